"""The one definition of every metric: name, unit, labels, and its Prometheus name.

``metrics`` creates the instruments from this table, and the dashboard and
alert generators build their queries from it, so they cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

COUNTER, HISTOGRAM, GAUGE = "counter", "histogram", "gauge"

# Second-scale buckets, 0.1 s to 300 s, instead of the SDK's millisecond defaults.
SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
# Tool calls are often a few milliseconds (a cache hit, an L0 lookup): buckets from 5 ms.
TOOL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Export delay: seconds when keeping up, hours or days for a backfill or a catch-up after an
# outage; a top bucket of 300 s made every catch-up read as exactly 300 s.
DELAY_BUCKETS = SECONDS_BUCKETS + (600.0, 1800.0, 3600.0, 7200.0, 21600.0, 43200.0, 86400.0, 259200.0, 604800.0)


# Equal and hashed by identity: each is one constant of this catalogue, and a catch-up's tally
# hashes one several times a measurement (hashing the fields was a tenth of its poll thread).
@dataclass(frozen=True, eq=False)
class Instrument:
    name: str
    kind: str
    unit: str
    description: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = SECONDS_BUCKETS  # histograms only

    @property
    def prometheus(self) -> str:
        """The name after the OpenTelemetry-to-Prometheus translation."""
        base = self.name.replace(".", "_")
        if self.unit == "s":
            base += "_seconds"
        return base + "_total" if self.kind == COUNTER else base

    def labelled(self, *values: str) -> dict[str, str]:
        """The label set for ``values``, in the order of ``labels``: names live only here."""
        if len(values) != len(self.labels):
            raise ValueError(f"{self.name} takes labels {self.labels}, got {len(values)} values")
        return dict(zip(self.labels, values))

    def series(self, suffix: str = "") -> str:
        """A histogram's ``_bucket``/``_sum``/``_count`` series, or the plain name."""
        return self.prometheus + suffix


RUNS = Instrument(
    "diagnosis.runs", COUNTER, "{run}", "Finished diagnosis runs exported.", ("status", "intent", "release_outcome")
)
RUN_DURATION = Instrument("diagnosis.run.duration", HISTOGRAM, "s", "Run duration (total_duration_ms).", ("status", "intent"))
RUN_TOKENS = Instrument("diagnosis.run.tokens", COUNTER, "{token}", "Tokens used by exported runs.", ("intent",))
TOOL_INVOCATIONS = Instrument(
    "diagnosis.tool.invocations",
    COUNTER,
    "{invocation}",
    "Tool invocations of exported runs.",
    ("tool_name", "retrieval_layer", "relevance_level", "success"),
)
TOOL_DURATION = Instrument(
    "diagnosis.tool.duration",
    HISTOGRAM,
    "s",
    "Tool call duration (duration_ms).",
    ("tool_name", "retrieval_layer", "success"),
    TOOL_BUCKETS,
)
RAG_MATCHES = Instrument("rag.matches", COUNTER, "{match}", "RAG matches by retrieval layer.", ("layer", "tool_name"))
DEDUP = Instrument("rag.dedup", COUNTER, "{invocation}", "Deduplicated retrievals by reason.", ("dedup_reason", "tool_name"))
ZERO_MATCH = Instrument(
    "rag.zero_match",
    COUNTER,
    "{invocation}",
    "Retrieval calls that matched nothing in any layer.",
    ("retrieval_layer", "tool_name"),
)
FEEDBACK = Instrument(
    "diagnosis.run.feedback",
    COUNTER,
    "{run}",
    "User ratings of the runs the bridge sent, each counted once when first seen; a changed rating is a new one.",
    ("feedback", "intent"),
)

EXPORTED_SPANS = Instrument("run_otel.exported.spans", COUNTER, "{span}", "Spans acknowledged by the OTLP receiver.")
REJECTED_SPANS = Instrument("run_otel.rejected.spans", COUNTER, "{span}", "Spans the receiver rejected (partial_success).")
DROPPED_SPANS = Instrument(
    "run_otel.dropped.spans",
    COUNTER,
    "{span}",
    "Spans run-otel gave up on after splitting and cutting failed, so the runs behind them could go on.",
    ("reason",),
)
LATE_ROWS = Instrument(
    "run_otel.late.rows",
    COUNTER,
    "{row}",
    "Rows sent into a trace after its first export: tool rows committed late, and the finish of a run sent as incomplete.",
    ("kind",),
)
DUPLICATE_RUNS = Instrument(
    "run_otel.duplicate.runs",
    COUNTER,
    "{run}",
    "Later diagnosis_run rows with the run id of an earlier one (in any letter case), sent as traces of their own.",
)
ORPHAN_ROWS = Instrument(
    "run_otel.orphan.rows",
    COUNTER,
    "{row}",
    "Tool rows whose run had not appeared poll.orphan_wait_seconds after they were seen: named in the log and by check.",
)
ODD_TIMES = Instrument(
    "run_otel.row.odd_times",
    COUNTER,
    "{value}",
    "Times read by a documented rule rather than as written: a future updated_at, a time before the epoch, a tool "
    "call outside its run, a local time repeated or skipped by a daylight-saving change.",
    ("kind",),
)
PENDING_DELETED = Instrument(
    "run_otel.pending.deleted",
    COUNTER,
    "{run}",
    "Pending runs deleted from the source before they finished, dropped after a re-check.",
)
CLOCK_OFFSET = Instrument(
    "run_otel.source.clock_offset", GAUGE, "s", "The database's clock (UTC_TIMESTAMP()) minus this host's, each poll."
)
ZONE_SUSPECT = Instrument(
    "run_otel.source.timezone_suspect",
    GAUGE,
    "{bool}",
    "1 while the newest rows do not fit source.timezone (run times then count from when a run was seen).",
)
EXPORT_FAILURES = Instrument("run_otel.export.failures", COUNTER, "{batch}", "Batches the receiver did not acknowledge.")
EXPORT_THROTTLED = Instrument(
    "run_otel.export.throttled",
    COUNTER,
    "{answer}",
    "Answers in which the receiver asked run-otel to slow down (gRPC RetryInfo or RESOURCE_EXHAUSTED, "
    "HTTP 429 or Retry-After); no request goes to it before the delay it asked for.",
)
ROW_WARNINGS = Instrument("run_otel.row.warnings", COUNTER, "{warning}", "Bad values in source rows, mapped around.")
LABELS_FOLDED = Instrument(
    "run_otel.labels.folded",
    COUNTER,
    "{value}",
    "Values of a bounded label (tool_name, dedup_reason) counted as other: past metrics.max_tool_names or max_dedup_reasons.",
    ("label",),
)
POLL_DURATION = Instrument("run_otel.poll.duration", HISTOGRAM, "s", "Time per poll, all batches.", ("outcome",))
EXPORT_DELAY = Instrument(
    "run_otel.export.delay", HISTOGRAM, "s", "From a run being settled to its acknowledgement.", (), DELAY_BUCKETS
)
PENDING_RUNS = Instrument("run_otel.pending.runs", GAUGE, "{run}", "Runs waiting to finish or settle.")
PENDING_OLDEST = Instrument(
    "run_otel.pending.oldest_age",
    GAUGE,
    "s",
    "How long the longest-waiting pending run has waited since first seen; 0 with none.",
)
INCOMPLETE_RUNS = Instrument(
    "run_otel.incomplete.runs", COUNTER, "{run}", "Runs sent as incomplete: still unfinished after poll.run_timeout_seconds."
)
LAST_SUCCESS = Instrument("run_otel.last_success.timestamp", GAUGE, "s", "Unix time of the last successful poll.")
BACKLOG_RUNS = Instrument(
    "run_otel.backlog.runs", GAUGE, "{run}", "Run ids between the checkpoint and the newest run.", ("shard",)
)
LAG = Instrument("run_otel.lag", GAUGE, "s", "The newest run's created_at minus the checkpoint run's.", ("shard",))
START_TIME = Instrument("run_otel.start.timestamp", GAUGE, "s", "Unix time this instance started.")
STANDBY = Instrument("run_otel.standby", GAUGE, "1", "1 while an HA standby waits for the lease, else 0.")
CHECKPOINT_AHEAD = Instrument(
    "run_otel.checkpoint.ahead",
    GAUGE,
    "{run}",
    "How far the checkpoint's high-water id is above the newest run id: over 0 means the source went backwards.",
    ("shard",),
)

RUN_INSTRUMENTS = (RUNS, RUN_DURATION, RUN_TOKENS, TOOL_INVOCATIONS, TOOL_DURATION, RAG_MATCHES, DEDUP, ZERO_MATCH, FEEDBACK)
HEALTH_INSTRUMENTS = (
    EXPORTED_SPANS,
    REJECTED_SPANS,
    DROPPED_SPANS,
    LATE_ROWS,
    DUPLICATE_RUNS,
    ORPHAN_ROWS,
    ODD_TIMES,
    PENDING_DELETED,
    CLOCK_OFFSET,
    ZONE_SUSPECT,
    EXPORT_FAILURES,
    EXPORT_THROTTLED,
    ROW_WARNINGS,
    LABELS_FOLDED,
    POLL_DURATION,
    EXPORT_DELAY,
    PENDING_RUNS,
    PENDING_OLDEST,
    INCOMPLETE_RUNS,
    LAST_SUCCESS,
    START_TIME,
    STANDBY,
    BACKLOG_RUNS,
    LAG,
    CHECKPOINT_AHEAD,
)
ALL = RUN_INSTRUMENTS + HEALTH_INSTRUMENTS

# Prometheus job name used by the shipped scrape config, alerts and dashboards.
JOB = "run-otel"
# The instance label the shipped scrape config gives the daemon (its target).
INSTANCE = "run-otel:9464"
