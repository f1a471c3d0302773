"""How the checkpoint moves: pure functions of the checkpoint, the rows read and ``now``.

No I/O and no clock of their own: the poller passes ``now`` in, so every rule
here (where a first start begins, which ids are gaps, when a waiting run times
out, when a gap is given up) is unit-tested with exact times.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..config import PollConfig
from ..source.clock import FUTURE_TOLERANCE, SourceClock
from ..source.rows import RunRow, is_terminal
from .checkpoint import Checkpoint

# An updated_at further ahead of the database's clock than this is a bad value, not a clock's jitter.
FUTURE_TOLERANCE_SECONDS = FUTURE_TOLERANCE.total_seconds()
# More missing ids than this in one batch is a deletion, not in-flight commits.
MAX_NEW_GAPS = 10_000


@dataclass(frozen=True)
class Rules:
    settle_seconds: float
    run_timeout_seconds: float
    gap_timeout_seconds: float
    # False when the source's timestamps cannot be trusted (a wrong source.timezone): run
    # timeouts, and the settling of runs whose updated_at lies ahead, count from when first seen.
    trust_timestamps: bool = True

    @classmethod
    def from_config(cls, poll: PollConfig, trust_timestamps: bool = True) -> Rules:
        return cls(poll.settle_seconds, poll.run_timeout_seconds, poll.gap_timeout_seconds, trust_timestamps)


def initial_checkpoint(start_from: str, newest_id: int) -> Checkpoint:
    """Where a first start begins: after the newest run ("now"), at 1 ("beginning"), or at an id."""
    if start_from == "beginning":
        return Checkpoint(high_water=0)
    if start_from == "now":
        return Checkpoint(high_water=newest_id)
    return Checkpoint(high_water=int(start_from) - 1)


# With run_timeout_seconds = 0 (wait forever), a first start from "now" takes over the runs in flight of this long.
IN_FLIGHT_LOOKBACK_SECONDS = 86_400.0


def in_flight_since(now: float, rules: Rules) -> float:
    """How far back a first start from "now" looks for runs in flight: a run older than
    ``run_timeout_seconds`` would be sent as incomplete anyway, and a backfill sends it."""
    return now - (rules.run_timeout_seconds or IN_FLIGHT_LOOKBACK_SECONDS)


def take_over(checkpoint: Checkpoint, runs: Sequence[RunRow], now: float, rules: Rules, clock: SourceClock) -> int:
    """Adds the runs below a first start's mark that are still running, or finished but not
    settled, to the pending runs: the daemon exports them when they finish. Returns how many."""
    settled_before = now - rules.settle_seconds
    taken = 0
    for run in runs:
        updated = clock.epoch(run.updated_at)
        if not is_terminal(run.status) or (updated is not None and updated > settled_before):
            checkpoint.pending[run.id] = now
            taken += 1
    return taken


def advance(checkpoint: Checkpoint, new_ids: Sequence[int], now: float) -> int:
    """Moves the high-water mark over ``new_ids`` (ascending) and records the ids
    they skipped as gaps first missed at ``now``. Returns the gaps not tracked."""
    if not new_ids:
        return 0
    seen = set(new_ids)
    missing = [i for i in range(checkpoint.high_water + 1, new_ids[-1]) if i not in seen]
    dropped = max(len(missing) - MAX_NEW_GAPS, 0)
    for gap in missing[dropped:]:
        checkpoint.gaps.setdefault(gap, now)
    checkpoint.high_water = new_ids[-1]
    return dropped


def timed_out(created_at: float | None, first_seen: float, now: float, rules: Rules) -> bool:
    """Whether a waiting run has waited ``run_timeout_seconds``.

    Counted from ``created_at``, unless it is missing, lies in the future, or
    the timestamps are not trusted: then from when the run was first seen.
    """
    if rules.run_timeout_seconds <= 0:
        return False
    return waited(created_at, first_seen, now, rules) >= rules.run_timeout_seconds


def waited(created_at: float | None, first_seen: float, now: float, rules: Rules) -> float:
    """How long a run has been waiting to finish, counted as ``timed_out`` counts it."""
    since = first_seen
    if rules.trust_timestamps and created_at is not None and created_at <= now:
        since = created_at
    return now - since


@dataclass
class Classified:
    to_export: list[RunRow] = field(default_factory=list)
    incomplete: set[int] = field(default_factory=set)
    # How long each incomplete run waited to finish, in seconds.
    stuck_seconds: dict[int, float] = field(default_factory=dict)
    # When the first finished-but-unsettled run becomes exportable (Unix time).
    next_settle_at: float | None = None
    # Finished runs sent whose updated_at lay ahead of the database's clock, settled as seen: seconds ahead.
    ahead: dict[int, float] = field(default_factory=dict)


def classify(
    checkpoint: Checkpoint,
    runs: Sequence[RunRow],
    now: float,
    rules: Rules,
    clock: SourceClock,
    in_shard: Callable[[RunRow], bool] = lambda run: True,
) -> Classified:
    """Splits runs into those to send now and those still waiting (kept as pending)."""
    out = Classified()
    settled_before = now - rules.settle_seconds
    for run in runs:
        first_seen = checkpoint.pending.pop(run.id, None) or checkpoint.gaps.pop(run.id, None) or now
        if not in_shard(run):
            continue
        if is_terminal(run.status):
            updated = clock.epoch(run.updated_at)
            ahead = updated - now if updated is not None else 0.0
            if ahead > 0 and (not rules.trust_timestamps or ahead > FUTURE_TOLERANCE_SECONDS):
                # Ahead of the database's clock (2099, or a wrong source.timezone): it would never settle
                # by its own updated_at, so it settles by the database's clock, from when it was seen.
                updated = first_seen
            if updated is None or updated <= settled_before:
                out.to_export.append(run)
                if rules.trust_timestamps and ahead > FUTURE_TOLERANCE_SECONDS:
                    out.ahead[run.id] = ahead
            else:
                checkpoint.pending[run.id] = first_seen
                ready_at = updated + rules.settle_seconds
                out.next_settle_at = ready_at if out.next_settle_at is None else min(out.next_settle_at, ready_at)
        elif timed_out(created := clock.epoch(run.created_at), first_seen, now, rules):
            out.to_export.append(run)
            out.incomplete.add(run.id)
            out.stuck_seconds[run.id] = waited(created, first_seen, now, rules)
        else:
            checkpoint.pending[run.id] = first_seen
    return out


def expire_gaps(checkpoint: Checkpoint, now: float, gap_timeout_seconds: float) -> list[int]:
    """Gives up on gaps missed for ``gap_timeout_seconds`` (rolled back or deleted); returns them."""
    expired = [gap for gap, seen in checkpoint.gaps.items() if now - seen >= gap_timeout_seconds]
    for gap in expired:
        del checkpoint.gaps[gap]
    return expired


def cut(before: Checkpoint, following: Checkpoint, unsent: Sequence[RunRow], now: float) -> Checkpoint:
    """Where a batch ends when only some of its runs were acknowledged (a stop in the middle of
    it): ``following``, with the high-water mark below the first run above ``before``'s that was
    not sent, and each such run below the mark waiting again as it waited before. Nothing not
    sent is passed over, and what was sent is not sent again."""
    out = following.copy()
    above = [run.id for run in unsent if run.id > before.high_water]
    if above:
        out.high_water = min(above) - 1
        out.pending = {run_pk: seen for run_pk, seen in out.pending.items() if run_pk <= out.high_water}
        out.gaps = {gap: seen for gap, seen in out.gaps.items() if gap <= out.high_water}
    for run in unsent:
        if run.id <= before.high_water:  # a pending run or a gap before the batch: it waits again
            out.pending[run.id] = before.pending.get(run.id, before.gaps.get(run.id, now))
    return out
