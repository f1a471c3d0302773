"""What each exported run adds to the run, tool and RAG metrics, as plain values.

The live metrics (``metrics``) and the backfilled history (``history``) both
count from here, so a series has the same name and labels whether Prometheus
scraped it or imported it. Nothing here loads the metrics SDK.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from ..mapping.span_data import MAX_DURATION_MS, identity_for, tool_span_id_for
from ..pipeline.results import ExportedRun
from ..source.rows import (
    INTENTS,
    RELEVANCE_LEVELS,
    RETRIEVAL_LAYERS,
    TERMINAL_STATUSES,
    ToolRow,
    is_terminal,
)
from ..source.rows import RELEASE_OUTCOMES as _OUTCOMES
from . import instruments as I
from .bounds import NONE, OTHER, STATUSES, LabelBounds, label

__all__ = ["NONE", "OTHER", "STATUSES", "Measurement", "label", "run_measurements", "tool_measurements", "zero_series"]

# A rating's label ("UP", "DOWN"...), or None when ratings are not counted.
FeedbackLabel = Callable[[str], str | None] | None


# A span's id, or a tool span's (identity key, tool row id), hashed only if asked: a batch keeps a
# few exemplars of its thousands of measurements, and a tool span's id costs a SHA-256.
SpanRef = bytes | tuple[str, int]


class Measurement(NamedTuple):
    instrument: I.Instrument
    labels: tuple[str, ...]  # in the order of instrument.labels
    value: float
    trace_id: bytes
    span: SpanRef
    # The pull endpoint keeps this one as its bucket's or series' exemplar (failures and durations).
    keep_exemplar: bool = False

    @property
    def span_id(self) -> bytes:
        span = self.span
        return span if isinstance(span, bytes) else tool_span_id_for(*span)


def run_measurements(exported: ExportedRun, feedback_label: FeedbackLabel, bounds: LabelBounds) -> Iterator[Measurement]:
    """Every counter increment and histogram observation one exported run makes."""
    run = exported.run
    status, intent = label(run.status, STATUSES), label(run.intent, INTENTS)
    ids = exported.identity or identity_for(run.run_id)  # a later row with a run id has its own trace
    trace_id, root_id = ids.trace_id, ids.root_id
    outcome = label(run.release_outcome, _OUTCOMES)
    yield Measurement(I.RUNS, (status, intent, outcome), 1, trace_id, root_id, status == "FAILED")
    if run.total_duration_ms is not None and 0 <= run.total_duration_ms <= MAX_DURATION_MS:
        yield Measurement(I.RUN_DURATION, (status, intent), run.total_duration_ms / 1000, trace_id, root_id, True)
    if run.feedback is not None and feedback_label is not None and is_terminal(run.status):
        # The history's count of the ratings a backfill sends with the runs (a timed-out run's is
        # not final, so not sent); the live metrics count them as the feedback pass sends them.
        yield Measurement(I.FEEDBACK, (feedback_label(run.feedback) or OTHER, intent), 1, trace_id, root_id)
    if run.total_token_count:
        yield Measurement(I.RUN_TOKENS, (intent,), max(run.total_token_count, 0), trace_id, root_id)
    for tool in exported.tools:
        yield from tool_measurements(tool, trace_id, (ids.key, tool.id), bounds)


def tool_measurements(tool: ToolRow, trace_id: bytes, span_id: SpanRef, bounds: LabelBounds) -> Iterator[Measurement]:
    # The name is folded once per call, so every instrument below carries the same one.
    name, success = bounds.tool_name(tool.tool_name), label(tool.success)
    layer, relevance = label(tool.retrieval_layer, RETRIEVAL_LAYERS), label(tool.relevance_level, RELEVANCE_LEVELS)
    yield Measurement(I.TOOL_INVOCATIONS, (name, layer, relevance, success), 1, trace_id, span_id, tool.success is False)
    if tool.duration_ms is not None and 0 <= tool.duration_ms <= MAX_DURATION_MS:
        yield Measurement(I.TOOL_DURATION, (name, layer, success), tool.duration_ms / 1000, trace_id, span_id, True)
    for layer_name, count in (("L0", tool.l0_match_count), ("L1", tool.l1_match_count)):
        if count and count > 0:
            yield Measurement(I.RAG_MATCHES, (layer_name, name), count, trace_id, span_id)
    if tool.dedup_reason is not None:
        yield Measurement(I.DEDUP, (bounds.dedup_reason(tool.dedup_reason), name), 1, trace_id, span_id)
    if tool.retrieval_layer is not None and not (tool.l0_match_count or 0) and not (tool.l1_match_count or 0):
        yield Measurement(I.ZERO_MATCH, (layer, name), 1, trace_id, span_id)


# -- series that exist at 0 before their first increment ------------------------------------------
# rate() needs two samples: a counter that appears with its first event at 1 hides that event, so
# "Layer mix" read none=100% and "Matches per call" +Inf in a fresh Prometheus, and the first rating
# after a restart never reached increase(). The series whose labels all come from the documented
# enums start at 0. A tool's or a dedup reason's series do not: their values are the agent's, and a
# zero series per value was what filled the SDK's cardinality limit.


def zero_series(feedback_labels: Iterable[str] = ()) -> Iterator[tuple[I.Instrument, tuple[str, ...]]]:
    """The enum-labelled counter series every /metrics has from the start: ``feedback_labels`` are
    the configured rating labels (none when ratings are not counted), each with ``other``."""
    for status in sorted(TERMINAL_STATUSES):
        for intent in sorted(INTENTS):
            # A finished run's release outcome is its status, or none when the agent wrote none.
            for outcome in (status, NONE):
                yield I.RUNS, (status, intent, outcome)
    for intent in sorted(INTENTS):
        yield I.RUN_TOKENS, (intent,)
    labels = sorted(set(feedback_labels))
    for feedback in [*labels, OTHER] if labels else []:
        for intent in sorted(INTENTS):
            yield I.FEEDBACK, (feedback, intent)
