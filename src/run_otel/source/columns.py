"""The columns run-otel reads: every field of the row types, in their order, so
rows build positionally. User content columns come last, and only with
``content.capture = true``; ``self_evaluation`` and ``agent_reasoning_audit``
are never read."""

from __future__ import annotations

from ..config import ContentConfig
from .rows import RunRow, ToolRow

RUN_CONTENT_COLUMNS = ("query", "answer", "published_result")
TOOL_CONTENT_COLUMNS = ("input_params", "output_preview")
RUN_COLUMNS = tuple(name for name in RunRow._fields if name not in RUN_CONTENT_COLUMNS)
TOOL_COLUMNS = tuple(name for name in ToolRow._fields if name not in TOOL_CONTENT_COLUMNS)


def columns_read(content: ContentConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The ``diagnosis_run`` and ``tool_invocation`` columns read under ``content``."""
    if content.capture:
        return RUN_COLUMNS + RUN_CONTENT_COLUMNS, TOOL_COLUMNS + TOOL_CONTENT_COLUMNS
    return RUN_COLUMNS, TOOL_COLUMNS
