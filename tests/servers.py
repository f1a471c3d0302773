"""Real servers for the tests: MariaDB, rotel, and an OTLP receiver.

Everything listens on loopback and lives in a temp directory. The receiver is
the test's own, built from opentelemetry-proto and grpcio; rotel sits in
front of it as the independent OTLP peer run-otel talks to.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pymysql
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from run_otel.source.schema import mysql_statements

_GIVEN_PORTS: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, never one this test process was given before: the kernel
    can hand the same free port to two calls in a row, and a server given it twice fails to bind."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _GIVEN_PORTS:
            _GIVEN_PORTS.add(port)
            return port


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def stop_process(process: subprocess.Popen | None, timeout: float) -> None:
    """SIGTERM, then SIGKILL if it is still there after ``timeout`` seconds."""
    if process and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class ServerGate:
    """Keeps the ``server`` marker honest: a test that starts a server or runs a program the test
    command installs without the marker fails at once, so ``pytest -m "not server"`` never waits
    on one. conftest opens the gate for each marked test."""

    open = True  # outside pytest (a script importing these helpers), nothing is gated

    @classmethod
    def need(cls, what: str) -> None:
        if not cls.open:
            raise RuntimeError(f"this test uses {what}: mark it @pytest.mark.server (or use a server fixture)")


def _binary(*names: str) -> str:
    ServerGate.need(names[0])
    for name in names:
        for folder in ("/usr/sbin", "/usr/bin", "/usr/local/bin"):
            path = Path(folder) / name
            if path.exists():
                return str(path)
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError(f"none of {names} is installed; run the README's test command")


def with_driver(url: str, driver: str) -> str:
    """A MariaDB URL of this harness with another driver: pymysql, mysqlconnector or mysqldb."""
    return url.replace("mysql+pymysql://", f"mysql+{driver}://")


class MariaDB:
    """A throwaway MariaDB server from Debian's mariadb-server package."""

    ROOT_PASSWORD = "root-secret-pw"

    def __init__(self, base: Path, extra_args: tuple[str, ...] = ()):
        self.base = base
        self.datadir = base / "data"
        self.socket = base / "mysqld.sock"
        self.port = free_port()
        self.extra_args = extra_args
        self.process: subprocess.Popen | None = None

    def install(self) -> None:
        command = [
            _binary("mariadb-install-db", "mysql_install_db"),
            f"--datadir={self.datadir}",
            "--user=root",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ]
        # On a loaded machine the bootstrap server has been seen to fail now and then: once more
        # into an empty directory, then fail with what it said.
        for _attempt in range(2):
            shutil.rmtree(self.datadir, ignore_errors=True)
            self.datadir.mkdir(parents=True)
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode == 0:
                return
        raise RuntimeError(f"mariadb-install-db failed twice ({done.returncode}): {(done.stdout + done.stderr)[-2000:]}")

    def start(self) -> None:
        log = (self.base / "mysqld.log").open("ab")
        self.process = subprocess.Popen(
            [
                _binary("mariadbd", "mysqld"),
                "--no-defaults",
                f"--datadir={self.datadir}",
                f"--socket={self.socket}",
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                "--user=root",
                f"--pid-file={self.base / 'mysqld.pid'}",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=256M",
                "--innodb-flush-log-at-trx-commit=2",
                "--max-connections=500",
                f"--log-error={self.base / 'mysqld.err'}",
                *self.extra_args,
            ],
            stdout=log,
            stderr=log,
        )
        wait_for(self._accepts, 60, "MariaDB to accept connections", 0.2)

    def _accepts(self) -> bool:
        if self.process and self.process.poll() is not None:
            raise RuntimeError(f"mariadbd exited: {(self.base / 'mysqld.err').read_text()[-2000:]}")
        try:
            conn = pymysql.connect(unix_socket=str(self.socket), user="root")
        except pymysql.err.OperationalError:
            return False
        # The tests and run-otel connect over TCP on loopback, as a deployment would.
        with conn.cursor() as cur:
            cur.execute(f"CREATE OR REPLACE USER 'root'@'127.0.0.1' IDENTIFIED BY '{self.ROOT_PASSWORD}'")
            cur.execute("GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION")
        conn.close()
        return True

    def stop(self) -> None:
        stop_process(self.process, 60)
        self.process = None

    def root(self, database: str | None = None, **kwargs) -> pymysql.Connection:
        return pymysql.connect(
            host="127.0.0.1",
            port=self.port,
            user="root",
            password=self.ROOT_PASSWORD,
            database=database,
            autocommit=True,
            charset="utf8mb4",
            **kwargs,
        )

    def url(self, database: str, user: str = "root", password: str | None = None) -> str:
        password = self.ROOT_PASSWORD if password is None else password
        return f"mysql+pymysql://{user}:{password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A fresh database with the agent's schema; returns its root URL."""
        conn = self.root()
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
            cur.execute(f"USE `{name}`")
            for statement in mysql_statements():
                cur.execute(statement)
        conn.close()
        return self.url(name)


class Throttle:
    """A receiver throttling on purpose: the first ``answers`` requests are told to wait ``seconds``
    (a gRPC RetryInfo, an HTTP Retry-After). Every request is timed against the window the last
    such answer opened, so ``inside`` counts the requests a sender should not have made yet."""

    def __init__(self, seconds: float, answers: int):
        self.seconds, self.answers = seconds, answers
        self.given = 0  # throttling answers given
        self.inside = 0  # requests that arrived before the window the last answer opened had passed
        self.arrivals: list[float] = []  # time.monotonic() of every request
        self.until = 0.0
        self._lock = threading.Lock()

    def arrive(self, may_throttle: bool = True) -> bool:
        """Times one request; True when it is to be told to wait (never unless ``may_throttle``)."""
        with self._lock:
            now = time.monotonic()
            self.arrivals.append(now)
            # 50 ms of grace: a sender that waited the whole window is not early because of jitter here.
            if now < self.until - 0.05:
                self.inside += 1
            if self.given >= self.answers or not may_throttle:
                return False
            self.given += 1
            self.until = now + self.seconds
            return True


def grpc_throttled(context, seconds: float, code=grpc.StatusCode.RESOURCE_EXHAUSTED) -> None:
    """Aborts the call with ``code`` and a google.rpc.RetryInfo asking for ``seconds``, as the
    collector's memory limiter and vendors' gateways answer."""
    from google.protobuf import any_pb2, duration_pb2
    from google.rpc import error_details_pb2, status_pb2

    whole = int(seconds)
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=whole, nanos=int((seconds - whole) * 1e9))))
    status = status_pb2.Status(code=code.value[0], message="throttled: slow down", details=[detail])
    context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
    context.abort(code, "throttled: slow down")


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: Receiver):
        self._receiver = receiver

    def Export(self, request, context):
        if self._receiver.refuse_credentials:
            # A gateway that refuses the credential and quotes it back, as some do.
            sent = dict(context.invocation_metadata()).get("authorization", "")
            details = f"invalid credentials in header authorization: {sent!r} (token {sent.split()[-1] if sent else ''} unknown)"
            self._receiver.quoted.append(details)
            context.abort(grpc.StatusCode.UNAUTHENTICATED, details)
        self._receiver.throttling(context, "traces")
        return self._receiver.accept(request)


class _LogsService:
    """OTLP logs, served only when a Receiver is built with ``logs=True`` (else UNIMPLEMENTED, as Jaeger answers)."""

    def __init__(self, receiver: Receiver):
        self._receiver = receiver

    def Export(self, request, context):
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2

        self._receiver.throttling(context, "logs")
        with self._receiver._lock:
            self._receiver.log_requests.append(request)
        return logs_service_pb2.ExportLogsServiceResponse()


class _MetricsService:
    """OTLP metrics, served only when a Receiver is built with ``metrics=True``: keeps each request
    with the call's metadata (its grpc-encoding says whether the sender compressed it)."""

    def __init__(self, receiver: Receiver):
        self._receiver = receiver

    def Export(self, request, context):
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

        with self._receiver._lock:
            self._receiver.metric_requests.append((request, dict(context.invocation_metadata())))
        return metrics_service_pb2.ExportMetricsServiceResponse()


@dataclass
class Receiver:
    """The test's OTLP/gRPC trace receiver. Keeps every request it was sent."""

    port: int = field(default_factory=free_port)
    reject_every: int = 0  # answer partial_success for this many spans of each request
    requests: list = field(default_factory=list)
    # With hold_after set, the request after that many is not answered until release():
    # a sender is then provably stuck mid-backlog.
    hold_after: int = 0
    # Answer UNAUTHENTICATED, quoting the authorization header sent; what was answered is kept in quoted.
    refuse_credentials: bool = False
    quoted: list = field(default_factory=list)
    # gRPC's default receive limit (4 MiB), as the collector and Jaeger keep it, unless a
    # test stands for a receiver (or a proxy in front of one) that takes less.
    max_receive_bytes: int | None = None
    # Answer a partial_success that rejects nothing but carries this message (a receiver's warning).
    warning: str = ""
    logs: bool = False  # also serve the OTLP logs service
    log_requests: list = field(default_factory=list)
    metrics: bool = False  # also serve the OTLP metrics service
    metric_requests: list = field(default_factory=list)  # (request, metadata) pairs
    # A slow receiver: each request is kept at once, and answered this many seconds later (drawn
    # from the range), whether or not its sender still waits.
    delay: tuple[float, float] = (0.0, 0.0)
    # TLS: (key, certificate chain) PEM bytes, and the CA a client certificate must be signed by (mTLS).
    tls: tuple[bytes, bytes] | None = None
    client_ca: bytes | None = None
    # Throttling on purpose: this code with a RetryInfo, to the services named (one receiver, one window).
    throttle: Throttle | None = None
    throttle_code: grpc.StatusCode = grpc.StatusCode.RESOURCE_EXHAUSTED
    throttle_services: tuple[str, ...] = ("traces", "logs")

    def __post_init__(self):
        self._lock = threading.Lock()
        self._server = None
        self.holding = threading.Event()
        self._released = threading.Event()

    def release(self) -> None:
        self.hold_after = 0
        self._released.set()

    def throttling(self, context, service: str) -> None:
        """Times the request against the throttle's window, and aborts it when it is to wait."""
        throttle = self.throttle
        if throttle is not None and throttle.arrive(service in self.throttle_services):
            grpc_throttled(context, throttle.seconds, self.throttle_code)

    def accept(self, request):
        with self._lock:
            self.requests.append(request.SerializeToString())
            held = bool(self.hold_after) and len(self.requests) > self.hold_after
        if held:
            # Kept, but not answered until release(): the ack of a delivered request is lost
            # when its sender dies waiting, which is what makes at-least-once send twice.
            self.holding.set()
            self._released.wait(120)
        if self.delay[1]:
            time.sleep(random.uniform(*self.delay))
        response = trace_service_pb2.ExportTraceServiceResponse()
        if self.reject_every:
            response.partial_success.rejected_spans = self.reject_every
            response.partial_success.error_message = "test receiver rejects spans"
        elif self.warning:
            response.partial_success.error_message = self.warning
        return response

    def start(self) -> None:
        options = [] if self.max_receive_bytes is None else [("grpc.max_receive_message_length", self.max_receive_bytes)]
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=options)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), self._server)
        if self.logs:
            from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc

            logs_service_pb2_grpc.add_LogsServiceServicer_to_server(_LogsService(self), self._server)  # type: ignore[arg-type]
        if self.metrics:
            from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc

            metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_MetricsService(self), self._server)  # type: ignore[arg-type]
        if self.tls:
            credentials = grpc.ssl_server_credentials(
                [self.tls], root_certificates=self.client_ca, require_client_auth=self.client_ca is not None
            )
            self._server.add_secure_port(f"127.0.0.1:{self.port}", credentials)
        else:
            self._server.add_insecure_port(f"127.0.0.1:{self.port}")
        self._server.start()

    def stop(self) -> None:
        if self._server:
            self._server.stop(0).wait()
            self._server = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def spans(self) -> list:
        """Every span received so far, as (resource, span) protobuf pairs."""
        out = []
        with self._lock:
            raw = list(self.requests)
        for blob in raw:
            request = trace_service_pb2.ExportTraceServiceRequest.FromString(blob)
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    out.extend((rs.resource, ss.scope, span) for span in ss.spans)
        return out

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()


class RefusingHttpReceiver:
    """An OTLP/HTTP endpoint that answers 401 with the authorization header it refused in its body."""

    def __init__(self):
        self.port = free_port()
        self.quoted: list[str] = []
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        quoted = self.quoted

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = f"401 Unauthorized: bad credentials {self.headers.get('Authorization')!r}"
                quoted.append(body)
                answer(self, 401, "text/plain", body.encode())

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def answer(handler: BaseHTTPRequestHandler, status: int, content_type: str, data: bytes) -> None:
    """One whole HTTP/1.1 reply, its length given, so the connection can be kept."""
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class HttpReceiver:
    """An OTLP/HTTP trace receiver (HTTP/1.1, as Python's server speaks it), with TLS and mTLS when
    given a certificate: keeps each request's body and answers an empty ExportTraceServiceResponse.
    With ``delay``, a slow one: each body is kept at once and answered this many seconds later
    (drawn from the range), whether or not its sender still waits. With ``throttle``, one that
    answers ``throttle_status`` (429 or 503) and a Retry-After, in seconds or, with
    ``retry_after_date``, as an HTTP date; a throttled body is not kept."""

    def __init__(
        self,
        cert: Path | None = None,
        key: Path | None = None,
        client_ca: Path | None = None,
        delay: tuple[float, float] = (0.0, 0.0),
        throttle: Throttle | None = None,
        throttle_status: int = 429,
        retry_after_date: bool = False,
    ):
        self.port = free_port()
        self.bodies: list[bytes] = []
        # Requests to another path than /v1/traces (the metrics, the logs): (path, headers, body).
        self.others: list[tuple[str, dict[str, str], bytes]] = []
        self._tls = (cert, key, client_ca)
        self._delay = delay
        self.throttle = throttle
        self._throttling = (throttle_status, retry_after_date)
        self._server: ThreadingHTTPServer | None = None

    def _retry_after(self) -> str:
        """The Retry-After of a throttling answer: whole seconds, or the HTTP date that many seconds on."""
        from email.utils import formatdate

        assert self.throttle is not None
        if self._throttling[1]:
            # A date has whole seconds: one second more, so the sender never waits less than asked.
            return formatdate(time.time() + self.throttle.seconds + 1, usegmt=True)
        return str(int(self.throttle.seconds))

    def start(self) -> None:
        bodies, delay, receiver = self.bodies, self._delay, self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path != "/v1/traces":
                    receiver.others.append((self.path, dict(self.headers), body))
                    answer(self, 200, "application/x-protobuf", b"")
                    return
                if receiver.throttle is not None and receiver.throttle.arrive():
                    self.send_response(receiver._throttling[0])
                    self.send_header("Retry-After", receiver._retry_after())
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                bodies.append(body)
                if delay[1]:
                    time.sleep(random.uniform(*delay))
                try:
                    answer(
                        self, 200, "application/x-protobuf", trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                    )
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the sender stopped waiting: its copy is kept all the same

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        cert, key, client_ca = self._tls
        if cert and key:
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            if client_ca:
                context.load_verify_locations(client_ca)
                context.verify_mode = ssl.CERT_REQUIRED
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    def endpoint(self, scheme: str = "https") -> str:
        return f"{scheme}://127.0.0.1:{self.port}"

    def spans(self) -> list:
        """Every span received so far, as (resource, scope, span) protobuf triples, as Receiver.spans."""
        out = []
        for body in list(self.bodies):
            if body[:2] == b"\x1f\x8b":  # export.compression = "gzip"
                import gzip

                body = gzip.decompress(body)
            request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    out.extend((rs.resource, ss.scope, span) for span in ss.spans)
        return out


class Rotel:
    """rotel from PyPI: the OTLP peer run-otel sends to; it forwards to a Receiver."""

    def __init__(self, base: Path, forward_to: str):
        self.base = base
        self.forward_to = forward_to
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.process: subprocess.Popen | None = None

    @staticmethod
    def binary() -> str:
        ServerGate.need("rotel")
        import rotel

        return str(Path(rotel.__file__).parent / "rotel-agent")

    def start(self) -> None:
        log = (self.base / "rotel.log").open("ab")
        self.process = subprocess.Popen(
            [
                self.binary(),
                "start",
                "--otlp-grpc-endpoint",
                f"127.0.0.1:{self.grpc_port}",
                "--otlp-http-endpoint",
                f"127.0.0.1:{self.http_port}",
                "--exporter",
                "otlp",
                "--otlp-exporter-endpoint",
                f"http://{self.forward_to}",
                "--otlp-exporter-protocol",
                "grpc",
                "--batch-timeout",
                "50ms",
                "--otlp-exporter-retry-max-elapsed-time",
                "120s",
                "--pid-file",
                str(self.base / "rotel.pid"),
            ],
            stdout=log,
            stderr=log,
            env={**os.environ, "ROTEL_LOG_FORMAT": "text"},
        )
        wait_for(lambda: _port_open(self.grpc_port) and _port_open(self.http_port), 30, "rotel to listen")

    def stop(self) -> None:
        stop_process(self.process, 20)
        self.process = None

    def endpoint(self, protocol: str) -> str:
        if protocol == "grpc":
            return f"http://127.0.0.1:{self.grpc_port}"
        return f"http://127.0.0.1:{self.http_port}"


class StallingProxy:
    """A TCP proxy in front of a server (MariaDB) with a stall switch: stalled, it keeps every
    connection open and accepts new ones, but forwards nothing either way, as a frozen server, a
    hung load balancer or a black-holed network looks to a client. Resumed, it forwards again."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.port = free_port()
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> StallingProxy:
        ServerGate.need("a TCP proxy")
        listener = self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def stall(self) -> None:
        self._forwarding.clear()

    def resume(self) -> None:
        self._forwarding.set()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed by stop()
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                self._forwarding.wait()  # stalled: the bytes are held, and nothing is closed
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def stop(self) -> None:
        self._forwarding.set()
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.close()
                except OSError:
                    pass


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class Prometheus:
    """Debian's prometheus (2.42), scraping run-otel on loopback every second."""

    def __init__(self, base: Path, target: str, rules: Path, shipped_config: Path, extra_args: tuple[str, ...] = ()):
        import yaml

        self.base = base
        self.extra_args = extra_args
        self.port = free_port()
        config = yaml.safe_load(shipped_config.read_text())
        # The shipped scrape config, pointed at the test's run-otel and scraped fast.
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config["rule_files"] = [str(rules)]
        config["scrape_configs"][0]["static_configs"] = [{"targets": [target]}]
        self.config = base / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        log = (self.base / "prometheus.log").open("ab")
        self.process = subprocess.Popen(
            [
                _binary("prometheus"),
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.base / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                *self.extra_args,
            ],
            stdout=log,
            stderr=log,
        )
        wait_for(self._ready, 60, "prometheus to be ready", 0.2)

    def _ready(self) -> bool:
        import requests

        try:
            return requests.get(f"http://127.0.0.1:{self.port}/-/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> None:
        stop_process(self.process, 30)

    def exemplars(self, expr: str, since: float) -> list:
        """/api/v1/query_exemplars over [since, now]: one entry per series, with its exemplars."""
        import requests

        reply = requests.get(
            f"http://127.0.0.1:{self.port}/api/v1/query_exemplars",
            params={"query": expr, "start": since, "end": time.time() + 1},
            timeout=10,
        ).json()
        if reply["status"] != "success":
            raise AssertionError(f"{expr}: {reply}")
        return reply["data"]

    def query(self, expr: str) -> list:
        import requests

        reply = requests.get(f"http://127.0.0.1:{self.port}/api/v1/query", params={"query": expr}, timeout=10).json()
        if reply["status"] != "success":
            raise AssertionError(f"{expr}: {reply}")
        return reply["data"]["result"]


ROOT = Path(__file__).resolve().parent.parent


def promtool() -> str:
    return _binary("promtool")


def systemd_analyze() -> str:
    return _binary("systemd-analyze")


def peer_binary(name: str) -> str:
    """A Go test peer built by scripts/peers.sh (the README's test command runs it)."""
    ServerGate.need(name)
    path = ROOT / ".peers" / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run scripts/peers.sh, which the README's test command runs")
    return str(path)


class CollectorProgram:
    """A program built on the OpenTelemetry Collector framework (the collector, Jaeger v2), run
    with a shipped config file and only its listen and send endpoints changed, by --set."""

    def __init__(self, base: Path, name: str, config: Path, endpoints: dict[str, str], health: str):
        self.base = base
        self.name = name
        self.config = config
        self.endpoints = endpoints
        self.health = health
        self.telemetry_port = free_port()
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        # The framework's own metrics listen on :8888 by default; each program gets a port of its own.
        telemetry = (
            "yaml:service::telemetry::metrics::readers: "
            f"[{{pull: {{exporter: {{prometheus: {{host: 127.0.0.1, port: {self.telemetry_port}}}}}}}}}]"
        )
        sets = [f"--set={key}={value}" for key, value in self.endpoints.items()]
        return [peer_binary(self.name), f"--config={self.config}", f"--config={telemetry}", *sets]

    def start(self) -> None:
        log = (self.base / f"{self.name}.log").open("ab")
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=log)
        wait_for(self._healthy, 60, f"{self.name} to report healthy", 0.1)

    def _healthy(self) -> bool:
        import requests

        if self.process and self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited: {(self.base / f'{self.name}.log').read_text()[-2000:]}")
        try:
            return requests.get(self.health, timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> None:
        stop_process(self.process, 20)
        self.process = None

    def metric(self, name: str, **labels: str) -> float:
        """The sum of one of the collector's own metrics over the series with these labels."""
        import requests

        text = requests.get(f"http://127.0.0.1:{self.telemetry_port}/metrics", timeout=5).text
        total = 0.0
        for line in text.splitlines():
            series, _, value = line.rpartition(" ")
            if series.split("{")[0] == name and all(f'{k}="{v}"' in series for k, v in labels.items()):
                total += float(value)
        return total

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush, as a crash or the OOM killer ends it."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()
        self.process = None


def validate_config(program: str, config: Path) -> subprocess.CompletedProcess:
    """`<program> validate`: loads the config the way the program would, without starting it."""
    return subprocess.run([peer_binary(program), "validate", f"--config={config}"], capture_output=True, text=True, timeout=60)


class Jaeger(CollectorProgram):
    """Jaeger v2 with the repository's config/jaeger.yaml: memory storage, all on loopback."""

    def __init__(self, base: Path):
        self.otlp_port, self.query_port = free_port(), free_port()
        health_port = free_port()
        super().__init__(
            base,
            "jaeger",
            ROOT / "config" / "jaeger.yaml",
            {
                "receivers.otlp.protocols.grpc.endpoint": f"127.0.0.1:{self.otlp_port}",
                "receivers.otlp.protocols.http.endpoint": f"127.0.0.1:{free_port()}",
                "extensions.jaeger_query.http.endpoint": f"127.0.0.1:{self.query_port}",
                "extensions.jaeger_query.grpc.endpoint": f"127.0.0.1:{free_port()}",
                "extensions.healthcheckv2.http.endpoint": f"127.0.0.1:{health_port}",
            },
            f"http://127.0.0.1:{health_port}/status",
        )

    def api(self, path: str, **params) -> dict:
        import requests

        reply = requests.get(f"http://127.0.0.1:{self.query_port}/api/{path}", params=params, timeout=10)
        reply.raise_for_status()
        return reply.json()

    def trace(self, trace_id: str) -> dict | None:
        """The trace as the Jaeger UI gets it (after its adjusters), or None when unknown."""
        import requests

        try:
            data = self.api(f"traces/{trace_id}")["data"]
        except requests.HTTPError as error:
            if error.response is not None and error.response.status_code == 404:
                return None
            raise
        return data[0] if data else None


class Collector(CollectorProgram):
    """The OpenTelemetry Collector with the repository's config/otel-collector.yaml, sending to
    the test's Jaeger and, in place of Tempo, to a Receiver. Its queue directory is in ``base``,
    and outlives a restart of the same Collector."""

    def __init__(self, base: Path, jaeger: str, tempo: str, config: Path = ROOT / "config" / "otel-collector.yaml"):
        self.grpc_port, self.http_port = free_port(), free_port()
        health_port = free_port()
        self.queue_dir = base / "otelcol-queue"
        super().__init__(
            base,
            "otelcol",
            config,
            {
                "receivers.otlp.protocols.grpc.endpoint": f"127.0.0.1:{self.grpc_port}",
                "receivers.otlp.protocols.http.endpoint": f"127.0.0.1:{self.http_port}",
                "exporters.otlp_grpc/jaeger.endpoint": jaeger,
                "exporters.otlp_grpc/tempo.endpoint": tempo,
                "extensions.health_check.endpoint": f"127.0.0.1:{health_port}",
                "extensions.file_storage.directory": str(self.queue_dir),
                "extensions.file_storage.compaction.directory": str(self.queue_dir),
            },
            f"http://127.0.0.1:{health_port}/",
        )


class Gateway(CollectorProgram):
    """The collector gateway with the repository's config/otel-gateway.yaml: its DNS resolver finds one
    backend, 127.0.0.1, on ``backend_port``. Its build has no health extension: it is up once its
    OTLP port listens. Its queue directory is in ``base``, and outlives a restart."""

    def __init__(self, base: Path, backend_port: int, config: Path = ROOT / "config" / "otel-gateway.yaml"):
        self.grpc_port = free_port()
        self.queue_dir = base / "otelcol-gateway-queue"
        super().__init__(
            base,
            "otelcol-gateway",
            config,
            {
                "receivers.otlp.protocols.grpc.endpoint": f"127.0.0.1:{self.grpc_port}",
                "exporters.loadbalancing.resolver.dns.hostname": "127.0.0.1",
                "exporters.loadbalancing.resolver.dns.port": f'"{backend_port}"',  # a string, as in the file
                "extensions.file_storage.directory": str(self.queue_dir),
                "extensions.file_storage.compaction.directory": str(self.queue_dir),
            },
            "",
        )

    def _healthy(self) -> bool:
        if self.process and self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited: {(self.base / f'{self.name}.log').read_text()[-2000:]}")
        return _port_open(self.grpc_port)


class Phoenix:
    """Arize Phoenix from PyPI, on loopback, with its SQLite database in a temp dir."""

    def __init__(self, base: Path):
        self.base = base
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        import sys

        ServerGate.need("Phoenix")
        log = (self.base / "phoenix.log").open("ab")
        env = {
            **os.environ,
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(self.port),
            "PHOENIX_GRPC_PORT": str(free_port()),
            "PHOENIX_WORKING_DIR": str(self.base),
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
        self.process = subprocess.Popen([sys.executable, "-m", "phoenix.server.main", "serve"], stdout=log, stderr=log, env=env)
        wait_for(self._healthy, 120, "phoenix to serve", 0.5)

    def _healthy(self) -> bool:
        import requests

        if self.process and self.process.poll() is not None:
            raise RuntimeError(f"phoenix exited: {(self.base / 'phoenix.log').read_text()[-2000:]}")
        try:
            return requests.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rest(self, path: str, **params) -> list:
        """Every page of a list endpoint of Phoenix's REST API."""
        import requests

        items, cursor = [], None
        while True:
            reply = requests.get(f"{self.url}/v1/{path}", params={**params, **({"cursor": cursor} if cursor else {})}, timeout=30)
            if reply.status_code == 404:
                return []
            reply.raise_for_status()
            body = reply.json()
            items += body["data"]
            cursor = body.get("next_cursor")
            if not cursor:
                return items

    def graphql(self, query: str) -> dict:
        import requests

        reply = requests.post(f"{self.url}/graphql", json={"query": query}, timeout=30).json()
        if reply.get("errors"):
            raise AssertionError(reply["errors"])
        return reply["data"]

    def stop(self) -> None:
        stop_process(self.process, 30)
