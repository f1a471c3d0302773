"""Rows to spans: a pure function of a run, its tool rows and the config.

No I/O and no clock: the same rows always give the same spans, which is what
makes an at-least-once re-export byte-identical (SPEC section 1).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final, NamedTuple

from ..config import TraceConfig
from ..source.clock import SourceClock
from ..source.evidence import Evidence, EvidenceParser
from ..source.memo import Memo
from ..source.rows import RELEVANCE_LEVELS, RETRIEVAL_LAYERS, RunRow, ToolRow
from . import attributes as A
from .content import ContentPolicy
from .documents import RetrievalDocuments, openinference_documents
from .limits import AttributeLimits
from .span_data import (
    MAX_DURATION_MS,
    STATUS_ERROR,
    STATUS_OK,
    STATUS_UNSET,
    AttrValue,
    Event,
    MappedRun,
    RunIdentity,
    completion_span_id_for,
    identity_for,
    tool_span_id_for,
)
from .span_out import ReadableSpans, SpanOut, Status, T
from .times import OUTSIDE_TOLERANCE_NS, TimeReader, valid_duration

# How each outcome shows in a trace list: (status, error.type, description). Jaeger's list marks
# only errors, so the outcomes where the user did not get the agent's own answer are errors, each
# with its own error.type; an unknown status stays UNSET, and the poller logs it once per value.
_OUTCOMES: Final = {
    "SUCCESS": (STATUS_OK, None, ""),
    "FAILED": (STATUS_ERROR, A.ERROR_RUN_FAILED, "run failed"),
    "FALLBACK": (STATUS_ERROR, A.ERROR_RUN_FALLBACK, "run fell back"),
    "CANCELLED": (STATUS_ERROR, A.ERROR_RUN_CANCELLED, "run was cancelled"),
}
_INCOMPLETE: Final = (STATUS_ERROR, A.ERROR_RUN_INCOMPLETE, "run did not finish in time")

_NS_PER_MS: Final = 1_000_000


class Late(NamedTuple):
    """What an exported run sends later: its tool rows committed since, and whether a run sent as
    incomplete has finished (its outcome then goes out as a child of the root, the ``completed``
    span, and the tool rows sent with it hang under that span). ``first``: the tool rows sent with
    the incomplete root, which hang under it (a re-send of the run as it was first sent)."""

    tool_ids: frozenset[int]
    completed: bool
    first: frozenset[int] = frozenset()


# Longer error messages are redacted every time rather than held as memo keys.
_MEMO_MAX_CHARS: Final = 1024


class Mapper:
    """Maps rows to spans under the trace section. Build once; ``map_run`` is pure.

    A span is written to a ``SpanOut``: readable ``SpanData`` here, OTLP bytes on the
    export's hot path (``map_into``). One run is mapped at a time."""

    def __init__(self, trace: TraceConfig, clock: SourceClock, content: ContentPolicy):
        self._clock = clock
        self.times = TimeReader(clock)
        # In a zone without shifts every value is read straight: the common case pays nothing.
        self._epoch_ns = self._clock.epoch_ns if clock.local_shifts.fixed else self.times.ns
        self._agent_name = trace.agent_name
        self._provider = trace.provider_name
        self._openinference = "openinference" in trace.conventions
        self._anchor_start = trace.tool_time_anchor == "start"
        self._cap = trace.max_spans_per_trace
        self.limits = AttributeLimits.from_config(trace)
        self._readable = ReadableSpans(self.limits)
        self._content = content
        # Error messages repeat (the same timeout across thousands of calls): redact each once.
        self._error_texts = Memo(self._content.error_text, 1024)
        self._evidence_parser = EvidenceParser()
        self._retrieval_documents = RetrievalDocuments()

    # -- the run ------------------------------------------------------------

    @property
    def span_cap(self) -> int:
        return self._cap

    def map_run(
        self,
        run: RunRow,
        tools: Sequence[ToolRow],
        incomplete: bool = False,
        late: Late | None = None,
        identity: RunIdentity | None = None,
    ) -> MappedRun:
        """The readable spans ``map_into`` makes: for ``show``, the tests and the reference encoder."""
        spans, warnings = self.map_into(self._readable, run, tools, incomplete, late, identity)
        return MappedRun(spans, warnings)

    def map_into(
        self,
        out: SpanOut[T],
        run: RunRow,
        tools: Sequence[ToolRow],
        incomplete: bool = False,
        late: Late | None = None,
        identity: RunIdentity | None = None,
    ) -> tuple[list[T], list[str]]:
        """The run's spans, root first, as ``out`` makes them, and the warnings its rows raised.

        With ``late``, what an exported run sends later instead: the spans of its tool rows in
        ``late.tool_ids`` and, once a run sent as incomplete has finished, a child of the root with
        its final outcome. The root is never sent again: with a new extent or status it would be a
        second, different span with the same id, which Jaeger shows twice. ``tools`` are then all of
        the run's rows, and only the late ones warn (the others warned at the run's export).

        ``identity`` says whose ids the spans get (``identity_for`` the run id unless given); a
        later row with a run id an earlier row has gets its own, and its root links to that row's."""
        warnings: list[str] = []
        quiet = [] if late is not None else warnings
        ids = identity or identity_for(run.run_id)
        kept = tools[: self._cap]
        fallback_ns = self._run_start_ns(run, warnings)
        own_start, own_end = self._own_bounds(run, fallback_ns, quiet)
        # What came after a run was sent incomplete hangs under its completed span, inside that span's time.
        completion_id = completion_span_id_for(ids.key) if late is not None and late.completed else b""
        spans: list[T] = []
        bounds: list[tuple[int, int]] = []
        outside, farthest, farthest_id = 0, 0, 0
        for tool in kept:
            sending = late is None or tool.id in late.tool_ids
            times = self._tool_times(tool, fallback_ns, warnings if sending else quiet)
            bounds.append((times[0], times[1]))
            if sending:
                parent = completion_id if completion_id and tool.id not in late.first else ids.root_id  # type: ignore[union-attr]
                spans.append(self._tool_span(out, run, tool, ids, parent, times, warnings))
                off = times[1] - own_end if times[1] > own_end else times[0] - own_start if times[0] < own_start else 0
                if abs(off) > OUTSIDE_TOLERANCE_NS:
                    outside += 1
                    if abs(off) > abs(farthest):
                        farthest, farthest_id = off, tool.id
        if outside:
            self.times.outside(outside, farthest_id, farthest / 1e9, warnings, late is not None and not late.completed)
        if late is not None and not late.completed:
            return spans, warnings
        start_ns = min([own_start, *(start for start, _ in bounds)])
        end_ns = max([own_end, *(end for _, end in bounds)])
        out.begin()
        self._run_attributes(out, run, incomplete, len(tools) - len(kept))
        name = f"{A.OPERATION_INVOKE_AGENT} {self._agent_name}"
        span_id, parent_id = ids.root_id, b""
        if late is not None:
            out.put(A.RUN_COMPLETED_LATE, True)
            name, span_id, parent_id = f"{name} {A.COMPLETION_SUFFIX}", completion_id, ids.root_id
        elif ids.link is not None:
            name = f"{name} {A.DUPLICATE_SUFFIX}"
            out.put(A.RUN_ROW_ID, run.id)
            out.put(A.RUN_DUPLICATE_OF_ROW_ID, ids.owner_pk)
            out.link(*ids.link)
        status = self._run_status(run, incomplete, end_ns)
        spans.insert(0, out.finish((ids.trace_id, span_id, parent_id, name, start_ns, end_ns), status, None))
        return spans, warnings

    def _run_start_ns(self, run: RunRow, warnings: list[str]) -> int:
        start = self._epoch_ns(run.created_at)
        if start is None:
            warnings.append("diagnosis_run.created_at is not a valid date")
            start = self._epoch_ns(run.updated_at)
        if start == 0:
            self.times.before_epoch(run.created_at, "diagnosis_run.created_at", warnings)
        return start or 0

    def _own_bounds(self, run: RunRow, start_ns: int, warnings: list[str]) -> tuple[int, int]:
        """The run's own time, before it is widened over its tool rows."""
        duration = valid_duration(run.total_duration_ms, warnings, "diagnosis_run", None, "total_duration_ms")
        if duration is not None:
            return start_ns, start_ns + duration * _NS_PER_MS
        end_ns = self._epoch_ns(run.updated_at)
        if end_ns is None:
            return start_ns, start_ns
        if end_ns < start_ns:
            warnings.append("diagnosis_run.updated_at is before created_at")
            end_ns = start_ns
        elif end_ns - start_ns > MAX_DURATION_MS * _NS_PER_MS:  # 2099, say: as a duration over a day is
            warnings.append("diagnosis_run.updated_at is more than a day after created_at; the run ends at its start")
            end_ns = start_ns
        return start_ns, end_ns

    @staticmethod
    def _run_status(run: RunRow, incomplete: bool, end_ns: int) -> Status:
        code, _error_type, message = _INCOMPLETE if incomplete else _OUTCOMES.get(run.status or "", (STATUS_UNSET, None, ""))
        if run.status == "FAILED" and not incomplete:
            return code, message, (exception_event(A.ERROR_RUN_FAILED, message, end_ns),)
        return code, message, ()

    def _run_attributes(self, out: SpanOut, run: RunRow, incomplete: bool, dropped: int) -> None:
        out.put(A.GEN_AI_OPERATION_NAME, A.OPERATION_INVOKE_AGENT)
        out.put(A.GEN_AI_AGENT_NAME, self._agent_name)
        if self._provider:
            out.put(A.GEN_AI_PROVIDER_NAME, self._provider)
        out.put_some(A.GEN_AI_CONVERSATION_ID, run.session_id)
        out.put_some(A.SESSION_ID, run.session_id)
        out.put(A.RUN_ID, run.run_id)
        out.put_some(A.RUN_STATUS, run.status)
        out.put_some(A.RUN_INTENT, run.intent)
        out.put_some(A.RUN_RELEASE_OUTCOME, run.release_outcome)
        out.put_some(A.RUN_AGENT_FLOW, run.agent_flow)
        out.put_some(A.RUN_STEP_COUNT, run.step_count)
        out.put_some(A.RUN_TOOL_CALL_COUNT, run.tool_call_count)
        out.put_some(A.RUN_TOTAL_TOKEN_COUNT, run.total_token_count)
        out.put_some(A.RUN_DURATION_MS, run.total_duration_ms)
        if incomplete:
            out.put(A.ERROR_TYPE, A.ERROR_RUN_INCOMPLETE)
            out.put(A.RUN_INCOMPLETE, True)
        else:
            out.put_some(A.ERROR_TYPE, _OUTCOMES.get(run.status or "", (0, None, ""))[1])
        if dropped > 0:
            out.put(A.RUN_TOOL_SPAN_LIMIT, self._cap)
            out.put(A.RUN_TOOL_SPANS_DROPPED, dropped)
        if self._openinference:
            out.put(A.OPENINFERENCE_SPAN_KIND, A.OI_KIND_AGENT)
        if self._content.capture:
            out.extend(self._content.run_attributes(run.query, run.answer, run.published_result))

    # -- a tool invocation ----------------------------------------------------

    def _tool_times(self, tool: ToolRow, fallback_ns: int, warnings: list[str]) -> tuple[int, int, int | None]:
        """The call's start and end, and its duration when valid."""
        at_ns = self._epoch_ns(tool.created_at)
        if at_ns is None:
            warnings.append(f"tool_invocation {tool.id}: created_at is not a valid date")
            at_ns = fallback_ns
        elif not at_ns:
            self.times.before_epoch(tool.created_at, f"tool_invocation {tool.id}: created_at", warnings)
        duration = valid_duration(tool.duration_ms, warnings, "tool_invocation", tool.id, "duration_ms")
        length_ns = (duration or 0) * _NS_PER_MS
        if self._anchor_start:
            return at_ns, at_ns + length_ns, duration
        return max(at_ns - length_ns, 0), at_ns, duration

    def _tool_span(
        self,
        out: SpanOut[T],
        run: RunRow,
        tool: ToolRow,
        ids: RunIdentity,
        parent_id: bytes,
        times: tuple[int, int, int | None],
        warnings: list[str],
    ) -> T:
        start_ns, end_ns, duration = times
        status: Status = (STATUS_UNSET, "", ())
        cut = False
        if tool.success is False:
            message, cut = self._error_text(tool.error_message)
            status = (STATUS_ERROR, message, (exception_event(A.ERROR_TOOL, message, end_ns),))
        out.begin()
        self._tool_attributes(out, run, tool, duration, warnings)
        # A RAG lookup is the conventions' retrieval operation; Jaeger's UI classifies it as one.
        operation = A.OPERATION_RETRIEVAL if tool.retrieval_layer is not None else A.OPERATION_EXECUTE_TOOL
        span_id = tool_span_id_for(ids.key, tool.id)
        # A message past content.max_length is named as cut, as an attribute past the limits is.
        head = (ids.trace_id, span_id, parent_id, f"{operation} {tool.tool_name}", start_ns, end_ns)
        return out.finish(head, status, A.EXCEPTION_MESSAGE if cut else None)

    def _error_text(self, message: str | None) -> tuple[str, bool]:
        if message is not None and len(message) <= _MEMO_MAX_CHARS:
            return self._error_texts(message)
        return self._content.error_text(message)

    def _tool_attributes(self, out: SpanOut, run: RunRow, tool: ToolRow, duration_ms: int | None, warnings: list[str]) -> None:
        retriever = tool.retrieval_layer is not None
        out.put(A.GEN_AI_OPERATION_NAME, A.OPERATION_RETRIEVAL if retriever else A.OPERATION_EXECUTE_TOOL)
        out.put_some(A.GEN_AI_TOOL_NAME, tool.tool_name)
        out.put(A.GEN_AI_TOOL_CALL_ID, str(tool.id))
        out.put(A.GEN_AI_TOOL_TYPE, A.TOOL_TYPE_DATASTORE if retriever else A.TOOL_TYPE_FUNCTION)
        out.put_some(A.GEN_AI_CONVERSATION_ID, run.session_id)
        out.put(A.RUN_ID, run.run_id)
        out.put_some(A.STEP_ID, tool.step_id)
        if retriever and tool.retrieval_layer not in RETRIEVAL_LAYERS:
            warnings.append(f"tool_invocation {tool.id}: unknown retrieval_layer {tool.retrieval_layer!r}")
        if tool.relevance_level is not None and tool.relevance_level not in RELEVANCE_LEVELS:
            warnings.append(f"tool_invocation {tool.id}: unknown relevance_level {tool.relevance_level!r}")
        out.put_some(A.RAG_RETRIEVAL_LAYER, tool.retrieval_layer)
        out.put_some(A.RAG_L0_MATCH_COUNT, tool.l0_match_count)
        out.put_some(A.RAG_L1_MATCH_COUNT, tool.l1_match_count)
        out.put_some(A.RAG_RELEVANCE_LEVEL, tool.relevance_level)
        out.put_some(A.RAG_DEDUP_REASON, tool.dedup_reason)
        evidence = self._evidence(out, tool, warnings)
        documents = retriever and evidence is not None and bool(evidence.paths)
        if retriever:
            out.put_some(A.GEN_AI_DATA_SOURCE_ID, tool.tool_name)
            if documents:
                out.put(A.GEN_AI_RETRIEVAL_DOCUMENTS, self._retrieval_documents(evidence, tool))  # type: ignore[arg-type]
        out.put_some(A.TOOL_OUTPUT_LENGTH, tool.output_length)
        out.put_some(A.TOOL_OUTPUT_TRUNCATED, None if tool.is_truncated is None else bool(tool.is_truncated))
        # The span treats an out-of-range duration as missing; so does its attribute.
        out.put_some(A.TOOL_DURATION_MS, duration_ms)
        if tool.success is False:
            out.put(A.ERROR_TYPE, A.ERROR_TOOL)
        if self._openinference:
            # A RAG lookup is a RETRIEVER, so Phoenix shows its evidence as documents.
            out.put(A.OPENINFERENCE_SPAN_KIND, A.OI_KIND_RETRIEVER if retriever else A.OI_KIND_TOOL)
            out.put_some(A.OI_TOOL_NAME, tool.tool_name)
            out.put_some(A.SESSION_ID, run.session_id)
            if documents:
                out.extend(openinference_documents(evidence, tool, self._content))  # type: ignore[arg-type]
        if self._content.capture:
            refs_json = _compact_json(evidence.refs) if evidence is not None and evidence.refs is not None else None
            out.extend(
                self._content.tool_attributes(
                    tool.input_params, tool.output_preview, tool.success is True, refs_json, retriever and self._openinference
                )
            )

    def _evidence(self, out: SpanOut, tool: ToolRow, warnings: list[str]) -> Evidence | None:
        """Puts rag.evidence.* from retrieval_details, parsed here or summarized by the database."""
        details = tool.retrieval_details
        evidence = details if isinstance(details, Evidence) else self._evidence_parser.summarize(details, warnings, tool.id)
        if evidence is None:
            return None
        out.put_some(A.RAG_EVIDENCE_STATUS, evidence.status)
        if evidence.refs_not_a_list:
            warnings.append(f"tool_invocation {tool.id}: evidence_refs is not a list")
            return evidence
        out.put_some(A.RAG_EVIDENCE_COUNT, evidence.ref_count)
        if evidence.paths:
            out.put(A.RAG_EVIDENCE_PATHS, evidence.paths)
        return evidence


def exception_event(error_type: str, message: str, at_ns: int) -> Event:
    """An ``exception`` event as the SDK's record_exception writes it, less the stack trace we do not have."""
    attrs: tuple[tuple[str, AttrValue], ...] = ((A.EXCEPTION_TYPE, error_type),)
    if message:
        attrs += ((A.EXCEPTION_MESSAGE, message),)
    return (A.EXCEPTION_EVENT, at_ns, attrs)


def _compact_json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
