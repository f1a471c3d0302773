"""The OpenInference profile in a real Arize Phoenix: MariaDB -> `run-otel once` -> Phoenix's
OTLP/HTTP endpoint, read back through its REST and GraphQL APIs."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
from conftest import bridge_sections, run_cli, table_rows, write_config
from servers import Phoenix, wait_for
from test_bridge_mariadb import seed

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
    runs = table_rows(agent_db, f"SELECT run_id, session_id FROM diagnosis_run WHERE status IN {TERMINAL}")
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


def test_openinference_runs_render_as_agent_tool_and_retriever_with_documents_sessions_and_project(
    agent_db, tmp_path, phoenix
):
    project = f"sre-diagnosis-{os.getpid()}"
    seed(agent_db, 20, seed_value=31, waiting=0)
    runs, tools = expected_rows(agent_db)
    export_to_phoenix(
        agent_db, tmp_path, phoenix, trace={"conventions": ["gen_ai", "openinference"], "project_name": project},
        content={"capture": True},
    )
    spans = project_spans(phoenix, project, len(runs) + len(tools))
    assert len(spans) == len(runs) + len(tools)
    retrievers = [tool for tool in tools if tool["retrieval_layer"] is not None]
    assert Counter(span["span_kind"] for span in spans) == {
        "AGENT": len(runs), "RETRIEVER": len(retrievers), "TOOL": len(tools) - len(retrievers)
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


def test_the_default_gen_ai_profile_alone_renders_as_agent_and_tool(agent_db, tmp_path, phoenix):
    # Phoenix converts gen_ai.* itself (since 15.10); runs land in its default project.
    service = f"genai-only-{os.getpid()}"
    seed(agent_db, 8, seed_value=32, waiting=0)
    runs, tools = expected_rows(agent_db)
    export_to_phoenix(agent_db, tmp_path, phoenix, service={"name": service})
    ours = wait_for(
        lambda: len(found := [s for s in phoenix.rest("projects/default/spans", limit=1000)
                              if s["attributes"].get("diagnosis.run.id") in {r["run_id"] for r in runs}])
        >= len(runs) + len(tools) and found,
        60,
        "the gen_ai-only spans in Phoenix's default project",
        0.5,
    )
    assert Counter(span["span_kind"] for span in ours) == {"AGENT": len(runs), "TOOL": len(tools)}
    assert service not in {p["name"] for p in phoenix.rest("projects")}
