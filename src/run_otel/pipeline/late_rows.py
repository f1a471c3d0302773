"""Keeping a run's trace complete after its first export.

Each exported run is watched for ``poll.late_window_seconds`` after it settled
(``watch.py``). The poll reads each new tool row once, by primary-key range
(``tool_feed.py``); this pass takes from what it read the rows of the watched
runs that their traces lack, whatever the number watched, and re-reads the runs
sent as incomplete by primary key:

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
from ..mapping.spans import Late
from ..source.reader import Source
from ..source.rows import RunRow, ToolRow, is_terminal
from .recorder import Recorder
from .results import ExportedRun
from .run_export import RunExporter
from .state_store import StateStore
from .tool_feed import ToolFeed
from .watch import Watched

log = logging.getLogger(__name__)


class LatePass:
    def __init__(
        self,
        poll: PollConfig,
        source: Source,
        store: StateStore,
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
        # The watches, by run_id: read from the store at the first use, then kept here as it is written.
        self._held: dict[str, Watched] | None = None
        # The new tool rows, read once each; the poll's export takes its runs' rows from it too.
        self.feed = ToolFeed(source, store, poll.gap_timeout_seconds, self.watches)

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

    def remember(self, saved: list[Watched]) -> None:
        """Adds the watches the checkpoint's transaction just saved to those held here."""
        if self._held is not None:
            self._held.update((w.run_id, w) for w in saved)

    def watches(self) -> dict[str, Watched]:
        """The runs watched, by run_id: read from the store once, then kept here as it is written."""
        if self._held is None:
            self._held = {w.run_id: w for w in self._store.watched(self._clock())}
        return self._held

    def run(self) -> list[ExportedRun]:
        """Sends what the watched runs added since their export; returns it."""
        now = self._clock()
        held = self.watches()
        over = [run_id for run_id, w in held.items() if w.until < now]
        for run_id in over:
            del held[run_id]
        found = self.feed.late(held)
        completed = self._finished([w for w in held.values() if w.incomplete], now)
        changed = [w for w in held.values() if w.run_id in found or w.run_pk in completed]
        if not changed:
            if over:
                self._store.save_watch([], [], now, self.feed.mark())  # ends the watches that are over
            return []
        late, gone = self._late_sends(changed, found, completed)
        sent = self._exporter.send_late(late) if late else []
        # By run: a run the mapper cannot map at all is left out of what was sent.
        watches = {w.run_id: w for w in changed}
        updated = [self._after(watches[item.run.run_id], item, now) for item in sent]
        self.feed.release((item.run.run_id, item.late.tool_ids if item.late else ()) for item in sent)
        self.feed.release((run_id, [row.id for row in found.get(run_id, [])]) for run_id in gone)
        self._store.save_watch(updated, gone, now, self.feed.mark())
        for run_id in gone:
            held.pop(run_id, None)
        self.remember(updated)
        self._report(sent)
        return sent

    def _late_sends(
        self, changed: list[Watched], found: dict[str, list[ToolRow]], completed: dict[int, RunRow]
    ) -> tuple[list[tuple[RunRow, list[ToolRow], Late]], list[str]]:
        """What each changed run sends: its rows the trace lacks, and for a finished run sent as incomplete
        its outcome, whose span covers every tool row; and the runs deleted since (run_ids)."""
        runs = {run.id: run for run in self._source.runs_by_ids(w.run_pk for w in changed if w.run_pk not in completed)}
        runs.update(completed)
        whole = self._source.tools_for(w.run_id for w in changed if w.run_pk in completed)
        late: list[tuple[RunRow, list[ToolRow], Late]] = []
        gone: list[str] = []
        for w in changed:
            run = runs.get(w.run_pk)
            if run is None or run.run_id != w.run_id:
                gone.append(w.run_id)  # deleted since: nothing more to send
                continue
            rows = {row.id: row for row in [*whole.get(w.run_id, []), *found.get(w.run_id, [])]}
            tools = [rows[i] for i in sorted(rows)]
            late.append((run, tools, Late(frozenset(rows) - w.tool_ids, w.run_pk in completed)))
        return late, gone

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

    def _after(self, watched: Watched, sent: ExportedRun, now: float) -> Watched:
        """The watch once ``sent`` is acknowledged: a finished run is watched for the window from now."""
        assert sent.late is not None  # what send_late returns
        tool_ids = watched.tool_ids | sent.late.tool_ids
        if sent.late.completed:
            return replace(watched, tool_ids=tool_ids, incomplete=False, until=now + self._window)
        return replace(watched, tool_ids=tool_ids)

    def _report(self, sent: list[ExportedRun]) -> None:
        for item in sent:
            assert item.late is not None
            late = len(item.late.tool_ids)
            if item.late.completed:
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
