"""The deadline of one request, which grows behind a receiver slower than ``export.timeout_seconds``.

A receiver that answers every request in 15 s never acknowledges one under a 10 s deadline:
each retry sends the same request again, the receiver stores each copy, and the checkpoint never
moves. So a request that times out is sent again with twice the deadline, up to
``export.max_timeout_seconds``, and the longer deadline is kept while the receiver stays that
slow: the next requests do not time out first. An answer within ``export.timeout_seconds``
brings the deadline back to it.
"""

from __future__ import annotations

import threading


class Deadline:
    def __init__(self, timeout_seconds: float, max_timeout_seconds: float):
        self.base = timeout_seconds
        # A cap below the base would shorten the configured deadline: it only ever holds it.
        self.cap = max(max_timeout_seconds, timeout_seconds)
        self._current = timeout_seconds
        self._lock = threading.Lock()  # the poll and the daemon's probe share a sink

    @property
    def seconds(self) -> float:
        return self._current

    def exceeded(self, waited: float) -> str:
        """Doubles the deadline after a request that got no answer within ``waited`` seconds;
        returns the words that say so and name the setting to raise."""
        with self._lock:
            self._current = min(max(self._current, waited) * 2, self.cap)
            longer = self._current
        if waited >= self.cap:
            return (
                f"no answer within {waited:g}s, the most export.max_timeout_seconds allows: "
                "the receiver is slower than that; raise export.max_timeout_seconds and export.timeout_seconds"
            )
        return (
            f"no answer within {waited:g}s (export.timeout_seconds = {self.base:g}): the receiver is slower than that; "
            f"the next attempt waits up to {longer:g}s (export.max_timeout_seconds = {self.cap:g}). "
            "If it is always this slow, raise export.timeout_seconds"
        )

    def answered(self, seconds: float) -> None:
        """A receiver fast again brings the deadline back to export.timeout_seconds."""
        if seconds <= self.base:
            with self._lock:
                self._current = self.base
