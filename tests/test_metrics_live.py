"""Metrics proven end to end: MariaDB -> run-otel run -> a real Prometheus 2.42 -> PromQL."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from helpers import (
    NOT_YET,
    bridge_metrics,
    bridge_sections,
    filled,
    http_status,
    scalar,
    start_daemon,
    table_rows,
    utc_now_naive,
    write_config,
)
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from prometheus_client import CollectorRegistry
from servers import MariaDB, Prometheus, free_port, wait_for
from sqlalchemy.engine import make_url

from run_otel.config import build_config
from run_otel.export.sinks import JsonFileSink
from run_otel.factory import build_parts, build_poller
from run_otel.ops.demo import generate, insert_workload
from run_otel.pipeline.state_store import StateStore
from run_otel.source.engine import make_engine
from run_otel.telemetry import instruments as I

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))


def stop_daemon(daemon: subprocess.Popen) -> str:
    daemon.send_signal(signal.SIGTERM)
    _out, err = daemon.communicate(timeout=60)
    assert daemon.returncode == 0, err
    return err


def panel_targets(dashboard: dict):
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                yield inner["title"], target


def test_prometheus_reads_what_was_seeded(agent_db, otlp, tmp_path):
    port = free_port()
    # Feedback rechecked every second, so the feedback panels have data within the test.
    sections = bridge_sections(
        agent_db, tmp_path, otlp.endpoint("grpc"), metrics={"enabled": True, "port": port}, feedback={"interval_seconds": 1}
    )
    daemon = start_daemon(write_config(tmp_path / "run-otel.toml", sections))
    prometheus = Prometheus(
        tmp_path, f"127.0.0.1:{port}", ROOT / "config/prometheus/alerts.yml", ROOT / "config/prometheus/prometheus.yml"
    )
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

        rated = Counter(run["feedback"] for run in terminal if run["feedback"])
        wait_for(
            lambda: (r := prometheus.query(f"sum({I.FEEDBACK.prometheus})")) and scalar(r) == sum(rated.values()),
            60,
            "every rating counted in Prometheus",
            0.5,
        )
        time.sleep(2)
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
                result = prometheus.query(filled(target["expr"]))
                # The fallback line is empty once a poll has succeeded; every other query has data.
                if bool(result) == (target.get("legendFormat") == NOT_YET):
                    empty.append(f"{path.name}: {title}: {target['expr']}: {result}")
        assert len(DASHBOARDS) == 3 and queried >= 50
        assert not empty, "panels without data (or a fallback that shows):\n" + "\n".join(empty)

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
            db,
            tmp_path,
            otlp.endpoint("grpc"),
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


class _CrashingStore(StateStore):
    """A state store whose save dies, as the process would between ack and checkpoint."""

    def save(self, checkpoint, now, feedback=None, watched=None):
        raise KeyboardInterrupt("killed before the checkpoint was saved")


def _counted(registry: CollectorRegistry) -> float:
    return sum(
        sample.value for family in registry.collect() for sample in family.samples if sample.name == "diagnosis_runs_total"
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
        metrics = bridge_metrics(config, [PrometheusMetricReader(registry=registry)], registry)
        sink = JsonFileSink(tmp_path / "out.jsonl")
        poller = build_poller(build_parts(config, recorder=metrics, sink=sink, store=store_class(config.state, config.shard)))
        try:
            poller.poll()
        except KeyboardInterrupt:
            pass
        sink.close()
        return _counted(registry)

    first = process(_CrashingStore)  # acknowledged, then died before the checkpoint
    second = process(StateStore)  # the restart replays the batch
    third = process(StateStore)  # nothing new
    sent = sum(1 for line in (tmp_path / "out.jsonl").read_text().splitlines())
    assert sent >= 2  # the batch really went out twice
    assert first + second + third == len(workload.terminal_runs())


def spec_root_span_id(run_id: str) -> str:
    return hashlib.sha256(f"run:{run_id}".encode()).digest()[:8].hex()


def spec_tool_span_id(run_id: str, tool_id: int) -> str:
    return hashlib.sha256(f"tool_invocation:{run_id}:{tool_id}".encode()).digest()[:8].hex()


def exemplar_points(prometheus: Prometheus, expr: str, since: float) -> list[tuple[dict, dict]]:
    """(series labels, exemplar) for every exemplar Prometheus stored for ``expr``."""
    return [(series["seriesLabels"], e) for series in prometheus.exemplars(expr, since) for e in series["exemplars"]]


def test_exemplars_in_prometheus_open_the_run_and_the_tool_behind_each_bucket(agent_db, otlp, tmp_path):
    port = free_port()
    sections = bridge_sections(agent_db, tmp_path, otlp.endpoint("grpc"), metrics={"enabled": True, "port": port})
    daemon = start_daemon(write_config(tmp_path / "run-otel.toml", sections))
    prometheus = Prometheus(
        tmp_path,
        f"127.0.0.1:{port}",
        ROOT / "config/prometheus/alerts.yml",
        ROOT / "config/prometheus/prometheus.yml",
        ("--enable-feature=exemplar-storage",),
    )
    since = time.time() - 5
    try:
        wait_for(lambda: http_status(f"http://127.0.0.1:{port}/readyz") == 200, 30, "run-otel ready")
        # The scraper that asks for OpenMetrics gets exemplars; the text format carries none.
        openmetrics = requests.get(
            f"http://127.0.0.1:{port}/metrics", headers={"Accept": "application/openmetrics-text"}, timeout=5
        )
        assert openmetrics.headers["Content-Type"].startswith("application/openmetrics-text")
        prometheus.start()
        workload = generate(12, 120, anchor=utc_now_naive())
        insert_workload(agent_db.engine(), workload)
        terminal = workload.terminal_runs()
        wait_for(
            lambda: (r := prometheus.query("sum(diagnosis_runs_total)")) and scalar(r) == len(terminal), 60, "runs counted", 0.5
        )
        wait_for(lambda: exemplar_points(prometheus, "diagnosis_tool_duration_seconds_bucket", since), 30, "tool exemplars")
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert "diagnosis_run_duration_seconds_bucket" in text and "trace_id" not in text

        runs = {r["run_id"]: r for r in workload.runs}
        by_trace = {uuid.UUID(run_id.removeprefix("run-")).hex: run for run_id, run in runs.items()}
        run_points = exemplar_points(prometheus, "diagnosis_run_duration_seconds_bucket", since)
        assert len(run_points) >= 5
        for series, exemplar in run_points:
            run = by_trace[exemplar["labels"]["trace_id"]]
            assert exemplar["labels"]["span_id"] == spec_root_span_id(run["run_id"])
            assert float(exemplar["value"]) == run["total_duration_ms"] / 1000
            assert (series["status"], series["intent"]) == (run["status"], run["intent"])
            assert float(exemplar["value"]) <= float(series["le"])

        tools = {
            (t["run_id"], spec_tool_span_id(t["run_id"], t["id"])): t
            for t in table_rows(agent_db, "SELECT * FROM tool_invocation")
        }
        tool_points = exemplar_points(prometheus, "diagnosis_tool_duration_seconds_bucket", since)
        for series, exemplar in tool_points:
            run = by_trace[exemplar["labels"]["trace_id"]]
            tool = tools[(run["run_id"], exemplar["labels"]["span_id"])]
            assert float(exemplar["value"]) == tool["duration_ms"] / 1000
            assert series["tool_name"] == tool["tool_name"]

        failed = exemplar_points(prometheus, 'diagnosis_runs_total{status="FAILED"}', since)
        assert failed and all(by_trace[e["labels"]["trace_id"]]["status"] == "FAILED" for _s, e in failed)
        failed_tools = exemplar_points(prometheus, 'diagnosis_tool_invocations_total{success="false"}', since)
        for _series, exemplar in failed_tools:
            run = by_trace[exemplar["labels"]["trace_id"]]
            assert tools[(run["run_id"], exemplar["labels"]["span_id"])]["success"] == 0
        assert failed_tools
    finally:
        prometheus.stop()
        stop_daemon(daemon)


def test_the_sdk_keeps_the_span_of_each_measurement_as_an_otlp_exemplar():
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from run_otel.pipeline.results import ExportedRun, PollResult
    from run_otel.source.rows import RunRow, ToolRow

    run_id = "run-550e8400-e29b-41d4-a716-446655440000"
    run = RunRow(
        **{
            **{f: None for f in RunRow._fields},
            "id": 1,
            "run_id": run_id,
            "status": "FAILED",
            "intent": "DIAGNOSIS",
            "total_duration_ms": 4200,
        }
    )
    tool = ToolRow(
        **{
            **{f: None for f in ToolRow._fields},
            "id": 7,
            "run_id": run_id,
            "tool_name": "query_logs",
            "success": False,
            "duration_ms": 120,
        }
    )
    reader = InMemoryMetricReader()
    metrics = bridge_metrics(build_config({}), [reader])
    metrics.runs_exported(PollResult(runs=[ExportedRun(run, [tool], False, 2)]), time.time())
    points = {
        m.name: m.data.data_points
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    (duration,) = points["diagnosis.run.duration"]
    (exemplar,) = [e for e in duration.exemplars]
    assert f"{exemplar.trace_id:032x}" == "550e8400e29b41d4a716446655440000"
    assert f"{exemplar.span_id:016x}" == spec_root_span_id(run_id)
    assert exemplar.value == 4.2
    (tool_duration,) = points["diagnosis.tool.duration"]
    assert [f"{e.span_id:016x}" for e in tool_duration.exemplars] == [spec_tool_span_id(run_id, 7)]
    failed = [p for p in points["diagnosis.runs"] if p.attributes["status"] == "FAILED"]
    assert [f"{e.trace_id:032x}" for p in failed for e in p.exemplars] == ["550e8400e29b41d4a716446655440000"]
    metrics.shutdown()
