"""The loop: read new and waiting runs, map them, send them, then checkpoint.

The order is the delivery guarantee: the checkpoint is saved only after every
request of the batch was acknowledged, and metrics are recorded only after the
checkpoint is saved, so a replay after a crash re-sends spans (identical
bytes) but never counts a run twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from ..config import PollConfig
from ..sharding import in_shard
from ..source.clock import zone_finding
from ..source.errors import ConnectionLost
from ..source.reader import Source, SourceError
from ..source.rows import RunRow
from .checkpoint import Checkpoint
from .gc_policy import BatchCollection
from .guard import SourceGuard
from .late_rows import LatePass
from .recorder import Recorder
from .results import PollResult
from .run_export import RunExporter
from .state_store import StateStore
from .transitions import (
    Classified,
    Rules,
    advance,
    classify,
    expire_gaps,
    in_flight_since,
    initial_checkpoint,
    take_over,
)

log = logging.getLogger(__name__)


class Poller:
    def __init__(
        self,
        poll: PollConfig,
        source: Source,
        store: StateStore,
        exporter: RunExporter,
        recorder: Recorder,
        late: LatePass | None = None,
        clock: Callable[[], float] = time.time,
        keep_going: Callable[[], bool] = lambda: True,
    ):
        self._poll = poll
        self._source = source
        self._store = store
        self._exporter = exporter
        self._recorder = recorder
        # Keeps exported runs' traces complete after the poll; None when poll.late_window_seconds is 0.
        self._late = late
        self._clock = clock
        self._rules = Rules.from_config(poll)
        self._zone_checked = False
        self._high_water: int | None = None
        self._checkpoint_pending = 0  # the last loaded checkpoint's, for the gauge when a poll fails
        self._missed_once: set[int] = set()  # pending runs the last poll did not find
        self._offset = 0.0  # the database's clock minus this host's, measured each poll
        self._waiting_since: float | None = None  # the first seen time of the longest-waiting pending run
        # The checkpoint is one shard's: the store says which.
        self._shard = shard = store.shard
        where = f"{store.name} in {store.describe()}"
        self._guard = SourceGuard(source, where, shard, recorder.checkpoint_ahead, store.saved_at)
        self.stop_requested = threading.Event()
        # Asked between batches of a long drain; the HA lease answers False once lost.
        self._keep_going = keep_going
        # time.monotonic() of the last batch started or finished, for liveness.
        self.progress_at = time.monotonic()

    def poll(self) -> PollResult:
        """Batches until the backlog is drained (or a stop is requested)."""
        started = self._clock()
        total = PollResult()
        try:
            self._measure_offset()
            with BatchCollection() as collection:
                while True:
                    self.progress_at = time.monotonic()
                    result = self._poll_batch()
                    self.progress_at = time.monotonic()
                    total.add(result)
                    if not result.full_batch or self.stop_requested.is_set() or not self._keep_going():
                        break
                    collection.after_batch()
            if self._late is not None:
                self._late.run()
        except Exception as exc:
            self._recorder.poll_finished(
                self._clock() - started, ok=False, pending=self._checkpoint_pending, oldest_pending=self._oldest_pending()
            )
            if not isinstance(exc, ConnectionLost):  # a database that stopped answering would only hold the failure up
                self._record_backlog()  # an outage is when the backlog matters most
            raise
        self._recorder.poll_finished(
            self._clock() - started, ok=True, pending=total.pending, oldest_pending=self._oldest_pending()
        )
        self._record_backlog()
        return total

    def _oldest_pending(self) -> float:
        """Seconds the longest-waiting pending run has waited since first seen (0 with none): one
        stuck run shows here long before the pending count stands out."""
        return 0.0 if self._waiting_since is None else max(self._clock() - self._waiting_since, 0.0)

    # -- one batch ----------------------------------------------------------

    def _poll_batch(self) -> PollResult:
        checkpoint = self._load_checkpoint()
        self._high_water, self._checkpoint_pending = checkpoint.high_water, len(checkpoint.pending)
        self._waiting_since = min(checkpoint.pending.values(), default=None)
        self._check_zone_once()
        now = self._clock() + self._offset  # the database's time: settle and timeouts compare its timestamps
        new_runs = self._source.runs_after(checkpoint.high_water, self._poll.batch_size)
        self._guard.check(checkpoint.high_water, new_runs, self._poll.batch_size)
        rechecked = self._source.runs_by_ids(checkpoint.pending.keys() | checkpoint.gaps.keys())
        following = checkpoint.copy()
        self._drop_deleted(following, rechecked)
        dropped = advance(following, [run.id for run in new_runs], now)
        if dropped:
            log.warning("%d ids missing below run id %d; tracking only the last of them", dropped, new_runs[-1].id)
        decided = classify(following, [*rechecked, *new_runs], now, self._rules, self._source.clock, self._in_shard)
        expired = expire_gaps(following, now, self._rules.gap_timeout_seconds)
        if expired:
            log.info(
                "gave up on %d missing run ids after %.0fs (rolled back or deleted)",
                len(expired),
                self._rules.gap_timeout_seconds,
            )
        try:
            result = self._exporter.export(decided.to_export, decided.incomplete)
        except Exception:
            self._recorder.export_failed()
            raise
        for run in new_runs:  # once the batch is sent: a failed poll reads the same runs again
            self._exporter.note_status(run.status)
        acked_at = self._clock()
        watched = self._late.watch(result.runs, acked_at) if self._late is not None else None
        self._store.save(following, acked_at, watched)
        if self._late is not None and watched:
            self._late.remember(watched)
        self._high_water = following.high_water
        self._log_incomplete(decided)
        result.pending, result.gaps = len(following.pending), len(following.gaps)
        self._waiting_since = min(following.pending.values(), default=None)
        result.full_batch = len(new_runs) >= self._poll.batch_size
        result.next_settle_at = decided.next_settle_at
        try:
            self._recorder.runs_exported(result, acked_at + self._offset)
        except Exception:  # the batch is sent and checkpointed: a metric must not turn that into a failed poll
            log.exception("metrics: recording the exported runs failed; the runs were exported and checkpointed")
        return result

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

    def _log_incomplete(self, decided: Classified) -> None:
        """One line per run sent unfinished: an operator looks for the agent's stuck runs by id."""
        for run in decided.to_export:
            if run.id in decided.incomplete:
                log.warning(
                    "run %s sent as incomplete: status %s, not finished after %.0fs (poll.run_timeout_seconds = %g)",
                    run.run_id,
                    run.status,
                    decided.stuck_seconds.get(run.id, 0.0),
                    self._rules.run_timeout_seconds,
                )

    def _record_backlog(self) -> None:
        """What is left after the poll: run ids above the checkpoint, and how much newer they are."""
        if self._high_water is None:
            return
        try:
            backlog = self._source.backlog(self._high_water, self._source.clock)
        except SourceError:
            return  # the database is away: the poll's own error says so
        # No runs at all is no backlog: 0, so the gauges exist from the first poll attempt.
        runs, seconds = (backlog.runs, backlog.seconds) if backlog else (0, 0.0)
        self._recorder.backlog(runs, seconds)

    def _load_checkpoint(self) -> Checkpoint:
        saved = self._store.load()
        if saved is not None:
            return saved
        start = self._poll.start_from
        checkpoint = initial_checkpoint(start, self._source.max_run_id() if start == "now" else 0)
        # Runs at or below the first mark are not this bridge's: the feedback pass leaves their ratings alone.
        checkpoint.start_mark = checkpoint.high_water
        # From "beginning" a lost checkpoint only re-sends; from "now" or an id it may skip runs.
        level = logging.INFO if start == "beginning" else logging.WARNING
        log.log(
            level,
            "no checkpoint for %s in %s: starting after run id %d (poll.start_from=%s)",
            self._store.name,
            self._store.describe(),
            checkpoint.high_water,
            start,
        )
        if start == "now":
            self._take_over_in_flight(checkpoint)
        return checkpoint

    def _take_over_in_flight(self, checkpoint: Checkpoint) -> None:
        """A first start from "now" sets the mark at the newest run: the runs below it still in
        flight would be skipped, by the poll and by a backfill that runs before they finish."""
        now = self._clock()
        since = self._source.clock.naive(datetime.fromtimestamp(in_flight_since(now, self._rules), UTC))
        cursor = self._source.first_id_created_at_or_after(since) - 1
        taken = 0
        while cursor < checkpoint.high_water:
            runs = self._source.runs_after(cursor, self._poll.batch_size, until_id=checkpoint.high_water)
            if not runs:
                break
            taken += take_over(checkpoint, [r for r in runs if self._in_shard(r)], now, self._rules, self._source.clock)
            cursor = runs[-1].id
        # Below the start mark, yet sent by this bridge: the feedback pass sends their ratings too.
        checkpoint.taken_over = set(checkpoint.pending)
        if taken:
            log.info(
                "first start: %d run(s) below run id %d still in flight are pending; each is sent when it finishes",
                taken,
                checkpoint.high_water,
            )

    def _measure_offset(self) -> None:
        """The database's clock against this host's, once a poll: its timestamps are on its clock."""
        offset = self._source.clock_offset(self._clock)
        self._offset = offset or 0.0
        if offset is not None:
            self._recorder.clock_offset(offset)

    def _check_zone_once(self) -> None:
        """Logs a wrong-looking source.timezone once, and stops trusting the timestamps for timeouts."""
        if self._zone_checked:
            return
        sample = self._source.clock_sample()
        self._zone_checked = True
        finding = zone_finding(sample, self._source.clock) if sample else None
        message = finding.message(self._source.clock.zone_name) if finding else None
        if message:
            log.warning(message)
            self._rules = Rules.from_config(self._poll, trust_timestamps=False)
        # Kept on a gauge and in readiness while it lasts, not only in one line.
        self._recorder.zone_suspect(message)

    def _in_shard(self, run: RunRow) -> bool:
        return in_shard(run.run_id, self._shard)
