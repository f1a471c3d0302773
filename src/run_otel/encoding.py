"""Spans to OTLP protobuf, and the resource every batch carries.

Deterministic: no instance id, no clock. The same spans always serialize to
the same bytes, so an at-least-once duplicate is identical to the original.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from . import __version__
from . import attributes as A
from .config import Config, resource_attributes_from_env
from .mapping import AttrValue, SpanData


def resource_attributes(config: Config, env: Mapping[str, str]) -> dict[str, str]:
    """OTEL_RESOURCE_ATTRIBUTES, then run-otel's service keys on top."""
    attrs = resource_attributes_from_env(env)
    attrs[A.SERVICE_NAME] = config.service.name
    if config.service.namespace:
        attrs[A.SERVICE_NAMESPACE] = config.service.namespace
    if config.service.environment:
        attrs[A.DEPLOYMENT_ENVIRONMENT_NAME] = config.service.environment
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
        status=Status(code=span.status_code, message=span.status_message),
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
                    )
                ],
            )
        ]
    )


def encode_spans(spans: Iterable[SpanData], resource: Mapping[str, str]) -> ExportTraceServiceRequest:
    return encode_request((encode_span(s) for s in spans), resource)
