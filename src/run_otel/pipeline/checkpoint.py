"""Where the poller stands: the high-water mark, the pending runs and the gaps.

A plain value, saved by the state store (``state_store.py``) only after the receiver
acknowledged the batch it covers, as one row per shard.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

FORMAT_VERSION = 1


@dataclass
class Checkpoint:
    high_water: int
    # run primary key -> when it was first seen waiting (Unix seconds)
    pending: dict[int, float] = field(default_factory=dict)
    # missing primary key below the high-water mark -> when it was first missed
    gaps: dict[int, float] = field(default_factory=dict)
    # The first start's high-water mark; 0 for a checkpoint saved before it was recorded.
    start_mark: int = 0
    # Primary keys below start_mark of the runs in flight at the first start, which this bridge sends.
    taken_over: set[int] = field(default_factory=set)

    def copy(self) -> Checkpoint:
        return Checkpoint(self.high_water, dict(self.pending), dict(self.gaps), self.start_mark, set(self.taken_over))

    def values(self, now: float) -> dict[str, Any]:
        """The checkpoint as its row's values, saved at ``now``."""
        return {
            "format_version": FORMAT_VERSION,
            "high_water": self.high_water,
            "pending": json.dumps({str(k): v for k, v in sorted(self.pending.items())}),
            "gaps": json.dumps({str(k): v for k, v in sorted(self.gaps.items())}),
            "saved_at": now,
            "start_mark": self.start_mark,
            "taken_over": json.dumps(sorted(self.taken_over)),
        }

    @classmethod
    def from_row(cls, row: Any) -> Checkpoint:
        """The checkpoint a row holds; raises ValueError (or TypeError) when it is damaged."""
        if row.format_version != FORMAT_VERSION:
            raise ValueError(f"format version {row.format_version}")
        return cls(
            high_water=int(row.high_water),
            pending={int(k): float(v) for k, v in json.loads(row.pending).items()},
            gaps={int(k): float(v) for k, v in json.loads(row.gaps).items()},
            start_mark=int(row.start_mark or 0),
            taken_over={int(i) for i in json.loads(row.taken_over or "[]")},
        )
