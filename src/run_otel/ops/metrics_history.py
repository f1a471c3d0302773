"""`backfill --metrics-out FILE`: the backfilled runs' metrics as a scrape would have seen them,
written as OpenMetrics for `promtool tsdb create-blocks-from openmetrics`."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from ..telemetry import instruments as I
from ..telemetry.history import Grid, MetricsHistory
from ..telemetry.openmetrics import write_openmetrics

log = logging.getLogger(__name__)

# Prometheus' default lookback: an instant query finds a series only within this of a sample.
LOOKBACK_SECONDS = 300

Progress = Callable[[str, int], AbstractContextManager[Callable[[int, str], None]]]


@dataclass(frozen=True)
class MetricsRequest:
    """Where the history goes, its step, and the labels the daemon's scrape gives it. No ``job``
    means [generate]'s: the job the generated rules and dashboards select on."""

    path: Path
    step: int = 60
    job: str | None = None
    instance: str = I.INSTANCE

    def labelled(self, generate_job: str) -> MetricsRequest:
        """The request with its job: --metrics-job when given, else the [generate] section's."""
        return self if self.job else replace(self, job=generate_job)


def warn_step(request: MetricsRequest) -> None:
    if request.step > LOOKBACK_SECONDS:
        log.warning(
            "--metrics-step %ds is longer than Prometheus' %ds lookback: between samples the series read as absent, "
            "and rate() needs a range of at least two steps",
            request.step,
            LOOKBACK_SECONDS,
        )


@dataclass(frozen=True)
class Written:
    path: Path
    series: int
    grid: Grid
    bytes: int
    seconds: float
    left_to_daemon: int = 0

    def describe(self) -> str:
        first, last = (datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S") for t in (self.grid.first, self.grid.last))
        return (
            f"metrics: {self.series} series x {self.grid.steps + 1} samples, {first} to {last} UTC "
            f"({self.bytes / 1e6:,.1f} MB, {self.seconds:.1f}s) in {self.path}\n"
            + (
                f"metrics: {self.left_to_daemon} run(s) left out, counted by the daemon (above its first start's mark, "
                "or taken over in flight)\n"
                if self.left_to_daemon
                else ""
            )
            + f"metrics: the daemon's own samples for these job and instance labels must start after {last} UTC; "
            f"import: promtool tsdb create-blocks-from openmetrics {self.path} DIR (docs/operations.md#metrics-history)"
        )


def write_history(history: MetricsHistory, request: MetricsRequest, progress: Progress) -> Written:
    """Writes the file beside its final name, then renames it: a reader never sees half a history."""
    started = time.monotonic()
    partial = request.path.with_name(request.path.name + ".partial")
    total = history.series_count()
    with progress(f"metrics history, {history.grid.steps + 1} steps", total) as advance:
        try:
            with partial.open("w", encoding="utf-8", buffering=1 << 20) as out:
                series = write_openmetrics(
                    history, out, request.job or I.JOB, request.instance, lambda done: advance(done, "series")
                )
            os.replace(partial, request.path)
        except OSError:
            partial.unlink(missing_ok=True)  # half a history would import as a drop in traffic
            raise
    size, seconds = request.path.stat().st_size, time.monotonic() - started
    return Written(request.path, series, history.grid, size, seconds, history.left_to_daemon)
