"""Which runs of ``feedback.window_seconds`` a feedback pass reads, and what it costs.

The first pass after a start reads the whole window by primary-key range, as a pass always did.
Each later pass reads, by primary key, the runs exported since the pass before (the rating a
run had when it was read goes out with the next pass), and then the runs that may have been
rated since:

- with an index on ``diagnosis_run.updated_at`` (any index that leads with it; the agent's
  schema has none, ``run-otel check`` says whether this one does), the runs updated since the
  pass before, less ``RATING_COMMIT_SECONDS`` for a rating committed a while after the agent set
  its time: about the runs that finished or were rated since, whatever the window holds;
- without one, a primary-key range that reaches further back the rarer it is: pass ``p`` reads
  the runs created in the last ``8 × feedback.interval_seconds × 2^v`` (at least eight minutes
  × ``2^v``), where
  ``2^v`` is the largest power of two that divides ``p``, and every ``2^L`` passes the whole
  window and one such period more, so that a rating given just inside the window is still read.
  ``L`` is the largest level whose period is at most an eighth of the window. So a run is
  re-read every pass while it is younger than eight intervals (or eight minutes), and then at
  least every quarter of its age: a rating on an hour-old run is sent within 15 minutes. An average pass reads
  ``share()`` of the window: at the defaults (60 s, one day) about 1/37 of it, 39 minutes' worth.
"""

from __future__ import annotations

import math

YOUNG_INTERVALS = 8
YOUNG_SECONDS = 480.0  # with a short interval, still the last eight minutes every pass
RATING_COMMIT_SECONDS = 60.0


class AgingWindow:
    """The schedule without an updated_at index: how far back each pass reads."""

    def __init__(self, interval_seconds: float, window_seconds: float):
        self._interval = interval_seconds
        self._window = window_seconds
        self._young = young = max(YOUNG_INTERVALS * interval_seconds, YOUNG_SECONDS)
        # The whole window at least every eighth of it, and no level past the one that reaches it.
        if window_seconds > young:
            self.levels = max(
                0, min(math.floor(math.log2(window_seconds / 8 / interval_seconds)), math.ceil(math.log2(window_seconds / young)))
            )
        else:
            self.levels = 0
        # The whole window, and one period of its oldest level more: a rating given just inside it is read.
        self.kept_seconds = window_seconds + (2**self.levels) * interval_seconds if self.levels else window_seconds
        self.passes = 0  # the passes through since the start

    def age(self, number: int) -> float:
        """How far back pass ``number`` (from 1) reads."""
        level = (number & -number).bit_length() - 1  # the power of two that divides it
        if level >= self.levels:
            return self.kept_seconds
        return min(self._young * 2**level, self.kept_seconds)

    def share(self) -> float:
        """The part of the window an average pass reads (1 when every pass reads all of it)."""
        cycle = 2**self.levels
        return sum(min(self.age(n), self._window) for n in range(1, cycle + 1)) / cycle / self._window


def rows_a_pass(runs_in_window: int, interval_seconds: float, window_seconds: float) -> int:
    """About how many runs a pass without the updated_at index reads, for ``check``."""
    return math.ceil(runs_in_window * AgingWindow(interval_seconds, window_seconds).share())
