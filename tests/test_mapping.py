"""SPEC section 1, rule by rule, on hand-built rows (no database)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

import pytest
from otlp_helpers import encode_spans

from run_otel.config import Config, build_config
from run_otel.export.encoding import resource_attributes
from run_otel.factory import build_mapper
from run_otel.mapping import attributes as A
from run_otel.mapping.content import is_content_attribute
from run_otel.mapping.span_data import STATUS_ERROR, STATUS_OK, STATUS_UNSET
from run_otel.mapping.spans import Late, Mapper
from run_otel.source.clock import SourceClock
from run_otel.source.rows import RunRow, ToolRow

RUN_ID = "run-550e8400-e29b-41d4-a716-446655440000"


def make_run(**kw) -> RunRow:
    values = dict(
        id=7,
        run_id=RUN_ID,
        session_id="sess-1",
        status="SUCCESS",
        agent_flow="CHAT_HARNESS",
        intent="DIAGNOSIS",
        release_outcome="SUCCESS",
        feedback=None,
        total_duration_ms=5000,
        total_token_count=1234,
        step_count=3,
        tool_call_count=2,
        created_at=datetime(2026, 1, 1, 0, 0, 0),
        updated_at=datetime(2026, 1, 1, 0, 0, 6),
    )
    values.update(kw)
    return RunRow(**values)


def make_tool(id_: int, **kw) -> ToolRow:
    values = dict(
        id=id_,
        run_id=RUN_ID,
        step_id=1,
        tool_name="lookup_knowledge",
        output_length=10,
        retrieval_layer="L0",
        l0_match_count=3,
        l1_match_count=None,
        is_truncated=False,
        relevance_level="PRECISE",
        dedup_reason=None,
        retrieval_details='{"evidence_status":"supported","evidence_refs":[{"raw_path":"$.logs[0]","text":"t"}]}',
        duration_ms=1500,
        success=True,
        error_message=None,
        created_at=datetime(2026, 1, 1, 0, 0, 2),
    )
    values.update(kw)
    return ToolRow(**values)


def mapper(**sections) -> Mapper:
    return mapper_for(build_config(sections))


def mapper_for(config: Config) -> Mapper:
    return build_mapper(config, SourceClock(config.source.timezone))


def ns(dt: datetime) -> int:
    return int(dt.replace(tzinfo=UTC).timestamp()) * 1_000_000_000


# -- ids ----------------------------------------------------------------------


def test_trace_id_is_the_uuid_of_a_run_uuid_id():
    root = mapper().map_run(make_run(), []).root
    assert root.trace_id.hex() == "550e8400e29b41d4a716446655440000"


def test_trace_id_accepts_upper_case_uuid():
    root = mapper().map_run(make_run(run_id=RUN_ID.upper().replace("RUN-", "run-")), []).root
    assert root.trace_id.hex() == "550e8400e29b41d4a716446655440000"


@pytest.mark.parametrize("run_id", ["legacy-42", "run-not-a-uuid", "run-550e8400e29b41d4a716446655440000"])
def test_trace_id_falls_back_to_sha256(run_id):
    root = mapper().map_run(make_run(run_id=run_id), []).root
    assert root.trace_id == hashlib.sha256(f"diagnosis_run:{run_id}".encode()).digest()[:16]


def test_all_zero_uuid_is_never_a_trace_id():
    run_id = "run-00000000-0000-0000-0000-000000000000"
    root = mapper().map_run(make_run(run_id=run_id), []).root
    assert any(root.trace_id)
    assert root.trace_id == hashlib.sha256(f"diagnosis_run:{run_id}".encode()).digest()[:16]


def test_span_ids_are_hashes_of_run_and_tool_ids():
    mapped = mapper().map_run(make_run(), [make_tool(41), make_tool(42)])
    assert mapped.root.span_id == hashlib.sha256(f"run:{RUN_ID}".encode()).digest()[:8]
    for span, tool_id in zip(mapped.spans[1:], (41, 42)):
        assert span.span_id == hashlib.sha256(f"tool_invocation:{RUN_ID}:{tool_id}".encode()).digest()[:8]
        assert span.parent_span_id == mapped.root.span_id
        assert span.trace_id == mapped.root.trace_id
    assert mapped.root.parent_span_id == b""


# -- names and timing -----------------------------------------------------------


def test_names_follow_gen_ai_conventions():
    mapped = mapper(trace={"agent_name": "ops-agent"}).map_run(make_run(), [make_tool(1)])
    assert mapped.root.name == "invoke_agent ops-agent"
    # A RAG lookup (retrieval_layer set) is the conventions' retrieval operation; any other call a tool.
    assert mapped.spans[1].name == "retrieval lookup_knowledge"
    plain = mapper().map_run(make_run(), [make_tool(1, retrieval_layer=None, tool_name="restart_pod")]).spans[1]
    assert plain.name == "execute_tool restart_pod"
    assert plain.attribute_map()["gen_ai.operation.name"] == "execute_tool"


def test_root_runs_for_total_duration():
    root = mapper().map_run(make_run(), []).root
    assert root.start_ns == ns(datetime(2026, 1, 1))
    assert root.end_ns - root.start_ns == 5_000_000_000


def test_root_falls_back_to_updated_at_without_duration():
    root = mapper().map_run(make_run(total_duration_ms=None), []).root
    assert root.end_ns == ns(datetime(2026, 1, 1, 0, 0, 6))


def test_root_widens_to_cover_children():
    early = make_tool(1, created_at=datetime(2025, 12, 31, 23, 59, 59), duration_ms=2000)
    late = make_tool(2, created_at=datetime(2026, 1, 1, 0, 0, 9), duration_ms=10)
    root = mapper().map_run(make_run(), [early, late]).root
    assert root.start_ns == ns(datetime(2025, 12, 31, 23, 59, 57))
    assert root.end_ns == ns(datetime(2026, 1, 1, 0, 0, 9))


def test_tool_span_ends_at_created_at_by_default():
    span = mapper().map_run(make_run(), [make_tool(1)]).spans[1]
    assert span.end_ns == ns(datetime(2026, 1, 1, 0, 0, 2))
    assert span.end_ns - span.start_ns == 1_500_000_000


def test_tool_time_anchor_start_flips_it():
    span = mapper(trace={"tool_time_anchor": "start"}).map_run(make_run(), [make_tool(1)]).spans[1]
    assert span.start_ns == ns(datetime(2026, 1, 1, 0, 0, 2))
    assert span.end_ns - span.start_ns == 1_500_000_000


def test_null_tool_duration_is_zero_length():
    span = mapper().map_run(make_run(), [make_tool(1, duration_ms=None)]).spans[1]
    assert span.start_ns == span.end_ns == ns(datetime(2026, 1, 1, 0, 0, 2))


def test_source_timezone_shifts_naive_datetimes():
    shanghai = mapper(source={"timezone": "Asia/Shanghai"}).map_run(make_run(), [make_tool(1)])
    utc = mapper().map_run(make_run(), [make_tool(1)])
    eight_hours = 8 * 3600 * 1_000_000_000
    assert utc.root.start_ns - shanghai.root.start_ns == eight_hours
    assert utc.spans[1].end_ns - shanghai.spans[1].end_ns == eight_hours
    # 2026-01-01 08:00 in Shanghai is midnight UTC.
    local = mapper(source={"timezone": "Asia/Shanghai"}).map_run(make_run(created_at=datetime(2026, 1, 1, 8)), []).root
    assert local.start_ns == ns(datetime(2026, 1, 1))


# -- status ---------------------------------------------------------------------


def test_a_successful_run_is_ok():
    root = mapper().map_run(make_run(status="SUCCESS"), []).root
    assert root.status_code == STATUS_OK and not root.status_message and not root.events
    assert "error.type" not in root.attribute_map()


@pytest.mark.parametrize(
    ("status", "error_type", "description"),
    [("FALLBACK", "run_fallback", "run fell back"), ("CANCELLED", "run_cancelled", "run was cancelled")],
)
def test_fallback_and_cancelled_are_marked_in_lists_but_are_not_exceptions(status, error_type, description):
    # Jaeger's trace list marks only errors: anything else would look like a SUCCESS there.
    root = mapper().map_run(make_run(status=status), []).root
    assert root.status_code == STATUS_ERROR and root.status_message == description
    assert root.attribute_map()["error.type"] == error_type
    assert root.attribute_map()["diagnosis.run.status"] == status
    assert not root.events  # nothing was raised: the outcome, not a failure


def test_failed_run_is_an_error_with_an_exception_event():
    root = mapper().map_run(make_run(status="FAILED"), []).root
    assert root.status_code == STATUS_ERROR
    assert root.attribute_map()["error.type"] == "run_failed"
    assert root.events == (("exception", root.end_ns, (("exception.type", "run_failed"), ("exception.message", "run failed"))),)


@pytest.mark.parametrize("status", ["PENDING", "RUNNING", None])
def test_incomplete_run_is_an_error(status):
    root = mapper().map_run(make_run(status=status), [], incomplete=True).root
    attrs = root.attribute_map()
    assert root.status_code == STATUS_ERROR
    assert attrs["error.type"] == "run_incomplete"
    assert attrs["diagnosis.run.incomplete"] is True


def test_unknown_status_is_exported_unset():
    mapped = mapper().map_run(make_run(status="ARCHIVED"), [])
    assert mapped.root.status_code == STATUS_UNSET
    assert mapped.root.attribute_map()["diagnosis.run.status"] == "ARCHIVED"


def test_failed_tool_is_an_error_with_redacted_message():
    tool = make_tool(1, success=False, error_message="denied for bob@example.com " + "x" * 5000)
    span = mapper().map_run(make_run(), [tool]).spans[1]
    assert span.status_code == STATUS_ERROR
    assert span.attribute_map()["error.type"] == "tool_error"
    assert "bob@example.com" not in span.status_message
    assert "[REDACTED]" in span.status_message
    assert len(span.status_message) == 1024
    # Jaeger's Logs section shows events: the error is there too, as record_exception writes it.
    ((name, at_ns, attrs),) = span.events
    assert (name, at_ns) == ("exception", span.end_ns)
    assert dict(attrs) == {"exception.type": "tool_error", "exception.message": span.status_message}


def test_a_1_mb_error_message_is_cut_to_the_limit_and_the_cut_is_recorded():
    tool = make_tool(1, success=False, error_message="timeout talking to the index " + "y" * (1024 * 1024))
    span = mapper(content={"max_length": 512}).map_run(make_run(), [tool]).spans[1]
    assert len(span.status_message) == 512
    assert span.status_message.startswith("timeout talking to the index ")
    assert span.attribute_map()[A.RUN_OTEL_ATTRIBUTES_CUT] == (A.EXCEPTION_MESSAGE,)
    # A message within the limit is not named as cut.
    short = mapper(content={"max_length": 512}).map_run(make_run(), [make_tool(1, success=False, error_message="boom")])
    assert A.RUN_OTEL_ATTRIBUTES_CUT not in short.spans[1].attribute_map()


def test_a_tool_that_did_not_fail_has_no_event():
    assert [s.events for s in mapper().map_run(make_run(), [make_tool(1), make_tool(2, success=None)]).spans] == [(), (), ()]


def test_null_success_leaves_status_unset():
    span = mapper().map_run(make_run(), [make_tool(1, success=None)]).spans[1]
    assert span.status_code == STATUS_UNSET
    assert "error.type" not in span.attribute_map()


def test_no_evidence_is_not_an_error():
    details = '{"evidence_status":"no_evidence","evidence_refs":[{"raw_path":"$.no_evidence","text":""}]}'
    span = mapper().map_run(make_run(), [make_tool(1, retrieval_details=details)]).spans[1]
    attrs = span.attribute_map()
    assert span.status_code == STATUS_UNSET
    assert attrs["rag.evidence.paths"] == ("$.no_evidence",)
    assert attrs["rag.evidence.status"] == "no_evidence"


# -- attributes -----------------------------------------------------------------


def test_root_attributes():
    attrs = mapper(trace={"provider_name": "deepseek"}).map_run(make_run(), []).root.attribute_map()
    assert attrs == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "diagnosis-agent",
        "gen_ai.provider.name": "deepseek",
        "gen_ai.conversation.id": "sess-1",
        "session.id": "sess-1",
        "diagnosis.run.id": RUN_ID,
        "diagnosis.run.status": "SUCCESS",
        "diagnosis.run.intent": "DIAGNOSIS",
        "diagnosis.run.release_outcome": "SUCCESS",
        "diagnosis.run.agent_flow": "CHAT_HARNESS",
        "diagnosis.run.step_count": 3,
        "diagnosis.run.tool_call_count": 2,
        "diagnosis.run.total_token_count": 1234,
        "diagnosis.run.duration_ms": 5000,
    }


def test_tool_attributes():
    attrs = mapper().map_run(make_run(), [make_tool(9, dedup_reason="doc_retrieved")]).spans[1].attribute_map()
    assert attrs == {
        "gen_ai.operation.name": "retrieval",
        "gen_ai.tool.name": "lookup_knowledge",
        "gen_ai.tool.call.id": "9",
        "gen_ai.tool.type": "datastore",
        "gen_ai.conversation.id": "sess-1",
        "diagnosis.run.id": RUN_ID,
        "diagnosis.step.id": 1,
        "rag.retrieval_layer": "L0",
        "rag.l0_match_count": 3,
        "rag.relevance_level": "PRECISE",
        "rag.dedup_reason": "doc_retrieved",
        "rag.evidence.status": "supported",
        "rag.evidence.count": 1,
        "rag.evidence.paths": ("$.logs[0]",),
        "gen_ai.data_source.id": "lookup_knowledge",
        "gen_ai.retrieval.documents": '[{"id":"$.logs[0]","score":1.0}]',
        "tool.output_length": 10,
        "tool.output_truncated": False,
        "tool.duration_ms": 1500,
    }


def test_function_tool_type_without_retrieval_layer():
    attrs = mapper().map_run(make_run(), [make_tool(1, retrieval_layer=None)]).spans[1].attribute_map()
    assert attrs["gen_ai.tool.type"] == "function"
    assert "rag.retrieval_layer" not in attrs


def test_null_columns_are_omitted():
    run = make_run(
        session_id=None,
        status="SUCCESS",
        agent_flow=None,
        intent=None,
        release_outcome=None,
        feedback=None,
        total_duration_ms=None,
        total_token_count=None,
        step_count=None,
        tool_call_count=None,
    )
    tool = make_tool(
        1,
        step_id=None,
        output_length=None,
        retrieval_layer=None,
        l0_match_count=None,
        l1_match_count=None,
        is_truncated=None,
        relevance_level=None,
        dedup_reason=None,
        retrieval_details=None,
        duration_ms=None,
        success=None,
    )
    mapped = mapper().map_run(run, [tool])
    assert set(mapped.root.attribute_map()) == {
        "gen_ai.operation.name",
        "gen_ai.agent.name",
        "diagnosis.run.id",
        "diagnosis.run.status",
    }
    assert set(mapped.spans[1].attribute_map()) == {
        "gen_ai.operation.name",
        "gen_ai.tool.name",
        "gen_ai.tool.call.id",
        "gen_ai.tool.type",
        "diagnosis.run.id",
    }
    assert mapped.warnings == []


def test_content_is_off_by_default():
    run = make_run(query="secret question", answer="secret answer", published_result='{"a":1}')
    tool = make_tool(1, input_params='{"q":"secret"}', output_preview="secret output")
    mapped = mapper().map_run(run, [tool])
    blob = encode_spans(mapped.spans, {}).SerializeToString()
    assert b"secret" not in blob


@pytest.mark.parametrize("duration", [-5, 86_400_001])
def test_an_out_of_range_tool_duration_is_left_out_of_the_span_and_its_attribute(duration):
    mapped = mapper().map_run(make_run(), [make_tool(1, duration_ms=duration)])
    span = mapped.spans[1]
    assert "tool.duration_ms" not in span.attribute_map()
    assert span.start_ns == span.end_ns
    assert any("duration_ms out of range" in w for w in mapped.warnings)


PROFILES = (["gen_ai"], ["gen_ai", "openinference"])


@pytest.mark.parametrize("conventions", PROFILES)
def test_capture_off_exports_no_content_under_any_profile(conventions):
    run = make_run(query="MARK-query", answer="MARK-answer", published_result='{"MARK":"pub"}')
    tools = [
        make_tool(
            1,
            input_params='{"q":"MARK-args"}',
            output_preview="MARK-out",
            retrieval_details='{"evidence_refs":[{"raw_path":"$.a","text":"MARK-evidence"}]}',
        ),
        make_tool(2, success=False, error_message="failed", input_params="MARK-args2"),
    ]
    mapped = mapper(trace={"conventions": conventions}).map_run(run, tools)
    for span in mapped.spans:
        assert not [key for key in span.attribute_map() if is_content_attribute(key)], span.name
    assert b"MARK" not in encode_spans(mapped.spans, {}).SerializeToString()


@pytest.mark.parametrize("conventions", PROFILES)
def test_content_goes_only_to_the_attributes_the_policy_names(conventions):
    run = make_run(query="MARK-query", answer="MARK-answer", published_result='{"MARK":"pub"}')
    tools = [
        make_tool(
            1,
            input_params='{"q":"MARK-args"}',
            output_preview="MARK-out",
            retrieval_details='{"evidence_refs":[{"raw_path":"$.a","text":"MARK-evidence"}]}',
        )
    ]
    mapped = mapper(trace={"conventions": conventions}, content={"capture": True}).map_run(run, tools)
    carriers = set()
    for span in mapped.spans:
        for key, value in span.attributes:
            if "MARK" in str(value):
                carriers.add(key)
    assert carriers and all(is_content_attribute(key) for key in carriers), carriers
    assert ("input.value" in carriers) == ("openinference" in conventions)


def test_content_when_opted_in_is_redacted_and_truncated():
    run = make_run(query="mail me at a.b@example.org " + "q" * 3000, answer="ok", published_result='{"a":1}')
    tool = make_tool(1, input_params='{"key":"sk-abcdefghijklmnop1234"}', output_preview="call 13812345678")
    mapped = mapper(content={"capture": True, "max_length": 100}).map_run(run, [tool])
    root, span = mapped.root.attribute_map(), mapped.spans[1].attribute_map()
    assert root["diagnosis.run.query"].startswith("mail me at [REDACTED]")
    assert len(root["diagnosis.run.query"]) == 100
    assert root["diagnosis.run.answer"] == "ok"
    assert root["diagnosis.run.published_result"] == '{"a":1}'
    assert "sk-abc" not in span["gen_ai.tool.call.arguments"]
    assert span["gen_ai.tool.call.result"] == "call [REDACTED]"
    assert '"text":"t"' in span["rag.evidence.refs"]


OPENINFERENCE = {"conventions": ["gen_ai", "openinference"]}
EVIDENCE = (
    '{"evidence_status":"supported","evidence_refs":[{"raw_path":"$.docs[0]","text":"disk full on db-1"},'
    '{"raw_path":"$.no_evidence","text":"none"},{"raw_path":"$.docs[3]","text":"see runbook 12"}]}'
)


def test_openinference_profile_adds_its_keys():
    run = make_run(query="q?", answer="a.")
    tool = make_tool(1, retrieval_layer=None, tool_name="query_logs", input_params='{"q": 1}', output_preview="out")
    mapped = mapper(trace=OPENINFERENCE, content={"capture": True}).map_run(run, [tool])
    root, span = mapped.root.attribute_map(), mapped.spans[1].attribute_map()
    assert root["openinference.span.kind"] == "AGENT"
    assert (root["input.value"], root["output.value"]) == ("q?", "a.")
    assert (root["input.mime_type"], root["output.mime_type"]) == ("text/plain", "text/plain")
    assert span["openinference.span.kind"] == "TOOL"
    assert span["tool.name"] == "query_logs"
    assert span["session.id"] == "sess-1"
    assert (span["input.value"], span["output.value"]) == ('{"q": 1}', "out")
    assert (span["input.mime_type"], span["output.mime_type"]) == ("application/json", "text/plain")
    assert not [key for key in span if key.startswith("retrieval.")]


def test_a_rag_lookup_is_a_retriever_with_its_evidence_as_documents():
    tool = make_tool(1, l1_match_count=2, input_params='{"query": "why is db-1 slow", "limit": 5}', retrieval_details=EVIDENCE)
    off = mapper(trace=OPENINFERENCE).map_run(make_run(), [tool]).spans[1].attribute_map()
    on = mapper(trace=OPENINFERENCE, content={"capture": True}).map_run(make_run(), [tool]).spans[1].attribute_map()
    gen_ai_only = mapper().map_run(make_run(), [tool]).spans[1].attribute_map()
    assert off["openinference.span.kind"] == on["openinference.span.kind"] == "RETRIEVER"
    # Every gen_ai.*, rag.* and tool.* key of the default profile is still there, unchanged.
    assert {k: v for k, v in off.items() if k in gen_ai_only} == gen_ai_only
    documents = {k: v for k, v in off.items() if k.startswith("retrieval.documents.")}
    assert documents == {
        "retrieval.documents.0.document.id": "$.docs[0]",
        "retrieval.documents.0.document.score": 1.0,  # PRECISE
        "retrieval.documents.0.document.metadata": documents["retrieval.documents.0.document.metadata"],
        "retrieval.documents.1.document.id": "$.docs[3]",
        "retrieval.documents.1.document.score": 1.0,
        "retrieval.documents.1.document.metadata": documents["retrieval.documents.1.document.metadata"],
    }
    assert json.loads(documents["retrieval.documents.1.document.metadata"]) == {
        "retrieval_layer": "L0",
        "relevance_level": "PRECISE",
        "l0_match_count": 3,
        "l1_match_count": 2,
    }
    assert "input.value" not in off  # the query is content
    assert on["retrieval.documents.0.document.content"] == "disk full on db-1"
    assert on["retrieval.documents.1.document.content"] == "see runbook 12"
    assert (on["input.value"], on["input.mime_type"]) == ("why is db-1 slow", "text/plain")


@pytest.mark.parametrize(("level", "score"), [("PRECISE", 1.0), ("HIGHLY_RELEVANT", 0.75), ("REFERENCE", 0.5), ("DEDUPED", 0.25)])
def test_a_document_with_its_own_id_keeps_it_across_runs_and_scores_by_relevance(level, score):
    details = json.dumps(
        {
            "evidence_refs": [
                {"raw_path": "$.docs[2]", "doc_id": "kb-4711", "text": "t"},
                {"raw_path": "$.docs[0]", "document_id": 42},
                {"raw_path": "$.docs[1]", "doc_id": ""},
            ]
        }
    )
    spans = [
        mapper(trace=OPENINFERENCE)
        .map_run(make_run(run_id=run_id), [make_tool(1, retrieval_details=details, relevance_level=level)])
        .spans[1]
        for run_id in ("run-a", "run-b")
    ]
    first, second = (span.attribute_map() for span in spans)
    ids = [first[f"retrieval.documents.{n}.document.id"] for n in range(3)]
    assert ids == ["kb-4711", "42", "$.docs[1]"]  # an empty id is no id: the path stands in
    assert ids == [second[f"retrieval.documents.{n}.document.id"] for n in range(3)]
    assert [first[f"retrieval.documents.{n}.document.score"] for n in range(3)] == [score] * 3
    # The conventions' own attribute names the same documents, with the same ids and scores.
    assert json.loads(first["gen_ai.retrieval.documents"]) == [{"id": doc_id, "score": score} for doc_id in ids]
    assert json.loads(first["retrieval.documents.0.document.metadata"])["raw_path"] == "$.docs[2]"
    assert "raw_path" not in json.loads(first["retrieval.documents.2.document.metadata"])


def test_document_content_is_redacted_and_cut_like_all_content():
    details = json.dumps({"evidence_refs": [{"raw_path": "$.a", "text": "token sk-abcdefghijklmnop1234 " + "x" * 500}]})
    tool = make_tool(1, retrieval_details=details)
    span = mapper(trace=OPENINFERENCE, content={"capture": True, "max_length": 60}).map_run(make_run(), [tool]).spans[1]
    content = span.attribute_map()["retrieval.documents.0.document.content"]
    assert "sk-abcdefghijklmnop1234" not in content and "[REDACTED]" in content
    assert len(content) <= 60


def test_openinference_keys_are_the_conventions_own():
    from openinference.semconv.resource import ResourceAttributes
    from openinference.semconv.trace import DocumentAttributes, OpenInferenceSpanKindValues, SpanAttributes

    assert A.OPENINFERENCE_SPAN_KIND == SpanAttributes.OPENINFERENCE_SPAN_KIND
    assert A.OI_RETRIEVAL_DOCUMENTS == SpanAttributes.RETRIEVAL_DOCUMENTS
    assert (A.OI_DOCUMENT_ID, A.OI_DOCUMENT_CONTENT, A.OI_DOCUMENT_METADATA) == (
        DocumentAttributes.DOCUMENT_ID,
        DocumentAttributes.DOCUMENT_CONTENT,
        DocumentAttributes.DOCUMENT_METADATA,
    )
    assert (A.OI_INPUT_VALUE, A.OI_INPUT_MIME_TYPE, A.OI_OUTPUT_VALUE, A.OI_OUTPUT_MIME_TYPE) == (
        SpanAttributes.INPUT_VALUE,
        SpanAttributes.INPUT_MIME_TYPE,
        SpanAttributes.OUTPUT_VALUE,
        SpanAttributes.OUTPUT_MIME_TYPE,
    )
    assert A.OI_KIND_RETRIEVER == OpenInferenceSpanKindValues.RETRIEVER.value
    assert A.OI_PROJECT_NAME == ResourceAttributes.PROJECT_NAME


def test_span_cap_drops_extra_tools_and_says_so():
    tools = [make_tool(i) for i in range(1, 11)]
    mapped = mapper(trace={"max_spans_per_trace": 4}).map_run(make_run(), tools)
    assert len(mapped.spans) == 5
    attrs = mapped.root.attribute_map()
    assert attrs["diagnosis.run.tool_span_limit"] == 4
    assert attrs["diagnosis.run.tool_spans_dropped"] == 6


# -- determinism ----------------------------------------------------------------


def test_same_rows_twice_are_byte_identical():
    config = build_config({"service": {"name": "svc", "namespace": "ns"}})
    env = {"OTEL_RESOURCE_ATTRIBUTES": "k8s.cluster.name=prod"}
    rows = (make_run(), [make_tool(1), make_tool(2, success=False, error_message="boom")])
    first = encode_spans(
        mapper_for(config).map_run(*rows).spans, resource_attributes(config.service, config.trace, env)
    ).SerializeToString()
    second = encode_spans(
        mapper_for(config).map_run(*rows).spans, resource_attributes(config.service, config.trace, env)
    ).SerializeToString()
    assert first == second
    changed = rows[0]._replace(status="FAILED")
    third = encode_spans(
        mapper_for(config).map_run(changed, rows[1]).spans, resource_attributes(config.service, config.trace, env)
    )
    assert third.SerializeToString() != first


def test_a_rating_given_or_changed_leaves_the_run_spans_byte_identical():
    """A backfill after a rating re-sends the run: the same bytes, so Jaeger and Tempo keep one copy."""
    config = build_config({})
    tools = [make_tool(1)]
    unrated = encode_spans(mapper_for(config).map_run(make_run(feedback=None), tools).spans, {}).SerializeToString()
    for rating in ("DOWN", "UP"):
        rated = mapper_for(config).map_run(make_run(feedback=rating), tools)
        assert rated.spans[0].name.startswith("invoke_agent")  # the precondition: the root is among them
        assert encode_spans(rated.spans, {}).SerializeToString() == unrated


def test_a_late_finish_carries_no_rating_and_is_byte_identical_rated_or_not():
    """The completion child copies the root's attributes; ratings reach the trace only through the feedback pass."""
    config = build_config({"trace": {"conventions": ["gen_ai", "openinference"]}})
    tools = [make_tool(1), make_tool(2)]

    def late(feedback: str | None) -> list:
        return mapper_for(config).map_run(make_run(feedback=feedback), tools, late=Late(frozenset({2}), True)).spans

    rated = late("DOWN")
    completion = next(span for span in rated if span.name.endswith(A.COMPLETION_SUFFIX))
    assert (A.RUN_COMPLETED_LATE, True) in completion.attributes  # the precondition: the completion child is there
    for span in rated:
        keys = {key for key, _value in span.attributes}
        assert not {key for key in keys if "feedback" in key or key.startswith("gen_ai.evaluation")}, (span.name, keys)
    assert encode_spans(rated, {}).SerializeToString() == encode_spans(late(None), {}).SerializeToString()


def test_resource_carries_service_and_env_attributes():
    config = build_config({"service": {"name": "diag", "namespace": "ops", "environment": "prod"}})
    attrs = resource_attributes(config.service, config.trace, {"OTEL_RESOURCE_ATTRIBUTES": "team=sre,service.name=ignored"})
    assert attrs == {
        "deployment.environment.name": "prod",
        "service.name": "diag",
        "service.namespace": "ops",
        "team": "sre",
    }


def test_a_rating_given_later_lies_inside_the_runs_own_window_with_its_real_time_as_an_attribute():
    from run_otel.mapping.evaluation import Evaluations
    from run_otel.source.rows import FeedbackRow

    config = build_config({})
    clock = SourceClock(config.source.timezone)
    run = make_run(total_duration_ms=13_000, updated_at=datetime(2026, 1, 1, 0, 0, 13))
    root = mapper_for(config).map_run(run, [make_tool(1)]).root
    rated = datetime(2026, 1, 1, 0, 24, 0)  # 24 minutes after the run
    row = FeedbackRow(run.id, run.run_id, "DIAGNOSIS", "UP", rated, run.created_at, run.total_duration_ms)
    span = Evaluations(config.feedback, clock).span(row)
    assert root.start_ns <= span.start_ns <= span.end_ns == root.end_ns  # the trace keeps the run's extent
    assert span.end_ns - span.start_ns == 1_000  # its last microsecond
    assert span.attribute_map()["diagnosis.feedback.rated_at"].startswith("2026-01-01T00:24:00")
    # Without a duration the run's end is unknown now: zero-length at its start, never at the rating.
    bare = Evaluations(config.feedback, clock).span(row._replace(total_duration_ms=None))
    assert bare.start_ns == bare.end_ns == root.start_ns
