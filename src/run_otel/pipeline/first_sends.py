"""The runs sent incomplete, as they were first sent, in the state store.

A run still PENDING or RUNNING after ``poll.run_timeout_seconds`` goes out with an incomplete
root; when it finishes, the late pass sends its outcome as a child of that root, the
``completed`` span, and what came after the timeout (tool rows, the rating) hangs under it.
The root cannot be sent again: mapped from the finished row it would be a second, different
span under the same id, which Jaeger shows as two roots with "duplicate span IDs". So the
first send's root (its span's bytes) and the tool rows sent with it are kept here, one row per
run by primary key, and every later send of the run (a backfill, ``run-otel export``, a
rewind) sends that root again, byte for byte, then the ``completed`` span. About a kilobyte
a run sent incomplete; kept as long as the state store.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from sqlalchemy import Connection, select
from sqlalchemy.exc import IntegrityError

from .state_tables import incomplete_table


class FirstSend(NamedTuple):
    """A run as it was first sent incomplete: its root's bytes and the tool rows sent with it."""

    root: bytes
    tool_ids: frozenset[int]


class Sent(NamedTuple):
    """A run just sent incomplete for the first time, to record once acknowledged."""

    run_pk: int
    run_id: str
    root: bytes
    tool_ids: frozenset[int]


def of(conn: Connection, run_pks: Iterable[int]) -> dict[int, FirstSend]:
    """The first sends of those of ``run_pks`` that were sent incomplete, by primary key."""
    wanted, out, table = sorted(set(run_pks)), {}, incomplete_table
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        rows = conn.execute(select(table.c.run_pk, table.c.root, table.c.tool_ids).where(table.c.run_pk.in_(chunk)))
        out.update({int(pk): FirstSend(bytes(root), frozenset(json.loads(ids))) for pk, root, ids in rows})
    return out


def record(conn: Connection, sent: Sequence[Sent], now: float) -> None:
    """Records the first sends not recorded yet, in the caller's transaction: a run another process
    recorded meanwhile (a backfill beside the daemon) keeps the record it has."""
    known = of(conn, (s.run_pk for s in sent))
    for s in sent:
        if s.run_pk in known:
            continue
        values = {"run_pk": s.run_pk, "run_id": s.run_id, "root": s.root, "tool_ids": json.dumps(sorted(s.tool_ids))}
        try:
            with conn.begin_nested():
                conn.execute(incomplete_table.insert().values(sent_at=now, **values))
        except IntegrityError:
            continue  # recorded by the other process between the read and the insert
