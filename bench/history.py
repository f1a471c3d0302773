"""A month of metrics history into Prometheus 2.42, the file way and the push way, side by side.

    .venv/bin/python bench/history.py                 # 3,000 runs over 30 days; 10 to 20 minutes

It starts its own MariaDB and seeds the demo's workload over the month, then measures:

- **file** (`backfill --metrics-out FILE --metrics-step 300`, the step the docs recommended): the
  file's size, and `promtool tsdb create-blocks-from openmetrics --max-block-duration=24h` on one
  core (taskset), its time and CPU;
- **push** (`backfill --metrics-push URL`, its default step of 30 s): into a Prometheus on one core
  (taskset, GOMAXPROCS=1) that scrapes a target of its own, so its newest samples are now and the
  history goes through its out-of-order window, as beside a running daemon: the push's time, the
  bytes sent, Prometheus' CPU and the disk it wrote.

Then, for each, the panels of the runs and RAG dashboards with data over the month, a week and one
day (the middle one), each at the $__interval and $__rate_interval Grafana gives the panel for that
range (the shipped data source's 15 s scrape interval, a screen 1,920 pixels wide). Prometheus 2.42
reads out-of-order samples in chunks of 32 until it compacts them into blocks, within two hours,
and reads them slowly before then; the push's panels are counted on a second Prometheus that took
the same push with nothing newer (so in order, into blocks as it goes): the same samples.
tests/test_history_prometheus.py reads a day of the out-of-order push itself.
The machine is shared: compare CPU seconds before wall times. Writes bench/results/history.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import requests
from helpers import filled, grafana_intervals, panels, utc_now_naive, write_config
from servers import MariaDB, Prometheus, Receiver, free_port, promtool

from run_otel.ops.demo import generate, insert_workload

BOARDS = ("diagnosis-runs.json", "rag-retrieval.json")
DAY = 86400


def at(moment: datetime) -> float:
    return moment.replace(tzinfo=UTC).timestamp()


def backfill(config: Path, since: datetime, until: datetime, *extra: str) -> tuple[str, float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "run_otel", "backfill", "--config", str(config)]
        + ["--since", f"{since:%Y-%m-%d %H:%M:%S}", "--until", f"{until:%Y-%m-%d %H:%M:%S}", *extra],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return done.stdout, time.monotonic() - started


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def one_core_prometheus(base: Path, *extra: str, scrape: bool = True) -> Prometheus:
    base.mkdir(parents=True)
    prometheus = Prometheus(
        base,
        f"127.0.0.1:{free_port()}",  # nothing listens: the scrape's `up` samples are the newest
        ROOT / "config/prometheus/alerts.yml",
        ROOT / "config/prometheus/prometheus.yml",
        ("--storage.tsdb.retention.time=400d", *extra),
    )
    if not scrape:
        import yaml

        # Nothing newer at all: no scrape, and no rules (an absent() alert writes ALERTS at now).
        config = yaml.safe_load(prometheus.config.read_text())
        config["scrape_configs"], config["rule_files"] = [], []
        prometheus.config.write_text(yaml.safe_dump(config))
    os.environ["GOMAXPROCS"] = "1"
    try:
        prometheus.start()
    finally:
        del os.environ["GOMAXPROCS"]
    subprocess.run(["taskset", "-a", "-p", "-c", "1", str(prometheus.process.pid)], check=True, capture_output=True)
    return prometheus


def zoom_levels(since: datetime, until: datetime) -> dict[str, tuple[datetime, int]]:
    middle = (since + (until - since) / 2).replace(hour=0, minute=0, second=0)
    return {"30 d": (since, 30 * DAY), "7 d": (until - timedelta(days=7), 7 * DAY), "1 d": (middle, DAY)}


def panels_with_data(prometheus: Prometheus, zooms: dict[str, tuple[datetime, int]]) -> dict[str, dict]:
    """Per zoom level: how many panel queries return a finite point, and which do not."""
    found: dict[str, dict] = {}
    for zoom, (start, seconds) in zooms.items():
        total, empty = 0, []
        for board in BOARDS:
            dashboard = json.loads((ROOT / "dashboards" / board).read_text())
            for panel in panels(dashboard):
                step, window = grafana_intervals(seconds, panel)
                for target in panel["targets"]:
                    total += 1
                    # A fixed window (the error budget's [30d]) reads the month at every point: four will do.
                    every = step if "$__rate_interval" in target["expr"] else seconds // 4
                    reply = requests.get(
                        f"http://127.0.0.1:{prometheus.port}/api/v1/query_range",
                        params={
                            "query": filled(target["expr"], f"{window}s"),
                            "start": at(start),
                            "end": at(start) + seconds,
                            "step": every,
                        },
                        timeout=900,
                    ).json()
                    if reply["status"] != "success":  # a query Prometheus gave up on shows nothing either
                        empty.append(f"{panel['title']} [{window}s]: {reply.get('error', reply)}")
                        continue
                    points = [v for s in reply["data"]["result"] for _t, v in s["values"] if math.isfinite(float(v))]
                    if not points:
                        empty.append(f"{panel['title']} [{window}s]")
        found[zoom] = {"with data": total - len(empty), "queries": total, "empty": empty}
        print(f"  {zoom}: {total - len(empty)} of {total} panel queries with data", flush=True)
    return found


def measure_file(tmp: Path, config: Path, since: datetime, until: datetime, step: int) -> dict:
    history = tmp / "history.om"
    out, seconds = backfill(config, since, until, "--metrics-out", str(history), "--metrics-step", str(step))
    written = re.search(r"\(([\d,.]+) MB, ([\d.]+)s\) in", out)
    result = {"step": step, "bytes": history.stat().st_size, "write seconds": float(written.group(2)) if written else None}
    print(f"file at {step}s: {result['bytes'] / 1e6:,.0f} MB, importing with promtool on one core ...", flush=True)
    blocks = tmp / "file-prometheus" / "tsdb"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run(
        ["taskset", "-c", "1", promtool(), "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=24h"]
        + [str(history), str(blocks)],
        check=True,
        capture_output=True,
        timeout=7200,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result["import seconds"] = time.monotonic() - started
    result["import cpu seconds"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    result["blocks bytes"] = size(blocks)
    history.unlink()
    print(f"  promtool: {result['import seconds']:.0f}s ({result['import cpu seconds']:.0f}s CPU)", flush=True)
    prometheus = Prometheus(
        tmp / "file-prometheus",
        f"127.0.0.1:{free_port()}",
        ROOT / "config/prometheus/alerts.yml",
        ROOT / "config/prometheus/prometheus.yml",
        ("--storage.tsdb.retention.time=400d",),
    )
    prometheus.start()
    try:
        result["panels"] = panels_with_data(prometheus, zoom_levels(since, until))
    finally:
        prometheus.stop()
    return result


def measure_push(tmp: Path, config: Path, since: datetime, until: datetime) -> dict:
    prometheus = one_core_prometheus(tmp / "push-prometheus", "--web.enable-remote-write-receiver")
    try:
        tsdb = tmp / "push-prometheus" / "tsdb"
        disk, cpu = size(tsdb), cpu_seconds(prometheus.process.pid)
        url = f"http://127.0.0.1:{prometheus.port}/api/v1/write"
        print("pushing into a Prometheus on one core, beside newer samples ...", flush=True)
        out, seconds = backfill(config, since, until, "--metrics-push", url)
        sent = re.search(
            r"metrics: (\d+) series x (\d+) samples \((\d+)s apart\).* in (\d+) requests \(([\d,.]+) MB, ([\d.]+)s\)", out
        )
        assert sent, out
        result = {
            "step": int(sent.group(3)),
            "series": int(sent.group(1)),
            "samples": int(sent.group(1)) * int(sent.group(2)),
            "requests": int(sent.group(4)),
            "bytes sent": float(sent.group(5).replace(",", "")) * 1e6,
            "push seconds": float(sent.group(6)),
            "backfill seconds": seconds,
            "prometheus cpu seconds": cpu_seconds(prometheus.process.pid) - cpu,
            "prometheus disk bytes": size(tsdb) - disk,
        }
        print(f"  {result['push seconds']:.0f}s, Prometheus {result['prometheus cpu seconds']:.0f}s CPU", flush=True)
    finally:
        prometheus.stop()
    print("the same push into a Prometheus with nothing newer, read from blocks ...", flush=True)
    blocks = one_core_prometheus(tmp / "push-blocks", "--web.enable-remote-write-receiver", scrape=False)
    try:
        out, _seconds = backfill(config, since, until, "--metrics-push", f"http://127.0.0.1:{blocks.port}/api/v1/write")
        in_order = re.search(r"pushed to .* \(([\d,.]+) MB, ([\d.]+)s\)", out)
        result["push seconds, nothing newer"] = float(in_order.group(2)) if in_order else None
        result["panels"] = panels_with_data(blocks, zoom_levels(since, until))
    finally:
        blocks.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--file-step", type=int, default=300, help="the --metrics-step of the file")
    parser.add_argument("--skip-file", action="store_true")
    args = parser.parse_args()
    until = utc_now_naive().replace(minute=0, second=0) - timedelta(hours=1)
    since = until - timedelta(days=args.days)
    results: dict = {"runs": args.runs, "days": args.days, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        server = MariaDB(tmp / "mariadb")
        server.install()
        server.start()
        receiver = Receiver()
        receiver.start()
        try:
            url = server.create_database("history")
            from sqlalchemy.engine import make_url

            from run_otel.source.engine import make_engine

            insert_workload(make_engine(make_url(url)), generate(9, args.runs, anchor=until, span_seconds=args.days * DAY - 60))
            config = write_config(
                tmp / "run-otel.toml",
                {
                    "source": {"url": url},
                    "state": {"url": f"sqlite:///{tmp / 'state.db'}"},
                    "poll": {"run_timeout_seconds": 0, "settle_seconds": 0},
                    "export": {"protocol": "grpc", "endpoint": receiver.endpoint},
                    "metrics": {"enabled": False},
                },
            )
            if not args.skip_file:
                results["file"] = measure_file(tmp, config, since, until, args.file_step)
                shutil.rmtree(tmp / "file-prometheus")
            results["push"] = measure_push(tmp, config, since, until)
        finally:
            receiver.stop()
            server.stop()
    out = ROOT / "bench/results/history.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print_table(results)


def print_table(results: dict) -> None:
    rows = []
    if "file" in results:
        f = results["file"]
        rows.append(("file, step (s)", f["step"]))
        rows.append(("file, size", f"{f['bytes'] / 1e6:,.0f} MB"))
        rows.append(("promtool import, one core", f"{f['import seconds']:.0f} s ({f['import cpu seconds']:.0f} s CPU)"))
        rows.append(("blocks", f"{f['blocks bytes'] / 1e6:,.0f} MB"))
        rows += [(f"file, panels with data, {z}", f"{p['with data']} of {p['queries']}") for z, p in f["panels"].items()]
    p = results["push"]
    rows.append(("push, step (s)", p["step"]))
    rows.append(("push, samples", f"{p['samples']:,} in {p['requests']} requests"))
    rows.append(("push, bytes sent (snappy)", f"{p['bytes sent'] / 1e6:,.0f} MB"))
    rows.append(("push time, Prometheus on one core", f"{p['push seconds']:.0f} s ({p['prometheus cpu seconds']:.0f} s CPU)"))
    rows.append(("Prometheus disk written (WAL, WBL, chunks)", f"{p['prometheus disk bytes'] / 1e6:,.0f} MB"))
    rows.append(("push time, into a Prometheus with nothing newer", f"{p['push seconds, nothing newer']:.0f} s"))
    rows += [(f"push, panels with data, {z}", f"{v['with data']} of {v['queries']}") for z, v in p["panels"].items()]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    main()
