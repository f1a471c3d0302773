"""A receiver slower than export.timeout_seconds, and one that comes back after an outage, on a real
MariaDB: the backlog drains with few duplicates, the log names the setting to raise, readiness
follows the acknowledged requests, and a receiver back up is used before the backoff ends."""

from __future__ import annotations

import re
import time

import pytest
import requests
from helpers import DaemonProcess, bridge_sections, received_roots, run_cli, terminal_trace_ids, utc_now_naive, write_config
from servers import HttpReceiver, Receiver, free_port, wait_for

from run_otel.ops.demo import generate, insert_workload

pytestmark = pytest.mark.server

# Scaled down from 10 s against a receiver answering in 15-20 s: the same ratio, in seconds.
SLOW = (1.5, 1.9)
TIMEOUT = 1.0


def seed(agent_db, runs: int, seed_value: int) -> None:
    insert_workload(agent_db.engine(), generate(seed_value, runs, anchor=utc_now_naive()))


# Each protocol's receiver, and the word its sink's log gives a request that got no answer in time.
SLOW_RECEIVERS = {
    "grpc": (lambda: Receiver(delay=SLOW), lambda r: r.endpoint, "DEADLINE_EXCEEDED"),
    "http/protobuf": (lambda: HttpReceiver(delay=SLOW), lambda r: r.endpoint("http"), "ReadTimeout"),
}


@pytest.mark.parametrize("protocol", SLOW_RECEIVERS)
def test_once_behind_a_receiver_slower_than_the_timeout_drains_and_says_which_setting_to_raise(agent_db, tmp_path, protocol):
    seed(agent_db, 30, 41)
    make, endpoint, timed_out_word = SLOW_RECEIVERS[protocol]
    receiver = make()
    receiver.start()
    path = write_config(
        tmp_path / "run-otel.toml",
        bridge_sections(
            agent_db,
            tmp_path,
            endpoint(receiver),
            protocol,
            poll={"batch_size": 10},
            export={"timeout_seconds": TIMEOUT, "max_timeout_seconds": 4},
        ),
    )
    try:
        done = run_cli("once", "--config", str(path), timeout=120)
    finally:
        receiver.stop()
    assert done.returncode == 0, done.stderr
    assert received_roots(receiver) >= terminal_trace_ids(agent_db)
    assert "no answer within 1s (export.timeout_seconds = 1)" in done.stderr
    assert "raise export.timeout_seconds" in done.stderr
    # Each request reached the receiver at most twice: the copy whose answer came too late, then
    # the one under the longer deadline, which every later request keeps.
    spans = [span.span_id for _r, _s, span in receiver.spans()]
    assert len(spans) <= 2 * len(set(spans))
    timed_out = done.stderr.count(timed_out_word)
    assert 1 <= timed_out <= 2, done.stderr


def test_readiness_stays_up_while_a_slow_receiver_acknowledges_a_long_drain(agent_db, tmp_path):
    receiver = Receiver(delay=SLOW)
    receiver.start()
    port = free_port()
    path = write_config(
        tmp_path / "run-otel.toml",
        bridge_sections(
            agent_db,
            tmp_path,
            receiver.endpoint,
            poll={"batch_size": 5, "interval_seconds": 0.3},
            export={"timeout_seconds": 3, "max_timeout_seconds": 6},
            metrics={"enabled": True, "port": port},
        ),
    )
    daemon = DaemonProcess(path, tmp_path / "daemon.log")
    samples: list[tuple[int, str]] = []
    try:
        ready = f"http://127.0.0.1:{port}/readyz"
        wait_for(lambda: _status(ready)[0] == 200, 60, "the daemon's first (empty) poll to make it ready")
        seed(agent_db, 30, 42)
        wanted = terminal_trace_ids(agent_db)
        wait_for(lambda: receiver.requests, 60, "the drain to begin")
        while not received_roots(receiver) >= wanted:
            samples.append(_status(ready))
            time.sleep(0.25)
            assert len(samples) < 400, "the drain took over 100 s"
    finally:
        assert daemon.terminate() == 0
        receiver.stop()
    # The precondition: the drain outlasted three poll intervals many times over, so a readiness
    # that waited for the poll to finish would have gone 503.
    assert len(receiver.requests) >= 6 and len(samples) > 3 * 0.9 / 0.25
    assert [s for s in samples if s[0] != 200] == [], samples
    assert any("draining" in why for _code, why in samples)


def _status(url: str) -> tuple[int, str]:
    try:
        reply = requests.get(url, timeout=2)
    except requests.RequestException as exc:
        return 0, str(exc)
    return reply.status_code, reply.text.strip()


def test_a_receiver_back_from_an_outage_is_used_before_the_backoff_ends(agent_db, tmp_path):
    seed(agent_db, 20, 43)
    receiver = Receiver(port=free_port())  # not started: the endpoint refuses
    path = write_config(
        tmp_path / "run-otel.toml",
        bridge_sections(
            agent_db,
            tmp_path,
            receiver.endpoint,
            poll={"interval_seconds": 0.5, "retry_initial_seconds": 1, "retry_max_seconds": 60},
            export={"max_attempts": 1, "timeout_seconds": 2},
        ),
    )
    daemon = DaemonProcess(path, tmp_path / "daemon.log")
    try:
        # The fourth failure backs off about 8 s: long enough to tell a probe from the backoff.
        wait_for(lambda: daemon.output().count("poll failed") >= 4, 60, "four failed polls")
        announced = float(re.findall(r"retrying in ([\d.]+)s", daemon.output())[-1])
        assert announced >= 6, daemon.output()
        receiver.start()
        back = time.monotonic()
        wait_for(lambda: "recovered" in daemon.output(), 60, "the recovery line")
        waited = time.monotonic() - back
    finally:
        assert daemon.terminate() == 0
        receiver.stop()
    assert waited < announced / 2, (waited, announced)
    assert "answers again; polled then rather than in" in daemon.output()
    assert received_roots(receiver) >= terminal_trace_ids(agent_db)


def test_a_receiver_restarted_on_its_port_after_a_long_outage_is_used_within_an_interval(agent_db, tmp_path):
    """gRPC holds a channel's connection failure for its reconnect backoff, which grows with the
    outage (to two minutes): every request meanwhile failed at once with the old "Connection
    refused", and export resumed many seconds after the receiver listened again."""
    import json
    from datetime import datetime

    interval = 2.0
    # The ratings' log records go to the same receiver, over a channel of their own.
    receiver = Receiver(port=free_port(), logs=True)
    receiver.start()
    seed(agent_db, 10, 44)
    path = write_config(
        tmp_path / "run-otel.toml",
        bridge_sections(
            agent_db,
            tmp_path,
            receiver.endpoint,
            # The failed poll is retried after 48 s at the soonest: only the probe can find the receiver back.
            poll={"interval_seconds": interval, "retry_initial_seconds": 60, "retry_max_seconds": 60},
            export={"max_attempts": 1, "timeout_seconds": 2},
            feedback={"interval_seconds": 1, "log_records": True},
            log={"format": "json"},
        ),
    )
    daemon = DaemonProcess(path, tmp_path / "daemon.log")
    try:
        wait_for(lambda: received_roots(receiver) >= terminal_trace_ids(agent_db), 60, "the first runs")
        wait_for(lambda: receiver.log_requests, 30, "the ratings' log records")
        receiver.stop()
        first = received_roots(receiver)
        seed(agent_db, 10, 45)  # these finish while nobody listens
        wait_for(lambda: daemon.output().count("poll failed") >= 1, 30, "a failed poll")
        time.sleep(30)  # the probes' connection attempts grow gRPC's reconnect backoff past ten seconds
        receiver = Receiver(port=receiver.port, logs=True)
        receiver.start()
        listening, back = time.time(), time.monotonic()
        wait_for(lambda: received_roots(receiver) | first >= terminal_trace_ids(agent_db), 120, "the runs after the outage", 0.1)
        resumed = time.monotonic() - back
        time.sleep(1)  # any late line about the outage would be written by now
    finally:
        assert daemon.terminate() == 0
        receiver.stop()
    # gRPC's C core writes a line of its own to stderr when the receiver goes away (GOAWAY), not JSON.
    records = [json.loads(line) for line in daemon.output().splitlines() if line.startswith("{")]
    after = [r for r in records if datetime.fromisoformat(r["time"].replace("Z", "+00:00")).timestamp() > listening + 0.5]
    # The precondition: the outage was seen, in the words it had while nobody listened.
    assert any("Connection refused" in r["message"] for r in records), [r["message"] for r in records]
    assert resumed < interval + 3, resumed
    assert [r["message"] for r in after if "Connection refused" in r["message"]] == []
    back_lines = [r["message"] for r in records if "recovered" in r["message"] or "answers again" in r["message"]]
    assert len(back_lines) == 1 and "answers again" in back_lines[0], back_lines
