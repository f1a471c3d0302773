"""How a sink reaches its receiver: plaintext or TLS, which CA and client pair, and what a
transport failure means in words an operator can act on.

The CA and the client pair come from ``export.certificate``, ``export.client_certificate`` and
``export.client_key`` (``OTEL_EXPORTER_OTLP_{,TRACES_}CERTIFICATE``, ``…CLIENT_CERTIFICATE``,
``…CLIENT_KEY``), and for the log records from their ``logs_`` twins, which fall back to them.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import grpc

from ..config import ExportConfig

# Header names whose value is a credential, as gateways and vendors spell them.
_CREDENTIAL_WORDS = ("authorization", "auth", "token", "key", "secret", "password", "cookie", "signature")


@dataclass(frozen=True)
class Tls:
    """PEM file paths; empty: the system's roots, no client certificate."""

    ca: str = ""
    cert: str = ""
    key: str = ""

    def read(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """The files' bytes for grpc.ssl_channel_credentials (root, private key, chain)."""
        return _read(self.ca), _read(self.key), _read(self.cert)

    def requests_verify(self) -> str | bool:
        return self.ca or True

    def requests_cert(self) -> tuple[str, str] | None:
        return (self.cert, self.key) if self.cert else None

    def requests_session(self) -> Any:
        """A requests Session for a client that sets the CA on its session (the SDK's OTLP/HTTP metric
        exporter). requests lets REQUESTS_CA_BUNDLE beat a session's CA: the configured one is kept."""
        import requests

        ca = self.ca

        class PinnedCa(requests.Session):
            def merge_environment_settings(self, *args: Any, **kwargs: Any) -> dict:
                settings = super().merge_environment_settings(*args, **kwargs)
                if ca:
                    settings["verify"] = ca
                return settings

        return PinnedCa()


def _read(path: str) -> bytes | None:
    return Path(path).read_bytes() if path else None


def traces_tls(export: ExportConfig) -> Tls:
    return Tls(export.certificate, export.client_certificate, export.client_key)


def logs_tls(export: ExportConfig) -> Tls:
    """The log records' own CA and client pair where set, else the traces'."""
    pair = (
        (export.logs_client_certificate, export.logs_client_key)
        if export.logs_client_certificate
        else (export.client_certificate, export.client_key)
    )
    return Tls(export.logs_certificate or export.certificate, *pair)


@dataclass(frozen=True)
class GrpcTarget:
    target: str  # host:port, as grpc takes it
    secure: bool


def grpc_target(endpoint: str, export: ExportConfig, tls: Tls) -> GrpcTarget:
    """``https://`` is TLS and ``http://`` plaintext; without a scheme, TLS unless
    ``export.insecure``, and always when a CA or client certificate is configured."""
    parsed = urlparse(endpoint if "://" in endpoint else f"//{endpoint}")
    target = parsed.netloc or endpoint
    if parsed.scheme:
        return GrpcTarget(target, parsed.scheme == "https")
    return GrpcTarget(target, not export.insecure or bool(tls.ca or tls.cert))


class GrpcChannel:
    """The gRPC channel to the receiver, opened afresh once it failed to connect.

    A channel keeps a connection failure for its reconnect backoff, which grows to two minutes:
    every call meanwhile fails at once with the last error ("Connection refused"), though the
    receiver may have been listening again for a minute. So a channel that failed to connect is
    closed, which ends its backoff with it, and replaced: the next request connects at once, and a
    failure it reports is its own.
    """

    # gRPC's words for a connection that was not made (refused, unreachable, unresolved).
    _NOT_CONNECTED = ("failed to connect", "dns resolution failed")

    def __init__(self, target: str, credentials: grpc.ChannelCredentials | None, method: str, parse: Callable[[bytes], Any]):
        self._target, self._credentials, self._method, self._parse = target, credentials, method, parse
        self._lock = threading.Lock()  # the poll and the daemon's probe share the channel
        self._current = self._open()

    def _open(self) -> tuple[grpc.Channel, grpc.UnaryUnaryMultiCallable]:
        options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
        channel = (
            grpc.secure_channel(self._target, self._credentials, options=options)
            if self._credentials is not None
            else grpc.insecure_channel(self._target, options=options)
        )
        return channel, channel.unary_unary(self._method, request_serializer=None, response_deserializer=self._parse)

    def call(self, request: bytes, **kwargs: Any) -> Any:
        channel, method = self._current
        try:
            return method(request, **kwargs)
        except grpc.RpcError as exc:
            words = (exc.details() or "").lower()
            if exc.code() == grpc.StatusCode.UNAVAILABLE and any(w in words for w in self._NOT_CONNECTED):
                self._replace(channel)
            raise

    def _replace(self, failed: grpc.Channel) -> None:
        with self._lock:
            if self._current[0] is not failed:  # another thread replaced it already
                return
            self._current = self._open()
        failed.close()

    def close(self) -> None:
        self._current[0].close()


def plaintext(endpoint: str, protocol: str, export: ExportConfig, tls: Tls) -> bool:
    if protocol == "http/protobuf":
        return urlparse(endpoint).scheme != "https"
    return not grpc_target(endpoint, export, tls).secure


def _host(endpoint: str) -> str:
    parsed = urlparse(endpoint if "://" in endpoint else f"//{endpoint}")
    return parsed.hostname or ""


def is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def credential_headers(headers: dict[str, str]) -> list[str]:
    return sorted(name for name in headers if any(word in name.lower() for word in _CREDENTIAL_WORDS))


def transport_warnings(export: ExportConfig, endpoint: str) -> list[str]:
    """What ``check`` and the daemon's start warn about: credentials in plaintext beyond this
    host, and TLS files that the endpoint's scheme leaves unused."""
    tls = traces_tls(export)
    found = []
    clear = plaintext(endpoint, export.protocol, export, tls)
    host = _host(endpoint)
    named = credential_headers(export.headers)
    if clear and named and not is_loopback(host):
        how = "plain http://" if export.protocol == "http/protobuf" else "gRPC without TLS"
        found.append(
            f"export.headers {', '.join(named)} travel over {how} to {host}: anyone on the path can read them; "
            f"use an https:// endpoint{'' if export.protocol == 'http/protobuf' else ' (or export.insecure = false)'}"
        )
    if clear and (tls.ca or tls.cert):
        found.append(
            f"export.certificate / export.client_certificate are set, but {endpoint} is plaintext: they are not used; "
            "use an https:// endpoint"
        )
    return found


# What a receiver's or the TLS library's words mean, and what to change.
_TLS_VERIFY = ("certificate_verify_failed", "certificate verify failed")
_TLS_HANDSHAKE = ("ssl handshake failed", "sslv3_alert", "tlsv1_alert", "tlsv13_alert", "ssl routines", "sslerror")
_HTTP1 = ("failed parsing http/2", "trying to connect an http1.x server", "http status 400", "http/1.")
# An OTLP/HTTP request to a gRPC port: answered with HTTP/2 frames, or the connection dropped.
_H2_ANSWER = "but http/2 frames"
_DROPPED = ("connection reset", "connection aborted")
_GRPC_PORT = (
    'set export.protocol = "grpc" for an OTLP/gRPC port (4317), or point export.endpoint at the receiver\'s OTLP/HTTP port (4318)'
)
# gRPC's words when a receiver that wants a client certificate hangs up in the handshake.
_CLOSED = ("socket closed", "connection reset")
_MTLS = (
    "if the receiver requires a client certificate (mTLS), set export.client_certificate and export.client_key "
    "(OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE, …_CLIENT_KEY)"
)


@dataclass(frozen=True)
class Explained:
    text: str
    # The same request meets it again at once: a TLS or protocol mismatch, not a passing outage.
    permanent: bool = False


def explain(reason: str, protocol: str, endpoint: str, tls_without_client: bool = False) -> Explained:
    """``reason`` with the hint that names the setting to change, when the words say which."""
    text = reason.lower()
    if any(word in text for word in _TLS_VERIFY):
        return Explained(
            f"TLS verification failed: the receiver's certificate is not signed by a CA this host trusts ({reason}); "
            "set export.certificate (OTEL_EXPORTER_OTLP_CERTIFICATE) to the PEM of the CA that signed it",
            permanent=True,
        )
    if any(word in text for word in _TLS_HANDSHAKE):
        return Explained(f"TLS handshake refused ({reason}); {_MTLS}", permanent=True)
    if protocol == "grpc" and any(word in text for word in _HTTP1):
        return Explained(
            f'{endpoint} answers HTTP/1.1, not gRPC ({reason}): set export.protocol = "http/protobuf" for an OTLP/HTTP '
            "port (4318), or point export.endpoint at the receiver's gRPC port (4317)",
            permanent=True,
        )
    if protocol == "http/protobuf" and _H2_ANSWER in text:
        return Explained(f"{endpoint} answers gRPC, not OTLP/HTTP ({reason}): {_GRPC_PORT}", permanent=True)
    if protocol == "http/protobuf" and any(word in text for word in _DROPPED):
        # Also what a receiver restarting looks like: said, and retried.
        return Explained(f"{reason}; if {endpoint} is a gRPC port: {_GRPC_PORT}")
    if tls_without_client and any(word in text for word in _CLOSED):
        # Also what a receiver restarting looks like: said, and retried.
        return Explained(f"{reason}; the receiver closed the TLS connection: {_MTLS}")
    return Explained(reason)


def innermost(exc: BaseException) -> str:
    """The TLS library's own words, from under the layers requests and urllib3 wrap them in."""
    while exc.args and isinstance(exc.args[0], BaseException):
        exc = exc.args[0]
    inner = getattr(exc, "reason", None)
    return str(inner if isinstance(inner, BaseException) else exc)


def request_failure(exc: BaseException) -> str:
    inner = innermost(exc)
    if "BadStatusLine" in inner:
        # The answer's first bytes, binary when they are an HTTP/2 frame: named, never written out.
        inner = "BadStatusLine: the answer is not HTTP/1.1" + (" but HTTP/2 frames" if "\\x00" in inner else "")
    return f"{type(exc).__name__}: {inner}"
