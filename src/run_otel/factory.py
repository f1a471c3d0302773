"""Builds the parts from the one config: source, sink, state store, locks,
mapper, encoder, then the passes over them (poll, backfill, feedback) and the
metrics.

This is the one module below ops/ and cli/ that reads the whole Config: each
part takes its own section and the few values it needs, and every command gets
its parts here, so each part is built one way only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .config import Config
from .export import sinks
from .export.encoding import RequestFrame, resource_attributes
from .export.logrecords import LogRecordSender, build_log_sink
from .export.sending import RequestSender
from .export.sinks import Sink
from .export.throttle import Throttle
from .export.wire import RunEncoder, WireSpans
from .mapping.content import ContentPolicy
from .mapping.evaluation import Evaluations
from .mapping.masking import configured_secrets
from .mapping.spans import Mapper
from .pipeline.backfill_pass import BackfillPass
from .pipeline.duplicates import DuplicateRule
from .pipeline.feedback import FeedbackPass, FeedbackSender
from .pipeline.late_rows import LatePass
from .pipeline.lease import MySqlLease
from .pipeline.named_lock import lock_name
from .pipeline.orphans import OrphanPass
from .pipeline.poller import Poller
from .pipeline.recorder import Recorder
from .pipeline.row_shapes import RowShapes
from .pipeline.run_export import RunExporter
from .pipeline.state_store import StateStore
from .pipeline.store_lock import StoreLock, store_lock
from .sharding import shard_name
from .source.clock import SourceClock
from .source.reader import Source
from .source.run_ids import RunIdRows

if TYPE_CHECKING:
    from .export.phoenix import PhoenixAnnotations
    from .telemetry.health import HealthServer
    from .telemetry.metrics import BridgeMetrics

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
    store: StateStore
    mapper: Mapper
    frame: RequestFrame
    recorder: Recorder
    # Which rows share a run id: the duplicate rule and the orphan look ask it, and it says once what it found.
    run_ids: RunIdRows
    # The receiver's requested delay, which every sink to it (traces, log records) and the probe wait for.
    throttle: Throttle = field(default_factory=Throttle)

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


def build_store(config: Config, create: bool = True) -> StateStore:
    """``create=False`` only reads: a store that does not exist yet is an error, never created."""
    return StateStore(config.state, config.shard, create)


def build_sink(config: Config, throttle: Throttle | None = None) -> Sink:
    return sinks.build_sink(config.export, throttle)


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
    config: Config, recorder: Recorder | None = None, sink: Sink | None = None, store: StateStore | None = None
) -> Parts:
    """``sink`` and ``store`` replace the configured ones (the demo's file, a test's store); the parts own them."""
    source = build_source(config)
    recorder = recorder or Recorder()
    throttle = Throttle(recorder.export_throttled)
    return Parts(
        config,
        source,
        sink or build_sink(config, throttle),
        store or build_store(config),
        build_mapper(config, source.clock),
        RequestFrame(_resource(config)),
        recorder,
        RunIdRows(source),
        throttle,
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
        recorder.request_sending,
    )


def build_shapes(parts: Parts) -> RowShapes:
    """The duplicate rule and the runs sent incomplete before: what every send asks beside the rows."""
    return RowShapes(DuplicateRule(parts.run_ids), parts.store)


def build_exporter(parts: Parts) -> RunExporter:
    runs = RunEncoder(parts.mapper, WireSpans(parts.mapper.limits))
    return RunExporter(parts.source, runs, build_sender(parts), parts.recorder, build_shapes(parts))


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


def build_orphans(parts: Parts, poller: Poller, clock: Callable[[], float] | None = None) -> OrphanPass | None:
    """The look for tool rows whose run never appears, after each of ``poller``'s polls, from the tool rows
    it read; None when poll.orphan_wait_seconds is 0."""
    poll = parts.config.poll
    if not poll.orphan_wait_seconds:
        return None
    wait, shard = poll.orphan_wait_seconds, parts.config.shard
    return OrphanPass(wait, parts.source, parts.run_ids, parts.store, parts.recorder, shard, poller.feed, clock or time.time)


def build_backfill(parts: Parts) -> BackfillPass:
    config = parts.config
    # The state store learns what each batch exported, for the ratings given on those runs later.
    exporter, ratings = build_exporter(parts), build_ratings(parts)
    return BackfillPass(config.poll, config.shard, parts.source, exporter, parts.recorder, ratings, store=parts.store)


def build_ratings(parts: Parts) -> FeedbackSender | None:
    """Where ratings go: the run's trace, and the log records and Phoenix where configured; None when off.
    The feedback pass and the backfill share it."""
    config = parts.config
    if not config.feedback.enabled:
        return None
    log_records = None
    if config.feedback.log_records:
        log_sink = build_log_sink(config.export, parts.throttle)
        log_records = LogRecordSender(log_sink, _resource(config), parts.recorder.export_failed)
    evaluations = Evaluations(config.feedback, parts.source.clock, "openinference" in config.trace.conventions)
    wire = WireSpans(parts.mapper.limits)
    return FeedbackSender(evaluations, wire, build_sender(parts), log_records, _phoenix(config), build_shapes(parts))


def build_feedback(parts: Parts, clock: Callable[[], float] | None = None) -> FeedbackPass | None:
    """The feedback recheck, sharing the parts of the poll; None when off."""
    sender = build_ratings(parts)
    if sender is None:
        return None
    config = parts.config
    return FeedbackPass(config.feedback, parts.source, parts.store, sender, parts.recorder, **({"clock": clock} if clock else {}))


@dataclass(frozen=True)
class Service:
    """What `run-otel run` runs on, with its one lifecycle: ``start`` takes the store lock (without
    HA; with HA the daemon takes it only while it holds the lease) before anything binds a port,
    then serves the metrics; ``stop`` gives everything back."""

    store_lock: StoreLock
    metrics: BridgeMetrics | None
    server: HealthServer | None
    parts: Parts
    poller: Poller
    feedback: FeedbackPass | None
    lease: MySqlLease | None
    orphans: OrphanPass | None = None

    def start(self) -> None:
        if self.lease is None:
            self.store_lock.__enter__()
        if self.server is not None:
            try:
                serve(self.server, self.parts.config)
            except MetricsPortError:
                self.store_lock.release()
                raise

    def stop(self) -> None:
        if self.lease is not None:
            self.lease.release()
        self.store_lock.release()
        self.parts.close()
        if self.server is not None:
            self.server.stop()
        if self.metrics is not None:
            self.metrics.shutdown()


def build_service(config: Config, alive: Check, keep_going: Callable[[], bool]) -> Service:
    """The daemon's parts, built without taking or binding anything: ``Service.start`` does."""
    metrics = build_metrics(config) if config.metrics.enabled else None
    server = build_health_server(config, metrics, alive) if metrics is not None else None
    parts = build_parts(config, recorder=metrics)
    lease = build_lease(config, parts.source) if config.ha.enabled else None
    lock = build_store_lock(config)
    poller, feedback = build_poller(parts, keep_going), build_feedback(parts)
    return Service(lock, metrics, server, parts, poller, feedback, lease, build_orphans(parts, poller))


# -- the bridge's own telemetry ---------------------------------------------------------


def build_metrics(config: Config) -> BridgeMetrics:
    """The metrics with the readers the config asks for (pull, push, or both)."""
    # Here, not at the top: a backfill without --with-metrics never loads the metrics SDK.
    from .telemetry.metrics import BridgeMetrics
    from .telemetry.readers import metric_readers

    readers, registry, exemplars = metric_readers(config.metrics, config.export)
    return BridgeMetrics(config.feedback, config.poll.settle_seconds, config.shard, readers, registry, exemplars, config.metrics)


def build_health_server(config: Config, metrics: BridgeMetrics, alive: Check | None = None) -> HealthServer:
    """/metrics, /healthz and /readyz on metrics.port, not yet bound."""
    from .telemetry.health import HealthServer, readiness

    return HealthServer(
        config.metrics.host,
        config.metrics.port,
        metrics.registry,
        # A request may take up to the longest deadline before its acknowledgement is progress.
        readiness(metrics, config.poll.interval_seconds, max(config.export.max_timeout_seconds, config.export.timeout_seconds)),
        alive or (lambda: (True, "ok")),
    )


def serve(server: HealthServer, config: Config) -> None:
    """Binds metrics.port and serves; a port that cannot be bound is a MetricsPortError naming it."""
    try:
        server.start()
    except OSError as exc:
        raise MetricsPortError(f"metrics.port {config.metrics.port} on {config.metrics.host}: {exc.strerror}") from None


def start_metrics(config: Config) -> tuple[BridgeMetrics | None, HealthServer | None]:
    """The metrics and their server, serving: for a command that runs beside no daemon (a backfill)."""
    if not config.metrics.enabled:
        return None, None
    metrics = build_metrics(config)
    server = build_health_server(config, metrics)
    try:
        serve(server, config)
    except MetricsPortError:
        metrics.shutdown()
        raise
    return metrics, server


def _phoenix(config: Config) -> PhoenixAnnotations | None:
    if not config.ui.phoenix_url:
        return None
    from .export.phoenix import PhoenixAnnotations  # HTTP client: only when Phoenix is configured

    return PhoenixAnnotations(config.ui.phoenix_url, config.export.timeout_seconds)
