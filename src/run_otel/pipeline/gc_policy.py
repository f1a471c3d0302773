"""Garbage collection between batches, not in the middle of them.

A batch allocates tens of thousands of short-lived rows, spans and encoded
bytes. Reference counting frees them; the cyclic collector only rescans them
while they live, and its full passes walk every long-lived object of the
process (SQLAlchemy, gRPC, protobuf): a quarter of a backfill's time. So
automatic passes are off while batches run, a young-generation pass runs after
every ``young_every`` batches and a full pass every ``full_every``, so cyclic
garbage stays bounded. A batch leaves a few dozen objects in cycles, while a
young pass walks every object the batches in flight still hold (the next
batch's rows, the spans being sent): 2 to 5 ms on a quiet machine, up to 14 ms
on a busy one, whatever the cycles it finds. After each batch that cost a
backfill about 2% of its time; after every 16th, with a few hundred objects
left in cycles between passes, an eighth of a percent. Nothing is frozen or
promoted: when the block ends, the collector carries on as before.
"""

from __future__ import annotations

import gc
from types import TracebackType


class BatchCollection:
    """A ``with`` block in which the collector runs only at ``after_batch``."""

    def __init__(self, young_every: int = 16, full_every: int = 64):
        self._young_every = young_every
        self._full_every = full_every
        self._batches = 0
        self._was_enabled = False

    def __enter__(self) -> BatchCollection:
        self._was_enabled = gc.isenabled()
        gc.disable()
        return self

    def after_batch(self) -> None:
        self._batches += 1
        if self._batches % self._full_every == 0:
            gc.collect(2)
        elif self._batches % self._young_every == 0:
            gc.collect(0)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self._was_enabled:
            gc.enable()
