"""A backfilled history in a real Prometheus 2.42, both ways in: MariaDB -> `run-otel backfill
--metrics-push` -> remote write into a running Prometheus, whose live samples are newer (its
out-of-order window takes the history); and `--metrics-out` -> `promtool tsdb create-blocks-from
openmetrics` -> Prometheus on those blocks. Then PromQL.

Counts between two past instants equal SQL's over the same rows. Every panel of the runs and RAG
dashboards shows data over single days of a pushed month, at the rate window Grafana gives the
panel for one day; the dashboards' job variable has values on those days. (Until Prometheus
compacts pushed samples into blocks, within its next two hours, 2.42 reads a month of them
slowly: bench/history.py measures the week and month views on blocks.)
"""

from __future__ import annotations

import json
import math
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from helpers import bridge_sections, filled, grafana_intervals, panels, run_cli, utc_now_naive, write_config
from servers import Prometheus, free_port, promtool

from run_otel.ops.demo import generate, insert_workload
from run_otel.telemetry import instruments as I

ROOT = Path(__file__).resolve().parent.parent
BOARDS = ("diagnosis-runs.json", "rag-retrieval.json")
DAY = 86400
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


def push_into_prometheus(agent_db, receiver, tmp_path, since, until, *extra: str) -> Prometheus:
    """Starts Prometheus as shipped (remote write on, its scrape writing live samples at now), then
    backfills [since, until) with --metrics-push into it: the history is older than its head."""
    prometheus = Prometheus(
        tmp_path,
        f"127.0.0.1:{free_port()}",  # nothing listens: the scrape's `up` samples are the live ones
        ROOT / "config/prometheus/alerts.yml",
        ROOT / "config/prometheus/prometheus.yml",
        ("--web.enable-remote-write-receiver", "--storage.tsdb.retention.time=400d"),
    )
    prometheus.start()
    sections = bridge_sections(agent_db, tmp_path, receiver.endpoint, poll={"run_timeout_seconds": 0})
    config = write_config(tmp_path / "run-otel.toml", sections)
    url = f"http://127.0.0.1:{prometheus.port}/api/v1/write"
    done = run_cli(
        "backfill",
        "--config",
        str(config),
        "--since",
        f"{since:%Y-%m-%d %H:%M:%S}",
        "--until",
        f"{until:%Y-%m-%d %H:%M:%S}",
        "--metrics-push",
        url,
        *extra,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    assert f"pushed to {url}" in done.stdout, done.stdout
    print(done.stdout)
    return prometheus


@pytest.mark.timeout(1800)  # a month of samples, then a query per panel: minutes on a busy 2-core machine
def test_every_runs_and_rag_panel_has_data_on_single_days_of_a_pushed_month(agent_db, receiver, tmp_path):
    until = utc_now_naive().replace(minute=0, second=0) - timedelta(hours=1)
    since = until - timedelta(days=30)
    insert_workload(agent_db.engine(), generate(9, 3000, anchor=until, span_seconds=30 * DAY - 60))
    prometheus = push_into_prometheus(agent_db, receiver, tmp_path, since, until)
    try:
        assert instant(prometheus, "sum(up)", utc_now_naive()) == {"total": 0.0}  # live samples at now, newer than the history
        compare_counts(agent_db, prometheus, since + timedelta(days=3), until - timedelta(days=2))
        midnight = since.replace(hour=0) + timedelta(days=1)
        days = [midnight, midnight + timedelta(days=14), until.replace(hour=0) - timedelta(days=1)]
        # The middle day: 2.42 reads every out-of-order chunk of a series for each query until it
        # compacts them, so a query costs seconds here; bench/history.py reads more days from blocks.
        day, empty = days[1], []
        for board in BOARDS:
            dashboard = json.loads((ROOT / "dashboards" / board).read_text())
            for panel in panels(dashboard):
                step, window = grafana_intervals(DAY, panel)
                for target in panel["targets"]:
                    # A fixed window (the error budget's [30d]) reads the month at every point: four will do.
                    every = step if "$__rate_interval" in target["expr"] else DAY // 4
                    values = range_of(prometheus, filled(target["expr"], f"{window}s"), day, day + timedelta(days=1), every)
                    print(f"{board} | {panel['title']} | {day:%Y-%m-%d} at [{window}s] | {values}")
                    if not values:
                        empty.append((board, panel["title"], target["expr"], window))
        assert not empty, empty
        for day in days:  # the dashboards' job variable, as Grafana asks for its values over the day
            assert I.JOB in job_values(prometheus, day, day + timedelta(days=1)), day
    finally:
        prometheus.stop()


def job_values(prometheus: Prometheus, start: datetime, end: datetime) -> set[str]:
    """The health dashboard's job variable over [start, end], as Grafana's Prometheus data source asks
    for label_values(selector, job): the series of the selector in that range, their job labels."""
    dashboard = json.loads((ROOT / "dashboards" / "exporter-health.json").read_text())
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "job")
    query = variable["query"] if isinstance(variable["query"], str) else variable["query"]["query"]
    selector = query.removeprefix("label_values(").removesuffix(", job)")
    reply = requests.get(
        f"http://127.0.0.1:{prometheus.port}/api/v1/series",
        params={"match[]": selector, "start": at(start), "end": at(end)},
        timeout=60,
    ).json()
    assert reply["status"] == "success", reply
    return {series["job"] for series in reply["data"]}


def range_of(prometheus: Prometheus, expr: str, start: datetime, end: datetime, step: int) -> dict[str, str]:
    """A range query as a panel asks it: per series, the mean of its finite points and their count."""
    reply = requests.get(
        f"http://127.0.0.1:{prometheus.port}/api/v1/query_range",
        params={"query": expr, "start": at(start), "end": at(end), "step": step},
        timeout=300,
    ).json()
    assert reply["status"] == "success", reply
    means: dict[str, str] = {}
    for series in reply["data"]["result"]:
        points = [float(v) for _t, v in series["values"] if math.isfinite(float(v))]
        if points:
            name = ",".join(f"{k}={v}" for k, v in series["metric"].items()) or "all"
            means[name] = f"{sum(points) / len(points):.3g} over {len(points)} points"
    return means


def test_a_prometheus_that_would_refuse_the_history_stops_the_backfill_before_a_run_is_read(agent_db, receiver, tmp_path):
    import yaml

    until = utc_now_naive().replace(minute=0, second=0) - timedelta(hours=1)
    since = until - timedelta(days=2)
    insert_workload(agent_db.engine(), generate(3, 40, anchor=until, span_seconds=2 * DAY - 60))
    shipped = yaml.safe_load((ROOT / "config/prometheus/prometheus.yml").read_text())
    assert shipped["storage"]["tsdb"]["out_of_order_time_window"] == "35d"  # precondition: the shipped one takes it
    no_window = tmp_path / "no-window.yml"
    no_window.write_text(yaml.safe_dump({k: v for k, v in shipped.items() if k != "storage"}))
    config = write_config(tmp_path / "run-otel.toml", bridge_sections(agent_db, tmp_path, receiver.endpoint))
    cases = [
        (
            no_window,
            ("--web.enable-remote-write-receiver",),
            ["refused samples as old as", "out_of_order_time_window: set it to at least"],
        ),
        (ROOT / "config/prometheus/prometheus.yml", (), ["answered 404", "--web.enable-remote-write-receiver"]),
    ]
    for number, (prometheus_config, flags, says) in enumerate(cases):
        base = tmp_path / f"prometheus-{number}"
        base.mkdir()
        prometheus = Prometheus(base, f"127.0.0.1:{free_port()}", ROOT / "config/prometheus/alerts.yml", prometheus_config, flags)
        prometheus.start()
        try:
            wait_for_live_sample(prometheus)
            done = run_cli(
                "backfill",
                "--config",
                str(config),
                "--since",
                f"{since:%Y-%m-%d %H:%M:%S}",
                "--until",
                f"{until:%Y-%m-%d %H:%M:%S}",
                "--metrics-push",
                f"http://127.0.0.1:{prometheus.port}/api/v1/write",
            )
        finally:
            prometheus.stop()
        assert done.returncode == 1, done.stdout + done.stderr
        for words in says:
            assert words in done.stderr, done.stderr
        assert "backfilled" not in done.stdout and not receiver.spans()  # stopped before a run was read


def wait_for_live_sample(prometheus: Prometheus) -> None:
    """The scrape's first `up`: from then on the history is older than Prometheus' newest sample."""
    from servers import wait_for

    wait_for(lambda: bool(instant(prometheus, "up", utc_now_naive() + timedelta(seconds=1))), 30, "a first scrape")
