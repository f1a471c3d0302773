"""One active instance among several: a MySQL named lock on the source.

``GET_LOCK`` needs no write privilege and is released by the server the
moment the holder's connection closes, so a killed instance hands over at
once. The lock's connection gets ``wait_timeout = ha.takeover_seconds``: if
the holder's host vanishes without closing it, the server drops it, and the
lock, within that time. The holder touches it every poll, and between
batches, so it never idles that long while alive.
"""

from __future__ import annotations

import logging

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from .named_lock import NamedLock

log = logging.getLogger(__name__)


class LeaseError(RuntimeError):
    pass


class MySqlLease:
    def __init__(self, engine: Engine, name: str, takeover_seconds: float):
        if engine.dialect.name != "mysql":
            raise LeaseError(f"ha.enabled needs a MySQL/MariaDB source (GET_LOCK); this one is {engine.dialect.name}")
        self._lock = NamedLock(engine, name, wait_timeout=max(1, int(takeover_seconds)))
        self._was_held: bool | None = None

    def held(self) -> bool:
        """True while this process holds the lock; tries to take it when free."""
        lock = self._lock
        try:
            holding = lock.still_held() if lock.conn is not None else lock.take()
        except SQLAlchemyError as exc:
            log.warning("lease %r: database error (%s); treating it as lost", lock.name, getattr(exc, "orig", exc))
            holding = False
        if not holding:
            lock.drop()
        if holding != self._was_held:
            log.info("lease %r %s", lock.name, "acquired: this instance exports" if holding else "held elsewhere: standing by")
            self._was_held = holding
        return holding

    def release(self) -> None:
        self._lock.release()
