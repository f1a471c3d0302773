"""Run, RAG and bridge-health metrics: the Recorder the passes tell, over the OpenTelemetry SDK.

Runs are counted when their batch has been acknowledged *and* checkpointed
(the poller calls :meth:`BridgeMetrics.runs_exported` after saving), so a
replay after a crash, which only re-sends what was never checkpointed, is
never counted twice.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry

from .. import __version__
from ..config import FeedbackConfig, MetricsConfig
from ..export.sending import TOO_LARGE
from ..mapping import attributes as A
from ..mapping.span_data import tool_span_id_for, trace_id_for
from ..mapping.times import ODD_TIME_KINDS
from ..pipeline.recorder import Recorder
from ..pipeline.results import ExportedRun, PollResult
from ..pipeline.row_shapes import SPAN_LIMIT
from ..pipeline.run_export import UNMAPPABLE
from ..sharding import Shard, shard_name
from ..source.rows import INTENTS, FeedbackRow
from . import instruments as I
from .batch_tally import BatchTally, BucketsByBatch
from .bounds import LabelBounds
from .exemplars import ExemplarStore, span_context
from .measurements import NONE, OTHER, STATUSES, Measurement, label, run_measurements, tool_measurements, zero_series

__all__ = ["NONE", "OTHER", "STATUSES", "BridgeMetrics", "label"]

log = logging.getLogger(__name__)

LATE_KINDS = ("tool", "completion")  # run_otel_late_rows_total's: a tool row after its run's export, a late finish
# run_otel_dropped_spans_total's: too large for any request, past trace.max_spans_per_trace, a run no value left out maps.
DROP_REASONS = (TOO_LARGE, SPAN_LIMIT, UNMAPPABLE)


class BridgeMetrics(Recorder):
    def __init__(
        self,
        feedback: FeedbackConfig,
        settle_seconds: float,
        shard: Shard,
        readers: list[MetricReader],
        registry: CollectorRegistry | None = None,
        exemplars: ExemplarStore | None = None,
        limits: MetricsConfig | None = None,
    ):
        self.registry = registry
        self._exemplars = exemplars or ExemplarStore()
        limits = limits or MetricsConfig()
        self._bounds = LabelBounds.of(limits, self._folded)
        self._feedback_labels = _feedback_labels(feedback)
        # service.name here is the bridge's own; the traces carry the agent's.
        resource = Resource.create({A.SERVICE_NAME: "run-otel", A.SERVICE_VERSION: __version__})
        self.provider = MeterProvider(metric_readers=readers, views=self._views(), resource=resource)
        meter = self.provider.get_meter("run_otel", __version__)
        self._settle = settle_seconds
        self._feedback = feedback
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
        self.failed_part = ""  # where the last failed poll failed, for /readyz
        # Unix time the requests in flight began going out; None while none is: a poll waiting on
        # the database is not a request the receiver is answering.
        self.sending_since: float | None = None
        self._sending = 0
        # An HA standby does not poll; it is ready while it can reach the lease.
        self.standby = False
        self.checkpoint_ahead_runs = 0
        self.zone_message: str | None = None  # why source.timezone looks wrong, while it does
        self._get(I.START_TIME).set(time.time())
        self._get(I.STANDBY).set(0)
        self._zero_run_counters()

    def _views(self) -> list[View]:
        """Second-scale buckets for the histograms, and for every instrument a cardinality limit above
        what its labels' bounds allow, so the SDK never folds series on its own (an SDK that takes no
        limit per instrument has none, or its default, which the bounds keep far below)."""
        per_view = "aggregation_cardinality_limit" in inspect.signature(View.__init__).parameters
        views = []
        for i in I.ALL:
            options: dict[str, Any] = {}
            if i.kind == I.HISTOGRAM:
                options["aggregation"] = BucketsByBatch(i.buckets)
            if per_view:
                options["aggregation_cardinality_limit"] = self._bounds.cardinality_limit(i, len(self._feedback_labels))
            if options:
                views.append(View(instrument_name=i.name, **options))
        return views

    def _zero_run_counters(self) -> None:
        """Starts the enum-labelled series at 0, so rate() sees the first runs and ratings after a restart."""
        for instrument, values in zero_series(self._feedback_labels):
            self._get(instrument).add(0, instrument.labelled(*values))
        for bounded in (self._bounds.tool_name, self._bounds.dedup_reason):
            self._get(I.LABELS_FOLDED).add(0, I.LABELS_FOLDED.labelled(bounded.label_name))
        self._get(I.EXPORTED_SPANS).add(0)
        self._get(I.EXPORT_FAILURES).add(0)
        self._get(I.EXPORT_THROTTLED).add(0)
        self._get(I.REJECTED_SPANS).add(0)
        self._get(I.ROW_WARNINGS).add(0)
        self._get(I.PENDING_DELETED).add(0)
        self._get(I.INCOMPLETE_RUNS).add(0)
        for reason in DROP_REASONS:
            self._get(I.DROPPED_SPANS).add(0, I.DROPPED_SPANS.labelled(reason))
        self._get(I.DUPLICATE_RUNS).add(0)
        self._get(I.ORPHAN_ROWS).add(0)
        for kind in ODD_TIME_KINDS:
            self._get(I.ODD_TIMES).add(0, I.ODD_TIMES.labelled(kind))
        for kind in LATE_KINDS:
            self._get(I.LATE_ROWS).add(0, I.LATE_ROWS.labelled(kind))
        # 0 until the poller finds the source behind the checkpoint: the panel reads 0, not "No data".
        self._get(I.CHECKPOINT_AHEAD).set(0, I.CHECKPOINT_AHEAD.labelled(self._shard))

    def _get(self, instrument: I.Instrument) -> Any:
        return self._i[instrument.name]

    # -- Recorder -------------------------------------------------------------

    def runs_exported(self, result: PollResult, acked_at: float) -> None:
        """A batch's runs, summed per series before they reach the SDK (``batch_tally.py``)."""
        tally, incomplete = BatchTally(), 0
        for exported in result.runs:
            # Ratings are counted as the feedback pass sends them (feedback_sent), not at export.
            for measurement in run_measurements(exported, None, self._bounds):
                tally.take(measurement)
            incomplete += exported.incomplete
            if exported.settled_at is not None:
                tally.observe(I.EXPORT_DELAY, max(acked_at - exported.settled_at - self._settle, 0.0))
        tally.record(self._get, self._exemplars)
        if incomplete:
            self._get(I.INCOMPLETE_RUNS).add(incomplete)
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

    def _folded(self, label_name: str) -> None:
        self._get(I.LABELS_FOLDED).add(1, I.LABELS_FOLDED.labelled(label_name))

    def feedback_sent(self, rows: Sequence[FeedbackRow]) -> None:
        for row in rows:
            feedback = self._feedback.label_of(row.feedback) or OTHER
            self._get(I.FEEDBACK).add(1, I.FEEDBACK.labelled(feedback, label(row.intent, INTENTS)))

    def late_sent(self, runs: Sequence[ExportedRun]) -> None:
        """Late tool rows count as tool invocations too: they were not counted at the run's export."""
        for item in runs:
            trace_id = trace_id_for(item.run.run_id)
            for tool in item.late_tools:
                for measurement in tool_measurements(tool, trace_id, tool_span_id_for(item.run.run_id, tool.id), self._bounds):
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

    def duplicate_runs(self, count: int) -> None:
        self._get(I.DUPLICATE_RUNS).add(count)

    def odd_times(self, kind: str, count: int) -> None:
        self._get(I.ODD_TIMES).add(count, I.ODD_TIMES.labelled(kind))

    def orphan_rows(self, count: int) -> None:
        self._get(I.ORPHAN_ROWS).add(count)

    def export_failed(self) -> None:
        self._get(I.EXPORT_FAILURES).add(1)

    def request_acknowledged(self) -> None:
        self.last_progress = time.time()

    def request_sending(self, active: bool) -> None:
        with self._lock:
            self._sending = self._sending + 1 if active else max(self._sending - 1, 0)
            if not self._sending:
                self.sending_since = None
            elif self.sending_since is None:
                self.sending_since = time.time()

    def export_throttled(self) -> None:
        self._get(I.EXPORT_THROTTLED).add(1)

    def feedback_failed(self) -> None:
        with self._lock:
            self.last_poll_ok = False
            self.last_failure = time.time()
            self.failed_part = "the feedback pass"

    def poll_finished(self, seconds: float, ok: bool, pending: int, oldest_pending: float = 0.0, failed: str = "") -> None:
        self._get(I.POLL_DURATION).record(seconds, I.POLL_DURATION.labelled("ok" if ok else "error"))
        with self._lock:
            self.last_poll_ok = ok
            if ok:
                self.last_success = time.time()
                self._get(I.LAST_SUCCESS).set(self.last_success)
            else:
                self.last_failure = time.time()
                self.failed_part = failed
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


def _feedback_labels(feedback: FeedbackConfig) -> list[str]:
    """The labels ratings are counted under, as the config spells them; none when ratings are off."""
    if not feedback.enabled:
        return []
    return sorted({feedback.label_of(name) or name for name in (*feedback.scores, *feedback.negative)})
