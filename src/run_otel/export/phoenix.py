"""Ratings as Arize Phoenix annotations: a HUMAN annotation on the run's root span.

Phoenix's ``POST /v1/span_annotations`` upserts on (name, span, identifier),
so one fixed identifier leaves one current rating per run, in the traces list,
the annotation columns and the session's feedback. ``sync=true`` stores them at
once where Phoenix has the spans. A rating the run had when it was exported is
sent seconds after its root, which Phoenix may not have stored yet (it writes
spans in batches): Phoenix answers 404 then, and the batch goes again without
``sync``, into Phoenix's own queue, which holds an annotation until its span
arrives (up to 60 retries 10 s apart in Phoenix 20) and then drops it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import requests

log = logging.getLogger(__name__)

# Phoenix answers 404 for the whole batch when any span is missing; then the batch is queued there.
_MISSING = 404


class PhoenixError(RuntimeError):
    """Phoenix did not store the annotations; the pass is retried."""


class PhoenixAnnotations:
    def __init__(self, base_url: str, timeout: float = 10.0, session: requests.Session | None = None):
        self._url = f"{base_url.rstrip('/')}/v1/span_annotations"
        self._timeout = timeout
        self._session = session or requests.Session()
        self._queued_before = False

    def upsert(self, annotations: Sequence[dict[str, Any]]) -> bool:
        """Stores the annotations; False when some waited for their root span in Phoenix's queue."""
        if not annotations:
            return True
        if self._post(list(annotations), sync=True) != _MISSING:
            return True
        self._post(list(annotations), sync=False)
        # Expected right after an export, so said once per process; the line tells an SRE where to look.
        log.log(
            logging.DEBUG if self._queued_before else logging.INFO,
            "Phoenix has not stored the root span of some of %d rated runs yet; their annotations wait in its queue "
            "for the roots (a root that never reaches Phoenix, e.g. traces sent elsewhere, leaves its rating unannotated)",
            len(annotations),
        )
        self._queued_before = True
        return False

    def _post(self, data: list[dict[str, Any]], sync: bool) -> int:
        try:
            params = {"sync": "true" if sync else "false"}
            reply = self._session.post(self._url, params=params, json={"data": data}, timeout=self._timeout)
        except requests.RequestException as exc:
            raise PhoenixError(f"Phoenix {self._url}: {type(exc).__name__}") from None
        if reply.status_code not in (200, _MISSING):
            raise PhoenixError(f"Phoenix {self._url}: HTTP {reply.status_code} {reply.text[:200]}")
        return reply.status_code

    def close(self) -> None:
        self._session.close()
