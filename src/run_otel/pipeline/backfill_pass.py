"""A backfill's pass over an id range: read each batch (the next one while this
one is sent), keep the finished runs of the shard created in the window, and
export them, then the ratings they carry. The checkpoint is neither read nor
moved; as each batch is acknowledged, the state store records the ids it
exported and the ratings it sent (``backfilled.py``), so the daemon's feedback
pass sends a rating given on one of those runs later."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

from ..config import PollConfig
from ..sharding import Shard, in_shard
from ..source.reader import Source
from ..source.reconnect import Reconnecting
from ..source.rows import FeedbackRow, RunRow, ToolRow, is_terminal
from .backfilled import Range, ranges_of
from .feedback import FeedbackSender
from .gc_policy import BatchCollection
from .heap import keep_freed_memory
from .ratings_ledger import SentRating
from .readahead import ReadAhead
from .recorder import Recorder
from .results import PollResult
from .run_export import RunExporter
from .state_store import StateStore, StateStoreError
from .transitions import Rules, timed_out

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Batch:
    first: int  # the first run id this batch covers (the one after the last batch's cursor)
    cursor: int  # the last run id read
    inside: list[RunRow]  # the runs created inside the window
    ready: list[RunRow]  # of those, this shard's finished or timed-out runs
    tools: dict[str, list[ToolRow]]
    outside_window: int
    in_flight: int  # this shard's runs of the window not finished: the daemon's
    left_out: list[int]  # the ids of this shard's runs read and not exported (outside the window, in flight)

    @property
    def incomplete(self) -> set[int]:
        """The ready runs that timed out rather than finished."""
        return {r.id for r in self.ready if not is_terminal(r.status)}


class BackfillPass:
    def __init__(
        self,
        poll: PollConfig,
        shard: Shard,
        source: Source,
        exporter: RunExporter,
        recorder: Recorder,
        ratings: FeedbackSender | None = None,
        clock: Callable[[], float] = time.time,
        store: StateStore | None = None,
    ):
        self._batch_size = poll.batch_size
        self._ratings = ratings
        self._record = BackfillRecord(store) if store is not None else None
        self._shard = shard
        self._source = source
        self._exporter = exporter
        self._recorder = recorder
        self._clock = clock
        self._rules = Rules.from_config(poll)
        self.stop_requested = threading.Event()
        # A backfill's reads outlive a database restart; the daemon has its own backoff between polls.
        self._read = Reconnecting(
            poll.backfill_retry_seconds, poll.retry_initial_seconds, poll.retry_max_seconds, self.stop_requested
        )

    def run(
        self,
        first_id: int,
        last_id: int,
        on_batch: Callable[[PollResult, int], None] = lambda result, cursor: None,
        record_metrics: bool = False,
        created_in: Callable[[RunRow], bool] = lambda run: True,
    ) -> PollResult:
        """Exports the finished runs with ids in [first_id, last_id] that ``created_in``
        accepts. The next batch is read while this one is mapped, and mapped while the one
        before is sent: the receiver's time to acknowledge a request overlaps run-otel's work."""
        return self.run_ranges(iter([(first_id, last_id)]), on_batch, record_metrics, created_in)

    def run_ranges(
        self,
        ranges: Iterator[Range],
        on_batch: Callable[[PollResult, int], None] = lambda result, cursor: None,
        record_metrics: bool = False,
        created_in: Callable[[RunRow], bool] = lambda run: True,
    ) -> PollResult:
        """``run`` over id ranges taken one by one, as the reads reach the end of the last one
        (``backfill --workers``: each process takes the next piece of the range when it needs
        one), in one pass: reading, mapping and sending overlap across them. Each batch lies
        in one range; its cursor reaches the range's last id once the range is read."""
        total = PollResult()
        sending: tuple[Future[PollResult], _Batch] | None = None
        keep_freed_memory()  # the next batch reuses what this one frees (heap.py)

        def finish() -> None:
            assert sending is not None
            sent, batch = sending
            result = sent.result()  # an ExportError stops the backfill here, before this batch counts
            for run in batch.inside:
                self._exporter.note_status(run.status)
            result.outside_window = batch.outside_window
            result.in_flight = batch.in_flight
            rated = _rated(batch.ready) if self._ratings is not None else []
            ratings_sent: dict[str, SentRating] = {}
            if self._ratings is not None and rated:
                self._ratings.send(rated)
                ratings_sent = {r.run_id: SentRating(r.feedback, self._ratings.evaluations.rated_at_ns(r)) for r in rated}
            if self._record is not None:
                self._record.batch(batch.first, batch.cursor, batch.left_out, ratings_sent, self._clock())
            if record_metrics:
                self._recorder.runs_exported(result, self._clock())
                self._recorder.feedback_sent(rated)
            total.add(result)
            on_batch(result, batch.cursor)

        with (
            BatchCollection() as collection,
            ReadAhead(self._batches(ranges, created_in)) as batches,
            ThreadPoolExecutor(1, thread_name_prefix="run-otel-send") as sender,
        ):
            for batch in batches:
                prepared = self._exporter.prepare(batch.ready, batch.incomplete, batch.tools)
                if sending is not None:
                    finish()
                    collection.after_batch()
                sending = (sender.submit(self._exporter.deliver, prepared), batch)
            if sending is not None:
                finish()
        return total

    def _batches(self, ranges: Iterator[Range], created_in: Callable[[RunRow], bool]) -> Iterator[_Batch]:
        """The ranges' batches with their tool rows: pure reads, run in the read-ahead thread.
        The next range is taken only once this one is read, and none after a stop."""
        while not self.stop_requested.is_set():
            taken = next(ranges, None)
            if taken is None:
                return
            yield from self._range_batches(*taken, created_in)

    def _range_batches(self, first_id: int, last_id: int, created_in: Callable[[RunRow], bool]) -> Iterator[_Batch]:
        cursor = first_id - 1
        while cursor < last_id and not self.stop_requested.is_set():
            runs = self._read(partial(self._source.runs_after, cursor, self._batch_size, until_id=last_id))
            # Fewer runs than asked for: none is left up to last_id, so the batch covers the range's
            # end, ids that hold no run included (deleted runs, auto-increment gaps): the range is read.
            first, cursor = cursor + 1, runs[-1].id if len(runs) == self._batch_size else last_id
            now = self._clock()
            inside = [run for run in runs if created_in(run)]
            mine = [r for r in inside if in_shard(r.run_id, self._shard)]
            ready = [r for r in mine if self._finished(r, now)]
            tools = self._read(partial(self._source.tools_for, [r.run_id for r in ready])) if ready else {}
            exported = {r.id for r in ready}
            left_out = [r.id for r in runs if r.id not in exported and in_shard(r.run_id, self._shard)]
            yield _Batch(first, cursor, inside, ready, tools, len(runs) - len(inside), len(mine) - len(ready), left_out)

    def _finished(self, run: RunRow, now: float) -> bool:
        return is_terminal(run.status) or timed_out(self._source.clock.epoch(run.created_at), now, now, self._rules)


def _rated(runs: list[RunRow]) -> list[FeedbackRow]:
    """The finished runs' ratings, as the feedback pass reads them (a timed-out run's is not final)."""
    return [
        FeedbackRow(r.id, r.run_id, r.intent, r.feedback, r.updated_at, r.created_at, r.total_duration_ms)
        for r in runs
        if r.feedback is not None and is_terminal(r.status)
    ]


class BackfillRecord:
    """What one backfill tells the state store as each batch is acknowledged: the id ranges it
    exported, a range growing from batch to batch while no run of the shard is left out, and the
    ratings it sent, so the feedback pass neither misses a later rating nor sends these again."""

    def __init__(self, store: StateStore):
        self._store = store
        self._open: Range | None = None  # the last range written, while the next batch may extend it
        self._warned = False

    def batch(self, first: int, last: int, left_out: list[int], ratings: dict[str, SentRating], now: float) -> None:
        ranges = ranges_of(first, last, left_out)
        if ranges and self._open is not None and ranges[0][0] == self._open[1] + 1:
            ranges[0] = (self._open[0], ranges[0][1])
        self._open = ranges[-1] if ranges and ranges[-1][1] == last else None
        try:
            self._store.save_backfilled(ranges, ratings, now)
        except StateStoreError as exc:
            # The runs are sent; only a rating given on one of them later goes unsent. Said once.
            self._open = None
            if not self._warned:
                self._warned = True
                log.warning(
                    "backfill: %s: a rating given later on the runs it sent is not sent by the daemon's feedback "
                    "pass; run the backfill again over them once the state store is back",
                    exc,
                )
