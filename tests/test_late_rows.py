"""A run's trace stays complete after its first export, on a real MariaDB into the test's receiver:
a tool row committed after the export, and a run sent as incomplete that finishes later."""

from __future__ import annotations

import logging
from collections import Counter
from datetime import timedelta

import pytest
from helpers import add_run, add_tool, attrs_of, bridge_config, bridge_metrics, counter, new_run_id, utc_now_naive
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from run_otel.factory import build_parts, build_poller
from run_otel.mapping.span_data import completion_span_id_for, root_span_id_for, tool_span_id_for, trace_id_for
from run_otel.telemetry import instruments as I


def spans_of(receiver, run_id: str) -> list:
    trace = trace_id_for(run_id)
    return [span for _r, _s, span in receiver.spans() if span.trace_id == trace]


@pytest.fixture
def bridge(agent_db, receiver, tmp_path):
    reader = InMemoryMetricReader()
    config = bridge_config(agent_db, tmp_path, receiver.endpoint, poll={"run_timeout_seconds": 3600})
    metrics = bridge_metrics(config, [reader])
    parts = build_parts(config, recorder=metrics)
    yield build_poller(parts), reader
    parts.close()
    metrics.shutdown()


def test_a_tool_row_committed_after_its_run_was_exported_joins_the_trace_once(agent_db, receiver, bridge, caplog):
    poller, reader = bridge
    # The daemon's first tick, before the run exists: the late pass reads its watches from the state
    # store now, and from then on holds only what each poll's checkpoint tells it was saved.
    assert poller.poll().run_count == 0
    run_id = new_run_id()
    conn = agent_db.server.root(agent_db.name)
    finished = utc_now_naive() - timedelta(seconds=10)
    add_run(conn, run_id, tool_call_count=3, total_duration_ms=5000, created_at=finished, updated_at=finished)
    add_tool(conn, run_id, duration_ms=10, created_at=finished)
    add_tool(conn, run_id, duration_ms=20, created_at=finished)
    conn.commit()
    assert poller.poll().run_count == 1
    first = spans_of(receiver, run_id)
    assert len(first) == 3  # the root and the two tool rows there were

    add_tool(conn, run_id, duration_ms=30, created_at=finished)  # the third call, committed after the export
    conn.commit()
    late_id = agent_db.execute("SELECT MAX(id) FROM tool_invocation")[0][0]
    with caplog.at_level(logging.INFO, logger="run_otel"):
        assert poller.poll().run_count == 0
    spans = spans_of(receiver, run_id)
    copies = Counter(span.span_id for span in spans)
    assert copies[root_span_id_for(run_id)] == 1  # the root is never sent again
    late = [span for span in spans if span.span_id == tool_span_id_for(run_id, late_id)]
    assert len(late) == 1 and late[0].parent_span_id == root_span_id_for(run_id)
    assert attrs_of(late[0])["gen_ai.tool.call.id"] == str(late_id)
    assert len(copies) == 4  # the root and three children, as tool_call_count says
    assert any(run_id in r.getMessage() and "committed after its export" in r.getMessage() for r in caplog.records)
    assert counter(reader, I.LATE_ROWS, kind="tool") == 1
    assert counter(reader, I.TOOL_INVOCATIONS) == 3

    poller.poll()  # nothing new: nothing sent again
    assert len(spans_of(receiver, run_id)) == len(spans)
    conn.close()


def test_a_run_sent_as_incomplete_that_finishes_later_sends_its_outcome_and_new_rows(agent_db, receiver, bridge, caplog):
    poller, reader = bridge
    run_id = new_run_id()
    conn = agent_db.server.root(agent_db.name)
    add_run(conn, run_id, status="RUNNING")  # created two hours ago: past run_timeout_seconds
    add_tool(conn, run_id, duration_ms=10)
    conn.commit()
    poller.poll()
    (root,) = [span for span in spans_of(receiver, run_id) if not span.parent_span_id]
    assert attrs_of(root)["diagnosis.run.incomplete"] is True and root.status.code == 2

    add_tool(conn, run_id, duration_ms=20)
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE diagnosis_run SET status='SUCCESS', release_outcome='SUCCESS', total_duration_ms=7000, "
            "tool_call_count=2, updated_at = updated_at + INTERVAL 7 SECOND WHERE run_id=%s",
            (run_id,),
        )
    conn.commit()
    with caplog.at_level(logging.INFO, logger="run_otel"):
        poller.poll()
    spans = spans_of(receiver, run_id)
    copies = Counter(span.span_id for span in spans)
    assert copies[root_span_id_for(run_id)] == 1  # never a second, different root
    (done,) = [span for span in spans if span.span_id == completion_span_id_for(run_id)]
    assert done.parent_span_id == root_span_id_for(run_id)
    assert done.name == "invoke_agent diagnosis-agent completed"
    assert done.status.code == 1  # the final outcome, SUCCESS
    attrs = attrs_of(done)
    assert attrs["diagnosis.run.status"] == "SUCCESS" and attrs["diagnosis.run.completed_late"] is True
    assert "diagnosis.run.incomplete" not in attrs
    # The final extent: total_duration_ms from created_at, widened over every tool row.
    assert done.end_time_unix_nano - done.start_time_unix_nano >= 7_000_000_000
    assert done.start_time_unix_nano <= root.start_time_unix_nano
    assert len(copies) == 4  # root, the first tool, the completion, the tool written since
    assert any(run_id in r.getMessage() and "finished as SUCCESS" in r.getMessage() for r in caplog.records)
    assert counter(reader, I.LATE_ROWS, kind="completion") == 1
    assert counter(reader, I.LATE_ROWS, kind="tool") == 1

    poller.poll()  # finished and sent: the completion is not sent again
    assert len(spans_of(receiver, run_id)) == len(spans)
    conn.close()


def test_a_run_settled_longer_ago_than_the_window_is_not_watched(agent_db, receiver, tmp_path):
    config = bridge_config(agent_db, tmp_path, receiver.endpoint, poll={"late_window_seconds": 60})
    parts = build_parts(config)
    poller = build_poller(parts)
    run_id = new_run_id()
    conn = agent_db.server.root(agent_db.name)
    add_run(conn, run_id)  # settled two hours ago
    conn.commit()
    poller.poll()
    assert len(spans_of(receiver, run_id)) == 1
    assert parts.store.watched(0) == []  # a catch-up's runs cost the late pass nothing
    add_tool(conn, run_id)
    conn.commit()
    poller.poll()
    assert len(spans_of(receiver, run_id)) == 1
    parts.close()
    conn.close()


def test_a_restart_inside_the_window_still_sends_a_late_tool_row(agent_db, receiver, tmp_path):
    config = bridge_config(agent_db, tmp_path, receiver.endpoint)
    run_id = new_run_id()
    conn = agent_db.server.root(agent_db.name)
    finished = utc_now_naive() - timedelta(seconds=10)
    add_run(conn, run_id, created_at=finished, updated_at=finished)
    conn.commit()
    before = build_parts(config)
    assert build_poller(before).poll().run_count == 1
    before.close()  # the process stops; the watch is in the state store

    add_tool(conn, run_id, created_at=finished)
    conn.commit()
    after = build_parts(config)
    build_poller(after).poll()
    after.close()
    spans = spans_of(receiver, run_id)
    assert len(spans) == 2 and Counter(span.span_id for span in spans)[root_span_id_for(run_id)] == 1
    conn.close()


def test_a_late_tool_row_neither_resets_nor_resends_the_rating(agent_db, receiver, tmp_path):
    """Ratings reach the trace only through the feedback pass: a late row's spans carry none, the pass
    sends nothing again for it, and what it would send again is the same bytes."""
    from sqlalchemy import delete

    from run_otel.factory import build_feedback
    from run_otel.pipeline.state_tables import feedback_table

    parts = build_parts(bridge_config(agent_db, tmp_path, receiver.endpoint))
    poller, feedback = build_poller(parts), build_feedback(parts)
    assert feedback is not None
    run_id = new_run_id()
    conn = agent_db.server.root(agent_db.name)
    finished = utc_now_naive() - timedelta(seconds=10)
    add_run(conn, run_id, feedback="DOWN", tool_call_count=2, total_duration_ms=5000, created_at=finished, updated_at=finished)
    add_tool(conn, run_id, duration_ms=10, created_at=finished)
    conn.commit()
    assert poller.poll().run_count == 1
    assert feedback.run().sent == 1

    def ratings() -> list[bytes]:
        return [span.SerializeToString() for span in spans_of(receiver, run_id) if span.name.startswith("evaluation ")]

    (sent,) = ratings()
    add_tool(conn, run_id, duration_ms=20, created_at=finished)  # committed after the export
    conn.commit()
    before = len(spans_of(receiver, run_id))
    poller.poll()
    spans = spans_of(receiver, run_id)
    assert len(spans) == before + 1  # the precondition: the late row went out into the trace
    for span in spans:
        if not span.name.startswith("evaluation "):
            assert not [kv.key for kv in span.attributes if "feedback" in kv.key or kv.key.startswith("gen_ai.evaluation")]
    assert feedback.run().sent == 0
    assert ratings() == [sent]

    # A crash before the pass recorded its send: the pass sends the rating again, the same bytes.
    with parts.store.engine.begin() as state:
        state.execute(delete(feedback_table))
    assert feedback.run().sent == 1
    assert ratings() == [sent, sent]
    assert not [span for span in spans_of(receiver, run_id) if span.name.startswith("superseded ")]
    parts.close()
    conn.close()


def test_tool_rows_after_the_timeout_wait_for_the_finish_and_go_under_the_root_when_it_never_comes(
    agent_db, receiver, tmp_path, caplog
):
    """What a run sent incomplete writes next hangs under its completed span, so it waits for the finish;
    a run still unfinished when its watch ends sends it under its root then, with a WARNING, rather than never."""
    import time

    config = bridge_config(agent_db, tmp_path, receiver.endpoint, poll={"run_timeout_seconds": 2, "late_window_seconds": 1})
    run_id = new_run_id()
    conn = agent_db.server.root(agent_db.name)
    add_run(conn, run_id, status="RUNNING")  # two hours old: sent as incomplete
    conn.commit()
    with build_parts(config) as parts, caplog.at_level(logging.WARNING, logger="run_otel"):
        poller = build_poller(parts)
        assert poller.poll().run_count == 1
        add_tool(conn, run_id, duration_ms=20, created_at=utc_now_naive() - timedelta(minutes=5))
        conn.commit()
        poller.poll()
        assert len(spans_of(receiver, run_id)) == 1  # held for the finish, not sent under the root it lies outside
        time.sleep(2.5)  # the watch (poll.run_timeout_seconds more) ends, the run unfinished
        poller.poll()
    spans = spans_of(receiver, run_id)
    assert len(spans) == 2 and spans[1].parent_span_id == root_span_id_for(run_id)
    assert any(run_id in r.getMessage() and "did not finish while watched" in r.getMessage() for r in caplog.records)
    conn.close()
