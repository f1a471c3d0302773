"""The three Grafana dashboards, built with grafana-foundation-sdk from the instrument catalogue.

Needs the ``dashboards`` extra. ``scripts/generate.py`` writes the JSON into
``dashboards/``; a test fails when the committed files differ from this code.
"""

from __future__ import annotations

import json
from urllib.parse import quote

from grafana_foundation_sdk.builders import bargauge, piechart, prometheus, stat, timeseries
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DashboardLink,
    DatasourceVariable,
    QueryVariable,
    Row,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardLinkType, DataSourceRef, VariableRefresh

from . import instruments as I
from .alerts import since_last_success
from .config import FeedbackConfig

PROMETHEUS = DataSourceRef(type_val="prometheus", uid="${datasource}")
SERVICE = "diagnosis-agent"
RATE = "$__rate_interval"
INTENT = 'intent=~"$intent"'
# The link from an exemplar to its trace is the Prometheus datasource's exemplarTraceIdDestinations.
EXEMPLAR_NOTE = (
    "Each dot is an exemplar: one run (or tool call) in that bucket. Click it to open the trace in the traces datasource."
)


def _query(expr: str, legend: str = "") -> prometheus.Dataquery:
    query = prometheus.Dataquery().expr(expr).datasource(PROMETHEUS).ref_id("A")
    return query.legend_format(legend) if legend else query


def _timeseries(title: str, unit: str, *queries: prometheus.Dataquery, description: str = "") -> timeseries.Panel:
    panel = timeseries.Panel().title(title).unit(unit).datasource(PROMETHEUS).height(8).span(12)
    if description:
        panel = panel.description(description)
    for index, query in enumerate(queries):
        panel = panel.with_target(query.ref_id(chr(ord("A") + index)))
    return panel


def _stat(title: str, unit: str, query: prometheus.Dataquery) -> stat.Panel:
    return stat.Panel().title(title).unit(unit).datasource(PROMETHEUS).height(4).span(6).with_target(query)


def _explore(datasource: str, query: dict) -> str:
    pane = {"a": {"datasource": datasource, "queries": [{"refId": "A", **query}], "range": {"from": "${__from}", "to": "${__to}"}}}
    return "/explore?schemaVersion=1&panes=" + quote(json.dumps(pane, separators=(",", ":")), safe="${}_")


def failed_run_links() -> list:
    """Links from run panels to the failed runs' traces, in Tempo and in Jaeger."""
    traceql = f'{{ resource.service.name = "{SERVICE}" && span.diagnosis.run.status = "FAILED" }}'
    return [
        DashboardLink("Failed runs in Tempo (TraceQL)")
        .type(DashboardLinkType.LINK)
        .url(_explore("${traces}", {"queryType": "traceql", "query": traceql}))
        .target_blank(True),
        DashboardLink("Failed runs in Jaeger")
        .type(DashboardLinkType.LINK)
        .url(_explore("jaeger", {"queryType": "search", "service": SERVICE, "tags": "diagnosis.run.status=FAILED"}))
        .target_blank(True),
    ]


def _base(uid: str, title: str, description: str) -> Dashboard:
    return (
        Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["run-otel", "diagnosis-agent"])
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .editable()
        .with_variable(DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(DatasourceVariable("traces").label("Traces").type("tempo"))
    )


def _intent_variable() -> QueryVariable:
    return (
        QueryVariable("intent")
        .label("Intent")
        .datasource(PROMETHEUS)
        .query(f"label_values({I.RUNS.prometheus}, intent)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
    )


def runs_dashboard() -> Dashboard:
    runs = I.RUNS.prometheus
    finished = f"sum(rate({runs}{{{INTENT}}}[{RATE}]))"
    share = lambda status: f'sum(rate({runs}{{status="{status}",{INTENT}}}[{RATE}])) / {finished}'
    duration = I.RUN_DURATION.series("_bucket")
    feedback = I.FEEDBACK.prometheus
    negative = "|".join(FeedbackConfig().negative)
    return (
        _base("run-otel-runs", "Diagnosis runs", "Outcomes, failure and fallback rate, duration and tokens of the agent's runs.")
        .with_variable(_intent_variable())
        .with_row(Row("Outcomes"))
        .with_panel(_stat("Runs / min", "short", _query(f"{finished} * 60")).links(failed_run_links()))
        .with_panel(_stat("Failure rate", "percentunit", _query(share("FAILED"))).links(failed_run_links()))
        .with_panel(_stat("Fallback rate", "percentunit", _query(share("FALLBACK"))))
        .with_panel(_stat("Tokens / min", "short", _query(f"sum(rate({I.RUN_TOKENS.prometheus}{{{INTENT}}}[{RATE}])) * 60")))
        .with_panel(
            _timeseries(
                "Runs by outcome",
                "reqps",
                _query(f"sum by (status) (rate({runs}{{{INTENT}}}[{RATE}]))", "{{status}}"),
            ).links(failed_run_links())
        )
        .with_panel(
            _timeseries(
                "Failure and fallback rate",
                "percentunit",
                _query(share("FAILED"), "failed"),
                _query(share("FALLBACK"), "fallback"),
            ).links(failed_run_links())
        )
        .with_panel(
            _timeseries(
                "Release outcomes by intent",
                "reqps",
                _query(f"sum by (intent, release_outcome) (rate({runs}{{{INTENT}}}[{RATE}]))", "{{intent}} {{release_outcome}}"),
            )
        )
        .with_row(Row("Duration and tokens"))
        .with_panel(
            _timeseries(
                "Run duration percentiles",
                "s",
                *(
                    _query(f"histogram_quantile({q}, sum by (le) (rate({duration}{{{INTENT}}}[{RATE}])))", f"p{int(q * 100)}")
                    .exemplar(True)
                    for q in (0.5, 0.9, 0.99)
                ),
                description=EXEMPLAR_NOTE,
            )
        )
        .with_panel(
            _timeseries(
                "Tokens by intent",
                "short",
                _query(f"sum by (intent) (rate({I.RUN_TOKENS.prometheus}{{{INTENT}}}[{RATE}])) * 60", "{{intent}}"),
                description="Tokens per minute.",
            )
        )
        .with_row(Row("User feedback"))
        .with_panel(
            _timeseries(
                "Ratings by feedback",
                "short",
                _query(f"sum by (feedback) (increase({feedback}{{{INTENT}}}[{RATE}]))", "{{feedback}}"),
                description="Ratings users gave, by value: each new or changed rating counted once.",
            )
        )
        .with_panel(
            _timeseries(
                "Negative feedback share",
                "percentunit",
                _query(
                    f'sum(rate({feedback}{{feedback=~"{negative}",{INTENT}}}[1h])) / sum(rate({feedback}{{{INTENT}}}[1h]))',
                    "negative",
                ),
                description="Share of ratings in feedback.negative over the last hour, as the alert computes it.",
            )
        )
    )


def rag_dashboard() -> Dashboard:
    tools = I.TOOL_INVOCATIONS.prometheus
    retrieval = 'retrieval_layer!="none"'
    duration = I.TOOL_DURATION.series("_bucket")
    return (
        _base("run-otel-rag", "RAG retrieval", "How the agent's L0/L1 retrieval layers behave: matches, relevance, dedup, errors.")
        .with_row(Row("Layers"))
        .with_panel(
            _timeseries(
                "Invocations by retrieval layer",
                "reqps",
                _query(f"sum by (retrieval_layer) (rate({tools}{{{retrieval}}}[{RATE}]))", "{{retrieval_layer}}"),
            )
        )
        .with_panel(
            _timeseries(
                "Matches per call by layer",
                "short",
                _query(
                    f"sum by (layer) (rate({I.RAG_MATCHES.prometheus}[{RATE}])) / scalar(sum(rate({tools}{{{retrieval}}}[{RATE}])))",
                    "{{layer}}",
                ),
                description="Average L0 and L1 matches per retrieval call.",
            )
        )
        .with_panel(
            piechart.Panel()
            .title("Relevance mix")
            .datasource(PROMETHEUS)
            .height(8)
            .span(8)
            .with_target(_query(f"sum by (relevance_level) (increase({tools}{{{retrieval}}}[$__range]))", "{{relevance_level}}").instant())
        )
        .with_panel(
            bargauge.Panel()
            .title("Dedup reasons")
            .datasource(PROMETHEUS)
            .height(8)
            .span(8)
            .with_target(_query(f"sum by (dedup_reason) (increase({I.DEDUP.prometheus}[$__range]))", "{{dedup_reason}}").instant())
        )
        .with_panel(
            _stat(
                "Zero-match share",
                "percentunit",
                _query(f"sum(rate({I.ZERO_MATCH.prometheus}[{RATE}])) / sum(rate({tools}{{{retrieval}}}[{RATE}]))"),
            ).span(8).height(8)
        )
        .with_row(Row("Tools"))
        .with_panel(
            _timeseries(
                "Error rate per tool",
                "percentunit",
                _query(
                    f'sum by (tool_name) (rate({tools}{{success="false"}}[{RATE}])) / sum by (tool_name) (rate({tools}[{RATE}]))',
                    "{{tool_name}}",
                ),
            ).links(failed_run_links())
        )
        .with_panel(
            _timeseries(
                "Tool duration p90",
                "s",
                _query(f"histogram_quantile(0.9, sum by (le, tool_name) (rate({duration}[{RATE}])))", "{{tool_name}}")
                .exemplar(True),
                description=EXEMPLAR_NOTE,
            )
        )
    )


def health_dashboard() -> Dashboard:
    delay = I.EXPORT_DELAY.series("_bucket")
    poll = I.POLL_DURATION.series("_bucket")
    return (
        _base("run-otel-health", "run-otel exporter health", "Is the bridge keeping up? Lag, pending runs, failures, last success.")
        .with_row(Row("Health"))
        .with_panel(_stat("Up", "short", _query(f'sum(up{{job="{I.JOB}"}})')))
        .with_panel(_stat("Since last successful poll", "s", _query(f"time() - max({I.LAST_SUCCESS.prometheus})")))
        .with_panel(_stat("Pending runs", "short", _query(f"max({I.PENDING_RUNS.prometheus})")))
        .with_panel(_stat("HA standbys", "short", _query(f"sum({I.STANDBY.prometheus})")))
        .with_panel(_stat("Export failures (1h)", "short", _query(f"sum(increase({I.EXPORT_FAILURES.prometheus}[1h]))")))
        .with_panel(
            _timeseries(
                "Since last successful poll, per instance",
                "s",
                _query(since_last_success(), "{{instance}}"),
                description="One line per instance or shard, counted from its start when it never succeeded; "
                "the alert RunOtelExportStalled fires per line.",
            )
        )
        .with_panel(
            _timeseries(
                "Backlog per shard",
                "short",
                _query(I.BACKLOG_RUNS.prometheus, "{{instance}} {{shard}} runs"),
                description="Run ids above the checkpoint after each poll; run_otel_lag_seconds is the same gap in time.",
            )
        )
        .with_panel(_timeseries("Lag per shard", "s", _query(I.LAG.prometheus, "{{instance}} {{shard}}")))
        .with_panel(
            _timeseries(
                "Spans exported and rejected",
                "short",
                _query(f"sum(rate({I.EXPORTED_SPANS.prometheus}[{RATE}]))", "exported/s"),
                _query(f"sum(rate({I.REJECTED_SPANS.prometheus}[{RATE}]))", "rejected/s"),
            )
        )
        .with_panel(
            _timeseries(
                "Export delay (settled to acknowledged)",
                "s",
                *(
                    _query(f"histogram_quantile({q}, sum by (le) (rate({delay}[{RATE}])))", f"p{int(q * 100)}")
                    for q in (0.5, 0.95)
                ),
            )
        )
        .with_panel(
            _timeseries(
                "Poll duration p95",
                "s",
                _query(f"histogram_quantile(0.95, sum by (le, outcome) (rate({poll}[{RATE}])))", "{{outcome}}"),
            )
        )
        .with_panel(
            _timeseries(
                "Bad-row warnings and export failures",
                "short",
                _query(f"sum(increase({I.ROW_WARNINGS.prometheus}[{RATE}]))", "row warnings"),
                _query(f"sum(increase({I.EXPORT_FAILURES.prometheus}[{RATE}]))", "export failures"),
            )
        )
    )


DASHBOARDS = {
    "diagnosis-runs.json": runs_dashboard,
    "rag-retrieval.json": rag_dashboard,
    "exporter-health.json": health_dashboard,
}


def render(factory) -> str:
    return JSONEncoder(sort_keys=True, indent=2).encode(factory().build()) + "\n"
