"""Prometheus alerting rules, built from the instrument catalogue.

``scripts/generate.py`` writes them to ``config/prometheus/alerts.yml``; a
test fails when the committed file differs. Change a threshold in
:data:`THRESHOLDS` and regenerate.
"""

from __future__ import annotations

import re

from . import instruments as I
from .config import FeedbackConfig

THRESHOLDS: dict = {
    # share of finished runs, over WINDOW, with at least MIN_RUNS runs in it
    "run_failure_ratio": 0.10,
    "run_fallback_ratio": 0.20,
    "min_runs": 20,
    # share of one tool's calls, with at least MIN_TOOL_CALLS calls of it
    "tool_error_ratio": 0.25,
    "min_tool_calls": 20,
    "window": "10m",
    "for": "15m",
    # no successful poll for this long (seconds)
    "stall_seconds": 300,
    # run ids not yet exported, and still growing over BACKLOG_WINDOW, held for BACKLOG_FOR
    "backlog_runs": 500,
    "backlog_window": "15m",
    "backlog_for": "15m",
    # share of ratings that are negative (feedback.negative), over FEEDBACK_WINDOW, with at
    # least MIN_FEEDBACK ratings in it: users rate a few runs in a hundred, so a longer window
    "negative_feedback_ratio": 0.30,
    "min_feedback": 10,
    "feedback_window": "1h",
    "feedback_for": "30m",
    # runs waiting to finish, held for STUCK_FOR
    "pending_runs": 100,
    "stuck_for": "30m",
}

_SERVICE = 'resource.service.name = "diagnosis-agent"'


def _ratio(selector: str, by: str = "") -> str:
    """sum(rate(x{selector})) / sum(rate(x)), grouped ``by`` when given."""
    group = f" by ({by})" if by else ""
    window = THRESHOLDS["window"]
    return f"sum{group}(rate({{name}}{{{{{selector}}}}}[{window}])) / sum{group}(rate({{name}}[{window}]))"


def _traffic(by: str = "") -> str:
    group = f" by ({by})" if by else ""
    return f"sum{group}(increase({{name}}[{THRESHOLDS['window']}]))"


def _run_ratio_rule(alert: str, status: str, threshold: float, what: str) -> dict:
    runs = I.RUNS.prometheus
    ratio = _ratio(f'status="{status}"').format(name=runs)
    traffic = _traffic().format(name=runs)
    return {
        "alert": alert,
        "expr": f"({ratio}) > {threshold}\nand\n{traffic} >= {THRESHOLDS['min_runs']}",
        "for": THRESHOLDS["for"],
        "labels": {"severity": "page" if status == "FAILED" else "ticket"},
        "annotations": {
            "summary": f"{{{{ $value | humanizePercentage }}}} of diagnosis runs {what} over {THRESHOLDS['window']}",
            "description": (
                f"More than {threshold:.0%} of finished diagnosis runs ended {status} for {THRESHOLDS['for']} "
                f"(at least {THRESHOLDS['min_runs']} runs per {THRESHOLDS['window']}). Open the traces: "
                f'TraceQL {{ {_SERVICE} && span.diagnosis.run.status = "{status}" }}, or in Jaeger search '
                f"service=diagnosis-agent with tag diagnosis.run.status={status}. Compare "
                "the RAG retrieval dashboard for a layer that stopped matching."
            ),
        },
    }


def negative_feedback_rule(negative: list[str]) -> dict:
    feedback, window = I.FEEDBACK.prometheus, THRESHOLDS["feedback_window"]
    # The PromQL string holds an RE2 pattern: escape for the regex, then for the string.
    labels = "|".join(re.escape(label) for label in negative).replace("\\", "\\\\")
    ratio = f'sum(rate({feedback}{{feedback=~"{labels}"}}[{window}])) / sum(rate({feedback}[{window}]))'
    return {
        "alert": "DiagnosisNegativeFeedbackHigh",
        "expr": f"({ratio}) > {THRESHOLDS['negative_feedback_ratio']}\nand\nsum(increase({feedback}[{window}])) >= {THRESHOLDS['min_feedback']}",
        "for": THRESHOLDS["feedback_for"],
        "labels": {"severity": "ticket"},
        "annotations": {
            "summary": f"{{{{ $value | humanizePercentage }}}} of user ratings were negative over {window}",
            "description": (
                f"More than {THRESHOLDS['negative_feedback_ratio']:.0%} of the ratings users gave ({', '.join(negative)}) "
                f"were negative for {THRESHOLDS['feedback_for']} (at least {THRESHOLDS['min_feedback']} ratings per {window}). "
                f'The ratings are spans in their runs\' traces: TraceQL {{ {_SERVICE} && span.gen_ai.evaluation.score.label = "{negative[0]}" }}. '
                "The labels come from feedback.negative's default: for other labels, set that key and edit this regex to match."
            ),
        },
    }


def since_last_success() -> str:
    """Seconds since each instance's last successful poll, or since its start when it never had one."""
    last, started = I.LAST_SUCCESS.prometheus, I.START_TIME.prometheus
    return f"time() - ({last} or on (job, instance) {started})"


def stalled_expression() -> str:
    """Per instance (and so per shard); an HA standby, which does not poll, is left out."""
    return f"({since_last_success()}) > {THRESHOLDS['stall_seconds']}\nunless on (job, instance) ({I.STANDBY.prometheus} == 1)"


def rules() -> dict:
    tools = I.TOOL_INVOCATIONS.prometheus
    tool_ratio = _ratio('success="false"', "tool_name").format(name=tools)
    tool_traffic = _traffic("tool_name").format(name=tools)
    return {
        "groups": [
            {
                "name": "diagnosis-runs",
                "rules": [
                    _run_ratio_rule("DiagnosisRunFailureRateHigh", "FAILED", THRESHOLDS["run_failure_ratio"], "failed"),
                    _run_ratio_rule("DiagnosisRunFallbackRateHigh", "FALLBACK", THRESHOLDS["run_fallback_ratio"], "fell back"),
                    {
                        "alert": "DiagnosisToolErrorRateHigh",
                        "expr": f"({tool_ratio}) > {THRESHOLDS['tool_error_ratio']}\nand\n{tool_traffic} >= {THRESHOLDS['min_tool_calls']}",
                        "for": THRESHOLDS["for"],
                        "labels": {"severity": "ticket"},
                        "annotations": {
                            "summary": "Tool {{ $labels.tool_name }} fails {{ $value | humanizePercentage }} of its calls",
                            "description": (
                                f"More than {THRESHOLDS['tool_error_ratio']:.0%} of {{{{ $labels.tool_name }}}} calls failed for "
                                f"{THRESHOLDS['for']}. Failing calls are ERROR spans with error.type=tool_error: TraceQL "
                                f'{{ {_SERVICE} && span.gen_ai.tool.name = "{{{{ $labels.tool_name }}}}" && status = error }}.'
                            ),
                        },
                    },
                    negative_feedback_rule(FeedbackConfig().negative),
                    {
                        "alert": "DiagnosisRunsStuckPending",
                        "expr": f"max({I.PENDING_RUNS.prometheus}) > {THRESHOLDS['pending_runs']}",
                        "for": THRESHOLDS["stuck_for"],
                        "labels": {"severity": "ticket"},
                        "annotations": {
                            "summary": "{{ $value }} diagnosis runs have been waiting to finish",
                            "description": (
                                f"More than {THRESHOLDS['pending_runs']} runs stayed PENDING or RUNNING for "
                                f"{THRESHOLDS['stuck_for']}: the agent may be stuck. They are exported as incomplete "
                                "after poll.run_timeout_seconds: TraceQL "
                                f"{{ {_SERVICE} && span.diagnosis.run.incomplete = true }}."
                            ),
                        },
                    },
                ],
            },
            {
                "name": "run-otel",
                "rules": [
                    {
                        "alert": "RunOtelExportStalled",
                        "expr": stalled_expression(),
                        "for": "5m",
                        "labels": {"severity": "page"},
                        "annotations": {
                            "summary": "run-otel {{ $labels.instance }} has not completed a poll for {{ $value | humanizeDuration }}",
                            "description": (
                                "Traces from this instance (or shard) are not reaching Jaeger/Tempo; if it never "
                                "succeeded since it started, suspect the first deploy: a password, a grant, the endpoint. "
                                "Check run_otel_export_failures_total, `run-otel check`, and the bridge's log for the "
                                "database or OTLP error. Nothing is lost: the checkpoint resumes when the cause is fixed."
                            ),
                        },
                    },
                    {
                        "alert": "RunOtelBacklogGrowing",
                        "expr": (
                            f"{I.BACKLOG_RUNS.prometheus} > {THRESHOLDS['backlog_runs']}\nand\n"
                            f"deriv({I.BACKLOG_RUNS.prometheus}[{THRESHOLDS['backlog_window']}]) > 0"
                        ),
                        "for": THRESHOLDS["backlog_for"],
                        "labels": {"severity": "ticket"},
                        "annotations": {
                            "summary": "run-otel {{ $labels.instance }} shard {{ $labels.shard }} is {{ $value }} runs behind and falling further",
                            "description": (
                                f"More than {THRESHOLDS['backlog_runs']} run ids wait above the checkpoint and the backlog "
                                f"kept growing for {THRESHOLDS['backlog_for']}: the agent writes faster than this instance exports. "
                                "See `run-otel status`, run_otel_lag_seconds and the poll duration; add shards (--shard) "
                                "or raise poll.batch_size."
                            ),
                        },
                    },
                    {
                        "alert": "RunOtelDown",
                        "expr": f'up{{job="{I.JOB}"}} == 0 or absent(up{{job="{I.JOB}"}})',
                        "for": "5m",
                        "labels": {"severity": "page"},
                        "annotations": {
                            "summary": "run-otel is down or not scraped",
                            "description": (
                                "Prometheus cannot scrape run-otel's /metrics. Runs keep accumulating in the "
                                "database and will be exported from the checkpoint once it is back; "
                                "see /healthz and /readyz on the metrics port."
                            ),
                        },
                    },
                ],
            },
        ]
    }
