"""The OpenInference profile in a real Arize Phoenix: MariaDB -> `run-otel once` -> Phoenix's
OTLP/HTTP endpoint, read back through its REST and GraphQL APIs."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections import Counter
from datetime import datetime

import pytest
import requests
from helpers import DaemonProcess, add_runs, bridge_sections, rate, run_cli, seed, table_rows, write_config
from servers import Phoenix, free_port, wait_for

from run_otel.mapping.span_data import root_span_id_for

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
    agent_db.execute("UPDATE diagnosis_run SET feedback = NULL")  # ratings have tests of their own below
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
    agent_db.execute("UPDATE diagnosis_run SET feedback = NULL")  # ratings have tests of their own below
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


def test_a_run_sent_as_incomplete_that_finishes_later_shows_its_outcome_in_phoenix(agent_db, tmp_path, phoenix):
    from helpers import add_run, add_tool, new_run_id

    project = f"late-{os.getpid()}"
    run_id = new_run_id()
    conn = agent_db.server.root(agent_db.name)
    add_run(conn, run_id, status="RUNNING")  # two hours old: sent as incomplete
    conn.commit()
    trace = {"conventions": ["gen_ai", "openinference"], "project_name": project}
    export_to_phoenix(agent_db, tmp_path, phoenix, trace=trace)
    (root,) = project_spans(phoenix, project, 1)
    assert root["status_code"] == "ERROR"

    add_tool(conn, run_id, duration_ms=20)
    with conn.cursor() as cur:
        cur.execute("UPDATE diagnosis_run SET status='SUCCESS', total_duration_ms=3000 WHERE run_id=%s", (run_id,))
    conn.commit()
    export_to_phoenix(agent_db, tmp_path, phoenix, trace=trace)
    spans = project_spans(phoenix, project, 3)
    by_name = {span["name"]: span for span in spans}
    assert len(spans) == 3, [s["name"] for s in spans]  # one root: the completion is a child of it
    done = by_name["invoke_agent diagnosis-agent completed"]
    assert done["parent_id"] == root["context"]["span_id"] and done["span_kind"] == "AGENT"
    assert done["status_code"] == "OK" and done["attributes"]["diagnosis.run.status"] == "SUCCESS"
    # Written after the run was sent incomplete: under the completed span, whose time covers it.
    assert by_name["execute_tool lookup_knowledge"]["parent_id"] == done["context"]["span_id"]
    conn.close()


def test_a_rating_the_run_had_when_it_was_sent_is_an_annotation_on_its_root_too(agent_db, tmp_path, phoenix):
    """Most ratings come in before the run is sent; each becomes the one current annotation on its root."""
    project = f"rated-at-export-{os.getpid()}"
    seed(agent_db, 6, seed_value=34, waiting=0)
    agent_db.execute("UPDATE diagnosis_run SET feedback = IF(id % 2 = 0, 'UP', 'DOWN')")
    runs, tools = expected_rows(agent_db)
    assert len(runs) >= 4  # the precondition: several rated runs, all rated before the export
    overrides = dict(trace={"conventions": ["gen_ai", "openinference"], "project_name": project}, ui={"phoenix_url": phoenix.url})
    export_to_phoenix(agent_db, tmp_path, phoenix, **overrides)
    spans = project_spans(phoenix, project, len(runs) + len(tools))
    labels = {row["run_id"]: row["feedback"] for row in table_rows(agent_db, "SELECT run_id, feedback FROM diagnosis_run")}
    for run in runs:
        (root,) = [s for s in spans if s["attributes"].get("diagnosis.run.id") == run["run_id"] and not s.get("parent_id")]
        annotations = wait_for(
            lambda root=root: root_annotations(phoenix, project, root["context"]["span_id"]), 60, "the annotation", 0.5
        )
        assert [(a["name"], a["result"]["label"]) for a in annotations] == [("user_feedback", labels[run["run_id"]])]


@pytest.mark.server
def test_a_root_phoenix_never_stores_is_named_once_its_queue_is_done_with_the_rating(phoenix, caplog):
    """A rating whose root went elsewhere waits in Phoenix's queue, then is looked for again and named."""
    from run_otel.export.phoenix import PhoenixAnnotations

    now = [0.0]
    annotations = PhoenixAnnotations(phoenix.url, queue_seconds=600, clock=lambda: now[0])
    item = {
        "span_id": os.urandom(8).hex(),  # a root Phoenix never received
        "name": "user_feedback",
        "annotator_kind": "HUMAN",
        "result": {"label": "DOWN", "score": 0.0},
        "identifier": "diagnosis_run.feedback",
        "metadata": {"run_id": "run-nowhere"},
    }
    with caplog.at_level(logging.INFO, logger="run_otel.export.phoenix"):
        assert annotations.upsert([item]) is False  # left to Phoenix's queue
        assert "wait in its queue" in caplog.text and "never stored" not in caplog.text
        now[0] = 599.0
        assert annotations.look_again() == 0  # the queue may still store it: nothing said yet
        assert "never stored" not in caplog.text
        now[0] = 600.0
        assert annotations.look_again() == 1
        assert "Phoenix never stored the root span of 1 rated runs" in caplog.text and "run-nowhere" in caplog.text
        assert annotations.look_again() == 0  # said once
    annotations.close()


def test_the_feedback_pass_looks_again_at_what_it_left_to_phoenixs_queue(
    agent_db, receiver, tmp_path, phoenix, monkeypatch, caplog
):
    """A rated run whose trace went to another receiver: the pass leaves its annotation to Phoenix's
    queue, and a pass once that queue is done with it names the run, so the rating is not lost
    unnoticed and nothing waits for it any longer."""
    import uuid
    from functools import partial

    from helpers import add_finished_runs, bridge_config, rate

    from run_otel.export import phoenix as phoenix_module
    from run_otel.factory import build_feedback, build_parts, build_poller

    # Phoenix's queue time is minutes; the annotations' clock is the test's, so it passes at once.
    now = [0.0]
    monkeypatch.setattr(phoenix_module, "PhoenixAnnotations", partial(phoenix_module.PhoenixAnnotations, clock=lambda: now[0]))
    (trace_id,) = add_finished_runs(agent_db, 1)
    run_id = f"run-{uuid.UUID(trace_id)}"
    rate(agent_db, [run_id], "DOWN")
    config = bridge_config(agent_db, tmp_path, receiver.endpoint, ui={"phoenix_url": phoenix.url})
    with build_parts(config) as parts, caplog.at_level(logging.INFO, logger="run_otel"):
        assert build_poller(parts).poll().run_count == 1  # the trace goes to the receiver, not to Phoenix
        feedback = build_feedback(parts)
        assert feedback is not None
        assert feedback.run().sent == 1
        assert "wait in its queue" in caplog.text  # the precondition: Phoenix lacked the root
        now[0] = phoenix_module.QUEUE_SECONDS - 1
        feedback.run()
        assert "never stored" not in caplog.text  # Phoenix's queue may still store it
        now[0] = phoenix_module.QUEUE_SECONDS
        feedback.run()
        named = [r.getMessage() for r in caplog.records if "Phoenix never stored the root span" in r.getMessage()]
        assert len(named) == 1 and run_id in named[0], caplog.text
        feedback.run()  # looked at once: not named again
    assert len([r for r in caplog.records if "Phoenix never stored the root span" in r.getMessage()]) == 1


@contextlib.contextmanager
def a_rating_phoenix_queued(agent_db, receiver, tmp_path, phoenix, monkeypatch, project: str):
    """A run rated THUMBS_UP, sent to the receiver, its rating sent to Phoenix before the root was there
    (Phoenix answered 404: its queue keeps the rating), then the run exported to Phoenix, which stores the
    queued rating. Yields the parts, the feedback pass, the run id, the root's labels in Phoenix and the
    queue's clock (a list to set)."""
    import uuid
    from functools import partial

    from helpers import add_finished_runs, bridge_config, rate

    from run_otel.export import phoenix as phoenix_module
    from run_otel.factory import build_feedback, build_parts, build_poller
    from run_otel.mapping.span_data import root_span_id_for

    now = [0.0]
    monkeypatch.setattr(phoenix_module, "PhoenixAnnotations", partial(phoenix_module.PhoenixAnnotations, clock=lambda: now[0]))
    trace = {"conventions": ["gen_ai", "openinference"], "project_name": project}
    (trace_id,) = add_finished_runs(agent_db, 1)
    run_id = f"run-{uuid.UUID(trace_id)}"
    root = root_span_id_for(run_id).hex()
    rate(agent_db, [run_id], "THUMBS_UP")
    config = bridge_config(agent_db, tmp_path, receiver.endpoint, trace=trace, ui={"phoenix_url": phoenix.url})
    with build_parts(config) as parts:
        assert build_poller(parts).poll().run_count == 1  # the trace goes to the receiver first
        feedback = build_feedback(parts)
        assert feedback is not None and feedback.run().sent == 1  # Phoenix lacks the root: its queue keeps the rating
        (tmp_path / "phoenix").mkdir()
        sections = bridge_sections(agent_db, tmp_path / "phoenix", phoenix.url, "http/protobuf", trace=trace)
        done = run_cli("export", run_id, "--config", str(write_config(tmp_path / "phoenix" / "run-otel.toml", sections)))
        assert done.returncode == 0, done.stderr

        def labels() -> list[str]:
            return [a["result"]["label"] for a in root_annotations(phoenix, project, root)]

        wait_for(lambda: labels() == ["THUMBS_UP"], 90, "Phoenix's queue to store the first rating", 0.5)
        yield parts, feedback, run_id, labels, now


def test_a_changed_rating_never_reverts_when_phoenixs_queue_is_looked_at_again(
    agent_db, receiver, tmp_path, phoenix, monkeypatch
):
    """A rating Phoenix first answered 404 waits in its queue; the root arrives, the rating changes and
    is stored; when the pass looks again at what it queued, Phoenix keeps the changed rating."""
    from helpers import rate

    from run_otel.export import phoenix as phoenix_module

    project = f"reverted-{os.getpid()}"
    with a_rating_phoenix_queued(agent_db, receiver, tmp_path, phoenix, monkeypatch, project) as (
        _p,
        feedback,
        run_id,
        labels,
        now,
    ):
        rate(agent_db, [run_id], "THUMBS_DOWN")
        assert feedback.run().sent == 1
        assert labels() == ["THUMBS_DOWN"]  # the precondition: the changed rating is stored
        now[0] = phoenix_module.QUEUE_SECONDS  # Phoenix's queue is done with what it held
        feedback.run()
        assert labels() == ["THUMBS_DOWN"]  # the queued THUMBS_UP was posted again over it before


def test_the_superseded_marker_is_an_evaluator_span_in_phoenix(agent_db, tmp_path, phoenix):
    project = f"superseded-{os.getpid()}"
    seed(agent_db, 2, seed_value=35, waiting=0)
    agent_db.execute("UPDATE diagnosis_run SET feedback = 'DOWN'")
    overrides = dict(trace={"conventions": ["gen_ai", "openinference"], "project_name": project})
    export_to_phoenix(agent_db, tmp_path, phoenix, **overrides)
    agent_db.execute("UPDATE diagnosis_run SET feedback = 'UP', updated_at = updated_at + INTERVAL 5 MINUTE")
    export_to_phoenix(agent_db, tmp_path, phoenix, **overrides)
    markers = wait_for(
        lambda: [s for s in phoenix.rest(f"projects/{project}/spans", limit=1000) if s["name"] == "superseded user_feedback"],
        60,
        "the superseded markers in Phoenix",
        0.5,
    )
    assert markers and {span["span_kind"] for span in markers} == {"EVALUATOR"}  # "UNKNOWN" before


def test_a_look_again_posts_the_newest_annotation_of_a_span_not_the_one_first_queued(agent_db, tmp_path, phoenix):
    """Without any filter of the caller's: the annotation queued when Phoenix lacked the root gives way
    to the one stored since for that span, which is what the look again posts."""
    from helpers import add_finished_runs

    from run_otel.export.phoenix import PhoenixAnnotations
    from run_otel.mapping.span_data import root_span_id_for

    project = f"newest-{os.getpid()}"
    (trace_id,) = add_finished_runs(agent_db, 1)
    run_id = f"run-{trace_id[:8]}-{trace_id[8:12]}-{trace_id[12:16]}-{trace_id[16:20]}-{trace_id[20:]}"
    root = root_span_id_for(run_id).hex()

    def item(label: str) -> dict:
        return {
            "span_id": root,
            "name": "user_feedback",
            "annotator_kind": "HUMAN",
            "result": {"label": label},
            "identifier": "diagnosis_run.feedback",
            "metadata": {"run_id": run_id},
        }

    now = [0.0]
    annotations = PhoenixAnnotations(phoenix.url, queue_seconds=600, clock=lambda: now[0])
    assert annotations.upsert([item("UP")]) is False  # no root yet: left to Phoenix's queue
    export_to_phoenix(agent_db, tmp_path, phoenix, trace={"conventions": ["gen_ai", "openinference"], "project_name": project})

    def labels() -> list[str]:
        return [a["result"]["label"] for a in root_annotations(phoenix, project, root)]

    wait_for(lambda: labels() == ["UP"], 90, "Phoenix's queue to store the first annotation", 0.5)
    assert annotations.upsert([item("DOWN")]) is True and labels() == ["DOWN"]
    now[0] = 600.0
    assert annotations.look_again() == 0
    assert labels() == ["DOWN"]
    annotations.close()


def test_a_queued_rating_the_state_store_no_longer_holds_is_not_posted_again(agent_db, receiver, tmp_path, phoenix, monkeypatch):
    """HA: the instance that queued a rating lost the lease; the other one sent the changed rating and recorded
    it in the shared state store. Back in charge, the first one's look again must not post its older value."""
    from helpers import rate

    from run_otel.export import phoenix as phoenix_module
    from run_otel.mapping.evaluation import Evaluations
    from run_otel.pipeline.ratings_ledger import SentRating

    project = f"store-holds-{os.getpid()}"
    with a_rating_phoenix_queued(agent_db, receiver, tmp_path, phoenix, monkeypatch, project) as (
        parts,
        feedback,
        run_id,
        labels,
        now,
    ):
        # The other instance: the changed rating stored in Phoenix and recorded in the shared state store.
        rate(agent_db, [run_id], "THUMBS_DOWN")
        other, evaluations = (
            phoenix_module.PhoenixAnnotations(phoenix.url),
            Evaluations(parts.config.feedback, parts.source.clock),
        )
        (row,) = [r for r in parts.source.rated_runs(1, 10) if r.run_id == run_id]
        assert other.upsert([evaluations.annotation(row)]) is True
        other.close()
        parts.store.save_feedback({run_id: SentRating("THUMBS_DOWN", evaluations.rated_at_ns(row))}, 0.0, -1.0)
        assert labels() == ["THUMBS_DOWN"]  # the precondition
        now[0] = phoenix_module.QUEUE_SECONDS
        feedback.run()
        assert labels() == ["THUMBS_DOWN"]


def test_a_rating_given_after_the_cutover_on_a_backfilled_run_is_counted_and_annotated(agent_db, tmp_path, phoenix):
    """The first deploy's order: the daemon starts (its mark is the cutover), the backfill sends the
    history before it. A rating given afterwards on a run the backfill sent is the bridge's to send
    and count, as on a run the daemon sent; one on a run older than the backfill's window is not."""
    project = f"backfilled-{os.getpid()}"
    older = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 5 HOUR"])  # before the backfill's window
    history = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 2 HOUR"] * 3)
    run_ids = {trace: f"run-{uuid.UUID(trace)}" for trace in older + history}
    rate(agent_db, [run_ids[history[2]]], "UP")  # rated before the backfill: it sends this one with its run
    port = free_port()
    sections = bridge_sections(
        agent_db,
        tmp_path,
        phoenix.url,
        "http/protobuf",
        poll={"start_from": "now"},
        feedback={"interval_seconds": 1},
        metrics={"enabled": True, "port": port},
        trace={"conventions": ["gen_ai", "openinference"], "project_name": project},
        ui={"phoenix_url": phoenix.url},
    )
    config = write_config(tmp_path / "run-otel.toml", sections)
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    try:
        wait_for(lambda: "starting after run id 4" in daemon.output(), 30, "the cutover")
        done = run_cli("backfill", "--config", str(config), "--since", "3h")
        assert done.returncode == 0, done.stderr
        project_spans(phoenix, project, 3)  # the history's roots
        wait_for(lambda: annotation_labels(phoenix, project, run_ids[history[2]]) == ["UP"], 30, "the backfill's rating")

        rate(agent_db, [run_ids[history[0]], run_ids[older[0]]], "DOWN")
        wait_for(lambda: counted_ratings(port) == {("DOWN", "none"): 1}, 30, "the later rating counted")
        wait_for(lambda: annotation_labels(phoenix, project, run_ids[history[0]]) == ["DOWN"], 30, "its annotation")
        time.sleep(3)  # three more passes: nothing else is sent or counted
        assert counted_ratings(port) == {("DOWN", "none"): 1}  # the backfill's UP is not counted again
        assert annotation_labels(phoenix, project, run_ids[older[0]]) == []
        assert {s["context"]["trace_id"] for s in phoenix.rest(f"projects/{project}/spans", limit=1000)} == set(history)
    finally:
        daemon.terminate()


def annotation_labels(phoenix: Phoenix, project: str, run_id: str) -> list[str]:
    return [a["result"]["label"] for a in root_annotations(phoenix, project, root_span_id_for(run_id).hex())]


def counted_ratings(port: int) -> dict[tuple[str, str], float]:
    """diagnosis_run_feedback_total's series above 0 on the daemon's /metrics: (feedback, intent) -> count."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    out = {}
    for line in text.splitlines():
        if line.startswith("diagnosis_run_feedback_total{") and float(line.rsplit(" ", 1)[1]) > 0:
            labels = dict(pair.split("=", 1) for pair in line[line.index("{") + 1 : line.index("}")].split(","))
            out[(labels["feedback"].strip('"'), labels["intent"].strip('"'))] = float(line.rsplit(" ", 1)[1])
    return out
