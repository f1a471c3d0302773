"""Keeping a run's trace complete after its first export.

Each exported run is watched for ``poll.late_window_seconds`` after it settled
(``watch.py``). The poll reads each new tool row once, by primary-key range
(``tool_feed.py``); this pass takes from what it read the rows of the watched
runs that their traces lack, whatever the number watched, and re-reads the runs
sent as incomplete by primary key:

- a tool row that was not in the trace is sent as a span of the same trace,
  with the id it would have had at the first export, so nothing else changes;
- a run sent as incomplete that has finished (and settled) sends a child of the
  root, ``invoke_agent {agent} completed``, with the final status, attributes and
  extent, and the tool rows written since under it, inside its time (they wait
  for the finish, held by the feed; a run whose watch ends unfinished sends them
  under its root, with a WARNING). The root is never sent again: a second root
  with the same id and other contents is what Jaeger flags as a duplicate
  (``first_sends.py`` keeps it for the re-sends of a backfill or ``run-otel export``).

A watch is kept under ``duplicates.key_of`` its run: the run id for the row that
owns it, which owns every tool row of the run id in any letter case (the feed
holds them case-folded), and ``run_id#pk`` for a later row, which has none.

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
        # The watches, by key: read from the store at the first use, then kept here as it is written.
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

    def watches(self) -> dict[str, Watched]:
        """The runs watched, by key: read from the store once, then kept here as it is written."""
        if self._held is None:
            self._held = {w.run_id: w for w in self._store.watched(self._clock())}
        return self._held

    def run(self, offset: float = 0.0) -> list[ExportedRun]:
        """Sends what the watched runs added since their export; returns it. ``offset``: the database's
        clock minus this host's, which a run's updated_at is read against."""
        now = self._clock()
        held = self.watches()
        over = [w for w in held.values() if w.until < now]
        ending = {w.run_id: w for w in over if w.incomplete}  # never finished: what they held goes out now
        watched = {key: w for key, w in held.items() if w.until >= now}
        found = self.feed.late({**watched, **ending})
        completed = self._finished([w for w in watched.values() if w.incomplete], now + offset)
        # A run sent incomplete keeps its new rows for its completed span, unless its watch ends unfinished.
        stranded = {w.run_pk for w in ending.values() if w.run_id in found}
        changed = [
            *(w for w in watched.values() if w.run_pk in completed or (not w.incomplete and w.run_id in found)),
            *(w for w in ending.values() if w.run_pk in stranded),
        ]
        sent: list[ExportedRun] = []
        updated: list[Watched] = []
        gone: list[str] = []
        if changed:
            late, gone = self._late_sends(changed, found, completed)
            sent = self._exporter.send_late(late) if late else []
            # By primary key: a later row's watch is not under its run id; a run the mapper cannot map is left out.
            watches = {w.run_pk: w for w in changed}
            updated = [self._after(watches[item.run.id], item, now) for item in sent if item.run.id not in stranded]
            self.feed.release((item.run.run_id, item.late.tool_ids if item.late else ()) for item in sent)
            self.feed.release((key, [row.id for row in found.get(key, [])]) for key in gone)
        elif not over:
            return []
        for w in over:  # only once what they held went out: a failed send leaves them for the next pass
            held.pop(w.run_id, None)
        for key in gone:
            held.pop(key, None)
        self._store.save_watch(updated, gone, now, self.feed.mark())
        self.remember(updated)
        self._report(sent, stranded)
        return sent

    def _late_sends(
        self, changed: list[Watched], found: dict[str, list[ToolRow]], completed: dict[int, RunRow]
    ) -> tuple[list[tuple[RunRow, list[ToolRow], Late]], list[str]]:
        """What each changed run sends: its rows the trace lacks, and for a finished run sent as incomplete
        its outcome, whose span covers every tool row; and the runs deleted since (keys)."""
        runs = {run.id: run for run in self._source.runs_by_ids(w.run_pk for w in changed if w.run_pk not in completed)}
        runs.update(completed)
        # A finished run's outcome covers all its rows: read by run_id, once, for the owners only.
        owners = [runs[w.run_pk].run_id for w in changed if w.run_pk in completed and w.run_id == runs[w.run_pk].run_id]
        whole = self._source.tools_for(owners) if owners else {}
        late: list[tuple[RunRow, list[ToolRow], Late]] = []
        gone: list[str] = []
        for w in changed:
            run = runs.get(w.run_pk)
            if run is None or not is_key_of(w.run_id, run):
                gone.append(w.run_id)  # deleted since: nothing more to send
                continue
            rows = {row.id: row for row in [*whole.get(run.run_id, []), *found.get(w.run_id, [])]}
            if w.run_id != run.run_id:
                rows = {}  # a later row with the run id: its tool rows are the owner's
            tools = [rows[i] for i in sorted(rows)]
            late.append((run, tools, Late(frozenset(rows) - w.tool_ids, w.run_pk in completed)))
        return late, gone

    def _finished(self, incomplete: list[Watched], db_now: float) -> dict[int, RunRow]:
        """Of the runs sent as incomplete, those now terminal and settled by the database's clock, by primary key."""
        if not incomplete:
            return {}
        settled_before = db_now - self._settle
        out = {}
        for run in self._source.runs_by_ids(w.run_pk for w in incomplete):
            updated = self._source_clock.epoch(run.updated_at)
            if updated is not None and updated > db_now + FUTURE_TOLERANCE.total_seconds():
                updated = None  # ahead of the database's clock: settled as seen, as the poll settles it
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

    def _report(self, sent: list[ExportedRun], stranded: set[int]) -> None:
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
            elif item.run.id in stranded:
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
