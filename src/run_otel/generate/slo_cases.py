"""The promtool unit tests of ``DiagnosisRunErrorBudgetBurn``: a fast burn pages, a slow one opens a
ticket, a steady rate inside the budget and a short spike stay silent, and a page clears minutes
after the burn stops. 100 runs a minute throughout; the numbers are for the objective's default 0.95.
"""

from __future__ import annotations

from .slo import ALERT as SLO_ALERT
from .stack import Stack

RUNS = 'diagnosis_runs_total{{job="run-otel",instance="a:9464",status="{status}",intent="DIAGNOSIS",release_outcome="{status}"}}'
LABELS = {"job": "run-otel"}
THREE_DAYS = 3 * 24 * 60 + 10


def _runs(success: str, failed: str) -> list[dict]:
    return [
        {"series": RUNS.format(status="SUCCESS"), "values": success},
        {"series": RUNS.format(status="FAILED"), "values": failed},
    ]


def _steady(failed_per_minute: int) -> list[dict]:
    return _runs(f"0+{100 - failed_per_minute}x{THREE_DAYS}", f"0+{failed_per_minute}x{THREE_DAYS}")


def _fired(severity: str, share: str, days: int) -> tuple[dict, str]:
    return {"severity": severity, **LABELS}, f"{share} of diagnosis runs failed: the {days}-day error budget burns too fast"


def slo_scenarios(stack: Stack) -> list[tuple]:
    """The cases, for the default objective only: another one moves every boundary they sit on."""
    if stack.slo.objective != 0.95:
        return []
    days = stack.slo.window_days
    return [
        # 80% failing for 70 minutes: over 14.4x (72%) on 1h and 5m; the slow burns see it too.
        (
            SLO_ALERT,
            "fast burn pages",
            _runs("0+20x90", "0+80x90"),
            "70m",
            [_fired("critical", "80%", days), _fired("warning", "80%", days)],
        ),
        # 4% failing for three days, under the 5% budget: nothing, even on the 3-day window.
        (SLO_ALERT, "steady rate inside the budget", _steady(4), f"{THREE_DAYS - 5}m", []),
        # 6% for three days: 1.2x, over 1x on 3d and 6h only: a ticket, no page.
        (SLO_ALERT, "slow burn tickets", _steady(6), f"{THREE_DAYS - 5}m", [_fired("warning", "6%", days)]),
        # Six hours healthy, then every run failing for 6 minutes, looked at 14 minutes later.
        (
            SLO_ALERT,
            "short spike",
            _runs("0+100x360 36000x5 36000+100x30", "0x360 100+100x5 600x30"),
            "380m",
            [],
        ),
        # Six hours healthy, 90 minutes of every run failing, then healthy: 10 minutes later the 5m
        # window is clean and the page has cleared; the day's 19.57% still holds the ticket.
        (
            SLO_ALERT,
            "page clears after the burn stops",
            _runs("0+100x360 36000x90 36000+100x20", "0x360 0+100x90 9000x20"),
            "462m",
            [_fired("warning", "19.57%", days)],
        ),
    ]


def slo_annotations(rules: dict, severity: str) -> dict:
    """The annotations of the burn rule of that severity: both rules share the alert's name."""
    return next(
        r["annotations"]
        for g in rules["groups"]
        for r in g["rules"]
        if r.get("alert") == SLO_ALERT and r["labels"]["severity"] == severity
    )
