"""A state store that goes away under a running daemon: every failed attempt is one
line and a backoff, readiness drops, the failure metric counts, nothing is re-sent
in a loop, and the daemon recovers when the store is back."""

from __future__ import annotations

import re
import time
from collections import Counter

import requests
from helpers import DaemonProcess, add_finished_runs, bridge_sections, received_roots, write_config
from servers import free_port, wait_for


def _get(url: str) -> tuple[int, str]:
    try:
        reply = requests.get(url, timeout=2)
        return reply.status_code, reply.text
    except requests.RequestException:
        return 0, ""


def failed_polls(metrics: str) -> float:
    match = re.search(r'run_otel_poll_duration_seconds_count\{[^}]*outcome="error"[^}]*\} ([0-9.e+]+)', metrics)
    return float(match.group(1)) if match else 0.0


def export_failures(metrics: str) -> float:
    match = re.search(r"run_otel_export_failures_total\{[^}]*\} ([0-9.e+]+)", metrics)
    return float(match.group(1)) if match else 0.0


def test_the_state_store_removed_under_the_daemon_backs_off_and_recovers(agent_db, otlp, tmp_path):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    port = free_port()
    config = write_config(
        tmp_path / "c.toml",
        bridge_sections(
            agent_db,
            tmp_path,
            otlp.endpoint("grpc"),
            state={"url": f"sqlite:///{state_dir / 'state.db'}"},
            poll={"interval_seconds": 0.5, "retry_initial_seconds": 1, "retry_max_seconds": 4},
            metrics={"enabled": True, "port": port},
        ),
    )
    first = set(add_finished_runs(agent_db, 5))
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: received_roots(otlp.receiver) >= first, 30, "the first runs")
        wait_for(lambda: _get(base + "/readyz")[0] == 200, 10, "readiness")
        assert failed_polls(_get(base + "/metrics")[1]) == 0
        requests_before = len(otlp.receiver.requests)
        gone = tmp_path / "moved-away"
        state_dir.rename(gone)
        later = set(add_finished_runs(agent_db, 10))
        wait_for(lambda: _get(base + "/readyz")[0] == 503, 15, "readiness to drop")
        time.sleep(10)  # 20 ticks of poll.interval_seconds
        assert failed_polls(_get(base + "/metrics")[1]) >= 2
        sends = len(otlp.receiver.requests) - requests_before
        # A batch sent whose checkpoint could not be saved is not re-sent tick after tick (once
        # a 0.5s tick, that was 20 sends here); nor is anything sent while the store cannot be read.
        assert sends <= 3, sends
        lines = [line for line in daemon.output().splitlines() if "poll failed" in line]
        assert 2 <= len(lines) <= 8, lines
        assert all("state store" in line and "retrying in" in line for line in lines), lines
        gone.rename(state_dir)
        wait_for(lambda: "exports recovered" in daemon.output(), 20, "the daemon to recover")
        wait_for(lambda: _get(base + "/readyz")[0] == 200, 10, "readiness again")
        # The collector in between forwards on its own schedule: the runs arrive soon after the ack.
        wait_for(lambda: received_roots(otlp.receiver) >= later, 15, "the runs added while the store was away")
        # A batch sent while the store was away is sent once more after it is back (at-least-once),
        # and the roots above may have come from the first send: give the collector time to forward
        # the second. After it, each run has come at most twice, and nothing more comes.
        time.sleep(3)
        copies = Counter(span.trace_id.hex() for _r, _s, span in otlp.receiver.spans() if not span.parent_span_id)
        assert all(copies[trace] <= 2 for trace in later), copies
        settled = len(otlp.receiver.requests)
        time.sleep(2)
        assert len(otlp.receiver.requests) == settled  # nothing is re-sent after the checkpoint is saved
    finally:
        assert daemon.terminate() == 0
    assert "Traceback" not in daemon.output()


def test_a_failed_feedback_pass_takes_the_poll_failed_path(agent_db, tmp_path):
    """Readiness drops, the next try backs off, and the failed send is counted as an export failure;
    the poll before it succeeded and is counted once, as a good poll."""
    from helpers import feedback_spans
    from servers import Receiver

    receiver = Receiver()
    receiver.start()
    add_finished_runs(agent_db, 4)
    port = free_port()
    config = write_config(
        tmp_path / "c.toml",
        bridge_sections(
            agent_db,
            tmp_path,
            f"http://{receiver.endpoint}",
            feedback={"interval_seconds": 1},
            poll={"retry_initial_seconds": 1, "retry_max_seconds": 2},
            metrics={"enabled": True, "port": port},
            export={"max_attempts": 1, "timeout_seconds": 2},
        ),
    )
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: len(receiver.spans()) == 4, 30, "the runs exported")
        wait_for(lambda: _get(base + "/readyz")[0] == 200, 10, "readiness")
        receiver.stop()  # polls find nothing to send and succeed; only the feedback pass sends
        agent_db.execute("UPDATE diagnosis_run SET feedback = 'DOWN', updated_at = NOW()")
        wait_for(lambda: "feedback pass failed" in daemon.output(), 30, "the feedback pass to fail")
        wait_for(lambda: _get(base + "/readyz")[0] == 503, 10, "readiness to drop")
        metrics = _get(base + "/metrics")[1]
        assert export_failures(metrics) >= 1
        assert failed_polls(metrics) == 0  # every poll succeeded: none is recorded twice, once as failed
        line = next(line for line in daemon.output().splitlines() if "feedback pass failed" in line)
        assert "retrying in" in line, line
        receiver.start()
        wait_for(lambda: len(feedback_spans(receiver)) == 4, 30, "the feedback sent once the receiver is back")
        wait_for(lambda: _get(base + "/readyz")[0] == 200, 10, "readiness again")
    finally:
        assert daemon.terminate() == 0
        receiver.stop()
    assert "Traceback" not in daemon.output()
