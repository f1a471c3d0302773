"""The secrets the config holds, masked verbatim wherever run-otel writes text.

A receiver or a database may quote a credential back in an error: a gateway
that refuses ``Authorization: Bearer X`` often answers with the header, or
with the bare ``X``. Credential shapes are caught by the redactor, but an
opaque token has no shape, so every value the config holds as a secret is
masked as it is, before the redactor runs. One ``Scrubber`` does both, and
it sits where every line leaves the process: the log handler and the
command's stdout and stderr.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable
from typing import TextIO

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from ..config import ExportConfig, SourceConfig, StateConfig
from .redaction import MIN_SECRET as _MIN_SECRET
from .redaction import Redactor

MASK = "***"
_SCHEME = re.compile(r"(?i)^\s*(?:bearer|basic|token|digest|apikey|negotiate)\s+(\S+)\s*$")


def configured_secrets(export: ExportConfig, source: SourceConfig, state: StateConfig) -> list[str]:
    """Every secret value the config holds: each export header's value and, for an
    ``Authorization``-style value, its bare token; the source password (from the
    URL or source.password_file) and the state store's password."""
    secrets: list[str] = []
    for value in export.headers.values():
        secrets.append(value)
        token = _SCHEME.match(value)
        if token:
            secrets.append(token.group(1))
    try:
        secrets.append(str(source.connect_url().password or ""))
    except OSError:
        pass
    try:
        secrets.append(str(make_url(state.url).password or ""))
    except ArgumentError:
        pass
    return [s for s in secrets if len(s) >= _MIN_SECRET]


class Scrubber:
    """Masks the configured secrets, then redacts credential shapes."""

    def __init__(self, secrets: Iterable[str], redactor: Redactor):
        # Longest first, so a secret that contains another is masked whole.
        self._secrets = sorted({s for s in secrets if len(s) >= _MIN_SECRET}, key=len, reverse=True)
        self._redactor = redactor

    @classmethod
    def for_secrets(cls, secrets: Iterable[str]) -> Scrubber:
        return cls(secrets, Redactor.for_secrets())

    def add_secret(self, secret: str) -> None:
        """Masks ``secret`` too from now on: a password read again after a rotation."""
        if len(secret) >= _MIN_SECRET and secret not in self._secrets:
            # One assignment, so a thread scrubbing meanwhile sees the old list or the new one.
            self._secrets = sorted({*self._secrets, secret}, key=len, reverse=True)

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        return self._redactor.redact(text)


class ScrubbedStream(io.TextIOBase):
    """A text stream that scrubs every write: the command's stdout and stderr.

    It has no ``buffer``, so click and rich write text through it rather than
    around it to the bytes underneath."""

    def __init__(self, stream: TextIO, scrubber: Scrubber):
        super().__init__()
        self._stream = stream
        self._scrubber = scrubber

    def write(self, text: str) -> int:  # type: ignore[override]
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self._stream.write(self._scrubber.scrub(text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", "utf-8") or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self._stream, "errors", None)
