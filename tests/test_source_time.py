"""Time at the edges, on a real MariaDB: a database clock apart from the host's, and a wrong
source.timezone that keeps a gauge and readiness telling and no longer holds runs for hours."""

from __future__ import annotations

import time

from helpers import add_finished_runs, bridge_config, bridge_metrics, bridge_sections, run_cli, write_config
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from run_otel.factory import build_parts, build_poller
from run_otel.telemetry import instruments as I
from run_otel.telemetry.health import readiness


def points(reader: InMemoryMetricReader, instrument: I.Instrument) -> list:
    data = reader.get_metrics_data()
    return [
        point
        for rm in (data.resource_metrics if data else ())
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == instrument.name
        for point in m.data.data_points
    ]


def test_a_database_clock_ahead_of_the_host_neither_delays_runs_nor_hides_in_the_delay(agent_db, receiver, tmp_path):
    # The host runs 90 s behind the database: the database's rows read 90 s in the host's future.
    host = lambda: time.time() - 90
    add_finished_runs(agent_db, 3, created="UTC_TIMESTAMP() - INTERVAL 5 SECOND")
    reader = InMemoryMetricReader()
    config = bridge_config(agent_db, tmp_path, receiver.endpoint, poll={"settle_seconds": 2})
    metrics = bridge_metrics(config, [reader])
    parts = build_parts(config, recorder=metrics)
    result = build_poller(parts, clock=host).poll()
    parts.close()

    assert result.run_count == 3 and result.pending == 0  # settled on the database's clock, not held 90 s
    (offset,) = points(reader, I.CLOCK_OFFSET)
    assert 88 < offset.value < 92
    (delay,) = points(reader, I.EXPORT_DELAY)
    assert delay.count == 3 and delay.sum < 3 * 10  # seconds after settling, as the database counts them
    metrics.shutdown()


def test_a_wrong_timezone_keeps_a_gauge_and_readiness_telling_and_holds_no_run_for_hours(agent_db, receiver, tmp_path):
    # The agent writes Asia/Shanghai times; the bridge is told UTC: every row reads 8 hours ahead.
    run_ids = add_finished_runs(agent_db, 2, created="UTC_TIMESTAMP() + INTERVAL 8 HOUR - INTERVAL 1 MINUTE")
    reader = InMemoryMetricReader()
    config = bridge_config(agent_db, tmp_path, receiver.endpoint, poll={"settle_seconds": 0})
    metrics = bridge_metrics(config, [reader])
    parts = build_parts(config, recorder=metrics)
    poller = build_poller(parts)
    first = poller.poll()
    second = poller.poll()  # and it stays said, poll after poll
    parts.close()

    assert first.run_count + second.run_count == len(run_ids)  # settled from when they were seen
    (suspect,) = points(reader, I.ZONE_SUSPECT)
    assert suspect.value == 1
    ready, why = readiness(metrics, config.poll.interval_seconds, config.export.max_timeout_seconds)()
    assert not ready and "source.timezone = 'UTC' looks wrong" in why and "Asia/Shanghai" in why, why
    metrics.shutdown()

    sections = bridge_sections(agent_db, tmp_path, receiver.endpoint)
    backfill = run_cli("backfill", "--since", "1h", "--config", str(write_config(tmp_path / "c.toml", sections)))
    assert backfill.returncode == 0, backfill.stderr
    assert "the window looks shifted" in backfill.stderr, backfill.stderr


def test_check_warns_of_a_database_clock_apart_from_settle_seconds_up(agent_db, receiver, tmp_path):
    from run_otel.ops.check import OK, WARN, run_checks

    config = bridge_config(agent_db, tmp_path, receiver.endpoint, poll={"settle_seconds": 2})

    def clock_line(offset: float):
        findings = run_checks(config, clock=lambda: time.time() - offset)
        return next(f for f in findings if f.what == "database clock")

    apart = clock_line(90)
    assert apart.level == WARN and apart.detail.startswith("90.") and "ahead of this host's (over 2s)" in apart.detail
    assert clock_line(-10).level == WARN and "behind" in clock_line(-10).detail
    assert clock_line(0.5).level == OK  # within settle_seconds: what a round trip and NTP leave
