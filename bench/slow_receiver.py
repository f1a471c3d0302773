"""Behind a receiver that answers each request in 15-20 s: how many span copies `run-otel run` sends,
how long the backlog takes to drain, and what /readyz says meanwhile.

    .venv/bin/python bench/slow_receiver.py                      # this checkout
    .venv/bin/python bench/slow_receiver.py --src OTHER/src      # another release's source tree

It starts its own MariaDB, seeds the synthetic workload, and runs the daemon with the default
export settings (export.timeout_seconds 10, poll.batch_size 500) against the test suite's
receiver, slowed down; it stops at the drain's end or after --seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's server harness

import requests
from servers import MariaDB, Receiver, free_port

from run_otel.ops.demo import generate, insert_workload

TERMINAL = "status IN ('SUCCESS', 'FALLBACK', 'FAILED', 'CANCELLED')"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", default=str(ROOT / "src"), help="the run_otel source tree to run")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=240)
    parser.add_argument("--timeout", type=float, default=10.0, help="export.timeout_seconds")
    parser.add_argument("--delay", type=float, nargs=2, default=(15.0, 20.0))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        print(json.dumps(measure(Path(folder), args), indent=2))


def measure(base: Path, args: argparse.Namespace) -> dict:
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    from run_otel.source.engine import make_engine

    server = MariaDB(base / "mariadb")
    server.install()
    server.start()
    receiver = Receiver(delay=tuple(args.delay))
    receiver.start()
    try:
        url = server.create_database("agent")
        engine = make_engine(make_url(url))
        anchor = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(hours=1)
        insert_workload(engine, generate(7, args.runs, anchor=anchor))
        with engine.connect() as conn:
            finished = conn.execute(text(f"SELECT COUNT(*) FROM diagnosis_run WHERE {TERMINAL}")).scalar_one()
        port = free_port()
        config = base / "run-otel.toml"
        config.write_text(
            f'[source]\nurl = "{url}"\n[state]\nurl = "sqlite:///{base / "state.db"}"\n'
            '[poll]\nstart_from = "beginning"\nsettle_seconds = 0\n'
            f'[export]\nendpoint = "{receiver.endpoint}"\ntimeout_seconds = {args.timeout}\n'
            f"[metrics]\nport = {port}\n"
        )
        return drive(base, config, receiver, port, args, finished)
    finally:
        receiver.stop()
        server.stop()


def drive(base: Path, config: Path, receiver: Receiver, port: int, args: argparse.Namespace, wanted: int) -> dict:
    log = base / "daemon.log"
    env = {**os.environ, "PYTHONPATH": args.src}
    started = time.monotonic()
    with log.open("wb") as out:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "run_otel", "run", "--config", str(config)], stdout=out, stderr=out, env=env
        )
    drained_at = None
    samples: list[int] = []
    next_sample = started + 15
    while time.monotonic() - started < args.seconds:
        roots = {span.trace_id for _r, _s, span in receiver.spans() if not span.parent_span_id}
        if len(roots) >= wanted and drained_at is None:
            drained_at = time.monotonic() - started
            break
        if time.monotonic() >= next_sample:
            samples.append(_status(f"http://127.0.0.1:{port}/readyz"))
            next_sample += 15
        time.sleep(2)
    daemon.terminate()
    daemon.wait(60)
    spans = [span.span_id for _r, _s, span in receiver.spans()]
    text = log.read_text(errors="replace")
    return {
        "src": args.src,
        "finished_runs": wanted,
        "runs_received": len({span.trace_id for _r, _s, span in receiver.spans() if not span.parent_span_id}),
        "requests_received": len(receiver.requests),
        "span_copies_received": len(spans),
        "distinct_spans": len(set(spans)),
        "duplicate_span_copies": len(spans) - len(set(spans)),
        "seconds_to_drain": None if drained_at is None else round(drained_at, 1),
        "readyz_samples_503": f"{sum(1 for s in samples if s != 200)} of {len(samples)}",
        "log_names_timeout_setting": "raise export.timeout_seconds" in text,
    }


def _status(url: str) -> int:
    try:
        return requests.get(url, timeout=5).status_code
    except requests.RequestException:
        return 0


if __name__ == "__main__":
    main()
