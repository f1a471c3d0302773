"""Builds the parts from the one config: source, sink, state store, metrics, poller.

Every command gets its parts here, so each part is built one way only.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .config import Config
from .export.encoding import FastEncoder, resource_attributes
from .export.logrecords import LogRecordSender, build_log_sink
from .export.phoenix import PhoenixAnnotations
from .export.sinks import Sink, build_sink
from .mapping.content import ContentPolicy
from .mapping.evaluation import Evaluations
from .mapping.masking import configured_secrets
from .mapping.spans import Mapper
from .pipeline.checkpoint import CheckpointStore
from .pipeline.feedback import FeedbackPass
from .pipeline.poller import Poller, Recorder
from .source.clock import SourceClock
from .source.reader import Source
from .telemetry.metrics import BridgeMetrics, HealthServer, build_metrics, readiness

Check = Callable[[], tuple[bool, str]]


class MetricsPortError(OSError):
    """metrics.port could not be bound."""


def build_mapper(config: Config, clock: SourceClock | None = None) -> Mapper:
    content = ContentPolicy.build(config.content, config.trace.conventions, configured_secrets(config))
    return Mapper(config, clock or SourceClock(config.source.timezone), content)


def build_poller(
    config: Config,
    recorder: Recorder | None = None,
    sink: Sink | None = None,
    keep_going: Callable[[], bool] = lambda: True,
    store: CheckpointStore | None = None,
    clock: Callable[[], float] | None = None,
) -> Poller:
    source_clock = SourceClock(config.source.timezone)
    return Poller(
        config,
        Source(config),
        sink or build_sink(config),
        store or CheckpointStore(config),
        mapper=build_mapper(config, source_clock),
        encoder=FastEncoder(resource_attributes(config, os.environ)),
        source_clock=source_clock,
        recorder=recorder,
        keep_going=keep_going,
        **({"clock": clock} if clock else {}),
    )


def build_feedback(config: Config, poller: Poller, recorder: Recorder | None = None) -> FeedbackPass | None:
    """The feedback recheck, sharing the poller's source, sink, state store and encoder; None when off."""
    if not config.feedback.enabled:
        return None
    log_records = None
    if config.feedback.log_records:
        on_failure = recorder.export_failed if recorder is not None else (lambda: None)
        log_records = LogRecordSender(build_log_sink(config), resource_attributes(config, os.environ), on_failure)
    return FeedbackPass(
        config.feedback,
        config.shard,
        poller.source,
        poller.sink,
        poller.store,
        Evaluations(config.feedback, poller.source_clock, "openinference" in config.trace.conventions),
        poller.encoder,
        poller.source_clock,
        recorder,
        log_records=log_records,
        phoenix=PhoenixAnnotations(config.ui.phoenix_url, config.export.timeout_seconds) if config.ui.phoenix_url else None,
    )


def start_metrics(config: Config, alive: Check | None = None) -> tuple[BridgeMetrics | None, HealthServer | None]:
    """The metrics and, for Prometheus pull, the /metrics + health server."""
    if not config.metrics.enabled:
        return None, None
    metrics = build_metrics(config)
    try:
        server = HealthServer(
            config.metrics.host,
            config.metrics.port,
            metrics.registry,
            readiness(metrics, config.poll.interval_seconds),
            alive or (lambda: (True, "ok")),
        ).start()
    except OSError as exc:
        metrics.shutdown()
        raise MetricsPortError(f"metrics.port {config.metrics.port} on {config.metrics.host}: {exc.strerror}") from None
    return metrics, server
