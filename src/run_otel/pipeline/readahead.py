"""Reading the next batch while the current one is mapped and sent.

A backfill alternates between waiting on the database and Python work. Run in a
thread, the reads overlap that work: the driver waits on its socket with the GIL
released, and the database does its share on the other core. Order is kept (one
producer, one consumer, a FIFO), and at most ``depth`` batches wait, so memory
stays bounded by the batch size.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Generic, TypeVar

T = TypeVar("T")

_POLL_SECONDS = 0.1


class _End:
    def __init__(self, error: BaseException | None = None):
        self.error = error


class ReadAhead(Generic[T]):
    """Iterates ``items`` in a thread, up to ``depth`` items ahead of the consumer.

    A failure in the thread is raised to the consumer at the point it happened.
    Leaving the ``with`` block stops the thread, also when the consumer failed.
    """

    def __init__(self, items: Iterator[T], depth: int = 1, name: str = "run-otel-read-ahead"):
        self._items = items
        self._queue: queue.Queue[T | _End] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name=name, daemon=True)

    def __enter__(self) -> ReadAhead[T]:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()

    def __iter__(self) -> Iterator[T]:
        while True:
            item = self._queue.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            yield item

    def _produce(self) -> None:
        try:
            for item in self._items:
                if not self._put(item):
                    return
            end = _End()
        except BaseException as error:  # handed to the consumer, which raises it
            end = _End(error)
        self._put(end)

    def _put(self, item: T | _End) -> bool:
        """Waits for room, or until the consumer has gone; False when it has."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False
