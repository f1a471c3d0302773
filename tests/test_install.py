"""The README's first command, as a newcomer types it: a fresh copy, a new virtualenv, the demo."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from otlp_helpers import parse_otlp_json

ROOT = Path(__file__).resolve().parent.parent


def readme_demo_command() -> str:
    readme = (ROOT / "README.md").read_text()
    (command,) = re.findall(r"^python3 -m venv \.venv && .*run-otel demo$", readme, re.M)
    return command


def fresh_copy(target: Path) -> Path:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode == 0 and tracked.stdout.strip():
        for name in tracked.stdout.splitlines():
            source = ROOT / name
            if source.is_file():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / name)
    else:
        shutil.copytree(ROOT, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__"))
    return target


@pytest.mark.slow
def test_the_readme_first_command_works_on_a_fresh_copy(tmp_path):
    checkout = fresh_copy(tmp_path / "run-otel")
    # The newcomer's own shell: their PATH and python3, none of this test run's virtualenv.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH") and not k.startswith("RUN_OTEL_")}
    env["HOME"] = str(tmp_path)
    done = subprocess.run(
        ["bash", "-c", readme_demo_command()], cwd=checkout, capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = checkout / "run-otel-demo.otlp.jsonl"
    assert f"OTLP-JSON written to {out.name}" in done.stdout
    spans = [
        s
        for line in out.read_text().splitlines()
        for rs in parse_otlp_json(line).resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    ]
    with sqlite3.connect(checkout / "run-otel-demo.db") as conn:
        runs = dict(conn.execute("SELECT run_id, status FROM diagnosis_run WHERE status <> 'RUNNING'").fetchall())
        tools = conn.execute(
            "SELECT t.run_id, t.id FROM tool_invocation t JOIN diagnosis_run r ON r.run_id = t.run_id WHERE r.status <> 'RUNNING'"
        ).fetchall()
    roots = {s.trace_id.hex(): s for s in spans if not s.parent_span_id}
    assert set(roots) == {run_id[4:].replace("-", "") for run_id in runs}
    for run_id, status in runs.items():
        root = roots[run_id[4:].replace("-", "")]
        assert root.span_id == hashlib.sha256(f"run:{run_id}".encode()).digest()[:8]
        assert root.status.code == (1 if status == "SUCCESS" else 2)  # OK, else ERROR (docs/mapping.md: outcomes)
    children = {s.span_id: s for s in spans if s.parent_span_id}
    assert set(children) == {hashlib.sha256(f"tool_invocation:{r}:{i}".encode()).digest()[:8] for r, i in tools}


@pytest.mark.slow
def test_the_wheel_holds_every_subpackage_the_data_files_and_the_type_marker(tmp_path):
    checkout = fresh_copy(tmp_path / "run-otel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(checkout)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("run_otel-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    package = ROOT / "src" / "run_otel"
    subpackages = {p.parent.relative_to(package.parent).as_posix() for p in package.rglob("__init__.py")}
    assert len(subpackages) >= 9  # the package and its stages: the check below is over all of them
    expected = {f"{p}/__init__.py" for p in subpackages} | {
        "run_otel/py.typed",
        "run_otel/example.toml",
        "run_otel/source/schema/mysql.sql",
    }
    assert expected <= names, sorted(expected - names)
