"""bench/span_cpu.py, the hot path's CPU a span, runs against the export as it is: it once failed
when the export began asking the agent's schema beside the rows, and nothing noticed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_span_cpu_measures_every_stage():
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "span_cpu.py"), "--runs", "40", "--reps", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    figures = dict(re.findall(r"^\s+(read|read \+ map|export)\s+([\d.]+) µs", done.stdout, re.M))
    assert set(figures) == {"read", "read + map", "export"}, done.stdout
    assert all(float(value) > 0 for value in figures.values())
    assert "request bytes a span" in done.stdout  # the export reached the sink
