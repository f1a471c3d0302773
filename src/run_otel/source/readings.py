"""Column values read by meaning, whatever type the column drifted to.

The documented schema holds ``success`` as BOOLEAN and the counts as INT, but
a migration may change them: ``success`` as VARCHAR holding ``'false'`` must
still be a failure (Python's ``bool('false')`` is True), and a count holding
text must not reach the metrics, where it would raise after the checkpoint
was saved. A row is read once, here, before it is mapped or counted: a value
that means nothing becomes None and a row warning naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

from .rows import RunRow, ToolRow

_TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})
_FALSE = frozenset({"0", "false", "f", "no", "n", "off"})
_RUN_COUNTS = ("total_duration_ms", "total_token_count", "step_count", "tool_call_count")
_TOOL_COUNTS = ("step_id", "output_length", "l0_match_count", "l1_match_count", "duration_ms")
_TOOL_FLAGS = ("success", "is_truncated")


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


def _read(row: Any, table: str, columns: tuple[str, ...], reader: Callable[[Any], Any], warnings: list[str]) -> dict[str, Any]:
    changed: dict[str, Any] = {}
    for column in columns:
        value = getattr(row, column)
        try:
            read = reader(value)
        except Unreadable:
            where = f"{table} {row.id}" if table == "tool_invocation" else table
            warnings.append(f"{where}: {column} {value!r} is not a {'boolean' if reader is as_flag else 'number'}; left out")
            read = None
        if read is not value:
            changed[column] = read
    return changed


def read_run(run: RunRow, warnings: list[str]) -> RunRow:
    """The run with its counts as ints (or None, with a warning)."""
    changed = _read(run, "diagnosis_run", _RUN_COUNTS, as_count, warnings)
    return run._replace(**changed) if changed else run


def read_tool(tool: ToolRow, warnings: list[str]) -> ToolRow:
    """The tool call with its flags as bools and its counts as ints (or None, with a warning)."""
    changed = _read(tool, "tool_invocation", _TOOL_FLAGS, as_flag, warnings)
    changed.update(_read(tool, "tool_invocation", _TOOL_COUNTS, as_count, warnings))
    return tool._replace(**changed) if changed else tool
