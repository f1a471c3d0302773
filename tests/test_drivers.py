"""mysql-connector-python's C extension beside PyMySQL on real MariaDB: the same rows give
byte-identical spans and the same warnings, with and without content capture and with the
evidence summarized by the database or parsed here. The bad-row corpus is part of the rows."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from datetime import datetime

import pytest
from helpers import seed_corpus, start_logging
from servers import with_driver
from sqlalchemy import create_engine, event

from run_otel.config import build_config
from run_otel.export.wire import WireSpans
from run_otel.factory import build_mapper, build_source
from run_otel.ops.demo import generate, insert_workload
from run_otel.source.reader import ConnectionLost, Source
from run_otel.source.readings import read_run, read_tool


def _seed_usual_runs(agent_db, runs: int = 40) -> None:
    conn = agent_db.server.root(agent_db.name)
    with conn.cursor() as cur:
        cur.execute(
            f"""INSERT INTO diagnosis_run (run_id, session_id, query, answer, status, intent, release_outcome, agent_flow,
                    total_duration_ms, total_token_count, step_count, tool_call_count, feedback, created_at, updated_at)
                SELECT CONCAT('run-', LPAD(HEX(seq), 8, '0'), '-0000-4000-8000-', LPAD(HEX(seq), 12, '0')), CONCAT('s', seq % 3),
                       'why is the disk full 🔥', 'rotate logs', ELT(1 + seq % 4, 'FAILED', 'FALLBACK', 'SUCCESS', 'CANCELLED'),
                       'DIAGNOSIS', 'SUCCESS', 'CHAT_HARNESS', 9000, 4200, 5, 4, IF(seq % 5 = 0, 'UP', NULL),
                       UTC_TIMESTAMP() - INTERVAL 1 HOUR, UTC_TIMESTAMP() - INTERVAL 59 MINUTE
                FROM seq_1_to_{runs}"""
        )
        cur.execute(
            """INSERT INTO tool_invocation (session_id, run_id, step_id, tool_name, input_params, output_preview, output_length,
                    retrieval_layer, l0_match_count, l1_match_count, is_truncated, relevance_level, retrieval_details,
                    duration_ms, success, error_message, created_at)
                SELECT r.session_id, r.run_id, t.seq,
                       ELT(t.seq, 'lookup_knowledge', 'query_logs', 'query_metrics', 'search_runbook'),
                       '{"q": "磁盘"}', 'preview password=hunter2', 2048, IF(t.seq % 2 = 0, 'L0+L1', NULL), 3, 2, t.seq % 2,
                       'PRECISE', '{"evidence_status":"supported","evidence_refs":[{"raw_path":"$.logs[0]","text":"disk 98%"}]}',
                       180, IF(t.seq = 3, 0, 1), IF(t.seq = 3, 'timeout after 30000 ms', NULL),
                       r.created_at + INTERVAL t.seq SECOND
                FROM diagnosis_run r JOIN seq_1_to_4 t"""
        )
    conn.close()


def _reads_with(engine) -> str:
    """The driver's connection class, and for PyMySQL the class its results are read with."""
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("SELECT 1")
        cursor.fetchall()
        result = getattr(raw.driver_connection, "_result", None)
        return type(raw.driver_connection).__name__ + (f"/{type(result).__name__}" if result is not None else "")
    finally:
        raw.close()


def _spans_and_warnings(url: str, **source) -> tuple[list[bytes], list[str], str]:
    config = build_config({"source": {"url": url, **source.pop("source", {})}, **source})
    reader = build_source(config)
    mapper = build_mapper(config, reader.clock)
    wire = WireSpans(mapper.limits)
    driver = _reads_with(reader.engine)
    runs = reader.runs_after(0, 10_000)
    tools = reader.tools_for(r.run_id for r in runs)
    spans: list[bytes] = []
    warnings: list[str] = []
    for row in runs:  # read by meaning, then mapped, as the poller does
        run = read_run(row, warnings)
        mapped = mapper.map_run(run, [read_tool(tool, warnings) for tool in tools[run.run_id]])
        spans += [wire.replay(s) for s in mapped.spans]
        warnings += mapped.warnings
    reader.close()
    return spans, warnings, driver


@pytest.mark.parametrize("capture", [False, True], ids=["capture off", "capture on"])
@pytest.mark.parametrize("in_database", [True, False], ids=["evidence in the database", "evidence parsed here"])
def test_the_c_driver_maps_every_row_to_the_same_bytes_as_pymysql(agent_db, capture, in_database):
    _seed_usual_runs(agent_db)
    seed_corpus(agent_db)
    settings = {
        "source": {"evidence_in_database": in_database},
        "content": {"capture": capture},
        "trace": {"conventions": ["gen_ai", "openinference"]},
    }
    reference, reference_warnings, reference_driver = _spans_and_warnings(agent_db.url, **settings)
    spans, warnings, driver = _spans_and_warnings(with_driver(agent_db.url, "mysqlconnector"), **settings)
    # The preconditions: the C extension really read the rows, not the pure-Python fallback, its
    # rows kept as it made them (mysqlconnector_connection.py), and PyMySQL's rows were read by
    # run-otel's reader (pymysql_rows.py), not PyMySQL's own.
    assert driver == "SourceCMySQLConnection"
    assert reference_driver == "SourceConnection/CompiledRows"
    assert len(reference) > 1000 and reference_warnings
    assert warnings == reference_warnings
    assert spans == reference


@pytest.mark.slow
def test_a_c_driver_that_did_not_load_is_named_in_a_warning():
    # Phoenix's pytest plugin uses up glibc's static TLS space, so the C extension then
    # fails to load: a real case of the quiet fall-back to pure Python.
    program = (
        "import logging, phoenix.client.pytest.plugin, mysql.connector\n"
        "assert not mysql.connector.HAVE_CEXT\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from sqlalchemy.engine import make_url\n"
        "from run_otel.source.engine import make_engine\n"
        "make_engine(make_url('mysql+mysqlconnector://u:p@127.0.0.1:1/d'))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "C extension did not load, so it runs in pure Python" in done.stderr
    # The control: in a plain process it loads, and nothing is said.
    done = subprocess.run(
        [sys.executable, "-c", program.replace("phoenix.client.pytest.plugin, ", "").replace("assert not", "assert")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "C extension" not in done.stderr, done.stderr


@pytest.mark.parametrize("driver", ["pymysql", "mysqlconnector"])
def test_a_connection_killed_after_its_read_is_a_lost_connection_with_every_driver(agent_db, driver, restore_logging):
    """The server going away between a read and the connection's release: mysql-connector's
    C extension then raises from rollback() an error SQLAlchemy does not wrap, which once
    ended a backfill with a traceback instead of the retry a lost connection gets."""
    _seed_usual_runs(agent_db, runs=5)
    config = build_config({"source": {"url": with_driver(agent_db.url, driver)}, "log": {"format": "text"}})
    stream = io.StringIO()
    start_logging(config, stream)
    reader = build_source(config)

    @event.listens_for(reader.engine, "connect")
    def remember_id(dbapi_connection, record):
        cursor = dbapi_connection.cursor()
        cursor.execute("SELECT CONNECTION_ID()")
        record.info["server_id"] = cursor.fetchone()[0]
        cursor.close()

    @event.listens_for(reader.engine, "after_cursor_execute")
    def kill_it(conn, cursor, statement, parameters, context, executemany):
        if conn.info.pop("kill", False):
            agent_db.execute(f"KILL CONNECTION {conn.info['server_id']}")
            time.sleep(0.2)

    assert len(reader.runs_after(0, 100)) == 5  # the precondition: the read works until the kill
    reader.engine.pool.dispose()
    with reader.engine.connect() as conn:
        conn.info["kill"] = True
    with pytest.raises(ConnectionLost, match="lost the connection"):
        reader.runs_after(0, 100)
    # The next read takes a fresh connection.
    assert len(reader.runs_after(0, 100)) == 5
    reader.close()
    # The pool's own complaint, if it has one, is a line and not a traceback.
    assert "Traceback" not in stream.getvalue(), stream.getvalue()


def _types(rows) -> list[tuple[type, ...]]:
    return [tuple(type(value) for value in row) for row in rows]


@pytest.mark.parametrize("driver", ["pymysql", "mysqlconnector"])
@pytest.mark.parametrize("capture", [False, True], ids=["capture off", "capture on"])
def test_the_bulk_read_takes_the_drivers_tuples_and_gets_what_sqlalchemys_rows_hold(agent_db, driver, capture):
    """The runs and tool rows read from the driver's cursor are the values and the types
    SQLAlchemy's Row would have handed over: the bad-row corpus (zero dates, text in number
    columns, booleans stored as text) included."""
    _seed_usual_runs(agent_db)
    seed_corpus(agent_db)
    config = build_config({"source": {"url": with_driver(agent_db.url, driver)}, "content": {"capture": capture}})
    raw, rows = build_source(config), build_source(config)
    rows.reads_raw = False
    assert raw.reads_raw  # the precondition: on MariaDB no selected column needs converting

    def read(source: Source) -> tuple[list, dict]:
        runs = source.runs_after(0, 10_000) + source.runs_by_ids([3, 1, 2])
        return runs, source.tools_for(r.run_id for r in runs)

    (raw_runs, raw_tools), (row_runs, row_tools) = read(raw), read(rows)
    raw.close()
    rows.close()
    assert len(raw_runs) > 40 and sum(map(len, raw_tools.values())) > 160
    assert raw_runs == row_runs and raw_tools == row_tools
    assert _types(raw_runs) == _types(row_runs)
    assert _types(t for ts in raw_tools.values() for t in ts) == _types(t for ts in row_tools.values() for t in ts)


def test_sqlite_is_read_through_sqlalchemys_rows_because_its_datetimes_are_text(tmp_path):
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    insert_workload(create_engine(url), generate(3, 5, anchor=datetime(2026, 1, 1)), create=True)
    source = build_source(build_config({"source": {"url": url}}))
    runs = source.runs_after(0, 10)
    tools = [t for ts in source.tools_for(r.run_id for r in runs).values() for t in ts]
    source.close()
    assert runs and tools
    assert all(isinstance(row.created_at, datetime) for row in [*runs, *tools])
    assert not source.reads_raw


def test_a_result_the_server_breaks_off_fails_as_the_c_extension_says(agent_db):
    # A statement stopped by max_statement_time while its rows stream (an unbuffered cursor) fails in
    # the middle of the rows, where the source's connection reads them itself: the same error as the C
    # extension's own connection, and the connection usable after it.
    from mysql.connector.connection_cext import CMySQLConnection

    from run_otel.source.mysqlconnector_connection import SourceCMySQLConnection

    server = agent_db.server
    outcomes = []
    for kind in (CMySQLConnection, SourceCMySQLConnection):
        connection = kind(host="127.0.0.1", port=server.port, user="root", password=server.ROOT_PASSWORD, database=agent_db.name)
        cursor = connection.cursor(buffered=False)
        cursor.execute("SET SESSION max_statement_time = 0.2")
        cursor.execute("SELECT seq, SLEEP(0.01) FROM seq_1_to_1000")
        with pytest.raises(Exception) as failed:
            cursor.fetchall()
        cursor.close()
        after = connection.cursor()
        after.execute("SELECT 42")
        outcomes.append((type(failed.value), failed.value.errno, failed.value.msg, after.fetchall()))
        connection.close()
    assert outcomes[0][1] == 1969, outcomes[0]  # the precondition: ER_STATEMENT_TIMEOUT, raised by a fetch
    assert outcomes[1] == outcomes[0]


def test_the_c_extensions_rows_are_kept_unless_the_result_needs_its_connection(agent_db, monkeypatch):
    # The source's connection keeps the extension's rows for a plain result, and leaves a result
    # with a VECTOR column (mysql-connector converts it in Python) to the extension's get_rows.
    from mysql.connector.connection_cext import CMySQLConnection
    from mysql.connector.constants import FieldType

    from run_otel.source.mysqlconnector_connection import SourceCMySQLConnection

    parents: list[str] = []
    parent_get_rows = CMySQLConnection.get_rows
    monkeypatch.setattr(
        CMySQLConnection, "get_rows", lambda self, *a, **k: parents.append(type(self).__name__) or parent_get_rows(self, *a, **k)
    )
    server = agent_db.server

    def read(kind, vector: bool):
        connection = kind(host="127.0.0.1", port=server.port, user="root", password=server.ROOT_PASSWORD, database=agent_db.name)
        cursor = connection.cursor(buffered=False)
        cursor.execute("SELECT 7, 'seven', X'0000803F'")  # the last: the float 1.0 as a VECTOR holds it
        if vector:
            name, _type, *rest = connection._columns[2]
            connection._columns[2] = (name, FieldType.VECTOR, *rest)
        rows = cursor.fetchall()
        connection.close()
        return rows

    assert read(SourceCMySQLConnection, vector=False) == [(7, "seven", b"\x00\x00\x80?")]
    assert parents == []  # the precondition: a plain result is not read by the extension's get_rows
    vector = read(SourceCMySQLConnection, vector=True)
    assert vector == read(CMySQLConnection, vector=True) and str(vector[0][2]) == "array('f', [1.0])"


def test_a_url_that_asks_mysql_connector_for_its_pure_python_connection_gets_it(agent_db):
    url = with_driver(agent_db.url, "mysqlconnector")
    assert "?" not in url
    reader = build_source(build_config({"source": {"url": url + "?use_pure=true"}}))
    try:
        assert _reads_with(reader.engine) == "MySQLConnection"
    finally:
        reader.close()
