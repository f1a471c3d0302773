"""Feedback values the config does not map: said once by the daemon, counted by `check`.

A value no ``feedback.scores`` or ``feedback.negative`` label matches counts as
"other" in the metrics, so the negative-feedback alert never sees it. That is
silent unless said: the daemon warns once per such value, and `check` names
every one present in the feedback window, with how many runs carry it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime

from ..config import FeedbackConfig
from ..source.clock import SourceClock
from ..source.reader import Source

log = logging.getLogger(__name__)

# Free-text feedback would make every value new: past this many, stop naming them.
MAX_WARNED = 100


class UnmappedFeedback:
    """Warns once per feedback value the config maps to no label."""

    def __init__(self, config: FeedbackConfig):
        self._config = config
        self._warned: set[str] = set()

    def note(self, values: Iterable[str]) -> None:
        for value in values:
            if value in self._warned or len(self._warned) > MAX_WARNED or self._config.label_of(value) is not None:
                continue
            self._warned.add(value)
            if len(self._warned) > MAX_WARNED:
                log.warning("more than %d distinct unmapped feedback values: no more are named", MAX_WARNED)
                continue
            log.warning(
                'feedback value %r matches no label in feedback.scores or feedback.negative: it counts as "other" '
                "and never in the negative-feedback alert; add it to [feedback] scores (and negative)",
                value,
            )


def unmapped_in_window(
    config: FeedbackConfig, source: Source, clock: SourceClock, now: float | None = None
) -> tuple[int, Counter[str]]:
    """The rated runs created within feedback.window_seconds, and how many carry each unmapped
    value: the feedback pass's own primary-key range read."""
    now = time.time() if now is None else now
    since = clock.naive(datetime.fromtimestamp(now - config.window_seconds, UTC))
    rated = source.rated_runs(source.first_id_created_at_or_after(since), source.max_run_id())
    return len(rated), Counter(row.feedback for row in rated if config.label_of(row.feedback) is None)
