"""Where the mapper writes a span: its attributes one by one, then the span.

The mapper decides what a span holds once, and writes it to a ``SpanOut``. The
readable one here makes ``SpanData``, for ``show``, the tests and the property
test's reference; the export's wire one (:mod:`run_otel.export.wire`) writes the
same span straight as OTLP bytes. Both hold every attribute to the same limits
in the same way, here: an attribute that does not fit is shortened (or removed)
as it is put, and the span's ``run_otel.attributes.cut`` names it. One span is
written at a time: ``begin``, the attributes, ``finish``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

from . import attributes as A
from .limits import AttributeLimits
from .span_data import AttrValue, Event, SpanData

T = TypeVar("T")
# What names and places a span: trace id, span id, parent span id, name, start and end (ns).
Head = tuple[bytes, bytes, bytes, str, int, int]
# A span's status: code, message and events (an exception event for a failure).
Status = tuple[int, str, tuple[Event, ...]]


class SpanOut(Generic[T]):
    def __init__(self, limits: AttributeLimits):
        self.limits = limits
        self._cut: list[str] = []  # the keys the limits shortened or removed in this span
        self._dropped = 0  # the attributes they removed
        self._links: list[tuple[bytes, bytes]] = []  # spans of other traces this one links to

    def begin(self) -> None:
        self._cut = []
        self._dropped = 0
        if self._links:
            self._links = []
        self._start()

    def link(self, trace_id: bytes, span_id: bytes) -> None:
        """Links the span being written to a span of another trace."""
        self._links.append((trace_id, span_id))

    def put(self, key: str, value: AttrValue) -> None:
        raise NotImplementedError

    def put_some(self, key: str, value: AttrValue | None) -> None:
        """Puts the attribute unless its column is NULL."""
        if value is not None:
            self.put(key, value)

    def extend(self, pairs: Iterable[tuple[str, AttrValue]]) -> None:
        for key, value in pairs:
            self.put(key, value)

    def finish(self, head: Head, status: Status, cut: str | None) -> T:
        """The span with the attributes put since ``begin``; ``cut`` names an attribute the
        mapper already shortened (an error message past content.max_length)."""
        if cut is not None:
            self._cut.insert(0, cut)
        if self._cut:
            self.put(A.RUN_OTEL_ATTRIBUTES_CUT, self.limits.cut_record(self._cut))
        return self._make(head, status, self._dropped)

    def replay(self, span: SpanData) -> T:
        """A span made elsewhere (a rating's, say), written through this output."""
        self.begin()
        self.extend(span.attributes)
        self._dropped += span.dropped_attributes_count
        for trace_id, span_id in span.links:
            self.link(trace_id, span_id)
        head = (span.trace_id, span.span_id, span.parent_span_id, span.name, span.start_ns, span.end_ns)
        return self.finish(head, (span.status_code, span.status_message, span.events), None)

    def _admitted(self, key: str, value: AttrValue) -> AttrValue | None:
        """An attribute that does not fit, as the limits leave it, its cut recorded; None when removed."""
        admitted = self.limits.admit(key, value)
        if admitted is None:
            self._dropped += 1
            self._cut.append(A.OI_RETRIEVAL_DOCUMENTS)
        else:
            self._cut.append(key)
        return admitted

    # -- what each output makes -----------------------------------------------------

    def _start(self) -> None:
        raise NotImplementedError

    def _make(self, head: Head, status: Status, dropped: int) -> T:
        raise NotImplementedError


class ReadableSpans(SpanOut[SpanData]):
    """SpanData within the attribute limits."""

    def __init__(self, limits: AttributeLimits):
        super().__init__(limits)
        self._attrs: list[tuple[str, AttrValue]] = []

    def _start(self) -> None:
        self._attrs = []

    def put(self, key: str, value: AttrValue) -> None:
        if not self.limits.fits(key, value):
            admitted = self._admitted(key, value)
            if admitted is None:
                return
            value = admitted
        self._attrs.append((key, value))

    def _make(self, head: Head, status: Status, dropped: int) -> SpanData:
        trace_id, span_id, parent_span_id, name, start_ns, end_ns = head
        code, message, events = status
        links = tuple(self._links)
        return SpanData(
            trace_id, span_id, parent_span_id, name, start_ns, end_ns, tuple(self._attrs), code, message, dropped, events, links
        )
