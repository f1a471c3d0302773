"""A run with more tool rows than trace.max_spans_per_trace, on a real MariaDB into the test's
receiver: the first ones go out, and the cut is a WARNING naming the run and
run_otel_dropped_spans_total{reason="span_limit"}, not only an attribute on the root."""

from __future__ import annotations

import logging

from helpers import add_run, attrs_of, bridge_config, bridge_metrics, counter, new_run_id
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from run_otel.factory import build_parts, build_poller
from run_otel.mapping.span_data import trace_id_for
from run_otel.telemetry import instruments as I


def dropped(reader, reason: str) -> float:
    return counter(reader, I.DROPPED_SPANS, reason=reason)


def test_tool_rows_past_the_span_limit_are_a_warning_naming_the_run_and_a_counted_drop(agent_db, receiver, tmp_path, caplog):
    reader = InMemoryMetricReader()
    config = bridge_config(agent_db, tmp_path, receiver.endpoint, trace={"max_spans_per_trace": 40})
    metrics = bridge_metrics(config, [reader])
    run_id, small = new_run_id(), new_run_id()
    conn = agent_db.server.root(agent_db.name)
    add_run(conn, run_id)
    add_run(conn, small)
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO tool_invocation (session_id, run_id, tool_name, input_params, duration_ms, created_at) "
            "SELECT 's', %s, 'query_metrics', '{}', 5, created_at FROM diagnosis_run WHERE run_id = %s",
            [(run_id, run_id)] * 100 + [(small, small)] * 40,
        )
    with build_parts(config, recorder=metrics) as parts, caplog.at_level(logging.WARNING, logger="run_otel"):
        assert build_poller(parts).poll().run_count == 2
    spans = [span for _r, _s, span in receiver.spans() if span.trace_id == trace_id_for(run_id)]
    (root,) = [span for span in spans if not span.parent_span_id]
    assert len(spans) == 41 and attrs_of(root)["diagnosis.run.tool_spans_dropped"] == 60  # the precondition
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [line for line in lines if "max_spans_per_trace" in line] == [
        f"run {run_id}: 60 tool row(s) past trace.max_spans_per_trace (40) left out of its trace"
    ]
    assert dropped(reader, "span_limit") == 60  # the run at the limit drops nothing
    metrics.shutdown()
    conn.close()
