"""`run-otel health`: the running daemon's /readyz or /healthz, asked from the same host."""

from __future__ import annotations

from ..config import Config


def health(config: Config, live: bool) -> tuple[str, bool, str]:
    """(the URL asked, answered 200, what it answered): /healthz when ``live``, else /readyz."""
    url = probe_url(config.metrics.host, config.metrics.port, "/healthz" if live else "/readyz")
    healthy, why = probe(url)
    return url, healthy, why


def probe_url(host: str, port: int, path: str) -> str:
    """The URL that reaches the metrics server from the same host: a wildcard bind is
    reached on loopback."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"


def probe(url: str, timeout: float = 3.0) -> tuple[bool, str]:
    """(answered 200, what it answered): never raises, never waits past the timeout."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status == 200, f"{reply.status} {reply.read(200).decode(errors='replace').strip()}"
    except urllib.error.HTTPError as error:
        return False, f"{error.code} {error.read(200).decode(errors='replace').strip()}"
    except (OSError, ValueError) as error:
        return False, f"no answer: {getattr(error, 'reason', error)}"
