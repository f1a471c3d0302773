"""`show`'s rendering, in the fast loop: a failed tool's message cut between words, a link never
split over lines, and a link a terminal can open (OSC 8), written plain in a pipe."""

from __future__ import annotations

import io
import re
from datetime import datetime

import pytest
from rich.console import Console

from run_otel.cli.render import MESSAGE_WIDTH, print_trace
from run_otel.config import build_config
from run_otel.factory import build_mapper
from run_otel.ops.show import RunTrace
from run_otel.source.clock import SourceClock
from run_otel.source.rows import RunRow, ToolRow

LINK = "https://grafana.example.com/d/run-otel-exporter-health/exporter?orgId=1&var-shard=all&from=now-6h&to=now"
WORDS = "the retrieval index answered 503 while it was being rebuilt after the nightly compaction job"
MESSAGE = f"{WORDS} " * 3
# A link longer than the message's width, first: kept whole, never cut inside.
LINKED = f"{LINK} {WORDS}"
# What a terminal interprets rather than shows: styles and OSC 8 hyperlinks.
_ESCAPES = re.compile(r"\x1b\]8;[^\x1b]*\x1b\\|\x1b\[[0-9;]*m")


def _trace() -> tuple:
    config = build_config({"ui": {"tempo_url": "https://tempo.example.com/grafana"}})
    none = dict.fromkeys(("agent_flow", "intent", "release_outcome", "feedback", "total_token_count", "step_count"))
    run = RunRow(
        **none,
        id=1,
        run_id="run-1",
        session_id="s",
        status="FAILED",
        total_duration_ms=5000,
        tool_call_count=1,
        created_at=datetime(2026, 1, 1, 0, 0, 0),
        updated_at=datetime(2026, 1, 1, 0, 0, 5),
    )
    tool_none = ("step_id", "output_length", "retrieval_layer", "l0_match_count", "l1_match_count", "is_truncated")
    tools = [
        ToolRow(
            **dict.fromkeys((*tool_none, "relevance_level", "dedup_reason", "retrieval_details")),
            id=tool_id,
            run_id="run-1",
            tool_name=f"tool_{tool_id}",
            duration_ms=100,
            success=False,
            error_message=message,
            created_at=datetime(2026, 1, 1, 0, 0, tool_id),
        )
        for tool_id, message in ((1, MESSAGE), (2, LINKED))
    ]
    mapped = build_mapper(config, SourceClock(config.source.timezone)).map_run(run, tools)
    return config, RunTrace(run, mapped, [])


def _show(terminal: bool) -> str:
    config, trace = _trace()
    out = io.StringIO()
    # Narrower than every link: a renderer that wraps at the width splits them.
    console = Console(file=out, width=40, force_terminal=terminal, color_system="standard" if terminal else None)
    print_trace(console, config, trace)
    return out.getvalue()


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "tty"])
def test_a_failed_tools_message_is_cut_between_words_and_no_link_is_split(terminal):
    output = _show(terminal)
    lines = [_ESCAPES.sub("", line) for line in output.splitlines()]
    (words_line,) = [line for line in lines if "tool_1" in line]
    shown = words_line.split("ERROR tool_error: ", 1)[1]
    assert shown.endswith(" …"), shown
    kept = shown.removesuffix(" …")
    assert MESSAGE.startswith(kept) and MESSAGE[len(kept)] == " ", f"cut inside a word: {kept!r}"
    assert MESSAGE_WIDTH - 20 < len(shown) <= MESSAGE_WIDTH
    # Every link whole on one line: the message's, though longer than the width, and the trace's link into Tempo.
    (link_line,) = [line for line in lines if "tool_2" in line]
    assert link_line.split("ERROR tool_error: ", 1)[1] == f"{LINK} …"
    (tempo,) = [line for line in lines if line.startswith("open: ")]
    assert tempo.removeprefix("open: ").startswith("https://tempo.example.com/grafana/explore?") and len(tempo) > 40


def test_links_are_osc_8_hyperlinks_on_a_terminal_and_plain_in_a_pipe():
    tty = _show(terminal=True)
    assert re.search(r"\x1b\]8;[^;]*;" + re.escape(LINK) + r"\x1b\\", tty), repr(tty)
    assert re.search(r"\x1b\]8;[^;]*;https://tempo\.example\.com/grafana/explore\?", tty)
    assert "\x1b]8;" not in _show(terminal=False)
