"""Run, RAG and bridge-health metrics, plus /metrics, /healthz and /readyz.

Runs are counted when their batch has been acknowledged *and* checkpointed
(the poller calls :meth:`BridgeMetrics.runs_exported` after saving), so a
replay after a crash, which only re-sends what was never checkpointed, is
never counted twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from .. import __version__
from ..config import ExportConfig, FeedbackConfig, MetricsConfig
from ..mapping import attributes as A
from ..mapping.span_data import tool_span_id_for, trace_id_for
from ..pipeline.recorder import Recorder
from ..pipeline.results import ExportedRun, PollResult
from ..sharding import Shard, shard_name
from ..source.rows import INTENTS, FeedbackRow
from . import instruments as I
from .exemplars import ExemplarCollector, ExemplarStore, span_context
from .measurements import (
    NONE,
    OTHER,
    STATUSES,
    Measurement,
    label,
    run_measurements,
    tool_measurements,
    tool_zero_series,
    zero_series,
)

__all__ = ["NONE", "OTHER", "STATUSES", "BridgeMetrics", "HealthServer", "label", "metric_readers", "readiness"]

log = logging.getLogger(__name__)

LATE_KINDS = ("tool", "completion")  # run_otel_late_rows_total's: a tool row after its run's export, a late finish


class BridgeMetrics(Recorder):
    def __init__(
        self,
        feedback: FeedbackConfig,
        settle_seconds: float,
        shard: Shard,
        readers: list[MetricReader],
        registry: CollectorRegistry | None = None,
        exemplars: ExemplarStore | None = None,
    ):
        self.registry = registry
        self._exemplars = exemplars or ExemplarStore()
        views = [
            View(instrument_name=i.name, aggregation=ExplicitBucketHistogramAggregation(i.buckets))
            for i in I.ALL
            if i.kind == I.HISTOGRAM
        ]
        # service.name here is the bridge's own; the traces carry the agent's.
        resource = Resource.create({A.SERVICE_NAME: "run-otel", A.SERVICE_VERSION: __version__})
        self.provider = MeterProvider(metric_readers=readers, views=views, resource=resource)
        meter = self.provider.get_meter("run_otel", __version__)
        self._settle = settle_seconds
        self._feedback = feedback
        self._tools_seen: set[tuple[str, bool]] = set()
        self._shard = shard_name(shard)
        self._i: dict[str, Any] = {}
        factories: dict[str, Callable[..., Any]] = {
            I.COUNTER: meter.create_counter,
            I.HISTOGRAM: meter.create_histogram,
            I.GAUGE: meter.create_gauge,
        }
        for instrument in I.ALL:
            factory = factories[instrument.kind]
            self._i[instrument.name] = factory(instrument.name, unit=instrument.unit, description=instrument.description)
        self._lock = threading.Lock()
        self.last_poll_ok = False
        self.last_success = 0.0
        # Unix times of the last acknowledged request and the last failed poll: a long drain behind
        # a slow receiver is progress, though no poll finishes for minutes.
        self.last_progress = 0.0
        self.last_failure = 0.0
        # An HA standby does not poll; it is ready while it can reach the lease.
        self.standby = False
        self.checkpoint_ahead_runs = 0
        self.zone_message: str | None = None  # why source.timezone looks wrong, while it does
        self._get(I.START_TIME).set(time.time())
        self._get(I.STANDBY).set(0)
        self._zero_run_counters()

    def _zero_run_counters(self) -> None:
        """Starts the enum-labelled series at 0, so rate() sees the first runs after a restart."""
        for instrument, values in zero_series():
            self._get(instrument).add(0, instrument.labelled(*values))
        self._get(I.EXPORTED_SPANS).add(0)
        self._get(I.EXPORT_FAILURES).add(0)
        self._get(I.REJECTED_SPANS).add(0)
        self._get(I.ROW_WARNINGS).add(0)
        self._get(I.PENDING_DELETED).add(0)
        self._get(I.INCOMPLETE_RUNS).add(0)
        self._get(I.DROPPED_SPANS).add(0, I.DROPPED_SPANS.labelled("too_large"))
        for kind in LATE_KINDS:
            self._get(I.LATE_ROWS).add(0, I.LATE_ROWS.labelled(kind))
        # 0 until the poller finds the source behind the checkpoint: the panel reads 0, not "No data".
        self._get(I.CHECKPOINT_AHEAD).set(0, I.CHECKPOINT_AHEAD.labelled(self._shard))

    def _get(self, instrument: I.Instrument) -> Any:
        return self._i[instrument.name]

    # -- Recorder -------------------------------------------------------------

    def runs_exported(self, result: PollResult, acked_at: float) -> None:
        for exported in result.runs:
            for tool in exported.tools:
                self._first_call(tool.tool_name, tool.retrieval_layer is not None)
            # Ratings are counted as the feedback pass sends them (feedback_sent), not at export.
            for measurement in run_measurements(exported, None):
                self._measure(measurement)
            if exported.incomplete:
                self._get(I.INCOMPLETE_RUNS).add(1)
            if exported.settled_at is not None:
                self._get(I.EXPORT_DELAY).record(max(acked_at - exported.settled_at - self._settle, 0.0))
        # Only what the receiver took: rejected and dropped spans have counters of their own.
        self._get(I.EXPORTED_SPANS).add(result.accepted_spans)
        if result.rejected_spans:
            self._get(I.REJECTED_SPANS).add(result.rejected_spans)

    def _measure(self, m: Measurement) -> None:
        """One increment or observation, with its span as the exemplar: one click from a bucket to the trace."""
        labels = m.instrument.labelled(*m.labels)
        context = span_context(m.trace_id, m.span_id)
        if m.instrument.kind == I.HISTOGRAM:
            self._get(m.instrument).record(m.value, labels, context=context)
        else:
            self._get(m.instrument).add(m.value, labels, context=context)
        if m.keep_exemplar:
            self._exemplars.record(m.instrument, labels, m.trace_id, m.span_id, m.value)

    def _first_call(self, tool_name: str | None, retrieval: bool) -> None:
        """A tool's first call starts its sibling series at 0, so their first increments show in rate()."""
        key = (label(tool_name), retrieval)
        if key in self._tools_seen:
            return
        self._tools_seen.add(key)
        for instrument, values in tool_zero_series(key[0], retrieval):
            self._get(instrument).add(0, instrument.labelled(*values))

    def feedback_sent(self, rows: Sequence[FeedbackRow]) -> None:
        for row in rows:
            feedback = self._feedback.label_of(row.feedback) or OTHER
            self._get(I.FEEDBACK).add(1, I.FEEDBACK.labelled(feedback, label(row.intent, INTENTS)))

    def late_sent(self, runs: Sequence[ExportedRun]) -> None:
        """Late tool rows count as tool invocations too: they were not counted at the run's export."""
        for item in runs:
            trace_id = trace_id_for(item.run.run_id)
            for tool in item.late_tools:
                self._first_call(tool.tool_name, tool.retrieval_layer is not None)
                for measurement in tool_measurements(tool, trace_id, tool_span_id_for(item.run.run_id, tool.id)):
                    self._measure(measurement)
            if item.late is None:
                continue
            if item.late.tool_ids:
                self._get(I.LATE_ROWS).add(len(item.late.tool_ids), I.LATE_ROWS.labelled("tool"))
            if item.late.completed:
                self._get(I.LATE_ROWS).add(1, I.LATE_ROWS.labelled("completion"))

    def clock_offset(self, seconds: float) -> None:
        self._get(I.CLOCK_OFFSET).set(seconds)

    def zone_suspect(self, message: str | None) -> None:
        self.zone_message = message
        self._get(I.ZONE_SUSPECT).set(1 if message else 0)

    def pending_deleted(self, count: int) -> None:
        self._get(I.PENDING_DELETED).add(count)

    def spans_dropped(self, reason: str, count: int) -> None:
        self._get(I.DROPPED_SPANS).add(count, I.DROPPED_SPANS.labelled(reason))

    def export_failed(self) -> None:
        self._get(I.EXPORT_FAILURES).add(1)

    def request_acknowledged(self) -> None:
        self.last_progress = time.time()

    def poll_finished(self, seconds: float, ok: bool, pending: int, oldest_pending: float = 0.0) -> None:
        self._get(I.POLL_DURATION).record(seconds, I.POLL_DURATION.labelled("ok" if ok else "error"))
        with self._lock:
            self.last_poll_ok = ok
            if ok:
                self.last_success = time.time()
                self._get(I.LAST_SUCCESS).set(self.last_success)
            else:
                self.last_failure = time.time()
            # Set on a failed poll too (the checkpoint's count), so a first deploy that never succeeds shows it.
            self._get(I.PENDING_RUNS).set(pending)
            self._get(I.PENDING_OLDEST).set(oldest_pending)

    def backlog(self, runs: int, seconds: float | None) -> None:
        self._get(I.BACKLOG_RUNS).set(runs, I.BACKLOG_RUNS.labelled(self._shard))
        if seconds is not None:
            self._get(I.LAG).set(seconds, I.LAG.labelled(self._shard))

    def checkpoint_ahead(self, runs: int) -> None:
        self.checkpoint_ahead_runs = runs
        self._get(I.CHECKPOINT_AHEAD).set(runs, I.CHECKPOINT_AHEAD.labelled(self._shard))

    def set_standby(self, standby: bool) -> None:
        self.standby = standby
        self._get(I.STANDBY).set(1 if standby else 0)

    def row_warnings(self, count: int) -> None:
        self._get(I.ROW_WARNINGS).add(count)

    def shutdown(self) -> None:
        self.provider.shutdown()


class HealthServer:
    """/metrics (Prometheus text), /healthz (alive) and /readyz (ready) on one port."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry | None,
        ready: Callable[[], tuple[bool, str]],
        alive: Callable[[], tuple[bool, str]] = lambda: (True, "ok"),
    ):
        handler = _handler(registry, ready, alive)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="run-otel-http", daemon=True)

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(
    registry: CollectorRegistry | None, ready: Callable[[], tuple[bool, str]], alive: Callable[[], tuple[bool, str]]
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics" and registry is not None:
                # prometheus_client's own negotiation: OpenMetrics when the scraper asks for it.
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                self._reply(200, encoder(registry), content_type)
            elif path == "/healthz":
                is_alive, why = alive()
                self._reply(200 if is_alive else 503, (why + "\n").encode())
            elif path == "/readyz":
                is_ready, why = ready()
                self._reply(200 if is_ready else 503, (why + "\n").encode())
            else:
                self._reply(404, b"not found\n")

        def _reply(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:  # scrapes every few seconds would flood the log
            pass

    return Handler


def readiness(
    metrics: BridgeMetrics, interval: float, request_seconds: float, clock: Callable[[], float] = time.time
) -> Callable[[], tuple[bool, str]]:
    """Ready unless a poll failed since the last progress, or no poll finished and no request was
    acknowledged for three poll intervals plus ``request_seconds``, the longest a request may wait
    for its answer: a backlog drained behind a slow receiver is progress, not a stall."""

    def ready() -> tuple[bool, str]:
        if metrics.standby:
            return True, "ready: standby, another instance holds the lease"
        if metrics.checkpoint_ahead_runs:
            return False, f"not ready: the checkpoint is {metrics.checkpoint_ahead_runs} run ids ahead of the source; see the log"
        if metrics.zone_message:
            return False, f"not ready: {metrics.zone_message}"
        now = clock()
        if metrics.last_poll_ok and now - metrics.last_success <= 3 * interval:
            return True, "ready"
        latest = max(metrics.last_success, metrics.last_progress)
        if not latest or metrics.last_failure > latest:
            return False, "not ready: the last poll failed or none has finished yet"
        quiet = now - latest
        if quiet > 3 * interval + request_seconds:
            return False, f"not ready: no poll finished and no request was acknowledged for {quiet:.0f}s"
        if metrics.last_progress >= metrics.last_success:
            return True, f"ready: a poll is draining; the last request was acknowledged {quiet:.0f}s ago"
        return True, f"ready: a request is in flight; the last poll finished {quiet:.0f}s ago"

    return ready


def metric_readers(
    config: MetricsConfig, export: ExportConfig
) -> tuple[list[MetricReader], CollectorRegistry | None, ExemplarStore]:
    """The readers the config asks for (pull, push, or both), the registry /metrics serves, and its exemplars."""
    readers: list[MetricReader] = []
    registry = None
    exemplars = ExemplarStore()
    if config.prometheus:
        # The SDK's families go to a registry of their own; the served one adds their exemplars.
        sdk_families = CollectorRegistry(auto_describe=True)
        readers.append(PrometheusMetricReader(registry=sdk_families))
        registry = CollectorRegistry()
        registry.register(ExemplarCollector(sdk_families, exemplars))
    if config.otlp:
        readers.append(PeriodicExportingMetricReader(_otlp_metric_exporter(export), int(config.otlp_interval_seconds * 1000)))
    return readers, registry, exemplars


def _otlp_metric_exporter(config: ExportConfig) -> MetricExporter:
    endpoint = config.resolved_endpoint()
    if config.protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

        return HttpExporter(endpoint=endpoint.rstrip("/") + "/v1/metrics", headers=config.headers)
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

    return GrpcExporter(endpoint=endpoint, insecure=config.insecure, headers=config.headers or None)
