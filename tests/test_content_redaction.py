"""Captured content is redacted as well as error_message: the whole redaction corpus,
written as text and as JSON values (also JSON held inside a JSON string, as tool
arguments often are), through every content path, on MariaDB and a real receiver."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

from helpers import bridge_config, utc_now_naive
from secret_corpus import SECRETS
from servers import Receiver
from sqlalchemy import insert

from run_otel.factory import build_parts, build_poller
from run_otel.source.schema import diagnosis_run, tool_invocation

# Credentials as JSON values, the way tool arguments and results carry them.
JSON_SECRETS: list[tuple[str, str]] = [
    ('{"api_key": "sk-live-opaque-value-0001"}', "sk-live-opaque-value-0001"),
    ('{"password": "opaque pw 0002"}', "opaque pw 0002"),
    ('{"db": {"user": "app", "password": "opaque-0003"}}', "opaque-0003"),
    ('{"credentials": {"user": "a", "pass": "opaque-0004"}}', "opaque-0004"),
    ('{"headers": {"X-Api-Key": "opaque-0005"}}', "opaque-0005"),
    ('{"client_secret": 90000006}', "90000006"),
    ('{"passphrase": "opaque horse 0007"}', "opaque horse 0007"),
    (json.dumps({"args": json.dumps({"password": "opaque-0008", "host": "db"})}), "opaque-0008"),
    (json.dumps({"args": json.dumps({"api_key": "opaque-0009"})}), "opaque-0009"),
]
CORPUS = SECRETS + JSON_SECRETS


def seed(agent_db) -> None:
    """One run per corpus entry; the entry sits in every content column and in error_message."""
    old = utc_now_naive() - timedelta(hours=1)
    runs, tools = [], []
    for text, _secret in CORPUS:
        run_id = f"run-{uuid.uuid4()}"
        runs.append(
            dict(
                run_id=run_id,
                session_id="s",
                query=text,
                answer=text,
                published_result=json.dumps({"r": text}),
                status="SUCCESS",
                intent="DIAGNOSIS",
                created_at=old,
                updated_at=old,
            )
        )
        details = {"evidence_status": "supported", "evidence_refs": [{"raw_path": "$.x", "text": text}]}
        for success in (True, False):
            tools.append(
                dict(
                    session_id="s",
                    run_id=run_id,
                    tool_name="search_kb",
                    input_params=json.dumps({"query": text}),
                    output_preview=text,
                    retrieval_details=json.dumps(details),
                    retrieval_layer="L0",
                    success=success,
                    error_message=None if success else text,
                    created_at=old,
                )
            )
    with agent_db.engine().begin() as conn:
        conn.execute(insert(diagnosis_run), runs)
        conn.execute(insert(tool_invocation), tools)


def test_every_content_path_is_redacted_with_the_error_message_corpus(agent_db, tmp_path):
    seed(agent_db)
    receiver = Receiver()
    receiver.start()
    try:
        config = bridge_config(
            agent_db,
            tmp_path,
            receiver.endpoint,
            content={"capture": True, "max_length": 8192},
            trace={"conventions": ["gen_ai", "openinference"]},
        )
        build_poller(build_parts(config)).poll()
        spans = receiver.spans()
    finally:
        receiver.stop()
    values: dict[str, list[str]] = {}
    for _r, _s, span in spans:
        values.setdefault("status", []).append(span.status.message)
        for kv in span.attributes:
            if kv.value.string_value:
                values.setdefault(kv.key, []).append(kv.value.string_value)
    # Every content path was exported, document content included.
    for key in (
        "diagnosis.run.query",
        "diagnosis.run.answer",
        "diagnosis.run.published_result",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
        "input.value",
        "output.value",
        "status",
    ):
        assert any(k == key or k.endswith(key) for k in values), (key, sorted(values))
    assert any(k.endswith("document.content") for k in values), sorted(values)
    leaks = [(key, secret) for key, texts in values.items() for text in texts for _t, secret in CORPUS if secret in text]
    assert not leaks, leaks

    # A failed call's output_preview is not its result: only a successful call carries one.
    calls = [span for _r, _s, span in spans if any(kv.key == "gen_ai.tool.call.id" for kv in span.attributes)]
    failed = [span for span in calls if span.status.code == 2]
    assert len(failed) == len(calls) - len(failed) == len(CORPUS)  # the precondition: both kinds, each with a preview
    for span in calls:
        keys = {kv.key for kv in span.attributes}
        carries = {"gen_ai.tool.call.result", "output.value"} & keys
        assert carries == (set() if span in failed else {"gen_ai.tool.call.result", "output.value"}), (span.name, keys)
