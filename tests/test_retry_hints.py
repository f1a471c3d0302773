"""A receiver that asks for a delay gets it: gRPC RetryInfo and HTTP Retry-After."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from servers import answer, free_port

from run_otel.config import build_config
from run_otel.factory import build_sink

EMPTY = trace_service_pb2.ExportTraceServiceRequest().SerializeToString()


class _Busy(trace_service_pb2_grpc.TraceServiceServicer):
    """RESOURCE_EXHAUSTED with RetryInfo(1.5 s) the first time, then accepts."""

    def __init__(self):
        self.calls: list[float] = []

    def Export(self, request, context):
        self.calls.append(time.monotonic())
        if len(self.calls) == 1:
            detail = any_pb2.Any()
            detail.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=1, nanos=500_000_000)))
            status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message="slow down", details=[detail])
            context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down")
        return trace_service_pb2.ExportTraceServiceResponse()


def test_grpc_retry_info_sets_the_wait(caplog):
    servicer, port = _Busy(), free_port()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    sink = build_sink(build_config({"export": {"endpoint": f"127.0.0.1:{port}", "max_attempts": 3}}))
    try:
        with caplog.at_level("WARNING"):
            sink.send(EMPTY)
    finally:
        sink.close()
        server.stop(0)
    assert len(servicer.calls) == 2
    assert 1.45 <= servicer.calls[1] - servicer.calls[0] < 2.5
    assert "retrying in 1.5s (as the receiver asked)" in caplog.text


def test_http_retry_after_sets_the_wait(caplog):
    calls: list[float] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            calls.append(time.monotonic())
            if len(calls) == 1:
                self.send_response(503)
                self.send_header("Retry-After", "2")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            answer(self, 200, "application/x-protobuf", trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

        def log_message(self, *_args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = build_config({"export": {"protocol": "http/protobuf", "endpoint": f"http://127.0.0.1:{server.server_address[1]}"}})
    sink = build_sink(config)
    try:
        with caplog.at_level("WARNING"):
            sink.send(EMPTY)
    finally:
        sink.close()
        server.shutdown()
    assert len(calls) == 2
    assert 1.95 <= calls[1] - calls[0] < 3.0
    assert "retrying in 2.0s (as the receiver asked)" in caplog.text
