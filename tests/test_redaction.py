"""Credentials out, ordinary error text kept: the redaction corpus.

Every value below is a made-up credential in a real provider's shape. The
miss count and the over-redaction count are printed (run with -s) and must
both be zero.
"""

from __future__ import annotations

import pytest
from secret_corpus import SECRETS

from run_otel.mapping.content import Cleaner
from run_otel.mapping.redaction import REDACTED, Redactor

# Ordinary error text that must come through unchanged.
ORDINARY: list[str] = [
    "connection refused: db-prod.internal:3306",
    "java.net.SocketTimeoutException: Read timed out\n\tat com.acme.agent.tools.LogQuery.run(LogQuery.java:118)",
    "SQLSTATE[HY000] [2002] Connection refused",
    "(1045, \"Access denied for user 'app'@'10.0.0.5' (using password: YES)\")",
    "Duplicate entry 'run-42' for key 'PRIMARY'",
    "timeout after 30000 ms querying loki at http://loki.monitoring.svc:3100/loki/api/v1/query_range",
    "HTTP 503 Service Unavailable from https://prometheus.monitoring.svc/api/v1/query",
    "token_count=4096 exceeds max_tokens=4000",
    "invalid JSON: Unexpected token } in JSON at position 17",
    "trace 550e8400e29b41d4a716446655440000 span 00f067aa0ba902b7",
    "run-550e8400-e29b-41d4-a716-446655440000 failed at step 3",
    "KeyError: 'evidence_refs'",
    "password policy requires 12 characters",
    "ERROR 1205 (HY000): Lock wait timeout exceeded; try restarting transaction",
    "grpc: UNAVAILABLE: failed to connect to all addresses; last error: ipv4:127.0.0.1:4317: Connection refused",
    "ConnectionResetError(104, 'Connection reset by peer')",
    "Caused by: org.springframework.dao.DataAccessResourceFailureException: Unable to acquire JDBC Connection",
    "secret rotation completed for vault path kv/agent",
    "disk /dev/sda1 95% full on node ip-10-0-3-17",
    "KB document kb-2024-113 not found (layer L1)",
    "rate limited: retry after 30s (429 Too Many Requests)",
    "NullPointerException at DiagnosisService.java:88",
    "Elasticsearch index 'logs-2026.12.03' missing",
    "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 digest mismatch",
    "pod agent-7d9f8c6b5-x2k4z OOMKilled (exit 137)",
    "upstream connect error or disconnect/reset before headers. reset reason: connection timeout",
    'Traceback (most recent call last):\n  File "/app/tools/metrics.py", line 42, in query\n    raise TimeoutError',
    "ORA-12541: TNS:no listener",
    "curl: (7) Failed to connect to grafana.local port 3000 after 1 ms: Connection refused",
    "evidence $.no_evidence for query on index kb_v2",
]


@pytest.fixture(scope="module")
def redactor() -> Redactor:
    return Redactor.for_secrets()


def test_the_corpora_are_large_and_distinct():
    assert len(SECRETS) >= 30 and len(ORDINARY) >= 30
    assert len({secret for _, secret in SECRETS}) == len(SECRETS)
    for text, secret in SECRETS:
        assert secret in text


def test_every_credential_is_redacted_and_ordinary_text_survives(redactor, capsys):
    misses = [(text, secret) for text, secret in SECRETS if secret in redactor.redact(text)]
    over = [text for text in ORDINARY if redactor.redact(text) != text]
    with capsys.disabled():
        print(
            f"\nredaction corpus: {len(SECRETS)} credentials, {len(misses)} missed; "
            f"{len(ORDINARY)} ordinary messages, {len(over)} over-redacted"
        )
    assert not misses, misses
    assert not over, [(text, redactor.redact(text)) for text in over]


@pytest.mark.parametrize(("text", "secret"), SECRETS[:8])
def test_the_message_around_a_secret_stays_readable(redactor, text, secret):
    out = redactor.redact(text)
    assert REDACTED in out
    # What is not the secret is kept: the words before it still read.
    assert out.split(REDACTED)[0] == text.split(secret)[0][: len(out.split(REDACTED)[0])]
    assert len(out) >= len(text) - len(secret)


def test_the_reported_leak_is_closed():
    cleaner = Cleaner.build([], 1024)
    text = "connect failed: mysql://app:hunter2@db-prod:3306/orders (MYSQL_PASSWORD=hunter2 client_secret=s3cr3tval)"
    out = cleaner.clean(text)
    assert "hunter2" not in out and "s3cr3tval" not in out
    assert out.startswith("connect failed: mysql://app:") and "@db-prod:3306/orders" in out


def test_redaction_is_idempotent(redactor):
    for text, _ in SECRETS:
        once = redactor.redact(text)
        assert redactor.redact(once) == once


def test_the_copy_of_detect_secrets_patterns_is_the_installed_librarys():
    """Redaction applies a copy of detect-secrets' provider patterns (provider_patterns.py), so that no
    command imports the library (and requests) at start-up; the copy must be what the library holds."""
    from run_otel.mapping.redaction import detect_secrets_patterns, provider_patterns

    copied = [(p.pattern, p.flags) for p in provider_patterns()]
    assert len(copied) >= 20
    assert copied == [(p.pattern, p.flags) for p in detect_secrets_patterns()], "stale: run scripts/generate.py"


def test_a_command_imports_neither_detect_secrets_nor_requests():
    import subprocess
    import sys

    code = (
        "import sys; from run_otel.mapping.redaction import Redactor; "
        "Redactor.for_secrets().redact('ghp_' + 'a' * 36); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('detect_secrets', 'requests')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
