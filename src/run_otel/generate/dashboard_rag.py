"""The RAG retrieval dashboard: how the agent's L0/L1 layers behave over time, beside the
runs' failure and fallback rate, with tool latency by tool and by layer."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from ..telemetry import instruments as I
from .dashboard_kit import (
    EXEMPLAR_NOTE,
    JOB,
    RATE,
    RED,
    YELLOW,
    base,
    dashboard_link,
    eq,
    failed_run_links,
    panel,
    query,
    selector,
    stacked,
    stat_panel,
    thresholds,
    trace_search_links,
)
from .stack import HEALTH_DASHBOARD, RAG_DASHBOARD, RUNS_DASHBOARD, Stack

TOOLS = I.TOOL_INVOCATIONS.prometheus
RETRIEVAL = selector(JOB, 'retrieval_layer!="none"')


def _calls(by: str, where: str = RETRIEVAL) -> str:
    return f"sum by ({by}) (rate({TOOLS}{where}[{RATE}]))" if by else f"sum(rate({TOOLS}{where}[{RATE}]))"


def _layer_panels(d: Dashboard, stack: Stack) -> Dashboard:
    runs = I.RUNS.prometheus
    finished = f"sum(rate({runs}{selector(JOB)}[{RATE}]))"
    zero = f"sum(rate({I.ZERO_MATCH.prometheus}{selector(JOB)}[{RATE}]))"
    return (
        d.with_row(Row("Layers"))
        .with_panel(
            stacked(
                "Layer mix",
                "Share of all tool calls by the retrieval layer that answered: L0, L1, both (L0+L1), or none "
                "(no layer: a tool that does not retrieve, or a retrieval no layer answered). Stacked to 100%; "
                "a band that grows or shrinks is a layer shift.",
                query(
                    f"{_calls('retrieval_layer', selector(JOB))} / ignoring "
                    f"(retrieval_layer) group_left {_calls('', selector(JOB))}",
                    "{{retrieval_layer}}",
                ),
            )
        )
        .with_panel(
            panel(
                "Fallback and failure rate beside retrieval",
                "percentunit",
                "Share of finished runs that fell back or failed, and the share of retrieval calls that matched "
                "nothing, on one axis: a fallback spike that rises with the zero-match line, or with a shift in "
                "the layer mix beside it, is retrieval finding nothing.",
                query(f"sum(rate({runs}{selector(JOB, eq('status', 'FALLBACK'))}[{RATE}])) / {finished}", "fallback"),
                query(f"sum(rate({runs}{selector(JOB, eq('status', 'FAILED'))}[{RATE}])) / {finished}", "failed"),
                query(f"{zero} / {_calls('')}", "retrieval matched nothing"),
            ).links(failed_run_links(stack))
        )
        .with_panel(
            panel(
                "Zero-match share by layer",
                "percentunit",
                "Share of each layer's retrieval calls that matched nothing (l0_match_count and l1_match_count both 0). "
                "A layer whose line climbs has stopped finding documents: an empty or stale index.",
                query(
                    f"sum by (retrieval_layer) (rate({I.ZERO_MATCH.prometheus}{selector(JOB)}[{RATE}])) "
                    f"/ {_calls('retrieval_layer')}",
                    "{{retrieval_layer}}",
                ),
            )
        )
        .with_panel(
            panel(
                "Matches per call by layer",
                "short",
                "Average L0 and L1 matches per retrieval call (rag_matches_total over retrieval calls). "
                "Fewer L0 matches with more L1 ones is the agent leaning on the slower layer.",
                query(
                    f"sum by (layer) (rate({I.RAG_MATCHES.prometheus}{selector(JOB)}[{RATE}])) "
                    f"/ ignoring (layer) group_left {_calls('')}",
                    "{{layer}}",
                ),
            )
        )
        .with_panel(
            stat_panel(
                "Zero-match share",
                "percentunit",
                "Share of retrieval calls, all layers, that matched nothing. Yellow from 20%, red from 50%.",
                query(f"{zero} / {_calls('')}"),
                thresholds((0.2, YELLOW), (0.5, RED)),
            ).span(6)
        )
        .with_panel(
            stat_panel(
                "Retrieval calls / min",
                "short",
                "Tool calls that used a retrieval layer, per minute.",
                query(f"{_calls('')} * 60"),
                thresholds(),
            ).span(6)
        )
        .with_panel(
            panel(
                "Retrieval calls by layer",
                "reqps",
                "Retrieval calls per second by layer: the volume behind the shares above.",
                query(_calls("retrieval_layer"), "{{retrieval_layer}}"),
            ).height(4)
        )
    )


def _quality_panels(d: Dashboard) -> Dashboard:
    return (
        d.with_row(Row("Relevance and dedup"))
        .with_panel(
            stacked(
                "Relevance levels by layer",
                "Within each layer, the share of retrieval calls at each relevance level, stacked per layer. "
                "Read one layer's bands: a PRECISE band that thins over time is a relevance regression "
                "that a pie over the whole range would hide.",
                query(
                    f"{_calls('retrieval_layer, relevance_level')} / ignoring "
                    f"(relevance_level) group_left {_calls('retrieval_layer')}",
                    "{{retrieval_layer}} {{relevance_level}}",
                ),
            )
        )
        .with_panel(
            panel(
                "Dedup reasons over time",
                "short",
                "Deduplicated retrievals per minute by dedup_reason: a retrieval skipped because its result was "
                "already in the run. A new reason, or one that jumps, is worth a look at the traces.",
                query(f"sum by (dedup_reason) (rate({I.DEDUP.prometheus}{selector(JOB)}[{RATE}])) * 60", "{{dedup_reason}}"),
            )
        )
    )


def _tool_panels(d: Dashboard, stack: Stack) -> Dashboard:
    duration = I.TOOL_DURATION.series("_bucket")
    where = selector(JOB)
    quantiles = (0.5, 0.95, 0.99)
    return (
        d.with_row(Row("Tools"))
        .with_panel(
            panel(
                "Tool latency by tool",
                "s",
                "p50, p95 and p99 of each tool's duration_ms. " + EXEMPLAR_NOTE,
                *(
                    query(
                        f"histogram_quantile({q}, sum by (le, tool_name) (rate({duration}{where}[{RATE}])))",
                        f"{{{{tool_name}}}} p{int(q * 100)}",
                    ).exemplar(True)
                    for q in quantiles
                ),
            )
        )
        .with_panel(
            panel(
                "Tool latency by layer",
                "s",
                "p50, p95 and p99 of tool duration by the retrieval layer that answered (none: no layer). "
                "L1 should sit above L0; an L0 line rising towards it is the fast layer slowing down. " + EXEMPLAR_NOTE,
                *(
                    query(
                        f"histogram_quantile({q}, sum by (le, retrieval_layer) (rate({duration}{where}[{RATE}])))",
                        f"{{{{retrieval_layer}}}} p{int(q * 100)}",
                    ).exemplar(True)
                    for q in quantiles
                ),
            )
        )
        .with_panel(
            panel(
                "Error rate per tool",
                "percentunit",
                f"Share of each tool's calls that failed; the alert fires above {stack.thresholds['tool_error_ratio']:.0%} "
                "with 20 calls in 10 minutes. The links open failed runs' traces.",
                query(
                    f"sum by (tool_name) (rate({TOOLS}{selector(JOB, eq('success', 'false'))}[{RATE}])) "
                    f"/ {_calls('tool_name', where)}",
                    "{{tool_name}}",
                ),
                width=24,
            ).links(failed_run_links(stack))
        )
    )


def rag_dashboard(stack: Stack) -> Dashboard:
    links = [
        dashboard_link("Diagnosis runs", RUNS_DASHBOARD),
        dashboard_link("run-otel exporter health", HEALTH_DASHBOARD),
        *trace_search_links(stack),
    ]
    d = base(
        RAG_DASHBOARD,
        "RAG retrieval",
        "How the agent's L0/L1 retrieval layers behave: mix, matches, relevance, dedup, latency.",
        links,
        stack,
    )
    return _tool_panels(_quality_panels(_layer_panels(d, stack)), stack)
