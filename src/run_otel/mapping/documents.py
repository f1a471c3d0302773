"""A RAG lookup's evidence as documents: the GenAI conventions' ``gen_ai.retrieval.documents``
and OpenInference's ``retrieval.documents.N.document.*``, with the same ids and scores.

A document's id is the evidence's own stable id when it carries one, so it can be followed
across runs; else its path in this call's output. Its score is the call's relevance level.
"""

from __future__ import annotations

import json

from ..source.evidence import Evidence
from ..source.rows import ToolRow
from . import attributes as A
from .content import ContentPolicy

AttrValue = str | bool | int | float | tuple[str, ...]  # as mapping.py's, which imports this module


def retrieval_documents(evidence: Evidence, tool: ToolRow) -> str:
    """gen_ai.retrieval.documents: JSON [{id, score}], the same ids and scores as the OpenInference documents."""
    score = A.RELEVANCE_SCORES.get(tool.relevance_level or "")
    if evidence.refs is not None:
        ids = [
            _stable_id(ref) or ref["raw_path"]
            for ref in evidence.refs
            if isinstance(ref, dict) and isinstance(ref.get("raw_path"), str) and ref["raw_path"] != A.NO_EVIDENCE_PATH
        ]
    else:
        ids = [path for path in evidence.paths if path != A.NO_EVIDENCE_PATH]
    return _compact_json([{"id": doc_id, **({"score": score} if score is not None else {})} for doc_id in ids])


class RetrievalDocuments:
    """:func:`retrieval_documents`, encoded once per distinct evidence and relevance level.

    Its JSON took a seventh of a compiled backfill's main thread, though retrieval calls
    of one kind carry the same document again and again. Evidence holding refs is
    unhashable (a list), but the parser's memo hands out one shared Evidence per distinct
    document, so its identity is the key; the entry holds the Evidence, so no other object
    can take its id while the entry lives. The database's summaries carry no refs and are
    keyed by value. At most ``size`` entries, forgotten all at once."""

    def __init__(self, size: int = 4096):
        self._values: dict[tuple, tuple[Evidence, str]] = {}
        self._size = size

    def __call__(self, evidence: Evidence, tool: ToolRow) -> str:
        key = (evidence if evidence.refs is None else id(evidence), tool.relevance_level)
        hit = self._values.get(key)
        if hit is not None:
            return hit[1]
        value = retrieval_documents(evidence, tool)
        if len(self._values) >= self._size:
            self._values.clear()
        self._values[key] = (evidence, value)
        return value


def openinference_documents(evidence: Evidence, tool: ToolRow, content: ContentPolicy) -> list[tuple[str, AttrValue]]:
    """retrieval.documents.N.document.*: one per evidence ref with a raw_path, except $.no_evidence."""
    metadata = _compact_json(
        {
            key: value
            for key, value in (
                ("retrieval_layer", tool.retrieval_layer),
                ("relevance_level", tool.relevance_level),
                ("l0_match_count", tool.l0_match_count),
                ("l1_match_count", tool.l1_match_count),
            )
            if value is not None
        }
    )
    if evidence.refs is not None:
        documents = [
            (ref["raw_path"], ref.get("text"), _stable_id(ref))
            for ref in evidence.refs
            if isinstance(ref, dict) and isinstance(ref.get("raw_path"), str)
        ]
    else:  # summarized by the database: paths only, and no text to show
        documents = [(path, None, None) for path in evidence.paths]
    score = A.RELEVANCE_SCORES.get(tool.relevance_level or "")
    pairs: list[tuple[str, AttrValue]] = []
    for n, (path, text, stable_id) in enumerate(doc for doc in documents if doc[0] != A.NO_EVIDENCE_PATH):
        prefix = f"{A.OI_RETRIEVAL_DOCUMENTS}.{n}."
        # A stable id follows a document across runs; the path is only where it sat in this output.
        pairs.append((prefix + A.OI_DOCUMENT_ID, stable_id or path))
        _put(pairs, prefix + A.OI_DOCUMENT_SCORE, score)
        _put(pairs, prefix + A.OI_DOCUMENT_CONTENT, content.document_content(text))
        pairs.append((prefix + A.OI_DOCUMENT_METADATA, metadata if stable_id is None else _with_path(metadata, path)))
    return pairs


def _stable_id(ref: dict) -> str | None:
    """The evidence's own document id, when it carries one (a non-empty string or integer)."""
    for key in A.DOCUMENT_ID_KEYS:
        value = ref.get(key)
        if isinstance(value, str) and value or isinstance(value, int) and not isinstance(value, bool):
            return str(value)
    return None


def _with_path(metadata: str, path: str) -> str:
    return _compact_json({**json.loads(metadata), "raw_path": path})


def _put(attrs: list, key: str, value: AttrValue | None) -> None:
    if value is not None:
        attrs.append((key, value))


def _compact_json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
