"""User ratings of the runs this bridge sent, into each run's trace.

``diagnosis_run.feedback`` is written when the user rates an answer, before or
after run-otel exported the run. A pass reads the finished, rated runs created
within ``feedback.window_seconds`` that may carry a rating not sent yet
(``feedback_window.py``): those updated since the pass before, by the agent's
index on ``updated_at`` where it has one, else a primary-key range that reaches
further back the older its runs, found by primary-key probes. The range starts
above the first start's mark and ends at the checkpoint; beside it come the runs
the first start took over in flight below its mark, which it sent too, and those
below the mark that a backfill exported (``backfilled.py``). Runs still pending or missing are left out:
a rating alone, without its run's trace, would be an orphan trace. A value not sent before, or
changed since, becomes a child span of the run's root, inside the run's window
(``evaluation.py``), and, where configured, a ``gen_ai.evaluation.result`` log
record and a Phoenix annotation; a replaced rating gets a ``superseded`` span
under its own. Ids come from the rows, so a re-send after a crash is the same
span. What was acknowledged is recorded in the state store before it is
counted, so each rating is counted once, when first seen.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ..config import FeedbackConfig
from ..export.logrecords import LogRecordSender
from ..export.sending import RequestSender
from ..export.sinks import ExportError
from ..export.wire import RunSpans, WireSpans
from ..mapping.evaluation import Evaluations, iso_time
from ..mapping.feedback_vocab import UnmappedFeedback
from ..mapping.span_data import RunIdentity, completion_span_id_for, identity_for
from ..sharding import in_shard
from ..source.reader import Source
from ..source.rows import FeedbackRow
from .backfilled import Range, clipped, covers
from .checkpoint import Checkpoint
from .duplicates import DuplicateRule, key_of
from .feedback_window import RATING_COMMIT_SECONDS, AgingWindow
from .ratings_ledger import SentRating
from .recorder import Recorder
from .row_shapes import RowShapes
from .state_store import StateStore

if TYPE_CHECKING:  # its HTTP client loads only when Phoenix is configured
    from ..export.phoenix import PhoenixAnnotations

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Read:
    """Where a pass by the updated_at index stood: the next reads the runs updated since ``since``, and
    by primary key those exported after it: above ``high_water``, or among ``unsent`` (pending, gaps)."""

    since: float
    high_water: int
    unsent: frozenset[int]


@dataclass(frozen=True)
class FeedbackResult:
    rated: int = 0  # rated runs the pass read
    sent: int = 0  # new or changed values sent


class FeedbackSender:
    """A rating in its three shapes: the span in the run's trace (with a marker under the span of the
    rating it replaced), the ``gen_ai.evaluation.result`` log record, and the Phoenix annotation.
    The feedback pass and the backfill share it."""

    def __init__(
        self,
        evaluations: Evaluations,
        wire: WireSpans,
        sender: RequestSender,
        log_records: LogRecordSender | None = None,
        phoenix: PhoenixAnnotations | None = None,
        shapes: RowShapes | None = None,
    ):
        self.evaluations = evaluations
        self._wire = wire
        self._sender = sender
        self._log_records = log_records
        self._phoenix = phoenix
        # Whose trace a rating joins (a later row with a run id has its own) and under which span.
        self._shapes = shapes or RowShapes(DuplicateRule(None))

    def look_again(self, current: Callable[[list[tuple[str, dict]]], list[dict]] | None = None) -> None:
        """Phoenix: the annotations its queue held for roots it lacked, once it is done with them, those
        ``current`` keeps (the ratings the state store holds: never an older one)."""
        if self._phoenix is not None:
            self._phoenix.look_again(current)

    def identities(self, rows: Sequence[FeedbackRow]) -> dict[int, RunIdentity]:
        """The later rows' ids, by primary key: nothing asked where the schema allows one row per run id."""
        return self._shapes.duplicates.identities(rows)

    def send(
        self,
        rows: Sequence[FeedbackRow],
        sent_before: Mapping[str, SentRating] | None = None,
        ids: dict[int, RunIdentity] | None = None,
    ) -> None:
        """Raises when the spans were not acknowledged or Phoenix refused; the caller records nothing then.
        ``sent_before`` by ``key_of`` the row; ``ids`` as ``identities`` gives them, found here unless given."""
        evaluations, sent_before = self.evaluations, sent_before or {}
        ids = self.identities(rows) if ids is None else ids
        # A run first sent incomplete: its rating hangs under the completed span, whose time it lies in.
        finished_late = self._shapes.first_sends([row.id for row in rows])
        runs = []
        for row in rows:
            own = ids.get(row.id) or identity_for(row.run_id)
            parent = completion_span_id_for(own.key) if row.id in finished_late else None
            spans = [self._wire.replay(evaluations.span(row, own, parent))]
            before = sent_before.get(key_of(row, own))
            # An earlier release kept no rating time, so the old span's id is unknown: no marker then.
            if before is not None and before.rated_at_ns is not None:
                spans.append(self._wire.replay(evaluations.superseded(row, before.feedback, before.rated_at_ns, own)))
            runs.append(RunSpans(row.run_id, spans))
        # The runs' own way: requests under export.max_request_bytes, split when refused, each acknowledgement progress.
        self._sender.send(runs)
        # A log record or annotation is a few hundred bytes: 1000 keep a request far under receivers' 4 MiB limit.
        for start in range(0, len(rows), 1000):
            chunk = rows[start : start + 1000]
            if self._log_records is not None:
                self._log_records.send([evaluations.log_record(row, ids.get(row.id)) for row in chunk])
            if self._phoenix is not None:
                keys = [key_of(row, ids.get(row.id)) for row in chunk]
                self._phoenix.upsert([evaluations.annotation(row, ids.get(row.id)) for row in chunk], keys)


class FeedbackPass:
    """The shard is the store's: its checkpoint says which runs were exported."""

    def __init__(
        self,
        config: FeedbackConfig,
        source: Source,
        store: StateStore,
        sender: FeedbackSender,
        recorder: Recorder | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self._config = config
        self._source = source
        self._store = store
        self._ratings = sender
        self._recorder = recorder or Recorder()
        self._clock = clock
        self._unmapped = UnmappedFeedback(config)
        self._aging = AgingWindow(config.interval_seconds, config.window_seconds)
        self._index: str | None = None  # the agent's index on updated_at, looked for at the first pass
        self._looked = False
        # With the index: what the last pass went through read (the database's time), and this pass's.
        self._last: _Read | None = None
        self._next: _Read | None = None

    def run(self) -> FeedbackResult:
        """One pass over the exported runs (up to the saved checkpoint) created within the window."""
        try:
            return self._pass()
        except Exception as exc:
            if isinstance(exc, ExportError):
                self._recorder.export_failed()
            self._recorder.feedback_failed()
            raise

    def _pass(self) -> FeedbackResult:
        self._ratings.look_again(self._current)
        checkpoint = self._store.load()
        backfilled = self._store.backfilled() if checkpoint is not None else []
        if checkpoint is None or (
            checkpoint.high_water <= checkpoint.start_mark and not checkpoint.taken_over and not backfilled
        ):
            return FeedbackResult()
        now = self._clock()
        # A pending or missing run is not sent yet: its rating goes out on the pass after its export.
        unsent = checkpoint.pending.keys() | checkpoint.gaps.keys()
        read = self._read(checkpoint, backfilled, now)
        rated = [row for row in read if row.id not in unsent and in_shard(row.run_id, self._store.shard)]
        self._unmapped.note(row.feedback for row in rated)
        # A later row with a run id an earlier one has keeps its rating under a key of its own.
        ids = self._ratings.identities(rated)
        keys = {row.id: key_of(row, ids.get(row.id)) for row in rated}
        sent_before = self._store.sent_feedback(list(keys.values()))
        changed = [row for row in rated if (before := sent_before.get(keys[row.id])) is None or before.feedback != row.feedback]
        if changed:
            self._ratings.send(changed, sent_before, ids)
        sent = {keys[row.id]: SentRating(row.feedback, self._ratings.evaluations.rated_at_ns(row)) for row in changed}
        # A run stays in the ledger as long as a pass may read it.
        self._store.save_feedback(sent, now, now - self._aging.kept_seconds)
        if self._last is not None:
            self._aging.passes += 1  # only a pass that went through moves the schedule on
        self._last = self._next
        self._recorder.feedback_sent(changed)
        if changed:
            log.debug("feedback: %d rated runs in the window, %d new or changed sent", len(rated), len(changed))
        return FeedbackResult(len(rated), len(changed))

    def _read(self, checkpoint: Checkpoint, backfilled: list[Range], now: float) -> list[FeedbackRow]:
        """The rated runs this pass looks at (``feedback_window.py``). The first pass after a start reads
        the whole window; each later one the runs exported since the pass before, by primary key (a rating
        they had when read), and the runs that may have been rated since: by the index on updated_at where
        the agent has one, else the part of the window due this pass. Below the first start's mark, only
        the runs this bridge sent: those it took over in flight, and those a backfill exported."""
        if not self._looked:
            self._index, self._looked = self._source.updated_at_index(), True
        # updated_at is on the database's clock; without the index the window's edge is all it bounds
        db_now = now + (self._source.clock_offset(self._clock) or 0.0) if self._index is not None else now
        unsent = checkpoint.pending.keys() | checkpoint.gaps.keys()
        last, high, mark = self._last, checkpoint.high_water, checkpoint.start_mark
        self._next = _Read(db_now - RATING_COMMIT_SECONDS, high, frozenset(unsent))
        whole = last is None or self._aging.age(self._aging.passes + 1) >= self._aging.kept_seconds
        if whole and backfilled:  # ranges wholly below the window are forgotten when it is read whole
            backfilled = self._forget_backfilled(backfilled, self._first_id(now - self._aging.kept_seconds))
        if last is None:
            first = self._first_id(db_now - self._config.window_seconds)
            rows = [*self._taken_over(checkpoint, first), *self._backfilled(backfilled, mark, first)]
            rows += self._source.rated_runs(max(first, mark + 1), high)
        else:
            rows = self._source.rated_runs(last.high_water + 1, high) if high > last.high_water else []
            rows += self._source.rated_runs_by_ids(last.unsent - unsent)
            if self._index is not None:
                created_from = self._naive(db_now - self._config.window_seconds)
                rows += self._source.rated_runs_updated_since(self._naive(last.since), created_from, high, self._index)
            else:  # below what the first read covers, as far back as this pass reaches
                first = self._first_id(now - self._aging.age(self._aging.passes + 1))
                rows += [*self._taken_over(checkpoint, first), *self._backfilled(backfilled, mark, first)]
                rows += self._source.rated_runs(max(first, mark + 1), min(last.high_water, high))
        sent_below = covers(clipped(backfilled, 0, mark))
        by_id = {row.id: row for row in rows if row.id > mark or row.id in checkpoint.taken_over or sent_below(row.id)}
        return [by_id[i] for i in sorted(by_id)]

    def _naive(self, epoch: float) -> datetime:
        return self._source.clock.naive(datetime.fromtimestamp(epoch, UTC))

    def _first_id(self, created_from: float) -> int:
        return self._source.first_id_created_at_or_after(self._naive(created_from))

    def _current(self, queued: list[tuple[str, dict]]) -> list[dict]:
        """Of the annotations Phoenix's queue held, those still the rating the state store holds."""
        sent = self._store.sent_feedback([key for key, _item in queued])
        return [
            item
            for key, item in queued
            if (rating := sent.get(key)) is not None
            and rating.feedback == item["result"]["label"]
            and (rating.rated_at_ns is None or iso_time(rating.rated_at_ns) == item["metadata"].get("rated_at"))
        ]

    def _taken_over(self, checkpoint: Checkpoint, window_first: int) -> list[FeedbackRow]:
        """The rated runs below the start mark that the first start took over in flight, and sent: only
        those, since the finished runs beside them were never this bridge's (one range read, filtered)."""
        ids = [i for i in checkpoint.taken_over if window_first <= i <= checkpoint.start_mark]
        if not ids:
            return []
        return [row for row in self._source.rated_runs(min(ids), max(ids)) if row.id in checkpoint.taken_over]

    def _backfilled(self, ranges: list[Range], start_mark: int, first: int) -> list[FeedbackRow]:
        """The rated runs backfills exported below the start mark (above it the runs are the daemon's)
        from ``first`` on, in one range read from the first to the last recorded id, however many ranges."""
        cut = clipped(ranges, first, start_mark)
        if not cut:
            return []
        inside = covers(cut)
        return [row for row in self._source.rated_runs(cut[0][0], cut[-1][1]) if inside(row.id)]

    def _forget_backfilled(self, ranges: list[Range], window_first: int) -> list[Range]:
        """Forgets the ranges wholly below the window, so the cost follows the window, not the history."""
        if any(last < window_first for _first, last in ranges):
            self._store.forget_backfilled(window_first)
        return [(first, last) for first, last in ranges if last >= window_first]
