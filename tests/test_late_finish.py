"""A run sent incomplete that finishes later, end to end: MariaDB -> run-otel -> the collector with
config/otel-collector.yaml -> Jaeger v2, read back through Jaeger's query API as its UI gets it.
What came after the timeout (a tool row, the rating) hangs under the completed span, so Jaeger
flags nothing, and `export` and `backfill` send the run again as it was first sent: one root,
each span once."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from helpers import (
    add_run,
    add_tool,
    bridge_sections,
    jaeger_trace,
    new_run_id,
    run_cli,
    utc_now_naive,
    warnings_of,
    write_config,
)
from servers import wait_for

from run_otel.mapping.span_data import completion_span_id_for, trace_id_for


def parent_of(span: dict) -> str | None:
    parents = [ref["spanID"] for ref in span.get("references") or [] if ref["refType"] == "CHILD_OF"]
    return parents[0] if parents else None


def test_what_came_after_the_timeout_hangs_under_the_completed_span_and_a_resend_is_the_first_send(stack, agent_db, tmp_path):
    jaeger, collector, tempo = stack
    sections = bridge_sections(agent_db, tmp_path, f"http://127.0.0.1:{collector.grpc_port}")
    config = str(write_config(tmp_path / "run-otel.toml", sections))
    run_id, started = new_run_id(), utc_now_naive() - timedelta(hours=2)
    conn = agent_db.server.root(agent_db.name)
    add_run(conn, run_id, status="RUNNING", created_at=started, updated_at=started)  # past poll.run_timeout_seconds
    add_tool(conn, run_id, tool_name="query_logs", duration_ms=10, created_at=started + timedelta(seconds=1))
    assert run_cli("once", "--config", config).returncode == 0
    trace_id = trace_id_for(run_id).hex()
    jaeger_trace(jaeger, trace_id, 2)

    # The run goes on past its timeout, finishes 90 minutes in, and is rated.
    add_tool(conn, run_id, tool_name="query_metrics", duration_ms=20, created_at=started + timedelta(minutes=80))
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE diagnosis_run SET status = 'SUCCESS', total_duration_ms = %s, feedback = 'DOWN', "
            "updated_at = UTC_TIMESTAMP() - INTERVAL 1 SECOND WHERE run_id = %s",
            (90 * 60 * 1000, run_id),
        )
    done = run_cli("once", "--config", config)
    assert done.returncode == 0, done.stderr
    trace = jaeger_trace(jaeger, trace_id, 5)
    by_name = {span["operationName"]: span for span in trace["spans"]}
    completed = by_name["invoke_agent diagnosis-agent completed"]
    assert completed["spanID"] == completion_span_id_for(run_id).hex()
    assert parent_of(by_name["execute_tool query_metrics"]) == completed["spanID"]
    assert parent_of(by_name["evaluation user_feedback"]) == completed["spanID"]
    assert (
        parent_of(by_name["execute_tool query_logs"]) == parent_of(completed) == by_name["invoke_agent diagnosis-agent"]["spanID"]
    )
    assert warnings_of(trace) == []  # "clock skew adjustment disabled" for the tool row and the rating before
    first = Counter(span.SerializeToString() for _r, _s, span in tempo.spans() if span.trace_id.hex() == trace_id)
    assert len(first) == 5 and set(first.values()) == {1}

    for command in (("export", run_id), ("backfill", "--since", "3h")):
        done = run_cli(*command, "--config", config)
        assert done.returncode == 0, done.stderr
        sent = sum(first.values()) + 4  # the root as first sent, two tool rows, the completed span
        wait_for(
            lambda sent=sent: sum(1 for _r, _s, s in tempo.spans() if s.trace_id.hex() == trace_id) >= sent,
            30,
            f"{command[0]} to send the run again",
        )
        again = Counter(span.SerializeToString() for _r, _s, span in tempo.spans() if span.trace_id.hex() == trace_id)
        assert set(again) == set(first), command  # the incomplete root as first sent, byte for byte; no other root
        first = again
        trace = jaeger.trace(trace_id)
        assert sorted(Counter(span["spanID"] for span in trace["spans"]).values()) == [1] * 5, command
        assert [span["spanID"] for span in trace["spans"] if parent_of(span) is None] == [parent_of(completed)]
        assert warnings_of(trace) == [], command  # "duplicate span IDs" and two roots before
    conn.close()
