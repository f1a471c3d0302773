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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial

from ..config import Config
from ..export.encoding import FastEncoder
from ..export.sending import RequestSender
from ..export.sinks import Sink
from ..mapping.spans import MappedRun, Mapper, shard_of
from ..source.clock import SourceClock, zone_finding
from ..source.guard import SourceGuard
from ..source.reader import Source, SourceError
from ..source.readings import read_run, read_tool
from ..source.reconnect import Reconnecting
from ..source.rows import TERMINAL_STATUSES, FeedbackRow, RunRow, ToolRow, is_terminal
from .checkpoint import Checkpoint, CheckpointStore
from .gc_policy import BatchCollection
from .readahead import ReadAhead
from .transitions import Rules, advance, classify, expire_gaps, initial_checkpoint, timed_out

log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class _BackfillBatch:
    cursor: int  # the last run id read
    inside: list[RunRow]  # the runs created inside the window
    ready: list[RunRow]  # of those, this shard's finished or timed-out runs
    tools: dict[str, list[ToolRow]]
    outside_window: int

    @property
    def incomplete(self) -> set[int]:
        """The ready runs that timed out rather than finished."""
        return {r.id for r in self.ready if not is_terminal(r.status)}


class Recorder:
    """What the poller tells the metrics module. The default records nothing."""

    def runs_exported(self, result: PollResult, acked_at: float) -> None: ...

    def export_failed(self) -> None: ...

    def poll_finished(self, seconds: float, ok: bool, pending: int) -> None: ...

    def row_warnings(self, count: int) -> None: ...

    def backlog(self, runs: int, seconds: float | None) -> None: ...

    def feedback_sent(self, rows: Sequence[FeedbackRow]) -> None: ...

    def spans_dropped(self, reason: str, count: int) -> None: ...

    def checkpoint_ahead(self, runs: int) -> None: ...


class Poller:
    def __init__(
        self,
        config: Config,
        source: Source,
        sink: Sink,
        store: CheckpointStore,
        mapper: Mapper,
        encoder: FastEncoder,
        source_clock: SourceClock,
        recorder: Recorder | None = None,
        clock: Callable[[], float] = time.time,
        keep_going: Callable[[], bool] = lambda: True,
    ):
        self._poll = config.poll
        self._feedback = config.feedback.enabled
        self._source = source
        self._sink = sink
        self._store = store
        self._recorder = recorder or Recorder()
        self._clock = clock
        self._source_clock = source_clock
        self.mapper = mapper
        self._encoder = encoder
        self._sender = RequestSender(
            sink, encoder, config.export.max_request_bytes, config.trace.max_list_length, self._recorder.spans_dropped
        )
        self._rules = Rules.from_config(config.poll)
        self._zone_checked = False
        self._high_water: int | None = None
        self._checkpoint_pending = 0  # the last loaded checkpoint's, for the gauge when a poll fails
        self._shard_index, self._shard_total = config.shard
        self._unknown_statuses: set[str | None] = set()
        where = f"{store.name} in {store.describe()}"
        self._guard = SourceGuard(source, where, config.shard, self._recorder.checkpoint_ahead, store.saved_at)
        self.stop_requested = threading.Event()
        # A backfill's reads outlive a database restart; the daemon has its own backoff between polls.
        self._backfill_read = Reconnecting(
            config.poll.backfill_retry_seconds, config.poll.retry_initial_seconds, config.poll.retry_max_seconds, self.stop_requested
        )
        # Asked between batches of a long drain; the HA lease answers False once lost.
        self._keep_going = keep_going
        # time.monotonic() of the last batch started or finished, for liveness.
        self.progress_at = time.monotonic()

    # -- public -------------------------------------------------------------

    @property
    def source(self) -> Source:
        return self._source

    @property
    def sink(self) -> Sink:
        return self._sink

    @property
    def store(self) -> CheckpointStore:
        return self._store

    @property
    def encoder(self) -> FastEncoder:
        return self._encoder

    @property
    def source_clock(self) -> SourceClock:
        return self._source_clock

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

    def export_runs(
        self,
        runs: Sequence[RunRow],
        incomplete_ids: frozenset[int] | set[int] = frozenset(),
        tools: dict[str, list[ToolRow]] | None = None,
    ) -> PollResult:
        """Maps and sends ``runs`` with their tools (read here unless given); raises
        ExportError unless all were acked."""
        result = PollResult()
        if tools is None:
            tools = self._source.tools_for(r.run_id for r in runs) if runs else {}
        mapped: list[tuple[ExportedRun, MappedRun]] = []
        for row in runs:
            warnings: list[str] = []
            run = read_run(row, warnings)
            run_tools = [read_tool(tool, warnings) for tool in tools.get(run.run_id, [])]
            one = self.mapper.map_run(run, run_tools, incomplete=run.id in incomplete_ids)
            warnings += one.warnings
            for warning in warnings:
                log.warning("run %s: %s", run.run_id, warning)
            result.warnings += len(warnings)
            settled_at = self._source_clock.epoch(run.updated_at)
            mapped.append((ExportedRun(run, run_tools, run.id in incomplete_ids, len(one.spans), settled_at), one))
        sent = self._sender.send((exported.run.run_id, one.spans) for exported, one in mapped)
        result.rejected_spans, result.dropped_spans = sent.rejected, sent.dropped
        result.runs = [exported for exported, _ in mapped]
        result.run_count = len(result.runs)
        result.spans = sum(e.span_count for e in result.runs)
        if result.warnings:
            self._recorder.row_warnings(result.warnings)
        return result

    def backfill(
        self,
        first_id: int,
        last_id: int,
        on_batch: Callable[[PollResult, int], None] = lambda result, cursor: None,
        record_metrics: bool = False,
        created_in: Callable[[RunRow], bool] = lambda run: True,
    ) -> PollResult:
        """Exports the finished runs with ids in [first_id, last_id] that ``created_in``
        accepts; the checkpoint is not touched. The next batch is read while this one
        is mapped and sent."""
        total = PollResult()
        with BatchCollection() as collection, ReadAhead(self._backfill_batches(first_id, last_id, created_in)) as batches:
            for batch in batches:
                for run in batch.inside:
                    self._note_unknown_status(run.status)
                result = self.export_runs(batch.ready, batch.incomplete, batch.tools)
                result.outside_window = batch.outside_window
                if record_metrics:
                    self._recorder.runs_exported(result, self._clock())
                total.add(result)
                on_batch(result, batch.cursor)
                collection.after_batch()
        return total

    def _backfill_batches(
        self, first_id: int, last_id: int, created_in: Callable[[RunRow], bool]
    ) -> Iterator[_BackfillBatch]:
        """The id range's batches with their tool rows: pure reads, run in the read-ahead thread."""
        cursor = first_id - 1
        while cursor < last_id and not self.stop_requested.is_set():
            runs = self._backfill_read(partial(self._source.runs_after, cursor, self._poll.batch_size, until_id=last_id))
            if not runs:
                return
            cursor = runs[-1].id
            now = self._clock()
            inside = [run for run in runs if created_in(run)]
            ready = [r for r in inside if self._in_shard(r) and (is_terminal(r.status) or self._timed_out(r, now))]
            tools = self._backfill_read(partial(self._source.tools_for, [r.run_id for r in ready])) if ready else {}
            yield _BackfillBatch(cursor, inside, ready, tools, len(runs) - len(inside))

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
            self._note_unknown_status(run.status)
        decided = classify(following, [*rechecked, *new_runs], now, self._rules, self._source_clock, self._in_shard)
        expired = expire_gaps(following, now, self._rules.gap_timeout_seconds)
        if expired:
            log.info("gave up on %d missing run ids after %.0fs (rolled back or deleted)", len(expired), self._rules.gap_timeout_seconds)
        try:
            result = self.export_runs(decided.to_export, decided.incomplete)
        except Exception:
            self._recorder.export_failed()
            raise
        acked_at = self._clock()
        # Feedback the root already carries is recorded with the checkpoint, in one transaction:
        # the feedback recheck then sends only what is set or changed after the export.
        rated = {run.run_id: run.feedback for run in decided.to_export if run.feedback is not None} if self._feedback else {}
        self._store.save(following, acked_at, rated)
        self._high_water = following.high_water
        result.pending, result.gaps = len(following.pending), len(following.gaps)
        result.full_batch = len(new_runs) >= self._poll.batch_size
        result.next_settle_at = decided.next_settle_at
        try:
            self._recorder.runs_exported(result, acked_at)
        except Exception:  # the batch is sent and checkpointed: a metric must not turn that into a failed poll
            log.exception("metrics: recording the exported runs failed; the runs were exported and checkpointed")
        return result

    def _record_backlog(self) -> None:
        """What is left after the poll: run ids above the checkpoint, and how much newer they are."""
        if self._high_water is None:
            return
        try:
            backlog = self._source.backlog(self._high_water, self._source_clock)
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
        finding = zone_finding(sample, self._source_clock) if sample else None
        if finding:
            log.warning(finding.message(self._source_clock.zone_name))
            self._rules = Rules.from_config(self._poll, trust_timestamps=False)

    def _timed_out(self, run: RunRow, now: float) -> bool:
        return timed_out(self._source_clock.epoch(run.created_at), now, now, self._rules)

    def _in_shard(self, run: RunRow) -> bool:
        return self._shard_total == 1 or shard_of(run.run_id, self._shard_total) == self._shard_index

    def _note_unknown_status(self, status: str | None) -> None:
        """Counts every run with an unknown status; logs each such value once."""
        if status in TERMINAL_STATUSES or not is_terminal(status):
            return
        self._recorder.row_warnings(1)
        if status not in self._unknown_statuses:
            self._unknown_statuses.add(status)
            log.warning("unknown diagnosis_run.status %r: treated as terminal", status)
