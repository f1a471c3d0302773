"""Operating a deployment on MariaDB: status, rewind, export, relative times."""

from __future__ import annotations

import json
import time

from helpers import add_runs, bridge_sections, received_roots, run_cli, write_config
from servers import wait_for


def config_file(agent_db, tmp_path, otlp, **overrides) -> str:
    return str(write_config(tmp_path / "c.toml", bridge_sections(agent_db, tmp_path, otlp.endpoint("grpc"), **overrides)))


def test_status_shows_lag_pending_and_gaps_in_text_and_json(agent_db, otlp, tmp_path):
    add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 10 MINUTE"] * 5)
    add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 9 MINUTE"], status="RUNNING")  # id 6: pending
    agent_db.execute("DELETE FROM diagnosis_run WHERE id = 4")  # a gap below the high-water mark
    config = config_file(agent_db, tmp_path, otlp, poll={"start_from": "beginning", "batch_size": 500})
    assert run_cli("status", "--config", config).returncode == 1  # no state store yet...
    assert not (tmp_path / "state.db").exists()  # ...and status did not create one
    assert run_cli("once", "--config", config).returncode == 0
    add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 4 MINUTE", "UTC_TIMESTAMP() - INTERVAL 1 MINUTE"])  # the backlog: 7, 8
    done = run_cli("status", "--config", config, "--json")
    assert done.returncode == 0, done.stderr
    (row,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert row["high_water_id"] == 6 and row["newest_id"] == 8 and row["lag_runs"] == 2
    assert 475 <= row["lag_seconds"] <= 485  # 8 was created 8 minutes after 6
    assert (row["pending_runs"], row["gaps"]) == (1, 1)
    assert abs(time.time() - row["saved_at"]) < 60
    text = run_cli("status", "--config", config)
    assert text.returncode == 0
    assert "default" in text.stdout and "state store sqlite:///" in text.stdout
    row_line = next(line for line in text.stdout.splitlines() if line.strip().startswith("default"))
    assert "ago)" in row_line  # one line per shard, not wrapped at 80 columns in a pipe


def test_rewind_then_once_resends_exactly_the_runs_from_that_id(agent_db, otlp, tmp_path):
    traces = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 10 MINUTE"] * 10)
    config = config_file(agent_db, tmp_path, otlp, poll={"start_from": "beginning"})
    assert run_cli("once", "--config", config).returncode == 0
    wait_for(lambda: received_roots(otlp.receiver) == set(traces), 30, "the first export")
    before = len(otlp.receiver.requests)
    refused = run_cli("rewind", "--config", config, "--to-id", "7")  # no --yes and no terminal: no change
    assert refused.returncode == 1
    done = run_cli("rewind", "--config", config, "--to-id", "7", "--yes")
    assert done.returncode == 0, done.stderr
    assert "high-water id 10 -> 6" in done.stdout and "byte-identical" in done.stdout
    assert run_cli("once", "--config", config).returncode == 0
    wait_for(lambda: len(otlp.receiver.requests) > before, 30, "the re-export")
    time.sleep(0.5)
    again = {span.trace_id.hex() for request in otlp.receiver.requests[before:] for span in _roots(request)}
    assert again == set(traces[6:])


def test_rewind_since_a_relative_time(agent_db, otlp, tmp_path):
    traces = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 3 HOUR"] * 3 + ["UTC_TIMESTAMP() - INTERVAL 30 MINUTE"] * 2)
    config = config_file(agent_db, tmp_path, otlp, poll={"start_from": "beginning"})
    assert run_cli("once", "--config", config).returncode == 0
    done = run_cli("rewind", "--config", config, "--since", "1h", "--yes")
    assert done.returncode == 0, done.stderr
    assert "exports run ids from 4" in done.stdout
    assert len(traces) == 5


def test_export_sends_exactly_the_two_runs(agent_db, otlp, tmp_path):
    traces = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 10 MINUTE"] * 6)
    waiting = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 1 MINUTE"], status="RUNNING")
    run_ids = [f"run-{t[:8]}-{t[8:12]}-{t[12:16]}-{t[16:20]}-{t[20:]}" for t in (traces[1], traces[4], waiting[0])]
    config = config_file(agent_db, tmp_path, otlp)
    done = run_cli("export", "--config", config, *run_ids)
    assert done.returncode == 0, done.stderr
    assert "2 run(s)" in done.stdout and f"as trace {traces[1]}" in done.stdout
    assert "not finished yet" in done.stderr
    wait_for(lambda: received_roots(otlp.receiver) >= {traces[1], traces[4]}, 30, "the two runs")
    time.sleep(0.5)
    assert received_roots(otlp.receiver) == {traces[1], traces[4]}
    assert _checkpoint_rows(tmp_path) == []  # the checkpoint is untouched
    forced = run_cli("export", "--config", config, "--incomplete", run_ids[2])
    assert forced.returncode == 0 and "1 run(s)" in forced.stdout


def test_backfill_since_a_relative_time(agent_db, otlp, tmp_path):
    add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 3 DAY"] * 2)
    recent = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 2 HOUR"] * 3)
    done = run_cli("backfill", "--config", config_file(agent_db, tmp_path, otlp), "--since", "24h")
    assert done.returncode == 0, done.stderr
    assert "backfilled 3 runs" in done.stdout
    wait_for(lambda: received_roots(otlp.receiver) >= set(recent), 30, "the recent runs")
    assert received_roots(otlp.receiver) == set(recent)


def _roots(raw: bytes):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest.FromString(raw)
    return [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans if not s.parent_span_id]


def _checkpoint_rows(tmp_path) -> list:
    import sqlite3

    if not (tmp_path / "state.db").exists():
        return []
    with sqlite3.connect(tmp_path / "state.db") as conn:
        return conn.execute("SELECT name FROM run_otel_checkpoint").fetchall()


def test_the_backlog_gauge_counts_every_waiting_run_during_an_outage(agent_db, tmp_path):
    """Receiver down: 6 finished runs wait above the checkpoint, and the gauge says 6."""
    from servers import Receiver, free_port

    from run_otel.config import build_config
    from run_otel.export.sinks import ExportError
    from run_otel.factory import build_metrics, build_parts, build_poller

    add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 10 MINUTE"] * 2)
    receiver = Receiver()
    receiver.start()
    sections = bridge_sections(
        agent_db,
        tmp_path,
        receiver.endpoint,
        poll={"start_from": "beginning"},
        metrics={"enabled": True, "port": free_port()},
        export={"max_attempts": 1, "timeout_seconds": 2},
    )
    config = build_config(sections)
    metrics = build_metrics(config)
    poller = build_poller(build_parts(config, recorder=metrics))
    assert poller.poll().run_count == 2
    assert _gauge(metrics, "run_otel_backlog_runs") == 0
    receiver.stop()
    add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 9 MINUTE"] * 5 + ["UTC_TIMESTAMP() - INTERVAL 8 MINUTE"])
    try:
        poller.poll()
        raise AssertionError("the receiver is down: the poll must fail")
    except ExportError:
        pass
    assert _gauge(metrics, "run_otel_backlog_runs") == 6
    assert 115 <= _gauge(metrics, "run_otel_lag_seconds") <= 125
    metrics.shutdown()


def _gauge(metrics, name: str) -> float:
    (value,) = [s.value for f in metrics.registry.collect() for s in f.samples if s.name == name]
    return value


def test_a_successful_once_is_quiet_at_info(agent_db, otlp, tmp_path):
    config = config_file(agent_db, tmp_path, otlp, poll={"start_from": "beginning"}, log={"level": "INFO"})
    add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 10 MINUTE"] * 2)
    assert run_cli("once", "--config", config).returncode == 0  # the first start says where it begins
    add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 5 MINUTE"] * 36)
    done = run_cli("once", "--config", config)
    assert done.returncode == 0, done.stderr
    assert "exported 36 runs" in done.stdout
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) <= 2, lines


def test_health_probes_the_port_the_config_names_and_follows_an_override(agent_db, otlp, tmp_path):
    from helpers import DaemonProcess
    from servers import free_port

    port = free_port()
    config = config_file(agent_db, tmp_path, otlp, metrics={"enabled": True, "host": "0.0.0.0", "port": port})
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    try:
        wait_for(lambda: run_cli("health", "--config", config).returncode == 0, 30, "the daemon to be ready")
        done = run_cli("health", "--config", config, "--live")
        assert done.returncode == 0 and f"http://127.0.0.1:{port}/healthz: 200" in done.stdout
        # The same config with the port moved by the environment: the probe follows, finds nothing.
        other = free_port()
        started = time.monotonic()
        moved = run_cli("health", "--config", config, env={"RUN_OTEL_METRICS__PORT": str(other)})
        assert moved.returncode == 1 and f"127.0.0.1:{other}/readyz: no answer" in moved.stdout
        assert time.monotonic() - started < 10
    finally:
        daemon.terminate()
    off = run_cli("health", "--config", config, env={"RUN_OTEL_METRICS__ENABLED": "false"})
    assert off.returncode == 2 and "metrics.enabled is false" in off.stderr


def test_a_backfill_stopped_by_sigterm_says_where_to_resume(agent_db, otlp, tmp_path):
    import signal
    import subprocess
    import sys

    agent_db.execute(
        """INSERT INTO diagnosis_run (run_id, session_id, query, status, created_at, updated_at)
           SELECT CONCAT('run-stop-', seq), 's', 'q', 'SUCCESS', UTC_TIMESTAMP() - INTERVAL 1 HOUR,
                  UTC_TIMESTAMP() - INTERVAL 1 HOUR FROM seq_1_to_60000"""
    )
    config = write_config(
        tmp_path / "c.toml", bridge_sections(agent_db, tmp_path, otlp.endpoint("grpc"), poll={"batch_size": 200})
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "run_otel", "backfill", "--from-id", "1", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: len(received_roots(otlp.receiver)) >= 1000, 60, "the backfill to be under way")
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    stopped_after = int(err.split("stopped by SIGTERM after run id ")[1].split(":")[0]) if "stopped by SIGTERM" in err else None
    # The precondition: the signal landed mid-backlog, not after the last batch.
    assert stopped_after is not None and stopped_after < 60000, (out, err)
    assert process.returncode == 1
    assert f"resume with --from-id {stopped_after + 1} --to-id 60000" in err
    # Every run up to the id it names was sent, so resuming there skips nothing.
    wait_for(lambda: len(received_roots(otlp.receiver)) >= stopped_after, 30, "the runs before the stop")


def test_a_backfill_up_to_the_daemons_start_probes_its_first_id_from_since(agent_db, otlp, tmp_path):
    """`backfill --since 2h --to-id N`, the README's history up to the daemon's start: the first id is
    probed from the window (not id 1, a read of the whole table), the last is N, and nothing above N goes."""
    older = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 5 HOUR"] * 3)
    history = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 1 HOUR"] * 4)
    daemons = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 10 MINUTE"] * 2)
    ((start,),) = agent_db.execute("SELECT MAX(id) - 2 FROM diagnosis_run")
    done = run_cli("backfill", "--config", config_file(agent_db, tmp_path, otlp), "--since", "2h", "--to-id", str(start))
    assert done.returncode == 0, done.stderr
    assert f"backfill ids {start - 3}..{start}" in done.stderr, done.stderr
    sent = wait_for(lambda: (roots := received_roots(otlp.receiver)) and len(roots) >= 4 and roots, 30, "the history's roots")
    time.sleep(0.5)
    assert received_roots(otlp.receiver) == set(history)
    assert len(sent) == 4 and not set(older + daemons) & sent
