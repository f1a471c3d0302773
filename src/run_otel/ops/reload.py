"""SIGHUP: what `run` takes up again without a restart, and one line saying what it did.

Two things can change safely under a running daemon: ``log.level``, and the
content of ``source.password_file`` (read for every new connection anyway; the
signal checks it now, so a bad rotation shows at once rather than at the next
reconnect). Every other key shapes parts built once at start (the engine, the
sink, the state store, the schedule), so a change to it is named as waiting for
a restart rather than half applied.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import asdict

from ..config import Config
from ..source.password_file import read_password, readable_by_others
from ..telemetry.logs import set_level

log = logging.getLogger("run_otel")

# What a SIGHUP applies; docs/operations.md names the same two.
RELOADED = ("log.level", "source.password_file")


def _digest(secret: str) -> str:
    # Only whether it changed matters: no second copy of the password is kept.
    return hashlib.sha256(secret.encode()).hexdigest()


def _keys(config: Config) -> dict[str, object]:
    return {
        f"{section}.{key}": value
        for section, values in asdict(config).items()
        if isinstance(values, dict)
        for key, value in values.items()
    }


class Reloader:
    """Holds what the daemon runs with, and applies a fresh read of the config to it."""

    def __init__(self, config: Config, fresh: Callable[[], Config]):
        self._config = config
        self._fresh = fresh
        self._password = self._read_password(config)

    @staticmethod
    def _read_password(config: Config) -> str | None:
        path = config.source.password_file
        return _digest(read_password(path)) if path else None

    def reload(self) -> None:
        """One line for the signal, whatever happens: a bad file never stops the daemon."""
        try:
            fresh = self._fresh()
        except Exception as exc:  # a config error, an unreadable file: keep running as before
            log.error("SIGHUP: the config was not reloaded (%s); running on with the settings from the start", exc)
            return
        done = [self._level(fresh)]
        try:
            done.append(self._password_file())
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            log.error(
                "SIGHUP: source.password_file %s: %s; new connections will fail until it is readable",
                self._config.source.password_file,
                reason,
            )
        waiting = [key for key, value in _keys(fresh).items() if key not in RELOADED and _keys(self._config).get(key) != value]
        line = "SIGHUP: " + "; ".join(d for d in done if d)
        if waiting:
            line += f"; changed but applied only after a restart: {', '.join(waiting)}"
        log.log(logging.WARNING if waiting else logging.INFO, line)
        warning = readable_by_others(self._config.source.password_file) if self._config.source.password_file else None
        if warning:
            log.warning(warning)

    def _level(self, fresh: Config) -> str:
        before, after = self._config.log.level, fresh.log.level
        if before != after:
            set_level(after)
            self._config = _with_level(self._config, after)
            return f"log.level {before} -> {after}"
        return f"log.level {after} (unchanged)"

    def _password_file(self) -> str:
        if not self._config.source.password_file:
            return ""
        digest = self._read_password(self._config)
        changed, self._password = digest != self._password, digest
        return f"source.password_file re-read ({'changed: new connections use it' if changed else 'unchanged'})"


def _with_level(config: Config, level: str) -> Config:
    from dataclasses import replace

    return replace(config, log=replace(config.log, level=level))
