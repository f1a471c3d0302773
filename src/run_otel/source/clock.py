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
# No zone is further from UTC than this (UTC-12 to UTC+14): a row further ahead holds a bad time
# (2099, say), which the poll settles and names by run, not a wrong zone.
WIDEST_OFFSET = timedelta(hours=14)

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
    """Naive source DATETIMEs as Unix time, in ``source.timezone``.

    A time before the Unix epoch reads as the epoch (OTLP times are unsigned; the mapper
    warns). A local time the zone repeats (the hour before clocks go back) reads as its
    first occurrence, and one it skips (the hour clocks jump over) with the offset in force
    before the change: Python's ``fold=0`` (``local_shifts`` says which times those are)."""

    def __init__(self, zone_name: str):
        self.zone_name = zone_name
        self.zone = ZoneInfo(zone_name)
        self._utc = zone_name in ("UTC", "Etc/UTC")
        self.local_shifts = LocalShifts(self.zone)

    def epoch_ns(self, value: object) -> int | None:
        """A naive DATETIME as Unix nanoseconds (0 for a time before the epoch); None if not a date."""
        if not isinstance(value, datetime):
            return None
        if value.tzinfo is None and self._utc:
            delta = value - _NAIVE_EPOCH  # the common case, without building an aware datetime
        else:
            delta = (value.replace(tzinfo=self.zone) if value.tzinfo is None else value) - _EPOCH
        ns = (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000
        return ns if ns > 0 else 0

    def epoch(self, value: object) -> float | None:
        ns = self.epoch_ns(value)
        return None if ns is None else ns / 1e9

    def naive(self, moment: datetime) -> datetime:
        """An aware time as the naive DATETIME the agent would write; naive times pass."""
        return moment if moment.tzinfo is None else moment.astimezone(self.zone).replace(tzinfo=None)

    def offset(self, naive: datetime) -> timedelta:
        return naive.replace(tzinfo=self.zone).utcoffset() or timedelta(0)


REPEATED, MISSING = "repeated", "missing"


class LocalShifts:
    """The local times a zone repeats or skips when its offset changes (daylight saving time).

    Found once per year asked, from the zone's own offsets, day by day in UTC; a time is
    then told by a lookup, so only the few values in such an hour cost more than that."""

    def __init__(self, zone: ZoneInfo):
        self._zone = zone
        self.fixed = zone.key in ("UTC", "Etc/UTC") or zone.key.startswith("Etc/")
        self._years: dict[int, list[tuple[datetime, datetime, str]]] = {}

    def kind(self, value: datetime) -> str | None:
        """REPEATED or MISSING for a naive local time the zone repeats or skips, else None."""
        if self.fixed:
            return None
        shifts = self._years.get(value.year)
        if shifts is None:
            shifts = self._years[value.year] = self._shifts_in(value.year)
        for start, end, kind in shifts:
            if start <= value < end:
                return kind
        return None

    def _shifts_in(self, year: int) -> list[tuple[datetime, datetime, str]]:
        if not 1900 <= year <= 2200:  # beyond what the zone database says anything about
            return []
        out = []
        at = datetime(year, 1, 1, tzinfo=UTC) - timedelta(days=1)
        last = datetime(year + 1, 1, 1, tzinfo=UTC) + timedelta(days=1)
        offset = self._offset(at)
        while at < last:
            after = at + timedelta(days=1)
            new = self._offset(after)
            if new != offset:
                change = self._change(at, after, offset)  # the first instant at the new offset
                local = change.replace(tzinfo=None)
                if new < offset:
                    out.append((local + new, local + offset, REPEATED))
                else:
                    out.append((local + offset, local + new, MISSING))
                offset = new
            at = after
        return out

    def _offset(self, at: datetime) -> timedelta:
        return at.astimezone(self._zone).utcoffset() or timedelta(0)

    def _change(self, before: datetime, after: datetime, offset: timedelta) -> datetime:
        """The first second in (before, after] whose offset is not ``offset``."""
        while after - before > timedelta(seconds=1):
            middle = before + (after - before) / 2
            if self._offset(middle) == offset:
                before = middle
            else:
                after = middle
        return after.replace(microsecond=0)


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
    if ahead > WIDEST_OFFSET + FUTURE_TOLERANCE:
        return None
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
