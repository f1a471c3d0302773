"""Secrets out of every string run-otel exports or logs.

Two sources of rules, applied in order:

* **Provider tokens** come from detect-secrets' regex detectors (AWS key ids,
  GitHub, GitLab, Slack, Stripe, SendGrid, Twilio, Discord, Telegram, PyPI,
  npm, Mailchimp, Square, Azure storage keys, OpenAI). They are maintained
  upstream; run-otel only applies their ``denylist`` patterns to text.
* **Shapes** that detect-secrets does not find in free text, written here:
  ``KEY=value`` / ``"key": "value"`` / ``key: value`` assignments whose key
  names a credential (its KeywordDetector is line-oriented and tuned to source
  files: in an error message it either takes the rest of the line or misses
  ``token=`` and ``db_password=``), credentials in URLs, ``Authorization``
  headers, whole PEM private-key blocks and whole JWTs (its detectors match
  only the header line and a JWT without its signature), and vendor keys it
  lacks (``sk-``, Google ``AIza``/``ya29.``, Hugging Face ``hf_``,
  ``github_pat_``, Azure SAS ``sig=``).

The test corpus in ``tests/test_redaction.py`` holds both halves to real
credential shapes, and to ordinary error text that must stay readable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from re import Match, Pattern

REDACTED = "[REDACTED]"
# A configured secret shorter than this would mask ordinary words; one that short is not one.
MIN_SECRET = 3

# detect-secrets detectors whose patterns are safe on free text. Left out: the
# keyword and high-entropy detectors (they over-redact hostnames, hashes and
# stack frames), IPPublicDetector (an address is not a secret and helps
# debugging), Artifactory (its pattern eats the delimiter around a match), and
# private keys, JWTs and URL credentials, which the shapes below take whole.
_PROVIDER_DETECTORS = (
    ("aws", "AWSKeyDetector"),
    ("azure_storage_key", "AzureStorageKeyDetector"),
    ("discord", "DiscordBotTokenDetector"),
    ("github_token", "GitHubTokenDetector"),
    ("gitlab_token", "GitLabTokenDetector"),
    ("mailchimp", "MailchimpDetector"),
    ("npm", "NpmDetector"),
    ("openai", "OpenAIDetector"),
    ("pypi_token", "PypiTokenDetector"),
    ("sendgrid", "SendGridDetector"),
    ("slack", "SlackDetector"),
    ("square_oauth", "SquareOAuthDetector"),
    ("stripe", "StripeDetector"),
    ("telegram_token", "TelegramBotTokenDetector"),
    ("twilio", "TwilioKeyDetector"),
)

# Words that make the key of an assignment a credential's name. The key must end
# in one (db_password, client_secret, aws_secret_access_key, X-Api-Key), so
# token_count=5 and max_tokens=4096 stay. Only the word is matched, not the
# whole key: a leading [\w.-]* would backtrack at every position of the text.
_CREDENTIAL_WORDS = (
    r"passw(?:or)?d|pwd|(?<![a-z])pass|secret|token|credentials?|"
    r"(?:api|access|secret|private|auth|client|account|master|encryption|signing|session|shared[_-]?access)[_-]?key|"
    r"apikey|sig|signature|private[_-]?key[_-]?id|passphrase"
)
# The key, its closing quote (escaped too, at any depth, as in JSON held inside a JSON string), the separator.
_KEY = rf"""(?:{_CREDENTIAL_WORDS})(?:\\*["'])?\s*"""
# A quoted value: the quotes stay, so a JSON document stays JSON; only what is between them goes.
_QUOTED = r"""(?:[:=]\s*|\s)(?:"(?P<dq>(?:[^"\\]|\\.)+)"|(?P<bs>\\+)"(?P<eq>(?:(?!(?P=bs)")[^"])+)(?P=bs)"|'(?P<sq>[^']+)')"""
# An unquoted value; not an object or list (the keys inside them are judged one by one).
_VALUE = r"""(?!\[REDACTED\])(?![\\"'{\[])[^\s,;'"}\]\)&]+"""

_SHAPES: tuple[tuple[str, str], ...] = (
    # PEM private keys, the whole block (or up to the end when cut short)
    ("pem", r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)"),
    # user:password@ in any URL; the user name stays, and so does an already masked ***
    ("url", r"(?i)(?<=[a-z0-9+.-]://)(?P<keep>[^\s/:@]*:)(?!\*+@)[^\s/@]+(?=@)"),
    # Authorization / Proxy-Authorization headers, any scheme
    (
        "authorization",
        r"(?i)(?<=authorization)(?P<keep>[\"']?\s*[:=]\s*[\"']?)(?:(?:basic|bearer|token|digest|apikey|negotiate)\s+)?[A-Za-z0-9._~+/=-]{6,}",
    ),
    # a bearer token written on its own
    ("bearer", r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}"),
    # JSON Web Tokens, signature included
    ("jwt", r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"),
    # KEY=value, "key": "value", key: value, --password value; MySQL's "using password: YES/NO" is not a secret
    ("quoted", rf"""(?i){_KEY}{_QUOTED}"""),
    ("assignment", rf"""(?i)(?P<keep>{_KEY}[:=]\s*)(?!(?:YES|NO)\b){_VALUE}"""),
    (
        "flag",
        rf"""(?i)(?P<keep>--?(?:password|passwd|pwd|token|secret|api-key)[= ])(?!\[REDACTED\])(?:"[^"]+"|'[^']+'|{_VALUE})""",
    ),
    # vendor keys detect-secrets lacks
    ("sk", r"\b(?:sk|rk|pk)[-_](?:live_|test_|proj-|ant-)?[A-Za-z0-9_-]{16,}"),
    ("google", r"\bAIza[0-9A-Za-z_-]{35}\b|\bya29\.[0-9A-Za-z_-]{20,}"),
    ("huggingface", r"\bhf_[A-Za-z0-9]{30,}\b"),
    ("github_pat", r"\bgithub_pat_[A-Za-z0-9_]{40,}\b"),
)


def detect_secrets_patterns() -> tuple[Pattern[str], ...]:
    """detect-secrets' provider token patterns, from the library itself: for scripts/generate.py,
    which copies them into provider_patterns.py, and the test that holds that copy to the library."""
    import importlib

    patterns: list[Pattern[str]] = []
    for module, name in _PROVIDER_DETECTORS:
        detector = getattr(importlib.import_module(f"detect_secrets.plugins.{module}"), name)
        patterns.extend(detector.denylist)
    return tuple(patterns)


def provider_patterns() -> tuple[Pattern[str], ...]:
    """detect-secrets' provider token patterns, from the copy in provider_patterns.py: importing the
    library costs every command a tenth of a second at start-up (it loads requests), for these alone."""
    from .provider_patterns import PATTERNS

    return tuple(re.compile(pattern, flags) for pattern, flags in PATTERNS)


def provider_patterns_module() -> str:
    """provider_patterns.py as scripts/generate.py writes it, from the installed detect-secrets."""
    import json
    from importlib.metadata import version

    # JSON's string is Python's too, quoted as the formatter quotes it.
    lines = [f"    ({json.dumps(pattern.pattern)}, {int(pattern.flags)})," for pattern in detect_secrets_patterns()]
    return "\n".join(
        [
            '"""detect-secrets\' provider token patterns (mapping/redaction.py), copied from detect-secrets '
            f"{version('detect-secrets')} by",
            'scripts/generate.py; tests/test_redaction.py holds the copy to the installed library."""',
            "",
            "# (pattern, re flags), in the order of redaction._PROVIDER_DETECTORS",
            "PATTERNS: tuple[tuple[str, int], ...] = (",
            *lines,
            ")",
            "",
        ]
    )


def secret_patterns(secrets: Iterable[str]) -> tuple[Pattern[str], ...]:
    """Known secret values (the config's own) as literal patterns, longest first."""
    ordered = sorted({s for s in secrets if len(s) >= MIN_SECRET}, key=len, reverse=True)
    return tuple(re.compile(re.escape(s)) for s in ordered)


def shape_patterns() -> tuple[Pattern[str], ...]:
    return tuple(re.compile(pattern, re.DOTALL if name == "pem" else 0) for name, pattern in _SHAPES)


def _secret_span(match: Match[str]) -> tuple[int, int]:
    """The part of a match that is the secret: after a ``keep`` group, or a
    detect-secrets pattern's one capture group when it is the token itself."""
    names = match.re.groupindex
    for quoted in ("dq", "eq", "sq"):
        if quoted in names and match.group(quoted) is not None:
            return match.span(quoted)
    if "keep" in names:
        return match.end("keep"), match.end()
    if match.re.groups == 1 and match.group(1) and match.end(1) - match.start(1) >= 16:
        return match.span(1)
    return match.span()


class Redactor:
    """Replaces every match of its patterns with ``[REDACTED]``."""

    def __init__(self, patterns: Iterable[Pattern[str]]):
        self._patterns = tuple(patterns)

    @classmethod
    def for_secrets(cls, extra: Iterable[Pattern[str]] = (), first: Iterable[Pattern[str]] = ()) -> Redactor:
        """``first`` runs before the shapes: literal secrets, matched whole before a shape cuts into them."""
        return cls((*first, *shape_patterns(), *provider_patterns(), *extra))

    def redact(self, text: str) -> str:
        for pattern in self._patterns:
            text = _substitute(pattern, text)
        return text


def _substitute(pattern: Pattern[str], text: str) -> str:
    pieces: list[str] = []
    last = 0
    for match in pattern.finditer(text):
        start, end = _secret_span(match)
        if end <= start or text[start:end] == REDACTED:
            continue
        pieces.append(text[last:start])
        pieces.append(REDACTED)
        last = end
    if not pieces:
        return text
    pieces.append(text[last:])
    return "".join(pieces)
