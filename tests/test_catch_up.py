"""A daemon behind its backlog, as a real process: it reads and maps the next batch while the one
before is sent, as a backfill does; its lag and backlog gauges are there and falling while it
drains; and a SIGTERM in the middle of a large batch stops the sending at once and keeps what was
acknowledged, so the next start sends again at most about one request's worth."""

from __future__ import annotations

import re
import signal
import time

import pytest
import requests
from helpers import DaemonProcess, StatementLog, bridge_sections, reader_url, write_config
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from servers import Receiver, free_port, wait_for
from test_database_cost import add_runs_with_tools

pytestmark = pytest.mark.server


def roots_of(request: bytes) -> list[bytes]:
    """The trace ids of the root spans one request carries (one a run)."""
    parsed = trace_service_pb2.ExportTraceServiceRequest.FromString(request)
    return [
        span.trace_id for rs in parsed.resource_spans for ss in rs.scope_spans for span in ss.spans if not span.parent_span_id
    ]


def received(receiver: Receiver) -> list[list[bytes]]:
    return [roots_of(request) for request in list(receiver.requests)]


def gauge(text: str, name: str) -> float | None:
    found = re.search(rf"^{name}\{{[^}}]*\}} ([0-9.e+]+)$", text, re.M)
    return float(found[1]) if found else None


def test_the_lag_and_backlog_gauges_are_there_and_fall_while_the_daemon_drains(agent_db, tmp_path):
    add_runs_with_tools(agent_db, 600, 2, ended="UTC_TIMESTAMP() - INTERVAL 2 HOUR")
    receiver = Receiver(delay=(0.3, 0.3))
    receiver.start()
    port = free_port()
    sections = bridge_sections(
        agent_db, tmp_path, receiver.endpoint, poll={"batch_size": 20}, metrics={"enabled": True, "port": port}
    )
    daemon = DaemonProcess(write_config(tmp_path / "c.toml", sections), tmp_path / "daemon.log")
    seen: list[tuple[float, float]] = []
    try:
        while sum(map(len, received(receiver))) < 600:
            try:
                text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except requests.RequestException:
                text = ""
            backlog, lag = gauge(text, "run_otel_backlog_runs"), gauge(text, "run_otel_lag_seconds")
            if backlog is not None and lag is not None and sum(map(len, received(receiver))) < 600:
                seen.append((backlog, lag))
            time.sleep(0.2)
            assert daemon.alive(), daemon.output()
    finally:
        daemon.terminate()
        receiver.stop()
    # The precondition: thirty batches of a slow receiver's answers, nine seconds of drain (the gauges
    # are set at most once a second).
    assert len(receiver.requests) >= 30
    backlogs = [backlog for backlog, _lag in seen]
    assert len(set(backlogs)) >= 5, seen  # there during the drain, and moving
    assert backlogs == sorted(backlogs, reverse=True) and backlogs[0] >= 300, seen
    assert all(lag >= 0 for _b, lag in seen)


def test_the_daemon_reads_the_next_batch_while_the_one_before_is_sent(agent_db, tmp_path):
    add_runs_with_tools(agent_db, 60, 2, ended="UTC_TIMESTAMP() - INTERVAL 2 HOUR")
    receiver = Receiver(hold_after=1)  # the second request is kept unanswered until released
    receiver.start()
    sections = bridge_sections(agent_db, tmp_path, receiver.endpoint, poll={"batch_size": 20})
    sections["source"]["url"] = reader_url(agent_db)
    daemon = None
    try:
        with StatementLog(agent_db, tmp_path / "slow.log") as log:
            daemon = DaemonProcess(write_config(tmp_path / "c.toml", sections), tmp_path / "daemon.log")
            wait_for(receiver.holding.is_set, 60, "the second batch's request to be held")
            # Mapping the third batch needs its runs and their tool rows, read while the second is unanswered.
            wait_for(
                lambda: any("diagnosis_run.id > 40 " in s.sql for s in log.statements()),
                30,
                "the third batch read while the second waits for its acknowledgement",
            )
            statements = log.statements()
            receiver.release()
            wait_for(lambda: sum(map(len, received(receiver))) >= 60, 60, "the drain")
    finally:
        if daemon is not None:
            daemon.terminate()
        receiver.stop()
    third = next(i for i, s in enumerate(statements) if "diagnosis_run.id > 40 " in s.sql)
    assert any("tool_invocation" in s.sql for s in statements[third:])  # its tool rows too


def test_a_sigterm_in_the_middle_of_a_batch_stops_at_once_and_keeps_what_was_acknowledged(agent_db, tmp_path):
    run_ids = add_runs_with_tools(agent_db, 3000, 3, ended="UTC_TIMESTAMP() - INTERVAL 2 HOUR")
    receiver = Receiver(delay=(0.25, 0.25))
    receiver.start()
    sections = bridge_sections(
        agent_db,
        tmp_path,
        receiver.endpoint,
        poll={"batch_size": 5000, "shutdown_timeout_seconds": 10},
        export={"max_request_bytes": 64 * 1024},
    )
    config = write_config(tmp_path / "c.toml", sections)
    first = DaemonProcess(config, tmp_path / "first.log")
    try:
        wait_for(lambda: len(receiver.requests) >= 10, 60, "ten requests acknowledged")
        first.process.send_signal(signal.SIGTERM)
        stopped_at = len(receiver.requests)
        assert first.process.wait(30) == 0, first.output()
    finally:
        first.kill() if first.alive() else None
    before = received(receiver)
    acknowledged = {trace for request in before for trace in request}
    per_request = max(len(request) for request in before)
    # The precondition: one large batch, cut short; each request holds a few dozen runs.
    assert 300 <= per_request * len(before) and len(acknowledged) < len(run_ids) / 2, (per_request, len(before))
    assert len(before) <= stopped_at + 1  # the request in flight, then no more

    receiver.delay = (0.0, 0.0)
    second = DaemonProcess(config, tmp_path / "second.log")
    try:
        wait_for(lambda: len({t for r in received(receiver) for t in r}) >= len(run_ids), 120, "every run")
    finally:
        second.terminate()
        receiver.stop()
    again = [trace for request in received(receiver)[len(before) :] for trace in request if trace in acknowledged]
    assert len(again) <= per_request, (len(again), per_request)
    assert "stopped in the middle of a batch" in first.output()
