"""The ratings sent, in the state store: only a new or changed rating is sent again.

One row per run and shard, written in the feedback pass's transaction once the rating was
acknowledged, and forgotten when the run leaves ``feedback.window_seconds``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, select

from .state_tables import feedback_table


@dataclass(frozen=True)
class SentRating:
    """The rating last sent for a run, and when it was given (None when an earlier release sent it)."""

    feedback: str
    rated_at_ns: int | None = None


def sent(conn: Connection, shard: str, run_ids: list[str]) -> dict[str, SentRating]:
    """run_id -> the rating last sent, for those of ``run_ids`` that have one."""
    table, out = feedback_table, {}
    for start in range(0, len(run_ids), 500):
        chunk = run_ids[start : start + 500]
        rows = conn.execute(
            select(table.c.run_id, table.c.feedback, table.c.rated_at_ns).where(table.c.shard == shard, table.c.run_id.in_(chunk))
        )
        out.update({run_id: SentRating(feedback, rated_at) for run_id, feedback, rated_at in rows})
    return out


def record(conn: Connection, shard: str, ratings: dict[str, SentRating], now: float) -> None:
    """Writes (or replaces) the ratings acknowledged, in the caller's transaction."""
    if not ratings:
        return
    table = feedback_table
    conn.execute(table.delete().where(table.c.shard == shard, table.c.run_id.in_(list(ratings))))
    conn.execute(
        table.insert(),
        [
            {"shard": shard, "run_id": run_id, "feedback": r.feedback, "rated_at_ns": r.rated_at_ns, "sent_at": now}
            for run_id, r in ratings.items()
        ],
    )


def forget(conn: Connection, shard: str, before: float) -> None:
    """Forgets the ratings sent before ``before``: their runs left the recheck window."""
    conn.execute(feedback_table.delete().where(feedback_table.c.shard == shard, feedback_table.c.sent_at < before))
