"""A rotated database password and SIGHUP, on a real MariaDB: the daemon takes up the
rewritten password file without a restart, SIGHUP reloads what it can and keeps running, and
`check` calls a refused password a refused login, not an unreachable database."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from conftest import DRIVERS, AgentDb
from helpers import DaemonProcess, add_finished_runs, bridge_sections, received_roots, run_cli, write_config
from servers import free_port, wait_for, with_driver

from run_otel.source.password_file import readable_by_others

OLD_PASSWORD = "rotation-old-7Qx2"
NEW_PASSWORD = "rotation-new-Vb91"


def _reader(agent_db: AgentDb, password: str) -> str:
    """A SELECT-only user on the test's database; returns its URL without the password."""
    user = f"r{agent_db.name[-12:]}"
    agent_db.execute(f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{password}'")
    agent_db.execute(f"GRANT SELECT ON `{agent_db.name}`.* TO '{user}'@'127.0.0.1'")
    return agent_db.server.url(agent_db.name, user, "placeholder")


def _kill_sessions(agent_db: AgentDb, user: str) -> int:
    ids = [row[0] for row in agent_db.execute("SELECT id FROM information_schema.processlist WHERE user = %s", user)]
    for session in ids:
        agent_db.execute(f"KILL {session}")
    return len(ids)


def _daemon(tmp_path: Path, agent_db: AgentDb, url: str, secret: Path, endpoint: str, level: str = "INFO") -> Path:
    sections = bridge_sections(
        agent_db,
        tmp_path,
        endpoint,
        source={"url": url, "password_file": str(secret)},
        poll={"interval_seconds": 0.5, "retry_initial_seconds": 0.5, "retry_max_seconds": 2},
        log={"level": level},
    )
    return write_config(tmp_path / "run-otel.toml", sections)


def _write_secret(path: Path, password: str) -> None:
    path.write_text(password + "\n", encoding="utf-8")
    path.chmod(0o400)


def _rewrite_secret(path: Path, password: str) -> None:
    """As Kubernetes does: the new file is written beside the old, then renamed over it."""
    fresh = path.with_suffix(".new")
    _write_secret(fresh, password)
    os.replace(fresh, path)


def test_a_rotated_password_is_taken_up_without_a_restart(agent_db, receiver, tmp_path):
    secret = tmp_path / "db-password"
    _write_secret(secret, OLD_PASSWORD)
    url = _reader(agent_db, OLD_PASSWORD)
    user = url.split("//")[1].split(":")[0]
    daemon = DaemonProcess(_daemon(tmp_path, agent_db, url, secret, receiver.endpoint), tmp_path / "daemon.log")
    try:
        first = set(add_finished_runs(agent_db, 3))
        wait_for(lambda: received_roots(receiver) >= first, 60, "the runs before the rotation")

        agent_db.execute(f"ALTER USER '{user}'@'127.0.0.1' IDENTIFIED BY '{NEW_PASSWORD}'")
        assert _kill_sessions(agent_db, user) >= 1  # the daemon must need a new connection
        second = set(add_finished_runs(agent_db, 3))
        wait_for(lambda: "1045" in daemon.output(), 30, "the access-denied line while the file holds the old password")
        assert not received_roots(receiver) & second

        _rewrite_secret(secret, NEW_PASSWORD)
        wait_for(lambda: received_roots(receiver) >= second, 30, "the runs after the file was rewritten")
        assert daemon.alive()
    finally:
        assert daemon.terminate() == 0
    output = daemon.output()
    assert "exports recovered" in output
    assert OLD_PASSWORD not in output and NEW_PASSWORD not in output


def test_sighup_reloads_the_log_level_and_the_password_file_and_keeps_running(agent_db, receiver, tmp_path):
    secret = tmp_path / "db-password"
    _write_secret(secret, OLD_PASSWORD)
    url = _reader(agent_db, OLD_PASSWORD)
    config = _daemon(tmp_path, agent_db, url, secret, receiver.endpoint)
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    try:
        wait_for(lambda: "starting" in daemon.output(), 30, "the start line")
        text = (
            config.read_text()
            .replace('level = "INFO"', 'level = "DEBUG"')
            .replace("interval_seconds = 0.5", "interval_seconds = 0.7")
        )
        config.write_text(text)
        daemon.process.send_signal(signal.SIGHUP)
        wait_for(lambda: "SIGHUP:" in daemon.output(), 15, "the reload line")
        time.sleep(1)
        assert daemon.alive(), daemon.output()
        runs = set(add_finished_runs(agent_db, 2))
        wait_for(lambda: received_roots(receiver) >= runs, 30, "runs exported after the signal")

        config.write_text("[source\nbroken")
        daemon.process.send_signal(signal.SIGHUP)
        wait_for(lambda: "was not reloaded" in daemon.output(), 15, "the line about the broken file")
        assert daemon.alive()
    finally:
        assert daemon.terminate() == 0
    line = next(line for line in daemon.output().splitlines() if "SIGHUP:" in line)
    assert "log.level INFO -> DEBUG" in line
    assert "source.password_file re-read (unchanged)" in line
    assert "applied only after a restart: poll.interval_seconds" in line
    assert " DEBUG " in daemon.output().split(line, 1)[1], "the new level took effect"
    assert OLD_PASSWORD not in daemon.output()


@pytest.mark.parametrize(("mode", "warned"), [(0o400, False), (0o440, True), (0o644, True), (0o600, False)])
def test_a_password_file_others_can_read_is_named(tmp_path, mode, warned):
    secret = tmp_path / "db-password"
    secret.write_text("x")
    secret.chmod(mode)
    warning = readable_by_others(str(secret))
    assert (warning is not None) == warned
    if warning:
        assert f"mode {mode:04o}" in warning and "0400" in warning


def test_check_and_the_start_line_warn_of_a_password_file_others_can_read(agent_db, receiver, tmp_path):
    secret = tmp_path / "db-password"
    url = _reader(agent_db, OLD_PASSWORD)
    _write_secret(secret, OLD_PASSWORD)
    secret.chmod(0o644)
    config = _daemon(tmp_path, agent_db, url, secret, receiver.endpoint)
    checked = run_cli("check", "--config", str(config))
    assert "source.password_file" in checked.stdout and "readable by its group and every user" in checked.stdout, checked.stdout
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    try:
        wait_for(lambda: "readable by" in daemon.output(), 30, "the warning at start")
    finally:
        assert daemon.terminate() == 0
    secret.chmod(0o400)
    assert "readable by" not in run_cli("check", "--config", str(config)).stdout


def _database_line(config: Path) -> tuple[int, str, str]:
    checked = run_cli("check", "--config", str(config))
    lines = [line for line in checked.stdout.splitlines() if " database: " in line]
    assert lines, checked.stdout + checked.stderr
    return checked.returncode, lines[0], checked.stdout + checked.stderr


@pytest.mark.parametrize("driver", DRIVERS)
def test_check_calls_a_wrong_password_access_denied_for_the_user_not_unreachable(agent_db, receiver, tmp_path, driver):
    secret = tmp_path / "db-password"
    url = with_driver(_reader(agent_db, OLD_PASSWORD), driver)
    user = url.split("//")[1].split(":")[0]
    _write_secret(secret, NEW_PASSWORD)  # not the user's password (yet): the server answers 1045
    config = _daemon(tmp_path, agent_db, url, secret, receiver.endpoint)
    code, line, output = _database_line(config)
    assert code == 1 and line.startswith("✘")
    assert "unreachable" not in line
    assert "denied access (MySQL error 1045" in line and f"user '{user}'@'127.0.0.1'" in line, line
    assert "check the password" in line and f"source.password_file ({secret})" in line, line
    assert NEW_PASSWORD not in output and OLD_PASSWORD not in output

    _rewrite_secret(secret, OLD_PASSWORD)  # the right one: the same line says reachable
    code, line, _ = _database_line(config)
    assert line.startswith("✔") and line.endswith("reachable"), line


def test_check_still_calls_a_closed_port_unreachable(agent_db, receiver, tmp_path):
    secret = tmp_path / "db-password"
    _write_secret(secret, OLD_PASSWORD)
    url = _reader(agent_db, OLD_PASSWORD).replace(f":{agent_db.server.port}/", f":{free_port()}/")
    code, line, _ = _database_line(_daemon(tmp_path, agent_db, url, secret, receiver.endpoint))
    assert code == 1 and "unreachable" in line and "denied" not in line, line
