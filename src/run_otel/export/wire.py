"""Spans straight to OTLP bytes: the export's hot path, and the one encoder of spans.

The mapper writes each span to ``WireSpans``, which encodes every attribute as it
is put, so no span object is made between a row and its bytes. Keys are encoded
once; the attributes that repeat (operation and tool names, layers, the run id on
every span of a trace, small counts) once per value. Only values within the
limits are held, so a value found in the cache needs no test against them; a new
one is tested (``AttributeLimits.fits``) and, past them, cut as the readable
spans cut it (``span_out.py``). A span made elsewhere (a rating's) is written
through the same output with ``replay``. A property test (tests/test_wire.py)
holds the bytes to the protobuf runtime's for the readable spans.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, NamedTuple

from ..mapping import attributes as A
from ..mapping.limits import AttributeLimits
from ..mapping.span_data import AttrValue, Event, RunIdentity
from ..mapping.span_out import Head, SpanOut, Status
from ..mapping.spans import Late, Mapper
from ..source.rows import RunRow, ToolRow
from .encoding import attribute_field, event_body, event_field, key_field, link_field, name_field, span_bytes, span_head

# Held values are at most this many bytes encoded: longer ones rarely repeat.
_HELD_MAX_BYTES: Final = 1024
# Keys whose values never repeat from span to span: encoded each time, never held.
_UNIQUE_KEYS: Final = frozenset({A.GEN_AI_TOOL_CALL_ID})


class _Key:
    """One attribute key: its encoded field, and the attributes already encoded with it, by the
    value's class (True == 1, so a bool and an int are held apart; a float never is: 0.0 == -0.0)."""

    def __init__(self, key: str):
        self.field = key_field(key)
        repeats = key not in _UNIQUE_KEYS
        # Typed alike, so the one lookup in ``put`` serves every kind.
        self.strings: dict[Any, bytes] | None = {} if repeats else None
        self.ints: dict[Any, bytes] | None = {} if repeats else None
        self.flags: dict[Any, bytes] | None = {} if repeats else None
        self.lists: dict[Any, bytes] | None = {} if repeats else None


class WireSpans(SpanOut[bytes]):
    """Spans as OTLP bytes, within the attribute limits."""

    def __init__(self, limits: AttributeLimits, cache_size: int = 50_000):
        super().__init__(limits)
        self._cache_size = cache_size
        self._cached = 0
        self._keys: dict[str, _Key] = {}
        self._names: dict[str, bytes] = {}
        # The exception event of a failed call: its type and message repeat.
        self._event_bodies: dict[tuple[str, tuple[tuple[str, AttrValue], ...]], bytes] = {}
        self._parts: list[bytes] = []

    def _start(self) -> None:
        self._parts = []

    def put(self, key: str, value: AttrValue) -> None:
        spec = self._keys.get(key)
        if spec is None:
            spec = self._keys[key] = _Key(key)
        kind = type(value)
        held: dict[Any, bytes] | None
        if kind is str:
            held = spec.strings
        elif kind is int:
            held = spec.ints
        elif kind is bool:
            held = spec.flags
        elif kind is tuple:
            held = spec.lists
        else:
            held = None
        field = held.get(value) if held is not None else None
        if field is None:
            field = self._encode(spec, key, value, held)
            if field is None:
                return
        self._parts.append(field)

    def _encode(self, spec: _Key, key: str, value: AttrValue, held: dict[Any, bytes] | None) -> bytes | None:
        """A value not held: tested against the limits (only values within them are held), then
        encoded; None when the limits remove it."""
        if not self.limits.fits(key, value):
            admitted = self._admitted(key, value)
            return None if admitted is None else attribute_field(spec.field, admitted)
        field = attribute_field(spec.field, value)
        if held is not None and len(field) <= _HELD_MAX_BYTES:
            self._hold()
            held[value] = field
        return field

    def _hold(self) -> None:
        """Counts a value held; past ``cache_size`` every key forgets its values."""
        self._cached += 1
        if self._cached > self._cache_size:
            self._keys.clear()
            self._names.clear()
            self._event_bodies.clear()
            self._cached = 0

    def _make(self, head: Head, status: Status, dropped: int) -> bytes:
        trace_id, span_id, parent_span_id, name, start_ns, end_ns = head
        encoded_name = self._names.get(name)
        if encoded_name is None:
            encoded_name = self._names[name] = name_field(name)
            self._hold()
        fields = span_head(trace_id, span_id, parent_span_id, encoded_name, start_ns, end_ns)
        code, message, events = status
        events_and_links = [self._event(event) for event in events]
        if self._links:  # only a later row with a run id an earlier row has links its root
            events_and_links += [link_field(trace_id, span_id) for trace_id, span_id in self._links]
        return span_bytes(fields, self._parts, dropped, events_and_links, code, message)

    def _event(self, event: Event) -> bytes:
        name, at_ns, attributes = event
        body = self._event_bodies.get((name, attributes))
        if body is None:
            body = event_body(name, attributes)
            # Held only with text values: True == 1 and 0.0 == -0.0 would meet under one key.
            if len(body) <= _HELD_MAX_BYTES and all(type(value) is str for _, value in attributes):
                self._hold()
                self._event_bodies[(name, attributes)] = body
        return event_field(at_ns, body)


class RunSpans(NamedTuple):
    """One run's spans as bytes, root first, for the request sender."""

    run_id: str
    encoded: list[bytes]


class RunEncoder:
    """Maps a run and encodes its spans in one pass. One run at a time: the backfill's sending
    thread only frames and sends bytes, and never writes a span here."""

    def __init__(self, mapper: Mapper, wire: WireSpans):
        self._mapper = mapper
        self._wire = wire

    @property
    def mapper(self) -> Mapper:
        return self._mapper

    def encode(
        self,
        run: RunRow,
        tools: Sequence[ToolRow],
        incomplete: bool = False,
        late: Late | None = None,
        identity: RunIdentity | None = None,
    ) -> tuple[RunSpans, list[str]]:
        """The run's spans (or, with ``late``, what it sends after its export) and the warnings its rows raised."""
        encoded, warnings = self._mapper.map_into(self._wire, run, tools, incomplete, late, identity)
        return RunSpans(run.run_id, encoded), warnings
