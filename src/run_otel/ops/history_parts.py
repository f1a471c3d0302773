"""What a backfill's metrics history is built from: the grid over its window, when each run
counts, and which runs the daemon's live metrics count instead."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..config import Config
from ..factory import build_store
from ..pipeline.backfill import Window
from ..pipeline.state_store import StateStoreError
from ..source.clock import SourceClock
from ..source.rows import RunRow
from ..telemetry.bounds import LabelBounds
from ..telemetry.history import Grid, HistoryWindowError, MetricsHistory


def build_history(config: Config, window: Window, step: int, now: float | None = None) -> MetricsHistory:
    """What `backfill --metrics-out` records into: a sample every ``step`` seconds from the window's
    start to its end (or now), each run counted after its ``updated_at`` in the source's zone."""
    if window.since is None:
        raise HistoryWindowError("--metrics-out needs --since: the history starts there")
    clock = SourceClock(config.source.timezone)
    start = clock.epoch(window.since)
    end = clock.epoch(window.until) if window.until else (time.time() if now is None else now)
    assert start is not None and end is not None  # the window's bounds are datetimes

    def finished_at(run: RunRow) -> float | None:
        # A run is counted when it is exported, which follows updated_at by the settle time.
        return clock.epoch(run.updated_at) or clock.epoch(run.created_at)

    feedback = config.feedback
    label_of = feedback.label_of if feedback.enabled else None
    grid = Grid.covering(start, end, step)
    return MetricsHistory(grid, finished_at, label_of, daemon_counted(config), LabelBounds.of(config.metrics))


def daemon_counted(config: Config) -> Callable[[RunRow], bool] | None:
    """The runs the daemon's live metrics count, from its checkpoint (read only): those above its
    first start's mark and those it took over in flight. None before the daemon's first start,
    or for a checkpoint saved before the mark was kept."""
    try:
        store = build_store(config, create=False)
    except StateStoreError:
        return None
    try:
        checkpoint = store.load()
    finally:
        store.close()
    if checkpoint is None or not checkpoint.start_mark:
        return None
    mark, taken_over = checkpoint.start_mark, frozenset(checkpoint.taken_over)
    return lambda run: run.id > mark or run.id in taken_over
