"""Writes the generated artefacts: what `run-otel generate` writes with the default config
(dashboards/*.json, config/prometheus/alerts.yml and its promtool tests, docs/runbook.md), the
compose stack's demo workload, deploy/mysql/03-demo-workload.sql, the reference table in
docs/configuration.md, and the copy of detect-secrets' provider patterns in
src/run_otel/mapping/provider_patterns.py.

    .venv/bin/python scripts/generate.py          # rewrite them
    .venv/bin/python scripts/generate.py --check  # exit 1 if any is stale

Dashboards and alerts come from src/run_otel/telemetry/instruments.py, so a metric
renamed there is renamed everywhere. The configuration reference comes from
src/run_otel/example.toml, what `run-otel config --example` prints (config/run-otel.toml
is a link to that file).
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Generate from this checkout's sources, whichever copy of run_otel is installed.
sys.path.insert(0, str(ROOT / "src"))

from run_otel.generate.artifacts import RULE_TESTS, RULES, RUNBOOK, artifacts
from run_otel.generate.config_reference import config_reference, splice
from run_otel.generate.stack import Stack
from run_otel.mapping.redaction import provider_patterns_module
from run_otel.ops.demo import generate, workload_sql

# A fixed anchor keeps the file stable; its times are written relative to NOW().
DEMO_ANCHOR = datetime(2026, 1, 1)
# Where `run-otel generate`'s files live in this repository.
PLACES = {RULES: "config/prometheus/alerts.yml", RULE_TESTS: "config/prometheus/alerts_test.yml", RUNBOOK: "docs/runbook.md"}


EXAMPLE = ROOT / "src" / "run_otel" / "example.toml"
CONFIGURATION_DOC = ROOT / "docs" / "configuration.md"


def configuration_doc() -> str:
    """docs/configuration.md with its reference table made from example.toml."""
    return splice(CONFIGURATION_DOC.read_text(encoding="utf-8"), config_reference(EXAMPLE.read_text(encoding="utf-8")))


def artefacts() -> dict[Path, str]:
    # The defaults of [generate] and [slo]: what `run-otel generate` writes with no config.
    files = {ROOT / PLACES.get(name, name): text for name, text in artifacts(Stack()).items()}
    files[ROOT / "deploy" / "mysql" / "03-demo-workload.sql"] = workload_sql(generate(42, 300, DEMO_ANCHOR), DEMO_ANCHOR)
    files[CONFIGURATION_DOC] = configuration_doc()
    files[ROOT / "src" / "run_otel" / "mapping" / "provider_patterns.py"] = provider_patterns_module()
    return files


def main() -> int:
    stale = []
    for path, text in artefacts().items():
        if "--check" in sys.argv:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"stale: {path.relative_to(ROOT)} (run scripts/generate.py)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
