"""Spans to OTLP protobuf, and the resource every batch carries.

Deterministic: no instance id, no clock. The same spans always serialize to
the same bytes, so an at-least-once duplicate is identical to the original.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping

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


# -- the fast path: spans straight to OTLP wire bytes -----------------------------------
#
# Building protobuf message objects costs more than everything else the bridge
# does per span. This writes the same bytes directly: fields in field-number
# order, proto3 defaults omitted, oneof values always written, exactly as the
# protobuf runtime serializes `encode_span` / `encode_request`. A property test
# (tests/test_encoding.py) holds the two byte-identical.

_pack_fixed64 = struct.Struct("<Q").pack
_pack_double = struct.Struct("<d").pack
_INTERNAL = b"\x30\x01"  # kind = SPAN_KIND_INTERNAL


_ONE_BYTE = [bytes((i,)) for i in range(0x80)]


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


class FastEncoder:
    """SpanData to serialized OTLP, caching the encoded attributes.

    Most attribute values repeat (operation and tool names, layers, the run id
    on every span of a trace), so whole KeyValue messages are cached; the cache
    is dropped when it grows past ``cache_size`` to keep memory bounded.
    """

    def __init__(self, resource: Mapping[str, str], cache_size: int = 50_000):
        self._keys: dict[str, bytes] = {}
        self._kv_cache: dict[tuple, bytes] = {}
        self._cache_size = cache_size
        # The scope comes from the reference encoder, so it is defined in one place.
        reference_scope = encode_request((), resource).resource_spans[0].scope_spans[0].scope
        self._scope = _field(b"\x0a", reference_scope.SerializeToString())
        self._schema_url = _field(b"\x1a", A.SCHEMA_URL.encode())  # ScopeSpans.schema_url
        self._resource = _field(b"\x0a", b"".join(_field(b"\x0a", self._key_value(k, v)) for k, v in resource.items()))

    def _key_value(self, key: str, value: AttrValue) -> bytes:
        prefix = self._keys.get(key)
        if prefix is None:
            prefix = self._keys[key] = _field(b"\x0a", key.encode("utf-8"))
        return prefix + _field(b"\x12", _any_value_bytes(value))

    def span(self, span: SpanData) -> bytes:
        parts = [b"\x0a\x10", span.trace_id, b"\x12\x08", span.span_id]
        if span.parent_span_id:
            parts += (b"\x22\x08", span.parent_span_id)
        if span.name:
            name = span.name.encode("utf-8", "replace")
            parts += (b"\x2a", _varint(len(name)), name)
        parts.append(_INTERNAL)
        if span.start_ns:
            parts += (b"\x39", _pack_fixed64(span.start_ns))
        if span.end_ns:
            parts += (b"\x41", _pack_fixed64(span.end_ns))
        cache = self._kv_cache
        for key, value in span.attributes:
            # Equal values can encode differently: True == 1 (so the class is
            # in the key) and 0.0 == -0.0 (so a float is keyed by its repr).
            cls = value.__class__
            cache_key = (key, cls, repr(value) if cls is float else value)
            field = cache.get(cache_key)
            if field is None:
                kv = self._key_value(key, value)
                field = b"\x4a" + _varint(len(kv)) + kv
                if len(cache) >= self._cache_size:
                    cache.clear()
                cache[cache_key] = field
            parts.append(field)
        if span.dropped_attributes_count:
            parts += (b"\x50", _varint(span.dropped_attributes_count))
        for event_name, at_ns, event_attrs in span.events:  # rare (failed calls): not cached
            event = b"\x09" + _pack_fixed64(at_ns) if at_ns else b""
            event += _field(b"\x12", event_name.encode("utf-8", "replace")) if event_name else b""
            event += b"".join(_field(b"\x1a", self._key_value(k, v)) for k, v in event_attrs)
            parts.append(_field(b"\x5a", event))
        status = b""
        if span.status_message:
            status = _field(b"\x12", span.status_message.encode("utf-8", "replace"))
        if span.status_code:
            status += b"\x18" + _varint(span.status_code)
        parts += (b"\x7a", _varint(len(status)), status)
        return b"".join(parts)

    def request(self, spans: list[bytes]) -> bytes:
        """An ExportTraceServiceRequest holding the encoded spans, serialized."""
        scope_spans = self._scope + b"".join(_field(b"\x12", s) for s in spans) + self._schema_url
        resource_spans = self._resource + _field(b"\x12", scope_spans)
        return _field(b"\x0a", resource_spans)
