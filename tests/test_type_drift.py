"""Columns whose type drifted from the documented schema, on MariaDB: values are read
by meaning, a value that means nothing is a counted row warning, nothing raises after
the checkpoint is saved, and `check` names each drifted column."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from helpers import add_run, add_tool, bridge_config, bridge_sections, new_run_id, run_cli, write_config
from prometheus_client import generate_latest

from run_otel.factory import build_metrics, build_parts, build_poller, build_store
from run_otel.ops.check import WARN, run_checks
from run_otel.pipeline.recorder import Recorder
from run_otel.source.readings import Unreadable, as_count, as_flag

FAILED = ("false", "FALSE", "no", "0", "n")
SUCCEEDED = ("true", "Yes", "1")


def drift(agent_db) -> None:
    agent_db.execute("ALTER TABLE tool_invocation MODIFY success VARCHAR(8) NULL, MODIFY l0_match_count VARCHAR(16) NULL")
    agent_db.execute("ALTER TABLE diagnosis_run MODIFY total_token_count VARCHAR(16) NULL")


def test_drifted_columns_are_read_by_meaning_and_bad_values_are_row_warnings(agent_db, receiver, tmp_path):
    drift(agent_db)
    conn = agent_db.server.root(agent_db.name)
    flags_run, counts_run = new_run_id(), new_run_id()
    add_run(conn, flags_run)
    for value in (*FAILED, *SUCCEEDED, "maybe"):
        add_tool(conn, flags_run, tool_name=f"tool_{value}", success=value)
    add_run(conn, counts_run, total_token_count="n/a")
    add_tool(conn, counts_run, tool_name="counted", success="1", l0_match_count="three")
    add_tool(conn, counts_run, tool_name="counted_ok", success="1", l0_match_count=" 7 ")
    conn.close()
    config = bridge_config(agent_db, tmp_path, receiver.endpoint)
    metrics = build_metrics(config)
    poller = build_poller(build_parts(config, recorder=metrics))

    result = poller.poll()

    assert result.run_count == 2
    assert build_store(config).load().high_water >= 2
    # The failures are failures: ERROR status and error.type, whatever the column's type.
    status = {}
    for _r, _s, span in receiver.spans():
        attrs = {kv.key: kv.value for kv in span.attributes}
        if "gen_ai.tool.name" in attrs:
            status[attrs["gen_ai.tool.name"].string_value] = (span.status.code, attrs)
    assert {name for name, (code, _a) in status.items() if code == 2} == {f"tool_{v}" for v in FAILED}
    assert status["tool_maybe"][0] == 0  # neither: UNSET, and a warning
    assert "rag.l0.match_count" not in str(status["counted"][1])
    assert 7 in [v.int_value for v in status["counted_ok"][1].values()]
    # Three values that mean nothing, each a counted warning; metrics were recorded, per meaning.
    assert result.warnings == 3
    text = generate_latest(metrics.registry).decode()
    invocations = Counter()
    for line in text.splitlines():
        if line.startswith("diagnosis_tool_invocations_total{") and 'success="' in line:
            invocations[line.split('success="')[1].split('"')[0]] += int(float(line.rsplit(" ", 1)[1]))
    assert invocations == {"false": len(FAILED), "true": len(SUCCEEDED) + 2, "none": 1}
    assert re.search(r"^run_otel_row_warnings_total\{[^}]*\} 3\.0$", text, re.MULTILINE), text


def test_check_names_each_column_whose_type_drifted(agent_db, receiver, tmp_path):
    config = bridge_config(agent_db, tmp_path, receiver.endpoint)
    before = [f for f in run_checks(config) if f.what.startswith("column")]
    assert [f.what for f in before] == ["column types"] and before[0].level != WARN
    drift(agent_db)
    warned = {f.what: f.detail for f in run_checks(config) if f.level == WARN and f.what.startswith("column ")}
    assert set(warned) == {
        "column tool_invocation.success",
        "column tool_invocation.l0_match_count",
        "column diagnosis_run.total_token_count",
    }
    assert warned["column tool_invocation.success"].startswith("is VARCHAR, the documented schema has TINYINT")
    assert warned["column diagnosis_run.total_token_count"].startswith("is VARCHAR, the documented schema has INT")


@pytest.mark.parametrize("value", [0, 1, True, False, b"\x00", b"\x01", "0", "1", "true", "False", " YES ", "no", "on", "off"])
def test_a_flag_is_read_from_any_type(value):
    assert as_flag(value) is (str(value).strip().lower() in ("1", "true", "yes", "on", "b'\\x01'"))


@pytest.mark.parametrize("value", ["maybe", "", 2, "-1", 0.5])
def test_a_flag_that_means_nothing_is_unreadable(value):
    with pytest.raises(Unreadable):
        as_flag(value)


def test_counts_are_read_from_numbers_and_numeric_text():
    assert [as_count(v) for v in (None, 3, 3.0, "12", b"4", " 5 ")] == [None, 3, 3, 12, 4, 5]
    for bad in ("three", "1.5", 2.5, ""):
        with pytest.raises(Unreadable):
            as_count(bad)


class FailingRecorder(Recorder):
    def runs_exported(self, result, acked_at: float) -> None:
        raise TypeError("'>' not supported between instances of 'str' and 'int'")


def test_a_metrics_failure_after_the_checkpoint_fails_no_poll(agent_db, receiver, tmp_path, caplog):
    conn = agent_db.server.root(agent_db.name)
    add_run(conn, new_run_id())
    conn.close()
    config = bridge_config(agent_db, tmp_path, receiver.endpoint)
    result = build_poller(build_parts(config, recorder=FailingRecorder())).poll()
    assert result.run_count == 1 and build_store(config).load().high_water >= 1
    assert "metrics: recording the exported runs failed" in caplog.text


def test_binary_columns_are_read_as_text_and_the_runs_behind_them_go_on(agent_db, receiver, tmp_path):
    agent_db.execute("ALTER TABLE tool_invocation MODIFY error_message LONGBLOB NULL, MODIFY tool_name VARBINARY(128) NULL")
    agent_db.execute("ALTER TABLE diagnosis_run MODIFY intent VARBINARY(32) NULL")
    conn = agent_db.server.root(agent_db.name)
    binary = new_run_id()
    add_run(conn, binary, intent="DIAGNOSIS")
    add_tool(conn, binary, tool_name="lookup_knowledge", success=0)
    behind = [new_run_id() for _ in range(20)]
    for run_id in behind:
        add_run(conn, run_id)
        add_tool(conn, run_id, tool_name="search_docs", success=1)
    with conn.cursor() as cur:  # "timeout" and a byte that is no UTF-8
        cur.execute("UPDATE tool_invocation SET error_message = X'74696d656f7574ff' WHERE run_id = %s", (binary,))
    conn.commit()
    (kind,) = agent_db.execute(
        "SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
        "AND TABLE_NAME = 'tool_invocation' AND COLUMN_NAME = 'tool_name'"
    )[0]
    assert kind == "varbinary"  # the precondition: the driver hands these columns over as bytes
    config = bridge_config(agent_db, tmp_path, receiver.endpoint)
    parts = build_parts(config)
    result = build_poller(parts).poll()
    parts.close()

    assert result.run_count == 21 and result.dropped_spans == 0
    tools = {}
    for _r, _s, span in receiver.spans():
        attrs = {kv.key: kv.value.string_value for kv in span.attributes}
        if attrs.get("diagnosis.run.id") == binary:
            tools[span.name] = (span.status, attrs)
    status, attrs = tools["execute_tool lookup_knowledge"]
    assert attrs["gen_ai.tool.name"] == "lookup_knowledge"
    assert status.code == 2 and status.message == "timeout\ufffd"
    assert tools["invoke_agent diagnosis-agent"][1]["diagnosis.run.intent"] == "DIAGNOSIS"
    show = run_cli(
        "show", binary, "--config", str(write_config(tmp_path / "c.toml", bridge_sections(agent_db, tmp_path, receiver.endpoint)))
    )
    assert show.returncode == 0 and "Traceback" not in show.stderr, show.stderr
    assert "lookup_knowledge" in show.stdout
