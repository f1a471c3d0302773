"""Faults on real servers: the database restarts, the receiver goes away or rejects spans,
the process is killed, the state store is damaged."""

from __future__ import annotations

import random
import sqlite3
import time

from conftest import AgentDb
from helpers import (
    DaemonProcess,
    bridge_sections,
    received_roots,
    run_cli,
    table_rows,
    terminal_trace_ids,
    utc_now_naive,
    write_config,
)
from servers import Receiver, wait_for

from run_otel.ops.demo import generate, insert_workload


def seed(agent_db, runs: int, seed_value: int) -> None:
    insert_workload(agent_db.engine(), generate(seed_value, runs, anchor=utc_now_naive()))


def config(tmp_path, agent_db, endpoint: str, protocol: str = "grpc", **overrides):
    sections = bridge_sections(agent_db, tmp_path, endpoint, protocol, **overrides)
    return write_config(tmp_path / "run-otel.toml", sections)


def test_database_restart_keeps_the_daemon_alive(private_mariadb, otlp, tmp_path):
    db = AgentDb(private_mariadb, "agent", private_mariadb.create_database("agent"))
    seed(db, 50, 1)
    daemon = DaemonProcess(
        config(
            tmp_path,
            db,
            otlp.endpoint("grpc"),
            poll={"interval_seconds": 0.5, "retry_initial_seconds": 0.5, "retry_max_seconds": 2},
        ),
        tmp_path / "daemon.log",
    )
    try:
        first = terminal_trace_ids(db)
        wait_for(lambda: received_roots(otlp.receiver) >= first, 60, "the first runs")
        private_mariadb.stop()
        time.sleep(3)
        assert daemon.alive()
        private_mariadb.start()
        seed(db, 40, 2)
        wait_for(lambda: received_roots(otlp.receiver) >= terminal_trace_ids(db), 60, "runs inserted after the restart")
        assert daemon.alive()
    finally:
        assert daemon.terminate() == 0
    output = daemon.output()
    assert "poll failed" in output and "retrying in" in output
    assert private_mariadb.ROOT_PASSWORD not in output


def test_receiver_away_for_30_seconds_loses_nothing(agent_db, otlp, tmp_path):
    seed(agent_db, 60, 3)
    daemon = DaemonProcess(
        config(
            tmp_path,
            agent_db,
            otlp.endpoint("http/protobuf"),
            "http/protobuf",
            poll={"interval_seconds": 0.5, "retry_max_seconds": 2},
            export={"max_attempts": 1, "timeout_seconds": 2},
        ),
        tmp_path / "daemon.log",
    )
    try:
        wait_for(lambda: received_roots(otlp.receiver) >= terminal_trace_ids(agent_db), 60, "the first runs")
        otlp.rotel.stop()
        seed(agent_db, 80, 4)  # these finish while nobody listens
        time.sleep(30)
        otlp.rotel.start()
        wait_for(lambda: received_roots(otlp.receiver) >= terminal_trace_ids(agent_db), 90, "the runs held back")
    finally:
        assert daemon.terminate() == 0
    assert "export to OTLP/HTTP" in daemon.output() or "poll failed" in daemon.output()


def test_partial_success_is_logged_and_counted(agent_db, tmp_path):
    receiver = Receiver(reject_every=3)
    receiver.start()
    try:
        seed(agent_db, 20, 5)
        done = run_cli("once", "--config", str(config(tmp_path, agent_db, receiver.endpoint)))
    finally:
        receiver.stop()
    assert done.returncode == 3, done.stderr  # checkpointed, but not all delivered
    assert "receiver rejected 3 of" in done.stderr
    assert "test receiver rejects spans" in done.stderr
    assert "receiver rejected 3 spans" in done.stdout


def test_kill_9_twenty_times_loses_nothing(agent_db, otlp, tmp_path):
    seed(agent_db, 6000, 6)
    path = config(tmp_path, agent_db, otlp.endpoint("grpc"), poll={"batch_size": 5, "interval_seconds": 0.2})
    rng = random.Random(20)
    terminal = terminal_trace_ids(agent_db)
    for _ in range(20):
        before = len(otlp.receiver.requests)
        daemon = DaemonProcess(path, tmp_path / "daemon.log")
        # Killed only once it has delivered something, at a random point a little later:
        # every kill lands inside the drain, however fast or slow the machine is.
        wait_for(lambda b=before: len(otlp.receiver.requests) > b, 60, "this daemon to deliver")
        time.sleep(rng.uniform(0, 0.3))
        daemon.kill()
        assert received_roots(otlp.receiver) < terminal  # really killed mid-backlog
    assert len(received_roots(otlp.receiver)) < len(terminal) // 2
    last = DaemonProcess(path, tmp_path / "daemon.log")
    try:
        wait_for(lambda: received_roots(otlp.receiver) >= terminal_trace_ids(agent_db), 120, "everything")
    finally:
        assert last.terminate() == 0
    assert received_roots(otlp.receiver) == terminal_trace_ids(agent_db)
    copies: dict = {}
    for resource, _scope, span in otlp.receiver.spans():
        blob = span.SerializeToString() + resource.SerializeToString()
        assert copies.setdefault((span.trace_id, span.span_id), blob) == blob  # duplicates are identical


def test_a_damaged_state_store_is_a_clear_error(agent_db, otlp, tmp_path):
    seed(agent_db, 10, 7)
    path = config(tmp_path, agent_db, otlp.endpoint("grpc"))
    assert run_cli("once", "--config", str(path)).returncode == 0
    with sqlite3.connect(tmp_path / "state.db") as conn:
        conn.execute("UPDATE run_otel_checkpoint SET pending = 'not json'")
    done = run_cli("once", "--config", str(path))
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert "is damaged" in line and "Refusing to restart from scratch" in line
    (tmp_path / "state.db").write_bytes(b"this is not a database" * 100)
    done = run_cli("once", "--config", str(path))
    assert done.returncode == 1
    assert "state store" in done.stderr and "Traceback" not in done.stderr


def test_a_deleted_state_store_says_where_it_restarts(agent_db, otlp, tmp_path):
    seed(agent_db, 10, 8)
    path = config(tmp_path, agent_db, otlp.endpoint("grpc"), poll={"start_from": "now"})
    assert run_cli("once", "--config", str(path)).returncode == 0
    (tmp_path / "state.db").unlink()
    done = run_cli("once", "--config", str(path))
    assert done.returncode == 0
    top = table_rows(agent_db, "SELECT MAX(id) AS m FROM diagnosis_run")[0]["m"]
    assert (
        "WARNING run_otel.pipeline.poller: no checkpoint for default in "
        f"sqlite:///{tmp_path / 'state.db'}: starting after run id {top}" in done.stderr
    )


def test_retries_happen_when_the_log_says_and_recovery_is_said(agent_db, tmp_path):
    """Backoff of 1, 2, 4 s (with jitter) under a 10 s poll interval: each retry comes
    at the announced time, not at the next interval tick."""
    import json
    from datetime import datetime

    from servers import free_port

    seed(agent_db, 20, 11)
    receiver = Receiver(port=free_port())  # not started yet: the endpoint refuses
    path = config(
        tmp_path,
        agent_db,
        f"127.0.0.1:{receiver.port}",
        poll={"interval_seconds": 10, "retry_initial_seconds": 1, "retry_max_seconds": 60},
        export={"max_attempts": 1, "timeout_seconds": 2},
        log={"format": "json"},
    )
    daemon = DaemonProcess(path, tmp_path / "daemon.log")
    try:
        wait_for(lambda: daemon.output().count("poll failed") >= 4, 60, "four failed polls")
        receiver.start()
        wait_for(lambda: "recovered" in daemon.output(), 60, "the recovery line")
    finally:
        assert daemon.terminate() == 0
        receiver.stop()
    records = [json.loads(line) for line in daemon.output().splitlines()]
    failures = [r for r in records if r["message"].startswith("poll failed")]
    stamps = [datetime.fromisoformat(r["time"].replace("Z", "+00:00")).timestamp() for r in failures]
    announced = [float(r["message"].rsplit("retrying in ", 1)[1].rstrip("s")) for r in failures]
    for number, (gap, said) in enumerate(zip((b - a for a, b in zip(stamps, stamps[1:])), announced)):
        assert 0.8 * 2**number - 0.01 <= said <= 1.2 * 2**number + 0.01, (number, said)
        assert abs(gap - said) < 0.6, (number, gap, said)  # at the announced time, not at the next 10 s tick
    recovered = next(r["message"] for r in records if "recovered" in r["message"])
    assert f"after {len(failures)} failed poll(s)" in recovered
    assert f"exported {len(terminal_trace_ids(agent_db))} runs" in recovered
