"""A metrics history as Prometheus remote-write 1.0 requests (``prompb.WriteRequest``), which
``backfill --metrics-push`` compresses with snappy's block format and POSTs.

Every series has a sample at every step with its running total, as a scrape gives it, so
``rate()`` over any window of two steps or more sees what the live series would show. The
requests go in time order, each holding every series over a span of steps: a receiver that has
nothing newer appends each series in order, and one that has (the daemon's live samples) takes
the history through its out-of-order window. Exemplars ride on the series and step a run changed.

The protobuf is written by hand, from the field numbers of prompb's remote.proto and types.proto:
three small messages, and a month of samples at 15 s is a hundred million of them. A run of equal
values differs only in the timestamps, so each run of samples is one ``bytes.join`` over the
encoded timestamps, with the value between them.
"""

from __future__ import annotations

import bisect
import math
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from . import instruments as I
from .history import CounterChanges, Exemplar, HistogramChanges, MetricsHistory
from .openmetrics import SCOPE_LABELS

# A request of at most this many samples (~4 MB before compression): far under what Prometheus,
# Mimir (100 MiB) and VictoriaMetrics (32 MB) take in one request.
SAMPLES_PER_REQUEST = 200_000
# prompb.MetricMetadata.MetricType
_TYPES = {I.COUNTER: 1, I.GAUGE: 2, I.HISTOGRAM: 3}


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field: its tag byte, the length, the bytes."""
    return bytes((tag,)) + varint(len(payload)) + payload


def _label(name: str, value: str) -> bytes:
    # TimeSeries.labels = 1, Label.name = 1, Label.value = 2
    return _field(0x0A, _field(0x0A, name.encode()) + _field(0x12, value.encode()))


def encode_labels(pairs: Iterable[tuple[str, str]]) -> bytes:
    """Sorted by name, as Prometheus keeps a label set."""
    return b"".join(_label(name, value) for name, value in sorted(pairs))


def _exemplar(exemplar: Exemplar) -> bytes:
    # TimeSeries.exemplars = 3: labels = 1, value = 2 (double), timestamp = 3 (ms)
    labels = _label("span_id", exemplar.span_id.hex()) + _label("trace_id", exemplar.trace_id.hex())
    body = labels + b"\x11" + struct.pack("<d", exemplar.value) + b"\x18" + varint(round(exemplar.at * 1000))
    return _field(0x1A, body)


@dataclass
class Series:
    """One Prometheus series: its encoded labels, its value from each change on (the first at step
    0), and the exemplar of the steps where it changed."""

    labels: bytes
    starts: list[int]
    values: list[float]
    exemplars: dict[int, Exemplar]

    def value_at(self, step: int) -> float:
        return self.values[bisect.bisect_right(self.starts, step) - 1]


class Timestamps:
    """Each step's timestamp, encoded once as the variable part of a ``Sample``.

    A Sample (TimeSeries.samples = 2) is written timestamp first (field 2, varint ms), then the
    value (field 1, double): ``12 len 10 <ts> 09 <value>``. Between two samples of equal value
    only ``len 10 <ts>`` changes, so the rest is the separator of one join."""

    def __init__(self, first: int, step: int, steps: int):
        self.first, self.step = first, step
        self.parts = []
        for k in range(steps + 1):
            ts = varint((first + k * step) * 1000)
            self.parts.append(bytes((len(ts) + 10, 0x10)) + ts)

    def run(self, value: float, start: int, stop: int) -> bytes:
        """The samples of steps [start, stop), all of ``value``."""
        double = b"\x09" + struct.pack("<d", value)
        return b"\x12" + (double + b"\x12").join(self.parts[start:stop]) + double


@dataclass(frozen=True)
class Request:
    payload: bytes  # a WriteRequest, not yet compressed
    samples: int
    last_step: int


def history_series(history: MetricsHistory, job: str, instance: str) -> list[Series]:
    """Every series of the run instruments, in the order the OpenMetrics file writes them."""
    common = (("job", job), ("instance", instance), *SCOPE_LABELS)
    found: list[Series] = []
    for instrument in I.RUN_INSTRUMENTS:
        for values, changes in history.series_of(instrument):
            pairs = (*zip(instrument.labels, values), *common)
            if isinstance(changes, HistogramChanges):
                found.extend(_histogram(instrument, pairs, changes))
            else:
                found.append(_counter(instrument, pairs, changes))
    return found


def _counter(instrument: I.Instrument, pairs: tuple[tuple[str, str], ...], changes: CounterChanges) -> Series:
    series = Series(encode_labels((*pairs, ("__name__", instrument.prometheus))), [0], [0.0], dict(changes.exemplars))
    total = 0.0
    for step in sorted(changes.deltas):
        total += changes.deltas[step]
        series.starts.append(step)
        series.values.append(total)
    return series


def _histogram(instrument: I.Instrument, pairs: tuple[tuple[str, str], ...], changes: HistogramChanges) -> list[Series]:
    bounds = (*changes.bounds, math.inf)

    def named(suffix: str, *extra: tuple[str, str]) -> Series:
        return Series(encode_labels((*pairs, *extra, ("__name__", instrument.series(suffix)))), [0], [0.0], {})

    buckets = [named("_bucket", ("le", "+Inf" if b == math.inf else repr(float(b)))) for b in bounds]
    count, total = named("_count"), named("_sum")
    per_bucket, observations, summed = [0] * len(bounds), 0, 0.0
    for step in sorted(changes.counts):
        running = 0
        for index, added in enumerate(changes.counts[step]):
            per_bucket[index] += added  # le is cumulative: a bucket holds every one below it
            running += per_bucket[index]
            if running != buckets[index].values[-1]:
                buckets[index].starts.append(step)
                buckets[index].values.append(float(running))
        observations += sum(changes.counts[step])
        summed += changes.sums[step]
        for series, value in ((count, float(observations)), (total, summed)):
            series.starts.append(step)
            series.values.append(value)
        for index, exemplar in changes.exemplars.get(step, {}).items():
            buckets[index].exemplars[step] = exemplar
    return [*buckets, count, total]


def _samples(series: Series, times: Timestamps, start: int, stop: int) -> bytes:
    """The series' samples of steps [start, stop): one join per run of equal values."""
    at = bisect.bisect_right(series.starts, start) - 1
    parts = []
    while start < stop:
        end = series.starts[at + 1] if at + 1 < len(series.starts) else stop
        end = min(end, stop)
        parts.append(times.run(series.values[at], start, end))
        start, at = end, at + 1
    return b"".join(parts)


def _timeseries(series: Series, times: Timestamps, start: int, stop: int) -> bytes:
    exemplars = b"".join(_exemplar(series.exemplars[k]) for k in sorted(series.exemplars) if start <= k < stop)
    return _field(0x0A, series.labels + _samples(series, times, start, stop) + exemplars)


def metadata(history: MetricsHistory) -> bytes:
    """WriteRequest.metadata = 3: type = 1, metric_family_name = 2, help = 4, unit = 5."""
    out = []
    for instrument in I.RUN_INSTRUMENTS:
        if next(history.series_of(instrument), None) is None:
            continue
        family = instrument.prometheus.removesuffix("_total")
        body = b"\x08" + varint(_TYPES[instrument.kind]) + _field(0x12, family.encode())
        body += _field(0x22, instrument.description.encode())
        if instrument.unit == "s":
            body += _field(0x2A, b"seconds")
        out.append(_field(0x1A, body))
    return b"".join(out)


def write_requests(history: MetricsHistory, series: list[Series], per_request: int = SAMPLES_PER_REQUEST) -> Iterator[Request]:
    """The whole history, in time order: every series over each span of steps, the metadata first."""
    grid = history.grid
    times = Timestamps(grid.first, grid.step, grid.steps)
    span = max(1, per_request // max(len(series), 1))
    head = metadata(history)
    for start in range(0, grid.steps + 1, span):
        stop = min(start + span, grid.steps + 1)
        payload = head + b"".join(_timeseries(s, times, start, stop) for s in series)
        head = b""
        yield Request(payload, (stop - start) * len(series), stop - 1)


def first_sample(history: MetricsHistory, series: list[Series]) -> Request:
    """The first series' first sample alone, sent again with the rest: a receiver that takes it
    takes samples as old as the history's, before the backfill spends its time."""
    grid = history.grid
    times = Timestamps(grid.first, grid.step, 0)
    return Request(_field(0x0A, series[0].labels + times.run(series[0].value_at(0), 0, 1)), 1, 0)
