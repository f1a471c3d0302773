"""The one backoff: doubling waits up to a ceiling, each within its jitter."""

from __future__ import annotations

import random

from run_otel.backoff import Backoff


def test_waits_double_from_the_first_up_to_the_ceiling_without_jitter():
    backoff = Backoff(0.5, 8.0, jitter=0)
    assert [backoff.delay(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert backoff.delay(10_000) == 8.0  # no overflow however long the outage


def test_each_wait_is_within_its_jitter_and_the_waits_are_not_in_step():
    backoff = Backoff(1.0, 60.0, jitter=0.2, rng=random.Random(7))
    for failures in range(1, 10):
        step = min(2 ** (failures - 1), 60)
        waits = [backoff.delay(failures) for _ in range(50)]
        assert all(0.8 * step <= w <= 1.2 * step for w in waits)
        assert len(set(waits)) > 40  # spread out: replicas retrying together do not stay in step
