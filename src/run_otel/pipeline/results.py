"""What a pass over the runs reports: the runs it exported, and the counts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..mapping.span_data import RunIdentity
from ..mapping.spans import Late
from ..source.rows import RunRow, ToolRow


@dataclass
class ExportedRun:
    run: RunRow
    tools: Sequence[ToolRow]
    incomplete: bool
    span_count: int
    # Unix time the run became exportable (updated_at), for the export-delay metric.
    settled_at: float | None = None
    # Set when this was a later send of a run exported before: what it added.
    late: Late | None = None
    # Set for a later row with a run id an earlier row has: the ids of its own (pipeline/duplicates.py).
    identity: RunIdentity | None = None

    @property
    def late_tools(self) -> list[ToolRow]:
        """The tool rows this later send added to the run's trace."""
        if self.late is None:
            return []
        return [tool for tool in self.tools if tool.id in self.late.tool_ids]


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
    # A stop in the middle of a batch: only ``runs`` were acknowledged; ``unsent`` were prepared, not sent.
    interrupted: bool = False
    unsent: list[RunRow] = field(default_factory=list)
    batches: int = 0  # the batches acknowledged and checkpointed

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
        self.batches += other.batches
        self.interrupted = self.interrupted or other.interrupted
        self.pending, self.gaps, self.full_batch = other.pending, other.gaps, other.full_batch
        self.next_settle_at = other.next_settle_at
