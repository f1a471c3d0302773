"""Ratings as Arize Phoenix annotations: a HUMAN annotation on the run's root span.

Phoenix's ``POST /v1/span_annotations`` upserts on (name, span, identifier),
so one fixed identifier leaves one current rating per run, in the traces list,
the annotation columns and the session's feedback. ``sync=true`` stores them at
once where Phoenix has the spans. A rating the run had when it was exported is
sent seconds after its root, which Phoenix may not have stored yet (it writes
spans in batches): Phoenix answers 404 then, and the batch goes again without
``sync``, into Phoenix's own queue, which holds an annotation until its span
arrives (up to 60 retries 10 s apart in Phoenix 20) and then drops it. So the
daemon looks again, with ``sync``, once that time is over: a root still missing
then never reached Phoenix (traces sent elsewhere), and a WARNING says so.

A look again never posts a rating older than the current one: only the newest
annotation for a queued span is kept (a changed rating stored since takes the
place of the one queued, and is posted again then, over anything Phoenix's queue
still landed), and the caller's ``current`` filter (the ratings the state store
holds) drops one replaced in any other way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import requests

log = logging.getLogger(__name__)

# Phoenix answers 404 for the whole batch when any span is missing; then the batch is queued there.
_MISSING = 404
# How long Phoenix's queue keeps an annotation for a span it lacks (60 retries, 10 s apart), and a margin.
QUEUE_SECONDS = 660.0


class PhoenixError(RuntimeError):
    """Phoenix did not store the annotations; the pass is retried."""


class PhoenixAnnotations:
    def __init__(
        self,
        base_url: str,
        timeout: float = 10.0,
        queue_seconds: float = QUEUE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._url = f"{base_url.rstrip('/')}/v1/span_annotations"
        self._timeout = timeout
        self._session = requests.Session()
        self._queued_before = False
        self._queue_seconds = queue_seconds
        self._clock = clock
        # Annotations left to Phoenix's queue, the newest per span, with when and the caller's key for it
        # (what ``current`` is asked about), to look for once the queue gave up on them.
        self._queued: dict[str, tuple[float, str, dict[str, Any]]] = {}

    def upsert(self, annotations: Sequence[dict[str, Any]], keys: Sequence[str] | None = None) -> bool:
        """Stores the annotations; False when some waited for their root span in Phoenix's queue.
        ``keys``: the caller's name for each, which ``look_again``'s filter is asked about."""
        if not annotations:
            return True
        keys = keys or [""] * len(annotations)
        if self._post(list(annotations), sync=True) != _MISSING:
            for item, key in zip(annotations, keys):
                # Stored; what Phoenix's queue holds for the span is older and may still land after it:
                # the look again posts this one instead, when that queue is done.
                if item["span_id"] in self._queued:
                    self._queued[item["span_id"]] = (self._queued[item["span_id"]][0], key, item)
            return True
        self._post(list(annotations), sync=False)
        for item, key in zip(annotations, keys):
            self._queued[item["span_id"]] = (self._clock(), key, item)
        # Expected right after an export, so said once per process; the line tells an SRE where to look.
        log.log(
            logging.DEBUG if self._queued_before else logging.INFO,
            "Phoenix has not stored the root span of some of %d rated runs yet; their annotations wait in its queue "
            "for the roots (a root that never reaches Phoenix, e.g. traces sent elsewhere, leaves its rating unannotated)",
            len(annotations),
        )
        self._queued_before = True
        return False

    def look_again(self, current: Callable[[list[tuple[str, dict[str, Any]]]], list[dict[str, Any]]] | None = None) -> int:
        """Stores, with ``sync``, the queued annotations Phoenix's queue is done with, those ``current``
        keeps (given (key, annotation) pairs: the ones still the current rating); warns about those
        whose root is still missing, and returns how many that is."""
        now = self._clock()
        spans = [span for span, (queued_at, _key, _item) in self._queued.items() if now - queued_at >= self._queue_seconds]
        if not spans:
            return 0
        pairs = [(key, item) for _at, key, item in (self._queued.pop(span) for span in spans)]
        due = current(pairs) if current is not None else [item for _key, item in pairs]
        if len(due) < len(pairs):
            log.debug("Phoenix: %d queued rating(s) replaced since were not posted again", len(pairs) - len(due))
        if not due or self._post(due, sync=True) != _MISSING:
            return 0
        missing = [str(item["metadata"]["run_id"]) for item in due if self._post([item], sync=True) == _MISSING]
        log.warning(
            "Phoenix never stored the root span of %d rated runs (are the traces sent to %s?); their ratings are "
            "not annotated there: %s",
            len(missing),
            self._url.removesuffix("/v1/span_annotations"),
            ", ".join(missing[:5]) + (", …" if len(missing) > 5 else ""),
        )
        return len(missing)

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
