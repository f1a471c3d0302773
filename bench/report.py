"""bench/steady.py's figures: one phase's from its counters and slow-log entries, and the tables."""

from __future__ import annotations

import db_cost as db


def phase_report(label: str, rate: float, seconds: float, before: db.Snapshot, after: db.Snapshot, entries: list) -> dict:
    cost = db.bridge_cost(entries)
    bridge = db.user_delta(before, after, db.BRIDGE_USER)
    writer = db.user_delta(before, after, db.WRITER_USER)
    new_rows = writer["ROWS_INSERTED"]
    polls = max(cost.polls, 1)
    feedback = cost.kinds[db.FEEDBACK]
    return {
        "phase": label,
        "runs_per_s": rate,
        "seconds": seconds,
        "new_rows": new_rows,
        "new_rows_per_s": new_rows / seconds,
        "rows_examined": cost.rows_examined,
        "rows_examined_per_s": cost.rows_examined / seconds,
        "rows_read_userstat_per_s": bridge["ROWS_READ"] / seconds,
        "statements_per_s": cost.statements / seconds,
        "selects_per_s_userstat": bridge["SELECT_COMMANDS"] / seconds,
        "rows_examined_per_new_row": cost.rows_examined / new_rows if new_rows else None,
        "polls": cost.polls,
        "polls_per_s": cost.polls / seconds,
        "kinds": {
            name: {
                "statements": k.statements,
                "rows_examined": k.rows_examined,
                "rows_examined_per_poll": k.rows_examined / polls,
                "full_scans": k.full_scans,
            }
            for name, k in cost.kinds.items()
        },
        "late_watch_rows_per_poll": sum(cost.watch_rows) / polls,
        "late_watch_rows_max_poll": max(cost.watch_rows, default=0),
        "late_watch_runs_max_poll": max(cost.watch_ids, default=0),
        "feedback_passes": feedback.statements,
        "feedback_rows_per_pass": feedback.rows_examined / feedback.statements if feedback.statements else None,
        "full_scans": cost.full_scans,
        "full_scans_by_shape": {s: v["full_scans"] for s, v in cost.shapes.items() if v["full_scans"]},
        # Cross-check: the server's own Select_scan against the slow log's Full_scan, every user.
        "select_scan_global": after.select_scan - before.select_scan,
        "full_scans_slow_log_all_users": sum(e.full_scan for e in entries),
        "shapes": dict(sorted(cost.shapes.items(), key=lambda item: -item[1]["rows_examined"])[:15]),
    }


def _n(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f}×" if value < 100 else f"{value:,.0f}×"


def phase_rows(phases: list[dict]) -> list[tuple[str, list[str]]]:
    kind = lambda name, p: _n(p["kinds"][name]["rows_examined_per_poll"])
    return [
        ("rows examined per second", [_n(p["rows_examined_per_s"]) for p in phases]),
        ("of which the late-row watch, per poll", [_n(p["late_watch_rows_per_poll"]) for p in phases]),
        ("statements per second", [_n(p["statements_per_s"], 1) for p in phases]),
        ("rows examined ÷ new rows", [_ratio(p["rows_examined_per_new_row"]) for p in phases]),
        ("new rows per second (the writer's ROWS_INSERTED)", [_n(p["new_rows_per_s"]) for p in phases]),
        ("ROWS_READ per second (USER_STATISTICS)", [_n(p["rows_read_userstat_per_s"]) for p in phases]),
        ("SELECTs per second (USER_STATISTICS)", [_n(p["selects_per_s_userstat"], 1) for p in phases]),
        ("polls per second", [_n(p["polls_per_s"], 2) for p in phases]),
        (
            "late-row watch: largest poll, rows / runs watched",
            [f"{p['late_watch_rows_max_poll']:,} / {p['late_watch_runs_max_poll']:,}" for p in phases],
        ),
        ("feedback pass, rows examined per poll", [kind(db.FEEDBACK, p) for p in phases]),
        (
            "feedback pass, rows examined per pass (passes)",
            [f"{_n(p['feedback_rows_per_pass'])} ({p['feedback_passes']})" for p in phases],
        ),
        (
            "feedback pass, rows examined per new rating",
            [_n(p["kinds"][db.FEEDBACK]["rows_examined"] / p["new_ratings"]) if p.get("new_ratings") else "—" for p in phases],
        ),
        ("backlog probe, rows examined per poll", [kind(db.BACKLOG, p) for p in phases]),
        ("main poll, rows examined per poll", [kind(db.POLL, p) for p in phases]),
        ("full scans (Full_scan), run-otel, per second", [_n(p["full_scans"] / p["seconds"], 2) for p in phases]),
        (
            "Select_scan / Full_scan in the slow log, all users",
            [f"{p['select_scan_global']:,} / {p['full_scans_slow_log_all_users']:,}" for p in phases],
        ),
        ("spans acknowledged per second", [_n(p["spans_acknowledged_per_s"]) for p in phases]),
    ]


def catchup_rows(results: dict) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    catch, backfill = results.get("catchup"), results.get("backfill")
    for name, one in (("`run-otel backfill` of the same ids", backfill), ("the daemon's catch-up", catch)):
        if one:
            rows.append(
                (
                    name,
                    f"{one['seconds']:.1f} s, {one['spans']:,} spans, {one['spans_per_s']:,.0f} spans/s; rows examined "
                    f"÷ rows exported {one['rows_examined_per_row_exported']:.4f} (ROWS_READ {one['rows_read_userstat']:,}); "
                    f"{one['full_scans']} full scans",
                )
            )
    if catch and backfill:
        pairs = catch.get("vs_backfill_pairs", [catch["vs_backfill"]])
        rows.append(
            (
                "catch-up ÷ backfill, time",
                f"{catch.get('vs_backfill_median', catch['vs_backfill']):.2f}×, the median of {len(pairs)} pairs "
                f"({', '.join(f'{r:.2f}×' for r in pairs)})",
            )
        )
    if catch:
        gauges = catch["gauges"]
        for name in ("run_otel_lag_seconds", "run_otel_backlog_runs"):
            g = gauges[name]
            rows.append(
                (
                    f"`{name}` during the catch-up",
                    f"present in {g['present']} of {gauges['scrapes']} scrapes ({gauges['failed_scrapes']} unanswered); "
                    f"first {_n(g['first'])}, last {_n(g['last'])}, fell: {'yes' if g['fell'] else 'no'}; after the drain: "
                    + (
                        f"{g['after'][1]:,.0f} at {g['after'][0]} s"
                        if g["after"]
                        else f"absent ({gauges['scrapes_after']} scrapes)"
                    ),
                )
            )
    return rows


def print_report(results: dict) -> None:
    phases = results["phases"]
    if phases:
        print("\n| | " + " | ".join(p["phase"] for p in phases) + " |")
        print("|---|" + "---|" * len(phases))
        for name, cells in phase_rows(phases):
            print(f"| {name} | " + " | ".join(cells) + " |")
    rows = catchup_rows(results)
    if rows:
        print("\n| catch-up | |\n|---|---|")
        for name, value in rows:
            print(f"| {name} | {value} |")
