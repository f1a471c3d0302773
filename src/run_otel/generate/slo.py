"""The run objective as Prometheus rules: the error ratio recorded over the SRE workbook's windows,
and ``DiagnosisRunErrorBudgetBurn``, its multiwindow, multi-burn-rate alert as Sloth and Pyrra write it.

An error is a finished run that ended FAILED; ``slo.objective`` is the share that must not. A burn
rate of 1 spends the whole budget in ``slo.window_days``. Each alert needs its long window (the
budget really went) and its short one (it is still going), so it fires within minutes of a fast burn
and clears minutes after the burn stops, however long the long window.
"""

from __future__ import annotations

from ..telemetry import instruments as I
from .stack import BURN_RATES, ERROR_WINDOWS, RUNS_DASHBOARD, Stack

ALERT = "DiagnosisRunErrorBudgetBurn"


def error_ratio_record(window: str) -> str:
    """The recorded series: the level (job), the metric and the operation, as Prometheus names recording rules."""
    return f"job:diagnosis_run_errors:ratio_rate{window}"


def error_ratio(stack: Stack, window: str) -> str:
    runs, selector = I.RUNS.prometheus, stack.selector
    failed = f'{runs}{{{selector}, status="FAILED"}}'
    return f"sum by (job) (rate({failed}[{window}])) / sum by (job) (rate({runs}{{{selector}}}[{window}]))"


def _burning(stack: Stack, rate: float, long: str, short: str) -> str:
    bound = f"({rate:g} * {stack.error_budget:g})"
    return (
        f"(\n  {error_ratio_record(long)}{{{stack.selector}}} > {bound}\n"
        f"  and\n  {error_ratio_record(short)}{{{stack.selector}}} > {bound}\n)"
    )


def _burn_alert(stack: Stack, severity: str, service: str) -> dict:
    burns = [b for b in BURN_RATES if b[0] == severity]
    expr = "\nor\n".join(_burning(stack, rate, long, short) for _s, rate, long, short in burns)
    spend = ", ".join(f"{rate:g}x over {long} and {short}" for _s, rate, long, short in burns)
    objective, days = stack.slo.objective, stack.slo.window_days
    return {
        "alert": ALERT,
        "expr": expr,
        "labels": {"severity": severity},
        "annotations": {
            "summary": (
                f"{{{{ $value | humanizePercentage }}}} of diagnosis runs failed: the {days}-day error budget burns too fast"
            ),
            "description": (
                f"The objective is {objective:.4g} of finished runs not FAILED over {days} days, so {stack.error_budget:.4g} "
                f"may fail. The share failing now burns that budget {spend} (at 1x it lasts exactly {days} days). "
                "The summary's share is over the long window that fired. Open the failed runs: TraceQL "
                f'{{ {service} && span.diagnosis.run.status = "FAILED" }}, and the error budget on the runs dashboard.'
            ),
            "runbook_url": stack.runbook_url(ALERT),
            "dashboard_url": stack.dashboard_url(RUNS_DASHBOARD),
        },
    }


def slo_groups(stack: Stack, service: str) -> list[dict]:
    records = [{"record": error_ratio_record(w), "expr": error_ratio(stack, w)} for w in ERROR_WINDOWS]
    alerts = [_burn_alert(stack, severity, service) for severity in ("critical", "warning")]
    return [{"name": "diagnosis-runs-slo", "rules": records + alerts}]
