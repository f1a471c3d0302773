"""The content policy: what user content is, where it is read, where it goes.

User content (the query, the answer, the published result, tool arguments
and results, evidence text) leaves the database only with
``content.capture = true`` (``source.columns`` says which columns hold it).
This module is the one place that says which span attributes carry it, and
how a value is redacted and cut before it may leave.

``error_message`` is not user content, but it often quotes input or a
connection string, so it is always redacted. Every value, content or error,
passes the one ``Cleaner``: the same credential corpus, the config's own
secrets masked verbatim, and the PII patterns.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..config import ContentConfig
from . import attributes as A
from .redaction import REDACTED, Redactor, secret_patterns

__all__ = ["REDACTED", "ContentPolicy", "Cleaner", "is_content_attribute"]


# Every attribute that can carry user content. Tests hold the mapping to it.
CONTENT_ATTRIBUTES = frozenset(
    {
        A.RUN_QUERY,
        A.RUN_ANSWER,
        A.RUN_PUBLISHED_RESULT,
        A.GEN_AI_TOOL_CALL_ARGUMENTS,
        A.GEN_AI_TOOL_CALL_RESULT,
        A.RAG_EVIDENCE_REFS,
        A.OI_INPUT_VALUE,
        A.OI_OUTPUT_VALUE,
    }
)


def is_content_attribute(key: str) -> bool:
    """Whether the attribute may carry user content: the fixed keys and each retrieved document's text."""
    return key in CONTENT_ATTRIBUTES or (
        key.startswith(A.OI_RETRIEVAL_DOCUMENTS + ".") and key.endswith("." + A.OI_DOCUMENT_CONTENT)
    )


PII_PATTERNS: tuple[str, ...] = (
    # e-mail addresses
    r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    # mainland China mobile numbers, with or without +86
    r"(?<!\d)(?:\+?86[\s-]?)?1[3-9]\d{9}(?!\d)",
    # international numbers written with a leading +
    r"(?<![\w+])\+\d{1,3}[\s-]?\(?\d{1,4}\)?(?:[\s-]?\d{2,4}){2,3}(?!\d)",
    # North American style 555-123-4567 and (555) 123-4567
    r"(?<!\d)(?:\(\d{3}\)\s?|\d{3}[-.\s])\d{3}[-.\s]\d{4}(?!\d)",
)


@dataclass(frozen=True)
class Cleaner:
    """Redacts, then truncates to ``max_length`` characters."""

    redactor: Redactor
    max_length: int

    @classmethod
    def build(cls, extra_patterns: Iterable[str], max_length: int, secrets: Iterable[str] = ()) -> Cleaner:
        """``secrets`` are the config's own (``masking.configured_secrets``), masked verbatim."""
        extra = tuple(re.compile(p) for p in (*PII_PATTERNS, *extra_patterns))
        return cls(Redactor.for_secrets(extra, first=secret_patterns(secrets)), max_length)

    def clean(self, value: str | bytes | None) -> str | None:
        if value is None:
            return None
        text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)
        # Cut first to bound the regex work on a 1 MB preview, with a margin so
        # a secret straddling the cut is still matched whole.
        text = text[: self.max_length * 2 + 256]
        return self.redactor.redact(text)[: self.max_length]

    def clean_cut(self, value: str | bytes | None) -> tuple[str | None, bool]:
        """``clean(value)``, and whether it was cut short of what redaction left (``run_otel.attributes.cut``)."""
        if value is None:
            return None, False
        text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)
        bound = self.max_length * 2 + 256
        redacted = self.redactor.redact(text[:bound])
        return redacted[: self.max_length], len(text) > bound or len(redacted) > self.max_length


Pairs = list[tuple[str, str]]
MaybePairs = list[tuple[str, str | None]]


@dataclass(frozen=True)
class ContentPolicy:
    capture: bool
    openinference: bool
    cleaner: Cleaner

    @classmethod
    def build(cls, content: ContentConfig, conventions: Iterable[str], secrets: Iterable[str] = ()) -> ContentPolicy:
        cleaner = Cleaner.build(content.redact, content.max_length, secrets)
        return cls(content.capture, "openinference" in conventions, cleaner)

    # -- what is written ----------------------------------------------------------

    def error_text(self, message: str | None) -> tuple[str, bool]:
        """An error message as it may be exported, always redacted and cut, and whether it was cut."""
        text, cut = self.cleaner.clean_cut(message)
        return text or "", cut

    def run_attributes(self, query: str | None, answer: str | None, published_result: str | None) -> Pairs:
        if not self.capture:
            return []
        clean = self.cleaner.clean
        pairs: MaybePairs = [
            (A.RUN_QUERY, clean(query)),
            (A.RUN_ANSWER, clean(answer)),
            (A.RUN_PUBLISHED_RESULT, clean(published_result)),
        ]
        if self.openinference:
            pairs += _with_mime_types(clean(query), clean(answer))
        return _present(pairs)

    def tool_attributes(
        self, arguments: str | None, result: str | None, succeeded: bool, evidence_json: str | None, retriever: bool = False
    ) -> Pairs:
        """``result`` is exported for successful calls only; ``evidence_json`` is the refs with their text.
        A retriever's input is the lookup's query, not its whole argument object."""
        if not self.capture:
            return []
        clean = self.cleaner.clean
        result = result if succeeded else None
        pairs: MaybePairs = [
            (A.GEN_AI_TOOL_CALL_ARGUMENTS, clean(arguments)),
            (A.GEN_AI_TOOL_CALL_RESULT, clean(result)),
            (A.RAG_EVIDENCE_REFS, clean(evidence_json)),
        ]
        if self.openinference:
            lookup = _query_of(arguments) if retriever else None
            pairs += _with_mime_types(clean(lookup if lookup is not None else arguments), clean(result))
        return _present(pairs)

    def document_content(self, text: object) -> str | None:
        """An evidence ref's text as a retrieved document's content: only with capture on."""
        if not self.capture or not isinstance(text, str):
            return None
        return self.cleaner.clean(text)


def _query_of(arguments: str | None) -> str | None:
    try:
        value = json.loads(arguments) if arguments else None
    except ValueError:
        return None
    query = value.get("query") if isinstance(value, dict) else None
    return query if isinstance(query, str) else None


def _mime_type(value: str) -> str:
    # Judged on the value as exported: JSON cut short by max_length is text again.
    try:
        json.loads(value)
    except ValueError:
        return A.MIME_TEXT
    return A.MIME_JSON if value.lstrip()[:1] in ("{", "[") else A.MIME_TEXT


def _with_mime_types(input_value: str | None, output_value: str | None) -> MaybePairs:
    pairs: MaybePairs = []
    for key, mime_key, value in (
        (A.OI_INPUT_VALUE, A.OI_INPUT_MIME_TYPE, input_value),
        (A.OI_OUTPUT_VALUE, A.OI_OUTPUT_MIME_TYPE, output_value),
    ):
        if value is not None:
            pairs += [(key, value), (mime_key, _mime_type(value))]
    return pairs


def _present(pairs: MaybePairs) -> Pairs:
    return [(key, value) for key, value in pairs if value is not None]
