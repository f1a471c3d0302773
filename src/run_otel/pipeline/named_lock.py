"""A MySQL/MariaDB named lock (``GET_LOCK``) held on a connection of its own.

It needs no write privilege, and the server releases it the moment that
connection ends, so a killed holder hands over at once. The HA lease and the
state store's one-writer lock are both one of these.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError

# MySQL and MariaDB refuse lock names longer than this.
MAX_LOCK_NAME = 64


def lock_name(base: str, database: str | None, shard: str) -> str:
    """The lock name for one database and one shard.

    ``GET_LOCK`` names are server-wide: without the database and the shard in
    the name, an instance for another database on the same server, or another
    shard, would stand by forever behind the first.
    """
    name = f"{base}:{database or ''}:{shard}"
    if len(name) <= MAX_LOCK_NAME:
        return name
    return f"{base[:24]}:{hashlib.sha256(name.encode()).hexdigest()[:32]}"


class NamedLock:
    """Database errors propagate; each holder decides what a lost lock means."""

    def __init__(self, engine: Engine, name: str, wait_timeout: int | None = None):
        self._engine = engine
        self.name = name
        # The server drops the connection, and the lock, of a holder silent this long.
        self._wait_timeout = wait_timeout
        self.conn: Connection | None = None

    def take(self) -> bool:
        """Tries once, without waiting; True when this connection now holds it."""
        conn = self._engine.connect()
        if self._wait_timeout is not None:
            conn.execute(text(f"SET SESSION wait_timeout = {int(self._wait_timeout)}"))
        got = conn.execute(text("SELECT GET_LOCK(:name, 0)"), {"name": self.name}).scalar()
        conn.commit()
        if got != 1:
            conn.close()
            return False
        self.conn = conn
        return True

    def still_held(self) -> bool:
        """Asks the server whether the lock's connection still holds it (and keeps that connection alive)."""
        assert self.conn is not None  # asked only after take()
        mine = self.conn.execute(text("SELECT IS_USED_LOCK(:name) = CONNECTION_ID()"), {"name": self.name}).scalar()
        self.conn.commit()
        return mine == 1

    def drop(self) -> None:
        """Forgets a connection that may be dead, without asking the server anything."""
        if self.conn is not None:
            try:
                self.conn.invalidate()
            except SQLAlchemyError:
                pass
            self.conn = None

    def release(self) -> None:
        if self.conn is not None:
            try:
                self.conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": self.name})
                self.conn.close()
            except SQLAlchemyError:
                pass
            self.conn = None


def lock_holder(engine: Engine, name: str) -> int | None:
    """The connection id holding ``name``, or None while it is free."""
    with engine.connect() as conn:
        return conn.execute(text("SELECT IS_USED_LOCK(:name)"), {"name": name}).scalar()
