"""Seeing and steering a deployment: `status`, `rewind` and `export`.

Each returns plain values; the CLI renders them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from sqlalchemy import text

from ..config import Config
from ..mapping.span_data import MappedRun, trace_id_for
from ..pipeline.checkpoint import Checkpoint, CheckpointStore
from ..pipeline.run_export import RunExporter
from ..source.reader import Backlog, Source
from ..source.readings import read_run, read_tool
from ..source.rows import RunRow, is_terminal
from .lease import lease_name_for


@dataclass(frozen=True)
class ShardStatus:
    shard: str
    high_water_id: int
    newest_id: int
    lag_runs: int  # ids between the high-water mark and the newest run
    lag_seconds: float | None  # newest created_at minus the high-water run's created_at
    pending_runs: int
    gaps: int
    saved_at: float
    state_store: str
    ahead_runs: int = 0  # ids the high-water mark is above the newest run: the source went backwards

    def as_dict(self) -> dict:
        return asdict(self)


def shard_statuses(store: CheckpointStore, source: Source) -> list[ShardStatus]:
    out = []
    for name, checkpoint, saved_at in store.load_all():
        backlog = source.backlog(checkpoint.high_water, source.clock) or Backlog(0, 0, None)
        out.append(
            ShardStatus(
                shard=name,
                high_water_id=checkpoint.high_water,
                newest_id=backlog.newest_id,
                lag_runs=backlog.runs,
                lag_seconds=backlog.seconds,
                pending_runs=len(checkpoint.pending),
                gaps=len(checkpoint.gaps),
                saved_at=saved_at,
                state_store=store.describe(),
                ahead_runs=max(checkpoint.high_water - backlog.newest_id, 0),
            )
        )
    return out


def rewound(checkpoint: Checkpoint, first_id: int) -> Checkpoint:
    """The checkpoint from which the next poll reads ``first_id`` and everything after it again."""
    keep = first_id - 1
    return Checkpoint(
        high_water=keep,
        pending={i: seen for i, seen in checkpoint.pending.items() if i <= keep},
        gaps={i: seen for i, seen in checkpoint.gaps.items() if i <= keep},
        # Back: the runs from first_id are sent again, so their ratings follow. Forward: the runs
        # skipped are never sent, and a rating alone would open a trace with no run in it.
        start_mark=min(checkpoint.start_mark, keep) if keep <= checkpoint.high_water else keep,
    )


def rewind_line(shard: str, high_water: int, first_id: int) -> str:
    """What a rewind did; one forward skips runs instead of re-sending them."""
    moved = f"high-water id {high_water} -> {first_id - 1}; the next poll exports run ids from {first_id}."
    if first_id - 1 > high_water:
        skipped = f"{high_water + 1}" if first_id - 1 == high_water + 1 else f"{high_water + 1}..{first_id - 1}"
        return f"moved {shard} forward: {moved} Run ids {skipped} are skipped: they are never exported."
    if first_id - 1 == high_water:
        return f"{shard} unchanged: {moved}"
    return f"rewound {shard}: {moved} Runs already sent arrive again, byte-identical, and backends show them once."


def lease_holder(config: Config, source: Source) -> int | None:
    """The connection id holding this shard's HA lease, if another instance runs."""
    if not config.ha.enabled or source.engine.dialect.name != "mysql":
        return None
    name = lease_name_for(config)
    with source.engine.connect() as conn:
        return conn.execute(text("SELECT IS_USED_LOCK(:name)"), {"name": name}).scalar()


@dataclass
class ExportOutcome:
    sent: list[tuple[str, str]]  # (run_id, trace id)
    waiting: list[str]  # run_ids not finished, not sent without --incomplete
    unknown: list[str]
    spans: int


def export_run_ids(source: Source, exporter: RunExporter, run_ids: Sequence[str], incomplete: bool) -> ExportOutcome:
    runs: list[RunRow] = []
    waiting, unknown = [], []
    for run_id in dict.fromkeys(run_ids):
        run = source.run_by_run_id(run_id)
        if run is None:
            unknown.append(run_id)
        elif is_terminal(run.status) or incomplete:
            runs.append(run)
        else:
            waiting.append(run_id)
    result = exporter.export(runs, {r.id for r in runs if not is_terminal(r.status)}) if runs else None
    sent = [(r.run_id, trace_id_for(r.run_id).hex()) for r in runs]
    return ExportOutcome(sent, waiting, unknown, result.spans if result else 0)


@dataclass
class RunTrace:
    """A run as `run-otel show` prints it: the spans it would be exported as."""

    run: RunRow
    mapped: MappedRun
    warnings: list[str]  # the row's and the mapping's


def run_trace(config: Config, source: Source, run_id: str) -> RunTrace | None:
    """The spans ``run_id`` maps to; None when no run has that run_id."""
    row = source.run_by_run_id(run_id)
    if row is None:
        return None
    from ..factory import build_mapper  # the factory imports the metrics: keep `show` light

    warnings: list[str] = []
    run = read_run(row, warnings)
    tools = [read_tool(tool, warnings) for tool in source.tools_for([run.run_id])[run.run_id]]
    mapped = build_mapper(config, source.clock).map_run(run, tools)
    return RunTrace(run, mapped, warnings + mapped.warnings)


def probe_url(host: str, port: int, path: str) -> str:
    """The URL that reaches the metrics server from the same host: a wildcard bind is
    reached on loopback."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"


def probe(url: str, timeout: float = 3.0) -> tuple[bool, str]:
    """(answered 200, what it answered): never raises, never waits past the timeout."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status == 200, f"{reply.status} {reply.read(200).decode(errors='replace').strip()}"
    except urllib.error.HTTPError as error:
        return False, f"{error.code} {error.read(200).decode(errors='replace').strip()}"
    except (OSError, ValueError) as error:
        return False, f"no answer: {getattr(error, 'reason', error)}"
