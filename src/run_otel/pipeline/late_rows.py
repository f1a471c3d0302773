"""Keeping a run's trace complete after its first export.

Each exported run is watched for ``poll.late_window_seconds`` after it settled
(``watch.py``). Every poll then reads the tool row ids of the watched runs from
``idx_tool_invocation_run_id`` alone, and re-reads the runs sent as incomplete
by primary key:

- a tool row that was not in the trace is sent as a span of the same trace,
  with the id it would have had at the first export, so nothing else changes;
- a run sent as incomplete that has finished (and settled) sends its new tool
  rows and a child of the root, ``invoke_agent {agent} completed``, with the
  final status and attributes. The root is never sent again: a second root
  with the same id and other contents is what Jaeger flags as a duplicate.

A run sent as incomplete is watched for ``poll.run_timeout_seconds`` more (at
least the window); once finished, for the window from then. Each late row and
late completion is counted (``run_otel_late_rows_total``) and logged with its run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from ..config import PollConfig
from ..source.reader import Source
from ..source.rows import RunRow, is_terminal
from .checkpoint import CheckpointStore
from .results import ExportedRun, LateRun, Recorder
from .run_export import RunExporter
from .watch import Watched

log = logging.getLogger(__name__)


class LatePass:
    def __init__(
        self,
        poll: PollConfig,
        source: Source,
        store: CheckpointStore,
        exporter: RunExporter,
        recorder: Recorder,
        clock: Callable[[], float] = time.time,
    ):
        self._window = poll.late_window_seconds
        # A run sent as incomplete may take as long again to finish.
        self._incomplete_window = max(poll.late_window_seconds, poll.run_timeout_seconds)
        self._settle = poll.settle_seconds
        self._source = source
        self._store = store
        self._exporter = exporter
        self._recorder = recorder
        self._clock = clock
        self._source_clock = source.clock

    def watch(self, exported: Sequence[ExportedRun], now: float) -> list[Watched]:
        """The watches a batch just sent starts. A run that settled longer ago than the window
        (a catch-up, a backlog) is not watched: its late rows landed before it was read."""
        out = []
        for sent in exported:
            if sent.incomplete:
                until = now + self._incomplete_window
            else:
                until = (sent.settled_at if sent.settled_at is not None else now) + self._window
                if until < now:
                    continue
            out.append(Watched(sent.run.id, sent.run.run_id, frozenset(t.id for t in sent.tools), sent.incomplete, until))
        return out

    def run(self) -> list[LateRun]:
        """Sends what the watched runs added since their export; returns it."""
        now = self._clock()
        watched = self._store.watched(now)
        if not watched:
            self._store.save_watch([], [], now)  # ends the watches that are over
            return []
        current = self._source.tool_ids_for(w.run_id for w in watched)
        finished = self._finished([w for w in watched if w.incomplete], now)
        changed = [w for w in watched if current.get(w.run_id, set()) - w.tool_ids or w.run_pk in finished]
        if not changed:
            self._store.save_watch([], [], now)
            return []
        runs = {run.id: run for run in self._source.runs_by_ids(w.run_pk for w in changed)}
        tools = self._source.tools_for(w.run_id for w in changed)
        late: list[LateRun] = []
        gone: list[str] = []
        for w in changed:
            run = runs.get(w.run_pk)
            if run is None or run.run_id != w.run_id:
                gone.append(w.run_id)  # deleted since: nothing more to send
                continue
            run_tools = tools.get(w.run_id, [])
            late_ids = frozenset(t.id for t in run_tools) - w.tool_ids
            late.append(LateRun(run, run_tools, late_ids, w.run_pk in finished))
        sent = self._exporter.export_late(late) if late else []
        self._store.save_watch([self._after(w, item, now) for w, item in zip(_kept(changed, gone), sent)], gone, now)
        self._report(sent)
        return sent

    def _finished(self, incomplete: list[Watched], now: float) -> dict[int, RunRow]:
        """Of the runs sent as incomplete, those now terminal and settled, by primary key."""
        if not incomplete:
            return {}
        settled_before = now - self._settle
        out = {}
        for run in self._source.runs_by_ids(w.run_pk for w in incomplete):
            updated = self._source_clock.epoch(run.updated_at)
            if is_terminal(run.status) and (updated is None or updated <= settled_before):
                out[run.id] = run
        return out

    def _after(self, watched: Watched, sent: LateRun, now: float) -> Watched:
        """The watch once ``sent`` is acknowledged: a finished run is watched for the window from now."""
        tool_ids = watched.tool_ids | sent.late_ids
        if sent.completed:
            return replace(watched, tool_ids=tool_ids, incomplete=False, until=now + self._window)
        return replace(watched, tool_ids=tool_ids)

    def _report(self, sent: list[LateRun]) -> None:
        for item in sent:
            late = len(item.late_ids)
            if item.completed:
                log.info(
                    "run %s, sent as incomplete, finished as %s: its outcome and %d tool row(s) written since were sent "
                    "into its trace",
                    item.run.run_id,
                    item.run.status,
                    late,
                )
            elif late:
                log.info("run %s: %d tool row(s) committed after its export were sent into its trace", item.run.run_id, late)
        if sent:
            self._recorder.late_sent(sent)


def _kept(changed: list[Watched], gone: list[str]) -> list[Watched]:
    missing = set(gone)
    return [w for w in changed if w.run_id not in missing]
