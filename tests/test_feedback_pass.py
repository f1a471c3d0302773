"""The feedback pass on SQLite, in the fast loop: what it rechecks, what it sends, and what it records.

The end-to-end tests (test_feedback.py) hold the same pass against MariaDB and a real receiver;
these catch a break in the pass itself within a minute.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from sqlalchemy import insert, update
from sqlalchemy.engine import make_url

from run_otel.config import build_config
from run_otel.factory import build_backfill, build_feedback, build_parts, build_poller
from run_otel.mapping.span_data import root_span_id_for, trace_id_for
from run_otel.pipeline.backfill import Window
from run_otel.pipeline.feedback import FeedbackResult
from run_otel.pipeline.recorder import Recorder
from run_otel.sharding import in_shard
from run_otel.source.engine import make_engine
from run_otel.source.schema import diagnosis_run, metadata

NOW = time.time()


class Counted(Recorder):
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def feedback_sent(self, rows) -> None:
        self.sent += [(row.run_id, row.feedback) for row in rows]


def _agent_db(tmp_path, runs: list[tuple[str, str | None, float]]):
    """``runs`` as (run_id, feedback, hours ago), finished, in id order."""
    engine = make_engine(make_url(f"sqlite:///{tmp_path / 'agent.db'}"))
    metadata.create_all(engine)
    with engine.begin() as conn:
        for run_id, feedback, hours_ago in runs:
            created = datetime.fromtimestamp(NOW - hours_ago * 3600, UTC).replace(tzinfo=None, microsecond=0)
            conn.execute(
                insert(diagnosis_run).values(
                    run_id=run_id,
                    session_id="s",
                    query="q",
                    status="SUCCESS",
                    feedback=feedback,
                    created_at=created,
                    updated_at=created + timedelta(seconds=5),
                    total_duration_ms=4000,
                )
            )
    return engine


def _rate(engine, run_id: str, value: str) -> None:
    with engine.begin() as conn:
        conn.execute(update(diagnosis_run).where(diagnosis_run.c.run_id == run_id).values(feedback=value))


def _config(tmp_path, shard=(0, 1), **feedback):
    config = build_config(
        {
            "source": {"url": f"sqlite:///{tmp_path / 'agent.db'}"},
            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "poll": {"start_from": "beginning", "settle_seconds": 0},
            "feedback": {"window_seconds": 86400, **feedback},
        }
    )
    return replace(config, shard=shard)  # as --shard sets it


def _file_parts(config, tmp_path, recorder: Recorder | None = None):
    from run_otel.export.sinks import JsonFileSink

    return build_parts(config, recorder=recorder, sink=JsonFileSink(tmp_path / "out.jsonl"))


def _evaluation_spans(tmp_path) -> list[dict]:
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    spans = [
        span
        for line in lines
        for resource in json.loads(line)["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]
    return [span for span in spans if span["name"].startswith("evaluation ")]


def _run_of(span: dict) -> str:
    return next(a["value"]["stringValue"] for a in span["attributes"] if a["key"] == "diagnosis.run.id")


def _label(span: dict) -> str:
    return next(a["value"]["stringValue"] for a in span["attributes"] if a["key"] == "gen_ai.evaluation.score.label")


def test_nothing_is_rechecked_before_the_first_checkpoint(tmp_path):
    _agent_db(tmp_path, [("run-a", "UP", 1)])
    with _file_parts(_config(tmp_path), tmp_path) as parts:
        feedback = build_feedback(parts)
        assert feedback is not None
        assert parts.store.load() is None  # precondition: nothing was exported yet
        assert feedback.run() == FeedbackResult()
    assert _evaluation_spans(tmp_path) == []


def test_a_rating_given_after_the_export_is_sent_once_into_the_runs_trace(tmp_path):
    # Three minutes old: young enough that every pass reads them again.
    engine = _agent_db(tmp_path, [("run-a", None, 0.05), ("run-b", "UP", 0.05)])
    recorder = Counted()
    with _file_parts(_config(tmp_path), tmp_path, recorder) as parts:
        build_poller(parts).poll()
        feedback = build_feedback(parts, clock=lambda: NOW)
        assert feedback is not None
        # The root carries no rating: run-b's, given before the export, goes out on the first pass, once.
        assert feedback.run() == FeedbackResult(rated=1, sent=1)
        assert feedback.run() == FeedbackResult(rated=1, sent=0)
        _rate(engine, "run-a", "thumbs-down")
        assert feedback.run() == FeedbackResult(rated=2, sent=1)
        assert feedback.run() == FeedbackResult(rated=2, sent=0)  # unchanged: not sent again
        _rate(engine, "run-a", "UP")
        assert feedback.run() == FeedbackResult(rated=2, sent=1)
    spans = _evaluation_spans(tmp_path)
    assert [(_run_of(span), _label(span)) for span in spans] == [("run-b", "UP"), ("run-a", "thumbs-down"), ("run-a", "UP")]
    for span in spans:
        assert span["traceId"] == trace_id_for(_run_of(span)).hex()
        assert span["parentSpanId"] == root_span_id_for(_run_of(span)).hex()
    assert recorder.sent == [("run-b", "UP"), ("run-a", "thumbs-down"), ("run-a", "UP")]


def test_runs_created_before_the_window_are_not_rechecked(tmp_path):
    engine = _agent_db(tmp_path, [("run-old", None, 30), ("run-new", None, 1)])
    with _file_parts(_config(tmp_path, window_seconds=86400), tmp_path) as parts:
        build_poller(parts).poll()
        feedback = build_feedback(parts, clock=lambda: NOW)
        assert feedback is not None
        _rate(engine, "run-old", "UP")
        _rate(engine, "run-new", "DOWN")
        assert feedback.run() == FeedbackResult(rated=1, sent=1)
    assert [_label(span) for span in _evaluation_spans(tmp_path)] == ["DOWN"]


def test_a_shard_sends_the_ratings_of_its_own_runs_only(tmp_path):
    run_ids = [f"run-{n}" for n in range(12)]
    engine = _agent_db(tmp_path, [(run_id, None, 1) for run_id in run_ids])
    shard = (0, 2)
    mine = [run_id for run_id in run_ids if in_shard(run_id, shard)]
    assert 0 < len(mine) < len(run_ids)  # precondition: both shards have runs
    with _file_parts(_config(tmp_path, shard=shard), tmp_path) as parts:
        build_poller(parts).poll()
        feedback = build_feedback(parts, clock=lambda: NOW)
        assert feedback is not None
        for run_id in run_ids:
            _rate(engine, run_id, "UP")
        assert feedback.run() == FeedbackResult(rated=len(mine), sent=len(mine))
    sent = {span["traceId"] for span in _evaluation_spans(tmp_path)}
    assert sent == {trace_id_for(run_id).hex() for run_id in mine}


def test_the_pass_is_off_when_feedback_is_off(tmp_path):
    _agent_db(tmp_path, [("run-a", "UP", 1)])
    with _file_parts(_config(tmp_path, enabled=False), tmp_path) as parts:
        assert build_feedback(parts) is None


def test_a_new_rating_on_an_older_run_waits_for_its_part_of_the_window_at_most_a_quarter_of_its_age(tmp_path):
    engine = _agent_db(tmp_path, [("run-old", None, 5), ("run-young", None, 0.05)])  # ids grow with time
    recorder = Counted()
    with _file_parts(_config(tmp_path), tmp_path, recorder) as parts:
        build_poller(parts).poll()
        feedback = build_feedback(parts, clock=lambda: NOW)
        assert feedback is not None and feedback.run() == FeedbackResult()  # the first pass reads the whole window
        _rate(engine, "run-young", "UP")
        _rate(engine, "run-old", "DOWN")
        assert feedback.run().sent == 1  # the young run's, at once
        passes = 1
        while not any(run_id == "run-old" for run_id, _ in recorder.sent):
            feedback.run()
            passes += 1
    # Five hours old: read every 64th pass (8 minutes x 64 reaches back 8.5 hours), so within 64 minutes at the
    # default interval, a fifth of its age; the passes between read the younger parts of the window only.
    assert passes == 64
    assert recorder.sent == [("run-young", "UP"), ("run-old", "DOWN")]


def test_a_rating_a_run_had_when_it_was_exported_goes_out_with_the_next_pass_whatever_its_age(tmp_path):
    engine = _agent_db(tmp_path, [("run-first", None, 0.05)])
    recorder = Counted()
    with _file_parts(_config(tmp_path), tmp_path, recorder) as parts:
        poller = build_poller(parts)
        poller.poll()
        feedback = build_feedback(parts, clock=lambda: NOW)
        assert feedback is not None
        feedback.run()  # the first pass, over the whole window
        with engine.begin() as conn:  # a run of twenty hours ago, rated, which a catch-up exports only now
            created = datetime.fromtimestamp(NOW - 20 * 3600, UTC).replace(tzinfo=None, microsecond=0)
            conn.execute(
                insert(diagnosis_run).values(
                    run_id="run-late",
                    session_id="s",
                    query="q",
                    status="SUCCESS",
                    feedback="UP",
                    created_at=created,
                    updated_at=created,
                )
            )
        assert poller.poll().run_count == 1
        assert feedback.run() == FeedbackResult(rated=1, sent=1)
    assert recorder.sent == [("run-late", "UP")]


def test_the_schedule_reads_the_young_runs_every_pass_and_the_whole_window_every_128th():
    from run_otel.pipeline.feedback_window import AgingWindow

    window = AgingWindow(60, 86400)
    ages = [window.age(n) / 60 for n in range(1, 129)]
    assert ages[:8] == [8, 16, 8, 32, 8, 16, 8, 64]
    assert ages.count(window.kept_seconds / 60) == 1 and ages[-1] == window.kept_seconds / 60
    assert window.kept_seconds == 86400 + 128 * 60  # the window, and one period of its oldest part more
    assert 1 / 40 < window.share() < 1 / 35
    assert AgingWindow(60, 300).share() == 1  # a window under eight intervals is read whole each pass


def test_a_rating_given_later_on_a_run_a_backfill_exported_is_sent_and_counted_once(tmp_path):
    """Below the daemon's first start's mark, the runs a backfill exported are the bridge's: a rating
    given on one after the backfill goes out like any other. Those it did not export (before its
    range, or in its range but created outside its window) stay out, and a rating it sent with its
    run is not sent again."""
    engine = _agent_db(
        tmp_path,
        [("run-never", None, 5), ("run-h1", None, 4), ("run-rated", "UP", 4), ("run-skip", None, 20), ("run-h2", None, 3)],
    )
    config = _config(tmp_path)
    config = replace(config, poll=replace(config.poll, start_from="now"))
    recorder = Counted()
    with _file_parts(config, tmp_path, recorder) as parts:
        build_poller(parts).poll()  # the first start: its mark is the newest run, run-h2 (id 5)
        assert parts.store.load().start_mark == 5  # the precondition: every run is below the mark
        since = datetime.fromtimestamp(NOW - 10 * 3600, UTC).replace(tzinfo=None)
        build_backfill(parts).run(2, 5, created_in=Window(since).contains)
        assert [_run_of(s) for s in _evaluation_spans(tmp_path)] == ["run-rated"]  # sent with its run
        feedback = build_feedback(parts, clock=lambda: NOW)
        assert feedback is not None
        for run_id in ("run-never", "run-h1", "run-skip", "run-h2"):
            _rate(engine, run_id, "DOWN")
        assert feedback.run() == FeedbackResult(rated=3, sent=2)
        assert feedback.run().sent == 0  # a later pass reads what may have changed since: nothing is sent again
    assert recorder.sent == [("run-h1", "DOWN"), ("run-h2", "DOWN")]
    assert [_run_of(s) for s in _evaluation_spans(tmp_path)] == ["run-rated", "run-h1", "run-h2"]


def test_the_ranges_a_backfill_exported_grow_batch_by_batch_and_leave_out_what_it_did_not_send():
    from run_otel.pipeline.backfilled import clipped, covers, merged, ranges_of

    assert ranges_of(1, 10, []) == [(1, 10)]
    assert ranges_of(1, 10, [1, 4, 5, 10]) == [(2, 3), (6, 9)]
    assert ranges_of(5, 7, [2, 9]) == [(5, 7)]
    assert merged([(8, 9), (1, 3), (4, 5), (2, 2), (11, 12)]) == [(1, 5), (8, 9), (11, 12)]
    assert clipped([(1, 5), (8, 9), (11, 20)], 4, 12) == [(4, 5), (8, 9), (11, 12)]
    inside = covers([(2, 3), (6, 9)])
    assert [i for i in range(12) if inside(i)] == [2, 3, 6, 7, 8, 9]
