"""The OpenInference profile in a real Arize Phoenix: MariaDB -> `run-otel once` -> Phoenix's
OTLP/HTTP endpoint, read back through its REST and GraphQL APIs."""

from __future__ import annotations

import json
import os
from collections import Counter
from datetime import datetime

import pytest
from helpers import bridge_sections, run_cli, seed, table_rows, write_config
from servers import Phoenix, wait_for

NO_EVIDENCE = "$.no_evidence"
TERMINAL = "('SUCCESS', 'FALLBACK', 'FAILED', 'CANCELLED')"


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    server = Phoenix(tmp_path_factory.mktemp("phoenix"))
    server.start()
    yield server
    server.stop()


def export_to_phoenix(agent_db, tmp_path, phoenix, **overrides) -> None:
    sections = bridge_sections(agent_db, tmp_path, phoenix.url, "http/protobuf", **overrides)
    done = run_cli("once", "--config", str(write_config(tmp_path / "run-otel.toml", sections)))
    assert done.returncode == 0, done.stderr


def expected_rows(agent_db) -> tuple[list[dict], list[dict]]:
    # The demo mix holds a run or two still RUNNING: `once` leaves those for later.
    runs = table_rows(agent_db, f"SELECT run_id, session_id, status FROM diagnosis_run WHERE status IN {TERMINAL}")
    tools = table_rows(
        agent_db,
        "SELECT t.id, t.retrieval_layer, t.retrieval_details FROM tool_invocation t "
        f"JOIN diagnosis_run r ON r.run_id = t.run_id WHERE r.status IN {TERMINAL}",
    )
    return runs, tools


def project_spans(phoenix: Phoenix, project: str, count: int) -> list[dict]:
    return wait_for(
        lambda: len(spans := phoenix.rest(f"projects/{project}/spans", limit=1000)) >= count and spans,
        60,
        f"{count} spans in Phoenix project {project}",
        0.5,
    )


def documents_of(details: str | None) -> list[str]:
    refs = (json.loads(details) if details else {}).get("evidence_refs") or []
    return [ref["raw_path"] for ref in refs if ref.get("raw_path") != NO_EVIDENCE]


def test_openinference_runs_render_as_agent_tool_and_retriever_with_documents_sessions_and_project(agent_db, tmp_path, phoenix):
    project = f"sre-diagnosis-{os.getpid()}"
    seed(agent_db, 20, seed_value=31, waiting=0)
    # This seed has neither a failed run nor a failed call: one of each, so both are compared.
    agent_db.execute("UPDATE diagnosis_run SET status = 'FAILED' WHERE status = 'SUCCESS' ORDER BY id LIMIT 1")
    agent_db.execute(
        "UPDATE tool_invocation SET success = 0, error_message = 'timed out for bob@example.com' ORDER BY id LIMIT 1"
    )
    runs, tools = expected_rows(agent_db)
    export_to_phoenix(
        agent_db,
        tmp_path,
        phoenix,
        trace={"conventions": ["gen_ai", "openinference"], "project_name": project},
        content={"capture": True},
    )
    spans = project_spans(phoenix, project, len(runs) + len(tools))
    assert len(spans) == len(runs) + len(tools)
    retrievers = [tool for tool in tools if tool["retrieval_layer"] is not None]
    assert Counter(span["span_kind"] for span in spans) == {
        "AGENT": len(runs),
        "RETRIEVER": len(retrievers),
        "TOOL": len(tools) - len(retrievers),
    }

    # Each retriever's documents, as Phoenix counts them and as their ids read.
    by_call_id = {span["attributes"].get("gen_ai.tool.call.id"): span for span in spans}
    with_documents = 0
    for tool in retrievers:
        span = by_call_id[str(tool["id"])]
        paths = documents_of(tool["retrieval_details"])
        ids = [span["attributes"].get(f"retrieval.documents.{n}.document.id") for n in range(len(paths))]
        assert ids == paths
        (node,) = phoenix.graphql(f'{{ node(id: "{span["id"]}") {{ ... on Span {{ numDocuments }} }} }}').values()
        assert node["numDocuments"] == len(paths)
        with_documents += bool(paths)
    assert with_documents > 0  # documents were really compared, not only empty lists

    sessions = phoenix.rest(f"projects/{project}/sessions", limit=100)
    assert {session["session_id"] for session in sessions} == {run["session_id"] for run in runs}
    assert project in {p["name"] for p in phoenix.rest("projects")}

    # The status Phoenix's traces list shows: only a success is OK; a failure's error is an event too.
    status_of = {run["run_id"]: run["status"] for run in runs}
    roots = [span for span in spans if not span.get("parent_id")]
    shown = Counter((status_of[r["attributes"]["diagnosis.run.id"]], r["status_code"]) for r in roots)
    assert {o for o, _c in shown} >= {"SUCCESS", "FAILED", "CANCELLED"}, shown  # the precondition
    assert all(code == ("OK" if outcome == "SUCCESS" else "ERROR") for outcome, code in shown), shown
    exceptions = 0
    for span in spans:
        if span["status_code"] == "ERROR" and (
            span.get("parent_id") or status_of[span["attributes"]["diagnosis.run.id"]] == "FAILED"
        ):
            (event,) = span["events"]
            assert event["name"] == "exception" and event["attributes"]["exception.message"] == span["status_message"]
            exceptions += 1
    assert exceptions >= 2


def test_the_default_gen_ai_profile_alone_renders_as_agent_tool_and_retriever(agent_db, tmp_path, phoenix):
    # Phoenix converts gen_ai.* itself (since 15.10); runs land in its default project.
    service = f"genai-only-{os.getpid()}"
    seed(agent_db, 8, seed_value=32, waiting=0)
    runs, tools = expected_rows(agent_db)
    export_to_phoenix(agent_db, tmp_path, phoenix, service={"name": service})
    ours = wait_for(
        lambda: (
            len(
                found := [
                    s
                    for s in phoenix.rest("projects/default/spans", limit=1000)
                    if s["attributes"].get("diagnosis.run.id") in {r["run_id"] for r in runs}
                ]
            )
            >= len(runs) + len(tools)
            and found
        ),
        60,
        "the gen_ai-only spans in Phoenix's default project",
        0.5,
    )
    # Phoenix reads the conventions' retrieval operation as a RETRIEVER of its own accord.
    retrievers = sum(tool["retrieval_layer"] is not None for tool in tools)
    assert retrievers > 0
    assert Counter(span["span_kind"] for span in ours) == {
        "AGENT": len(runs),
        "RETRIEVER": retrievers,
        "TOOL": len(tools) - retrievers,
    }
    assert service not in {p["name"] for p in phoenix.rest("projects")}


def phoenix_trace_latency_ms(phoenix: Phoenix, project: str, trace_id: str) -> float:
    (project_id,) = [p["id"] for p in phoenix.rest("projects") if p["name"] == project]
    node = phoenix.graphql(
        f'{{ node(id: "{project_id}") {{ ... on Project {{ trace(traceId: "{trace_id}") {{ latencyMs }} }} }} }}'
    )
    return node["node"]["trace"]["latencyMs"]


def root_annotations(phoenix: Phoenix, project: str, root_span_id: str) -> list[dict]:
    return phoenix.rest(f"projects/{project}/span_annotations", span_ids=root_span_id)


def test_a_rating_after_export_is_a_human_annotation_on_the_root_and_leaves_the_latency_alone(agent_db, tmp_path, phoenix):
    project = f"rated-{os.getpid()}"
    seed(agent_db, 4, seed_value=33, waiting=0)
    agent_db.execute("UPDATE diagnosis_run SET feedback = NULL")
    runs, tools = expected_rows(agent_db)
    overrides = dict(trace={"conventions": ["gen_ai", "openinference"], "project_name": project}, ui={"phoenix_url": phoenix.url})
    export_to_phoenix(agent_db, tmp_path, phoenix, **overrides)
    spans = project_spans(phoenix, project, len(runs) + len(tools))
    run_id = runs[0]["run_id"]
    (root,) = [s for s in spans if s["attributes"].get("diagnosis.run.id") == run_id and not s.get("parent_id")]
    trace_id, root_id = root["context"]["trace_id"], root["context"]["span_id"]
    run_ms = (datetime.fromisoformat(root["end_time"]) - datetime.fromisoformat(root["start_time"])).total_seconds() * 1000
    latency = wait_for(lambda: phoenix_trace_latency_ms(phoenix, project, trace_id), 30, "the trace's latency", 0.5)
    assert latency == pytest.approx(run_ms, abs=0.01) and run_ms < 10 * 60 * 1000  # the precondition
    assert root_annotations(phoenix, project, root_id) == []

    # Rated 24 minutes after the run started, long after it was sent.
    agent_db.execute(
        "UPDATE diagnosis_run SET feedback = 'DOWN', updated_at = created_at + INTERVAL 24 MINUTE WHERE run_id = %s", run_id
    )
    export_to_phoenix(agent_db, tmp_path, phoenix, **overrides)
    (annotation,) = root_annotations(phoenix, project, root_id)
    assert (annotation["name"], annotation["annotator_kind"]) == ("user_feedback", "HUMAN")
    assert (annotation["result"]["label"], annotation["result"]["score"]) == ("DOWN", 0.0)
    assert annotation["metadata"]["run_id"] == run_id
    wait_for(
        lambda: any(
            s["attributes"].get("gen_ai.evaluation.score.label") == "DOWN"
            for s in phoenix.rest(f"projects/{project}/spans", limit=1000)
        ),
        30,
        "the rating's span in Phoenix",
        0.5,
    )
    assert phoenix_trace_latency_ms(phoenix, project, trace_id) == pytest.approx(run_ms, abs=0.01)

    # A changed rating replaces the annotation: one current value.
    agent_db.execute(
        "UPDATE diagnosis_run SET feedback = 'UP', updated_at = created_at + INTERVAL 30 MINUTE WHERE run_id = %s", run_id
    )
    export_to_phoenix(agent_db, tmp_path, phoenix, **overrides)
    (annotation,) = root_annotations(phoenix, project, root_id)
    assert (annotation["result"]["label"], annotation["result"]["score"]) == ("UP", 1.0)
