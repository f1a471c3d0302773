"""Labels from the agent's rows: each value as a label, the bound of each label, and the SDK's limit above them.

NULL is ``none``; a value outside a documented enum (status, intent, layer, relevance) is ``other``.

``tool_name`` and ``dedup_reason`` hold whatever the agent writes: an agent that names its tools
per call makes a series per call, and a scrape of tens of megabytes. Each has a bound
(``metrics.max_tool_names``, ``metrics.max_dedup_reasons``): the first values seen since start
keep their own series; past the bound a new value is ``other``, in every instrument that carries
the label, so a counter and a histogram always agree. The first fold is a WARNING; each folded
value is counted (``run_otel_labels_folded_total``). Every other label takes the documented enums
(a value outside them is ``other`` too), so each instrument's distinct label sets have a ceiling,
and the SDK's cardinality limit is set above it: the SDK's own default (2,000 per instrument) would
otherwise fold what is past it into one series without a tool name or an outcome, silently.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from ..config import MetricsConfig
from ..mapping.times import ODD_TIME_KINDS
from ..source.rows import INTENTS, RELEASE_OUTCOMES, RELEVANCE_LEVELS, RETRIEVAL_LAYERS, TERMINAL_STATUSES, WAITING_STATUSES
from . import instruments as I

log = logging.getLogger(__name__)

NONE = "none"
OTHER = "other"

STATUSES = TERMINAL_STATUSES | {s for s in WAITING_STATUSES if s}


def label(value: object, known: frozenset | None = None) -> str:
    """A low-cardinality label: "none" for NULL, "other" for a value outside ``known``."""
    if value is None:
        return NONE
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    return text if known is None or text in known else OTHER


# The values a label can take besides those of its enum or bound: none (NULL) and other.
_EXTRA = 2


class LabelBound:
    """One label's distinct values: the first ``limit`` seen keep their name, any later one is ``other``."""

    def __init__(self, label_name: str, key: str, limit: int, folded: Callable[[str], None] | None = None):
        self.label_name, self.key, self.limit = label_name, key, limit
        self._kept: set[str] = set()
        self._folded = folded
        self._warned = False

    def __call__(self, value: object) -> str:
        text = label(value)
        if text in self._kept or text in (NONE, OTHER):
            return text
        if len(self._kept) < self.limit:
            self._kept.add(text)
            return text
        if not self._warned:
            self._warned = True
            log.warning(
                '%s: more than %d distinct values (%s): %r and every later new value count as %s="other" in every '
                "metric until the next start, in run_otel_labels_folded_total too; raise %s to keep more apart",
                self.label_name,
                self.limit,
                self.key,
                text,
                self.label_name,
                self.key,
            )
        if self._folded is not None:
            self._folded(self.label_name)
        return OTHER


class LabelBounds:
    """The bounded labels, each folded the same way wherever it appears (live metrics or a history)."""

    def __init__(self, max_tool_names: int, max_dedup_reasons: int, folded: Callable[[str], None] | None = None):
        self.tool_name = LabelBound("tool_name", "metrics.max_tool_names", max_tool_names, folded)
        self.dedup_reason = LabelBound("dedup_reason", "metrics.max_dedup_reasons", max_dedup_reasons, folded)

    @classmethod
    def of(cls, config: MetricsConfig, folded: Callable[[str], None] | None = None) -> LabelBounds:
        return cls(config.max_tool_names, config.max_dedup_reasons, folded)

    def values_per_label(self, feedback_labels: int) -> dict[str, int]:
        """The most distinct values each label of the catalogue can take."""
        return {
            "status": len(STATUSES) + _EXTRA,
            "intent": len(INTENTS) + _EXTRA,
            "release_outcome": len(RELEASE_OUTCOMES) + _EXTRA,
            "tool_name": self.tool_name.limit + _EXTRA,
            "retrieval_layer": len(RETRIEVAL_LAYERS) + _EXTRA,
            "relevance_level": len(RELEVANCE_LEVELS) + _EXTRA,
            "success": 3,  # true, false, none
            "layer": 2,  # L0, L1
            "dedup_reason": self.dedup_reason.limit + _EXTRA,
            "feedback": feedback_labels + 1,  # and other
            "label": 2,  # the bounded labels themselves
            "reason": 4,  # too_large, unmappable, and room for one more
            "kind": 2 + len(ODD_TIME_KINDS),  # late rows' tool and completion, and the odd times' kinds
            "outcome": 2,  # ok, error
            "shard": 1,  # this instance's
        }

    def cardinality_limit(self, instrument: I.Instrument, feedback_labels: int) -> int:
        """Above the most label sets ``instrument`` can have, and never below the SDK's own default."""
        sizes = self.values_per_label(feedback_labels)
        return max(2000, math.prod(sizes[name] for name in instrument.labels) + 1)
