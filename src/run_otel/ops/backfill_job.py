"""`run-otel backfill` from the plan to the outcome: probe the id range, export
it with a progress report, and on a stop say where to resume. The command line
renders what this returns."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from ..config import Config
from ..export.sinks import ExportError
from ..factory import build_backfill, build_parts, build_source, start_metrics
from ..mapping.span_data import trace_id_for
from ..pipeline.backfill import Plan, Window, order_warning, plan, probe_order, resume_hint
from ..pipeline.recorder import Recorder, Tee
from ..pipeline.results import PollResult
from ..source.clock import zone_finding
from ..source.reader import Source, SourceError
from .history_parts import build_history
from .metrics_history import MetricsRequest, Written, check_target, deliver, warn_step
from .metrics_push import Pushed, PushError

log = logging.getLogger(__name__)

# Given a label and the ids to read, a context that yields the function told (ids read, rate).
Progress = Callable[[str, int], AbstractContextManager[Callable[[int, str], None]]]


@dataclass
class BackfillOutcome:
    plan: Plan
    window: Window
    total: PollResult = field(default_factory=PollResult)
    read_to: int = 0  # every id up to here was read and its runs sent
    first_trace: str = ""
    last_trace: str = ""
    seconds: float = 0.0
    warning: str | None = None  # ids may be out of created_at order: runs may have been missed
    failure: str | None = None  # why it stopped early, with the resume line
    metrics: Written | Pushed | None = None  # the --metrics-out file or --metrics-push, when the backfill finished
    metrics_note: str | None = None  # why there is none

    def add(self, result: PollResult, cursor: int) -> None:
        self.read_to = cursor
        self.total.add(result)  # here, not from the pass's return: a failed backfill still reports what it sent
        if result.runs:
            self.first_trace = self.first_trace or trace_id_for(result.runs[0].run.run_id).hex()
            self.last_trace = trace_id_for(result.runs[-1].run.run_id).hex()


def run_backfill(
    config: Config,
    window: Window,
    ids: tuple[int | None, int | None, bool],
    with_metrics: bool,
    progress: Progress,
    workers: int = 1,
    metrics_out: MetricsRequest | None = None,
) -> BackfillOutcome:
    """``ids`` is (--from-id, --to-id, --full-scan); ``workers`` > 1 splits the range over processes.
    ``metrics_out`` also writes or pushes the exported runs' metrics history (one process only).
    Raises PushError when the push's receiver refuses the history's first sample, before any run is read."""
    if workers > 1:
        return _run_in_parts(config, window, ids, progress, workers)
    # The history first: a window it cannot cover fails before a metrics port is bound.
    history = build_history(config, window, metrics_out.seconds) if metrics_out else None
    if history is not None and metrics_out is not None:
        metrics_out = metrics_out.labelled(config.generate.job)
        warn_step(metrics_out)
        check_target(history, metrics_out)
    metrics, server = start_metrics(config) if with_metrics else (None, None)
    recorders: list[Recorder] = [r for r in (metrics, history) if r is not None]
    with build_parts(config, recorder=Tee(*recorders) if recorders else None) as parts:
        backfill = build_backfill(parts)
        ids_plan = plan(parts.source, window, *ids)
        shifted = shifted_window(parts.source, window)
        if shifted:
            log.warning(shifted)
        signal.signal(signal.SIGTERM, lambda *_: backfill.stop_requested.set())
        outcome = BackfillOutcome(ids_plan, window, read_to=ids_plan.first_id - 1)
        started = time.monotonic()
        error: Exception | None = None
        if not ids_plan.empty:
            label = f"backfill ids {ids_plan.first_id}..{ids_plan.last_id}"
            with progress(label, ids_plan.last_id - ids_plan.first_id + 1) as advance:

                def on_batch(result: PollResult, cursor: int) -> None:
                    outcome.add(result, cursor)
                    rate = outcome.total.spans / max(time.monotonic() - started, 1e-9)
                    advance(cursor - ids_plan.first_id + 1, f"{rate:,.0f} spans/s")

                try:
                    backfill.run(
                        ids_plan.first_id, ids_plan.last_id, on_batch, record_metrics=bool(recorders), created_in=window.contains
                    )
                except (SourceError, ExportError) as exc:  # what was sent stays sent: say where to resume
                    error = exc
        outcome.seconds = time.monotonic() - started
        # The order probes read the database; after a failure it may be away, and the resume line matters more.
        if error is None:
            outcome.warning = order_warning(outcome.total.outside_window, probe_order(ids_plan, parts.source))
        if shifted:
            outcome.warning = f"{shifted}{' ' + outcome.warning if outcome.warning else ''}"
        if server:
            server.stop()
        if metrics:
            metrics.shutdown()
        resume = resume_hint(outcome.read_to, ids_plan.last_id)
        if error is not None:
            outcome.failure = f"{error}; stopped after run id {outcome.read_to}: {resume}"
        elif backfill.stop_requested.is_set() and outcome.read_to < ids_plan.last_id:
            outcome.failure = f"stopped by SIGTERM after run id {outcome.read_to}: {resume}"
    if metrics_out is not None and outcome.failure is not None:
        done = "pushed to" if metrics_out.push_url else "written to"
        outcome.metrics_note = f"metrics: not {done} {metrics_out.target}: a history of part of the window reads as a drop"
    if history is not None and metrics_out is not None and outcome.failure is None:
        # A history of part of the window would read as a drop in traffic: only a finished backfill writes one.
        try:
            outcome.metrics = deliver(history, metrics_out, progress)
        except OSError as exc:  # a full disk, say: the traces are sent, only the file is missing
            outcome.failure = (
                f"the runs were sent, but the metrics history could not be written to {metrics_out.path} "
                f"({exc.strerror}); run the backfill again to write it"
            )
        except PushError as exc:  # the samples pushed again are the same: the receiver keeps them once
            outcome.failure = (
                f"the runs were sent, but the metrics history could not be pushed: {exc}; run the backfill again to push it whole"
            )
    return outcome


def shifted_window(source: Source, window: Window) -> str | None:
    """A window in time read under a wrong-looking source.timezone is shifted by its error:
    `--since 1h` would send runs hours old, or none. Said before anything is read."""
    if window.since is None and window.until is None:
        return None
    sample = source.clock_sample()
    finding = zone_finding(sample, source.clock) if sample else None
    if finding is None:
        return None
    return f"the window looks shifted: {finding.message(source.clock.zone_name)}; --since/--until are read in it."


def _run_in_parts(
    config: Config, window: Window, ids: tuple[int | None, int | None, bool], progress: Progress, workers: int
) -> BackfillOutcome:
    from .backfill_workers import Running, Tally

    source = build_source(config)
    try:
        ids_plan = plan(source, window, *ids)
        # Probed now, on the planning connection: after the parts, it would be one more connection to wait for.
        inversion = probe_order(ids_plan, source)
    finally:
        source.close()
    outcome = BackfillOutcome(ids_plan, window, read_to=ids_plan.first_id - 1)
    started = time.monotonic()
    if ids_plan.empty:  # probed bounds that found no id may have missed the window's runs, as one process says
        outcome.warning = order_warning(0, inversion)
        return outcome
    label = f"backfill ids {ids_plan.first_id}..{ids_plan.last_id}, {workers} workers"
    # Started before the progress bar, whose drawing thread would make a fork unsafe.
    try:
        running = Running(config, window, ids_plan, workers)
    except OSError as exc:  # the machine is out of processes or memory; the parts started are stopped
        resume = resume_hint(outcome.read_to, ids_plan.last_id)
        outcome.failure = f"could not start {workers} worker processes ({exc}); try fewer --workers: {resume}"
        return outcome
    log.debug("backfill: %d worker processes, started by %s", workers, running.method)
    with progress(label, ids_plan.last_id - ids_plan.first_id + 1) as advance:

        def on_progress(tally: Tally) -> None:
            rate = tally.total.spans / max(time.monotonic() - started, 1e-9)
            advance(tally.ids_read(), f"{rate:,.0f} spans/s")

        tally, stopped = running.wait(on_progress), running.stopped
    outcome.total, outcome.seconds = tally.total, time.monotonic() - started
    outcome.first_trace, outcome.last_trace = tally.first_trace(), tally.last_trace()
    unsent = tally.unsent()
    errors = tally.errors()
    if unsent is None:
        outcome.read_to = ids_plan.last_id
        outcome.warning = order_warning(outcome.total.outside_window, inversion)
        return outcome
    resume_from, resume_to, none_sent = unsent
    outcome.read_to = resume_from - 1
    resume = resume_hint(outcome.read_to, resume_to, none_sent)
    why = "; ".join(errors) if errors else ("stopped by SIGTERM" if stopped else "a worker stopped early")
    sent = f"; every id before {resume_from} was sent" if resume_from > ids_plan.first_id else ""
    outcome.failure = f"{why}{sent}: {resume}"
    return outcome
