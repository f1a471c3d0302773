"""One writer per state store and shard, on a SQLite file and on MariaDB: a second
instance is refused at start naming the first; HA standbys wait instead."""

from __future__ import annotations

import socket

import pytest
from helpers import DaemonProcess, add_finished_runs, bridge_sections, received_roots, run_cli, write_config
from servers import wait_for


def state_url(agent_db, tmp_path, store: str) -> str:
    return f"sqlite:///{tmp_path / 'state.db'}" if store == "sqlite" else agent_db.url


@pytest.mark.parametrize("store", ["sqlite", "mariadb"])
def test_a_second_instance_is_refused_naming_the_first(agent_db, otlp, tmp_path, store):
    traces = set(add_finished_runs(agent_db, 30))
    config = write_config(
        tmp_path / "c.toml",
        bridge_sections(agent_db, tmp_path, otlp.endpoint("grpc"), state={"url": state_url(agent_db, tmp_path, store)}),
    )
    first = DaemonProcess(config, tmp_path / "first.log")
    try:
        wait_for(lambda: received_roots(otlp.receiver) >= traces, 30, "the first instance exporting")
        holder = f"host {socket.gethostname()}, pid {first.process.pid}, started "
        for command in (("run",), ("once",)):
            refused = run_cli(*command, "--config", str(config), timeout=60)
            assert refused.returncode == 1, refused.stderr
            line = refused.stderr.strip().splitlines()[-1]
            assert "is in use by another run-otel" in line and holder in line and "shard default" in line, line
        rewind = run_cli("rewind", "--config", str(config), "--to-id", "1", "--yes")
        assert rewind.returncode == 1 and holder in rewind.stderr, rewind.stderr
        # Reading is never refused.
        assert run_cli("status", "--config", str(config)).returncode == 0
        more = set(add_finished_runs(agent_db, 5))
        wait_for(lambda: received_roots(otlp.receiver) >= traces | more, 30, "the first instance going on")
    finally:
        assert first.terminate() == 0
    # Every run went out once: the refused ones sent nothing.
    roots = [span for _r, _s, span in otlp.receiver.spans() if not span.parent_span_id]
    assert len(roots) == 35
    # The holder gone, the lock is free.
    again = run_cli("once", "--config", str(config))
    assert again.returncode == 0 and "exported 0 runs" in again.stdout, again.stderr


def test_ha_standbys_wait_and_a_once_beside_the_active_one_is_refused(agent_db, otlp, tmp_path):
    traces = set(add_finished_runs(agent_db, 10))
    config = write_config(
        tmp_path / "c.toml",
        bridge_sections(agent_db, tmp_path, otlp.endpoint("grpc"), ha={"enabled": True, "takeover_seconds": 3}),
    )
    a = DaemonProcess(config, tmp_path / "a.log")
    b = DaemonProcess(config, tmp_path / "b.log")
    try:
        wait_for(
            lambda: "acquired" in a.output() + b.output() and "standing by" in a.output() + b.output(),
            30,
            "one active, one standby",
        )
        active, standby = (a, b) if "acquired" in a.output() else (b, a)
        wait_for(lambda: received_roots(otlp.receiver) >= traces, 30, "the active instance exporting")
        assert standby.alive() and "in use" not in standby.output()
        refused = run_cli("once", "--config", str(config))
        assert refused.returncode == 1 and f"pid {active.process.pid}" in refused.stderr, refused.stderr
        active.kill()
        wait_for(lambda: "acquired" in standby.output(), 15, "the standby to take over the lease and the store")
        more = set(add_finished_runs(agent_db, 3))
        wait_for(lambda: received_roots(otlp.receiver) >= traces | more, 30, "the new active instance exporting")
        assert "in use" not in standby.output()
    finally:
        for process in (a, b):
            if process.alive():
                assert process.terminate() == 0
