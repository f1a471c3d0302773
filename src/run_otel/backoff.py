"""How long to wait after a failure: doubling from a first wait up to a ceiling, with jitter.

One rule for every retry the bridge makes: a request to the receiver (``export/sinks.py``),
a poll after a failed one (``ops/daemon.py``) and a read after a lost connection
(``source/reconnect.py``). The jitter spreads many senders, or replicas, out of step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    initial: float
    ceiling: float
    jitter: float = 0.2  # each wait is within +-20% of its step
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, failures: int) -> float:
        """The wait after the ``failures``-th failure in a row (the first waits ``initial``)."""
        # The exponent is bounded: past it the ceiling holds anyway, and a float cannot take 2**1024.
        step = min(self.initial * 2 ** min(max(failures - 1, 0), 60), self.ceiling)
        return step * self.rng.uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else step
