"""retrieval_details summarized by MariaDB's JSON functions gives the same spans, and the same
warnings, as Python parsing the column; and the evidence text is no longer read."""

from __future__ import annotations

import json
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from run_otel.config import build_config
from run_otel.export.wire import WireSpans
from run_otel.factory import build_mapper, build_source
from run_otel.source.clock import SourceClock
from run_otel.source.evidence import Evidence

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=8))
REF = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "raw_path": st.one_of(st.sampled_from(["$.docs[0]", "$.no_evidence", "$.logs[1]"]), st.text(max_size=6), SCALARS),
            "text": st.text(max_size=40),
        },
    ),
    SCALARS,
    st.lists(SCALARS, max_size=2),
)
DETAILS = st.fixed_dictionaries(
    {},
    optional={
        "evidence_status": st.one_of(st.sampled_from(["supported", "partial", "no_evidence"]), SCALARS),
        "evidence_refs": st.one_of(st.lists(REF, max_size=4), REF, st.none()),
        "other": st.text(max_size=10),
    },
)
# What a column can hold: usual objects, other JSON, text that is not JSON, and NULL.
COLUMN = st.one_of(
    DETAILS.map(lambda d: json.dumps(d, ensure_ascii=False)),
    st.lists(SCALARS, max_size=3).map(json.dumps),
    SCALARS.map(json.dumps),
    st.text(max_size=20),
    st.sampled_from(['{"evidence_refs": [', "NaN", "{'a': 1}", " ", '{"evidence_refs": [{"raw_path": "\\u00e9"}]}']),
    st.none(),
)


def insert_tools(agent_db, details: list[str | None]) -> str:
    run_id = f"run-{uuid.uuid4()}"
    conn = agent_db.server.root(agent_db.name)
    with conn.cursor() as cur:
        cur.execute("SET SESSION check_constraint_checks = 0")  # legacy rows may hold anything
        cur.executemany(
            "INSERT INTO tool_invocation (run_id, session_id, tool_name, "
            "input_params, retrieval_layer, retrieval_details, created_at) "
            "VALUES (%s, 's', 'lookup_knowledge', '{}', 'L0', %s, UTC_TIMESTAMP())",
            [(run_id, d) for d in details],
        )
    conn.commit()
    conn.close()
    return run_id


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
# One object first: a list of the other shapes alone (Hypothesis likes ['null', '[]', ...]) leaves the
# database nothing to summarize, and the test's precondition false.
@given(
    details=st.tuples(DETAILS.map(lambda d: json.dumps(d, ensure_ascii=False)), st.lists(COLUMN, min_size=40, max_size=60)).map(
        lambda first_and_rest: [first_and_rest[0], *first_and_rest[1]]
    )
)
def test_the_database_summary_maps_to_the_same_spans_and_warnings_as_parsing(agent_db, details):
    run_id = insert_tools(agent_db, details)
    off = build_config({"source": {"url": agent_db.url, "evidence_in_database": True}})
    summarized = build_source(off).tools_for([run_id])[run_id]
    assert len(summarized) == len(details)
    # The precondition: the database really summarized rows (the usual ones), and only objects.
    by_database = [text for tool, text in zip(summarized, details) if isinstance(tool.retrieval_details, Evidence)]
    assert by_database and all(_is_object(text) for text in by_database)
    parsed = [tool._replace(retrieval_details=text) for tool, text in zip(summarized, details)]
    for conventions in (["gen_ai"], ["gen_ai", "openinference"]):
        config = build_config({"source": {"url": agent_db.url}, "trace": {"conventions": conventions}})
        mapper = build_mapper(config, SourceClock(config.source.timezone))
        wire = WireSpans(mapper.limits)
        run = _run(run_id)
        from_database, from_python = mapper.map_run(run, summarized), mapper.map_run(run, parsed)
        assert from_database.warnings == from_python.warnings
        assert [wire.replay(s) for s in from_database.spans] == [wire.replay(s) for s in from_python.spans]


def _is_object(text: str | None) -> bool:
    if text is None:
        return False
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _run(run_id: str):
    from datetime import datetime

    from run_otel.source.rows import RunRow

    now = datetime(2026, 12, 3, 12, 0)
    fields = {f: None for f in RunRow._fields}
    return RunRow(**{**fields, "id": 1, "run_id": run_id, "status": "SUCCESS", "created_at": now, "updated_at": now})


def test_with_capture_off_the_evidence_text_never_leaves_the_database(agent_db):
    text = json.dumps(
        {"evidence_status": "supported", "evidence_refs": [{"raw_path": "$.docs[0]", "text": "MARK-EVIDENCE " * 80}]}
    )
    run_id = insert_tools(agent_db, [text])
    read = {
        in_database: build_source(build_config({"source": {"url": agent_db.url, "evidence_in_database": in_database}})).tools_for(
            [run_id]
        )[run_id]
        for in_database in (True, False)
    }
    assert "MARK-EVIDENCE" in repr(read[False])  # the precondition: reading the column brings the text
    assert "MARK-EVIDENCE" not in repr(read[True])
    assert read[True][0].retrieval_details == Evidence("supported", 1, ("$.docs[0]",))
    # With capture on, the text is wanted (rag.evidence.refs), so the column is read.
    on = build_config({"source": {"url": agent_db.url, "evidence_in_database": True}, "content": {"capture": True}})
    assert "MARK-EVIDENCE" in repr(build_source(on).tools_for([run_id])[run_id])
