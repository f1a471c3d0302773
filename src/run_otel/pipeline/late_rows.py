"""Keeping a run's trace complete after its first export.

Each exported run is watched for ``poll.late_window_seconds`` after it settled
(``watch.py``). Every poll then reads the count and highest id of the watched
runs' tool rows from ``idx_tool_invocation_run_id`` alone (one row a run), and
re-reads the runs sent as incomplete by primary key:

- a tool row that was not in the trace is sent as a span of the same trace,
  with the id it would have had at the first export, so nothing else changes;
- a run sent as incomplete that has finished (and settled) sends a child of the
  root, ``invoke_agent {agent} completed``, with the final status, attributes and
  extent, and the tool rows written since under it, inside its time (they wait
  for the finish; a run whose watch ends unfinished sends them under its root,
  with a WARNING). The root is never sent again: a second root with the same id
  and other contents is what Jaeger flags as a duplicate (``first_sends.py``
  keeps it for the re-sends of a backfill or ``run-otel export``).

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
from ..source.clock import FUTURE_TOLERANCE
from ..source.reader import Source
from ..source.rows import RunRow, ToolRow, is_terminal
from .duplicates import is_key_of, key_of
from .recorder import Recorder
from .results import ExportedRun
from .run_export import RunExporter
from .state_store import StateStore
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
        # The watches, by run_id: read from the store at the first pass, then kept here as it is written.
        self._held: dict[str, Watched] | None = None
        self._completed: dict[int, RunRow] = {}  # this pass's finished runs sent as incomplete
        self._stranded: set[int] = set()  # this pass's runs sent as incomplete whose watch ended unfinished

    def watch(self, exported: Sequence[ExportedRun], now: float) -> list[Watched]:
        """The watches a batch just sent starts. A run that settled longer ago than the window
        (a catch-up, a backlog) is not watched: its late rows landed before it was read."""
        out = []
        for sent in exported:
            if sent.incomplete:
                until = now + self._incomplete_window
            else:  # an updated_at ahead of the clock (2099, say) is watched from now
                until = min(sent.settled_at if sent.settled_at is not None else now, now) + self._window
                if until < now:
                    continue
            key = key_of(sent.run, sent.identity)  # a later row with a run id is kept under its own key
            out.append(Watched(sent.run.id, key, frozenset(t.id for t in sent.tools), sent.incomplete, until))
        return out

    def remember(self, saved: list[Watched]) -> None:
        """Adds the watches the checkpoint's transaction just saved to those held here."""
        if self._held is not None:
            self._held.update((w.run_id, w) for w in saved)

    def run(self) -> list[ExportedRun]:
        """Sends what the watched runs added since their export; returns it."""
        now = self._clock()
        if self._held is None:  # the store is read once; after that it is only written
            self._held = {w.run_id: w for w in self._store.watched(now)}
        over = [w for w in self._held.values() if w.until < now]
        for w in over:
            del self._held[w.run_id]
        watched = list(self._held.values())
        ending = [w for w in over if w.incomplete]  # never finished: what they held goes out now
        changed = self._changed(watched, ending, now) if watched or ending else []
        if not changed:
            if over:
                self._store.save_watch([], [], now)  # ends the watches that are over
            return []
        runs = {run.id: run for run in self._source.runs_by_ids(w.run_pk for w in changed)}
        tools = self._source.tools_for(w.run_id for w in changed)
        late: list[tuple[RunRow, list[ToolRow], Late]] = []
        gone: list[str] = []
        for w in changed:
            run = runs.get(w.run_pk)
            if run is None or not is_key_of(w.run_id, run):
                gone.append(w.run_id)  # deleted since: nothing more to send
                continue
            run_tools = tools.get(w.run_id, [])
            late_ids = frozenset(t.id for t in run_tools) - w.tool_ids
            late.append((run, run_tools, Late(late_ids, w.run_pk in self._completed)))
        sent = self._exporter.send_late(late) if late else []
        # By run: a run the mapper cannot map at all is left out of what was sent.
        watches = {w.run_pk: w for w in changed}
        updated = [self._after(watches[item.run.id], item, now) for item in sent if item.run.id not in self._stranded]
        self._store.save_watch(updated, gone, now)
        for run_id in gone:
            self._held.pop(run_id, None)
        self.remember(updated)
        self._report(sent)
        return sent

    def _changed(self, watched: list[Watched], ending: list[Watched], now: float) -> list[Watched]:
        """The watched runs with tool rows their trace lacks, or sent as incomplete and finished since.

        The tool rows of a run sent incomplete wait for its finish, to hang under its completed span
        inside that span's time; a run whose watch ends unfinished sends them under its root."""
        current = self._source.tool_counts_for(w.run_id for w in [*watched, *ending])
        self._completed = self._finished([w for w in watched if w.incomplete], now)
        stranded = [w for w in ending if _grew(w, current.get(w.run_id))]
        self._stranded = {w.run_pk for w in stranded}
        grown = [w for w in watched if not w.incomplete and _grew(w, current.get(w.run_id))]
        return [*grown, *(w for w in watched if w.run_pk in self._completed), *stranded]

    def _finished(self, incomplete: list[Watched], now: float) -> dict[int, RunRow]:
        """Of the runs sent as incomplete, those now terminal and settled, by primary key."""
        if not incomplete:
            return {}
        settled_before = now - self._settle
        out = {}
        for run in self._source.runs_by_ids(w.run_pk for w in incomplete):
            updated = self._source_clock.epoch(run.updated_at)
            if updated is not None and updated > now + FUTURE_TOLERANCE.total_seconds():
                updated = None  # ahead of the clock: settled as seen, as the poll settles it
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
            elif item.run.id in self._stranded:
                log.warning(
                    "run %s, sent as incomplete, did not finish while watched: its %d tool row(s) written since were sent "
                    "under its root, outside its time",
                    item.run.run_id,
                    late,
                )
            elif late:
                log.info("run %s: %d tool row(s) committed after its export were sent into its trace", item.run.run_id, late)
        if sent:
            self._recorder.late_sent(sent)


def _grew(watched: Watched, now: tuple[int, int] | None) -> bool:
    """Whether the run has tool rows its trace lacks: more of them, or a higher id than sent."""
    if now is None:
        return False
    count, highest = now
    return count > len(watched.tool_ids) or highest > max(watched.tool_ids, default=0)
