"""Feedback written in a vocabulary other than UP/DOWN, on MariaDB: the defaults map the
common ones (any case), the negative ones reach the alert's labels, a value the config
does not map is warned about once by the daemon and named with its count by `check`."""

from __future__ import annotations

import logging
import re
import uuid

from helpers import add_runs, attrs, bridge_config, feedback_spans, rate
from prometheus_client import generate_latest

from run_otel.config import FeedbackConfig
from run_otel.factory import build_feedback, build_metrics, build_parts, build_poller
from run_otel.generate.alerts import negative_feedback_rule
from run_otel.ops.check import WARN, run_checks

RATINGS = {
    "LIKE": "LIKE",
    "dislike": "DISLIKE",
    "thumbs-down": "THUMBS_DOWN",
    "Thumbs Up": "THUMBS_UP",
    "negative": "NEGATIVE",
    "0": "0",
    "Unhelpful": "UNHELPFUL",
}
UNMAPPED = ["meh", "meh", "LOL"]


def rated_runs(agent_db, values: list[str]) -> None:
    traces = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 10 MINUTE"] * len(values))
    for trace, value in zip(traces, values):
        rate(agent_db, [f"run-{uuid.UUID(trace)}"], value)


def feedback_counts(metrics) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        match = re.match(r'diagnosis_run_feedback_total\{.*feedback="([^"]*)".*\} (\S+)', line)
        if match:
            counts[match.group(1)] = counts.get(match.group(1), 0) + int(float(match.group(2)))
    return {label: count for label, count in counts.items() if count}  # every label's series is there, at 0 until rated


def test_common_vocabularies_are_mapped_and_reach_the_alert(agent_db, receiver, tmp_path, caplog):
    values = [*RATINGS, *UNMAPPED]
    traces = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 10 MINUTE"] * len(values))
    config = bridge_config(agent_db, tmp_path, receiver.endpoint)
    metrics = build_metrics(config)
    parts = build_parts(config, recorder=metrics)
    build_poller(parts).poll()
    for trace, value in zip(traces, values):  # rated after the export: sent by the feedback pass
        rate(agent_db, [f"run-{uuid.UUID(trace)}"], value)
    feedback = build_feedback(parts)
    with caplog.at_level(logging.WARNING):
        feedback.run()
        feedback.run()  # a second pass over the same values warns no more
    counts = feedback_counts(metrics)
    assert counts == {**{label: 1 for label in RATINGS.values()}, "other": 3}
    # The negative ones are labels the shipped alert's regex matches.
    regex = re.search(r'feedback=~"([^"]+)"', negative_feedback_rule(FeedbackConfig().negative)["expr"]).group(1)
    assert {label for label in counts if re.fullmatch(regex, label)} == {"DISLIKE", "THUMBS_DOWN", "NEGATIVE", "0", "UNHELPFUL"}
    scores = {
        attrs(s)["gen_ai.evaluation.score.label"]: attrs(s).get("gen_ai.evaluation.score.value") for s in feedback_spans(receiver)
    }
    assert (
        scores["dislike"] == 0.0 and scores["Thumbs Up"] == 1.0 and "gen_ai.evaluation.score.value" not in str(scores.get("meh"))
    )
    warnings = [r.getMessage() for r in caplog.records if "matches no label" in r.getMessage()]
    assert sorted(w.split("'")[1] for w in warnings) == ["LOL", "meh"]


def test_check_names_the_unmapped_values_with_counts(agent_db, receiver, tmp_path):
    config = bridge_config(agent_db, tmp_path, receiver.endpoint)
    rated_runs(agent_db, ["UP", "like"])
    before = {f.what: f for f in run_checks(config)}["feedback values"]
    assert before.level != WARN and "2 rated run(s)" in before.detail
    rated_runs(agent_db, UNMAPPED)
    finding = {f.what: f for f in run_checks(config)}["feedback values"]
    assert finding.level == WARN
    assert "3 of 5 rated run(s) in the last 24h" in finding.detail
    assert finding.detail.endswith("'meh' (2), 'LOL' (1)")


def test_a_value_matches_its_label_whatever_the_case_and_separator():
    config = FeedbackConfig()
    assert [config.label_of(v) for v in ("up", " Thumbs-Down ", "thumbs down", "DisLike", "1", "meh", None)] == [
        "UP",
        "THUMBS_DOWN",
        "THUMBS_DOWN",
        "DISLIKE",
        "1",
        None,
        None,
    ]
    custom = FeedbackConfig(scores={"Accepted": 1.0, "rejected": 0.0}, negative=["REJECTED"])
    assert custom.label_of("REJECTED") == "REJECTED" and custom.score_of("Rejected") == 0.0 and custom.label_of("up") is None
