"""The source going backwards on real MariaDB: a restore from an older backup resets
AUTO_INCREMENT below the checkpoint, and new runs reuse ids the poller has passed."""

from __future__ import annotations

import json
import re
import shlex
import time

import requests
from helpers import DaemonProcess, add_finished_runs, bridge_sections, received_roots, run_cli, write_config
from servers import free_port, wait_for


def restore_backup(agent_db, newest_kept: int) -> None:
    """What restoring a backup taken at id ``newest_kept`` does: later rows go, and so does their AUTO_INCREMENT."""
    agent_db.execute("DELETE FROM diagnosis_run WHERE id > %s", newest_kept)
    agent_db.execute(f"ALTER TABLE diagnosis_run AUTO_INCREMENT = {newest_kept + 1}")


def ids(agent_db) -> list[int]:
    return [row[0] for row in agent_db.execute("SELECT id FROM diagnosis_run ORDER BY id")]


def config_file(agent_db, tmp_path, otlp, **overrides) -> str:
    return str(write_config(tmp_path / "c.toml", bridge_sections(agent_db, tmp_path, otlp.endpoint("grpc"), **overrides)))


def rewind_in(text: str) -> list[str]:
    """The rewind command a message names, as arguments."""
    match = re.search(r"`run-otel (rewind [^`]+)`", text)
    assert match, text
    return shlex.split(match.group(1))


def test_a_restore_below_the_checkpoint_fails_once_and_check_and_names_the_rewind(agent_db, otlp, tmp_path):
    add_finished_runs(agent_db, 20)
    config = config_file(agent_db, tmp_path, otlp)
    first = run_cli("once", "--config", config)
    assert first.returncode == 0 and "exported 20 runs" in first.stdout, first.stdout + first.stderr
    wait_for(lambda: len(received_roots(otlp.receiver)) == 20, 30, "the first runs")  # before the clear below
    restore_backup(agent_db, 12)
    new = add_finished_runs(agent_db, 3, created="UTC_TIMESTAMP()")
    assert ids(agent_db) == [*range(1, 13), 13, 14, 15]  # the new runs reuse ids the checkpoint has passed
    otlp.receiver.clear()

    lost = run_cli("once", "--config", config)
    assert lost.returncode == 1, lost.stdout + lost.stderr
    assert "exported 0 runs" not in lost.stdout
    line = lost.stderr.strip().splitlines()[-1]
    assert "is at run id 20" in line and "the newest run is id 15" in line and "the source went backwards" in line, line
    command = rewind_in(line)
    assert not received_roots(otlp.receiver)

    check = run_cli("check", "--config", config)
    assert check.returncode == 1
    finding = next(row for row in check.stdout.splitlines() if "checkpoint ahead of the source" in row)
    assert "is at run id 20" in finding and rewind_in(finding) == command

    status = run_cli("status", "--config", config, "--json")
    assert json.loads(status.stdout.splitlines()[0])["ahead_runs"] == 5
    assert "5 run ids ahead of the source" in run_cli("status", "--config", config).stdout

    rewound = run_cli(*command, "--config", config, "--yes")
    assert rewound.returncode == 0 and "rewound default" in rewound.stdout, rewound.stdout + rewound.stderr
    again = run_cli("once", "--config", config)
    assert again.returncode == 0, again.stderr
    # The collector acknowledges before it forwards: wait for the receiver behind it.
    wait_for(lambda: received_roots(otlp.receiver) >= set(new), 30, "the new runs")
    assert run_cli("check", "--config", config).returncode == 0


def test_an_empty_table_after_a_restore_fails_the_poll(agent_db, otlp, tmp_path):
    add_finished_runs(agent_db, 4)
    config = config_file(agent_db, tmp_path, otlp)
    assert run_cli("once", "--config", config).returncode == 0
    agent_db.execute("TRUNCATE TABLE diagnosis_run")
    lost = run_cli("once", "--config", config)
    assert lost.returncode == 1
    assert "is at run id 4, but in" in lost.stderr and "there are no runs" in lost.stderr, lost.stderr


def test_a_restore_refilled_past_the_mark_is_caught_by_the_run_at_the_mark(agent_db, otlp, tmp_path):
    """Between two polls the backup comes back and more runs than it lost arrive:
    the newest id is above the mark again, but the run at the mark is another one."""
    from run_otel.config import build_config
    from run_otel.factory import build_parts, build_poller
    from run_otel.pipeline.guard import SourceBehindError

    add_finished_runs(agent_db, 10)
    parts = build_parts(build_config(bridge_sections(agent_db, tmp_path, otlp.endpoint("grpc"))))
    poller = build_poller(parts)
    assert poller.poll().run_count == 10
    restore_backup(agent_db, 6)
    add_finished_runs(agent_db, 7, created="UTC_TIMESTAMP()")
    assert max(ids(agent_db)) == 13
    try:
        poller.poll()
        raise AssertionError("the poll went past reused ids")
    except SourceBehindError as exc:
        message = str(exc)
    assert "run id 10 is now run-" in message and "the source went backwards" in message, message
    assert parts.store.load().high_water == 10  # nothing was saved past them


def test_the_daemon_drops_readiness_and_sets_the_gauge(agent_db, otlp, tmp_path):
    add_finished_runs(agent_db, 8)
    port = free_port()
    config = write_config(
        tmp_path / "c.toml",
        bridge_sections(
            agent_db,
            tmp_path,
            otlp.endpoint("grpc"),
            poll={"retry_initial_seconds": 0.5, "retry_max_seconds": 2},
            metrics={"enabled": True, "port": port},
        ),
    )
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: len(received_roots(otlp.receiver)) == 8, 30, "the first runs")
        wait_for(lambda: _get(base + "/readyz")[0] == 200, 10, "readiness")
        assert re.search(r'run_otel_checkpoint_ahead\{[^}]*shard="default"[^}]*\} 0', _get(base + "/metrics")[1])
        restore_backup(agent_db, 5)
        wait_for(lambda: _get(base + "/readyz")[0] == 503, 15, "readiness to drop")
        assert "3 run ids ahead of the source" in _get(base + "/readyz")[1]
        assert re.search(r'run_otel_checkpoint_ahead\{[^}]*shard="default"[^}]*\} 3', _get(base + "/metrics")[1])
        time.sleep(3)
    finally:
        assert daemon.terminate() == 0
    failed = [line for line in daemon.output().splitlines() if "the source went backwards" in line]
    assert failed and all("poll failed" in line and "retrying in" in line for line in failed)
    assert "Traceback" not in daemon.output()


def _get(url: str) -> tuple[int, str]:
    try:
        reply = requests.get(url, timeout=2)
        return reply.status_code, reply.text
    except requests.RequestException:
        return 0, ""


def test_deleting_the_newest_runs_is_no_restore(agent_db, otlp, tmp_path):
    add_finished_runs(agent_db, 6)
    config = config_file(agent_db, tmp_path, otlp)
    assert run_cli("once", "--config", config).returncode == 0
    agent_db.execute("DELETE FROM diagnosis_run WHERE id >= 5")  # the agent deletes its newest runs
    assert ids(agent_db) == [1, 2, 3, 4]
    polled = run_cli("once", "--config", config)
    assert polled.returncode == 0, polled.stderr
    assert "run ids 5..6 deleted" in polled.stderr and "not a restore" in polled.stderr, polled.stderr
    check = run_cli("check", "--config", config)
    assert check.returncode == 0, check.stdout
    assert "checkpoint ahead of the source" not in check.stdout
    new = add_finished_runs(agent_db, 2, created="UTC_TIMESTAMP()")
    assert ids(agent_db) == [1, 2, 3, 4, 7, 8]  # AUTO_INCREMENT stayed above the deleted ids
    otlp.receiver.clear()
    assert run_cli("once", "--config", config).returncode == 0
    wait_for(lambda: received_roots(otlp.receiver) >= set(new), 30, "the new runs")
    time.sleep(0.5)  # and for anything else it would forward
    assert received_roots(otlp.receiver) == set(new)


def test_a_pending_run_deleted_by_the_agent_is_dropped_after_a_recheck(agent_db, otlp, tmp_path, caplog):
    import logging

    from helpers import bridge_config, bridge_metrics
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from run_otel.factory import build_parts, build_poller
    from run_otel.telemetry import instruments as I

    add_finished_runs(agent_db, 2)
    agent_db.execute("UPDATE diagnosis_run SET status = 'RUNNING', created_at = UTC_TIMESTAMP() WHERE id = 2")
    reader = InMemoryMetricReader()
    config = bridge_config(agent_db, tmp_path, otlp.endpoint("grpc"))
    metrics = bridge_metrics(config, [reader])
    poller = build_poller(build_parts(config, recorder=metrics))
    assert poller.poll().pending == 1
    agent_db.execute("DELETE FROM diagnosis_run WHERE id = 2")
    with caplog.at_level(logging.WARNING, logger="run_otel"):
        assert poller.poll().pending == 1  # missed once: re-checked at the next poll
        assert not any("pending run(s) were deleted" in r.getMessage() for r in caplog.records)
        assert poller.poll().pending == 0
    assert any("1 pending run(s) were deleted" in r.getMessage() and "run id 2" in r.getMessage() for r in caplog.records)
    data = reader.get_metrics_data()
    (count,) = [
        p.value
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == I.PENDING_DELETED.name
        for p in m.data.data_points
    ]
    assert count == 1
    metrics.shutdown()
