"""A corpus of bad rows on real MariaDB: each is still exported with what could be mapped,
with a counted warning, and none blocks the runs after it."""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

from helpers import (
    add_run,
    add_tool,
    bridge_config,
    new_run_id,
    seed_corpus,
)
from servers import wait_for

from run_otel.config import build_config
from run_otel.export.encoding import RequestFrame
from run_otel.export.sending import RequestSender
from run_otel.export.sinks import JsonFileSink
from run_otel.export.wire import RunEncoder, WireSpans
from run_otel.factory import build_mapper, build_parts, build_poller
from run_otel.pipeline.recorder import Recorder
from run_otel.pipeline.run_export import Prepared, RunExporter
from run_otel.source.clock import SourceClock
from run_otel.source.rows import RunRow, ToolRow


class CountingRecorder(Recorder):
    def __init__(self):
        self.warnings = 0
        self.run_ids: list[str] = []

    def row_warnings(self, count: int) -> None:
        self.warnings += count

    def runs_exported(self, result, acked_at: float) -> None:
        self.run_ids.extend(e.run.run_id for e in result.runs)


def test_bad_rows_are_exported_with_warnings_and_block_nothing(agent_db, otlp, tmp_path, caplog):
    cases = seed_corpus(agent_db)
    caplog.set_level(logging.WARNING)
    recorder = CountingRecorder()
    config = bridge_config(agent_db, tmp_path, otlp.endpoint("grpc"), content={"capture": True})
    poller = build_poller(build_parts(config, recorder=recorder))
    poller.poll()
    exported = set(recorder.run_ids)

    # A healthy run inserted after the corpus goes out on the next poll.
    normal = new_run_id()
    conn = agent_db.server.root(agent_db.name)
    add_run(conn, normal)
    add_tool(conn, normal, success=1, duration_ms=10)
    conn.close()
    poller.poll()
    assert recorder.run_ids[len(exported) :] == [normal]
    assert exported == set(cases.values())
    wait_for(lambda: len({s.trace_id.hex() for _r, _s, s in otlp.receiver.spans()}) >= len(cases) + 1, 30, "every trace")

    by_run = defaultdict(list)
    for _resource, _scope, span in otlp.receiver.spans():
        attrs = {kv.key: kv.value for kv in span.attributes}
        by_run[attrs["diagnosis.run.id"].string_value].append((span, attrs))
    assert set(by_run) == set(cases.values()) | {normal}
    trace_ids = {span.trace_id.hex() for _r, _s, span in otlp.receiver.spans()}
    assert all(any(t) for t in trace_ids)

    # 5,000 tool rows: capped, and the cap is on the root span.
    big = by_run[cases["5000 tools"]]
    root = next(attrs for span, attrs in big if not span.parent_span_id)
    assert len(big) == 1 + 1000
    assert root["diagnosis.run.tool_span_limit"].int_value == 1000
    assert root["diagnosis.run.tool_spans_dropped"].int_value == 4000
    assert sum(span.ByteSize() for span, _ in big) < 5 * 1024 * 1024

    # The 1 MB preview is cut to content.max_length.
    ((preview_span, preview_attrs),) = [x for x in by_run[cases["1 MB output_preview"]] if x[0].parent_span_id]
    assert len(preview_attrs["gen_ai.tool.call.result"].string_value) == 1024

    # Durations out of range are zero-length; none stretches the trace.
    for span, _attrs in by_run[cases["durations"]]:
        assert span.end_time_unix_nano - span.start_time_unix_nano < 10 * 60 * 10**9
    # created_at after updated_at still gives end >= start.
    for span, _attrs in by_run[cases["created_at after updated_at"]]:
        assert span.end_time_unix_nano >= span.start_time_unix_nano

    emoji = [attrs for span, attrs in by_run[cases["emoji and bad bytes"]] if span.parent_span_id]
    assert emoji[0]["gen_ai.tool.name"].string_value == "query_logs_🔥"

    # The non-UUID run id gets the hash trace id and still arrives.
    assert by_run["legacy-run-42"]

    # Orphan and legacy tool rows never appear anywhere.
    names = {
        attrs["gen_ai.tool.name"].string_value for spans in by_run.values() for _s, attrs in spans if "gen_ai.tool.name" in attrs
    }
    assert not names & {"orphan", "legacy_no_run_id"}

    logged = "\n".join(r.getMessage() for r in caplog.records)
    for expected in (
        "retrieval_details is not valid JSON",
        "retrieval_details is not a JSON object",
        "evidence_refs is not a list",
        "unknown retrieval_layer 'L9'",
        "unknown relevance_level 'SUPER_RELEVANT'",
        "duration_ms out of range (-5 ms)",
        "duration_ms out of range (1000000000 ms)",
        "total_duration_ms out of range (-1 ms)",
        "updated_at is before created_at",
        "created_at is not a valid date",
    ):
        assert expected in logged, expected
    assert logged.count("unknown diagnosis_run.status 'ARCHIVED'") == 1  # logged once ...
    assert recorder.warnings >= 12  # ... and every bad value counted


class DropRecorder(Recorder):
    def __init__(self):
        self.dropped: list[tuple[str, int]] = []

    def spans_dropped(self, reason: str, count: int) -> None:
        self.dropped.append((reason, count))


def _exporter(recorder: Recorder, out: Path | None = None) -> RunExporter:
    config = build_config({})
    clock = SourceClock("UTC")
    # Only the mapping runs here: the exporter reads nothing, it needs the source's clock alone; it
    # sends to a file when given one.
    source = SimpleNamespace(clock=clock)
    mapper = build_mapper(config, clock)
    runs = RunEncoder(mapper, WireSpans(mapper.limits))
    sender = (
        None
        if out is None
        else RequestSender(JsonFileSink(out), RequestFrame({}), config.export.max_request_bytes, 128, recorder.spans_dropped)
    )
    return RunExporter(source, runs, sender, recorder)  # type: ignore[arg-type]


def _rows(*durations) -> tuple[RunRow, list[ToolRow]]:
    at = datetime(2026, 1, 1, 12)
    run = RunRow(1, "run-a", "s", "SUCCESS", None, None, None, None, 1000, None, None, None, at, at)
    tools = [
        ToolRow(10 + k, "run-a", 1, "lookup", None, None, None, None, None, None, None, None, d, True, None, at)
        for k, d in enumerate(durations)
    ]
    return run, tools


def test_a_value_the_mapper_still_refuses_is_left_out_naming_its_column():
    # A value no reading caught (a duration as text) makes the mapper raise.
    run, tools = _rows(5, "five")
    recorder = DropRecorder()
    warnings: list[str] = []
    mapped = _exporter(recorder)._map(run, tools, False, None, warnings, [])
    assert mapped is not None and len(mapped.encoded) == 3
    assert len(warnings) == 1 and warnings[0].startswith("tool_invocation 11: duration_ms could not be mapped (TypeError")
    assert recorder.dropped == []


def test_a_run_that_cannot_be_mapped_at_all_is_skipped_with_a_warning_and_counted(caplog, tmp_path):
    run, tools = _rows("five", "six")  # leaving one value out is not enough
    recorder = DropRecorder()
    exporter = _exporter(recorder, tmp_path / "out.jsonl")
    with caplog.at_level(logging.WARNING, logger="run_otel"):
        # The rows as the mapper gets them: no reading catches a duration as text.
        prepared = Prepared()
        assert exporter._map(run, tools, False, None, [], prepared.skipped) is None
        assert recorder.dropped == [] and not caplog.records  # told once the batch is sent
        result = exporter.deliver(prepared)
    assert result.dropped_spans == 3 and recorder.dropped == [("unmappable", 3)]
    assert any("run run-a: cannot be mapped (TypeError" in r.getMessage() and "skipped" in r.getMessage() for r in caplog.records)
