"""One batch of runs, from rows to acknowledged requests: read each row by
meaning, map it to spans, and send the spans in requests under the size limit."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..export.sending import RequestSender
from ..mapping.span_data import MappedRun
from ..mapping.spans import Mapper
from ..source.reader import Source
from ..source.readings import read_run, read_tool
from ..source.rows import TERMINAL_STATUSES, RunRow, ToolRow, is_terminal
from .results import ExportedRun, PollResult, Recorder

log = logging.getLogger(__name__)


class RunExporter:
    """Shared by the poller, the backfill and ``run-otel export``: the one way a run is sent."""

    def __init__(self, source: Source, mapper: Mapper, sender: RequestSender, recorder: Recorder):
        self._source = source
        self._mapper = mapper
        self._sender = sender
        self._clock = source.clock
        self._recorder = recorder
        self._unknown_statuses: set[str | None] = set()

    def export(
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
            one = self._mapper.map_run(run, run_tools, incomplete=run.id in incomplete_ids)
            warnings += one.warnings
            for warning in warnings:
                log.warning("run %s: %s", run.run_id, warning)
            result.warnings += len(warnings)
            settled_at = self._clock.epoch(run.updated_at)
            mapped.append((ExportedRun(run, run_tools, run.id in incomplete_ids, len(one.spans), settled_at), one))
        sent = self._sender.send((exported.run.run_id, one.spans) for exported, one in mapped)
        result.rejected_spans, result.dropped_spans = sent.rejected, sent.dropped
        result.runs = [exported for exported, _ in mapped]
        result.run_count = len(result.runs)
        result.spans = sum(e.span_count for e in result.runs)
        if result.warnings:
            self._recorder.row_warnings(result.warnings)
        return result

    def note_status(self, status: str | None) -> None:
        """Counts every run with an unknown status; logs each such value once."""
        if status in TERMINAL_STATUSES or not is_terminal(status):
            return
        self._recorder.row_warnings(1)
        if status not in self._unknown_statuses:
            self._unknown_statuses.add(status)
            log.warning("unknown diagnosis_run.status %r: treated as terminal", status)
