"""A row's times as the spans read them, and what is odd about them.

Three shapes of time are read by a rule rather than refused, each counted by kind (the mapper's
``TimeReader.take``, then ``run_otel_row_odd_times_total``):

- a time before the Unix epoch (a zero-ish date in a zone east of UTC) reads as the epoch, with
  a warning: OTLP times are unsigned;
- a local time the zone repeats, or skips, when its offset changes reads as ``SourceClock``
  says (the first occurrence; the offset before the change), counted without a warning: it
  happens to every run in that hour, and the rule is documented;
- a tool call more than a second outside its run's own time, with a warning; the root is
  still widened to cover it, so no backend sees a child outside its parent, unless the row came
  after the root was sent (the late-row watch), which the warning then says.

The poller counts a fourth, a finished run whose ``updated_at`` lies ahead of the database's clock.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from ..source.clock import REPEATED, SourceClock
from .span_data import MAX_DURATION_MS

FUTURE_UPDATED_AT: Final = "future_updated_at"
BEFORE_EPOCH: Final = "before_epoch"
TOOL_OUTSIDE_RUN: Final = "tool_outside_run"
DST_REPEATED: Final = "dst_repeated"
DST_MISSING: Final = "dst_missing"
ODD_TIME_KINDS: Final = (FUTURE_UPDATED_AT, BEFORE_EPOCH, TOOL_OUTSIDE_RUN, DST_REPEATED, DST_MISSING)

# DATETIME holds whole seconds, so a call may end, or start, up to a second outside its run's own time.
OUTSIDE_TOLERANCE_NS: Final = 1_000_000_000


class TimeReader:
    """Reads the times of the rows one mapper maps, and keeps the count of the odd ones until taken."""

    def __init__(self, clock: SourceClock):
        self._clock = clock
        self._shifts = clock.local_shifts
        self.tally: dict[str, int] = {}

    def ns(self, value: object) -> int | None:
        """Unix nanoseconds, as ``SourceClock.epoch_ns``; a local time the zone repeats or skips is counted."""
        ns = self._clock.epoch_ns(value)
        if isinstance(value, datetime) and value.tzinfo is None:
            kind = self._shifts.kind(value)
            if kind is not None:
                self.count(DST_REPEATED if kind == REPEATED else DST_MISSING)
        return ns

    def before_epoch(self, value: object, where: str, warnings: list[str]) -> bool:
        """For a value that read as 0 or None: True, with a warning, when it is a date before the epoch."""
        if not isinstance(value, datetime):
            return False
        warnings.append(
            f"{where} {value:%Y-%m-%d %H:%M:%S} ({self._clock.zone_name}) is before the Unix epoch; read as 1970-01-01T00:00:00Z"
        )
        self.count(BEFORE_EPOCH)
        return True

    def outside(self, count: int, farthest_id: int, seconds: float, warnings: list[str], late: bool = False) -> None:
        """``count`` tool rows more than a second outside their run's own time; the farthest by ``seconds``.
        ``late``: rows sent after their run's root, which is not sent again, so it is not widened."""
        where = "before its start" if seconds < 0 else "after its end"
        outcome = (
            "its root, sent before them, is not sent again, so a trace view shows them outside it"
            if late
            else "the root is widened to cover them"
        )
        warnings.append(
            f"{count} tool row(s) lie outside the run's own time (created_at to created_at + total_duration_ms, "
            f"else updated_at), the farthest, tool_invocation {farthest_id}, {abs(seconds):.0f}s {where}: {outcome}"
        )
        self.count(TOOL_OUTSIDE_RUN, count)

    def count(self, kind: str, n: int = 1) -> None:
        self.tally[kind] = self.tally.get(kind, 0) + n

    def take(self) -> dict[str, int]:
        """The counts since the last take, by kind."""
        taken, self.tally = self.tally, {}
        return taken


def _where(row: str, row_id: int | None, column: str) -> str:
    # Built only when there is something to say: formatting it per row is measurable.
    return f"{row}.{column}" if row_id is None else f"{row} {row_id}: {column}"


def valid_duration(value: int | None, warnings: list[str], row: str, row_id: int | None, column: str) -> int | None:
    """A duration, or None with a warning when below 0 or above a day: a broken row, not a slow call."""
    if value is None:
        return None
    if value < 0 or value > MAX_DURATION_MS:
        warnings.append(f"{_where(row, row_id, column)} out of range ({value} ms)")
        return None
    return value
