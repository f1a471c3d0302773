"""What a pass over the runs reports: the runs it exported and the counts, and
the ``Recorder`` that the metrics implement to hear about them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..source.rows import FeedbackRow, RunRow, ToolRow


@dataclass
class ExportedRun:
    run: RunRow
    tools: Sequence[ToolRow]
    incomplete: bool
    span_count: int
    # Unix time the run became exportable (updated_at), for the export-delay metric.
    settled_at: float | None = None


@dataclass
class LateRun:
    """A run exported before, with what it sends now: tool rows committed after its export
    and, for a run sent as incomplete that has finished, its final outcome."""

    run: RunRow
    tools: Sequence[ToolRow]  # all of its tool rows, the late ones among them
    late_ids: frozenset[int]
    completed: bool

    @property
    def late_tools(self) -> list[ToolRow]:
        return [tool for tool in self.tools if tool.id in self.late_ids]


@dataclass
class PollResult:
    """One batch's exported runs; a total over batches keeps the counts only, so a
    long drain or backfill holds one batch in memory, never the backlog."""

    runs: list[ExportedRun] = field(default_factory=list)
    run_count: int = 0
    spans: int = 0
    rejected_spans: int = 0
    dropped_spans: int = 0  # given up on as too large, after splitting and cutting
    warnings: int = 0
    pending: int = 0
    gaps: int = 0
    full_batch: bool = False
    # Backfill: rows inside the id range but created outside the time window.
    outside_window: int = 0
    # Backfill: runs of the window still running (or not settled), left to the daemon.
    in_flight: int = 0
    # When the first finished-but-unsettled run becomes exportable (Unix time).
    next_settle_at: float | None = None

    @property
    def accepted_spans(self) -> int:
        """The spans the receiver took: neither rejected by it nor dropped by run-otel."""
        return max(self.spans - self.rejected_spans - self.dropped_spans, 0)

    def add(self, other: PollResult) -> None:
        self.run_count += other.run_count
        self.spans += other.spans
        self.rejected_spans += other.rejected_spans
        self.dropped_spans += other.dropped_spans
        self.warnings += other.warnings
        self.outside_window += other.outside_window
        self.in_flight += other.in_flight
        self.pending, self.gaps, self.full_batch = other.pending, other.gaps, other.full_batch
        self.next_settle_at = other.next_settle_at


class Recorder:
    """What the poller tells the metrics module. The default records nothing."""

    def runs_exported(self, result: PollResult, acked_at: float) -> None: ...

    def export_failed(self) -> None: ...

    def request_acknowledged(self) -> None:
        """One request of a batch was acknowledged: progress, even while the batch goes on."""

    def poll_finished(self, seconds: float, ok: bool, pending: int, oldest_pending: float = 0.0) -> None:
        """``oldest_pending``: seconds the longest-waiting pending run has waited since first seen."""

    def row_warnings(self, count: int) -> None: ...

    def backlog(self, runs: int, seconds: float | None) -> None: ...

    def feedback_sent(self, rows: Sequence[FeedbackRow]) -> None: ...

    def late_sent(self, runs: Sequence[LateRun]) -> None: ...

    def pending_deleted(self, count: int) -> None: ...

    def clock_offset(self, seconds: float) -> None: ...

    def zone_suspect(self, message: str | None) -> None: ...

    def spans_dropped(self, reason: str, count: int) -> None: ...

    def checkpoint_ahead(self, runs: int) -> None: ...


class Tee(Recorder):
    """Tells every recorder given (the live metrics and a backfill's history, say) what happened:
    every Recorder method, so one added later reaches them all."""

    def __init__(self, *recorders: Recorder):
        self._recorders = recorders


def _fan_out(name: str) -> Callable[..., None]:
    def method(self: Tee, *args: Any, **kwargs: Any) -> None:
        for recorder in self._recorders:
            getattr(recorder, name)(*args, **kwargs)

    method.__name__ = name
    return method


for _name, _member in vars(Recorder).items():
    if callable(_member) and not _name.startswith("_"):
        setattr(Tee, _name, _fan_out(_name))
