"""`run-otel demo` from the seed to the traces: generate a workload, seed the
SQLite file, export it through the same poller as the daemon, and map the two
runs worth looking at. The command line renders what this returns."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ..config import Config
from ..export.sinks import Sink
from ..factory import build_demo_sink, build_parts, build_poller
from ..pipeline.recorder import Recorder
from ..pipeline.results import PollResult
from .demo import Workload, demo_config, generate, interesting_runs, seed_demo_database
from .show import RunTrace, run_traces


@dataclass
class DemoSetup:
    config: Config
    workload: Workload
    sink: Sink  # the OTLP endpoint when OTEL_EXPORTER_OTLP_ENDPOINT is set, else a JSON file


def prepare_demo(base: Config, db_path: Path, out_path: Path, runs: int, seed: int, anchor: datetime) -> DemoSetup:
    """Seeds ``db_path`` afresh, with a fresh state store beside it."""
    workload = generate(seed, runs, anchor)
    seed_demo_database(db_path, workload)
    state_path = db_path.with_name(db_path.name + ".state")
    state_path.unlink(missing_ok=True)
    config = demo_config(base, db_path, state_path)
    return DemoSetup(config, workload, build_demo_sink(config, out_path))


def export_demo(setup: DemoSetup, recorder: Recorder) -> PollResult:
    """One poll over the whole workload; the parts, the sink among them, are closed after it."""
    with build_parts(setup.config, recorder=recorder, sink=setup.sink) as parts:
        return build_poller(parts).poll()


def demo_traces(setup: DemoSetup) -> list[tuple[str, RunTrace]]:
    """A failed run and a RAG-heavy run, as `run-otel show` would print them."""
    titled = [
        (title, run_id) for title, run_id in zip(("a failed run", "a RAG-heavy run"), interesting_runs(setup.workload)) if run_id
    ]
    traces, _ = run_traces(setup.config, [run_id for _, run_id in titled])
    return [(title, trace) for (title, _), trace in zip(titled, traces) if trace is not None]


@dataclass
class DemoRun:
    setup: DemoSetup
    result: PollResult
    traces: list[tuple[str, RunTrace]]


def run_demo(
    base: Config,
    db_path: Path,
    out_path: Path,
    counts: tuple[int, int],
    anchor: datetime,
    exporting: Callable[[DemoSetup], AbstractContextManager[Recorder]],
) -> DemoRun:
    """``counts`` is (runs, seed); ``exporting`` shows the export's progress, through the Recorder it gives."""
    runs, seed = counts
    setup = prepare_demo(base, db_path, out_path, runs, seed, anchor)
    with exporting(setup) as recorder:
        result = export_demo(setup, recorder)
    return DemoRun(setup, result, demo_traces(setup))
