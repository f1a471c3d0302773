"""User content: truncated and redacted before it may leave the process.

Only ``mapping`` calls this, and only for values the config opted in to (plus
``error_message``, which is always cleaned because it often quotes input).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

REDACTED = "[REDACTED]"

DEFAULT_PATTERNS: tuple[str, ...] = (
    # e-mail addresses
    r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    # bearer tokens in headers or text
    r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}",
    # sk-... style API keys (OpenAI, Anthropic, DeepSeek and many gateways)
    r"\bsk-[A-Za-z0-9_-]{12,}",
    # key=value credentials
    r"(?i)\b(?:api[_-]?key|access[_-]?token|secret|password|passwd)\b\s*[:=]\s*[^\s,;\"']+",
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

    patterns: tuple[re.Pattern[str], ...]
    max_length: int

    @classmethod
    def build(cls, extra_patterns: Iterable[str], max_length: int) -> "Cleaner":
        compiled = tuple(re.compile(p) for p in (*DEFAULT_PATTERNS, *extra_patterns))
        return cls(compiled, max_length)

    def clean(self, value: str | bytes | None) -> str | None:
        if value is None:
            return None
        text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)
        # Cut first to bound the regex work on a 1 MB preview, with a margin so
        # a secret straddling the cut is still matched whole.
        text = text[: self.max_length * 2 + 256]
        for pattern in self.patterns:
            text = pattern.sub(REDACTED, text)
        return text[: self.max_length]
