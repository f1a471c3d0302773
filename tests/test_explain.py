"""Every statement run-otel sends is index-bounded: EXPLAIN on MariaDB never shows a full scan."""

from __future__ import annotations

from datetime import timedelta

from helpers import bridge_config, utc_now_naive
from sqlalchemy import Engine, event

from run_otel.factory import build_backfill, build_parts, build_poller
from run_otel.ops.demo import generate, insert_workload
from run_otel.ops.show import run_trace


def test_no_statement_scans_a_table(agent_db, otlp, tmp_path):
    workload = generate(3, 3000, anchor=utc_now_naive())
    insert_workload(agent_db.engine(), workload)
    # Waiting runs and a gap, so the recheck statements run too.
    agent_db.execute("UPDATE diagnosis_run SET status = 'RUNNING' WHERE MOD(id, 50) = 0")
    agent_db.execute("DELETE FROM diagnosis_run WHERE id = 1500")
    agent_db.execute("ANALYZE TABLE diagnosis_run, tool_invocation")
    config = bridge_config(agent_db, tmp_path, otlp.endpoint("grpc"), poll={"batch_size": 200})
    captured: list[tuple[str, object]] = []

    def record(conn, _cursor, statement, parameters, _context, _many):
        if conn.engine.dialect.name == "mysql" and statement.lstrip().upper().startswith("SELECT"):
            captured.append((statement, parameters))

    event.listen(Engine, "before_cursor_execute", record)
    try:
        parts = build_parts(config)
        poller = build_poller(parts)
        poller.poll()  # polling and the tool fetch
        poller.poll()  # rechecks of pending runs and gaps
        source = parts.source
        first = source.first_id_created_at_or_after(utc_now_naive() - timedelta(minutes=30))  # backfill probes
        build_backfill(parts).run(first, first + 300)
        assert run_trace(config, source, workload.runs[10]["run_id"]) is not None  # show
    finally:
        event.remove(Engine, "before_cursor_execute", record)

    kinds = {
        "poll": "id >",
        "recheck": "diagnosis_run.id IN",
        "tools": "tool_invocation.run_id IN",
        "probe": "id >=",
        "show": "diagnosis_run.run_id =",
    }
    for kind, marker in kinds.items():
        assert any(marker in statement for statement, _ in captured), kind
    conn = agent_db.server.root(agent_db.name)
    plans = []
    with conn.cursor() as cur:
        for statement, parameters in captured:
            if "@@" in statement or "DATABASE()" in statement:
                continue  # the dialect's session probes touch no table
            cur.execute("EXPLAIN " + statement, parameters)
            columns = [d[0] for d in cur.description]
            for row in cur.fetchall():
                plan = dict(zip(columns, row))
                plans.append(plan)
                assert plan["type"] != "ALL", (statement, plan)
    assert {p["table"] for p in plans if p["table"]} == {"diagnosis_run", "tool_invocation"}
    # The check can fail: without idx_tool_invocation_run_id the same tool fetch is a full scan.
    statement, parameters = next((s, p) for s, p in captured if "tool_invocation.run_id IN" in s)
    with conn.cursor() as cur:
        cur.execute("ALTER TABLE tool_invocation DROP INDEX idx_tool_invocation_run_id")
        cur.execute("EXPLAIN " + statement, parameters)
        columns = [d[0] for d in cur.description]
        assert [dict(zip(columns, row))["type"] for row in cur.fetchall()] == ["ALL"]
    conn.close()
