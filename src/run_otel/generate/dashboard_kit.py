"""The parts the three dashboards share: datasource and label variables, panels with a
description, units and thresholds, and the links between dashboards and to traces.

The conventions are those of the monitoring mixins and Grafana's dashboard-linter; the
tests in ``tests/test_dashboard_lint.py`` hold the generated JSON to them.
"""

from __future__ import annotations

import json
from urllib.parse import quote

from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.builders.common import StackingConfig
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DashboardLink,
    DatasourceVariable,
    QueryVariable,
    ThresholdsConfig,
)
from grafana_foundation_sdk.models.common import StackingMode
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DashboardLinkType,
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    VariableOption,
    VariableRefresh,
)

from ..telemetry import instruments as I
from .stack import Stack

PROMETHEUS = DataSourceRef(type_val="prometheus", uid="${prometheus_datasource}")
SERVICE = "diagnosis-agent"
RATE = "$__rate_interval"
JOB = 'job=~"$job"'
INSTANCE = 'instance=~"$instance"'
SHARD = 'shard=~"$shard"'
GREEN, YELLOW, RED, BLUE = "green", "yellow", "red", "blue"
EXEMPLAR_NOTE = "Each dot is an exemplar: one run (or tool call) in that bucket; click it to open the trace."


def selector(*matchers: str) -> str:
    return "{" + ", ".join(matchers) + "}"


def eq(label: str, value: str) -> str:
    """An equality matcher: a single value never needs a regex."""
    return f'{label}="{value}"'


def query(expr: str, legend: str = "") -> prometheus.Dataquery:
    built = prometheus.Dataquery().expr(expr).datasource(PROMETHEUS).ref_id("A")
    return built.legend_format(legend) if legend else built


def thresholds(*steps: tuple[float, str], base: str = GREEN) -> ThresholdsConfig:
    """Absolute steps above a base colour: a stat turns yellow or red when its value does."""
    return (
        ThresholdsConfig()
        .mode(ThresholdsMode.ABSOLUTE)
        .steps([Threshold(None, base), *(Threshold(value, colour) for value, colour in steps)])
    )


def panel(title: str, unit: str, description: str, *queries: prometheus.Dataquery, width: int = 12) -> timeseries.Panel:
    built = timeseries.Panel().title(title).unit(unit).description(description).datasource(PROMETHEUS).height(8).span(width)
    for index, one in enumerate(queries):
        built = built.with_target(one.ref_id(chr(ord("A") + index)))
    return built


def stacked(title: str, description: str, *queries: prometheus.Dataquery, width: int = 12) -> timeseries.Panel:
    """Shares that add up to 1, stacked: the layer or level mix at each moment."""
    return (
        panel(title, "percentunit", description, *queries, width=width)
        .stacking(StackingConfig().mode(StackingMode.NORMAL))
        .fill_opacity(60)
        .min(0)
        .max(1)
    )


def stat_panel(title: str, unit: str, description: str, one: prometheus.Dataquery, steps: ThresholdsConfig) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .unit(unit)
        .description(description)
        .datasource(PROMETHEUS)
        .height(4)
        .span(6)
        .thresholds(steps)
        .with_target(one)
    )


def explore(datasource: str, search: dict) -> str:
    """A link to Explore for the dashboard's own time range."""
    pane = {
        "a": {"datasource": datasource, "queries": [{"refId": "A", **search}], "range": {"from": "${__from}", "to": "${__to}"}}
    }
    return "/explore?schemaVersion=1&panes=" + quote(json.dumps(pane, separators=(",", ":")), safe="${}_")


def _links(stack: Stack, tempo: tuple[str, dict], jaeger: tuple[str, dict]) -> list:
    """A (title, search) link to Explore in each trace store of ``generate.trace_stores``: a store the
    stack does not run would be a dead link, and its data source variable an empty one."""
    sources = {"tempo": "${tempo_datasource}", "jaeger": stack.generate.jaeger_datasource_uid}
    return [
        DashboardLink(title).type(DashboardLinkType.LINK).url(explore(sources[store], search)).target_blank(True)
        for store, (title, search) in (("tempo", tempo), ("jaeger", jaeger))
        if store in stack.generate.trace_stores
    ]


def failed_run_links(stack: Stack) -> list:
    """Links from run panels to the failed runs' traces, in Tempo and in Jaeger."""
    traceql = f'{{ resource.service.name = "{SERVICE}" && span.diagnosis.run.status = "FAILED" }}'
    return _links(
        stack,
        ("Failed runs in Tempo (TraceQL)", {"queryType": "traceql", "query": traceql}),
        ("Failed runs in Jaeger", {"queryType": "search", "service": SERVICE, "tags": "diagnosis.run.status=FAILED"}),
    )


def trace_search_links(stack: Stack) -> list:
    """The agent's traces in the dashboard's time range, in Tempo and in Jaeger."""
    traceql = f'{{ resource.service.name = "{SERVICE}" }}'
    return _links(
        stack,
        ("Traces in this window (Tempo)", {"queryType": "traceql", "query": traceql}),
        ("Traces in this window (Jaeger)", {"queryType": "search", "service": SERVICE}),
    )


def dashboard_link(title: str, uid: str) -> DashboardLink:
    """Another run-otel dashboard, with the same time range and variables."""
    return DashboardLink(title).type(DashboardLinkType.LINK).url(f"/d/{uid}").keep_time(True).include_vars(True)


def label_variable(name: str, metric: str) -> QueryVariable:
    """A multi-select label variable, All meaning any value, reloaded with the time range."""
    return (
        QueryVariable(name)
        .label(name.title())
        .datasource(PROMETHEUS)
        .query(f"label_values({metric}, {name})")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
        .all_value(".+")
    )


def base(uid: str, title: str, description: str, links: list, stack: Stack) -> Dashboard:
    """Provisioned read-only, with a shared crosshair, and the job variable every query selects on."""
    board = (
        Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["run-otel", "diagnosis-agent"])
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .readonly()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .links(links)
        .with_variable(datasource_variable("prometheus", stack.generate.prometheus_datasource_uid))
    )
    if "tempo" in stack.generate.trace_stores:
        board = board.with_variable(datasource_variable("tempo", stack.generate.tempo_datasource_uid))
    return board.with_variable(job_variable(stack.job))


def datasource_variable(kind: str, uid: str) -> DatasourceVariable:
    """A data source picker; with a uid, that data source is selected when the dashboard opens."""
    built = DatasourceVariable(f"{kind}_datasource").label(f"{kind.title()} data source").type(kind)
    return built.current(VariableOption(text=uid, value=uid, selected=True)) if uid else built


def job_variable(job: str) -> QueryVariable:
    """The jobs that scrape a run-otel, the configured scrape job by default: All would also count
    every other job's up series. A daemon serves its start time; an imported history has none, but
    has the run counter, so the variable has values over history days too."""
    jobs = f'{{__name__=~"{I.START_TIME.prometheus}|{I.RUNS.prometheus}"}}'
    return label_variable("job", jobs).current(VariableOption(text=job, value=job, selected=True))


def run_metric_variable() -> QueryVariable:
    return label_variable("intent", I.RUNS.prometheus).query(f"label_values({I.RUNS.prometheus}{{{JOB}}}, intent)")
