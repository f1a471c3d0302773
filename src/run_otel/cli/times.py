"""Times on the command line: exact (``2026-12-03``, ``2026-12-03 14:05[:09]``, ISO with an
offset) or relative to now (``90m``, ``24h``, ``7d``, ``2w``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import click

_RELATIVE = re.compile(r"(\d+)\s*([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_FORMATS = ("%Y-%m-%d", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S")


class TimeParam(click.ParamType):
    """A naive time (read in source.timezone) or an aware one (an offset, or a duration ago)."""

    name = "TIME"

    def __init__(self, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._now = now

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            return value
        text = str(value).strip()
        relative = _RELATIVE.fullmatch(text)
        if relative:
            amount, unit = relative.groups()
            return self._now() - timedelta(**{_UNITS[unit]: int(amount)})
        for fmt in _FORMATS:
            try:
                return datetime.strptime(text, fmt)
            except ValueError:
                continue
        try:
            return datetime.fromisoformat(text)
        except ValueError:
            self.fail(
                f"{text!r} is not a time: use YYYY-MM-DD[ HH:MM[:SS]], ISO 8601 with an offset, or 24h / 7d ago", param, ctx
            )
