"""What a batch's rows say about how each run goes out, beyond its own columns, and what is told
of them once the batch is acknowledged.

- A later row with a run id an earlier row has goes out under ids of its own, with no tool
  rows (``duplicates.py``).
- A run first sent incomplete is sent again as it was first sent: the root's bytes from the
  state store, the tool rows sent with it under it, and, once it finished, its ``completed``
  span with every tool row since under that span (``first_sends.py``).
- A run with more tool rows than ``trace.max_spans_per_trace`` loses the rest: a WARNING naming
  the run, and ``run_otel_dropped_spans_total{reason="span_limit"}``.
- Odd times the mapper read by its rules are counted (``mapping/times.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ..mapping.span_data import RunIdentity
from ..mapping.spans import Late
from ..source.rows import FeedbackRow, RunRow, ToolRow, is_terminal
from .duplicates import DuplicateRule, tools_of
from .first_sends import FirstSend, Sent
from .recorder import Recorder
from .state_store import StateStore

log = logging.getLogger(__name__)

# run_otel_dropped_spans_total's reason for the tool rows past trace.max_spans_per_trace.
SPAN_LIMIT = "span_limit"


class Entry(NamedTuple):
    """One run to map: its rows, how it goes out, and whose ids its spans get."""

    row: RunRow
    tools: Sequence[ToolRow]
    incomplete: bool
    late: Late | None = None
    identity: RunIdentity | None = None
    first_root: bytes | None = None  # the root as first sent, for a run first sent incomplete


@dataclass
class Noted:
    """What a batch's rows raised besides row warnings, told once it is acknowledged."""

    first_sends: list[Sent] = field(default_factory=list)
    duplicates: list[tuple[str, int, int, str]] = field(default_factory=list)  # run id, row, owner row, trace id
    cuts: list[tuple[str, int, int]] = field(default_factory=list)  # run id, tool rows left out, the limit
    odd_times: dict[str, int] = field(default_factory=dict)

    def add_times(self, counts: dict[str, int]) -> None:
        for kind, count in counts.items():
            self.odd_times[kind] = self.odd_times.get(kind, 0) + count

    def tell(self, recorder: Recorder) -> None:
        for run_id, row, owner, trace_id in self.duplicates:
            log.warning(
                "run %s: diagnosis_run row %d has the run id of row %d, which owns its trace and tool rows: "
                "sent as a trace of its own (%s), linked to it",
                run_id,
                row,
                owner,
                trace_id,
            )
        if self.duplicates:
            recorder.duplicate_runs(len(self.duplicates))
        for run_id, left_out, limit in self.cuts:
            log.warning(
                "run %s: %d tool row(s) past trace.max_spans_per_trace (%d) left out of its trace", run_id, left_out, limit
            )
            recorder.spans_dropped(SPAN_LIMIT, left_out)
        for kind, count in self.odd_times.items():
            recorder.odd_times(kind, count)


class RowShapes:
    """Plans each run's entry from the rows and the state store; ``store`` None: nothing was sent incomplete before."""

    def __init__(self, duplicates: DuplicateRule, store: StateStore | None = None):
        self.duplicates = duplicates
        self._store = store

    def plan(
        self, runs: Sequence[RunRow], tools: dict[str, list[ToolRow]], incomplete_ids: frozenset[int] | set[int]
    ) -> list[Entry]:
        ids = self.duplicates.identities(runs)
        firsts = self.first_sends([run.id for run in runs])
        entries = []
        for run, run_tools in zip(runs, tools_of(runs, tools, ids)):
            first = firsts.get(run.id)
            if first is None:
                entries.append(Entry(run, run_tools, run.id in incomplete_ids, None, ids.get(run.id)))
                continue
            # As first sent: the stored root, the tool rows sent with it under it, and once finished the
            # completed span with the rest under it. Not finished: the rest under the root, as the late
            # pass sends them when the run's watch ends unfinished.
            every = frozenset(tool.id for tool in run_tools)
            late = Late(every, is_terminal(run.status), first.tool_ids)
            entries.append(Entry(run, run_tools, not is_terminal(run.status), late, ids.get(run.id), first.root))
        return entries

    def plan_late(self, runs: Sequence[tuple[RunRow, Sequence[ToolRow], Late]]) -> list[Entry]:
        ids = self.duplicates.identities([run for run, _tools, _late in runs])
        return [Entry(run, [] if run.id in ids else tools, False, late, ids.get(run.id)) for run, tools, late in runs]

    def first_sends(self, run_pks: Sequence[int]) -> dict[int, FirstSend]:
        return self._store.first_sends(run_pks) if self._store is not None and run_pks else {}

    def rated(self, rows: Sequence[FeedbackRow]) -> tuple[dict[int, RunIdentity], set[int]]:
        """For ratings: the later rows' ids, and the rows first sent incomplete (their rating hangs under the completed span)."""
        return self.duplicates.identities(rows), set(self.first_sends([row.id for row in rows]))

    def acknowledged(self, noted: Noted, now: float) -> None:
        """Records the runs just sent incomplete for the first time: a later send sends them as they were."""
        if self._store is not None and noted.first_sends:
            self._store.save_first_sends(noted.first_sends, now)


def cut_by_limit(tools: Sequence[ToolRow], late: Late | None, limit: int) -> int:
    """How many tool rows that were to be sent are past ``limit`` and left out."""
    if len(tools) <= limit:
        return 0
    if late is None:
        return len(tools) - limit
    return sum(1 for tool in tools[limit:] if tool.id in late.tool_ids)
