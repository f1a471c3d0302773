"""detect-secrets' provider token patterns (mapping/redaction.py), copied from detect-secrets 1.5.0 by
scripts/generate.py; tests/test_redaction.py holds the copy to the installed library."""

# (pattern, re flags), in the order of redaction._PROVIDER_DETECTORS
PATTERNS: tuple[tuple[str, int], ...] = (
    ("(?:A3T[A-Z0-9]|ABIA|ACCA|AKIA|ASIA)[0-9A-Z]{16}", 32),
    ("aws.{0,20}?(?:key|pwd|pw|password|pass|token).{0,20}?[\\'\\\"]([0-9a-zA-Z/+]{40})[\\'\\\"]", 34),
    ("AccountKey=[a-zA-Z0-9+\\/=]{88}", 32),
    ("[MNO][a-zA-Z\\d_-]{23,25}\\.[a-zA-Z\\d_-]{6}\\.[a-zA-Z\\d_-]{27}", 32),
    ("(ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9_]{36}", 32),
    ("(glpat|gldt|glft|glsoat|glrt)-[A-Za-z0-9_\\-]{20,50}(?!\\w)", 32),
    ("GR1348941[A-Za-z0-9_\\-]{20,50}(?!\\w)", 32),
    ("glcbt-([0-9a-fA-F]{2}_)?[A-Za-z0-9_\\-]{20,50}(?!\\w)", 32),
    ("glimt-[A-Za-z0-9_\\-]{25}(?!\\w)", 32),
    ("glptt-[A-Za-z0-9_\\-]{40}(?!\\w)", 32),
    ("glagent-[A-Za-z0-9_\\-]{50,1024}(?!\\w)", 32),
    ("gloas-[A-Za-z0-9_\\-]{64}(?!\\w)", 32),
    ("[0-9a-z]{32}-us[0-9]{1,2}", 32),
    ("\\/\\/.+\\/:_authToken=\\s*((npm_.+)|([A-Fa-f0-9-]{36})).*", 32),
    ("sk-[A-Za-z0-9-_]*[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20}", 32),
    ("pypi-AgEIcHlwaS5vcmc[A-Za-z0-9-_]{70,}", 32),
    ("pypi-AgENdGVzdC5weXBpLm9yZw[A-Za-z0-9-_]{70,}", 32),
    ("SG\\.[a-zA-Z0-9_-]{22}\\.[a-zA-Z0-9_-]{43}", 32),
    ("xox(?:a|b|p|o|s|r)-(?:\\d+-)+[a-z0-9]+", 34),
    ("https://hooks\\.slack\\.com/services/T[a-zA-Z0-9_]+/B[a-zA-Z0-9_]+/[a-zA-Z0-9_]+", 98),
    ("sq0csp-[0-9A-Za-z\\\\\\-_]{43}", 32),
    ("(?:r|s)k_live_[0-9a-zA-Z]{24}", 32),
    ("\\d{8,10}:[0-9A-Za-z_-]{35}", 32),
    ("AC[a-z0-9]{32}", 32),
    ("SK[a-z0-9]{32}", 32),
)
