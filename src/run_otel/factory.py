"""Builds the parts from the one config: source, sink, state store, mapper,
encoder, then the passes over them (poll, backfill, feedback) and the metrics.

Every command gets its parts here, so each part is built one way only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .config import Config
from .export.encoding import FastEncoder, resource_attributes
from .export.logrecords import LogRecordSender, build_log_sink
from .export.sending import RequestSender
from .export.sinks import Sink, build_sink
from .mapping.content import ContentPolicy
from .mapping.evaluation import Evaluations
from .mapping.masking import configured_secrets
from .mapping.spans import Mapper
from .pipeline.backfill_pass import BackfillPass
from .pipeline.checkpoint import CheckpointStore
from .pipeline.feedback import FeedbackPass
from .pipeline.poller import Poller
from .pipeline.results import Recorder
from .pipeline.run_export import RunExporter
from .source.clock import SourceClock
from .source.reader import Source

if TYPE_CHECKING:
    from .export.phoenix import PhoenixAnnotations
    from .telemetry.metrics import BridgeMetrics, HealthServer

Check = Callable[[], tuple[bool, str]]


class MetricsPortError(OSError):
    """metrics.port could not be bound."""


@dataclass(frozen=True)
class Parts:
    """The parts a pass over the runs shares, each built once from its own section."""

    config: Config
    source: Source
    source_clock: SourceClock
    sink: Sink
    store: CheckpointStore
    mapper: Mapper
    encoder: FastEncoder
    recorder: Recorder

    def close(self) -> None:
        self.source.close()
        self.store.close()


def build_mapper(config: Config, source_clock: SourceClock) -> Mapper:
    content = ContentPolicy.build(config.content, config.trace.conventions, configured_secrets(config))
    return Mapper(config.trace, source_clock, content)


def build_source(config: Config) -> Source:
    """The source alone, for what only reads (plans, probes)."""
    return Source(config)


def build_parts(
    config: Config, recorder: Recorder | None = None, sink: Sink | None = None, store: CheckpointStore | None = None
) -> Parts:
    """``sink`` and ``store`` replace the configured ones (the demo's file, a test's store)."""
    source = build_source(config)
    return Parts(
        config,
        source,
        source.clock,
        sink or build_sink(config),
        store or CheckpointStore(config),
        build_mapper(config, source.clock),
        FastEncoder(resource_attributes(config, os.environ)),
        recorder or Recorder(),
    )


def build_exporter(parts: Parts) -> RunExporter:
    config = parts.config
    recorder = parts.recorder
    sender = RequestSender(
        parts.sink,
        parts.encoder,
        config.export.max_request_bytes,
        config.trace.max_list_length,
        recorder.spans_dropped,
        recorder.request_acknowledged,
    )
    return RunExporter(parts.source, parts.mapper, sender, parts.source_clock, parts.recorder)


def build_poller(parts: Parts, keep_going: Callable[[], bool] = lambda: True, clock: Callable[[], float] | None = None) -> Poller:
    config = parts.config
    return Poller(
        config.poll,
        config.shard,
        parts.source,
        parts.store,
        build_exporter(parts),
        parts.source_clock,
        parts.recorder,
        keep_feedback=config.feedback.enabled,
        keep_going=keep_going,
        **({"clock": clock} if clock else {}),
    )


def build_backfill(parts: Parts) -> BackfillPass:
    config = parts.config
    return BackfillPass(config.poll, config.shard, parts.source, build_exporter(parts), parts.source_clock, parts.recorder)


def build_feedback(parts: Parts) -> FeedbackPass | None:
    """The feedback recheck, sharing the parts of the poll; None when off."""
    config = parts.config
    if not config.feedback.enabled:
        return None
    log_records = None
    if config.feedback.log_records:
        log_records = LogRecordSender(
            build_log_sink(config), resource_attributes(config, os.environ), parts.recorder.export_failed
        )
    return FeedbackPass(
        config.feedback,
        config.shard,
        parts.source,
        parts.sink,
        parts.store,
        Evaluations(config.feedback, parts.source_clock, "openinference" in config.trace.conventions),
        parts.encoder,
        parts.source_clock,
        parts.recorder,
        log_records=log_records,
        phoenix=_phoenix(config),
    )


def start_metrics(config: Config, alive: Check | None = None) -> tuple[BridgeMetrics | None, HealthServer | None]:
    """The metrics and, for Prometheus pull, the /metrics + health server."""
    if not config.metrics.enabled:
        return None, None
    # Here, not at the top: a backfill without --with-metrics never loads the metrics SDK.
    from .telemetry.metrics import HealthServer, build_metrics, readiness

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
