"""The alert rules under Debian's promtool: each fires on a sustained breach and stays
silent on low traffic and on a spike shorter than its `for:`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "config" / "prometheus" / "alerts.yml"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

RUNS = 'diagnosis_runs_total{{status="{status}",intent="DIAGNOSIS",release_outcome="{status}"}}'
LABELS = '{}{{job="run-otel",instance="{}"}}'
BACKLOG = 'run_otel_backlog_runs{job="run-otel",instance="a:9464",shard="default"}'
TOOLS = 'diagnosis_tool_invocations_total{{tool_name="{tool}",retrieval_layer="L0",relevance_level="PRECISE",success="{ok}"}}'


def runs(success: str, other_status: str, other: str) -> list[dict]:
    return [
        {"series": RUNS.format(status="SUCCESS"), "values": success},
        {"series": RUNS.format(status=other_status), "values": other},
    ]


def tools(tool: str, ok: str, failed: str) -> list[dict]:
    return [
        {"series": TOOLS.format(tool=tool, ok="true"), "values": ok},
        {"series": TOOLS.format(tool=tool, ok="false"), "values": failed},
    ]


# (alert, case, input series, eval time, expected: list of (extra labels, summary))
SCENARIOS = [
    # 8 ok + 2 failed a minute: 20% for an hour.
    ("DiagnosisRunFailureRateHigh", "sustained breach", runs("0+8x60", "FAILED", "0+2x60"), "40m",
     [({"severity": "page"}, "20% of diagnosis runs failed over 10m")]),
    # the same 50% share, but 1 run a minute: under the 20-runs-per-10m guard.
    ("DiagnosisRunFailureRateHigh", "low traffic", runs("0+0.5x60", "FAILED", "0+0.5x60"), "40m", []),
    # 40 failures in two minutes: over the ratio for ~11 minutes, under `for: 15m`.
    ("DiagnosisRunFailureRateHigh", "short spike", runs("0+10x60", "FAILED", "0x20 20 40 40x37"), "30m", []),
    ("DiagnosisRunFailureRateHigh", "healthy", runs("0+10x60", "FAILED", "0+0.2x60"), "40m", []),
    ("DiagnosisRunFallbackRateHigh", "sustained breach", runs("0+6x60", "FALLBACK", "0+4x60"), "40m",
     [({"severity": "ticket"}, "40% of diagnosis runs fell back over 10m")]),
    ("DiagnosisRunFallbackRateHigh", "low traffic", runs("0+0.5x60", "FALLBACK", "0+0.5x60"), "40m", []),
    ("DiagnosisRunFallbackRateHigh", "short spike", runs("0+10x60", "FALLBACK", "0x20 30 60 60x37"), "30m", []),
    ("DiagnosisToolErrorRateHigh", "sustained breach", tools("query_logs", "0+5x60", "0+5x60") + tools("lookup_knowledge", "0+10x60", "0x60"), "40m",
     [({"severity": "ticket", "tool_name": "query_logs"}, "Tool query_logs fails 50% of its calls")]),
    ("DiagnosisToolErrorRateHigh", "low traffic", tools("query_logs", "0+0.5x60", "0+0.5x60"), "40m", []),
    ("DiagnosisToolErrorRateHigh", "short spike", tools("query_logs", "0+10x60", "0x20 30 60 60x37"), "30m", []),
    # time() starts at 0 in promtool: a gauge that tracks it is a healthy bridge.
    ("RunOtelExportStalled", "sustained breach", [{"series": LABELS.format("run_otel_last_success_timestamp_seconds", "a:9464"), "values": "0+60x10 600x50"}], "25m",
     [({"severity": "page", "job": "run-otel", "instance": "a:9464"}, "run-otel a:9464 has not completed a poll for 15m 0s")]),
    # Up since 0 with a wrong password: never a success, so no last_success series at all.
    ("RunOtelExportStalled", "never succeeded", [
        {"series": LABELS.format("run_otel_start_timestamp_seconds", "a:9464"), "values": "0x40"},
        {"series": LABELS.format("run_otel_standby", "a:9464"), "values": "0x40"},
    ], "15m", [({"severity": "page", "job": "run-otel", "instance": "a:9464"}, "run-otel a:9464 has not completed a poll for 15m 0s")]),
    # Three shards; shard b stops succeeding at 10m. Only b fires.
    ("RunOtelExportStalled", "one stalled shard of three", [
        {"series": LABELS.format("run_otel_last_success_timestamp_seconds", "a:9464"), "values": "0+60x40"},
        {"series": LABELS.format("run_otel_last_success_timestamp_seconds", "b:9464"), "values": "0+60x10 600x30"},
        {"series": LABELS.format("run_otel_last_success_timestamp_seconds", "c:9464"), "values": "0+60x40"},
    ], "25m", [({"severity": "page", "job": "run-otel", "instance": "b:9464"}, "run-otel b:9464 has not completed a poll for 15m 0s")]),
    # An HA standby never polls: silent.
    ("RunOtelExportStalled", "standby", [
        {"series": LABELS.format("run_otel_start_timestamp_seconds", "s:9464"), "values": "0x40"},
        {"series": LABELS.format("run_otel_standby", "s:9464"), "values": "1x40"},
    ], "25m", []),
    ("RunOtelExportStalled", "healthy", [{"series": "run_otel_last_success_timestamp_seconds", "values": "0+60x60"}], "40m", []),
    ("RunOtelExportStalled", "short spike", [{"series": "run_otel_last_success_timestamp_seconds", "values": "0+60x10 600x7 1080+60x40"}], "25m", []),
    ("RunOtelBacklogGrowing", "sustained breach", [{"series": BACKLOG, "values": "0+50x60"}], "40m",
     [({"severity": "ticket", "job": "run-otel", "instance": "a:9464", "shard": "default"},
       "run-otel a:9464 shard default is 2000 runs behind and falling further")]),
    # Far behind but draining: no page for a backfill that is catching up.
    ("RunOtelBacklogGrowing", "draining", [{"series": BACKLOG, "values": "5000-50x60"}], "40m", []),
    ("RunOtelBacklogGrowing", "short spike", [{"series": BACKLOG, "values": "0x10 0+200x10 2000-200x10 0x30"}], "40m", []),
    ("RunOtelBacklogGrowing", "low", [{"series": BACKLOG, "values": "0+5x60"}], "40m", []),
    ("RunOtelDown", "sustained breach", [{"series": 'up{job="run-otel"}', "values": "1x10 0x30"}], "25m",
     [({"severity": "page", "job": "run-otel"}, "run-otel is down or not scraped")]),
    ("RunOtelDown", "never scraped", [{"series": 'up{job="other"}', "values": "1x30"}], "25m",
     [({"severity": "page", "job": "run-otel"}, "run-otel is down or not scraped")]),
    ("RunOtelDown", "short spike", [{"series": 'up{job="run-otel"}', "values": "1x10 0x2 1x30"}], "25m", []),
    ("RunOtelDown", "healthy", [{"series": 'up{job="run-otel"}', "values": "1x40"}], "25m", []),
    ("DiagnosisRunsStuckPending", "sustained breach", [{"series": "run_otel_pending_runs", "values": "150x60"}], "40m",
     [({"severity": "ticket"}, "150 diagnosis runs have been waiting to finish")]),
    ("DiagnosisRunsStuckPending", "short spike", [{"series": "run_otel_pending_runs", "values": "5x10 150x10 5x40"}], "40m", []),
    ("DiagnosisRunsStuckPending", "low", [{"series": "run_otel_pending_runs", "values": "50x60"}], "40m", []),
]


def _descriptions() -> dict[str, str]:
    rules = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r["annotations"]["description"] for g in rules["groups"] for r in g["rules"]}


def _test_file(tmp_path: Path) -> Path:
    descriptions = _descriptions()
    tests = []
    for alert, _case, series, at, expected in SCENARIOS:
        exp = []
        for labels, summary in expected:
            description = descriptions[alert].replace("{{ $labels.tool_name }}", labels.get("tool_name", ""))
            exp.append({"exp_labels": labels, "exp_annotations": {"summary": summary, "description": description}})
        tests.append(
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": exp}],
            }
        )
    path = tmp_path / "alerts_test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests}))
    return path


def test_rules_pass_promtool_check():
    done = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 7 rules found" in done.stdout


def test_every_alert_fires_and_stays_silent_under_promtool(tmp_path):
    done = subprocess.run([PROMTOOL, "test", "rules", str(_test_file(tmp_path))], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_firing_and_a_silent_case():
    alerts = set(_descriptions())
    assert alerts == {
        "DiagnosisRunFailureRateHigh",
        "DiagnosisRunFallbackRateHigh",
        "DiagnosisToolErrorRateHigh",
        "RunOtelExportStalled",
        "RunOtelDown",
        "RunOtelBacklogGrowing",
        "DiagnosisRunsStuckPending",
    }
    for alert in alerts:
        cases = [s for s in SCENARIOS if s[0] == alert]
        assert any(s[4] for s in cases), f"{alert} never fires"
        assert any(not s[4] for s in cases), f"{alert} is never silent"
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
                "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": [{"eval_time": "12m", "alertname": alert, "exp_alerts": []}]}],
            }
        )
    )
    done = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True)
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
                "tests": [{"interval": "1m", "input_series": firing[2], "alert_rule_test": [{"eval_time": firing[3], "alertname": alert, "exp_alerts": []}]}],
            }
        )
    )
    done = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode != 0
