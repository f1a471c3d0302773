"""The hot path writes exactly the bytes the protobuf runtime writes for the readable spans.

For any rows, ``RunEncoder.encode`` (rows straight to OTLP bytes) gives, span for span, what
``Mapper.map_run`` and the protobuf messages of ``encode_span`` give, with the same warnings:
content capture on and off, both profiles, small limits that cut, the tool-span cap, and what an
exported run sends later (its late tool rows, its late completion).
"""

from __future__ import annotations

import json
import struct
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from run_otel.config import build_config
from run_otel.export.encoding import encode_span
from run_otel.export.wire import RunEncoder, WireSpans
from run_otel.factory import build_mapper
from run_otel.mapping import attributes as A
from run_otel.mapping.limits import AttributeLimits
from run_otel.mapping.span_data import SpanData
from run_otel.mapping.span_out import ReadableSpans
from run_otel.mapping.spans import Late
from run_otel.source.clock import SourceClock
from run_otel.source.rows import RunRow, ToolRow

text = st.text(max_size=30)
maybe_text = st.none() | text
count = st.none() | st.integers(min_value=-5, max_value=2**40)
when = st.none() | st.sampled_from(["0000-00-00 00:00:00"]) | st.datetimes(datetime(1971, 1, 1), datetime(2100, 1, 1))
ref = st.fixed_dictionaries(
    {"raw_path": st.sampled_from(["$.logs[0]", "$.docs[1]", "$.no_evidence"]) | text},
    optional={"text": text, "doc_id": text | st.integers(0, 99), "score": st.floats(allow_nan=False)},
)
evidence = st.one_of(
    st.none(),
    text,
    st.builds(
        lambda status, refs: json.dumps({"evidence_status": status, "evidence_refs": refs}), maybe_text, st.lists(ref, max_size=5)
    ),
    st.builds(lambda refs: json.dumps({"evidence_refs": refs}), st.dictionaries(text, text, max_size=2)),
)
runs = st.builds(
    RunRow,
    id=st.integers(1, 2**40),
    run_id=st.sampled_from(["run-00000001-0000-4000-8000-000000000001", "run-a"]) | text,
    session_id=maybe_text,
    status=st.sampled_from(["SUCCESS", "FAILED", "FALLBACK", "CANCELLED", "RUNNING", "ARCHIVED", None]),
    agent_flow=maybe_text,
    intent=maybe_text,
    release_outcome=maybe_text,
    feedback=maybe_text,
    total_duration_ms=count,
    total_token_count=count,
    step_count=count,
    tool_call_count=count,
    created_at=when,
    updated_at=when,
    query=maybe_text,
    answer=maybe_text,
    published_result=maybe_text,
)
tools = st.builds(
    ToolRow,
    id=st.integers(1, 2**40),
    run_id=st.just("run-a"),
    step_id=count,
    tool_name=st.none() | st.sampled_from(["lookup_knowledge", "query_logs"]) | text,
    output_length=count,
    retrieval_layer=st.sampled_from([None, "L0", "L1", "L0+L1", "L9"]),
    l0_match_count=count,
    l1_match_count=count,
    is_truncated=st.none() | st.booleans(),
    relevance_level=st.sampled_from([None, "PRECISE", "HIGHLY_RELEVANT", "REFERENCE", "DEDUPED", "ODD"]),
    dedup_reason=maybe_text,
    retrieval_details=evidence,
    duration_ms=count,
    success=st.none() | st.booleans(),
    error_message=st.none() | text | st.text(min_size=100, max_size=300),
    created_at=when,
    input_params=st.none() | text | st.builds(lambda q: json.dumps({"query": q}), text),
    output_preview=maybe_text,
)
settings_for = st.fixed_dictionaries(
    {
        "trace": st.fixed_dictionaries(
            {
                "conventions": st.sampled_from([["gen_ai"], ["gen_ai", "openinference"]]),
                "provider_name": st.sampled_from(["", "internal"]),
                "tool_time_anchor": st.sampled_from(["end", "start"]),
                "max_spans_per_trace": st.sampled_from([1000, 2]),
                # Small limits cut values and lists; the defaults leave them be.
                "max_attribute_length": st.sampled_from([4096, 12]),
                "max_list_length": st.sampled_from([128, 1]),
            }
        ),
        "content": st.fixed_dictionaries({"capture": st.booleans(), "max_length": st.sampled_from([1024, 50])}),
    }
)
ENCODERS: dict[str, tuple] = {}


def _pair(raw: dict):
    """A mapper and its run encoder per config, kept across examples so their memos and caches are exercised."""
    key = json.dumps(raw, sort_keys=True)
    if key not in ENCODERS:
        mapper = build_mapper(build_config(raw), SourceClock("UTC"))
        ENCODERS[key] = (mapper, RunEncoder(mapper, WireSpans(mapper.limits)))
    return ENCODERS[key]


late_sends = st.none() | st.builds(Late, st.frozensets(st.integers(1, 2**40), max_size=3), st.booleans())


@settings(max_examples=300, deadline=None)
@given(settings_for, runs, st.lists(tools, max_size=4), st.booleans(), late_sends, st.data())
def test_a_runs_wire_bytes_equal_the_protobuf_runtimes_for_its_readable_spans(raw, run, tool_rows, incomplete, late, data):
    mapper, runs_encoder = _pair(raw)
    if late is not None and tool_rows:  # some of the run's own rows came late
        late = late._replace(tool_ids=late.tool_ids | {data.draw(st.sampled_from([t.id for t in tool_rows]))})
    incomplete = incomplete and late is None
    mapped = mapper.map_run(run, tool_rows, incomplete, late)
    try:
        expected = [encode_span(span).SerializeToString() for span in mapped.spans]
    except ValueError:  # a time before 1970 that no OTLP field holds: the exporter leaves a value out
        with pytest.raises((ValueError, struct.error)):
            runs_encoder.encode(run, tool_rows, incomplete, late)
        return
    encoded, warnings = runs_encoder.encode(run, tool_rows, incomplete, late)
    assert encoded.encoded == expected
    assert warnings == mapped.warnings


def _bench_rows() -> tuple[RunRow, list[ToolRow]]:
    at = datetime(2026, 1, 1, 12)
    run = RunRow(1, "run-a", "sess-1", "SUCCESS", "CHAT_HARNESS", "DIAGNOSIS", "SUCCESS", None, 9000, 4200, 3, 2, at, at)
    details = json.dumps({"evidence_status": "supported", "evidence_refs": [{"raw_path": "$.logs[0]", "text": "t"}]})
    rag = ToolRow(7, "run-a", 1, "lookup_knowledge", 2048, "L0+L1", 3, 2, False, "PRECISE", None, details, 180, True, None, at)
    failed = ToolRow(8, "run-a", 2, "query_logs", 2048, None, None, None, False, None, None, None, 180, False, "timeout", at)
    return run, [rag, failed]


class CountingClock(SourceClock):
    """Counts the times read: a run mapped twice reads each of them twice. A Python subclass, so
    the count holds in the compiled build too, where a method of the mapper cannot be patched."""

    def __init__(self, zone_name: str):
        super().__init__(zone_name)
        self.reads = 0

    def epoch_ns(self, value: object) -> int | None:
        self.reads += 1
        return super().epoch_ns(value)


def test_a_run_past_the_limits_is_mapped_once_and_cut_as_the_readable_spans_are():
    clock = CountingClock("UTC")
    mapper = build_mapper(build_config({"trace": {"max_attribute_length": 5}}), clock)
    run, tool_rows = _bench_rows()
    readable = mapper.map_run(run, tool_rows)
    once = clock.reads
    assert once >= 1 + len(tool_rows)  # the precondition: a mapping reads the run's and each call's time
    expected = [encode_span(s).SerializeToString() for s in readable.spans]
    clock.reads = 0
    encoded, _ = RunEncoder(mapper, WireSpans(mapper.limits)).encode(run, tool_rows)
    assert encoded.encoded == expected
    assert clock.reads == once  # one pass, even past the limits: the wire cuts as it writes
    cut_records = [s for s in expected if A.RUN_OTEL_ATTRIBUTES_CUT.encode() in s]
    assert len(cut_records) == len(expected)  # the precondition: every span was cut


def test_the_wire_cuts_what_the_limits_cut_as_the_readable_spans_do():
    limits = AttributeLimits(value_length=4, list_length=2)
    cases = (("k", "12345"), ("k", ("a", "b", "c")), ("k", ("12345",)), ("retrieval.documents.2.document.id", "x"))
    for key, value in cases:
        assert not limits.fits(key, value)  # the precondition: each is past the limits
        span = SpanData(b"\x01" * 16, b"\x02" * 8, b"", "n", 1, 2, ((key, value), ("kept", "ok")))
        readable = ReadableSpans(limits).replay(span)
        assert readable != span
        assert WireSpans(limits).replay(span) == encode_span(readable).SerializeToString(), (key, value)


def test_the_value_caches_tell_equal_values_apart():
    out = WireSpans(AttributeLimits())
    for value in (True, 1, False, 0, "1", 0.0, -0.0):
        out.begin()
        out.put("k", value)
        wire = out.finish((b"\x01" * 16, b"\x02" * 8, b"", "n", 1, 2), (0, "", ()), None)
        assert wire == encode_span(SpanData(b"\x01" * 16, b"\x02" * 8, b"", "n", 1, 2, (("k", value),))).SerializeToString()
