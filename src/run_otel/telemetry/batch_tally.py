"""A batch's measurements, summed per series before they reach the SDK.

Recording each run's and each tool call's measurements one by one cost more than exporting the
run: about 40 measurements a run, and 10 to 50 µs of CPU each in the SDK (it copies, cleans and
hashes the labels of every one), two thirds of a catch-up's time on the poll thread. So a batch
is tallied first: a counter's increments are one ``add`` per series, and a histogram's
observations one record per bucket of each series, their count and sum in one value
(:class:`Observations`), which the histograms' aggregation (:class:`BucketsByBatch`) adds as
that many observations. That value is the bucket's newest observation, recorded with its span:
each bucket's exemplar still opens the newest trace in it.

The SDK takes no such value through its API, so ``BucketsByBatch`` extends the SDK's own bucket
aggregation. Whether this SDK's aggregation is the one it was written for is tried once
(:func:`weighted`); if not, the observations are recorded one by one, as before.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation

from . import instruments as I
from .exemplars import ExemplarStore, span_context
from .measurements import Measurement

_Series = tuple[I.Instrument, tuple[str, ...]]


class Observations(float):
    """Several observations in one histogram bucket, as one value: the newest of them, for the exemplar."""

    count: int
    total: float
    low: float
    high: float

    def __new__(cls, newest: float, count: int, total: float, low: float, high: float) -> Observations:
        value = super().__new__(cls, newest)
        value.count, value.total, value.low, value.high = count, total, low, high
        return value


def _weighted_class() -> type | None:
    try:
        from opentelemetry.sdk.metrics._internal.aggregation import _ExplicitBucketHistogramAggregation
    except ImportError:
        return None

    class Weighted(_ExplicitBucketHistogramAggregation):  # type: ignore[misc, valid-type]
        def aggregate(self, measurement: Any, should_sample_exemplar: bool = True) -> None:
            value = measurement.value
            if not isinstance(value, Observations):
                super().aggregate(measurement, should_sample_exemplar)
                return
            state: Any = self  # the SDK's own fields, as its aggregate() sets them
            with state._lock:
                if state._value is None:
                    state._value = state._get_empty_bucket_counts()
                state._sum += value.total
                if state._record_min_max:
                    state._min, state._max = min(state._min, value.low), max(state._max, value.high)
                state._value[bisect.bisect_left(state._boundaries, value.high)] += value.count
            self._sample_exemplar(measurement, should_sample_exemplar)

    Weighted.__name__ = "_WeightedBucketAggregation"
    return Weighted


_WEIGHTED = _weighted_class()


class BucketsByBatch(ExplicitBucketHistogramAggregation):
    """The SDK's explicit-bucket histogram, which also adds an :class:`Observations` as its count."""

    def _create_aggregation(self, *args: Any, **kwargs: Any) -> Any:
        aggregation = super()._create_aggregation(*args, **kwargs)
        if _WEIGHTED is not None and type(aggregation) in _WEIGHTED.__mro__[1:2]:
            aggregation.__class__ = _WEIGHTED
        return aggregation


@functools.cache
def weighted() -> bool:
    """Whether this SDK adds an Observations as its count, sum, minimum and maximum: tried once."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.metrics.view import View

    try:
        reader = InMemoryMetricReader()
        provider = MeterProvider([reader], views=[View(instrument_name="probe", aggregation=BucketsByBatch((1.0, 2.0)))])
        provider.get_meter("probe").create_histogram("probe").record(Observations(1.5, 3, 4.0, 1.1, 1.5))
        data = reader.get_metrics_data()
        provider.shutdown()
        point: Any = data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points[0] if data else None
        return point is not None and (list(point.bucket_counts), point.sum, point.min, point.max) == ([0, 3, 0], 4.0, 1.1, 1.5)
    except Exception:  # an SDK whose internals differ: record one by one
        return False


class BatchTally:
    def __init__(self) -> None:
        self._sums: dict[_Series, float] = {}
        self._values: dict[tuple[_Series, int], list[float]] = {}  # by series and bucket
        # The measurement a sample's exemplar comes from: the newest of a counter series, or of a
        # histogram bucket; the newest kept for the pull endpoint's exemplars, apart.
        self._newest: dict[tuple[_Series, int], Measurement] = {}
        self._kept: dict[tuple[_Series, int], Measurement] = {}

    def take(self, m: Measurement) -> None:
        series = (m.instrument, m.labels)
        if m.instrument.kind == I.HISTOGRAM:
            key = (series, bisect.bisect_left(m.instrument.buckets, m.value))
            self._values.setdefault(key, []).append(m.value)
        else:
            key = (series, -1)
            self._sums[series] = self._sums.get(series, 0.0) + m.value
        self._newest[key] = m
        if m.keep_exemplar:
            self._kept[key] = m

    def observe(self, instrument: I.Instrument, value: float) -> None:
        """An observation of a histogram without labels or exemplars (the export delay)."""
        self._values.setdefault(((instrument, ()), bisect.bisect_left(instrument.buckets, value)), []).append(value)

    def record(self, instrument: Callable[[I.Instrument], Any], exemplars: ExemplarStore) -> None:
        """Hands the batch to the SDK: ``instrument`` gives the SDK instrument of a catalogue entry."""
        labels = {series: series[0].labelled(*series[1]) for series in {*self._sums, *(s for s, _b in self._values)}}
        for series, total in self._sums.items():
            m = self._kept.get((series, -1)) or self._newest[(series, -1)]
            instrument(series[0]).add(total, labels[series], context=span_context(m.trace_id, m.span_id))
        by_bucket = weighted()
        for key, values in self._values.items():
            series, newest = key[0], self._newest.get(key)
            record, attributes = instrument(series[0]).record, labels[series]
            last = values[-1] if newest is None else newest.value
            context = None if newest is None else span_context(newest.trace_id, newest.span_id)
            if by_bucket:
                record(Observations(last, len(values), sum(values), min(values), max(values)), attributes, context=context)
                continue
            values.remove(last)  # recorded last, with its span: the bucket's exemplar
            for value in values:
                record(value, attributes)
            record(last, attributes, context=context)
        for (series, _bucket), m in self._kept.items():
            exemplars.record(series[0], labels[series], m.trace_id, m.span_id, m.value)
