"""End to end on the real stack: MariaDB -> run-otel -> the OpenTelemetry Collector running the
repository's config/otel-collector.yaml -> Jaeger v2 with memory storage, read back through
Jaeger's HTTP query API. The collector's second exporter (Tempo's in the shipped config) points
at the test's Receiver, which shows what really went over the wire."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

from helpers import (
    add_finished_runs,
    add_run,
    add_tool,
    assert_trace_matches,
    bridge_sections,
    expected_traces,
    jaeger_trace,
    new_run_id,
    run_cli,
    seed,
    utc_now_naive,
    warnings_of,
    write_config,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from servers import Receiver, wait_for

from run_otel.mapping.span_data import trace_id_for

SERVICE = "diagnosis-agent"


def config_path(agent_db, tmp_path, collector) -> str:
    sections = bridge_sections(agent_db, tmp_path, f"http://127.0.0.1:{collector.grpc_port}")
    return str(write_config(tmp_path / "run-otel.toml", sections))


# -- Jaeger's JSON, read back into OTLP spans so the mapping assertions apply as they are --------


def _otlp_value(tag: dict) -> common_pb2.AnyValue:
    kind, value = tag["type"], tag["value"]
    if kind == "int64":
        return common_pb2.AnyValue(int_value=int(value))
    if kind == "float64":
        return common_pb2.AnyValue(double_value=float(value))
    if kind == "bool":
        return common_pb2.AnyValue(bool_value=bool(value))
    return common_pb2.AnyValue(string_value=str(value))


def otlp_span(span: dict) -> trace_pb2.Span:
    tags = {tag["key"]: tag for tag in span["tags"]}
    parents = [ref["spanID"] for ref in span.get("references") or [] if ref["refType"] == "CHILD_OF"]
    start_ns = span["startTime"] * 1000
    return trace_pb2.Span(
        trace_id=bytes.fromhex(span["traceID"]),
        span_id=bytes.fromhex(span["spanID"]),
        parent_span_id=bytes.fromhex(parents[0]) if parents else b"",
        name=span["operationName"],
        start_time_unix_nano=start_ns,
        end_time_unix_nano=start_ns + span["duration"] * 1000,
        attributes=[common_pb2.KeyValue(key=key, value=_otlp_value(tag)) for key, tag in tags.items()],
        status=trace_pb2.Status(code={"ERROR": 2, "OK": 1}.get(tags.get("otel.status_code", {}).get("value"), 0)),
    )


def span_ids(trace: dict) -> Counter:
    return Counter(span["spanID"] for span in trace["spans"])


def received_copies(tempo: Receiver, trace_id: str) -> Counter:
    return Counter(span.span_id.hex() for _r, _s, span in tempo.spans() if span.trace_id.hex() == trace_id)


def wait_for_copies(tempo: Receiver, trace_id: str, spans: int, copies: int) -> None:
    wait_for(
        lambda: sorted(received_copies(tempo, trace_id).values()) == [copies] * spans,
        30,
        f"{copies} copies of each span of {trace_id} to be sent",
    )


def us(moment: datetime) -> int:
    return int(moment.replace(tzinfo=UTC).timestamp() * 1_000_000)


# -- the tests ------------------------------------------------------------------------------------


def test_each_run_opens_in_jaeger_by_the_uuid_of_its_run_id_as_mapped(stack, agent_db, tmp_path):
    jaeger, collector, _tempo = stack
    seed(agent_db, 25, seed_value=21, waiting=0)
    expected = expected_traces(agent_db)
    done = run_cli("once", "--config", config_path(agent_db, tmp_path, collector))
    assert done.returncode == 0, done.stderr
    failed_tools, outcomes = 0, Counter()
    for run, tools in expected.values():
        # What an SRE pastes: the UUID of run-<uuid>, as Jaeger's trace-id lookup takes it.
        run_uuid = uuid.UUID(run["run_id"].removeprefix("run-"))
        # A rated run's trace also holds its rating's span, sent by the feedback pass after the run.
        spans = 1 + len(tools) + (run["feedback"] is not None)
        trace = jaeger_trace(jaeger, run_uuid.hex, spans)
        assert trace["traceID"] == run_uuid.hex
        assert [p["serviceName"] for p in trace["processes"].values()] == [SERVICE]
        assert sorted(span_ids(trace).values()) == [1] * spans
        assert_trace_matches(run, tools, [otlp_span(span) for span in trace["spans"]])
        assert warnings_of(trace) == [], warnings_of(trace)
        failed_tools += sum(1 for tool in tools if tool["success"] == 0)
        # What the trace list counts as errors (the `error` tag), and what the Logs section shows.
        for span in trace["spans"]:
            tags = {t["key"]: t["value"] for t in span["tags"]}
            logs = [{f["key"]: f["value"] for f in entry["fields"]} for entry in span.get("logs") or []]
            is_root = not span.get("references")
            failed = tags.get("diagnosis.run.status") == "FAILED" if is_root else tags.get("error.type") == "tool_error"
            assert tags.get("error", False) is (tags.get("otel.status_code") == "ERROR")
            assert logs == (
                [
                    {
                        "event": "exception",
                        "exception.type": tags["error.type"],
                        "exception.message": tags["otel.status_description"],
                    }
                ]
                if failed
                else []
            )
        outcomes[run["status"]] += 1
    assert failed_tools > 0  # error status was really compared, not only OK
    # OK, FALLBACK's error and FAILED's exception were really compared (the seed writes no CANCELLED).
    assert {"SUCCESS", "FALLBACK", "FAILED"} <= set(outcomes), outcomes


def test_a_trace_jaeger_must_adjust_carries_warnings_the_checks_above_would_see(stack):
    # The control for `warnings_of(trace) == []`: a tool span whose root never arrived.
    jaeger, collector, _tempo = stack
    trace_id, orphan = uuid.uuid4().bytes, uuid.uuid4().bytes[:8]
    now = int(datetime.now(UTC).timestamp() * 1e9)
    span = trace_pb2.Span(
        trace_id=trace_id,
        span_id=orphan,
        parent_span_id=b"\x01" * 8,
        name="execute_tool x",
        start_time_unix_nano=now,
        end_time_unix_nano=now + 1_000_000,
    )
    request = trace_service_pb2.ExportTraceServiceRequest(
        resource_spans=[
            trace_pb2.ResourceSpans(
                resource={
                    "attributes": [common_pb2.KeyValue(key="service.name", value=common_pb2.AnyValue(string_value=SERVICE))]
                },
                scope_spans=[trace_pb2.ScopeSpans(spans=[span])],
            )
        ]
    )
    import requests

    reply = requests.post(
        f"http://127.0.0.1:{collector.http_port}/v1/traces",
        data=request.SerializeToString(),
        headers={"Content-Type": "application/x-protobuf"},
        timeout=10,
    )
    assert reply.status_code == 200
    trace = jaeger_trace(jaeger, trace_id.hex(), 1)
    assert warnings_of(trace), trace


def test_a_second_backfill_of_the_same_rows_leaves_one_copy_of_each_span(stack, agent_db, tmp_path):
    jaeger, collector, tempo = stack
    seed(agent_db, 6, seed_value=22, waiting=0)  # a seed of its own: ids of its own
    expected = expected_traces(agent_db)
    config = config_path(agent_db, tmp_path, collector)
    since = (utc_now_naive() - timedelta(days=1)).isoformat()
    for _ in range(2):
        done = run_cli("backfill", "--config", config, "--since", since)
        assert done.returncode == 0, done.stderr
    for trace_id, (run, tools) in expected.items():
        spans = 1 + len(tools) + (run["feedback"] is not None)  # a backfill sends the rating too
        # The precondition: every span really went over the wire twice.
        wait_for_copies(tempo, trace_id, spans, 2)
        trace = jaeger_trace(jaeger, trace_id, spans)
        assert sorted(span_ids(trace).values()) == [1] * spans

    # The same rows with one resource attribute changed are different spans, and Jaeger shows both.
    done = run_cli(
        "backfill", "--config", config, "--since", since, env={"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=replay"}
    )
    assert done.returncode == 0, done.stderr
    for trace_id, (run, tools) in expected.items():
        spans = 1 + len(tools) + (run["feedback"] is not None)
        trace = jaeger_trace(jaeger, trace_id, 2 * spans)
        assert sorted(span_ids(trace).values()) == [2] * spans


def test_a_run_backfilled_a_month_late_is_found_by_a_search_over_its_own_hour(stack, agent_db, tmp_path):
    jaeger, collector, _tempo = stack
    created = (utc_now_naive() - timedelta(days=30)).replace(minute=20, second=0)
    run_uuid = uuid.uuid4()
    agent_db.execute(
        "INSERT INTO diagnosis_run (run_id, session_id, query, status, total_duration_ms, created_at, updated_at) "
        "VALUES (%s, 's', 'q', 'SUCCESS', 4000, %s, %s)",
        f"run-{run_uuid}",
        created,
        created,
    )
    agent_db.execute(
        "INSERT INTO tool_invocation (run_id, session_id, tool_name, input_params, success, duration_ms, created_at) "
        "VALUES (%s, 's', 'kb_search', '{}', 1, 500, %s)",
        f"run-{run_uuid}",
        created + timedelta(seconds=2),
    )
    config = config_path(agent_db, tmp_path, collector)
    done = run_cli(
        "backfill",
        "--config",
        config,
        "--since",
        (created - timedelta(hours=1)).isoformat(),
        "--until",
        (created + timedelta(hours=1)).isoformat(),
    )
    assert done.returncode == 0, done.stderr
    # The closing summary says where to look: the window, the trace ids, and Tempo's limit.
    assert f"first trace {run_uuid.hex}, last trace {run_uuid.hex}" in done.stdout
    assert created.strftime("%Y-%m-%d") in done.stdout
    assert "ingestion_time_range_slack" in done.stdout
    jaeger_trace(jaeger, run_uuid.hex, 2)

    hour = created.replace(minute=0)
    found = jaeger.api("traces", service=SERVICE, start=us(hour), end=us(hour + timedelta(hours=1)), limit=100)["data"]
    assert run_uuid.hex in {trace["traceID"] for trace in found}
    recent = jaeger.api("traces", service=SERVICE, lookback="1h", limit=1000)["data"]
    assert run_uuid.hex not in {trace["traceID"] for trace in recent}


def extent_us(trace: dict) -> int:
    """The trace's duration as Jaeger's UI shows it: first span start to last span end."""
    return max(s["startTime"] + s["duration"] for s in trace["spans"]) - min(s["startTime"] for s in trace["spans"])


def rate_later(agent_db, run_id: str, value: str, minutes: int) -> datetime:
    """Rates the run ``minutes`` after it was created, as a user does long after the daemon sent it."""
    agent_db.execute(
        "UPDATE diagnosis_run SET feedback = %s, updated_at = created_at + INTERVAL %s MINUTE WHERE run_id = %s",
        value,
        minutes,
        run_id,
    )
    (row,) = agent_db.execute("SELECT updated_at FROM diagnosis_run WHERE run_id = %s", run_id)
    return row[0]


def test_a_rating_given_after_export_joins_the_trace_in_jaeger_without_stretching_it(stack, agent_db, tmp_path):
    jaeger, collector, tempo = stack
    seed(agent_db, 4, seed_value=23, waiting=0)
    agent_db.execute("UPDATE diagnosis_run SET feedback = NULL")
    expected = expected_traces(agent_db)
    config = config_path(agent_db, tmp_path, collector)
    assert run_cli("once", "--config", config).returncode == 0
    trace_id, (run, tools) = next(iter(expected.items()))
    before = jaeger_trace(jaeger, trace_id, 1 + len(tools))
    (root,) = [s for s in before["spans"] if not s.get("references")]
    # The precondition: the run's trace is the root's extent, and far shorter than 24 minutes.
    assert extent_us(before) == root["duration"] < 10 * 60 * 1_000_000

    rated_at = rate_later(agent_db, run["run_id"], "DOWN", 24)
    done = run_cli("once", "--config", config)
    assert "1 new or changed sent" in done.stdout, done.stdout
    after = jaeger_trace(jaeger, trace_id, 2 + len(tools))
    (rating,) = [s for s in after["spans"] if s["operationName"] == "evaluation user_feedback"]
    assert rating["references"] == [{"refType": "CHILD_OF", "traceID": trace_id, "spanID": root["spanID"]}]
    tags = {t["key"]: t["value"] for t in rating["tags"]}
    assert (tags["gen_ai.evaluation.score.label"], tags["gen_ai.evaluation.score.value"]) == ("DOWN", 0)
    assert tags["diagnosis.feedback.rated_at"] == rated_at.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    # The trace keeps the run's extent: the rating sits inside the root, not 24 minutes later.
    assert extent_us(after) == extent_us(before) == root["duration"]
    assert (
        root["startTime"]
        <= rating["startTime"]
        <= rating["startTime"] + rating["duration"]
        <= root["startTime"] + root["duration"]
    )
    assert warnings_of(after) == []

    # A changed rating: a second span, and under the first a child that marks it superseded, so the
    # list says which rating holds without opening the tags.
    rate_later(agent_db, run["run_id"], "UP", 30)
    assert "1 new or changed sent" in run_cli("once", "--config", config).stdout
    changed = jaeger_trace(jaeger, trace_id, 4 + len(tools))
    ratings = [s for s in changed["spans"] if s["operationName"] == "evaluation user_feedback"]
    by_label = {next(t["value"] for t in s["tags"] if t["key"] == "gen_ai.evaluation.score.label"): s for s in ratings}
    assert sorted(by_label) == ["DOWN", "UP"]
    children = Counter(ref["spanID"] for s in changed["spans"] for ref in s.get("references") or [])
    (marker,) = [s for s in changed["spans"] if s["operationName"] == "superseded user_feedback"]
    assert marker["references"] == [{"refType": "CHILD_OF", "traceID": trace_id, "spanID": by_label["DOWN"]["spanID"]}]
    assert children[by_label["DOWN"]["spanID"]] == 1 and children[by_label["UP"]["spanID"]] == 0
    assert extent_us(changed) == root["duration"]
    assert warnings_of(changed) == [] and sorted(span_ids(changed).values()) == [1] * (4 + len(tools))

    # A backfill after the ratings sends the run again: the same bytes, so one root and one copy of each.
    since = (utc_now_naive() - timedelta(days=1)).isoformat()
    assert run_cli("backfill", "--config", config, "--since", since).returncode == 0
    root_copies = lambda: received_copies(tempo, trace_id)[root["spanID"]] == 2
    wait_for(root_copies, 30, "the root sent a second time")  # the precondition: the run really went again
    time.sleep(2)  # the collector sent the batch to both exporters at once: Jaeger has it by now
    again = jaeger_trace(jaeger, trace_id, 4 + len(tools))
    assert [s["operationName"] for s in again["spans"]].count(root["operationName"]) == 1
    assert warnings_of(again) == [] and sorted(span_ids(again).values()) == [1] * (4 + len(tools))


def test_a_first_start_opens_no_trace_for_the_ratings_of_runs_it_never_sent(stack, agent_db, tmp_path):
    jaeger, collector, tempo = stack
    seed(agent_db, 4, seed_value=25, waiting=0)
    agent_db.execute("UPDATE diagnosis_run SET feedback = 'DOWN'")
    history = expected_traces(agent_db)
    sections = bridge_sections(agent_db, tmp_path, f"http://127.0.0.1:{collector.grpc_port}", poll={"start_from": "now"})
    config = str(write_config(tmp_path / "run-otel.toml", sections))
    done = run_cli("once", "--config", config)
    assert done.returncode == 0, done.stderr
    assert "feedback: 0 rated runs in the window" in done.stdout, done.stdout
    # The precondition: a run added now goes through the same stack and opens in Jaeger.
    (new,) = add_finished_runs(agent_db, 1)
    agent_db.execute("UPDATE diagnosis_run SET feedback = 'UP' WHERE run_id = %s", f"run-{uuid.UUID(new)}")
    assert run_cli("once", "--config", config).returncode == 0
    assert [s["operationName"] for s in jaeger_trace(jaeger, new, 2)["spans"]].count("evaluation user_feedback") == 1
    wait_for(lambda: received_copies(tempo, new), 30, "the new run at the collector's second exporter")
    for trace_id in history:
        assert jaeger.trace(trace_id) is None
        assert not received_copies(tempo, trace_id)


def test_jaeger_refusing_log_records_never_holds_back_the_rating_or_the_pass(stack, agent_db, tmp_path):
    jaeger, _collector, _tempo = stack
    seed(agent_db, 3, seed_value=24, waiting=0)
    agent_db.execute("UPDATE diagnosis_run SET feedback = NULL")
    expected = expected_traces(agent_db)
    # Straight to Jaeger's own OTLP receiver, which has no logs pipeline.
    sections = bridge_sections(agent_db, tmp_path, f"http://127.0.0.1:{jaeger.otlp_port}", feedback={"log_records": True})
    config = str(write_config(tmp_path / "run-otel.toml", sections))
    assert run_cli("once", "--config", config).returncode == 0
    (trace_id, (run, tools)), (other_id, (other, other_tools)) = list(expected.items())[:2]
    jaeger_trace(jaeger, trace_id, 1 + len(tools))

    rate_later(agent_db, run["run_id"], "DOWN", 5)
    done = run_cli("once", "--config", config)
    assert done.returncode == 0, done.stderr
    assert "1 new or changed sent" in done.stdout, done.stdout
    assert done.stderr.count("gen_ai.evaluation.result log records not accepted (OTLP/gRPC") == 1, done.stderr
    assert "UNIMPLEMENTED" in done.stderr
    jaeger_trace(jaeger, trace_id, 2 + len(tools))  # the rating's span arrived all the same
    # The pass moved on: the same rating is not sent again.
    assert "0 new or changed sent" in run_cli("once", "--config", config).stdout
    rate_later(agent_db, other["run_id"], "UP", 5)
    assert "1 new or changed sent" in run_cli("once", "--config", config).stdout
    jaeger_trace(jaeger, other_id, 2 + len(other_tools))


def test_show_and_the_backfill_summary_print_ids_and_links_that_open_in_jaeger(stack, agent_db, tmp_path):
    import re

    import requests

    jaeger, collector, _tempo = stack
    seed(agent_db, 3, seed_value=25, waiting=0)
    expected = expected_traces(agent_db)
    jaeger_url = f"http://127.0.0.1:{jaeger.query_port}"
    sections = bridge_sections(agent_db, tmp_path, f"http://127.0.0.1:{collector.grpc_port}", ui={"jaeger_url": jaeger_url})
    config = str(write_config(tmp_path / "run-otel.toml", sections))
    since = (utc_now_naive() - timedelta(days=1)).isoformat()
    backfill = run_cli("backfill", "--config", config, "--since", since)
    assert backfill.returncode == 0, backfill.stderr
    trace_id, (run, tools) = next(iter(expected.items()))
    jaeger_trace(jaeger, trace_id, 1 + len(tools))
    # The precondition: what people paste first, the run id's UUID with its dashes, is refused.
    dashed = requests.get(f"{jaeger_url}/api/traces/{run['run_id'].removeprefix('run-')}", timeout=10)
    assert dashed.status_code == 400, dashed.text

    shown = run_cli("show", run["run_id"], "--config", config)
    assert shown.returncode == 0, shown.stderr
    assert f"trace {trace_id}" in shown.stdout
    (link,) = re.findall(r"open: (\S+)", shown.stdout)
    assert link == f"{jaeger_url}/trace/{trace_id}"
    opened = requests.get(f"{jaeger_url}/api/traces/{link.rsplit('/', 1)[1]}", timeout=10).json()["data"]
    assert [t["traceID"] for t in opened] == [trace_id]
    summary_links = re.findall(r"open (?:first|last): (\S+)", backfill.stdout)
    assert len(summary_links) == 2, backfill.stdout
    for summary_link in summary_links:
        found = requests.get(f"{jaeger_url}/api/traces/{summary_link.rsplit('/', 1)[1]}", timeout=10)
        assert found.status_code == 200 and found.json()["data"], summary_link


def test_each_refused_log_batch_is_counted_and_warned_about_once(stack, tmp_path, caplog):
    import logging

    from run_otel.config import build_config
    from run_otel.export.logrecords import LogRecordSender, build_log_sink
    from run_otel.mapping.evaluation import Evaluations
    from run_otel.source.clock import SourceClock
    from run_otel.source.rows import FeedbackRow

    jaeger, _collector, _tempo = stack
    config = build_config({"export": {"endpoint": f"http://127.0.0.1:{jaeger.otlp_port}", "timeout_seconds": 5}})
    refused = []
    sender = LogRecordSender(build_log_sink(config.export), {"service.name": SERVICE}, lambda: refused.append(1))
    record = Evaluations(config.feedback, SourceClock("UTC")).log_record(
        FeedbackRow(1, f"run-{uuid.uuid4()}", None, "UP", datetime(2026, 1, 1))
    )
    try:
        with caplog.at_level(logging.DEBUG, logger="run_otel.export.logrecords"):
            assert sender.send([record]) is False and sender.send([record]) is False
    finally:
        sender.close()
    assert len(refused) == 2  # each refused batch counted (run_otel_export_failures_total in the daemon)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "UNIMPLEMENTED" in warnings[0].getMessage()


def test_a_late_tool_row_and_a_late_finish_show_in_jaeger_under_one_root(stack, agent_db, tmp_path):
    jaeger, collector, _tempo = stack
    config = config_path(agent_db, tmp_path, collector)
    conn = agent_db.server.root(agent_db.name)
    finished, stuck = new_run_id(), new_run_id()
    recent = utc_now_naive() - timedelta(seconds=10)
    add_run(conn, finished, tool_call_count=2, total_duration_ms=5000, created_at=recent, updated_at=recent)
    add_tool(conn, finished, duration_ms=10, created_at=recent)
    add_run(conn, stuck, status="RUNNING")  # two hours old: sent as incomplete
    conn.commit()
    assert run_cli("once", "--config", config).returncode == 0
    finished_trace, stuck_trace = trace_id_for(finished).hex(), trace_id_for(stuck).hex()
    jaeger_trace(jaeger, finished_trace, 2)
    jaeger_trace(jaeger, stuck_trace, 1)

    # Called during the run, committed after its export.
    add_tool(conn, finished, duration_ms=20, created_at=recent + timedelta(seconds=3))
    add_tool(conn, stuck, duration_ms=30)
    with conn.cursor() as cur:
        cur.execute("UPDATE diagnosis_run SET status='FAILED', total_duration_ms=4000 WHERE run_id=%s", (stuck,))
    conn.commit()
    done = run_cli("once", "--config", config)
    assert done.returncode == 0, done.stderr

    late = jaeger_trace(jaeger, finished_trace, 3)
    assert sorted(span_ids(late).values()) == [1, 1, 1] and warnings_of(late) == [], warnings_of(late)
    roots = [span for span in late["spans"] if not span.get("references")]
    assert len(roots) == 1 and {span["operationName"] for span in late["spans"]} == {
        "invoke_agent diagnosis-agent",
        "execute_tool lookup_knowledge",
    }
    completed = jaeger_trace(jaeger, stuck_trace, 3)
    assert sorted(span_ids(completed).values()) == [1, 1, 1]
    # The run went on past the root it was sent with: Jaeger notes children outside it (its clock-skew and
    # zero-length notes), but no duplicate span id and no orphan.
    noted = " ".join(warnings_of(completed)).lower()
    assert "duplicate" not in noted and "invalid parent" not in noted, noted
    by_name = {span["operationName"]: span for span in completed["spans"]}
    root, outcome = by_name["invoke_agent diagnosis-agent"], by_name["invoke_agent diagnosis-agent completed"]
    root_tags = {t["key"]: t["value"] for t in root["tags"]}
    tags = {t["key"]: t["value"] for t in outcome["tags"]}
    assert root_tags["error.type"] == "run_incomplete"  # the root stays as it was sent: one copy
    assert tags["diagnosis.run.status"] == "FAILED" and tags["error.type"] == "run_failed" and tags["error"] is True
    assert outcome["references"][0]["spanID"] == root["spanID"]
    conn.close()
