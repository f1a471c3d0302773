"""A receiver that throttles on purpose (gRPC RESOURCE_EXHAUSTED or UNAVAILABLE with a RetryInfo,
HTTP 429 or 503 with Retry-After in seconds or as a date) is sent nothing before the delay it asked
for: not the next attempt, nor the next poll's request, a rating, a log record or the daemon's
probe. Each receiver counts the requests that arrive inside the window its last throttling answer
opened."""

from __future__ import annotations

import time
import uuid

import grpc
import pytest
import requests
from helpers import DaemonProcess, add_finished_runs, bridge_sections, feedback_spans, rate, received_roots, write_config
from prometheus_client.parser import text_string_to_metric_families
from servers import HttpReceiver, Receiver, Throttle, free_port, wait_for

from run_otel.config import build_config
from run_otel.export.sinks import ExportError
from run_otel.export.throttle import MAX_THROTTLE_SECONDS
from run_otel.factory import build_sink

EMPTY = b""

# (protocol, what the receiver answers): every form of a requested delay.
FORMS = {
    "grpc RESOURCE_EXHAUSTED": ("grpc", grpc.StatusCode.RESOURCE_EXHAUSTED, 0, False),
    "grpc UNAVAILABLE": ("grpc", grpc.StatusCode.UNAVAILABLE, 0, False),
    "http 429 seconds": ("http/protobuf", None, 429, False),
    "http 503 seconds": ("http/protobuf", None, 503, False),
    "http 503 date": ("http/protobuf", None, 503, True),
}


def _receiver(form: str, throttle: Throttle) -> tuple[Receiver | HttpReceiver, str]:
    protocol, code, status, as_date = FORMS[form]
    if protocol == "grpc":
        receiver: Receiver | HttpReceiver = Receiver(throttle=throttle, throttle_code=code)
        receiver.start()
        return receiver, f"http://{receiver.endpoint}"
    http = HttpReceiver(throttle=throttle, throttle_status=status, retry_after_date=as_date)
    http.start()
    return http, http.endpoint("http")


@pytest.mark.parametrize("form", sorted(FORMS))
def test_after_a_throttled_send_the_probe_and_the_next_send_wait_for_the_window(form):
    throttle = Throttle(seconds=2.0, answers=1)
    receiver, endpoint = _receiver(form, throttle)
    protocol = FORMS[form][0]
    # One attempt per send: the throttled answer ends the send, as it ends a poll after export.max_attempts.
    sink = build_sink(build_config({"export": {"protocol": protocol, "endpoint": endpoint, "max_attempts": 1}}))
    try:
        with pytest.raises(ExportError) as throttled:
            sink.send(EMPTY)
        assert throttle.given == 1, "the precondition: the receiver throttled the first send"
        assert "nothing is sent to it for" in str(throttled.value), throttled.value
        with pytest.raises(ExportError) as probed:
            sink.probe()
        assert "the receiver asked for no request for" in str(probed.value)
        assert len(throttle.arrivals) == 1, "the probe was sent inside the window"
        started = time.monotonic()
        sink.send(EMPTY)
        waited = time.monotonic() - started
    finally:
        sink.close()
        receiver.stop()
    assert throttle.inside == 0 and len(throttle.arrivals) == 2
    assert 1.0 < waited < 4.0, waited  # the rest of the window (a date has whole seconds), not a backoff


def test_what_a_receiver_may_ask_for_is_capped_and_the_cap_is_said():
    throttle = Throttle(seconds=600.0, answers=1)
    receiver, endpoint = _receiver("grpc RESOURCE_EXHAUSTED", throttle)
    sink = build_sink(build_config({"export": {"endpoint": endpoint, "max_attempts": 1}}))
    try:
        with pytest.raises(ExportError) as throttled:
            sink.send(EMPTY)
        with pytest.raises(ExportError) as probed:
            sink.probe()
    finally:
        sink.close()
        receiver.stop()
    cap = f"{MAX_THROTTLE_SECONDS:g}s"
    assert f"nothing is sent to it for {cap}: it asked for 600s, cut to {cap}" in str(throttled.value), throttled.value
    left = float(str(probed.value).rsplit("no request for ", 1)[1].split("s more")[0])
    assert MAX_THROTTLE_SECONDS - 5 < left <= MAX_THROTTLE_SECONDS


def _counter(port: int, name: str) -> float | None:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    return None


@pytest.mark.parametrize("form", ["grpc RESOURCE_EXHAUSTED", "http 429 seconds"])
def test_the_daemon_sends_a_throttling_receiver_nothing_inside_its_window(agent_db, tmp_path, form):
    """Four answers asking for 3 s each: a poll fails on them (two attempts each), the daemon backs off
    0.5 s and probes every 0.5 s, yet no request, poll or probe, reaches the receiver before it asked."""
    throttle = Throttle(seconds=3.0, answers=4)
    receiver, endpoint = _receiver(form, throttle)
    port = free_port()
    sections = bridge_sections(
        agent_db,
        tmp_path,
        endpoint,
        FORMS[form][0],
        poll={"interval_seconds": 0.5, "retry_initial_seconds": 0.5, "retry_max_seconds": 1},
        export={"max_attempts": 2},
        metrics={"enabled": True, "port": port},
    )
    traces = set(add_finished_runs(agent_db, 5))
    daemon = DaemonProcess(write_config(tmp_path / "c.toml", sections), tmp_path / "daemon.log")
    try:
        wait_for(lambda: received_roots(receiver) >= traces, 60, "the runs, once the receiver takes them")
        throttled = _counter(port, "run_otel_export_throttled_total")
    finally:
        assert daemon.terminate() == 0
        receiver.stop()
    output = daemon.output()
    # The precondition: the throttle failed polls, so retries and probes had reason to come early.
    assert throttle.given == 4 and "poll failed" in output, output
    assert "as the receiver asked" in output
    assert throttle.inside == 0, (throttle.inside, [round(t - throttle.arrivals[0], 2) for t in throttle.arrivals])
    assert throttled == 4


def test_ratings_wait_for_the_window_a_refused_log_record_opened(agent_db, tmp_path):
    """The log records go to the traces' receiver: a window it opens on a log record holds the next
    rating's spans too, though another sink sends them."""
    throttle = Throttle(seconds=4.0, answers=1)
    receiver = Receiver(logs=True, throttle=throttle, throttle_services=("logs",))
    receiver.start()
    first, second = add_finished_runs(agent_db, 2)
    sections = bridge_sections(
        agent_db,
        tmp_path,
        f"http://{receiver.endpoint}",
        export={"max_attempts": 1},
        feedback={"interval_seconds": 0.5, "log_records": True},
    )
    daemon = DaemonProcess(write_config(tmp_path / "c.toml", sections), tmp_path / "daemon.log")
    try:
        wait_for(lambda: received_roots(receiver) >= {first, second}, 60, "the runs")
        rate(agent_db, [f"run-{uuid.UUID(first)}"], "UP")
        wait_for(lambda: throttle.given == 1, 30, "the first rating's log record to be throttled")
        rated = time.monotonic()  # the next feedback pass, within a second, sends the second rating
        rate(agent_db, [f"run-{uuid.UUID(second)}"], "DOWN")
        wait_for(lambda: second in {s.trace_id.hex() for s in feedback_spans(receiver)}, 30, "the second rating")
    finally:
        assert daemon.terminate() == 0
        receiver.stop()
    # The precondition: the second rating was given well inside the window, so its pass came inside it.
    assert throttle.until - rated > 2, throttle.until - rated
    assert "log records not accepted" in daemon.output()
    assert throttle.inside == 0, [round(t - throttle.until, 2) for t in throttle.arrivals]
