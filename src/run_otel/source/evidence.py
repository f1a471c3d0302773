"""What the spans need from ``tool_invocation.retrieval_details``, and two ways to get it.

With content capture off, a span needs the evidence status, the number of refs
and their ``raw_path`` values, never the evidence text, which can be kilobytes
per ref. On MySQL and MariaDB the database computes exactly those with its JSON
functions (:func:`database_columns`), so the text never leaves it. Elsewhere,
and with capture on, Python parses the column (:func:`summarize`).

Both paths give the same :class:`Evidence`, including the warnings: a row the
database finds unusual (not valid JSON, or not an object) comes back as its raw
text and takes the Python path, so bad rows are judged one way only. A property
test holds the two paths equal on MariaDB.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

from sqlalchemy import case, func, literal_column
from sqlalchemy.sql.elements import ColumnElement

from .memo import Memo


class Evidence(NamedTuple):
    status: str | None  # evidence_status, when it is a string
    ref_count: int | None  # len(evidence_refs) when it is a list
    paths: tuple[str, ...]  # each ref's raw_path that is a string, in order
    # The refs themselves (with their text), only on the Python path: content capture needs them.
    refs: list | None = None
    refs_not_a_list: bool = False


_NOT_JSON: Final = "retrieval_details is not valid JSON"
_NOT_OBJECT: Final = "retrieval_details is not a JSON object"


def summarize(text: str | bytes | None, warnings: list[str], tool_id: int) -> Evidence | None:
    """The Python path: parse the column."""
    if text is None:
        return None
    return _with_warning(_parse(text), warnings, tool_id)


class EvidenceParser:
    """:func:`summarize`, parsing each distinct document once.

    Retrieval calls of one kind return the same document again and again (the same
    status and refs); those up to ``max_chars`` are remembered, at most ``size`` of
    them, so the memo stays a few megabytes whatever the data. Its values are shared,
    and nothing downstream changes them."""

    def __init__(self, size: int = 1024, max_chars: int = 4096):
        self._memo: Memo[str | bytes, Evidence | str] = Memo(_parse, size)
        self._max_chars = max_chars

    def summarize(self, text: str | bytes | None, warnings: list[str], tool_id: int) -> Evidence | None:
        if text is None:
            return None
        parsed = self._memo(text) if len(text) <= self._max_chars else _parse(text)
        return _with_warning(parsed, warnings, tool_id)


def _with_warning(parsed: Evidence | str, warnings: list[str], tool_id: int) -> Evidence | None:
    if isinstance(parsed, str):
        warnings.append(f"tool_invocation {tool_id}: {parsed}")
        return None
    return parsed


def _parse(text: str | bytes) -> Evidence | str:
    """Evidence, or why there is none."""
    try:
        details = json.loads(text)
    except (ValueError, TypeError):
        return _NOT_JSON
    if not isinstance(details, dict):
        return _NOT_OBJECT
    status = details.get("evidence_status")
    status = status if isinstance(status, str) else None
    refs = details.get("evidence_refs")
    if refs is None:
        return Evidence(status, None, ())
    if not isinstance(refs, list):
        return Evidence(status, None, (), refs_not_a_list=True)
    paths = tuple(ref["raw_path"] for ref in refs if isinstance(ref, dict) and isinstance(ref.get("raw_path"), str))
    return Evidence(status, len(refs), paths, refs)


# -- the database path (MySQL 8, MariaDB) -------------------------------------------------

DATABASE_COLUMN_COUNT: Final = 6


def database_columns(details: ColumnElement) -> list[ColumnElement]:
    """Six expressions that replace the column: its JSON type, the raw text unless it is an object,
    the status as JSON, the refs' JSON type and length, and the refs' raw_paths as a JSON array.

    Each parses the document once, and none is guarded by another: on MariaDB a JSON
    function returns NULL for text that is not JSON, and on MySQL the JSON column type
    holds only valid JSON. Whatever they return for a row that is not an object is ignored.
    """
    refs: ColumnElement = literal_column("'$.evidence_refs'")
    return [
        func.json_type(details),
        case((func.json_type(details) == "OBJECT", None), else_=details),
        func.json_extract(details, literal_column("'$.evidence_status'")),
        func.json_type(func.json_extract(details, refs)),
        func.json_length(details, refs),
        func.json_extract(details, literal_column("'$.evidence_refs[*].raw_path'")),
    ]


class DatabaseSummaries:
    """Turns the six values of :func:`database_columns` into Evidence.

    Statuses and raw_path lists repeat from row to row, so each distinct JSON text
    is parsed once (the memo is bounded; its values are immutable)."""

    def __init__(self, memo_size: int = 4096):
        self._status = Memo(_status_from_json, memo_size)
        self._paths = Memo(_paths_from_json, memo_size)

    def evidence(self, values: Sequence[Any]) -> Evidence | str | None:
        """Evidence, or the raw text of an unusual row for the Python path to judge."""
        document_type, raw, status_json, kind, length, paths = values
        if document_type != "OBJECT":
            return raw  # NULL, or text Python must judge (not JSON, or not an object)
        status = self._status(status_json) if status_json is not None else None
        if kind in (None, "NULL"):  # absent, or JSON null: as Python's details.get() sees it
            return Evidence(status, None, ())
        if kind != "ARRAY":
            return Evidence(status, None, (), refs_not_a_list=True)
        return Evidence(status, int(length), self._paths(paths) if paths else ())


def _status_from_json(text: str) -> str | None:
    status = json.loads(text)
    return status if isinstance(status, str) else None


def _paths_from_json(text: str) -> tuple[str, ...]:
    return tuple(p for p in json.loads(text) if isinstance(p, str))
