"""A database that stops answering without closing the connection (a frozen server, a hung proxy
or load balancer), played by a TCP proxy that stops forwarding: the poll fails within
source.statement_timeout_seconds + source.connect_timeout_seconds, and /readyz goes down after
three poll intervals, since no OTLP request is in flight. Before, the pool's pre-ping and the
reconnect each waited out the socket backstop, and /readyz called the database read a request in
flight for a minute."""

from __future__ import annotations

import time

import pytest
from conftest import DRIVERS
from helpers import DaemonProcess, add_finished_runs, bridge_sections, http_status, received_roots, write_config
from servers import StallingProxy, free_port, wait_for, with_driver

STATEMENT, CONNECT, INTERVAL = 6.0, 2.0, 1.0
BOUND = STATEMENT + CONNECT  # the documented bound on a poll against a database that stops answering
# Where the stall finds a pooled connection: PyMySQL pings it and reconnects, each under the connect
# timeout; mysql-connector's C extension reuses it unpinged, and the statement ends at the backstop.
EXPECTED = {"pymysql": 2 * CONNECT, "mysqlconnector": BOUND}


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_poll_against_a_stalled_database_fails_within_the_bound_and_readiness_drops(agent_db, receiver, tmp_path, driver):
    proxy = StallingProxy(agent_db.server.port).start()
    url = with_driver(agent_db.url, driver).replace(f":{agent_db.server.port}/", f":{proxy.port}/")
    port = free_port()
    sections = bridge_sections(
        agent_db,
        tmp_path,
        receiver.endpoint,
        source={"url": url, "statement_timeout_seconds": STATEMENT, "connect_timeout_seconds": CONNECT},
        poll={"interval_seconds": INTERVAL, "retry_initial_seconds": 1, "retry_max_seconds": 2},
        metrics={"enabled": True, "port": port},
    )
    traces = set(add_finished_runs(agent_db, 3))
    daemon = DaemonProcess(write_config(tmp_path / "c.toml", sections), tmp_path / "daemon.log")
    ready = f"http://127.0.0.1:{port}/readyz"
    try:
        wait_for(lambda: received_roots(receiver) >= traces and http_status(ready) == 200, 60, "the runs, and ready")
        time.sleep(2 * INTERVAL)  # polls go on through the proxy: its connections are pooled
        assert http_status(ready) == 200 and "poll failed" not in daemon.output(), daemon.output()
        proxy.stall()
        stalled = time.monotonic()
        failed = not_ready = None
        while time.monotonic() - stalled < BOUND + 20 and (failed is None or not_ready is None):
            if not_ready is None and http_status(ready) == 503:
                not_ready = time.monotonic() - stalled
            if failed is None and "poll failed" in daemon.output():
                failed = time.monotonic() - stalled
            time.sleep(0.1)
        proxy.resume()
        wait_for(lambda: http_status(ready) == 200, 60, "ready again once the database answers")
    finally:
        assert daemon.terminate() == 0
        proxy.stop()
    output = daemon.output()
    # A poll starts within an interval of the stall; a second of slack for a machine under load.
    assert EXPECTED[driver] <= BOUND and failed is not None and failed < EXPECTED[driver] + INTERVAL + 1, (failed, output)
    assert not_ready is not None and not_ready < 3 * INTERVAL + 1.5, not_ready
    assert "lost the connection" in output and "recovered" in output, output
