"""Two ``diagnosis_run`` rows with one run id: which one owns the trace.

The rule. Of the rows whose run ids are equal ignoring letter case, the one with the lowest
primary key owns the run id's trace, and every tool row with that run id, in any case. Each
later row goes out as a trace of its own: its ids hash the normalized run id, ``#`` and its
own primary key (``span_data.duplicate_identity``); its root carries
``diagnosis.run.row_id`` and ``diagnosis.run.duplicate_of_row_id`` and links to the owning
row's root; it holds no tool rows (they are the owner's). It is logged with both row ids and
counted (``run_otel_duplicate_runs_total``) when acknowledged.

So one trace never holds two roots, no row is left out, and, the rule being a function of the
rows alone, every path (poll, backfill, ``export``, a re-send after a crash) sends the same
bytes. The state store keeps a later row's watch and rating under its own key (``key_of``),
so two rows never meet on the store's unique keys, which stalled every export before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..mapping.span_data import RunIdentity, duplicate_identity
from ..source.rows import RunRow, ToolRow
from ..source.run_ids import RunIdRows


class Row(Protocol):
    """A run row, or a rated one: what the rule reads of it."""

    @property
    def id(self) -> int: ...

    @property
    def run_id(self) -> str: ...


class DuplicateRule:
    def __init__(self, rows: RunIdRows | None):
        # None: nothing asked, every row owns its run id (a test's exporter, `show`).
        self._rows = rows

    def identities(self, runs: Sequence[Row]) -> dict[int, RunIdentity]:
        """The ids of the later rows among ``runs``, by primary key; an owner is not in it."""
        if not runs or self._rows is None or not self._rows.possible():
            return {}
        lowest = self._rows.lowest(run.run_id for run in runs)
        out = {}
        for run in runs:
            owner_pk, owner_run_id = lowest.get(run.run_id.casefold(), (run.id, run.run_id))
            if owner_pk < run.id:
                out[run.id] = duplicate_identity(run.run_id, run.id, owner_run_id, owner_pk)
        return out

    def row_ids(self, run_id: str) -> list[int] | None:
        """Every row with ``run_id`` in any letter case, for ``run-otel export``; None when only one can have it."""
        if self._rows is None or not self._rows.possible():
            return None
        return self._rows.row_ids(run_id)


def tools_of(runs: Sequence[RunRow], tools: dict[str, list[ToolRow]], ids: dict[int, RunIdentity]) -> list[list[ToolRow]]:
    """Each run's tool rows: an owner's are those of its run id in every letter case, a later row has none."""
    if not ids:
        return [tools.get(run.run_id, []) for run in runs]
    by_key: dict[str, dict[int, ToolRow]] = {}
    for run_id, rows in tools.items():
        by_key.setdefault(run_id.casefold(), {}).update((tool.id, tool) for tool in rows)
    return [[] if run.id in ids else sorted(by_key.get(run.run_id.casefold(), {}).values()) for run in runs]


def key_of(run: Row, identity: RunIdentity | None) -> str:
    """The key a run's watch and rating are kept under in the state store: the run id for the owning
    row (as earlier releases kept it), the identity's key for a later row."""
    return identity.key if identity is not None and identity.duplicate else run.run_id


def is_key_of(key: str, run: Row) -> bool:
    """Whether a state-store key (``key_of``) is ``run``'s: its run id, or a later row's key with its primary key."""
    return key == run.run_id or (key.endswith(f"#{run.id}") and key[: -len(f"#{run.id}")].casefold() == run.run_id.casefold())
