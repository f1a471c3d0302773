"""One writer per state store and shard.

Two instances saving one checkpoint both export every run, and both count it.
So whatever moves a checkpoint (`run`, `once`, `rewind`) first locks the
store for its shard, for as long as it runs: a SQLite store with ``flock`` on
a file beside the database, a MySQL/MariaDB store with ``GET_LOCK`` on a
connection of its own. The OS or the server releases either the moment the
holder dies. The holder writes who it is (host, pid, start time) where the
next one reads it, so a refusal names the instance to look for.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Column, Float, Integer, MetaData, String, Table, select
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError

from ..config import StateConfig
from ..sharding import Shard, shard_name
from ..source.engine import make_engine, safe_url
from .named_lock import NamedLock, lock_name
from .state_store import StateStoreError

log = logging.getLogger(__name__)


class StoreLockedError(StateStoreError):
    """Another instance writes this state store and shard."""


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    started: float

    @classmethod
    def me(cls) -> Holder:
        return cls(socket.gethostname(), os.getpid(), time.time())

    def describe(self) -> str:
        started = datetime.fromtimestamp(self.started, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"host {self.host}, pid {self.pid}, started {started}"


class StoreLock:
    """No lock: a store nothing else can open (SQLite in memory), or a backend without one."""

    held = False

    def __init__(self, where: str):
        self.where = where

    def acquire(self) -> bool:
        self.held = True
        return True

    def holder(self) -> str:
        return "holder unknown"

    def check(self) -> None:
        """Raises when the lock was lost (a server that dropped its connection) and is now held elsewhere."""

    def release(self) -> None:
        self.held = False

    def in_use(self) -> str:
        return f"{self.where} is in use by another run-otel ({self.holder()})"

    def refusal(self) -> StoreLockedError:
        return StoreLockedError(
            f"{self.in_use()}: one writer per state store and shard. "
            "Stop that one first, or give this one its own state.url or --shard; for a standby, set ha.enabled on both"
        )

    def __enter__(self) -> StoreLock:
        if not self.acquire():
            raise self.refusal()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


class FileLock(StoreLock):
    def __init__(self, where: str, path: Path):
        super().__init__(where)
        self._path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        try:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StateStoreError(f"{self.where}: cannot open the lock file {self._path}: {exc.strerror}") from None
        try:
            # flock, not fcntl: SQLite's own POSIX locks on the database are dropped by any close in the process.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(asdict(Holder.me())).encode())
        self._fd, self.held = fd, True
        return True

    def holder(self) -> str:
        try:
            return Holder(**json.loads(self._path.read_text())).describe()
        except (OSError, ValueError, TypeError):
            return "holder unknown"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # the OS releases the flock with its last descriptor
            self._fd = None
        self.held = False


_writer = Table(
    "run_otel_writer",
    MetaData(),
    Column("shard", String(64), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started", Float(precision=53), nullable=False),
)


class MySqlStoreLock(StoreLock):
    def __init__(self, where: str, url: URL, shard: str):
        super().__init__(where)
        self._engine = make_engine(url, pool_size=1, max_overflow=0)
        self._shard = shard
        self._lock = NamedLock(self._engine, lock_name("run-otel-state", url.database, shard))

    def acquire(self) -> bool:
        try:
            _writer.create(self._engine, checkfirst=True)
            if not self._lock.take():
                return False
            conn = self._lock.conn
            assert conn is not None  # take() keeps the connection that holds the lock
            conn.execute(_writer.delete().where(_writer.c.shard == self._shard))
            conn.execute(_writer.insert().values(shard=self._shard, **asdict(Holder.me())))
            conn.commit()
        except SQLAlchemyError as exc:
            self._lock.drop()  # its connection's end frees the lock, if it was taken
            raise StateStoreError(f"{self.where}: cannot take the writer lock: {getattr(exc, 'orig', exc)}") from None
        self.held = True
        return True

    def holder(self) -> str:
        try:
            with self._engine.connect() as conn:
                row = conn.execute(select(_writer).where(_writer.c.shard == self._shard)).first()
        except SQLAlchemyError:
            row = None
        return Holder(row.host, row.pid, row.started).describe() if row else "holder unknown"

    def check(self) -> None:
        if self._lock.conn is not None:
            try:
                if self._lock.still_held():
                    return
            except SQLAlchemyError:
                pass
            self._lock.drop()
            self.held = False
            log.warning("%s: the writer lock was lost with its connection; taking it again", self.where)
        if not self.acquire():
            raise self.refusal()

    def release(self) -> None:
        self._lock.release()
        self.held = False
        self._engine.dispose()


def store_lock(state: StateConfig, shard_of: Shard) -> StoreLock:
    """The lock for this state store and shard (not yet taken)."""
    url = make_url(state.url)
    shard = shard_name(shard_of)
    where = f"state store {safe_url(url)} (shard {shard})"
    backend = url.get_backend_name()
    if backend == "sqlite" and url.database and url.database != ":memory:":
        return FileLock(where, Path(f"{url.database}.{shard}.lock"))
    if backend == "mysql":
        return MySqlStoreLock(where, url, shard)
    if backend != "sqlite":
        log.warning("%s: one writer per shard is not enforced on %s; run one instance per shard", where, backend)
    return StoreLock(where)
