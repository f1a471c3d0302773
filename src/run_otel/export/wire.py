"""A run's rows straight to OTLP bytes: the export's hot path.

The mapper writes each span to ``WireSpans``, which encodes every attribute as it
is put, so no span object is made between a row and its bytes. Keys are encoded
once; the attributes that repeat (operation and tool names, layers, the run id on
every span of a trace, small counts) once per value. A span past the attribute
limits is the rare case the limits' cuts are written for: its whole run is mapped
the readable way and encoded from ``SpanData``. A property test
(tests/test_wire.py) holds both ways byte-identical to the protobuf runtime.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial

from ..mapping import attributes as A
from ..mapping.limits import AttributeLimits
from ..mapping.span_data import AttrValue, Event, SpanData
from ..mapping.span_out import SpanOut, Status
from ..mapping.spans import Mapper
from ..source.rows import RunRow, ToolRow
from .encoding import FastEncoder, attribute_field, event_body, event_field, key_field, name_field, span_bytes, span_head

_DOCUMENT_PREFIX = A.OI_RETRIEVAL_DOCUMENTS + "."
# Longer values are encoded each time rather than held: they rarely repeat.
_CACHED_MAX_CHARS = 256


class OverLimits(Exception):
    """A span needs the limits' cuts: map its run the readable way."""


class _Key:
    """One attribute key: its encoded field, and the attributes already encoded with it."""

    def __init__(self, key: str, list_length: int):
        self.field = key_field(key)
        # A retrieval.documents entry past trace.max_list_length is removed by the limits.
        index = key[len(_DOCUMENT_PREFIX) :].partition(".")[0] if key.startswith(_DOCUMENT_PREFIX) else ""
        self.over = index.isdigit() and int(index) >= list_length
        self.strings: dict[str, bytes] = {}
        self.ints: dict[int, bytes] = {}
        self.flags: dict[bool, bytes] = {}
        self.lists: dict[tuple[str, ...], bytes] = {}


class WireSpans(SpanOut[bytes]):
    """Spans as OTLP bytes, within the attribute limits or not at all (``OverLimits``)."""

    def __init__(self, limits: AttributeLimits, cache_size: int = 50_000):
        self._value_length = limits.value_length
        self._list_length = limits.list_length
        self._cache_size = cache_size
        self._cached = 0
        self._keys: dict[str, _Key] = {}
        self._names: dict[str, bytes] = {}
        # The exception event of a failed call: its type and message repeat.
        self._event_bodies: dict[tuple[str, tuple[tuple[str, AttrValue], ...]], bytes] = {}
        self._parts: list[bytes] = []
        self._over = False

    def begin(self) -> None:
        self._parts = []
        self._over = False

    def put(self, key: str, value: AttrValue) -> None:
        spec = self._keys.get(key)
        if spec is None:
            spec = self._keys[key] = _Key(key, self._list_length)
        if spec.over:
            self._over = True
            return
        field: bytes | None
        if isinstance(value, str):
            if len(value) > self._value_length:
                self._over = True
                return
            field = spec.strings.get(value)
            if field is None:
                field = attribute_field(spec.field, value)
                if len(value) <= _CACHED_MAX_CHARS:
                    self._hold()
                    spec.strings[value] = field
        elif isinstance(value, bool):  # before int: a bool is an int
            field = spec.flags.get(value)
            if field is None:
                field = spec.flags[value] = attribute_field(spec.field, value)
        elif isinstance(value, int):
            field = spec.ints.get(value)
            if field is None:
                field = attribute_field(spec.field, value)
                self._hold()
                spec.ints[value] = field
        elif isinstance(value, tuple):
            n = self._value_length
            if len(value) > self._list_length or any(len(item) > n for item in value):
                self._over = True
                return
            field = spec.lists.get(value)
            if field is None:
                field = attribute_field(spec.field, value)
                if len(field) <= 4 * _CACHED_MAX_CHARS:
                    self._hold()
                    spec.lists[value] = field
        else:
            field = attribute_field(spec.field, value)
        self._parts.append(field)

    def _hold(self) -> None:
        """Counts a value held; past ``cache_size`` every key forgets its values."""
        self._cached += 1
        if self._cached > self._cache_size:
            self._keys.clear()
            self._names.clear()
            self._event_bodies.clear()
            self._cached = 0

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
    ) -> bytes:
        if cut is not None:
            self.put(A.RUN_OTEL_ATTRIBUTES_CUT, (cut,)[: self._list_length])
        if self._over:
            raise OverLimits
        encoded_name = self._names.get(name)
        if encoded_name is None:
            encoded_name = self._names[name] = name_field(name)
            self._hold()
        head = span_head(trace_id, span_id, parent_span_id, encoded_name, start_ns, end_ns)
        code, message, events = status
        return span_bytes(head, self._parts, 0, [self._event(event) for event in events], code, message)

    def _event(self, event: Event) -> bytes:
        name, at_ns, attributes = event
        body = self._event_bodies.get((name, attributes))
        if body is None:
            body = event_body(name, attributes)
            if len(body) <= 4 * _CACHED_MAX_CHARS:
                self._hold()
                self._event_bodies[(name, attributes)] = body
        return event_field(at_ns, body)


class RunSpans:
    """One run's encoded spans for the sender, and its readable spans, made only when one
    must be cut to fit a request or named in a warning."""

    def __init__(self, run_id: str, encoded: list[bytes], readable: Callable[[], list[SpanData]]):
        self.run_id = run_id
        self.encoded = encoded
        self._readable = readable
        self._spans: list[SpanData] | None = None

    @classmethod
    def of(cls, run_id: str, spans: list[SpanData], encoder: FastEncoder) -> RunSpans:
        run = cls(run_id, [encoder.span(span) for span in spans], lambda: spans)
        run._spans = spans
        return run

    def span(self, index: int) -> SpanData:
        if self._spans is None:
            self._spans = self._readable()
        return self._spans[index]


class RunEncoder:
    """Maps a run and encodes its spans in one pass; the readable way when limits cut a span.

    The mapper writes one span at a time, and a backfill's sending thread may ask for a run's
    readable spans (to cut one) while the next batch is mapped: a lock keeps them apart."""

    def __init__(self, mapper: Mapper, encoder: FastEncoder):
        self._mapper = mapper
        self._encoder = encoder
        self._wire = WireSpans(mapper.limits)
        self._lock = threading.Lock()

    def encode(self, run: RunRow, tools: Sequence[ToolRow], incomplete: bool = False) -> tuple[RunSpans, list[str]]:
        """The run's spans, root first, and the warnings its rows raised."""
        with self._lock:
            try:
                encoded, warnings = self._mapper.map_into(self._wire, run, tools, incomplete)
            except OverLimits:
                mapped = self._mapper.map_run(run, tools, incomplete)
                return RunSpans.of(run.run_id, mapped.spans, self._encoder), mapped.warnings
        return RunSpans(run.run_id, encoded, partial(self._readable, run, tools, incomplete)), warnings

    def _readable(self, run: RunRow, tools: Sequence[ToolRow], incomplete: bool) -> list[SpanData]:
        with self._lock:
            return self._mapper.map_run(run, tools, incomplete).spans

    def encode_late(
        self, run: RunRow, tools: Sequence[ToolRow], late_ids: set[int], completed: bool
    ) -> tuple[RunSpans, list[str]]:
        """What an exported run sends later (``Mapper.map_late``): rare, so the readable way."""
        with self._lock:
            mapped = self._mapper.map_late(run, tools, late_ids, completed)
        return RunSpans.of(run.run_id, mapped.spans, self._encoder), mapped.warnings
