"""Tool rows whose run never appears: found after a wait, named in the log and by ``check``, counted.

A tool row is read only with its run (``run_id IN (...)``), so a row whose run never appears
would never be read, and nothing would say so. After each poll the daemon notes the newest tool
id and when it saw it; once ``poll.orphan_wait_seconds`` has passed since, it looks at the tool
rows up to that id it has not looked at yet (a primary-key range, its run ids then asked for by
the ``run_id`` index) for run ids no ``diagnosis_run`` row has, in any letter case. Those are named in one WARNING per
look (run ids and tool ids), counted in ``run_otel_orphan_rows_total``, and kept in the state
store, where ``run-otel check`` names them: how many, and the oldest.

They are not exported: a trace of tool spans without their root would show in Jaeger as spans
with an invalid parent. Should the run appear after all, the poll reads them with it, as any
tool row, and ``check`` no longer names them. The wait counts from when run-otel first saw a
row, not from its ``created_at``, so a wrong clock or zone does not make a row an orphan.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from ..sharding import Shard, in_shard
from ..source.reader import Source
from ..source.run_ids import RunIdRows
from ..source.tool_orphans import OrphanRow, newest_tool_id, tool_rows_between
from .orphan_scan import OrphanScan
from .recorder import Recorder
from .state_store import StateStore

log = logging.getLogger(__name__)

# Tool ids looked at per pass, and tool rows read per pass: a first look over a long history goes in steps.
RANGE = 20_000
LIMIT = 20_000


class OrphanPass:
    def __init__(
        self,
        wait_seconds: float,
        start_from: str,
        source: Source,
        store: StateStore,
        recorder: Recorder,
        shard: Shard,
        clock: Callable[[], float] = time.time,
    ):
        self._wait = wait_seconds
        self._from_now = start_from == "now"
        self._source = source
        self._store = store
        self._recorder = recorder
        self._shard = shard
        self._clock = clock
        self._run_ids = RunIdRows(source)
        # (newest tool id, when seen), oldest first: in memory, so a restart waits once more.
        self._marks: deque[tuple[int, float]] = deque()

    def run(self) -> int:
        """One look; returns the orphan rows it named."""
        now = self._clock()
        scan = self._store.orphan_scan()
        newest = newest_tool_id(self._source)
        if scan is None:  # a first start from "now" leaves the history alone, as the poll does
            scan = OrphanScan(newest if self._from_now else 0)
            self._store.save_orphan_scan(scan, now)
        if not self._marks or newest > self._marks[-1][0]:
            self._marks.append((newest, now))
        decided = 0
        while self._marks and now - self._marks[0][1] >= self._wait:
            decided = self._marks.popleft()[0]
        if decided:  # the last mark past the wait stays the bound until a newer one passes it
            self._marks.appendleft((decided, now - self._wait))
        up_to = min(decided, scan.cursor + RANGE)
        if up_to <= scan.cursor:
            return 0
        rows = tool_rows_between(self._source, scan.cursor, up_to, LIMIT)
        scan.cursor = rows[-1].id if len(rows) >= LIMIT else up_to
        self._run_ids.possible()  # how the column compares letter cases, looked at now and then
        found = self._run_ids.lowest({row.run_id for row in rows}) if rows else {}
        mine = [row for row in rows if row.run_id.casefold() not in found and in_shard(row.run_id, self._shard)]
        scan.add(mine)
        self._store.save_orphan_scan(scan, now)
        if mine:
            self._name(mine)
            self._recorder.orphan_rows(len(mine))
        return len(mine)

    def _name(self, rows: list[OrphanRow]) -> None:
        by_run: dict[str, list[int]] = {}
        for row in rows:
            by_run.setdefault(row.run_id, []).append(row.id)
        named = "; ".join(
            f"{run_id} (tool_invocation {', '.join(map(str, ids[:5]))}{', …' if len(ids) > 5 else ''})"
            for run_id, ids in list(by_run.items())[:5]
        )
        log.warning(
            "%d tool row(s) of %d run id(s) have no diagnosis_run row %gs after they were seen (poll.orphan_wait_seconds): "
            "not exported until their run appears; %s%s",
            len(rows),
            len(by_run),
            self._wait,
            named,
            "; …" if len(by_run) > 5 else "",
        )
