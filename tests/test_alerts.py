"""The alert rules under Debian's promtool: each fires on a sustained breach and stays
silent on low traffic and on a spike shorter than its `for:`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from servers import promtool

from run_otel.generate.alert_cases import SCENARIOS as BUILT_IN
from run_otel.generate.slo_cases import slo_scenarios
from run_otel.generate.stack import Stack

SCENARIOS = BUILT_IN + slo_scenarios(Stack())

pytestmark = pytest.mark.server  # every test here runs promtool

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "config" / "prometheus" / "alerts.yml"


def _descriptions() -> dict[str, str]:
    rules = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r["annotations"]["description"] for g in rules["groups"] for r in g["rules"] if "alert" in r}


def _rule_count() -> int:
    return sum(len(g["rules"]) for g in yaml.safe_load(RULES.read_text())["groups"])


TESTS = ROOT / "config" / "prometheus" / "alerts_test.yml"


def test_rules_pass_promtool_check():
    done = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {_rule_count()} rules found" in done.stdout


def test_every_alert_fires_and_stays_silent_under_promtool():
    """The committed rule tests, as an SRE runs them: promtool test rules alerts_test.yml."""
    done = subprocess.run([promtool(), "test", "rules", TESTS.name], capture_output=True, text=True, cwd=TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


# Any span lost is worth a ticket at once: these fire on the first loss and have no `for:` to outlast.
ANY_LOSS = {"RunOtelSpansRejected", "RunOtelSpansDropped"}


def test_every_alert_has_a_firing_and_a_silent_case():
    alerts = set(_descriptions())
    assert alerts == {
        "DiagnosisRunFailureRateHigh",
        "DiagnosisRunFallbackRateHigh",
        "DiagnosisNegativeFeedbackHigh",
        "DiagnosisToolErrorRateHigh",
        "RunOtelExportStalled",
        "RunOtelDown",
        "RunOtelBacklogGrowing",
        "DiagnosisRunsStuckPending",
        "RunOtelSpansRejected",
        "RunOtelSpansDropped",
        "RunOtelCheckpointAheadOfSource",
        "DiagnosisRunErrorBudgetBurn",
    }
    for alert in alerts:
        cases = [s for s in SCENARIOS if s[0] == alert]
        assert any(s[4] for s in cases), f"{alert} never fires"
        assert any(not s[4] for s in cases), f"{alert} is never silent"
        if alert in ANY_LOSS:
            assert any(s[1] == "resolved" for s in cases), f"{alert} never resolves"
        else:
            assert any(s[1] == "short spike" for s in cases), f"{alert} has no spike shorter than for:"


def test_a_breach_is_not_firing_before_its_for(tmp_path):
    """The sustained failure breach, looked at 5 minutes in: pending, not firing."""
    alert, _case, series, _at, _expected = SCENARIOS[0]
    path = tmp_path / "early.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(RULES)],
                "evaluation_interval": "1m",
                "tests": [
                    {
                        "interval": "1m",
                        "input_series": series,
                        "alert_rule_test": [{"eval_time": "12m", "alertname": alert, "exp_alerts": []}],
                    }
                ],
            }
        )
    )
    done = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("alert", ["DiagnosisRunFailureRateHigh", "RunOtelDown"])
def test_promtool_would_catch_a_wrong_expectation(tmp_path, alert):
    """Guards the harness itself: a scenario expecting silence where the rule fires must fail."""
    firing = next(s for s in SCENARIOS if s[0] == alert and s[4])
    path = tmp_path / "wrong.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(RULES)],
                "evaluation_interval": "1m",
                "tests": [
                    {
                        "interval": "1m",
                        "input_series": firing[2],
                        "alert_rule_test": [{"eval_time": firing[3], "alertname": alert, "exp_alerts": []}],
                    }
                ],
            }
        )
    )
    done = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode != 0


def _run_counts(success: str, failed: str) -> list[dict]:
    labels = 'job="run-otel",instance="a:9464",intent="DIAGNOSIS"'
    return [
        {"series": f'diagnosis_runs_total{{{labels},status="{status}",release_outcome="{status}"}}', "values": values}
        for status, values in (("SUCCESS", success), ("FAILED", failed))
    ]


def test_a_burn_only_the_6h_and_30m_pair_sees_pages(tmp_path):
    """The SRE workbook's second page, 6x over 6h and 30m: 60% of runs failing (12x the default 5%
    budget, under the 14.4x of the first pair) for six hours, looked at 8 minutes after it stopped.
    The 30m window still holds the burn; a 5m one would not, so a pair of 6h and 5m stays silent."""

    def expect(expr: str, *samples: tuple[str, float]) -> dict:
        return {
            "expr": expr,
            "eval_time": "368m",
            "exp_samples": [{"labels": labels, "value": value} for labels, value in samples],
        }

    job = '{job="run-otel"}'
    path = tmp_path / "six_hours.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(RULES)],
                "evaluation_interval": "1m",
                "tests": [
                    {
                        "interval": "1m",
                        # 100 runs a minute: 60 failing for 360 minutes, then none.
                        "input_series": _run_counts("0+40x360 14400+100x10", "0+60x360 21600x10"),
                        "promql_expr_test": [
                            # The precondition: the first pair (14.4x over 1h and 5m) does not fire,
                            # and the last 5 minutes are under 6x.
                            expect("job:diagnosis_run_errors:ratio_rate1h < bool (14.4 * 0.05)", (job, 1)),
                            expect("job:diagnosis_run_errors:ratio_rate5m < bool (6 * 0.05)", (job, 1)),
                            expect(
                                'count by (severity) (ALERTS{alertname="DiagnosisRunErrorBudgetBurn", alertstate="firing"})',
                                ('{severity="critical"}', 1),
                                ('{severity="warning"}', 1),
                            ),
                        ],
                    }
                ],
            }
        )
    )
    done = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
