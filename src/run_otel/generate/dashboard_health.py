"""The exporter-health dashboard: is the bridge keeping up? Every panel shows a value from the
first poll attempt, also on a first deploy whose polls all fail."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from ..telemetry import instruments as I
from .alerts import since_last_success
from .dashboard_kit import (
    BLUE,
    INSTANCE,
    JOB,
    RATE,
    RED,
    SHARD,
    YELLOW,
    base,
    dashboard_link,
    label_variable,
    panel,
    query,
    selector,
    stat_panel,
    thresholds,
)
from .stack import HEALTH_DASHBOARD, RAG_DASHBOARD, RUNS_DASHBOARD, Stack

WHERE = selector(JOB, INSTANCE)
SHARDS = selector(JOB, INSTANCE, SHARD)


def _stats(d: Dashboard, stack: Stack) -> Dashboard:
    t = stack.thresholds
    stall, pending, backlog, stuck = t["stall_seconds"], t["pending_runs"], t["backlog_runs"], t["stuck_seconds"]
    lost = (
        f"sum(increase({I.REJECTED_SPANS.prometheus}{WHERE}[$__range])) "
        f"+ sum(increase({I.DROPPED_SPANS.prometheus}{WHERE}[$__range]))"
    )
    return (
        d.with_row(Row("Health"))
        .with_panel(
            stat_panel(
                "Up",
                "short",
                "Instances Prometheus scrapes successfully. Red at 0: RunOtelDown.",
                query(f"sum(up{WHERE})"),
                thresholds((1, "green"), base=RED),
            )
        )
        .with_panel(
            stat_panel(
                "Since last successful poll",
                "s",
                "The worst instance's time since its last successful poll, counted from its start when it never had one "
                f"(a first deploy with a wrong endpoint). Red at {stall} s: RunOtelExportStalled.",
                query(f"max({since_last_success(WHERE[1:-1])})"),
                thresholds((stall / 5, YELLOW), (stall, RED)),
            )
        )
        .with_panel(
            stat_panel(
                "Pending runs",
                "short",
                "Runs the checkpoint holds as PENDING or RUNNING, from the first poll attempt. "
                f"Red at {pending}: many in flight at once.",
                query(f"max({I.PENDING_RUNS.prometheus}{WHERE})"),
                thresholds((pending / 2, YELLOW), (pending, RED)),
            )
        )
        .with_panel(
            stat_panel(
                "Longest pending run",
                "s",
                "How long the longest-waiting pending run has waited since first seen, worst instance. "
                f"Red at {stuck} s: DiagnosisRunsStuckPending.",
                query(f"max({I.PENDING_OLDEST.prometheus}{WHERE})"),
                thresholds((stuck / 2, YELLOW), (stuck, RED)),
            )
        )
        .with_panel(
            stat_panel(
                "Runs sent incomplete",
                "short",
                "Runs still PENDING or RUNNING after poll.run_timeout_seconds, sent as incomplete in the dashboard's "
                "time range. Red from 1: DiagnosisRunsStuckPending.",
                query(f"sum(increase({I.INCOMPLETE_RUNS.prometheus}{WHERE}[$__range]))"),
                thresholds((1, RED)),
            )
        )
        .with_panel(
            stat_panel(
                "Backlog",
                "short",
                f"Run ids above the checkpoint, all shards, after the last poll attempt. Yellow from {backlog}: "
                "RunOtelBacklogGrowing fires when it also keeps growing.",
                query(f"sum({I.BACKLOG_RUNS.prometheus}{SHARDS})"),
                thresholds((backlog, YELLOW)),
            )
        )
        .with_panel(
            stat_panel(
                "Checkpoint ahead of the source",
                "short",
                "Run ids the checkpoint is above the newest run, worst shard. Over 0 the source went backwards "
                "(restored from a backup): runs are skipped until `run-otel rewind`. RunOtelCheckpointAheadOfSource.",
                query(f"max({I.CHECKPOINT_AHEAD.prometheus}{SHARDS})"),
                thresholds((1, RED)),
            )
        )
        .with_panel(
            stat_panel(
                "Spans rejected or dropped",
                "short",
                "Spans lost in the dashboard's time range: refused by the receiver, or given up by run-otel. "
                "Red from 1: RunOtelSpansRejected, RunOtelSpansDropped.",
                query(lost),
                thresholds((1, RED)),
            )
        )
        .with_panel(
            stat_panel(
                "Export failures",
                "short",
                "Batches the receiver did not acknowledge in the dashboard's time range; each is retried, "
                "nothing is skipped. Yellow from 1.",
                query(f"sum(increase({I.EXPORT_FAILURES.prometheus}{WHERE}[$__range]))"),
                thresholds((1, YELLOW)),
            )
        )
        .with_panel(
            stat_panel(
                "HA standbys",
                "short",
                "Instances waiting for the HA lease; they do not poll, and RunOtelExportStalled leaves them out.",
                query(f"sum({I.STANDBY.prometheus}{WHERE})"),
                thresholds(base=BLUE),
            )
        )
    )


def _series(d: Dashboard, stack: Stack) -> Dashboard:
    delay, poll = I.EXPORT_DELAY.series("_bucket"), I.POLL_DURATION.series("_bucket")
    started, last = I.START_TIME.prometheus, I.LAST_SUCCESS.prometheus
    return (
        d.with_row(Row("Progress"))
        .with_panel(
            panel(
                "Since last successful poll, per instance",
                "s",
                "One line per instance or shard, counted from its start when it never succeeded; "
                f"RunOtelExportStalled fires per line above {stack.thresholds['stall_seconds']} s.",
                query(since_last_success(WHERE[1:-1]), "{{instance}}"),
            )
        )
        .with_panel(
            panel(
                "Export delay (settled to acknowledged)",
                "s",
                "p50, p95 and p99 from a run being settled to its acknowledgement; the buckets reach a week, so "
                "a backfill or a catch-up reads as hours or days. Before the first successful poll there is no "
                "delay to measure: the line 'no successful poll yet' shows the seconds since start instead.",
                *(
                    query(f"histogram_quantile({q}, sum by (le) (rate({delay}{WHERE}[{RATE}])))", f"p{int(q * 100)}")
                    for q in (0.5, 0.95, 0.99)
                ),
                query(f"max(time() - {started}{WHERE}) unless on () max({last}{WHERE})", "no successful poll yet"),
            )
        )
        .with_panel(
            panel(
                "Backlog per shard",
                "short",
                "Run ids above each shard's checkpoint after each poll attempt; Lag per shard is the same gap in time.",
                query(f"{I.BACKLOG_RUNS.prometheus}{SHARDS}", "{{instance}} {{shard}}"),
            )
        )
        .with_panel(
            panel(
                "Lag per shard",
                "s",
                "The newest run's created_at minus the checkpoint run's (the oldest run's before anything was "
                "exported), per shard, from the first poll attempt.",
                query(f"{I.LAG.prometheus}{SHARDS}", "{{instance}} {{shard}}"),
            )
        )
        .with_panel(
            panel(
                "Spans exported, rejected and dropped",
                "cps",
                "Spans per second acknowledged by the receiver, refused by it (partial_success), and given up "
                "by run-otel by reason. Any rejected or dropped span is a ticket.",
                query(f"sum(rate({I.EXPORTED_SPANS.prometheus}{WHERE}[{RATE}]))", "exported"),
                query(f"sum(rate({I.REJECTED_SPANS.prometheus}{WHERE}[{RATE}]))", "rejected"),
                query(f"sum by (reason) (rate({I.DROPPED_SPANS.prometheus}{WHERE}[{RATE}]))", "dropped {{reason}}"),
            )
        )
        .with_panel(
            panel(
                "Checkpoint ahead of the source, per shard",
                "short",
                "0 while the source moves forward. Over 0, the newest run id fell below the checkpoint: "
                "see the runbook's RunOtelCheckpointAheadOfSource for the rewind.",
                query(f"{I.CHECKPOINT_AHEAD.prometheus}{SHARDS}", "{{instance}} {{shard}}"),
            )
        )
        .with_panel(
            panel(
                "Poll duration p95",
                "s",
                "p95 of a whole poll (all its batches), by outcome: ok or "
                "error. Failed polls are measured from the first attempt.",
                query(f"histogram_quantile(0.95, sum by (le, outcome) (rate({poll}{WHERE}[{RATE}])))", "{{outcome}}"),
            )
        )
        .with_panel(
            panel(
                "Bad-row warnings, export failures and late rows",
                "short",
                "Per minute: bad values mapped around in source rows, batches not acknowledged (retried), answers in "
                "which the receiver asked run-otel to slow down (it is sent nothing until the delay it asked for), rows "
                "sent into a trace after its first export (tool rows committed late; runs sent as incomplete that finished), "
                "pending runs deleted from the source before they finished, and values of a bounded label counted as "
                "other (past metrics.max_tool_names or max_dedup_reasons).",
                query(f"sum(rate({I.ROW_WARNINGS.prometheus}{WHERE}[{RATE}])) * 60", "row warnings"),
                query(f"sum(rate({I.EXPORT_FAILURES.prometheus}{WHERE}[{RATE}])) * 60", "export failures"),
                query(f"sum(rate({I.EXPORT_THROTTLED.prometheus}{WHERE}[{RATE}])) * 60", "throttled by the receiver"),
                query(f"sum by (kind) (rate({I.LATE_ROWS.prometheus}{WHERE}[{RATE}])) * 60", "late {{kind}}"),
                query(f"sum(rate({I.PENDING_DELETED.prometheus}{WHERE}[{RATE}])) * 60", "pending runs deleted"),
                query(f"sum by (label) (rate({I.LABELS_FOLDED.prometheus}{WHERE}[{RATE}])) * 60", "{{label}} folded to other"),
            )
        )
        .with_panel(
            panel(
                "Row shapes: duplicate run ids, orphan tool rows, odd times",
                "short",
                "Per minute: later diagnosis_run rows with the run id of an earlier one, sent as traces of their own; "
                "tool rows whose run never appeared (run-otel check names them); and times read by a documented rule "
                "(a future updated_at, before the epoch, a tool call outside its run, a repeated or skipped local hour), "
                "by kind. The log names each run.",
                query(f"sum(rate({I.DUPLICATE_RUNS.prometheus}{WHERE}[{RATE}])) * 60", "duplicate run ids"),
                query(f"sum(rate({I.ORPHAN_ROWS.prometheus}{WHERE}[{RATE}])) * 60", "orphan tool rows"),
                query(f"sum by (kind) (rate({I.ODD_TIMES.prometheus}{WHERE}[{RATE}])) * 60", "{{kind}}"),
            )
        )
        .with_panel(
            panel(
                "Database clock and time zone",
                "s",
                "The database's clock minus this host's (settle and export delay are measured on the database's), "
                "and 1 while the newest rows do not fit source.timezone (readiness is down then; see the log).",
                query(f"{I.CLOCK_OFFSET.prometheus}{WHERE}", "{{instance}} clock offset"),
                query(f"{I.ZONE_SUSPECT.prometheus}{WHERE}", "{{instance}} source.timezone suspect"),
            )
        )
    )


def health_dashboard(stack: Stack) -> Dashboard:
    links = [dashboard_link("Diagnosis runs", RUNS_DASHBOARD), dashboard_link("RAG retrieval", RAG_DASHBOARD)]
    d = (
        base(
            HEALTH_DASHBOARD,
            "run-otel exporter health",
            "Is the bridge keeping up? Lag, pending runs, failures, last success.",
            links,
            stack,
        )
        .with_variable(
            label_variable("instance", I.START_TIME.prometheus).query(
                f"label_values({I.START_TIME.prometheus}{{{JOB}}}, instance)"
            )
        )
        .with_variable(
            label_variable("shard", I.BACKLOG_RUNS.prometheus).query(f"label_values({I.BACKLOG_RUNS.prometheus}{{{JOB}}}, shard)")
        )
    )
    return _series(_stats(d, stack), stack)
