"""The promtool unit tests of ``DiagnosisRunErrorBudgetBurn``: a fast burn pages, a slow one opens a
ticket, a steady rate inside the budget and a short spike stay silent, and a page clears minutes
after the burn stops.

Each case fails a multiple of the error budget (1 - ``slo.objective``), so it means the same for
any objective: 0.8x stays inside, 1.2x tickets, 16x pages. The runs per minute grow with the
objective, 100 for a budget of 5% or more, so a tenth of the budget is still a whole run. A case
whose point the objective rules out (no burn can page when 14.4x the budget is every run) is left out.
"""

from __future__ import annotations

from .slo import ALERT as SLO_ALERT
from .stack import BURN_RATES, Stack

RUNS = 'diagnosis_runs_total{{job="run-otel",instance="a:9464",status="{status}",intent="DIAGNOSIS",release_outcome="{status}"}}'
LABELS = {"job": "run-otel"}
THREE_DAYS = 3 * 24 * 60 + 10
PAGE = max(rate for _s, rate, _l, _w in BURN_RATES)
TICKET = next(rate for severity, rate, long, _w in BURN_RATES if severity == "warning" and long == "1d")


def _runs(success: str, failed: str) -> list[dict]:
    return [
        {"series": RUNS.format(status="SUCCESS"), "values": success},
        {"series": RUNS.format(status="FAILED"), "values": failed},
    ]


def _ramp(start: int, per_minute: int, minutes: int) -> str:
    """promtool's series notation: ``start`` growing by ``per_minute``, ``minutes`` times."""
    return f"{start}+{per_minute}x{minutes}" if per_minute else f"{start}x{minutes}"


def _fired(severity: str, share: float, days: int) -> tuple[dict, str]:
    # As Prometheus' humanizePercentage writes the long window's share.
    summary = f"{share * 100:.4g}% of diagnosis runs failed: the {days}-day error budget burns too fast"
    return {"severity": severity, **LABELS}, summary


def runs_per_minute(budget: float) -> int:
    per_minute = 100
    while budget * per_minute < 5:
        per_minute *= 10
    return per_minute


def slo_scenarios(stack: Stack) -> list[tuple]:
    budget, days = stack.error_budget, stack.slo.window_days
    n = runs_per_minute(budget)

    def failing(times_budget: float) -> int:
        return min(n, round(times_budget * budget * n))

    def steady(failed: int) -> list[dict]:
        return _runs(_ramp(0, n - failed, THREE_DAYS), _ramp(0, failed, THREE_DAYS))

    fast, inside, slow = failing(16), failing(0.8), failing(1.2)
    cases: list[tuple] = [
        # Under the budget for three days: nothing, even on the 3-day window.
        (SLO_ALERT, "steady rate inside the budget", steady(inside), f"{THREE_DAYS - 5}m", []),
        # 1.2x for three days: over 1x on 3d and 6h only: a ticket, no page.
        (SLO_ALERT, "slow burn tickets", steady(slow), f"{THREE_DAYS - 5}m", [_fired("warning", slow / n, days)]),
        _short_spike(n, failing(20)),
    ]
    if PAGE * budget < 1:
        # 16x (or every run) failing for 70 minutes: over 14.4x on 1h and 5m; the slow burns see it too.
        page = [_fired("critical", fast / n, days), _fired("warning", fast / n, days)]
        cases.insert(0, (SLO_ALERT, "fast burn pages", _runs(_ramp(0, n - fast, 90), _ramp(0, fast, 90)), "70m", page))
        clears = _page_clears(n, failing(20), budget, days)
        cases.extend([clears] if clears else [])
    return cases


def _short_spike(n: int, spike: int) -> tuple:
    """Six hours healthy, then 20x the budget (or every run) failing for 6 minutes, looked at 14
    minutes later: over 14.4x on 5m while it lasts, never on 1h, and a drop in the long windows."""
    success = f"{_ramp(0, n, 360)} {_ramp(360 * n + n - spike, n - spike, 5)} {_ramp(360 * n + 6 * (n - spike), n, 30)}"
    failed = f"0x360 {spike}+{spike}x5 {6 * spike}x30"
    return (SLO_ALERT, "short spike", _runs(success, failed), "380m", [])


def _page_clears(n: int, burning: int, budget: float, days: int) -> tuple | None:
    """Six hours healthy, 90 minutes of 20x the budget (or every run) failing, then healthy: 10 minutes
    later the 5m window is clean and the page has cleared, while the day's share holds the ticket."""
    day_share = 90 * burning / (461 * n - burning)  # the 1d window at 462m: every sample so far
    if day_share <= TICKET * budget:
        return None
    success = f"{_ramp(0, n, 360)} {_ramp(360 * n + n - burning, n - burning, 90)} {_ramp(360 * n + 91 * (n - burning), n, 20)}"
    failed = f"0x360 {_ramp(0, burning, 90)} {90 * burning}x20"
    return (SLO_ALERT, "page clears after the burn stops", _runs(success, failed), "462m", [_fired("warning", day_share, days)])


def slo_annotations(rules: dict, severity: str) -> dict:
    """The annotations of the burn rule of that severity: both rules share the alert's name."""
    return next(
        r["annotations"]
        for g in rules["groups"]
        for r in g["rules"]
        if r.get("alert") == SLO_ALERT and r["labels"]["severity"] == severity
    )
