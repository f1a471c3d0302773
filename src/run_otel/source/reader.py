"""Index-bounded reads of ``diagnosis_run`` and ``tool_invocation``.

Every statement is bounded by the primary key, ``run_id`` or
``idx_tool_invocation_run_id``, and lists its columns: run-otel reads only what
it maps, never ``self_evaluation``, and user content only when capture is on.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy import Boolean, Connection, Dialect, Engine, Select, func, inspect, select, text, type_coerce
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.expression import Executable
from sqlalchemy.sql.sqltypes import NullType

from ..config import ContentConfig, SourceConfig
from .clock import ClockSample, SourceClock
from .columns import TOOL_COLUMNS, columns_read
from .engine import make_engine, safe_url
from .errors import ConnectionLost, SourceError, read_failed, unwrapped_driver_errors
from .evidence import DATABASE_COLUMN_COUNT, DatabaseSummaries, database_columns
from .rows import TERMINAL_STATUSES, FeedbackRow, RunRow, ToolRow, run_id_text
from .schema import diagnosis_run, tool_invocation

__all__ = ["Backlog", "ConnectionLost", "Source", "SourceError"]

log = logging.getLogger(__name__)


class Backlog(NamedTuple):
    newest_id: int
    runs: int  # run ids above the checkpoint
    seconds: float | None  # the newest run's created_at minus the checkpoint run's


def _as_stored(column: ColumnElement) -> ColumnElement:
    """A BOOLEAN column as the database returns it: SQLAlchemy's own conversion makes any
    non-empty text true, 'false' included, so ``readings`` reads the value by meaning."""
    return type_coerce(column, NullType()).label(column.name) if isinstance(column.type, Boolean) else column


def _without_processing(statement: Select, dialect: Dialect) -> bool:
    """True when SQLAlchemy would hand every selected value over as the driver returned it,
    so the driver's own tuples are the same rows without building a Row for each."""
    return all(dialect.type_descriptor(c.type).result_processor(dialect, None) is None for c in statement.selected_columns)


def _newest_id(conn: Connection) -> int:
    """The highest run id, from the primary key's last entry; 0 for an empty table."""
    return int(conn.execute(select(func.max(diagnosis_run.c.id))).scalar() or 0)


def _first_from(conn: Connection, first_id: int) -> tuple[int, datetime] | None:
    """The first run at or after ``first_id`` with its created_at: a primary-key probe."""
    run = diagnosis_run.c
    row = conn.execute(select(run.id, run.created_at).where(run.id >= first_id).order_by(run.id).limit(1)).first()
    return (int(row[0]), row[1]) if row else None


def _chunks(values: Sequence, size: int) -> Iterator[Sequence]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


class Source:
    """The agent's database, read-only."""

    def __init__(self, config: SourceConfig, content: ContentConfig, tool_chunk_size: int, engine: Engine | None = None):
        self._url = config.connect_url()
        self._statement_timeout = config.statement_timeout_seconds
        self.engine = engine or make_engine(self._url, config.connect_timeout_seconds, config)
        self._chunk = tool_chunk_size
        unwrapped = unwrapped_driver_errors() if self.engine.dialect.driver == "mysqlconnector" else ()
        self._read_errors: tuple[type[Exception], ...] = (SQLAlchemyError, *unwrapped)
        self.clock = SourceClock(config.timezone)
        run_cols, tool_cols = columns_read(content)
        self._run_select = select(*(diagnosis_run.c[name] for name in run_cols))
        columns: list[ColumnElement] = [_as_stored(tool_invocation.c[name]) for name in tool_cols]
        # Without capture, MySQL/MariaDB summarize retrieval_details themselves: the evidence
        # text, often kilobytes a call, then never leaves the database.
        summarize = config.evidence_in_database and not content.capture and self.engine.dialect.name == "mysql"
        self._evidence_at = TOOL_COLUMNS.index("retrieval_details") if summarize else None
        if self._evidence_at is not None:
            at = self._evidence_at
            columns[at : at + 1] = database_columns(tool_invocation.c.retrieval_details)
        self._tool_select = select(*columns)
        self._summaries = DatabaseSummaries()
        # The bulk reads take the driver's tuples when no column needs converting (MySQL and
        # MariaDB; SQLite's DATETIME is text that SQLAlchemy parses): a Row per value read
        # costs about a seventh of mysql-connector's read.
        dialect = self.engine.dialect
        self.reads_raw = _without_processing(self._run_select, dialect) and _without_processing(self._tool_select, dialect)

    def describe(self) -> str:
        return safe_url(self._url)

    def summarizes_evidence(self) -> bool:
        return self._evidence_at is not None

    def probe_tool_select(self) -> None:
        """Runs the tool statement on no rows: the server then says whether it knows every function."""
        self._fetch(self._tool_select.limit(0))

    def _tool_row(self, row: Sequence[Any]) -> ToolRow:
        at = self._evidence_at
        if at is None:
            return ToolRow(*row)
        summary = self._summaries.evidence(row[at : at + DATABASE_COLUMN_COUNT])
        values = [*row[:at], summary, *row[at + DATABASE_COLUMN_COUNT :]]
        return ToolRow(*values)

    @contextmanager
    def _connection(self) -> Iterator[Connection]:
        """A pooled connection for one or more reads; a failure as the SourceError that says what it means."""
        try:
            with self.engine.connect() as conn:
                yield conn
        except self._read_errors as exc:
            raise read_failed(exc, self.describe(), self._statement_timeout, self._evidence_at is not None) from None

    def _fetch(self, statement: Executable, bulk: bool = False) -> list:
        with self._connection() as conn:
            result = conn.execute(statement)
            if bulk and self.reads_raw:
                # Each driver's default cursor holds the whole result once execute returns
                # (PyMySQL's Cursor, mysql-connector's buffered cursor, mysqlclient's
                # stored result), so this fetch does not touch the network.
                rows = result.cursor.fetchall()
                result.close()
                return list(rows)
            return list(result)

    fetch = _fetch  # for the reads of the modules beside this one (run_ids.py), with the same errors

    # -- runs ---------------------------------------------------------------

    def max_run_id(self) -> int:
        with self._connection() as conn:
            return _newest_id(conn)

    def next_run_id(self) -> int | None:
        """The next run's id (AUTO_INCREMENT): a delete leaves it, a restore moves it back. None on SQLite.
        From SHOW CREATE TABLE, which reads no table; information_schema.TABLES is a full scan by
        MariaDB's count, and MySQL 8 answers it from statistics up to a day old."""
        if self.engine.dialect.name != "mysql":
            return None
        rows = self._fetch(text(f"SHOW CREATE TABLE {diagnosis_run.name}"))
        found = re.search(r"\bAUTO_INCREMENT=(\d+)", str(rows[0][1])) if rows else None
        return int(found[1]) if found else 1  # no AUTO_INCREMENT= clause: the table never had a row

    def runs_after(self, high_water: int, limit: int, until_id: int | None = None) -> list[RunRow]:
        """Up to ``limit`` runs with id above ``high_water`` (and up to ``until_id``), by id."""
        stmt = self._run_select.where(diagnosis_run.c.id > high_water)
        if until_id is not None:
            stmt = stmt.where(diagnosis_run.c.id <= until_id)
        stmt = stmt.order_by(diagnosis_run.c.id).limit(limit)
        return [RunRow(*row) for row in self._fetch(stmt, bulk=True)]

    def runs_by_ids(self, ids: Iterable[int]) -> list[RunRow]:
        ordered = sorted(set(ids))
        out: list[RunRow] = []
        for chunk in _chunks(ordered, self._chunk):
            stmt = self._run_select.where(diagnosis_run.c.id.in_(chunk)).order_by(diagnosis_run.c.id)
            out.extend(RunRow(*row) for row in self._fetch(stmt, bulk=True))
        return out

    def run_by_run_id(self, run_id: str) -> RunRow | None:
        rows = self._fetch(self._run_select.where(diagnosis_run.c.run_id == run_id))
        return RunRow(*rows[0]) if rows else None

    def _newest(self, *columns: ColumnElement) -> list:
        """The newest run's ``columns``, by MAX(id), which the optimizer answers from the primary
        key's last entry, then that row by key. ``ORDER BY id DESC LIMIT 1`` reads the same one row,
        but MariaDB counts it as a full scan (``Select_scan``, ``Full_scan`` in the slow log)."""
        newest = select(func.max(diagnosis_run.c.id)).scalar_subquery()
        return self._fetch(select(*columns).where(diagnosis_run.c.id == newest))

    def newest_run(self) -> tuple[int, datetime] | None:
        """The newest run's id and created_at: one primary-key probe."""
        rows = self._newest(diagnosis_run.c.id, diagnosis_run.c.created_at)
        return (int(rows[0][0]), rows[0][1]) if rows else None

    def backlog(self, high_water: int, clock: SourceClock) -> Backlog | None:
        """What waits above ``high_water``: two primary-key probes. None when there are no runs."""
        newest = self.newest_run()
        if newest is None:
            return None
        newest_id, newest_at = newest
        if newest_id <= high_water:
            return Backlog(newest_id, 0, 0.0)
        # From high water 0 nothing is exported yet: the lag runs from the oldest run.
        mark = self.created_at_from(high_water)
        newest_epoch, mark_epoch = clock.epoch(newest_at), clock.epoch(mark[1]) if mark else None
        seconds = max(newest_epoch - mark_epoch, 0.0) if newest_epoch is not None and mark_epoch is not None else None
        return Backlog(newest_id, newest_id - high_water, seconds)

    def created_at_from(self, first_id: int) -> tuple[int, datetime] | None:
        """The first run at or after ``first_id``: a primary-key probe, for backfill bounds."""
        with self._connection() as conn:
            return _first_from(conn, first_id)

    def created_at_from_each(self, first_ids: Sequence[int]) -> Iterator[tuple[int, datetime] | None]:
        """:meth:`created_at_from` for each id, on one connection: the ids that exist in one primary-key
        lookup, a probe each for the others (gaps), where a probe each took a checkout each."""
        run = diagnosis_run.c
        with self._connection() as conn:
            rows = conn.execute(select(run.id, run.created_at).where(run.id.in_(sorted(set(first_ids)))))
            exact = {int(pk): created for pk, created in rows}
            for first_id in first_ids:
                found = first_id in exact
                yield (first_id, exact[first_id]) if found else _first_from(conn, first_id)

    def first_id_created_at_or_after(self, moment: datetime) -> int:
        """The first run id created at or after ``moment``, by binary search on primary-key probes.

        It relies on ids growing with created_at, as an auto-increment key
        written at insert time does; it never scans.
        """
        with self._connection() as conn:  # one checkout for the whole search
            low, high = 1, _newest_id(conn) + 1
            while low < high:
                middle = (low + high) // 2
                probe = _first_from(conn, middle)
                if probe is None or (isinstance(probe[1], datetime) and probe[1] >= moment):
                    high = middle
                else:
                    # Every id up to the probed row starts no later than it: skip them all.
                    low = probe[0] + 1
        return low

    def rated_runs(self, first_id: int, last_id: int) -> list[FeedbackRow]:
        """Finished runs in [first_id, last_id] that carry feedback: one primary-key range read."""
        run = diagnosis_run.c
        return self._rated(run.id >= first_id, run.id <= last_id)

    def rated_runs_by_ids(self, ids: Iterable[int]) -> list[FeedbackRow]:
        """Finished runs of these ids that carry feedback: primary-key lookups."""
        return [row for chunk in _chunks(sorted(set(ids)), self._chunk) for row in self._rated(diagnosis_run.c.id.in_(chunk))]

    def rated_runs_updated_since(self, since: datetime, created_from: datetime, last_id: int, index: str) -> list[FeedbackRow]:
        """Finished runs up to ``last_id``, created from ``created_from``, that carry feedback and were
        updated since ``since``: a range of the agent's index ``index`` on updated_at."""
        run = diagnosis_run.c
        # In the index's order, sorted here: MariaDB counts a filesort's rows as examined again.
        rows = self._rated(run.updated_at >= since, run.created_at >= created_from, run.id <= last_id, index=index)
        return sorted(rows, key=lambda row: row.id)

    def _rated(self, *bounds: ColumnElement, index: str | None = None) -> list[FeedbackRow]:
        run = diagnosis_run.c
        stmt = select(run.id, run.run_id, run.intent, run.feedback, run.updated_at, run.created_at, run.total_duration_ms).where(
            *bounds, run.feedback.is_not(None), run.status.in_(sorted(TERMINAL_STATUSES))
        )
        if index is None:
            stmt = stmt.order_by(run.id)
        else:  # the status index is there too: the optimizer may not see which is narrow
            stmt = stmt.with_hint(diagnosis_run, f"FORCE INDEX (`{index}`)", "mysql")
        return [FeedbackRow(*row) for row in self._fetch(stmt)]

    def updated_at_index(self) -> str | None:
        """An index of diagnosis_run that leads with updated_at, by name; None when there is none.
        Read from SHOW CREATE TABLE, which reads no rows."""
        try:
            indexes = inspect(self.engine).get_indexes(diagnosis_run.name)
        except self._read_errors as exc:
            raise read_failed(exc, self.describe(), self._statement_timeout, False) from None
        return next((str(i["name"]) for i in indexes if i["column_names"][:1] == ["updated_at"]), None)

    def clock_offset(self, clock: Callable[[], float] = time.time) -> float | None:
        """The database's clock minus ``clock`` (this host's) mid round trip; None on SQLite (the host's clock)."""
        if self.engine.dialect.name != "mysql":
            return None
        before = clock()
        db_utc = self._fetch(select(func.utc_timestamp(6)))[0][0]
        after = clock()
        if not isinstance(db_utc, datetime):
            return None
        return db_utc.replace(tzinfo=UTC).timestamp() - (before + after) / 2

    def clock_sample(self) -> ClockSample | None:
        """The newest run's times and the database's clocks, for the time-zone check."""
        newest = self._newest(diagnosis_run.c.id, diagnosis_run.c.created_at, diagnosis_run.c.updated_at)
        if not newest:
            return None
        stamps = [v for v in newest[0][1:] if isinstance(v, datetime)]
        if not stamps:
            return None
        if self.engine.dialect.name == "mysql":
            db_now, db_utc = self._fetch(select(func.now(), func.utc_timestamp()))[0]
        else:  # SQLite has one clock, in UTC
            db_now, db_utc = None, datetime.fromisoformat(self._fetch(select(func.datetime("now")))[0][0])
        return ClockSample(int(newest[0][0]), max(stamps), db_now, db_utc)

    # -- tools --------------------------------------------------------------

    def tools_for(self, run_ids: Iterable[str], through_id: int | None = None) -> dict[str, list[ToolRow]]:
        """Tool rows by run_id, in id order: one ``run_id IN (...)`` query per chunk. With
        ``through_id``, only the rows up to that id: ``idx_tool_invocation_run_id`` is
        (run_id, id), so the rows above it are not even examined. The bound is written
        ``id + 0 <=``: as ``id <=`` it let MariaDB take the primary key's range instead of that
        index where the range held the whole table, and examine every row in it for each chunk."""
        wanted = sorted({run_id_text(run_id) for run_id in run_ids})
        by_run: dict[str, list[ToolRow]] = {run_id: [] for run_id in wanted}
        # MySQL's default collations compare case-insensitively, so IN may
        # return 'RUN-A' for 'run-a'; file such rows under the id that was asked.
        folded = {run_id.casefold(): run_id for run_id in wanted}
        for chunk in _chunks(wanted, self._chunk):
            stmt = self._tool_select.where(tool_invocation.c.run_id.in_(chunk))
            if through_id is not None:
                stmt = stmt.where(tool_invocation.c.id + 0 <= through_id)
            for tool in self._tools(stmt.order_by(tool_invocation.c.run_id, tool_invocation.c.id)):
                run_id = run_id_text(tool.run_id)
                key = run_id if run_id in by_run else folded.get(run_id.casefold())
                if key is not None:
                    by_run[key].append(tool)
        return by_run

    def tools_after(self, tool_id: int, limit: int) -> list[ToolRow]:
        """Up to ``limit`` tool rows with id above ``tool_id``, by id: a primary-key range."""
        c = tool_invocation.c
        return self._tools(self._tool_select.where(c.id > tool_id).order_by(c.id).limit(limit))

    def tools_by_ids(self, ids: Iterable[int]) -> list[ToolRow]:
        """The tool rows of these ids that exist, by id: primary-key lookups, one query per chunk."""
        out: list[ToolRow] = []
        for chunk in _chunks(sorted(set(ids)), self._chunk):
            out.extend(self._tools(self._tool_select.where(tool_invocation.c.id.in_(chunk)).order_by(tool_invocation.c.id)))
        return out

    def max_tool_id(self) -> int:
        """The highest tool row id, from the primary key's last entry."""
        return int(self._fetch(select(func.max(tool_invocation.c.id)))[0][0] or 0)

    def _tools(self, statement: Select) -> list[ToolRow]:
        return [self._tool_row(row) for row in self._fetch(statement, bulk=True)]

    def close(self) -> None:
        self.engine.dispose()
