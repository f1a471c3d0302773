"""What a pass over the runs reports: the runs it exported and the counts, and
the ``Recorder`` that the metrics implement to hear about them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

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
        self.pending, self.gaps, self.full_batch = other.pending, other.gaps, other.full_batch
        self.next_settle_at = other.next_settle_at


class Recorder:
    """What the poller tells the metrics module. The default records nothing."""

    def runs_exported(self, result: PollResult, acked_at: float) -> None: ...

    def export_failed(self) -> None: ...

    def request_acknowledged(self) -> None:
        """One request of a batch was acknowledged: progress, even while the batch goes on."""

    def poll_finished(self, seconds: float, ok: bool, pending: int) -> None: ...

    def row_warnings(self, count: int) -> None: ...

    def backlog(self, runs: int, seconds: float | None) -> None: ...

    def feedback_sent(self, rows: Sequence[FeedbackRow]) -> None: ...

    def spans_dropped(self, reason: str, count: int) -> None: ...

    def checkpoint_ahead(self, runs: int) -> None: ...
