"""`run-otel show`: the spans a run maps to, as they would be exported."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..config import Config
from ..mapping.span_data import MappedRun
from ..source.reader import Source
from ..source.readings import read_rows
from ..source.rows import RunRow


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
    run, tools = read_rows(row, source.tools_for([row.run_id]).get(row.run_id, []), warnings)
    mapped = build_mapper(config, source.clock).map_run(run, tools)
    return RunTrace(run, mapped, warnings + mapped.warnings)
