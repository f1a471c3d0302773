"""Faults on real servers: the database restarts, the receiver goes away or rejects spans,
the process is killed, the state store is damaged."""

from __future__ import annotations

import random
import sqlite3
import time

from conftest import (
    AgentDb,
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

from run_otel.demo import generate, insert_workload


def seed(agent_db, runs: int, seed_value: int) -> None:
    insert_workload(agent_db.engine(), generate(seed_value, runs, anchor=utc_now_naive()))


def config(tmp_path, agent_db, endpoint: str, protocol: str = "grpc", **overrides):
    sections = bridge_sections(agent_db, tmp_path, endpoint, protocol, **overrides)
    return write_config(tmp_path / "run-otel.toml", sections)


def test_database_restart_keeps_the_daemon_alive(private_mariadb, otlp, tmp_path):
    db = AgentDb(private_mariadb, "agent", private_mariadb.create_database("agent"))
    seed(db, 50, 1)
    daemon = DaemonProcess(
        config(tmp_path, db, otlp.endpoint("grpc"), poll={"interval_seconds": 0.5, "retry_initial_seconds": 0.5, "retry_max_seconds": 2}),
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
        config(tmp_path, agent_db, otlp.endpoint("http/protobuf"), "http/protobuf",
               poll={"interval_seconds": 0.5, "retry_max_seconds": 2}, export={"max_attempts": 1, "timeout_seconds": 2}),
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
    assert done.returncode == 0, done.stderr
    assert "receiver rejected 3 of" in done.stderr
    assert "test receiver rejects spans" in done.stderr
    assert "receiver rejected 3 spans" in done.stdout


def test_kill_9_twenty_times_loses_nothing(agent_db, otlp, tmp_path):
    seed(agent_db, 6000, 6)
    path = config(tmp_path, agent_db, otlp.endpoint("grpc"), poll={"batch_size": 5, "interval_seconds": 0.2})
    rng = random.Random(20)
    for _ in range(20):
        daemon = DaemonProcess(path, tmp_path / "daemon.log")
        time.sleep(rng.uniform(0.6, 1.8))  # past start-up, at a random point of the drain
        daemon.kill()
    assert received_roots(otlp.receiver) < terminal_trace_ids(agent_db)  # really killed mid-backlog
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
    assert f"WARNING run_otel.poller: no checkpoint for default in sqlite:///{tmp_path / 'state.db'}: starting after run id {top}" in done.stderr
