"""Column values read by meaning, whatever type the column drifted to.

The documented schema holds ``success`` as BOOLEAN and the counts as INT, but
a migration may change them: ``success`` as VARCHAR holding ``'false'`` must
still be a failure (Python's ``bool('false')`` is True), and a count holding
text must not reach the metrics, where it would raise after the checkpoint
was saved. A row is read once, here, before it is mapped or counted: a value
that means nothing becomes None and a row warning naming it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from decimal import Decimal
from operator import itemgetter
from typing import Any, Final

from .rows import RunRow, ToolRow

_TRUE: Final = frozenset({"1", "true", "t", "yes", "y", "on"})
_FALSE: Final = frozenset({"0", "false", "f", "no", "n", "off"})
_RUN_COUNTS: Final = ("total_duration_ms", "total_token_count", "step_count", "tool_call_count")
_TOOL_COUNTS: Final = ("step_id", "output_length", "l0_match_count", "l1_match_count", "duration_ms")
_TOOL_FLAGS: Final = ("success", "is_truncated")
# Text columns: a BLOB or VARBINARY hands over bytes, which the mapper (compiled: its annotations) refuses.
_RUN_TEXTS: tuple[str, ...] = ("run_id", "session_id", "status", "agent_flow", "intent", "release_outcome", "feedback")
_RUN_TEXTS += ("query", "answer", "published_result")
_TOOL_TEXTS: tuple[str, ...] = ("run_id", "tool_name", "retrieval_layer", "relevance_level", "dedup_reason")
_TOOL_TEXTS += ("retrieval_details", "error_message", "input_params", "output_preview")


class Unreadable(ValueError):
    """A value that means no boolean or count."""


def as_flag(value: Any) -> bool | None:
    """True/False from 0/1, true/false, yes/no (any case, any column type); None stays None."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (bytes, bytearray)):
        # BIT(1) arrives as one byte; a string column as bytes under some drivers.
        value = int.from_bytes(value, "big") if len(value) == 1 and value[0] in (0, 1) else value.decode("utf-8", "replace")
    if isinstance(value, (int, float, Decimal)) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise Unreadable(value)


def as_text(value: Any) -> Any:
    """Bytes as UTF-8 text, invalid sequences replaced; anything else as it is."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return value


def _texts(row: tuple, values: list | None, positions: tuple[int, ...]) -> list | None:
    """``values`` with the text columns that arrived as bytes decoded."""
    for i in positions:
        value = row[i]
        if type(value) in _BINARY:
            if values is None:
                values = list(row)
            values[i] = as_text(value)
    return values


def as_count(value: Any) -> int | None:
    """An integer from an int, a whole float or decimal, or text holding one; None stays None."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, (float, Decimal)) and value == int(value):
        return int(value)
    if isinstance(value, (str, bytes, bytearray)):
        text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value
        try:
            return int(text.strip())
        except ValueError:
            pass
    raise Unreadable(value)


def _positions(fields: tuple[str, ...], flags: tuple[str, ...], counts: tuple[str, ...]) -> tuple:
    """(index, column, reader) for each column read here: flags first, then counts."""
    return tuple((fields.index(c), c, as_flag) for c in flags) + tuple((fields.index(c), c, as_count) for c in counts)


_RUN_READS: Final = _positions(RunRow._fields, (), _RUN_COUNTS)
_TOOL_READS: Final = _positions(ToolRow._fields, _TOOL_FLAGS, _TOOL_COUNTS)
_RUN_TEXT_AT: Final = tuple(RunRow._fields.index(c) for c in _RUN_TEXTS)
_TOOL_TEXT_AT: Final = tuple(ToolRow._fields.index(c) for c in _TOOL_TEXTS)
# The text columns' values in one C call: the check for bytes runs on every row.
_run_texts = itemgetter(*_RUN_TEXT_AT)
_tool_texts = itemgetter(*_TOOL_TEXT_AT)
_BINARY: Final = frozenset({bytes, bytearray, memoryview})


def _read(row: tuple, table: str, reads: tuple, warnings: list[str]) -> list | None:
    """The row's values with the columns read, or None when each already was what it means.

    By position, into a list made only on a change: it runs for every row of a backfill,
    and a namedtuple's _replace by keyword cost more than the reading itself."""
    values: list | None = None
    for i, column, reader in reads:
        value = row[i]
        if value is None:
            continue  # NULL means NULL in any type, without a call
        # The common types, without a call: a count as an int, a flag as a bool or TINYINT(1).
        kind = type(value)
        if reader is as_count:
            if kind is int:
                continue
        elif kind is bool:
            continue
        elif kind is int and (value == 0 or value == 1):
            values = values if values is not None else list(row)
            values[i] = value == 1
            continue
        try:
            read = reader(value)
        except Unreadable:
            where = f"{table} {row[0]}" if table == "tool_invocation" else table  # both rows start with id
            warnings.append(f"{where}: {column} {value!r} is not a {'boolean' if reader is as_flag else 'number'}; left out")
            read = None
        if read is not value:
            if values is None:
                values = list(row)
            values[i] = read
    return values


def read_run(run: RunRow, warnings: list[str]) -> RunRow:
    """The run with its counts as ints (or None, with a warning)."""
    values = _read(run, "diagnosis_run", _RUN_READS, warnings)
    if not _BINARY.isdisjoint(map(type, _run_texts(run))):  # a text column drifted to a binary type
        values = _texts(run, values, _RUN_TEXT_AT)
    # tuple.__new__ skips the namedtuple's keyword-taking __new__, a tenth of a row's reading.
    return run if values is None else tuple.__new__(RunRow, values)


def read_tool(tool: ToolRow, warnings: list[str]) -> ToolRow:
    """The tool call with its flags as bools and its counts as ints (or None, with a warning)."""
    values = _read(tool, "tool_invocation", _TOOL_READS, warnings)
    if not _BINARY.isdisjoint(map(type, _tool_texts(tool))):
        values = _texts(tool, values, _TOOL_TEXT_AT)
    return tool if values is None else tuple.__new__(ToolRow, values)


def read_rows(
    run: RunRow, tools: Sequence[ToolRow], warnings: list[str], quiet_tools: Collection[int] = ()
) -> tuple[RunRow, list[ToolRow]]:
    """A run and its tool rows read by meaning, the way every path reads them before it maps them;
    the tool rows in ``quiet_tools`` add no warnings (they warned when they were first read)."""
    read = read_run(run, warnings)
    if not quiet_tools:  # every first send: no membership test per tool
        return read, [read_tool(tool, warnings) for tool in tools]
    quiet: list[str] = []
    return read, [read_tool(tool, quiet if tool.id in quiet_tools else warnings) for tool in tools]
