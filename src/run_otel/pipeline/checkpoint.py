"""Where the poller stands: high-water mark, pending runs and gaps.

Kept in any SQLAlchemy database (default a SQLite file), one row per shard,
and written only after the receiver acknowledged the batch it covers.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import BigInteger, Column, Connection, Float, Integer, MetaData, String, Table, Text, inspect, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from ..config import StateConfig
from ..sharding import Shard, shard_name
from ..source.engine import make_engine, safe_url

log = logging.getLogger(__name__)

FORMAT_VERSION = 1

# Unix seconds need a double: MySQL's FLOAT is single precision, about two minutes apart at today's times.
Seconds = Float(precision=53)

_metadata = MetaData()
checkpoint_table = Table(
    "run_otel_checkpoint",
    _metadata,
    Column("name", String(64), primary_key=True),
    Column("format_version", Integer, nullable=False),
    Column("high_water", BigInteger, nullable=False),
    Column("pending", Text, nullable=False),
    Column("gaps", Text, nullable=False),
    Column("saved_at", Seconds, nullable=False),
)


# The feedback value last sent per run: only a new or changed value is sent again.
feedback_table = Table(
    "run_otel_feedback",
    _metadata,
    Column("shard", String(64), primary_key=True),
    Column("run_id", String(128), primary_key=True),
    Column("feedback", String(64), nullable=False),
    Column("sent_at", Seconds, nullable=False, index=True),
)


class CheckpointError(RuntimeError):
    """The state store is unreadable; run-otel refuses to guess where it was."""


@dataclass
class Checkpoint:
    high_water: int
    # run primary key -> when it was first seen waiting (Unix seconds)
    pending: dict[int, float] = field(default_factory=dict)
    # missing primary key below the high-water mark -> when it was first missed
    gaps: dict[int, float] = field(default_factory=dict)

    def copy(self) -> Checkpoint:
        return Checkpoint(self.high_water, dict(self.pending), dict(self.gaps))


class CheckpointStore:
    def __init__(self, config: StateConfig, shard: Shard, create: bool = True):
        self._url = make_url(config.url)
        self.shard = shard
        self.name = shard_name(shard)
        if not create and self._url.get_backend_name() == "sqlite" and not Path(self._url.database or "").is_file():
            raise CheckpointError(f"no state store at {self.describe()}: nothing has been exported with this config yet")
        self.engine = make_engine(self._url)
        if not create:
            if not self._table_exists():
                raise CheckpointError(f"state store {self.describe()} has no checkpoint table yet")
            return
        try:
            _metadata.create_all(self.engine)
        except SQLAlchemyError as exc:
            # Two instances starting together (HA, shards) race to create the table.
            if self._table_exists():
                return
            raise CheckpointError(
                f"state store {self.describe()} is not usable: {exc.__class__.__name__}: {getattr(exc, 'orig', exc)}"
            ) from None
        self._widen_seconds()

    def _widen_seconds(self) -> None:
        """Tables created by earlier releases on MySQL/MariaDB keep seconds in a FLOAT: made DOUBLE here."""
        if self.engine.dialect.name != "mysql":
            return
        for table, column in ((checkpoint_table, "saved_at"), (feedback_table, "sent_at")):
            kind = None
            try:
                kind = next((c["type"] for c in inspect(self.engine).get_columns(table.name) if c["name"] == column), None)
                if kind is None or "DOUBLE" in str(kind).upper():
                    continue
                with self.engine.begin() as conn:
                    conn.execute(text(f"ALTER TABLE {table.name} MODIFY {column} DOUBLE NOT NULL"))
                log.info("state store %s: %s.%s widened from %s to DOUBLE", self.describe(), table.name, column, kind)
            except SQLAlchemyError as exc:
                log.warning(
                    "state store %s: %s.%s is %s, which rounds Unix times to minutes; ALTER it to DOUBLE (%s)",
                    self.describe(),
                    table.name,
                    column,
                    kind,
                    getattr(exc, "orig", exc),
                )

    def _table_exists(self) -> bool:
        try:
            return inspect(self.engine).has_table(checkpoint_table.name)
        except SQLAlchemyError:
            return False

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
            raise CheckpointError(
                f"checkpoint {name!r} in {self.describe()} was written by a newer run-otel (format version "
                f"{row.format_version}; this release reads {FORMAT_VERSION}): run that release or a later one"
            )
        try:
            if row.format_version != FORMAT_VERSION:
                raise ValueError(f"format version {row.format_version}")
            return Checkpoint(
                high_water=int(row.high_water),
                pending={int(k): float(v) for k, v in json.loads(row.pending).items()},
                gaps={int(k): float(v) for k, v in json.loads(row.gaps).items()},
            )
        except (ValueError, TypeError, AttributeError) as exc:
            raise CheckpointError(
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
            raise CheckpointError(f"state store {self.describe()} is unreadable: {getattr(exc, 'orig', exc)}") from None
        out = []
        for name, saved_at in rows:
            checkpoint = self.load(name)
            if checkpoint is not None:
                out.append((name, checkpoint, float(saved_at)))
        return out

    def save(self, checkpoint: Checkpoint, now: float, feedback: dict[str, str] | None = None) -> None:
        """Saves the checkpoint and, in the same transaction, the feedback its runs were exported with."""
        values = {
            "format_version": FORMAT_VERSION,
            "high_water": checkpoint.high_water,
            "pending": json.dumps({str(k): v for k, v in sorted(checkpoint.pending.items())}),
            "gaps": json.dumps({str(k): v for k, v in sorted(checkpoint.gaps.items())}),
            "saved_at": now,
        }
        try:
            with self.engine.begin() as conn:
                updated = conn.execute(
                    checkpoint_table.update().where(checkpoint_table.c.name == self.name).values(**values)
                ).rowcount
                if not updated:
                    conn.execute(checkpoint_table.insert().values(name=self.name, **values))
                if feedback:
                    self._record_feedback(conn, feedback, now)
        except SQLAlchemyError as exc:
            raise self._failed("cannot save the checkpoint", exc) from None

    def _failed(self, what: str, exc: SQLAlchemyError) -> CheckpointError:
        """The error for a store that failed mid-use. Its pooled connections are dropped, so a
        file or server that comes back is opened afresh, not through a handle to what went away."""
        self.engine.dispose()
        return CheckpointError(f"state store {self.describe()} {what}: {getattr(exc, 'orig', exc)}")

    def _record_feedback(self, conn: Connection, sent: dict[str, str], now: float) -> None:
        table = feedback_table
        conn.execute(table.delete().where(table.c.shard == self.name, table.c.run_id.in_(list(sent))))
        conn.execute(
            table.insert(),
            [{"shard": self.name, "run_id": run_id, "feedback": value, "sent_at": now} for run_id, value in sent.items()],
        )

    # -- feedback sent --------------------------------------------------------------

    def sent_feedback(self, run_ids: list[str]) -> dict[str, str]:
        """run_id -> the feedback value last sent, for those of ``run_ids`` that have one."""
        table, out = feedback_table, {}
        try:
            with self.engine.connect() as conn:
                for start in range(0, len(run_ids), 500):
                    chunk = run_ids[start : start + 500]
                    rows = conn.execute(
                        select(table.c.run_id, table.c.feedback).where(table.c.shard == self.name, table.c.run_id.in_(chunk))
                    )
                    out.update({run_id: feedback for run_id, feedback in rows})
        except SQLAlchemyError as exc:
            raise self._failed("is unreadable", exc) from None
        return out

    def save_feedback(self, sent: dict[str, str], now: float, forget_before: float) -> None:
        """Records what was acknowledged, and forgets runs that left the recheck window."""
        table = feedback_table
        try:
            with self.engine.begin() as conn:
                if sent:
                    self._record_feedback(conn, sent, now)
                conn.execute(table.delete().where(table.c.shard == self.name, table.c.sent_at < forget_before))
        except SQLAlchemyError as exc:
            raise self._failed("cannot save the feedback sent", exc) from None

    def close(self) -> None:
        self.engine.dispose()
