"""`run-otel generate DIR`: the files it writes are the committed ones with the defaults, and follow
the [generate] and [slo] sections of the config otherwise."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from servers import promtool

from run_otel.cli.main import cli
from run_otel.config import ConfigError, build_config
from run_otel.generate.artifacts import artifacts
from run_otel.generate.stack import stack_of

ROOT = Path(__file__).resolve().parent.parent
# Where each file `generate` writes is committed in this repository.
COMMITTED = {
    "dashboards/diagnosis-runs.json": "dashboards/diagnosis-runs.json",
    "dashboards/rag-retrieval.json": "dashboards/rag-retrieval.json",
    "dashboards/exporter-health.json": "dashboards/exporter-health.json",
    "prometheus/alerts.yml": "config/prometheus/alerts.yml",
    "prometheus/alerts_test.yml": "config/prometheus/alerts_test.yml",
    "runbook.md": "docs/runbook.md",
}

CUSTOM = """
[slo]
objective = 0.99
window_days = 28

[generate]
job = "diagnosis-bridge"
runbook_url = "https://git.example.com/ops/run-otel/runbook.md"
grafana_url = "https://grafana.example.com/"
prometheus_datasource_uid = "prom-main"
tempo_datasource_uid = "tempo-main"
jaeger_datasource_uid = "jaeger-prod"
thresholds = { run_failure_ratio = 0.2, stall_seconds = 600 }
"""


def _generate(tmp_path: Path, config_text: str | None) -> tuple[Path, object]:
    out = tmp_path / "out"
    args = ["generate", str(out)]
    if config_text is not None:
        config = tmp_path / "run-otel.toml"
        config.write_text(config_text)
        args = ["generate", "--config", str(config), str(out)]
    result = CliRunner().invoke(cli, args)
    return out, result


def test_with_no_config_it_writes_the_committed_files(tmp_path):
    out, result = _generate(tmp_path, None)
    assert result.exit_code == 0, result.output
    written = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert written == set(COMMITTED)
    for name, committed in COMMITTED.items():
        assert (out / name).read_text() == (ROOT / committed).read_text(), name


def test_the_generate_section_reaches_every_file(tmp_path):
    out, result = _generate(tmp_path, CUSTOM)
    assert result.exit_code == 0, result.output
    alerts = (out / "prometheus/alerts.yml").read_text()
    assert 'job="run-otel"' not in alerts and 'job="diagnosis-bridge"' in alerts
    rules = [r for g in yaml.safe_load(alerts)["groups"] for r in g["rules"] if "alert" in r]
    assert all(r["annotations"]["runbook_url"].startswith("https://git.example.com/ops/run-otel/runbook.md#") for r in rules)
    assert all(r["annotations"]["dashboard_url"].startswith("https://grafana.example.com/d/run-otel-") for r in rules)
    failure = next(r for r in rules if r["alert"] == "DiagnosisRunFailureRateHigh")
    assert "> 0.2\n" in failure["expr"]
    # 1 - 0.99 = 0.01 of runs may fail: the page is at 14.4 times that.
    burn = next(r for r in rules if r["alert"] == "DiagnosisRunErrorBudgetBurn" and r["labels"]["severity"] == "critical")
    assert "> (14.4 * 0.01)" in burn["expr"] and "> (6 * 0.01)" in burn["expr"]
    runs = json.loads((out / "dashboards/diagnosis-runs.json").read_text())
    variables = {v["name"]: v for v in runs["templating"]["list"]}
    assert variables["prometheus_datasource"]["current"]["value"] == "prom-main"
    assert variables["tempo_datasource"]["current"]["value"] == "tempo-main"
    assert variables["job"]["current"]["value"] == "diagnosis-bridge"
    links = [link["url"] for p in runs["panels"] for link in p.get("links", [])]
    assert any("jaeger-prod" in url for url in links) and not any('"jaeger"' in url for url in links)
    stats = {p["title"]: p for p in runs["panels"] if p["type"] == "stat"}
    red = [s["value"] for s in stats["Failure rate"]["fieldConfig"]["defaults"]["thresholds"]["steps"] if s["color"] == "red"]
    assert red == [0.2]
    assert "over the last 28 days" in stats["Error budget remaining"]["description"]
    runbook = (out / "runbook.md").read_text()
    assert "More than 20% of the agent's finished runs ended `FAILED`" in runbook
    assert "for 10 minutes, or never" in runbook and "that 99% of finished runs" in runbook


def test_a_relative_runbook_or_a_local_grafana_is_warned_about(tmp_path):
    _out, result = _generate(tmp_path, None)
    assert "warning: generate.runbook_url is 'docs/runbook.md', a relative link" in result.output
    assert "warning: generate.grafana_url is 'http://localhost:3000'" in result.output
    _out, result = _generate(tmp_path, CUSTOM)
    assert "warning:" not in result.output


@pytest.mark.server
def test_the_tests_it_writes_pass_promtool_with_the_job_and_objective_changed(tmp_path):
    """The alert tests follow the job; those sitting on a changed threshold are named, not run."""
    out, result = _generate(tmp_path, CUSTOM.replace("objective = 0.99", "objective = 0.95"))
    assert result.exit_code == 0, result.output
    tests = (out / "prometheus/alerts_test.yml").read_text()
    assert "# Not tested here: the built-in cases of DiagnosisRunFailureRateHigh, RunOtelExportStalled" in tests
    assert "DiagnosisRunErrorBudgetBurn" not in tests.partition("\n\n")[0].splitlines()[2]
    names = [t["name"] for t in yaml.safe_load(tests)["tests"]]
    assert any(n.startswith("DiagnosisRunErrorBudgetBurn: fast burn pages") for n in names)
    assert not any(n.startswith("DiagnosisRunFailureRateHigh") for n in names)
    done = subprocess.run(
        [promtool(), "test", "rules", "alerts_test.yml"], capture_output=True, text=True, cwd=out / "prometheus"
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"generate": {"thresholds": {"run_failure": 0.1}}}, "generate.thresholds: unknown threshold 'run_failure'"),
        (
            {"generate": {"thresholds": {"run_failure_ratio": 10}}},
            "generate.thresholds.run_failure_ratio must be between 0 and 1",
        ),
        ({"generate": {"thresholds": {"min_runs": 2.5}}}, "generate.thresholds.min_runs counts whole"),
        ({"generate": {"job": 'a"b'}}, "generate.job must be a Prometheus job name"),
        ({"slo": {"objective": 95}}, "slo.objective is the share of runs that must not fail, between 0 and 1, got 95"),
        ({"slo": {"window_days": 0}}, "slo.window_days must be greater than 0"),
        ({"generate": {"trace_stores": ["zipkin"]}}, "generate.trace_stores: unknown trace store 'zipkin'"),
    ],
)
def test_bad_generate_and_slo_values_are_refused_with_the_key(section, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        build_config(section)


def test_a_threshold_table_keeps_the_thresholds_it_does_not_name():
    config = build_config({"generate": {"thresholds": {"pending_runs": 250}}})
    assert config.generate.thresholds["pending_runs"] == 250 and isinstance(config.generate.thresholds["pending_runs"], int)
    assert config.generate.thresholds["run_failure_ratio"] == 0.1


BURN_CASES = [
    "fast burn pages",
    "steady rate inside the budget",
    "slow burn tickets",
    "short spike",
    "page clears after the burn stops",
]


def _burn_cases(objective: float) -> tuple[str, list[str]]:
    config = build_config({"slo": {"objective": objective}})
    written = artifacts(stack_of(config.generate, config.slo, config.feedback))["prometheus/alerts_test.yml"]
    names = [t["name"] for t in yaml.safe_load(written)["tests"]]
    return written, sorted(
        n.removeprefix("DiagnosisRunErrorBudgetBurn: ") for n in names if n.startswith("DiagnosisRunErrorBudgetBurn")
    )


@pytest.mark.parametrize("objective", [0.94, 0.95, 0.97, 0.99, 0.999])
def test_every_objective_that_can_page_gets_every_burn_rate_case(objective):
    written, cases = _burn_cases(objective)
    assert cases == sorted(BURN_CASES), cases
    assert "Not tested here" not in written.splitlines()[2]


def test_an_objective_that_can_never_page_keeps_the_cases_that_still_mean_something():
    _written, cases = _burn_cases(0.9)  # 14.4 times a 10% budget is more than every run
    assert cases == sorted(["steady rate inside the budget", "slow burn tickets", "short spike"])


@pytest.mark.server
@pytest.mark.parametrize("objective", [0.9, 0.94, 0.99, 0.999])
def test_the_burn_rate_cases_pass_promtool_for_another_objective(tmp_path, objective):
    out, result = _generate(tmp_path, f"[slo]\nobjective = {objective}\n")
    assert result.exit_code == 0, result.output
    tests = yaml.safe_load((out / "prometheus/alerts_test.yml").read_text())["tests"]
    assert any(t["name"].startswith("DiagnosisRunErrorBudgetBurn: slow burn tickets") for t in tests)
    done = subprocess.run(
        [promtool(), "test", "rules", "alerts_test.yml"], capture_output=True, text=True, cwd=out / "prometheus"
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_without_tempo_the_dashboards_have_no_tempo_variable_or_link(tmp_path):
    out, result = _generate(tmp_path, '[generate]\ntrace_stores = ["jaeger"]\n')
    assert result.exit_code == 0, result.output
    for name in ("diagnosis-runs.json", "rag-retrieval.json", "exporter-health.json"):
        text = (out / "dashboards" / name).read_text()
        board = json.loads(text)
        assert "tempo_datasource" not in {v["name"] for v in board["templating"]["list"]}, name
        assert "tempo" not in text.lower(), name
    runs = json.loads((out / "dashboards/diagnosis-runs.json").read_text())
    links = [link["title"] for p in runs["panels"] for link in p.get("links", [])]
    assert links and all(title == "Failed runs in Jaeger" for title in links), links
    # The committed dashboards, for the default of both stores, keep both.
    assert '"Failed runs in Tempo (TraceQL)"' in (ROOT / "dashboards/diagnosis-runs.json").read_text()


def test_an_objective_too_loose_for_the_fast_burn_is_warned_about():
    from run_otel.generate.stack import warnings

    config = build_config({"slo": {"objective": 0.9}})
    (line,) = [w for w in warnings(stack_of(config.generate, config.slo, config.feedback)) if w.startswith("slo.")]
    assert "the fastest burn can never page" in line
    assert artifacts(stack_of(config.generate, config.slo, config.feedback))  # still written


@pytest.mark.slow
def test_the_installed_wheel_generates_the_committed_files_with_no_checkout(tmp_path):
    """A wheel built from a fresh copy, installed as the README says (no extra) into a new virtualenv,
    run from an empty directory: the dashboards, rules, tests and runbook come from the wheel alone."""
    import os
    import sys

    from test_install import fresh_copy

    checkout = fresh_copy(tmp_path / "run-otel")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH") and not k.startswith("RUN_OTEL_")}
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(checkout)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "RUN_OTEL_PURE_PYTHON": "1"},
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("run_otel-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    installed = subprocess.run(
        [str(venv / "bin/pip"), "install", "-q", str(wheel)], capture_output=True, text=True, timeout=900, env=env
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    done = subprocess.run(
        [str(venv / "bin/run-otel"), "generate", "out"], cwd=empty, capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for name, committed in COMMITTED.items():
        assert (empty / "out" / name).read_text() == (ROOT / committed).read_text(), name
