"""Which rows share a run id, in any letter case: what the duplicate rule
(``pipeline/duplicates.py``) asks the database.

On the agent's documented schema, the UNIQUE key on ``diagnosis_run.run_id`` in a
case-insensitive collation makes two rows with one run id impossible, in any letter case:
then nothing is asked. Without it (a migration dropped the key, or the column's collation
tells letter cases apart, as a ``_bin`` one and SQLite do), one index-bounded read per batch
finds the rows with the batch's run ids. A case-sensitive column is asked for the run id as
written, in lower case and in upper case; other mixes of case are not found there.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable

from sqlalchemy import select, text

from .reader import Source
from .rows import run_id_text
from .schema import diagnosis_run

log = logging.getLogger(__name__)

# The schema is looked at again this often: a migration may drop the key while run-otel runs.
SCHEMA_RECHECK_SECONDS = 600.0
_CHUNK = 500

# From SHOW CREATE TABLE, which reads no table: information_schema is a full scan by MariaDB's count.
_UNIQUE_RUN_ID = re.compile(r"^\s*UNIQUE KEY `[^`]+` \(`run_id`\)", re.M)
_RUN_ID_COLUMN = re.compile(r"^\s*`run_id` (.*)$", re.M)
_COLLATE = re.compile(r"\bCOLLATE[= ]\s*'?(\w+)", re.I)


def schema_facts(create_table: str) -> tuple[bool, str]:
    """Whether ``run_id`` has a UNIQUE key of its own (no prefix), and its column's collation ('binary' for
    a binary type), from diagnosis_run's SHOW CREATE TABLE. A column with no COLLATE of its own has the
    table's, and a table with none its character set's default, which is case-insensitive."""
    column = _RUN_ID_COLUMN.search(create_table)
    definition = column[1] if column else ""
    if re.match(r"(var)?binary|\w*blob", definition, re.I) or re.search(r"CHARACTER SET binary", definition, re.I):
        collation = "binary"
    else:
        found = _COLLATE.search(definition) or _COLLATE.search(create_table.rsplit(")", 1)[-1])
        collation = found[1] if found else "_ci"
    return _UNIQUE_RUN_ID.search(create_table) is not None, collation


def _spellings(run_id: str) -> set[str]:
    """The run id as a case-sensitive column may hold it: as written, and the part after a prefix in either case."""
    return {run_id, run_id.lower(), run_id.upper(), run_id[:4] + run_id[4:].lower(), run_id[:4] + run_id[4:].upper()}


class RunIdRows:
    def __init__(
        self, source: Source, recheck_seconds: float = SCHEMA_RECHECK_SECONDS, clock: Callable[[], float] = time.monotonic
    ):
        self._source = source
        self._recheck = recheck_seconds
        self._clock = clock
        self._possible: bool | None = None
        self._checked_at = 0.0
        self._folds = False  # whether the column's collation finds a run id in any letter case

    def possible(self) -> bool:
        """Whether two rows may share a run id (in any letter case) in this schema; looked at again now and then."""
        if self._possible is None or self._clock() - self._checked_at >= self._recheck:
            reason, before = self.why_possible(), self._possible
            self._possible, self._checked_at = reason is not None, self._clock()
            if reason is not None and not before:  # the parts share one: said once, and again after a change
                log.info(
                    "%s: two diagnosis_run rows may share a run id (%s); the duplicate rule reads them",
                    self._source.describe(),
                    reason,
                )
        return self._possible

    def why_possible(self) -> str | None:
        """Why two rows may share a run id here, or None when the schema forbids it."""
        if self._source.engine.dialect.name != "mysql":
            self._folds = False
            return "the column tells letter cases apart (SQLite)"
        rows = self._source.fetch(text(f"SHOW CREATE TABLE {diagnosis_run.name}"))
        unique, name = schema_facts(str(rows[0][1]) if rows else "")
        self._folds = name.endswith("_ci")
        if not unique:
            return "diagnosis_run.run_id has no UNIQUE key of its own"
        if not self._folds:
            return f"diagnosis_run.run_id's collation ({name}) tells letter cases apart"
        return None

    def _asked(self, run_id: str) -> set[str]:
        """The spellings to ask for: the run id alone where the collation finds every case of it."""
        return {run_id} if self._folds else _spellings(run_id)

    def lowest(self, run_ids: Iterable[str]) -> dict[str, tuple[int, str]]:
        """Each run id (case folded) -> the lowest primary key of the rows with it, in any letter case,
        and the run id as that row writes it: one ``run_id IN (...)`` read per chunk, by the run_id index."""
        wanted = sorted({spelling for run_id in run_ids for spelling in self._asked(run_id)})
        out: dict[str, tuple[int, str]] = {}
        for start in range(0, len(wanted), _CHUNK):
            chunk = wanted[start : start + _CHUNK]
            statement = select(diagnosis_run.c.id, diagnosis_run.c.run_id).where(diagnosis_run.c.run_id.in_(chunk))
            for pk, run_id in self._source.fetch(statement):
                name = run_id_text(run_id)
                key = name.casefold()
                if key not in out or int(pk) < out[key][0]:
                    out[key] = (int(pk), name)
        return out

    def row_ids(self, run_id: str) -> list[int]:
        """The primary keys of every row with ``run_id``, in any letter case, in order."""
        key = run_id.casefold()
        statement = select(diagnosis_run.c.id, diagnosis_run.c.run_id).where(
            diagnosis_run.c.run_id.in_(sorted(self._asked(run_id)))
        )
        return sorted(int(pk) for pk, name in self._source.fetch(statement) if run_id_text(name).casefold() == key)
