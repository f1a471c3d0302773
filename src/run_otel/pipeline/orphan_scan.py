"""A shard's look for tool rows whose run never appears, as the state store keeps it (``orphans.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..source.tool_orphans import OrphanRow

# Run ids kept for `check`: the first found; the rows of any more are counted only.
KEPT = 1_000


@dataclass
class OrphanScan:
    """A shard's look: the tool id looked up to, and the orphans found, by run id: [rows, first tool id, its created_at]."""

    cursor: int
    runs: dict[str, list] = field(default_factory=dict)
    others: int = 0  # orphan rows of run ids past KEPT

    @property
    def rows(self) -> int:
        return sum(entry[0] for entry in self.runs.values()) + self.others

    def add(self, rows: list[OrphanRow]) -> None:
        for row in rows:
            entry = self.runs.get(row.run_id)
            if entry is not None:
                entry[0] += 1
            elif len(self.runs) < KEPT:
                self.runs[row.run_id] = [1, row.id, str(row.created_at)]
            else:
                self.others += 1
