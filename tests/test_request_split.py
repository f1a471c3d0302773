"""The request split, in the fast loop: spans packed under export.max_request_bytes, and a request
the receiver refuses as too large sent again in halves, every span delivered once. The packing is
held end to end too: a poll of many small spans into the test's gRPC receiver."""

from __future__ import annotations

import logging
from datetime import timedelta

from helpers import utc_now_naive
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from sqlalchemy import insert
from sqlalchemy.engine import make_url

from run_otel.config import build_config
from run_otel.export.encoding import RequestFrame
from run_otel.export.sending import RequestSender
from run_otel.export.sinks import Ack, TooLarge
from run_otel.export.wire import RunSpans, WireSpans
from run_otel.factory import build_parts, build_poller
from run_otel.mapping.limits import AttributeLimits
from run_otel.mapping.span_data import SpanData
from run_otel.source.engine import make_engine
from run_otel.source.schema import diagnosis_run, metadata, tool_invocation

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


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 1500), max_size=6), max_size=25),
    st.integers(2 * 1024, 12 * 1024),
)
def test_each_request_holds_the_spans_that_fit_in_order_whole_runs_or_not(sizes, max_request_bytes):
    """The requests are those of packing span by span: a request is sent when the next span would
    take it past the limit, whether a run's spans are added one by one or all at once."""
    runs = [
        RunSpans(
            f"run-{n}",
            [
                WIRE.replay(SpanData(bytes([n + 1]) * 16, bytes([n, i]) * 4, b"", "s", 1, 2, (("p", "x" * k),)))
                for i, k in enumerate(run)
            ],
        )
        for n, run in enumerate(sizes)
    ]
    receiver = LimitedReceiver(limit=max_request_bytes)
    sender = RequestSender(receiver, ENCODER, max_request_bytes, 128, lambda *_: None)
    sent = sender.send(runs)
    expected: list[list[bytes]] = []
    request: list[bytes] = []
    size = 0
    for encoded in (encoded for run in runs for encoded in run.encoded):
        if request and size + len(encoded) + 6 > sender._room:
            expected.append(request)
            request, size = [], 0
        request.append(Span.FromString(encoded).span_id)
        size += len(encoded) + 6
    if request:
        expected.append(request)
    assert receiver.accepted == expected and receiver.refused == 0
    assert sent.runs == len(runs) and sent.dropped == 0


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


def _small_tool_calls(url: str, runs: int, calls: int) -> None:
    """``runs`` finished runs of ``calls`` tool calls each, every call a span of a few hundred bytes."""
    engine = make_engine(make_url(url))
    metadata.create_all(engine)
    at = utc_now_naive() - timedelta(hours=1)
    with engine.begin() as conn:
        for n in range(runs):
            run_id = f"run-{n:04d}"
            row = dict(run_id=run_id, session_id="s", query="q", status="SUCCESS", created_at=at, updated_at=at)
            conn.execute(insert(diagnosis_run).values(**row))
            tool = dict(
                session_id="s", run_id=run_id, tool_name="t", input_params="{}", duration_ms=5, success=True, created_at=at
            )
            conn.execute(insert(tool_invocation), [tool] * calls)
    engine.dispose()


def test_many_small_spans_are_packed_under_max_request_bytes_with_each_spans_frame_counted(tmp_path, receiver):
    """A span's frame (its tag and length) is a few bytes: many small spans make hundreds of them in a
    request, far more than the slack left for the lengths of the request's own fields."""
    limit = 64 * 1024  # the smallest export.max_request_bytes allowed
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    _small_tool_calls(url, runs=10, calls=100)
    config = build_config(
        {
            "source": {"url": url},
            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "poll": {"start_from": "beginning", "settle_seconds": 0},
            "export": {"endpoint": receiver.endpoint, "max_request_bytes": limit},
            "feedback": {"enabled": False},
        }
    )
    with build_parts(config) as parts:
        assert build_poller(parts).poll().run_count == 10
    sizes = [len(request) for request in receiver.requests]
    per_request = [_span_count(request) for request in receiver.requests]
    spans = receiver.spans()
    assert len(spans) == 10 * 101  # every span, once
    assert len({span.span_id for _r, _s, span in spans}) == len(spans)
    # The precondition: the limit is what ends each request but the last, with hundreds of spans in each.
    assert len(sizes) >= 3 and min(per_request[:-1]) >= 200, (sizes, per_request)
    assert max(sizes) <= limit, sizes


def _span_count(request: bytes) -> int:
    parsed = ExportTraceServiceRequest.FromString(request)
    return sum(len(scope.spans) for resource in parsed.resource_spans for scope in resource.scope_spans)
