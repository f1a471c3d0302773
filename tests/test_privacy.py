"""Privacy by default, on MariaDB: content stays home unless opted in, statements only read,
secrets never printed."""

from __future__ import annotations

import json
import re
import uuid
from datetime import timedelta

import pytest
import requests
from helpers import bridge_config, bridge_sections, run_cli, utc_now_naive, write_config
from servers import free_port, wait_for
from sqlalchemy import Engine, event, insert

from run_otel.factory import build_backfill, build_parts, build_poller, start_metrics
from run_otel.ops.check import run_checks
from run_otel.ops.show import run_trace
from run_otel.source.schema import diagnosis_run, tool_invocation

CONTENT_COLUMNS = ("query", "answer", "published_result", "input_params", "output_preview", "evidence")


def seed_markers(agent_db, runs: int = 5) -> dict[str, list[str]]:
    """Runs whose every content column holds a unique marker; returns the markers by column."""
    markers = {column: [] for column in CONTENT_COLUMNS}
    old = utc_now_naive() - timedelta(hours=1)
    run_rows, tool_rows = [], []
    for n in range(runs):
        mark = {c: f"MARK-{c}-{uuid.uuid4().hex}" for c in CONTENT_COLUMNS}
        for column, value in mark.items():
            markers[column].append(value)
        run_id = f"run-{uuid.uuid4()}"
        run_rows.append(
            dict(
                run_id=run_id,
                session_id="sess-privacy",
                query=f"why is {mark['query']} slow?",
                status="SUCCESS",
                intent="DIAGNOSIS",
                release_outcome="SUCCESS",
                answer=f"because {mark['answer']}",
                published_result=json.dumps({"summary": mark["published_result"]}),
                total_duration_ms=900,
                created_at=old,
                updated_at=old,
            )
        )
        tool_rows.append(
            dict(
                session_id="sess-privacy",
                run_id=run_id,
                tool_name="query_logs",
                input_params=json.dumps({"q": mark["input_params"]}),
                output_preview=f"found {mark['output_preview']}",
                retrieval_details=json.dumps(
                    {"evidence_status": "supported", "evidence_refs": [{"raw_path": "$.logs[0]", "text": mark["evidence"]}]}
                ),
                duration_ms=120,
                success=n % 2 == 0,
                error_message=None if n % 2 == 0 else "boom for ops@example.com",
                created_at=old,
            )
        )
    with agent_db.engine().begin() as conn:
        conn.execute(insert(diagnosis_run), run_rows)
        conn.execute(insert(tool_invocation), tool_rows)
    return markers


def all_markers(markers: dict[str, list[str]]) -> list[str]:
    return [m for values in markers.values() for m in values]


def test_content_never_leaves_by_default(agent_db, otlp, tmp_path):
    markers = seed_markers(agent_db)
    config = write_config(tmp_path / "c.toml", bridge_sections(agent_db, tmp_path, otlp.endpoint("grpc"), log={"level": "DEBUG"}))
    done = run_cli("once", "--config", str(config))
    assert done.returncode == 0, done.stderr
    wait_for(lambda: len(otlp.receiver.spans()) >= 10, 30, "the spans")
    exported = b"".join(otlp.receiver.requests)
    logs = done.stdout + done.stderr
    assert "no checkpoint" in logs  # the log really was captured
    for marker in all_markers(markers):
        assert marker.encode() not in exported, marker
        assert marker not in logs, marker
    # error_message is not user content, but it is always redacted.
    assert b"boom for [REDACTED]" in exported
    assert b"ops@example.com" not in exported


def test_content_when_opted_in_is_truncated_and_redacted(agent_db, otlp, tmp_path):
    old = utc_now_naive() - timedelta(hours=1)
    secret_query = (
        "mail li.lei@example.cn or call +86 138-1234-5678 / 13912345678 / +1 415 555 0100, "
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig key sk-proj-abcdefghijklmnop1234 "
        "ticket TCK-99812 " + "x" * 500
    )
    with agent_db.engine().begin() as conn:
        conn.execute(
            insert(diagnosis_run),
            [
                dict(
                    run_id="run-7d3f1c2a-1111-4222-8333-444455556666",
                    session_id="s",
                    query=secret_query,
                    status="SUCCESS",
                    answer="ok",
                    created_at=old,
                    updated_at=old,
                )
            ],
        )
    config = write_config(
        tmp_path / "c.toml",
        bridge_sections(
            agent_db,
            tmp_path,
            otlp.endpoint("grpc"),
            content={"capture": True, "max_length": 200, "redact": [r"TCK-\d+"]},
        ),
    )
    assert run_cli("once", "--config", str(config)).returncode == 0
    wait_for(lambda: otlp.receiver.spans(), 30, "the span")
    ((_r, _s, root),) = otlp.receiver.spans()
    query = next(kv.value.string_value for kv in root.attributes if kv.key == "diagnosis.run.query")
    assert len(query) == 200
    for leaked in (
        "li.lei@example.cn",
        "138-1234-5678",
        "13912345678",
        "415 555 0100",
        "eyJhbGciOiJIUzI1NiJ9",
        "sk-proj-abc",
        "TCK-99812",
    ):
        assert leaked not in query, leaked
    assert query.count("[REDACTED]") == 7


def _record_statements(statements: list[str]):
    def record(conn, _cursor, statement, _params, _context, _many):
        if conn.engine.dialect.name == "mysql":
            statements.append(statement)

    return record


@pytest.mark.parametrize("conventions", [["gen_ai"], ["gen_ai", "openinference"]])
def test_capture_off_never_selects_content_under_any_profile(agent_db, otlp, tmp_path, conventions):
    markers = seed_markers(agent_db, 4)
    config = bridge_config(
        agent_db,
        tmp_path,
        otlp.endpoint("grpc"),
        trace={"conventions": conventions},
        metrics={"enabled": True, "port": free_port()},
    )
    statements: list[str] = []
    record = _record_statements(statements)
    event.listen(Engine, "before_cursor_execute", record)
    try:
        metrics, server = start_metrics(config)
        parts = build_parts(config, recorder=metrics)
        assert build_poller(parts).poll().run_count == 4
        build_backfill(parts).run(1, 10, record_metrics=True)
        assert run_trace(config, parts.source, "run-nope") is None
        list(run_checks(config))
        scraped = requests.get(f"http://127.0.0.1:{config.metrics.port}/metrics", timeout=5).text
        server.stop()
        metrics.shutdown()
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    assert any("tool_invocation" in s for s in statements) and any("diagnosis_run" in s for s in statements)
    content_columns = re.compile(r"\b(query|answer|published_result|input_params|output_preview)\b", re.I)
    for statement in statements:
        assert not content_columns.search(statement), statement
    wait_for(lambda: len(otlp.receiver.spans()) >= 16, 30, "both exports")
    exported = b"".join(otlp.receiver.requests)
    assert "diagnosis_runs_total" in scraped
    for marker in all_markers(markers):
        assert marker.encode() not in exported and marker not in scraped, marker


def test_every_statement_only_reads_the_two_tables(agent_db, otlp, tmp_path):
    seed_markers(agent_db, 3)
    config = bridge_config(agent_db, tmp_path, otlp.endpoint("grpc"), content={"capture": True})
    statements: list[str] = []

    record = _record_statements(statements)
    event.listen(Engine, "before_cursor_execute", record)
    try:
        parts = build_parts(config)
        assert build_poller(parts).poll().run_count
        build_backfill(parts).run(1, 10)
        assert run_trace(config, parts.source, "run-nope") is None
        data_path = list(statements)
        findings = list(run_checks(config))
        assert findings
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    assert data_path and len(statements) > len(data_path)
    writes = re.compile(r"^\s*(INSERT|UPDATE|DELETE|REPLACE|CREATE|ALTER|DROP|TRUNCATE|GRANT|REVOKE|LOCK|CALL|LOAD)\b", re.I)
    for statement in statements:
        assert "agent_reasoning_audit" not in statement
        assert "self_evaluation" not in statement
        assert not re.search(r"select\s+\*", statement, re.I), statement
        assert not writes.match(statement), statement
    # What the bridge itself sends: SELECTs, the dialect's session set-up on connect, and the agent's
    # table definitions (AUTO_INCREMENT, the run_id key and collation), which read no row.
    bookkeeping = re.compile(
        r"^\s*(SHOW VARIABLES|SHOW COLLATION|SET SESSION TRANSACTION ISOLATION LEVEL"
        r"|SHOW CREATE TABLE (diagnosis_run|tool_invocation)$)",
        re.I,
    )
    for statement in data_path:
        assert statement.lstrip().upper().startswith("SELECT") or bookkeeping.match(statement), statement


@pytest.mark.parametrize("command", ["once", "check"])
def test_a_bad_password_is_never_printed(agent_db, tmp_path, command):
    url = agent_db.server.url(agent_db.name, "root", "pw-WRONG-hunter2")
    config = write_config(
        tmp_path / "c.toml",
        {
            "source": {"url": url},
            "state": {"url": f"sqlite:///{tmp_path / 's.db'}"},
            "export": {"endpoint": f"127.0.0.1:{free_port()}"},
        },
    )
    done = run_cli(command, "--config", str(config))
    assert done.returncode == 1
    assert "Access denied" in done.stdout + done.stderr
    assert "pw-WRONG-hunter2" not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


def test_an_unreachable_host_is_reported_without_the_password(tmp_path):
    url = f"mysql+pymysql://reader:pw-hunter3@127.0.0.1:{free_port()}/agent"
    config = write_config(
        tmp_path / "c.toml",
        {"source": {"url": url, "connect_timeout_seconds": 2}, "state": {"url": f"sqlite:///{tmp_path / 's.db'}"}},
    )
    done = run_cli("once", "--config", str(config))
    assert done.returncode == 1
    assert "pw-hunter3" not in done.stdout + done.stderr
    assert "Can't connect" in done.stderr
    assert "reader:***@127.0.0.1" in done.stderr


def test_help_never_shows_the_configured_dsn():
    env = {"RUN_OTEL_SOURCE__URL": "mysql+pymysql://reader:pw-hunter4@db/agent", "RUN_OTEL_CONFIG": "/nonexistent.toml"}
    for command in ("--help", "run --help", "once --help", "check --help", "backfill --help", "show --help", "demo --help"):
        done = run_cli(*command.split(), env=env)
        assert done.returncode == 0, command
        assert "pw-hunter4" not in done.stdout + done.stderr
