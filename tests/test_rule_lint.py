"""The alert rules against the checks of Cloudflare's pint and the monitoring mixins'
conventions that apply to them, over the committed config/prometheus/alerts.yml."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from run_otel.generate.alerts import rules
from run_otel.telemetry import instruments as I

ROOT = Path(__file__).resolve().parent.parent
RUNBOOK = ROOT / "docs" / "runbook.md"

KIND = {i.prometheus: i.kind for i in I.ALL}
# A histogram's series are counters too.
COUNTERS = {name for name, kind in KIND.items() if kind == I.COUNTER} | {
    i.series(suffix) for i in I.ALL if i.kind == I.HISTOGRAM for suffix in ("_bucket", "_count", "_sum")
}
GAUGES = {name for name, kind in KIND.items() if kind == I.GAUGE}


def committed_rules() -> list[dict]:
    document = yaml.safe_load((ROOT / "config/prometheus/alerts.yml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def recording_rules() -> list[dict]:
    document = yaml.safe_load((ROOT / "config/prometheus/alerts.yml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"] if "record" in rule]


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors for the level-2 headings."""
    return {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^## (.+)$", markdown, re.M)}


def test_every_alert_has_a_mixin_severity_a_summary_and_a_description():
    for rule in committed_rules():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


def test_every_alert_links_its_runbook_section_and_a_dashboard():
    sections = anchors(RUNBOOK.read_text())
    boards = {f"/d/{board['uid']}" for board in (yaml.safe_load(p.read_text()) for p in (ROOT / "dashboards").glob("*.json"))}
    for rule in committed_rules():
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page.endswith("docs/runbook.md") and anchor in sections, rule["alert"]
        assert any(rule["annotations"]["dashboard_url"].endswith(board) for board in boards), rule["alert"]


def test_every_runbook_section_says_what_it_means_how_to_check_and_how_to_fix():
    text = RUNBOOK.read_text()
    body = dict(zip(re.findall(r"^## (.+)$", text, re.M), re.split(r"^## .+$", text, flags=re.M)[1:]))
    assert set(body) == {rule["alert"] for rule in committed_rules()}
    for alert, section in body.items():
        for part in ("**What it means.**", "**How to check.**", "**How to fix.**"):
            assert part in section, (alert, part)


def test_the_checkpoint_runbook_names_the_rewind():
    section = RUNBOOK.read_text().split("## RunOtelCheckpointAheadOfSource")[1]
    assert "run-otel rewind" in section and "--to-id" in section


def test_ratio_alerts_hold_for_a_while_and_group_by_job():
    ratios = [rule for rule in committed_rules() if " / " in rule["expr"]]
    assert len(ratios) >= 4
    for rule in ratios:
        assert rule.get("for"), rule["alert"]


def test_every_aggregation_keeps_the_job_label():
    for rule in committed_rules():
        expr = rule["expr"]
        assert not re.search(r"\b(sum|max|min|avg|count)\s*\(", expr), (rule["alert"], "aggregates away job")
        for grouping in re.findall(r"\b(?:sum|max|min|avg|count) by \(([^)]*)\)", expr):
            assert "job" in [g.strip() for g in grouping.split(",")], (rule["alert"], grouping)


def selectors(expr: str) -> list[tuple[str, str]]:
    """(metric, matchers) for every series selector in ``expr``."""
    return re.findall(r"\b([a-z_][a-z0-9_]*)\{([^}]*)\}", expr)


def test_every_series_is_selected_by_the_job():
    for rule in committed_rules():
        found = selectors(rule["expr"])
        assert found, rule["alert"]
        for metric, matchers in found:
            assert f'job="{I.JOB}"' in matchers, (rule["alert"], metric)


def test_the_job_selector_is_configurable():
    from run_otel.config import GenerateConfig
    from run_otel.generate.stack import Stack

    text = yaml.safe_dump(rules(Stack(GenerateConfig(job="bridge"))))
    assert 'job="run-otel"' not in text and text.count('job="bridge"') >= 11 + 7 + 2


def test_recording_rules_keep_the_job_and_select_it():
    records = recording_rules()
    assert [r["record"] for r in records] == [
        f"job:diagnosis_run_errors:ratio_rate{w}" for w in ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
    ]
    for rule in records:
        assert rule["expr"].count("sum by (job)") == 2, rule["record"]
        for _metric, matchers in selectors(rule["expr"]):
            assert f'job="{I.JOB}"' in matchers, rule["record"]


def test_rate_and_increase_only_over_counters_and_deriv_only_over_gauges():
    for rule in committed_rules():
        for function, metric in re.findall(r"\b(rate|increase|deriv)\(([a-z_][a-z0-9_]*)", rule["expr"]):
            assert metric in (GAUGES if function == "deriv" else COUNTERS), (rule["alert"], function, metric)


def test_no_regex_matcher_for_a_single_literal_value():
    for rule in committed_rules():
        for value in re.findall(r'=~"([^"]*)"', rule["expr"]):
            assert re.search(r"[|.*+?()\[\]\\]", value), (rule["alert"], value)
