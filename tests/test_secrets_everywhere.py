"""A credential quoted back by a receiver or held in a row is masked in every output:
CLI error lines, `check`, `export`, `status`, the daemon's text and JSON logs,
/metrics, and span attributes. On MariaDB, with real gRPC and HTTP receivers
that answer with the header they refused."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
import requests
from helpers import DaemonProcess, bridge_sections, run_cli, utc_now_naive, write_config
from servers import Receiver, RefusingHttpReceiver, free_port, wait_for
from sqlalchemy import insert

from run_otel.source.schema import diagnosis_run, tool_invocation

# Opaque values: no credential shape, so only verbatim masking can catch them.
TOKEN = "QZ7vK2mN9pL4xR8tW3yB"
HEADER = "Bearer " + TOKEN
DB_PASSWORD = "Kx4qPw9zLm2Rt7"


def add_run(agent_db, error_message: str = "tool failed", query: str = "why?") -> str:
    run_id = f"run-{uuid.uuid4()}"
    old = utc_now_naive() - timedelta(hours=1)
    with agent_db.engine().begin() as conn:
        conn.execute(
            insert(diagnosis_run),
            [
                dict(
                    run_id=run_id,
                    session_id="s",
                    query=query,
                    status="FAILED",
                    intent="DIAGNOSIS",
                    created_at=old,
                    updated_at=old,
                )
            ],
        )
        conn.execute(
            insert(tool_invocation),
            [
                dict(
                    session_id="s",
                    run_id=run_id,
                    tool_name="query_logs",
                    input_params=json.dumps({"q": query}),
                    success=False,
                    error_message=error_message,
                    created_at=old,
                )
            ],
        )
    return run_id


def secret_user(agent_db) -> str:
    """A database user with a password the config holds, so it is a configured secret."""
    user = f"reader_{uuid.uuid4().hex[:8]}"
    agent_db.execute(f"CREATE USER '{user}'@'%' IDENTIFIED BY '{DB_PASSWORD}'")
    agent_db.execute(f"GRANT SELECT ON `{agent_db.name}`.* TO '{user}'@'%'")
    return agent_db.server.url(agent_db.name, user, DB_PASSWORD)


def assert_clean(text: str) -> None:
    assert TOKEN not in text
    assert DB_PASSWORD not in text


@pytest.fixture
def refusing_grpc():
    receiver = Receiver()
    receiver.start()
    yield receiver
    receiver.stop()


def test_a_token_quoted_back_by_a_grpc_receiver_is_printed_nowhere(agent_db, refusing_grpc, tmp_path):
    metrics_port = free_port()
    sections = bridge_sections(
        agent_db,
        tmp_path,
        refusing_grpc.endpoint,
        source={"url": secret_user(agent_db)},
        export={"headers": {"authorization": HEADER}, "max_attempts": 1},
        metrics={"enabled": True, "port": metrics_port},
    )
    config = write_config(tmp_path / "c.toml", sections)
    add_run(agent_db)
    first = run_cli("once", "--config", str(config))
    assert first.returncode == 0, first.stderr  # a checkpoint, so `status` has a row to show
    run_id = add_run(agent_db)
    refusing_grpc.refuse_credentials = True

    outputs = {}
    for name, args in {"once": ("once",), "check": ("check",), "export": ("export", run_id), "status": ("status",)}.items():
        done = run_cli(*args, "--config", str(config))
        outputs[name] = done.stdout + done.stderr
    for log_format in ("text", "json"):
        config_log = write_config(tmp_path / f"{log_format}.toml", {**sections, "log": {"format": log_format}})
        daemon = DaemonProcess(config_log, tmp_path / f"{log_format}.log")
        try:
            wait_for(lambda d=daemon: "UNAUTHENTICATED" in d.output(), 60, "the refused export in the daemon's log")
            outputs["/metrics"] = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
        finally:
            daemon.terminate()
        outputs[f"run ({log_format} log)"] = daemon.output()

    # The receiver really quoted the header and the bare token, and what it said is printed.
    assert refusing_grpc.quoted and all(HEADER in q and f"token {TOKEN} " in q for q in refusing_grpc.quoted)
    for name in ("once", "check", "export", "run (text log)", "run (json log)"):
        assert "invalid credentials in header authorization" in outputs[name], (name, outputs[name])
    assert "run_otel_" in outputs["/metrics"]
    for name, text in outputs.items():
        assert TOKEN not in text, (name, text)
        assert DB_PASSWORD not in text, (name, text)
    assert json.loads(outputs["run (json log)"].splitlines()[-1])  # still one JSON object a line


def test_a_token_quoted_back_by_an_http_receiver_is_printed_nowhere(agent_db, tmp_path):
    receiver = RefusingHttpReceiver()
    receiver.start()
    try:
        sections = bridge_sections(
            agent_db,
            tmp_path,
            receiver.endpoint,
            protocol="http/protobuf",
            export={"headers": {"Authorization": HEADER}, "max_attempts": 1},
        )
        config = write_config(tmp_path / "c.toml", sections)
        add_run(agent_db)
        once = run_cli("once", "--config", str(config))
        check = run_cli("check", "--config", str(config))
    finally:
        receiver.stop()
    assert receiver.quoted and all(TOKEN in q for q in receiver.quoted)
    for done in (once, check):
        assert done.returncode == 1
        assert "bad credentials" in done.stdout + done.stderr
        assert_clean(done.stdout + done.stderr)


def test_configured_secrets_in_a_row_are_masked_in_every_span_attribute(agent_db, tmp_path):
    receiver = Receiver()
    receiver.start()
    try:
        sections = bridge_sections(
            agent_db,
            tmp_path,
            receiver.endpoint,
            source={"url": secret_user(agent_db)},
            export={"headers": {"authorization": HEADER}},
            content={"capture": True},
        )
        config = write_config(tmp_path / "c.toml", sections)
        add_run(agent_db, error_message=f"gateway said {TOKEN}; db said {DB_PASSWORD}", query=f"is {TOKEN} valid?")
        done = run_cli("once", "--config", str(config))
        assert done.returncode == 0, done.stderr
        spans = receiver.spans()
    finally:
        receiver.stop()
    values = [str(span.status.message) for _r, _s, span in spans]
    values += [kv.value.string_value for _r, _s, span in spans for kv in span.attributes]
    assert any("gateway said" in v for v in values) and any(v.startswith("is ") for v in values)
    for value in values:
        assert_clean(value)
