"""Reads for the look for tool rows whose run never appears (``pipeline/orphans.py``).

Both are index-bounded: the newest tool id is one primary-key probe, and the look reads a
primary-key range of ``tool_invocation`` (id, run id and time only); the run ids it holds are
then asked for by the ``run_id`` index (``run_ids.py``). Two reads rather than one anti-join:
MariaDB answered ``NOT EXISTS`` by materializing the whole ``run_id`` index when the range
was large next to the table.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import func, select

from .reader import Source
from .rows import run_id_text
from .schema import tool_invocation


class OrphanRow(NamedTuple):
    id: int
    run_id: str
    created_at: Any  # a datetime, or what a broken row holds


def newest_tool_id(source: Source) -> int:
    rows = source.fetch(select(func.max(tool_invocation.c.id)))
    return int(rows[0][0] or 0)


def tool_rows_between(source: Source, after_id: int, up_to_id: int, limit: int) -> list[OrphanRow]:
    """Tool rows with ids in (after_id, up_to_id] and a run id, by id, at most ``limit``: a NULL run id
    (legacy rows) has no run to wait for."""
    tool = tool_invocation.c
    statement = (
        select(tool.id, tool.run_id, tool.created_at)
        .where(tool.id > after_id, tool.id <= up_to_id, tool.run_id.is_not(None))
        .order_by(tool.id)
        .limit(limit)
    )
    return [OrphanRow(int(pk), run_id_text(run_id), created) for pk, run_id, created in source.fetch(statement)]
