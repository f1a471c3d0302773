"""How the sinks reach a receiver, without a server: the deadline behind a slow receiver, the TLS
settings and which wins, the plaintext-credential warning, the hints for a TLS or protocol mismatch,
and readiness while a backlog drains."""

from __future__ import annotations

import time

import pytest
from helpers import bridge_metrics

from run_otel.config import ConfigError, build_config, load_config
from run_otel.export.deadline import Deadline
from run_otel.export.transport import Explained, explain, grpc_target, logs_tls, traces_tls, transport_warnings
from run_otel.telemetry.health import readiness

# -- the deadline -------------------------------------------------------------------


def test_a_request_that_times_out_gets_twice_the_deadline_up_to_the_cap_and_the_words_name_the_setting():
    deadline = Deadline(10, 60)
    said = deadline.exceeded(10)
    assert deadline.seconds == 20
    assert "no answer within 10s (export.timeout_seconds = 10)" in said
    assert "raise export.timeout_seconds" in said
    deadline.exceeded(20)
    deadline.exceeded(40)
    assert deadline.seconds == 60  # capped
    assert "raise export.max_timeout_seconds" in deadline.exceeded(60)
    assert deadline.seconds == 60


def test_the_longer_deadline_is_kept_while_the_receiver_is_slow_and_dropped_when_it_is_fast_again():
    deadline = Deadline(10, 60)
    deadline.exceeded(10)
    deadline.answered(17)  # slower than export.timeout_seconds: the next request would time out at 10 s
    assert deadline.seconds == 20
    deadline.answered(0.2)
    assert deadline.seconds == 10


def test_a_cap_below_the_timeout_never_shortens_it():
    deadline = Deadline(30, 5)
    assert deadline.seconds == 30
    deadline.exceeded(30)
    assert deadline.seconds == 30


# -- TLS settings ------------------------------------------------------------------------


@pytest.fixture
def pems(tmp_path):
    names = ("ca.pem", "client.pem", "client.key", "logs-ca.pem", "other-ca.pem")
    for name in names:
        (tmp_path / name).write_text("-----BEGIN CERTIFICATE-----\n")
    return {name: str(tmp_path / name) for name in names}


def test_the_standard_certificate_variables_set_the_keys_and_the_traces_one_wins(pems):
    env = {
        "OTEL_EXPORTER_OTLP_CERTIFICATE": pems["ca.pem"],
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": pems["other-ca.pem"],
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": pems["client.pem"],
        "OTEL_EXPORTER_OTLP_CLIENT_KEY": pems["client.key"],
        "OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE": pems["logs-ca.pem"],
    }
    export = load_config(None, env).export
    assert traces_tls(export).ca == pems["other-ca.pem"]
    assert (traces_tls(export).cert, traces_tls(export).key) == (pems["client.pem"], pems["client.key"])
    logs = logs_tls(export)
    assert logs.ca == pems["logs-ca.pem"]
    assert (logs.cert, logs.key) == (pems["client.pem"], pems["client.key"])  # the general pair


def test_the_log_records_take_the_general_variable_not_the_traces_one(pems):
    env = {"OTEL_EXPORTER_OTLP_CERTIFICATE": pems["ca.pem"], "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": pems["other-ca.pem"]}
    export = load_config(None, env).export
    assert (traces_tls(export).ca, logs_tls(export).ca) == (pems["other-ca.pem"], pems["ca.pem"])


def test_a_variable_beats_the_file_key_and_a_run_otel_variable_beats_both(tmp_path, pems):
    path = tmp_path / "run-otel.toml"
    path.write_text(f'[export]\ncertificate = "{pems["ca.pem"]}"\n')
    assert load_config(path, {}).export.certificate == pems["ca.pem"]
    env = {"OTEL_EXPORTER_OTLP_CERTIFICATE": pems["other-ca.pem"]}
    assert load_config(path, env).export.certificate == pems["other-ca.pem"]
    env["RUN_OTEL_EXPORT__CERTIFICATE"] = pems["logs-ca.pem"]
    assert load_config(path, env).export.certificate == pems["logs-ca.pem"]


def test_a_missing_pem_file_or_half_a_client_pair_is_named(pems, tmp_path):
    with pytest.raises(ConfigError, match="export.certificate: no such file"):
        build_config({"export": {"certificate": str(tmp_path / "nope.pem")}})
    with pytest.raises(ConfigError, match="OTEL|export.client_key"):
        load_config(None, {"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": pems["client.pem"]})
    with pytest.raises(ConfigError, match="export.logs_client_certificate and export.logs_client_key go together"):
        build_config({"export": {"logs_client_key": pems["client.key"]}})


def test_a_certificate_turns_tls_on_for_an_endpoint_without_a_scheme(pems):
    plain = build_config({"export": {"endpoint": "collector:4317"}}).export
    assert not grpc_target("collector:4317", plain, traces_tls(plain)).secure
    with_ca = build_config({"export": {"endpoint": "collector:4317", "certificate": pems["ca.pem"]}}).export
    assert grpc_target("collector:4317", with_ca, traces_tls(with_ca)).secure
    assert not grpc_target("http://collector:4317", with_ca, traces_tls(with_ca)).secure  # the scheme says plaintext


# -- credentials in plaintext ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("protocol", "endpoint", "warned"),
    [
        ("grpc", "collector.example:4317", True),
        ("grpc", "http://10.0.0.7:4317", True),
        ("http/protobuf", "http://collector.example:4318", True),
        ("grpc", "https://collector.example:4317", False),
        ("http/protobuf", "https://collector.example:4318", False),
        ("grpc", "localhost:4317", False),
        ("grpc", "127.0.0.1:4317", False),
        ("http/protobuf", "http://[::1]:4318", False),
    ],
)
def test_credentials_over_plaintext_beyond_loopback_are_warned(protocol, endpoint, warned):
    export = build_config(
        {"export": {"protocol": protocol, "endpoint": endpoint, "headers": {"Authorization": "Bearer abcdefgh12345678"}}}
    ).export
    found = transport_warnings(export, endpoint)
    assert bool(found) == warned, found
    if warned:
        assert "export.headers Authorization travel over" in found[0]
        assert "abcdefgh12345678" not in found[0]


def test_a_header_that_is_no_credential_is_not_warned():
    export = build_config({"export": {"endpoint": "collector.example:4317", "headers": {"x-scope-orgid": "tenant-1"}}}).export
    assert transport_warnings(export, "collector.example:4317") == []
    keyed = build_config({"export": {"endpoint": "collector.example:4317", "headers": {"x-api-key": "k" * 20}}}).export
    assert "x-api-key" in transport_warnings(keyed, "collector.example:4317")[0]


# -- what a failure means -------------------------------------------------------------------


def test_the_hints_name_the_setting_to_change():
    verify = explain("UNAVAILABLE: Ssl handshake failed: CERTIFICATE_VERIFY_FAILED", "grpc", "h:4317")
    assert verify.text.startswith("TLS verification failed") and "export.certificate" in verify.text and verify.permanent
    mtls = explain("UNAVAILABLE: Ssl handshake failed: TLSV13_ALERT_CERTIFICATE_REQUIRED", "grpc", "h:4317")
    assert "export.client_certificate" in mtls.text and mtls.permanent
    closed = explain("UNAVAILABLE: ipv4:127.0.0.1:4317: Socket closed", "grpc", "h:4317", tls_without_client=True)
    assert "export.client_certificate" in closed.text and not closed.permanent  # a restarting receiver says the same
    assert explain("UNAVAILABLE: Socket closed", "grpc", "h:4317").text == "UNAVAILABLE: Socket closed"
    http1 = explain("UNAVAILABLE: Trying to connect an http1.x server (HTTP status 400)", "grpc", "h:4318")
    assert 'export.protocol = "http/protobuf"' in http1.text and http1.permanent
    assert explain("UNAVAILABLE: Connection refused", "grpc", "h:4317") == Explained("UNAVAILABLE: Connection refused")
    h2 = explain("ConnectionError: BadStatusLine: the answer is not HTTP/1.1 but HTTP/2 frames", "http/protobuf", "u")
    assert 'export.protocol = "grpc"' in h2.text and h2.permanent
    reset = explain("ConnectionError: ('Connection aborted.', ConnectionResetError(104, 'reset'))", "http/protobuf", "u")
    assert 'if u is a gRPC port: set export.protocol = "grpc"' in reset.text and not reset.permanent


@pytest.mark.server
def test_an_otlp_http_export_to_a_grpc_port_names_the_protocol_and_writes_no_frame_bytes():
    from servers import Receiver

    from run_otel.export.sinks import ExportError, HttpSink

    receiver = Receiver()
    receiver.start()
    try:
        export = build_config({"export": {"protocol": "http/protobuf", "endpoint": f"http://{receiver.endpoint}"}}).export
        sink = HttpSink(export)
        with pytest.raises(ExportError) as failed:
            sink.send(b"")
        sink.close()
    finally:
        receiver.stop()
    text = str(failed.value)
    assert "answers gRPC, not OTLP/HTTP" in text and 'export.protocol = "grpc"' in text, text
    assert "\\x00" not in text and "\x00" not in text
    assert not receiver.spans()  # nothing reached it as a trace


# -- readiness while a backlog drains ------------------------------------------------------------


def test_readiness_follows_requests_in_flight_and_acknowledged_while_a_long_poll_drains():
    metrics = bridge_metrics(build_config({}), readers=[])
    offset = [0.0]  # the readiness clock runs this far ahead of the times the metrics recorded
    ready = readiness(metrics, interval=5, request_seconds=60, clock=lambda: time.time() + offset[0])
    metrics.poll_finished(0.1, ok=True, pending=0)
    assert ready() == (True, "ready")
    offset[0] = 16  # no poll finished for three intervals, and no request is in flight: a poll waits on the database
    assert ready() == (False, "not ready: no poll finished and no request was acknowledged for 16s")
    metrics.request_sending(True)
    offset[0] = 40  # a request of the drain has been in flight for 40 s, within the longest deadline
    assert ready() == (True, "ready: a request is in flight for 40s; the last poll finished 40s ago")
    metrics.request_acknowledged()
    metrics.request_sending(False)
    metrics.last_success -= 30  # the poll that drains began after the last one finished, 30 s earlier
    offset[0] = 10
    assert ready() == (True, "ready: a poll is draining; the last request was acknowledged 10s ago")
    metrics.request_sending(True)
    assert ready() == (True, "ready: a poll is draining; a request is in flight for 10s, the last was acknowledged 10s ago")
    offset[0] = 61  # past the longest deadline, the request in flight no longer counts
    assert ready() == (
        False,
        "not ready: no poll finished and no request was acknowledged for 61s; a request has waited 61s for its answer",
    )
    metrics.request_sending(False)
    offset[0] = 0
    metrics.request_acknowledged()
    metrics.poll_finished(1.0, ok=False, pending=0, failed="sending to the OTLP endpoint")  # after the last progress
    assert ready() == (False, "not ready: the last poll failed (sending to the OTLP endpoint); see the log")
    metrics.request_acknowledged()  # the next poll's first request: progress again
    assert ready()[0]


def test_readiness_before_any_poll_is_not_ready():
    metrics = bridge_metrics(build_config({}), readers=[])
    assert readiness(metrics, 5, 60)() == (False, "not ready: no poll has finished yet")
