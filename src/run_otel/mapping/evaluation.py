"""A user's rating of a run, in the three shapes the backends read it.

A rating usually comes minutes after the run was exported. Timed at the moment
it was given, it would stretch the run's trace (a 13 s run showed as 24 min in
Jaeger, and polluted Phoenix's latency percentiles). So:

- the span goes inside the run's own window, at its end, and carries the real
  time as ``diagnosis.feedback.rated_at``: Jaeger and Tempo show it in the trace,
  whose extent stays the run's. It is a function of the row alone, so whoever
  sends it again (a backfill, a re-send after a crash) sends the same bytes;
- a rating that replaced another adds a ``superseded`` span under the old one's
  span: a sent span cannot be changed, and the list must tell which is current;
- the GenAI conventions' ``gen_ai.evaluation.result`` event is an OTLP log record
  at the real time, tied to the run's trace and root span, for log backends;
- Phoenix gets a HUMAN annotation on the root span (see ``phoenix.py``), upserted
  by one identifier, so a changed rating replaces the old one there.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from ..config import FeedbackConfig
from ..source.clock import SourceClock
from ..source.rows import FeedbackRow
from . import attributes as A
from .span_data import MAX_DURATION_MS, AttrValue, LogData, RunIdentity, SpanData, identity_for, nonzero_window

# Phoenix upserts on (name, span, identifier): one fixed identifier keeps one current rating per run.
ANNOTATION_IDENTIFIER = "diagnosis_run.feedback"
_US = 1_000


def feedback_span_id_for(run_id: str, feedback: str, rated_at_ns: int) -> bytes:
    """One id per rating: a re-send is the same span, a new rating (even back to an old value) a new one."""
    return nonzero_window(hashlib.sha256(f"feedback:{run_id}:{feedback}:{rated_at_ns}".encode()).digest(), 8)


class Evaluations:
    """Rated rows to the feedback span, the log record and the Phoenix annotation. Pure."""

    def __init__(self, config: FeedbackConfig, clock: SourceClock, openinference: bool = False):
        self._name = config.evaluation_name
        self._score_of = config.score_of
        self._clock = clock
        self._openinference = openinference

    def rated_at_ns(self, row: FeedbackRow) -> int:
        return self._clock.epoch_ns(row.updated_at) or 0

    def _attributes(self, row: FeedbackRow) -> list[tuple[str, AttrValue]]:
        attrs: list[tuple[str, AttrValue]] = [
            (A.GEN_AI_EVALUATION_NAME, self._name),
            (A.GEN_AI_EVALUATION_SCORE_LABEL, row.feedback),
        ]
        score = self._score_of(row.feedback)
        if score is not None:
            attrs.append((A.GEN_AI_EVALUATION_SCORE_VALUE, score))
        attrs.append((A.RUN_ID, row.run_id))
        return attrs

    def _window_end_ns(self, row: FeedbackRow, rated_at_ns: int) -> tuple[int, int]:
        """Where the span goes: the last microsecond of the run's own time.

        The root spans at least [created_at, created_at + total_duration_ms], so this never
        widens it. Without a duration the root ended at updated_at as it was at export,
        unknown now: the span is then zero-length at created_at."""
        start = self._clock.epoch_ns(row.created_at)
        if start is None:  # a broken row: the root started at updated_at then, unknown now
            return rated_at_ns, rated_at_ns
        duration = row.total_duration_ms
        if duration is None or not 0 <= duration <= MAX_DURATION_MS:
            return start, start
        end = start + duration * 1_000_000
        return max(start, end - _US), end

    def span(self, row: FeedbackRow, ids: RunIdentity | None = None, parent: bytes | None = None) -> SpanData:
        """The rating's span: the row's alone, never what was sent before, so every send is the same bytes.

        ``ids``: whose trace it joins (a later row with a run id has its own); ``parent``: the root
        unless given (the completed span of a run first sent incomplete, whose time it lies in)."""
        ids = ids or identity_for(row.run_id)
        rated_at = self.rated_at_ns(row)
        start, end = self._window_end_ns(row, rated_at)
        attrs = self._attributes(row)
        if row.intent is not None:
            attrs.append((A.RUN_INTENT, row.intent))
        attrs.append((A.FEEDBACK_RATED_AT, iso_time(rated_at)))
        if self._openinference:
            attrs.append((A.OPENINFERENCE_SPAN_KIND, A.OI_KIND_EVALUATOR))
        return SpanData(
            trace_id=ids.trace_id,
            span_id=feedback_span_id_for(ids.key, row.feedback, rated_at),
            parent_span_id=parent or ids.root_id,
            name=f"evaluation {self._name}",
            start_ns=start,
            end_ns=end,
            attributes=tuple(attrs),
        )

    def superseded(self, row: FeedbackRow, old_value: str, old_rated_at_ns: int, ids: RunIdentity | None = None) -> SpanData:
        """A child of the replaced rating's span, named so the list shows which rating no longer holds.

        Its id comes from both ratings, so a re-send after a crash is the same span."""
        ids = ids or identity_for(row.run_id)
        old_id = feedback_span_id_for(ids.key, old_value, old_rated_at_ns)
        rated_at = self.rated_at_ns(row)
        start, end = self._window_end_ns(row, old_rated_at_ns)
        key = f"superseded:{old_id.hex()}:{row.feedback}:{rated_at}"
        attrs: tuple[tuple[str, AttrValue], ...] = (
            (A.GEN_AI_EVALUATION_NAME, self._name),
            (A.RUN_ID, row.run_id),
            (A.FEEDBACK_SUPERSEDED_BY, row.feedback),
            (A.FEEDBACK_RATED_AT, iso_time(rated_at)),
        )
        if self._openinference:  # Phoenix lists a span without a kind as "unknown"
            attrs += ((A.OPENINFERENCE_SPAN_KIND, A.OI_KIND_EVALUATOR),)
        return SpanData(
            trace_id=ids.trace_id,
            span_id=nonzero_window(hashlib.sha256(key.encode()).digest(), 8),
            parent_span_id=old_id,
            name=f"superseded {self._name}",
            start_ns=start,
            end_ns=end,
            attributes=attrs,
        )

    def log_record(self, row: FeedbackRow, ids: RunIdentity | None = None) -> LogData:
        """The ``gen_ai.evaluation.result`` event, at the time of the rating, on the run's root span."""
        ids = ids or identity_for(row.run_id)
        return LogData(
            self.rated_at_ns(row), A.GEN_AI_EVALUATION_RESULT_EVENT, ids.trace_id, ids.root_id, tuple(self._attributes(row))
        )

    def annotation(self, row: FeedbackRow, ids: RunIdentity | None = None) -> dict[str, Any]:
        """A body item for Phoenix's ``POST /v1/span_annotations``."""
        result: dict[str, Any] = {"label": row.feedback}
        score = self._score_of(row.feedback)
        if score is not None:
            result["score"] = score
        return {
            "span_id": (ids or identity_for(row.run_id)).root_id.hex(),
            "name": self._name,
            "annotator_kind": "HUMAN",
            "result": result,
            "identifier": ANNOTATION_IDENTIFIER,
            "metadata": {"run_id": row.run_id, "rated_at": iso_time(self.rated_at_ns(row))},
        }


def iso_time(ns: int) -> str:
    """A rating's time as the span and the annotation write it."""
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
