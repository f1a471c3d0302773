"""A metrics history as OpenMetrics text that ``promtool tsdb create-blocks-from openmetrics`` imports.

What the import needs, and a scrape of ``/metrics`` would give: one block per metric family
(``# HELP``, ``# TYPE``, ``# UNIT`` as prometheus_client writes them), counters' samples named
``_total``, a timestamp in seconds on every sample, each series' samples in time order, the
daemon's labels (its own, the ``otel_scope_*`` ones, and the scrape's ``job`` and ``instance``),
and ``# EOF``. Exemplars sit on the sample of the step a run changed: a counter's line, or the
histogram bucket that holds the value.

Every series has a sample at every step, as a scrape would give it; between two changes only
the timestamp differs, so each stretch is written from one template per series.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TextIO

from .. import __version__
from . import instruments as I
from .history import CounterChanges, Exemplar, HistogramChanges, MetricsHistory

# The labels the SDK's Prometheus exporter adds to every series; an empty schema URL is no label.
SCOPE_LABELS = (("otel_scope_name", "run_otel"), ("otel_scope_version", __version__))
# Where the timestamp goes in a template of a step's lines.
_TS = "\x00"


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def number(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))


def write_openmetrics(
    history: MetricsHistory, out: TextIO, job: str, instance: str, advance: Callable[[int], None] = lambda done: None
) -> int:
    """Writes every family of the run instruments; returns the number of series written."""
    writer = _Writer(history, out, (("job", job), ("instance", instance), *SCOPE_LABELS))
    for instrument in I.RUN_INSTRUMENTS:
        writer.family(instrument)
        advance(writer.written)
    out.write("# EOF\n")
    return writer.written


class _Writer:
    def __init__(self, history: MetricsHistory, out: TextIO, common: Iterable[tuple[str, str]]):
        self._history = history
        self._out = out
        self._common = tuple(common)
        self._timestamps = history.grid.timestamps()
        self.written = 0

    def family(self, instrument: I.Instrument) -> None:
        series = list(self._history.series_of(instrument))
        if not series:
            return
        name = instrument.prometheus.removesuffix("_total")
        self._out.write(f"# HELP {name} {escape(instrument.description)}\n# TYPE {name} {instrument.kind}\n")
        if instrument.unit == "s":
            self._out.write(f"# UNIT {name} seconds\n")
        for values, changes in series:
            labels = self._labels(instrument, values)
            if isinstance(changes, HistogramChanges):
                self._histogram(instrument, labels, changes)
            else:
                self._counter(instrument, labels, changes)
            self.written += 1

    def _labels(self, instrument: I.Instrument, values: tuple[str, ...]) -> str:
        pairs = (*zip(instrument.labels, values), *self._common)
        return ",".join(f'{key}="{escape(value)}"' for key, value in pairs)

    def _counter(self, instrument: I.Instrument, labels: str, changes: CounterChanges) -> None:
        prefix = f"{instrument.prometheus}{{{labels}}} "
        total, done = 0.0, 0
        for step in sorted(changes.deltas):
            self._repeat(prefix + number(total) + " " + _TS + "\n", done, step)
            total += changes.deltas[step]
            line = f"{prefix}{number(total)} {self._timestamps[step]}"
            exemplar = changes.exemplars.get(step)
            self._out.write(line + (_exemplar(exemplar) if exemplar else "") + "\n")
            done = step + 1
        self._repeat(prefix + number(total) + " " + _TS + "\n", done, len(self._timestamps))

    def _histogram(self, instrument: I.Instrument, labels: str, changes: HistogramChanges) -> None:
        bounds = (*changes.bounds, math.inf)
        prefixes = [f'{instrument.series("_bucket")}{{{labels},le="{_le(b)}"}} ' for b in bounds]
        count_prefix = f"{instrument.series('_count')}{{{labels}}} "
        sum_prefix = f"{instrument.series('_sum')}{{{labels}}} "
        per_bucket, observations, total, done = [0] * len(bounds), 0, 0.0, 0

        def block(exemplars: dict[int, Exemplar] | None = None) -> str:
            lines, running = [], 0
            for index, prefix in enumerate(prefixes):
                running += per_bucket[index]
                exemplar = exemplars.get(index) if exemplars else None
                lines.append(f"{prefix}{running} {_TS}{_exemplar(exemplar) if exemplar else ''}\n")
            lines.append(f"{count_prefix}{observations} {_TS}\n{sum_prefix}{number(total)} {_TS}\n")
            return "".join(lines)

        for step in sorted(changes.counts):
            self._repeat(block(), done, step)
            for index, count in enumerate(changes.counts[step]):
                per_bucket[index] += count
            observations += sum(changes.counts[step])
            total += changes.sums[step]
            self._out.write(block(changes.exemplars.get(step)).replace(_TS, self._timestamps[step]))
            done = step + 1
        self._repeat(block(), done, len(self._timestamps))

    def _repeat(self, template: str, start: int, stop: int) -> None:
        """The same lines at steps [start, stop): only the timestamp changes."""
        if stop <= start:
            return
        if template.count(_TS) == 1 and template.endswith(_TS + "\n"):
            head = template[: -len(_TS) - 1]  # one line: join the timestamps with the line's start between them
            self._out.write(head + ("\n" + head).join(self._timestamps[start:stop]) + "\n")
            return
        self._out.write("".join(template.replace(_TS, ts) for ts in self._timestamps[start:stop]))


def _le(bound: float) -> str:
    return "+Inf" if bound == math.inf else repr(float(bound))


def _exemplar(exemplar: Exemplar) -> str:
    ids = f'trace_id="{exemplar.trace_id.hex()}",span_id="{exemplar.span_id.hex()}"'
    return f" # {{{ids}}} {number(exemplar.value)} {exemplar.at:.3f}"
