"""`demo`, `show`, `check` and the CLI's manners, as an SRE at a terminal meets them."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers import bridge_sections, run_cli, write_config
from otlp_helpers import parse_otlp_json
from servers import wait_for

ANCHOR = "2026-11-30T12:00:00"


def demo(tmp_path: Path, *args: str, env: dict | None = None, name: str = "demo"):
    db, out = tmp_path / f"{name}.db", tmp_path / f"{name}.jsonl"
    done = run_cli("demo", "--db", str(db), "--out", str(out), "--anchor", ANCHOR, *args, env=env)
    assert done.returncode == 0, done.stderr
    return db, out, done


def spans_in(out: Path) -> list:
    spans = []
    for line in out.read_text().splitlines():
        for rs in parse_otlp_json(line).resource_spans:
            for ss in rs.scope_spans:
                spans.extend(ss.spans)
    return spans


def db_rows(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


# -- demo -------------------------------------------------------------------------


def test_demo_writes_otlp_json_that_parses_back_into_the_mapping(tmp_path):
    db, out, done = demo(tmp_path, env={"OTEL_EXPORTER_OTLP_ENDPOINT": ""})
    assert str(out.name) in done.stdout
    spans = spans_in(out)
    terminal = db_rows(db, "SELECT run_id, status FROM diagnosis_run WHERE status NOT IN ('RUNNING','PENDING')")
    statuses = Counter(status for _run_id, status in terminal)
    assert {"SUCCESS", "FALLBACK", "FAILED", "CANCELLED"} <= set(statuses)
    assert db_rows(db, "SELECT COUNT(*) FROM diagnosis_run WHERE status = 'RUNNING'")[0][0] > 0
    tools = db_rows(db, "SELECT run_id, id, tool_name, retrieval_layer FROM tool_invocation")
    roots = {s.trace_id.hex(): s for s in spans if not s.parent_span_id}
    assert set(roots) == {run_id[4:].replace("-", "") for run_id, _ in terminal}
    terminal_ids = {run_id for run_id, _ in terminal}
    expected_children = {
        hashlib.sha256(f"tool_invocation:{run_id}:{tool_id}".encode()).digest()[
            :8
        ]: f"{'retrieval' if layer else 'execute_tool'} {name}"
        for run_id, tool_id, name, layer in tools
        if run_id in terminal_ids
    }
    children = {s.span_id: s for s in spans if s.parent_span_id}
    assert set(children) == set(expected_children)
    for span_id, span in children.items():
        assert span.name == expected_children[span_id]
        assert span.parent_span_id == roots[span.trace_id.hex()].span_id
    for root in roots.values():
        assert root.name == "invoke_agent diagnosis-agent"
        assert root.start_time_unix_nano <= root.end_time_unix_nano
    for label in ("runs by outcome", "failure rate", "fallback rate", "retrieval layer mix", "a failed run", "a RAG-heavy run"):
        assert label in done.stdout


def test_demo_workload_is_realistic(tmp_path):
    db, _out, _done = demo(tmp_path)
    runs = db_rows(db, "SELECT status, intent, session_id FROM diagnosis_run")
    assert 280 <= len(runs) <= 320
    share = Counter(status for status, _, _ in runs)
    assert 0.75 < share["SUCCESS"] / len(runs) < 0.93
    assert {intent for _, intent, _ in runs} == {"SYSTEM_CHAT", "KNOWLEDGE_QUERY", "DIAGNOSIS"}
    assert len({session for _, _, session in runs}) > 3
    per_run = db_rows(
        db, "SELECT COUNT(t.id) FROM diagnosis_run r LEFT JOIN tool_invocation t ON t.run_id = r.run_id GROUP BY r.id"
    )
    counts = [n for (n,) in per_run]
    assert min(counts) == 0 and max(counts) <= 12
    tools = db_rows(
        db,
        "SELECT retrieval_layer, relevance_level, dedup_reason, retrieval_details, success, error_message FROM tool_invocation",
    )
    assert {t[0] for t in tools} == {None, "L0", "L1", "L0+L1"}
    assert {t[1] for t in tools} >= {"PRECISE", "HIGHLY_RELEVANT", "REFERENCE", "DEDUPED"}
    assert {t[2] for t in tools} >= {"doc_retrieved", "domain_retrieved"}
    assert any(t[3] and "$.no_evidence" in t[3] for t in tools)
    assert any(t[4] == 0 and t[5] for t in tools)


def test_same_seed_same_bytes_other_seed_other_data(tmp_path):
    db1, out1, _ = demo(tmp_path, "--seed", "7", name="a")
    db2, out2, _ = demo(tmp_path, "--seed", "7", name="b")
    db3, out3, _ = demo(tmp_path, "--seed", "8", name="c")
    dump = "SELECT * FROM diagnosis_run ORDER BY id"
    tools = "SELECT * FROM tool_invocation ORDER BY id"
    assert db_rows(db1, dump) == db_rows(db2, dump)
    assert db_rows(db1, tools) == db_rows(db2, tools)
    assert out1.read_bytes() == out2.read_bytes()
    assert db_rows(db1, dump) != db_rows(db3, dump)
    assert out1.read_bytes() != out3.read_bytes()


def test_demo_delivers_to_the_otlp_endpoint(tmp_path, otlp):
    db = tmp_path / "demo.db"
    done = run_cli("demo", "--db", str(db), "--anchor", ANCHOR, env={"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint("grpc")})
    assert done.returncode == 0, done.stderr
    terminal = {r[0][4:].replace("-", "") for r in db_rows(db, "SELECT run_id FROM diagnosis_run WHERE status <> 'RUNNING'")}
    total = (
        len(terminal)
        + db_rows(
            db, "SELECT COUNT(*) FROM tool_invocation t JOIN diagnosis_run r ON r.run_id = t.run_id WHERE r.status <> 'RUNNING'"
        )[0][0]
    )
    wait_for(lambda: len(otlp.receiver.spans()) >= total, 30, "the demo's spans")
    assert {span.trace_id.hex() for _r, _s, span in otlp.receiver.spans()} == terminal


# -- show -------------------------------------------------------------------------


@pytest.fixture
def demo_db(tmp_path) -> Path:
    db, _out, _done = demo(tmp_path)
    return db


def show(db: Path, run_id: str, tmp_path: Path, **ui):
    config = write_config(tmp_path / "show.toml", {"source": {"url": f"sqlite:///{db}"}, "ui": ui})
    return run_cli("show", run_id, "--config", str(config))


def test_show_a_failed_run(demo_db, tmp_path):
    (run_id,) = db_rows(
        demo_db,
        "SELECT r.run_id FROM diagnosis_run r JOIN tool_invocation t ON t.run_id = r.run_id "
        "WHERE r.status = 'FAILED' AND t.success = 0 LIMIT 1",
    )[0]
    done = show(demo_db, run_id, tmp_path, jaeger_url="http://jaeger:16686", tempo_url="http://grafana:3000")
    assert done.returncode == 0, done.stderr
    trace_id = run_id[4:].replace("-", "")
    assert f"trace {trace_id}" in done.stdout
    assert "ERROR run_failed" in done.stdout
    assert "ERROR tool_error" in done.stdout
    assert f"http://jaeger:16686/trace/{trace_id}" in done.stdout
    assert "http://grafana:3000/explore" in done.stdout
    tool_count = db_rows(demo_db, f"SELECT COUNT(*) FROM tool_invocation WHERE run_id = '{run_id}'")[0][0]
    assert done.stdout.count("execute_tool") + done.stdout.count("retrieval ") == tool_count


def test_show_a_run_without_tools(demo_db, tmp_path):
    (run_id,) = db_rows(
        demo_db,
        "SELECT run_id FROM diagnosis_run r WHERE status = 'SUCCESS' AND NOT EXISTS "
        "(SELECT 1 FROM tool_invocation t WHERE t.run_id = r.run_id) LIMIT 1",
    )[0]
    done = show(demo_db, run_id, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "invoke_agent diagnosis-agent" in done.stdout
    assert "execute_tool" not in done.stdout


def test_show_an_unknown_run(demo_db, tmp_path):
    done = show(demo_db, "run-does-not-exist", tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"run-otel: error: no run with run_id 'run-does-not-exist' in sqlite:///{demo_db}"
    ]


# -- check on MariaDB ---------------------------------------------------------------


def check(agent_db, tmp_path, otlp_endpoint: str, url: str | None = None):
    sections = bridge_sections(agent_db, tmp_path, otlp_endpoint, source={"evidence_in_database": True})
    if url:
        sections["source"]["url"] = url
    return run_cli("check", "--config", str(write_config(tmp_path / "check.toml", sections)))


def make_reader(agent_db, name: str, grants: list[str]) -> str:
    for statement in [f"CREATE OR REPLACE USER '{name}'@'127.0.0.1' IDENTIFIED BY 'pw-{name}'", *grants]:
        agent_db.execute(statement.format(db=agent_db.name, user=f"'{name}'@'127.0.0.1'"))
    return agent_db.server.url(agent_db.name, name, f"pw-{name}")


SELECT_ONLY = [
    "GRANT SELECT ON `{db}`.diagnosis_run TO {user}",
    "GRANT SELECT ON `{db}`.tool_invocation TO {user}",
]


def test_check_passes_on_a_correct_schema_with_a_select_only_user(agent_db, otlp, tmp_path):
    url = make_reader(agent_db, "reader", SELECT_ONLY)
    done = check(agent_db, tmp_path, otlp.endpoint("grpc"), url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "check passed with 0 warning(s)" in done.stdout
    assert "SELECT only" in done.stdout
    assert "pw-reader" not in done.stdout + done.stderr
    # The select-only user can run the JSON functions the tool statement uses.
    assert "✔ source.evidence_in_database: the database summarizes retrieval_details" in done.stdout


def test_check_warns_about_a_user_that_can_write(agent_db, otlp, tmp_path):
    url = make_reader(agent_db, "writer", ["GRANT SELECT, INSERT, UPDATE ON `{db}`.* TO {user}"])
    done = check(agent_db, tmp_path, otlp.endpoint("grpc"), url)
    assert done.returncode == 0
    assert "the user can write (INSERT, UPDATE)" in done.stdout
    assert "read beyond the two tables" in done.stdout


def test_check_names_a_dropped_column(agent_db, otlp, tmp_path):
    agent_db.execute("ALTER TABLE tool_invocation DROP COLUMN relevance_level")
    done = check(agent_db, tmp_path, otlp.endpoint("grpc"))
    assert done.returncode == 1
    assert "table tool_invocation: missing column(s): relevance_level" in done.stdout
    assert "check failed" in done.stdout


def test_check_warns_about_a_dropped_run_id_index(agent_db, otlp, tmp_path):
    agent_db.execute("ALTER TABLE tool_invocation DROP INDEX idx_tool_invocation_run_id")
    done = check(agent_db, tmp_path, otlp.endpoint("grpc"))
    assert done.returncode == 0
    assert "index tool_invocation.idx_tool_invocation_run_id: missing" in done.stdout
    assert "scans the whole tool_invocation table" in done.stdout


def test_check_reports_an_unreachable_endpoint(agent_db, otlp, tmp_path):
    otlp.rotel.stop()
    done = check(agent_db, tmp_path, otlp.endpoint("grpc"))
    assert done.returncode == 1
    assert "✘ otlp endpoint" in done.stdout


# -- CLI manners ------------------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "once", "backfill", "check", "show", "demo", "status", "rewind", "export"])
def test_every_command_explains_itself(command):
    done = run_cli(command, "--help")
    assert done.returncode == 0
    assert "--config" in done.stdout
    assert len(done.stdout.splitlines()) > 6


def test_bad_option_is_one_clear_line():
    done = run_cli("once", "--no-such-option")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "run-otel: error: No such option '--no-such-option'. (see 'run-otel once --help')"
    ]


def test_bad_config_key_is_one_clear_line(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("[poll]\nbatch = 3\n")
    done = run_cli("once", "--config", str(config))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "run-otel: error: config: unknown config key poll.batch (known in [poll]: interval_seconds, batch_size, "
        "settle_seconds, run_timeout_seconds, gap_timeout_seconds, late_window_seconds, orphan_wait_seconds, start_from, "
        "tool_chunk_size, retry_initial_seconds, retry_max_seconds, stuck_after_seconds, shutdown_timeout_seconds, "
        "backfill_retry_seconds)"
    ]


def _driver_config(tmp_path, scheme: str) -> str:
    return str(
        write_config(
            tmp_path / "driver.toml",
            {
                "source": {"url": f"{scheme}://run_otel:pw-driver-secret@127.0.0.1:1/agent"},
                "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
                "export": {"endpoint": "127.0.0.1:1"},
            },
        )
    )


@pytest.mark.parametrize("command", [["once"], ["backfill", "--since", "1d"]])
def test_a_misspelt_driver_is_one_clear_config_line(tmp_path, command):
    done = run_cli(*command, "--config", _driver_config(tmp_path, "mysql+mysqlconector"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "run-otel: error: config: mysql+mysqlconector://run_otel:***@127.0.0.1:1/agent: SQLAlchemy knows no "
        "'mysql+mysqlconector'; for MySQL and MariaDB use mysql+pymysql, mysql+mysqlconnector or mysql+mysqldb"
    ]


def test_a_driver_that_is_not_installed_is_named_with_how_to_install_it(tmp_path):
    import importlib.util

    assert importlib.util.find_spec("MySQLdb") is None  # the precondition: mysqlclient is not installed here
    done = run_cli("once", "--config", _driver_config(tmp_path, "mysql+mysqldb"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "run-otel: error: config: mysql+mysqldb://run_otel:***@127.0.0.1:1/agent: the driver is not installed "
        "(no module 'MySQLdb'): apt-get install libmariadb-dev pkg-config, then pip install 'run-otel[mysqlclient]'"
    ]


def test_check_reports_a_misspelt_driver_as_a_finding(tmp_path):
    done = run_cli("check", "--config", _driver_config(tmp_path, "mysql+mysqlconector"))
    assert done.returncode == 1, done.stderr
    assert "✘ source.url: mysql+mysqlconector://run_otel:***@127.0.0.1:1/agent: SQLAlchemy knows no" in done.stdout
    assert "Traceback" not in done.stderr and "pw-driver-secret" not in done.stdout + done.stderr


@pytest.mark.parametrize("command", [["once"], ["run"], ["check"], ["status"], ["show", "run-x"], ["backfill", "--since", "1d"]])
def test_without_a_config_nothing_runs_against_the_demo_defaults(tmp_path, command):
    done = subprocess.run(
        [sys.executable, "-m", "run_otel", *command],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("RUN_OTEL_")}},
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "no config: pass --config FILE" in done.stderr
    assert list(tmp_path.iterdir()) == []  # no demo database or state store created


def test_the_example_config_is_printed_and_parses_to_the_defaults(tmp_path):
    import tomllib

    from run_otel.config import Config, build_config

    done = run_cli("config", "--example")
    assert done.returncode == 0
    assert build_config(tomllib.loads(done.stdout)) == Config()
