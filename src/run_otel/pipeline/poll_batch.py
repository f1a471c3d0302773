"""One batch of the poll, before it is sent: the runs read above the checkpoint and again
below it, and what the checkpoint would be once they are acknowledged.

Pure reads and decisions on a checkpoint held in memory, so the poller reads and maps
the next batch while the one before is sent, as a backfill does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ..source.reader import Source
from ..source.rows import RunRow, ToolRow
from .checkpoint import Checkpoint
from .guard import SourceGuard
from .recorder import Recorder
from .transitions import Classified, Rules, advance, classify, expire_gaps

log = logging.getLogger(__name__)


@dataclass
class Batch:
    before: Checkpoint  # where the batch starts
    following: Checkpoint  # where it ends once every run it sends is acknowledged
    decided: Classified
    new_runs: list[RunRow]  # the runs read above the checkpoint
    full: bool  # as many new runs as poll.batch_size: more may wait
    tools: dict[str, list[ToolRow]] | None = None  # the tool rows of the runs to send, by run_id


class BatchReader:
    def __init__(
        self,
        source: Source,
        guard: SourceGuard,
        recorder: Recorder,
        batch_size: int,
        in_shard: Callable[[RunRow], bool],
    ):
        self._source = source
        self._guard = guard
        self._recorder = recorder
        self._batch_size = batch_size
        self._in_shard = in_shard
        self._missed_once: set[int] = set()  # pending runs the last read did not find

    def read(self, checkpoint: Checkpoint, now: float, rules: Rules) -> Batch:
        """The runs above ``checkpoint`` and its pending runs and gaps again, classified at ``now``
        (the database's time). ``checkpoint`` is left as it is."""
        new_runs = self._source.runs_after(checkpoint.high_water, self._batch_size)
        self._guard.check(checkpoint.high_water, new_runs, self._batch_size)
        rechecked = self._source.runs_by_ids(checkpoint.pending.keys() | checkpoint.gaps.keys())
        following = checkpoint.copy()
        self._drop_deleted(following, rechecked)
        dropped = advance(following, [run.id for run in new_runs], now)
        if dropped:
            log.warning("%d ids missing below run id %d; tracking only the last of them", dropped, new_runs[-1].id)
        decided = classify(following, [*rechecked, *new_runs], now, rules, self._source.clock, self._in_shard)
        expired = expire_gaps(following, now, rules.gap_timeout_seconds)
        if expired:
            log.info(
                "gave up on %d missing run ids after %.0fs (rolled back or deleted)", len(expired), rules.gap_timeout_seconds
            )
        return Batch(checkpoint, following, decided, new_runs, len(new_runs) >= self._batch_size)

    def _drop_deleted(self, checkpoint: Checkpoint, rechecked: list[RunRow]) -> None:
        """Pending runs gone from the source (deleted by the agent) stay pending for good otherwise.
        A run missed once is re-checked at the next poll; missed again, it is dropped."""
        found = {run.id for run in rechecked}
        missing = {run_pk for run_pk in checkpoint.pending if run_pk not in found}
        deleted = sorted(missing & self._missed_once)
        self._missed_once = missing - set(deleted)
        if not deleted:
            return
        for run_pk in deleted:
            del checkpoint.pending[run_pk]
        shown = ", ".join(map(str, deleted[:10])) + (", …" if len(deleted) > 10 else "")
        log.warning(
            "%d pending run(s) were deleted from diagnosis_run before they finished (run id %s): no longer waited for",
            len(deleted),
            shown,
        )
        self._recorder.pending_deleted(len(deleted))
