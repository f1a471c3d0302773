"""`backfill --metrics-out FILE`: the backfilled runs' metrics as a scrape would have seen them,
written as OpenMetrics for `promtool tsdb create-blocks-from openmetrics`."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ..config import FeedbackConfig
from ..pipeline.backfill import Window
from ..source.clock import SourceClock
from ..source.rows import RunRow
from ..telemetry import instruments as I
from ..telemetry.history import Grid, HistoryWindowError, MetricsHistory
from ..telemetry.openmetrics import write_openmetrics

log = logging.getLogger(__name__)

# Prometheus' default lookback: an instant query finds a series only within this of a sample.
LOOKBACK_SECONDS = 300

Progress = Callable[[str, int], AbstractContextManager[Callable[[int, str], None]]]


@dataclass(frozen=True)
class MetricsRequest:
    """Where the history goes, its step, and the labels the daemon's scrape gives it."""

    path: Path
    step: int = 60
    job: str = I.JOB
    instance: str = I.INSTANCE


def start_history(
    request: MetricsRequest, window: Window, clock: SourceClock, feedback: FeedbackConfig, now: float | None = None
) -> MetricsHistory:
    """The recorder a backfill feeds; the window's bounds are the first and last samples."""
    if window.since is None:
        raise HistoryWindowError("--metrics-out needs --since: the history starts there")
    start = clock.epoch(window.since)
    end = clock.epoch(window.until) if window.until else (time.time() if now is None else now)
    assert start is not None and end is not None  # the window's bounds are datetimes
    if request.step > LOOKBACK_SECONDS:
        log.warning(
            "--metrics-step %ds is longer than Prometheus' %ds lookback: between samples the series read as absent, "
            "and rate() needs a range of at least two steps",
            request.step,
            LOOKBACK_SECONDS,
        )
    grid = Grid.covering(start, end, request.step)

    def finished_at(run: RunRow) -> float | None:
        # A run is counted when it is exported, which follows updated_at by the settle time.
        return clock.epoch(run.updated_at) or clock.epoch(run.created_at)

    return MetricsHistory(grid, finished_at, feedback.label_of if feedback.enabled else None)


@dataclass(frozen=True)
class Written:
    path: Path
    series: int
    grid: Grid
    bytes: int
    seconds: float

    def describe(self) -> str:
        first, last = (datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S") for t in (self.grid.first, self.grid.last))
        return (
            f"metrics: {self.series} series x {self.grid.steps + 1} samples, {first} to {last} UTC "
            f"({self.bytes / 1e6:,.1f} MB, {self.seconds:.1f}s) in {self.path}\n"
            f"metrics: the daemon's own samples for these job and instance labels must start after {last} UTC; "
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
                series = write_openmetrics(history, out, request.job, request.instance, lambda done: advance(done, "series"))
            os.replace(partial, request.path)
        except OSError:
            partial.unlink(missing_ok=True)  # half a history would import as a drop in traffic
            raise
    return Written(request.path, series, history.grid, request.path.stat().st_size, time.monotonic() - started)
