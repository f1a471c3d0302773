"""Prometheus alerting rules, built from the instrument catalogue.

``scripts/generate.py`` writes them to ``config/prometheus/alerts.yml``; a
test fails when the committed file differs. Change a threshold in
:data:`THRESHOLDS`, the scrape job's selector or the links in :data:`LINKS`,
and regenerate.
"""

from __future__ import annotations

import re

from ..config import FeedbackConfig
from ..telemetry import instruments as I

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
    # the checkpoint above the newest run, held this long: a deleted newest run clears within it
    "ahead_for": "5m",
}

# Where an alert's links point. The runbook is docs/runbook.md of this repository: set
# runbook to where your copy is served (e.g. its page on your Git host) and regenerate.
LINKS: dict = {
    "runbook": "docs/runbook.md",
    "grafana": "http://localhost:3000",
}

# Selects run-otel's own series. The shipped scrape config names the job run-otel.
SELECTOR = f'job="{I.JOB}"'

HEALTH_DASHBOARD, RUNS_DASHBOARD, RAG_DASHBOARD = "run-otel-health", "run-otel-runs", "run-otel-rag"
CRITICAL, WARNING, INFO = "critical", "warning", "info"

_SERVICE = 'resource.service.name = "diagnosis-agent"'


def since_last_success(selector: str = SELECTOR) -> str:
    """Seconds since each instance's last successful poll, or since its start when it never had one."""
    last, started = I.LAST_SUCCESS.prometheus, I.START_TIME.prometheus
    return f"time() - ({last}{{{selector}}} or on (job, instance) {started}{{{selector}}})"


def stalled_expression(selector: str = SELECTOR) -> str:
    """Per instance (and so per shard); an HA standby, which does not poll, is left out."""
    standby = f"{I.STANDBY.prometheus}{{{selector}}}"
    return f"({since_last_success(selector)}) > {THRESHOLDS['stall_seconds']}\nunless on (job, instance) ({standby} == 1)"


class _Rules:
    """The rules for one job selector: every series is selected, and every ratio grouped, by job."""

    def __init__(self, selector: str):
        self.selector = selector

    def series(self, name: str, matchers: str = "") -> str:
        return f"{name}{{{', '.join(m for m in (self.selector, matchers) if m)}}}"

    def ratio(self, name: str, matchers: str, by: str = "job", window: str = "") -> str:
        window = window or THRESHOLDS["window"]
        part, whole = self.series(name, matchers), self.series(name)
        return f"sum by ({by}) (rate({part}[{window}])) / sum by ({by}) (rate({whole}[{window}]))"

    def traffic(self, name: str, by: str = "job", window: str = "") -> str:
        return f"sum by ({by}) (increase({self.series(name)}[{window or THRESHOLDS['window']}]))"


def _rule(
    alert: str, expr: str, severity: str, summary: str, description: str, for_: str = "", dashboard: str = HEALTH_DASHBOARD
) -> dict:
    rule: dict = {"alert": alert, "expr": expr}
    if for_:
        rule["for"] = for_
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {
        "summary": summary,
        "description": description,
        "runbook_url": f"{LINKS['runbook']}#{alert.lower()}",
        "dashboard_url": f"{LINKS['grafana']}/d/{dashboard}",
    }
    return rule


def _run_ratio_rule(r: _Rules, alert: str, status: str, threshold: float, what: str, severity: str) -> dict:
    runs = I.RUNS.prometheus
    return _rule(
        alert,
        f"({r.ratio(runs, f'status={chr(34)}{status}{chr(34)}')}) > "
        f"{threshold}\nand\n{r.traffic(runs)} >= {THRESHOLDS['min_runs']}",
        severity,
        f"{{{{ $value | humanizePercentage }}}} of diagnosis runs {what} over {THRESHOLDS['window']}",
        f"More than {threshold:.0%} of finished diagnosis runs ended {status} for {THRESHOLDS['for']} "
        f"(at least {THRESHOLDS['min_runs']} runs per {THRESHOLDS['window']}). Open the traces: "
        f'TraceQL {{ {_SERVICE} && span.diagnosis.run.status = "{status}" }}, or in Jaeger search '
        f"service=diagnosis-agent with tag diagnosis.run.status={status}. Compare "
        "the RAG retrieval dashboard for a layer that stopped matching.",
        THRESHOLDS["for"],
        RUNS_DASHBOARD,
    )


def negative_feedback_rule(negative: list[str], selector: str = SELECTOR) -> dict:
    r, feedback, window = _Rules(selector), I.FEEDBACK.prometheus, THRESHOLDS["feedback_window"]
    # The PromQL string holds an RE2 pattern: escape for the regex, then for the string.
    labels = "|".join(re.escape(label) for label in negative).replace("\\", "\\\\")
    # One label is an equality matcher, several a regex.
    matcher = f'feedback="{labels}"' if len(negative) == 1 else f'feedback=~"{labels}"'
    return _rule(
        "DiagnosisNegativeFeedbackHigh",
        f"({r.ratio(feedback, matcher, window=window)}) > {THRESHOLDS['negative_feedback_ratio']}\nand\n"
        f"{r.traffic(feedback, window=window)} >= {THRESHOLDS['min_feedback']}",
        INFO,
        f"{{{{ $value | humanizePercentage }}}} of user ratings were negative over {window}",
        f"More than {THRESHOLDS['negative_feedback_ratio']:.0%} of the ratings users gave ({', '.join(negative)}) "
        f"were negative for {THRESHOLDS['feedback_for']} (at least {THRESHOLDS['min_feedback']} ratings per {window}). "
        "The ratings are spans in their runs' traces: "
        f'TraceQL {{ {_SERVICE} && span.gen_ai.evaluation.score.label = "{negative[0]}" }}. '
        "The labels come from feedback.negative's default: for other labels, set that key and regenerate.",
        THRESHOLDS["feedback_for"],
        RUNS_DASHBOARD,
    )


def _run_rules(r: _Rules) -> list[dict]:
    tools = I.TOOL_INVOCATIONS.prometheus
    return [
        _run_ratio_rule(r, "DiagnosisRunFailureRateHigh", "FAILED", THRESHOLDS["run_failure_ratio"], "failed", CRITICAL),
        _run_ratio_rule(r, "DiagnosisRunFallbackRateHigh", "FALLBACK", THRESHOLDS["run_fallback_ratio"], "fell back", WARNING),
        _rule(
            "DiagnosisToolErrorRateHigh",
            f"({r.ratio(tools, 'success=' + chr(34) + 'false' + chr(34), 'job, tool_name')}) > {THRESHOLDS['tool_error_ratio']}\n"
            f"and\n{r.traffic(tools, 'job, tool_name')} >= {THRESHOLDS['min_tool_calls']}",
            WARNING,
            "Tool {{ $labels.tool_name }} fails {{ $value | humanizePercentage }} of its calls",
            f"More than {THRESHOLDS['tool_error_ratio']:.0%} of {{{{ $labels.tool_name }}}} calls failed for "
            f"{THRESHOLDS['for']}. Failing calls are ERROR spans with error.type=tool_error: TraceQL "
            f'{{ {_SERVICE} && span.gen_ai.tool.name = "{{{{ $labels.tool_name }}}}" && status = error }}.',
            THRESHOLDS["for"],
            RAG_DASHBOARD,
        ),
        negative_feedback_rule(FeedbackConfig().negative, r.selector),
        _rule(
            "DiagnosisRunsStuckPending",
            f"max by (job) ({r.series(I.PENDING_RUNS.prometheus)}) > {THRESHOLDS['pending_runs']}",
            WARNING,
            "{{ $value }} diagnosis runs have been waiting to finish",
            f"More than {THRESHOLDS['pending_runs']} runs stayed PENDING or RUNNING for "
            f"{THRESHOLDS['stuck_for']}: the agent may be stuck. They are exported as incomplete "
            f"after poll.run_timeout_seconds: TraceQL {{ {_SERVICE} && span.diagnosis.run.incomplete = true }}.",
            THRESHOLDS["stuck_for"],
            RUNS_DASHBOARD,
        ),
    ]


def _health_rules(r: _Rules) -> list[dict]:
    backlog = r.series(I.BACKLOG_RUNS.prometheus)
    return [
        _rule(
            "RunOtelExportStalled",
            stalled_expression(r.selector),
            CRITICAL,
            "run-otel {{ $labels.instance }} has not completed a poll for {{ $value | humanizeDuration }}",
            "Traces from this instance (or shard) are not reaching Jaeger/Tempo; if it never "
            "succeeded since it started, suspect the first deploy: a password, a grant, the endpoint. "
            "Check run_otel_export_failures_total, `run-otel check`, and the bridge's log for the "
            "database or OTLP error. Nothing is lost: the checkpoint resumes when the cause is fixed.",
            "5m",
        ),
        _rule(
            "RunOtelBacklogGrowing",
            f"{backlog} > {THRESHOLDS['backlog_runs']}\nand\nderiv({backlog}[{THRESHOLDS['backlog_window']}]) > 0",
            WARNING,
            "run-otel {{ $labels.instance }} shard {{ $labels.shard }} is {{ $value }} runs behind and falling further",
            f"More than {THRESHOLDS['backlog_runs']} run ids wait above the checkpoint and the backlog "
            f"kept growing for {THRESHOLDS['backlog_for']}: the agent writes faster than this instance exports. "
            "See `run-otel status`, run_otel_lag_seconds and the poll duration; add shards (--shard) "
            "or raise poll.batch_size.",
            THRESHOLDS["backlog_for"],
        ),
        _rule(
            "RunOtelDown",
            f"up{{{r.selector}}} == 0 or absent(up{{{r.selector}}})",
            CRITICAL,
            "run-otel is down or not scraped",
            "Prometheus cannot scrape run-otel's /metrics. Runs keep accumulating in the "
            "database and will be exported from the checkpoint once it is back; "
            "see /healthz and /readyz on the metrics port.",
            "5m",
        ),
        _rule(
            "RunOtelSpansRejected",
            f"{r.traffic(I.REJECTED_SPANS.prometheus)} > 0",
            WARNING,
            "The OTLP receiver rejected {{ $value | humanize }} spans from run-otel in the last " + THRESHOLDS["window"],
            "The receiver acknowledged the requests but refused some spans (OTLP partial_success): those "
            "spans are not in Jaeger/Tempo and are not re-sent. The bridge's log names the receiver's reason; "
            "usually a limit on the receiver (attribute size, spans per trace, ingestion rate).",
        ),
        _rule(
            "RunOtelSpansDropped",
            f"sum by (job, reason) (increase({r.series(I.DROPPED_SPANS.prometheus)}[{THRESHOLDS['window']}])) > 0",
            WARNING,
            "run-otel dropped {{ $value | humanize }} spans ({{ $labels.reason }}) in the last " + THRESHOLDS["window"],
            "run-otel gave up on these spans after splitting the request and cutting the span failed, so "
            "the runs behind them could go on: their traces miss those spans. The bridge's log names the run "
            "and the span; raise the receiver's message size limit or lower export.max_request_bytes.",
        ),
        _rule(
            "RunOtelCheckpointAheadOfSource",
            f"max by (job, shard) ({r.series(I.CHECKPOINT_AHEAD.prometheus)}) > 0",
            CRITICAL,
            "run-otel's checkpoint (shard {{ $labels.shard }}) is {{ $value }} run ids above the newest run",
            "The source database went backwards (restored from an older backup, or its ids were reset): "
            "new runs reuse ids the checkpoint has passed, and are skipped until an operator acts. Stop the "
            "bridge and run the `run-otel rewind --since …` that its log line and `run-otel check` name.",
            THRESHOLDS["ahead_for"],
        ),
    ]


def rules(selector: str = SELECTOR) -> dict:
    r = _Rules(selector)
    return {"groups": [{"name": "diagnosis-runs", "rules": _run_rules(r)}, {"name": "run-otel", "rules": _health_rules(r)}]}
