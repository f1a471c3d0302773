"""Sending now, beside the daemon's schedule: `run-otel once` (one poll and one feedback pass)
and `run-otel export RUN_ID...` (those runs, whatever the checkpoint says)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..config import Config
from ..mapping.span_data import identity_for
from ..pipeline.feedback import FeedbackResult
from ..pipeline.results import PollResult
from ..pipeline.run_export import RunExporter
from ..source.reader import Source
from ..source.rows import RunRow, is_terminal


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
        # Every row with the run id, where the schema lets several have it: each goes out as the duplicate rule says.
        pks = exporter.shapes.duplicates.row_ids(run_id)
        rows = source.runs_by_ids(pks) if pks is not None else [row for row in [source.run_by_run_id(run_id)] if row]
        if not rows:
            unknown.append(run_id)
        for run in rows:
            if is_terminal(run.status) or incomplete:
                runs.append(run)
            elif run_id not in waiting:
                waiting.append(run_id)
    result = exporter.export(runs, {r.id for r in runs if not is_terminal(r.status)}) if runs else None
    sent = [(e.run.run_id, (e.identity or identity_for(e.run.run_id)).trace_id.hex()) for e in (result.runs if result else [])]
    return ExportOutcome(sent, waiting, unknown, result.spans if result else 0)
