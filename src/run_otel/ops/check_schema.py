"""`run-otel check`'s look at the agent's tables: the columns run-otel reads, their types, and
the indexes its statements need or can use."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import inspect, text

from ..config import Config
from ..pipeline.feedback_window import rows_a_pass
from ..source.columns import columns_read
from ..source.reader import Source, SourceError
from ..source.schema import REQUIRED_INDEXES, documented_types

OK, WARN, FAIL = "ok", "warn", "fail"

_INDEX_COST = {
    ("diagnosis_run", "PRIMARY"): "every poll scans diagnosis_run",
    ("diagnosis_run", "run_id"): "`run-otel show` scans diagnosis_run",
    ("tool_invocation", "PRIMARY"): "tool rows have no stable order",
    ("tool_invocation", "idx_tool_invocation_run_id"): "every poll scans the whole tool_invocation table once per chunk of runs",
}
# The index the agent's team may add for the feedback pass; the documented schema has none.
UPDATED_AT_DDL = "CREATE INDEX idx_diagnosis_run_updated_at ON diagnosis_run (updated_at)"


@dataclass(frozen=True)
class Finding:
    level: str
    what: str
    detail: str = ""


def check_columns(config: Config, source: Source) -> Iterator[Finding]:
    inspector = inspect(source.engine)
    run_columns, tool_columns = columns_read(config.content)
    wanted = {"diagnosis_run": run_columns, "tool_invocation": tool_columns}
    for table, columns in wanted.items():
        if not inspector.has_table(table):
            yield Finding(FAIL, f"table {table}", "missing")
            continue
        present = {c["name"].lower() for c in inspector.get_columns(table)}
        missing = [c for c in columns if c not in present]
        if missing:
            yield Finding(FAIL, f"table {table}", f"missing column(s): {', '.join(missing)}")
        else:
            yield Finding(OK, f"table {table}", f"{len(columns)} columns run-otel reads are present")


def check_column_types(config: Config, source: Source) -> Iterator[Finding]:
    """A column whose type drifted from the documented schema: run-otel still reads its
    values by meaning, but says so, since the agent may now write values that mean nothing."""
    if source.engine.dialect.name != "mysql":
        return
    run_columns, tool_columns = columns_read(config.content)
    read = {("diagnosis_run", c) for c in run_columns} | {("tool_invocation", c) for c in tool_columns}
    statement = text(
        "SELECT TABLE_NAME, COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ('diagnosis_run', 'tool_invocation')"
    )
    with source.engine.connect() as conn:
        found = {(str(t), str(c).lower()): str(d).lower() for t, c, d in conn.execute(statement)}
    documented = documented_types()
    drifted = [
        (key, documented[key][0], kind)
        for key, kind in sorted(found.items())
        if key in read and key in documented and kind not in documented[key]
    ]
    for (table, column), expected, kind in drifted:
        yield Finding(
            WARN,
            f"column {table}.{column}",
            f"is {kind.upper()}, the documented schema has {expected.upper()}: "
            "values are read by meaning, and one that means nothing is a row warning",
        )
    if found and not drifted:
        yield Finding(OK, "column types", "as in the documented schema")


def _index_columns(source: Source, table: str) -> dict[str, tuple[str, ...]]:
    inspector = inspect(source.engine)
    if not inspector.has_table(table):
        return {}
    found: dict[str, tuple[str, ...]] = {"PRIMARY": tuple(inspector.get_pk_constraint(table).get("constrained_columns") or ())}
    for index in inspector.get_indexes(table):
        found[str(index["name"])] = tuple(str(c) for c in index["column_names"])
    for unique in inspector.get_unique_constraints(table):
        found[str(unique["name"])] = tuple(str(c) for c in unique["column_names"])
    return found


def check_indexes(source: Source) -> Iterator[Finding]:
    for table, required in REQUIRED_INDEXES.items():
        present = _index_columns(source, table)
        for name, columns in required.items():
            # Any index leading with the same columns serves the query, whatever its name.
            if any(cols[: len(columns)] == columns for cols in present.values()):
                yield Finding(OK, f"index {table}.{name}", f"({', '.join(columns)})")
            else:
                yield Finding(WARN, f"index {table}.{name}", f"missing: without it {_INDEX_COST[(table, name)]}")


def check_feedback_index(config: Config, source: Source, clock: Callable[[], float] = time.time) -> Iterator[Finding]:
    """The feedback pass's index, which the agent's schema does not have: what it would save."""
    if not config.feedback.enabled:
        return
    what = "index diagnosis_run.updated_at"
    try:
        index = source.updated_at_index()
        if index is not None:
            yield Finding(OK, what, f"{index}: each feedback pass reads only the runs updated or exported since the pass before")
            return
        since = source.clock.naive(datetime.fromtimestamp(clock() - config.feedback.window_seconds, UTC))
        runs = max(source.max_run_id() - source.first_id_created_at_or_after(since) + 1, 0)
    except SourceError as exc:
        yield Finding(FAIL, what, f"cannot read the table's indexes or the feedback window: {exc}")
        return
    feedback = config.feedback
    rows = rows_a_pass(runs, feedback.interval_seconds, feedback.window_seconds)
    yield Finding(
        OK,
        what,
        f"none (optional): each feedback pass re-reads about {rows:,} of the {runs:,} runs in feedback.window_seconds, "
        f"the older ones less often; with `{UPDATED_AT_DDL}` it would read only the runs updated since the pass before "
        "(docs/operations.md, The feedback pass)",
    )
