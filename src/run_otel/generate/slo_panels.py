"""The error budget on the runs dashboard: how much of ``slo.window_days``'s budget is left, and how
fast it burns, from the run counter itself (not the recording rules), so imported history counts."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from ..telemetry import instruments as I
from .dashboard_kit import GREEN, JOB, RED, YELLOW, eq, panel, query, selector, stat_panel, thresholds
from .stack import BURN_RATES, Stack


def _error_ratio(window: str) -> str:
    runs = I.RUNS.prometheus
    # A window with runs but no failure has no FAILED series to sum: that is a ratio of 0, not no data.
    failed = f"(sum(increase({runs}{selector(JOB, eq('status', 'FAILED'))}[{window}])) or vector(0))"
    return f"{failed} / sum(increase({runs}{selector(JOB)}[{window}]))"


def error_budget_panels(board: Dashboard, stack: Stack) -> Dashboard:
    budget, days = stack.error_budget, stack.slo.window_days
    objective = f"{stack.slo.objective:.4g} of finished runs not FAILED over {days} days"
    page = max(rate for _s, rate, _l, _w in BURN_RATES)
    ticket = min(rate for _s, rate, _l, _w in BURN_RATES)
    burn_lines = [query(f"({_error_ratio(w)}) / {budget:g}", f"over {w}") for w in ("1h", "6h", "1d", "3d")]
    return (
        board.with_row(Row("Error budget"))
        .with_panel(
            stat_panel(
                "Error budget remaining",
                "percentunit",
                f"The objective is {objective}, so {budget:g} of them may fail. This is the share of that budget left "
                f"over the last {days} days (below 0: spent). Counted from the run counter, so history imported into "
                "Prometheus counts from the first day.",
                query(f"1 - ({_error_ratio(f'{days}d')}) / {budget:g}"),
                thresholds((0.0, YELLOW), (0.25, GREEN), base=RED),
            )
        )
        .with_panel(
            stat_panel(
                "Burn rate (1h)",
                "short",
                f"How fast the last hour spends the budget: 1 spends it in exactly {days} days. "
                f"DiagnosisRunErrorBudgetBurn pages at {page:g} over 1h and 5m.",
                query(f"({_error_ratio('1h')}) / {budget:g}"),
                thresholds((ticket, YELLOW), (page, RED)),
            )
        )
        .with_panel(
            panel(
                "Error budget burn rate",
                "short",
                "The burn rate over the alert's long windows. DiagnosisRunErrorBudgetBurn pages above "
                f"{page:g} over 1h or 6 over 6h, and opens a ticket above 3 over 1d or {ticket:g} over 3d, "
                "each while its short window agrees.",
                *burn_lines,
            )
        )
    )
