"""`run-otel rewind`: the checkpoint moved so that the next poll exports from a run again."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from ..config import Config
from ..pipeline.checkpoint import Checkpoint
from ..pipeline.named_lock import lock_holder
from ..pipeline.state_store import StateStore
from ..source.reader import Source


class Refused(RuntimeError):
    """An operation that would fight another instance, or has nothing to work on."""


def rewound(checkpoint: Checkpoint, first_id: int) -> Checkpoint:
    """The checkpoint from which the next poll reads ``first_id`` and everything after it again."""
    keep = first_id - 1
    return Checkpoint(
        high_water=keep,
        pending={i: seen for i, seen in checkpoint.pending.items() if i <= keep},
        gaps={i: seen for i, seen in checkpoint.gaps.items() if i <= keep},
        # Back: the runs from first_id are sent again, so their ratings follow. Forward: the runs
        # skipped are never sent, and a rating alone would open a trace with no run in it.
        start_mark=min(checkpoint.start_mark, keep) if keep <= checkpoint.high_water else keep,
        taken_over={i for i in checkpoint.taken_over if i <= keep},
    )


def rewind_line(shard: str, high_water: int, first_id: int) -> str:
    """What a rewind did; one forward skips runs instead of re-sending them."""
    moved = f"high-water id {high_water} -> {first_id - 1}; the next poll exports run ids from {first_id}."
    if first_id - 1 > high_water:
        skipped = f"{high_water + 1}" if first_id - 1 == high_water + 1 else f"{high_water + 1}..{first_id - 1}"
        return f"moved {shard} forward: {moved} Run ids {skipped} are skipped: they are never exported."
    if first_id - 1 == high_water:
        return f"{shard} unchanged: {moved}"
    return f"rewound {shard}: {moved} Runs already sent arrive again, byte-identical, and backends show them once."


def lease_holder(config: Config, source: Source) -> int | None:
    """The connection id holding this shard's HA lease, if another instance runs."""
    if not config.ha.enabled or source.engine.dialect.name != "mysql":
        return None
    from ..factory import lease_name

    return lock_holder(source.engine, lease_name(config))


def rewind(config: Config, first: int | datetime, force: bool, confirm: Callable[[str], bool]) -> str | None:
    """Moves the checkpoint so the next poll reads run id ``first`` (or the first run created at
    ``first``) again; None when ``confirm`` declined. Refused while another instance holds the HA
    lease or the store, unless ``force``."""
    from ..factory import build_source, build_store, build_store_lock

    source = build_source(config)
    try:
        holder = lease_holder(config, source)
        if holder and not force:
            raise Refused(
                f"another instance (connection {holder}) holds the HA lease "
                "and would overwrite the checkpoint; stop it, or use --force"
            )
        store = build_store(config, create=False)
        try:
            lock = build_store_lock(config)
            if not lock.acquire() and not force:
                raise Refused(
                    f"{lock.in_use()}, which would save its own checkpoint over this one; stop it first, or use --force"
                )
            try:
                return _rewind(store, source, first, confirm)
            finally:
                lock.release()
        finally:
            store.close()
    finally:
        source.close()


def _rewind(store: StateStore, source: Source, first: int | datetime, confirm: Callable[[str], bool]) -> str | None:
    current = store.load()
    if current is None:
        raise Refused(f"no checkpoint for {store.name} in {store.describe()}: set poll.start_from instead")
    first_id = first if isinstance(first, int) else source.first_id_created_at_or_after(source.clock.naive(first))
    newest = source.max_run_id()
    if first_id - 1 > max(newest, current.high_water):
        # Past every run written: each run the agent writes until then would be skipped, never sent.
        raise Refused(f"run id {first_id} is past the newest run id {newest}: the runs written until then would be skipped")
    skipped = first_id - 1 - current.high_water
    if skipped > 0:
        direction = f"forward, skipping {skipped} run id(s) that are then never exported,"
    else:
        direction = "back" if skipped < 0 else "nowhere"
    if not confirm(
        f"move {store.name} in {store.describe()} {direction} from high-water id {current.high_water} so the next poll "
        f"exports from run id {first_id}?"
    ):
        return None
    store.save(rewound(current, first_id), time.time())
    return rewind_line(store.name, current.high_water, first_id)
