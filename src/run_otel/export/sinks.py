"""OTLP sinks: gRPC, HTTP/protobuf, and an OTLP-JSON file for the demo.

Each ``send`` takes a serialized ExportTraceServiceRequest and returns an
:class:`Ack` only when the receiver accepted it; anything else raises
:class:`ExportError`. The checkpoint advances on
that answer alone, so unlike a BatchSpanProcessor a failure is never silent.

The SDK's span exporters take ``ReadableSpan`` objects and drop the receiver's
``partial_success``; run-otel already holds encoded requests and must count
rejected spans, so it sends with the generated gRPC stub and ``requests``
directly, and honours the same ``OTEL_EXPORTER_OTLP_*`` settings through config.
"""

from __future__ import annotations

import base64
import gzip
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from ..backoff import Backoff
from ..config import ExportConfig
from .deadline import Deadline
from .throttle import Throttle, grpc_retry_delay, http_retry_delay
from .transport import GrpcChannel, Tls, explain, grpc_target, innermost, request_failure, traces_tls

log = logging.getLogger(__name__)

_RETRYABLE_GRPC = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.CANCELLED,
}
_RETRYABLE_HTTP = {429, 502, 503, 504}


class ExportError(RuntimeError):
    """The receiver did not acknowledge the request; the checkpoint must not move."""


class TooLarge(ExportError):
    """The receiver refused the request for its size (gRPC "larger than max", HTTP 413):
    sent again as it is, it would be refused forever, so it is never retried unchanged."""


def _too_large(code: grpc.StatusCode, details: str | None) -> bool:
    # RESOURCE_EXHAUSTED is also a receiver's back-pressure (a memory limiter), which is retried.
    return code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in (details or "").lower()


@dataclass(frozen=True)
class Ack:
    rejected_spans: int = 0
    message: str = ""


class Sink(Protocol):
    def send(self, request: bytes) -> Ack: ...

    def probe(self) -> None: ...

    def close(self) -> None: ...

    def describe(self) -> str: ...


def _with_retries(
    attempt: Callable[[], Ack], attempts: int, describe: str, throttle: Throttle, rng: random.Random | None = None
) -> Ack:
    """Runs ``attempt`` until it acks, a non-retryable error, or ``attempts`` run out.

    Every attempt first waits out the receiver's not-before (``throttle``), whoever was told it;
    after a failure without a requested delay, the backoff from 0.5 s up to 8 s, with jitter so
    many senders do not retry in step.
    """
    with throttle.sending():
        return _attempts(attempt, attempts, describe, throttle, Backoff(0.5, 8.0, rng=rng or random.Random()))


def _attempts(attempt: Callable[[], Ack], attempts: int, describe: str, throttle: Throttle, backoff: Backoff) -> Ack:
    for number in range(1, attempts + 1):
        throttle.wait()
        try:
            return attempt()
        except _Retryable as exc:
            held = throttle.answered(exc.after) if exc.throttled else None
            asked = _asked(exc.after, held)
            if number == attempts:
                later = f"; nothing is sent to it for {held:g}s{asked}" if held else ""
                raise ExportError(f"{describe}: {exc} (after {attempts} attempts{later})") from None
            if held is not None:
                log.warning("export to %s failed (%s); retrying in %.1fs (as the receiver asked%s)", describe, exc, held, asked)
                continue
            delay = backoff.delay(number)
            log.warning("export to %s failed (%s); retrying in %.1fs (backoff)", describe, exc, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


def _asked(after: float | None, held: float | None) -> str:
    """Words for a requested delay longer than the cap (MAX_THROTTLE_SECONDS): said, since it is not what was asked."""
    if after is None or held is None or after <= held:
        return ""
    return f": it asked for {after:g}s, cut to {held:g}s"


class _Retryable(Exception):
    def __init__(self, reason: str, after: float | None = None, throttled: bool = False):
        super().__init__(reason)
        self.after = after  # the delay the receiver asked for, if any
        # The receiver asked to slow down: it named a delay, or said it is over its limit (429, RESOURCE_EXHAUSTED).
        self.throttled = throttled or after is not None


# An empty request is valid OTLP: it proves the endpoint speaks it, and exports nothing.
EMPTY_REQUEST = b""


def _ack_from(response: ExportTraceServiceResponse) -> Ack:
    partial = response.partial_success
    return Ack(rejected_spans=partial.rejected_spans, message=partial.error_message)


class GrpcSink:
    # A subclass sends another signal's requests (logrecords.py).
    METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

    def __init__(self, config: ExportConfig, tls: Tls | None = None, throttle: Throttle | None = None):
        self._endpoint = config.resolved_endpoint()
        tls = tls or traces_tls(config)
        where = grpc_target(self._endpoint, config, tls)
        self._target = where.target
        self._tls_without_client = where.secure and not tls.cert
        self.throttle = throttle or Throttle()
        credentials = grpc.ssl_channel_credentials(*tls.read()) if where.secure else None
        # The request is already serialized: send its bytes as they are.
        self._channel = GrpcChannel(self._target, credentials, self.METHOD, ExportTraceServiceResponse.FromString)
        self._metadata = tuple((k.lower(), v) for k, v in config.headers.items())
        self._deadline = Deadline(config.timeout_seconds, config.max_timeout_seconds)
        self._attempts = config.max_attempts
        self._compression = grpc.Compression.Gzip if config.compression == "gzip" else grpc.Compression.NoCompression

    def describe(self) -> str:
        return f"OTLP/gRPC {self._target}"

    def send(self, request: bytes) -> Ack:
        return _with_retries(lambda: self._send_once(request), self._attempts, self.describe(), self.throttle)

    def probe(self) -> None:
        _probe(self._send_once, self.describe(), self.throttle)

    def _send_once(self, request: bytes) -> Ack:
        deadline, started = self._deadline.seconds, time.monotonic()
        try:
            response = self._channel.call(request, timeout=deadline, metadata=self._metadata, compression=self._compression)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise _Retryable(f"DEADLINE_EXCEEDED: {self._deadline.exceeded(deadline)}") from None
            reason = explain(f"{exc.code().name}: {exc.details()}", "grpc", self._endpoint, self._tls_without_client)
            if _too_large(exc.code(), exc.details()):
                raise TooLarge(f"{self.describe()}: {reason.text}") from None
            if exc.code() in _RETRYABLE_GRPC and not reason.permanent:
                busy = exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                raise _Retryable(reason.text, grpc_retry_delay(exc), throttled=busy) from None
            raise ExportError(f"{self.describe()}: {reason.text}") from None
        self._deadline.answered(time.monotonic() - started)
        return _ack_from(response)

    def close(self) -> None:
        self._channel.close()


class HttpSink:
    PATH = "/v1/traces"

    def __init__(self, config: ExportConfig, tls: Tls | None = None, throttle: Throttle | None = None):
        endpoint = config.resolved_endpoint().rstrip("/").removesuffix("/v1/traces")
        self.throttle = throttle or Throttle()
        self._url = f"{endpoint}{self.PATH}"
        import requests  # here: a gRPC export never loads it

        self._requests = requests
        self._session = requests.Session()
        tls = tls or traces_tls(config)
        # Per request, not on the session: requests lets REQUESTS_CA_BUNDLE beat a session's CA.
        self._verify, self._cert = tls.requests_verify(), tls.requests_cert()
        self._headers = {"Content-Type": "application/x-protobuf", **config.headers}
        self._gzip = config.compression == "gzip"
        if self._gzip:
            self._headers["Content-Encoding"] = "gzip"
        self._deadline = Deadline(config.timeout_seconds, config.max_timeout_seconds)
        self._attempts = config.max_attempts

    def describe(self) -> str:
        return f"OTLP/HTTP {self._url}"

    def probe(self) -> None:
        _probe(self._send_once, self.describe(), self.throttle)

    def send(self, request: bytes) -> Ack:
        body = request
        if self._gzip:
            body = gzip.compress(body, mtime=0)
        return _with_retries(lambda: self._send_once(body), self._attempts, self.describe(), self.throttle)

    def _send_once(self, body: bytes) -> Ack:
        deadline, started = self._deadline.seconds, time.monotonic()
        try:
            response = self._session.post(
                self._url, data=body, headers=self._headers, timeout=deadline, verify=self._verify, cert=self._cert
            )
        except self._requests.exceptions.SSLError as exc:
            # A TLS failure is the same at every attempt: said with what to set, not retried here.
            reason = explain(f"SSLError: {innermost(exc)}", "http/protobuf", self._url)
            raise ExportError(f"{self.describe()}: {reason.text}") from None
        except self._requests.Timeout as exc:
            if isinstance(exc, self._requests.ConnectTimeout):
                raise _Retryable("ConnectTimeout") from None
            raise _Retryable(f"{type(exc).__name__}: {self._deadline.exceeded(deadline)}") from None
        except self._requests.RequestException as exc:
            reason = explain(request_failure(exc), "http/protobuf", self._url)
            if reason.permanent:
                raise ExportError(f"{self.describe()}: {reason.text}") from None
            raise _Retryable(reason.text) from None
        self._deadline.answered(time.monotonic() - started)
        if response.status_code == 413:
            raise TooLarge(f"{self.describe()}: HTTP 413 {response.text[:200]}")
        if response.status_code in _RETRYABLE_HTTP:
            after = http_retry_delay(response.headers.get("Retry-After"))
            raise _Retryable(f"HTTP {response.status_code}", after, throttled=response.status_code == 429)
        if response.status_code != 200:
            raise ExportError(f"{self.describe()}: HTTP {response.status_code} {response.text[:200]}")
        parsed = ExportTraceServiceResponse()
        if response.content and response.headers.get("Content-Type", "").startswith("application/x-protobuf"):
            parsed.ParseFromString(response.content)
        return _ack_from(parsed)

    def close(self) -> None:
        self._session.close()


def _probe(send_once: Callable[[bytes], Ack], describe: str, throttle: Throttle) -> None:
    """One empty export, no retry and no log line: is the receiver there and speaking OTLP?
    Not while it asked for no request: a probe is a request too."""
    if why := throttle.may_probe():
        raise ExportError(f"{describe}: not probed: {why}")
    try:
        send_once(EMPTY_REQUEST)
    except _Retryable as exc:
        if exc.throttled:
            throttle.answered(exc.after)
        raise ExportError(f"{describe}: {exc}") from None


class JsonFileSink:
    """Appends each request as one line of OTLP JSON (hex ids, integer enums).

    This is the OTLP/HTTP JSON encoding: the protobuf JSON mapping, except that
    trace and span ids are hex strings, as the OTLP specification requires.
    The collector's ``otlpjsonfile`` receiver reads it back.
    """

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = path.open("ab")

    def describe(self) -> str:
        return f"OTLP-JSON file {self.path}"

    def probe(self) -> None:
        pass

    def send(self, request: bytes) -> Ack:
        self._fh.write(otlp_json(ExportTraceServiceRequest.FromString(request)).encode("utf-8") + b"\n")
        self._fh.flush()
        return Ack()

    def close(self) -> None:
        self._fh.close()


_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def otlp_json(request: ExportTraceServiceRequest) -> str:
    """The request in OTLP JSON: proto3 JSON with hex-encoded ids."""
    doc = json_format.MessageToDict(request, use_integers_for_enums=True)
    for resource_spans in doc.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in _ID_FIELDS:
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def build_sink(config: ExportConfig, throttle: Throttle | None = None) -> GrpcSink | HttpSink:
    if config.protocol == "http/protobuf":
        return HttpSink(config, throttle=throttle)
    return GrpcSink(config, throttle=throttle)
