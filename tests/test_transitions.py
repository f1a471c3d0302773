"""The checkpoint's moves and the time-zone check, as pure functions with exact times."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from run_otel.ops.rewind import rewound
from run_otel.pipeline.checkpoint import Checkpoint
from run_otel.pipeline.transitions import MAX_NEW_GAPS, Rules, advance, classify, cut, expire_gaps, initial_checkpoint, timed_out
from run_otel.source.clock import ClockSample, SourceClock, zone_finding
from run_otel.source.rows import RunRow

UTC = SourceClock("UTC")
T0 = datetime(2026, 12, 1, 12, 0, 0)
E0 = UTC.epoch(T0)
RULES = Rules(settle_seconds=2, run_timeout_seconds=3600, gap_timeout_seconds=600)


def run(id_: int, status: str | None = "SUCCESS", created: datetime = T0, updated: datetime | None = None) -> RunRow:
    return RunRow(id_, f"run-{id_}", None, status, None, None, None, None, None, None, None, None, created, updated or created)


# -- start ----------------------------------------------------------------------


@pytest.mark.parametrize(("start", "high_water"), [("now", 500), ("beginning", 0), ("42", 41)])
def test_a_first_start_begins_where_start_from_says(start, high_water):
    assert initial_checkpoint(start, 500) == Checkpoint(high_water=high_water)


# -- gaps -----------------------------------------------------------------------


def test_skipped_ids_become_gaps_first_missed_now():
    checkpoint = Checkpoint(high_water=10)
    assert advance(checkpoint, [11, 14, 15], now=E0) == 0
    assert checkpoint.high_water == 15
    assert checkpoint.gaps == {12: E0, 13: E0}


def test_a_gap_keeps_the_time_it_was_first_missed():
    checkpoint = Checkpoint(high_water=10, gaps={12: E0})
    advance(checkpoint, [11, 13, 15], now=E0 + 100)
    assert checkpoint.gaps == {12: E0, 14: E0 + 100}


def test_a_huge_id_jump_tracks_only_the_newest_gaps():
    checkpoint = Checkpoint(high_water=0)
    dropped = advance(checkpoint, [1, 1_000_000], now=E0)
    assert checkpoint.high_water == 1_000_000
    assert len(checkpoint.gaps) == MAX_NEW_GAPS
    assert dropped == 1_000_000 - 2 - MAX_NEW_GAPS
    assert min(checkpoint.gaps) == 1_000_000 - MAX_NEW_GAPS and max(checkpoint.gaps) == 999_999


def test_a_gap_expires_exactly_at_the_gap_timeout():
    checkpoint = Checkpoint(high_water=20, gaps={12: E0, 13: E0 + 300})
    assert expire_gaps(checkpoint, E0 + 599.9, 600) == []
    assert expire_gaps(checkpoint, E0 + 600, 600) == [12]
    assert checkpoint.gaps == {13: E0 + 300}
    assert expire_gaps(checkpoint, E0 + 900, 600) == [13]


def test_a_late_commit_just_before_expiry_is_exported():
    checkpoint = Checkpoint(high_water=20, gaps={12: E0})
    now = E0 + 599
    decided = classify(checkpoint, [run(12, created=T0, updated=T0)], now, RULES, UTC)
    assert [r.id for r in decided.to_export] == [12]
    assert expire_gaps(checkpoint, now, 600) == [] and checkpoint.gaps == {}


def test_a_late_commit_just_after_expiry_is_no_longer_rechecked():
    checkpoint = Checkpoint(high_water=20, gaps={12: E0})
    now = E0 + 600
    # That poll's recheck found nothing: the gap expires, and no later poll asks for id 12.
    classify(checkpoint, [], now, RULES, UTC)
    assert expire_gaps(checkpoint, now, 600) == [12]
    assert 12 not in checkpoint.gaps and 12 not in checkpoint.pending


# -- settle and timeouts --------------------------------------------------------------


def test_a_finished_run_waits_to_settle_and_says_when():
    checkpoint = Checkpoint(high_water=1)
    decided = classify(checkpoint, [run(1, updated=T0)], E0 + 1.5, RULES, UTC)
    assert decided.to_export == [] and decided.next_settle_at == E0 + 2
    assert checkpoint.pending == {1: E0 + 1.5}
    decided = classify(checkpoint, [run(1, updated=T0)], E0 + 2, RULES, UTC)
    assert [r.id for r in decided.to_export] == [1] and checkpoint.pending == {}


def test_a_waiting_run_times_out_exactly_at_the_run_timeout():
    checkpoint = Checkpoint(high_water=1)
    waiting = run(1, status="RUNNING")
    assert classify(checkpoint, [waiting], E0 + 3599, RULES, UTC).to_export == []
    assert checkpoint.pending == {1: E0 + 3599}
    decided = classify(checkpoint, [waiting], E0 + 3600, RULES, UTC)
    assert decided.incomplete == {1} and [r.id for r in decided.to_export] == [1]


def test_a_zero_run_timeout_waits_forever():
    assert not timed_out(E0, E0, E0 + 10**9, Rules(2, 0, 600))


def test_a_timestamp_in_the_future_never_fires_a_timeout():
    eight_hours_ahead = E0 + 8 * 3600
    # Seen first at E0; an hour later the timeout counts from that, not from the row.
    assert not timed_out(eight_hours_ahead, E0, E0 + 30, RULES)
    assert not timed_out(eight_hours_ahead, E0, E0 + 3599, RULES)
    assert timed_out(eight_hours_ahead, E0, E0 + 3600, RULES)


def test_untrusted_timestamps_count_from_first_seen():
    untrusted = Rules(2, 3600, 600, trust_timestamps=False)
    eight_hours_old = E0 - 8 * 3600
    assert timed_out(eight_hours_old, E0, E0, RULES)
    assert not timed_out(eight_hours_old, E0, E0 + 20, untrusted)
    assert timed_out(eight_hours_old, E0, E0 + 3600, untrusted)


def test_a_pending_run_keeps_its_first_seen_across_polls():
    checkpoint = Checkpoint(high_water=1, pending={1: E0})
    classify(checkpoint, [run(1, status="PENDING", created=None)], E0 + 100, RULES, UTC)
    assert checkpoint.pending == {1: E0}


# -- the time-zone check ----------------------------------------------------------------

NOW_UTC = datetime(2026, 12, 3, 8, 0, 0)


def sample(newest: datetime, db_now: datetime | None = None) -> ClockSample:
    return ClockSample(run_id=99, newest=newest, db_now=db_now or NOW_UTC, db_utc=NOW_UTC)


def test_rows_in_shanghai_read_as_utc_lie_in_the_future():
    finding = zone_finding(sample(NOW_UTC + timedelta(hours=8, seconds=-20)), UTC)
    assert finding is not None
    assert "7h 59m in the future" in finding.evidence and "id 99" in finding.evidence
    assert finding.likely_offset == timedelta(hours=8)
    assert "Asia/Shanghai" in finding.message("UTC") and "UTC+08:00" in finding.message("UTC")


def test_rows_in_utc_read_as_shanghai_match_utc_timestamp():
    finding = zone_finding(sample(NOW_UTC - timedelta(seconds=20)), SourceClock("Asia/Shanghai"))
    assert finding is not None
    assert "UTC_TIMESTAMP()" in finding.evidence and "8h 00m old" in finding.evidence
    assert finding.likely_offset == timedelta(0)


def test_rows_that_match_the_database_now_name_its_zone():
    db_now = NOW_UTC + timedelta(hours=9)
    finding = zone_finding(sample(db_now - timedelta(seconds=5), db_now=db_now), SourceClock("Europe/Berlin"))
    assert finding is not None and finding.likely_offset == timedelta(hours=9)
    assert "Asia/Tokyo" in finding.message("Europe/Berlin")


@pytest.mark.parametrize(
    ("zone", "newest"),
    [
        ("UTC", NOW_UTC - timedelta(seconds=20)),
        ("Asia/Shanghai", NOW_UTC + timedelta(hours=8, seconds=-20)),
        ("UTC", NOW_UTC - timedelta(hours=3)),  # an idle agent: old rows are not evidence
        ("UTC", NOW_UTC + timedelta(seconds=60)),  # a little clock skew
    ],
)
def test_rows_that_fit_the_zone_raise_nothing(zone, newest):
    assert zone_finding(sample(newest), SourceClock(zone)) is None


# -- the same rules, through the poller, on SQLite with an injected clock -----------------


def test_the_poller_expires_a_gap_exactly_at_the_configured_timeout(tmp_path):
    from sqlalchemy import insert
    from sqlalchemy.engine import make_url

    from run_otel.config import build_config
    from run_otel.export.sinks import JsonFileSink
    from run_otel.factory import build_parts, build_poller
    from run_otel.source.engine import make_engine
    from run_otel.source.schema import diagnosis_run, metadata

    engine = make_engine(make_url(f"sqlite:///{tmp_path / 'agent.db'}"))
    metadata.create_all(engine)
    old = datetime(2026, 1, 1)
    with engine.begin() as conn:  # ids 1 and 3: id 2 is an insert not committed yet
        for id_ in (1, 3):
            conn.execute(
                insert(diagnosis_run).values(
                    id=id_, run_id=f"run-{id_}", session_id="s", query="q", status="SUCCESS", created_at=old, updated_at=old
                )
            )
    config = build_config(
        {
            "source": {"url": f"sqlite:///{tmp_path / 'agent.db'}"},
            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "poll": {"start_from": "beginning", "gap_timeout_seconds": 600},
        }
    )
    now = [E0]
    sink = JsonFileSink(tmp_path / "out.jsonl")
    poller = build_poller(build_parts(config, sink=sink), clock=lambda: now[0])
    poller.poll()
    store = poller._store
    assert store.load().gaps == {2: E0}
    now[0] = E0 + 599
    poller.poll()
    assert store.load().gaps == {2: E0}
    now[0] = E0 + 600
    poller.poll()
    assert store.load().gaps == {}
    sink.close()


def test_a_rewind_back_hands_the_runs_ratings_to_the_daemon_and_one_forward_keeps_them_out():
    checkpoint = Checkpoint(high_water=100, start_mark=50)
    # Back: runs from 21 are sent again, so their ratings follow them.
    assert rewound(checkpoint, 21).start_mark == 20
    assert rewound(checkpoint, 71).start_mark == 50
    # Forward: runs 101..149 are never sent, so a rating of one would open a trace with nothing else in it.
    assert rewound(checkpoint, 150).start_mark == 149


# -- a batch cut short by a stop ------------------------------------------------


def test_a_batch_cut_short_keeps_the_mark_below_its_first_run_not_sent():
    before = Checkpoint(high_water=10, pending={7: E0}, gaps={9: E0})
    following = before.copy()
    advance(following, [11, 12, 14, 15, 16], now=E0 + 5)  # 13 is a gap
    following.pending.pop(7)
    following.pending[15] = E0 + 5  # still running
    unsent = [run(14), run(16)]
    out = cut(before, following, unsent, now=E0 + 5)
    assert out.high_water == 13  # 11 and 12 went out; 14 did not: the next poll reads it again
    assert out.gaps == {9: E0, 13: E0 + 5}
    assert out.pending == {}  # 15 lies above the mark: read again with 14 and 16
    assert before.high_water == 10 and following.high_water == 16  # neither is changed


def test_a_waiting_run_not_sent_before_the_stop_waits_again_as_it_waited():
    before = Checkpoint(high_water=10, pending={7: E0}, gaps={9: E0 + 1})
    following = before.copy()
    advance(following, [11], now=E0 + 5)
    following.pending.clear()
    following.gaps.clear()
    out = cut(before, following, [run(7), run(9)], now=E0 + 5)
    assert out.high_water == 11  # the new run went out
    assert out.pending == {7: E0, 9: E0 + 1}  # first seen when they were, so their timeouts hold


def test_a_batch_sent_whole_is_not_cut():
    before = Checkpoint(high_water=10)
    following = before.copy()
    advance(following, [11, 12], now=E0)
    assert cut(before, following, [], now=E0) == following
