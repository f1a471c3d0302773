"""The core bridge against a real MariaDB, through rotel, into the test's receiver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict

import pytest
from helpers import (
    assert_trace_matches,
    attrs_of,
    bridge_sections,
    expected_traces,
    run_cli,
    seed,
    table_rows,
    utc_now_naive,
    write_config,
)
from servers import Receiver, wait_for
from sqlalchemy import insert

from run_otel.source.schema import diagnosis_run

PROTOCOLS = ["grpc", "http/protobuf"]
TERMINAL = ("SUCCESS", "FALLBACK", "FAILED", "CANCELLED")


def received_by_trace(receiver) -> dict[str, list]:
    traces = defaultdict(dict)
    for _resource, _scope, span in receiver.spans():
        traces[span.trace_id.hex()][span.span_id] = span
    return {trace: list(spans.values()) for trace, spans in traces.items()}


def config_file(tmp_path, agent_db, otlp, protocol, **overrides):
    return write_config(
        tmp_path / "run-otel.toml", bridge_sections(agent_db, tmp_path, otlp.endpoint(protocol), protocol, **overrides)
    )


def span_total(expected) -> int:
    return sum(1 + len(tools) for _run, tools in expected.values())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_once_exports_every_settled_terminal_run_as_mapped(agent_db, otlp, tmp_path, protocol):
    seed(agent_db, 200)
    expected = expected_traces(agent_db)
    assert 150 < len(expected) < 200  # the seed holds waiting runs too
    done = run_cli("once", "--config", str(config_file(tmp_path, agent_db, otlp, protocol)))
    assert done.returncode == 0, done.stderr
    wait_for(lambda: len(otlp.receiver.spans()) >= span_total(expected), 30, "all spans")
    received = received_by_trace(otlp.receiver)
    assert set(received) == set(expected)  # no PENDING or RUNNING run arrived
    for trace_id, (run, tools) in expected.items():
        assert_trace_matches(run, tools, received[trace_id])
    resource = {kv.key: kv.value.string_value for kv in otlp.receiver.spans()[0][0].attributes}
    assert resource["service.name"] == "diagnosis-agent"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_waiting_run_arrives_on_the_poll_after_it_finishes(agent_db, otlp, tmp_path, protocol):
    seed(agent_db, 30, waiting=3)
    config = str(config_file(tmp_path, agent_db, otlp, protocol))
    assert run_cli("once", "--config", config).returncode == 0
    waiting = table_rows(agent_db, "SELECT run_id FROM diagnosis_run WHERE status IN ('PENDING','RUNNING')")
    assert waiting
    wait_for(lambda: len(received_by_trace(otlp.receiver)) == len(expected_traces(agent_db)), 30, "first poll")
    late = waiting[0]["run_id"]
    assert late[4:].replace("-", "") not in received_by_trace(otlp.receiver)
    agent_db.execute(
        "UPDATE diagnosis_run SET status='SUCCESS', release_outcome='SUCCESS', total_duration_ms=1000, "
        "updated_at = NOW() - INTERVAL 1 MINUTE WHERE run_id=%s",
        late,
    )
    done = run_cli("once", "--config", config)
    assert done.returncode == 0, done.stderr
    expected = expected_traces(agent_db)
    trace = late[4:].replace("-", "")
    wait_for(lambda: trace in received_by_trace(otlp.receiver), 30, "the late run")
    assert_trace_matches(*expected[trace], received_by_trace(otlp.receiver)[trace])


def _run_row(run_id: str, status: str = "SUCCESS") -> dict:
    now = utc_now_naive()
    return dict(
        run_id=run_id,
        session_id="s",
        query="q",
        status=status,
        intent="DIAGNOSIS",
        release_outcome=status,
        total_duration_ms=1000,
        created_at=now.replace(year=now.year - 1),
        updated_at=now.replace(year=now.year - 1),
    )


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_late_commit_is_not_skipped(agent_db, otlp, tmp_path, protocol):
    config = str(config_file(tmp_path, agent_db, otlp, protocol))
    slow = agent_db.server.root(agent_db.name)
    slow.autocommit(False)
    with slow.cursor() as cur:
        cur.execute(
            "INSERT INTO diagnosis_run (run_id, session_id, query, status, "
            "release_outcome, total_duration_ms, created_at, updated_at) "
            "VALUES ('run-00000000-0000-4000-8000-00000000000a', 's', 'q', 'SUCCESS', "
            "'SUCCESS', 10, NOW() - INTERVAL 1 HOUR, NOW() - INTERVAL 1 HOUR)"
        )
    with agent_db.engine().begin() as conn:
        conn.execute(insert(diagnosis_run), [_run_row("run-00000000-0000-4000-8000-00000000000b")])
    ids = table_rows(agent_db, "SELECT id FROM diagnosis_run")
    assert len(ids) == 1  # k is invisible, k+1 committed
    assert run_cli("once", "--config", config).returncode == 0
    wait_for(lambda: "0000000000004000800000000000000b" in received_by_trace(otlp.receiver), 30, "k+1")
    slow.commit()
    slow.close()
    done = run_cli("once", "--config", config)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: "0000000000004000800000000000000a" in received_by_trace(otlp.receiver), 30, "k")


def checkpoint_row(tmp_path):
    import sqlite3

    with sqlite3.connect(tmp_path / "state.db") as conn:
        return conn.execute("SELECT high_water, pending, gaps FROM run_otel_checkpoint").fetchall()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_receiver_down_moves_nothing_and_recovers(agent_db, otlp, tmp_path, protocol):
    seed(agent_db, 40, waiting=2)
    config = str(config_file(tmp_path, agent_db, otlp, protocol, export={"max_attempts": 2, "timeout_seconds": 2}))
    otlp.rotel.stop()
    failed = run_cli("once", "--config", config)
    assert failed.returncode == 1
    error_lines = [line for line in failed.stderr.splitlines() if line.startswith("run-otel: error:")]
    assert len(error_lines) == 1 and "OTLP" in error_lines[0]
    assert "Traceback" not in failed.stderr
    assert checkpoint_row(tmp_path) == []
    otlp.rotel.start()
    done = run_cli("once", "--config", config)
    assert done.returncode == 0, done.stderr
    expected = expected_traces(agent_db)
    wait_for(lambda: len(otlp.receiver.spans()) >= span_total(expected), 30, "every waiting run")
    assert set(received_by_trace(otlp.receiver)) == set(expected)
    assert checkpoint_row(tmp_path)[0][0] == table_rows(agent_db, "SELECT MAX(id) AS m FROM diagnosis_run")[0]["m"]


def test_kill_9_mid_batch_then_restart_delivers_everything_identically(agent_db, tmp_path):
    seed(agent_db, 1500, waiting=0)
    # Straight to the test's receiver, which keeps the 11th request but holds its answer:
    # the daemon is then provably stuck mid-backlog, with a batch delivered but not acknowledged.
    receiver = Receiver(hold_after=10)
    receiver.start()
    sections = bridge_sections(agent_db, tmp_path, receiver.endpoint, poll={"batch_size": 25, "interval_seconds": 0.2})
    config = str(write_config(tmp_path / "run-otel.toml", sections))
    env = {**os.environ}
    command = [sys.executable, "-m", "run_otel", "run", "--config", config]
    first = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert receiver.holding.wait(60), "the daemon never reached the held request"
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        receiver.release()
    expected = expected_traces(agent_db)
    assert len(receiver.requests) == 11
    saved = checkpoint_row(tmp_path)[0][0]
    assert 0 < saved < max(run["id"] for run, _tools in expected.values())  # killed mid-backlog, by construction
    second = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: set(received_by_trace(receiver)) >= set(expected), 120, "every run after restart")
    finally:
        second.send_signal(signal.SIGTERM)
        _out, err = second.communicate(timeout=60)
        receiver.stop()
    assert second.returncode == 0, err
    copies = defaultdict(list)
    for resource, _scope, span in receiver.spans():
        copies[(span.trace_id, span.span_id)].append(span.SerializeToString() + resource.SerializeToString())
    assert any(len(versions) > 1 for versions in copies.values()), "no duplicate was sent: the test proves nothing about them"
    assert all(len(set(versions)) == 1 for versions in copies.values())
    received = received_by_trace(receiver)
    for trace_id, (run, tools) in expected.items():
        assert_trace_matches(run, tools, received[trace_id])


def test_sigterm_finishes_the_batch_and_saves_the_checkpoint(agent_db, tmp_path):
    seed(agent_db, 300, waiting=0)
    # The receiver holds the answer to the 4th request: SIGTERM then lands, by construction,
    # while a batch is in flight and the backlog is not drained.
    receiver = Receiver(hold_after=3)
    receiver.start()
    sections = bridge_sections(agent_db, tmp_path, receiver.endpoint, poll={"batch_size": 10})
    config = str(write_config(tmp_path / "run-otel.toml", sections))
    daemon = subprocess.Popen([sys.executable, "-m", "run_otel", "run", "--config", config], stderr=subprocess.PIPE, text=True)
    try:
        assert receiver.holding.wait(60), "the daemon never reached the held request"
        daemon.send_signal(signal.SIGTERM)
        time.sleep(1)
        receiver.release()  # the batch in flight is acknowledged after the signal
        _out, err = daemon.communicate(timeout=60)
    finally:
        receiver.stop()
    assert daemon.returncode == 0, err
    assert "stopped" in err
    saved = checkpoint_row(tmp_path)[0][0]
    time.sleep(1)
    ids = [r["id"] for r in table_rows(agent_db, "SELECT id FROM diagnosis_run ORDER BY id")]
    assert saved in ids and saved < ids[-1]  # it stopped mid-backlog
    arrived = {attrs_of(s)["diagnosis.run.id"] for _r, _s, s in receiver.spans() if not s.parent_span_id}
    exported_ids = {r["run_id"] for r in table_rows(agent_db, f"SELECT run_id FROM diagnosis_run WHERE id <= {saved}")}
    assert len(exported_ids) == 40  # the four acknowledged batches, the one in flight included
    assert exported_ids <= arrived  # everything below the checkpoint was acknowledged


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_backfill_exports_a_time_range_with_a_progress_bar(agent_db, otlp, tmp_path, protocol):
    seed(agent_db, 300, waiting=0)
    runs = table_rows(agent_db, "SELECT id, run_id, status, created_at FROM diagnosis_run ORDER BY id")
    since, until = runs[100]["created_at"], runs[200]["created_at"]
    inside = {r["run_id"][4:].replace("-", "") for r in runs if since <= r["created_at"] < until and r["status"] in TERMINAL}
    config = str(config_file(tmp_path, agent_db, otlp, protocol))
    done = run_cli("backfill", "--config", config, "--since", since.isoformat(), "--until", until.isoformat())
    assert done.returncode == 0, done.stderr
    assert f"backfilled {len(inside)} runs" in done.stdout
    assert "spans/s" in done.stderr and "backfill ids" in done.stderr  # the progress bar, with its rate
    wait_for(lambda: len(received_by_trace(otlp.receiver)) >= len(inside), 30, "the range")
    assert set(received_by_trace(otlp.receiver)) == inside
    assert checkpoint_row(tmp_path) == []  # the daemon's checkpoint is not touched
