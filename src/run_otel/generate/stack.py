"""The user's stack as the generated files name it: the scrape job, where the runbook and Grafana
are served, the data source uids, the alert thresholds and the objective.

Built once from the ``[generate]``, ``[slo]`` and ``[feedback]`` sections; every generator takes it,
so the files written for the defaults are the ones this repository commits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..config import FeedbackConfig, GenerateConfig, SloConfig

# The alert windows and holds; the numbers an operator tunes are in [generate] thresholds.
DURATIONS: dict[str, str] = {
    "window": "10m",
    "for": "15m",
    "backlog_window": "15m",
    "backlog_for": "15m",
    "feedback_window": "1h",
    "feedback_for": "30m",
    "stuck_for": "5m",
    # an incomplete run fires for this long after it was sent
    "stuck_window": "1h",
    # the checkpoint above the newest run, held this long: a deleted newest run clears within it
    "ahead_for": "5m",
}

# The SRE workbook's multiwindow, multi-burn-rate table for a 30-day objective, as Sloth and Pyrra
# generate it: (severity, burn rate, long window, short window). 14.4x for an hour spends 2% of a
# 30-day budget, 6x for 6 hours 5%, 3x for a day 10%, 1x for 3 days 10%.
BURN_RATES: tuple[tuple[str, float, str, str], ...] = (
    ("critical", 14.4, "1h", "5m"),
    ("critical", 6.0, "6h", "30m"),
    ("warning", 3.0, "1d", "2h"),
    ("warning", 1.0, "3d", "6h"),
)
ERROR_WINDOWS: tuple[str, ...] = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
# The three dashboards' uids: the alerts, the SLO and the dashboards' own links name them.
HEALTH_DASHBOARD, RUNS_DASHBOARD, RAG_DASHBOARD = "run-otel-health", "run-otel-runs", "run-otel-rag"


@dataclass(frozen=True)
class Stack:
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    negative: tuple[str, ...] = tuple(FeedbackConfig().negative)

    @property
    def job(self) -> str:
        return self.generate.job

    @property
    def selector(self) -> str:
        return f'job="{self.generate.job}"'

    @property
    def thresholds(self) -> dict:
        return {**self.generate.thresholds, **DURATIONS}

    @property
    def error_budget(self) -> float:
        """1 - objective, written as the objective's digits allow (0.05, not 0.050000000000000044)."""
        return float(f"{1 - self.slo.objective:.10g}")

    def runbook_url(self, alert: str) -> str:
        return f"{self.generate.runbook_url}#{alert.lower()}"

    def dashboard_url(self, uid: str) -> str:
        return f"{self.generate.grafana_url.rstrip('/')}/d/{uid}"

    def changed_thresholds(self) -> set[str]:
        """The thresholds set to other values than the built-in ones."""
        defaults = GenerateConfig().thresholds
        return {name for name, value in self.generate.thresholds.items() if value != defaults[name]}


def stack_of(generate: GenerateConfig, slo: SloConfig, feedback: FeedbackConfig) -> Stack:
    return Stack(generate, slo, tuple(feedback.negative))


def warnings(stack: Stack) -> list[str]:
    """Settings that are plausibly wrong for a real stack: the files are written, with these lines."""
    found = []
    if not urlsplit(stack.generate.runbook_url).scheme:
        found.append(
            f"generate.runbook_url is {stack.generate.runbook_url!r}, a relative link: alerts will link to it as is; "
            "set it to where runbook.md is served (e.g. its page on your Git host)"
        )
    if urlsplit(stack.generate.grafana_url).hostname in ("localhost", "127.0.0.1"):
        found.append(
            f"generate.grafana_url is {stack.generate.grafana_url!r}: the alerts' dashboard links open on the "
            "machine of whoever reads them"
        )
    fastest = max(rate for _s, rate, _l, _w in BURN_RATES)
    if fastest * stack.error_budget >= 1:
        found.append(
            f"slo.objective {stack.slo.objective:g} leaves an error budget of {stack.error_budget:g}: "
            f"a {fastest:g}x burn would need more than every run to fail, so the fastest burn can never page"
        )
    return found
