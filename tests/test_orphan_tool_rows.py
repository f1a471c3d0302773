"""Tool rows whose run never appears, with `run-otel run` on a real MariaDB into the test's receiver:
after poll.orphan_wait_seconds they are named in a WARNING, counted on /metrics and named by
`run-otel check` (how many, the oldest); a run that appears after all brings them with it."""

from __future__ import annotations

import re

import requests
from helpers import DaemonProcess, add_run, add_tool, bridge_sections, new_run_id, run_cli, write_config
from servers import free_port, wait_for

from run_otel.mapping.span_data import trace_id_for


def metric(port: int, name: str) -> float:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    found = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert found, f"no {name} on /metrics"
    return float(found.group(1))


def polls(port: int) -> float:
    try:
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except requests.ConnectionError:
        return 0
    found = re.search(r'^run_otel_poll_duration_seconds_count{[^}]*outcome="ok"[^}]*} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0


def test_tool_rows_whose_run_never_appears_are_named_counted_and_checked(agent_db, receiver, tmp_path):
    port = free_port()
    sections = bridge_sections(
        agent_db, tmp_path, receiver.endpoint, poll={"orphan_wait_seconds": 2}, metrics={"enabled": True, "port": port}
    )
    config = str(write_config(tmp_path / "run-otel.toml", sections))
    ghost, real = new_run_id(), new_run_id()
    conn = agent_db.server.root(agent_db.name)
    add_tool(conn, new_run_id(), tool_name="before_the_first_start")  # the history is not looked at
    daemon = DaemonProcess(write_config(tmp_path / "run-otel.toml", sections), tmp_path / "daemon.log")
    try:
        # Past two polls: the feed's first read on a first start sets where it begins, the next reads from there.
        wait_for(lambda: polls(port) >= 2, 30, "two polls")
        add_run(conn, real)
        add_tool(conn, real)
        for _ in range(3):
            add_tool(conn, ghost, tool_name="query_logs")
        add_tool(conn, None, tool_name="legacy_no_run_id")  # legacy rows without a run id are not looked at
        orphans = [row[0] for row in agent_db.execute("SELECT id FROM tool_invocation WHERE run_id = %s ORDER BY id", ghost)]
        wait_for(lambda: "have no diagnosis_run row" in daemon.output(), 60, "the orphan tool rows to be named", 0.2)
        (line,) = [line for line in daemon.output().splitlines() if "have no diagnosis_run row" in line]
        assert "WARNING" in line and "3 tool row(s) of 1 run id(s)" in line, line
        assert f"{ghost} (tool_invocation {', '.join(map(str, orphans))})" in line, line
        assert metric(port, "run_otel_orphan_rows_total") == 3
        checked = run_cli("check", "--config", config)
        assert "! orphan tool rows: 3 tool row(s) of 1 run id(s) have no diagnosis_run row" in checked.stdout, checked.stdout
        assert f"the oldest: tool_invocation {orphans[0]} (run_id {ghost}," in checked.stdout

        add_run(conn, ghost)  # the run comes after all: its tool rows go out with it
        wait_for(
            lambda: len([s for _r, _s, s in receiver.spans() if s.trace_id == trace_id_for(ghost)]) == 4,
            60,
            "the late run with its three tool rows",
            0.2,
        )
        checked = run_cli("check", "--config", config)
        assert "orphan tool rows: none" in checked.stdout, checked.stdout
        assert metric(port, "run_otel_orphan_rows_total") == 3  # named once, not again
        assert daemon.output().count("have no diagnosis_run row") == 1
    finally:
        assert daemon.terminate() == 0, daemon.output()
        conn.close()
