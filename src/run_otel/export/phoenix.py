"""Ratings as Arize Phoenix annotations: a HUMAN annotation on the run's root span.

Phoenix's ``POST /v1/span_annotations`` upserts on (name, span, identifier),
so one fixed identifier leaves one current rating per run, in the traces list,
the annotation columns and the session's feedback. ``sync=true`` makes Phoenix
check the spans exist: a root it never received (exported elsewhere, or before
Phoenix was set up) is skipped with a warning instead of failing every pass.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import requests

log = logging.getLogger(__name__)

# Phoenix answers 404 for the whole batch when any span is missing; then each goes alone.
_MISSING = 404


class PhoenixError(RuntimeError):
    """Phoenix did not store the annotations; the pass is retried."""


class PhoenixAnnotations:
    def __init__(self, base_url: str, timeout: float = 10.0, session: requests.Session | None = None):
        self._url = f"{base_url.rstrip('/')}/v1/span_annotations"
        self._timeout = timeout
        self._session = session or requests.Session()

    def upsert(self, annotations: Sequence[dict[str, Any]]) -> int:
        """Stores the annotations; returns how many landed (roots Phoenix lacks are skipped)."""
        if not annotations:
            return 0
        if self._post(list(annotations)) != _MISSING:
            return len(annotations)
        stored = sum(self._post([item]) != _MISSING for item in annotations)
        log.warning(
            "Phoenix has no root span for %d of %d rated runs; their ratings are not annotated there",
            len(annotations) - stored,
            len(annotations),
        )
        return stored

    def _post(self, data: list[dict[str, Any]]) -> int:
        try:
            reply = self._session.post(self._url, params={"sync": "true"}, json={"data": data}, timeout=self._timeout)
        except requests.RequestException as exc:
            raise PhoenixError(f"Phoenix {self._url}: {type(exc).__name__}") from None
        if reply.status_code not in (200, _MISSING):
            raise PhoenixError(f"Phoenix {self._url}: HTTP {reply.status_code} {reply.text[:200]}")
        return reply.status_code

    def close(self) -> None:
        self._session.close()
