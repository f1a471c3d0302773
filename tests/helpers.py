"""Plain helpers the test modules share (the fixtures are in conftest.py): configs and the command
line, rows for the agent's tables, what the traces should be, and the scrapes and spans they are
checked against."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import requests
from servers import Jaeger, Receiver, wait_for
from sqlalchemy import text

from run_otel.config import Config, build_config
from run_otel.ops.demo import generate, insert_workload
from run_otel.telemetry import instruments as I

if TYPE_CHECKING:
    from conftest import AgentDb


def utc_now_naive() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None, microsecond=0)


def write_config(path: Path, sections: dict) -> Path:
    """Writes ``sections`` as a TOML file (flat tables of scalars and lists)."""
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            lines.append(f"{key} = {_toml(value)}")
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    tomllib.loads(path.read_text())  # the file must be valid TOML
    return path


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f'"{k}" = {_toml(v)}' for k, v in value.items()) + "}"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def bridge_sections(agent_db: AgentDb, tmp_path: Path, endpoint: str, protocol: str = "grpc", **overrides) -> dict:
    sections = {
        "source": {"url": agent_db.url},
        "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
        "poll": {"start_from": "beginning", "settle_seconds": 0, "interval_seconds": 0.5},
        "export": {"protocol": protocol, "endpoint": endpoint, "timeout_seconds": 5},
        "metrics": {"enabled": False},
    }
    for section, values in overrides.items():
        sections.setdefault(section, {}).update(values)
    return sections


def bridge_config(*args, **kwargs) -> Config:
    return build_config(bridge_sections(*args, **kwargs))


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "run_otel", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def set_old(agent_db: AgentDb, seconds: int = 30) -> None:
    """Moves every row into the past so it is settled."""
    agent_db.execute(
        "UPDATE diagnosis_run SET created_at = created_at - INTERVAL %s SECOND, updated_at = updated_at - INTERVAL %s SECOND",
        seconds,
        seconds,
    )


def table_rows(agent_db: AgentDb, sql: str) -> list[dict]:
    with agent_db.engine().connect() as conn:
        return [dict(row._mapping) for row in conn.execute(text(sql))]


class DaemonProcess:
    """`run-otel run` in a subprocess, with its stderr kept in a file."""

    def __init__(self, config: Path, log: Path, *args: str):
        self.log = log
        self._fh = log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "run_otel", "run", "--config", str(config), *args], stdout=self._fh, stderr=self._fh
        )

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()

    def terminate(self, timeout: float = 60) -> int:
        self.process.terminate()
        return self.process.wait(timeout)

    def alive(self) -> bool:
        return self.process.poll() is None

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def output(self) -> str:
        return self.log.read_text(errors="replace")


TERMINAL_SQL = "SELECT run_id FROM diagnosis_run WHERE status IN ('SUCCESS','FALLBACK','FAILED','CANCELLED')"


def terminal_trace_ids(agent_db: AgentDb) -> set[str]:
    """The trace ids every finished run in the database must arrive under (its run-<uuid>)."""
    return {r["run_id"][4:].replace("-", "") for r in table_rows(agent_db, TERMINAL_SQL)}


def demo_backfill_config(tmp_path: Path, endpoint: str, runs: int) -> Path:
    """A config for a backfill of the embedded demo's SQLite database of ``runs`` runs, metrics off."""
    db = tmp_path / "agent.db"
    subprocess.run(
        [sys.executable, "-m", "run_otel", "demo", "--db", str(db), "--runs", str(runs)],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    return write_config(
        tmp_path / "c.toml",
        {
            "source": {"url": f"sqlite:///{db}"},
            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "export": {"endpoint": endpoint},
            "metrics": {"enabled": False},
        },
    )


def received_roots(receiver) -> set[str]:
    """The trace ids of the root spans the receiver has seen."""
    return {span.trace_id.hex() for _r, _s, span in receiver.spans() if not span.parent_span_id}


# OTLP status code of the root per outcome: OK 1, ERROR 2. A trace list marks only errors, so
# FALLBACK and CANCELLED are errors too, told from FAILED by error.type (docs/mapping.md).
ROOT_STATUS = {"SUCCESS": 1, "FAILED": 2, "FALLBACK": 2, "CANCELLED": 2}


def epoch_ns(dt: datetime) -> int:
    return int(dt.replace(tzinfo=UTC).timestamp()) * 1_000_000_000


def attrs_of(span) -> dict:
    out = {}
    for kv in span.attributes:
        which = kv.value.WhichOneof("value")
        value = getattr(kv.value, which)
        if which == "array_value":
            value = tuple(v.string_value for v in value.values)
        out[kv.key] = value
    return out


def seed(agent_db, runs: int, seed_value: int = 7, waiting: int = 10) -> None:
    """``runs`` runs of the demo mix, with ``waiting`` of them set PENDING or RUNNING."""
    workload = generate(seed_value, runs, anchor=utc_now_naive())
    insert_workload(agent_db.engine(), workload)
    if not waiting:
        return
    agent_db.execute(
        "UPDATE diagnosis_run SET status = IF(MOD(id, 2) = 0, 'PENDING', 'RUNNING'), release_outcome = NULL "
        "WHERE MOD(id, %s) = 3 LIMIT %s",
        max(2, runs // waiting),
        waiting,
    )


def expected_traces(agent_db) -> dict[str, tuple[dict, list[dict]]]:
    """Terminal runs and their tools, read straight from the database: trace id -> rows."""
    runs = table_rows(agent_db, "SELECT * FROM diagnosis_run WHERE status IN ('SUCCESS','FALLBACK','FAILED','CANCELLED')")
    tools = defaultdict(list)
    for tool in table_rows(agent_db, "SELECT * FROM tool_invocation ORDER BY id"):
        tools[tool["run_id"]].append(tool)
    return {run["run_id"][4:].replace("-", ""): (run, tools[run["run_id"]]) for run in runs}


def assert_trace_matches(run: dict, tools: list[dict], spans: list) -> None:
    # The rating has spans of its own in the trace, sent by the feedback pass after the run.
    ratings = [s for s in spans if s.name.startswith(("evaluation ", "superseded "))]
    labels = {attrs_of(s)["gen_ai.evaluation.score.label"] for s in ratings if s.name.startswith("evaluation ")}
    assert labels <= {run["feedback"]}, run["run_id"]
    spans = [s for s in spans if s not in ratings]
    roots = [s for s in spans if not s.parent_span_id]
    assert len(roots) == 1, run["run_id"]
    root = roots[0]
    children = sorted((s for s in spans if s.parent_span_id), key=lambda s: int(attrs_of(s)["gen_ai.tool.call.id"]))
    assert len(children) == len(tools)
    assert root.name == "invoke_agent diagnosis-agent"
    root_attrs = attrs_of(root)
    assert "diagnosis.run.feedback" not in root_attrs  # a root that changed with the rating would not re-send identically
    assert root_attrs["diagnosis.run.id"] == run["run_id"]
    assert root_attrs["diagnosis.run.status"] == run["status"]
    assert root_attrs["gen_ai.conversation.id"] == run["session_id"]
    assert root_attrs.get("diagnosis.run.intent") == run["intent"]
    assert root_attrs.get("diagnosis.run.total_token_count") == run["total_token_count"]
    assert root.status.code == ROOT_STATUS[run["status"]], (run["status"], root.status)
    starts, ends = [epoch_ns(run["created_at"])], [epoch_ns(run["created_at"]) + run["total_duration_ms"] * 1_000_000]
    for child, tool in zip(children, tools):
        attrs = attrs_of(child)
        assert child.parent_span_id == root.span_id
        assert child.name == f"{'retrieval' if tool['retrieval_layer'] else 'execute_tool'} {tool['tool_name']}"
        assert attrs["gen_ai.tool.call.id"] == str(tool["id"])
        assert attrs.get("rag.retrieval_layer") == tool["retrieval_layer"]
        assert attrs.get("rag.l0_match_count") == tool["l0_match_count"]
        assert attrs.get("rag.l1_match_count") == tool["l1_match_count"]
        assert attrs.get("rag.relevance_level") == tool["relevance_level"]
        assert attrs["gen_ai.tool.type"] == ("datastore" if tool["retrieval_layer"] else "function")
        assert (child.status.code == 2) == (tool["success"] == 0)
        assert child.end_time_unix_nano == epoch_ns(tool["created_at"])
        assert child.start_time_unix_nano == epoch_ns(tool["created_at"]) - tool["duration_ms"] * 1_000_000
        starts.append(child.start_time_unix_nano)
        ends.append(child.end_time_unix_nano)
    assert root.start_time_unix_nano == min(starts)
    assert root.end_time_unix_nano == max(ends)


def start_daemon(config: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "run_otel", "run", "--config", str(config)], stderr=subprocess.PIPE, text=True)


def http_status(url: str) -> int:
    try:
        return requests.get(url, timeout=2).status_code
    except requests.RequestException:
        return 0


# The variables as Grafana fills them by default: the shipped job, All for the rest.
VARIABLES = {"$job": I.JOB, "$instance": ".+", "$shard": ".+", "$intent": ".+", "$__range": "10m"}


# A line that is there only before the first successful poll.
NOT_YET = "no successful poll yet"


def filled(expr: str, rate_interval: str = "1m") -> str:
    expr = expr.replace("$__rate_interval", rate_interval)
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, expr
    return expr


# Grafana's query intervals for the shipped Prometheus data source (timeInterval 15s): its
# round_interval table (kbn.ts), as (below this many ms, round to this many ms).
GRAFANA_SCRAPE_SECONDS = 15
_ROUNDED_MS = (
    (1500, 1000), (3500, 2000), (7500, 5000), (12500, 10000), (17500, 15000), (25000, 20000), (45000, 30000),
    (90000, 60000), (210000, 120000), (450000, 300000), (750000, 600000), (1050000, 900000), (1500000, 1200000),
    (2700000, 1800000), (5400000, 3600000), (9000000, 7200000), (16200000, 10800000), (32400000, 21600000),
    (86400000, 43200000), (604800000, 86400000), (1814400000, 604800000), (3628800000, 2592000000),
)  # fmt: skip
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def grafana_intervals(range_seconds: float, panel: dict, screen_px: int = 1920) -> tuple[int, int]:
    """($__interval, $__rate_interval) in seconds, as Grafana computes them for ``panel`` over a range
    of ``range_seconds`` on a screen ``screen_px`` wide: a point per pixel of the panel's width, rounded,
    at least the panel's min interval (else the scrape interval); the rate window is that plus a
    scrape interval, and at least four of them."""
    points = panel["gridPos"]["w"] * screen_px / 24
    wanted = range_seconds * 1000 / points
    rounded = next((to for below, to in _ROUNDED_MS if wanted < below), 31536000000) / 1000
    least = panel.get("interval") or f"{GRAFANA_SCRAPE_SECONDS}s"
    interval = max(rounded, int(least[:-1]) * _UNITS[least[-1]])
    return int(interval), int(max(interval + GRAFANA_SCRAPE_SECONDS, 4 * GRAFANA_SCRAPE_SECONDS))


def panels(dashboard: dict):
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            if inner.get("targets"):
                yield inner


def scalar(result: list) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


def feedback_spans(receiver: Receiver) -> list:
    return [span for _r, _s, span in receiver.spans() if span.name.startswith("evaluation ")]


def attrs(span) -> dict:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in span.attributes}


def rate(agent_db, run_ids: list[str], value: str) -> None:
    for run_id in run_ids:
        agent_db.execute("UPDATE diagnosis_run SET feedback = %s, updated_at = NOW() WHERE run_id = %s", value, run_id)


def add_runs(agent_db, created: list[str], status: str = "SUCCESS") -> list[str]:
    """Runs with the given created_at SQL expressions, in this id order; returns their trace ids."""
    traces = []
    for expression in created:
        run_uuid = uuid.uuid4()
        agent_db.execute(
            f"INSERT INTO diagnosis_run (run_id, session_id, query, status, created_at, updated_at) "
            f"VALUES (%s, 's', 'q', %s, {expression}, {expression})",
            f"run-{run_uuid}",
            status,
        )
        traces.append(run_uuid.hex)
    return traces


def add_finished_runs(agent_db, count: int, created: str = "UTC_TIMESTAMP() - INTERVAL 1 MINUTE") -> list[str]:
    """``count`` finished runs created at one SQL time; returns their trace ids, in id order."""
    return add_runs(agent_db, [created] * count)


OLD = utc_now_naive() - timedelta(hours=2)


def sql_literal(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, (int, float)):
        return str(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def add_run(conn, run_id: str, **columns) -> None:
    values = dict(run_id=run_id, session_id="sess-bad", query="q", status="SUCCESS", created_at=str(OLD), updated_at=str(OLD))
    values.update(columns)
    with conn.cursor() as cur:
        cur.execute(
            f"INSERT INTO diagnosis_run ({', '.join(values)}) VALUES ({', '.join(sql_literal(v) for v in values.values())})"
        )


def add_tool(conn, run_id: str | None, **columns) -> None:
    values = dict(session_id="sess-bad", run_id=run_id, tool_name="lookup_knowledge", input_params="{}", created_at=str(OLD))
    values.update(columns)
    with conn.cursor() as cur:
        cur.execute(
            f"INSERT INTO tool_invocation ({', '.join(values)}) VALUES ({', '.join(sql_literal(v) for v in values.values())})"
        )


def new_run_id() -> str:
    return f"run-{uuid.uuid4()}"


def seed_corpus(agent_db) -> dict[str, str]:
    """Inserts every bad case; returns case name -> run_id."""
    cases: dict[str, str] = {}
    conn = agent_db.server.root(agent_db.name)
    with conn.cursor() as cur:
        # A permissive server: no JSON check, zero dates allowed, as legacy data has them.
        cur.execute("SET SESSION check_constraint_checks = 0")
        cur.execute("SET SESSION sql_mode = ''")

    def case(name: str, run_id: str | None = None, **run_columns) -> str:
        cases[name] = run_id or new_run_id()
        add_run(conn, cases[name], **run_columns)
        return cases[name]

    r = case("malformed json")
    add_tool(conn, r, input_params="{not json", retrieval_details='{"evidence_refs": [')
    r = case("non-object json")
    add_tool(conn, r, input_params="[1, 2]", retrieval_details='"just a string"')
    r = case("evidence_refs of the wrong type")
    add_tool(conn, r, retrieval_details='{"evidence_status": "supported", "evidence_refs": {"raw_path": "$.x"}}')
    add_tool(conn, r, retrieval_details='{"evidence_refs": [42, "x", {"raw_path": 7}, {"raw_path": "$.ok"}]}')
    r = case("unknown enums", status="ARCHIVED")
    add_tool(conn, r, relevance_level="SUPER_RELEVANT", retrieval_layer="L9")
    case("unknown status again", status="ARCHIVED")
    # Only the NOT NULL columns set (status is SUCCESS: a NULL status waits, as it should).
    r = case("every nullable column NULL")
    add_tool(conn, r)
    r = case("durations", total_duration_ms=-1)
    add_tool(conn, r, duration_ms=-5)
    add_tool(conn, r, duration_ms=0)
    add_tool(conn, r, duration_ms=10**9)
    case("created_at after updated_at", created_at=str(OLD + timedelta(minutes=5)), updated_at=str(OLD))
    r = case("zero dates", created_at="0000-00-00 00:00:00", updated_at="0000-00-00 00:00:00")
    add_tool(conn, r, created_at="0000-00-00 00:00:00")
    r = case("1 MB output_preview")
    add_tool(conn, r, output_preview="y" * 1_000_000, output_length=1_000_000, success=1)
    r = case("emoji and bad bytes", query="磁盘满了 🔥🔥 \ufffd")
    # Raw invalid UTF-8 sent over a binary connection: the server stores what
    # utf8mb4 can hold (it replaces the bytes), and the bridge must cope with that.
    with conn.cursor() as cur:
        cur.execute("SET NAMES binary")
        cur.execute(b"UPDATE diagnosis_run SET answer = CONCAT('ok ', X'C3FFFE') WHERE run_id = '" + r.encode() + b"'")
        cur.execute("SET NAMES utf8mb4")
    add_tool(conn, r, tool_name="query_logs_🔥", error_message="失败 💥 timeout", success=0)
    case("not a uuid", run_id="legacy-run-42")
    add_tool(conn, "run-that-does-not-exist", tool_name="orphan")
    add_tool(conn, None, tool_name="legacy_no_run_id")
    r = case("5000 tools")
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO tool_invocation (session_id, run_id, tool_name, input_params, duration_ms, success, created_at) "
            "VALUES ('s', %s, 'query_metrics', '{}', 5, 1, %s)",
            [(r, str(OLD))] * 5000,
        )
    conn.close()
    return cases


def bridge_metrics(config, readers: list, registry=None):
    """BridgeMetrics from a config, with the readers a test reads them through."""
    from run_otel.telemetry.metrics import BridgeMetrics

    return BridgeMetrics(config.feedback, config.poll.settle_seconds, config.shard, readers, registry)


def start_logging(config, stream=None):
    """Logging as the command line sets it up: the config's format and level, its secrets masked."""
    from run_otel.mapping.masking import Scrubber, configured_secrets
    from run_otel.telemetry.logs import configure_logging

    return configure_logging(
        config.log, Scrubber.for_secrets(configured_secrets(config.export, config.source, config.state)), stream
    )


# -- what run-otel costs the agent's database, by MariaDB's own account -------------------------


@dataclass
class Statement:
    """One statement in MariaDB's slow log: who sent it, the rows it examined, whether it was a full scan."""

    user: str
    rows_examined: int
    full_scan: bool
    sql: str


_SLOW_HEAD = re.compile(r"^# User@Host: (\S+?)\[", re.M)
_SLOW_NOT_SQL = re.compile(r"#|SET timestamp=|use |\S+, Version: |Tcp port: |Time\s+Id\s+Command")


def reader_url(agent_db: AgentDb, user: str = "run_otel_reader") -> str:
    """A user of its own that may only read the agent's database: its statements are told from the test's own."""
    for statement in (
        f"CREATE OR REPLACE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'reader-pw'",
        f"GRANT SELECT ON `{agent_db.name}`.* TO '{user}'@'127.0.0.1'",
    ):
        agent_db.execute(statement)
    return agent_db.server.url(agent_db.name, user, "reader-pw")


class StatementLog:
    """MariaDB's slow log at long_query_time = 0 with its query plan: every statement of a session opened
    while it is on, with the rows it examined (``Rows_examined``) and whether it was a full scan
    (``Full_scan``, which the server sets where it counts ``Select_scan``)."""

    def __init__(self, agent_db: AgentDb, path: Path):
        self._server, self.path = agent_db.server, path

    def _set(self, *assignments: str) -> None:
        conn = self._server.root()
        try:
            with conn.cursor() as cur:
                for assignment in assignments:
                    cur.execute(f"SET GLOBAL {assignment}")
                cur.execute("FLUSH SLOW LOGS")
        finally:
            conn.close()

    def __enter__(self) -> StatementLog:
        self._set(
            f"slow_query_log_file = '{self.path}'",
            "log_output = 'FILE'",
            "long_query_time = 0",
            "log_slow_verbosity = 'query_plan'",
            "slow_query_log = ON",
        )
        return self

    def __exit__(self, *_exc) -> None:
        self._set("slow_query_log = OFF", "long_query_time = 10")

    def statements(self, user: str = "run_otel_reader") -> list[Statement]:
        """Every statement of ``user`` logged so far, in order."""
        self._set()  # FLUSH SLOW LOGS: what was written is in the file
        text = self.path.read_text(errors="replace") if self.path.exists() else ""
        heads = list(_SLOW_HEAD.finditer(text))
        out = []
        for head, following in zip(heads, [*heads[1:], None]):
            chunk = text[head.start() : following.start() if following else len(text)]
            sql = " ".join(line for line in chunk.splitlines() if line and not _SLOW_NOT_SQL.match(line))
            examined, scan = re.search(r"Rows_examined: (\d+)", chunk), re.search(r"Full_scan: (Yes|No)", chunk)
            if head[1] == user:
                out.append(Statement(head[1], int(examined[1]) if examined else 0, bool(scan and scan[1] == "Yes"), sql))
        return out

    def mark(self, user: str = "run_otel_reader") -> int:
        """How many statements ``user`` sent so far: ``since(mark)`` gives those sent after."""
        return len(self.statements(user))

    def since(self, mark: int, user: str = "run_otel_reader") -> list[Statement]:
        return self.statements(user)[mark:]


def counter(reader, instrument, **labels: str) -> float:
    """The sum of ``instrument``'s points whose attributes include ``labels``, from an InMemoryMetricReader."""
    data = reader.get_metrics_data()
    total = 0.0
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == instrument.name:
                    total += sum(p.value for p in metric.data.data_points if labels.items() <= dict(p.attributes).items())
    return total


def warnings_of(trace: dict) -> list[str]:
    """The warnings Jaeger put on a trace's spans (clock skew, duplicate span ids)."""
    return [warning for span in trace["spans"] for warning in span.get("warnings") or []]


def jaeger_trace(jaeger: Jaeger, trace_id: str, spans: int) -> dict:
    """The trace once Jaeger holds at least ``spans`` of its spans."""
    return wait_for(
        lambda: (trace := jaeger.trace(trace_id)) and len(trace["spans"]) >= spans and trace,
        30,
        f"{spans} spans of trace {trace_id} in Jaeger",
        0.2,
    )
