"""The wire encoder writes exactly the bytes the protobuf runtime writes, span and request."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from run_otel.export.encoding import RequestFrame, encode_request, encode_span
from run_otel.export.wire import WireSpans
from run_otel.mapping.limits import AttributeLimits
from run_otel.mapping.span_data import SpanData

text = st.text(max_size=40)
attribute_value = st.one_of(
    text,
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.tuples(text, text) | st.lists(text, max_size=4).map(tuple),
)
spans = st.builds(
    SpanData,
    trace_id=st.binary(min_size=16, max_size=16),
    span_id=st.binary(min_size=8, max_size=8),
    parent_span_id=st.sampled_from([b""]) | st.binary(min_size=8, max_size=8),
    name=text,
    start_ns=st.integers(min_value=0, max_value=2**64 - 1),
    end_ns=st.integers(min_value=0, max_value=2**64 - 1),
    attributes=st.lists(st.tuples(st.text(min_size=1, max_size=30), attribute_value), max_size=12).map(tuple),
    status_code=st.sampled_from([0, 1, 2]),
    dropped_attributes_count=st.sampled_from([0]) | st.integers(min_value=1, max_value=2**32 - 1),
    status_message=text,
    events=st.lists(
        st.tuples(
            text,
            st.integers(min_value=0, max_value=2**64 - 1),
            st.lists(st.tuples(st.text(min_size=1, max_size=30), attribute_value), max_size=4).map(tuple),
        ),
        max_size=3,
    ).map(tuple),
)
resources = st.dictionaries(st.text(min_size=1, max_size=20), text, max_size=5)


# Limits no example reaches: these tests hold the encoding alone (tests/test_wire.py holds the cuts).
LIMITS = AttributeLimits(value_length=10**9, list_length=10**9)
# One encoder for every example, so its attribute cache is exercised across spans.
SHARED = WireSpans(LIMITS, cache_size=64)


@settings(max_examples=400, deadline=None)
@given(spans)
def test_fast_span_bytes_equal_the_protobuf_runtime(span):
    assert SHARED.replay(span) == encode_span(span).SerializeToString()


def test_the_attribute_cache_tells_equal_values_apart():
    wire = WireSpans(LIMITS)
    for value in (True, 1, 1.0, "1", ("1",), False, 0, 0.0, -0.0, 0.0):
        span = SpanData(b"\x01" * 16, b"\x02" * 8, b"", "n", 1, 2, (("k", value),))
        assert wire.replay(span) == encode_span(span).SerializeToString(), value


# Where a varint takes one byte more: 2^7, 2^14 and 2^21, each with the value just under it.
VARINT_EDGES = (127, 128, 16383, 16384, 2**21 - 1, 2**21)


@pytest.mark.parametrize("n", VARINT_EDGES)
def test_the_fast_bytes_equal_the_protobuf_runtime_at_each_varint_length(n):
    """Random values hit these edges rarely; every length prefix and integer is written at each of them."""
    at_edge = SpanData(
        b"\x01" * 16,
        b"\x02" * 8,
        b"",
        "n" * n,  # the name's length, and the span's and the request's lengths around it
        1,
        2,
        (("count", n), ("text", "t" * n), ("list", ("l" * n,))),
        2,
        "m" * n,
        dropped_attributes_count=n,
        events=(("e" * n, 3, (("k", n),)),),
    )
    encoded = WireSpans(LIMITS).replay(at_edge)
    assert encoded == encode_span(at_edge).SerializeToString()
    reference = encode_request([encode_span(at_edge)], {"service.name": "svc"}).SerializeToString()
    assert RequestFrame({"service.name": "svc"}).request([encoded]) == reference


@settings(max_examples=150, deadline=None)
@given(st.lists(spans, max_size=6), resources)
def test_fast_request_bytes_equal_the_protobuf_runtime(batch, resource):
    wire = WireSpans(LIMITS)
    fast = RequestFrame(resource).request([wire.replay(s) for s in batch])
    reference = encode_request([encode_span(s) for s in batch], resource).SerializeToString()
    assert fast == reference


def test_the_fast_bytes_parse_back():
    span = SpanData(b"\x01" * 16, b"\x02" * 8, b"", "invoke_agent x", 5, 9, (("k", "v"), ("n", -3)), 2, "boom")
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    frame = RequestFrame({"service.name": "svc"})
    parsed = ExportTraceServiceRequest.FromString(frame.request([WireSpans(LIMITS).replay(span)]))
    (decoded,) = parsed.resource_spans[0].scope_spans[0].spans
    assert decoded.name == "invoke_agent x" and decoded.attributes[1].value.int_value == -3
    assert decoded.status.message == "boom" and parsed.resource_spans[0].resource.attributes[0].key == "service.name"
    # The pinned GenAI conventions' schema, on the scope.
    assert parsed.resource_spans[0].scope_spans[0].schema_url == "https://opentelemetry.io/schemas/gen-ai/0.1.0"
