"""The effective settings, as one log line with every secret masked."""

from __future__ import annotations

from ..config import Config
from ..sharding import shard_name
from ..source.engine import safe_url


def effective_settings(config: Config) -> str:
    """Where it reads, where it writes and how: the line an SRE checks first."""
    try:
        source = safe_url(config.source.connect_url())
    except OSError:
        source = "(source.password_file unreadable)"
    parts = [
        f"source={source}",
        f"timezone={config.source.timezone}",
        f"tls={config.source.tls_mode}",
        f"endpoint={config.export.protocol} {config.export.resolved_endpoint()}",
        f"state={_masked(config.state.url)}",
        f"shard={shard_name(config.shard)}",
        f"start_from={config.poll.start_from}",
        f"interval={config.poll.interval_seconds:g}s",
        f"capture={'on' if config.content.capture else 'off'}",
        f"conventions={'+'.join(config.trace.conventions)}",
        f"ha={'on' if config.ha.enabled else 'off'}",
    ]
    if config.metrics.enabled:
        parts.append(f"metrics={config.metrics.host}:{config.metrics.port}")
    return " ".join(parts)


def _masked(url: str) -> str:
    from sqlalchemy.engine import make_url

    return safe_url(make_url(url))
