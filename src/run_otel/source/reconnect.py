"""Reads that outlive a database restart: a lost connection is retried with backoff.

A backfill reads for minutes or hours; a restart or failover of the agent's
database in that time costs it only a wait. Only a lost or refused connection
is retried; a statement timeout or a missing table is not transient and ends
the read at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from ..backoff import Backoff
from .reader import ConnectionLost

log = logging.getLogger(__name__)

T = TypeVar("T")


class Reconnecting:
    """Retries a read on ConnectionLost, doubling the wait from ``initial`` up to ``ceiling``,
    for ``budget`` seconds in all; a stop request ends the waiting."""

    def __init__(self, budget: float, initial: float, ceiling: float, stop: threading.Event):
        self._budget, self._stop = budget, stop
        self._backoff = Backoff(initial, ceiling, jitter=0)

    def __call__(self, read: Callable[[], T]) -> T:
        deadline = time.monotonic() + self._budget
        failures = 0
        while True:
            try:
                return read()
            except ConnectionLost as exc:
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    raise ConnectionLost(f"{exc} (gave up after retrying for {self._budget:g}s)") from None
                failures += 1
                wait = min(self._backoff.delay(failures), left)
                log.warning("%s; retrying in %.1fs", exc, wait)
                if self._stop.wait(wait):
                    raise
