"""The runs whose traces are kept complete after their first export, in the state store.

A tool row can commit after its run was exported (the agent writes some calls
in a transaction of their own), and a run sent as incomplete can still finish.
For each run exported, the state store keeps which tool rows were sent, whether
the run was sent incomplete, and until when it is watched. The late pass
(``late_rows.py``) compares this with the source. The rows are written in the
checkpoint's own transaction, so a run is watched exactly when it was sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, select

from .state_tables import tool_cursor_table, watch_table


@dataclass(frozen=True)
class Watched:
    run_pk: int  # diagnosis_run.id
    run_id: str
    tool_ids: frozenset[int]  # the tool rows its trace holds
    incomplete: bool  # sent as incomplete, and not finished since
    until: float  # Unix time the watch ends


@dataclass(frozen=True)
class ToolMark:
    """Where the watch stands in tool_invocation (``tool_feed.py``): every tool row up to ``high``
    was read, but for ``gaps``, ids not committed when read (id -> when first missed, Unix seconds)."""

    high: int
    gaps: dict[int, float] = field(default_factory=dict)


def record_mark(conn: Connection, shard: str, mark: ToolMark, now: float) -> None:
    """Writes the shard's tool mark, in the caller's transaction."""
    table = tool_cursor_table
    values = {"high": mark.high, "gaps": json.dumps({str(k): v for k, v in sorted(mark.gaps.items())}), "saved_at": now}
    if not conn.execute(table.update().where(table.c.shard == shard).values(**values)).rowcount:
        conn.execute(table.insert().values(shard=shard, **values))


def load_mark(engine: Engine, shard: str) -> ToolMark | None:
    """The shard's tool mark; None before the first save (a first start, or a store of an earlier release)."""
    table = tool_cursor_table
    with engine.connect() as conn:
        row = conn.execute(select(table.c.high, table.c.gaps).where(table.c.shard == shard)).first()
    if row is None:
        return None
    return ToolMark(int(row.high), {int(k): float(v) for k, v in json.loads(row.gaps).items()})


def record(conn: Connection, shard: str, runs: Iterable[Watched]) -> None:
    """Writes (or replaces) the watch of ``runs``, in the caller's transaction."""
    rows = [
        {
            "shard": shard,
            "run_id": w.run_id,
            "run_pk": w.run_pk,
            "incomplete": w.incomplete,
            "tool_ids": json.dumps(sorted(w.tool_ids)),
            "until": w.until,
        }
        for w in runs
    ]
    if not rows:
        return
    for start in range(0, len(rows), 500):
        chunk = rows[start : start + 500]
        ids = [row["run_id"] for row in chunk]
        conn.execute(watch_table.delete().where(watch_table.c.shard == shard, watch_table.c.run_id.in_(ids)))
        conn.execute(watch_table.insert(), chunk)


def forget(conn: Connection, shard: str, run_ids: Iterable[str] = (), before: float | None = None) -> None:
    """Ends the watch of ``run_ids``, and of every run whose watch ended before ``before``."""
    ids = list(run_ids)
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        conn.execute(watch_table.delete().where(watch_table.c.shard == shard, watch_table.c.run_id.in_(chunk)))
    if before is not None:
        conn.execute(watch_table.delete().where(watch_table.c.shard == shard, watch_table.c.until < before))


def load(engine: Engine, shard: str, now: float) -> list[Watched]:
    """The runs still watched at ``now``, by run primary key."""
    table = watch_table
    with engine.connect() as conn:
        rows = conn.execute(
            select(table.c.run_pk, table.c.run_id, table.c.tool_ids, table.c.incomplete, table.c.until)
            .where(table.c.shard == shard, table.c.until >= now)
            .order_by(table.c.run_pk)
        )
        return [
            Watched(int(pk), run_id, frozenset(json.loads(ids)), bool(inc), float(until)) for pk, run_id, ids, inc, until in rows
        ]
