"""Garbage collection between batches: off inside them, a young pass every ``young_every``,
a full pass every ``full_every``, cyclic garbage still freed, and the process as it was after."""

from __future__ import annotations

import gc
import weakref

from run_otel.pipeline.gc_policy import BatchCollection


class Node:
    def __init__(self):
        self.other: Node | None = None


def _cycle() -> weakref.ref:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_the_collector_runs_only_between_batches_and_frees_cycles_there():
    passes: list[int] = []

    def note(phase, info):
        if phase == "start":
            passes.append(info["generation"])

    assert gc.isenabled()
    gc.callbacks.append(note)
    try:
        with BatchCollection(young_every=2, full_every=5) as collection:
            assert not gc.isenabled()
            cycles = []
            for batch in range(1, 11):
                cycles.append(_cycle())
                # The batch's live objects: enough to trigger passes if the collector were on.
                rows = [Node() for _ in range(50_000)]
                assert all(cycle() is not None for cycle in cycles)  # cycles outlive the batches' allocations ...
                del rows
                collection.after_batch()
                if batch % 2 and batch % 5:
                    assert cycles[-1]() is not None  # ... until a pass ...
                else:
                    assert all(cycle() is None for cycle in cycles)  # ... which frees them all
                    cycles.clear()
    finally:
        gc.callbacks.remove(note)
    assert passes == [0, 0, 2, 0, 0, 2]
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    try:
        with BatchCollection():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
