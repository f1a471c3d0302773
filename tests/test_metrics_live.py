"""Metrics proven end to end: MariaDB -> run-otel run -> a real Prometheus 2.42 -> PromQL."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from conftest import bridge_sections, utc_now_naive, write_config
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from prometheus_client import CollectorRegistry
from servers import MariaDB, Prometheus, free_port, wait_for
from sqlalchemy.engine import make_url

from run_otel.checkpoint import CheckpointStore
from run_otel.config import build_config
from run_otel.demo import generate, insert_workload
from run_otel.export import JsonFileSink
from run_otel.metrics import BridgeMetrics
from run_otel.source import make_engine
from run_otel.wiring import build_poller

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))


def start_daemon(config: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "run_otel.cli", "run", "--config", str(config)], stderr=subprocess.PIPE, text=True
    )


def stop_daemon(daemon: subprocess.Popen) -> str:
    daemon.send_signal(signal.SIGTERM)
    _out, err = daemon.communicate(timeout=60)
    assert daemon.returncode == 0, err
    return err


def http_status(url: str) -> int:
    try:
        return requests.get(url, timeout=2).status_code
    except requests.RequestException:
        return 0


def panel_targets(dashboard: dict):
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                yield inner["title"], target


def filled(expr: str, rate_interval: str = "1m") -> str:
    return expr.replace("$__rate_interval", rate_interval).replace("$__range", "10m").replace("$intent", ".*")


def scalar(result: list) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


def test_prometheus_reads_what_was_seeded(agent_db, otlp, tmp_path):
    port = free_port()
    sections = bridge_sections(agent_db, tmp_path, otlp.endpoint("grpc"), metrics={"enabled": True, "port": port})
    daemon = start_daemon(write_config(tmp_path / "run-otel.toml", sections))
    prometheus = Prometheus(tmp_path, f"127.0.0.1:{port}", ROOT / "config/prometheus/alerts.yml", ROOT / "config/prometheus/prometheus.yml")
    try:
        wait_for(lambda: http_status(f"http://127.0.0.1:{port}/readyz") == 200, 30, "run-otel ready")
        prometheus.start()
        wait_for(lambda: prometheus.query('up{job="run-otel"} == 1'), 60, "the first scrape")
        time.sleep(3)  # a few scrapes of the zeroed counters, so rate() sees the jump
        workload = generate(11, 400, anchor=utc_now_naive())
        insert_workload(agent_db.engine(), workload)
        terminal = workload.terminal_runs()
        wait_for(
            lambda: (r := prometheus.query("sum(diagnosis_runs_total)")) and scalar(r) == len(terminal),
            60,
            "every run counted in Prometheus",
            0.5,
        )
        time.sleep(4)

        by_outcome = {
            r["metric"]["release_outcome"]: float(r["value"][1])
            for r in prometheus.query("sum by (release_outcome) (diagnosis_runs_total)")
            if float(r["value"][1]) > 0
        }
        assert by_outcome == dict(Counter(run["release_outcome"] for run in terminal))

        empty, queried = [], 0
        for path in DASHBOARDS:
            for title, target in panel_targets(json.loads(path.read_text())):
                queried += 1
                if not prometheus.query(filled(target["expr"])):
                    empty.append(f"{path.name}: {title}: {target['expr']}")
        assert len(DASHBOARDS) == 3 and queried >= 25
        assert not empty, "panels without data:\n" + "\n".join(empty)

        runs_board = json.loads((ROOT / "dashboards/diagnosis-runs.json").read_text())
        fallback = next(t for title, t in panel_targets(runs_board) if t.get("legendFormat") == "fallback")
        share = scalar(prometheus.query(filled(fallback["expr"], "2m")))
        seeded = sum(run["status"] == "FALLBACK" for run in terminal) / len(terminal)
        assert share == pytest.approx(seeded, rel=1e-6)
    finally:
        prometheus.stop()
        stop_daemon(daemon)


def test_readyz_follows_the_database(tmp_path, otlp):
    server = MariaDB(tmp_path / "db")
    server.install()
    server.start()
    try:
        db = SimpleNamespace(url=server.create_database("agent"))
        port = free_port()
        sections = bridge_sections(
            db, tmp_path, otlp.endpoint("grpc"),
            metrics={"enabled": True, "port": port},
            poll={"interval_seconds": 1, "retry_initial_seconds": 0.5, "retry_max_seconds": 1},
        )
        daemon = start_daemon(write_config(tmp_path / "run-otel.toml", sections))
        ready = f"http://127.0.0.1:{port}/readyz"
        try:
            wait_for(lambda: http_status(ready) == 200, 30, "ready")
            assert http_status(f"http://127.0.0.1:{port}/healthz") == 200
            server.stop()
            went_away = time.monotonic()
            wait_for(lambda: http_status(ready) == 503, 10, "not ready")
            assert time.monotonic() - went_away <= 3 * 1 + 1  # within three poll intervals
            assert http_status(f"http://127.0.0.1:{port}/healthz") == 200  # alive all along
            server.start()
            wait_for(lambda: http_status(ready) == 200, 30, "ready again")
        finally:
            err = stop_daemon(daemon)
        assert MariaDB.ROOT_PASSWORD not in err
    finally:
        server.stop()


class _CrashingStore(CheckpointStore):
    """A state store whose save dies, as the process would between ack and checkpoint."""

    def save(self, checkpoint, now):
        raise KeyboardInterrupt("killed before the checkpoint was saved")


def _counted(registry: CollectorRegistry) -> float:
    return sum(
        sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == "diagnosis_runs_total"
    )


def test_a_replay_after_a_crash_counts_each_run_once(tmp_path):
    db = tmp_path / "agent.db"
    config = build_config(
        {
            "source": {"url": f"sqlite:///{db}"},
            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "poll": {"start_from": "beginning", "settle_seconds": 0, "run_timeout_seconds": 0},
        }
    )
    workload = generate(5, 120, anchor=utc_now_naive())
    insert_workload(make_engine(make_url(config.source.url)), workload, create=True)

    def process(store_class):
        registry = CollectorRegistry()
        metrics = BridgeMetrics(config, [PrometheusMetricReader(registry=registry)], registry)
        sink = JsonFileSink(tmp_path / "out.jsonl")
        poller = build_poller(config, recorder=metrics, sink=sink, store=store_class(config))
        try:
            poller.poll()
        except KeyboardInterrupt:
            pass
        sink.close()
        return _counted(registry)

    first = process(_CrashingStore)  # acknowledged, then died before the checkpoint
    second = process(CheckpointStore)  # the restart replays the batch
    third = process(CheckpointStore)  # nothing new
    sent = sum(1 for line in (tmp_path / "out.jsonl").read_text().splitlines())
    assert sent >= 2  # the batch really went out twice
    assert first + second + third == len(workload.terminal_runs())
