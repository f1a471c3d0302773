"""The tool feed on SQLite, in the fast loop: what it holds, what it gives each export and the
late-row watch, where it stands after a restart, and what it does when it is far behind.
What it costs MariaDB is in test_database_cost.py."""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlalchemy import insert

from run_otel.config import build_config
from run_otel.factory import build_source, build_store
from run_otel.pipeline import tool_feed
from run_otel.pipeline.tool_feed import ToolFeed
from run_otel.pipeline.watch import Watched
from run_otel.source.rows import RunRow
from run_otel.source.schema import metadata, tool_invocation

T = datetime(2026, 12, 1, 12, 0, 0)


@pytest.fixture
def parts(tmp_path):
    config = build_config(
        {"source": {"url": f"sqlite:///{tmp_path / 'agent.db'}"}, "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"}}
    )
    source, store = build_source(config), build_store(config)
    metadata.create_all(source.engine)
    yield source, store
    source.close()
    store.close()


def add_tools(source, run_id: str, count: int, first_id: int | None = None) -> list[int]:
    ids = []
    with source.engine.begin() as conn:
        for n in range(count):
            values = {"session_id": "s", "run_id": run_id, "tool_name": "t", "input_params": "{}", "created_at": T}
            if first_id is not None:
                values["id"] = first_id + n
            ids.append(conn.execute(insert(tool_invocation).values(**values)).inserted_primary_key[0])
    return ids


def run(run_id: str, pk: int = 1) -> RunRow:
    return RunRow(pk, run_id, "s", "SUCCESS", None, None, None, None, None, None, None, None, T, T)


def feed_of(parts, watched: dict[str, Watched] | None = None, gap_timeout: float = 600) -> ToolFeed:
    source, store = parts
    return ToolFeed(source, store, gap_timeout, lambda: watched if watched is not None else {})


def ids(rows) -> list[int]:
    return [row.id for row in rows]


def test_a_first_start_begins_at_the_newest_row_and_a_run_reads_its_older_rows_by_run_id(parts):
    old = add_tools(parts[0], "run-a", 3)
    feed = feed_of(parts)
    feed.read(0)
    new = add_tools(parts[0], "run-a", 2)
    feed.read(1)
    assert ids(feed.tools_for([run("run-a")])["run-a"]) == old + new
    assert feed.mark().high == new[-1]


def test_past_the_rows_it_may_hold_the_oldest_go_and_their_runs_read_them_again(parts, monkeypatch):
    monkeypatch.setattr(tool_feed, "HELD_ROWS", 8)
    feed = feed_of(parts)
    feed.read(0)
    first = add_tools(parts[0], "run-a", 6)
    second = add_tools(parts[0], "run-b", 6)
    feed.read(1)
    assert feed._count <= 8 and feed._floor >= first[-1]  # the precondition: some rows went
    tools = feed.tools_for([run("run-a"), run("run-b", 2)])
    assert ids(tools["run-a"]) == first and ids(tools["run-b"]) == second


def test_a_watched_runs_row_holds_the_mark_below_it_until_it_is_sent(parts):
    (sent,) = add_tools(parts[0], "run-w", 1)
    watched = {"run-w": Watched(1, "run-w", frozenset({sent}), False, 1e12)}
    feed = feed_of(parts, watched)
    feed.read(0)
    (late,) = add_tools(parts[0], "run-w", 1)
    others = add_tools(parts[0], "run-x", 3)
    feed.read(1)
    assert ids(feed.late(watched)["run-w"]) == [late]
    assert feed.mark().high == late - 1  # a restart reads it again
    feed.release([("run-w", [late])])
    assert feed.late(watched) == {}
    assert feed.mark().high == others[-1]


def test_an_id_missing_when_read_is_read_when_it_commits_and_given_up_after_the_window(parts):
    feed = feed_of(parts, gap_timeout=600)
    feed.read(0)
    add_tools(parts[0], "run-a", 1, first_id=5)
    add_tools(parts[0], "run-a", 1, first_id=8)
    feed.read(100)
    assert feed.mark().gaps == {1: 100, 2: 100, 3: 100, 4: 100, 6: 100, 7: 100}
    add_tools(parts[0], "run-a", 1, first_id=6)  # committed after 8
    feed.read(200)
    assert ids(feed.tools_for([run("run-a")])["run-a"]) == [5, 6, 8]
    feed.read(700)  # 600 s after they were first missed
    assert feed.mark().gaps == {}


def test_far_behind_it_skips_to_the_newest_row_and_reads_the_watched_runs_by_run_id(parts, monkeypatch):
    monkeypatch.setattr(tool_feed, "READ_LIMIT", 5)
    monkeypatch.setattr(tool_feed, "BEHIND_ROWS", 10)
    (sent,) = add_tools(parts[0], "run-w", 1)
    watched = {"run-w": Watched(1, "run-w", frozenset({sent}), False, 1e12)}
    feed = feed_of(parts, watched)
    feed.read(0)
    add_tools(parts[0], "run-x", 30)  # more than BEHIND_ROWS since the last read
    (late,) = add_tools(parts[0], "run-w", 1)
    newest = add_tools(parts[0], "run-x", 1)
    feed.read(1)
    assert feed._floor == newest[-1]  # the precondition: it skipped
    assert ids(feed.late(watched)["run-w"]) == [late]
    assert len(feed.tools_for([run("run-x")])["run-x"]) == 31
