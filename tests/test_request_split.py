"""The request split, in the fast loop: spans packed under export.max_request_bytes, and a request
the receiver refuses as too large sent again in halves, every span delivered once."""

from __future__ import annotations

import logging

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from run_otel.export.encoding import RequestFrame
from run_otel.export.sending import RequestSender
from run_otel.export.sinks import Ack, TooLarge
from run_otel.export.wire import RunSpans, WireSpans
from run_otel.mapping.limits import AttributeLimits
from run_otel.mapping.span_data import SpanData

ENCODER = RequestFrame({"service.name": "diagnosis-agent"})
WIRE = WireSpans(AttributeLimits())


class LimitedReceiver:
    """What a receiver with a smaller receive limit than ours does: refuses a request over it."""

    def __init__(self, limit: int):
        self.limit = limit
        self.accepted: list[list[bytes]] = []  # the span ids of each request taken
        self.refused = 0
        self.sizes: list[int] = []

    def send(self, request: bytes) -> Ack:
        if len(request) > self.limit:
            self.refused += 1
            raise TooLarge(f"received message larger than max ({len(request)} vs. {self.limit})")
        self.sizes.append(len(request))
        parsed = ExportTraceServiceRequest.FromString(request)
        self.accepted.append([s.span_id for r in parsed.resource_spans for sc in r.scope_spans for s in sc.spans])
        return Ack()

    def probe(self) -> None: ...

    def describe(self) -> str:
        return "limited"

    def close(self) -> None: ...


def _runs(count: int) -> list[RunSpans]:
    return [
        RunSpans(
            f"run-{n}",
            [
                WIRE.replay(SpanData(bytes([n]) * 16, bytes([n, i]) * 4, b"", f"span {i}", 1, 2, (("payload", "x" * 1000),)))
                for i in range(3)
            ],
        )
        for n in range(1, 11)
    ]


def _ids(runs) -> list[bytes]:
    return [Span.FromString(encoded).span_id for run in runs for encoded in run.encoded]


def test_spans_are_packed_under_max_request_bytes():
    receiver = LimitedReceiver(limit=10**6)
    acked: list[int] = []
    sender = RequestSender(receiver, ENCODER, 8 * 1024, 128, lambda *_: None, lambda: acked.append(1))
    runs = _runs(10)
    sender.send(runs)
    assert sum(receiver.accepted, []) == _ids(runs)  # every span once, in order
    assert all(size <= 8 * 1024 for size in receiver.sizes), receiver.sizes
    assert len(receiver.accepted) == 5  # 30 spans of about 1.1 KB under 8 KiB: 7 a request, packed full
    assert all(len(ids) == 7 for ids in receiver.accepted[:-1])
    assert len(acked) == len(receiver.accepted)


def test_a_request_refused_as_too_large_is_sent_again_in_halves_each_span_once(caplog):
    receiver = LimitedReceiver(limit=4 * 1024)  # the receiver takes less than max_request_bytes
    sender = RequestSender(receiver, ENCODER, 32 * 1024, 128, lambda *_: None)
    runs = _runs(10)
    with caplog.at_level(logging.WARNING):
        sent = sender.send(runs)
    assert sent.dropped == 0
    assert sum(receiver.accepted, []) == _ids(runs)
    assert receiver.refused >= 1 and all(len(ids) <= 4 for ids in receiver.accepted)
    split = [r.getMessage() for r in caplog.records if "refused a request" in r.getMessage()]
    assert len(split) == 1 and "export.max_request_bytes" in split[0]  # said once, not at every halving
