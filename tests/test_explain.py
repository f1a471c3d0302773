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
    # The check can fail: without idx_tool_invocation_run_id the same tool fetch is a full scan (the
    # backfill's, which reads every row of its runs; the poll's reads only those below the rows it holds).
    statement, parameters = next((s, p) for s, p in captured if "tool_invocation.run_id IN" in s and "id <=" not in s)
    with conn.cursor() as cur:
        cur.execute("ALTER TABLE tool_invocation DROP INDEX idx_tool_invocation_run_id")
        cur.execute("EXPLAIN " + statement, parameters)
        columns = [d[0] for d in cur.description]
        assert [dict(zip(columns, row))["type"] for row in cur.fetchall()] == ["ALL"]
    conn.close()


def test_a_poll_reads_its_runs_tool_rows_in_one_statement(agent_db, receiver, tmp_path):
    """The tool rows of a poll's runs come in one ``run_id IN (...)`` query per poll.tool_chunk_size
    runs, not one a run: counted in MariaDB's own general log, whatever the driver or the code sends."""
    from helpers import seed

    seed(agent_db, 20, seed_value=5, waiting=0)
    agent_db.execute("UPDATE diagnosis_run SET status = 'SUCCESS' WHERE status IN ('PENDING', 'RUNNING')")  # all 20 sent
    runs_with_tools = agent_db.execute("SELECT COUNT(DISTINCT run_id) FROM tool_invocation")[0][0]
    # No late pass: it reads tool counts of the runs just sent, which is a statement of its own.
    config = bridge_config(agent_db, tmp_path, receiver.endpoint, poll={"late_window_seconds": 0})
    assert config.poll.tool_chunk_size >= 20  # the precondition: the poll's runs make one chunk
    conn = agent_db.server.root()
    try:
        with conn.cursor() as cur:
            cur.execute("SET GLOBAL log_output = 'TABLE'")
            cur.execute("TRUNCATE TABLE mysql.general_log")
            cur.execute("SET GLOBAL general_log = ON")
        try:
            with build_parts(config) as parts:
                assert build_poller(parts).poll().run_count == 20
        finally:
            with conn.cursor() as cur:
                cur.execute("SET GLOBAL general_log = OFF")
        with conn.cursor() as cur:
            cur.execute(
                "SELECT CONVERT(argument USING utf8mb4) FROM mysql.general_log "
                "WHERE command_type IN ('Query', 'Execute') AND CONVERT(argument USING utf8mb4) LIKE '%%tool_invocation%%'"
            )
            statements = [row[0] for row in cur.fetchall()]
    finally:
        conn.close()
    assert runs_with_tools >= 10  # the precondition: most of the 20 runs have tool rows of their own
    assert len(statements) == 1, statements
    assert "run_id IN" in statements[0]


def test_no_statement_is_a_full_scan_by_mariadbs_own_count(agent_db, receiver, tmp_path):
    """EXPLAIN can show a plan that MariaDB then counts as a full scan: ``ORDER BY id DESC LIMIT 1``
    reads one row, yet counts in Select_scan, and so in the slow log's Full_scan, which a DBA who
    logs queries not using indexes alerts on. Every statement of the poll, the late-row watch, the
    feedback pass, the backlog probe, a backfill, `show` and `status` is counted here by the server
    itself, as run-otel's own database user."""
    from helpers import StatementLog, bridge_sections, reader_url

    from run_otel.config import build_config
    from run_otel.factory import build_feedback
    from run_otel.ops.status import shard_statuses

    insert_workload(agent_db.engine(), generate(3, 3000, anchor=utc_now_naive()))
    agent_db.execute("UPDATE diagnosis_run SET status = 'RUNNING' WHERE MOD(id, 50) = 0")
    agent_db.execute("DELETE FROM diagnosis_run WHERE id = 1500")
    agent_db.execute("ANALYZE TABLE diagnosis_run, tool_invocation")
    sections = bridge_sections(agent_db, tmp_path, receiver.endpoint, poll={"batch_size": 200})
    sections["source"]["url"] = reader_url(agent_db)
    config = build_config(sections)
    with StatementLog(agent_db, tmp_path / "slow.log") as log, build_parts(config) as parts:
        poller = build_poller(parts)
        poller.poll()  # the drain, its tool rows, the backlog probe
        poller.poll()  # rechecks of pending runs and gaps, and the late-row watch
        feedback = build_feedback(parts)
        assert feedback is not None and feedback.run().rated > 0
        source = parts.source
        first = source.first_id_created_at_or_after(utc_now_naive() - timedelta(minutes=30))
        build_backfill(parts).run(first, first + 300)
        assert run_trace(config, source, insert_run_id(agent_db)) is not None  # show
        assert shard_statuses(parts.store, source)[0].newest_id == 3000  # status
        assert source.next_run_id() == 3001  # the guard's AUTO_INCREMENT, after a delete at the top
        assert source.clock_sample() is not None
        statements = log.statements()
    assert len(statements) > 50  # the precondition: the log holds what run-otel sent, as its own user
    assert any("max(diagnosis_run.id)" in s.sql.lower() for s in statements)  # the backlog probe ran
    scans = [s.sql[:160] for s in statements if s.full_scan]
    assert scans == []


def insert_run_id(agent_db) -> str:
    return agent_db.execute("SELECT run_id FROM diagnosis_run WHERE id = 10")[0][0]


def test_the_duplicate_rule_and_the_orphan_look_scan_no_table(agent_db, receiver, tmp_path):
    """Where two rows may share a run id, the rule's read goes by the run_id index; the look for tool rows
    without their run, after a restart, reads what the process before had read by primary-key range, then
    asks for its run ids by that index."""
    from helpers import add_run, add_tool, new_run_id

    from run_otel.factory import build_orphans

    workload = generate(4, 500, anchor=utc_now_naive())
    insert_workload(agent_db.engine(), workload)
    agent_db.execute("ALTER TABLE diagnosis_run DROP INDEX run_id, ADD INDEX run_id (run_id)")
    conn = agent_db.server.root(agent_db.name)
    add_run(conn, workload.runs[0]["run_id"])  # a later row with a run id
    agent_db.execute("ANALYZE TABLE diagnosis_run, tool_invocation")
    config = bridge_config(agent_db, tmp_path, receiver.endpoint, poll={"orphan_wait_seconds": 60})
    captured: list[tuple[str, object]] = []

    def record(conn, _cursor, statement, parameters, _context, _many):
        if conn.engine.dialect.name == "mysql" and statement.lstrip().upper().startswith("SELECT"):
            captured.append((statement, parameters))

    now = [1000.0]
    event.listen(Engine, "before_cursor_execute", record)
    try:
        with build_parts(config) as parts:
            poller = build_poller(parts)
            assert poller.poll().run_count > 0
            poller.poll()  # the feed's first read on a first start only sets where it begins
            orphans = build_orphans(parts, poller, clock=lambda: now[0])
            assert orphans is not None and orphans.run() == 0
            add_tool(conn, new_run_id())  # a tool row whose run never appears, read by this process
            poller.poll()
            assert orphans.run() == 0
        with build_parts(config) as parts:  # a restart before the wait is over
            poller = build_poller(parts)
            poller.poll()
            orphans = build_orphans(parts, poller, clock=lambda: now[0])
            assert orphans is not None and orphans.run() == 0  # read again, seen now, looked at after the wait
            now[0] += 60
            assert orphans.run() == 1
    finally:
        event.remove(Engine, "before_cursor_execute", record)
        conn.close()
    marked = [(s, p) for s, p in captured if "diagnosis_run.run_id IN" in s or "tool_invocation.id <=" in s]
    assert {"diagnosis_run.run_id IN" in s for s, _ in marked} == {True, False}  # both kinds ran
    conn = agent_db.server.root(agent_db.name)
    with conn.cursor() as cur:
        for statement, parameters in marked:
            cur.execute("EXPLAIN " + statement, parameters)
            columns = [d[0] for d in cur.description]
            for row in cur.fetchall():
                plan = dict(zip(columns, row))
                assert plan["type"] != "ALL", (statement, plan)
    conn.close()
