"""A collector killed right after it acknowledged run-otel's requests loses none of them: the
shipped config/otel-collector.yaml and config/otel-gateway.yaml keep their sending queue on disk,
and the restarted collector sends what it holds. The real collectors built from source, Jaeger v2
and MariaDB; the backend is away while the collector takes the requests, so every one of them is
still in its queue when it is killed."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import bridge_sections, received_roots, run_cli, seed, terminal_trace_ids, write_config
from servers import Collector, Gateway, Jaeger, Receiver, wait_for

pytestmark = pytest.mark.server  # the Go peers

RUNS = 300
QUEUE_SIZE = "otelcol_exporter_queue_size"


def in_jaeger(jaeger: Jaeger, wanted: set[str], found: set[str]) -> set[str]:
    """The wanted trace ids Jaeger has, asking only for those not found before."""
    for trace_id in sorted(wanted - found):
        if jaeger.trace(trace_id):
            found.add(trace_id)
    return found


def export_through(grpc_port: int, agent_db, tmp_path: Path) -> None:
    # Requests of 64 KiB: the runs go as many requests, each acknowledged on its own.
    sections = bridge_sections(agent_db, tmp_path, f"http://127.0.0.1:{grpc_port}", export={"max_request_bytes": 65536})
    done = run_cli("once", "--config", str(write_config(tmp_path / "run-otel.toml", sections)))
    assert done.returncode == 0, done.stdout + done.stderr  # 0: every request was acknowledged


def test_runs_the_collector_acknowledged_survive_its_sigkill(agent_db, tmp_path):
    seed(agent_db, RUNS, seed_value=41, waiting=0)
    runs = terminal_trace_ids(agent_db)
    assert len(runs) > RUNS * 0.9  # the demo mix leaves a few running, which are not sent
    tempo = Receiver()  # Tempo's exporter sends here; only Jaeger is away
    tempo.start()
    jaeger = Jaeger(tmp_path)  # its ports chosen, nothing listening on them yet
    collector = Collector(tmp_path, f"127.0.0.1:{jaeger.otlp_port}", tempo.endpoint)
    try:
        collector.start()
        export_through(collector.grpc_port, agent_db, tmp_path)
        # The precondition: what run-otel was told is delivered sits in the collector, not in Jaeger.
        held = collector.metric(QUEUE_SIZE, exporter="otlp_grpc/jaeger")
        assert held > 0, "the Jaeger exporter's queue is empty: the kill below would prove nothing"
        collector.kill()

        jaeger.start()
        assert not in_jaeger(jaeger, runs, set()), "Jaeger had runs before the collector sent any"
        collector.start()  # the same config and queue directory, as a restarted container or unit has
        found: set[str] = set()
        try:
            wait_for(lambda: in_jaeger(jaeger, runs, found) == runs, 90, "every acknowledged run in Jaeger", 1)
        except TimeoutError:
            pytest.fail(f"{len(runs - found)} of {len(runs)} acknowledged runs lost in the collector's crash")
    finally:
        collector.stop()
        jaeger.stop()
        tempo.stop()
    assert "file_storage" in (tmp_path / "otelcol.log").read_text()  # the queue went by the extension


def test_runs_the_gateway_acknowledged_survive_its_sigkill(agent_db, tmp_path):
    seed(agent_db, RUNS, seed_value=43, waiting=0)
    runs = terminal_trace_ids(agent_db)
    assert len(runs) > RUNS * 0.9
    backend = Receiver()  # the second tier: its port chosen, nothing listening on it yet
    gateway = Gateway(tmp_path, backend.port)
    try:
        gateway.start()
        export_through(gateway.grpc_port, agent_db, tmp_path)
        held = gateway.metric(QUEUE_SIZE, exporter="loadbalancing")
        assert held > 0, "the gateway's queue is empty: the kill below would prove nothing"
        gateway.kill()

        backend.start()
        gateway.start()
        try:
            wait_for(lambda: received_roots(backend) >= runs, 90, "every acknowledged run at the second tier", 1)
        except TimeoutError:
            pytest.fail(f"{len(runs - received_roots(backend))} of {len(runs)} acknowledged runs lost in the gateway's crash")
    finally:
        gateway.stop()
        backend.stop()
