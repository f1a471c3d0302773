"""A backfill across a database restart, on a MariaDB server of the test's own: it retries
the lost connection and finishes with every run sent, or, past its retry budget, stops
with the --from-id that resumes it; the message says the connection was lost, not that a
statement timed out."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from helpers import received_roots, write_config
from servers import Receiver, wait_for, with_driver

RUNS = 50_000


def start_backfill(private_mariadb, receiver: Receiver, tmp_path, driver: str, retry_seconds: float) -> subprocess.Popen:
    url = private_mariadb.create_database("agent")
    conn = private_mariadb.root("agent")
    with conn.cursor() as cur:
        cur.execute(
            f"""INSERT INTO diagnosis_run (run_id, session_id, query, status, created_at, updated_at)
                SELECT CONCAT('run-restart-', seq), 's', 'q', 'SUCCESS', UTC_TIMESTAMP() - INTERVAL 1 HOUR,
                       UTC_TIMESTAMP() - INTERVAL 1 HOUR FROM seq_1_to_{RUNS}"""
        )
    conn.commit()
    conn.close()
    config = write_config(
        tmp_path / "c.toml",
        {
            "source": {"url": with_driver(url, driver), "connect_timeout_seconds": 2},
            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "poll": {
                "batch_size": 200,
                "backfill_retry_seconds": retry_seconds,
                "retry_initial_seconds": 0.5,
                "retry_max_seconds": 2,
            },
            "export": {"endpoint": receiver.endpoint, "timeout_seconds": 5},
            "metrics": {"enabled": False},
        },
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "run_otel", "backfill", "--from-id", "1", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: len(received_roots(receiver)) >= 2000, 120, "the backfill to be under way")
    return process


@pytest.mark.parametrize("driver", ["pymysql", "mysqlconnector"])
def test_a_backfill_outlives_a_database_restart_and_sends_every_run(private_mariadb, receiver, tmp_path, driver):
    process = start_backfill(private_mariadb, receiver, tmp_path, driver, retry_seconds=120)
    private_mariadb.stop()
    sent_at_stop = len(received_roots(receiver))
    time.sleep(2)
    private_mariadb.start()
    out, err = process.communicate(timeout=300)
    # The precondition: the restart landed mid-backfill, and the backfill saw it.
    assert sent_at_stop < RUNS
    assert "lost the connection" in err and "retrying in" in err, err
    assert process.returncode == 0, err
    assert f"backfilled {RUNS} runs" in out
    assert len(received_roots(receiver)) == RUNS


def test_a_backfill_that_cannot_reconnect_says_where_to_resume(private_mariadb, receiver, tmp_path):
    process = start_backfill(private_mariadb, receiver, tmp_path, "pymysql", retry_seconds=3)
    private_mariadb.stop()
    try:
        out, err = process.communicate(timeout=120)
    finally:
        private_mariadb.start()  # for the fixture's own stop
    assert process.returncode == 1, (out, err)
    last_line = err.strip().splitlines()[-1]
    assert last_line.startswith("run-otel: error: database ") and "lost the connection" in last_line, err
    assert "statement_timeout" not in last_line and "table locked" not in last_line
    assert "gave up after retrying for 3s" in last_line
    stopped_after = int(last_line.split("stopped after run id ")[1].split(":")[0])
    assert 2000 <= stopped_after < RUNS
    assert f"resume with --from-id {stopped_after + 1} --to-id {RUNS}" in last_line
    # Every run up to the id it names was sent, so resuming there skips nothing.
    assert len(received_roots(receiver)) >= stopped_after
