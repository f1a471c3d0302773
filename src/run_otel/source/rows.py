"""The rows run-otel reads, as plain values, and the enums their columns hold.

Named tuples: built once per row on the hot path, they cost a fraction of a
frozen dataclass.

``source`` builds these from SQL results and ``mapping`` consumes them, so
neither needs to know about the other.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final, NamedTuple

TERMINAL_STATUSES: Final = frozenset({"SUCCESS", "FALLBACK", "FAILED", "CANCELLED"})
WAITING_STATUSES: Final = frozenset({"PENDING", "RUNNING", None})
INTENTS: Final = frozenset({"SYSTEM_CHAT", "KNOWLEDGE_QUERY", "DIAGNOSIS"})
RELEASE_OUTCOMES: Final = frozenset({"SUCCESS", "FALLBACK", "FAILED", "CANCELLED"})
RELEVANCE_LEVELS: Final = frozenset({"PRECISE", "HIGHLY_RELEVANT", "REFERENCE", "DEDUPED"})
RETRIEVAL_LAYERS: Final = frozenset({"L0", "L1", "L0+L1"})


def is_terminal(status: str | None) -> bool:
    """SUCCESS, FALLBACK, FAILED, CANCELLED, and any unknown non-NULL status."""
    return status not in WAITING_STATUSES


class RunRow(NamedTuple):
    id: int
    run_id: str
    session_id: str | None
    status: str | None
    agent_flow: str | None
    intent: str | None
    release_outcome: str | None
    feedback: str | None
    total_duration_ms: int | None
    total_token_count: int | None
    step_count: int | None
    tool_call_count: int | None
    # datetime when valid; a zero date may arrive as a string or None.
    created_at: datetime | Any
    updated_at: datetime | Any
    # Read only when content capture is on.
    query: str | None = None
    answer: str | None = None
    published_result: str | None = None


class ToolRow(NamedTuple):
    id: int
    run_id: str
    step_id: int | None
    tool_name: str | None
    output_length: int | None
    retrieval_layer: str | None
    l0_match_count: int | None
    l1_match_count: int | None
    is_truncated: bool | None
    relevance_level: str | None
    dedup_reason: str | None
    # The JSON text, or (MySQL/MariaDB, capture off) the database's evidence.Evidence summary.
    retrieval_details: str | Any | None
    duration_ms: int | None
    success: bool | None
    error_message: str | None
    created_at: datetime | Any
    # Read only when content capture is on.
    input_params: str | None = None
    output_preview: str | None = None


class FeedbackRow(NamedTuple):
    """A rated run, as the feedback recheck reads it: no content, only what the span and metric need."""

    id: int
    run_id: str
    intent: str | None
    feedback: str
    updated_at: datetime | Any
    # Where the run's span lies, so the rating's span stays inside it.
    created_at: datetime | Any = None
    total_duration_ms: int | None = None


def run_id_text(value: object) -> str:
    """A run_id as text: a VARBINARY column hands over bytes."""
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)
