"""Receivers behind a private CA, with and without mTLS, on gRPC and HTTP; a gRPC export to an
HTTP/1.1 port; credentials over plaintext. Each against a real MariaDB, with `check` and `once`
as an operator runs them."""

from __future__ import annotations

import pytest
from helpers import DaemonProcess, bridge_sections, received_roots, run_cli, terminal_trace_ids, utc_now_naive, write_config
from servers import HttpReceiver, Receiver, wait_for
from tls_material import private_ca

from run_otel.ops.demo import generate, insert_workload

pytestmark = pytest.mark.server


@pytest.fixture
def ca(tmp_path):
    return private_ca(tmp_path / "pki")


def seed(agent_db, runs: int = 8) -> None:
    insert_workload(agent_db.engine(), generate(51, runs, anchor=utc_now_naive()))


def config(agent_db, tmp_path, endpoint: str, protocol: str = "grpc", **export):
    sections = bridge_sections(agent_db, tmp_path, endpoint, protocol, export={"max_attempts": 1, **export})
    return str(write_config(tmp_path / "run-otel.toml", sections))


def endpoint_line(checked) -> str:
    return next(line for line in checked.stdout.splitlines() if "otlp endpoint" in line)


def test_grpc_receiver_behind_a_private_ca_is_refused_as_unverified_then_reached_with_the_standard_variable(
    agent_db, tmp_path, ca
):
    seed(agent_db)
    receiver = Receiver(tls=ca.server.read())
    receiver.start()
    path = config(agent_db, tmp_path, f"https://localhost:{receiver.port}")
    try:
        refused = run_cli("check", "--config", path)
        assert "TLS verification failed" in endpoint_line(refused), refused.stdout
        assert "export.certificate (OTEL_EXPORTER_OTLP_CERTIFICATE)" in endpoint_line(refused)
        assert receiver.requests == []
        env = {"OTEL_EXPORTER_OTLP_CERTIFICATE": str(ca.ca)}
        checked = run_cli("check", "--config", path, env=env)
        assert "accepted an empty export" in endpoint_line(checked), checked.stdout
        done = run_cli("once", "--config", path, env=env)
    finally:
        receiver.stop()
    assert done.returncode == 0, done.stderr
    assert received_roots(receiver) >= terminal_trace_ids(agent_db)


def test_http_receiver_behind_a_private_ca_with_the_traces_variable(agent_db, tmp_path, ca):
    seed(agent_db)
    receiver = HttpReceiver(ca.server.cert, ca.server.key)
    receiver.start()
    path = config(agent_db, tmp_path, receiver.endpoint(), "http/protobuf")
    try:
        refused = run_cli("check", "--config", path)
        assert "TLS verification failed" in endpoint_line(refused), refused.stdout
        env = {"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": str(ca.ca)}
        done = run_cli("once", "--config", path, env=env)
    finally:
        receiver.stop()
    assert done.returncode == 0, done.stderr
    assert len(receiver.bodies) >= 1


def test_grpc_mtls_needs_the_client_pair_from_the_standard_variables(agent_db, tmp_path, ca):
    seed(agent_db)
    receiver = Receiver(tls=ca.server.read(), client_ca=ca.ca.read_bytes())
    receiver.start()
    path = config(agent_db, tmp_path, f"localhost:{receiver.port}", certificate=str(ca.ca))
    try:
        refused = run_cli("check", "--config", path)
        assert "export.client_certificate and export.client_key" in endpoint_line(refused), refused.stdout
        env = {"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": str(ca.client.cert), "OTEL_EXPORTER_OTLP_CLIENT_KEY": str(ca.client.key)}
        done = run_cli("once", "--config", path, env=env)
    finally:
        receiver.stop()
    assert done.returncode == 0, done.stderr
    assert received_roots(receiver) >= terminal_trace_ids(agent_db)


def test_http_mtls_with_the_config_keys(agent_db, tmp_path, ca):
    seed(agent_db)
    receiver = HttpReceiver(ca.server.cert, ca.server.key, client_ca=ca.ca)
    receiver.start()
    without = config(agent_db, tmp_path, receiver.endpoint(), "http/protobuf", certificate=str(ca.ca))
    try:
        refused = run_cli("check", "--config", without)
        assert "TLS handshake refused" in endpoint_line(refused), refused.stdout
        with_pair = config(
            agent_db,
            tmp_path,
            receiver.endpoint(),
            "http/protobuf",
            certificate=str(ca.ca),
            client_certificate=str(ca.client.cert),
            client_key=str(ca.client.key),
        )
        done = run_cli("once", "--config", with_pair)
    finally:
        receiver.stop()
    assert done.returncode == 0, done.stderr
    assert len(receiver.bodies) >= 1


def test_a_grpc_export_to_an_http_port_says_to_switch_the_protocol(agent_db, tmp_path):
    seed(agent_db)
    receiver = HttpReceiver()  # OTLP/HTTP over HTTP/1.1, where gRPC needs HTTP/2
    receiver.start()
    path = config(agent_db, tmp_path, f"127.0.0.1:{receiver.port}")
    try:
        done = run_cli("once", "--config", path)
        checked = run_cli("check", "--config", path)
    finally:
        receiver.stop()
    assert done.returncode != 0
    hint = 'set export.protocol = "http/protobuf" for an OTLP/HTTP port (4318)'
    assert hint in done.stderr, done.stderr
    assert hint in endpoint_line(checked)


def test_a_credential_over_plaintext_beyond_loopback_is_warned_by_check_and_at_start(agent_db, tmp_path):
    secret = "Bearer s3cr3t-token-1234567890"
    path = write_config(
        tmp_path / "run-otel.toml",
        bridge_sections(
            agent_db, tmp_path, "collector.invalid:4317", export={"headers": {"Authorization": secret}, "timeout_seconds": 1}
        ),
    )
    checked = run_cli("check", "--config", str(path))
    warning = "export.headers Authorization travel over gRPC without TLS to collector.invalid"
    assert warning in checked.stdout, checked.stdout
    daemon = DaemonProcess(path, tmp_path / "daemon.log")
    try:
        wait_for(lambda: "starting" in daemon.output(), 60, "the start line")
        wait_for(lambda: warning in daemon.output(), 10, "the warning after it")
    finally:
        daemon.terminate()
    assert "s3cr3t-token" not in checked.stdout + checked.stderr + daemon.output()


def _metric_names(request) -> set[str]:
    return {m.name for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_bridges_own_metrics_reach_an_mtls_receiver_with_the_export_settings(agent_db, tmp_path, ca, protocol):
    """metrics.otlp pushes to the traces' endpoint: with the same CA, client pair and compression, set
    once in [export]."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    if protocol == "grpc":
        grpc_receiver = Receiver(tls=ca.server.read(), client_ca=ca.ca.read_bytes(), metrics=True)
        grpc_receiver.start()
        endpoint, stop = f"https://localhost:{grpc_receiver.port}", grpc_receiver.stop
    else:
        http_receiver = HttpReceiver(ca.server.cert, ca.server.key, client_ca=ca.ca)
        http_receiver.start()
        endpoint, stop = http_receiver.endpoint(), http_receiver.stop

    def pushed() -> list[tuple[ExportMetricsServiceRequest, dict]]:
        if protocol == "grpc":
            return list(grpc_receiver.metric_requests)
        import gzip

        return [
            (ExportMetricsServiceRequest.FromString(gzip.decompress(body)), headers)
            for path, headers, body in http_receiver.others
            if path == "/v1/metrics"
        ]

    sections = bridge_sections(
        agent_db,
        tmp_path,
        endpoint,
        protocol,
        export={
            "certificate": str(ca.ca),
            "client_certificate": str(ca.client.cert),
            "client_key": str(ca.client.key),
            "compression": "gzip",
        },
        metrics={"enabled": True, "prometheus": False, "otlp": True, "otlp_interval_seconds": 0.5},
    )
    daemon = DaemonProcess(write_config(tmp_path / "run-otel.toml", sections), tmp_path / "daemon.log")
    try:
        wait_for(lambda: pushed() and "starting" in daemon.output(), 30, "the bridge's metrics at the receiver")
    finally:
        assert daemon.terminate() == 0
        stop()
    request, headers = pushed()[0]
    assert "run_otel.start.timestamp" in _metric_names(request)
    if protocol == "http/protobuf":  # gRPC's server takes the grpc-encoding header away before the handler
        assert headers.get("Content-Encoding") == "gzip", headers
