"""`backfill --metrics-out FILE` and `--metrics-push URL`: the backfilled runs' metrics as a scrape
would have seen them, written as OpenMetrics for `promtool tsdb create-blocks-from openmetrics`,
or pushed by remote write (``metrics_push``)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ..telemetry import instruments as I
from ..telemetry.history import Grid, MetricsHistory
from ..telemetry.openmetrics import write_openmetrics

if TYPE_CHECKING:
    from .metrics_push import Pushed

log = logging.getLogger(__name__)

# Prometheus' default lookback: an instant query finds a series only within this of a sample.
LOOKBACK_SECONDS = 300
# Grafana's shortest $__rate_interval: four scrape intervals of 15 s, the shipped data source's.
# A rate() needs two samples in it, so a push a dashboard can zoom into has a step of half that.
SHORTEST_RATE_WINDOW = 60
# The steps when none is given: half the shortest rate window for a push, the file's own since it began.
PUSH_STEP, FILE_STEP = 30, 60

Progress = Callable[[str, int], AbstractContextManager[Callable[[int, str], None]]]


@dataclass(frozen=True)
class MetricsRequest:
    """Where the history goes (a file, or a remote-write URL with its headers), its step, and the
    labels the daemon's scrape gives it. No ``job`` means [generate]'s: the job the generated rules
    and dashboards select on. No ``step`` means the target's own: a scrape's for a push."""

    path: Path | None
    step: int | None = None
    job: str | None = None
    instance: str = I.INSTANCE
    push_url: str | None = None
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def flag(self) -> str:
        return "--metrics-push" if self.push_url else "--metrics-out"

    @property
    def target(self) -> str:
        return self.push_url or str(self.path)

    @property
    def seconds(self) -> int:
        return self.step or (PUSH_STEP if self.push_url else FILE_STEP)

    def labelled(self, generate_job: str) -> MetricsRequest:
        """The request with its job: --metrics-job when given, else the [generate] section's."""
        return self if self.job else replace(self, job=generate_job)


def warn_step(request: MetricsRequest) -> None:
    if request.push_url and request.seconds > SHORTEST_RATE_WINDOW // 2:
        log.warning(
            "--metrics-step %ds is more than half of Grafana's shortest rate window (%ds, four scrape intervals of 15 s): "
            "a day's view of the dashboards shows gaps where rate() finds one sample",
            request.seconds,
            SHORTEST_RATE_WINDOW,
        )
    if request.seconds > LOOKBACK_SECONDS:
        log.warning(
            "--metrics-step %ds is longer than Prometheus' %ds lookback: between samples the series read as absent, "
            "and rate() needs a range of at least two steps",
            request.seconds,
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
            + (
                f"\nmetrics: at {self.grid.step}s apart, rate() over a day's view finds one sample or none; "
                "--metrics-push URL sends samples 30 s apart by remote write, without a file"
                if self.grid.step > SHORTEST_RATE_WINDOW // 2
                else ""
            )
        )


def check_target(history: MetricsHistory, request: MetricsRequest) -> None:
    """Before the backfill: a push's receiver is there and takes samples as old as the history's.
    Raises PushError."""
    if request.push_url:
        from .metrics_push import check_receiver

        check_receiver(history, request.push_url, request.headers, request.job or I.JOB, request.instance)


def deliver(history: MetricsHistory, request: MetricsRequest, progress: Progress) -> Written | Pushed:
    """The history written to its file, or pushed to its URL. Raises OSError or PushError."""
    if request.push_url:
        from .metrics_push import push_history

        return push_history(history, request.push_url, request.headers, request.job or I.JOB, request.instance, progress)
    return write_history(history, request, progress)


def write_history(history: MetricsHistory, request: MetricsRequest, progress: Progress) -> Written:
    """Writes the file beside its final name, then renames it: a reader never sees half a history."""
    assert request.path is not None  # a request without a push URL has a file
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
