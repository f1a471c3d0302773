"""The state store and the source session on real MariaDB: times kept as doubles, a
checkpoint from a newer release, a forward rewind, polls that outlast the interval,
and a statement timeout that really ends statements."""

from __future__ import annotations

import re
import time

import pytest
from helpers import DaemonProcess, add_finished_runs, bridge_sections, run_cli, write_config
from sqlalchemy import text

from run_otel.config import build_config
from run_otel.factory import build_source
from run_otel.source.reader import SourceError


def config_file(agent_db, tmp_path, otlp, **overrides) -> str:
    return str(write_config(tmp_path / "c.toml", bridge_sections(agent_db, tmp_path, otlp.endpoint("grpc"), **overrides)))


def test_a_mariadb_state_store_keeps_saved_at_to_the_second_even_in_an_old_float_table(agent_db, otlp, tmp_path):
    # The table as earlier releases created it: saved_at a single-precision FLOAT.
    agent_db.execute(
        "CREATE TABLE run_otel_checkpoint (name VARCHAR(64) PRIMARY KEY, format_version INT NOT NULL, "
        "high_water BIGINT NOT NULL, pending TEXT NOT NULL, gaps TEXT NOT NULL, saved_at FLOAT NOT NULL)"
    )
    add_finished_runs(agent_db, 3)
    config = config_file(agent_db, tmp_path, otlp, state={"url": agent_db.url})
    before = time.time()
    done = run_cli("once", "--config", config)
    assert done.returncode == 0, done.stderr
    ((kind,),) = agent_db.execute(
        "SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
        "AND TABLE_NAME = 'run_otel_checkpoint' AND COLUMN_NAME = 'saved_at'"
    )
    assert kind == "double"
    ((saved_at,),) = agent_db.execute("SELECT saved_at FROM run_otel_checkpoint")
    assert before <= saved_at <= time.time(), (before, saved_at)
    status = run_cli("status", "--config", config)
    ago = int(re.search(r"\((-?\d+)s ago\)", status.stdout).group(1))
    assert 0 <= ago <= 30, status.stdout


def test_a_checkpoint_from_a_newer_release_is_named_as_such(agent_db, otlp, tmp_path):
    add_finished_runs(agent_db, 2)
    config = config_file(agent_db, tmp_path, otlp)
    assert run_cli("once", "--config", config).returncode == 0
    import sqlite3

    with sqlite3.connect(tmp_path / "state.db") as db:
        db.execute("UPDATE run_otel_checkpoint SET format_version = 2")
    done = run_cli("once", "--config", config)
    assert done.returncode == 1
    assert "written by a newer run-otel (format version 2" in done.stderr and "damaged" not in done.stderr, done.stderr


def test_a_forward_rewind_says_what_it_skips(agent_db, otlp, tmp_path):
    add_finished_runs(agent_db, 3)
    config = config_file(agent_db, tmp_path, otlp)
    assert run_cli("once", "--config", config).returncode == 0
    add_finished_runs(agent_db, 5)  # ids 4..8, not polled yet
    past = run_cli("rewind", "--config", config, "--to-id", "10", "--yes")
    assert past.returncode != 0 and "run id 10 is past the newest run id 8" in past.stderr, past.stderr
    forward = run_cli("rewind", "--config", config, "--to-id", "8", "--yes")
    assert forward.returncode == 0, forward.stderr
    assert "moved default forward" in forward.stdout and "Run ids 4..7 are skipped" in forward.stdout
    assert "arrive again" not in forward.stdout
    back = run_cli("rewind", "--config", config, "--to-id", "2", "--yes")
    assert "rewound default" in back.stdout and "arrive again" in back.stdout


@pytest.fixture
def locked(agent_db):
    add_finished_runs(agent_db, 1)
    conn = agent_db.server.root(agent_db.name)
    with conn.cursor() as cur:
        cur.execute("LOCK TABLES diagnosis_run WRITE")
    yield conn
    conn.close()


def test_a_poll_that_outlasts_the_interval_logs_no_scheduler_noise(agent_db, otlp, tmp_path, locked):
    config = config_file(
        agent_db,
        tmp_path,
        otlp,
        source={"statement_timeout_seconds": 3},
        poll={"interval_seconds": 0.2, "retry_initial_seconds": 0.2, "retry_max_seconds": 0.5},
    )
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    try:
        time.sleep(8)
    finally:
        assert daemon.terminate() == 0
    output = daemon.output()
    assert output.count("poll failed") >= 1 and "statement_timeout_seconds (3s" in output  # polls did outlast it
    assert "maximum number of running instances" not in output, output


# -- the statement timeout, without a lock to end the wait first ---------------------------


def test_a_source_session_carries_the_statement_timeout(agent_db, otlp, tmp_path):
    source = build_source(
        build_config(bridge_sections(agent_db, tmp_path, otlp.endpoint("grpc"), source={"statement_timeout_seconds": 2.5}))
    )
    with source.engine.connect() as conn:
        assert conn.execute(text("SELECT @@SESSION.max_statement_time")).scalar() == 2.5
        assert conn.execute(text("SELECT @@SESSION.lock_wait_timeout")).scalar() == 2


def test_a_long_statement_without_a_lock_is_cut_off(agent_db, otlp, tmp_path):
    source = build_source(
        build_config(bridge_sections(agent_db, tmp_path, otlp.endpoint("grpc"), source={"statement_timeout_seconds": 1}))
    )
    started = time.monotonic()
    with pytest.raises(SourceError, match=r"statement_timeout_seconds \(1s; max_statement_time\)"):
        # No lock taken, and shorter than the socket's read-timeout backstop: only the statement timeout ends it.
        source._fetch(text("SELECT SLEEP(8)"))
    assert time.monotonic() - started < 4
