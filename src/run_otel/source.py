"""Index-bounded reads of ``diagnosis_run`` and ``tool_invocation``.

Every statement is bounded by the primary key, ``run_id`` or
``idx_tool_invocation_run_id``, and lists its columns: run-otel reads only what
it maps, never ``self_evaluation``, and user content only when capture is on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime

from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from .config import Config
from .content import RUN_CONTENT_COLUMNS, TOOL_CONTENT_COLUMNS, ContentPolicy
from .rows import RunRow, ToolRow
from .schema import diagnosis_run, tool_invocation

log = logging.getLogger(__name__)

# The columns read are the row types' fields, in their order, so rows build positionally;
# the content columns come last, and only when the content policy asks for them.
RUN_COLUMNS = tuple(name for name in RunRow._fields if name not in RUN_CONTENT_COLUMNS)
TOOL_COLUMNS = tuple(name for name in ToolRow._fields if name not in TOOL_CONTENT_COLUMNS)


class SourceError(RuntimeError):
    """The database could not be read. The message never holds a password."""


def safe_url(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def make_engine(url: URL, connect_timeout: float = 10.0, **kwargs) -> Engine:
    """An engine with pre-ping, so a restarted database is reconnected transparently."""
    connect_args: dict = {}
    if url.get_backend_name() == "mysql":
        connect_args = {"connect_timeout": max(1, int(connect_timeout)), "charset": "utf8mb4"}
        # Each poll must see rows committed since the last one.
        kwargs.setdefault("isolation_level", "READ COMMITTED")
    return create_engine(url, pool_pre_ping=True, connect_args=connect_args, **kwargs)


def _chunks(values: Sequence, size: int) -> Iterator[Sequence]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


class Source:
    """The agent's database, read-only."""

    def __init__(self, config: Config, engine: Engine | None = None):
        self._url = config.source_url()
        self.engine = engine or make_engine(self._url, config.source.connect_timeout_seconds)
        self._chunk = config.poll.tool_chunk_size
        content = ContentPolicy.build(config.content, config.trace.conventions)
        run_cols = RUN_COLUMNS + content.run_columns()
        tool_cols = TOOL_COLUMNS + content.tool_columns()
        self._run_select = select(*(diagnosis_run.c[name] for name in run_cols))
        self._tool_select = select(*(tool_invocation.c[name] for name in tool_cols))

    def describe(self) -> str:
        return safe_url(self._url)

    def _fetch(self, statement) -> list:
        try:
            with self.engine.connect() as conn:
                return list(conn.execute(statement))
        except SQLAlchemyError as exc:
            reason = getattr(exc, "orig", None) or exc.__class__.__name__
            raise SourceError(f"database {self.describe()}: {reason}") from None

    # -- runs ---------------------------------------------------------------

    def max_run_id(self) -> int:
        rows = self._fetch(select(func.max(diagnosis_run.c.id)))
        return int(rows[0][0] or 0)

    def runs_after(self, high_water: int, limit: int, until_id: int | None = None) -> list[RunRow]:
        """Up to ``limit`` runs with id above ``high_water`` (and up to ``until_id``), by id."""
        stmt = self._run_select.where(diagnosis_run.c.id > high_water)
        if until_id is not None:
            stmt = stmt.where(diagnosis_run.c.id <= until_id)
        stmt = stmt.order_by(diagnosis_run.c.id).limit(limit)
        return [RunRow(*row) for row in self._fetch(stmt)]

    def runs_by_ids(self, ids: Iterable[int]) -> list[RunRow]:
        ordered = sorted(set(ids))
        out: list[RunRow] = []
        for chunk in _chunks(ordered, self._chunk):
            stmt = self._run_select.where(diagnosis_run.c.id.in_(chunk)).order_by(diagnosis_run.c.id)
            out.extend(RunRow(*row) for row in self._fetch(stmt))
        return out

    def run_by_run_id(self, run_id: str) -> RunRow | None:
        rows = self._fetch(self._run_select.where(diagnosis_run.c.run_id == run_id))
        return RunRow(*rows[0]) if rows else None

    def created_at_from(self, first_id: int) -> tuple[int, datetime] | None:
        """The first run at or after ``first_id``: a primary-key probe, for backfill bounds."""
        stmt = (
            select(diagnosis_run.c.id, diagnosis_run.c.created_at)
            .where(diagnosis_run.c.id >= first_id)
            .order_by(diagnosis_run.c.id)
            .limit(1)
        )
        rows = self._fetch(stmt)
        return (int(rows[0][0]), rows[0][1]) if rows else None

    def first_id_created_at_or_after(self, moment: datetime) -> int:
        """The first run id created at or after ``moment``, by binary search on primary-key probes.

        It relies on ids growing with created_at, as an auto-increment key
        written at insert time does; it never scans.
        """
        low, high = 1, self.max_run_id() + 1
        while low < high:
            middle = (low + high) // 2
            probe = self.created_at_from(middle)
            if probe is None or (isinstance(probe[1], datetime) and probe[1] >= moment):
                high = middle
            else:
                # Every id up to the probed row starts no later than it: skip them all.
                low = probe[0] + 1
        return low

    # -- tools --------------------------------------------------------------

    def tools_for(self, run_ids: Iterable[str]) -> dict[str, list[ToolRow]]:
        """Tool rows by run_id, in id order: one ``run_id IN (...)`` query per chunk."""
        wanted = sorted(set(run_ids))
        by_run: dict[str, list[ToolRow]] = {run_id: [] for run_id in wanted}
        # MySQL's default collations compare case-insensitively, so IN may
        # return 'RUN-A' for 'run-a'; file such rows under the id that was asked.
        folded = {run_id.casefold(): run_id for run_id in wanted}
        for chunk in _chunks(wanted, self._chunk):
            stmt = self._tool_select.where(tool_invocation.c.run_id.in_(chunk)).order_by(
                tool_invocation.c.run_id, tool_invocation.c.id
            )
            for row in self._fetch(stmt):
                tool = ToolRow(*row)
                key = tool.run_id if tool.run_id in by_run else folded.get(tool.run_id.casefold())
                if key is not None:
                    by_run[key].append(tool)
        return by_run

    def close(self) -> None:
        self.engine.dispose()
