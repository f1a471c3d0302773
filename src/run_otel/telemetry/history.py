"""The run, tool, RAG and feedback metrics of a backfill, as a scrape would have seen them.

``backfill --metrics-out`` hears every run the backfill exports (a
:class:`~run_otel.pipeline.recorder.Recorder`), places each run's measurements
at the step when it finished (``updated_at``), and keeps only the changes per
series and step; ``openmetrics`` then writes one sample per series and step,
with the running totals. Memory grows with the changes, never with the steps.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..config import MetricsConfig
from ..pipeline.recorder import Recorder
from ..pipeline.results import PollResult
from ..source.rows import RunRow
from . import instruments as I
from .bounds import LabelBounds
from .measurements import FeedbackLabel, Measurement, run_measurements, zero_series

SeriesKey = tuple[str, tuple[str, ...]]  # (instrument name, label values)


class HistoryWindowError(ValueError):
    """The history's window or step cannot make a single sample."""


@dataclass(frozen=True)
class Grid:
    """The scrape times: ``first`` (a multiple of ``step``) and every ``step`` seconds up to ``last``.

    A run that finished at ``t`` is in every sample after ``t``, as a scrape after its export
    would show it; the first sample is before every run, so every series starts at 0."""

    first: int
    step: int
    steps: int  # the index of the last sample

    @classmethod
    def covering(cls, start: float, end: float, step: int) -> Grid:
        if step < 1:
            raise HistoryWindowError(f"--metrics-step must be at least 1 second, got {step}")
        if end <= start:
            raise HistoryWindowError("the metrics window is empty: it ends (--until, or now) before it starts (--since)")
        first = math.floor(start / step) * step
        return cls(first, step, max(math.ceil((end - first) / step), 1))

    @property
    def last(self) -> int:
        return self.first + self.steps * self.step

    def index(self, moment: float) -> int:
        """The first sample that counts an event at ``moment``; later events go to the last sample."""
        return min(max(math.floor((moment - self.first) / self.step) + 1, 1), self.steps)

    def timestamps(self) -> list[str]:
        return [str(self.first + k * self.step) for k in range(self.steps + 1)]


@dataclass(frozen=True)
class Exemplar:
    trace_id: bytes
    span_id: bytes
    value: float
    at: float


@dataclass
class CounterChanges:
    """Per step, what the series gained and the newest run behind it."""

    deltas: dict[int, float] = field(default_factory=dict)
    exemplars: dict[int, Exemplar] = field(default_factory=dict)


@dataclass
class HistogramChanges:
    """Per step, the observations per bucket (the last one is +Inf), their sum, and an exemplar per bucket."""

    bounds: tuple[float, ...]
    counts: dict[int, list[int]] = field(default_factory=dict)
    sums: dict[int, float] = field(default_factory=dict)
    exemplars: dict[int, dict[int, Exemplar]] = field(default_factory=dict)

    def observe(self, step: int, value: float, exemplar: Exemplar) -> None:
        bucket = bisect.bisect_left(self.bounds, value)  # le is inclusive: the smallest bound >= value
        counts = self.counts.setdefault(step, [0] * (len(self.bounds) + 1))
        counts[bucket] += 1
        self.sums[step] = self.sums.get(step, 0.0) + value
        self.exemplars.setdefault(step, {})[bucket] = exemplar


class MetricsHistory(Recorder):
    """Hears the runs a backfill exports and keeps each series' changes on the grid."""

    def __init__(
        self,
        grid: Grid,
        finished_at: Callable[[RunRow], float | None],
        feedback_label: FeedbackLabel,
        daemon_counts: Callable[[RunRow], bool] | None = None,
        bounds: LabelBounds | None = None,
    ):
        self.grid = grid
        self._finished_at = finished_at
        self._feedback_label = feedback_label
        # The live metrics' bounds, so an imported day has the series a scraped one would have.
        self._bounds = bounds or LabelBounds.of(MetricsConfig())
        # The runs the daemon's live metrics count: left out here, so no run is counted twice.
        self._daemon_counts = daemon_counts
        self.left_to_daemon = 0
        self.counters: dict[SeriesKey, CounterChanges] = {}
        self.histograms: dict[SeriesKey, HistogramChanges] = {}
        self.runs = 0
        for instrument, values in zero_series():
            self.counters[(instrument.name, values)] = CounterChanges()

    def runs_exported(self, result: PollResult, acked_at: float) -> None:
        for exported in result.runs:
            if self._daemon_counts is not None and self._daemon_counts(exported.run):
                self.left_to_daemon += 1
                continue
            moment = self._finished_at(exported.run)
            step = self.grid.steps if moment is None else self.grid.index(moment)
            at = float(self.grid.first + step * self.grid.step) if moment is None else moment
            self.runs += 1
            for measurement in run_measurements(exported, self._feedback_label, self._bounds):
                self._add(measurement, step, at)

    def _add(self, m: Measurement, step: int, at: float) -> None:
        key = (m.instrument.name, m.labels)
        exemplar = Exemplar(m.trace_id, m.span_id, m.value, at)
        if m.instrument.kind == I.HISTOGRAM:
            histogram = self.histograms.get(key)
            if histogram is None:
                histogram = self.histograms[key] = HistogramChanges(m.instrument.buckets)
            histogram.observe(step, m.value, exemplar)
            return
        counter = self.counters.setdefault(key, CounterChanges())
        counter.deltas[step] = counter.deltas.get(step, 0.0) + m.value
        counter.exemplars[step] = exemplar

    def series_of(self, instrument: I.Instrument) -> Iterator[tuple[tuple[str, ...], CounterChanges | HistogramChanges]]:
        """The instrument's series in label order, so the file is the same for the same rows."""
        changes = self.histograms if instrument.kind == I.HISTOGRAM else self.counters
        keys = sorted(values for name, values in changes if name == instrument.name)
        for values in keys:
            yield values, changes[(instrument.name, values)]

    def series_count(self) -> int:
        return len(self.counters) + len(self.histograms)
