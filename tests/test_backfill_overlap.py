"""A backfill maps the next batch while the one before is being sent, in the fast loop (SQLite).

The receiver's time to acknowledge a request then overlaps run-otel's own work; the batches still
finish in order, each run is sent once, and a failed send stops the backfill at that batch;
what the rows of a batch not acknowledged raise is told when it is sent again, not twice.
"""

from __future__ import annotations

import threading
from datetime import datetime

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from sqlalchemy import insert
from sqlalchemy.engine import make_url

from run_otel.config import build_config
from run_otel.export.sending import RequestSender
from run_otel.export.sinks import Ack, ExportError
from run_otel.export.wire import RunEncoder, WireSpans
from run_otel.factory import build_parts
from run_otel.pipeline.backfill_pass import BackfillPass
from run_otel.pipeline.recorder import Recorder
from run_otel.pipeline.run_export import RunExporter
from run_otel.source.engine import make_engine
from run_otel.source.schema import diagnosis_run, metadata

RUNS = 6
BATCH = 2


class WaitingReceiver:
    """Holds its first request until ``go`` is set (or 3 s pass), as a slow receiver would."""

    def __init__(self, fail_at: int | None = None):
        self.go = threading.Event()
        self.waited_for_go: bool | None = None
        self.run_ids: list[list[str]] = []
        self._fail_at = fail_at

    def send(self, request: bytes) -> Ack:
        if not self.run_ids and self.waited_for_go is None:
            self.waited_for_go = self.go.wait(3)
        if self._fail_at is not None and len(self.run_ids) == self._fail_at:
            raise ExportError("the receiver is gone")
        parsed = ExportTraceServiceRequest.FromString(request)
        spans = [s for r in parsed.resource_spans for sc in r.scope_spans for s in sc.spans]
        self.run_ids.append(
            [a.value.string_value for s in spans if not s.parent_span_id for a in s.attributes if a.key == "diagnosis.run.id"]
        )
        return Ack()

    def probe(self) -> None: ...

    def close(self) -> None: ...

    def describe(self) -> str:
        return "waiting"


class NotingExporter(RunExporter):
    """Sets ``second`` when the second batch is prepared."""

    def __init__(self, *args, second: threading.Event):
        super().__init__(*args)
        self._second = second
        self._prepared = 0

    def prepare(self, *args, **kwargs):
        prepared = super().prepare(*args, **kwargs)
        self._prepared += 1
        if self._prepared == 2:
            self._second.set()
        return prepared


class WarningsRecorder(Recorder):
    def __init__(self):
        self.warnings = 0

    def row_warnings(self, count: int) -> None:
        self.warnings += count


# Runs with a bad value and an unknown status: in the batch whose send fails, and in the one mapped behind it.
BAD_RUNS = (3, 5)


def _seed(tmp_path) -> None:
    engine = make_engine(make_url(f"sqlite:///{tmp_path / 'agent.db'}"))
    metadata.create_all(engine)
    with engine.begin() as conn:
        for n in range(1, RUNS + 1):
            at = datetime(2026, 1, 1, 12, 0, n)
            bad = n in BAD_RUNS
            conn.execute(
                insert(diagnosis_run).values(
                    run_id=f"run-{n}",
                    session_id="s",
                    query="q",
                    status="WEIRD" if bad else "SUCCESS",
                    step_count="many" if bad else 3,  # SQLite keeps the text: a row warning
                    created_at=at,
                    updated_at=at,
                )
            )


def _backfill(tmp_path, receiver: WaitingReceiver, recorder: Recorder | None = None) -> BackfillPass:
    if not (tmp_path / "agent.db").exists():
        _seed(tmp_path)
    config = build_config(
        {
            "source": {"url": f"sqlite:///{tmp_path / 'agent.db'}"},
            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "poll": {"batch_size": BATCH},
            "feedback": {"enabled": False},
        }
    )
    parts = build_parts(config, sink=receiver, **({"recorder": recorder} if recorder else {}))
    sender = RequestSender(receiver, parts.frame, config.export.max_request_bytes, 128, lambda *_: None)
    runs = RunEncoder(parts.mapper, WireSpans(parts.mapper.limits))
    exporter = NotingExporter(parts.source, runs, sender, parts.recorder, second=receiver.go)
    return BackfillPass(config.poll, config.shard, parts.source, exporter, parts.recorder)


def test_the_next_batch_is_mapped_while_the_one_before_is_sent(tmp_path):
    receiver = WaitingReceiver()
    finished: list[tuple[int, int]] = []
    total = _backfill(tmp_path, receiver).run(
        1, RUNS, on_batch=lambda result, cursor: finished.append((cursor, result.run_count))
    )
    # The first request was still waiting for its acknowledgement when the second batch was mapped.
    assert receiver.waited_for_go is True
    assert receiver.run_ids == [["run-1", "run-2"], ["run-3", "run-4"], ["run-5", "run-6"]]
    assert finished == [(2, 2), (4, 2), (6, 2)] and total.run_count == RUNS


def test_a_failed_send_stops_the_backfill_at_its_batch(tmp_path):
    receiver = WaitingReceiver(fail_at=1)
    receiver.go.set()
    finished: list[int] = []
    with pytest.raises(ExportError):
        _backfill(tmp_path, receiver).run(1, RUNS, on_batch=lambda result, cursor: finished.append(cursor))
    # The first batch counts; the second failed, so nothing after it does, though the third was mapped.
    assert finished == [2] and receiver.run_ids == [["run-1", "run-2"]]


def test_rows_of_a_batch_not_acknowledged_warn_once_it_is_sent_again(tmp_path, caplog):
    recorder = WarningsRecorder()
    failing = WaitingReceiver(fail_at=1)
    failing.go.set()
    with pytest.raises(ExportError):
        _backfill(tmp_path, failing, recorder).run(1, RUNS)
    # Both bad runs were read and mapped (one in the failed batch, one behind it), neither was acknowledged.
    assert failing.run_ids == [["run-1", "run-2"]]
    assert recorder.warnings == 0 and "many" not in caplog.text

    resumed = WaitingReceiver()
    resumed.go.set()
    _backfill(tmp_path, resumed, recorder).run(3, RUNS)
    assert resumed.run_ids == [["run-3", "run-4"], ["run-5", "run-6"]]
    # Each bad run: its unreadable step_count and its unknown status, counted once.
    assert recorder.warnings == 2 * len(BAD_RUNS)
    assert caplog.text.count("'many'") == len(BAD_RUNS)
