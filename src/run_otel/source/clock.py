"""The source's clock: what a naive DATETIME means, and whether the zone fits.

The agent's ``DATETIME`` columns carry no zone; ``source.timezone`` says which
one they are in. :class:`SourceClock` is built once from it and passed to the
mapping and the poller. :func:`zone_finding` compares the newest rows with
the database's own ``NOW()`` and ``UTC_TIMESTAMP()`` to catch a zone that is
plausibly wrong: rows in the future, or rows that match another zone's "now"
to the minute while reading hours old in the configured one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAIVE_EPOCH = datetime(1970, 1, 1)

# A row this far ahead of the database's UTC clock is "in the future".
FUTURE_TOLERANCE = timedelta(minutes=2)
# A row this close to another zone's "now" was plausibly written in that zone.
MATCH_TOLERANCE = timedelta(minutes=5)
# ... when the configured zone makes it at least this old.
STALE_AFTER = timedelta(minutes=30)

# Zones to name for an offset, most likely first; others fall back to Etc/GMT±N.
_COMMON_ZONES = (
    "UTC",
    "Asia/Shanghai",
    "Asia/Tokyo",
    "Asia/Seoul",
    "Asia/Singapore",
    "Asia/Kolkata",
    "Asia/Dubai",
    "Europe/London",
    "Europe/Berlin",
    "Europe/Moscow",
    "America/New_York",
    "America/Chicago",
    "America/Denver",
    "America/Los_Angeles",
    "America/Sao_Paulo",
    "Australia/Sydney",
)


class SourceClock:
    """Naive source DATETIMEs as Unix time, in ``source.timezone``."""

    def __init__(self, zone_name: str):
        self.zone_name = zone_name
        self.zone = ZoneInfo(zone_name)
        self._utc = zone_name in ("UTC", "Etc/UTC")

    def epoch_ns(self, value: object) -> int | None:
        """A naive DATETIME as Unix nanoseconds; None if not a date."""
        if not isinstance(value, datetime):
            return None
        if value.tzinfo is None and self._utc:
            delta = value - _NAIVE_EPOCH  # the common case, without building an aware datetime
        else:
            delta = (value.replace(tzinfo=self.zone) if value.tzinfo is None else value) - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000

    def epoch(self, value: object) -> float | None:
        ns = self.epoch_ns(value)
        return None if ns is None else ns / 1e9

    def naive(self, moment: datetime) -> datetime:
        """An aware time as the naive DATETIME the agent would write; naive times pass."""
        return moment if moment.tzinfo is None else moment.astimezone(self.zone).replace(tzinfo=None)

    def offset(self, naive: datetime) -> timedelta:
        return naive.replace(tzinfo=self.zone).utcoffset() or timedelta(0)


@dataclass(frozen=True)
class ClockSample:
    """The newest run and the database's clocks, read together."""

    run_id: int
    newest: datetime  # the later of the newest run's created_at and updated_at
    db_now: datetime | None  # NOW(), in the server's session zone
    db_utc: datetime  # UTC_TIMESTAMP()


@dataclass(frozen=True)
class ZoneFinding:
    evidence: str
    likely_offset: timedelta | None

    def message(self, configured: str) -> str:
        hint = ""
        if self.likely_offset is not None:
            hint = (
                f"; the rows look written in UTC{format_offset(self.likely_offset)} ({', '.join(zones_for(self.likely_offset))})"
            )
        return (
            f"source.timezone = {configured!r} looks wrong: {self.evidence}{hint}. "
            "Until it is fixed, run timeouts, and the settling of runs that look ahead, count from when run-otel first saw a run"
        )


def format_offset(offset: timedelta) -> str:
    minutes = int(offset.total_seconds() // 60)
    sign = "-" if minutes < 0 else "+"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def zones_for(offset: timedelta, at: datetime | None = None) -> list[str]:
    """Common IANA zones at ``offset`` (at ``at``), else the Etc/GMT zone for it."""
    at = at or datetime.now(UTC).replace(tzinfo=None)
    found = [name for name in _COMMON_ZONES if at.replace(tzinfo=ZoneInfo(name)).utcoffset() == offset]
    if found:
        return found[:2]
    hours, rest = divmod(int(offset.total_seconds()), 3600)
    # Etc/GMT signs are inverted: Etc/GMT-8 is UTC+8.
    return [f"Etc/GMT{-hours:+d}"] if not rest else [f"UTC{format_offset(offset)}"]


def _round_offset(delta: timedelta) -> timedelta:
    quarter = 15 * 60
    return timedelta(seconds=round(delta.total_seconds() / quarter) * quarter)


def zone_finding(sample: ClockSample, clock: SourceClock) -> ZoneFinding | None:
    """Evidence that ``source.timezone`` is wrong, or None when the rows fit it."""
    configured_now = sample.db_utc + clock.offset(sample.newest)  # "now" as the agent would write it
    ahead = sample.newest - configured_now
    if ahead > FUTURE_TOLERANCE:
        return ZoneFinding(
            f"the newest run (id {sample.run_id}, {sample.newest:%Y-%m-%d %H:%M:%S}) lies {_span(ahead)} in the future "
            f"(database UTC_TIMESTAMP() is {sample.db_utc:%Y-%m-%d %H:%M:%S})",
            _round_offset(sample.newest - sample.db_utc),
        )
    if -ahead < STALE_AFTER:
        return None
    readings = [("UTC_TIMESTAMP()", sample.db_utc)]
    if sample.db_now is not None and sample.db_now != sample.db_utc:
        readings.append(("NOW()", sample.db_now))
    for name, now in readings:
        if abs(sample.newest - now) <= MATCH_TOLERANCE:
            return ZoneFinding(
                f"the newest run (id {sample.run_id}, {sample.newest:%Y-%m-%d %H:%M:%S}) reads {_span(-ahead)} old in "
                f"{clock.zone_name}, but matches the database's {name} ({now:%Y-%m-%d %H:%M:%S}) to the minute",
                _round_offset(now - sample.db_utc),
            )
    return None


def _span(delta: timedelta) -> str:
    minutes = int(abs(delta.total_seconds()) // 60)
    return f"{minutes // 60}h {minutes % 60:02d}m"
