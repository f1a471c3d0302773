"""One batch of runs, from rows to acknowledged requests: read each row by
meaning, map it to spans, and send the spans in requests under the size limit."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from threading import Event
from typing import Any

from ..export.sending import Interrupted, RequestSender, Sent
from ..export.wire import RunEncoder, RunSpans
from ..mapping.span_data import RunIdentity
from ..mapping.spans import Late
from ..source.reader import Source
from ..source.readings import read_rows
from ..source.rows import TERMINAL_STATUSES, RunRow, ToolRow, is_terminal
from .duplicates import DuplicateRule
from .first_sends import Sent as SentIncomplete
from .recorder import Recorder
from .results import ExportedRun, PollResult
from .row_shapes import Entry, Noted, RowShapes, cut_by_limit

log = logging.getLogger(__name__)

# run_otel_dropped_spans_total's reason for a run no value left out lets the mapper map.
UNMAPPABLE = "unmappable"


@dataclass
class Prepared:
    """A batch's runs as read, and their spans as bytes, before they are sent.

    What its rows raised is told only once the batch is acknowledged: a batch whose send
    fails is prepared again on the next try, and its rows would otherwise warn twice."""

    runs: list[ExportedRun] = field(default_factory=list)
    spans: list[RunSpans] = field(default_factory=list)
    warned: list[tuple[str, str]] = field(default_factory=list)  # run id, warning
    skipped: list[tuple[str, str, int]] = field(default_factory=list)  # run id, why, its tool rows
    noted: Noted = field(default_factory=Noted)  # duplicates, cuts, odd times, first incomplete sends

    @property
    def warnings(self) -> int:
        return len(self.warned)

    @property
    def unmapped(self) -> int:
        """Spans of the runs that could not be mapped."""
        return sum(1 + tools for _, _, tools in self.skipped)


class RunExporter:
    """Shared by the poller, the backfill and ``run-otel export``: the one way a run is sent."""

    def __init__(
        self, source: Source, runs: RunEncoder, sender: RequestSender, recorder: Recorder, shapes: RowShapes | None = None
    ):
        self._source = source
        self._runs = runs
        self._sender = sender
        self._clock = source.clock
        self._recorder = recorder
        self._unknown_statuses: set[str | None] = set()
        # Without it every row owns its run id and nothing was sent incomplete before.
        self.shapes = shapes or RowShapes(DuplicateRule(None))

    def export(
        self,
        runs: Sequence[RunRow],
        incomplete_ids: frozenset[int] | set[int] = frozenset(),
        tools: dict[str, list[ToolRow]] | None = None,
    ) -> PollResult:
        """Maps and sends ``runs`` with their tools (read here unless given); raises
        ExportError unless all were acked."""
        return self.deliver(self.prepare(runs, incomplete_ids, tools))

    def prepare(
        self,
        runs: Sequence[RunRow],
        incomplete_ids: frozenset[int] | set[int] = frozenset(),
        tools: dict[str, list[ToolRow]] | None = None,
    ) -> Prepared:
        """Reads and maps ``runs`` with their tools into their spans' bytes, ready to ``deliver``."""
        if tools is None:
            tools = self._source.tools_for(r.run_id for r in runs) if runs else {}
        return self._prepare(self.shapes.plan(runs, tools, incomplete_ids))

    def send_late(self, runs: Sequence[tuple[RunRow, Sequence[ToolRow], Late]]) -> list[ExportedRun]:
        """Sends what exported runs add later (``Mapper.map_into`` with ``late``): the same path as a
        first send, but for what it sends. Raises ExportError unless acked; returns the runs as read."""
        return self.deliver(self._prepare(self.shapes.plan_late(runs))).runs

    def _prepare(self, entries: list[Entry]) -> Prepared:
        prepared = Prepared()
        for row, tool_rows, incomplete, late, identity, first_root in entries:
            warnings: list[str] = []
            if late is not None and not late.completed:  # only the late rows are sent
                tool_rows = [tool for tool in tool_rows if tool.id in late.tool_ids]
            quiet = () if late is None else {tool.id for tool in tool_rows} - late.tool_ids
            run, run_tools = read_rows(row, tool_rows, warnings, quiet)
            one = self._map(run, run_tools, incomplete, late, warnings, prepared.skipped, identity)
            if one is None:
                continue
            self._note(prepared.noted, run, run_tools, incomplete, late, identity, one, first_root)
            prepared.warned += [(run.run_id, warning) for warning in warnings]
            settled_at = self._clock.epoch(run.updated_at)
            sent_late = late if first_root is None else None  # a re-send as first sent is a whole send
            prepared.runs.append(ExportedRun(run, run_tools, incomplete, len(one.encoded), settled_at, sent_late, identity))
            prepared.spans.append(one)
        prepared.noted.add_times(self._runs.mapper.times.take())
        return prepared

    def _note(
        self,
        noted: Noted,
        run: RunRow,
        tools: list[ToolRow],
        incomplete: bool,
        late: Late | None,
        identity: RunIdentity | None,
        one: RunSpans,
        first_root: bytes | None,
    ) -> None:
        """What the run's send adds besides its spans: its first root before them, the first incomplete
        send to record, a later row with its run id, the tool rows past the span limit."""
        if first_root is not None:
            one.encoded.insert(0, first_root)
        elif incomplete and late is None:
            noted.first_sends.append(SentIncomplete(run.id, run.run_id, one.encoded[0], frozenset(tool.id for tool in tools)))
        if identity is not None and identity.duplicate and late is None:
            noted.duplicates.append((run.run_id, run.id, identity.owner_pk, identity.trace_id.hex()))
        limit = self._runs.mapper.span_cap
        if cut := cut_by_limit(tools, late, limit):
            noted.cuts.append((run.run_id, cut, limit))

    def deliver(self, prepared: Prepared, stop: Event | None = None) -> PollResult:
        """Sends what ``prepare`` made; raises ExportError unless all was acked. It maps nothing
        new, so a backfill or a drain sends one batch while it prepares the next. Once ``stop`` is
        set no request is sent, and the result holds the runs acknowledged whole and the rest unsent."""
        try:
            sent = self._sender.send(prepared.spans, stop)
        except Interrupted as cut:
            return self._interrupted(prepared, cut.sent)
        self.shapes.acknowledged(prepared.noted, time.time())
        self._report(prepared)
        result = PollResult()
        result.warnings = prepared.warnings
        result.rejected_spans, result.dropped_spans = sent.rejected, sent.dropped + prepared.unmapped
        result.runs = prepared.runs
        result.run_count = len(result.runs)
        result.spans = sum(e.span_count for e in result.runs)
        return result

    def _interrupted(self, prepared: Prepared, sent: Sent) -> PollResult:
        """The runs acknowledged whole before a stop, and those not: their spans go out again after the restart."""
        result = PollResult(interrupted=True)
        result.runs, result.unsent = prepared.runs[: sent.runs], [one.run for one in prepared.runs[sent.runs :]]
        # The incomplete roots acknowledged are recorded as first sent: a re-send must send the same bytes.
        acked = {one.run.id for one in result.runs}
        first = [one for one in prepared.noted.first_sends if one.run_pk in acked]
        self.shapes.acknowledged(Noted(first_sends=first), time.time())
        result.run_count, result.spans = len(result.runs), sum(one.span_count for one in result.runs)
        result.rejected_spans, result.dropped_spans = sent.rejected, sent.dropped
        return result

    def _report(self, prepared: Prepared) -> None:
        for run_id, warning in prepared.warned:
            log.warning("run %s: %s", run_id, warning)
        if prepared.warned:
            self._recorder.row_warnings(len(prepared.warned))
        for run_id, failure, tools in prepared.skipped:
            log.warning("run %s: cannot be mapped (%s); skipped with its %d tool row(s)", run_id, failure, tools)
            self._recorder.spans_dropped(UNMAPPABLE, 1 + tools)
        prepared.noted.tell(self._recorder)

    def _map(
        self,
        run: RunRow,
        tools: list[ToolRow],
        incomplete: bool,
        late: Late | None,
        warnings: list[str],
        skipped: list[tuple[str, str, int]],
        identity: RunIdentity | None = None,
    ) -> RunSpans | None:
        """The run's spans, its mapping's warnings added to ``warnings``; a value the mapper still
        refuses is left out, naming its column, and a run that cannot be mapped even so is added to
        ``skipped``: never an error that stops the poll."""
        try:
            one, mapped_warnings = self._runs.encode(run, tools, incomplete, late, identity)
            warnings += mapped_warnings
            return one
        except Exception as exc:  # one row must never stop the runs behind it
            failure = f"{exc.__class__.__name__}: {exc}"
        for where, run_without, tools_without in _each_value_left_out(run, tools):
            try:
                one, mapped_warnings = self._runs.encode(run_without, tools_without, incomplete, late, identity)
            except Exception:  # the next value left out may be the one
                continue
            warnings.append(f"{where} could not be mapped ({failure}); left out")
            warnings += mapped_warnings
            return one
        skipped.append((run.run_id, failure, len(tools)))
        return None

    def note_status(self, status: str | None) -> None:
        """Counts every run with an unknown status; logs each such value once."""
        if status in TERMINAL_STATUSES or not is_terminal(status):
            return
        self._recorder.row_warnings(1)
        if status not in self._unknown_statuses:
            self._unknown_statuses.add(status)
            log.warning("unknown diagnosis_run.status %r: treated as terminal", status)


def _each_value_left_out(run: RunRow, tools: list[ToolRow]) -> Iterator[tuple[str, RunRow, list[ToolRow]]]:
    """The run with one value set to NULL at a time, the run's own columns first: where, run, tools.
    Only after the mapper refused a run, so its cost is never paid on the way of a good row."""
    for i, column in enumerate(RunRow._fields[2:], 2):  # id and run_id make the trace
        if run[i] is not None:
            nulled: dict[str, Any] = {column: None}
            yield f"diagnosis_run.{column}", run._replace(**nulled), tools
    for k, tool in enumerate(tools):
        for i, column in enumerate(ToolRow._fields[2:], 2):
            if tool[i] is not None:
                nulled = {column: None}
                without = tool._replace(**nulled)
                yield f"tool_invocation {tool.id}: {column}", run, [*tools[:k], without, *tools[k + 1 :]]
