"""User feedback that arrives after its run was exported, sent into the run's trace.

``diagnosis_run.feedback`` is written when the user rates an answer, usually
after run-otel exported the run. A pass re-reads the finished, rated runs
created within ``feedback.window_seconds``: one primary-key range, found by
primary-key probes (the agent's schema has no index on ``updated_at``, and is
not ours to change). A value not sent before, or changed since, becomes a
child span of the run's root, inside the run's window (``evaluation.py``), and,
where configured, a ``gen_ai.evaluation.result`` log record and a Phoenix
annotation. Its id comes from the run and the rating, so a re-send after a
crash is the same span. What was acknowledged is recorded in the state store
before it is counted, so each change is counted once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ..config import FeedbackConfig
from ..export.encoding import FastEncoder
from ..export.logrecords import LogRecordSender
from ..export.sinks import Sink
from ..mapping.evaluation import Evaluations
from ..mapping.feedback_vocab import UnmappedFeedback
from ..sharding import in_shard
from ..source.reader import Source
from ..source.rows import FeedbackRow
from .checkpoint import CheckpointStore
from .results import Recorder

if TYPE_CHECKING:  # its HTTP client loads only when Phoenix is configured
    from ..export.phoenix import PhoenixAnnotations

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeedbackResult:
    rated: int = 0  # rated runs in the window
    sent: int = 0  # new or changed values sent


class FeedbackSender:
    """Where a rating goes: a span into the run's trace, and where configured a log record and a Phoenix annotation."""

    def __init__(
        self,
        evaluations: Evaluations,
        encoder: FastEncoder,
        sink: Sink,
        log_records: LogRecordSender | None = None,
        phoenix: PhoenixAnnotations | None = None,
    ):
        self._evaluations = evaluations
        self._encoder = encoder
        self._sink = sink
        self._log_records = log_records
        self._phoenix = phoenix

    def send(self, rows: list[FeedbackRow], sent_before: dict[str, str]) -> None:
        evaluations = self._evaluations
        spans = [self._encoder.span(evaluations.span(row, sent_before.get(row.run_id))) for row in rows]
        # A feedback span or record is a few hundred bytes: 1000 keep a request far under receivers' 4 MiB limit.
        for start in range(0, len(spans), 1000):
            self._sink.send(self._encoder.request(spans[start : start + 1000]))
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
        store: CheckpointStore,
        sender: FeedbackSender,
        recorder: Recorder | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self._config = config
        self._source = source
        self._store = store
        self._sender = sender
        self._recorder = recorder or Recorder()
        self._clock = clock
        self._unmapped = UnmappedFeedback(config)

    def run(self) -> FeedbackResult:
        """One pass over the exported runs (up to the saved checkpoint) created within the window."""
        checkpoint = self._store.load()
        last_exported_id = checkpoint.high_water if checkpoint else 0
        if last_exported_id <= 0:
            return FeedbackResult()
        now = self._clock()
        since = self._source.clock.naive(datetime.fromtimestamp(now - self._config.window_seconds, UTC))
        first_id = self._source.first_id_created_at_or_after(since)
        shard = self._store.shard
        rated = [row for row in self._source.rated_runs(first_id, last_exported_id) if in_shard(row.run_id, shard)]
        self._unmapped.note(row.feedback for row in rated)
        sent_before = self._store.sent_feedback([row.run_id for row in rated])
        changed = [row for row in rated if sent_before.get(row.run_id) != row.feedback]
        if changed:
            self._sender.send(changed, sent_before)
        self._store.save_feedback({row.run_id: row.feedback for row in changed}, now, now - self._config.window_seconds)
        self._recorder.feedback_sent(changed)
        if changed:
            log.debug("feedback: %d rated runs in the window, %d new or changed sent", len(rated), len(changed))
        return FeedbackResult(len(rated), len(changed))
