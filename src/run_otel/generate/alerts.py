"""Prometheus alerting rules, built from the instrument catalogue for one :class:`Stack`.

``run-otel generate`` (and ``scripts/generate.py``, with the defaults) writes them to
``alerts.yml``; a test fails when the committed file differs. The thresholds, the scrape job and
the links come from the ``[generate]`` section, the error-budget burn alerts from ``[slo]``.
"""

from __future__ import annotations

import re

from ..telemetry import instruments as I
from .slo import slo_groups
from .stack import HEALTH_DASHBOARD, RAG_DASHBOARD, RUNS_DASHBOARD, Stack

# The defaults, as the committed files have them.
DEFAULT = Stack()
THRESHOLDS: dict = DEFAULT.thresholds
# Selects run-otel's own series. The shipped scrape config names the job run-otel.
SELECTOR = DEFAULT.selector

CRITICAL, WARNING, INFO = "critical", "warning", "info"

_SERVICE = 'resource.service.name = "diagnosis-agent"'


def since_last_success(selector: str = SELECTOR) -> str:
    """Seconds since each instance's last successful poll, or since its start when it never had one."""
    last, started = I.LAST_SUCCESS.prometheus, I.START_TIME.prometheus
    return f"time() - ({last}{{{selector}}} or on (job, instance) {started}{{{selector}}})"


def stalled_expression(selector: str, stall_seconds: float) -> str:
    """Per instance (and so per shard); an HA standby, which does not poll, is left out."""
    standby = f"{I.STANDBY.prometheus}{{{selector}}}"
    return f"({since_last_success(selector)}) > {stall_seconds}\nunless on (job, instance) ({standby} == 1)"


class _Rules:
    """The rules for one stack: every series is selected, and every ratio grouped, by its job."""

    def __init__(self, stack: Stack):
        self.stack, self.selector, self.t = stack, stack.selector, stack.thresholds

    def series(self, name: str, matchers: str = "") -> str:
        return f"{name}{{{', '.join(m for m in (self.selector, matchers) if m)}}}"

    def ratio(self, name: str, matchers: str, by: str = "job", window: str = "") -> str:
        window = window or self.t["window"]
        part, whole = self.series(name, matchers), self.series(name)
        return f"sum by ({by}) (rate({part}[{window}])) / sum by ({by}) (rate({whole}[{window}]))"

    def traffic(self, name: str, by: str = "job", window: str = "") -> str:
        return f"sum by ({by}) (increase({self.series(name)}[{window or self.t['window']}]))"


def _rule(
    r: _Rules,
    alert: str,
    expr: str,
    severity: str,
    summary: str,
    description: str,
    for_: str = "",
    dashboard: str = HEALTH_DASHBOARD,
) -> dict:
    rule: dict = {"alert": alert, "expr": expr}
    if for_:
        rule["for"] = for_
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {
        "summary": summary,
        "description": description,
        "runbook_url": r.stack.runbook_url(alert),
        "dashboard_url": r.stack.dashboard_url(dashboard),
    }
    return rule


def _run_ratio_rule(r: _Rules, alert: str, status: str, threshold: float, what: str, severity: str) -> dict:
    runs = I.RUNS.prometheus
    return _rule(
        r,
        alert,
        f"({r.ratio(runs, f'status={chr(34)}{status}{chr(34)}')}) > {threshold}\nand\n{r.traffic(runs)} >= {r.t['min_runs']}",
        severity,
        f"{{{{ $value | humanizePercentage }}}} of diagnosis runs {what} over {r.t['window']}",
        f"More than {threshold:.0%} of finished diagnosis runs ended {status} for {r.t['for']} "
        f"(at least {r.t['min_runs']} runs per {r.t['window']}). Open the traces: "
        f'TraceQL {{ {_SERVICE} && span.diagnosis.run.status = "{status}" }}, or in Jaeger search '
        f"service=diagnosis-agent with tag diagnosis.run.status={status}. Compare "
        "the RAG retrieval dashboard for a layer that stopped matching.",
        r.t["for"],
        RUNS_DASHBOARD,
    )


def negative_feedback_rule(negative: list[str] | tuple[str, ...], stack: Stack = DEFAULT) -> dict:
    r, feedback = _Rules(stack), I.FEEDBACK.prometheus
    window = r.t["feedback_window"]
    # The PromQL string holds an RE2 pattern: escape for the regex, then for the string.
    labels = "|".join(re.escape(label) for label in negative).replace("\\", "\\\\")
    # One label is an equality matcher, several a regex.
    matcher = f'feedback="{labels}"' if len(negative) == 1 else f'feedback=~"{labels}"'
    return _rule(
        r,
        "DiagnosisNegativeFeedbackHigh",
        f"({r.ratio(feedback, matcher, window=window)}) > {r.t['negative_feedback_ratio']}\nand\n"
        f"{r.traffic(feedback, window=window)} >= {r.t['min_feedback']}",
        INFO,
        f"{{{{ $value | humanizePercentage }}}} of user ratings were negative over {window}",
        f"More than {r.t['negative_feedback_ratio']:.0%} of the ratings users gave ({', '.join(negative)}) "
        f"were negative for {r.t['feedback_for']} (at least {r.t['min_feedback']} ratings per {window}). "
        "The ratings are spans in their runs' traces: "
        f'TraceQL {{ {_SERVICE} && span.gen_ai.evaluation.score.label = "{negative[0]}" }}. '
        "The labels are feedback.negative's: for other labels, set that key and run `run-otel generate` again.",
        r.t["feedback_for"],
        RUNS_DASHBOARD,
    )


def _run_rules(r: _Rules) -> list[dict]:
    tools = I.TOOL_INVOCATIONS.prometheus
    return [
        _run_ratio_rule(r, "DiagnosisRunFailureRateHigh", "FAILED", r.t["run_failure_ratio"], "failed", CRITICAL),
        _run_ratio_rule(r, "DiagnosisRunFallbackRateHigh", "FALLBACK", r.t["run_fallback_ratio"], "fell back", WARNING),
        _rule(
            r,
            "DiagnosisToolErrorRateHigh",
            f"({r.ratio(tools, 'success=' + chr(34) + 'false' + chr(34), 'job, tool_name')}) > {r.t['tool_error_ratio']}\n"
            f"and\n{r.traffic(tools, 'job, tool_name')} >= {r.t['min_tool_calls']}",
            WARNING,
            "Tool {{ $labels.tool_name }} fails {{ $value | humanizePercentage }} of its calls",
            f"More than {r.t['tool_error_ratio']:.0%} of {{{{ $labels.tool_name }}}} calls failed for "
            f"{r.t['for']}. Failing calls are ERROR spans with error.type=tool_error: TraceQL "
            f'{{ {_SERVICE} && span.gen_ai.tool.name = "{{{{ $labels.tool_name }}}}" && status = error }}. '
            'tool_name="other" is every tool past metrics.max_tool_names, counted together '
            f"({I.LABELS_FOLDED.prometheus}): leave the name out of that query to see which one fails.",
            r.t["for"],
            RAG_DASHBOARD,
        ),
        negative_feedback_rule(r.stack.negative, r.stack),
        _rule(
            r,
            "DiagnosisRunsStuckPending",
            # One run is enough: sent as incomplete in the window, or still pending past stuck_seconds.
            f"{r.traffic(I.INCOMPLETE_RUNS.prometheus, window=r.t['stuck_window'])} > 0\n"
            f"or\nmax by (job) ({r.series(I.PENDING_OLDEST.prometheus)}) > {r.t['stuck_seconds']}",
            WARNING,
            "A diagnosis run did not finish: sent as incomplete, or pending too long",
            f"A run was sent as incomplete in the last {r.t['stuck_window']} (still PENDING or RUNNING after "
            f"poll.run_timeout_seconds), or a run has been pending for more than {r.t['stuck_seconds']} s: the agent "
            f"may be stuck. TraceQL {{ {_SERVICE} && span.diagnosis.run.incomplete = true }}.",
            r.t["stuck_for"],
            RUNS_DASHBOARD,
        ),
    ]


def _health_rules(r: _Rules) -> list[dict]:
    backlog = r.series(I.BACKLOG_RUNS.prometheus)
    return [
        _rule(
            r,
            "RunOtelExportStalled",
            stalled_expression(r.selector, r.t["stall_seconds"]),
            CRITICAL,
            "run-otel {{ $labels.instance }} has not completed a poll for {{ $value | humanizeDuration }}",
            "Traces from this instance (or shard) are not reaching Jaeger/Tempo; if it never "
            "succeeded since it started, suspect the first deploy: a password, a grant, the endpoint. "
            "Check run_otel_export_failures_total, `run-otel check`, and the bridge's log for the "
            "database or OTLP error. Nothing is lost: the checkpoint resumes when the cause is fixed.",
            "5m",
        ),
        _rule(
            r,
            "RunOtelBacklogGrowing",
            f"{backlog} > {r.t['backlog_runs']}\nand\nderiv({backlog}[{r.t['backlog_window']}]) > 0",
            WARNING,
            "run-otel {{ $labels.instance }} shard {{ $labels.shard }} is {{ $value }} runs behind and falling further",
            f"More than {r.t['backlog_runs']} run ids wait above the checkpoint and the backlog "
            f"kept growing for {r.t['backlog_for']}: the agent writes faster than this instance exports. "
            "See `run-otel status`, run_otel_lag_seconds and the poll duration; add shards (--shard) "
            "or raise poll.batch_size.",
            r.t["backlog_for"],
        ),
        _rule(
            r,
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
            r,
            "RunOtelSpansRejected",
            f"{r.traffic(I.REJECTED_SPANS.prometheus)} > 0",
            WARNING,
            "The OTLP receiver rejected {{ $value | humanize }} spans from run-otel in the last " + r.t["window"],
            "The receiver acknowledged the requests but refused some spans (OTLP partial_success): those "
            "spans are not in Jaeger/Tempo and are not re-sent. The bridge's log names the receiver's reason; "
            "usually a limit on the receiver (attribute size, spans per trace, ingestion rate).",
        ),
        _rule(
            r,
            "RunOtelSpansDropped",
            f"sum by (job, reason) (increase({r.series(I.DROPPED_SPANS.prometheus)}[{r.t['window']}])) > 0",
            WARNING,
            "run-otel dropped {{ $value | humanize }} spans ({{ $labels.reason }}) in the last " + r.t["window"],
            "run-otel gave up on these spans after splitting the request and cutting the span failed, so "
            "the runs behind them could go on: their traces miss those spans. The bridge's log names the run "
            "and the span; raise the receiver's message size limit or lower export.max_request_bytes.",
        ),
        _rule(
            r,
            "RunOtelCheckpointAheadOfSource",
            f"max by (job, shard) ({r.series(I.CHECKPOINT_AHEAD.prometheus)}) > 0",
            CRITICAL,
            "run-otel's checkpoint (shard {{ $labels.shard }}) is {{ $value }} run ids above the newest run",
            "The source database went backwards (restored from an older backup, or its ids were reset): "
            "new runs reuse ids the checkpoint has passed, and are skipped until an operator acts. Stop the "
            "bridge and run the `run-otel rewind --since …` that its log line and `run-otel check` name.",
            r.t["ahead_for"],
        ),
    ]


def rules(stack: Stack = DEFAULT) -> dict:
    r = _Rules(stack)
    groups = [{"name": "diagnosis-runs", "rules": _run_rules(r)}, {"name": "run-otel", "rules": _health_rules(r)}]
    return {"groups": groups + slo_groups(stack, _SERVICE)}
