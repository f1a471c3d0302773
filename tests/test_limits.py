"""Attribute caps, applied alike by both span outputs, and the cut of a span too large for a
request: pure functions, exact sizes."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from run_otel.config import ConfigError, build_config, load_config
from run_otel.export.cut import cut_span
from run_otel.export.encoding import RequestFrame, encode_span
from run_otel.export.sending import RequestSender
from run_otel.export.sinks import JsonFileSink
from run_otel.export.wire import WireSpans
from run_otel.mapping import attributes as A
from run_otel.mapping.limits import AttributeLimits
from run_otel.mapping.span_data import SpanData
from run_otel.mapping.span_out import ReadableSpans

FRAME = RequestFrame({"service.name": "diagnosis-agent"})
WIRE = WireSpans(AttributeLimits())
# No attribute limit reached: the span is larger than a request with every value whole.
UNCAPPED = WireSpans(AttributeLimits(10**6, 10**6))


def span(*attributes, status_message: str = "") -> SpanData:
    return SpanData(
        b"\x01" * 16,
        b"\x02" * 8,
        b"\x03" * 8,
        "execute_tool lookup",
        1,
        2,
        tuple(attributes),
        2 if status_message else 0,
        status_message,
    )


def decoded(encoded: bytes) -> Span:
    return Span.FromString(encoded)


def test_a_span_within_the_caps_is_left_as_it_is():
    within = span(("a", "x" * 10), (A.RAG_EVIDENCE_PATHS, ("p",) * 3), ("n", 5))
    limits = AttributeLimits(value_length=10, list_length=3)
    assert all(limits.fits(key, value) for key, value in within.attributes)
    assert ReadableSpans(limits).replay(within) == within


def test_every_value_list_and_document_list_is_capped_and_the_cut_recorded():
    documents = [(f"retrieval.documents.{n}.document.{field}", f"{field}{n}") for n in range(5) for field in ("id", "content")]
    wide = span(
        ("short", "ok"),
        ("long", "長" * 50),
        (A.RAG_EVIDENCE_PATHS, tuple(f"$.refs[{i}]" + "x" * 40 for i in range(9))),
        *documents,
    )
    limits = AttributeLimits(value_length=20, list_length=3)
    capped = ReadableSpans(limits).replay(wide)
    attrs = capped.attribute_map()
    assert attrs["short"] == "ok"
    assert attrs["long"] == "長" * 20
    assert attrs[A.RAG_EVIDENCE_PATHS] == tuple(f"$.refs[{i}]" + "x" * 11 for i in range(3))
    assert sorted(k for k in attrs if k.startswith("retrieval.documents.")) == sorted(k for k, _ in documents[:6])
    assert attrs[A.RUN_OTEL_ATTRIBUTES_CUT] == ("long", A.RAG_EVIDENCE_PATHS, "retrieval.documents")
    assert capped.dropped_attributes_count == 4  # the documents 3 and 4, two attributes each
    # The wire cuts as the readable spans do: the same bytes as the capped span's.
    assert WireSpans(limits).replay(wide) == encode_span(capped).SerializeToString()
    assert decoded(WIRE.replay(capped)).dropped_attributes_count == 4


def test_a_span_too_large_loses_its_largest_attributes_first():
    big = span(("small", "s"), ("huge", "x" * 5000), ("large", "y" * 3000), ("medium", "z" * 200), status_message="boom")
    encoded = UNCAPPED.replay(big)
    assert len(encoded) > 8000
    fitted = cut_span(encoded, 3500, 128)
    assert fitted is not None and len(fitted) <= 3500
    cut = decoded(fitted)
    attrs = {kv.key: kv.value for kv in cut.attributes}
    assert set(attrs) == {"small", "large", "medium", A.RUN_OTEL_ATTRIBUTES_CUT}
    assert [v.string_value for v in attrs[A.RUN_OTEL_ATTRIBUTES_CUT].array_value.values] == ["huge"]
    assert (cut.name, cut.status.message, cut.span_id) == (big.name, big.status_message, big.span_id)
    assert cut.dropped_attributes_count == 1
    # The same span and size always give the same bytes: a re-send is identical.
    assert cut_span(encoded, 3500, 128) == fitted


def test_a_span_that_fits_is_not_touched_and_one_too_large_without_attributes_gives_up():
    small = WIRE.replay(span(("a", "b")))
    assert cut_span(small, 1000, 128) is small
    assert cut_span(WIRE.replay(span(("a", "b"), status_message="e" * 5000)), 1000, 128) is None


def test_the_request_size_is_validated_and_a_value_over_4_mib_is_warned_about(tmp_path, caplog):
    with pytest.raises(ConfigError, match="export.max_request_bytes must be at least 65536"):
        build_config({"export": {"max_request_bytes": 1000}})
    for key in ("max_attribute_length", "max_list_length"):
        with pytest.raises(ConfigError, match=f"trace.{key} must be greater than 0"):
            build_config({"trace": {key: 0}})
    config = build_config({"export": {"max_request_bytes": 8 << 20}})
    with caplog.at_level(logging.WARNING):
        RequestSender(JsonFileSink(tmp_path / "out.jsonl"), FRAME, config.export.max_request_bytes, 128, lambda r, n: None)
    assert "export.max_request_bytes is 8388608, above the 4 MiB most receivers accept" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        RequestSender(JsonFileSink(tmp_path / "out.jsonl"), FRAME, 3 << 20, 128, lambda r, n: None)
    assert caplog.text == ""


def test_the_sdk_attribute_value_limit_is_honoured():
    assert load_config(environ={"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "500"}).trace.max_attribute_length == 500
    both = {"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "500", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "300"}
    assert load_config(environ=both).trace.max_attribute_length == 300
    with pytest.raises(ConfigError, match="OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT must be a whole number"):
        load_config(environ={"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "lots"})
