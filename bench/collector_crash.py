"""Runs lost when a collector is killed (SIGKILL) right after it acknowledged run-otel's requests.

    .venv/bin/python bench/collector_crash.py                        # the shipped configs
    .venv/bin/python bench/collector_crash.py --rev 7147841          # the configs of an earlier commit
    .venv/bin/python bench/collector_crash.py --backend up           # the backend there all along

It starts its own MariaDB, seeds the synthetic workload, and for each tier (the collector with
config/otel-collector.yaml in front of Jaeger v2, the gateway with config/otel-gateway.yaml in front
of the test suite's receiver) runs `run-otel once` through it, kills it with SIGKILL as soon as
`once` has exited 0 (every request acknowledged), starts it again on the same queue directory, and
counts the finished runs that never reach the backend. With `--backend away` (the default) the
backend starts only after the kill, so the collector still holds every run when it dies.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's server harness

from conftest import AgentDb
from helpers import bridge_sections, received_roots, run_cli, seed, terminal_trace_ids, write_config
from servers import Collector, CollectorProgram, Gateway, Jaeger, MariaDB, Receiver

CONFIGS = {"collector": "config/otel-collector.yaml", "gateway": "config/otel-gateway.yaml"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rev", help="take the collector configs from this commit (default: this checkout's)")
    parser.add_argument("--backend", choices=("away", "up"), default="away")
    parser.add_argument("--seconds", type=float, default=60, help="how long the restarted collector has to deliver")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        server = MariaDB(base / "mariadb")
        server.install()
        server.start()
        try:
            results = {tier: trial(server, base / tier, tier, args) for tier in CONFIGS}
        finally:
            server.stop()
    print(json.dumps({"rev": args.rev or "this checkout", "backend": args.backend, **results}, indent=2))


def config_file(base: Path, tier: str, rev: str | None) -> Path:
    if not rev:
        return ROOT / CONFIGS[tier]
    shown = subprocess.run(["git", "show", f"{rev}:{CONFIGS[tier]}"], cwd=ROOT, capture_output=True, text=True, check=True)
    path = base / Path(CONFIGS[tier]).name
    path.write_text(shown.stdout)
    return path


def trial(server: MariaDB, base: Path, tier: str, args: argparse.Namespace) -> dict:
    base.mkdir()
    database = AgentDb(server, tier, server.create_database(tier))
    seed(database, args.runs, seed_value=41, waiting=0)
    runs = terminal_trace_ids(database)
    config = config_file(base, tier, args.rev)
    backend, program, delivered, others = tier_parts(base, tier, config)
    if args.backend == "up":
        backend.start()
    program.queue_dir.mkdir()  # type: ignore[attr-defined]  # an old config does not create it
    program.start()
    port = program.grpc_port  # type: ignore[attr-defined]
    sections = bridge_sections(database, base, f"http://127.0.0.1:{port}", export={"max_request_bytes": 65536})
    done = run_cli("once", "--config", str(write_config(base / "run-otel.toml", sections)))
    assert done.returncode == 0, done.stderr[-2000:]
    program.kill()
    if args.backend == "away":
        backend.start()
    program.start()
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline and not runs <= delivered(runs):
        time.sleep(2)
    lost = len(runs - delivered(runs))
    for part in (program, backend, *others):
        part.stop()
    return {"config": CONFIGS[tier], "acknowledged_runs": len(runs), "runs_lost": lost}


def tier_parts(base: Path, tier: str, config: Path) -> tuple:
    """The backend, the collector program in front of it, what the backend has of the runs, and the
    other servers to stop (Tempo's stand-in, which takes the collector's second copy all along)."""
    program: CollectorProgram
    if tier == "collector":
        jaeger, tempo = Jaeger(base), Receiver()
        tempo.start()
        program = Collector(base, f"127.0.0.1:{jaeger.otlp_port}", tempo.endpoint, config=config)
        return jaeger, program, lambda runs: {t for t in runs if jaeger.trace(t)}, [tempo]
    receiver = Receiver()
    program = Gateway(base, receiver.port, config=config)
    return receiver, program, lambda _runs: received_roots(receiver), []


if __name__ == "__main__":
    main()
