"""Reading `success` by meaning, in the fast loop: whatever type the column drifted to, 'false'
is a failure, and a value that means nothing is left out with a warning, never read as truthy."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

import pytest

from run_otel.source.readings import read_tool
from run_otel.source.rows import ToolRow

NONE = dict.fromkeys(
    (
        "step_id",
        "output_length",
        "retrieval_layer",
        "l0_match_count",
        "l1_match_count",
        "is_truncated",
        "relevance_level",
        "dedup_reason",
        "retrieval_details",
        "duration_ms",
        "error_message",
    )
)


def _tool(success) -> ToolRow:
    return ToolRow(**NONE, id=5, run_id="run-1", tool_name="t", success=success, created_at=datetime(2026, 1, 1))


@pytest.mark.parametrize(
    ("stored", "meant"),
    [
        (True, True),
        (False, False),
        (1, True),
        (0, False),
        (Decimal(0), False),
        (b"\x00", False),  # BIT(1)
        (b"\x01", True),
        ("false", False),  # VARCHAR: bool("false") would be True
        (" FALSE ", False),
        ("no", False),
        ("0", False),
        (b"true", True),
        ("Yes", True),
        (None, None),
    ],
)
def test_success_is_read_by_meaning_whatever_the_column_type(stored, meant):
    warnings: list[str] = []
    assert read_tool(_tool(stored), warnings).success is meant
    assert warnings == []


@pytest.mark.parametrize("stored", ["maybe", 2, "", b"\x02\x03"])
def test_a_success_that_means_nothing_is_left_out_with_a_warning(stored):
    warnings: list[str] = []
    assert read_tool(_tool(stored), warnings).success is None
    assert warnings == [f"tool_invocation 5: success {stored!r} is not a boolean; left out"]
