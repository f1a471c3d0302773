"""The three Grafana dashboards, built with grafana-foundation-sdk from the instrument catalogue.

Needs the ``dashboards`` extra. ``scripts/generate.py`` writes the JSON into
``dashboards/``; a test fails when the committed files differ from this code.
The RAG and exporter-health dashboards are in ``dashboard_rag`` and ``dashboard_health``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from ..telemetry import instruments as I
from .dashboard_health import health_dashboard
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
    run_metric_variable,
    selector,
    stat_panel,
    thresholds,
)
from .dashboard_rag import rag_dashboard
from .slo_panels import error_budget_panels
from .stack import HEALTH_DASHBOARD, RAG_DASHBOARD, RUNS_DASHBOARD, Stack

INTENT = 'intent=~"$intent"'


def runs_dashboard(stack: Stack) -> Dashboard:
    runs, where = I.RUNS.prometheus, selector(JOB, INTENT)
    finished = f"sum(rate({runs}{where}[{RATE}]))"

    def share(status: str) -> str:
        return f"sum(rate({runs}{selector(JOB, eq('status', status), INTENT)}[{RATE}])) / {finished}"

    duration = I.RUN_DURATION.series("_bucket")
    feedback, tokens = I.FEEDBACK.prometheus, I.RUN_TOKENS.prometheus
    negative = list(stack.negative)
    negative_matcher = eq("feedback", negative[0]) if len(negative) == 1 else f'feedback=~"{"|".join(negative)}"'
    t = stack.thresholds
    failure, fallback = t["run_failure_ratio"], t["run_fallback_ratio"]
    links = [dashboard_link("RAG retrieval", RAG_DASHBOARD), dashboard_link("run-otel exporter health", HEALTH_DASHBOARD)]
    board = (
        base(
            RUNS_DASHBOARD,
            "Diagnosis runs",
            "Outcomes, failure and fallback rate, duration and tokens of the agent's runs.",
            links,
            stack,
        )
        .with_variable(run_metric_variable())
        .with_row(Row("Outcomes"))
        .with_panel(
            stat_panel(
                "Runs / min", "short", "Finished runs exported per minute, all outcomes.", query(f"{finished} * 60"), thresholds()
            ).links(failed_run_links(stack))
        )
        .with_panel(
            stat_panel(
                "Failure rate",
                "percentunit",
                f"Share of finished runs that ended FAILED. Red at {failure:.0%}, the alert's threshold "
                "(the alert also needs 20 runs in 10 minutes and holds for 15).",
                query(share("FAILED")),
                thresholds((failure / 2, YELLOW), (failure, RED)),
            ).links(failed_run_links(stack))
        )
        .with_panel(
            stat_panel(
                "Fallback rate",
                "percentunit",
                f"Share of finished runs that ended FALLBACK. Red at {fallback:.0%}, the alert's threshold.",
                query(share("FALLBACK")),
                thresholds((fallback / 2, YELLOW), (fallback, RED)),
            )
        )
        .with_panel(
            stat_panel(
                "Tokens / min",
                "short",
                "Tokens used by the runs exported, per minute.",
                query(f"sum(rate({tokens}{where}[{RATE}])) * 60"),
                thresholds(),
            )
        )
        .with_panel(
            panel(
                "Runs by outcome",
                "reqps",
                "Finished runs per second by status. The links open the failed runs' traces.",
                query(f"sum by (status) (rate({runs}{where}[{RATE}]))", "{{status}}"),
            ).links(failed_run_links(stack))
        )
        .with_panel(
            panel(
                "Failure and fallback rate",
                "percentunit",
                "Share of finished runs that failed or fell back. Compare "
                "the RAG retrieval dashboard's layer mix at the same time.",
                query(share("FAILED"), "failed"),
                query(share("FALLBACK"), "fallback"),
            ).links(failed_run_links(stack))
        )
        .with_panel(
            panel(
                "Release outcomes by intent",
                "reqps",
                "Finished runs per second by intent and release outcome.",
                query(f"sum by (intent, release_outcome) (rate({runs}{where}[{RATE}]))", "{{intent}} {{release_outcome}}"),
                width=24,
            )
        )
        .with_row(Row("Duration and tokens"))
        .with_panel(
            panel(
                "Run duration percentiles",
                "s",
                "p50, p90 and p99 of total_duration_ms. " + EXEMPLAR_NOTE,
                *(
                    query(f"histogram_quantile({q}, sum by (le) (rate({duration}{where}[{RATE}])))", f"p{int(q * 100)}").exemplar(
                        True
                    )
                    for q in (0.5, 0.9, 0.99)
                ),
            )
        )
        .with_panel(
            panel(
                "Tokens by intent",
                "short",
                "Tokens per minute by intent.",
                query(f"sum by (intent) (rate({tokens}{where}[{RATE}])) * 60", "{{intent}}"),
            )
        )
        .with_row(Row("User feedback"))
        .with_panel(
            panel(
                "Ratings by feedback",
                "short",
                "Ratings per hour by value: each new or changed rating counted once.",
                query(f"sum by (feedback) (rate({feedback}{where}[{RATE}])) * 3600", "{{feedback}}"),
            ).interval("15m")
        )
        .with_panel(
            panel(
                "Negative feedback share",
                "percentunit",
                "Share of ratings in feedback.negative. Ratings are sparse, so each point covers at least 15 minutes; "
                f"the alert looks at {t['feedback_window']} and needs {t['min_feedback']} ratings.",
                query(
                    f"sum(rate({feedback}{selector(JOB, negative_matcher, INTENT)}[{RATE}])) "
                    f"/ sum(rate({feedback}{where}[{RATE}]))",
                    "negative",
                ),
            ).interval("15m")
        )
    )
    return error_budget_panels(board, stack)


DASHBOARDS: dict[str, Callable[[Stack], Dashboard]] = {
    "diagnosis-runs.json": runs_dashboard,
    "rag-retrieval.json": rag_dashboard,
    "exporter-health.json": health_dashboard,
}


def render(factory: Callable[[Stack], Any], stack: Stack) -> str:
    return JSONEncoder(sort_keys=True, indent=2).encode(factory(stack).build()) + "\n"
