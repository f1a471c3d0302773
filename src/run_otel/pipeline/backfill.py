"""Backfill planning: which ids to read for a time window, and how complete that is.

Primary-key probes find the id range of ``[since, until)`` in a few queries,
which is exact when ids grow with ``created_at`` (an auto-increment key written
at insert time). After an import they may not: then rows of the window can
lie outside the probed range. Whatever range is read, only runs created inside
the window are exported, and a sign that ids are out of time order is said
loudly with the option that guarantees completeness.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from ..source.reader import Source
from ..source.rows import RunRow

# Concurrent inserts put created_at out of id order by seconds; an import by hours.
INVERSION_TOLERANCE = timedelta(minutes=10)


@dataclass(frozen=True)
class Window:
    """``[since, until)`` in naive source time; a missing bound is open."""

    since: datetime | None = None
    until: datetime | None = None

    def contains(self, run: RunRow) -> bool:
        created = run.created_at
        if not isinstance(created, datetime):
            # A zero or missing date is in no time window; an id range takes it.
            return self.since is None and self.until is None
        return (self.since is None or created >= self.since) and (self.until is None or created < self.until)

    def describe(self) -> str:
        since = f"{self.since:%Y-%m-%d %H:%M:%S}" if self.since else "the first run"
        until = f"{self.until:%Y-%m-%d %H:%M:%S}" if self.until else "now"
        return f"created from {since} to {until}"


@dataclass(frozen=True)
class Plan:
    first_id: int
    last_id: int
    # "probes" (the window's id range by primary-key probes), "ids" (given), or "full scan"
    how: str

    @property
    def empty(self) -> bool:
        return self.last_id < self.first_id


def plan(source: Source, window: Window, from_id: int | None, to_id: int | None, full_scan: bool) -> Plan:
    """The id range. Given ids are read whole (the window then filters what is sent), except that
    ``--since T --to-id N``, the history up to the daemon's start, probes its first id from T."""
    if from_id is None and to_id is not None and window.since is not None and not full_scan:
        return Plan(source.first_id_created_at_or_after(window.since), to_id, "probes")
    if from_id is not None or to_id is not None:
        return Plan(from_id or 1, to_id if to_id is not None else source.max_run_id(), "ids")
    if full_scan:
        return Plan(1, source.max_run_id(), "full scan")
    first = source.first_id_created_at_or_after(window.since) if window.since else 1
    last = (source.first_id_created_at_or_after(window.until) if window.until else source.max_run_id() + 1) - 1
    return Plan(first, last, "probes")


# The largest drop of created_at as ids grow, the earlier id and the later one.
Inversion = tuple[timedelta, int, int]


def probe_order(plan: Plan, source: Source) -> Inversion | None:
    """Only probed bounds can miss runs, so only they pay for the order probes."""
    return largest_time_inversion(source) if plan.how == "probes" else None


def largest_time_inversion(source: Source, probes: int = 64) -> Inversion:
    """How far ``created_at`` runs backwards as ids grow, over ``probes`` evenly spaced
    primary-key probes. A drop of minutes or more means ids are not in time order (an import)."""
    top = source.max_run_id()
    worst, pair = timedelta(0), (0, 0)
    latest: tuple[datetime, int] | None = None
    for probe in source.created_at_from_each([max(1, top * step // probes) for step in range(probes + 1)]):
        if probe is None or not isinstance(probe[1], datetime):
            continue
        if latest is not None and latest[0] - probe[1] > worst:
            worst, pair = latest[0] - probe[1], (latest[1], probe[0])
        if latest is None or probe[1] > latest[0]:
            latest = (probe[1], probe[0])
    return worst, pair[0], pair[1]


def order_warning(outside_window: int, inversion: Inversion | None) -> str | None:
    """The loud line when probed bounds (``inversion`` from :func:`probe_order`) may have missed runs of the window."""
    if inversion is None:
        return None
    drop, earlier, later = inversion
    evidence = []
    if outside_window:
        evidence.append(f"{outside_window} run(s) inside the probed id range were created outside the window")
    if drop > INVERSION_TOLERANCE:
        evidence.append(f"run id {later} was created {drop} before run id {earlier}")
    if not evidence:
        return None
    return (
        "ids are not in created_at order (" + "; ".join(evidence) + "), so runs of this window may lie outside "
        "the probed id range and were NOT exported. For a complete backfill, re-run with --full-scan "
        "(reads every id once) or give the id range with --from-id/--to-id."
    )


def resume_hint(read_to: int, last_id: int, none_sent: bool = True) -> str:
    """How to finish a backfill that stopped after run id ``read_to``: every id before is sent.
    ``none_sent`` False: some ids between were sent (by another worker), and will be again."""
    first = read_to + 1
    were, again = ("not sent", "") if none_sent else ("not all sent", ", which sends those already sent again, byte-identical")
    resume = f"resume with --from-id {first} --to-id {last_id} (and the same --since/--until)"
    return f"ids {first}..{last_id} were {were}; {resume}{again}"


def where_to_find(first_trace: str, last_trace: str, in_flight: int = 0) -> list[str]:
    """The closing lines of a backfill: the runs it left to the daemon, where its runs can be opened, and where not."""
    left = [
        f"{in_flight} run(s) of the window were still in flight: left to the daemon, which sends each when it finishes "
        "(a first start takes over the runs in flight of the last poll.run_timeout_seconds)"
    ]
    if not first_trace:
        return left if in_flight else []
    return (left if in_flight else []) + [
        f"first trace {first_trace}, last trace {last_trace}",
        "Jaeger: open them by trace id, or search the window above.",
        "Tempo: open them by trace id. Its search finds spans older than "
        "storage.trace.wal.ingestion_time_range_slack (default 2m) only when that was raised "
        "before the backfill; see docs/operations.md, Backfill.",
    ]
