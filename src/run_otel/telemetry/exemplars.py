"""Exemplars: the trace behind a metric sample, so Grafana can open it in one click.

Two paths, because the libraries differ:

* OTLP push: the SDK's own exemplar reservoirs. A measurement recorded with a
  context holding a *sampled* span context keeps that trace and span id
  (``TraceBasedExemplarFilter``, the SDK default). :func:`span_context` builds
  that context from the ids the mapping derives, without creating a span.
* Prometheus pull: ``opentelemetry-exporter-prometheus`` drops exemplars when it
  translates to ``prometheus_client`` families. :class:`ExemplarCollector`
  attaches them back: the SDK's families come from a private registry, and it
  adds the newest exemplar of each bucket (or counter series) as a
  ``prometheus_client`` exemplar, which the OpenMetrics exposition writes when
  the scraper asks for OpenMetrics. The text format leaves them out.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from collections.abc import Iterable, Mapping

from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context
from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar, Sample

from . import instruments as I

log = logging.getLogger(__name__)

TRACE_ID_LABEL = "trace_id"
# The label of the one series the SDK folds every label set past its cardinality limit into.
OVERFLOW_LABEL = "otel_metric_overflow"
SPAN_ID_LABEL = "span_id"


def span_context(trace_id: bytes, span_id: bytes) -> Context:
    """A context whose current span is the exported span: sampled, so the SDK keeps it as an exemplar."""
    context = SpanContext(
        trace_id=int.from_bytes(trace_id, "big"),
        span_id=int.from_bytes(span_id, "big"),
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return set_span_in_context(NonRecordingSpan(context))


class ExemplarStore:
    """The newest exemplar per Prometheus sample: a counter series, or one bucket of a histogram series.

    Series are keyed by the instrument's own labels only: the exposition adds
    others (the otel_scope_* labels) that say nothing about the run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._label_names: dict[str, tuple[str, ...]] = {}
        self._latest: dict[tuple[str, tuple[str, ...], float], Exemplar] = {}

    def record(
        self, instrument: I.Instrument, labels: Mapping[str, str], trace_id: bytes, span_id: bytes, value: float = 1.0
    ) -> None:
        exemplar = Exemplar({TRACE_ID_LABEL: trace_id.hex(), SPAN_ID_LABEL: span_id.hex()}, value, time.time())
        if instrument.kind == I.HISTOGRAM:
            # The smallest bucket that holds the value: the one a click on that bucket should open.
            index = bisect.bisect_left(instrument.buckets, value)
            name, bound = instrument.series("_bucket"), instrument.buckets[index] if index < len(instrument.buckets) else math.inf
        else:
            name, bound = instrument.prometheus, _NO_BUCKET
        with self._lock:
            self._label_names[name] = instrument.labels
            self._latest[(name, tuple(labels[key] for key in instrument.labels), bound)] = exemplar

    def find(self, sample_name: str, labels: Mapping[str, str]) -> Exemplar | None:
        with self._lock:
            names = self._label_names.get(sample_name)
            if names is None:
                return None
            bound = float(labels["le"]) if "le" in labels else _NO_BUCKET
            return self._latest.get((sample_name, tuple(labels.get(key, "") for key in names), bound))


# Counters have no buckets; a value no bucket bound can take keeps their keys apart.
_NO_BUCKET = -math.inf


class ExemplarCollector(Collector):
    """The SDK's families from ``source``, with the store's exemplars attached to matching samples."""

    def __init__(self, source: CollectorRegistry, store: ExemplarStore):
        self._source = source
        self._store = store
        self._overflowed: set[str] = set()

    def collect(self) -> Iterable:
        for family in self._source.collect():
            family.samples = [self._with_exemplar(sample) for sample in family.samples]
            self._note_overflow(family.name, family.samples)
            yield family

    def _note_overflow(self, name: str, samples: list[Sample]) -> None:
        """The SDK's cardinality limit is set above what the label bounds allow; should it be reached
        all the same (an SDK that ignores the limit, a label without a bound), it is said once."""
        if name in self._overflowed or not any(OVERFLOW_LABEL in sample.labels for sample in samples):
            return
        self._overflowed.add(name)
        log.warning(
            "%s: the OpenTelemetry SDK reached its cardinality limit and counts every further label set in one "
            'series labelled %s="true", without its labels; lower metrics.max_tool_names or max_dedup_reasons',
            name,
            OVERFLOW_LABEL,
        )

    def _with_exemplar(self, sample: Sample) -> Sample:
        if sample.exemplar is not None:
            return sample
        exemplar = self._store.find(sample.name, sample.labels)
        return sample if exemplar is None else sample._replace(exemplar=exemplar)
