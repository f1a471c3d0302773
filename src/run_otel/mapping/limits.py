"""Caps on what one span may carry, as the SDK's attribute limits cap them.

Every string attribute value is cut to ``trace.max_attribute_length`` characters
(each element of a list too), and every list (``rag.evidence.paths``, the JSON list
``gen_ai.retrieval.documents``, and the OpenInference ``retrieval.documents.N.*``
entries) to ``trace.max_list_length`` items. ``fits`` is the one test of an
attribute against the caps, and ``admit`` what the caps leave of one that does not;
both span outputs (``span_out.py``, the export's ``wire.py``) apply them as each
attribute is put. The cut is recorded on the span: ``run_otel.attributes.cut``
names the keys that were shortened or removed, and OTLP's own
``dropped_attributes_count`` counts the removed attributes.

A span still too large for one request is cut by the export (``export/cut.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from ..config import TraceConfig
from . import attributes as A
from .span_data import AttrValue

_DOCUMENT_PREFIX: Final = A.OI_RETRIEVAL_DOCUMENTS + "."


@dataclass(frozen=True)
class AttributeLimits:
    value_length: int = 4096
    list_length: int = 128

    @classmethod
    def from_config(cls, trace: TraceConfig) -> AttributeLimits:
        return cls(trace.max_attribute_length, trace.max_list_length)

    def fits(self, key: str, value: AttrValue) -> bool:
        """Whether the attribute is within the caps as it is."""
        if key.startswith(_DOCUMENT_PREFIX) and _document_index(key) >= self.list_length:
            return False
        kind = type(value)
        if kind is str:
            return len(value) <= self.value_length  # type: ignore[arg-type]
        if kind is tuple:
            n = self.value_length
            return len(value) <= self.list_length and all(len(item) <= n for item in value)  # type: ignore[arg-type, union-attr]
        return True

    def admit(self, key: str, value: AttrValue) -> AttrValue | None:
        """What the caps leave of an attribute that does not ``fit``: the value shortened, or
        None for a retrieval.documents entry past the list cap, which is removed."""
        n, m = self.value_length, self.list_length
        if key.startswith(_DOCUMENT_PREFIX) and _document_index(key) >= m:
            return None
        if key == A.GEN_AI_RETRIEVAL_DOCUMENTS and isinstance(value, str):
            return _shortened_documents(value, n, m)
        if isinstance(value, str):
            return value[:n]
        if isinstance(value, tuple):
            return tuple(item[:n] for item in value[:m])
        return value

    def cut_record(self, keys: list[str]) -> tuple[str, ...]:
        """The value of ``run_otel.attributes.cut`` for the keys cut, in order, each once."""
        return tuple(dict.fromkeys(keys))[: self.list_length]


def _shortened_documents(value: str, n: int, m: int) -> str:
    """gen_ai.retrieval.documents is a JSON list: keep its first documents, as many as fit, so it
    stays a list a reader can parse instead of JSON cut off mid-document."""
    try:
        documents = json.loads(value)
    except ValueError:
        documents = None
    if not isinstance(documents, list):
        return value[:n]
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
