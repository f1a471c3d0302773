"""`run-otel check`: is this deployment set up right? One verdict per line."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from sqlalchemy import inspect, text
from sqlalchemy.exc import SQLAlchemyError

from ..config import Config, ConfigError
from ..export.sinks import ExportError
from ..export.transport import transport_warnings
from ..factory import build_probe_sink, build_source, build_store
from ..mapping.feedback_vocab import unmapped_in_window
from ..pipeline.checkpoint import CheckpointError
from ..sharding import shard_from_name
from ..source.clock import zone_finding
from ..source.columns import columns_read
from ..source.password_file import readable_by_others
from ..source.reader import Source, SourceError
from ..source.schema import REQUIRED_INDEXES, documented_types

OK, WARN, FAIL = "ok", "warn", "fail"

_INDEX_COST = {
    ("diagnosis_run", "PRIMARY"): "every poll scans diagnosis_run",
    ("diagnosis_run", "run_id"): "`run-otel show` scans diagnosis_run",
    ("tool_invocation", "PRIMARY"): "tool rows have no stable order",
    ("tool_invocation", "idx_tool_invocation_run_id"): "every poll scans the whole tool_invocation table once per chunk of runs",
}
_WRITE_PRIVILEGES = ("ALL PRIVILEGES", "INSERT", "UPDATE", "DELETE", "CREATE", "DROP", "ALTER", "INDEX", "SUPER", "FILE")


@dataclass(frozen=True)
class Finding:
    level: str
    what: str
    detail: str = ""


def run_checks(config: Config) -> Iterator[Finding]:
    yield Finding(OK, "config", "valid")
    if config.source.password_file and (exposed := readable_by_others(config.source.password_file)):
        yield Finding(WARN, "source.password_file", exposed)
    try:
        source = build_source(config)
    except ConfigError as exc:  # a driver that SQLAlchemy does not know, or that is not installed
        yield Finding(FAIL, "source.url", str(exc))
        yield from _check_endpoint(config)
        return
    try:
        with source.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except (SQLAlchemyError, SourceError) as exc:  # SourceError: the password file went unreadable
        yield Finding(FAIL, "database", f"{source.describe()} unreachable: {getattr(exc, 'orig', exc)}")
        yield from _check_endpoint(config)
        return
    yield Finding(OK, "database", f"{source.describe()} reachable")
    try:
        yield from _check_columns(config, source)
        yield from _check_column_types(config, source)
        yield from _check_evidence(source)
        yield from _check_indexes(source)
        yield from _check_privileges(source)
        yield from _check_timezone(config, source)
        yield from _check_feedback_values(config, source)
        yield from _check_checkpoint_ahead(config, source)
    finally:
        source.close()
    yield from _check_state(config)
    yield from _check_endpoint(config)


def _check_columns(config: Config, source: Source) -> Iterator[Finding]:
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


def _check_column_types(config: Config, source: Source) -> Iterator[Finding]:
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


def _check_evidence(source: Source) -> Iterator[Finding]:
    if not source.summarizes_evidence():
        return
    try:
        source.probe_tool_select()
    except SourceError as exc:
        yield Finding(FAIL, "source.evidence_in_database", str(exc))
        return
    yield Finding(OK, "source.evidence_in_database", "the database summarizes retrieval_details; evidence text stays there")


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


def _check_indexes(source: Source) -> Iterator[Finding]:
    for table, required in REQUIRED_INDEXES.items():
        present = _index_columns(source, table)
        for name, columns in required.items():
            # Any index leading with the same columns serves the query, whatever its name.
            if any(cols[: len(columns)] == columns for cols in present.values()):
                yield Finding(OK, f"index {table}.{name}", f"({', '.join(columns)})")
            else:
                yield Finding(WARN, f"index {table}.{name}", f"missing: without it {_INDEX_COST[(table, name)]}")


def _check_privileges(source: Source) -> Iterator[Finding]:
    if source.engine.dialect.name != "mysql":
        yield Finding(OK, "privileges", f"not checked on {source.engine.dialect.name}")
        return
    with source.engine.connect() as conn:
        grants = [row[0] for row in conn.execute(text("SHOW GRANTS FOR CURRENT_USER()"))]
        database = conn.execute(text("SELECT DATABASE()")).scalar()
    writes: set[str] = set()
    wide: list[str] = []
    for grant in grants:
        match = re.match(r"GRANT (.+?) ON (\S+) TO", grant)
        if not match:
            continue
        privileges, target = match.group(1).upper(), match.group(2).replace("`", "")
        if privileges == "USAGE":
            continue
        writes.update(p for p in _WRITE_PRIVILEGES if p in privileges)
        table = target.split(".")[-1]
        if table not in ("diagnosis_run", "tool_invocation"):
            wide.append(target)
    if writes:
        yield Finding(WARN, "privileges", f"the user can write ({', '.join(sorted(writes))}); run-otel needs SELECT only")
    if wide:
        yield Finding(WARN, "privileges", f"the user can read beyond the two tables ({', '.join(sorted(set(wide)))})")
    if not writes and not wide:
        yield Finding(OK, "privileges", f"SELECT only, on {database}.diagnosis_run and {database}.tool_invocation")


def _check_timezone(config: Config, source: Source) -> Iterator[Finding]:
    try:
        sample = source.clock_sample()
    except SourceError as exc:
        yield Finding(FAIL, "source.timezone", f"cannot read the newest run: {exc}")
        return
    if sample is None:
        yield Finding(OK, "source.timezone", f"{config.source.timezone}: no runs yet to compare")
        return
    finding = zone_finding(sample, source.clock)
    if finding:
        yield Finding(WARN, "source.timezone", finding.message(config.source.timezone))
    else:
        yield Finding(
            OK, "source.timezone", f"{config.source.timezone}: the newest run (id {sample.run_id}) fits the database's clock"
        )


def _check_feedback_values(config: Config, source: Source) -> Iterator[Finding]:
    if not config.feedback.enabled:
        return
    try:
        rated, unmapped = unmapped_in_window(config.feedback, source, source.clock)
    except SourceError as exc:
        yield Finding(FAIL, "feedback values", f"cannot read the feedback window: {exc}")
        return
    window = f"{config.feedback.window_seconds / 3600:g}h"
    if not unmapped:
        yield Finding(OK, "feedback values", f"{rated} rated run(s) in the last {window}, every value mapped")
        return
    named = ", ".join(f"{value!r} ({count})" for value, count in unmapped.most_common(20))
    yield Finding(
        WARN,
        "feedback values",
        f"{sum(unmapped.values())} of {rated} rated run(s) in the last {window} carry values that feedback.scores and "
        f'feedback.negative do not map, so they count as "other" and never in the negative-feedback alert: {named}',
    )


def _check_state(config: Config) -> Iterator[Finding]:
    try:
        store = build_store(config)
        saved = store.load()
        store.close()
    except (CheckpointError, ConfigError) as exc:
        yield Finding(FAIL, "state store", str(exc))
        return
    where = "no checkpoint yet" if saved is None else f"checkpoint at run id {saved.high_water}"
    yield Finding(OK, "state store", f"{store.describe()}: {where}")


def _check_checkpoint_ahead(config: Config, source: Source) -> Iterator[Finding]:
    """Every shard's high-water mark against the newest run id: above it, the source went backwards."""
    from ..pipeline.guard import behind_message

    try:
        store = build_store(config, create=False)
    except (CheckpointError, ConfigError):
        return  # no store yet: the state store check says so
    try:
        shards = store.load_all()
        newest = source.max_run_id() if shards else 0
    except (CheckpointError, SourceError):
        return  # reported by the state store and database checks
    finally:
        store.close()
    for name, checkpoint, saved_at in shards:
        if checkpoint.high_water > newest:
            shard = shard_from_name(name) or config.shard
            where = f"{name} in {store.describe()}"
            detail = behind_message(where, checkpoint.high_water, newest, source.describe(), shard, saved_at)
            yield Finding(FAIL, "checkpoint ahead of the source", detail)
        else:
            yield Finding(OK, f"checkpoint {name}", f"high-water id {checkpoint.high_water}, the newest run is id {newest}")


def _check_endpoint(config: Config) -> Iterator[Finding]:
    for warning in transport_warnings(config.export, config.export.resolved_endpoint()):
        yield Finding(WARN, "otlp transport", warning)
    sink = build_probe_sink(config)
    try:
        # An empty request is valid OTLP: it proves the endpoint speaks it, and exports nothing.
        sink.send(ExportTraceServiceRequest().SerializeToString())
        yield Finding(OK, "otlp endpoint", f"{sink.describe()} accepted an empty export")
    except ExportError as exc:
        yield Finding(FAIL, "otlp endpoint", str(exc))
    finally:
        sink.close()
