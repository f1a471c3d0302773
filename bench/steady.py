"""What the run-otel daemon costs the agent's database, and how fast it drains a backlog.

    .venv/bin/python bench/steady.py                # 100k runs x 10 tools; about 25 minutes
    .venv/bin/python bench/steady.py --runs 20000 --catchup-runs 10000 \\
        --idle-seconds 15 --idle-warmup-seconds 5 --phase-seconds 20 --warmup-seconds 5   # about 3 minutes

It starts its own MariaDB on loopback with every statement in the slow log
(long_query_time = 0, log_slow_verbosity = query_plan: Rows_examined and
Full_scan per statement) and per-user counters (userstat = 1), seeds --runs
finished runs over --seed-hours up to 15 minutes ago (every 20th rated) with
--tools tool rows each, and runs, in one go:

1. the catch-up: `run-otel backfill --from-id F --to-id T` of the newest
   --catchup-runs runs, timed from start to exit; then `run-otel run` with
   poll.start_from = F, the same ids behind its checkpoint, timed from start to
   the receiver's last root span. /metrics is scraped every --scrape-seconds:
   in how many scrapes run_otel_lag_seconds and run_otel_backlog_runs were
   present, and whether they fell. Before that measured pair, --catchup-pairs
   minus one more pairs are timed alone; the catch-up's time ÷ the backfill's
   is reported pair by pair and as their median.
2. the steady state, the same daemon on: an agent writing --phases (runs a
   second, 'idle' for none), each run three statements (inserted RUNNING, its
   tool rows, finished) and every 20th rated. Each phase runs --warmup-seconds
   unmeasured, then --phase-seconds measured (--idle-warmup-seconds and
   --idle-seconds for idle). The late-row watch grows for the daemon's
   poll.late_window_seconds (10 minutes) into a phase: a warm-up of about that
   much measures it at its steady size.

For each phase, from MariaDB's own counters: rows examined and statements a
second of run-otel's user, rows examined per new row (the writer's rows
inserted), and rows examined per poll of each statement kind (the late-row
watch, the feedback pass, the backlog probe, the main poll), from the slow log
grouped by statement shape and cross-checked against USER_STATISTICS.ROWS_READ;
full scans by the slow log's Full_scan, cross-checked against Select_scan;
and the spans the receiver acknowledged a second. Each run-otel process reads
as the database user run_otel and the writer writes as agent. The daemon runs
at its default settings but for --late-window-seconds, when given.

Results go to bench/results/steady-latest.json and a table on stdout; the
daemon's log to bench/results/steady-daemon.log.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests")]  # its helpers, and the test suite's server harness

import db_cost as db
from agent_writer import AgentWriter
from catchup import Daemon, Receiver, Scraper, drain, run_backfill, write_config
from report import phase_report, print_report
from servers import MariaDB, free_port

DATABASE = "agent"
RESULTS = ROOT / "bench" / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_argument_group("sizes")
    size.add_argument("--runs", type=int, default=100_000, help="finished runs seeded (default 100,000)")
    size.add_argument("--tools", type=int, default=10, help="tool rows per run, seeded and written (default 10)")
    size.add_argument("--seed-hours", type=float, default=22.0, help="the seeded runs span this many hours, up to 15 minutes ago")
    size.add_argument(
        "--catchup-runs", type=int, help="runs behind the daemon's checkpoint at its start, the newest (default: all seeded)"
    )
    steady = parser.add_argument_group("the steady state")
    steady.add_argument("--phases", default="idle,2,10,50,idle", help="runs a second per phase, 'idle' for none")
    steady.add_argument("--phase-seconds", type=float, default=180.0, help="measured seconds of a phase with writes")
    steady.add_argument("--idle-seconds", type=float, default=60.0, help="measured seconds of an idle phase")
    steady.add_argument("--warmup-seconds", type=float, default=30.0, help="unmeasured seconds at the start of each phase")
    steady.add_argument("--idle-warmup-seconds", type=float, default=30.0, help="the same, of an idle phase")
    steady.add_argument("--run-seconds", type=float, default=1.0, help="how long each written run is in flight")
    steady.add_argument("--late-window-seconds", type=float, help="the daemon's poll.late_window_seconds (default: its own)")
    other = parser.add_argument_group("the catch-up")
    other.add_argument("--backfill-workers", type=int, default=1, help="the backfill's --workers (default 1)")
    other.add_argument("--scrape-seconds", type=float, default=1.0, help="how often /metrics is read during the catch-up")
    other.add_argument("--scrape-after-seconds", type=float, default=10.0, help="/metrics is read this long after the drain too")
    other.add_argument("--drain-timeout", type=float, default=3600.0, help="give up on the catch-up after this long")
    other.add_argument(
        "--catchup-pairs",
        type=int,
        default=3,
        help="backfill-then-catch-up pairs timed, turn about; the ratio reported is their median (default 3)",
    )
    other.add_argument("--skip-backfill", action="store_true", help="time the daemon's catch-up alone")
    other.add_argument("--skip-steady", action="store_true", help="stop after the catch-up")
    args = parser.parse_args(argv)
    args.catchup_runs = min(args.catchup_runs or args.runs, args.runs)
    return args


def phases(spec: str) -> list[tuple[str, float]]:
    """'idle,2,10,50,idle' as (label, runs a second); an idle phase after writes is labelled so."""
    out: list[tuple[str, float]] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if part == "idle":
            after = next((label for label, rate in reversed(out) if rate), None)
            out.append((f"idle after {after}" if after else "idle", 0.0))
        else:
            out.append((f"{float(part):g} runs/s", float(part)))
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    plan = phases(args.phases)  # a bad --phases fails before minutes of seeding
    RESULTS.mkdir(exist_ok=True)
    log = RESULTS / "steady-daemon.log"
    log.write_text("")
    results: dict = {"args": vars(args), "phases": []}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        slow_log = tmp / "slow.log"
        server = MariaDB(tmp / "mariadb", extra_args=db.server_args(slow_log))
        server.install()
        server.start()
        try:
            print(f"seeding {args.runs:,} runs x {args.tools} tools ...", flush=True)
            server.create_database(DATABASE)
            root = server.root(DATABASE)
            db.create_users(root, DATABASE)
            db.seed(root, args.runs, args.tools, args.seed_hours)
            with Receiver() as receiver:
                source = {"url": server.url(DATABASE, db.BRIDGE_USER, db.BRIDGE_PASSWORD)}
                export = {"endpoint": receiver.endpoint}
                first, last = args.runs - args.catchup_runs + 1, args.runs
                new_rows = args.catchup_runs * (args.tools + 1)

                def measured(what):
                    before = db.snapshot(root, slow_log)
                    out = what()
                    after = db.snapshot(root, slow_log)
                    cost = db.bridge_cost(db.read_entries(slow_log, before.slow_log_bytes, after.slow_log_bytes))
                    out["rows_examined"] = cost.rows_examined
                    out["rows_read_userstat"] = db.user_delta(before, after, db.BRIDGE_USER)["ROWS_READ"]
                    out["rows_examined_per_row_exported"] = cost.rows_examined / new_rows
                    out["full_scans"] = cost.full_scans
                    out["full_scans_by_shape"] = {s: v["full_scans"] for s, v in cost.shapes.items() if v["full_scans"]}
                    return out

                if not args.skip_backfill:
                    print(f"backfill of run ids {first}..{last} ...", flush=True)
                    config = write_config(tmp, {"source": source, "export": export, "metrics": {"enabled": False}})
                    results["backfill"] = measured(lambda: run_backfill(config, first, last, receiver, args.backfill_workers))
                    receiver.reset()
                poll: dict = {"start_from": str(first)}
                if args.late_window_seconds is not None:
                    poll["late_window_seconds"] = args.late_window_seconds
                ratios = []
                if not args.skip_backfill:
                    for pair in range(1, args.catchup_pairs):
                        print(f"pair {pair} of {args.catchup_pairs}: backfill, then catch-up, timed only ...", flush=True)
                        ratios.append(timed_pair(tmp, source, export, poll, (first, last), receiver, args, log))
                print(f"catch-up: the daemon {args.catchup_runs:,} runs behind its checkpoint ...", flush=True)
                port = free_port()
                config = write_config(
                    tmp, {"source": source, "export": export, "poll": poll, "metrics": {"enabled": True, "port": port}}
                )
                daemon, scraper = Daemon(config, log), Scraper(port, args.scrape_seconds)

                def catch_up() -> dict:
                    daemon.start()
                    scraper.start()
                    out = drain(daemon, receiver, args.catchup_runs, args.drain_timeout)
                    time.sleep(args.scrape_after_seconds)  # do the gauges come once the drain is over?
                    out["gauges"] = scraper.stop(receiver.last_root.value)
                    return out

                try:
                    results["catchup"] = measured(catch_up)
                    if "backfill" in results:
                        results["catchup"]["vs_backfill"] = results["catchup"]["seconds"] / results["backfill"]["seconds"]
                        ratios.append(results["catchup"]["vs_backfill"])
                        results["catchup"]["vs_backfill_pairs"] = ratios
                        results["catchup"]["vs_backfill_median"] = statistics.median(ratios)
                    if not args.skip_steady:
                        steady_state(args, plan, server, root, slow_log, receiver, results)
                finally:
                    daemon.stop()
        finally:
            server.stop()
    (RESULTS / "steady-latest.json").write_text(json.dumps(results, indent=2, default=str))
    print_report(results)


def timed_pair(tmp: Path, source: dict, export: dict, poll: dict, ids: tuple[int, int], receiver, args, log: Path) -> float:
    """One more backfill and catch-up of the same ids, as the measured pair runs them but only timed:
    the catch-up's time ÷ the backfill's. Pairs, turn about, keep the ratio meaningful on a noisy machine."""
    config = write_config(tmp, {"source": source, "export": export, "metrics": {"enabled": False}})
    backfill = run_backfill(config, *ids, receiver, args.backfill_workers)["seconds"]
    receiver.reset()
    metrics = {"enabled": True, "port": free_port()}
    daemon = Daemon(write_config(tmp, {"source": source, "export": export, "poll": poll, "metrics": metrics}), log)
    daemon.start()
    try:
        seconds = drain(daemon, receiver, args.catchup_runs, args.drain_timeout)["seconds"]
    finally:
        daemon.stop()
    receiver.reset()
    return seconds / backfill


def steady_state(args, plan, server: MariaDB, root, slow_log: Path, receiver: Receiver, results: dict) -> None:
    writer = AgentWriter(server.port, DATABASE, args.tools, args.run_seconds)
    writer.start()
    try:
        for label, rate in plan:
            seconds, warmup = (args.phase_seconds, args.warmup_seconds) if rate else (args.idle_seconds, args.idle_warmup_seconds)
            print(f"{label}: {warmup:g} s to settle, then {seconds:g} s measured ...", flush=True)
            writer.set_rate(rate)
            time.sleep(warmup)
            before, spans_before, ratings_before = db.snapshot(root, slow_log), receiver.counts()[0], writer.ratings
            started = time.perf_counter()
            time.sleep(seconds)
            after, spans_after, ratings_after = db.snapshot(root, slow_log), receiver.counts()[0], writer.ratings
            elapsed = time.perf_counter() - started
            entries = db.read_entries(slow_log, before.slow_log_bytes, after.slow_log_bytes)
            report = phase_report(label, rate, elapsed, before, after, entries)
            report["spans_acknowledged_per_s"] = (spans_after - spans_before) / elapsed
            report["new_ratings"] = ratings_after - ratings_before
            report["writer_behind_s_max"] = writer.behind_seconds
            results["phases"].append(report)
    finally:
        writer.stop()


if __name__ == "__main__":
    main()
