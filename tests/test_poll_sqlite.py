"""The poll on SQLite, in the fast loop: what it says about the runs it sends.

The end-to-end tests hold the same poll against MariaDB and a real receiver; these catch a break
in the poll itself within a minute.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import insert
from sqlalchemy.engine import make_url

from run_otel.config import build_config
from run_otel.export.sinks import JsonFileSink
from run_otel.factory import build_parts, build_poller
from run_otel.source.engine import make_engine
from run_otel.source.schema import diagnosis_run, metadata

NOW = float(int(time.time()))  # whole seconds, as a DATETIME column keeps them


def _naive(seconds_ago: float) -> datetime:
    return datetime.fromtimestamp(NOW - seconds_ago, UTC).replace(tzinfo=None, microsecond=0)


def _agent_db(tmp_path, runs: list[tuple[str, str, float]]):
    """``runs`` as (run_id, status, seconds since it was created), in id order."""
    engine = make_engine(make_url(f"sqlite:///{tmp_path / 'agent.db'}"))
    metadata.create_all(engine)
    with engine.begin() as conn:
        for run_id, status, age in runs:
            conn.execute(
                insert(diagnosis_run).values(
                    run_id=run_id,
                    session_id="s",
                    query="q",
                    status=status,
                    created_at=_naive(age),
                    updated_at=_naive(age) + timedelta(seconds=1),
                )
            )
    return engine


def _config(tmp_path, **poll):
    return build_config(
        {
            "source": {"url": f"sqlite:///{tmp_path / 'agent.db'}"},
            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "poll": {"start_from": "beginning", "settle_seconds": 0, **poll},
        }
    )


def test_a_run_sent_as_incomplete_is_one_warning_naming_it_and_how_long_it_was_stuck(tmp_path, caplog):
    _agent_db(tmp_path, [("run-done", "SUCCESS", 7200), ("run-stuck", "RUNNING", 7200), ("run-young", "RUNNING", 5)])
    config = _config(tmp_path, run_timeout_seconds=3600)
    with build_parts(config, sink=JsonFileSink(tmp_path / "out.jsonl")) as parts, caplog.at_level(logging.WARNING):
        result = build_poller(parts, clock=lambda: NOW).poll()
    assert result.run_count == 2  # precondition: the stuck run went out, beside the finished one
    lines = [r.getMessage() for r in caplog.records if "sent as incomplete" in r.getMessage()]
    assert lines == [
        "run run-stuck sent as incomplete: status RUNNING, not finished after 7200s (poll.run_timeout_seconds = 3600)"
    ]


def _add_finished(engine, run_ids: list[str]) -> None:
    with engine.begin() as conn:
        for run_id in run_ids:
            conn.execute(
                insert(diagnosis_run).values(
                    run_id=run_id, session_id="s", query="q", status="SUCCESS", created_at=_naive(60), updated_at=_naive(59)
                )
            )


def _sent_run_ids(path) -> list[str]:
    import json

    return [
        attribute["value"]["stringValue"]
        for line in path.read_text().splitlines()
        for resource in json.loads(line)["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
        for attribute in span["attributes"]
        if attribute["key"] == "diagnosis.run.id"
    ]


def test_a_checkpoint_that_cannot_be_saved_fails_the_poll_and_its_runs_are_sent_again(tmp_path):
    import pytest
    from sqlalchemy import text

    from run_otel.pipeline.state_store import StateStoreError

    agent = _agent_db(tmp_path, [("run-1", "SUCCESS", 60), ("run-2", "SUCCESS", 60)])
    out = tmp_path / "out.jsonl"
    with build_parts(_config(tmp_path), sink=JsonFileSink(out)) as parts:
        poller = build_poller(parts, clock=lambda: NOW)
        poller.poll()
        assert parts.store.load().high_water == 2  # precondition: saved
        _add_finished(agent, ["run-3", "run-4"])
        # The store still reads, but refuses every write (a full disk, a revoked grant).
        state = make_engine(make_url(f"sqlite:///{tmp_path / 'state.db'}"))
        with state.begin() as conn:
            for event in ("UPDATE", "INSERT"):
                conn.execute(
                    text(
                        f"CREATE TRIGGER refuse_{event.lower()} BEFORE {event} ON run_otel_checkpoint "
                        "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
                    )
                )
        with pytest.raises(StateStoreError, match="cannot save the checkpoint: .*database or disk is full"):
            poller.poll()
        assert parts.store.load().high_water == 2  # load still works, and the checkpoint did not move
        with state.begin() as conn:
            conn.execute(text("DROP TRIGGER refuse_update"))
            conn.execute(text("DROP TRIGGER refuse_insert"))
        poller.poll()
        assert parts.store.load().high_water == 4
    # At least once: the batch whose checkpoint was refused goes out again.
    assert _sent_run_ids(out) == ["run-1", "run-2", "run-3", "run-4", "run-3", "run-4"]


class _DownOnce(JsonFileSink):
    """A collector that is away for the first request."""

    def __init__(self, path):
        super().__init__(path)
        self.refused = 0

    def send(self, request: bytes):
        from run_otel.export.sinks import ExportError

        if not self.refused:
            self.refused += 1
            raise ExportError("connection refused")
        return super().send(request)


def test_a_bad_row_warns_once_when_its_run_is_sent_not_at_each_failed_try(tmp_path, caplog):
    import pytest
    from sqlalchemy import update

    from run_otel.export.sinks import ExportError
    from run_otel.pipeline.recorder import Recorder

    class Counting(Recorder):
        warnings = 0

        def row_warnings(self, count: int) -> None:
            self.warnings += count

    agent = _agent_db(tmp_path, [("run-1", "WEIRD", 60)])
    with agent.begin() as conn:  # SQLite keeps the text in the integer column: a row warning
        conn.execute(update(diagnosis_run).values(step_count="many"))
    recorder, sink = Counting(), _DownOnce(tmp_path / "out.jsonl")
    with build_parts(_config(tmp_path), sink=sink, recorder=recorder) as parts, caplog.at_level(logging.WARNING):
        poller = build_poller(parts, clock=lambda: NOW)
        with pytest.raises(ExportError):
            poller.poll()
        assert sink.refused == 1 and recorder.warnings == 0  # precondition: the run was read and mapped, not sent
        poller.poll()
    assert _sent_run_ids(tmp_path / "out.jsonl") == ["run-1"]
    assert recorder.warnings == 2  # the unreadable step_count and the unknown status, once each
    assert caplog.text.count("step_count 'many'") == 1
    assert caplog.text.count("unknown diagnosis_run.status 'WEIRD'") == 1


def test_a_drain_probes_the_backlog_once_a_second_not_after_every_batch(tmp_path):
    from sqlalchemy import event

    _agent_db(tmp_path, [(f"run-{i}", "SUCCESS", 60) for i in range(40)])
    with build_parts(_config(tmp_path, batch_size=2), sink=JsonFileSink(tmp_path / "out.jsonl")) as parts:
        probes: list[str] = []

        def seen(_conn, _cursor, statement, *_args) -> None:
            if "max(diagnosis_run.id)" in statement:
                probes.append(statement)

        event.listen(parts.source.engine, "before_cursor_execute", seen)
        started = time.monotonic()
        result = build_poller(parts, clock=lambda: NOW).poll()
        seconds = time.monotonic() - started
    assert result.run_count == 40 and result.batches >= 20  # precondition: a drain of many batches
    # The zone check's sample of the newest run; then the backlog when the drain starts, once a second
    # during it and at its end: 3 here, where a probe after each batch made 22.
    assert 1 <= len(probes) <= 3 + int(seconds), (len(probes), seconds)


def test_a_batch_is_counted_while_the_next_one_is_on_its_way(tmp_path):
    from run_otel.pipeline.recorder import Recorder

    events: list[str] = []

    class SlowToCount(Recorder):  # metrics as slow as a big batch's: does the next send wait for them?
        def runs_exported(self, result, acked_at):
            events.append("counting")
            time.sleep(0.5)
            events.append("counted")

    class Sending(JsonFileSink):
        def send(self, request):
            events.append("send")
            return super().send(request)

    _agent_db(tmp_path, [(f"run-{i}", "SUCCESS", 60) for i in range(6)])
    sink = Sending(tmp_path / "out.jsonl")
    with build_parts(_config(tmp_path, batch_size=2), recorder=SlowToCount(), sink=sink) as parts:
        result = build_poller(parts, clock=lambda: NOW).poll()
    sends = [k for k, event in enumerate(events) if event == "send"]
    counted = [k for k, event in enumerate(events) if event == "counted"]
    assert result.run_count == 6 and len(sends) == 3 and len(counted) >= 3  # the precondition: three batches sent
    # The next batch's request goes out while the one before is being counted, not after.
    assert all(sends[k + 1] < counted[k] for k in range(len(sends) - 1)), events


def test_readiness_names_the_part_a_failed_poll_failed_in_and_no_error_text(tmp_path):
    import pytest
    from helpers import bridge_metrics
    from sqlalchemy import text

    from run_otel.pipeline.state_store import StateStoreError
    from run_otel.source.errors import SourceError
    from run_otel.telemetry.health import readiness

    agent = _agent_db(tmp_path, [("run-1", "SUCCESS", 60)])
    config = _config(tmp_path)
    metrics = bridge_metrics(config, readers=[])
    ready = readiness(metrics, 5, 60)
    with build_parts(config, recorder=metrics, sink=JsonFileSink(tmp_path / "out.jsonl")) as parts:
        poller = build_poller(parts, clock=lambda: NOW)
        assert poller.poll().run_count == 1 and ready()[0]  # the precondition: ready after a good poll
        with agent.begin() as conn:
            conn.execute(text("ALTER TABLE diagnosis_run RENAME TO gone_secret_name"))
        with pytest.raises(SourceError):
            poller.poll()
        assert ready() == (False, "not ready: the last poll failed (reading the database); see the log")
        with agent.begin() as conn:
            conn.execute(text("ALTER TABLE gone_secret_name RENAME TO diagnosis_run"))
        poller.poll()
        assert ready()[0]
        state = make_engine(make_url(f"sqlite:///{tmp_path / 'state.db'}"))
        with state.begin() as conn:
            conn.execute(
                text("CREATE TRIGGER refuse BEFORE UPDATE ON run_otel_checkpoint BEGIN SELECT RAISE(ABORT, 'disk full'); END")
            )
        _add_finished(agent, ["run-2"])
        with pytest.raises(StateStoreError):
            poller.poll()
        assert ready() == (False, "not ready: the last poll failed (the state store); see the log")
    metrics.shutdown()
