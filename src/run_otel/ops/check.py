"""`run-otel check`: is this deployment set up right? One verdict per line."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from ..config import Config, ConfigError, SourceConfig, StateConfig
from ..export.sinks import ExportError
from ..export.transport import transport_warnings
from ..factory import build_probe_sink, build_source, build_store
from ..mapping.feedback_vocab import unmapped_in_window
from ..pipeline.state_store import StateStoreError
from ..sharding import shard_from_name
from ..source.clock import zone_finding
from ..source.errors import connect_failure
from ..source.password_file import readable_by_others
from ..source.reader import Source, SourceError
from .check_rows import row_shape_findings
from .check_schema import FAIL, OK, WARN, Finding, check_column_types, check_columns, check_feedback_index, check_indexes

__all__ = ["FAIL", "OK", "WARN", "Finding", "run_checks"]

_WRITE_PRIVILEGES = ("ALL PRIVILEGES", "INSERT", "UPDATE", "DELETE", "CREATE", "DROP", "ALTER", "INDEX", "SUPER", "FILE")


def run_checks(config: Config, clock: Callable[[], float] = time.time) -> Iterator[Finding]:
    """Each check's verdict; reads only: no store, file or table is created, whatever the
    config points at. ``clock`` is this host's, which the database's is compared with."""
    yield Finding(OK, "config", "valid")
    if config.source.password_file and (exposed := readable_by_others(config.source.password_file)):
        yield Finding(WARN, "source.password_file", exposed)
    yield from _check_demo_defaults(config)
    missing = _missing_sqlite_file(config.source.url)
    if missing:
        yield Finding(FAIL, "source.url", f"no SQLite database at {missing} (check creates none)")
        yield from _check_state(config)
        yield from _check_endpoint(config)
        return
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
        yield Finding(FAIL, "database", f"{source.describe()} {connect_failure(exc, config.source.password_file)}")
        yield from _check_endpoint(config)
        return
    yield Finding(OK, "database", f"{source.describe()} reachable")
    try:
        yield from check_columns(config, source)
        yield from check_column_types(config, source)
        yield from _check_evidence(source)
        yield from check_indexes(source)
        yield from check_feedback_index(config, source, clock)
        yield from _check_privileges(source)
        yield from _check_timezone(config, source)
        yield from _check_clock(config, source, clock)
        yield from _check_feedback_values(config, source)
        yield from _check_checkpoint_ahead(config, source)
        yield from (Finding(*finding) for finding in row_shape_findings(config, source))
    finally:
        source.close()
    yield from _check_state(config)
    yield from _check_endpoint(config)


def _check_demo_defaults(config: Config) -> Iterator[Finding]:
    """The defaults are the demo's SQLite files in the working directory: right for `run-otel demo`, never for a deployment."""
    if config.source.url == SourceConfig().url:
        yield Finding(WARN, "source.url", f"still the demo's default ({config.source.url}): set it to the agent's MySQL database")
    if config.state.url == StateConfig().url:
        yield Finding(
            WARN,
            "state.url",
            f"still the default ({config.state.url}), a file relative to the working directory: set an absolute "
            "path such as sqlite:////var/lib/run-otel/state.db, or a database URL",
        )


def _missing_sqlite_file(url: str) -> str:
    """The file a SQLite URL names when it does not exist (connecting would create it), else ""."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return ""
    return "" if Path(parsed.database or "").is_file() else str(parsed.database)


def _check_evidence(source: Source) -> Iterator[Finding]:
    if not source.summarizes_evidence():
        return
    try:
        source.probe_tool_select()
    except SourceError as exc:
        yield Finding(FAIL, "source.evidence_in_database", str(exc))
        return
    yield Finding(OK, "source.evidence_in_database", "the database summarizes retrieval_details; evidence text stays there")


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


# NTP keeps synchronized hosts within milliseconds, and one round trip adds less than this: an
# offset above it is a broken time sync, and it moves every span against the host's own logs.
CLOCK_OFFSET_WARN_SECONDS = 1.0


def _check_clock(config: Config, source: Source, clock: Callable[[], float]) -> Iterator[Finding]:
    """The database's clock against this host's. From poll.settle_seconds (default 2 s) up, an
    offset used to hold every run for the offset: the poll now measures it, but it still shows."""
    try:
        offset = source.clock_offset(clock)
    except SourceError as exc:
        yield Finding(FAIL, "database clock", f"cannot read UTC_TIMESTAMP(): {exc}")
        return
    if offset is None:
        return  # SQLite reads this host's clock
    limit = max(CLOCK_OFFSET_WARN_SECONDS, min(config.poll.settle_seconds, 5.0))
    where = "ahead of" if offset > 0 else "behind"
    if abs(offset) > limit:
        yield Finding(
            WARN,
            "database clock",
            f"{abs(offset):.1f}s {where} this host's (over {limit:g}s): the spans' times are the database's, so they "
            "sit that far from this host's logs and metrics; fix the time sync (NTP) of the one that is wrong",
        )
    else:
        yield Finding(OK, "database clock", f"{abs(offset):.2f}s {where} this host's")


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
    missing = _missing_sqlite_file(config.state.url)
    if missing:
        folder = Path(missing).absolute().parent
        if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
            yield Finding(FAIL, "state store", f"{missing} does not exist, and {folder} is not a directory run-otel can write")
        else:
            yield Finding(OK, "state store", f"{missing} does not exist yet: `run-otel run` creates it in {folder}")
        return
    try:
        store = build_store(config, create=False)
        saved = store.load()
        store.close()
    except (StateStoreError, ConfigError) as exc:
        level = OK if "has no checkpoint table yet" in str(exc) else FAIL
        yield Finding(level, "state store", f"{exc}: `run-otel run` creates it" if level == OK else str(exc))
        return
    where = "no checkpoint yet" if saved is None else f"checkpoint at run id {saved.high_water}"
    yield Finding(OK, "state store", f"{store.describe()}: {where}")


def _check_checkpoint_ahead(config: Config, source: Source) -> Iterator[Finding]:
    """Every shard's high-water mark against the newest run id: above it, the source went backwards."""
    from ..pipeline.guard import behind_message

    try:
        store = build_store(config, create=False)
    except (StateStoreError, ConfigError):
        return  # no store yet: the state store check says so
    try:
        shards = store.load_all()
        newest = source.max_run_id() if shards else 0
    except (StateStoreError, SourceError):
        return  # reported by the state store and database checks
    finally:
        store.close()
    next_id = source.next_run_id() if any(c.high_water > newest for _n, c, _s in shards) else None
    for name, checkpoint, saved_at in shards:
        if checkpoint.high_water > newest and next_id is not None and next_id > checkpoint.high_water:
            detail = f"the newest runs (ids {newest + 1}..{checkpoint.high_water}) were deleted; AUTO_INCREMENT is at {next_id}"
            yield Finding(OK, f"checkpoint {name}", f"high-water id {checkpoint.high_water}; {detail}, so no id is reused")
        elif checkpoint.high_water > newest:
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
