"""The script an SRE would write in an afternoon instead of installing run-otel: the baseline
`bench/run.py` compares `run-otel backfill` with, as a whole process, on the same rows.

    python bench/user_script.py HOST PORT USER PASSWORD DATABASE OTLP_ENDPOINT

A PyMySQL cursor over the runs by id, their tool rows in one query per page, one
ReadableSpan per row with the core attributes, and the SDK's OTLP gRPC exporter in
batches of 512. No checkpoint, no retries, no content policy: what run-otel adds is
not in it, so it is the fastest plain version of the same job.
"""

from __future__ import annotations

import hashlib
import sys
import uuid
from datetime import UTC

import pymysql
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Status, StatusCode

PAGE = 500
BATCH = 512


def ns(moment) -> int:
    return int(moment.replace(tzinfo=UTC).timestamp() * 1e9)


def send(exporter: OTLPSpanExporter, batch: list[ReadableSpan]) -> None:
    if exporter.export(batch) != SpanExportResult.SUCCESS:
        sys.exit("export failed")


def main() -> None:
    host, port, user, password, database, endpoint = sys.argv[1:7]
    db = pymysql.connect(host=host, port=int(port), user=user, password=password, database=database)
    exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True)
    resource = Resource.create({"service.name": "diagnosis-agent"})
    scope = InstrumentationScope("user-script")
    batch: list[ReadableSpan] = []
    last = 0
    with db.cursor() as cur:
        while True:
            cur.execute(
                "SELECT id, run_id, session_id, status, intent, total_duration_ms, created_at FROM diagnosis_run "
                "WHERE id > %s AND status IN ('SUCCESS','FALLBACK','FAILED','CANCELLED') ORDER BY id LIMIT %s",
                (last, PAGE),
            )
            runs = cur.fetchall()
            if not runs:
                break
            last = runs[-1][0]
            cur.execute(
                "SELECT id, run_id, tool_name, retrieval_layer, l0_match_count, l1_match_count, relevance_level, "
                "duration_ms, success, created_at FROM tool_invocation WHERE run_id IN %s ORDER BY run_id, id",
                ([r[1] for r in runs],),
            )
            tools: dict[str, list] = {}
            for tool in cur.fetchall():
                tools.setdefault(tool[1], []).append(tool)
            for _id, run_id, session, status, intent, duration, created in runs:
                trace_id = uuid.UUID(run_id[4:]).int
                root_id = int.from_bytes(hashlib.sha256(f"run:{run_id}".encode()).digest()[:8], "big")
                start = ns(created)
                root = trace.SpanContext(trace_id, root_id, False)
                batch.append(
                    ReadableSpan(
                        name="invoke_agent diagnosis-agent",
                        context=root,
                        resource=resource,
                        instrumentation_scope=scope,
                        attributes={
                            "diagnosis.run.id": run_id,
                            "gen_ai.conversation.id": session,
                            "diagnosis.run.status": status,
                            "diagnosis.run.intent": intent or "",
                        },
                        start_time=start,
                        end_time=start + (duration or 0) * 1_000_000,
                        status=Status(StatusCode.ERROR if status == "FAILED" else StatusCode.UNSET),
                    )
                )
                for tool_id, _run, name, layer, l0, l1, relevance, tool_ms, success, at in tools.get(run_id, []):
                    span_id = int.from_bytes(hashlib.sha256(f"tool_invocation:{run_id}:{tool_id}".encode()).digest()[:8], "big")
                    attributes = {"gen_ai.tool.name": name, "gen_ai.tool.call.id": str(tool_id), "diagnosis.run.id": run_id}
                    for key, value in (
                        ("rag.retrieval_layer", layer),
                        ("rag.l0_match_count", l0),
                        ("rag.l1_match_count", l1),
                        ("rag.relevance_level", relevance),
                    ):
                        if value is not None:
                            attributes[key] = value
                    end = ns(at)
                    batch.append(
                        ReadableSpan(
                            name=f"execute_tool {name}",
                            context=trace.SpanContext(trace_id, span_id, False),
                            parent=root,
                            resource=resource,
                            instrumentation_scope=scope,
                            attributes=attributes,
                            start_time=end - (tool_ms or 0) * 1_000_000,
                            end_time=end,
                            status=Status(StatusCode.ERROR if success == 0 else StatusCode.UNSET),
                        )
                    )
                if len(batch) >= BATCH:
                    send(exporter, batch)
                    batch = []
    if batch:
        send(exporter, batch)
    exporter.shutdown()
    db.close()


if __name__ == "__main__":
    main()
