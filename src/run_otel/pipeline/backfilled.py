"""The id ranges a backfill exported, in the state store: the feedback pass follows their ratings.

The daemon sends the ratings of the runs it exported itself (above its first start's mark, and
those it took over in flight). The runs a backfill exported below that mark are the bridge's too:
a rating given on one later, within ``feedback.window_seconds``, has a trace to go into. So a
backfill writes, as each batch is acknowledged and in the same transaction as the ratings it sent
(``ratings_ledger.py``), the ranges of ids it read in which every run of its shard was exported: a
run of the shard it read but did not export (created outside its window, or still in flight) ends
a range, and ids that hold no run do not. A range grows batch by batch in one row, keyed by its
first id, so a month of history is a row or two, whatever its size.

The feedback pass reads them (a handful of rows), cuts them to the window, and reads the rated runs
from the first id left to the last in one primary-key range, as it reads its own, keeping those
inside a range. Once a range lies wholly below the window it is forgotten, so the pass's cost
follows the window, never the history exported.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

from sqlalchemy import Connection, select

from .state_tables import backfilled_table

Range = tuple[int, int]  # first and last id, both included


def ranges_of(first: int, last: int, left_out: Iterable[int]) -> list[Range]:
    """The ranges of [first, last] between the ids ``left_out``."""
    out, start = [], first
    for gap in sorted(i for i in left_out if first <= i <= last):
        if gap > start:
            out.append((start, gap - 1))
        start = max(start, gap + 1)
    if start <= last:
        out.append((start, last))
    return out


def merged(ranges: Iterable[Range]) -> list[Range]:
    """Overlapping and adjacent ranges as one, in id order."""
    out: list[Range] = []
    for first, last in sorted(ranges):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return out


def clipped(ranges: list[Range], first: int, last: int) -> list[Range]:
    """The parts of ``ranges`` (in id order) within [first, last]."""
    cut = [(max(a, first), min(b, last)) for a, b in ranges]
    return [(a, b) for a, b in cut if a <= b]


def covers(ranges: list[Range]) -> Callable[[int], bool]:
    """Whether an id lies in one of ``ranges`` (merged, in id order)."""
    starts = [first for first, _last in ranges]

    def inside(run_id: int) -> bool:
        k = bisect.bisect_right(starts, run_id) - 1
        return k >= 0 and run_id <= ranges[k][1]

    return inside


def record(conn: Connection, shard: str, ranges: list[Range], now: float) -> None:
    """Writes each range, or widens the one already recorded from the same first id (a range that
    grows batch by batch, or a backfill run again), in the caller's transaction."""
    table = backfilled_table
    for first, last in ranges:
        key = (table.c.shard == shard) & (table.c.first_id == first)
        recorded = conn.execute(select(table.c.last_id).where(key)).scalar()
        if recorded is None:
            conn.execute(table.insert().values(shard=shard, first_id=first, last_id=last, saved_at=now))
        elif recorded < last:
            conn.execute(table.update().where(key).values(last_id=last, saved_at=now))


def load(conn: Connection, shard: str) -> list[Range]:
    table = backfilled_table
    rows = conn.execute(select(table.c.first_id, table.c.last_id).where(table.c.shard == shard))
    return merged((int(first), int(last)) for first, last in rows)


def forget(conn: Connection, shard: str, below: int) -> None:
    """Forgets the ranges that end below ``below``: the first id of the feedback window."""
    table = backfilled_table
    conn.execute(table.delete().where(table.c.shard == shard, table.c.last_id < below))
