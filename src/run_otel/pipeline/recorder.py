"""The ``Recorder``: what the passes over the runs tell the bridge's own telemetry.

The metrics (``telemetry/metrics.py``) and a backfill's history (``telemetry/history.py``)
implement it; the default records nothing, so a pass without metrics needs none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..source.rows import FeedbackRow
from .results import ExportedRun, PollResult


class Recorder:
    """What the poller tells the metrics module. The default records nothing."""

    def runs_exported(self, result: PollResult, acked_at: float) -> None: ...

    def export_failed(self) -> None: ...

    def request_acknowledged(self) -> None:
        """One request of a batch was acknowledged: progress, even while the batch goes on."""

    def request_sending(self, active: bool) -> None:
        """A request went out (True), or its answer or failure is in (False)."""

    def export_throttled(self) -> None:
        """The receiver asked run-otel to slow down (a RetryInfo, a Retry-After, HTTP 429)."""

    def poll_finished(self, seconds: float, ok: bool, pending: int, oldest_pending: float = 0.0, failed: str = "") -> None:
        """``oldest_pending``: seconds the longest-waiting pending run has waited since first seen;
        ``failed``: where a failed poll failed (``poller.failed_part``)."""

    def feedback_failed(self) -> None:
        """A feedback pass failed after a good poll: not ready until a poll and its pass succeed."""

    def row_warnings(self, count: int) -> None: ...

    def backlog(self, runs: int, seconds: float | None) -> None: ...

    def feedback_sent(self, rows: Sequence[FeedbackRow]) -> None: ...

    def late_sent(self, runs: Sequence[ExportedRun]) -> None:
        """Later sends of runs exported before: their late tool rows and late completions."""

    def pending_deleted(self, count: int) -> None: ...

    def clock_offset(self, seconds: float) -> None: ...

    def zone_suspect(self, message: str | None) -> None: ...

    def spans_dropped(self, reason: str, count: int) -> None: ...

    def duplicate_runs(self, count: int) -> None:
        """Later rows with a run id an earlier row has, sent as traces of their own (``duplicates.py``)."""

    def odd_times(self, kind: str, count: int) -> None:
        """Times read by a documented rule rather than as written (``mapping/times.py``), by kind."""

    def orphan_rows(self, count: int) -> None:
        """Tool rows whose run did not appear within ``poll.orphan_wait_seconds`` (``orphans.py``)."""

    def checkpoint_ahead(self, runs: int) -> None: ...


class Tee(Recorder):
    """Tells every recorder given (the live metrics and a backfill's history, say) what happened:
    every Recorder method, so one added later reaches them all."""

    def __init__(self, *recorders: Recorder):
        self._recorders = recorders


def _fan_out(name: str) -> Callable[..., None]:
    def method(self: Tee, *args: Any, **kwargs: Any) -> None:
        for recorder in self._recorders:
            getattr(recorder, name)(*args, **kwargs)

    method.__name__ = name
    return method


for _name, _member in vars(Recorder).items():
    if callable(_member) and not _name.startswith("_"):
        setattr(Tee, _name, _fan_out(_name))
