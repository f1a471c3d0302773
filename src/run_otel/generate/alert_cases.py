"""The promtool unit tests of the alert rules: each alert fires on a sustained breach and
stays silent on low traffic and on a spike shorter than its `for:`.

``scripts/generate.py`` writes them with the rules, as ``config/prometheus/alerts_test.yml``,
so an SRE who changes a threshold runs ``promtool test rules alerts_test.yml`` without pytest.
"""

from __future__ import annotations

from .slo_cases import SLO_ALERT, slo_annotations, slo_scenarios
from .stack import Stack

DEFAULT = Stack()

# Every series carries the labels Prometheus adds to run-otel's scrape; the rules select on job.
RUNS = 'diagnosis_runs_total{{job="run-otel",instance="a:9464",status="{status}",intent="DIAGNOSIS",release_outcome="{status}"}}'
LABELS = '{}{{job="run-otel",instance="{}"}}'
BACKLOG = 'run_otel_backlog_runs{job="run-otel",instance="a:9464",shard="default"}'
TOOLS = (
    'diagnosis_tool_invocations_total{{job="run-otel",instance="a:9464",tool_name="{tool}",retrieval_layer="L0",'
    'relevance_level="PRECISE",success="{ok}"}}'
)
FEEDBACK = 'diagnosis_run_feedback_total{{job="run-otel",instance="a:9464",feedback="{label}",intent="DIAGNOSIS"}}'
OLDEST = 'run_otel_pending_oldest_age_seconds{job="run-otel",instance="a:9464"}'
INCOMPLETE = 'run_otel_incomplete_runs_total{job="run-otel",instance="a:9464"}'
REJECTED = 'run_otel_rejected_spans_total{job="run-otel",instance="a:9464"}'
DROPPED = 'run_otel_dropped_spans_total{job="run-otel",instance="a:9464",reason="too_large"}'
AHEAD = 'run_otel_checkpoint_ahead{{job="run-otel",instance="a:9464",shard="{}"}}'
JOB = {"job": "run-otel"}


def ratings(up: str, down: str) -> list[dict]:
    return [{"series": FEEDBACK.format(label="UP"), "values": up}, {"series": FEEDBACK.format(label="DOWN"), "values": down}]


def stuck(incomplete: str, oldest: str) -> list[dict]:
    return [{"series": INCOMPLETE, "values": incomplete}, {"series": OLDEST, "values": oldest}]


STUCK = ({"severity": "warning", **JOB}, "A diagnosis run did not finish: sent as incomplete, or pending too long")


def runs(success: str, other_status: str, other: str) -> list[dict]:
    return [
        {"series": RUNS.format(status="SUCCESS"), "values": success},
        {"series": RUNS.format(status=other_status), "values": other},
    ]


def tools(tool: str, ok: str, failed: str) -> list[dict]:
    return [
        {"series": TOOLS.format(tool=tool, ok="true"), "values": ok},
        {"series": TOOLS.format(tool=tool, ok="false"), "values": failed},
    ]


# (alert, case, input series, eval time, expected: list of (extra labels, summary))
SCENARIOS = [
    # 8 ok + 2 failed a minute: 20% for an hour.
    (
        "DiagnosisRunFailureRateHigh",
        "sustained breach",
        runs("0+8x60", "FAILED", "0+2x60"),
        "40m",
        [({"severity": "critical", **JOB}, "20% of diagnosis runs failed over 10m")],
    ),
    # the same 50% share, but 1 run a minute: under the 20-runs-per-10m guard.
    ("DiagnosisRunFailureRateHigh", "low traffic", runs("0+0.5x60", "FAILED", "0+0.5x60"), "40m", []),
    # 40 failures in two minutes: over the ratio for ~11 minutes, under `for: 15m`.
    ("DiagnosisRunFailureRateHigh", "short spike", runs("0+10x60", "FAILED", "0x20 20 40 40x37"), "30m", []),
    ("DiagnosisRunFailureRateHigh", "healthy", runs("0+10x60", "FAILED", "0+0.2x60"), "40m", []),
    (
        "DiagnosisRunFallbackRateHigh",
        "sustained breach",
        runs("0+6x60", "FALLBACK", "0+4x60"),
        "40m",
        [({"severity": "warning", **JOB}, "40% of diagnosis runs fell back over 10m")],
    ),
    ("DiagnosisRunFallbackRateHigh", "low traffic", runs("0+0.5x60", "FALLBACK", "0+0.5x60"), "40m", []),
    ("DiagnosisRunFallbackRateHigh", "short spike", runs("0+10x60", "FALLBACK", "0x20 30 60 60x37"), "30m", []),
    (
        "DiagnosisToolErrorRateHigh",
        "sustained breach",
        tools("query_logs", "0+5x60", "0+5x60") + tools("lookup_knowledge", "0+10x60", "0x60"),
        "40m",
        [({"severity": "warning", **JOB, "tool_name": "query_logs"}, "Tool query_logs fails 50% of its calls")],
    ),
    # The tools past metrics.max_tool_names count together as "other": their failures still page.
    (
        "DiagnosisToolErrorRateHigh",
        "tools past the bound, as other",
        tools("other", "0+6x60", "0+4x60") + tools("query_logs", "0+10x60", "0x60"),
        "40m",
        [({"severity": "warning", **JOB, "tool_name": "other"}, "Tool other fails 40% of its calls")],
    ),
    ("DiagnosisToolErrorRateHigh", "low traffic", tools("query_logs", "0+0.5x60", "0+0.5x60"), "40m", []),
    ("DiagnosisToolErrorRateHigh", "short spike", tools("query_logs", "0+10x60", "0x20 30 60 60x37"), "30m", []),
    # 3 of 5 ratings a minute are negative, for two hours.
    (
        "DiagnosisNegativeFeedbackHigh",
        "sustained breach",
        ratings("0+2x120", "0+3x120"),
        "100m",
        [({"severity": "info", **JOB}, "60% of user ratings were negative over 1h")],
    ),
    # All negative, but 1 rating in 10 minutes: 6 an hour, under the 10-ratings guard.
    ("DiagnosisNegativeFeedbackHigh", "low traffic", ratings("0x120", "0+0.1x120"), "100m", []),
    ("DiagnosisNegativeFeedbackHigh", "healthy", ratings("0+4x120", "0+1x120"), "100m", []),
    # 100 negative ratings in two minutes: over the ratio from then on, but 19 minutes later
    # still under `for: 30m`.
    ("DiagnosisNegativeFeedbackHigh", "short spike", ratings("0+2x120", "0x20 50 100 100x97"), "40m", []),
    # time() starts at 0 in promtool: a gauge that tracks it is a healthy bridge.
    (
        "RunOtelExportStalled",
        "sustained breach",
        [{"series": LABELS.format("run_otel_last_success_timestamp_seconds", "a:9464"), "values": "0+60x10 600x50"}],
        "25m",
        [
            (
                {"severity": "critical", "job": "run-otel", "instance": "a:9464"},
                "run-otel a:9464 has not completed a poll for 15m 0s",
            )
        ],
    ),
    # Up since 0 with a wrong password: never a success, so no last_success series at all.
    (
        "RunOtelExportStalled",
        "never succeeded",
        [
            {"series": LABELS.format("run_otel_start_timestamp_seconds", "a:9464"), "values": "0x40"},
            {"series": LABELS.format("run_otel_standby", "a:9464"), "values": "0x40"},
        ],
        "15m",
        [
            (
                {"severity": "critical", "job": "run-otel", "instance": "a:9464"},
                "run-otel a:9464 has not completed a poll for 15m 0s",
            )
        ],
    ),
    # Three shards; shard b stops succeeding at 10m. Only b fires.
    (
        "RunOtelExportStalled",
        "one stalled shard of three",
        [
            {"series": LABELS.format("run_otel_last_success_timestamp_seconds", "a:9464"), "values": "0+60x40"},
            {"series": LABELS.format("run_otel_last_success_timestamp_seconds", "b:9464"), "values": "0+60x10 600x30"},
            {"series": LABELS.format("run_otel_last_success_timestamp_seconds", "c:9464"), "values": "0+60x40"},
        ],
        "25m",
        [
            (
                {"severity": "critical", "job": "run-otel", "instance": "b:9464"},
                "run-otel b:9464 has not completed a poll for 15m 0s",
            )
        ],
    ),
    # An HA standby never polls: silent.
    (
        "RunOtelExportStalled",
        "standby",
        [
            {"series": LABELS.format("run_otel_start_timestamp_seconds", "s:9464"), "values": "0x40"},
            {"series": LABELS.format("run_otel_standby", "s:9464"), "values": "1x40"},
        ],
        "25m",
        [],
    ),
    (
        "RunOtelExportStalled",
        "healthy",
        [{"series": LABELS.format("run_otel_last_success_timestamp_seconds", "a:9464"), "values": "0+60x60"}],
        "40m",
        [],
    ),
    (
        "RunOtelExportStalled",
        "short spike",
        [{"series": LABELS.format("run_otel_last_success_timestamp_seconds", "a:9464"), "values": "0+60x10 600x7 1080+60x40"}],
        "25m",
        [],
    ),
    (
        "RunOtelBacklogGrowing",
        "sustained breach",
        [{"series": BACKLOG, "values": "0+50x60"}],
        "40m",
        [
            (
                {"severity": "warning", "job": "run-otel", "instance": "a:9464", "shard": "default"},
                "run-otel a:9464 shard default is 2000 runs behind and falling further",
            )
        ],
    ),
    # Far behind but draining: no page for a backfill that is catching up.
    ("RunOtelBacklogGrowing", "draining", [{"series": BACKLOG, "values": "5000-50x60"}], "40m", []),
    ("RunOtelBacklogGrowing", "short spike", [{"series": BACKLOG, "values": "0x10 0+200x10 2000-200x10 0x30"}], "40m", []),
    ("RunOtelBacklogGrowing", "low", [{"series": BACKLOG, "values": "0+5x60"}], "40m", []),
    (
        "RunOtelDown",
        "sustained breach",
        [{"series": 'up{job="run-otel"}', "values": "1x10 0x30"}],
        "25m",
        [({"severity": "critical", **JOB}, "run-otel is down or not scraped")],
    ),
    (
        "RunOtelDown",
        "never scraped",
        [{"series": 'up{job="other"}', "values": "1x30"}],
        "25m",
        [({"severity": "critical", **JOB}, "run-otel is down or not scraped")],
    ),
    ("RunOtelDown", "short spike", [{"series": 'up{job="run-otel"}', "values": "1x10 0x2 1x30"}], "25m", []),
    ("RunOtelDown", "healthy", [{"series": 'up{job="run-otel"}', "values": "1x40"}], "25m", []),
    # One stuck run is enough: sent as incomplete, or pending past stuck_seconds (1800 s).
    ("DiagnosisRunsStuckPending", "one run sent as incomplete", stuck("0x10 1x50", "0x60"), "20m", [STUCK]),
    ("DiagnosisRunsStuckPending", "one run pending past its window", stuck("0x60", "0+60x60"), "40m", [STUCK]),
    # Pending past stuck_seconds for 2 minutes, then finished: shorter than the `for:`.
    ("DiagnosisRunsStuckPending", "short spike", stuck("0x60", "0+60x32 0x27"), "40m", []),
    ("DiagnosisRunsStuckPending", "none", stuck("0x60", "0x60"), "40m", []),
    # Busy but finishing: runs always in flight, none waiting long.
    ("DiagnosisRunsStuckPending", "busy, every run finishing", stuck("0x60", " ".join(["0+60x4"] * 12)), "40m", []),
    # One oversized reply: 30 spans refused. Any loss is worth a ticket, so no `for:`.
    (
        "RunOtelSpansRejected",
        "sustained breach",
        [{"series": REJECTED, "values": "0x10 30x30"}],
        "15m",
        [({"severity": "warning", **JOB}, "The OTLP receiver rejected 30 spans from run-otel in the last 10m")],
    ),
    ("RunOtelSpansRejected", "healthy", [{"series": REJECTED, "values": "0x40"}], "25m", []),
    # The rejection leaves the 10m window: resolved.
    ("RunOtelSpansRejected", "resolved", [{"series": REJECTED, "values": "0x10 30x30"}], "25m", []),
    # Another job's counter is not run-otel's.
    (
        "RunOtelSpansRejected",
        "other job",
        [{"series": 'run_otel_rejected_spans_total{job="other"}', "values": "0x10 30x30"}],
        "15m",
        [],
    ),
    (
        "RunOtelSpansDropped",
        "sustained breach",
        [{"series": DROPPED, "values": "0x10 2x30"}],
        "15m",
        [({"severity": "warning", **JOB, "reason": "too_large"}, "run-otel dropped 2 spans (too_large) in the last 10m")],
    ),
    ("RunOtelSpansDropped", "healthy", [{"series": DROPPED, "values": "0x40"}], "25m", []),
    ("RunOtelSpansDropped", "resolved", [{"series": DROPPED, "values": "0x10 2x30"}], "25m", []),
    # Restored from a backup 40 ids older; only that shard fires.
    (
        "RunOtelCheckpointAheadOfSource",
        "sustained breach",
        [
            {"series": AHEAD.format("0-of-2"), "values": "0x10 40x30"},
            {"series": AHEAD.format("1-of-2"), "values": "0x40"},
        ],
        "25m",
        [
            (
                {"severity": "critical", **JOB, "shard": "0-of-2"},
                "run-otel's checkpoint (shard 0-of-2) is 40 run ids above the newest run",
            )
        ],
    ),
    # The newest run deleted, and a new one written 2 minutes later: under `for: 5m`.
    (
        "RunOtelCheckpointAheadOfSource",
        "short spike",
        [{"series": AHEAD.format("default"), "values": "0x10 1x2 0x30"}],
        "25m",
        [],
    ),
    ("RunOtelCheckpointAheadOfSource", "healthy", [{"series": AHEAD.format("default"), "values": "0x40"}], "25m", []),
]


# The alerts whose scenarios hold for the built-in thresholds, and the thresholds each depends on.
DEPENDS_ON = {
    "DiagnosisRunFailureRateHigh": {"run_failure_ratio", "min_runs"},
    "DiagnosisRunFallbackRateHigh": {"run_fallback_ratio", "min_runs"},
    "DiagnosisToolErrorRateHigh": {"tool_error_ratio", "min_tool_calls"},
    "DiagnosisNegativeFeedbackHigh": {"negative_feedback_ratio", "min_feedback"},
    "RunOtelExportStalled": {"stall_seconds"},
    "RunOtelBacklogGrowing": {"backlog_runs"},
    "DiagnosisRunsStuckPending": {"stuck_seconds"},
}


def untested(stack: Stack) -> list[str]:
    """The alerts whose built-in scenarios no longer fit the stack's thresholds or feedback labels."""
    changed = stack.changed_thresholds()
    found = {alert for alert, names in DEPENDS_ON.items() if names & changed}
    if tuple(stack.negative[:1]) != ("DOWN",):
        found.add("DiagnosisNegativeFeedbackHigh")  # its scenarios rate with UP and DOWN
    if not slo_scenarios(stack):
        found.add(SLO_ALERT)  # its cases sit on the default objective's budget
    return sorted(found)


def _for_job(value: object, job: str) -> object:
    """A scenario's series and labels with the stack's scrape job for the shipped one."""
    if isinstance(value, str):
        return value.replace('job="run-otel"', f'job="{job}"')
    if isinstance(value, dict):
        return {k: (job if k == "job" and v == "run-otel" else _for_job(v, job)) for k, v in value.items()}
    if isinstance(value, list):
        return [_for_job(v, job) for v in value]
    return value


def promtool_tests(rules: dict, stack: Stack = DEFAULT, rule_file: str = "alerts.yml") -> dict:
    """The promtool test document for ``rules`` (as :func:`run_otel.generate.alerts.rules` returns them)."""
    annotations = {r["alert"]: r["annotations"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    skipped = set(untested(stack))
    tests = []
    for alert, case, series, at, expected in [*SCENARIOS, *slo_scenarios(stack)]:
        if alert in skipped:
            continue
        exp = []
        for labels, summary in expected:
            # The links and the description as the rule has them; only the summary is checked rendered.
            fixed = {k: v.replace("{{ $labels.tool_name }}", labels.get("tool_name", "")) for k, v in annotations[alert].items()}
            if alert == SLO_ALERT:
                fixed = slo_annotations(rules, labels["severity"])
            exp.append({"exp_labels": labels, "exp_annotations": {**fixed, "summary": summary}})
        tests.append(
            _for_job(
                {
                    "name": f"{alert}: {case}",
                    "interval": "1m",
                    "input_series": series,
                    "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": exp}],
                },
                stack.job,
            )
        )
    return {"rule_files": [rule_file], "evaluation_interval": "1m", "tests": tests}
