"""What the daemon costs the agent's database, counted by MariaDB itself: the rows each statement
examined, from the slow log at long_query_time = 0, as run-otel's own database user. The late-row
watch pays for the new tool rows, not for the runs it watches; a tool id committed after a later
one is still read; a restart and a first start read no old tool rows."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from helpers import DaemonProcess, StatementLog, bridge_sections, reader_url, write_config
from servers import wait_for

from run_otel.config import build_config
from run_otel.factory import build_parts, build_poller
from run_otel.mapping.span_data import tool_span_id_for, trace_id_for

pytestmark = pytest.mark.server


def add_runs_with_tools(agent_db, runs: int, tools: int, ended: str = "UTC_TIMESTAMP() - INTERVAL 10 SECOND") -> list[str]:
    """``runs`` finished runs, each with ``tools`` tool rows, in two statements; returns their run_ids in id order."""
    top = agent_db.execute("SELECT COALESCE(MAX(id), 0) FROM diagnosis_run")[0][0]
    agent_db.execute(
        f"INSERT INTO diagnosis_run (run_id, session_id, query, status, created_at, updated_at) "
        f"SELECT CONCAT('run-', UUID()), 's', 'q', 'SUCCESS', {ended}, {ended} FROM seq_1_to_{runs}"
    )
    agent_db.execute(
        f"INSERT INTO tool_invocation (session_id, run_id, tool_name, input_params, duration_ms, created_at) "
        f"SELECT 's', r.run_id, 'lookup_knowledge', '{{}}', 5, r.created_at FROM diagnosis_run r "
        f"JOIN seq_1_to_{tools} t WHERE r.id > %s ORDER BY r.id, t.seq",
        top,
    )
    return [row[0] for row in agent_db.execute("SELECT run_id FROM diagnosis_run WHERE id > %s ORDER BY id", top)]


def add_tool_row(conn, run_id: str) -> int:
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO tool_invocation (session_id, run_id, tool_name, input_params, duration_ms, created_at) "
            "VALUES ('s', %s, 'query_logs', '{}', 7, UTC_TIMESTAMP() - INTERVAL 5 SECOND)",
            (run_id,),
        )
        return cur.lastrowid


def tool_rows_examined(statements) -> int:
    return sum(s.rows_examined for s in statements if "tool_invocation" in s.sql)


def spans_of(receiver, run_id: str) -> list:
    return [span for _r, _s, span in receiver.spans() if span.trace_id == trace_id_for(run_id)]


@pytest.fixture
def reader_config(agent_db, receiver, tmp_path):
    def make(**poll):
        sections = bridge_sections(agent_db, tmp_path, receiver.endpoint, poll=poll)
        sections["source"]["url"] = reader_url(agent_db)
        return build_config(sections)

    return make


def test_the_late_row_watch_reads_the_new_tool_rows_whatever_the_runs_watched(agent_db, receiver, reader_config, tmp_path):
    watched = add_runs_with_tools(agent_db, 300, 10)
    with StatementLog(agent_db, tmp_path / "slow.log") as log, build_parts(reader_config()) as parts:
        poller = build_poller(parts)
        assert poller.poll().run_count == 300
        exported = log.mark()
        assert len(parts.store.watched(time.time())) == 300  # the precondition: 300 runs, 3,000 tool rows, watched
        assert tool_rows_examined(log.statements()) >= 3000  # the log counts what the export read

        poller.poll()  # nothing new
        idle = log.since(exported)
        assert tool_rows_examined(idle) <= 1, [(s.rows_examined, s.sql[:120]) for s in idle]

        conn = agent_db.server.root(agent_db.name)
        late_id = add_tool_row(conn, watched[123])
        conn.close()
        new_runs = add_runs_with_tools(agent_db, 2, 10)
        before = log.mark()
        assert poller.poll().run_count == 2
        busy = log.since(before)
    # The new rows, 21 of them, each examined once: one late row, two runs and their twenty tool rows.
    assert tool_rows_examined(busy) <= 21 + 2, [(s.rows_examined, s.sql[:120]) for s in busy]
    assert sum(s.rows_examined for s in busy) <= 1.5 * 23
    late = [span for span in spans_of(receiver, watched[123]) if span.span_id == tool_span_id_for(watched[123], late_id)]
    assert len(late) == 1
    assert all(len(spans_of(receiver, run_id)) == 11 for run_id in new_runs)


def test_a_tool_id_committed_after_a_later_one_still_joins_its_trace(agent_db, receiver, reader_config, tmp_path):
    (run_id,) = add_runs_with_tools(agent_db, 1, 2)
    other = agent_db.server.root(agent_db.name)
    with build_parts(reader_config()) as parts:
        poller = build_poller(parts)
        assert poller.poll().run_count == 1
        slow = agent_db.server.root(agent_db.name)
        slow.autocommit(False)
        early = add_tool_row(slow, run_id)  # its id is taken, its transaction still open
        later = add_tool_row(other, run_id)  # a higher id, committed first
        assert later > early
        poller.poll()
        assert {span.span_id for span in spans_of(receiver, run_id)} >= {tool_span_id_for(run_id, later)}
        assert tool_span_id_for(run_id, early) not in {span.span_id for span in spans_of(receiver, run_id)}
        slow.commit()
        slow.close()
        poller.poll()
    copies = Counter(span.span_id for span in spans_of(receiver, run_id))
    assert copies[tool_span_id_for(run_id, early)] == 1 and copies[tool_span_id_for(run_id, later)] == 1
    assert len(copies) == 5  # the root, the two rows it was sent with, and the two late ones
    other.close()


def test_a_restart_and_a_first_start_read_no_old_tool_rows(agent_db, receiver, reader_config, tmp_path):
    add_runs_with_tools(agent_db, 300, 10)
    config = reader_config(start_from="now")
    with StatementLog(agent_db, tmp_path / "slow.log") as log:
        with build_parts(config) as parts:
            assert build_poller(parts).poll().run_count == 0
        first_start = log.statements()
        assert any("max(tool_invocation.id)" in s.sql.lower() for s in first_start)  # the precondition: it began there
        assert tool_rows_examined(first_start) <= 1
        (run_id,) = add_runs_with_tools(agent_db, 1, 3)
        with build_parts(config) as parts:
            assert build_poller(parts).poll().run_count == 1
        mark = log.mark()
        with build_parts(config) as parts:  # a restart: where the watch stands is in the state store
            build_poller(parts).poll()
        restart = log.since(mark)
    assert len(spans_of(receiver, run_id)) == 4
    assert tool_rows_examined(restart) <= 1, [(s.rows_examined, s.sql[:120]) for s in restart]


def test_a_catch_up_over_runs_older_than_the_watch_examines_their_tool_rows_only(agent_db, receiver, reader_config, tmp_path):
    # Runs written before the first start: their tool rows lie below where the watch began, so each
    # batch reads them by run_id. With `id <=` that start in the statement, MariaDB took the
    # primary key's range on a table this size and examined every tool row below it, each batch.
    add_runs_with_tools(agent_db, 300, 10)
    agent_db.execute("ANALYZE TABLE diagnosis_run, tool_invocation")  # the statistics of a table in use
    with StatementLog(agent_db, tmp_path / "slow.log") as log, build_parts(reader_config(batch_size=50)) as parts:
        result = build_poller(parts).poll()
        examined = tool_rows_examined(log.statements())
    assert result.run_count == 300 and result.spans == 3300  # the precondition: six batches, every tool row sent
    assert examined <= 3000 * 1.1, [(s.rows_examined, s.sql[:160]) for s in log.statements() if "tool_invocation" in s.sql]


def test_a_wake_up_for_a_settling_run_leaves_the_watch_to_the_interval(agent_db, receiver, tmp_path):
    """A run sent as incomplete is re-read by primary key by each late-row watch; the daemon's wake-ups
    for runs settling, which come every second or two under load, send those runs and no more."""
    from helpers import add_run, new_run_id

    conn = agent_db.server.root(agent_db.name)
    stuck = new_run_id()
    add_run(conn, stuck, status="RUNNING")  # created two hours ago: sent as incomplete, then watched
    conn.commit()
    conn.close()
    stuck_pk = agent_db.execute("SELECT id FROM diagnosis_run WHERE run_id = %s", stuck)[0][0]
    sections = bridge_sections(
        agent_db, tmp_path, receiver.endpoint, poll={"interval_seconds": 60, "settle_seconds": 3, "run_timeout_seconds": 3600}
    )
    sections["source"]["url"] = reader_url(agent_db)
    config = write_config(tmp_path / "c.toml", sections)
    finishing: list[str] = []
    writing = threading.Event()

    def agent() -> None:  # a run finishing every 0.3 s: each wake-up finds the next ones settling
        while not writing.wait(0.3):
            finishing.extend(add_runs_with_tools(agent_db, 1, 1, ended="UTC_TIMESTAMP()"))

    writer = threading.Thread(target=agent)
    with StatementLog(agent_db, tmp_path / "slow.log") as log:
        writer.start()
        daemon = DaemonProcess(config, tmp_path / "daemon.log")
        try:
            wait_for(lambda: spans_of(receiver, stuck), 30, "the incomplete run")
            time.sleep(6)
            writing.set()
            writer.join()
            wait_for(lambda: all(spans_of(receiver, run_id) for run_id in finishing), 30, "the runs settled")
        finally:
            writing.set()
            daemon.terminate()
        statements = log.statements()
    polls = sum(1 for s in statements if "utc_timestamp(6)" in s.sql.lower())
    watch_reads = sum(1 for s in statements if f"diagnosis_run.id IN ({stuck_pk})" in s.sql)
    assert polls >= 5, daemon.output()  # the precondition: the first poll and a wake-up for each run
    assert watch_reads == 1


# -- the feedback pass ------------------------------------------------------------------------------


def seed_day(agent_db, runs: int, hours: float) -> list[str]:
    """``runs`` finished runs spread over ``hours`` up to five minutes ago, every 20th rated; their run_ids by id."""
    step = hours * 3600 / runs
    agent_db.execute(
        f"INSERT INTO diagnosis_run (run_id, session_id, query, status, feedback, created_at, updated_at) "
        f"SELECT CONCAT('run-', UUID()), 's', 'q', 'SUCCESS', IF(seq % 20 = 0, 'UP', NULL), "
        f"UTC_TIMESTAMP() - INTERVAL ROUND(({runs} - seq) * {step}) + 300 SECOND, "
        f"UTC_TIMESTAMP() - INTERVAL ROUND(({runs} - seq) * {step}) + 295 SECOND FROM seq_1_to_{runs}"
    )
    agent_db.execute("ANALYZE TABLE diagnosis_run")
    return [row[0] for row in agent_db.execute("SELECT run_id FROM diagnosis_run ORDER BY id")]


def rate_now(agent_db, run_ids: list[str], value: str = "DOWN") -> None:
    for run_id in run_ids:
        agent_db.execute("UPDATE diagnosis_run SET feedback = %s, updated_at = UTC_TIMESTAMP() WHERE run_id = %s", value, run_id)


def feedback_sent(receiver) -> set[str]:
    return {span.trace_id for _r, _s, span in receiver.spans() if span.name.startswith("evaluation ")}


def examined(log, mark: int) -> int:
    return sum(s.rows_examined for s in log.since(mark))


def index_line(config) -> str:
    from run_otel.ops.check import run_checks

    return next(f.detail for f in run_checks(config) if f.what == "index diagnosis_run.updated_at")


def test_without_an_updated_at_index_a_feedback_pass_reads_a_share_of_its_window(agent_db, receiver, reader_config, tmp_path):
    from run_otel.factory import build_feedback

    run_ids = seed_day(agent_db, 3000, 20)
    config = reader_config()
    with StatementLog(agent_db, tmp_path / "slow.log") as log, build_parts(config) as parts:
        assert build_poller(parts).poll().run_count == 3000
        feedback = build_feedback(parts)
        assert feedback is not None
        mark = log.mark()
        assert feedback.run().sent == 150  # the first pass after a start reads the whole window
        assert examined(log, mark) >= 3000  # the precondition: the log counts the pass's rows
        young, old = run_ids[-1], run_ids[1500]  # five minutes and ten hours old
        rate_now(agent_db, [young, old])
        passes = []
        for _ in range(128):
            mark = log.mark()
            feedback.run()
            passes.append(examined(log, mark))
            if len(passes) == 1:
                assert trace_id_for(young) in feedback_sent(receiver) and trace_id_for(old) not in feedback_sent(receiver)
    # Each part of the window re-read the less often the older it is: the ten-hour-old run's rating went out
    # within 128 passes, and a pass read a twentieth of the window on average (the probes for its edge
    # included), the youngest eight minutes each time.
    assert trace_id_for(old) in feedback_sent(receiver)
    assert sum(passes) / len(passes) < 3000 / 20, passes
    assert max(passes[:1]) < 150
    assert "none (optional)" in index_line(config) and "of the 3,000 runs" in index_line(config)


def test_with_an_updated_at_index_a_feedback_pass_reads_the_runs_updated_since(agent_db, receiver, reader_config, tmp_path):
    from run_otel.factory import build_feedback

    run_ids = seed_day(agent_db, 3000, 20)
    agent_db.execute("CREATE INDEX idx_diagnosis_run_updated_at ON diagnosis_run (updated_at)")
    config = reader_config()
    with StatementLog(agent_db, tmp_path / "slow.log") as log, build_parts(config) as parts:
        assert build_poller(parts).poll().run_count == 3000
        feedback = build_feedback(parts)
        assert feedback is not None and feedback.run().sent == 150
        rated = [run_ids[-1], run_ids[1500], run_ids[1]]  # five minutes, ten hours and twenty hours old
        rate_now(agent_db, rated)
        mark = log.mark()
        assert feedback.run().sent == 3
        one = examined(log, mark)
        mark = log.mark()
        assert feedback.run().sent == 0
        idle = examined(log, mark)
    assert {trace_id_for(run_id) for run_id in rated} <= feedback_sent(receiver)
    assert one <= 3 + 2, one  # the three runs rated, whatever the window holds
    assert idle <= 3, idle
    assert index_line(config).startswith("idx_diagnosis_run_updated_at: ")


def test_the_look_for_tool_rows_without_their_run_reads_no_tool_row_the_poll_read(agent_db, receiver, reader_config, tmp_path):
    """The orphan look takes its candidates from the rows the poll's feed read: neither the history nor
    new work costs it a tool row, and an orphan is still named after the wait."""
    from helpers import new_run_id

    from run_otel.factory import build_orphans

    add_runs_with_tools(agent_db, 300, 10)
    ahead = [0.0]  # the look's clock runs with the poll's, ahead by this
    with StatementLog(agent_db, tmp_path / "slow.log") as log, build_parts(reader_config(orphan_wait_seconds=60)) as parts:
        poller = build_poller(parts)
        assert poller.poll().run_count == 300
        poller.poll()  # the feed's first read on a first start sets where it begins
        assert tool_rows_examined(log.statements()) >= 3000  # the precondition: the log counts what the export read
        history = log.mark()
        orphans = build_orphans(parts, poller, clock=lambda: time.time() + ahead[0])
        assert orphans is not None and orphans.run() == 0
        assert tool_rows_examined(log.since(history)) == 0  # a first start leaves the history alone, as the feed does

        ghost = new_run_id()
        conn = agent_db.server.root(agent_db.name)
        add_tool_row(conn, ghost)
        conn.close()
        new_runs = add_runs_with_tools(agent_db, 20, 10)
        assert poller.poll().run_count == 20
        assert orphans.run() == 0  # seen now, decided after the wait
        ahead[0] = 61
        assert orphans.run() == 1
        busy = log.since(history)
    assert all(len(spans_of(receiver, run_id)) == 11 for run_id in new_runs)
    # 201 new tool rows, each examined once by the poll; the look adds one run_id lookup.
    assert tool_rows_examined(busy) <= 201 + 2, [(s.rows_examined, s.sql[:120]) for s in busy]
    assert sum(s.rows_examined for s in busy) <= 1.5 * 221
