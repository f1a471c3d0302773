from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass

import pytest
from servers import Collector, Jaeger, MariaDB, Receiver, Rotel, ServerGate

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


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Jaeger v2 behind the OpenTelemetry Collector with the repository's configs, and a receiver in
    Tempo's place: (jaeger, collector, tempo)."""
    base = tmp_path_factory.mktemp("stack")
    tempo = Receiver()
    tempo.start()
    jaeger = Jaeger(base)
    jaeger.start()
    collector = Collector(base, f"127.0.0.1:{jaeger.otlp_port}", tempo.endpoint)
    collector.start()
    yield jaeger, collector, tempo
    collector.stop()
    jaeger.stop()
    tempo.stop()
