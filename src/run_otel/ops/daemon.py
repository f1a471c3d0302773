"""`run-otel run`: the APScheduler loop around a Poller.

Polls never overlap. A failed poll is retried with jittered exponential
backoff, at the time the log line announces. ``/healthz`` fails when a poll
has made no progress for ``poll.stuck_after_seconds``. On SIGTERM no further
request is sent: the one in flight gets ``poll.shutdown_timeout_seconds`` to be
acknowledged, and the runs of the batch acknowledged whole are checkpointed;
past that the process exits 1 without saving, so the batch is re-sent after a restart.

After an export failure the receiver is probed with an empty request every
``poll.interval_seconds``: once a probe that failed succeeds, the receiver is
back, and the poll runs then rather than at the end of a backoff of up to
``poll.retry_max_seconds``. A receiver that answers the first probe failed for
another reason, and the backoff stands.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from .. import __version__
from ..backoff import Backoff
from ..config import Config
from ..export.sinks import ExportError
from ..export.transport import transport_warnings
from ..factory import build_service
from ..pipeline.results import PollResult
from ..pipeline.state_store import StateStoreError
from ..source.password_file import readable_by_others
from ..source.reader import SourceError
from .effective_settings import effective_settings
from .reload import Reloader

if TYPE_CHECKING:
    from apscheduler.schedulers.background import BackgroundScheduler

log = logging.getLogger("run_otel")

EXIT_STOP_TIMEOUT = 1


def summary(result: PollResult) -> str:
    return (
        f"exported {result.run_count} runs ({result.spans} spans); "
        f"{result.pending} pending, {result.gaps} gaps"
        + (f"; receiver rejected {result.rejected_spans} spans" if result.rejected_spans else "")
        + (f"; dropped {result.dropped_spans} spans too large to send" if result.dropped_spans else "")
    )


class _SkipWhilePolling(logging.Filter):
    """APScheduler warns each time it skips a start because the poll outlasted
    poll.interval_seconds: that is how polls never overlap, not a fault."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "maximum number of running instances reached" not in str(record.msg)


class Daemon:
    def __init__(self, config: Config, rng: random.Random | None = None, fresh: Callable[[], Config] | None = None):
        """``fresh`` reads the config again, for SIGHUP; without it the signal re-reads only the password file."""
        self._config = config
        self._reloader = Reloader(config, fresh or (lambda: config))
        poll = config.poll
        self._backoff = Backoff(poll.retry_initial_seconds, poll.retry_max_seconds, rng=rng or random.Random())
        self._stop = threading.Event()
        self._failures = 0
        self._retry_at = 0.0
        self._busy = threading.Lock()  # the interval job and a wake-up never overlap
        self._tick_started: float | None = None
        self._scheduler = None
        self._waiting_for_store = False
        self._feedback_due = 0.0  # time.monotonic() of the next feedback pass
        # Without HA the store is locked for the process's life (from start); with HA, only while the lease is held.
        service = self._service = build_service(config, alive=self.alive, keep_going=self._holding)
        self.store_lock, self.lease = service.store_lock, service.lease
        self.metrics, self.server = service.metrics, service.server
        self.poller, self.feedback, self.orphans = service.poller, service.feedback, service.orphans
        # Probed during an export backoff: the poll's own sink, so its answer is the poll's.
        self._sink = service.parts.sink
        self._receiver_seen_down = False
        self._back = ""  # what the probe found, for the recovery line

    # -- health -------------------------------------------------------------------

    def alive(self) -> tuple[bool, str]:
        """Alive unless a poll has made no progress for poll.stuck_after_seconds."""
        started = self._tick_started
        if started is None:
            return True, "ok"
        quiet = time.monotonic() - max(started, self.poller.progress_at)
        if quiet > self._config.poll.stuck_after_seconds:
            return False, f"wedged: the poll in flight has made no progress for {quiet:.0f}s"
        return True, "ok"

    def _holding(self) -> bool:
        """Whether this instance should poll now: always without HA, else while it holds the lease."""
        if self.lease is None:
            return True
        holding = self.lease.held() and self._store_locked()
        if not holding and self.store_lock.held:
            self.store_lock.release()
        if self.metrics:
            self.metrics.set_standby(not holding)
        return holding

    def _store_locked(self) -> bool:
        """With the lease held: the store too, which an instance without HA (or a `once`) may still hold."""
        try:
            if self.store_lock.held or self.store_lock.acquire():
                self._waiting_for_store = False
                return True
        except StateStoreError as exc:  # the store is away: stand by, like a lost lease
            log.warning("lease held, but %s; standing by", exc)
            return False
        if not self._waiting_for_store:
            log.warning("lease held, but %s; waiting for it", self.store_lock.in_use())
            self._waiting_for_store = True
        return False

    # -- one tick -------------------------------------------------------------------

    def _tick(self, late: bool = True) -> None:
        if not self._busy.acquire(blocking=False):
            return
        self._tick_started = time.monotonic()
        try:
            self._poll_once(late)
        finally:
            self._tick_started = None
            self._busy.release()

    def _poll_once(self, late: bool = True) -> None:
        if time.monotonic() < self._retry_at or self._stop.is_set() or not self._holding():
            return
        try:
            self.store_lock.check()
        except Exception as exc:
            self._failed(exc)
            return
        try:
            result = self.poller.poll(late)  # records its own failure
        except Exception as exc:
            self._failed(exc)
            return
        self._orphan_pass()
        try:
            self._feedback_pass()  # records its own failure
        except Exception as exc:
            self._failed(exc, "feedback pass failed")
            return
        if self._failures:
            log.info("exports recovered after %d failed poll(s)%s; %s", self._failures, self._back, summary(result))
        elif result.run_count:
            log.debug(summary(result))
        self._failures, self._retry_at, self._back = 0, 0.0, ""
        if result.next_settle_at is not None and result.next_settle_at - time.time() < self._config.poll.interval_seconds:
            # A finished run waits out poll.settle_seconds, not a whole extra interval.
            self._wake_at(result.next_settle_at, "settle")

    def _failed(self, exc: Exception, what: str = "poll failed") -> None:
        """Any failure in a tick, known or not: one line, then the next try after a backoff,
        never at once, so a batch whose checkpoint cannot be saved is not re-sent every tick."""
        self._failures += 1
        delay = self._backoff.delay(self._failures)
        self._retry_at = time.monotonic() + delay
        self._wake_at(time.time() + delay, "retry")
        if isinstance(exc, ExportError) and self._scheduler is not None and self._scheduler.get_job("probe") is None:
            self._receiver_seen_down = False
            self._scheduler.add_job(
                self._probe_receiver, "interval", seconds=self._config.poll.interval_seconds, id="probe", max_instances=1
            )
        known = isinstance(exc, (SourceError, ExportError, StateStoreError))
        log.error("%s (%s); retrying in %.1fs", what, exc if known else f"{exc.__class__.__name__}: {exc}", delay)

    def _probe_receiver(self) -> None:
        """During an export backoff: is the receiver back? One empty request, silent when it fails."""
        if not self._failures or self._stop.is_set():
            self._unschedule("probe")
            return
        try:
            self._sink.probe()
        except ExportError:
            self._receiver_seen_down = True
            return
        self._unschedule("probe")
        if self._receiver_seen_down and self._retry_at > time.monotonic():
            # Said once, in the recovery line of the poll this wakes: one line says the receiver is back.
            early = self._retry_at - time.monotonic()
            self._back = f" ({self._sink.describe()} answers again; polled then rather than in {early:.0f}s)"
            self._retry_at = 0.0
            self._wake_at(time.time(), "retry")

    def _unschedule(self, job_id: str) -> None:
        from apscheduler.jobstores.base import JobLookupError

        if self._scheduler is not None:
            try:
                self._scheduler.remove_job(job_id)
            except JobLookupError:  # removed meanwhile
                pass

    def _orphan_pass(self) -> None:
        """After a good poll: tool rows whose run never appeared. It only reads and names them, so a failure
        is a WARNING and the next poll's look, never a failed tick."""
        if self.orphans is None:
            return
        try:
            self.orphans.run()
        except Exception as exc:
            log.warning("the look for tool rows without their run failed (%s); it is tried again after the next poll", exc)

    def _feedback_pass(self) -> None:
        """Every feedback.interval_seconds, after a good poll, in the same tick: never beside a poll.
        A failure is the tick's: nothing was recorded as sent, so the next pass sends it again."""
        if self.feedback is None or time.monotonic() < self._feedback_due or self._stop.is_set():
            return
        self.feedback.run()
        self._feedback_due = time.monotonic() + self._config.feedback.interval_seconds

    def _wake_at(self, at: float, job_id: str) -> None:
        if self._scheduler is None:
            return
        run_date = datetime.fromtimestamp(max(at, time.time()) + 0.05, UTC)
        # A run settling sends that run: the late-row watch waits for the interval's poll.
        late = job_id != "settle"
        self._scheduler.add_job(self._tick, "date", run_date=run_date, id=job_id, replace_existing=True, kwargs={"late": late})

    # -- the loop -------------------------------------------------------------------

    def stop(self, *_args: object) -> None:
        self._stop.set()
        self.poller.stop_requested.set()

    def hangup(self, *_args: object) -> None:
        """SIGHUP: log.level and the password file taken up again (ops/reload.py), and a poll
        backing off after a failure tried at once, since the fix was likely what the signal announces."""
        self._reloader.reload()
        if self._failures:
            self._retry_at = 0.0
            self._wake_at(time.time(), "retry")

    def run_forever(self) -> None:
        from apscheduler.schedulers.background import BackgroundScheduler

        scheduler = self._scheduler = BackgroundScheduler(timezone="UTC")
        logging.getLogger("apscheduler.scheduler").addFilter(_SkipWhilePolling())
        scheduler.add_job(
            self._tick,
            "interval",
            seconds=self._config.poll.interval_seconds,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
            next_run_time=datetime.now(UTC),
        )
        self._service.start()
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        signal.signal(signal.SIGHUP, self.hangup)
        log.info("run-otel %s starting: %s", __version__, effective_settings(self._config))
        for warning in transport_warnings(self._config.export, self._config.export.resolved_endpoint()):
            log.warning(warning)
        if self._config.source.password_file and (exposed := readable_by_others(self._config.source.password_file)):
            log.warning(exposed)
        scheduler.start()
        self._stop.wait()
        self._shutdown(scheduler)

    def _shutdown(self, scheduler: BackgroundScheduler) -> None:
        bound = self._config.poll.shutdown_timeout_seconds
        log.info("stopping: no further request; the one in flight, if any, has %.0fs to be acknowledged", bound)
        scheduler.shutdown(wait=False)
        if not self._busy.acquire(timeout=bound):
            log.error(
                "the batch in flight did not finish within poll.shutdown_timeout_seconds (%.0fs); exiting without "
                "saving its checkpoint: it is re-sent after the restart",
                bound,
            )
            logging.shutdown()
            sys.stderr.flush()
            os._exit(EXIT_STOP_TIMEOUT)
        self._service.stop()
        log.info("stopped")
