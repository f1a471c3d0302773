"""No run stops the pipeline: an oversized run on real MariaDB, sent through the real OpenTelemetry
Collector at its default limits (4 MiB per gRPC message), arrives in pieces, and the runs behind
it follow. A span a receiver refuses even cut down is dropped, said and counted, and the export
goes on. The collector forwards to two of the test's Receivers, which keep gRPC's default limit too."""

from __future__ import annotations

import json
import uuid

import pytest
from helpers import bridge_metrics, bridge_sections, received_roots, run_cli, terminal_trace_ids, utc_now_naive, write_config
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from prometheus_client import CollectorRegistry
from servers import Collector, Receiver, wait_for

from run_otel.config import build_config
from run_otel.export.wire import WireSpans
from run_otel.factory import build_parts, build_poller
from run_otel.mapping import attributes as A
from run_otel.ops.demo import generate, insert_workload
from run_otel.source.readings import read_run, read_tool

GRPC_LIMIT = 4 * 1024 * 1024
CHINESE = "检索到的证据表明数据库连接池在高峰期耗尽，建议扩容并检查慢查询。"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    base = tmp_path_factory.mktemp("oversized")
    jaeger, tempo = Receiver(), Receiver()
    jaeger.start()
    tempo.start()
    collector = Collector(base, jaeger.endpoint, tempo.endpoint)
    collector.start()
    yield collector, tempo, jaeger
    collector.stop()
    tempo.stop()
    jaeger.stop()


def seed_normal(agent_db, runs: int, seed_value: int) -> None:
    insert_workload(agent_db.engine(), generate(seed_value, runs, anchor=utc_now_naive()))


def add_run(agent_db, tools: list[dict], **columns) -> str:
    """A finished run with the given tool rows, settled an hour ago; returns its run_id."""
    run_id = f"run-{uuid.uuid4()}"
    conn = agent_db.server.root(agent_db.name)
    try:
        with conn.cursor() as cur:
            run = {"run_id": run_id, "session_id": "sess-big", "query": CHINESE, "status": "SUCCESS", **columns}
            cur.execute(
                f"INSERT INTO diagnosis_run ({', '.join(run)}, created_at, updated_at) "
                f"VALUES ({', '.join(['%s'] * len(run))}, NOW() - INTERVAL 1 HOUR, NOW() - INTERVAL 1 HOUR)",
                list(run.values()),
            )
            for tool in tools:
                row = {"session_id": "sess-big", "run_id": run_id, "tool_name": "lookup_knowledge", "input_params": "{}", **tool}
                cur.execute(
                    f"INSERT INTO tool_invocation ({', '.join(row)}, created_at) "
                    f"VALUES ({', '.join(['%s'] * len(row))}, NOW() - INTERVAL 1 HOUR)",
                    list(row.values()),
                )
    finally:
        conn.close()
    return run_id


def trace_of(run_id: str) -> str:
    return run_id[4:].replace("-", "")


def spans_of(receiver: Receiver, run_id: str) -> dict:
    """span id -> the span, for each distinct span of the run's trace the receiver holds."""
    return {span.span_id: span for _r, _s, span in receiver.spans() if span.trace_id.hex() == trace_of(run_id)}


def attrs(span) -> dict:
    out = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = (
            [v.string_value for v in value.array_value.values]
            if value.HasField("array_value")
            else getattr(value, value.WhichOneof("value"))
        )
    return out


def checkpoint_is_at_the_newest_run(config_path) -> None:
    done = run_cli("status", "--json", "--config", str(config_path))
    assert done.returncode == 0, done.stderr
    (row,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert row["high_water_id"] == row["newest_id"], row


def wait_for_everything(tempo: Receiver, agent_db, big_run: str, big_spans: int) -> None:
    wait_for(
        lambda: received_roots(tempo) >= terminal_trace_ids(agent_db) and len(spans_of(tempo, big_run)) >= big_spans,
        60,
        "every run, and every span of the oversized one, behind the collector",
    )


def test_a_run_larger_than_the_collector_takes_goes_out_in_pieces_and_the_runs_behind_it_follow(stack, agent_db, tmp_path):
    collector, tempo, _jaeger = stack
    seed_normal(agent_db, 20, 31)
    long_text = (CHINESE * 40)[:1024]
    tools = [
        {
            "input_params": json.dumps({"query": long_text}, ensure_ascii=False),
            "output_preview": long_text,
            "retrieval_layer": "L1",
            "retrieval_details": json.dumps(
                {"evidence_refs": [{"raw_path": f"$.kb[{i}]", "text": long_text}]}, ensure_ascii=False
            ),
            "success": 1,
            "duration_ms": 20,
        }
        for i in range(1000)
    ]
    big_run = add_run(agent_db, tools, answer=long_text)
    seed_normal(agent_db, 20, 32)
    sections = bridge_sections(agent_db, tmp_path, f"http://127.0.0.1:{collector.grpc_port}", content={"capture": True})
    path = write_config(tmp_path / "run-otel.toml", sections)
    config = build_config(sections)
    # The precondition: this run alone is far over the collector's 4 MiB, the size that once stopped all export.
    parts = build_parts(config)
    (run,) = parts.source.runs_by_ids([int(agent_db.execute("SELECT id FROM diagnosis_run WHERE run_id = %s", big_run)[0][0])])
    # Read by meaning, as the poller does: the driver hands `success` over as stored.
    warnings: list[str] = []
    tools_read = [read_tool(tool, warnings) for tool in parts.source.tools_for([big_run])[big_run]]
    mapped = parts.mapper.map_run(read_run(run, warnings), tools_read)
    assert len(mapped.spans) == 1001
    wire = WireSpans(parts.mapper.limits)
    assert sum(len(wire.replay(s)) for s in mapped.spans) > 2 * GRPC_LIMIT

    done = run_cli("once", "--config", str(path))
    assert done.returncode == 0, done.stderr
    assert "RESOURCE_EXHAUSTED" not in done.stderr and "too large" not in done.stderr
    wait_for_everything(tempo, agent_db, big_run, 1001)
    assert len(spans_of(tempo, big_run)) == 1001
    # Nothing was cut: each span fits a request, only the run was split.
    assert all(A.RUN_OTEL_ATTRIBUTES_CUT not in attrs(s) for s in spans_of(tempo, big_run).values())
    checkpoint_is_at_the_newest_run(path)


@pytest.mark.parametrize("in_database", [False, True], ids=["python", "database"])
def test_evidence_of_200000_refs_is_capped_and_the_cap_recorded(stack, agent_db, tmp_path, in_database):
    collector, tempo, _jaeger = stack
    seed_normal(agent_db, 10, 33)
    details = json.dumps(
        {"evidence_status": "FOUND", "evidence_refs": [{"raw_path": f"$.kb.doc[{i}].para"} for i in range(200_000)]}
    )
    big_run = add_run(agent_db, [{"retrieval_layer": "L0", "retrieval_details": details, "success": 1}] * 2)
    seed_normal(agent_db, 10, 34)
    sections = bridge_sections(
        agent_db, tmp_path, f"http://127.0.0.1:{collector.grpc_port}", source={"evidence_in_database": in_database}
    )
    done = run_cli("once", "--config", str(write_config(tmp_path / "run-otel.toml", sections)))
    assert done.returncode == 0, done.stderr
    wait_for_everything(tempo, agent_db, big_run, 3)
    tools = [attrs(s) for s in spans_of(tempo, big_run).values() if s.parent_span_id]
    assert len(tools) == 2
    for tool in tools:
        assert tool[A.RAG_EVIDENCE_COUNT] == 200_000
        assert tool[A.RAG_EVIDENCE_PATHS] == [f"$.kb.doc[{i}].para" for i in range(128)]
        # The conventions' documents list is capped too, and stays a JSON list of the first documents.
        documents = json.loads(tool[A.GEN_AI_RETRIEVAL_DOCUMENTS])
        assert 0 < len(documents) <= 128 and len(tool[A.GEN_AI_RETRIEVAL_DOCUMENTS]) <= 4096
        assert [d["id"] for d in documents] == [f"$.kb.doc[{i}].para" for i in range(len(documents))]
        assert sorted(tool[A.RUN_OTEL_ATTRIBUTES_CUT]) == sorted([A.RAG_EVIDENCE_PATHS, A.GEN_AI_RETRIEVAL_DOCUMENTS])
    checkpoint_is_at_the_newest_run(tmp_path / "run-otel.toml")


def test_a_span_larger_than_a_request_is_cut_to_fit(stack, agent_db, tmp_path):
    """With the list cap raised past the evidence, one span is over export.max_request_bytes itself."""
    collector, tempo, _jaeger = stack
    details = json.dumps({"evidence_refs": [{"raw_path": f"$.kb.doc[{i}].para"} for i in range(200_000)]})
    big_run = add_run(agent_db, [{"retrieval_layer": "L0", "retrieval_details": details, "success": 1}])
    seed_normal(agent_db, 10, 35)
    sections = bridge_sections(
        agent_db, tmp_path, f"http://127.0.0.1:{collector.grpc_port}", trace={"max_list_length": 1_000_000}
    )
    done = run_cli("once", "--config", str(write_config(tmp_path / "run-otel.toml", sections)))
    assert done.returncode == 0, done.stderr
    assert f"run {big_run}: 1 of its 2 spans were cut to fit export.max_request_bytes" in done.stderr
    wait_for_everything(tempo, agent_db, big_run, 2)
    (tool,) = [s for s in spans_of(tempo, big_run).values() if s.parent_span_id]
    assert A.RAG_EVIDENCE_PATHS not in attrs(tool)
    # The documents JSON was capped by the value length first; the paths were removed to fit the request.
    assert attrs(tool)[A.RUN_OTEL_ATTRIBUTES_CUT] == [A.GEN_AI_RETRIEVAL_DOCUMENTS, A.RAG_EVIDENCE_PATHS]
    assert json.loads(attrs(tool)[A.GEN_AI_RETRIEVAL_DOCUMENTS])
    assert attrs(tool)[A.RAG_EVIDENCE_COUNT] == 200_000
    assert tool.dropped_attributes_count == 1


def _counter(registry: CollectorRegistry, name: str, **labels) -> float:
    return sum(
        sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def test_a_receiver_with_a_smaller_limit_gets_split_then_cut_requests_and_only_the_hopeless_span_is_dropped(agent_db, tmp_path):
    """A receiver (or a proxy before it) that takes 32 KiB, far less than export.max_request_bytes:
    the batch is split, a span too large for it is cut, and one too large even without its
    attributes (a 60 kB error message as its status) is dropped; everything else arrives."""
    limit = 32 * 1024
    receiver = Receiver(max_receive_bytes=limit)
    receiver.start()
    try:
        seed_normal(agent_db, 30, 36)
        cuttable = add_run(agent_db, [{"output_preview": "x" * 40_000, "success": 1}])
        hopeless = add_run(
            agent_db, [{"error_message": ("upstream timed out after 30s; " * 2000)[:60_000], "success": 0}, {"success": 1}]
        )
        seed_normal(agent_db, 30, 37)
        sections = bridge_sections(
            agent_db,
            tmp_path,
            receiver.endpoint,
            content={"capture": True, "max_length": 65_535},
            trace={"max_attribute_length": 65_535},
        )
        done = run_cli("once", "--config", str(write_config(tmp_path / "run-otel.toml", sections)))
        assert done.returncode == 3, done.stderr
        assert "sending it in smaller requests: set export.max_request_bytes below the receiver's limit" in done.stderr
        assert f"run {cuttable}: span " in done.stderr and "the receiver refused it as too large" in done.stderr
        assert f"run {hopeless}: dropped span " in done.stderr and "the export goes on without it" in done.stderr
        assert "1 spans were not delivered" in done.stderr
        wait_for(lambda: received_roots(receiver) >= terminal_trace_ids(agent_db), 10, "every run")
        (cut,) = [s for s in spans_of(receiver, cuttable).values() if s.parent_span_id]
        assert attrs(cut)[A.RUN_OTEL_ATTRIBUTES_CUT] == [A.GEN_AI_TOOL_CALL_RESULT]
        assert len(spans_of(receiver, hopeless)) == 2  # the root and the tool that fits; not the hopeless one
        checkpoint_is_at_the_newest_run(tmp_path / "run-otel.toml")

        # The same export in-process, with its own checkpoint, for the counter.
        sections["state"] = {"url": f"sqlite:///{tmp_path / 'again.db'}"}
        config = build_config(sections)
        registry = CollectorRegistry()
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        metrics = bridge_metrics(config, [PrometheusMetricReader(registry=registry)], registry)
        result = build_poller(build_parts(config, recorder=metrics)).poll()
        assert result.dropped_spans == 1
        assert _counter(registry, "run_otel_dropped_spans_total", reason="too_large") == 1
        assert _counter(registry, "run_otel_exported_spans_total") == result.spans - 1
    finally:
        receiver.stop()


def test_exported_spans_count_only_what_the_receiver_took_and_once_says_what_it_rejected(agent_db, tmp_path):
    receiver = Receiver(reject_every=2)
    receiver.start()
    try:
        seed_normal(agent_db, 10, 38)
        sections = bridge_sections(agent_db, tmp_path, receiver.endpoint)
        config = build_config(sections)
        registry = CollectorRegistry()
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        metrics = bridge_metrics(config, [PrometheusMetricReader(registry=registry)], registry)
        result = build_poller(build_parts(config, recorder=metrics)).poll()
        requests = len(receiver.requests)
        assert result.spans > 2 * requests > 0 and result.rejected_spans == 2 * requests
        assert _counter(registry, "run_otel_exported_spans_total") == result.spans - result.rejected_spans
        assert _counter(registry, "run_otel_rejected_spans_total") == result.rejected_spans

        sections["state"] = {"url": f"sqlite:///{tmp_path / 'again.db'}"}
        done = run_cli("once", "--config", str(write_config(tmp_path / "run-otel.toml", sections)))
        assert done.returncode == 3, done.stderr
        assert f"run-otel: error: {result.rejected_spans} spans were not delivered" in done.stderr
    finally:
        receiver.stop()


def test_a_warning_in_an_accepting_reply_is_logged(agent_db, tmp_path):
    receiver = Receiver(warning="attribute values over 2048 bytes were truncated")
    receiver.start()
    try:
        seed_normal(agent_db, 5, 39)
        done = run_cli(
            "once",
            "--config",
            str(write_config(tmp_path / "run-otel.toml", bridge_sections(agent_db, tmp_path, receiver.endpoint))),
        )
    finally:
        receiver.stop()
    assert done.returncode == 0, done.stderr
    assert "receiver accepted all" in done.stderr
    assert "spans with a warning: attribute values over 2048 bytes were truncated" in done.stderr


def test_the_test_receivers_keep_grpc_s_default_limit(stack):
    """A receiver with a raised limit would hide an oversized request: these must refuse one."""
    import grpc

    collector, tempo, _jaeger = stack
    request = trace_service_pb2.ExportTraceServiceRequest()
    request.resource_spans.add().scope_spans.add().spans.add(
        name="x" * (GRPC_LIMIT + 1), trace_id=b"\x01" * 16, span_id=b"\x02" * 8
    )
    for endpoint in (tempo.endpoint, f"127.0.0.1:{collector.grpc_port}"):
        with grpc.insecure_channel(endpoint) as channel:
            export = channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                request_serializer=None,
                response_deserializer=trace_service_pb2.ExportTraceServiceResponse.FromString,
            )
            with pytest.raises(grpc.RpcError) as refused:
                export(request.SerializeToString(), timeout=10)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "larger than max" in (refused.value.details() or "").lower()
