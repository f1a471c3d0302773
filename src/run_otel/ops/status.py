"""`run-otel status`: where each shard's checkpoint stands against the source."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..config import Config
from ..pipeline.state_store import StateStore
from ..source.reader import Backlog, Source


@dataclass(frozen=True)
class ShardStatus:
    shard: str
    high_water_id: int
    newest_id: int
    lag_runs: int  # ids between the high-water mark and the newest run
    lag_seconds: float | None  # newest created_at minus the high-water run's created_at
    pending_runs: int
    gaps: int
    saved_at: float
    state_store: str
    ahead_runs: int = 0  # ids the high-water mark is above the newest run: the source went backwards

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Status:
    shards: list[ShardStatus]
    state_store: str
    source: str


def status(config: Config) -> Status:
    """Reads only: a state store that does not exist is an error, never created."""
    from ..factory import build_source, build_store

    store = build_store(config, create=False)
    try:
        source = build_source(config)
        try:
            return Status(shard_statuses(store, source), store.describe(), source.describe())
        finally:
            source.close()
    finally:
        store.close()


def shard_statuses(store: StateStore, source: Source) -> list[ShardStatus]:
    out = []
    for name, checkpoint, saved_at in store.load_all():
        backlog = source.backlog(checkpoint.high_water, source.clock) or Backlog(0, 0, None)
        out.append(
            ShardStatus(
                shard=name,
                high_water_id=checkpoint.high_water,
                newest_id=backlog.newest_id,
                lag_runs=backlog.runs,
                lag_seconds=backlog.seconds,
                pending_runs=len(checkpoint.pending),
                gaps=len(checkpoint.gaps),
                saved_at=saved_at,
                state_store=store.describe(),
                ahead_runs=max(checkpoint.high_water - backlog.newest_id, 0),
            )
        )
    return out
