"""The bridge's own gauges exist from the first poll attempt: a first deploy that never
succeeds, or a source with no runs yet, shows numbers instead of "No data"."""

from __future__ import annotations

import pytest
from conftest import utc_now_naive
from servers import free_port
from sqlalchemy import text
from sqlalchemy.engine import make_url

from run_otel.config import build_config
from run_otel.demo import generate, insert_workload
from run_otel.export import JsonFileSink
from run_otel.metrics import build_metrics
from run_otel.source import make_engine
from run_otel.wiring import build_poller


def _config(tmp_path, endpoint: str = ""):
    return build_config(
        {
            "source": {"url": f"sqlite:///{tmp_path / 'agent.db'}"},
            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "poll": {"start_from": "beginning", "settle_seconds": 0, "run_timeout_seconds": 0},
            "export": {"endpoint": endpoint or f"127.0.0.1:{free_port()}", "max_attempts": 1, "timeout_seconds": 1},
            "metrics": {"enabled": True, "port": free_port()},
        }
    )


def _gauge(metrics, name: str) -> float:
    (value,) = [s.value for f in metrics.registry.collect() for s in f.samples if s.name == name]
    return value


def test_no_runs_yet_is_a_backlog_and_lag_of_zero(tmp_path):
    config = _config(tmp_path)
    insert_workload(make_engine(make_url(config.source.url)), generate(1, 0, anchor=utc_now_naive()), create=True)
    metrics = build_metrics(config)
    build_poller(config, recorder=metrics, sink=JsonFileSink(tmp_path / "out.jsonl")).poll()
    assert _gauge(metrics, "run_otel_backlog_runs") == 0
    assert _gauge(metrics, "run_otel_lag_seconds") == 0
    metrics.shutdown()


def test_a_restart_whose_polls_fail_shows_the_checkpoints_pending_runs(tmp_path):
    config = _config(tmp_path)
    engine = make_engine(make_url(config.source.url))
    workload = generate(7, 60, anchor=utc_now_naive())
    insert_workload(engine, workload, create=True)
    with engine.begin() as conn:
        conn.execute(text("UPDATE diagnosis_run SET status = 'RUNNING' WHERE id > (SELECT MAX(id) - 3 FROM diagnosis_run)"))
        waiting = conn.execute(text("SELECT COUNT(*) FROM diagnosis_run WHERE status IS NULL OR status IN ('PENDING', 'RUNNING')")).scalar()
    assert waiting >= 3

    first = build_metrics(config)
    build_poller(config, recorder=first, sink=JsonFileSink(tmp_path / "out.jsonl")).poll()
    assert _gauge(first, "run_otel_pending_runs") == waiting
    first.shutdown()

    # One pending run finishes while the restarted bridge's endpoint is wrong: its polls fail.
    with engine.begin() as conn:
        conn.execute(text("UPDATE diagnosis_run SET status = 'SUCCESS' WHERE id = (SELECT MAX(id) FROM diagnosis_run WHERE status = 'RUNNING')"))
    restarted = build_metrics(config)
    with pytest.raises(Exception):  # noqa: B017 - whichever export error, the poll must fail
        build_poller(config, recorder=restarted).poll()
    assert not restarted.last_poll_ok
    assert _gauge(restarted, "run_otel_pending_runs") == waiting
    restarted.shutdown()
