"""User ratings of the runs this bridge sent, into each run's trace.

``diagnosis_run.feedback`` is written when the user rates an answer, before or
after run-otel exported the run. A pass re-reads the finished, rated runs
created within ``feedback.window_seconds``: one primary-key range, found by
primary-key probes (the agent's schema has no index on ``updated_at``, and is
not ours to change). The range starts above the first start's mark and ends at
the checkpoint; beside it come the runs the first start took over in flight
below its mark, which it sent too, and those below the mark that a backfill
exported (``backfilled.py``), within the window. Runs still pending or missing are left out:
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
from ..mapping.evaluation import Evaluations
from ..mapping.feedback_vocab import UnmappedFeedback
from ..sharding import in_shard
from ..source.reader import Source
from ..source.rows import FeedbackRow
from .backfilled import Range, clipped, covers
from .checkpoint import Checkpoint
from .ratings_ledger import SentRating
from .recorder import Recorder
from .state_store import StateStore

if TYPE_CHECKING:  # its HTTP client loads only when Phoenix is configured
    from ..export.phoenix import PhoenixAnnotations

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeedbackResult:
    rated: int = 0  # rated runs in the window
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
    ):
        self.evaluations = evaluations
        self._wire = wire
        self._sender = sender
        self._log_records = log_records
        self._phoenix = phoenix

    def look_again(self) -> None:
        """Phoenix: the annotations its queue held for roots it lacked, once it is done with them."""
        if self._phoenix is not None:
            self._phoenix.look_again()

    def send(self, rows: Sequence[FeedbackRow], sent_before: Mapping[str, SentRating] | None = None) -> None:
        """Raises when the spans were not acknowledged or Phoenix refused; the caller records nothing then."""
        evaluations, sent_before = self.evaluations, sent_before or {}
        runs = []
        for row in rows:
            spans = [self._wire.replay(evaluations.span(row))]
            before = sent_before.get(row.run_id)
            # An earlier release kept no rating time, so the old span's id is unknown: no marker then.
            if before is not None and before.rated_at_ns is not None:
                spans.append(self._wire.replay(evaluations.superseded(row, before.feedback, before.rated_at_ns)))
            runs.append(RunSpans(row.run_id, spans))
        # The runs' own way: requests under export.max_request_bytes, split when refused, each acknowledgement progress.
        self._sender.send(runs)
        # A log record or annotation is a few hundred bytes: 1000 keep a request far under receivers' 4 MiB limit.
        for start in range(0, len(rows), 1000):
            chunk = rows[start : start + 1000]
            if self._log_records is not None:
                self._log_records.send([evaluations.log_record(row) for row in chunk])
            if self._phoenix is not None:
                self._phoenix.upsert([evaluations.annotation(row) for row in chunk])


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
        self._ratings.look_again()
        checkpoint = self._store.load()
        backfilled = self._store.backfilled() if checkpoint is not None else []
        if checkpoint is None or (
            checkpoint.high_water <= checkpoint.start_mark and not checkpoint.taken_over and not backfilled
        ):
            return FeedbackResult()
        now = self._clock()
        since = self._source.clock.naive(datetime.fromtimestamp(now - self._config.window_seconds, UTC))
        window_first = self._source.first_id_created_at_or_after(since)
        # A pending or missing run is not sent yet: its rating goes out on the pass after its export.
        unsent = checkpoint.pending.keys() | checkpoint.gaps.keys()
        found = [
            *self._taken_over(checkpoint, window_first),
            *self._backfilled(backfilled, checkpoint.start_mark, window_first),
            *self._source.rated_runs(max(window_first, checkpoint.start_mark + 1), checkpoint.high_water),
        ]
        # A run both taken over and backfilled is found twice: one row per run.
        rated = [
            row for row in {r.id: r for r in found}.values() if row.id not in unsent and in_shard(row.run_id, self._store.shard)
        ]
        self._unmapped.note(row.feedback for row in rated)
        sent_before = self._store.sent_feedback([row.run_id for row in rated])
        changed = [row for row in rated if (before := sent_before.get(row.run_id)) is None or before.feedback != row.feedback]
        if changed:
            self._ratings.send(changed, sent_before)
        sent = {row.run_id: SentRating(row.feedback, self._ratings.evaluations.rated_at_ns(row)) for row in changed}
        self._store.save_feedback(sent, now, now - self._config.window_seconds)
        self._recorder.feedback_sent(changed)
        if changed:
            log.debug("feedback: %d rated runs in the window, %d new or changed sent", len(rated), len(changed))
        return FeedbackResult(len(rated), len(changed))

    def _taken_over(self, checkpoint: Checkpoint, window_first: int) -> list[FeedbackRow]:
        """The rated runs below the start mark that the first start took over in flight, and sent: only
        those, since the finished runs beside them were never this bridge's (one range read, filtered)."""
        ids = [i for i in checkpoint.taken_over if window_first <= i <= checkpoint.start_mark]
        if not ids:
            return []
        return [row for row in self._source.rated_runs(min(ids), max(ids)) if row.id in checkpoint.taken_over]

    def _backfilled(self, ranges: list[Range], start_mark: int, window_first: int) -> list[FeedbackRow]:
        """The rated runs backfills exported below the start mark (above it the runs are the daemon's),
        in one range read from the first to the last recorded id in the window, however many ranges
        there are; ranges wholly below the window are forgotten."""
        if any(last < window_first for _first, last in ranges):
            self._store.forget_backfilled(window_first)
        cut = clipped(ranges, window_first, start_mark)
        if not cut:
            return []
        inside = covers(cut)
        return [row for row in self._source.rated_runs(cut[0][0], cut[-1][1]) if inside(row.id)]
