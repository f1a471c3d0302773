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
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime

from ..config import PollConfig
from ..export.sinks import ExportError
from ..mapping.times import FUTURE_UPDATED_AT
from ..sharding import in_shard
from ..source.clock import zone_finding
from ..source.errors import ConnectionLost
from ..source.reader import Source, SourceError
from ..source.rows import RunRow
from .checkpoint import Checkpoint
from .gc_policy import BatchCollection
from .guard import SourceGuard
from .late_rows import LatePass
from .poll_batch import Batch, BatchReader
from .readahead import ReadAhead
from .recorder import Recorder
from .results import PollResult
from .run_export import RunExporter
from .state_store import StateStore, StateStoreError
from .tool_feed import ToolFeed
from .transitions import Classified, Rules, cut, in_flight_since, initial_checkpoint, take_over

log = logging.getLogger(__name__)

BACKLOG_EVERY_SECONDS = 1.0


def failed_part(exc: BaseException) -> str:
    """Which part of the path a poll failed in, for /readyz: a fixed phrase, never the error's text."""
    if isinstance(exc, SourceError):
        return "reading the database"
    if isinstance(exc, ExportError):
        return "sending to the OTLP endpoint"
    if isinstance(exc, StateStoreError):
        return "the state store"
    return "an unexpected error"


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
        self._offset = 0.0  # the database's clock minus this host's, measured each poll
        self._waiting_since: float | None = None  # the first seen time of the longest-waiting pending run
        self._backlog_at = float("-inf")  # time.monotonic() the backlog gauges were last set
        # The checkpoint is one shard's: the store says which.
        self._shard = shard = store.shard
        where = f"{store.name} in {store.describe()}"
        guard = SourceGuard(source, where, shard, recorder.checkpoint_ahead, store.saved_at)
        self._reader = BatchReader(source, guard, recorder, poll.batch_size, self._in_shard)
        self.stop_requested = threading.Event()
        # Asked between batches of a long drain; the HA lease answers False once lost.
        self._keep_going = keep_going
        # time.monotonic() of the last batch started or finished, for liveness.
        self.progress_at = time.monotonic()

    @property
    def feed(self) -> ToolFeed | None:
        """The new tool rows, read once each, when the late-row watch is on."""
        return self._late.feed if self._late is not None else None

    def poll(self, late: bool = True) -> PollResult:
        """Batches until the backlog is drained (or a stop is requested), then, with ``late``, the
        late-row watch and the backlog gauges: a wake-up for a settling run (``late`` False) sends
        that run, and leaves them to the interval's poll, but between the batches of a drain."""
        started = self._clock()
        total = PollResult()
        try:
            self._measure_offset()
            self._drain(total, late)
            if late and self._late is not None and not self.stop_requested.is_set():
                self._late.run(self._offset)
        except Exception as exc:
            self._recorder.poll_finished(
                self._clock() - started,
                ok=False,
                pending=self._checkpoint_pending,
                oldest_pending=self._oldest_pending(),
                failed=failed_part(exc),
            )
            if not isinstance(exc, ConnectionLost):  # a database that stopped answering would only hold the failure up
                self._record_backlog()  # an outage is when the backlog matters most
            raise
        self._recorder.poll_finished(
            self._clock() - started, ok=True, pending=total.pending, oldest_pending=self._oldest_pending()
        )
        if late and not total.batches:
            self._record_backlog()
        return total

    def _oldest_pending(self) -> float:
        """Seconds the longest-waiting pending run has waited since first seen (0 with none): one
        stuck run shows here long before the pending count stands out."""
        return 0.0 if self._waiting_since is None else max(self._clock() - self._waiting_since, 0.0)

    # -- the batches ----------------------------------------------------------

    def _drain(self, total: PollResult, gauges: bool) -> None:
        """As a backfill does: the next batch is read in a read-ahead thread while this one is mapped,
        and mapped while the one before is sent, in a sending thread; each is checkpointed, counted
        and measured once acknowledged, in order. A batch's metrics and the garbage collection
        after it run once the next batch is on its way: while the receiver answers, not before."""
        self._check_zone_once()
        checkpoint = self._load_checkpoint()
        self._high_water = checkpoint.high_water  # the backlog gauges, even when the first batch fails
        self._checkpoint_pending = len(checkpoint.pending)
        self._waiting_since = min(checkpoint.pending.values(), default=None)
        sending: tuple[Future[PollResult], Batch] | None = None
        with (
            BatchCollection() as collection,
            ReadAhead(self._batches(checkpoint), name="run-otel-poll-read") as batches,
            ThreadPoolExecutor(1, thread_name_prefix="run-otel-send") as sender,
        ):
            try:
                for batch in batches:
                    self.progress_at = time.monotonic()
                    prepared = self._exporter.prepare(batch.decided.to_export, batch.decided.incomplete, batch.tools)
                    done = None
                    if sending is not None:
                        done = self._finish(*sending)
                        total.add(done[0])
                        sending = None
                    stopping = self.stop_requested.is_set() or not self._keep_going()
                    if not stopping:
                        sending = (sender.submit(self._exporter.deliver, prepared, self.stop_requested), batch)
                    if done is not None:
                        self._count(*done, gauges=self._backlog_due())  # a drain: its lag falls as it goes
                        collection.after_batch()
                    if stopping:
                        break
                if sending is not None:
                    done = self._finish(*sending)
                    total.add(done[0])
                    self._count(*done, gauges=gauges)
            finally:
                self.progress_at = time.monotonic()

    def _batches(self, checkpoint: Checkpoint) -> Iterator[Batch]:
        """Each batch's runs and tool rows, from where the one before would leave the checkpoint: pure
        reads, run in the read-ahead thread."""
        feed = self.feed
        while not self.stop_requested.is_set():
            now = self._clock() + self._offset  # the database's time: settle and timeouts compare its timestamps
            batch = self._reader.read(checkpoint, now, self._rules)
            runs = batch.decided.to_export
            if feed is not None:
                feed.read(now)  # after the runs: a settled run's tool rows have landed
                batch.tools = feed.tools_for(runs)
            else:
                batch.tools = self._source.tools_for(run.run_id for run in runs) if runs else {}
            yield batch
            if not batch.full:
                return
            checkpoint = batch.following

    def _finish(self, sent: Future[PollResult], batch: Batch) -> tuple[PollResult, float]:
        """Waits for the batch's acknowledgement (an ExportError fails the poll), then saves where it
        ends: all of it, or, after a stop in its middle, up to its first run not acknowledged. Gives the
        batch's result and when it was acknowledged, for :meth:`_count`."""
        try:
            result = sent.result()
        except Exception:
            self._recorder.export_failed()
            raise
        following = batch.following
        if result.interrupted:
            following = cut(batch.before, following, result.unsent, self._clock() + self._offset)
            log.info("stopped in the middle of a batch: %d run(s) acknowledged are checkpointed", len(result.runs))
        for run in batch.new_runs:  # once the batch is sent: a failed poll reads the same runs again
            if run.id <= following.high_water:
                self._exporter.note_status(run.status)
        acked_at = self._clock()
        late, feed = self._late, self.feed
        watched = late.watch(result.runs, acked_at) if late is not None else None
        self._store.save(following, acked_at, watched, feed.mark(watched or ()) if feed is not None else None)
        if feed is not None:
            feed.release((sent_run.run.run_id, [tool.id for tool in sent_run.tools]) for sent_run in result.runs)
        if late is not None and watched:
            late.remember(watched)
        self._high_water = following.high_water
        self._log_incomplete(batch.decided, result)
        self._log_ahead(batch.decided, result)
        result.pending, result.gaps, result.batches = len(following.pending), len(following.gaps), 1
        self._checkpoint_pending, self._waiting_since = result.pending, min(following.pending.values(), default=None)
        result.full_batch = batch.full and not result.interrupted
        result.next_settle_at = batch.decided.next_settle_at
        return result, acked_at

    def _count(self, result: PollResult, acked_at: float, gauges: bool) -> None:
        """A checkpointed batch's metrics, and with ``gauges`` the backlog's."""
        try:
            self._recorder.runs_exported(result, acked_at + self._offset)
        except Exception:  # the batch is sent and checkpointed: a metric must not turn that into a failed poll
            log.exception("metrics: recording the exported runs failed; the runs were exported and checkpointed")
        if gauges:
            self._record_backlog()

    def _log_incomplete(self, decided: Classified, result: PollResult) -> None:
        """One line per run sent unfinished: an operator looks for the agent's stuck runs by id."""
        sent = {exported.run.id for exported in result.runs}
        for run in decided.to_export:
            if run.id in decided.incomplete and run.id in sent:
                log.warning(
                    "run %s sent as incomplete: status %s, not finished after %.0fs (poll.run_timeout_seconds = %g)",
                    run.run_id,
                    run.status,
                    decided.stuck_seconds.get(run.id, 0.0),
                    self._rules.run_timeout_seconds,
                )

    def _log_ahead(self, decided: Classified, result: PollResult) -> None:
        """One line per finished run whose updated_at lay ahead of the database's clock: it settled as seen."""
        sent = {exported.run.id for exported in result.runs}
        ahead = [run for run in decided.to_export if run.id in decided.ahead and run.id in sent]
        for run in ahead:
            log.warning(
                "run %s: updated_at %s lies %.0fs ahead of the database's clock; settled by the database's clock, "
                "%gs after it was seen (poll.settle_seconds)",
                run.run_id,
                run.updated_at,
                decided.ahead[run.id],
                self._rules.settle_seconds,
            )
        if ahead:
            self._recorder.odd_times(FUTURE_UPDATED_AT, len(ahead))

    def _backlog_due(self) -> bool:
        """Whether a drain's batch sets the backlog gauges: once a second is finer than any scrape,
        and the two probes after every batch were a twentieth of a catch-up's time."""
        return time.monotonic() - self._backlog_at >= BACKLOG_EVERY_SECONDS

    def _record_backlog(self) -> None:
        """What is left after the poll: run ids above the checkpoint, and how much newer they are."""
        if self._high_water is None:
            return
        self._backlog_at = time.monotonic()
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
