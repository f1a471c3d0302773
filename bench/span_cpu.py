"""CPU a span of run-otel's hot path, in one process, without a database or a network.

    .venv/bin/python bench/span_cpu.py                 # the checkout's build
    <compiled-venv>/bin/python bench/span_cpu.py       # the wheel's compiled core

The rows are the ones bench/run.py seeds (8 tool calls a run, half of them RAG lookups
with evidence, the seventh failed), built in memory as the driver hands them over. Each
stage runs over the same rows, and the table gives its CPU a span: reading the rows by
meaning, mapping them to readable spans, and the whole export of a batch (reading, then
mapping and encoding, the limits and the requests) into a sink that only keeps the bytes'
length. ``--stage export`` alone, run by two builds in turn, compares them.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import create_engine

from run_otel.config.loading import build_config
from run_otel.export.sinks import Ack
from run_otel.factory import build_exporter, build_parts
from run_otel.source.readings import read_run, read_tool
from run_otel.source.rows import RunRow, ToolRow
from run_otel.source.schema import metadata

EVIDENCE = json.dumps(
    {
        "evidence_status": "supported",
        "evidence_refs": [{"raw_path": "$.logs[0]", "text": "evidence text"}, {"raw_path": "$.logs[1]", "text": "more"}],
    }
)
STATUSES = ["FAILED", "FALLBACK"] + ["SUCCESS"] * 16 + ["FALLBACK", "CANCELLED"]
TOOLS = ("lookup_knowledge", "query_logs", "query_metrics", "search_runbook")


def rows(runs: int, tools: int) -> tuple[list[RunRow], dict[str, list[ToolRow]]]:
    """The seeded rows of bench/run.py, as tuples the driver hands over."""
    start = datetime(2026, 1, 1)
    run_rows, tool_rows = [], {}
    tool_id = 0
    for seq in range(1, runs + 1):
        run_id = f"run-{seq:08X}-0000-4000-8000-{seq:012X}"
        created = start + timedelta(seconds=seq)
        run_rows.append(
            RunRow(
                seq,
                run_id,
                f"sess-{seq % 50}",
                STATUSES[seq % 20],
                "CHAT_HARNESS",
                "DIAGNOSIS",
                "SUCCESS",
                None,
                9000,
                4200,
                tools + 1,
                tools,
                created,
                created + timedelta(seconds=9),
            )
        )
        calls = []
        for t in range(1, tools + 1):
            tool_id += 1
            rag = t % 2 == 0
            calls.append(
                ToolRow(
                    tool_id,
                    run_id,
                    t,
                    TOOLS[t % 4],
                    2048,
                    "L0+L1" if rag else None,
                    3 if rag else None,
                    2 if rag else None,
                    0,
                    "PRECISE" if rag else None,
                    None,
                    EVIDENCE,
                    180,
                    0 if t == 7 else 1,
                    "timeout after 30000 ms" if t == 7 else None,
                    created + timedelta(seconds=t),
                )
            )
        tool_rows[run_id] = calls
    return run_rows, tool_rows


def varied(runs: list[RunRow], tools: dict[str, list[ToolRow]], seed: int = 7) -> None:
    """The same rows with the values that vary in an agent's table varied: each call's duration,
    output length and match counts, the runs' durations and tokens, and which of 400 log paths
    each call's evidence names. The caches of repeated values then meet their misses."""
    rng = random.Random(seed)
    paths = [f"$.logs[{n}]" for n in range(400)]
    for k, run in enumerate(runs):
        runs[k] = run._replace(total_duration_ms=rng.randint(800, 120_000), total_token_count=rng.randint(500, 20_000))
        calls = tools[run.run_id]
        for t, call in enumerate(calls):
            refs = [{"raw_path": rng.choice(paths), "text": "evidence text"} for _ in range(rng.randint(1, 4))]
            evidence = json.dumps({"evidence_status": "supported", "evidence_refs": refs})
            rag = call.retrieval_layer is not None
            calls[t] = call._replace(
                duration_ms=int(rng.lognormvariate(5, 1.5)),
                output_length=rng.randint(0, 8192),
                l0_match_count=rng.randint(0, 12) if rag else None,
                l1_match_count=rng.randint(0, 6) if rag else None,
                retrieval_details=evidence,
            )


class LengthSink:
    def __init__(self) -> None:
        self.bytes = 0

    def send(self, request: bytes) -> Ack:
        self.bytes += len(request)
        return Ack()

    def probe(self) -> None: ...

    def close(self) -> None: ...

    def describe(self) -> str:
        return "length"


def cpu_per_span(stage, batches, spans: int, reps: int) -> float:
    times = []
    for _ in range(reps):
        gc.collect()
        started = time.process_time()
        for batch in batches:
            stage(batch)
        times.append(time.process_time() - started)
    return statistics.median(times) / spans * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--tools", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--varied", action="store_true", help="vary durations, counts and evidence paths, as real rows do")
    parser.add_argument("--stage", choices=["read", "read + map", "export"], action="append", help="only these (repeatable)")
    args = parser.parse_args()

    # The agent's tables, empty: the export asks the schema and the duplicate rule beside the rows.
    database = Path(tempfile.mkdtemp()) / "agent.db"
    config = build_config({"source": {"url": f"sqlite:///{database}"}})
    metadata.create_all(create_engine(config.source.url))
    sink = LengthSink()
    parts = build_parts(config, sink=sink)
    exporter = build_exporter(parts)
    mapper = parts.mapper
    runs, tools = rows(args.runs, args.tools)
    if args.varied:
        varied(runs, tools)
    batches = [runs[i : i + args.batch] for i in range(0, len(runs), args.batch)]
    spans = args.runs * (args.tools + 1)

    def read(batch):
        warnings: list[str] = []
        for run in batch:
            read_run(run, warnings)
            for tool in tools[run.run_id]:
                read_tool(tool, warnings)

    def read_and_map(batch):
        warnings: list[str] = []
        for run in batch:
            mapper.map_run(read_run(run, warnings), [read_tool(t, warnings) for t in tools[run.run_id]])

    def export(batch):
        exporter.export(batch, frozenset(), tools)

    gc.disable()  # as a backfill runs its batches
    stages = {"read": read, "read + map": read_and_map, "export": export}
    figures = {name: cpu_per_span(stages[name], batches, spans, args.reps) for name in args.stage or stages}
    compiled = mapper.map_run.__class__.__name__ != "method"
    rows_kind = "varied rows" if args.varied else "seeded rows"
    print(f"{'compiled' if compiled else 'Python'} build, {spans:,} spans ({rows_kind}), medians of {args.reps}; CPU a span:")
    for name, micros in figures.items():
        print(f"  {name:<12} {micros:6.2f} µs")
    if sink.bytes:
        print(f"  (request bytes a span: {sink.bytes / spans / args.reps:.0f})")


if __name__ == "__main__":
    main()
