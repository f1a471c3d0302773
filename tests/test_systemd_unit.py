"""The systemd unit in deploy/systemd: systemd-analyze verifies it without a complaint, it stops
the daemon the way the daemon saves its checkpoint, and it keeps the hardening it documents."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from servers import systemd_analyze

from run_otel.config import PollConfig

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "deploy" / "systemd" / "run-otel.service"


def settings() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        match = re.match(r"^([A-Za-z]+)=(.*)$", line)
        if match:
            found.setdefault(match.group(1), []).append(match.group(2))
    return found


def _verify(unit_text: str, tmp_path: Path) -> subprocess.CompletedProcess:
    # verify wants ExecStart to exist: the run-otel of this test run stands in for /usr/local/bin's.
    run_otel = shutil.which("run-otel") or str(Path(__import__("sys").executable).parent / "run-otel")
    assert Path(run_otel).exists()
    unit = tmp_path / "run-otel.service"
    unit.write_text(unit_text.replace("/usr/local/bin/run-otel", run_otel))
    return subprocess.run([systemd_analyze(), "verify", str(unit)], capture_output=True, text=True, cwd=tmp_path)


@pytest.mark.server
def test_systemd_analyze_verifies_the_unit_without_a_word(tmp_path):
    done = _verify(UNIT.read_text(), tmp_path)
    # verify exits 0 on a directive it ignores, and says so: any line about the unit is a finding.
    assert done.returncode == 0 and "run-otel.service" not in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.mark.server
def test_verify_would_catch_a_bad_directive(tmp_path):
    """The harness itself: a misspelt value, which systemd ignores with a warning, fails the check above."""
    done = _verify(UNIT.read_text().replace("ProtectSystem=strict", "ProtectSystem=strictest"), tmp_path)
    assert "run-otel.service" in done.stdout + done.stderr


def test_it_stops_with_sigterm_and_waits_for_the_checkpoint():
    unit = settings()
    assert unit["KillSignal"] == ["SIGTERM"]
    assert float(unit["TimeoutStopSec"][0]) > PollConfig().shutdown_timeout_seconds
    assert unit["ExecStart"] == ["/usr/local/bin/run-otel run --config /etc/run-otel/run-otel.toml"]
    assert unit["Restart"] == ["on-failure"]


def test_it_runs_unprivileged_with_a_state_directory_and_a_read_only_system():
    unit = settings()
    for key, value in {
        "DynamicUser": "yes",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
        "StateDirectory": "run-otel",
        "WorkingDirectory": "/var/lib/run-otel",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
    }.items():
        assert unit.get(key) == [value], key
