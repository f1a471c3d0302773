"""Links into the configured UIs (Jaeger, Grafana/Tempo, Phoenix): plain text, so a command that
prints them without a terminal loads no rich."""

from __future__ import annotations

import json
from urllib.parse import quote

from ..config import Config


def trace_links(config: Config, trace_id_hex: str) -> list[str]:
    """Ready links for the trace in the configured UIs."""
    links = []
    if config.ui.jaeger_url:
        links.append(f"{config.ui.jaeger_url.rstrip('/')}/trace/{trace_id_hex}")
    if config.ui.tempo_url:
        pane = {"t": {"datasource": "tempo", "queries": [{"refId": "A", "queryType": "traceql", "query": trace_id_hex}]}}
        links.append(
            f"{config.ui.tempo_url.rstrip('/')}/explore?schemaVersion=1&panes={quote(json.dumps(pane, separators=(',', ':')))}"
        )
    if config.ui.phoenix_url:
        # Phoenix's own redirect finds the trace's project: its URLs otherwise need the project's id.
        links.append(f"{config.ui.phoenix_url.rstrip('/')}/redirects/traces/{trace_id_hex}")
    return links
