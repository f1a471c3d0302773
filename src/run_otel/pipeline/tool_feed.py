"""The agent's new tool rows, each read once: by primary-key range above the highest tool id read.

Each batch of a poll reads the tool rows committed since the batch before (``tool_invocation.id >
high``, a range on the primary key, ``READ_LIMIT`` rows a statement) and re-reads by primary key
the ids that range skipped: an id allocated before a later one may commit after it, as the main
poll's gaps do for run ids. A gap is given up after ``poll.gap_timeout_seconds``. What was read is
held here, by run, until it is sent:

- the first export of a run takes its tool rows from here, and reads by ``run_id`` only those up
  to the floor: the highest id read before this process began holding rows (or dropped some);
- the late-row watch (``late_rows.py``) finds here the rows of the watched runs that their traces
  lack, whatever the number of runs watched.

So the database examines each new tool row once. Where the feed stands (the highest id read, and
the gaps) is saved in the state store with the checkpoint, below any row a watched run's trace
still lacks, so a restart reads that row again. A first start begins at the newest tool id. At
most ``HELD_ROWS`` rows are held: past that, the oldest rows of runs not watched are dropped and
the floor rises, and those runs read them by ``run_id`` at their export. A feed more than
``BEHIND_ROWS`` rows behind (the daemon was stopped for a while) skips to the newest tool id, and
reads the rows of the runs watched then by ``run_id``, once.

The look for tool rows whose run never appears (``orphans.py``) takes from here the rows held
longest, of runs neither sent nor watched: it reads no tool row itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from ..sharding import in_shard
from ..source.reader import Source
from ..source.rows import RunRow, ToolRow
from .state_store import StateStore
from .transitions import MAX_NEW_GAPS
from .watch import ToolMark, Watched

READ_LIMIT = 5_000
HELD_ROWS = 20_000
BEHIND_ROWS = 100_000


def run_key(run_id: object) -> str:
    """A tool row's run_id as text (a VARBINARY column hands over bytes)."""
    return run_id.decode("utf-8", "replace") if isinstance(run_id, (bytes, bytearray)) else str(run_id)


class ToolFeed:
    def __init__(
        self,
        source: Source,
        store: StateStore,
        gap_timeout_seconds: float,
        watched: Callable[[], Mapping[str, Watched]],
    ):
        self._source = source
        self._store = store
        self._gap_timeout = gap_timeout_seconds
        self._watched = watched  # the runs watched now, by run_id
        # The poll reads ahead in a thread of its own, while the batch before is checkpointed here.
        self._lock = threading.RLock()
        self._high: int | None = None  # None until the first read loads or sets it
        self._floor = 0
        self._gaps: dict[int, float] = {}
        # run_id case-folded (MySQL's collations compare so) -> tool id -> row
        self._held: dict[str, dict[int, ToolRow]] = {}
        self._since: dict[str, float] = {}  # run_id case-folded -> when its first held row was read
        self._count = 0
        self.begun: int | None = None  # the highest id read before this process read any

    # -- reading ----------------------------------------------------------------

    def read(self, now: float) -> None:
        """Reads the tool rows committed since the last read, and the gaps committed since. Only this
        changes where the feed stands, so it reads without the lock, and takes it to hold what it read."""
        with self._lock:
            if self._high is None and not self._start():
                return
            gaps = list(self._gaps)
        found = self._source.tools_by_ids(gaps) if gaps else []
        with self._lock:
            self._found(found, now)
            if self.begun is None:
                self.begun = self._high
        read = 0
        while True:
            assert self._high is not None
            rows = self._source.tools_after(self._high, READ_LIMIT)
            read += len(rows)
            with self._lock:
                if len(rows) == READ_LIMIT and read >= BEHIND_ROWS:
                    self._skip_to_newest()
                    return
                self._take(rows, now)
                self._trim()
            if len(rows) < READ_LIMIT:
                return

    def _start(self) -> bool:
        """Where the state store says the feed stood, or (a first start) the newest tool id: False then."""
        saved = self._store.tool_mark()
        if saved is None:
            self._skip_to_newest()
            return False
        self._high = self._floor = saved.high
        self._gaps = dict(saved.gaps)
        return True

    def _take(self, rows: Sequence[ToolRow], now: float) -> None:
        """Holds ``rows`` (ascending, above the high) and records the ids they skipped as gaps."""
        if not rows:
            return
        assert self._high is not None
        skipped: list[tuple[int, int]] = []  # [first, end) of each run of ids not there
        last = self._high
        for row in rows:
            if row.id > last + 1:
                skipped.append((last + 1, row.id))
            last = row.id
            self._hold(row, now)
        room = MAX_NEW_GAPS  # more missing ids than this is a deletion: track only the last of them
        for first, end in reversed(skipped):
            for gap in range(end - 1, max(first, end - room) - 1, -1):
                self._gaps.setdefault(gap, now)
            room -= end - first
            if room <= 0:
                break
        self._high = last

    def _hold(self, row: ToolRow, now: float = 0.0) -> None:
        run_id = row.run_id
        if run_id is None or not in_shard(run_key(run_id), self._store.shard):
            return  # no run of this shard's: no trace to send it into
        key = run_key(run_id).casefold()
        if key not in self._held:
            self._since[key] = now
        held = self._held.setdefault(key, {})
        if row.id not in held:
            self._count += 1
        held[row.id] = row

    def _found(self, rows: Sequence[ToolRow], now: float) -> None:
        """The gaps that committed since are held like new rows; those missed for the window are given up."""
        for row in rows:
            self._gaps.pop(row.id, None)
            self._hold(row, now)
        for gap in [gap for gap, seen in self._gaps.items() if now - seen >= self._gap_timeout]:
            del self._gaps[gap]

    def _skip_to_newest(self) -> None:
        """A first start, or too far behind to read every row: the feed starts at the newest tool id.
        The rows up to it are read by run_id at each run's export; the watched runs' now, once."""
        self._high = self._floor = self._source.max_tool_id()
        self._gaps, self._held, self._count = {}, {}, 0
        watched = self._watched()
        if watched:
            for rows in self._source.tools_for(watched).values():
                for row in rows:
                    self._hold(row)
            self.late(watched)  # keeps only the rows their traces lack

    def _trim(self) -> None:
        """Past HELD_ROWS, the oldest rows of runs not watched go, and the floor rises over them."""
        if self._count <= HELD_ROWS:
            return
        watched = {run_id.casefold() for run_id in self._watched()}
        loose = sorted(i for key, held in self._held.items() if key not in watched for i in held)
        cut = loose[: max(self._count - HELD_ROWS * 3 // 4, 0)]
        if not cut:
            return
        self._floor = max(self._floor, cut[-1])
        for key in [key for key in self._held if key not in watched]:
            held = self._held[key]
            for tool_id in [i for i in held if i <= self._floor]:
                del held[tool_id]
                self._count -= 1
            if not held:
                del self._held[key]

    # -- what the passes take -------------------------------------------------------

    def tools_for(self, runs: Sequence[RunRow]) -> dict[str, list[ToolRow]]:
        """The runs' tool rows, in id order: those up to the floor by run_id, the rest from what was read."""
        asked = [run_key(run.run_id) for run in runs]
        with self._lock:
            floor = self._floor
        out = self._source.tools_for(asked, through_id=floor) if asked and floor else {}
        named, folded = set(asked), {run_id.casefold(): run_id for run_id in asked}
        with self._lock:
            for fold in folded:
                for row in self._held.get(fold, {}).values():
                    name = run_key(row.run_id)
                    key = name if name in named else folded.get(name.casefold())
                    if key is not None:
                        out.setdefault(key, []).append(row)
        for key, rows in out.items():
            out[key] = sorted({row.id: row for row in rows}.values(), key=lambda row: row.id)
        return out

    def late(self, watched: Mapping[str, Watched]) -> dict[str, list[ToolRow]]:
        """The rows read for the watched runs that their traces lack, by run_id, in id order."""
        with self._lock:
            out: dict[str, list[ToolRow]] = {}
            folded = {run_id.casefold(): w for run_id, w in watched.items()}
            for key in list(self._held):
                w = folded.get(key)
                if w is None:
                    continue
                held = self._held[key]
                for tool_id, row in sorted(held.items()):
                    if tool_id in w.tool_ids:  # in the trace already
                        del held[tool_id]
                        self._count -= 1
                    else:
                        out.setdefault(w.run_id, []).append(row)
                if not held:
                    del self._held[key]
            return out

    def release(self, sent: Iterable[tuple[str, Iterable[int]]]) -> None:
        """Drops the rows that went out, each (run_id, tool ids), once acknowledged."""
        with self._lock:
            for run_id, ids in sent:
                held = self._held.get(run_key(run_id).casefold())
                for tool_id in ids:
                    if held is not None and held.pop(tool_id, None) is not None:
                        self._count -= 1
                if held is not None and not held:
                    del self._held[run_key(run_id).casefold()]

    def unclaimed(self, seen_before: float, decided: Callable[[str], bool]) -> dict[str, list[ToolRow]]:
        """The rows held since before ``seen_before``, by case-folded run_id, of runs not watched and not
        ``decided``: runs not sent yet, still running or never written."""
        with self._lock:
            for key in [key for key in self._since if key not in self._held]:
                del self._since[key]
            watched = {run_id.casefold() for run_id in self._watched()}
            return {
                key: [held[i] for i in sorted(held)]
                for key, held in self._held.items()
                if self._since[key] <= seen_before and key not in watched and not decided(key)
            }

    def lowest_open(self, decided: Callable[[str], bool]) -> int | None:
        """The lowest id held of a run not watched and not ``decided``; None when there is none."""
        with self._lock:
            watched = {run_id.casefold() for run_id in self._watched()}
            ids = [min(held) for key, held in self._held.items() if held and key not in watched and not decided(key)]
            return min(ids, default=None)

    def mark(self, starting: Iterable[Watched] = ()) -> ToolMark | None:
        """What the state store keeps: the highest id read, lowered below any row that a watched
        run's trace still lacks (``starting``: the watches saved with it), so that a restart reads
        it again; and the gaps below it."""
        with self._lock:
            if self._high is None:
                return None
            watched = {**self._watched(), **{w.run_id: w for w in starting}}
            lacking = [row.id for rows in self.late(watched).values() for row in rows]
            high = min(self._high, min(lacking, default=self._high + 1) - 1)
            return ToolMark(high, {gap: seen for gap, seen in self._gaps.items() if gap <= high})
