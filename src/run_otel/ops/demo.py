"""A realistic synthetic workload for the embedded demo, the tests and the benchmark.

Deterministic: the same seed and anchor always give the same rows. Rows are
plain dicts keyed by column name, so they insert into SQLite or MySQL alike.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, insert
from sqlalchemy.engine import make_url

from ..source.engine import make_engine
from ..source.schema import diagnosis_run, metadata, tool_invocation

if TYPE_CHECKING:
    from ..config import Config

STATUS_WEIGHTS = {"SUCCESS": 85, "FALLBACK": 8, "FAILED": 5, "CANCELLED": 2}
INTENT_WEIGHTS = {"SYSTEM_CHAT": 20, "KNOWLEDGE_QUERY": 40, "DIAGNOSIS": 40}
RETRIEVAL_TOOLS = ("lookup_knowledge", "search_runbook")
FUNCTION_TOOLS = ("query_logs", "query_metrics", "get_service_topology", "query_traces")
LAYERS = ("L0", "L1", "L0+L1")
RELEVANCE = ("PRECISE", "HIGHLY_RELEVANT", "REFERENCE", "DEDUPED")
DEDUP_REASONS = ("doc_retrieved", "domain_retrieved")
TOOL_ERRORS = (
    "upstream timeout querying loki",
    "upstream returned HTTP 503 from prometheus-query",
    "permission denied for namespace payments (token for ops-bot@example.com)",
    "index kb_runbooks_v3 is read-only",
)
QUERIES = (
    "订单服务 P99 延迟在 14:05 突增，是什么原因？",
    "Why is checkout-api returning 502 since the last deploy?",
    "payment-gateway 的 Pod 反复 OOMKilled，怎么排查？",
    "What does the alert KafkaConsumerLagHigh mean for the billing team?",
    "Redis 连接数打满，影响了哪些服务？",
    "hello, what can you do?",
    "How do I roll back the search-indexer release?",
    "MySQL 主从延迟超过 30 秒，先看什么指标？",
)
FEEDBACK = (None, None, None, "UP", "DOWN")


@dataclass(frozen=True)
class Workload:
    runs: list[dict]
    tools: list[dict]

    def terminal_runs(self) -> list[dict]:
        return [r for r in self.runs if r["status"] in STATUS_WEIGHTS]


def _choice(rng: random.Random, weights: dict[str, int]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def _evidence(rng: random.Random, tool: str, matches: int) -> dict:
    if matches == 0 or rng.random() < 0.1:
        return {"evidence_status": "no_evidence", "evidence_refs": [{"raw_path": "$.no_evidence", "text": ""}]}
    source = "docs" if tool in RETRIEVAL_TOOLS else ("logs" if tool == "query_logs" else "series")
    refs = [
        {"raw_path": f"$.{source}[{i}]", "text": f"{source} evidence #{i}: connection pool exhausted on node-{rng.randint(1, 9)}"}
        for i in range(min(matches, rng.randint(1, 3)))
    ]
    return {"evidence_status": rng.choice(("supported", "supported", "partial")), "evidence_refs": refs}


def _tool_count(rng: random.Random, intent: str) -> int:
    if intent == "SYSTEM_CHAT":
        return rng.choice((0, 0, 1))
    if intent == "KNOWLEDGE_QUERY":
        return rng.randint(1, 4)
    return rng.randint(3, 12)


def _tool_row(rng: random.Random, run: dict, index: int, at: datetime, intent: str) -> tuple[dict, int]:
    retrieval = intent == "KNOWLEDGE_QUERY" or rng.random() < 0.45
    name = rng.choice(RETRIEVAL_TOOLS) if retrieval else rng.choice(FUNCTION_TOOLS)
    duration = int(rng.lognormvariate(5.3, 0.9))  # median ~200 ms, long tail
    failed = rng.random() < 0.04
    row = {
        "session_id": run["session_id"],
        "run_id": run["run_id"],
        "step_id": index + 1,
        "tool_name": name,
        "input_params": json.dumps({"query": run["query"][:40], "limit": 5}, ensure_ascii=False),
        "output_preview": None if failed else f"{name} returned results for {run['query'][:24]}",
        "output_length": None if failed else rng.randint(80, 12000),
        "retrieval_layer": None,
        "l0_match_count": None,
        "l1_match_count": None,
        "is_truncated": None if failed else rng.random() < 0.2,
        "relevance_level": None,
        "dedup_reason": None,
        "retrieval_details": None,
        "duration_ms": duration,
        "success": not failed,
        "error_message": rng.choice(TOOL_ERRORS) if failed else None,
        "created_at": at + timedelta(milliseconds=duration),
    }
    matches = 0
    if retrieval:
        layer = rng.choices(LAYERS, weights=(50, 20, 30))[0]
        l0 = rng.randint(0, 8) if "L0" in layer else 0
        l1 = rng.randint(0, 5) if "L1" in layer else 0
        matches = l0 + l1
        relevance = rng.choice(RELEVANCE) if matches else "REFERENCE"
        row.update(
            retrieval_layer=layer,
            l0_match_count=l0,
            l1_match_count=l1 if "L1" in layer else None,
            relevance_level=relevance,
            dedup_reason=rng.choice(DEDUP_REASONS) if relevance == "DEDUPED" else None,
        )
    elif not failed:
        matches = rng.randint(0, 4)
    if not failed:
        row["retrieval_details"] = json.dumps(_evidence(rng, name, matches), ensure_ascii=False)
    return row, duration


def generate(seed: int, runs: int, anchor: datetime, sessions: int = 12, span_seconds: float = 3600.0) -> Workload:
    """``runs`` runs spread over ``span_seconds`` before ``anchor`` (naive, source time zone)."""
    rng = random.Random(seed)
    session_ids = [f"sess-{uuid.UUID(int=rng.getrandbits(128), version=4).hex[:12]}" for _ in range(sessions)]
    offsets = sorted(rng.uniform(60, span_seconds) for _ in range(runs))[::-1]
    run_rows: list[dict] = []
    tool_rows: list[dict] = []
    for number, offset in enumerate(offsets):
        created = (anchor - timedelta(seconds=offset)).replace(microsecond=0)
        intent = _choice(rng, INTENT_WEIGHTS)
        # The newest few are still in flight, as on a live system.
        status = "RUNNING" if number >= runs - max(1, runs // 100) else _choice(rng, STATUS_WEIGHTS)
        run = {
            "run_id": f"run-{uuid.UUID(int=rng.getrandbits(128), version=4)}",
            "session_id": rng.choice(session_ids),
            "query": rng.choice(QUERIES),
            "status": status,
            "agent_flow": "CHAT_HARNESS",
            "intent": intent,
            "release_outcome": None if status == "RUNNING" else status,
            "published_result": None,
            "self_evaluation": None,
            "answer": None,
            "feedback": rng.choice(FEEDBACK),
            "total_token_count": rng.randint(400, 24000),
            "created_at": created,
        }
        at = created + timedelta(milliseconds=rng.randint(200, 1500))
        count = _tool_count(rng, intent)
        for index in range(count):
            row, duration = _tool_row(rng, run, index, at, intent)
            tool_rows.append(row)
            at += timedelta(milliseconds=duration + rng.randint(50, 900))
        total_ms = int((at - created).total_seconds() * 1000) + rng.randint(300, 4000)
        finished = created + timedelta(milliseconds=total_ms)
        if status != "RUNNING":
            run["answer"] = "诊断结论：连接池耗尽导致延迟升高，建议扩容并检查慢查询。"
            run["published_result"] = json.dumps({"outcome": status, "summary": "connection pool exhausted"})
        run.update(
            total_duration_ms=None if status == "RUNNING" else total_ms,
            step_count=count + 1,
            tool_call_count=count,
            updated_at=(finished if status != "RUNNING" else at).replace(microsecond=0),
        )
        run_rows.append(run)
    for row in tool_rows:
        row["created_at"] = row["created_at"].replace(microsecond=0)
    return Workload(run_rows, tool_rows)


def _batches(rows: list[dict], size: int) -> Iterator[list[dict]]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def insert_workload(engine: Engine, workload: Workload, create: bool = False) -> None:
    """Inserts the rows in id order (runs first), creating the tables if asked."""
    if create:
        metadata.create_all(engine)
    with engine.begin() as conn:
        for batch in _batches(workload.runs, 1000):
            conn.execute(insert(diagnosis_run), batch)
        for batch in _batches(workload.tools, 1000):
            conn.execute(insert(tool_invocation), batch)


# -- the `run-otel demo` command ------------------------------------------------


def demo_config(base: Config, db_path: Path, state_path: Path) -> Config:
    """The demo's settings: its own SQLite source and state, everything from the start."""
    return replace(
        base,
        source=replace(base.source, url=f"sqlite:///{db_path}", password_file="", timezone="UTC"),
        state=replace(base.state, url=f"sqlite:///{state_path}"),
        # The seeded runs are hours old but still "RUNNING": wait for them forever,
        # so a given seed always exports the same set.
        poll=replace(base.poll, start_from="beginning", settle_seconds=0, run_timeout_seconds=0, batch_size=25),
    )


def seed_demo_database(db_path: Path, workload: Workload) -> None:
    for path in (db_path, db_path.with_name(db_path.name + "-journal")):
        path.unlink(missing_ok=True)
    db_path.parent.mkdir(parents=True, exist_ok=True)
    engine = make_engine(make_url(f"sqlite:///{db_path}"))
    insert_workload(engine, workload, create=True)
    engine.dispose()


def interesting_runs(workload: Workload) -> tuple[str | None, str | None]:
    """A failed run with tools, and the run with the most retrieval calls."""
    per_run: dict[str, int] = {}
    for tool in workload.tools:
        if tool["retrieval_layer"]:
            per_run[tool["run_id"]] = per_run.get(tool["run_id"], 0) + 1
    tool_runs = {t["run_id"] for t in workload.tools}
    failed = next((r["run_id"] for r in workload.runs if r["status"] == "FAILED" and r["run_id"] in tool_runs), None)
    rag = max(per_run, key=lambda run_id: (per_run[run_id], run_id)) if per_run else None
    return failed, rag


def summary_rows(workload: Workload) -> list[tuple[str, str]]:
    """What the demo prints after the export: outcomes, rates and the layer mix."""
    outcomes: dict[str, int] = {}
    for run in workload.runs:
        outcomes[run["status"]] = outcomes.get(run["status"], 0) + 1
    finished = sum(n for status, n in outcomes.items() if status in STATUS_WEIGHTS)
    layers: dict[str, int] = {}
    for tool in workload.tools:
        layer = tool["retrieval_layer"] or "none"
        layers[layer] = layers.get(layer, 0) + 1
    failed_tools = sum(1 for t in workload.tools if t["success"] is False)
    return [
        ("runs by outcome", ", ".join(f"{s} {n}" for s, n in sorted(outcomes.items(), key=lambda kv: -kv[1]))),
        ("failure rate", f"{outcomes.get('FAILED', 0) / max(finished, 1):.1%} of finished runs"),
        ("fallback rate", f"{outcomes.get('FALLBACK', 0) / max(finished, 1):.1%} of finished runs"),
        ("tool calls", f"{len(workload.tools)} ({failed_tools} failed)"),
        ("retrieval layer mix", ", ".join(f"{k} {v}" for k, v in sorted(layers.items()))),
    ]


def _sql_value(value: object, anchor: datetime) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, datetime):
        # Relative to the moment the script runs, so the demo is always "the last hour".
        return f"NOW() - INTERVAL {int((anchor - value).total_seconds())} SECOND"
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def workload_sql(workload: Workload, anchor: datetime) -> str:
    """The workload as MySQL INSERTs with times relative to NOW(), for docker-entrypoint-initdb.d."""
    lines = ["-- Generated by scripts/generate.py from run_otel.ops.demo (seed 42): the demo workload.", "SET NAMES utf8mb4;"]
    for table, rows in (("diagnosis_run", workload.runs), ("tool_invocation", workload.tools)):
        columns = list(rows[0])
        for batch in _batches(rows, 200):
            values = ",\n".join("(" + ", ".join(_sql_value(row[c], anchor) for c in columns) + ")" for row in batch)
            lines.append(f"INSERT INTO {table} ({', '.join(columns)}) VALUES\n{values};")
    return "\n".join(lines) + "\n"
