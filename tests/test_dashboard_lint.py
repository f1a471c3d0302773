"""The generated dashboards against the rules of Grafana's dashboard-linter that apply to them,
and the mixins' conventions, honouring the linter's exclusion file ``dashboards/.lint``.

The linter is a Go module; these are its rules written as tests over the committed JSON.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from servers import promtool

from run_otel.telemetry import instruments as I

ROOT = Path(__file__).resolve().parent.parent
DATASOURCE_UIDS = {"$datasource", "${datasource}", "$prometheus_datasource", "${prometheus_datasource}"}
# Grafana's unit ids that these dashboards may use (a subset of the linter's list).
UNITS = {"short", "none", "percent", "percentunit", "s", "ms", "reqps", "ops", "cps", "bytes", "decbytes"}
METRICS = {i.prometheus for i in I.ALL} | {
    i.series(s) for i in I.ALL if i.kind == I.HISTOGRAM for s in ("_bucket", "_sum", "_count")
}
SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")


def boards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted((ROOT / "dashboards").glob("*.json"))}


def exclusions() -> dict:
    return yaml.safe_load((ROOT / "dashboards" / ".lint").read_text())["exclusions"]


def panels(board: dict) -> Iterator[dict]:
    for panel in board["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            if inner["type"] != "row":
                yield inner


def targets(board: dict) -> Iterator[tuple[dict, dict]]:
    for panel in panels(board):
        for target in panel.get("targets", []):
            yield panel, target


def variables(board: dict) -> dict[str, dict]:
    return {v["name"]: v for v in board["templating"]["list"]}


Finding = tuple[str, str, str]  # (dashboard title, panel title or "", message)


def excluded(rule: str, dashboard: str, panel: str, rules: dict) -> bool:
    if rule not in rules:
        return False
    entries = rules[rule].get("entries")
    return not entries or any(e["dashboard"] == dashboard and e.get("panel") in (None, panel) for e in entries)


def check(rule: str, findings: Callable[[dict], Iterator[Finding]], rules: dict | None = None) -> list[Finding]:
    """The findings of ``rule`` over every dashboard that the exclusion file does not excuse."""
    rules = exclusions() if rules is None else rules
    return [f for board in boards().values() for f in findings(board) if not excluded(rule, f[0], f[1], rules)]


# -- the linter's rules --------------------------------------------------------


def template_datasource(board: dict) -> Iterator[Finding]:
    sources = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    if not sources:
        yield board["title"], "", "no templated data source"
    for v in sources:
        names = {f"{v['query']}_datasource"} | ({"datasource"} if len(sources) == 1 else set())
        labels = {f"{v['query'].title()} data source"} | ({"Data source"} if len(sources) == 1 else set())
        if v["name"] not in names or v.get("label") not in labels:
            yield board["title"], "", f"data source variable {v['name']!r} labelled {v.get('label')!r}"


def template_label(name: str) -> Callable[[dict], Iterator[Finding]]:
    def findings(board: dict) -> Iterator[Finding]:
        v = variables(board).get(name)
        if v is None:
            yield board["title"], "", f"no {name} variable"
            return
        if v.get("datasource", {}).get("uid") not in DATASOURCE_UIDS or v["type"] != "query":
            yield board["title"], "", f"{name} is not a query on the templated data source"
        if v.get("label") != name.title() or not v.get("multi") or v.get("allValue") != ".+":
            yield board["title"], "", f"{name} should be labelled {name.title()}, multi-select, All = .+"

    return findings


def template_reload(board: dict) -> Iterator[Finding]:
    for v in board["templating"]["list"]:
        if v["type"] == "query" and v.get("refresh") != 2:
            yield board["title"], "", f"{v['name']} is not reloaded when the time range changes"


def panel_datasource(board: dict) -> Iterator[Finding]:
    for panel in panels(board):
        if panel.get("datasource", {}).get("uid") not in DATASOURCE_UIDS:
            yield board["title"], panel["title"], "not the templated data source"


def panel_title_description(board: dict) -> Iterator[Finding]:
    for panel in panels(board):
        if not panel.get("title", "").strip() or not panel.get("description", "").strip():
            yield board["title"], panel.get("title", ""), "missing a title or a description"


def panel_units(board: dict) -> Iterator[Finding]:
    for panel in panels(board):
        if panel["fieldConfig"]["defaults"].get("unit") not in UNITS:
            yield board["title"], panel["title"], f"unit {panel['fieldConfig']['defaults'].get('unit')!r}"


def target_rate_interval(board: dict) -> Iterator[Finding]:
    for panel, target in targets(board):
        for window in re.findall(r"\b(?:rate|irate|increase)\([^\[]*\[([^\]]+)\]", target["expr"]):
            if window != "$__rate_interval":
                yield board["title"], panel["title"], f"range [{window}] in {target['expr']}"


def target_matcher(label: str) -> Callable[[dict], Iterator[Finding]]:
    def findings(board: dict) -> Iterator[Finding]:
        for panel, target in targets(board):
            expr = target["expr"]
            bare = [m for m in METRICS | {"up"} if re.search(rf"\b{m}\b(?![{{_])", expr)]
            if bare:
                yield board["title"], panel["title"], f"selector without matchers: {bare}"
            for metric, matchers in SELECTOR.findall(expr):
                if f'{label}=~"${label}"' not in matchers:
                    yield board["title"], panel["title"], f'{metric} without {label}=~"${label}"'

    return findings


def target_counter_agg(board: dict) -> Iterator[Finding]:
    for panel, target in targets(board):
        expr = target["expr"]
        wrapped = len(re.findall(r"\b(?:rate|irate|increase)\(\s*[a-zA-Z_:][a-zA-Z0-9_:]*_total\{[^}]*\}\[", expr))
        if wrapped != len(re.findall(r"_total\{", expr)):
            yield board["title"], panel["title"], f"a counter outside rate/irate/increase: {expr}"


RULES = {
    "template-datasource-rule": template_datasource,
    "template-job-rule": template_label("job"),
    "template-instance-rule": template_label("instance"),
    "template-on-time-change-reload-rule": template_reload,
    "panel-datasource-rule": panel_datasource,
    "panel-title-description-rule": panel_title_description,
    "panel-units-rule": panel_units,
    "target-rate-interval-rule": target_rate_interval,
    "target-job-rule": target_matcher("job"),
    "target-instance-rule": target_matcher("instance"),
    "target-counter-agg-rule": target_counter_agg,
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_dashboards_pass_the_linter_rule(rule):
    assert not check(rule, RULES[rule])


def test_every_exclusion_has_a_reason_and_still_excuses_something():
    rules = exclusions()
    assert set(rules) <= set(RULES) | {"target-promql-rule"}
    for rule, exclusion in rules.items():
        assert exclusion.get("reason", "").strip(), rule
        unexcused = check(rule, RULES[rule], {})
        for entry in exclusion.get("entries", []):
            assert any(f[0] == entry["dashboard"] and entry.get("panel") in (None, f[1]) for f in unexcused), (rule, entry)


def test_the_rules_catch_what_they_are_for():
    """Each rule run over a dashboard that breaks it: the checks are not vacuous."""
    board = {
        "title": "bad",
        "templating": {"list": [{"type": "query", "name": "job", "refresh": 1, "datasource": {"uid": "x"}}]},
        "panels": [
            {
                "type": "timeseries",
                "title": "t",
                "datasource": {"uid": "prometheus"},
                "fieldConfig": {"defaults": {}},
                "targets": [{"expr": 'sum(increase(run_otel_export_failures_total[1h])) + run_otel_rejected_spans_total{x="1"}'}],
            }
        ],
    }
    for rule, findings in RULES.items():
        assert list(findings(board)), rule


# -- target-promql-rule: promtool parses every query ---------------------------


def filled(expr: str) -> str:
    for name, value in (
        ("$__rate_interval", "1m"),
        ("$__range", "10m"),
        ("$job", ".+"),
        ("$instance", ".+"),
        ("$shard", ".+"),
        ("$intent", ".+"),
    ):
        expr = expr.replace(name, value)
    return expr


@pytest.mark.server
def test_every_query_parses(tmp_path):
    exprs = [filled(t["expr"]) for board in boards().values() for _p, t in targets(board)]
    assert "$" not in "".join(exprs)
    path = tmp_path / "queries.yml"
    path.write_text(
        yaml.safe_dump(
            {"groups": [{"name": "dashboards", "rules": [{"record": f"q:{i}", "expr": e} for i, e in enumerate(exprs)]}]}
        )
    )
    done = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# -- the mixins' conventions ---------------------------------------------------


def test_provisioned_dashboards_are_read_only_with_a_shared_crosshair():
    for name, board in boards().items():
        assert board["editable"] is False, name
        assert board["graphTooltip"] >= 1, name


def test_no_panel_leaves_the_24_column_grid():
    for name, board in boards().items():
        for panel in board["panels"]:
            grid = panel["gridPos"]
            assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, (name, panel["title"], grid)


def test_every_stat_has_thresholds_and_the_alerting_ones_turn_red_at_the_alert():
    from run_otel.generate.alerts import THRESHOLDS

    stats = {p["title"]: p for board in boards().values() for p in panels(board) if p["type"] == "stat"}
    assert len(stats) >= 10
    for title, stat in stats.items():
        steps = stat["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert steps[0]["value"] is None, title

    def red_at(title: str) -> float:
        return next(s["value"] for s in stats[title]["fieldConfig"]["defaults"]["thresholds"]["steps"] if s["color"] == "red")

    assert red_at("Failure rate") == THRESHOLDS["run_failure_ratio"]
    assert red_at("Fallback rate") == THRESHOLDS["run_fallback_ratio"]
    assert red_at("Since last successful poll") == THRESHOLDS["stall_seconds"]
    assert red_at("Pending runs") == THRESHOLDS["pending_runs"]
    assert red_at("Longest pending run") == THRESHOLDS["stuck_seconds"]
    assert red_at("Runs sent incomplete") == 1
    assert red_at("Checkpoint ahead of the source") == 1


def test_no_regex_matcher_for_a_single_value():
    for board in boards().values():
        for panel, target in targets(board):
            for value in re.findall(r'=~"([^"]*)"', target["expr"]):
                assert value.startswith("$") or re.search(r"[|.*+?()\[\]\\]", value), (panel["title"], value)


def test_health_dashboard_selects_job_instance_and_shard():
    board = boards()["exporter-health.json"]
    assert {"job", "instance", "shard"} <= set(variables(board))
    shard_metrics = {i.prometheus for i in I.ALL if "shard" in i.labels}
    for panel, target in targets(board):
        for metric, matchers in SELECTOR.findall(target["expr"]):
            if metric in shard_metrics:
                assert 'shard=~"$shard"' in matchers, (panel["title"], metric)
