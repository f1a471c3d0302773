"""The daemon and the backfill, as a user runs them, against a receiver that counts.

The receiver runs in a process of its own and counts the spans it acknowledges
and, of them, the roots (one a run: a span without a parent), with the time of
the last root, so the end of a drain is seen at the receiver, not inferred.
A scraper reads the daemon's /metrics while it drains.
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from concurrent import futures
from pathlib import Path

from servers import free_port, stop_process, wait_for


def _receive(port: int, spans, roots, last_root) -> None:
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            count = top = 0
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    count += len(ss.spans)
                    top += sum(1 for span in ss.spans if not span.parent_span_id)
            with spans.get_lock():
                spans.value += count
                roots.value += top
                if top:
                    last_root.value = time.time()
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[("grpc.max_receive_message_length", 64 << 20)])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


class Receiver:
    """An OTLP/gRPC receiver in its own process: spans and roots acknowledged, and when the last root came."""

    def __init__(self) -> None:
        self.port = free_port()
        self.spans = multiprocessing.Value("q", 0)
        self.roots = multiprocessing.Value("q", 0)
        self.last_root = multiprocessing.Value("d", 0.0)
        args = (self.port, self.spans, self.roots, self.last_root)
        self.process = multiprocessing.Process(target=_receive, args=args, daemon=True)

    def __enter__(self) -> Receiver:
        self.process.start()
        time.sleep(0.5)
        return self

    def __exit__(self, *_) -> None:
        self.process.terminate()
        self.process.join()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def counts(self) -> tuple[int, int]:
        with self.spans.get_lock():
            return self.spans.value, self.roots.value

    def reset(self) -> None:
        with self.spans.get_lock():
            self.spans.value = self.roots.value = 0
            self.last_root.value = 0.0


def write_config(folder: Path, sections: dict[str, dict]) -> Path:
    """A run-otel config file of these sections, with a state store of its own."""
    sections = {"state": {"url": f"sqlite:///{folder / ('state-' + uuid.uuid4().hex + '.db')}"}, **sections}
    text = "\n\n".join(
        f"[{name}]\n" + "\n".join(f"{key} = {json.dumps(value)}" for key, value in values.items())
        for name, values in sections.items()
    )
    path = folder / f"run-otel-{uuid.uuid4().hex[:8]}.toml"
    path.write_text(text + "\n")
    return path


def run_backfill(config: Path, first_id: int, last_id: int, receiver: Receiver, workers: int = 1) -> dict:
    """`run-otel backfill` of the ids [first_id, last_id], start-up included, until it exits."""
    receiver.reset()
    command = [sys.executable, "-m", "run_otel", "backfill", "--from-id", str(first_id), "--to-id", str(last_id)]
    started = time.perf_counter()
    done = subprocess.run([*command, "--workers", str(workers), "--config", str(config)], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"backfill failed:\n{done.stderr[-3000:]}")
    spans, roots = receiver.counts()
    return {"seconds": seconds, "spans": spans, "runs": roots, "spans_per_s": spans / seconds}


class Daemon:
    """`run-otel run` in a process of its own; its log goes to a file."""

    def __init__(self, config: Path, log: Path):
        self.config, self.log = config, log
        self.process: subprocess.Popen | None = None
        self.started = 0.0

    def start(self) -> None:
        self.started = time.perf_counter()
        with self.log.open("ab") as out:
            command = [sys.executable, "-m", "run_otel", "run", "--config", str(self.config)]
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        stop_process(self.process, 30)


def drain(daemon: Daemon, receiver: Receiver, runs: int, timeout: float) -> dict:
    """Waits until the receiver has the roots of ``runs`` runs; the time from the daemon's start
    to the last of them (perf_counter and time.time agree over a difference)."""
    wall_started = time.time() - (time.perf_counter() - daemon.started)

    def done() -> bool:
        if not daemon.alive():
            raise SystemExit(f"the daemon exited during the catch-up; its log: {daemon.log}")
        return receiver.counts()[1] >= runs

    wait_for(done, timeout, f"the daemon to export {runs} runs", interval=0.2)
    spans, roots = receiver.counts()
    seconds = receiver.last_root.value - wall_started
    return {"seconds": seconds, "spans": spans, "runs": roots, "spans_per_s": spans / seconds}


GAUGES = ("run_otel_lag_seconds", "run_otel_backlog_runs")


class Scraper(threading.Thread):
    """Reads /metrics every ``interval`` seconds: which of the lag gauges each scrape held, and their values."""

    def __init__(self, port: int, interval: float = 1.0):
        super().__init__(daemon=True, name="scraper")
        self.url, self.interval = f"http://127.0.0.1:{port}/metrics", interval
        self.scrapes: list[tuple[float, dict[str, float | None]]] = []  # (time.time(), gauge -> value)
        self.failed = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as response:
                    text = response.read().decode()
            except OSError:
                self.failed += 1  # not listening yet, or too busy to answer: counted, not a scrape
                continue
            self.scrapes.append((time.time(), {name: _gauge(text, name) for name in GAUGES}))

    def stop(self, drained_at: float) -> dict:
        """The scrapes up to ``drained_at`` (the drain), and those after it, apart."""
        self._halt.set()
        self.join()
        during = [values for at, values in self.scrapes if at <= drained_at]
        after = [(at - drained_at, values) for at, values in self.scrapes if at > drained_at]
        out: dict = {"scrapes": len(during), "failed_scrapes": self.failed, "scrapes_after": len(after)}
        for name in GAUGES:
            values = [s[name] for s in during if s[name] is not None]
            out[name] = {
                "present": len(values),
                "first": values[0] if values else None,
                "last": values[-1] if values else None,
                "max": max(values) if values else None,
                # Fell: lower at the end than at the start, and never rose on the way.
                "fell": len(values) > 1 and values[-1] < values[0] and all(b <= a for a, b in zip(values, values[1:])),
                # After the drain: seconds to the first scrape that held it, and its value there.
                "after": next(((round(at, 1), s[name]) for at, s in after if s[name] is not None), None),
            }
        return out


def _gauge(text: str, name: str) -> float | None:
    """The sample's value, summed over its series (one a shard); None when the metric is absent."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " ")
    ]
    return sum(values) if values else None
