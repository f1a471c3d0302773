"""Runs in flight when the daemon first starts from "now", or at a backfill's edge, on a real
MariaDB: the daemon takes them over, and the backfill says how many it left to it."""

from __future__ import annotations

from datetime import timedelta

from helpers import add_run, bridge_sections, new_run_id, run_cli, utc_now_naive, write_config

from run_otel.config import build_config
from run_otel.factory import build_feedback, build_parts, build_poller
from run_otel.mapping.span_data import trace_id_for


def roots_of(receiver) -> set[bytes]:
    return {span.trace_id for _r, _s, span in receiver.spans() if not span.parent_span_id}


def test_a_run_in_flight_at_the_first_start_is_sent_when_it_finishes(agent_db, receiver, tmp_path):
    conn = agent_db.server.root(agent_db.name)
    history = [new_run_id() for _ in range(5)]
    for run_id in history:
        add_run(conn, run_id)
    in_flight = new_run_id()
    started = utc_now_naive() - timedelta(minutes=5)
    add_run(conn, in_flight, status="RUNNING", created_at=started, updated_at=started)
    newer = new_run_id()
    add_run(conn, newer, created_at=started, updated_at=started)  # finished, above the running one
    conn.commit()
    sections = bridge_sections(agent_db, tmp_path, receiver.endpoint, poll={"start_from": "now"})
    sections["poll"]["settle_seconds"] = 0
    parts = build_parts(build_config(sections))
    poller = build_poller(parts)
    first = poller.poll()
    assert first.run_count == 0 and first.pending == 1  # the mark is at the newest run; the running one waits
    backfill = run_cli("backfill", "--since", "1h", "--config", str(write_config(tmp_path / "c.toml", sections)))
    assert backfill.returncode == 0, backfill.stderr
    assert "1 run(s) of the window were still in flight: left to the daemon" in backfill.stdout, backfill.stdout
    assert trace_id_for(in_flight) not in roots_of(receiver)

    with conn.cursor() as cur:
        cur.execute(
            "UPDATE diagnosis_run SET status='SUCCESS', updated_at = UTC_TIMESTAMP() - INTERVAL 1 SECOND WHERE run_id=%s",
            (in_flight,),
        )
    conn.commit()
    second = poller.poll()
    assert second.run_count == 1 and second.pending == 0
    assert trace_id_for(in_flight) in roots_of(receiver)
    parts.close()
    conn.close()


def rating_spans(receiver, run_id: str) -> list:
    trace = trace_id_for(run_id)
    return [span for _r, _s, span in receiver.spans() if span.trace_id == trace and span.name.startswith("evaluation ")]


def test_a_run_in_flight_at_the_first_start_gets_its_rating_and_runs_it_never_sent_do_not(agent_db, receiver, tmp_path):
    conn = agent_db.server.root(agent_db.name)
    started = utc_now_naive() - timedelta(minutes=5)
    in_flight = new_run_id()
    add_run(conn, in_flight, status="RUNNING", created_at=started, updated_at=started)
    # Finished and rated before the first start, between the two runs taken over: never sent.
    between = new_run_id()
    add_run(conn, between, feedback="UP", created_at=started, updated_at=started)
    also_in_flight = new_run_id()
    add_run(conn, also_in_flight, status="RUNNING", created_at=started, updated_at=started)
    # Finished and rated before the first start, between the runs taken over and the mark: never sent.
    before = new_run_id()
    add_run(conn, before, feedback="UP", created_at=started, updated_at=started)
    conn.commit()
    sections = bridge_sections(agent_db, tmp_path, receiver.endpoint, poll={"start_from": "now"})
    parts = build_parts(build_config(sections))
    poller, feedback = build_poller(parts), build_feedback(parts)
    assert feedback is not None
    assert poller.poll().pending == 2  # the precondition: both running runs were taken over below the mark
    assert feedback.run().sent == 0

    with conn.cursor() as cur:
        cur.execute(
            "UPDATE diagnosis_run SET status='SUCCESS', feedback='DOWN', updated_at = UTC_TIMESTAMP() - INTERVAL 1 SECOND "
            "WHERE run_id IN (%s, %s)",
            (in_flight, also_in_flight),
        )
    conn.commit()
    assert poller.poll().run_count == 2
    assert feedback.run().sent == 2
    assert feedback.run().sent == 0  # once
    for run_id in (in_flight, also_in_flight):
        (span,) = rating_spans(receiver, run_id)
        labels = {kv.key: kv.value.string_value for kv in span.attributes}
        assert labels["gen_ai.evaluation.score.label"] == "DOWN"
    # A rating alone would open a trace with no run in it.
    assert rating_spans(receiver, between) == [] and rating_spans(receiver, before) == []
    parts.close()
    conn.close()
