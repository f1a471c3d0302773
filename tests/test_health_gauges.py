"""The bridge's own gauges exist from the first poll attempt: a first deploy that never
succeeds, or a source with no runs yet, shows numbers instead of "No data"."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from helpers import (
    NOT_YET,
    bridge_sections,
    filled,
    http_status,
    panels,
    scalar,
    start_daemon,
    table_rows,
    utc_now_naive,
    write_config,
)
from servers import Prometheus, free_port, wait_for
from sqlalchemy import text
from sqlalchemy.engine import make_url

from run_otel.config import build_config
from run_otel.export.sinks import JsonFileSink
from run_otel.factory import build_metrics, build_parts, build_poller
from run_otel.ops.demo import generate, insert_workload
from run_otel.source.engine import make_engine
from run_otel.telemetry import instruments as I

ROOT = Path(__file__).resolve().parent.parent


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
    build_poller(build_parts(config, recorder=metrics, sink=JsonFileSink(tmp_path / "out.jsonl"))).poll()
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
        waiting = conn.execute(
            text("SELECT COUNT(*) FROM diagnosis_run WHERE status IS NULL OR status IN ('PENDING', 'RUNNING')")
        ).scalar()
    assert waiting >= 3

    first = build_metrics(config)
    build_poller(build_parts(config, recorder=first, sink=JsonFileSink(tmp_path / "out.jsonl"))).poll()
    assert _gauge(first, "run_otel_pending_runs") == waiting
    first.shutdown()

    # One pending run finishes while the restarted bridge's endpoint is wrong: its polls fail.
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE diagnosis_run SET status = 'SUCCESS' WHERE id = "
                "(SELECT MAX(id) FROM diagnosis_run WHERE status = 'RUNNING')"
            )
        )
    restarted = build_metrics(config)
    with pytest.raises(Exception):  # noqa: B017 - whichever export error, the poll must fail
        build_poller(build_parts(config, recorder=restarted)).poll()
    assert not restarted.last_poll_ok
    assert _gauge(restarted, "run_otel_pending_runs") == waiting
    restarted.shutdown()


def test_a_bridge_that_never_succeeded_shows_a_value_on_every_health_panel(agent_db, tmp_path):
    """A first deploy with a wrong OTLP endpoint: the database is fine, no poll ever succeeds."""
    port = free_port()
    insert_workload(agent_db.engine(), generate(13, 40, anchor=utc_now_naive()))
    runs = int(table_rows(agent_db, "SELECT COUNT(*) AS n FROM diagnosis_run")[0]["n"])
    sections = bridge_sections(
        agent_db,
        tmp_path,
        f"127.0.0.1:{free_port()}",  # nothing listens there
        metrics={"enabled": True, "port": port},
        export={"timeout_seconds": 1, "max_attempts": 1},
        poll={"retry_initial_seconds": 0.5, "retry_max_seconds": 1},
    )
    daemon = start_daemon(write_config(tmp_path / "run-otel.toml", sections))
    prometheus = Prometheus(
        tmp_path, f"127.0.0.1:{port}", ROOT / "config/prometheus/alerts.yml", ROOT / "config/prometheus/prometheus.yml"
    )
    try:
        wait_for(lambda: http_status(f"http://127.0.0.1:{port}/healthz") == 200, 30, "run-otel alive")
        prometheus.start()
        wait_for(
            lambda: prometheus.query(f'{I.POLL_DURATION.series("_count")}{{outcome="error"}} >= 2'),
            60,
            "two failed polls scraped",
        )
        time.sleep(3)  # a few scrapes after them, so rate() has two points
        assert http_status(f"http://127.0.0.1:{port}/readyz") == 503
        assert not prometheus.query(I.LAST_SUCCESS.prometheus), "a poll succeeded: the test means nothing"
        assert scalar(prometheus.query(f"sum({I.EXPORT_FAILURES.prometheus})")) >= 1

        board = json.loads((ROOT / "dashboards/exporter-health.json").read_text())
        empty = [
            f"{panel['title']}: {[t['expr'] for t in panel['targets']]}"
            for panel in panels(board)
            if not any(prometheus.query(filled(t["expr"])) for t in panel["targets"])
        ]
        assert len(list(panels(board))) >= 16
        assert not empty, "health panels without a value before the first success:\n" + "\n".join(empty)

        def value(title: str, legend: str | None = None) -> float:
            panel = next(p for p in panels(board) if p["title"] == title)
            target = next(t for t in panel["targets"] if legend is None or t.get("legendFormat") == legend)
            return scalar(prometheus.query(filled(target["expr"])))

        assert value("Backlog") == runs  # from "beginning": every run waits
        assert value("Since last successful poll") >= 3  # counted from the start
        assert value("Export delay (settled to acknowledged)", NOT_YET) >= 3
        assert value("Pending runs") == 0 and value("Checkpoint ahead of the source") == 0
        assert scalar(prometheus.query(I.LAG.prometheus)) > 0  # the oldest run to the newest
    finally:
        prometheus.stop()
        daemon.send_signal(signal.SIGTERM)
        daemon.communicate(timeout=60)
