"""The bridge's health over HTTP: /metrics, /healthz and /readyz on one port, and the
readiness policy /readyz answers with."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from .metrics import BridgeMetrics


class HealthServer:
    """/metrics (Prometheus text), /healthz (alive) and /readyz (ready) on one port."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry | None,
        ready: Callable[[], tuple[bool, str]],
        alive: Callable[[], tuple[bool, str]] = lambda: (True, "ok"),
    ):
        self._address = (host, port)
        self._handler = _handler(registry, ready, alive)
        self._server: ThreadingHTTPServer | None = None
        self.port = port  # the port bound, once started (a port of 0 takes a free one)

    def start(self) -> HealthServer:
        """Binds the port (raises OSError when it cannot) and serves from a thread of its own."""
        server = self._server = ThreadingHTTPServer(self._address, self._handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        threading.Thread(target=server.serve_forever, name="run-otel-http", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _handler(
    registry: CollectorRegistry | None, ready: Callable[[], tuple[bool, str]], alive: Callable[[], tuple[bool, str]]
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics" and registry is not None:
                # prometheus_client's own negotiation: OpenMetrics when the scraper asks for it.
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                self._reply(200, encoder(registry), content_type)
            elif path == "/healthz":
                is_alive, why = alive()
                self._reply(200 if is_alive else 503, (why + "\n").encode())
            elif path == "/readyz":
                is_ready, why = ready()
                self._reply(200 if is_ready else 503, (why + "\n").encode())
            else:
                self._reply(404, b"not found\n")

        def _reply(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:  # scrapes every few seconds would flood the log
            pass

    return Handler


def readiness(
    metrics: BridgeMetrics, interval: float, request_seconds: float, clock: Callable[[], float] = time.time
) -> Callable[[], tuple[bool, str]]:
    """Ready unless a poll failed since the last progress, or no poll finished and no request was
    acknowledged for three poll intervals. Past that, only an OTLP request actually in flight keeps
    it up, for ``request_seconds``, the longest a request may wait for its answer: a backlog drained
    behind a slow receiver is progress, not a stall, but a poll that waits on the database is not."""

    def ready() -> tuple[bool, str]:
        if metrics.standby:
            return True, "ready: standby, another instance holds the lease"
        if metrics.checkpoint_ahead_runs:
            return False, f"not ready: the checkpoint is {metrics.checkpoint_ahead_runs} run ids ahead of the source; see the log"
        if metrics.zone_message:
            return False, f"not ready: {metrics.zone_message}"
        now = clock()
        if metrics.last_poll_ok and now - metrics.last_success <= 3 * interval:
            return True, "ready"
        latest = max(metrics.last_success, metrics.last_progress)
        if metrics.last_failure > latest:
            part = f" ({metrics.failed_part})" if metrics.failed_part else ""
            return False, f"not ready: the last poll failed{part}; see the log"
        if not latest:
            return False, "not ready: no poll has finished yet"
        quiet = now - latest
        draining = metrics.last_progress >= metrics.last_success
        sending_since = metrics.sending_since
        if sending_since is not None and now - sending_since <= request_seconds:
            flying = f"a request is in flight for {now - sending_since:.0f}s"
            if draining:
                return True, f"ready: a poll is draining; {flying}, the last was acknowledged {quiet:.0f}s ago"
            return True, f"ready: {flying}; the last poll finished {quiet:.0f}s ago"
        if quiet <= 3 * interval:
            return True, f"ready: a poll is draining; the last request was acknowledged {quiet:.0f}s ago"
        waiting = "" if sending_since is None else f"; a request has waited {now - sending_since:.0f}s for its answer"
        return False, f"not ready: no poll finished and no request was acknowledged for {quiet:.0f}s{waiting}"

    return ready
