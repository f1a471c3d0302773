"""The collector while a command starts: off through the imports, on (with what start-up
built frozen) once the command's body runs, and as it was when the command line returns."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

from run_otel.cli.startup import body_starts, quiet_start

# Runs `run-otel demo` in a process of its own, noting the collector's passes and the frozen
# objects at the moment the command's body starts.
PROBE = """
import gc, json, sys
import run_otel.cli.startup as startup

passes = []
gc.callbacks.append(lambda phase, info: passes.append(info["generation"]) if phase == "start" else None)
seen = {}
real = startup.body_starts

def body_starts():
    seen.update(before=len(passes), enabled=gc.isenabled(), frozen=gc.get_freeze_count())
    real()
    seen.update(after_enabled=gc.isenabled(), frozen_after=gc.get_freeze_count())

startup.body_starts = body_starts
from run_otel.cli.main import main
sys.argv = ["run-otel", "demo", "--runs", "3", "--db", sys.argv[1], "--out", sys.argv[2]]
passes.clear()  # the command line's own module (click) is imported before main() runs
try:
    main()
except SystemExit as exc:
    seen.update(code=exc.code, enabled_at_exit=gc.isenabled())
print(json.dumps(seen))
"""


def test_a_command_starts_without_collecting_and_collects_once_its_body_runs(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RUN_OTEL_"))}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "demo.db"), str(tmp_path / "demo.jsonl")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["code"] == 0
    # SQLAlchemy, gRPC and the config were imported with no pass over them ...
    assert seen["before"] == 0 and not seen["enabled"]
    # ... and are frozen, the collector on, when the body runs and after.
    assert seen["frozen"] == 0 and seen["frozen_after"] > 10_000
    assert seen["after_enabled"] and seen["enabled_at_exit"]


def test_start_up_is_frozen_when_the_body_starts():
    assert gc.isenabled() and gc.get_freeze_count() == 0
    try:
        with quiet_start():
            assert not gc.isenabled()
            body_starts()
            assert gc.isenabled()
            assert gc.get_freeze_count() > 0
        assert gc.isenabled()
    finally:
        gc.unfreeze()


def test_a_command_that_never_reaches_its_body_leaves_the_collector_on():
    with quiet_start():
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_outside_start_up_nothing_is_frozen():
    body_starts()
    assert gc.isenabled() and gc.get_freeze_count() == 0
