"""A bounded memo for pure functions of values that repeat from row to row.

Evidence statuses, raw_path lists and tool error messages recur across
thousands of rows; parsing or redacting each once per distinct value is most
of their cost. The memo forgets everything when full, so memory stays bounded
whatever the data. Only immutable results belong in it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Memo(Generic[K, V]):
    """``function``'s results by argument, at most ``size`` of them."""

    def __init__(self, function: Callable[[K], V], size: int = 4096):
        self._function = function
        self._size = size
        self._values: dict[K, V] = {}

    def __call__(self, key: K) -> V:
        try:
            return self._values[key]
        except KeyError:
            pass
        value = self._function(key)
        if len(self._values) >= self._size:
            self._values.clear()
        self._values[key] = value
        return value

    def __len__(self) -> int:
        return len(self._values)
