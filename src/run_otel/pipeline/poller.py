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

from ..config import PollConfig
from ..sharding import in_shard
from ..source.clock import zone_finding
from ..source.reader import Source, SourceError
from ..source.rows import RunRow
from .checkpoint import Checkpoint, CheckpointStore
from .gc_policy import BatchCollection
from .guard import SourceGuard
from .results import PollResult, Recorder
from .run_export import RunExporter
from .transitions import Classified, Rules, advance, classify, expire_gaps, initial_checkpoint

log = logging.getLogger(__name__)


class Poller:
    def __init__(
        self,
        poll: PollConfig,
        source: Source,
        store: CheckpointStore,
        exporter: RunExporter,
        recorder: Recorder,
        keep_feedback: bool = False,
        clock: Callable[[], float] = time.time,
        keep_going: Callable[[], bool] = lambda: True,
    ):
        self._poll = poll
        # Feedback the root already carries is saved with the checkpoint when the feedback pass runs.
        self._feedback = keep_feedback
        self._source = source
        self._store = store
        self._exporter = exporter
        self._recorder = recorder
        self._clock = clock
        self._rules = Rules.from_config(poll)
        self._zone_checked = False
        self._high_water: int | None = None
        self._checkpoint_pending = 0  # the last loaded checkpoint's, for the gauge when a poll fails
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
            with BatchCollection() as collection:
                while True:
                    self.progress_at = time.monotonic()
                    result = self._poll_batch()
                    self.progress_at = time.monotonic()
                    total.add(result)
                    if not result.full_batch or self.stop_requested.is_set() or not self._keep_going():
                        break
                    collection.after_batch()
        except Exception:
            self._recorder.poll_finished(self._clock() - started, ok=False, pending=self._checkpoint_pending)
            self._record_backlog()  # an outage is when the backlog matters most
            raise
        self._recorder.poll_finished(self._clock() - started, ok=True, pending=total.pending)
        self._record_backlog()
        return total

    # -- one batch ----------------------------------------------------------

    def _poll_batch(self) -> PollResult:
        checkpoint = self._load_checkpoint()
        self._high_water, self._checkpoint_pending = checkpoint.high_water, len(checkpoint.pending)
        self._check_zone_once()
        now = self._clock()
        new_runs = self._source.runs_after(checkpoint.high_water, self._poll.batch_size)
        self._guard.check(checkpoint.high_water, new_runs, self._poll.batch_size)
        rechecked = self._source.runs_by_ids(checkpoint.pending.keys() | checkpoint.gaps.keys())
        following = checkpoint.copy()
        dropped = advance(following, [run.id for run in new_runs], now)
        if dropped:
            log.warning("%d ids missing below run id %d; tracking only the last of them", dropped, new_runs[-1].id)
        for run in new_runs:
            self._exporter.note_status(run.status)
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
        acked_at = self._clock()
        # Feedback the root already carries is recorded with the checkpoint, in one transaction:
        # the feedback recheck then sends only what is set or changed after the export.
        rated = {run.run_id: run.feedback for run in decided.to_export if run.feedback is not None} if self._feedback else {}
        self._store.save(following, acked_at, rated)
        self._high_water = following.high_water
        self._log_incomplete(decided)
        result.pending, result.gaps = len(following.pending), len(following.gaps)
        result.full_batch = len(new_runs) >= self._poll.batch_size
        result.next_settle_at = decided.next_settle_at
        try:
            self._recorder.runs_exported(result, acked_at)
        except Exception:  # the batch is sent and checkpointed: a metric must not turn that into a failed poll
            log.exception("metrics: recording the exported runs failed; the runs were exported and checkpointed")
        return result

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
        return checkpoint

    def _check_zone_once(self) -> None:
        """Logs a wrong-looking source.timezone once, and stops trusting the timestamps for timeouts."""
        if self._zone_checked:
            return
        sample = self._source.clock_sample()
        self._zone_checked = True
        finding = zone_finding(sample, self._source.clock) if sample else None
        if finding:
            log.warning(finding.message(self._source.clock.zone_name))
            self._rules = Rules.from_config(self._poll, trust_timestamps=False)

    def _in_shard(self, run: RunRow) -> bool:
        return in_shard(run.run_id, self._shard)
