"""run-otel's benchmark: one command, one MariaDB, every figure side by side.

    .venv/bin/python bench/run.py                  # 20,000 runs x 8 tools, 3 repetitions
    .venv/bin/python bench/run.py --runs 2000 --reps 1 --skip-delay   # a quick look

It starts its own MariaDB (Debian's mariadb-server, as the tests do) and an
OTLP/gRPC receiver in a separate process that only counts spans, then reports:

1. backfill: `run-otel backfill` end to end, spans/s and peak RSS, with PyMySQL
   and with mysql-connector-python's C extension (and mysqlclient when installed);
2. user-script: bench/user_script.py, the plain script a user would write instead;
3. sdk-baseline: the same rows and mapping, sent as ReadableSpans through the
   SDK's OTLP encoder and gRPC exporter;
4. raw-read: the same rows and columns read with each driver, no mapping; and
   the bridge's own read (Source) taking the driver's tuples, beside the same
   read building SQLAlchemy's Row for each row;
5. 1 KB evidence: bytes the database sends per span, evidence summarized by the
   database or parsed in run-otel, and the speed of each;
6. memory: peak RSS of one backfill of 1,000,008 spans with each driver;
   idle poll: a poll that finds nothing, on a 10k-row and a 1M-row table;
7. delay: p50/p95 from a run turning terminal to the receiver's ack, under a
   live load of 50 runs/s, at the default poll settings;
8. feedback pass: one recheck of user feedback on a 1M-row table holding 30
   days of runs (1 in 20 rated), for a one-day and a seven-day window.

Medians over --reps repetitions, and ratios, because the machine is noisy. The
user's script runs right beside each backfill (before it, then after it, in turn),
and a ratio to it is the median of those pairs: the machine's speed drifts by a
third within minutes, which a ratio of medians taken minutes apart carried whole.
Results go to bench/results/latest.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent import futures
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's server harness

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from servers import MariaDB, free_port, wait_for, with_driver

# -- a receiver that only counts, in its own process ---------------------------------


def _count_spans(blob: bytes) -> int:
    request = trace_service_pb2.ExportTraceServiceRequest.FromString(blob)
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


def _counting_receiver(port: int, counter, arrivals, delay: float) -> None:
    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            time.sleep(delay)  # a receiver across a network answers later than one on loopback
            spans = 0
            now = time.time()
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    spans += len(ss.spans)
                    if arrivals is not None:
                        for span in ss.spans:
                            if not span.parent_span_id:
                                arrivals.put((span.trace_id.hex(), now))
            with counter.get_lock():
                counter.value += spans
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[("grpc.max_receive_message_length", 64 << 20)])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


class CountingReceiver:
    def __init__(self, track_arrivals: bool = False, delay: float = 0.0):
        self.port = free_port()
        self.counter = multiprocessing.Value("q", 0)
        self.arrivals = multiprocessing.Queue() if track_arrivals else None
        self.process = multiprocessing.Process(
            target=_counting_receiver, args=(self.port, self.counter, self.arrivals, delay), daemon=True
        )

    def __enter__(self):
        self.process.start()
        time.sleep(0.5)
        return self

    def __exit__(self, *_):
        self.process.terminate()
        self.process.join()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def reset(self) -> None:
        with self.counter.get_lock():
            self.counter.value = 0


# -- seeding ---------------------------------------------------------------------------


SHORT_EVIDENCE = (
    '\'{"evidence_status":"supported","evidence_refs":[{"raw_path":"$.logs[0]","text":"evidence text"},'
    '{"raw_path":"$.logs[1]","text":"more"}]}\''
)
# Three refs of about 1 KB of text each: what real retrieval calls carry.
KB_EVIDENCE = (
    'CONCAT(\'{"evidence_status":"supported","evidence_refs":[\', '
    + ", ',', ".join(f'\'{{"raw_path":"$.docs[{i}]","text":"\', REPEAT(\'e\', 1000), \'"}}\'' for i in range(3))
    + ", ']}')"
)


def seed_runs_and_tools(server: MariaDB, database: str, runs: int, tools: int, evidence: str = SHORT_EVIDENCE) -> None:
    """``runs`` finished runs with exactly ``tools`` tool rows each, via the sequence engine."""
    server.create_database(database)
    conn = server.root(database)
    with conn.cursor() as cur:
        cur.execute(
            f"""INSERT INTO diagnosis_run (run_id, session_id, query, status, intent, release_outcome, agent_flow,
                    total_duration_ms, total_token_count, step_count, tool_call_count, created_at, updated_at)
                SELECT CONCAT('run-', LPAD(HEX(seq), 8, '0'), '-0000-4000-8000-', LPAD(HEX(seq), 12, '0')),
                       CONCAT('sess-', seq % 50), 'q', ELT(1 + seq % 20, 'FAILED', 'FALLBACK', 'SUCCESS', 'SUCCESS', 'SUCCESS',
                       'SUCCESS', 'SUCCESS', 'SUCCESS', 'SUCCESS', 'SUCCESS', 'SUCCESS', 'SUCCESS', 'SUCCESS', 'SUCCESS',
                       'SUCCESS', 'SUCCESS', 'SUCCESS', 'SUCCESS', 'FALLBACK', 'CANCELLED'),
                       'DIAGNOSIS', 'SUCCESS', 'CHAT_HARNESS', 9000, 4200, {tools + 1}, {tools},
                       '2026-01-01' + INTERVAL seq SECOND, '2026-01-01' + INTERVAL seq SECOND + INTERVAL 9 SECOND
                FROM seq_1_to_{runs}"""
        )
        cur.execute(
            f"""INSERT INTO tool_invocation (session_id, run_id, step_id, tool_name, input_params, output_length,
                    retrieval_layer, l0_match_count, l1_match_count, is_truncated, relevance_level, dedup_reason,
                    retrieval_details, duration_ms, success, error_message, created_at)
                SELECT r.session_id, r.run_id, t.seq,
                       ELT(1 + t.seq % 4, 'lookup_knowledge', 'query_logs', 'query_metrics', 'search_runbook'),
                       '{{"q":"x"}}', 2048, IF(t.seq % 2 = 0, 'L0+L1', NULL),
                       IF(t.seq % 2 = 0, 3, NULL), IF(t.seq % 2 = 0, 2, NULL),
                       0, IF(t.seq % 2 = 0, 'PRECISE', NULL), NULL,
                       {evidence},
                       180, IF(t.seq = 7, 0, 1), IF(t.seq = 7, 'timeout after 30000 ms', NULL),
                       r.created_at + INTERVAL t.seq SECOND
                FROM diagnosis_run r JOIN seq_1_to_{tools} t ORDER BY r.id, t.seq"""
        )
    conn.close()


def seed_runs_only(server: MariaDB, database: str, runs: int) -> None:
    server.create_database(database)
    conn = server.root(database)
    with conn.cursor() as cur:
        cur.execute(
            f"""INSERT INTO diagnosis_run (run_id, session_id, query, status, created_at, updated_at)
                SELECT CONCAT('run-idle-', seq), 's', 'q', 'SUCCESS', '2026-01-01', '2026-01-01' FROM seq_1_to_{runs}"""
        )
    conn.close()


def seed_rated_runs(server: MariaDB, database: str, runs: int, days: int) -> None:
    """``runs`` finished runs spread evenly over the last ``days`` days; every 20th rated DOWN."""
    server.create_database(database)
    conn = server.root(database)
    step = days * 86400 / runs
    with conn.cursor() as cur:
        cur.execute(
            f"""INSERT INTO diagnosis_run (run_id, session_id, query, status, feedback, created_at, updated_at)
                SELECT CONCAT('run-fb-', seq), 's', 'q', 'SUCCESS', IF(MOD(seq, 20) = 0, 'DOWN', NULL),
                       UTC_TIMESTAMP() - INTERVAL ROUND(({runs} - seq) * {step}) SECOND,
                       UTC_TIMESTAMP() - INTERVAL ROUND(({runs} - seq) * {step}) SECOND
                FROM seq_1_to_{runs}"""
        )
    conn.close()


# -- the measured paths ----------------------------------------------------------------


def _config_file(tmp: Path, url: str, endpoint: str, **extra) -> Path:
    sections: dict[str, dict] = {
        "source": {"url": url},
        "state": {"url": f"sqlite:///{tmp / ('state-' + uuid.uuid4().hex + '.db')}"},
        "export": {"endpoint": endpoint},
        "metrics": {"enabled": False},
    }
    for section, values in extra.items():
        sections.setdefault(section, {}).update(values)
    text = "\n\n".join(
        f"[{section}]\n" + "\n".join(f"{key} = {json.dumps(value)}" for key, value in values.items())
        for section, values in sections.items()
    )
    path = tmp / f"bench-{uuid.uuid4().hex}.toml"
    path.write_text(text + "\n")
    return path


def server_bytes_sent(server: MariaDB) -> int:
    conn = server.root()
    with conn.cursor() as cur:
        cur.execute("SHOW GLOBAL STATUS LIKE 'Bytes_sent'")
        value = int(cur.fetchone()[1])
    conn.close()
    return value


def server_cpu_seconds(server: MariaDB) -> float:
    """The database process's user + system CPU time so far."""
    assert server.process is not None
    fields = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_backfill(
    tmp: Path,
    url: str,
    receiver: CountingReceiver,
    server: MariaDB | None = None,
    workers: int = 1,
    python: str = sys.executable,
    **config_extra,
) -> dict:
    """`run-otel backfill` as a user runs it; spans/s from the receiver's count, peak RSS of the child,
    and (with ``server``) the bytes the database sent and the CPU it spent per exported span."""
    receiver.reset()
    config = _config_file(tmp, url, receiver.endpoint, **config_extra)
    sent_before = server_bytes_sent(server) if server else 0
    cpu_before = server_cpu_seconds(server) if server else 0.0
    started = time.perf_counter()
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    process = subprocess.Popen(
        [
            python,
            "-m",
            "run_otel",
            "backfill",
            "--since",
            "2000-01-01",
            "--workers",
            str(workers),
            "--config",
            str(config),
        ],
        # Another build's interpreter must not import this checkout through PYTHONPATH.
        env=None if python == sys.executable else {k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak = PeakRss(process.pid)
    peak.start()
    _out, err = process.communicate()
    elapsed = time.perf_counter() - started
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak.join()
    if process.returncode != 0:
        raise SystemExit(err)
    wait_for(lambda: receiver.counter.value > 0, 10, "spans")
    out = {
        "spans": receiver.counter.value,
        "seconds": elapsed,
        "spans_per_s": receiver.counter.value / elapsed,
        "peak_rss_mib": peak.kib / 1024,
        "peak_rss_mib_per_process": peak.max_kib / 1024,
        # The backfill's own processes (its parts are its children, reaped before it exits), start-up included.
        "cpu_us_per_span": (children.ru_utime + children.ru_stime - children_before.ru_utime - children_before.ru_stime)
        / max(receiver.counter.value, 1)
        * 1e6,
    }
    if server:
        out["db_bytes_per_span"] = (server_bytes_sent(server) - sent_before) / receiver.counter.value
        out["db_cpu_us_per_span"] = (server_cpu_seconds(server) - cpu_before) / receiver.counter.value * 1e6
    return out


class PeakRss(threading.Thread):
    """Follows a process and its children (backfill's reader process): the sum of their peak
    RSS (VmHWM), an upper bound of what they held at once, until the process exits."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.kib = pid, 0
        self._peaks: dict[int, int] = {}
        self.max_kib = 0  # the largest single process's peak

    def run(self) -> None:
        status = Path(f"/proc/{self.pid}/status")
        while True:
            try:
                if "State:\tZ" in status.read_text():
                    return
            except (FileNotFoundError, ProcessLookupError):
                return
            for pid in (self.pid, *self._children()):
                self._peaks[pid] = max(self._peaks.get(pid, 0), _vm_hwm_kib(pid))
            self.kib = sum(self._peaks.values())
            self.max_kib = max(self._peaks.values())
            time.sleep(0.1)

    def _children(self) -> list[int]:
        pids: list[int] = []
        for task in Path(f"/proc/{self.pid}/task").glob("*/children"):
            try:
                pids += [int(p) for p in task.read_text().split()]
            except (FileNotFoundError, ProcessLookupError):
                pass
        return pids


def _vm_hwm_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def measure_sdk_baseline(url: str, receiver: CountingReceiver, batch_size: int = 500) -> dict:
    """The same read and mapping, then ReadableSpan + the SDK's OTLP encoder and gRPC exporter."""
    from opentelemetry import trace as trace_api
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExportResult
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Status, StatusCode

    from run_otel.config import build_config
    from run_otel.factory import build_mapper, build_source
    from run_otel.mapping.span_data import STATUS_ERROR

    receiver.reset()
    config = build_config({"source": {"url": url}})
    source = build_source(config)
    mapper = build_mapper(config, source.clock)
    exporter = OTLPSpanExporter(endpoint=receiver.endpoint, insecure=True)
    sdk_resource = Resource.create({"service.name": "diagnosis-agent"})
    scope = InstrumentationScope("run_otel", "bench")

    def readable(span):
        context = trace_api.SpanContext(int.from_bytes(span.trace_id, "big"), int.from_bytes(span.span_id, "big"), False)
        parent = (
            trace_api.SpanContext(int.from_bytes(span.trace_id, "big"), int.from_bytes(span.parent_span_id, "big"), False)
            if span.parent_span_id
            else None
        )
        status = Status(StatusCode.ERROR, span.status_message) if span.status_code == STATUS_ERROR else Status(StatusCode.UNSET)
        return ReadableSpan(
            name=span.name,
            context=context,
            parent=parent,
            resource=sdk_resource,
            attributes=dict(span.attributes),
            kind=trace_api.SpanKind.INTERNAL,
            status=status,
            start_time=span.start_ns,
            end_time=span.end_ns,
            instrumentation_scope=scope,
        )

    started = time.perf_counter()
    cursor = 0
    while True:
        runs = source.runs_after(cursor, batch_size)
        if not runs:
            break
        cursor = runs[-1].id
        tools = source.tools_for(r.run_id for r in runs)
        spans = [readable(s) for r in runs for s in mapper.map_run(r, tools[r.run_id]).spans]
        if exporter.export(spans) != SpanExportResult.SUCCESS:
            raise SystemExit("baseline export failed")
    elapsed = time.perf_counter() - started
    exporter.shutdown()
    source.close()
    return {"spans": receiver.counter.value, "seconds": elapsed, "spans_per_s": receiver.counter.value / elapsed}


def measure_user_script(server: MariaDB, database: str, receiver: CountingReceiver) -> dict:
    """bench/user_script.py as a whole process: the plain script an SRE would write instead."""
    receiver.reset()
    started = time.perf_counter()
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "user_script.py"),
            "127.0.0.1",
            str(server.port),
            "root",
            server.ROOT_PASSWORD,
            database,
            receiver.endpoint,
        ],
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    wait_for(lambda: receiver.counter.value > 0, 10, "spans")
    cpu = children.ru_utime + children.ru_stime - children_before.ru_utime - children_before.ru_stime
    return {
        "spans": receiver.counter.value,
        "seconds": elapsed,
        "spans_per_s": receiver.counter.value / elapsed,
        "cpu_us_per_span": cpu / receiver.counter.value * 1e6,
    }


def measure_help(reps: int = 5) -> dict:
    """`run-otel --help` wall time, as a user starts it."""
    command = [str(Path(sys.executable).parent / "run-otel"), "--help"]
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True)
        times.append(time.perf_counter() - started)
    return {"median_s": statistics.median(times), "all": times}


def _connect(server: MariaDB, database: str, driver: str):
    if driver == "mysqlconnector":
        import mysql.connector

        return mysql.connector.connect(
            host="127.0.0.1", port=server.port, user="root", password=server.ROOT_PASSWORD, database=database, charset="utf8mb4"
        )
    if driver == "mysqldb":
        import MySQLdb

        return MySQLdb.connect(
            host="127.0.0.1", port=server.port, user="root", password=server.ROOT_PASSWORD, database=database, charset="utf8mb4"
        )
    return server.root(database)


def measure_raw_read(server: MariaDB, database: str, driver: str = "pymysql", batch_size: int = 500) -> dict:
    """The bridge's statements and columns through the same driver, rows discarded: the read limit."""
    from run_otel.source.columns import RUN_COLUMNS, TOOL_COLUMNS

    conn = _connect(server, database, driver)
    rows = 0
    started = time.perf_counter()
    with conn.cursor() as cur:
        cursor = 0
        while True:
            cur.execute(
                f"SELECT {', '.join(RUN_COLUMNS)} FROM diagnosis_run WHERE id > %s ORDER BY id LIMIT %s", (cursor, batch_size)
            )
            runs = cur.fetchall()
            if not runs:
                break
            cursor = runs[-1][0]
            rows += len(runs)
            ids = [r[1] for r in runs]
            cur.execute(
                f"SELECT {', '.join(TOOL_COLUMNS)} FROM tool_invocation WHERE "
                f"run_id IN ({', '.join(['%s'] * len(ids))}) ORDER BY run_id, id",
                ids,
            )
            rows += len(cur.fetchall())
    elapsed = time.perf_counter() - started
    conn.close()
    return {"rows": rows, "seconds": elapsed, "rows_per_s": rows / elapsed}


def measure_bridge_read(tmp: Path, url: str, raw: bool, batch_size: int = 500) -> dict:
    """The bridge's own read (Source: the statements, the evidence summary, the row types), with
    the driver's tuples or with SQLAlchemy's Row for each row: the raw-read lever alone."""
    from run_otel.config import load_config
    from run_otel.factory import build_source

    source = build_source(load_config(_config_file(tmp, url, "127.0.0.1:1"), environ={}))
    assert source.reads_raw
    source.reads_raw = raw
    rows, high_water = 0, 0
    started, cpu = time.perf_counter(), time.process_time()
    while runs := source.runs_after(high_water, batch_size):
        high_water = runs[-1].id
        rows += len(runs) + sum(map(len, source.tools_for(r.run_id for r in runs).values()))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    source.close()
    return {"rows": rows, "seconds": elapsed, "rows_per_s": rows / elapsed, "cpu_us_per_row": cpu / rows * 1e6}


def measure_idle_poll(tmp: Path, url: str, reps: int = 30) -> dict:
    from run_otel.config import load_config
    from run_otel.factory import build_parts, build_poller

    config = load_config(_config_file(tmp, url, "127.0.0.1:1", poll={"start_from": "now"}), environ={})
    parts = build_parts(config)
    poller = build_poller(parts)
    poller.poll()  # the first poll sets the checkpoint at the top of the table
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        result = poller.poll()
        times.append(time.perf_counter() - started)
        assert not result.runs
    parts.close()
    return {"median_ms": statistics.median(times) * 1000, "p90_ms": sorted(times)[int(reps * 0.9)] * 1000}


def measure_feedback_pass(tmp: Path, url: str, receiver: CountingReceiver, window_days: int, reps: int = 10) -> dict:
    """One feedback recheck over ``window_days`` of a 1M-row table: the first (reads the whole window and sends every
    rating) and the steady state (the part of the window each later pass reads, without an index on updated_at)."""
    from run_otel.config import load_config
    from run_otel.factory import build_feedback, build_parts
    from run_otel.pipeline.checkpoint import Checkpoint

    config = load_config(_config_file(tmp, url, receiver.endpoint, feedback={"window_seconds": window_days * 86400}), environ={})
    parts = build_parts(config)
    parts.store.save(Checkpoint(high_water=parts.source.max_run_id()), time.time())
    feedback = build_feedback(parts)
    assert feedback is not None
    started = time.perf_counter()
    first = feedback.run()
    first_s = time.perf_counter() - started
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        again = feedback.run()
        times.append(time.perf_counter() - started)
        assert again.sent == 0 and again.rated <= first.rated
    parts.close()
    return {
        "window_days": window_days,
        "rated_in_window": first.rated,
        "first_pass_ms": first_s * 1000,
        "steady_pass_median_ms": statistics.median(times) * 1000,
    }


def measure_delay(tmp: Path, server: MariaDB, seconds: float, rate: float = 50.0) -> dict:
    """A daemon at default settings under a live load; delay from terminal to ack."""
    database = "bench_delay"
    server.create_database(database)
    with CountingReceiver(track_arrivals=True) as receiver:
        config = _config_file(tmp, server.url(database), receiver.endpoint, poll={"start_from": "beginning"})
        daemon = subprocess.Popen(
            [sys.executable, "-m", "run_otel", "run", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        finished: dict[str, float] = {}
        conn = server.root(database)
        time.sleep(3)
        end = time.monotonic() + seconds
        with conn.cursor() as cur:
            while time.monotonic() < end:
                tick = time.monotonic()
                run_uuid = uuid.uuid4()
                cur.execute(
                    "INSERT INTO diagnosis_run (run_id, session_id, query, status, "
                    "release_outcome, total_duration_ms, created_at, updated_at) "
                    "VALUES (%s, 's', 'q', 'SUCCESS', 'SUCCESS', 1000, UTC_TIMESTAMP(), UTC_TIMESTAMP())",
                    (f"run-{run_uuid}",),
                )
                finished[run_uuid.hex] = time.time()
                time.sleep(max(0.0, 1 / rate - (time.monotonic() - tick)))
        conn.close()
        deadline = time.monotonic() + 30
        arrived: dict[str, float] = {}
        while len(arrived) < len(finished) and time.monotonic() < deadline:
            try:
                trace_id, at = receiver.arrivals.get(timeout=1)
                arrived.setdefault(trace_id, at)
            except Exception:
                pass
        daemon.terminate()
        daemon.wait()
    delays = sorted(arrived[t] - finished[t] for t in arrived if t in finished)
    return {
        "runs": len(finished),
        "arrived": len(arrived),
        "p50_s": delays[len(delays) // 2],
        "p95_s": delays[int(len(delays) * 0.95)],
        "poll_interval_s": 5.0,
    }


def compiled_python(tmp: Path, revision: str | None = None) -> str:
    """A virtualenv with run-otel installed from its wheel, the core compiled (setup.py); its python.

    The checkout's own virtualenv is an editable install, which stays pure Python. With
    ``revision``, the wheel is built from that commit of this repository, to measure before and after."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    name = f"compiled-{revision}" if revision else "compiled"
    dist, venv, source = tmp / f"{name}-dist", tmp / f"{name}-venv", ROOT
    if revision:
        source = tmp / f"{name}-src"
        source.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)], check=True, env=env)
    (wheel,) = dist.glob("run_otel-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    install = [str(venv / "bin/pip"), "install", "-q", f"{wheel}[mysql-connector]"]
    subprocess.run(install, check=True, env=env)
    python = str(venv / "bin/python")
    where = subprocess.run(
        [python, "-c", "import run_otel.mapping.spans as m; print(m.__file__)"], capture_output=True, text=True, env=env
    )
    if not where.stdout.strip().endswith(".so"):
        raise SystemExit(f"the compiled build did not compile: {where.stdout}{where.stderr}")
    return python


def _paired(runs: list[dict], scripts: list[dict]) -> float:
    """The median of each backfill's spans/s over the user script's run beside it."""
    return statistics.median(run["spans_per_s"] / script["spans_per_s"] for run, script in zip(runs, scripts, strict=True))


def _drivers() -> list[str]:
    """PyMySQL and mysql-connector-python's C extension always; mysqlclient when installed."""
    import mysql.connector

    if not mysql.connector.HAVE_CEXT:
        raise SystemExit("mysql-connector-python's C extension did not load; the bench compares it, so it must")
    try:
        import MySQLdb  # noqa: F401
    except ImportError:
        return ["pymysql", "mysqlconnector"]
    return ["pymysql", "mysqlconnector", "mysqldb"]


# -- the report --------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--tools", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--delay-seconds", type=float, default=60)
    parser.add_argument("--skip-delay", action="store_true")
    parser.add_argument("--skip-idle", action="store_true")
    parser.add_argument("--skip-feedback", action="store_true")
    parser.add_argument("--skip-evidence", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--workers", default="2", help="backfill --workers values beyond 1 to measure, comma-separated")
    parser.add_argument("--skip-compiled", action="store_true", help="measure only the pure-Python build")
    parser.add_argument(
        "--receiver-delay-ms", type=float, default=0.0, help="the counting receiver answers each request this much later"
    )
    parser.add_argument("--before", metavar="REV", help="also measure the compiled build of this commit, side by side")
    args = parser.parse_args()

    results: dict = {
        "runs": args.runs,
        "tools_per_run": args.tools,
        "spans": args.runs * (args.tools + 1),
        "reps": args.reps,
        "cpus": os.cpu_count(),
    }
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        server = MariaDB(tmp / "mariadb")
        server.install()
        server.start()
        try:
            print(f"seeding {args.runs} runs x {args.tools} tools ...", flush=True)
            seed_runs_and_tools(server, "bench", args.runs, args.tools)
            url = server.url("bench")
            drivers = _drivers()
            worker_counts = [int(n) for n in args.workers.split(",") if int(n) > 1]
            builds = {"python": sys.executable}
            if not args.skip_compiled:
                print("building the compiled wheel into its own virtualenv ...", flush=True)
                builds["compiled"] = compiled_python(tmp)
            if args.before:
                print(f"building the compiled wheel of {args.before} ...", flush=True)
                builds[f"compiled {args.before}"] = compiled_python(tmp, args.before)
            # (build, workers) beyond the pure one-process backfill, which keeps its own keys.
            variants = [(b, 1) for b in builds if b != "python"] + [(b, n) for b in builds for n in worker_counts]
            backfill: dict[str, list] = {d: [] for d in drivers}
            by_variant: dict[tuple[str, str, int], list] = {(d, b, n): [] for d in drivers for b, n in variants}
            raw: dict[str, list] = {d: [] for d in drivers}
            bridge_read: dict[tuple[str, bool], list] = {(d, r): [] for d in drivers for r in (True, False)}
            baseline: list = []
            # Each backfill runs right beside a run of the user's script, first one, then the other
            # in turn: each ratio is the median of pairs taken seconds apart, where the machine's
            # speed drifts by a third within minutes.
            beside: dict[tuple[str, str, int], list] = {(d, b, n): [] for d in drivers for b, n in [("python", 1), *variants]}
            results["receiver_delay_ms"] = args.receiver_delay_ms
            with CountingReceiver(delay=args.receiver_delay_ms / 1000) as receiver:

                def paired(key: tuple[str, str, int], rep: int, backfill_run: Callable[[], dict]) -> dict:
                    if rep % 2 == 0:
                        beside[key].append(measure_user_script(server, "bench", receiver))
                    run = backfill_run()
                    if rep % 2 == 1:
                        beside[key].append(measure_user_script(server, "bench", receiver))
                    return run

                for rep in range(args.reps):
                    print(f"repetition {rep + 1}/{args.reps} ...", flush=True)
                    for driver in drivers:
                        driver_url = with_driver(url, driver)
                        raw[driver].append(measure_raw_read(server, "bench", driver))
                        for tuples in (True, False):
                            bridge_read[driver, tuples].append(measure_bridge_read(tmp, driver_url, tuples))
                        backfill[driver].append(
                            paired((driver, "python", 1), rep, partial(measure_backfill, tmp, driver_url, receiver))
                        )
                        for build, n in variants:
                            by_variant[driver, build, n].append(
                                paired(
                                    (driver, build, n),
                                    rep,
                                    partial(measure_backfill, tmp, driver_url, receiver, workers=n, python=builds[build]),
                                )
                            )
                    baseline.append(measure_sdk_baseline(url, receiver))
            script = [run for runs in beside.values() for run in runs]
            results["user_script"] = {
                "spans_per_s": statistics.median(r["spans_per_s"] for r in script),
                "cpu_us_per_span": statistics.median(r["cpu_us_per_span"] for r in script),
                "all": script,
            }
            results["sdk_baseline"] = {"spans_per_s": statistics.median(r["spans_per_s"] for r in baseline), "all": baseline}
            results["help"] = measure_help()
            results["drivers"] = {}
            for driver in drivers:
                spans_per_s = statistics.median(r["spans_per_s"] for r in backfill[driver])
                raw_rows_per_s = statistics.median(r["rows_per_s"] for r in raw[driver])
                results["drivers"][driver] = {
                    "backfill_spans_per_s": spans_per_s,
                    "peak_rss_mib": max(r["peak_rss_mib"] for r in backfill[driver]),
                    "raw_read_rows_per_s": raw_rows_per_s,
                    "vs_user_script": _paired(backfill[driver], beside[driver, "python", 1]),
                    "vs_sdk": spans_per_s / results["sdk_baseline"]["spans_per_s"],
                    "vs_its_raw_read": spans_per_s / raw_rows_per_s,
                    "bridge_read": {
                        kind: {
                            "rows_per_s": statistics.median(r["rows_per_s"] for r in bridge_read[driver, tuples]),
                            "cpu_us_per_row": statistics.median(r["cpu_us_per_row"] for r in bridge_read[driver, tuples]),
                        }
                        for kind, tuples in (("tuples", True), ("rows", False))
                    },
                    "all": {"backfill": backfill[driver], "raw_read": raw[driver]},
                    "variants": {
                        f"{build} x{n}": {
                            "backfill_spans_per_s": (
                                rate := statistics.median(r["spans_per_s"] for r in by_variant[driver, build, n])
                            ),
                            "vs_user_script": _paired(by_variant[driver, build, n], beside[driver, build, n]),
                            "vs_pure_one_process": rate / spans_per_s,
                            "peak_rss_mib_total": max(r["peak_rss_mib"] for r in by_variant[driver, build, n]),
                            "peak_rss_mib_per_process": max(r["peak_rss_mib_per_process"] for r in by_variant[driver, build, n]),
                            "cpu_us_per_span": statistics.median(r["cpu_us_per_span"] for r in by_variant[driver, build, n]),
                            "all": by_variant[driver, build, n],
                        }
                        for build, n in variants
                    },
                }
            results["ratios"] = {}
            if not args.skip_idle:
                print("idle poll: seeding 10k and 1M rows ...", flush=True)
                seed_runs_only(server, "idle_10k", 10_000)
                seed_runs_only(server, "idle_1m", 1_000_000)
                small = measure_idle_poll(tmp, server.url("idle_10k"))
                large = measure_idle_poll(tmp, server.url("idle_1m"))
                results["idle_poll"] = {"10k": small, "1m": large, "ratio_1m_vs_10k": large["median_ms"] / small["median_ms"]}
            if not args.skip_evidence:
                print(f"1 KB evidence: seeding {args.runs} runs x {args.tools} tools, 3 refs of 1 KB per call ...", flush=True)
                seed_runs_and_tools(server, "bench_kb", args.runs, args.tools, KB_EVIDENCE)
                kb_url, by_path = server.url("bench_kb"), {True: [], False: []}
                with CountingReceiver() as receiver:
                    for _ in range(args.reps):
                        for in_database in (True, False):
                            by_path[in_database].append(
                                measure_backfill(tmp, kb_url, receiver, server, source={"evidence_in_database": in_database})
                            )
                results["kb_evidence"] = {
                    name: {
                        "spans_per_s": statistics.median(r["spans_per_s"] for r in runs),
                        "db_bytes_per_span": statistics.median(r["db_bytes_per_span"] for r in runs),
                        "db_cpu_us_per_span": statistics.median(r["db_cpu_us_per_span"] for r in runs),
                    }
                    for name, runs in (("in_database", by_path[True]), ("parsed_here", by_path[False]))
                }
                kb = results["kb_evidence"]
                results["ratios"]["kb_bytes_parsed_vs_in_database"] = (
                    kb["parsed_here"]["db_bytes_per_span"] / kb["in_database"]["db_bytes_per_span"]
                )
                results["ratios"]["kb_speed_in_database_vs_parsed"] = (
                    kb["in_database"]["spans_per_s"] / kb["parsed_here"]["spans_per_s"]
                )
            if not args.skip_memory:
                print("memory: seeding 111,112 runs x 8 tools (1,000,008 spans) ...", flush=True)
                seed_runs_and_tools(server, "bench_1m", 111_112, 8)
                with CountingReceiver() as receiver:
                    results["memory_1m_spans"] = {
                        driver: measure_backfill(tmp, with_driver(server.url("bench_1m"), driver), receiver) for driver in drivers
                    }
                    if "compiled" in builds and worker_counts:
                        n = max(worker_counts)
                        results["memory_1m_spans_split"] = {
                            f"compiled x{n}, {driver}": measure_backfill(
                                tmp, with_driver(server.url("bench_1m"), driver), receiver, workers=n, python=builds["compiled"]
                            )
                            for driver in drivers
                        }
            if not args.skip_feedback:
                print("feedback pass: seeding 1M runs over 30 days ...", flush=True)
                seed_rated_runs(server, "feedback_1m", 1_000_000, 30)
                with CountingReceiver() as receiver:
                    results["feedback_pass"] = [
                        measure_feedback_pass(tmp, server.url("feedback_1m"), receiver, days) for days in (1, 7)
                    ]
            if not args.skip_delay:
                print(f"delay: {args.delay_seconds:.0f}s of 50 runs/s ...", flush=True)
                results["delay"] = measure_delay(tmp, server, args.delay_seconds)
        finally:
            server.stop()
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "latest.json").write_text(json.dumps(results, indent=2))
    print_table(results)


def print_table(results: dict) -> None:
    rows = [
        (
            "a user's script (bench/user_script.py)",
            f"{results['user_script']['spans_per_s']:,.0f} spans/s",
            f"whole process, PyMySQL; {results['user_script']['cpu_us_per_span']:.1f} us CPU a span",
        ),
        ("SDK path baseline", f"{results['sdk_baseline']['spans_per_s']:,.0f} spans/s", ""),
        ("run-otel --help", f"{results['help']['median_s'] * 1000:.0f} ms", "target < 150 ms"),
    ]
    for driver, d in results["drivers"].items():
        rows += [
            (f"backfill, {driver}", f"{d['backfill_spans_per_s']:,.0f} spans/s", f"peak RSS {d['peak_rss_mib']:.0f} MiB"),
            (f"raw read, {driver}", f"{d['raw_read_rows_per_s']:,.0f} rows/s", ""),
            *(
                (
                    f"the bridge's read, {driver}, {label}",
                    f"{d['bridge_read'][kind]['rows_per_s']:,.0f} rows/s",
                    f"{d['bridge_read'][kind]['cpu_us_per_row']:.1f} us CPU a row",
                )
                for kind, label in (("tuples", "the driver's tuples"), ("rows", "SQLAlchemy rows"))
            ),
            (
                f"the bridge's read {driver}, tuples / rows",
                f"{d['bridge_read']['rows']['cpu_us_per_row'] / d['bridge_read']['tuples']['cpu_us_per_row']:.2f}x less CPU",
                "",
            ),
            (f"backfill {driver} / user's script", f"{d['vs_user_script']:.2f}x", "target >= 3x"),
            (f"backfill {driver} / SDK path", f"{d['vs_sdk']:.2f}x", ""),
            (f"backfill {driver} / its raw read", f"{d['vs_its_raw_read']:.2f}x", "target >= 0.6x"),
        ]
        for name, w in d.get("variants", {}).items():
            rows += [
                (
                    f"backfill {name}, {driver}",
                    f"{w['backfill_spans_per_s']:,.0f} spans/s",
                    f"peak RSS {w['peak_rss_mib_per_process']:.0f} MiB per process, {w['peak_rss_mib_total']:.0f} MiB in all",
                ),
                (f"backfill {name} {driver} / user's script", f"{w['vs_user_script']:.2f}x", "target >= 3x"),
                (f"backfill {name} {driver} / python x1", f"{w['vs_pure_one_process']:.2f}x", ""),
                (
                    f"backfill {name} {driver}, CPU a span",
                    f"{w['cpu_us_per_span']:.1f} us",
                    "all its processes, start-up included",
                ),
            ]
    if "idle_poll" in results:
        idle = results["idle_poll"]
        rows += [
            ("idle poll, 10k rows", f"{idle['10k']['median_ms']:.2f} ms", ""),
            ("idle poll, 1M rows", f"{idle['1m']['median_ms']:.2f} ms", f"{idle['ratio_1m_vs_10k']:.2f}x (target <= 1.5x)"),
        ]
    if "kb_evidence" in results:
        kb, ratios = results["kb_evidence"], results["ratios"]
        rows += [
            (
                "1 KB evidence, JSON in the database",
                f"{kb['in_database']['spans_per_s']:,.0f} spans/s",
                f"{kb['in_database']['db_bytes_per_span']:,.0f} bytes read, "
                f"{kb['in_database']['db_cpu_us_per_span']:.1f} us database CPU per span",
            ),
            (
                "1 KB evidence, parsed in run-otel",
                f"{kb['parsed_here']['spans_per_s']:,.0f} spans/s",
                f"{kb['parsed_here']['db_bytes_per_span']:,.0f} bytes read, "
                f"{kb['parsed_here']['db_cpu_us_per_span']:.1f} us database CPU per span",
            ),
            ("bytes read, parsed / in the database", f"{ratios['kb_bytes_parsed_vs_in_database']:.1f}x", "target >= 5x"),
            ("speed, in the database / parsed", f"{ratios['kb_speed_in_database_vs_parsed']:.2f}x", ""),
        ]
    for name, one in results.get("memory_1m_spans_split", {}).items():
        rows.append(
            (
                f"backfill of {one['spans']:,} spans, {name}",
                f"peak RSS {one['peak_rss_mib_per_process']:.0f} MiB per process",
                f"{one['peak_rss_mib']:.0f} MiB in all; {one['spans_per_s']:,.0f} spans/s; target < 200 MB a process",
            )
        )
    for driver, one in results.get("memory_1m_spans", {}).items():
        rows.append(
            (
                f"backfill of {one['spans']:,} spans, {driver}",
                f"peak RSS {one['peak_rss_mib']:.0f} MiB",
                f"{one['spans_per_s']:,.0f} spans/s; target < 200 MB",
            )
        )
    for fb in results.get("feedback_pass", []):
        rows.append(
            (
                f"feedback pass, {fb['window_days']}-day window of 1M rows",
                f"{fb['steady_pass_median_ms']:.0f} ms",
                f"{fb['rated_in_window']} rated runs; first pass {fb['first_pass_ms']:.0f} ms",
            )
        )
    if "delay" in results:
        delay = results["delay"]
        rows.append(
            (
                "export delay p50 / p95",
                f"{delay['p50_s']:.2f} s / {delay['p95_s']:.2f} s",
                f"{delay['arrived']}/{delay['runs']} runs; target p95 <= {delay['poll_interval_s'] + 1:.0f} s",
            )
        )
    width = max(len(r[0]) for r in rows)
    print(
        f"\n{results['runs']} runs x {results['tools_per_run']} tools = "
        f"{results['spans']:,} spans, median of {results['reps']}, {results['cpus']} CPUs"
        + (f", the receiver answering {results['receiver_delay_ms']:.0f} ms late" if results.get("receiver_delay_ms") else "")
    )
    for name, value, note in rows:
        print(f"  {name:<{width}}  {value:>18}  {note}")


if __name__ == "__main__":
    main()
