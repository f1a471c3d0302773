"""User feedback written after export: sent into the run's trace once per change, and counted once,
on a real MariaDB and the test's OTLP receiver."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections import Counter
from pathlib import Path

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
from servers import Prometheus, Receiver, free_port, wait_for

ROOT = Path(__file__).resolve().parent.parent


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
        # Rated before its export: the rating's span follows the run, and the root stays the unrated run's.
        assert "feedback: 1 rated runs in the window, 1 new or changed sent" in first.stdout, first.stdout
        roots = [span for _r, _s, span in receiver.spans() if not span.parent_span_id]
        assert len(roots) == 7 and len(feedback_spans(receiver)) == 1
        assert not [r for r in roots if any(key.startswith("diagnosis.feedback") or "feedback" in key for key in attrs(r))]

        rate(agent_db, run_ids[:3], "DOWN")
        rate(agent_db, run_ids[3:5], "UP")
        second = run_cli("once", "--config", config)
        assert "feedback: 6 rated runs in the window, 5 new or changed sent" in second.stdout, second.stdout
        spans = [s for s in feedback_spans(receiver) if attrs(s)["diagnosis.run.id"] in run_ids]
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
        assert len(feedback_spans(receiver)) == 6

        # A changed rating is a new span (another id) in the same trace, and the old one gets a child
        # that marks it superseded: sent spans cannot change, and the list must say which one holds.
        rate(agent_db, run_ids[:1], "UP")
        fourth = run_cli("once", "--config", config)
        assert "1 new or changed sent" in fourth.stdout
        spans = feedback_spans(receiver)
        assert len(spans) == 7
        changed = {attrs(s)["gen_ai.evaluation.score.label"]: s for s in spans if attrs(s)["diagnosis.run.id"] == run_ids[0]}
        assert changed["DOWN"].span_id != changed["UP"].span_id and changed["DOWN"].trace_id == changed["UP"].trace_id
        (marker,) = [span for _r, _s, span in receiver.spans() if span.name == "superseded user_feedback"]
        assert marker.parent_span_id == changed["DOWN"].span_id and marker.trace_id == changed["DOWN"].trace_id
        assert attrs(marker)["diagnosis.feedback.superseded_by"] == "UP"
        # Both ratings' spans are the rows' alone: nothing in the new one says what it replaced.
        assert {k for k in attrs(changed["UP"])} == {k for k in attrs(changed["DOWN"])}
    finally:
        receiver.stop()


def test_ratings_go_only_into_traces_the_bridge_sent_each_counted_once_when_first_seen(agent_db, tmp_path):
    """A first start on a database with rated history: no rating of a run it never sent (that would open
    a trace holding only the rating), and none of them counted; a rating the run had when the bridge sent
    it goes out once, as a span and a log record, and counts once."""
    receiver = Receiver(logs=True)
    receiver.start()
    history = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 10 MINUTE"] * 3)
    rate(agent_db, [f"run-{uuid.UUID(t)}" for t in history], "DOWN")
    port = free_port()
    sections = bridge_sections(
        agent_db,
        tmp_path,
        f"http://{receiver.endpoint}",
        poll={"start_from": "now"},
        feedback={"interval_seconds": 1, "log_records": True},
        metrics={"enabled": True, "port": port},
    )
    daemon = DaemonProcess(write_config(tmp_path / "c.toml", sections), tmp_path / "daemon.log")
    try:
        wait_for(lambda: "starting after run id" in daemon.output(), 30, "the first start's mark")
        new = [uuid.uuid4().hex for _ in range(2)]
        for trace, feedback in zip(new, ("UP", None), strict=True):  # the first rated before the bridge sends it
            agent_db.execute(
                "INSERT INTO diagnosis_run (run_id, session_id, query, status, feedback, created_at, updated_at) "
                "VALUES (%s, 's', 'q', 'SUCCESS', %s, UTC_TIMESTAMP() - INTERVAL 1 MINUTE, UTC_TIMESTAMP() - INTERVAL 1 MINUTE)",
                f"run-{uuid.UUID(trace)}",
                feedback,
            )
        wait_for(lambda: len(receiver.spans()) >= 3, 30, "the new runs and the rating of the first")
        rate(agent_db, [f"run-{uuid.UUID(new[1])}"], "DOWN")  # rated after
        wait_for(lambda: len(feedback_spans(receiver)) >= 2, 30, "the later rating")
        time.sleep(3)  # three more passes: nothing sent or counted again
        by_trace = Counter(span.trace_id.hex() for span in feedback_spans(receiver))
        assert by_trace == {new[0]: 1, new[1]: 1}, by_trace
        assert not {span.trace_id.hex() for _r, _s, span in receiver.spans()} & set(history)
        assert feedback_total(port) == 2
        records = [r for req in receiver.log_requests for rl in req.resource_logs for sl in rl.scope_logs for r in sl.log_records]
        assert sorted(r.trace_id.hex() for r in records) == sorted(new)
        assert "Traceback" not in daemon.output()
    finally:
        daemon.terminate()
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


def test_a_state_store_from_an_earlier_release_keeps_its_ratings_and_gains_the_new_columns(agent_db, tmp_path):
    """Tables as the release before made them: no start mark, no rating times. Nothing is sent again,
    a change of a rating sent then has no span to mark, and the next change is marked."""
    receiver = Receiver()
    receiver.start()
    try:
        (trace,) = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 10 MINUTE"])
        run_id = f"run-{uuid.UUID(trace)}"
        rate(agent_db, [run_id], "DOWN")
        ((row_id,),) = agent_db.execute("SELECT id FROM diagnosis_run WHERE run_id = %s", run_id)
        agent_db.execute(
            "CREATE TABLE run_otel_checkpoint (name VARCHAR(64) PRIMARY KEY, format_version INT NOT NULL, "
            "high_water BIGINT NOT NULL, pending TEXT NOT NULL, gaps TEXT NOT NULL, saved_at DOUBLE NOT NULL)"
        )
        agent_db.execute(
            "CREATE TABLE run_otel_feedback (shard VARCHAR(64), run_id VARCHAR(128), feedback VARCHAR(64) NOT NULL, "
            "sent_at DOUBLE NOT NULL, PRIMARY KEY (shard, run_id))"
        )
        agent_db.execute("INSERT INTO run_otel_checkpoint VALUES ('default', 1, %s, '{}', '{}', UNIX_TIMESTAMP())", row_id)
        agent_db.execute("INSERT INTO run_otel_feedback VALUES ('default', %s, 'DOWN', UNIX_TIMESTAMP())", run_id)
        sections = bridge_sections(agent_db, tmp_path, f"http://{receiver.endpoint}", state={"url": agent_db.url})
        config = str(write_config(tmp_path / "c.toml", sections))
        done = run_cli("once", "--config", config)
        assert done.returncode == 0, done.stderr
        assert "1 rated runs in the window, 0 new or changed sent" in done.stdout, done.stdout  # not sent again

        rate(agent_db, [run_id], "UP")
        assert "1 new or changed sent" in run_cli("once", "--config", config).stdout
        assert [attrs(s)["gen_ai.evaluation.score.label"] for s in feedback_spans(receiver)] == ["UP"]
        assert not [span for _r, _s, span in receiver.spans() if span.name.startswith("superseded")]

        rate(agent_db, [run_id], "DOWN")
        assert "1 new or changed sent" in run_cli("once", "--config", config).stdout
        (marker,) = [span for _r, _s, span in receiver.spans() if span.name.startswith("superseded")]
        (up,) = [s for s in feedback_spans(receiver) if attrs(s)["gen_ai.evaluation.score.label"] == "UP"]
        assert marker.parent_span_id == up.span_id
    finally:
        receiver.stop()


def test_a_backfill_sends_the_ratings_of_the_runs_it_sends_and_the_same_bytes_again(agent_db, tmp_path):
    """The runs before the daemon's first start are the backfill's: so are their ratings, as a span in
    the trace and a log record, once per backfill, byte-identical to the first when sent again."""
    receiver = Receiver(logs=True)
    receiver.start()
    try:
        traces = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 2 HOUR"] * 3)
        rate(agent_db, [f"run-{uuid.UUID(t)}" for t in traces[:2]], "DOWN")
        agent_db.execute(  # a run that timed out carries no final rating
            "INSERT INTO diagnosis_run (run_id, session_id, query, status, feedback, created_at, updated_at) VALUES "
            "('run-timed-out', 's', 'q', 'RUNNING', 'UP', UTC_TIMESTAMP() - INTERVAL 3 HOUR, UTC_TIMESTAMP() - INTERVAL 3 HOUR)"
        )
        sections = bridge_sections(agent_db, tmp_path, f"http://{receiver.endpoint}", feedback={"log_records": True})
        config = str(write_config(tmp_path / "c.toml", sections))
        for _ in range(2):
            done = run_cli("backfill", "--config", config, "--since", "4h")
            assert done.returncode == 0, done.stderr
        roots = [span for _r, _s, span in receiver.spans() if span.name.startswith("invoke_agent")]
        assert len(roots) == 8  # the precondition: all four runs, twice
        spans = feedback_spans(receiver)
        assert sorted(span.trace_id.hex() for span in spans) == sorted(traces[:2] * 2)
        assert len({span.SerializeToString() for span in spans}) == 2  # each rating the same bytes both times
        records = [r for req in receiver.log_requests for rl in req.resource_logs for sl in rl.scope_logs for r in sl.log_records]
        assert sorted(r.trace_id.hex() for r in records) == sorted(traces[:2] * 2)
    finally:
        receiver.stop()


def test_the_first_rating_after_a_restart_shows_in_increase_on_a_real_prometheus(agent_db, tmp_path):
    """A rating given just after a restart is counted by the new process; its series must have been
    at 0 before it, or increase() over the scrapes sees a series that appears at 1 and nothing else."""
    receiver = Receiver()
    receiver.start()
    traces = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 10 MINUTE"] * 3)
    agent_db.execute("UPDATE diagnosis_run SET intent = 'DIAGNOSIS'")
    port = free_port()
    sections = bridge_sections(
        agent_db,
        tmp_path,
        f"http://{receiver.endpoint}",
        feedback={"interval_seconds": 1},
        metrics={"enabled": True, "port": port},
    )
    config = write_config(tmp_path / "c.toml", sections)
    prometheus = Prometheus(
        tmp_path, f"127.0.0.1:{port}", ROOT / "config/prometheus/alerts.yml", ROOT / "config/prometheus/prometheus.yml"
    )
    daemon = DaemonProcess(config, tmp_path / "first.log")
    try:
        wait_for(lambda: len(receiver.spans()) == 3, 30, "the runs exported")
        prometheus.start()
        wait_for(lambda: prometheus.query('up{job="run-otel"} == 1'), 60, "the first scrape")
        started = float(prometheus.query("run_otel_start_timestamp_seconds")[0]["value"][1])
        assert daemon.terminate() == 0
        daemon = DaemonProcess(config, tmp_path / "second.log")
        restarted = f"run_otel_start_timestamp_seconds > {started}"
        wait_for(lambda: prometheus.query(restarted), 60, "a scrape of the restarted daemon")
        time.sleep(2)  # two more scrapes before the rating
        rate(agent_db, [f"run-{uuid.UUID(traces[0])}"], "DOWN")
        wait_for(lambda: feedback_total(port) == 1, 30, "the rating counted by the daemon")
        time.sleep(3)  # a few scrapes after it
        down = 'sum(increase(diagnosis_run_feedback_total{job="run-otel", feedback="DOWN", intent="DIAGNOSIS"}[30s]))'
        seen = prometheus.query(down)
        assert seen and float(seen[0]["value"][1]) >= 0.9, seen
    finally:
        prometheus.stop()
        daemon.terminate()
        receiver.stop()


def handler_reads(agent_db) -> int:
    """Rows MariaDB's storage engines handed over so far, by the server's own count (Handler_read_*)."""
    return sum(int(value) for _name, value in agent_db.execute("SHOW GLOBAL STATUS LIKE 'Handler_read%%'"))


def test_the_feedback_pass_reads_the_window_of_a_backfilled_history_not_all_of_it(agent_db, receiver, tmp_path):
    """A backfill of 3,000 runs three days old and 20 runs of the last hour, below the daemon's mark:
    the pass follows the backfill's ratings within the window, and even its first pass, which reads the
    whole window, reads rows of the window only."""
    from helpers import bridge_config

    from run_otel.factory import build_backfill, build_feedback, build_parts, build_poller

    agent_db.execute(
        "INSERT INTO diagnosis_run (run_id, session_id, query, status, created_at, updated_at) "
        "SELECT CONCAT('run-old-', seq), 's', 'q', 'SUCCESS', UTC_TIMESTAMP() - INTERVAL 3 DAY, UTC_TIMESTAMP() - INTERVAL 3 DAY "
        "FROM seq_1_to_3000"
    )
    recent = add_runs(agent_db, ["UTC_TIMESTAMP() - INTERVAL 1 HOUR"] * 20)
    config = bridge_config(agent_db, tmp_path, receiver.endpoint, poll={"start_from": "now"})
    ((newest,),) = agent_db.execute("SELECT MAX(id) FROM diagnosis_run")
    with build_parts(config) as parts:
        build_poller(parts).poll()
        assert parts.store.load().start_mark == newest  # the precondition: the whole history is below the mark
        assert build_backfill(parts).run(1, newest).run_count == 3020
        feedback = build_feedback(parts)
        assert feedback is not None and feedback.run().sent == 0
        rate(agent_db, [f"run-{uuid.UUID(recent[0])}"], "DOWN")
        before = handler_reads(agent_db)
        restarted = build_feedback(parts)  # a first pass reads its whole window, the most a pass reads
        assert restarted is not None and restarted.run().sent == 1
        read = handler_reads(agent_db) - before
    assert read < 300, read  # the window's 20 runs and the probes that find it, not the 3,020 backfilled
