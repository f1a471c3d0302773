"""Seeing and steering a deployment: `once`, `status`, `rewind`, `export`, `show`, `health` and `generate`.

Each gets its parts from the factory, closes them, and returns plain values;
the CLI renders them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from ..config import Config
from ..mapping.span_data import MappedRun, trace_id_for
from ..pipeline.checkpoint import Checkpoint, CheckpointStore
from ..pipeline.feedback import FeedbackResult
from ..pipeline.named_lock import lock_holder
from ..pipeline.results import PollResult
from ..pipeline.run_export import RunExporter
from ..source.reader import Backlog, Source
from ..source.readings import read_run, read_tool
from ..source.rows import RunRow, is_terminal


class Refused(RuntimeError):
    """An operation that would fight another instance, or has nothing to work on."""


def once(config: Config, report: Callable[[PollResult], None]) -> tuple[PollResult, FeedbackResult | None]:
    """One poll, then one feedback pass, under the store lock; ``report`` hears the poll's result before
    the feedback pass starts, so it is shown even when that pass fails."""
    from ..factory import build_feedback, build_parts, build_poller, build_store_lock

    # The lock first: a `once` beside a running daemon would export everything twice.
    with build_store_lock(config), build_parts(config) as parts:
        result = build_poller(parts).poll()
        report(result)
        feedback = build_feedback(parts)
        return result, feedback.run() if feedback else None


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


@dataclass(frozen=True)
class Status:
    shards: list[ShardStatus]
    state_store: str
    source: str


def status(config: Config) -> Status:
    """Reads only: a state store that does not exist is an error, never created."""
    from ..factory import build_source, build_store

    store = build_store(config, create=False)
    try:
        source = build_source(config)
        try:
            return Status(shard_statuses(store, source), store.describe(), source.describe())
        finally:
            source.close()
    finally:
        store.close()


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
        taken_over={i for i in checkpoint.taken_over if i <= keep},
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
    from ..factory import lease_name

    return lock_holder(source.engine, lease_name(config))


def rewind(config: Config, first: int | datetime, force: bool, confirm: Callable[[str], bool]) -> str | None:
    """Moves the checkpoint so the next poll reads run id ``first`` (or the first run created at
    ``first``) again; None when ``confirm`` declined. Refused while another instance holds the HA
    lease or the store, unless ``force``."""
    from ..factory import build_source, build_store, build_store_lock

    source = build_source(config)
    try:
        holder = lease_holder(config, source)
        if holder and not force:
            raise Refused(
                f"another instance (connection {holder}) holds the HA lease "
                "and would overwrite the checkpoint; stop it, or use --force"
            )
        store = build_store(config, create=False)
        try:
            lock = build_store_lock(config)
            if not lock.acquire() and not force:
                raise Refused(
                    f"{lock.in_use()}, which would save its own checkpoint over this one; stop it first, or use --force"
                )
            try:
                return _rewind(store, source, first, confirm)
            finally:
                lock.release()
        finally:
            store.close()
    finally:
        source.close()


def _rewind(store: CheckpointStore, source: Source, first: int | datetime, confirm: Callable[[str], bool]) -> str | None:
    current = store.load()
    if current is None:
        raise Refused(f"no checkpoint for {store.name} in {store.describe()}: set poll.start_from instead")
    first_id = first if isinstance(first, int) else source.first_id_created_at_or_after(source.clock.naive(first))
    newest = source.max_run_id()
    if first_id - 1 > max(newest, current.high_water):
        # Past every run written: each run the agent writes until then would be skipped, never sent.
        raise Refused(f"run id {first_id} is past the newest run id {newest}: the runs written until then would be skipped")
    skipped = first_id - 1 - current.high_water
    if skipped > 0:
        direction = f"forward, skipping {skipped} run id(s) that are then never exported,"
    else:
        direction = "back" if skipped < 0 else "nowhere"
    if not confirm(
        f"move {store.name} in {store.describe()} {direction} from high-water id {current.high_water} so the next poll "
        f"exports from run id {first_id}?"
    ):
        return None
    store.save(rewound(current, first_id), time.time())
    return rewind_line(store.name, current.high_water, first_id)


@dataclass
class ExportOutcome:
    sent: list[tuple[str, str]]  # (run_id, trace id)
    waiting: list[str]  # run_ids not finished, not sent without --incomplete
    unknown: list[str]
    spans: int


def export_runs(config: Config, run_ids: Sequence[str], incomplete: bool) -> ExportOutcome:
    """Sends ``run_ids`` now, whatever the checkpoint says; it is not moved."""
    from ..factory import build_exporter, build_parts

    with build_parts(config) as parts:
        return export_run_ids(parts.source, build_exporter(parts), run_ids, incomplete)


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


def run_traces(config: Config, run_ids: Sequence[str]) -> tuple[list[RunTrace | None], str]:
    """The spans each run maps to (None for a run_id no run has), and the source they were read from."""
    from ..factory import build_source

    source = build_source(config)
    try:
        return [run_trace(config, source, run_id) for run_id in run_ids], source.describe()
    finally:
        source.close()


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


def health(config: Config, live: bool) -> tuple[str, bool, str]:
    """(the URL asked, answered 200, what it answered): /healthz when ``live``, else /readyz."""
    url = probe_url(config.metrics.host, config.metrics.port, "/healthz" if live else "/readyz")
    healthy, why = probe(url)
    return url, healthy, why


def generate_files(config: Config, directory: Path) -> tuple[list[Path], list[str]]:
    """(the files written into ``directory``, the settings plausibly wrong for a real stack), from
    [generate], [slo] and the feedback labels. Raises ImportError without the generate extra."""
    from ..generate.artifacts import write
    from ..generate.stack import stack_of, warnings

    stack = stack_of(config.generate, config.slo, config.feedback)
    return write(directory, stack), warnings(stack)


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
