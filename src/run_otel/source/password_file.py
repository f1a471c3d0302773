"""``source.password_file``: read again for every new connection, so a rotated secret
is picked up without a restart.

Kubernetes and Vault rotate a database password by rewriting the mounted file,
not by restarting the process that reads it. Connections already open stay
authenticated; the next one the pool opens reads the file as it is now.
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event

from .errors import SourceError

# Whoever must know each password read: the output scrubber masks the new one too.
_listeners: list[Callable[[str], None]] = []


def on_read(listener: Callable[[str], None]) -> None:
    """Calls ``listener`` with each password read from a file from now on."""
    _listeners.append(listener)


def read_password(path: str) -> str:
    """The file's first line, stripped as Kubernetes and Vault write it (with or without a newline)."""
    secret = Path(path).read_text(encoding="utf-8").strip()
    for listener in _listeners:
        listener(secret)
    return secret


def readable_by_others(path: str) -> str | None:
    """A warning when group or others may read the file; None when only its owner can, or it is absent."""
    try:
        mode = Path(path).stat().st_mode
    except OSError:
        return None
    if not mode & (stat.S_IRGRP | stat.S_IROTH):
        return None
    who = " and ".join(w for bit, w in ((stat.S_IRGRP, "its group"), (stat.S_IROTH, "every user")) if mode & bit)
    return (
        f"source.password_file {path} is readable by {who} (mode {stat.S_IMODE(mode):04o}): "
        "make it 0400 or 0440 (in Kubernetes, defaultMode: 0400 on the secret volume)"
    )


def read_on_connect(engine: Engine, path: str) -> None:
    """Each new connection of ``engine`` takes its password from ``path`` as the file is then."""

    def do_connect(_dialect: Any, _record: Any, _cargs: Any, cparams: dict) -> None:
        # PyMySQL and mysqlclient name the argument passwd, mysql-connector password.
        key = "passwd" if "passwd" in cparams else "password"
        try:
            cparams[key] = read_password(path)
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise SourceError(f"source.password_file {path}: {reason}; the connection was not attempted") from None

    event.listen(engine, "do_connect", do_connect)
