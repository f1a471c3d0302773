"""A row whose text holds terminal escapes: every command that prints it writes the escapes
shown, never as the bytes a terminal would obey, in a pipe and in a tty."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import pytest
from helpers import add_run, add_tool, bridge_sections, new_run_id, write_config

# Retitles the terminal, clears it, and a NUL; clears it again with the one-character CSI of the
# C1 controls (U+009B), and reverses the text after it with a bidirectional override (U+202E).
HOSTILE = "a\x1b]0;pwned\x07b\x1b[2Jc\x00d\x9b2Je\u202ef"
OBEYED = (b"\x1b]0;", b"\x1b[2J", b"\x00", b"\x07", "\x9b".encode(), "\u202e".encode())
# The tool name as the operator must see it: each control character spelled out.
SHOWN = rb"ta\x1b]0;pwned\x07b\x1b[2Jc\x00d\x9b2Je\u202ef"


def _command(args: list[str], tty: bool, env: dict) -> bytes:
    argv = [sys.executable, "-m", "run_otel", *args]
    if not tty:
        done = subprocess.run(argv, capture_output=True, env=env, timeout=120)
        return done.stdout + done.stderr
    script = shutil.which("script")
    assert script, "util-linux script(1) gives the command a tty"
    done = subprocess.run([script, "-qec", shlex.join(argv), "/dev/null"], capture_output=True, env=env, timeout=120)
    return done.stdout + done.stderr


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "tty"])
def test_no_command_writes_a_rows_escapes(agent_db, receiver, tmp_path, tty):
    run_id = new_run_id()
    conn = agent_db.server.root(agent_db.name)
    try:
        add_run(conn, run_id, query=HOSTILE, status="FAILED", session_id="s" + HOSTILE[:10])
        add_tool(conn, run_id, tool_name="t" + HOSTILE, success=0, error_message="failed: " + HOSTILE)
    finally:
        conn.close()
    config = write_config(tmp_path / "run-otel.toml", bridge_sections(agent_db, tmp_path, receiver.endpoint))
    env = {**os.environ, "COLUMNS": "100"}
    assert _command(["once", "--config", str(config)], tty, env)  # a checkpoint for `status`
    outputs = {
        name: _command([name, *args, "--config", str(config)], tty, env)
        for name, args in (("show", [run_id]), ("export", [run_id]), ("status", []), ("check", []))
    }
    for name, output in outputs.items():
        for raw in OBEYED:
            assert raw not in output, f"{name} wrote {raw!r} raw"
    assert SHOWN in outputs["show"], outputs["show"]  # precondition: the row was printed, escaped


DEMO_WITH_A_HOSTILE_TOOL = """
import run_otel.ops.demo_job as job
generate = job.generate
def hostile(*args, **kwargs):
    workload = generate(*args, **kwargs)
    for tool in workload.tools:
        tool["tool_name"] = "t" + {hostile!r}
        tool["error_message"] = "failed: " + {hostile!r}
    return workload
job.generate = hostile
from run_otel.cli.main import main
main()
"""


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "tty"])
def test_demo_writes_no_escapes_of_its_rows(tmp_path, tty):
    code = DEMO_WITH_A_HOSTILE_TOOL.format(hostile=HOSTILE)
    argv = ["-c", code, "demo", "--runs", "40", "--db", str(tmp_path / "d.db"), "--out", str(tmp_path / "d.jsonl")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if tty:
        done = subprocess.run(
            ["script", "-qec", shlex.join([sys.executable, *argv]), "/dev/null"], capture_output=True, env=env, timeout=180
        )
    else:
        done = subprocess.run([sys.executable, *argv], capture_output=True, env=env, timeout=180)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert SHOWN in output  # precondition: the hostile tool was printed
    for raw in OBEYED:
        assert raw not in output, f"demo wrote {raw!r} raw"
