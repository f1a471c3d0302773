"""Logging: one line per record on stderr, text or JSON, times in UTC, no secrets.

Every record, whatever library wrote it, passes the secret filter: the
configured secrets (``masking.configured_secrets``) are masked, then the same
credential rules as exported text apply. Its message then passes the terminal
sanitizer (``source/terminal_text.py``).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

from ..config import LogConfig
from ..mapping.masking import ScrubbedStream, Scrubber
from ..source.password_file import on_read as on_password_read
from ..source.terminal_text import terminal_safe

# APScheduler logs two INFO lines per job run ("Running job", "executed
# successfully"), even while every poll fails: about 35,000 lines a day.
_CHATTY = {"apscheduler": logging.WARNING}


def utc_iso(created: float) -> str:
    """A record time as ISO 8601 in UTC, to the millisecond: 2026-12-03T08:15:02.113Z."""
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and exception)."""

    def format(self, record: logging.LogRecord) -> str:
        message = terminal_safe(record.getMessage())
        doc = {"time": utc_iso(record.created), "level": record.levelname, "logger": record.name, "message": message}
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            doc["exception"] = record.exc_text
        return json.dumps(doc, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return utc_iso(record.created)

    def formatMessage(self, record: logging.LogRecord) -> str:
        # A value from a row (a status, a run id) may hold a line break or a terminal escape:
        # one record stays one line, and the operator's terminal is never steered.
        record.message = terminal_safe(record.message)
        return super().formatMessage(record)


class SecretFilter(logging.Filter):
    """Masks known secrets and redacts credential shapes in every record."""

    def __init__(self, scrubber: Scrubber):
        super().__init__()
        self._scrubber = scrubber

    def scrub(self, text: str) -> str:
        return self._scrubber.scrub(text)

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = self.scrub(record.getMessage()), None
        if record.exc_info:
            record.exc_text = self.scrub(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


class PoolResetFilter(logging.Filter):
    """SQLAlchemy's pool logs a traceback at ERROR when it cannot roll back a connection the
    server already closed. run-otel's own line about the lost connection says what matters,
    so the pool's becomes one WARNING line; at DEBUG the traceback stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("sqlalchemy.pool") and record.msg == "Exception during reset or similar":
            reason = record.exc_info[1] if record.exc_info else None
            if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
                record.exc_info, record.exc_text = None, None
            record.msg, record.args = "discarded a database connection that could not be reset: %s", (reason,)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def configure_logging(config: LogConfig, scrubber: Scrubber, stream: TextIO | None = None) -> SecretFilter:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if config.format == "json" else TextFormatter())
    handler.addFilter(PoolResetFilter())
    secret_filter = SecretFilter(scrubber)
    handler.addFilter(secret_filter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    set_level(config.level)
    return secret_filter


def set_level(level: str) -> None:
    """log.level, at start and on SIGHUP: the root logger, and the chatty libraries no lower."""
    logging.getLogger().setLevel(level)
    for name, floor in _CHATTY.items():
        logging.getLogger(name).setLevel(max(floor, logging.getLogger().level))


def scrub_output(scrubber: Scrubber) -> Scrubber:
    """From here on every line the process prints, on stdout or stderr (click, rich,
    tracebacks), passes the same masking as the logs: a receiver or database that
    quotes a configured secret back cannot get it printed."""
    # A password read again after a rotation is masked as the first one was.
    on_password_read(scrubber.add_secret)
    sys.stdout = ScrubbedStream(sys.stdout, scrubber)
    sys.stderr = ScrubbedStream(sys.stderr, scrubber)
    return scrubber
