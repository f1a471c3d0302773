"""Tool rows whose run never appears: found after a wait, named in the log and by ``check``, counted.

A tool row goes out with its run, so a row whose run never appears would never be sent, and
nothing would say so. The poll's tool feed (``tool_feed.py``) holds each new tool row until its
run is sent; the rows it has held for ``poll.orphan_wait_seconds`` of runs neither sent nor
watched are this look's candidates, and their run ids are asked for by the ``run_id`` index (in any
letter case). So the look reads no tool row the poll did not: its cost is one index lookup per
run id still unsent after the wait, which is a run running longer than that, or an orphan.

Run ids no ``diagnosis_run`` row has are named in one WARNING per look (run ids and tool ids),
counted in ``run_otel_orphan_rows_total``, and kept in the state store, where ``run-otel check``
names them: how many, and the oldest. They are not exported: a trace of tool spans without their
root would show in Jaeger as spans with an invalid parent. Should the run appear after all, the
poll sends them with it, as any tool row, and ``check`` no longer names them. The wait counts from
when run-otel first read a row, not from its ``created_at``, so a wrong clock or zone does not make
a row an orphan.

The state store keeps the tool id up to which every row is decided. Rows above it that the process
before a restart had read are read again by primary-key range, ``RANGE`` ids a look, and wait once
more; so is every new row when the late-row watch is off (``poll.late_window_seconds = 0``), which
leaves no feed to take them from. A first start looks from the newest tool id on, as the feed reads:
the tool rows already in the database are not looked at, since reading the whole history once
would cost a first start from the beginning as much again as its catch-up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from ..sharding import Shard, in_shard
from ..source.reader import Source
from ..source.run_ids import RunIdRows
from ..source.tool_orphans import OrphanRow, newest_tool_id, tool_rows_between
from .orphan_scan import OrphanScan
from .recorder import Recorder
from .state_store import StateStore
from .tool_feed import ToolFeed, run_key

log = logging.getLogger(__name__)

# Tool ids read per look, and tool rows read per look, where the feed does not hold them.
RANGE = 20_000
LIMIT = 20_000


class OrphanPass:
    def __init__(
        self,
        wait_seconds: float,
        source: Source,
        run_ids: RunIdRows,
        store: StateStore,
        recorder: Recorder,
        shard: Shard,
        feed: ToolFeed | None,
        clock: Callable[[], float] = time.time,
    ):
        self._wait = wait_seconds
        self._source = source
        self._store = store
        self._recorder = recorder
        self._shard = shard
        self._feed = feed
        self._clock = clock
        self._run_ids = run_ids
        self._ranged: int | None = None  # how far the range read has gone, in this process
        self._suspects: dict[str, tuple[float, list[OrphanRow]]] = {}  # from the range read, waiting
        self._present: set[str] = set()  # feed rows whose run exists: sent with it
        self._named: set[str] = set()  # feed rows named already: held until their run appears
        self._saved: int | None = None

    def run(self) -> int:
        """One look; returns the orphan rows it named."""
        now = self._clock()
        high = self._feed.begun if self._feed is not None else newest_tool_id(self._source)
        if high is None:
            return 0  # the feed has not read yet
        scan = self._store.orphan_scan()
        first = scan is None
        if scan is None:  # a first start looks from where the feed begins, whatever the poll's start_from
            scan = OrphanScan(high)
        if self._ranged is None:
            self._ranged = self._saved = scan.cursor
        self._read_range(high, now)
        found = self._decide(now)
        if found:
            scan.add(found)
            self._name(found)
            self._recorder.orphan_rows(len(found))
        scan.cursor = self._cursor(high)
        if first or found or scan.cursor != self._saved:
            self._store.save_orphan_scan(scan, now)
            self._saved = scan.cursor
        return len(found)

    def _read_range(self, high: int, now: float) -> None:
        """The rows the feed does not hold, up to ``high``: one step a look. Those whose run is
        missing now wait, from now."""
        assert self._ranged is not None
        up_to = min(high, self._ranged + RANGE)
        if up_to <= self._ranged:
            return
        rows = tool_rows_between(self._source, self._ranged, up_to, LIMIT)
        self._ranged = rows[-1].id if len(rows) >= LIMIT else up_to
        mine = [row for row in rows if in_shard(row.run_id, self._shard)]
        for key, group in self._missing(mine).items():
            since, held = self._suspects.get(key, (now, []))
            self._suspects[key] = (since, held + group)

    def _decide(self, now: float) -> list[OrphanRow]:
        """The rows whose run is still missing after the wait: from the feed and the range read."""
        before = now - self._wait
        waited = [row for since, rows in self._suspects.values() if since <= before for row in rows]
        held: dict[str, list[OrphanRow]] = {}
        if self._feed is not None:
            self._present &= set(self._feed.unclaimed(float("inf"), lambda key: False))  # forget runs sent since
            for key, tools in self._feed.unclaimed(before, self._decided).items():
                held[key] = [OrphanRow(row.id, run_key(row.run_id), row.created_at) for row in tools]
        if not waited and not held:
            return []
        for key in {row.run_id.casefold() for row in waited}:
            del self._suspects[key]
        missing = self._missing([*waited, *(row for rows in held.values() for row in rows)])
        self._present |= set(held) - set(missing)
        self._named |= set(held) & set(missing)
        return sorted((row for rows in missing.values() for row in rows), key=lambda row: row.id)

    def _missing(self, rows: Iterable[OrphanRow]) -> dict[str, list[OrphanRow]]:
        """Of ``rows``, those whose run id no diagnosis_run row has, in any letter case, by folded run id."""
        by_run: dict[str, list[OrphanRow]] = {}
        for row in rows:
            by_run.setdefault(row.run_id.casefold(), []).append(row)
        if not by_run:
            return {}
        self._run_ids.possible()  # how the column compares letter cases, looked at now and then
        found = self._run_ids.lowest({group[0].run_id for group in by_run.values()})
        return {key: group for key, group in by_run.items() if key not in found}

    def _decided(self, key: str) -> bool:
        return key in self._present or key in self._named

    def _cursor(self, high: int) -> int:
        """The tool id up to which every row is decided: a restart reads what is above it again."""
        assert self._ranged is not None
        open_ids = [rows[0].id for _since, rows in self._suspects.values()]
        if self._ranged >= high and self._feed is not None:
            lowest = self._feed.lowest_open(self._decided)
            open_ids.append(lowest if lowest is not None else self._feed_high())
        return min([self._ranged, *(i - 1 for i in open_ids)]) if open_ids else self._ranged

    def _feed_high(self) -> int:
        assert self._feed is not None
        mark = self._feed.mark()
        return mark.high + 1 if mark is not None else 0

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
