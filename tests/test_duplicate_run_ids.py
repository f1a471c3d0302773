"""Two diagnosis_run rows with one run id, on a real MariaDB whose schema lets them be (its UNIQUE
key dropped, or a collation that tells letter cases apart), into the test's receiver and Jaeger:
no stall, one root per trace, every row sent, the later row a trace of its own linked to the
first, logged and counted, and a re-send byte for byte the same."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from helpers import add_run, add_tool, attrs_of, bridge_config, bridge_metrics, bridge_sections, counter, run_cli, utc_now_naive
from helpers import write_config as write_toml
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from run_otel.factory import build_feedback, build_parts, build_poller
from run_otel.mapping import span_data
from run_otel.mapping.span_data import root_span_id_for, tool_span_id_for, trace_id_for
from run_otel.telemetry import instruments as I


def duplicate_identity(run_id: str, row: int, owner_run_id: str, owner: int):
    """The ids of the later row (read here, so each test fails on its own behaviour where they are missing)."""
    return span_data.duplicate_identity(run_id, row, owner_run_id, owner)


def without_unique_run_id(agent_db) -> None:
    """A migration that kept the index on run_id but dropped its UNIQUE: two rows may share a run id."""
    agent_db.execute("ALTER TABLE diagnosis_run DROP INDEX run_id, ADD INDEX run_id (run_id)")


def case_sensitive_run_id(agent_db) -> None:
    """UNIQUE, but in a collation that tells letter cases apart: run-ABC… and run-abc… are two run ids to it."""
    agent_db.execute("ALTER TABLE diagnosis_run MODIFY run_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL")


def spans_in(receiver, trace_id: bytes) -> list:
    return [span for _r, _s, span in receiver.spans() if span.trace_id == trace_id]


@pytest.fixture
def bridge(agent_db, receiver, tmp_path):
    reader = InMemoryMetricReader()
    config = bridge_config(agent_db, tmp_path, receiver.endpoint)
    metrics = bridge_metrics(config, [reader])
    parts = build_parts(config, recorder=metrics)
    yield parts, build_poller(parts), reader
    parts.close()
    metrics.shutdown()


def test_two_rows_with_one_run_id_never_stall_and_each_goes_out_once_under_one_root(agent_db, receiver, bridge, caplog):
    parts, poller, reader = bridge
    without_unique_run_id(agent_db)
    run_id, behind = f"run-{uuid.uuid4()}", f"run-{uuid.uuid4()}"
    recent = utc_now_naive() - timedelta(seconds=10)  # settled inside poll.late_window_seconds: both are watched
    conn = agent_db.server.root(agent_db.name)
    add_run(conn, run_id, session_id="s-first", total_duration_ms=4000, created_at=recent, updated_at=recent)
    add_run(conn, run_id, session_id="s-retry", total_duration_ms=2000, created_at=recent, updated_at=recent)
    add_run(conn, behind, created_at=recent, updated_at=recent)
    add_tool(conn, run_id, duration_ms=10, created_at=recent)
    first, later = (row[0] for row in agent_db.execute("SELECT id FROM diagnosis_run WHERE run_id = %s ORDER BY id", run_id))
    (tool_id,) = (row[0] for row in agent_db.execute("SELECT id FROM tool_invocation WHERE run_id = %s", run_id))

    with caplog.at_level(logging.WARNING, logger="run_otel"):
        assert poller.poll().run_count == 3  # the watch's unique key stalled this poll, and every retry of it
    assert parts.store.load().high_water == 3  # the checkpoint moved past the pair

    owner = spans_in(receiver, trace_id_for(run_id))
    assert sorted(span.span_id for span in owner) == sorted([root_span_id_for(run_id), tool_span_id_for(run_id, tool_id)])
    (root,) = [span for span in owner if not span.parent_span_id]
    assert attrs_of(root)["gen_ai.conversation.id"] == "s-first"  # the lowest id owns the trace and its tool rows

    own = duplicate_identity(run_id, later, run_id, first)
    (retry,) = spans_in(receiver, own.trace_id)  # a trace of its own, its root alone
    assert not retry.parent_span_id and retry.span_id == own.root_id
    assert retry.name == "invoke_agent diagnosis-agent duplicate"  # a trace list tells it from the first
    attrs = attrs_of(retry)
    assert (attrs["diagnosis.run.id"], attrs["gen_ai.conversation.id"]) == (run_id, "s-retry")
    assert (attrs["diagnosis.run.row_id"], attrs["diagnosis.run.duplicate_of_row_id"]) == (later, first)
    assert [(link.trace_id, link.span_id) for link in retry.links] == [(trace_id_for(run_id), root_span_id_for(run_id))]
    named = [r.getMessage() for r in caplog.records if run_id in r.getMessage()]
    assert any(f"row {later} has the run id of row {first}" in line for line in named), named
    assert counter(reader, getattr(I, "DUPLICATE_RUNS", None)) == 1

    sent = len(receiver.spans())
    assert poller.poll().run_count == 0
    assert len(receiver.spans()) == sent  # nothing sent again: the run behind the pair went out once
    assert Counter(span.span_id for span in spans_in(receiver, trace_id_for(behind))) == {root_span_id_for(behind): 1}
    conn.close()


def test_run_ids_differing_only_in_the_uuids_case_share_the_trace_and_its_ids(agent_db, receiver, bridge):
    parts, poller, reader = bridge
    case_sensitive_run_id(agent_db)
    run_uuid = uuid.uuid4()
    upper, lower = f"run-{str(run_uuid).upper()}", f"run-{run_uuid}"
    conn = agent_db.server.root(agent_db.name)
    add_run(conn, upper, session_id="s-upper")
    add_run(conn, lower, session_id="s-lower")
    add_tool(conn, lower, duration_ms=10)
    add_tool(conn, upper, duration_ms=20)
    first, later = (row[0] for row in agent_db.execute("SELECT id FROM diagnosis_run ORDER BY id"))
    tools = sorted(row[0] for row in agent_db.execute("SELECT id FROM tool_invocation"))
    assert trace_id_for(upper) == trace_id_for(lower)  # the precondition: one trace, as SPEC section 1 says

    assert poller.poll().run_count == 2
    trace = spans_in(receiver, trace_id_for(lower))
    roots = [span for span in trace if not span.parent_span_id]
    assert len(roots) == 1 and roots[0].span_id == root_span_id_for(lower)  # the ids hash the normalized run id
    assert sorted(span.span_id for span in trace if span.parent_span_id) == sorted(tool_span_id_for(lower, t) for t in tools)
    assert {span.parent_span_id for span in trace if span.parent_span_id} == {roots[0].span_id}
    own = duplicate_identity(lower, later, upper, first)
    (retry,) = spans_in(receiver, own.trace_id)
    assert attrs_of(retry)["diagnosis.run.id"] == lower and retry.links[0].trace_id == trace_id_for(upper)
    assert counter(reader, getattr(I, "DUPLICATE_RUNS", None)) == 1
    conn.close()


def test_a_later_row_read_polls_after_the_first_still_goes_out_on_its_own(agent_db, receiver, bridge):
    parts, poller, _reader = bridge
    without_unique_run_id(agent_db)
    run_id = f"run-{uuid.uuid4()}"
    conn = agent_db.server.root(agent_db.name)
    add_run(conn, run_id)
    assert poller.poll().run_count == 1
    add_run(conn, run_id, status="FAILED")  # the agent's retry, written long after
    (first, later) = (row[0] for row in agent_db.execute("SELECT id FROM diagnosis_run ORDER BY id"))
    assert poller.poll().run_count == 1
    roots = [span for span in spans_in(receiver, trace_id_for(run_id)) if not span.parent_span_id]
    assert len(roots) == 1 and attrs_of(roots[0])["diagnosis.run.status"] == "SUCCESS"
    (retry,) = spans_in(receiver, duplicate_identity(run_id, later, run_id, first).trace_id)
    assert attrs_of(retry)["diagnosis.run.status"] == "FAILED"
    conn.close()


def test_export_and_backfill_send_both_rows_again_byte_for_byte(agent_db, receiver, tmp_path):
    without_unique_run_id(agent_db)
    run_id = f"run-{uuid.uuid4()}"
    conn = agent_db.server.root(agent_db.name)
    add_run(conn, run_id, session_id="s-first", created_at=utc_now_naive() - timedelta(minutes=5))
    add_run(conn, run_id, session_id="s-retry", created_at=utc_now_naive() - timedelta(minutes=5))
    add_tool(conn, run_id, duration_ms=10)
    config = str(write_toml(tmp_path / "run-otel.toml", bridge_sections(agent_db, tmp_path, receiver.endpoint)))
    assert run_cli("once", "--config", config).returncode == 0
    first = sorted(span.SerializeToString() for _r, _s, span in receiver.spans())
    assert len(first) == 3  # the precondition: the owner's root and tool span, the later row's root

    checked = run_cli("check", "--config", config)
    assert "run ids: diagnosis_run.run_id has no UNIQUE key of its own: two rows may share one" in checked.stdout, checked.stdout
    receiver.clear()
    done = run_cli("export", run_id, "--config", config)
    assert done.returncode == 0, done.stderr
    assert sorted(span.SerializeToString() for _r, _s, span in receiver.spans()) == first
    receiver.clear()
    done = run_cli("backfill", "--since", "1h", "--config", config)
    assert done.returncode == 0, done.stderr
    assert sorted(span.SerializeToString() for _r, _s, span in receiver.spans()) == first
    conn.close()


def test_ratings_of_two_rows_with_one_run_id_each_go_to_their_own_trace_once(agent_db, receiver, tmp_path):
    without_unique_run_id(agent_db)
    run_id = f"run-{uuid.uuid4()}"
    conn = agent_db.server.root(agent_db.name)
    add_run(conn, run_id, feedback="UP", total_duration_ms=3000)
    add_run(conn, run_id, feedback="DOWN", total_duration_ms=3000)
    first, later = (row[0] for row in agent_db.execute("SELECT id FROM diagnosis_run ORDER BY id"))
    parts = build_parts(bridge_config(agent_db, tmp_path, receiver.endpoint))
    assert build_poller(parts).poll().run_count == 2
    feedback = build_feedback(parts)
    assert feedback is not None
    assert feedback.run().sent == 2
    assert feedback.run().sent == 0  # each rating is current under its own key: none sent again
    ratings = {span.trace_id: attrs_of(span) for _r, _s, span in receiver.spans() if span.name.startswith("evaluation ")}
    own = duplicate_identity(run_id, later, run_id, first)
    assert ratings[trace_id_for(run_id)]["gen_ai.evaluation.score.label"] == "UP"
    assert ratings[own.trace_id]["gen_ai.evaluation.score.label"] == "DOWN"
    parts.close()
    conn.close()


def test_jaeger_shows_one_root_in_the_run_ids_trace_and_the_later_row_as_a_trace_linked_to_it(stack, agent_db, tmp_path):
    from servers import wait_for

    jaeger, collector, _tempo = stack
    without_unique_run_id(agent_db)
    run_id = f"run-{uuid.uuid4()}"
    recent = utc_now_naive() - timedelta(minutes=2)
    conn = agent_db.server.root(agent_db.name)
    add_run(conn, run_id, total_duration_ms=4000, created_at=recent, updated_at=recent)
    add_tool(conn, run_id, duration_ms=300, created_at=recent + timedelta(seconds=1))
    add_run(conn, run_id, status="FAILED", total_duration_ms=2000, created_at=recent + timedelta(seconds=20), updated_at=recent)
    sections = bridge_sections(agent_db, tmp_path, f"http://127.0.0.1:{collector.grpc_port}")
    done = run_cli("once", "--config", str(write_toml(tmp_path / "run-otel.toml", sections)))

    # The run id's own trace: one root, each span once; then Jaeger's lookup by the run id's tag finds both traces.
    owner = wait_for(lambda: (t := jaeger.trace(trace_id_for(run_id).hex())) and len(t["spans"]) >= 2 and t, 30, "the trace", 0.2)
    tags = '{"diagnosis.run.id": "' + run_id + '"}'
    traces = wait_for(
        lambda: len(found := jaeger.api("traces", service="diagnosis-agent", tags=tags, lookback="1h")["data"]) == 2 and found,
        30,
        "both traces in Jaeger",
        0.2,
    )
    owner = {trace["traceID"]: trace for trace in traces}[owner["traceID"]]
    (later,) = [trace for trace in traces if trace["traceID"] != owner["traceID"]]
    for trace in (owner, later):
        assert [span.get("warnings") for span in trace["spans"]] == [None] * len(trace["spans"])  # "duplicate span IDs" before
        roots = [span for span in trace["spans"] if not any(r["refType"] == "CHILD_OF" for r in span.get("references") or [])]
        assert len(roots) == 1
    assert len(owner["spans"]) == 2 and len(later["spans"]) == 1
    (reference,) = later["spans"][0]["references"]
    assert (reference["refType"], reference["traceID"], reference["spanID"]) == (
        "FOLLOWS_FROM",
        owner["traceID"],
        root_span_id_for(run_id).hex(),
    )
    assert done.returncode == 0, done.stderr  # and the poll went on: it failed on the watch's unique key before
    conn.close()
