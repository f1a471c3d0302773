"""Times a row cannot mean as written, on a real MariaDB into the test's receiver: each is read by
its documented rule (docs/mapping.md, Odd times), the run still goes out, and each is counted in
run_otel_row_odd_times_total{kind} and, but for the daylight-saving hours, warned about by run."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

import pytest
from helpers import add_run, add_tool, attrs_of, bridge_config, bridge_metrics, counter, epoch_ns, new_run_id, utc_now_naive
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from run_otel.factory import build_parts, build_poller
from run_otel.mapping.span_data import trace_id_for
from run_otel.telemetry import instruments as I


def odd_times(reader, kind: str) -> float:
    assert getattr(I, "ODD_TIMES", None) is not None, "no run_otel_row_odd_times_total"
    return counter(reader, I.ODD_TIMES, kind=kind)


@pytest.fixture
def bridge(agent_db, receiver, tmp_path, request):
    reader = InMemoryMetricReader()
    zone = getattr(request, "param", "UTC")
    config = bridge_config(agent_db, tmp_path, receiver.endpoint, source={"timezone": zone})
    metrics = bridge_metrics(config, [reader])
    parts = build_parts(config, recorder=metrics)
    yield parts, build_poller(parts), reader
    parts.close()
    metrics.shutdown()


def spans_of(receiver, run_id: str) -> list:
    return [span for _r, _s, span in receiver.spans() if span.trace_id == trace_id_for(run_id)]


def root_of(receiver, run_id: str):
    (root,) = [span for span in spans_of(receiver, run_id) if not span.parent_span_id]
    return root


def warned(caplog, run_id: str, words: str) -> bool:
    return any(run_id in r.getMessage() and words in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_a_finished_run_updated_in_2099_settles_by_the_databases_clock_with_a_warning(agent_db, receiver, bridge, caplog):
    parts, poller, reader = bridge
    timed, untimed = new_run_id(), new_run_id()
    conn = agent_db.server.root(agent_db.name)
    started = utc_now_naive() - timedelta(seconds=30)
    add_run(conn, timed, total_duration_ms=3000, created_at=started, updated_at="2099-01-01 00:00:00")
    add_run(conn, untimed, created_at=started, updated_at="2099-01-01 00:00:00")
    add_run(conn, new_run_id(), created_at=started, updated_at=started)  # the newest run is a plain one
    with caplog.at_level(logging.WARNING, logger="run_otel"):
        assert poller.poll().run_count == 3  # the two were held as pending for ever before, without a word
    assert "looks wrong" not in caplog.text  # a bad time in one row is no wrong source.timezone
    assert parts.store.load().pending == {}
    for run_id in (timed, untimed):
        assert warned(caplog, run_id, "ahead of the database's clock; settled by the database's clock"), caplog.text
    assert odd_times(reader, "future_updated_at") == 2
    # Neither root reaches 2099: one ends at its duration, the other, without one, at its start.
    assert root_of(receiver, timed).end_time_unix_nano == epoch_ns(started) + 3_000_000_000
    assert root_of(receiver, untimed).end_time_unix_nano == epoch_ns(started)
    assert parts.store.watched(time.time() + 3600) == []  # watched for the window from now, not until 2099
    conn.close()


def test_a_lone_run_updated_in_2099_is_no_wrong_time_zone(agent_db, receiver, bridge, caplog):
    """The newest run is the one in 2099: the zone check, which compares the newest run with the database's
    clock, said source.timezone looked wrong (UTC+631747:00) and took /readyz down for good."""
    _parts, poller, _reader = bridge
    run_id = new_run_id()
    conn = agent_db.server.root(agent_db.name)
    add_run(conn, run_id, created_at=utc_now_naive() - timedelta(seconds=30), updated_at="2099-01-01 00:00:00")
    with caplog.at_level(logging.WARNING, logger="run_otel"):
        assert poller.poll().run_count == 1
    assert "looks wrong" not in caplog.text
    assert warned(caplog, run_id, "ahead of the database's clock; settled by the database's clock")
    conn.close()


@pytest.mark.parametrize("bridge", ["Europe/Berlin"], indirect=True)
def test_a_run_before_the_epoch_in_its_zone_is_sent_clamped_to_the_epoch_with_a_warning(agent_db, receiver, bridge, caplog):
    _parts, poller, reader = bridge
    run_id = new_run_id()
    conn = agent_db.server.root(agent_db.name)
    # 1970-01-01 00:00 in Berlin is 23:00 UTC on the last day of 1969.
    add_run(conn, run_id, total_duration_ms=5000, created_at="1970-01-01 00:00:00", updated_at="1970-01-01 00:00:05")
    add_tool(conn, run_id, duration_ms=100, created_at="1970-01-01 00:00:03")
    with caplog.at_level(logging.WARNING, logger="run_otel"):
        assert poller.poll().run_count == 1  # dropped as unmappable before
    spans = spans_of(receiver, run_id)
    assert len(spans) == 2
    root = root_of(receiver, run_id)
    assert (root.start_time_unix_nano, root.end_time_unix_nano) == (0, 5_000_000_000)
    assert warned(caplog, run_id, "diagnosis_run.created_at 1970-01-01 00:00:00 (Europe/Berlin) is before the Unix epoch")
    assert odd_times(reader, "before_epoch") == 2  # the run's created_at and the tool row's
    conn.close()


def test_a_tool_call_hours_after_its_run_is_a_counted_warning_and_the_root_still_covers_it(agent_db, receiver, bridge, caplog):
    _parts, poller, reader = bridge
    run_id = new_run_id()
    conn = agent_db.server.root(agent_db.name)
    started = utc_now_naive() - timedelta(hours=3)
    add_run(conn, run_id, total_duration_ms=5000, created_at=started, updated_at=started + timedelta(seconds=5))
    add_tool(conn, run_id, duration_ms=200, created_at=started + timedelta(seconds=6))  # the second DATETIME allows
    add_tool(conn, run_id, duration_ms=200, created_at=started + timedelta(hours=2))
    late_id = agent_db.execute("SELECT MAX(id) FROM tool_invocation")[0][0]
    with caplog.at_level(logging.WARNING, logger="run_otel"):
        assert poller.poll().run_count == 1
    assert warned(caplog, run_id, "1 tool row(s) lie outside the run's own time"), caplog.text
    assert warned(caplog, run_id, f"tool_invocation {late_id}, 7195s after its end")
    assert odd_times(reader, "tool_outside_run") == 1
    root = root_of(receiver, run_id)
    assert root.end_time_unix_nano == epoch_ns(started + timedelta(hours=2))  # no child outside its parent
    conn.close()


@pytest.mark.parametrize("bridge", ["Europe/Berlin"], indirect=True)
def test_repeated_and_skipped_local_hours_are_read_by_the_documented_rule_and_counted(agent_db, receiver, bridge):
    _parts, poller, reader = bridge
    repeated, skipped, plain = new_run_id(), new_run_id(), new_run_id()
    conn = agent_db.server.root(agent_db.name)
    add_run(conn, repeated, total_duration_ms=1000, created_at="2026-10-25 02:30:00", updated_at="2026-10-25 02:30:01")
    add_tool(conn, repeated, duration_ms=0, created_at="2026-10-25 02:30:01")
    add_run(conn, skipped, total_duration_ms=1000, created_at="2026-03-29 02:30:00", updated_at="2026-03-29 02:30:01")
    add_run(conn, plain, total_duration_ms=1000, created_at="2026-07-01 12:00:00", updated_at="2026-07-01 12:00:01")
    assert poller.poll().run_count == 3
    # The repeated hour as its first occurrence (summer time, UTC+2); the skipped one with the offset before (UTC+1).
    assert root_of(receiver, repeated).start_time_unix_nano == epoch_ns(datetime(2026, 10, 25, 0, 30))
    assert root_of(receiver, skipped).start_time_unix_nano == epoch_ns(datetime(2026, 3, 29, 1, 30))
    assert root_of(receiver, plain).start_time_unix_nano == epoch_ns(datetime(2026, 7, 1, 10, 0))
    assert odd_times(reader, "dst_repeated") == 2  # the run's created_at and its tool row's
    assert odd_times(reader, "dst_missing") == 1
    assert attrs_of(root_of(receiver, plain))["diagnosis.run.status"] == "SUCCESS"
    conn.close()
