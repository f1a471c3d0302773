"""A backfilled history in a real Prometheus: MariaDB -> `run-otel backfill --metrics-out` ->
`promtool tsdb create-blocks-from openmetrics` -> Prometheus 2.42 on those blocks -> PromQL.

Counts between two past instants equal SQL's over the same rows, and every panel of the runs
and RAG dashboards returns data over a backfilled month."""

from __future__ import annotations

import json
import math
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from helpers import bridge_sections, filled, panels, run_cli, utc_now_naive, write_config
from servers import Prometheus, free_port, promtool

from run_otel.ops.demo import generate, insert_workload
from run_otel.telemetry import instruments as I

ROOT = Path(__file__).resolve().parent.parent
BOARDS = ("diagnosis-runs.json", "rag-retrieval.json")
TERMINAL = "('SUCCESS','FALLBACK','FAILED','CANCELLED')"

pytestmark = pytest.mark.server


def at(moment: datetime) -> float:
    return moment.replace(tzinfo=UTC).timestamp()


def backfill_into_prometheus(agent_db, receiver, tmp_path, since, until, step: int, *extra: str) -> Prometheus:
    """Backfills [since, until) with --metrics-out, imports the file, and starts Prometheus on the blocks."""
    sections = bridge_sections(agent_db, tmp_path, receiver.endpoint, poll={"run_timeout_seconds": 0})
    config = write_config(tmp_path / "run-otel.toml", sections)
    history = tmp_path / "history.om"
    done = run_cli(
        "backfill",
        "--config",
        str(config),
        "--since",
        f"{since:%Y-%m-%d %H:%M:%S}",
        "--until",
        f"{until:%Y-%m-%d %H:%M:%S}",
        "--metrics-out",
        str(history),
        *(("--metrics-step", str(step)) if step != 60 else ()),
        *extra,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert f"in {history}" in done.stdout, done.stdout
    assert history.read_text().count(" # {trace_id=") > 0  # exemplars, which the import must take
    prometheus = Prometheus(
        tmp_path,
        f"127.0.0.1:{free_port()}",  # nothing listens: the history is all there is
        ROOT / "config/prometheus/alerts.yml",
        ROOT / "config/prometheus/prometheus.yml",
        # Retention counts back from the newest block: a month needs more than the 15 days default.
        ("--storage.tsdb.retention.time=400d",),
    )
    imported = subprocess.run(
        [
            promtool(),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--max-block-duration=24h",
            str(history),
            str(tmp_path / "tsdb"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert imported.returncode == 0, imported.stderr
    history.unlink()  # hundreds of MB: the blocks are what the test reads from here on
    prometheus.start()
    return prometheus


def instant(prometheus: Prometheus, expr: str, moment: datetime) -> dict[str, float]:
    reply = requests.get(
        f"http://127.0.0.1:{prometheus.port}/api/v1/query", params={"query": expr, "time": at(moment)}, timeout=60
    ).json()
    assert reply["status"] == "success", reply
    return {"/".join(r["metric"].values()) or "total": float(r["value"][1]) for r in reply["data"]["result"]}


def increase(prometheus: Prometheus, expr: str, start: datetime, end: datetime) -> dict[str, float]:
    """What the counters gained from ``start`` to ``end``: their raw values then and now, no extrapolation."""
    before, after = instant(prometheus, expr, start), instant(prometheus, expr, end)
    return {key: value - before.get(key, 0.0) for key, value in after.items() if value - before.get(key, 0.0)}


def sql_counts(agent_db, sql: str, start: datetime, end: datetime) -> dict[str, float]:
    rows = agent_db.execute(sql, start, end)
    return {"/".join(str(v) for v in row[:-1]) or "total": float(row[-1]) for row in rows if row[-1]}


def compare_counts(agent_db, prometheus: Prometheus, start: datetime, end: datetime) -> None:
    job = f'job="{I.JOB}"'
    runs_sql = f"FROM diagnosis_run WHERE status IN {TERMINAL} AND updated_at >= %s AND updated_at < %s"
    tools_sql = (
        "FROM tool_invocation t JOIN diagnosis_run r ON t.run_id = r.run_id "
        f"WHERE r.status IN {TERMINAL} AND r.updated_at >= %s AND r.updated_at < %s"
    )
    pairs = [
        (f"sum by (status) (diagnosis_runs_total{{{job}}})", f"SELECT status, COUNT(*) {runs_sql} GROUP BY status"),
        (
            f"sum by (intent) (diagnosis_run_tokens_total{{{job}}})",
            f"SELECT intent, SUM(total_token_count) {runs_sql} GROUP BY intent",
        ),
        (
            f'sum by (retrieval_layer) (diagnosis_tool_invocations_total{{{job}, retrieval_layer!="none"}})',
            f"SELECT t.retrieval_layer, COUNT(*) {tools_sql} AND t.retrieval_layer IS NOT NULL GROUP BY t.retrieval_layer",
        ),
        (f'sum(rag_matches_total{{{job}, layer="L0"}})', f"SELECT SUM(t.l0_match_count) {tools_sql}"),
        (
            f"sum by (feedback) (diagnosis_run_feedback_total{{{job}}})",
            f"SELECT feedback, COUNT(*) {runs_sql} AND feedback IS NOT NULL GROUP BY feedback",
        ),
    ]
    for expr, sql in pairs:
        expected = sql_counts(agent_db, sql, start, end)
        assert expected, sql  # rows in the window: a count of nothing would prove nothing
        assert increase(prometheus, expr, start, end) == expected, expr
        print(f"{start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} | {expr} | SQL and Prometheus: {expected}")


def test_a_backfilled_day_at_the_default_step_counts_what_sql_counts(agent_db, receiver, tmp_path):
    until = utc_now_naive().replace(minute=0, second=0) - timedelta(hours=1)
    since = until - timedelta(hours=6)
    insert_workload(agent_db.engine(), generate(5, 200, anchor=until, span_seconds=6 * 3600 - 60))
    prometheus = backfill_into_prometheus(agent_db, receiver, tmp_path, since, until, 60)
    # A run started before a minute and finished after it: it counts after that minute, as the daemon counts it.
    first = next(
        updated.replace(second=0)
        for created, updated in agent_db.execute(
            f"SELECT created_at, updated_at FROM diagnosis_run WHERE status IN {TERMINAL} ORDER BY id"
        )
        if created.replace(second=0) < updated.replace(second=0) < updated
    )
    assert since < first < until - timedelta(minutes=13)
    try:
        # Two past instants on the minute: every run that finished in between, and no other.
        compare_counts(agent_db, prometheus, first, until - timedelta(minutes=13))
        compare_counts(agent_db, prometheus, since, until + timedelta(minutes=1))
    finally:
        prometheus.stop()


def test_every_runs_and_rag_panel_has_data_over_a_backfilled_month(agent_db, receiver, tmp_path):
    until = utc_now_naive().replace(minute=0, second=0) - timedelta(hours=1)
    since = until - timedelta(days=30)
    insert_workload(agent_db.engine(), generate(9, 3000, anchor=until, span_seconds=30 * 86400 - 60))
    # Hourly samples keep the file a test can import to ~100 MB; Grafana's month view reads windows of hours anyway.
    prometheus = backfill_into_prometheus(agent_db, receiver, tmp_path, since, until, 3600)
    try:
        compare_counts(agent_db, prometheus, since + timedelta(days=3), until - timedelta(days=2))
        summary = {}
        for board in BOARDS:
            dashboard = json.loads((ROOT / "dashboards" / board).read_text())
            for panel in panels(dashboard):
                for target in panel["targets"]:
                    values = month_of(prometheus, filled(target["expr"], "3h"), since, until)
                    assert values, (board, panel["title"], target["expr"])
                    summary[(board, panel["title"], target.get("legendFormat", ""))] = values
        for (board, title, legend), values in summary.items():
            print(f"{board} | {title} | {legend} | " + ", ".join(f"{k}: {v}" for k, v in sorted(values.items())))
    finally:
        prometheus.stop()


def month_of(prometheus: Prometheus, expr: str, since: datetime, until: datetime) -> dict[str, str]:
    """A range query over the month (6-hour steps): per series, the mean of its finite points."""
    reply = requests.get(
        f"http://127.0.0.1:{prometheus.port}/api/v1/query_range",
        params={"query": expr, "start": at(since + timedelta(hours=3)), "end": at(until), "step": "6h"},
        timeout=60,
    ).json()
    assert reply["status"] == "success", reply
    means: dict[str, str] = {}
    for series in reply["data"]["result"]:
        points = [float(v) for _t, v in series["values"] if math.isfinite(float(v))]
        if points:
            name = ",".join(f"{k}={v}" for k, v in series["metric"].items()) or "all"
            means[name] = f"{sum(points) / len(points):.3g} over {len(points)} points"
    return means
