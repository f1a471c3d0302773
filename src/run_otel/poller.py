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

from .checkpoint import Checkpoint, CheckpointStore
from .config import Config
from .encoding import FastEncoder
from .export import Ack, Sink
from .mapping import MappedRun, Mapper, shard_of
from .rows import TERMINAL_STATUSES, RunRow, ToolRow, is_terminal
from .source import Source

log = logging.getLogger(__name__)

# Spans per request stay under the 4 MiB gRPC default of most collectors.
MAX_REQUEST_BYTES = 3 * 1024 * 1024
# More missing ids than this in one batch is a deletion, not in-flight commits.
MAX_NEW_GAPS = 10_000


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
    warnings: int = 0
    pending: int = 0
    gaps: int = 0
    full_batch: bool = False
    # When the first finished-but-unsettled run becomes exportable (Unix time).
    next_settle_at: float | None = None

    def add(self, other: "PollResult") -> None:
        self.run_count += other.run_count
        self.spans += other.spans
        self.rejected_spans += other.rejected_spans
        self.warnings += other.warnings
        self.pending, self.gaps, self.full_batch = other.pending, other.gaps, other.full_batch
        self.next_settle_at = other.next_settle_at


class Recorder:
    """What the poller tells the metrics module. The default records nothing."""

    def runs_exported(self, result: PollResult, acked_at: float) -> None: ...

    def export_failed(self) -> None: ...

    def poll_finished(self, seconds: float, ok: bool, pending: int) -> None: ...

    def row_warnings(self, count: int) -> None: ...


class Poller:
    def __init__(
        self,
        config: Config,
        source: Source,
        sink: Sink,
        store: CheckpointStore,
        resource: dict[str, str],
        recorder: Recorder | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self._config = config
        self._poll = config.poll
        self._source = source
        self._sink = sink
        self._store = store
        self._recorder = recorder or Recorder()
        self._clock = clock
        self.mapper = Mapper(config)
        self._encoder = FastEncoder(resource)
        self._shard_index, self._shard_total = config.shard
        self._unknown_statuses: set[str] = set()
        self.stop_requested = threading.Event()
        # Asked between batches of a long drain; the HA lease answers False once lost.
        self.keep_going: Callable[[], bool] = lambda: True

    # -- public -------------------------------------------------------------

    @property
    def source(self) -> Source:
        return self._source

    def describe_source(self) -> str:
        return self._source.describe()

    def poll(self) -> PollResult:
        """Batches until the backlog is drained (or a stop is requested)."""
        started = self._clock()
        total = PollResult()
        try:
            while True:
                result = self._poll_batch()
                total.add(result)
                if not result.full_batch or self.stop_requested.is_set() or not self.keep_going():
                    break
        except Exception:
            self._recorder.poll_finished(self._clock() - started, ok=False, pending=total.pending)
            raise
        self._recorder.poll_finished(self._clock() - started, ok=True, pending=total.pending)
        return total

    def export_runs(self, runs: Sequence[RunRow], incomplete_ids: set[int] = frozenset()) -> PollResult:
        """Maps and sends ``runs`` with their tools; raises ExportError unless all were acked."""
        result = PollResult()
        tools = self._source.tools_for(r.run_id for r in runs) if runs else {}
        mapped: list[tuple[ExportedRun, MappedRun]] = []
        for run in runs:
            run_tools = tools.get(run.run_id, [])
            one = self.mapper.map_run(run, run_tools, incomplete=run.id in incomplete_ids)
            for warning in one.warnings:
                log.warning("run %s: %s", run.run_id, warning)
            result.warnings += len(one.warnings)
            updated_ns = self.mapper.epoch_ns(run.updated_at)
            settled_at = updated_ns / 1e9 if updated_ns is not None else None
            mapped.append((ExportedRun(run, run_tools, run.id in incomplete_ids, len(one.spans), settled_at), one))
        for request_spans in self._requests(m for _, m in mapped):
            ack = self._sink.send(self._encoder.request(request_spans))
            self._note_rejections(ack, len(request_spans))
            result.rejected_spans += ack.rejected_spans
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
    ) -> PollResult:
        """Exports the finished runs with ids in [first_id, last_id]; the checkpoint is not touched."""
        total = PollResult()
        cursor = first_id - 1
        while cursor < last_id and not self.stop_requested.is_set():
            runs = self._source.runs_after(cursor, self._poll.batch_size, until_id=last_id)
            if not runs:
                break
            cursor = runs[-1].id
            now = self._clock()
            ready = [r for r in runs if self._in_shard(r) and (is_terminal(r.status) or self._timed_out(r, now, now))]
            result = self.export_runs(ready, {r.id for r in ready if not is_terminal(r.status)})
            if record_metrics:
                self._recorder.runs_exported(result, self._clock())
            total.add(result)
            on_batch(result, cursor)
        return total

    # -- one batch ----------------------------------------------------------

    def _poll_batch(self) -> PollResult:
        checkpoint = self._load_checkpoint()
        now = self._clock()
        new_runs = self._source.runs_after(checkpoint.high_water, self._poll.batch_size)
        rechecked = self._source.runs_by_ids(checkpoint.pending.keys() | checkpoint.gaps.keys())
        following = checkpoint.copy()
        self._advance(following, new_runs, now)
        to_export, incomplete, next_settle_at = self._classify(following, [*rechecked, *new_runs], now)
        self._expire_gaps(following, now)
        try:
            result = self.export_runs(to_export, incomplete)
        except Exception:
            self._recorder.export_failed()
            raise
        acked_at = self._clock()
        self._store.save(following, acked_at)
        result.pending, result.gaps = len(following.pending), len(following.gaps)
        result.full_batch = len(new_runs) >= self._poll.batch_size
        result.next_settle_at = next_settle_at
        self._recorder.runs_exported(result, acked_at)
        return result

    def _load_checkpoint(self) -> Checkpoint:
        saved = self._store.load()
        if saved is not None:
            return saved
        start = self._poll.start_from
        if start == "beginning":
            high_water = 0
        elif start == "now":
            high_water = self._source.max_run_id()
        else:
            high_water = int(start) - 1
        # From "beginning" a lost checkpoint only re-sends; from "now" or an id it may skip runs.
        level = logging.INFO if start == "beginning" else logging.WARNING
        log.log(
            level,
            "no checkpoint for %s in %s: starting after run id %d (poll.start_from=%s)",
            self._store.name,
            self._store.describe(),
            high_water,
            start,
        )
        return Checkpoint(high_water=high_water)

    def _advance(self, checkpoint: Checkpoint, new_runs: Sequence[RunRow], now: float) -> None:
        """Moves the high-water mark over ``new_runs`` and records the ids they skipped."""
        if not new_runs:
            return
        seen = {run.id for run in new_runs}
        missing = [i for i in range(checkpoint.high_water + 1, new_runs[-1].id) if i not in seen]
        if len(missing) > MAX_NEW_GAPS:
            log.warning("%d ids missing below run id %d; tracking the last %d", len(missing), new_runs[-1].id, MAX_NEW_GAPS)
            missing = missing[-MAX_NEW_GAPS:]
        for gap in missing:
            checkpoint.gaps.setdefault(gap, now)
        checkpoint.high_water = new_runs[-1].id

    def _classify(
        self, checkpoint: Checkpoint, runs: Sequence[RunRow], now: float
    ) -> tuple[list[RunRow], set[int], float | None]:
        """Splits runs into those to send now and those still waiting, and says when
        the first finished one still settling will be ready."""
        settled_before_ns = int((now - self._poll.settle_seconds) * 1e9)
        to_export: list[RunRow] = []
        incomplete: set[int] = set()
        next_settle_at: float | None = None
        for run in runs:
            first_seen = checkpoint.pending.pop(run.id, None) or checkpoint.gaps.pop(run.id, None) or now
            if not self._in_shard(run):
                continue
            if is_terminal(run.status):
                self._note_unknown_status(run.status)
                updated_ns = self.mapper.epoch_ns(run.updated_at)
                if updated_ns is None or updated_ns <= settled_before_ns:
                    to_export.append(run)
                else:
                    checkpoint.pending[run.id] = first_seen
                    ready_at = updated_ns / 1e9 + self._poll.settle_seconds
                    next_settle_at = ready_at if next_settle_at is None else min(next_settle_at, ready_at)
            elif self._timed_out(run, first_seen, now):
                to_export.append(run)
                incomplete.add(run.id)
            else:
                checkpoint.pending[run.id] = first_seen
        return to_export, incomplete, next_settle_at

    def _timed_out(self, run: RunRow, first_seen: float, now: float) -> bool:
        timeout = self._poll.run_timeout_seconds
        if timeout <= 0:
            return False
        created_ns = self.mapper.epoch_ns(run.created_at)
        since = created_ns / 1e9 if created_ns is not None else first_seen
        return now - since >= timeout

    def _expire_gaps(self, checkpoint: Checkpoint, now: float) -> None:
        expired = [gap for gap, seen in checkpoint.gaps.items() if now - seen >= self._poll.gap_timeout_seconds]
        for gap in expired:
            del checkpoint.gaps[gap]
        if expired:
            log.info("gave up on %d missing run ids after %.0fs (rolled back or deleted)", len(expired), self._poll.gap_timeout_seconds)

    def _in_shard(self, run: RunRow) -> bool:
        return self._shard_total == 1 or shard_of(run.run_id, self._shard_total) == self._shard_index

    def _note_unknown_status(self, status: str | None) -> None:
        """Counts every run with an unknown status; logs each such value once."""
        if status in TERMINAL_STATUSES:
            return
        self._recorder.row_warnings(1)
        if status not in self._unknown_statuses:
            self._unknown_statuses.add(status)
            log.warning("unknown diagnosis_run.status %r: treated as terminal", status)

    def _note_rejections(self, ack: Ack, sent: int) -> None:
        if ack.rejected_spans:
            log.warning("receiver rejected %d of %d spans: %s", ack.rejected_spans, sent, ack.message or "no reason given")

    def _requests(self, runs: Iterator[MappedRun]) -> Iterator[list[bytes]]:
        """Encoded spans grouped into requests of at most MAX_REQUEST_BYTES; a run never splits."""
        batch: list[bytes] = []
        size = 0
        encode = self._encoder.span
        for mapped in runs:
            encoded = [encode(span) for span in mapped.spans]
            run_size = sum(len(s) for s in encoded)
            if batch and size + run_size > MAX_REQUEST_BYTES:
                yield batch
                batch, size = [], 0
            batch.extend(encoded)
            size += run_size
        if batch:
            yield batch
