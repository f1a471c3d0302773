"""The state store's tables, and the changes made in place to tables of earlier releases.

Seven tables, one row per shard, per run and shard, per run, or per id range and shard:
``run_otel_checkpoint`` (where the poller stands), ``run_otel_feedback`` (the ratings sent,
``ratings_ledger.py``), ``run_otel_watch`` (the runs kept complete after their export,
``watch.py``), ``run_otel_tool_cursor`` (the highest tool id the watch read, ``tool_feed.py``),
``run_otel_incomplete`` (the runs sent incomplete, as first sent, ``first_sends.py``),
``run_otel_orphans`` (the look for tool rows whose run never appears, ``orphans.py``) and
``run_otel_backfilled`` (the id ranges a backfill exported, ``backfilled.py``).
"""

from __future__ import annotations

import logging

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Engine,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    inspect,
    text,
)
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger(__name__)

# Unix seconds need a double: MySQL's FLOAT is single precision, about two minutes apart at today's times.
Seconds = Float(precision=53)

metadata = MetaData()
checkpoint_table = Table(
    "run_otel_checkpoint",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("format_version", Integer, nullable=False),
    Column("high_water", BigInteger, nullable=False),
    Column("pending", Text, nullable=False),
    Column("gaps", Text, nullable=False),
    Column("saved_at", Seconds, nullable=False),
    # The high-water mark of the first start: runs at or below it were never this bridge's to send
    # (a backfill's, or nobody's), so their ratings are not either. NULL in tables of earlier releases.
    Column("start_mark", BigInteger, nullable=True),
    # The runs below start_mark in flight at the first start, taken over and sent by this bridge: their
    # ratings are its to send too. A JSON list of primary keys; NULL in tables of earlier releases.
    Column("taken_over", Text, nullable=True),
)

# The feedback value last sent per run: only a new or changed value is sent again.
feedback_table = Table(
    "run_otel_feedback",
    metadata,
    Column("shard", String(64), primary_key=True),
    Column("run_id", String(128), primary_key=True),
    Column("feedback", String(64), nullable=False),
    Column("sent_at", Seconds, nullable=False, index=True),
    # When the rating sent was given (ns): names its span, under which a later rating marks it superseded.
    Column("rated_at_ns", BigInteger, nullable=True),
)

# The runs whose traces are kept complete after their export: which tool rows were sent, whether
# the run went out incomplete, and until when it is watched.
watch_table = Table(
    "run_otel_watch",
    metadata,
    Column("shard", String(64), primary_key=True),
    Column("run_id", String(128), primary_key=True),
    Column("run_pk", BigInteger, nullable=False),
    Column("incomplete", Boolean, nullable=False),
    Column("tool_ids", Text, nullable=False),
    Column("until", Seconds, nullable=False, index=True),
)

# Where the late-row watch stands in tool_invocation: the highest tool id read, and the ids below it
# not committed yet (JSON: id -> when first missed), re-read until poll.gap_timeout_seconds.
tool_cursor_table = Table(
    "run_otel_tool_cursor",
    metadata,
    Column("shard", String(64), primary_key=True),
    Column("high", BigInteger, nullable=False),
    Column("gaps", Text, nullable=False),
    Column("saved_at", Seconds, nullable=False),
)

# The runs sent incomplete, one row each by primary key: the root as it was first sent (its span's
# bytes) and the tool rows sent with it, so that a re-send (a backfill, `export`, a rewind) sends the
# run as it was first sent, then its completed span (first_sends.py).
incomplete_table = Table(
    "run_otel_incomplete",
    metadata,
    Column("run_pk", BigInteger, primary_key=True, autoincrement=False),
    Column("run_id", String(128), nullable=False),
    Column("root", LargeBinary(16 * 1024 * 1024), nullable=False),
    Column("tool_ids", Text, nullable=False),
    Column("sent_at", Seconds, nullable=False),
)

# Each shard's look for tool rows whose run never appears (orphans.py): the tool id it has looked
# up to, and what it found (JSON), which `run-otel check` names.
orphan_table = Table(
    "run_otel_orphans",
    metadata,
    Column("shard", String(64), primary_key=True),
    Column("tool_cursor", BigInteger, nullable=False),
    Column("found", Text, nullable=False),
    Column("saved_at", Seconds, nullable=False),
)

# The id ranges a backfill exported (first and last id, both included), whose later ratings the
# feedback pass sends; a range grows in its row as the backfill's batches are acknowledged.
backfilled_table = Table(
    "run_otel_backfilled",
    metadata,
    Column("shard", String(64), primary_key=True),
    Column("first_id", BigInteger, primary_key=True, autoincrement=False),
    Column("last_id", BigInteger, nullable=False),
    Column("saved_at", Seconds, nullable=False),
)

# Columns added since the tables were first released: added in place to tables made before.
_ADDED_COLUMNS = ((checkpoint_table, "start_mark"), (checkpoint_table, "taken_over"), (feedback_table, "rated_at_ns"))


def create(engine: Engine, where: str) -> None:
    """Creates the tables that are missing, and brings those of earlier releases up to date.
    Raises SQLAlchemyError when the store cannot take them."""
    metadata.create_all(engine)
    _widen_seconds(engine, where)
    _add_columns(engine, where)


def exists(engine: Engine) -> bool:
    try:
        return inspect(engine).has_table(checkpoint_table.name)
    except SQLAlchemyError:
        return False


def _widen_seconds(engine: Engine, where: str) -> None:
    """Tables created by earlier releases on MySQL/MariaDB keep seconds in a FLOAT: made DOUBLE here."""
    if engine.dialect.name != "mysql":
        return
    for table, column in ((checkpoint_table, "saved_at"), (feedback_table, "sent_at")):
        kind = None
        try:
            kind = next((c["type"] for c in inspect(engine).get_columns(table.name) if c["name"] == column), None)
            if kind is None or "DOUBLE" in str(kind).upper():
                continue
            with engine.begin() as conn:
                conn.execute(text(f"ALTER TABLE {table.name} MODIFY {column} DOUBLE NOT NULL"))
            log.info("state store %s: %s.%s widened from %s to DOUBLE", where, table.name, column, kind)
        except SQLAlchemyError as exc:
            log.warning(
                "state store %s: %s.%s is %s, which rounds Unix times to minutes; ALTER it to DOUBLE (%s)",
                where,
                table.name,
                column,
                kind,
                getattr(exc, "orig", exc),
            )


def _add_columns(engine: Engine, where: str) -> None:
    """Adds the nullable columns newer than the tables, so a store made by an earlier release keeps working."""
    for table, column in _ADDED_COLUMNS:
        try:
            if column in {c["name"] for c in inspect(engine).get_columns(table.name)}:
                continue
            kind = table.c[column].type.compile(dialect=engine.dialect)
            with engine.begin() as conn:
                conn.execute(text(f"ALTER TABLE {table.name} ADD COLUMN {column} {kind} NULL"))
            log.info("state store %s: added %s.%s", where, table.name, column)
        except SQLAlchemyError as exc:
            # Two instances starting together race to add it; a store that cannot take it fails at first use.
            log.debug("state store %s: adding %s.%s: %s", where, table.name, column, getattr(exc, "orig", exc))
