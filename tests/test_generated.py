"""Dashboards and alert rules stay what their generator, and the instrument catalogue, say."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from helpers import bridge_metrics

from run_otel.telemetry import instruments as I

ROOT = Path(__file__).resolve().parent.parent


def dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in (ROOT / "dashboards").glob("*.json")}


def exprs(board: dict) -> list[str]:
    return [t["expr"] for p in board["panels"] for inner in [p, *p.get("panels", [])] for t in inner.get("targets", [])]


def test_committed_files_match_the_generator():
    done = subprocess.run([sys.executable, str(ROOT / "scripts/generate.py"), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_three_dashboards_with_prometheus_and_trace_variables():
    boards = dashboards()
    assert set(boards) == {"diagnosis-runs.json", "rag-retrieval.json", "exporter-health.json"}
    for name, board in boards.items():
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["prometheus_datasource"]["query"] == "prometheus", name
        assert variables["tempo_datasource"]["query"] == "tempo", name
        for panel in board["panels"]:
            if panel["type"] != "row":
                assert panel["datasource"]["uid"] == "${prometheus_datasource}", (name, panel["title"])


def test_run_panels_link_to_failed_runs_in_tempo_and_jaeger():
    board = dashboards()["diagnosis-runs.json"]
    links = [link["url"] for p in board["panels"] for link in p.get("links", [])]
    assert any("traceql" in url and "%24%7Btempo_datasource%7D" not in url and "${tempo_datasource}" in url for url in links)
    assert any("jaeger" in url for url in links)
    assert all("FAILED" in url for url in links)


def test_every_run_and_rag_metric_is_on_a_dashboard():
    text = "\n".join(e for board in dashboards().values() for e in exprs(board))
    for instrument in I.ALL:
        assert instrument.prometheus in text, instrument.name


def test_alerts_use_only_catalogue_metrics():
    rules = yaml.safe_load((ROOT / "config/prometheus/alerts.yml").read_text())
    # The recording rules' own series, which the burn-rate alert reads.
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    names = {i.prometheus for i in I.ALL} | {"up"} | recorded
    for group in rules["groups"]:
        for rule in group["rules"]:
            used = {token for token in _metric_tokens(rule["expr"])}
            assert used <= names, (rule.get("alert", rule.get("record")), used - names)


def _metric_tokens(expr: str) -> set[str]:
    import re

    words = set(re.findall(r"(?<![a-z0-9_:])([a-z_][a-z0-9_:]*)(?:\{|\[|\))", expr))
    return {w for w in words if "_" in w and w not in {"histogram_quantile", "tool_name"}} | ({"up"} if "up{" in expr else set())


def test_the_operations_doc_lists_every_metric():
    doc = (ROOT / "docs/operations.md").read_text()  # its metrics table
    for instrument in I.ALL:
        assert f"`{instrument.prometheus}`" in doc, instrument.prometheus


def test_tool_latencies_under_100ms_fall_in_different_buckets():
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from run_otel.config import build_config

    reader = InMemoryMetricReader()
    metrics = bridge_metrics(build_config({}), [reader])
    hist = metrics._get(I.TOOL_DURATION)
    for seconds in (0.004, 0.02, 0.07):
        hist.record(seconds, {"tool_name": "t", "retrieval_layer": "L0", "success": "true"})
    data = reader.get_metrics_data()
    (point,) = [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == I.TOOL_DURATION.name
        for p in m.data.data_points
    ]
    assert sum(1 for count in point.bucket_counts if count) == 3
    metrics.shutdown()


def test_the_metrics_endpoint_speaks_openmetrics_when_asked():
    import requests
    from servers import free_port

    from run_otel.config import build_config
    from run_otel.factory import build_metrics
    from run_otel.telemetry.health import HealthServer

    metrics = build_metrics(build_config({}))
    server = HealthServer("127.0.0.1", free_port(), metrics.registry, lambda: (True, "ready")).start()
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        plain = requests.get(url, timeout=5)
        open_metrics = requests.get(url, headers={"Accept": "application/openmetrics-text; version=1.0.0"}, timeout=5)
    finally:
        server.stop()
        metrics.shutdown()
    assert plain.headers["Content-Type"].startswith("text/plain")
    assert open_metrics.headers["Content-Type"].startswith("application/openmetrics-text")
    assert open_metrics.text.rstrip().endswith("# EOF") and "run_otel_start_timestamp_seconds" in open_metrics.text


def test_latency_panels_show_exemplars_that_open_the_trace_by_the_label_run_otel_writes():
    from run_otel.telemetry.exemplars import TRACE_ID_LABEL

    with_exemplars = {
        inner["title"]: target["expr"]
        for board in dashboards().values()
        for p in board["panels"]
        for inner in [p, *p.get("panels", [])]
        for target in inner.get("targets", [])
        if target.get("exemplar")
    }
    assert {I.RUN_DURATION.series("_bucket"), I.TOOL_DURATION.series("_bucket")} <= {
        name
        for expr in with_exemplars.values()
        for name in (I.RUN_DURATION.series("_bucket"), I.TOOL_DURATION.series("_bucket"))
        if name in expr
    }
    provisioning = yaml.safe_load((ROOT / "config/grafana/provisioning/datasources/run-otel.yml").read_text())
    by_uid = {d["uid"]: d for d in provisioning["datasources"]}
    destinations = by_uid["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert {d["name"] for d in destinations} == {TRACE_ID_LABEL}
    assert {by_uid[d["datasourceUid"]]["type"] for d in destinations} == {"tempo", "jaeger"}


def _points(reader, name: str) -> list:
    return [
        p
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
        for p in m.data.data_points
    ]


def test_export_delays_of_hours_and_days_fall_in_finite_buckets_of_their_own():
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from run_otel.config import build_config

    reader = InMemoryMetricReader()
    metrics = bridge_metrics(build_config({}), [reader])
    for seconds in (400, 3 * 3600, 2 * 86400):  # a catch-up, a backfill of the morning, one of last week
        metrics._get(I.EXPORT_DELAY).record(seconds)
    (point,) = _points(reader, I.EXPORT_DELAY.name)
    filled = [i for i, count in enumerate(point.bucket_counts) if count]
    assert len(filled) == 3 and filled[-1] < len(point.explicit_bounds)  # none in +Inf
    metrics.shutdown()


def test_tool_duration_is_labelled_by_retrieval_layer():
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from run_otel.config import build_config
    from run_otel.pipeline.results import ExportedRun, PollResult
    from run_otel.source.rows import RunRow, ToolRow

    run_id = "run-550e8400-e29b-41d4-a716-446655440000"
    run = RunRow(**{**{f: None for f in RunRow._fields}, "id": 1, "run_id": run_id, "status": "SUCCESS", "intent": "DIAGNOSIS"})
    tools = [
        ToolRow(
            **{
                **{f: None for f in ToolRow._fields},
                "id": i,
                "run_id": run_id,
                "tool_name": "search_runbook",
                "success": True,
                "duration_ms": 20,
                "retrieval_layer": layer,
            }
        )
        for i, layer in enumerate(("L0", "L1", None), 1)
    ]
    reader = InMemoryMetricReader()
    metrics = bridge_metrics(build_config({}), [reader])
    metrics.runs_exported(PollResult(runs=[ExportedRun(run, tools, False, 4)]), 0.0)
    layers = {p.attributes["retrieval_layer"] for p in _points(reader, I.TOOL_DURATION.name)}
    assert layers == {"L0", "L1", "none"}
    metrics.shutdown()


def test_rag_dashboard_shows_retrieval_over_time_and_links_to_runs_and_traces():
    board = dashboards()["rag-retrieval.json"]
    by_title = {p["title"]: p for p in board["panels"]}
    assert by_title["Layer mix"]["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    assert by_title["Relevance levels by layer"]["type"] == "timeseries"
    assert not [p for p in board["panels"] if p["type"] in ("piechart", "bargauge")]  # a pie over the range hides a regression
    layer_latency = [t["expr"] for t in by_title["Tool latency by layer"]["targets"]]
    assert len(layer_latency) == 3 and all("by (le, retrieval_layer)" in e for e in layer_latency)
    beside = " ".join(t["expr"] for t in by_title["Fallback and failure rate beside retrieval"]["targets"])
    assert 'status="FALLBACK"' in beside and 'status="FAILED"' in beside and I.ZERO_MATCH.prometheus in beside
    links = [link["url"] for link in board["links"]]
    assert "/d/run-otel-runs" in links and any("traceql" in url and "%24%7B__from%7D" not in url for url in links)


DOCS = [
    "README.md",
    "CONTRIBUTING.md",
    "CHANGELOG.md",
    "bench/README.md",
    *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")),
]


def _prose(path: Path) -> list[str]:
    """The file's lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _anchors(path: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, -1, -2 for repeats."""
    import re

    seen: dict[str, int] = {}
    for line in _prose(path):
        if match := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line):
            slug = re.sub(r"[^\w\- ]", "", match[1].lower()).replace(" ", "-")
            seen[slug] = seen.get(slug, -1) + 1
            if seen[slug]:
                seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def test_every_relative_link_in_the_docs_opens_a_file_and_a_heading_there():
    import re

    broken = []
    for name in DOCS:
        source = ROOT / name
        text = "\n".join(re.sub(r"`[^`]*`", "", line) for line in _prose(source))
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (source.parent / file).resolve() if file else source
            if not path.exists():
                broken.append(f"{name}: {target} (no such file)")
            elif anchor and (path.suffix != ".md" or anchor not in _anchors(path)):
                broken.append(f"{name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_anchor_rule_is_githubs():
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "page.md"
        page.write_text(
            "# Run it: the `demo`\n```sh\n# not a heading\n```\n## Tests\n## Tests\n### A RAG lookup is a `retrieval` span\n"
        )
        assert _anchors(page) == {"run-it-the-demo", "tests", "tests-1", "a-rag-lookup-is-a-retrieval-span"}
