"""The source going backwards: a checkpoint above the newest run id.

After the agent's database is restored from an older backup (and its
AUTO_INCREMENT with it), new runs get ids at or below the high-water mark,
which the poller never reads again. Nothing fails by itself: the poll finds
no new rows. So every poll compares the mark with the newest id, and a mark
above it fails the poll with the way out, until the checkpoint is rewound.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ..sharding import Shard, shard_option
from ..source.reader import Source
from ..source.rows import RunRow
from .state_store import StateStoreError

log = logging.getLogger(__name__)


class SourceBehindError(StateStoreError):
    """The checkpoint's high-water mark is above the newest run id in the source."""


# Every run that reused an id was created after the restore, and so after the checkpoint's
# last save; the margin covers clocks apart. Re-sent runs are byte-identical, so it costs little.
MARGIN_SECONDS = 600


def rewind_command(saved_at: float | None, shard: Shard) -> str:
    """The command that makes the next poll read every id the source may have reused."""
    if saved_at is None:
        return "run-otel rewind --since <the restored backup's time>"
    since = datetime.fromtimestamp(saved_at - MARGIN_SECONDS, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"run-otel rewind --since {since}{shard_option(shard)}"


def behind_message(
    checkpoint: str, high_water: int, newest_id: int, source: str, shard: Shard, saved_at: float | None, reused: str = ""
) -> str:
    newest = reused or (f"the newest run is id {newest_id}" if newest_id else "there are no runs")
    return (
        f"checkpoint {checkpoint} is at run id {high_water}, but in {source} {newest}: the source went backwards "
        f"(restored from an older backup?), and new runs that get ids up to {high_water} would never be exported. "
        f"Recover with `{rewind_command(saved_at, shard)}` (10 minutes before the checkpoint's last save: runs "
        "already sent arrive again, byte-identical)"
    )


@dataclass
class SourceGuard:
    """Compares each poll's high-water mark with the source's newest id, and the run at
    the mark with the one this process read there: a restore followed by new runs
    past the mark leaves the newest id above it, but not the same run at it."""

    source: Source
    checkpoint: str  # the shard's checkpoint and where it is stored, for the message
    shard: Shard
    record: Callable[[int], None]  # the checkpoint-ahead gauge
    saved_at: Callable[[], float | None]  # when the checkpoint was last saved
    newest_seen: int | None = None
    marks: dict[int, str] = field(default_factory=dict)  # the last ids read at the top -> their run_id
    deleted_logged: tuple[int, int] | None = None  # the deletion last logged: (newest id, mark)

    def check(self, high_water: int, new_runs: Sequence[RunRow], batch_size: int) -> None:
        """Sets the gauge; raises SourceBehindError when the source went back below the mark.
        A poll that fails here saves nothing, so the mark stays until it is rewound."""
        known = self.marks.get(high_water)
        now = None
        if known is not None:
            rows = self.source.runs_by_ids([high_water])
            now = rows[0].run_id if rows else None
        if new_runs:
            newest = new_runs[-1].id  # a short batch ends at the newest id
        elif now is not None and now == known:
            newest = high_water  # the mark's run is still there, and nothing is above it
        else:
            newest = self.source.max_run_id()
        ahead = self.observe(high_water, newest, exact=len(new_runs) < batch_size)
        replaced = now is not None and now != known
        if ahead and not replaced and self._deleted_only(high_water, newest):
            ahead = 0
        # A replaced run at the mark may hide any number of lost runs: the gauge shows at least one.
        self.record(max(ahead, 1) if replaced else ahead)
        if new_runs:
            self._remember(new_runs[-1])
        if replaced or ahead:
            reused = f"run id {high_water} is now {now}, no longer {known}" if replaced else ""
            raise self.error(high_water, newest, reused)

    def _deleted_only(self, high_water: int, newest: int) -> bool:
        """Whether the runs above the newest id were deleted rather than the source restored: then
        AUTO_INCREMENT stays above the mark and no new run reuses an id the poller has passed."""
        next_id = self.source.next_run_id()
        if next_id is None or next_id <= high_water:
            return False
        if self.deleted_logged != (newest, high_water):
            self.deleted_logged = (newest, high_water)
            ids = f"run id {high_water}" if newest + 1 == high_water else f"run ids {newest + 1}..{high_water}"
            log.warning(
                "%s deleted from %s (the newest run is id %d); AUTO_INCREMENT is at %d, so no new run "
                "reuses them: not a restore, nothing to do",
                ids,
                self.source.describe(),
                newest,
                next_id,
            )
        return True

    def _remember(self, run: RunRow) -> None:
        self.marks[run.id] = run.run_id
        for old in sorted(self.marks)[:-4]:  # the mark may stay a few batches behind after a failed save
            del self.marks[old]

    def observe(self, high_water: int, newest_id: int, exact: bool = True) -> int:
        """How many ids the mark is above the newest; 0 when it is not, or when ``exact`` is
        False because ``newest_id`` is only a lower bound (a full batch was read)."""
        previous = self.newest_seen
        self.newest_seen = newest_id if exact else max(newest_id, previous or 0)
        if not exact:
            return 0
        if previous is not None and newest_id < previous:
            log.warning(
                "the newest run id in %s went backwards from %d to %d: runs were deleted or the database was restored",
                self.source.describe(),
                previous,
                newest_id,
            )
        return max(high_water - newest_id, 0)

    def error(self, high_water: int, newest_id: int, reused: str = "") -> SourceBehindError:
        message = behind_message(
            self.checkpoint, high_water, newest_id, self.source.describe(), self.shard, self.saved_at(), reused
        )
        return SourceBehindError(message)
