from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from servers import MariaDB, Receiver, Rotel, ServerGate
from sqlalchemy import text

from run_otel.config import Config, build_config
from run_otel.source.engine import make_engine

_counter = itertools.count()

# The drivers the suite runs on MariaDB: PyMySQL, and mysql-connector-python's C extension.
DRIVERS = ("pymysql", "mysqlconnector")


# The fixtures that start a server: a test that uses one is marked ``server`` here, so the fast
# loop (pytest -m "not server") leaves it out. A test that starts one itself carries the mark.
SERVER_FIXTURES = frozenset({"mariadb", "agent_db", "private_mariadb", "otlp", "stack"})


def pytest_sessionstart(session):
    """Under the compiled build's own test run, the compiled modules must be what is tested."""
    if os.environ.get("RUN_OTEL_EXPECT_COMPILED") == "1":
        from run_otel.export import encoding
        from run_otel.mapping import spans

        for module in (encoding, spans):
            assert module.__file__ and module.__file__.endswith(".so"), f"{module.__name__} is not compiled: {module.__file__}"


def pytest_collection_modifyitems(items):
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.server)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    ServerGate.open = item.get_closest_marker("server") is not None


@pytest.fixture
def restore_logging():
    """For tests that call configure_logging: the root logger's handlers come back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory):
    server = MariaDB(tmp_path_factory.mktemp("mariadb"))
    server.install()
    server.start()
    yield server
    server.stop()


@dataclass
class AgentDb:
    """One fresh database with the agent's schema on the shared server."""

    server: MariaDB
    name: str
    url: str

    def engine(self):
        from sqlalchemy.engine import make_url

        return make_engine(make_url(self.url))

    def execute(self, sql: str, *params):
        conn = self.server.root(self.name)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params or None)
                return cur.fetchall()
        finally:
            conn.close()


@pytest.fixture
def agent_db(mariadb) -> AgentDb:
    name = f"agent_{os.getpid()}_{next(_counter)}"
    url = mariadb.create_database(name)
    yield AgentDb(mariadb, name, url)
    conn = mariadb.root()
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    conn.close()


@pytest.fixture
def private_mariadb(tmp_path):
    """A MariaDB server of the test's own, for tests that stop and restart it."""
    server = MariaDB(tmp_path / "private-mariadb")
    server.install()
    server.start()
    yield server
    server.stop()


@dataclass
class Otlp:
    receiver: Receiver
    rotel: Rotel

    def endpoint(self, protocol: str) -> str:
        return self.rotel.endpoint(protocol)


@pytest.fixture
def otlp(tmp_path) -> Otlp:
    receiver = Receiver()
    receiver.start()
    rotel = Rotel(tmp_path, receiver.endpoint)
    rotel.start()
    yield Otlp(receiver, rotel)
    rotel.stop()
    receiver.stop()


@pytest.fixture
def receiver():
    """The in-process OTLP/gRPC receiver alone, for tests that need no collector in between."""
    server = Receiver()
    server.start()
    yield server
    server.stop()


def utc_now_naive() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None, microsecond=0)


def write_config(path: Path, sections: dict) -> Path:
    """Writes ``sections`` as a TOML file (flat tables of scalars and lists)."""
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            lines.append(f"{key} = {_toml(value)}")
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    tomllib.loads(path.read_text())  # the file must be valid TOML
    return path


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f'"{k}" = {_toml(v)}' for k, v in value.items()) + "}"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def bridge_sections(agent_db: AgentDb, tmp_path: Path, endpoint: str, protocol: str = "grpc", **overrides) -> dict:
    sections = {
        "source": {"url": agent_db.url},
        "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
        "poll": {"start_from": "beginning", "settle_seconds": 0, "interval_seconds": 0.5},
        "export": {"protocol": protocol, "endpoint": endpoint, "timeout_seconds": 5},
        "metrics": {"enabled": False},
    }
    for section, values in overrides.items():
        sections.setdefault(section, {}).update(values)
    return sections


def bridge_config(*args, **kwargs) -> Config:
    return build_config(bridge_sections(*args, **kwargs))


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "run_otel", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def set_old(agent_db: AgentDb, seconds: int = 30) -> None:
    """Moves every row into the past so it is settled."""
    agent_db.execute(
        "UPDATE diagnosis_run SET created_at = created_at - INTERVAL %s SECOND, updated_at = updated_at - INTERVAL %s SECOND",
        seconds,
        seconds,
    )


def table_rows(agent_db: AgentDb, sql: str) -> list[dict]:
    with agent_db.engine().connect() as conn:
        return [dict(row._mapping) for row in conn.execute(text(sql))]


class DaemonProcess:
    """`run-otel run` in a subprocess, with its stderr kept in a file."""

    def __init__(self, config: Path, log: Path, *args: str):
        self.log = log
        self._fh = log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "run_otel", "run", "--config", str(config), *args], stdout=self._fh, stderr=self._fh
        )

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()

    def terminate(self, timeout: float = 60) -> int:
        self.process.terminate()
        return self.process.wait(timeout)

    def alive(self) -> bool:
        return self.process.poll() is None

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def output(self) -> str:
        return self.log.read_text(errors="replace")


TERMINAL_SQL = "SELECT run_id FROM diagnosis_run WHERE status IN ('SUCCESS','FALLBACK','FAILED','CANCELLED')"


def terminal_trace_ids(agent_db: AgentDb) -> set[str]:
    """The trace ids every finished run in the database must arrive under (its run-<uuid>)."""
    return {r["run_id"][4:].replace("-", "") for r in table_rows(agent_db, TERMINAL_SQL)}


def received_roots(receiver) -> set[str]:
    """The trace ids of the root spans the receiver has seen."""
    return {span.trace_id.hex() for _r, _s, span in receiver.spans() if not span.parent_span_id}
