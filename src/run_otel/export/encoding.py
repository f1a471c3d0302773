"""Spans to OTLP protobuf, and the resource every batch carries.

Deterministic: no instance id, no clock. The same spans always serialize to
the same bytes, so an at-least-once duplicate is identical to the original.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from .. import __version__
from ..config import ServiceConfig, TraceConfig
from ..mapping import attributes as A
from ..mapping.span_data import AttrValue, SpanData
from ..otel_env import resource_attributes_from_env


def resource_attributes(service: ServiceConfig, trace: TraceConfig, env: Mapping[str, str]) -> dict[str, str]:
    """OTEL_RESOURCE_ATTRIBUTES, then run-otel's service keys on top."""
    attrs = resource_attributes_from_env(env)
    attrs[A.SERVICE_NAME] = service.name
    if service.namespace:
        attrs[A.SERVICE_NAMESPACE] = service.namespace
    if service.environment:
        attrs[A.DEPLOYMENT_ENVIRONMENT_NAME] = service.environment
    if "openinference" in trace.conventions:
        attrs[A.OI_PROJECT_NAME] = trace.project_name or service.name
    return dict(sorted(attrs.items()))


def any_value(value: AttrValue) -> AnyValue:
    # bool before int: bool is a subclass of int.
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, tuple):
        return AnyValue(array_value=ArrayValue(values=[AnyValue(string_value=v) for v in value]))
    return AnyValue(string_value=value)


def encode_span(span: SpanData) -> Span:
    return Span(
        trace_id=span.trace_id,
        span_id=span.span_id,
        parent_span_id=span.parent_span_id,
        name=span.name,
        kind=Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=span.start_ns,
        end_time_unix_nano=span.end_ns,
        attributes=[KeyValue(key=k, value=any_value(v)) for k, v in span.attributes],
        dropped_attributes_count=span.dropped_attributes_count,
        events=[
            Span.Event(time_unix_nano=at, name=name, attributes=[KeyValue(key=k, value=any_value(v)) for k, v in attrs])
            for name, at, attrs in span.events
        ],
        links=[Span.Link(trace_id=trace_id, span_id=span_id) for trace_id, span_id in span.links],
        status=Status(code=span.status_code, message=span.status_message),  # type: ignore[arg-type]  # enum ints
    )


def encode_request(spans: Iterable[Span], resource: Mapping[str, str]) -> ExportTraceServiceRequest:
    """One ExportTraceServiceRequest: one resource, one scope, all the encoded spans."""
    return ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=Resource(attributes=[KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in resource.items()]),
                scope_spans=[
                    ScopeSpans(
                        scope=InstrumentationScope(name=A.SCOPE_NAME, version=__version__),
                        spans=list(spans),
                        schema_url=A.SCHEMA_URL,
                    )
                ],
            )
        ]
    )


# -- the fields, straight as OTLP wire bytes ---------------------------------------------
#
# Building protobuf message objects costs more than everything else the bridge
# does per span. These write the same bytes directly: fields in field-number
# order, proto3 defaults omitted, oneof values always written, exactly as the
# protobuf runtime serializes `encode_span` / `encode_request`, which stay only
# as the reference the property tests (tests/test_wire.py, tests/test_encoding.py)
# hold them to. ``wire.py`` puts them together into spans.

_pack_fixed64 = struct.Struct("<Q").pack
_pack_double = struct.Struct("<d").pack
# Both times with their tags in one call: start (field 7) and end (field 8), fixed64 each.
_pack_times = struct.Struct("<BQBQ").pack
_INTERNAL: Final = b"\x30\x01"  # kind = SPAN_KIND_INTERNAL


_ONE_BYTE: Final = [bytes((i,)) for i in range(0x80)]


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    if value < 0:
        value += 1 << 64  # int64 negatives take ten bytes, two's complement
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


def _any_value_bytes(value: AttrValue) -> bytes:
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _pack_double(value)
    if isinstance(value, tuple):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value_bytes(v)) for v in value))
    return _field(b"\x0a", value.encode("utf-8", "replace"))


def attribute_field(key_field: bytes, value: AttrValue) -> bytes:
    """A span's attribute (field 9) from its key's encoded field and its value."""
    kv = key_field + _field(b"\x12", _any_value_bytes(value))
    return b"\x4a" + _varint(len(kv)) + kv


def key_field(key: str) -> bytes:
    return _field(b"\x0a", key.encode("utf-8"))


def span_bytes(
    head: bytes, attributes: list[bytes], dropped: int, events: list[bytes], status_code: int, status_message: str
) -> bytes:
    """A span from its ``span_head``, its encoded attributes and ``event_field``s (then its ``link_field``s,
    whose field number comes next), in field order."""
    parts = [head, *attributes]
    if dropped:
        parts += (b"\x50", _varint(dropped))
    parts += events
    parts.append(status_field(status_code, status_message))
    return b"".join(parts)


# The statuses of every span without a message: UNSET, OK, ERROR.
_PLAIN_STATUS: Final = (b"\x7a\x00", b"\x7a\x02\x18\x01", b"\x7a\x02\x18\x02")


def status_field(code: int, message: str) -> bytes:
    if not message and 0 <= code <= 2:
        return _PLAIN_STATUS[code]
    status = _field(b"\x12", message.encode("utf-8", "replace")) if message else b""
    if code:
        status += b"\x18" + _varint(code)
    return b"\x7a" + _varint(len(status)) + status


def event_body(name: str, attributes: tuple[tuple[str, AttrValue], ...]) -> bytes:
    """An event's fields after its time: the part that repeats from span to span."""
    body = _field(b"\x12", name.encode("utf-8", "replace")) if name else b""
    return body + b"".join(_field(b"\x1a", key_field(k) + _field(b"\x12", _any_value_bytes(v))) for k, v in attributes)


def event_field(at_ns: int, body: bytes) -> bytes:
    """A span's event (field 11): its time, then its ``event_body``."""
    return _field(b"\x5a", b"\x09" + _pack_fixed64(at_ns) + body if at_ns else body)


def link_field(trace_id: bytes, span_id: bytes) -> bytes:
    """A span's link (field 13) to a span of another trace."""
    ids = (_field(b"\x0a", trace_id) if trace_id else b"") + (_field(b"\x12", span_id) if span_id else b"")
    return _field(b"\x6a", ids)


def span_head(trace_id: bytes, span_id: bytes, parent_span_id: bytes, name: bytes, start_ns: int, end_ns: int) -> bytes:
    """A span's fields before its attributes: ids, name (``name_field``), kind and times."""
    if start_ns and end_ns:
        times = _pack_times(0x39, start_ns, 0x41, end_ns)
    else:
        times = (b"\x39" + _pack_fixed64(start_ns) if start_ns else b"") + (b"\x41" + _pack_fixed64(end_ns) if end_ns else b"")
    if parent_span_id:
        return b"".join((b"\x0a\x10", trace_id, b"\x12\x08", span_id, b"\x22\x08", parent_span_id, name, _INTERNAL, times))
    return b"".join((b"\x0a\x10", trace_id, b"\x12\x08", span_id, name, _INTERNAL, times))


def name_field(name: str) -> bytes:
    return _field(b"\x2a", name.encode("utf-8", "replace")) if name else b""


class RequestFrame:
    """What surrounds the spans of every request: the resource, the scope and the nesting.

    The spans come as bytes (``wire.py``); a request is joined once, the nesting's
    lengths added up rather than each level copied."""

    def __init__(self, resource: Mapping[str, str]):
        # The scope comes from the reference encoder, so it is defined in one place.
        reference_scope = encode_request((), resource).resource_spans[0].scope_spans[0].scope
        self._scope = _field(b"\x0a", reference_scope.SerializeToString())
        self._schema_url = _field(b"\x1a", A.SCHEMA_URL.encode())  # ScopeSpans.schema_url
        self._resource = _field(
            b"\x0a", b"".join(_field(b"\x0a", key_field(k) + _field(b"\x12", _any_value_bytes(v))) for k, v in resource.items())
        )

    def request(self, spans: list[bytes]) -> bytes:
        """An ExportTraceServiceRequest holding the encoded spans, serialized."""
        middle: list[bytes] = [b""]
        size = 0
        for span in spans:
            length = _varint(len(span))
            middle += (b"\x12", length, span)
            size += 1 + len(length) + len(span)
        scope_spans_size = len(self._scope) + size + len(self._schema_url)
        scope_length = _varint(scope_spans_size)
        resource_spans_size = len(self._resource) + 1 + len(scope_length) + scope_spans_size
        middle[0] = b"\x0a" + _varint(resource_spans_size) + self._resource + b"\x12" + scope_length + self._scope
        middle.append(self._schema_url)
        return b"".join(middle)
