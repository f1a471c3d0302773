"""One active instance among several: a MySQL named lock on the source.

``GET_LOCK`` needs no write privilege and is released by the server the
moment the holder's connection closes, so a killed instance hands over at
once. The lock's connection gets ``wait_timeout = ha.takeover_seconds``: if
the holder's host vanishes without closing it, the server drops it, and the
lock, within that time. The holder touches it every poll, and between
batches, so it never idles that long while alive.
"""

from __future__ import annotations

import hashlib
import logging

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError

from ..config import Config
from ..sharding import shard_name

log = logging.getLogger(__name__)


class LeaseError(RuntimeError):
    pass


# MySQL and MariaDB refuse lock names longer than this.
MAX_LOCK_NAME = 64


def lease_name(base: str, database: str | None, shard: str) -> str:
    """The lock name for one source database and one shard.

    ``GET_LOCK`` names are server-wide: without the database and the shard in
    the name, an instance for another database on the same server, or another
    shard, would stand by forever behind the first.
    """
    name = f"{base}:{database or ''}:{shard}"
    if len(name) <= MAX_LOCK_NAME:
        return name
    return f"{base[:24]}:{hashlib.sha256(name.encode()).hexdigest()[:32]}"


def lease_name_for(config: Config) -> str:
    return lease_name(config.ha.lock_name, config.source_url().database, shard_name(config.shard))


class MySqlLease:
    def __init__(self, engine: Engine, name: str, takeover_seconds: float):
        if engine.dialect.name != "mysql":
            raise LeaseError(f"ha.enabled needs a MySQL/MariaDB source (GET_LOCK); this one is {engine.dialect.name}")
        self._engine = engine
        self._name = name
        self._timeout = max(1, int(takeover_seconds))
        self._conn: Connection | None = None
        self._was_held: bool | None = None

    def held(self) -> bool:
        """True while this process holds the lock; tries to take it when free."""
        try:
            holding = self._still_held() if self._conn is not None else self._acquire()
        except SQLAlchemyError as exc:
            log.warning("lease %r: database error (%s); treating it as lost", self._name, getattr(exc, "orig", exc))
            self._drop()
            holding = False
        if holding != self._was_held:
            log.info("lease %r %s", self._name, "acquired: this instance exports" if holding else "held elsewhere: standing by")
            self._was_held = holding
        return holding

    def _acquire(self) -> bool:
        conn = self._engine.connect()
        conn.execute(text(f"SET SESSION wait_timeout = {self._timeout}"))
        got = conn.execute(text("SELECT GET_LOCK(:name, 0)"), {"name": self._name}).scalar()
        conn.commit()
        if got == 1:
            self._conn = conn
            return True
        conn.close()
        return False

    def _still_held(self) -> bool:
        conn = self._conn
        assert conn is not None  # called only while a connection is held
        mine = conn.execute(text("SELECT IS_USED_LOCK(:name) = CONNECTION_ID()"), {"name": self._name}).scalar()
        conn.commit()
        if mine == 1:
            return True
        self._drop()
        return False

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.invalidate()
            except SQLAlchemyError:
                pass
            self._conn = None

    def release(self) -> None:
        if self._conn is not None:
            try:
                self._conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": self._name})
                self._conn.close()
            except SQLAlchemyError:
                pass
            self._conn = None
