"""The systemd unit in deploy/systemd: systemd-analyze verifies it after the install the README
leads with, its dynamic user reads the password as the unit's credential where it cannot read
root's file, `systemctl reload` sends the SIGHUP the docs rely on, it stops the daemon the way the
daemon saves its checkpoint, and it keeps the hardening it documents."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest
from helpers import DaemonProcess, bridge_sections, write_config
from servers import systemd_analyze, wait_for
from test_install import fresh_copy

from run_otel.config import PollConfig

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "deploy" / "systemd" / "run-otel.service"
NOBODY = 65534  # an unprivileged uid, as DynamicUser= gives the service one


def settings() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        match = re.match(r"^([A-Za-z]+)=(.*)$", line)
        if match:
            found.setdefault(match.group(1), []).append(match.group(2))
    return found


def program() -> str:
    return shlex.split(settings()["ExecStart"][0])[0]


def readme_install() -> list[str]:
    """The commands the README's own-database section leads with, up to the config it writes."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Run it against your own database") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the README's own-database section has no shell block"
    lines = block.group(1).splitlines()
    ends = [i for i, line in enumerate(lines) if "run-otel config --example" in line]
    assert ends, "the README's shell block no longer writes the config"
    return [line for line in lines[: ends[0]] if line.strip() and not line.startswith("#")]


def _verify(unit_text: str, tmp_path: Path) -> subprocess.CompletedProcess:
    unit = tmp_path / "run-otel.service"
    unit.write_text(unit_text)
    return subprocess.run([systemd_analyze(), "verify", str(unit)], capture_output=True, text=True, cwd=tmp_path)


def _with_this_run_otel(unit_text: str) -> str:
    # For the directives alone: the run-otel of this test run stands in for the installed one.
    run_otel = shutil.which("run-otel") or str(Path(sys.executable).parent / "run-otel")
    assert Path(run_otel).exists()
    return unit_text.replace(program(), run_otel)


@pytest.mark.server
def test_systemd_analyze_verifies_the_unit_without_a_word(tmp_path):
    done = _verify(_with_this_run_otel(UNIT.read_text()), tmp_path)
    # verify exits 0 on a directive it ignores, and says so: any line about the unit is a finding.
    assert done.returncode == 0 and "run-otel.service" not in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.mark.server
def test_verify_would_catch_a_bad_directive(tmp_path):
    """The harness itself: a misspelt value, which systemd ignores with a warning, fails the check above."""
    done = _verify(_with_this_run_otel(UNIT.read_text().replace("ProtectSystem=strict", "ProtectSystem=strictest")), tmp_path)
    assert "run-otel.service" in done.stdout + done.stderr


def test_the_unit_runs_run_otel_from_where_the_readme_and_the_deployment_guide_install_it():
    install = readme_install()
    venvs = [m.group(1) for line in install if (m := re.search(r"python3 -m venv (\S+)", line))]
    assert venvs, f"the README's install makes no virtualenv: {install}"
    assert any(f"{venvs[0]}/bin/pip install ." in line for line in install), install
    assert program() == f"{venvs[0]}/bin/run-otel"
    guide = (ROOT / "docs" / "deployment.md").read_text()
    assert f"`{venvs[0]}`" in guide.split("### systemd")[0]  # the first deploy names the same install
    assert f"`{program()} run --config /etc/run-otel/run-otel.toml`" in guide.split("### systemd")[1]


def relocated(text: str, root: Path) -> str:
    """Absolute paths of the system moved under ``root``, as on a machine of the test's own."""
    return re.sub(r"(?<![\w./-])/(?=(?:opt|usr|etc|var)/)", f"{root}/", text)


@pytest.mark.slow
@pytest.mark.server
def test_systemd_analyze_verifies_the_unit_after_the_readmes_install(tmp_path):
    """The README's install as a newcomer types it, run under a root of the test's own: the unit
    finds run-otel where that install put it, and verify has nothing to say."""
    root = tmp_path / "root"
    (root / "usr" / "local" / "bin").mkdir(parents=True)
    checkout = fresh_copy(tmp_path / "run-otel")
    script = "\n".join(relocated(line.removeprefix("sudo "), root) for line in readme_install())
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH") and not k.startswith("RUN_OTEL_")}
    env["RUN_OTEL_PURE_PYTHON"] = "1"  # where the files go is the same; compiling the core only takes longer
    done = subprocess.run(["bash", "-euc", script], cwd=checkout, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    installed = Path(relocated(program(), root))
    assert subprocess.run([str(installed), "--help"], capture_output=True, timeout=60).returncode == 0
    verified = _verify(relocated(UNIT.read_text(), root), tmp_path)
    assert verified.returncode == 0 and "run-otel.service" not in verified.stdout + verified.stderr, (
        verified.stdout + verified.stderr
    )


def test_the_password_is_a_credential_and_reload_sends_sighup():
    unit = settings()
    assert unit["DynamicUser"] == ["yes"]
    (credential,) = unit["LoadCredential"]
    name, source = credential.split(":", 1)
    assert source == "/etc/run-otel/db-password"
    assert f"RUN_OTEL_SOURCE__PASSWORD_FILE=%d/{name}" in unit["Environment"]
    assert unit["ExecReload"] == ["/bin/kill -HUP $MAINPID"]


# -- as the service's unprivileged user --------------------------------------------------------------


def _python_for(uid: int) -> str:
    """An interpreter ``uid`` can run: this one, or the system's of the same version (this one may
    live in a home directory only root can enter)."""
    for candidate in (sys.executable, f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"):
        ran = subprocess.run(
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", candidate, "-c", "pass"],
            capture_output=True,
            cwd="/",
        )
        if ran.returncode == 0:
            return candidate
    raise AssertionError(f"no Python {sys.version_info[:2]} that uid {uid} can run")


# The site-packages of this test run: run-otel and its dependencies, for the other interpreter too.
_BOOT = (
    "import runpy, site, sys; site.addsitedir(sys.argv.pop(1)); runpy.run_module('run_otel', run_name='__main__', alter_sys=True)"
)


def as_service_user(work: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    command += [_python_for(NOBODY), "-c", _BOOT, sysconfig.get_paths()["purelib"], *args]
    environment = {"PATH": "/usr/bin:/bin", "HOME": str(work), "LANG": "C.UTF-8", **(env or {})}
    return subprocess.run(command, capture_output=True, text=True, cwd=work, env=environment, timeout=120)


def unit_environment(credentials: Path) -> dict[str, str]:
    """The unit's Environment= lines, with %d as systemd expands it: the credentials directory."""
    pairs = [line.split("=", 1) for line in settings().get("Environment", [])]
    return {key: value.replace("%d", str(credentials)) for key, value in pairs}


def lay_credential(secret: Path, credentials: Path, name: str) -> None:
    """What LoadCredential= does at start: a copy of the file, in a directory of the service's user alone."""
    credentials.mkdir()
    shutil.copyfile(secret, credentials / name)
    for path, mode in ((credentials / name, 0o400), (credentials, 0o500)):
        os.chown(path, NOBODY, NOBODY)
        path.chmod(mode)


@pytest.mark.server
def test_the_dynamic_user_reads_the_password_as_the_units_credential_and_not_roots_file(agent_db, tmp_path):
    assert os.geteuid() == 0  # the precondition: root owns the password file, as the docs lay it out
    user, password = f"u{agent_db.name[-12:]}", "unit-credential-Qv83"
    agent_db.execute(f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{password}'")
    agent_db.execute(f"GRANT SELECT ON `{agent_db.name}`.* TO '{user}'@'127.0.0.1'")
    # pytest's tmp_path is root's alone (0700): the service's user needs a directory it can enter.
    work = Path(tempfile.mkdtemp(prefix="run-otel-unit-"))
    try:
        work.chmod(0o755)
        secret = work / "db-password"  # /etc/run-otel/db-password: root's, 0400, as the README writes it
        secret.write_text(password + "\n")
        secret.chmod(0o400)
        sections = bridge_sections(
            agent_db, work, "http://127.0.0.1:4317", source={"url": agent_db.server.url(agent_db.name, user, "placeholder")}
        )
        sections["source"]["password_file"] = str(secret)
        config = write_config(work / "run-otel.toml", sections)
        config.chmod(0o644)
        started = as_service_user(work, "--version")
        assert started.returncode == 0, started.stderr  # the precondition: that user can run run-otel at all

        direct = as_service_user(work, "check", "--config", str(config))
        assert f"config: source.password_file: Permission denied: {secret}" in direct.stderr, direct.stdout + direct.stderr

        name = settings()["LoadCredential"][0].split(":", 1)[0]
        lay_credential(secret, work / "credentials", name)
        env = {**unit_environment(work / "credentials"), "CREDENTIALS_DIRECTORY": str(work / "credentials")}
        checked = as_service_user(work, "check", "--config", str(config), env=env)
        database = [line for line in checked.stdout.splitlines() if " database: " in line]
        assert database and database[0].startswith("✔") and database[0].endswith("reachable"), checked.stdout + checked.stderr
        assert "Permission denied" not in checked.stdout + checked.stderr
        assert password not in checked.stdout + checked.stderr
    finally:
        shutil.rmtree(work)


@pytest.mark.server
def test_systemctl_reload_sends_the_sighup_the_daemon_reloads_on(agent_db, receiver, tmp_path):
    config = write_config(tmp_path / "run-otel.toml", bridge_sections(agent_db, tmp_path, receiver.endpoint))
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    try:
        wait_for(lambda: "starting" in daemon.output(), 30, "the start line")
        # As systemd runs ExecReload=: split as a command line, $MAINPID put in, no shell.
        reload = [arg.replace("$MAINPID", str(daemon.process.pid)) for arg in shlex.split(settings()["ExecReload"][0])]
        assert subprocess.run(reload, capture_output=True, timeout=10).returncode == 0
        wait_for(lambda: "SIGHUP:" in daemon.output(), 15, "the reload line")
        assert daemon.alive()
    finally:
        assert daemon.terminate() == 0


def test_it_stops_with_sigterm_and_waits_for_the_checkpoint():
    unit = settings()
    assert unit["KillSignal"] == ["SIGTERM"]
    assert float(unit["TimeoutStopSec"][0]) > PollConfig().shutdown_timeout_seconds
    assert unit["ExecStart"] == ["/opt/run-otel/bin/run-otel run --config /etc/run-otel/run-otel.toml"]
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
