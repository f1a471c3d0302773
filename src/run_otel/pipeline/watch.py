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
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, select

from .state_tables import watch_table


@dataclass(frozen=True)
class Watched:
    run_pk: int  # diagnosis_run.id
    run_id: str
    tool_ids: frozenset[int]  # the tool rows its trace holds
    incomplete: bool  # sent as incomplete, and not finished since
    until: float  # Unix time the watch ends


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
