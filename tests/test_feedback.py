"""User feedback written after export: sent into the run's trace once per change, and counted once,
on a real MariaDB and the test's OTLP receiver."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections import Counter

import requests
from helpers import (
    DaemonProcess,
    add_runs,
    attrs,
    bridge_sections,
    feedback_spans,
    rate,
    run_cli,
    set_old,
    write_config,
)
from servers import Receiver, free_port, wait_for


def test_feedback_given_after_export_joins_the_run_trace_once_per_change(agent_db, tmp_path):
    receiver = Receiver()
    receiver.start()
    try:
        traces = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 10 MINUTE"] * 6)
        run_ids = [f"run-{uuid.UUID(t)}" for t in traces]
        rated_before = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 10 MINUTE"])
        rate(agent_db, [f"run-{uuid.UUID(rated_before[0])}"], "UP")
        config = str(write_config(tmp_path / "c.toml", bridge_sections(agent_db, tmp_path, f"http://{receiver.endpoint}")))
        first = run_cli("once", "--config", config)
        assert first.returncode == 0, first.stderr
        # Rated before its export: the root span carries it, and no feedback span follows.
        assert "feedback: 1 rated runs in the window, 0 new or changed sent" in first.stdout, first.stdout
        roots = [span for _r, _s, span in receiver.spans() if not span.parent_span_id]
        assert len(roots) == 7 and not feedback_spans(receiver)
        assert [attrs(r).get("diagnosis.run.feedback") for r in roots].count("UP") == 1

        rate(agent_db, run_ids[:3], "DOWN")
        rate(agent_db, run_ids[3:5], "UP")
        second = run_cli("once", "--config", config)
        assert "feedback: 6 rated runs in the window, 5 new or changed sent" in second.stdout, second.stdout
        spans = feedback_spans(receiver)
        assert len(spans) == 5
        for span in spans:
            a = attrs(span)
            run_id = a["diagnosis.run.id"]
            assert span.trace_id.hex() == uuid.UUID(run_id.removeprefix("run-")).hex
            assert span.parent_span_id == hashlib.sha256(f"run:{run_id}".encode()).digest()[:8]
            assert a["gen_ai.evaluation.name"] == "user_feedback"
            assert a["gen_ai.evaluation.score.value"] == {"DOWN": 0.0, "UP": 1.0}[a["gen_ai.evaluation.score.label"]]
            assert a["gen_ai.evaluation.score.label"] == ("DOWN" if run_id in run_ids[:3] else "UP")

        # Nothing changed: nothing is sent again.
        third = run_cli("once", "--config", config)
        assert "6 rated runs in the window, 0 new or changed sent" in third.stdout
        assert len(feedback_spans(receiver)) == 5

        # A changed rating is a new span (another id) in the same trace.
        rate(agent_db, run_ids[:1], "UP")
        fourth = run_cli("once", "--config", config)
        assert "1 new or changed sent" in fourth.stdout
        spans = feedback_spans(receiver)
        assert len(spans) == 6
        changed = [s for s in spans if attrs(s)["diagnosis.run.id"] == run_ids[0]]
        assert len({s.span_id for s in changed}) == 2 and len({s.trace_id for s in changed}) == 1
    finally:
        receiver.stop()


def test_feedback_outside_the_window_or_on_an_agent_without_feedback_costs_only_the_recheck(agent_db, tmp_path):
    receiver = Receiver()
    receiver.start()
    try:
        old = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 3 HOUR"] * 2)
        add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 10 MINUTE"] * 2)
        sections = bridge_sections(agent_db, tmp_path, f"http://{receiver.endpoint}", feedback={"window_seconds": 3600})
        config = str(write_config(tmp_path / "c.toml", sections))
        assert run_cli("once", "--config", config).returncode == 0
        rate(agent_db, [f"run-{uuid.UUID(t)}" for t in old], "DOWN")
        done = run_cli("once", "--config", config)
        assert "feedback: 0 rated runs in the window, 0 new or changed sent" in done.stdout, done.stdout
        assert not feedback_spans(receiver)
    finally:
        receiver.stop()


def feedback_total(port: int) -> float:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("diagnosis_run_feedback_total{"))


def test_a_crash_before_the_ack_resends_the_feedback_and_counts_it_once(agent_db, tmp_path):
    receiver = Receiver()
    receiver.start()
    add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 10 MINUTE"] * 4)
    set_old(agent_db)
    port = free_port()
    sections = bridge_sections(
        agent_db,
        tmp_path,
        f"http://{receiver.endpoint}",
        feedback={"interval_seconds": 1},
        metrics={"enabled": True, "port": port},
        export={"max_attempts": 1},
    )
    config = write_config(tmp_path / "c.toml", sections)
    daemon = DaemonProcess(config, tmp_path / "first.log")
    try:
        wait_for(lambda: len(receiver.spans()) == 4, 30, "the runs exported")
        receiver.hold_after = len(receiver.requests)  # the next request, the feedback, is never answered
        # One statement: a pass (every second) must not see only some of the ratings.
        agent_db.execute("UPDATE diagnosis_run SET feedback = 'DOWN', updated_at = NOW()")
        wait_for(receiver.holding.is_set, 30, "the feedback request to be held")
        assert len(feedback_spans(receiver)) == 4  # the precondition: it really was delivered, unacknowledged
        assert feedback_total(port) == 0  # and nothing is counted before the acknowledgement
        daemon.kill()
        receiver.release()

        daemon = DaemonProcess(config, tmp_path / "second.log")
        wait_for(lambda: len(feedback_spans(receiver)) == 8, 30, "the feedback sent again after the restart")
        wait_for(lambda: feedback_total(port) == 4, 30, "the feedback counted")
        spans = feedback_spans(receiver)
        assert set(Counter(s.span_id for s in spans).values()) == {2}  # the same four spans, twice
        # Later passes (every second) find nothing new: no third copy, no second count.
        time.sleep(3)
        assert len(feedback_spans(receiver)) == 8 and feedback_total(port) == 4
        assert "feedback_total" not in daemon.output()
    finally:
        daemon.terminate()
        receiver.stop()


def test_a_rating_is_also_a_gen_ai_evaluation_result_log_record_on_the_root_span(agent_db, tmp_path):
    receiver = Receiver(logs=True)
    receiver.start()
    try:
        (trace,) = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 10 MINUTE"])
        run_id = f"run-{uuid.UUID(trace)}"
        sections = bridge_sections(agent_db, tmp_path, f"http://{receiver.endpoint}", feedback={"log_records": True})
        config = str(write_config(tmp_path / "c.toml", sections))
        assert run_cli("once", "--config", config).returncode == 0
        assert receiver.log_requests == []  # nothing rated yet: no record
        agent_db.execute(
            "UPDATE diagnosis_run SET feedback = 'DOWN', updated_at = '2031-05-06 07:08:09' WHERE run_id = %s", run_id
        )
        done = run_cli("once", "--config", config)
        assert "1 new or changed sent" in done.stdout, done.stdout
        assert "not accepted" not in done.stderr
        (request,) = receiver.log_requests
        (resource_logs,) = request.resource_logs
        (scope_logs,) = resource_logs.scope_logs
        (record,) = scope_logs.log_records
        assert record.event_name == "gen_ai.evaluation.result"
        assert record.trace_id.hex() == trace
        assert record.span_id == hashlib.sha256(f"run:{run_id}".encode()).digest()[:8]
        assert record.time_unix_nano == 1_935_817_689 * 10**9  # 2031-05-06T07:08:09Z, when it was rated
        assert attrs(record) == {
            "gen_ai.evaluation.name": "user_feedback",
            "gen_ai.evaluation.score.label": "DOWN",
            "gen_ai.evaluation.score.value": 0.0,
            "diagnosis.run.id": run_id,
        }
        assert (scope_logs.scope.name, scope_logs.schema_url) == ("run_otel", "https://opentelemetry.io/schemas/gen-ai/0.1.0")
        assert {kv.key: kv.value.string_value for kv in resource_logs.resource.attributes}["service.name"] == "diagnosis-agent"
    finally:
        receiver.stop()
