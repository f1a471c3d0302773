"""Caps on what one span may carry, and how a span too large for a request is cut.

Every string attribute value is cut to ``trace.max_attribute_length`` characters
(each element of a list too), and every list (``rag.evidence.paths``, the JSON list
``gen_ai.retrieval.documents``, and the OpenInference ``retrieval.documents.N.*``
entries) to ``trace.max_list_length`` items, as the SDK's attribute limits do. A span that is still too large for one
request is cut by :func:`cut_to`: its attributes are removed, largest first, until
it fits; its name, ids, times and status stay. Either cut is recorded on the span:
``run_otel.attributes.cut`` names the keys that were shortened or removed, and
OTLP's own ``dropped_attributes_count`` counts the removed attributes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from ..config import TraceConfig
from . import attributes as A
from .span_data import AttrValue, SpanData

_DOCUMENT_PREFIX = A.OI_RETRIEVAL_DOCUMENTS + "."


@dataclass(frozen=True)
class AttributeLimits:
    value_length: int = 4096
    list_length: int = 128

    @classmethod
    def from_config(cls, trace: TraceConfig) -> AttributeLimits:
        return cls(trace.max_attribute_length, trace.max_list_length)

    def apply(self, span: SpanData) -> SpanData:
        """The span with every value and list within the caps (the same object when it already is)."""
        attrs = span.attributes
        n, m = self.value_length, self.list_length
        # A documents list longer than the cap needs more attributes than the cap: skip its scan below that.
        if len(attrs) <= m and not self._any_too_long(attrs):
            return span
        cut: list[str] = []
        kept: list[tuple[str, AttrValue]] = []
        dropped = 0
        for key, value in attrs:
            if key.startswith(_DOCUMENT_PREFIX) and _document_index(key) >= m:
                dropped += 1
                if A.OI_RETRIEVAL_DOCUMENTS not in cut:
                    cut.append(A.OI_RETRIEVAL_DOCUMENTS)
                continue
            if _too_long(value, n, m):
                value = _shortened_documents(value, n, m) if key == A.GEN_AI_RETRIEVAL_DOCUMENTS else _shortened(value, n, m)
                cut.append(key)
            kept.append((key, value))
        if not cut:
            return span
        return with_cut(span._replace(attributes=tuple(kept)), cut, dropped, m)

    def _any_too_long(self, attrs: tuple) -> bool:
        # Runs for every span: a plain loop, no call per attribute.
        n, m = self.value_length, self.list_length
        for _, value in attrs:
            kind = value.__class__
            if kind is str:
                if len(value) > n:
                    return True
            elif kind is tuple and value and (len(value) > m or max(map(len, value)) > n):
                return True
        return False


def _too_long(value: AttrValue, n: int, m: int) -> bool:
    if value.__class__ is str:
        return len(value) > n  # type: ignore[arg-type]
    if value.__class__ is tuple:
        return len(value) > m or any(len(item) > n for item in value)  # type: ignore[arg-type]
    return False


def _shortened(value: AttrValue, n: int, m: int) -> AttrValue:
    if isinstance(value, str):
        return value[:n]
    assert isinstance(value, tuple)
    return tuple(item[:n] for item in value[:m])


def _shortened_documents(value: AttrValue, n: int, m: int) -> AttrValue:
    """gen_ai.retrieval.documents is a JSON list: keep its first documents, as many as fit, so it
    stays a list a reader can parse instead of JSON cut off mid-document."""
    try:
        documents = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        documents = None
    if not isinstance(documents, list):
        return _shortened(value, n, m)
    parts: list[str] = []
    size = 2  # the brackets
    for document in documents[:m]:
        part = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
        if size + len(part) + (1 if parts else 0) > n:
            break
        size += len(part) + (1 if parts else 0)
        parts.append(part)
    return "[" + ",".join(parts) + "]"


def _document_index(key: str) -> int:
    index = key[len(_DOCUMENT_PREFIX) :].partition(".")[0]
    return int(index) if index.isdigit() else -1


def with_cut(span: SpanData, keys: list[str], dropped: int, list_length: int) -> SpanData:
    """Records a cut on the span: the keys (merged with an earlier cut) and the removed count."""
    attrs = list(span.attributes)
    earlier: tuple[str, ...] = ()
    for i, (key, value) in enumerate(attrs):
        if key == A.RUN_OTEL_ATTRIBUTES_CUT and isinstance(value, tuple):
            earlier = value
            del attrs[i]
            break
    merged = tuple(dict.fromkeys((*earlier, *keys)))[:list_length]
    attrs.append((A.RUN_OTEL_ATTRIBUTES_CUT, merged))
    return span._replace(attributes=tuple(attrs), dropped_attributes_count=span.dropped_attributes_count + dropped)


def cut_to(span: SpanData, budget: int, encode: Callable[[SpanData], bytes], list_length: int) -> tuple[SpanData, bytes] | None:
    """The span with its largest attributes removed until it encodes to ``budget`` bytes or
    fewer, with the cut recorded; None when even its name, ids, times and status are too large."""
    encoded = encode(span)
    if len(encoded) <= budget:
        return span, encoded
    # The record of the cut takes room too: at most list_length keys of the sizes removed.
    sizes = sorted(
        (
            (len(key.encode()) + _value_size(value), i)
            for i, (key, value) in enumerate(span.attributes)
            if key != A.RUN_OTEL_ATTRIBUTES_CUT
        ),
        reverse=True,
    )
    excess = len(encoded) - budget
    removed: set[int] = set()
    freed = 0
    for size, i in sizes:
        removed.add(i)
        freed += size
        if freed >= excess + 64 + sum(len(span.attributes[j][0]) + 4 for j in removed):
            break
    while True:
        kept = tuple(attr for i, attr in enumerate(span.attributes) if i not in removed)
        keys = [span.attributes[i][0] for i in sorted(removed)]
        candidate = with_cut(span._replace(attributes=kept), keys, len(removed), list_length)
        encoded = encode(candidate)
        if len(encoded) <= budget:
            return candidate, encoded
        if len(removed) >= len(sizes):
            return None
        removed.add(next(i for _, i in sizes if i not in removed))


def _value_size(value: AttrValue) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8", "replace")) + 8
    if isinstance(value, tuple):
        return sum(len(item.encode("utf-8", "replace")) + 4 for item in value) + 8
    return 12
