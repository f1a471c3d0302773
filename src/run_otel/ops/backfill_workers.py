"""`run-otel backfill --workers N`: the id range in pieces, N processes taking them in turn.

Mapping and encoding hold Python's interpreter lock, so one process uses one core;
N processes use N. The range is cut into contiguous pieces, large first and down to
a quarter batch; each process takes the next piece when its reads reach the end of
the last, in one pass, so the processes end within a small piece of each other
whatever slowed one of them (a busy core, the database). Each piece is read in id
order, as a single backfill reads it, and sends the same bytes. The processes report
each batch to this one, which draws one progress bar and adds up the totals. On a
stop or a failure the resume line starts at the first id of any piece left unsent:
ids after it that were already sent are sent again, byte-identical, as at-least-once
allows.
"""

from __future__ import annotations

import bisect
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as connection_wait
from multiprocessing.process import BaseProcess
from typing import Any, Literal, cast

from ..config import Config
from ..export.sinks import ExportError
from ..factory import build_backfill, build_parts
from ..mapping.masking import Scrubber, configured_secrets
from ..mapping.span_data import trace_id_for
from ..pipeline.backfill import Plan, Window
from ..pipeline.backfilled import Range, merged
from ..pipeline.results import PollResult
from ..source.reader import SourceError
from ..telemetry.logs import configure_logging, scrub_output

log = logging.getLogger(__name__)

# Taking a piece holds the lock for microseconds; a wait this long means its holder died.
TAKE_WAIT_SECONDS = 30.0


def pieces(plan: Plan, workers: int, batch_size: int) -> list[Range]:
    """Contiguous pieces in id order, each a share of what is left (so the first are the largest),
    none under a quarter batch but the last: the processes that take them in turn then end
    within about a quarter batch of each other. A range too short for that still gives each
    process a piece."""
    size = plan.last_id - plan.first_id + 1
    smallest = max(1, min(batch_size // 4, -(-size // workers)))
    out: list[Range] = []
    first = plan.first_id
    while first <= plan.last_id:
        left = plan.last_id - first + 1
        size = min(left, max(smallest, -(-left // (2 * workers))))
        out.append((first, first + size - 1))
        first += size
    return out


@dataclass
class _Piece:
    first_id: int
    last_id: int
    read_to: int
    first_run: str = ""
    last_run: str = ""
    taken_by: int | None = None  # the process that took it
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.error is None and self.read_to >= self.last_id


@dataclass
class Tally:
    """What the processes reported, added up, by piece."""

    pieces: list[_Piece]
    workers: int = 1
    done: list[bool] = field(default_factory=list)  # by process
    total: PollResult = field(default_factory=PollResult)

    def __post_init__(self) -> None:
        self.done = self.done or [False] * self.workers
        self._firsts = [piece.first_id for piece in self.pieces]

    def piece_of(self, run_id: int) -> _Piece:
        return self.pieces[bisect.bisect_right(self._firsts, run_id) - 1]

    def ids_read(self) -> int:
        return sum(piece.read_to - piece.first_id + 1 for piece in self.pieces)

    def first_trace(self) -> str:
        first = next((piece.first_run for piece in self.pieces if piece.first_run), "")
        return trace_id_for(first).hex() if first else ""

    def last_trace(self) -> str:
        last = next((piece.last_run for piece in reversed(self.pieces) if piece.last_run), "")
        return trace_id_for(last).hex() if last else ""

    def unsent(self) -> tuple[int, int, bool] | None:
        """The ids to resume, from the first left unsent (of a piece taken or not) to the end of the
        last piece left unsent, and whether no piece between was finished; None when every piece is
        finished."""
        left = [piece for piece in self.pieces if not piece.finished]
        if not left:
            return None
        first, last = left[0].read_to + 1, left[-1].last_id
        return first, last, all(not p.finished for p in self.pieces if first <= p.last_id and p.first_id <= last)

    def failed(self, k: int, error: str) -> None:
        """Process ``k`` ended with ``error``: it names the pieces the process took and left unfinished."""
        for piece in self.pieces:
            if piece.taken_by == k and not piece.finished:
                piece.error = error

    def errors(self) -> list[str]:
        """Each error once, after the ids of the pieces it left unsent (the processes that met a
        collector down each name the same)."""
        by_error: dict[str, list[Range]] = {}
        for piece in self.pieces:
            if piece.error:
                by_error.setdefault(piece.error, []).append((piece.first_id, piece.last_id))
        return [f"ids {', '.join(f'{a}..{b}' for a, b in merged(ranges))}: {error}" for error, ranges in by_error.items()]


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
    """The processes, started; :meth:`wait` follows them to the end.

    Each reports on a pipe of its own: a queue shared by all would hold a lock across processes,
    and a process killed while it wrote would leave the others unable to report for good."""

    def __init__(self, config: Config, window: Window, plan: Plan, workers: int) -> None:
        self.method = start_method()
        context = multiprocessing.get_context("fork") if self.method == "fork" else multiprocessing.get_context("spawn")
        cut = pieces(plan, workers, config.poll.batch_size)
        count = min(workers, len(cut))
        self.tally = Tally([_Piece(first, last, first - 1) for first, last in cut], count)
        # The next piece to take; held here while the processes run: a spawned one opens its lock by name.
        self._taken = context.Value("i", 0)
        self._processes: list[BaseProcess] = []
        self._readers: dict[Connection, int] = {}
        self.stopped = False
        self._owner = os.getpid()
        self._previous = signal.signal(signal.SIGTERM, self._stop)
        try:
            for k in range(count):
                reader, writer = context.Pipe(duplex=False)
                process = context.Process(target=_work, args=(config, window, k, cut, self._taken, writer), daemon=True)
                self._processes.append(process)
                self._readers[reader] = k
                process.start()
                writer.close()  # the process's own end: its pipe ends when the process does
        except BaseException:  # out of processes or memory: none of them may run on alone
            self._stop()
            signal.signal(signal.SIGTERM, self._previous)
            for reader in self._readers:
                reader.close()
            raise

    def _stop(self, *_args: object) -> None:
        if os.getpid() != self._owner:
            return  # a forked process before it sets its own handler
        self.stopped = True
        for process in self._processes:
            if process.is_alive():
                process.terminate()  # SIGTERM: the process finishes its batch and reports where it stopped

    def wait(self, on_progress: Callable[[Tally], None]) -> Tally:
        """Runs the processes to the end; :attr:`stopped` then says whether a SIGTERM stopped them."""
        tally = self.tally
        try:
            while not all(tally.done):
                for ready in connection_wait(list(self._readers), timeout=1.0):
                    reader = cast(Connection, ready)
                    k = self._readers[reader]
                    try:
                        message = reader.recv()
                    except (EOFError, OSError):  # the process ended, and everything it sent was read
                        del self._readers[reader]
                        reader.close()
                        self._ended(k)
                        continue
                    _apply(tally, cast(tuple, message))
                    on_progress(tally)
        finally:
            signal.signal(signal.SIGTERM, self._previous)
            for process in self._processes:
                process.join(timeout=10)
            for reader in self._readers:
                reader.close()
        return tally

    def _ended(self, k: int) -> None:
        """A process that ended without a word (killed, out of memory) failed where it was."""
        if self.tally.done[k]:
            return
        process = self._processes[k]
        process.join(timeout=10)
        self.tally.done[k] = True
        self.tally.failed(k, f"the worker process exited with code {process.exitcode}")


class _Reports:
    """A process's end of its pipe, for its threads: the reading one says what it took, the
    mapping one what each batch sent."""

    def __init__(self, writer: Connection):
        self._writer = writer
        self._lock = threading.Lock()

    def put(self, message: tuple) -> None:
        with self._lock:
            self._writer.send(message)

    def close(self) -> None:
        self._writer.close()


def _apply(tally: Tally, message: tuple) -> None:
    kind, k, *rest = message
    if kind == "took":
        tally.pieces[rest[0]].taken_by = k
    elif kind == "batch":
        cursor, counts, first_run, last_run = rest
        piece = tally.piece_of(cursor)  # a batch lies in one piece
        piece.read_to = cursor
        piece.first_run = piece.first_run or first_run
        piece.last_run = last_run or piece.last_run
        tally.total.add(PollResult(**counts))
    else:
        tally.done[k] = True
        if rest[0] is not None:
            tally.failed(k, rest[0])


def _taking(cut: list[Range], taken: Any, k: int, reports: Any, wait: float = TAKE_WAIT_SECONDS) -> Iterator[Range]:
    """The pieces this process takes, each when it asks for the next: the one no process took yet."""
    lock = taken.get_lock()
    while True:
        # Held for a read and a write. A process killed holding it holds it for good: past the
        # wait this one takes no more, and the pieces no one took are left to the resume line.
        if not lock.acquire(timeout=wait):
            log.warning("backfill: no next piece of the id range after %.0fs: a worker process died taking one", wait)
            return
        try:
            j = taken.value
            if j >= len(cut):
                return
            taken.value = j + 1
        finally:
            lock.release()
        reports.put(("took", k, j))
        yield cut[j]


def _work(config: Config, window: Window, k: int, cut: list[Range], taken: Any, writer: Connection) -> None:
    """One process: the same pass a single backfill runs, over the pieces it takes."""
    reports = _Reports(writer)
    scrubber = Scrubber.for_secrets(configured_secrets(config.export, config.source, config.state))
    configure_logging(config.log, scrub_output(scrubber))
    parts = build_parts(config)  # closed below, once the last batch is sent
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
        backfill.run_ranges(_taking(cut, taken, k, reports), on_batch, created_in=window.contains)
    except (SourceError, ExportError) as exc:
        error = str(exc)
    finally:
        parts.close()
    reports.put(("done", k, error))
    reports.close()
