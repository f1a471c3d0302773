"""Labels whose values come from the agent's rows are bounded: 3,000 distinct tool names against
`run-otel run` and a real Prometheus 2.42 scraping it, as an SRE would run it."""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path

import requests
import yaml
from helpers import DaemonProcess, bridge_sections, http_status, utc_now_naive, write_config
from servers import Prometheus, free_port, wait_for

from run_otel.config import build_config
from run_otel.factory import build_metrics
from run_otel.ops.demo import Workload, insert_workload
from run_otel.pipeline.results import ExportedRun, PollResult
from run_otel.source.rows import RunRow, ToolRow
from run_otel.telemetry import instruments as I

ROOT = Path(__file__).resolve().parent.parent
OPENMETRICS = {"Accept": "application/openmetrics-text; version=1.0.0"}
TOOL_NAMES = 3000
FLAKY = "flaky_search"
# The targets on a 2-core machine.
MAX_SERIES, MAX_BYTES, MAX_SCRAPE_SECONDS = 5000, 1_000_000, 0.5


CHUNKS = 6


def many_tools_workload() -> list[Workload]:
    """An hour of an agent that names its tools per call, in the parts it arrives in: 300 runs calling
    3,000 distinct tools, a quarter of them retrievals (every layer and relevance, 60 dedup reasons),
    every 7th call failing; after each 50 of them, 10 runs of 25 calls each to one more tool,
    ``flaky_search``, every call failing. It is first called after 500 other names were seen, so it
    is past any bound below that."""
    anchor = utc_now_naive() - timedelta(minutes=2)
    runs: list[dict] = []
    tools: list[dict] = []

    def run(k: int) -> str:
        run_id = f"run-{uuid.UUID(int=k + 1)}"
        created = anchor - timedelta(seconds=3600 - k)
        runs.append(
            dict(
                run_id=run_id,
                session_id=f"s{k % 40}",
                query="q",
                status="SUCCESS",
                intent=("DIAGNOSIS", "KNOWLEDGE_QUERY", "SYSTEM_CHAT")[k % 3],
                release_outcome="SUCCESS",
                total_duration_ms=2000 + k,
                created_at=created,
                updated_at=created + timedelta(seconds=5),
            )
        )
        return run_id

    def call(run_id: str, name: str, k: int, success: bool, **retrieval) -> None:
        columns = dict.fromkeys(("retrieval_layer", "relevance_level", "l0_match_count", "l1_match_count", "dedup_reason"))
        tools.append(
            dict(
                session_id="s",
                run_id=run_id,
                tool_name=name,
                input_params="{}",
                duration_ms=3 + (k * 37) % 4000,
                success=success,
                created_at=anchor,
                **{**columns, **retrieval},
            )
        )

    parts, per_part = [], TOOL_NAMES // 10 // CHUNKS
    for part in range(CHUNKS):
        runs, tools = [], []
        for k in range(part * per_part, (part + 1) * per_part):
            run_id = run(k)
            for i in range(10 * k, 10 * k + 10):
                retrieval = {}
                if i % 4 == 0:
                    relevance = ("PRECISE", "HIGHLY_RELEVANT", "REFERENCE", "DEDUPED")[i // 4 % 4]
                    retrieval = dict(
                        retrieval_layer=("L0", "L1", "L0+L1")[i % 3],
                        relevance_level=relevance,
                        l0_match_count=i % 5,
                        l1_match_count=i % 3,
                        dedup_reason=f"reason_{i % 60}" if relevance == "DEDUPED" else None,
                    )
                call(run_id, f"tool_{i:04d}", i, i % 7 != 0, **retrieval)
        for k in range(10):
            run_id = run(1000 + part * 10 + k)
            for i in range(25):
                call(run_id, FLAKY, i, False)
        parts.append(Workload(runs, tools))
    return parts


def samples(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def scrape(port: int) -> tuple[str, float]:
    """/metrics as Prometheus asks for it (OpenMetrics), and the time it took."""
    started = time.perf_counter()
    reply = requests.get(f"http://127.0.0.1:{port}/metrics", headers=OPENMETRICS, timeout=120)
    return reply.text, time.perf_counter() - started


def counted(port: int) -> float:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=120).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in samples(text) if line.startswith(I.RUNS.prometheus + "{"))


def tool_error_rule_without_hold(path: Path) -> Path:
    """The shipped per-tool error-rate alert, its expression as generated, without its 15 minutes' hold."""
    shipped = yaml.safe_load((ROOT / "config/prometheus/alerts.yml").read_text())
    (rule,) = [r for g in shipped["groups"] for r in g["rules"] if r.get("alert") == "DiagnosisToolErrorRateHigh"]
    rule.pop("for", None)
    path.write_text(yaml.safe_dump({"groups": [{"name": "tools", "rules": [rule]}]}))
    return path


def test_3000_tool_names_stay_in_bounds_on_a_real_prometheus_and_the_folded_errors_alert(agent_db, receiver, tmp_path):
    parts = many_tools_workload()
    workload = Workload([r for p in parts for r in p.runs], [t for p in parts for t in p.tools])
    assert len({t["tool_name"] for t in workload.tools}) == TOOL_NAMES + 1  # the precondition
    port = free_port()
    sections = bridge_sections(agent_db, tmp_path, receiver.endpoint, metrics={"enabled": True, "port": port})
    daemon = DaemonProcess(write_config(tmp_path / "run-otel.toml", sections), tmp_path / "daemon.log")
    prometheus = Prometheus(
        tmp_path,
        f"127.0.0.1:{port}",
        tool_error_rule_without_hold(tmp_path / "rules.yml"),
        ROOT / "config/prometheus/prometheus.yml",
        ("--enable-feature=extra-scrape-metrics",),
    )
    try:
        wait_for(lambda: http_status(f"http://127.0.0.1:{port}/readyz") == 200, 60, "run-otel ready")
        prometheus.start()
        job = 'job="run-otel"'
        wait_for(lambda: prometheus.query(f"up{{{job}}} == 1"), 60, "the first scrape")
        # The hour arrives in parts, a few scrapes apart, so rate() sees the calls come in.
        for part in parts:
            runs = counted(port) + len(part.runs)
            insert_workload(agent_db.engine(), part)
            wait_for(lambda runs=runs: counted(port) == runs, 120, "the part's runs counted", 0.5)
            time.sleep(3)
        scrapes = [scrape(port) for _ in range(3)]
        text = scrapes[-1][0]
        series, size = len(samples(text)), len(text.encode())
        seconds = sorted(s for _t, s in scrapes)[1]
        figures = f"{series} series, {size:,} bytes, scrape {seconds:.3f} s (median of 3)"
        print(f"\n/metrics at {TOOL_NAMES} tool names: {figures}")
        assert series < MAX_SERIES and size < MAX_BYTES and seconds < MAX_SCRAPE_SECONDS, figures
        assert "otel_metric_overflow" not in text and 'tool_name=""' not in text

        # Prometheus' own account of its scrapes of the daemon.
        wait_for(
            lambda: prometheus.query(f"sum(diagnosis_runs_total{{{job}}}) == {len(workload.runs)}"), 60, "the runs in Prometheus"
        )
        scraped = float(prometheus.query(f"max_over_time(scrape_samples_scraped{{{job}}}[30s])")[0]["value"][1])
        body = float(prometheus.query(f"max_over_time(scrape_body_size_bytes{{{job}}}[30s])")[0]["value"][1])
        # The median scrape: one scrape slowed by a neighbour on a shared machine says nothing of the endpoint.
        took = float(prometheus.query(f"quantile_over_time(0.5, scrape_duration_seconds{{{job}}}[30s])")[0]["value"][1])
        assert scraped < MAX_SERIES and body < MAX_BYTES and took < MAX_SCRAPE_SECONDS, (scraped, body, took)

        # Counters and histograms fold alike: every call counted once in each, under the same name.
        calls = {
            r["metric"]["tool_name"]: float(r["value"][1])
            for r in prometheus.query(f"sum by (tool_name) ({I.TOOL_INVOCATIONS.prometheus}{{{job}}})")
        }
        timed = {
            r["metric"]["tool_name"]: float(r["value"][1])
            for r in prometheus.query(f"sum by (tool_name) ({I.TOOL_DURATION.series('_count')}{{{job}}})")
        }
        assert calls == timed and sum(calls.values()) == len(workload.tools)
        bound = build_config({}).metrics.max_tool_names
        kept = set(calls) - {"other"}
        assert "other" in calls and len(kept) == bound and FLAKY not in kept
        by_name = Counter(t["tool_name"] for t in workload.tools)
        assert all(calls[name] == by_name[name] for name in kept)
        folded = len(workload.tools) - sum(by_name[name] for name in kept)
        assert calls["other"] == folded
        for instrument in (I.RAG_MATCHES, I.DEDUP, I.ZERO_MATCH):
            names = {r["metric"]["tool_name"] for r in prometheus.query(f"{instrument.prometheus}{{{job}}}")}
            assert names <= kept | {"other"}, instrument.name
        folded_counter = prometheus.query(f'run_otel_labels_folded_total{{{job}, label="tool_name"}}')
        assert [float(r["value"][1]) for r in folded_counter] == [folded]

        # The folded tool's failures fire the per-tool alert, under tool_name="other".
        firing = wait_for(
            lambda: prometheus.query('ALERTS{alertname="DiagnosisToolErrorRateHigh", alertstate="firing"}'),
            60,
            "the tool error alert",
            0.5,
        )
        assert [r["metric"]["tool_name"] for r in firing] == ["other"]

        log = daemon.output()
        assert len(re.findall(r"WARNING.*tool_name", log)) == 1, log[-3000:]
        assert "metrics.max_tool_names" in log and "Traceback" not in log
    finally:
        prometheus.stop()
        daemon.terminate()


# -- the bounds in one process, in the fast loop -----------------------------------------------------

RUN_ID = "run-550e8400-e29b-41d4-a716-446655440000"


def exported(names: list[str], dedup: str | None = None) -> PollResult:
    run = RunRow(**{**dict.fromkeys(RunRow._fields), "id": 1, "run_id": RUN_ID, "status": "SUCCESS", "intent": "DIAGNOSIS"})
    tools = [
        ToolRow(
            **{
                **dict.fromkeys(ToolRow._fields),
                "id": k,
                "run_id": RUN_ID,
                "tool_name": name,
                "success": k % 2 == 0,
                "duration_ms": 20,
                "retrieval_layer": "L0",
                "relevance_level": "DEDUPED",
                "dedup_reason": dedup or f"reason {k}",
            }
        )
        for k, name in enumerate(names, 1)
    ]
    return PollResult(runs=[ExportedRun(run, tools, False, 1 + len(tools))])


def served(metrics) -> dict[str, list[dict]]:
    """Each family's samples' labels (without the scope's) and values, as /metrics serves them."""
    from prometheus_client.openmetrics.exposition import generate_latest
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    out: dict[str, list[dict]] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if not k.startswith("otel_scope")}
            out.setdefault(sample.name, []).append({**labels, "value": sample.value})
    return out


def test_past_the_bound_every_instrument_folds_a_name_alike_warns_once_and_counts(caplog):
    metrics = build_metrics(build_config({"metrics": {"max_tool_names": 2, "max_dedup_reasons": 3}}))
    with caplog.at_level(logging.WARNING):
        metrics.runs_exported(exported(["a", "b", "c", "d", "a", "e"]), 0.0)
        metrics.runs_exported(exported(["f", "b"]), 0.0)
    series = served(metrics)
    metrics.shutdown()
    calls = Counter()
    for s in series["diagnosis_tool_invocations_total"]:
        calls[s["tool_name"]] += s["value"]
    timed = Counter()
    for s in series["diagnosis_tool_duration_seconds_count"]:
        timed[s["tool_name"]] += s["value"]
    assert calls == timed == {"a": 2, "b": 2, "other": 4}
    for name in ("rag_dedup_total", "rag_zero_match_total"):
        assert {s["tool_name"] for s in series[name]} == {"a", "b", "other"}, name
    assert {s["dedup_reason"] for s in series["rag_dedup_total"]} == {"reason 1", "reason 2", "reason 3", "other"}
    folded = {s["label"]: s["value"] for s in series["run_otel_labels_folded_total"]}
    assert folded == {"tool_name": 4, "dedup_reason": 3}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # one per label, at its first fold
    assert "'c'" in warnings[0] and "metrics.max_tool_names" in warnings[0]
    assert "'reason 4'" in warnings[1] and "metrics.max_dedup_reasons" in warnings[1]


def test_no_label_set_is_lost_to_the_sdks_own_limit_below_the_bounds():
    """2,400 tool names under a bound of 2,500: the SDK's default of 2,000 label sets per metric
    would fold the rest into one series without their names; the limit is set above the bound."""
    names = [f"tool_{k}" for k in range(2400)]
    metrics = build_metrics(build_config({"metrics": {"max_tool_names": 2500}}))
    metrics.runs_exported(exported(names, dedup="same"), 0.0)
    series = served(metrics)
    metrics.shutdown()
    assert {s["tool_name"] for s in series["diagnosis_tool_invocations_total"]} == set(names)
    assert not [s for samples in series.values() for s in samples if "otel_metric_overflow" in s]


def test_a_reached_sdk_limit_is_said_once(caplog):
    """Should the SDK's limit be reached all the same, /metrics says so, naming the metric."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.view import View
    from prometheus_client import CollectorRegistry

    from run_otel.telemetry.exemplars import ExemplarCollector, ExemplarStore

    sdk = CollectorRegistry(auto_describe=True)
    provider = MeterProvider(
        [PrometheusMetricReader(registry=sdk)], views=[View(instrument_name="c", aggregation_cardinality_limit=2)]
    )
    counter = provider.get_meter("m").create_counter("c")
    for k in range(5):
        counter.add(1, {"k": str(k)})
    collector = ExemplarCollector(sdk, ExemplarStore())
    with caplog.at_level(logging.WARNING):
        families = list(collector.collect()) + list(collector.collect())
    provider.shutdown()
    assert any("otel_metric_overflow" in s.labels for f in families for s in f.samples)  # the precondition
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("c: the OpenTelemetry SDK reached its cardinality limit")


def test_every_label_of_the_catalogue_has_a_ceiling():
    from run_otel.telemetry.bounds import LabelBounds

    sizes = LabelBounds(100, 20).values_per_label(14)
    assert {name for i in I.ALL for name in i.labels} <= set(sizes)
