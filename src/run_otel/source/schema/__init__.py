"""The two source tables, as SQLAlchemy Core metadata and as MySQL DDL.

The Table objects are what every query is built from, so a column name is
spelled once. JSON columns are declared as Text: run-otel parses them itself,
tolerantly, because a malformed document must never stop the pipeline.
"""

import re
from importlib.resources import files

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

diagnosis_run = Table(
    "diagnosis_run",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("run_id", String(64), nullable=False, unique=True),
    Column("session_id", String(64), nullable=False),
    Column("query", Text, nullable=False),
    Column("status", String(16)),
    Column("agent_flow", String(32)),
    Column("answer", Text),
    Column("intent", String(32)),
    Column("release_outcome", String(16)),
    Column("published_result", Text),
    Column("self_evaluation", Text),
    Column("feedback", String(16)),
    Column("total_duration_ms", Integer),
    Column("total_token_count", Integer),
    Column("step_count", Integer),
    Column("tool_call_count", Integer),
    Column("created_at", DateTime, nullable=False),
    Column("updated_at", DateTime, nullable=False),
    Index("idx_diagnosis_run_session_created", "session_id", "created_at", "id"),
    Index("idx_diagnosis_run_session_run", "session_id", "run_id"),
    Index("idx_diagnosis_run_status", "status"),
    Index("idx_diagnosis_run_agent_flow", "agent_flow"),
)

tool_invocation = Table(
    "tool_invocation",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("session_id", String(64), nullable=False),
    Column("run_id", String(64)),
    Column("step_id", BigInteger),
    Column("tool_name", String(64), nullable=False),
    Column("input_params", Text, nullable=False),
    Column("output_preview", Text),
    Column("output_length", Integer),
    Column("retrieval_layer", String(8)),
    Column("l0_match_count", Integer),
    Column("l1_match_count", Integer),
    Column("is_truncated", Boolean(create_constraint=False)),
    Column("relevance_level", String(20)),
    Column("dedup_reason", String(32)),
    Column("retrieval_details", Text),
    Column("duration_ms", Integer),
    Column("success", Boolean(create_constraint=False)),
    Column("error_message", Text),
    Column("created_at", DateTime, nullable=False),
    Index("idx_session_id", "session_id"),
    Index("idx_tool_invocation_run_id", "run_id", "id"),
    Index("idx_tool_name", "tool_name"),
    Index("idx_retrieval_layer", "retrieval_layer"),
)

# The indexes every run-otel statement is bounded by (SPEC section 2).
REQUIRED_INDEXES: dict[str, dict[str, tuple[str, ...]]] = {
    "diagnosis_run": {"PRIMARY": ("id",), "run_id": ("run_id",)},
    "tool_invocation": {"PRIMARY": ("id",), "idx_tool_invocation_run_id": ("run_id", "id")},
}


def mysql_ddl() -> str:
    """The MySQL 8 / MariaDB DDL of both tables, as one script."""
    return files(__package__).joinpath("mysql.sql").read_text(encoding="utf-8")


def mysql_statements() -> list[str]:
    """The DDL split into statements, for drivers that run one at a time."""
    lines = [line for line in mysql_ddl().splitlines() if not line.lstrip().startswith("--")]
    return [stmt.strip() for stmt in "\n".join(lines).split(";") if stmt.strip()]


# How information_schema.COLUMNS.DATA_TYPE names a documented type where the two differ:
# BOOLEAN is TINYINT(1), and MariaDB stores JSON as LONGTEXT.
_DATA_TYPES = {"boolean": ("tinyint",), "json": ("json", "longtext")}


def documented_types() -> dict[tuple[str, str], tuple[str, ...]]:
    """(table, column) -> the DATA_TYPE values the documented DDL allows, from mysql.sql."""
    found: dict[tuple[str, str], tuple[str, ...]] = {}
    for statement in mysql_statements():
        table = re.match(r"CREATE TABLE IF NOT EXISTS (\w+)", statement)
        if not table:
            continue
        for name, kind in re.findall(r"^\s+(\w+)\s+([A-Z]+)\b", statement, re.MULTILINE):
            if name.upper() not in ("PRIMARY", "KEY", "UNIQUE"):
                found[(table.group(1), name)] = _DATA_TYPES.get(kind.lower(), (kind.lower(),))
    return found
