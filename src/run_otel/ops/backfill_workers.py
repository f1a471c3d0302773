"""`run-otel backfill --workers N`: the id range in N contiguous parts, one process each.

Mapping and encoding hold Python's interpreter lock, so one process uses one core;
N processes use N. Each part is read in id order, as a single backfill reads it,
and sends the same bytes. The processes report each batch to this one, which
draws one progress bar and adds up the totals. On a stop or a failure the resume
line starts at the first id any part left unsent: ids after it that a later part
already sent are sent again, byte-identical, as at-least-once allows.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queues
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any, Literal

from ..config import Config
from ..export.sinks import ExportError
from ..factory import build_backfill, build_parts
from ..mapping.masking import Scrubber, configured_secrets
from ..mapping.span_data import trace_id_for
from ..pipeline.backfill import Plan, Window
from ..pipeline.results import PollResult
from ..source.reader import SourceError
from ..telemetry.logs import configure_logging, scrub_output


def split(plan: Plan, workers: int) -> list[tuple[int, int]]:
    """Contiguous parts of about equal length, in id order; never an empty one."""
    size = plan.last_id - plan.first_id + 1
    count = max(1, min(workers, size))
    bounds = [plan.first_id + size * k // count for k in range(count + 1)]
    return [(bounds[k], bounds[k + 1] - 1) for k in range(count)]


@dataclass
class _Part:
    first_id: int
    last_id: int
    read_to: int
    first_run: str = ""
    last_run: str = ""
    done: bool = False
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.done and self.error is None and self.read_to >= self.last_id


@dataclass
class Tally:
    """What the parts reported, added up."""

    parts: list[_Part]
    total: PollResult = field(default_factory=PollResult)

    def ids_read(self) -> int:
        return sum(part.read_to - part.first_id + 1 for part in self.parts)

    def first_trace(self) -> str:
        first = next((part.first_run for part in self.parts if part.first_run), "")
        return trace_id_for(first).hex() if first else ""

    def last_trace(self) -> str:
        last = next((part.last_run for part in reversed(self.parts) if part.last_run), "")
        return trace_id_for(last).hex() if last else ""

    def resume_from(self) -> int | None:
        """The first id a part left unsent; None when every part finished."""
        unsent = [part.read_to + 1 for part in self.parts if not part.finished]
        return min(unsent) if unsent else None

    def errors(self) -> list[str]:
        return [f"ids {p.first_id}..{p.last_id}: {p.error}" for p in self.parts if p.error]


def start_method() -> Literal["fork", "spawn"]:
    """How the parts' processes start: forked when that is safe, spawned otherwise.

    This process has already imported the whole pipeline, so a forked part starts in
    milliseconds where a spawned one spends about a second of CPU importing it again,
    on each core, before its first read. Fork is safe here because nothing is open to
    share: the plan's connection is closed before the parts start, no gRPC channel exists
    yet, and no other thread runs, so no lock can be inherited held. With another thread
    running (an embedding program's), the parts are spawned instead."""
    if "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1:
        return "fork"
    return "spawn"


class Running:
    """The parts' processes, started; :meth:`wait` follows them to the end."""

    def __init__(self, config: Config, window: Window, plan: Plan, workers: int) -> None:
        self.method = start_method()
        context = multiprocessing.get_context("fork") if self.method == "fork" else multiprocessing.get_context("spawn")
        self._reports: Any = context.Queue()
        self.tally = Tally([_Part(first, last, first - 1) for first, last in split(plan, workers)])
        self._processes: list[BaseProcess] = [
            context.Process(target=_work, args=(config, window, k, part.first_id, part.last_id, self._reports), daemon=True)
            for k, part in enumerate(self.tally.parts)
        ]
        self.stopped = False
        self._owner = os.getpid()
        self._previous = signal.signal(signal.SIGTERM, self._stop)
        try:
            for process in self._processes:
                process.start()
        except BaseException:  # out of processes or memory: none of the parts may run on alone
            self._stop()
            signal.signal(signal.SIGTERM, self._previous)
            raise

    def _stop(self, *_args: object) -> None:
        if os.getpid() != self._owner:
            return  # a forked part before it sets its own handler
        self.stopped = True
        for process in self._processes:
            if process.is_alive():
                process.terminate()  # SIGTERM: the part finishes its batch and reports where it stopped

    def wait(self, on_progress: Callable[[Tally], None]) -> Tally:
        """Runs the parts to the end; :attr:`stopped` then says whether a SIGTERM stopped them."""
        tally = self.tally
        try:
            while not all(part.done for part in tally.parts):
                try:
                    message = self._reports.get(timeout=1.0)
                except queues.Empty:
                    _notice_deaths(tally, self._processes, self._reports)
                    continue
                _apply(tally, message)
                on_progress(tally)
        finally:
            signal.signal(signal.SIGTERM, self._previous)
            for process in self._processes:
                process.join(timeout=10)
        return tally


def _apply(tally: Tally, message: tuple) -> None:
    kind, k, *rest = message
    part = tally.parts[k]
    if kind == "batch":
        cursor, counts, first_run, last_run = rest
        part.read_to = cursor
        part.first_run = part.first_run or first_run
        part.last_run = last_run or part.last_run
        tally.total.add(PollResult(**counts))
    else:
        part.done, part.error = True, rest[0]


def _notice_deaths(tally: Tally, processes: list[BaseProcess], reports: Any) -> None:
    """A part whose process ended without a word (killed, out of memory) failed where it was."""
    ended = [k for k, process in enumerate(processes) if not tally.parts[k].done and process.exitcode is not None]
    if not ended:
        return
    while True:  # what an ended process sent before it ended is still to be read
        try:
            _apply(tally, reports.get(timeout=0.5))
        except queues.Empty:
            break
    for k in ended:
        part = tally.parts[k]
        if not part.done:
            part.done, part.error = True, f"the worker process exited with code {processes[k].exitcode}"


def _work(config: Config, window: Window, k: int, first_id: int, last_id: int, reports: Any) -> None:
    """One part, in its own process: the same pass a single backfill runs."""
    scrubber = Scrubber.for_secrets(configured_secrets(config.export, config.source, config.state))
    configure_logging(config.log, scrub_output(scrubber))
    parts = build_parts(config)  # closed below, once the part's last batch is sent
    backfill = build_backfill(parts)
    signal.signal(signal.SIGTERM, lambda *_: backfill.stop_requested.set())

    def on_batch(result: PollResult, cursor: int) -> None:
        runs = result.runs
        counts = {
            "run_count": result.run_count,
            "spans": result.spans,
            "rejected_spans": result.rejected_spans,
            "dropped_spans": result.dropped_spans,
            "warnings": result.warnings,
            "outside_window": result.outside_window,
            "in_flight": result.in_flight,
        }
        reports.put(("batch", k, cursor, counts, runs[0].run.run_id if runs else "", runs[-1].run.run_id if runs else ""))

    error = None
    try:
        backfill.run(first_id, last_id, on_batch, created_in=window.contains)
    except (SourceError, ExportError) as exc:
        error = str(exc)
    finally:
        parts.close()
    reports.put(("done", k, error))
    reports.close()
    reports.join_thread()  # the queue's feeder thread has written every report before the process exits
