"""Credentials as they appear in error messages, one per format the redaction must catch."""

from __future__ import annotations

_PEM_RSA = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM2rS0Mz7t1YvVyJxtaZ2nPq0dWJzD\n"
    "q8ZsVp8bW4n3c8V4kQIDAQABAoIBAQCt0tGf0rS2jdVzXq6E1hVq3o5wY6b1xZ9u\n-----END RSA PRIVATE KEY-----"
)


_PEM_OPENSSH = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
    "QyNTUxOQAAACBvZWQ4c2VjcmV0a2V5bWF0ZXJpYWwAAAAA\n-----END OPENSSH PRIVATE KEY-----"
)


_JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJvcHMtYm90IiwiaWF0IjoxNzAwMDAwMDAwfQ."
    "Zm9vYmFyYmF6cXV4c2lnbmF0dXJlX3ZhbHVlXzEyMzQ"
)


# (text, the secret that must not survive)
SECRETS: list[tuple[str, str]] = [
    ("connect failed: mysql://app:hunter2@db-prod:3306/orders", "hunter2"),
    ("env MYSQL_PASSWORD=hunter2x rejected", "hunter2x"),
    ("oauth error client_secret=s3cr3tval for app 7", "s3cr3tval"),
    ("db_password=Tr0ub4dor3x", "Tr0ub4dor3x"),
    ("secret_key=9f8e7d6c5b4a3f2e", "9f8e7d6c5b4a3f2e"),
    ("openai_api_key=sk-proj-Q9w8E7r6T5y4U3i2O1p0AsDfGh", "sk-proj-Q9w8E7r6T5y4U3i2O1p0AsDfGh"),
    ("callback failed: token=abc123def456ghi", "abc123def456ghi"),
    ("pwd=P@ssw0rd!x", "P@ssw0rd!x"),
    ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
    ("request headers {'Authorization': 'Bearer ya29.a0AfH6SMBxQ1w2e3r4t5y6u7i8o9p0'}", "a0AfH6SMBxQ1w2e3r4t5y6u7i8o9p0"),
    ("401 with bearer 7f3a9c1e5b2d8f4a6c0e", "7f3a9c1e5b2d8f4a6c0e"),
    ("s3 client: AKIAIOSFODNN7EXAMPLE denied", "AKIAIOSFODNN7EXAMPLE"),
    ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    ("git clone failed with ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8", "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"),
    (
        "pat github_pat_11ABCDEFG0aBcDeFgHiJkLmN_oPqRsTuVwXyZ0123456789aBcDeFgHiJkLmNoPqRsTuVwXyZ012345",
        "github_pat_11ABCDEFG0aBcDeFgHiJkLmN_oPqRsTuVwXyZ0123456789aBcDeFgHiJkLmNoPqRsTuVwXyZ012345",
    ),
    ("gitlab: glpat-xY7zQ2wE4rT6yU8iO0pA", "glpat-xY7zQ2wE4rT6yU8iO0pA"),
    (
        "slack post failed xoxb-123456789012-1234567890123-abcdefghijklmnopqrstuvwx",
        "xoxb-123456789012-1234567890123-abcdefghijklmnopqrstuvwx",
    ),
    ("webhook https://hooks.slack.com/services/T01ABCDEF/B02GHIJKL/abcdefGHIJKL123456mnop", "abcdefGHIJKL123456mnop"),
    ("stripe charge: sk_live_4eC39HqLyjWDarjtT1zdp7dc", "sk_live_4eC39HqLyjWDarjtT1zdp7dc"),
    ("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", "TwL2iGABf9DHoTf-09kqeF8tAmbihYzrnopKc-1s5cr"),
    ("twilio key SK0123456789abcdef0123456789abcdef", "SK0123456789abcdef0123456789abcdef"),
    (f"jwt rejected: {_JWT}", "Zm9vYmFyYmF6cXV4c2lnbmF0dXJlX3ZhbHVlXzEyMzQ"),
    (f"cannot parse key file:\n{_PEM_RSA}\n", "MIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM2rS0Mz7t1YvVyJxtaZ2nPq0dWJzD"),
    (f"ssh: {_PEM_OPENSSH}", "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW"),
    ("maps: key AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY invalid", "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY"),
    ("hf hub 401 for hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567", "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567"),
    ("anthropic: sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"),
    ("deepseek 401: sk-9f86d081884c7d659a2feaa0c55ad015", "sk-9f86d081884c7d659a2feaa0c55ad015"),
    ('config {"password": "hunter2y", "host": "db"}', "hunter2y"),
    ("config:\n  database:\n    password: hunter2z\n    host: db\n", "hunter2z"),
    ("yaml api_key: abcd1234efgh5678", "abcd1234efgh5678"),
    ('body {"apiKey": "AbCdEf123456XyZ"}', "AbCdEf123456XyZ"),
    ("export DATABASE_URL=postgres://agent:pa55word@pg:5432/agent", "pa55word"),
    ("redis://:s3cretRedis@redis:6379/0 unreachable", "s3cretRedis"),
    (
        "DefaultEndpointsProtocol=https;AccountName=agentlogs;AccountKey="
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;EndpointSuffix=core.windows.net",
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==",
    ),
    ("blob GET https://x.blob.core.windows.net/c/f?sv=2021-08-06&sig=q8Zs2Vp8bW4n3c8V4kQ%3D failed", "q8Zs2Vp8bW4n3c8V4kQ%3D"),
    (
        "npm ERR! //registry.npmjs.org/:_authToken=npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
        "npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    ),
    ("telegram 123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw0 blocked", "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw0"),
    ("mysql --password hunter2w -h db", "hunter2w"),
    ("X-Api-Key: abcdef1234567890", "abcdef1234567890"),
    ("PGPASSWORD=Zx9Yw8Vu7 psql failed", "Zx9Yw8Vu7"),
    (
        "pypi upload: pypi-AgEIcHlwaS5vcmcCJGFiY2RlZjEyLTM0NTYtNzg5MC1hYmNkLWVmMTIzNDU2Nzg5MAACJXsicGVybWlzc2lvbnMiOiAidXNlciJ9",
        "pypi-AgEIcHlwaS5vcmcCJGFiY2RlZjEyLTM0NTYtNzg5MC1hYmNkLWVmMTIzNDU2Nzg5MAACJXsicGVybWlzc2lvbnMiOiAidXNlciJ9",
    ),
    ("mailchimp 0123456789abcdef0123456789abcdef-us12 revoked", "0123456789abcdef0123456789abcdef-us12"),
    (
        '{"type": "service_account", "private_key": '
        '"-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\\n-----END PRIVATE KEY-----\\n"}',
        "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC",
    ),
]
