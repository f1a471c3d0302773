"""A span too large for a request, cut to a size: its largest attributes removed until it fits.

Rare (a span within the attribute limits is far under a request), so it works on the
span's bytes with the protobuf runtime, which writes the same bytes the wire does:
the span is read back, attributes are removed largest first, and the cut is recorded
on it as the attribute limits record theirs (``run_otel.attributes.cut`` names the
keys removed, ``dropped_attributes_count`` counts them). Its name, ids, times and
status stay. The same span and size always give the same bytes.
"""

from __future__ import annotations

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from ..mapping import attributes as A

# What the record of the cut and the lengths around it may take, beyond the keys it names.
_RECORD_ROOM = 64


def cut_span(encoded: bytes, budget: int, list_length: int) -> bytes | None:
    """The span within ``budget`` bytes, or None when even its name, ids, times and status exceed it."""
    if len(encoded) <= budget:
        return encoded
    span = Span.FromString(encoded)
    attributes = list(span.attributes)
    sizes = sorted(((kv.ByteSize(), i) for i, kv in enumerate(attributes) if kv.key != A.RUN_OTEL_ATTRIBUTES_CUT), reverse=True)
    excess = len(encoded) - budget
    removed: set[int] = set()
    freed = 0
    for size, i in sizes:
        removed.add(i)
        freed += size
        if freed >= excess + _RECORD_ROOM + sum(len(attributes[j].key) + 4 for j in removed):
            break
    while True:
        cut = _without(span, attributes, removed, list_length).SerializeToString()
        if len(cut) <= budget:
            return cut
        if len(removed) >= len(sizes):
            return None
        removed.add(next(i for _, i in sizes if i not in removed))


def _without(span: Span, attributes: list[KeyValue], removed: set[int], list_length: int) -> Span:
    """The span without the attributes at ``removed``, the cut recorded (merged with an earlier one)."""
    earlier: list[str] = []
    kept = []
    for i, kv in enumerate(attributes):
        if kv.key == A.RUN_OTEL_ATTRIBUTES_CUT:
            earlier = [value.string_value for value in kv.value.array_value.values]
        elif i not in removed:
            kept.append(kv)
    keys = [*earlier, *(attributes[i].key for i in sorted(removed))]
    record = tuple(dict.fromkeys(keys))[:list_length]
    out = Span()
    out.CopyFrom(span)
    del out.attributes[:]
    out.attributes.extend(kept)
    values = [AnyValue(string_value=key) for key in record]
    out.attributes.append(KeyValue(key=A.RUN_OTEL_ATTRIBUTES_CUT, value=AnyValue(array_value=ArrayValue(values=values))))
    out.dropped_attributes_count = span.dropped_attributes_count + len(removed)
    return out


def named(encoded: bytes) -> str:
    """A span as a log line names it: its id and name."""
    span = Span.FromString(encoded)
    return f"{span.span_id.hex()} ({span.name})"
