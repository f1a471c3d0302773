"""Builds the parts from the one config: source, sink, state store, locks,
mapper, encoder, then the passes over them (poll, backfill, feedback) and the
metrics.

This is the one module below ops/ and cli/ that reads the whole Config: each
part takes its own section and the few values it needs, and every command gets
its parts here, so each part is built one way only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .config import Config
from .export import sinks
from .export.encoding import RequestFrame, resource_attributes
from .export.logrecords import LogRecordSender, build_log_sink
from .export.sending import RequestSender
from .export.sinks import Sink
from .export.wire import RunEncoder, WireSpans
from .mapping.content import ContentPolicy
from .mapping.evaluation import Evaluations
from .mapping.masking import configured_secrets
from .mapping.spans import Mapper
from .pipeline.backfill_pass import BackfillPass
from .pipeline.checkpoint import CheckpointError, CheckpointStore
from .pipeline.feedback import FeedbackPass, FeedbackSender
from .pipeline.late_rows import LatePass
from .pipeline.lease import MySqlLease
from .pipeline.named_lock import lock_name
from .pipeline.poller import Poller
from .pipeline.recorder import Recorder
from .pipeline.run_export import RunExporter
from .pipeline.store_lock import StoreLock, store_lock
from .sharding import shard_name
from .source.clock import SourceClock
from .source.reader import Source

if TYPE_CHECKING:
    from .export.phoenix import PhoenixAnnotations
    from .pipeline.backfill import Window
    from .source.rows import RunRow
    from .telemetry.history import MetricsHistory
    from .telemetry.metrics import BridgeMetrics, HealthServer

Check = Callable[[], tuple[bool, str]]


class MetricsPortError(OSError):
    """metrics.port could not be bound."""


@dataclass(frozen=True)
class Parts:
    """The parts a pass over the runs shares, each built once from its own section.
    Closing them closes each, the sink included; ``with build_parts(...) as parts`` does it."""

    config: Config
    source: Source
    sink: Sink
    store: CheckpointStore
    mapper: Mapper
    frame: RequestFrame
    recorder: Recorder

    def close(self) -> None:
        self.source.close()
        self.store.close()
        self.sink.close()

    def __enter__(self) -> Parts:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


# -- one part each ------------------------------------------------------------------


def build_source(config: Config) -> Source:
    return Source(config.source, config.content, config.poll.tool_chunk_size)


def build_store(config: Config, create: bool = True) -> CheckpointStore:
    """``create=False`` only reads: a store that does not exist yet is an error, never created."""
    return CheckpointStore(config.state, config.shard, create)


def build_sink(config: Config) -> Sink:
    return sinks.build_sink(config.export)


def build_demo_sink(config: Config, out_path: Path) -> Sink:
    """The demo's sink: the OTLP endpoint when OTEL_EXPORTER_OTLP_ENDPOINT is set, else an OTLP-JSON file, started afresh."""
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return build_sink(config)
    out_path.unlink(missing_ok=True)
    return sinks.JsonFileSink(out_path)


def build_probe_sink(config: Config) -> Sink:
    """The sink `check` probes with: one attempt, at most 5 s, so a dead endpoint is a quick verdict."""
    export = config.export
    return sinks.build_sink(replace(export, max_attempts=1, timeout_seconds=min(5.0, export.timeout_seconds)))


def build_store_lock(config: Config) -> StoreLock:
    """One writer per state store and shard: the lock, not yet taken."""
    return store_lock(config.state, config.shard)


def lease_name(config: Config) -> str:
    """The HA lease's lock name: one per source database and shard."""
    return lock_name(config.ha.lock_name, config.source.connect_url().database, shard_name(config.shard))


def build_lease(config: Config, source: Source) -> MySqlLease:
    return MySqlLease(source.engine, lease_name(config), config.ha.takeover_seconds)


def build_mapper(config: Config, source_clock: SourceClock) -> Mapper:
    secrets = configured_secrets(config.export, config.source, config.state)
    content = ContentPolicy.build(config.content, config.trace.conventions, secrets)
    return Mapper(config.trace, source_clock, content)


def _resource(config: Config) -> dict[str, str]:
    return resource_attributes(config.service, config.trace, os.environ)


# -- the passes -----------------------------------------------------------------------


def build_parts(
    config: Config, recorder: Recorder | None = None, sink: Sink | None = None, store: CheckpointStore | None = None
) -> Parts:
    """``sink`` and ``store`` replace the configured ones (the demo's file, a test's store); the parts own them."""
    source = build_source(config)
    return Parts(
        config,
        source,
        sink or build_sink(config),
        store or build_store(config),
        build_mapper(config, source.clock),
        RequestFrame(_resource(config)),
        recorder or Recorder(),
    )


def build_sender(parts: Parts) -> RequestSender:
    """Spans into requests under export.max_request_bytes, to the parts' sink: runs and ratings alike."""
    config, recorder = parts.config, parts.recorder
    return RequestSender(
        parts.sink,
        parts.frame,
        config.export.max_request_bytes,
        config.trace.max_list_length,
        recorder.spans_dropped,
        recorder.request_acknowledged,
    )


def build_exporter(parts: Parts) -> RunExporter:
    runs = RunEncoder(parts.mapper, WireSpans(parts.mapper.limits))
    return RunExporter(parts.source, runs, build_sender(parts), parts.recorder)


def build_poller(parts: Parts, keep_going: Callable[[], bool] = lambda: True, clock: Callable[[], float] | None = None) -> Poller:
    config = parts.config
    exporter = build_exporter(parts)
    late = LatePass(config.poll, parts.source, parts.store, exporter, parts.recorder) if config.poll.late_window_seconds else None
    return Poller(
        config.poll,
        parts.source,
        parts.store,
        exporter,
        parts.recorder,
        late,
        keep_going=keep_going,
        **({"clock": clock} if clock else {}),
    )


def build_backfill(parts: Parts) -> BackfillPass:
    config = parts.config
    return BackfillPass(config.poll, config.shard, parts.source, build_exporter(parts), parts.recorder, build_ratings(parts))


def build_ratings(parts: Parts) -> FeedbackSender | None:
    """Where ratings go: the run's trace, and the log records and Phoenix where configured; None when off.
    The feedback pass and the backfill share it."""
    config = parts.config
    if not config.feedback.enabled:
        return None
    log_records = None
    if config.feedback.log_records:
        log_records = LogRecordSender(build_log_sink(config.export), _resource(config), parts.recorder.export_failed)
    evaluations = Evaluations(config.feedback, parts.source.clock, "openinference" in config.trace.conventions)
    wire = WireSpans(parts.mapper.limits)
    return FeedbackSender(evaluations, wire, build_sender(parts), log_records, _phoenix(config))


def build_feedback(parts: Parts, clock: Callable[[], float] | None = None) -> FeedbackPass | None:
    """The feedback recheck, sharing the parts of the poll; None when off."""
    sender = build_ratings(parts)
    if sender is None:
        return None
    config = parts.config
    return FeedbackPass(config.feedback, parts.source, parts.store, sender, parts.recorder, **({"clock": clock} if clock else {}))


@dataclass(frozen=True)
class Service:
    """What `run-otel run` runs on."""

    store_lock: StoreLock
    metrics: BridgeMetrics | None
    server: HealthServer | None
    parts: Parts
    poller: Poller
    feedback: FeedbackPass | None
    lease: MySqlLease | None


def build_service(config: Config, alive: Check, keep_going: Callable[[], bool]) -> Service:
    """The daemon's parts, the store lock first: without HA it is taken here, for the process's
    life, before anything binds a port; with HA the daemon takes it only while it holds the lease."""
    lock = build_store_lock(config)
    if not config.ha.enabled:
        lock.__enter__()
    metrics, server = start_metrics(config, alive)
    parts = build_parts(config, recorder=metrics)
    lease = build_lease(config, parts.source) if config.ha.enabled else None
    return Service(lock, metrics, server, parts, build_poller(parts, keep_going), build_feedback(parts), lease)


# -- the bridge's own telemetry ---------------------------------------------------------


def build_metrics(config: Config) -> BridgeMetrics:
    """The metrics with the readers the config asks for (pull, push, or both)."""
    # Here, not at the top: a backfill without --with-metrics never loads the metrics SDK.
    from .telemetry.metrics import BridgeMetrics, metric_readers

    readers, registry, exemplars = metric_readers(config.metrics, config.export)
    return BridgeMetrics(config.feedback, config.poll.settle_seconds, config.shard, readers, registry, exemplars)


def build_history(config: Config, window: Window, step: int, now: float | None = None) -> MetricsHistory:
    """What `backfill --metrics-out` records into: a sample every ``step`` seconds from the window's
    start to its end (or now), each run counted after its ``updated_at`` in the source's zone."""
    import time

    from .telemetry.history import Grid, HistoryWindowError, MetricsHistory

    if window.since is None:
        raise HistoryWindowError("--metrics-out needs --since: the history starts there")
    clock = SourceClock(config.source.timezone)
    start = clock.epoch(window.since)
    end = clock.epoch(window.until) if window.until else (time.time() if now is None else now)
    assert start is not None and end is not None  # the window's bounds are datetimes

    def finished_at(run: RunRow) -> float | None:
        # A run is counted when it is exported, which follows updated_at by the settle time.
        return clock.epoch(run.updated_at) or clock.epoch(run.created_at)

    feedback = config.feedback
    label_of = feedback.label_of if feedback.enabled else None
    return MetricsHistory(Grid.covering(start, end, step), finished_at, label_of, daemon_counted(config))


def daemon_counted(config: Config) -> Callable[[RunRow], bool] | None:
    """The runs the daemon's live metrics count, from its checkpoint (read only): those above its
    first start's mark and those it took over in flight. None before the daemon's first start,
    or for a checkpoint saved before the mark was kept."""
    try:
        store = build_store(config, create=False)
    except CheckpointError:
        return None
    try:
        checkpoint = store.load()
    finally:
        store.close()
    if checkpoint is None or not checkpoint.start_mark:
        return None
    mark, taken_over = checkpoint.start_mark, frozenset(checkpoint.taken_over)
    return lambda run: run.id > mark or run.id in taken_over


def start_metrics(config: Config, alive: Check | None = None) -> tuple[BridgeMetrics | None, HealthServer | None]:
    """The metrics and, for Prometheus pull, the /metrics + health server."""
    if not config.metrics.enabled:
        return None, None
    from .telemetry.metrics import HealthServer, readiness

    metrics = build_metrics(config)
    try:
        server = HealthServer(
            config.metrics.host,
            config.metrics.port,
            metrics.registry,
            # A request may take up to the longest deadline before its acknowledgement is progress.
            readiness(
                metrics, config.poll.interval_seconds, max(config.export.max_timeout_seconds, config.export.timeout_seconds)
            ),
            alive or (lambda: (True, "ok")),
        ).start()
    except OSError as exc:
        metrics.shutdown()
        raise MetricsPortError(f"metrics.port {config.metrics.port} on {config.metrics.host}: {exc.strerror}") from None
    return metrics, server


def _phoenix(config: Config) -> PhoenixAnnotations | None:
    if not config.ui.phoenix_url:
        return None
    from .export.phoenix import PhoenixAnnotations  # HTTP client: only when Phoenix is configured

    return PhoenixAnnotations(config.ui.phoenix_url, config.export.timeout_seconds)
