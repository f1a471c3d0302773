"""Reading a backfill's rows in a second process, so the two cores work at once.

Decoding rows (PyMySQL) and mapping and encoding them (run-otel) are both
Python and both hold the GIL, so a thread would not overlap them. A reader
process reads batch after batch, by primary key and in order, into a small
queue; the backfill maps, encodes and sends each batch as it comes. The order
of batches, and so the bytes sent, are what a single process would send.
"""

from __future__ import annotations

import multiprocessing
import queue as queue_module
from collections.abc import Callable, Iterator

from .config import Config
from .rows import RunRow, ToolRow

Batch = tuple[list[RunRow], dict[str, list[ToolRow]]]

# Batches read ahead: enough to keep the mapper busy, few enough to bound memory.
AHEAD = 2
_DONE = "done"
_ERROR = "error"


def _read(config: Config, first_id: int, last_id: int, out) -> None:
    """The reader process: every batch of [first_id, last_id], then "done" (or the error)."""
    from .source import Source

    try:
        source = Source(config)
        cursor = first_id - 1
        while cursor < last_id:
            runs = source.runs_after(cursor, config.poll.batch_size, until_id=last_id)
            if not runs:
                break
            cursor = runs[-1].id
            out.put((runs, source.tools_for(run.run_id for run in runs)))
        source.close()
        out.put(_DONE)
    except Exception as exc:  # reported in the parent, which owns the exit code
        out.put((_ERROR, f"{exc.__class__.__name__}: {exc}" if not str(exc).startswith("database") else str(exc)))


def prefetched_batches(config: Config, first_id: int, last_id: int, stop: Callable[[], bool]) -> Iterator[Batch]:
    """The backfill's batches, read by a child process; stops it when ``stop()`` or on exit."""
    from .source import SourceError

    context = multiprocessing.get_context("spawn")  # never fork a process that holds gRPC channels
    out = context.Queue(maxsize=AHEAD)
    reader = context.Process(target=_read, args=(config, first_id, last_id, out), daemon=True)
    reader.start()
    try:
        while not stop():
            try:
                item = out.get(timeout=1.0)
            except queue_module.Empty:
                if not reader.is_alive():
                    raise SourceError("the backfill's reader process died") from None
                continue
            if item == _DONE:
                return
            if item[0] == _ERROR:
                raise SourceError(item[1])
            yield item
    finally:
        if reader.is_alive():
            reader.terminate()
        reader.join(timeout=10)
