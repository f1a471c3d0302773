"""Where the mapper writes a span: its attributes one by one, then the span.

The mapper decides what a span holds once, and writes it to a ``SpanOut``. The
readable one here makes ``SpanData`` within the limits, for ``show``, the late
rows, the tests and the request cuts; the export's wire one
(:mod:`run_otel.export.wire`) writes the same span straight as OTLP bytes. One
span is written at a time: ``begin``, the attributes, ``finish``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

from .limits import AttributeLimits, with_cut
from .span_data import AttrValue, Event, SpanData

T = TypeVar("T")
# A span's status: code, message and events (an exception event for a failure).
Status = tuple[int, str, tuple[Event, ...]]


class SpanOut(Generic[T]):
    def begin(self) -> None:
        raise NotImplementedError

    def put(self, key: str, value: AttrValue) -> None:
        raise NotImplementedError

    def put_some(self, key: str, value: AttrValue | None) -> None:
        """Puts the attribute unless its column is NULL."""
        if value is not None:
            self.put(key, value)

    def extend(self, pairs: Iterable[tuple[str, AttrValue]]) -> None:
        for key, value in pairs:
            self.put(key, value)

    def finish(
        self,
        trace_id: bytes,
        span_id: bytes,
        parent_span_id: bytes,
        name: str,
        start_ns: int,
        end_ns: int,
        status: Status,
        cut: str | None,
    ) -> T:
        """The span with the attributes put since ``begin``; ``cut`` names an attribute the
        mapper already shortened (an error message past content.max_length)."""
        raise NotImplementedError


class ReadableSpans(SpanOut[SpanData]):
    """SpanData within the attribute limits: what the mapper always made."""

    def __init__(self, limits: AttributeLimits):
        self._limits = limits
        self._attrs: list[tuple[str, AttrValue]] = []

    def begin(self) -> None:
        self._attrs = []

    def put(self, key: str, value: AttrValue) -> None:
        self._attrs.append((key, value))

    def finish(
        self,
        trace_id: bytes,
        span_id: bytes,
        parent_span_id: bytes,
        name: str,
        start_ns: int,
        end_ns: int,
        status: Status,
        cut: str | None,
    ) -> SpanData:
        code, message, events = status
        span = SpanData(trace_id, span_id, parent_span_id, name, start_ns, end_ns, tuple(self._attrs), code, message, 0, events)
        if cut is not None:
            span = with_cut(span, [cut], 0, self._limits.list_length)
        return self._limits.apply(span)
