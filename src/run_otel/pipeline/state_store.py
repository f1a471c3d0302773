"""The state store: any SQLAlchemy database (default a SQLite file) holding where each shard
stands (``checkpoint.py``), the runs watched after their export (``watch.py``), the ratings
sent (``ratings_ledger.py``), the runs sent incomplete as first sent (``first_sends.py``), the
look for orphan tool rows (``orphans.py``) and the id ranges a backfill exported
(``backfilled.py``), in the tables of ``state_tables.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from ..config import StateConfig
from ..sharding import Shard, shard_name
from ..source.engine import make_engine, safe_url
from . import backfilled, ratings_ledger, state_tables, watch
from . import first_sends as first_sends_table
from .backfilled import Range
from .checkpoint import FORMAT_VERSION, Checkpoint
from .first_sends import FirstSend, Sent
from .orphan_scan import OrphanScan
from .ratings_ledger import SentRating
from .state_tables import checkpoint_table, orphan_table
from .watch import ToolMark, Watched


class StateStoreError(RuntimeError):
    """The state store is unreadable; run-otel refuses to guess where it was."""


class StateStore:
    def __init__(self, config: StateConfig, shard: Shard, create: bool = True):
        self._url = make_url(config.url)
        self.shard = shard
        self.name = shard_name(shard)
        if not create and self._url.get_backend_name() == "sqlite" and not Path(self._url.database or "").is_file():
            raise StateStoreError(f"no state store at {self.describe()}: nothing has been exported with this config yet")
        self.engine = make_engine(self._url)
        if not create:
            if not self._table_exists():
                raise StateStoreError(f"state store {self.describe()} has no checkpoint table yet")
            return
        try:
            state_tables.create(self.engine, self.describe())
        except SQLAlchemyError as exc:
            # Two instances starting together (HA, shards) race to create the table.
            if self._table_exists():
                return
            raise StateStoreError(
                f"state store {self.describe()} is not usable: {exc.__class__.__name__}: {getattr(exc, 'orig', exc)}"
            ) from None

    def _table_exists(self) -> bool:
        return state_tables.exists(self.engine)

    def describe(self) -> str:
        return safe_url(self._url)

    def load(self, name: str | None = None) -> Checkpoint | None:
        """The saved checkpoint (of this shard, or of ``name``), None on a first start; raises if damaged."""
        name = name or self.name
        try:
            with self.engine.connect() as conn:
                row = conn.execute(select(checkpoint_table).where(checkpoint_table.c.name == name)).first()
        except SQLAlchemyError as exc:
            raise self._failed("is unreadable", exc) from None
        if row is None:
            return None
        if isinstance(row.format_version, int) and row.format_version > FORMAT_VERSION:
            raise StateStoreError(
                f"checkpoint {name!r} in {self.describe()} was written by a newer run-otel (format version "
                f"{row.format_version}; this release reads {FORMAT_VERSION}): run that release or a later one"
            )
        try:
            return Checkpoint.from_row(row)
        except (ValueError, TypeError, AttributeError) as exc:
            raise StateStoreError(
                f"checkpoint {name!r} in {self.describe()} is damaged ({exc}). "
                "Refusing to restart from scratch: restore the state store, or delete the row "
                "and set poll.start_from to the first run id to re-export."
            ) from None

    def saved_at(self, name: str | None = None) -> float | None:
        """When this shard's checkpoint (or ``name``'s) was last saved, Unix seconds; None when never."""
        try:
            with self.engine.connect() as conn:
                row = conn.execute(
                    select(checkpoint_table.c.saved_at).where(checkpoint_table.c.name == (name or self.name))
                ).first()
        except SQLAlchemyError as exc:
            raise self._failed("is unreadable", exc) from None
        return float(row[0]) if row else None

    def load_all(self) -> list[tuple[str, Checkpoint, float]]:
        """Every shard's checkpoint in the store: (name, checkpoint, saved_at), by name."""
        try:
            with self.engine.connect() as conn:
                rows = list(
                    conn.execute(select(checkpoint_table.c.name, checkpoint_table.c.saved_at).order_by(checkpoint_table.c.name))
                )
        except SQLAlchemyError as exc:
            raise StateStoreError(f"state store {self.describe()} is unreadable: {getattr(exc, 'orig', exc)}") from None
        out = []
        for name, saved_at in rows:
            checkpoint = self.load(name)
            if checkpoint is not None:
                out.append((name, checkpoint, float(saved_at)))
        return out

    def save(
        self, checkpoint: Checkpoint, now: float, watched: list[Watched] | None = None, tools: ToolMark | None = None
    ) -> None:
        """Saves the checkpoint and, in the same transaction, the runs whose traces are kept complete from
        now on and where the watch stands in tool_invocation."""
        values = checkpoint.values(now)
        try:
            with self.engine.begin() as conn:
                updated = conn.execute(
                    checkpoint_table.update().where(checkpoint_table.c.name == self.name).values(**values)
                ).rowcount
                if not updated:
                    conn.execute(checkpoint_table.insert().values(name=self.name, **values))
                if watched:
                    watch.record(conn, self.name, watched)
                if tools is not None:
                    watch.record_mark(conn, self.name, tools, now)
        except SQLAlchemyError as exc:
            raise self._failed("cannot save the checkpoint", exc) from None

    # -- runs watched after their export ---------------------------------------------

    def watched(self, now: float) -> list[Watched]:
        """The runs whose traces are still kept complete at ``now``."""
        try:
            return watch.load(self.engine, self.name, now)
        except SQLAlchemyError as exc:
            raise self._failed("is unreadable", exc) from None

    def tool_mark(self) -> ToolMark | None:
        """Where the watch stands in tool_invocation; None before its first save."""
        try:
            return watch.load_mark(self.engine, self.name)
        except SQLAlchemyError as exc:
            raise self._failed("is unreadable", exc) from None

    def save_watch(self, updated: list[Watched], done: list[str], now: float, tools: ToolMark | None = None) -> None:
        """Records what the late pass sent, and ends the watches that are over."""
        try:
            with self.engine.begin() as conn:
                watch.forget(conn, self.name, done, before=now)
                watch.record(conn, self.name, updated)
                if tools is not None:
                    watch.record_mark(conn, self.name, tools, now)
        except SQLAlchemyError as exc:
            raise self._failed("cannot save the runs watched", exc) from None

    # -- runs sent incomplete, as first sent -------------------------------------------

    def first_sends(self, run_pks: Iterable[int]) -> dict[int, FirstSend]:
        """How those of ``run_pks`` sent incomplete were first sent, by primary key."""
        try:
            with self.engine.connect() as conn:
                return first_sends_table.of(conn, run_pks)
        except SQLAlchemyError as exc:
            raise self._failed("is unreadable", exc) from None

    def save_first_sends(self, sent: Sequence[Sent], now: float) -> None:
        """Records the runs just sent incomplete for the first time, once acknowledged."""
        if not sent:
            return
        try:
            with self.engine.begin() as conn:
                first_sends_table.record(conn, sent, now)
        except SQLAlchemyError as exc:
            raise self._failed("cannot save the runs sent incomplete", exc) from None

    # -- the look for orphan tool rows -----------------------------------------------

    def orphan_scan(self, name: str | None = None) -> OrphanScan | None:
        """This shard's (or ``name``'s) look for tool rows whose run never appears; None before the first."""
        try:
            with self.engine.connect() as conn:
                row = conn.execute(select(orphan_table).where(orphan_table.c.shard == (name or self.name))).first()
        except SQLAlchemyError as exc:
            raise self._failed("is unreadable", exc) from None
        if row is None:
            return None
        found = json.loads(row.found)
        return OrphanScan(int(row.tool_cursor), found.get("runs", {}), int(found.get("others", 0)))

    def save_orphan_scan(self, scan: OrphanScan, now: float) -> None:
        values = {"tool_cursor": scan.cursor, "found": json.dumps({"runs": scan.runs, "others": scan.others}), "saved_at": now}
        try:
            with self.engine.begin() as conn:
                where = orphan_table.c.shard == self.name
                if not conn.execute(orphan_table.update().where(where).values(**values)).rowcount:
                    conn.execute(orphan_table.insert().values(shard=self.name, **values))
        except SQLAlchemyError as exc:
            raise self._failed("cannot save the look for orphan tool rows", exc) from None

    def _failed(self, what: str, exc: SQLAlchemyError) -> StateStoreError:
        """The error for a store that failed mid-use. Its pooled connections are dropped, so a
        file or server that comes back is opened afresh, not through a handle to what went away."""
        self.engine.dispose()
        return StateStoreError(f"state store {self.describe()} {what}: {getattr(exc, 'orig', exc)}")

    # -- feedback sent --------------------------------------------------------------

    def sent_feedback(self, run_ids: list[str]) -> dict[str, SentRating]:
        """run_id -> the rating last sent, for those of ``run_ids`` that have one."""
        try:
            with self.engine.connect() as conn:
                return ratings_ledger.sent(conn, self.name, run_ids)
        except SQLAlchemyError as exc:
            raise self._failed("is unreadable", exc) from None

    def save_feedback(self, sent: dict[str, SentRating], now: float, forget_before: float) -> None:
        """Records what was acknowledged, and forgets runs that left the recheck window."""
        try:
            with self.engine.begin() as conn:
                ratings_ledger.record(conn, self.name, sent, now)
                ratings_ledger.forget(conn, self.name, forget_before)
        except SQLAlchemyError as exc:
            raise self._failed("cannot save the feedback sent", exc) from None

    # -- what a backfill exported ------------------------------------------------------

    def save_backfilled(self, ranges: list[Range], ratings: dict[str, SentRating], now: float) -> None:
        """Records, in one transaction, the id ranges a backfill's batch exported and the ratings it sent."""
        try:
            with self.engine.begin() as conn:
                backfilled.record(conn, self.name, ranges, now)
                ratings_ledger.record(conn, self.name, ratings, now)
        except SQLAlchemyError as exc:
            raise self._failed("cannot save what the backfill sent", exc) from None

    def backfilled(self) -> list[Range]:
        """The id ranges backfills exported for this shard, merged, in id order."""
        try:
            with self.engine.connect() as conn:
                return backfilled.load(conn, self.name)
        except SQLAlchemyError as exc:
            raise self._failed("is unreadable", exc) from None

    def forget_backfilled(self, below: int) -> None:
        try:
            with self.engine.begin() as conn:
                backfilled.forget(conn, self.name, below)
        except SQLAlchemyError as exc:
            raise self._failed("cannot forget the ranges a backfill sent", exc) from None

    def close(self) -> None:
        self.engine.dispose()
