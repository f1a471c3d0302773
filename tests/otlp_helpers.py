"""Test-only OTLP helpers: the reference encoding of mapped spans, and reading OTLP-JSON back."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from run_otel.export.encoding import encode_request, encode_span
from run_otel.mapping.span_data import SpanData

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def encode_spans(spans: Iterable[SpanData], resource: Mapping[str, str]) -> ExportTraceServiceRequest:
    """Mapped spans through the protobuf runtime: the reference the fast encoder is held to."""
    return encode_request((encode_span(s) for s in spans), resource)


def parse_otlp_json(line: str) -> ExportTraceServiceRequest:
    """The inverse of run_otel.export.sinks.otlp_json (hex ids), with protobuf's own JSON parser."""
    doc = json.loads(line)
    for resource_spans in doc.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in _ID_FIELDS:
                    if key in span:
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return json_format.ParseDict(doc, ExportTraceServiceRequest())
