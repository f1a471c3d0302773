"""`backfill --metrics-push URL`: the backfilled runs' metrics sent by Prometheus remote write, with
their original timestamps, to a Prometheus (``--web.enable-remote-write-receiver``), Mimir, Thanos
Receive or VictoriaMetrics.

The requests are snappy-compressed protobuf, sent one at a time in time order while the next one
is encoded. A refusal that another try cannot fix (no receiver at the URL, samples older than the
receiver takes) stops the push with the setting to change; one that can (a timeout, a 5xx, a 429)
is tried again. The first sample is sent before the backfill, so a receiver that would refuse the
history says so before the runs are read.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime

from .. import __version__
from ..source.terminal_text import terminal_safe
from ..telemetry.history import Grid, MetricsHistory
from ..telemetry.remote_write import Request, first_sample, history_series, write_requests

log = logging.getLogger(__name__)

Progress = Callable[[str, int], AbstractContextManager[Callable[[int, str], None]]]

HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
    "User-Agent": f"run-otel/{__version__}",
}
# What a receiver answers for a sample older than it takes: another try gets the same answer.
TOO_OLD = ("out of bounds", "too old", "out of order", "out-of-order", "too far in the past")
ATTEMPTS = 5


class PushError(Exception):
    """The receiver refused the history, or could not be reached."""


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S")


class RemoteWrite:
    """POSTs WriteRequests to one URL; ``headers`` are the user's own (a tenant, a token)."""

    def __init__(self, url: str, headers: Iterable[tuple[str, str]], oldest: float, timeout: float = 60.0):
        import requests

        self.url = url
        self._oldest = oldest
        self._timeout = timeout
        self._session = requests.Session()
        self._session.headers.update({**HEADERS, **dict(headers)})
        self.bytes_sent = 0

    def send(self, request: Request) -> None:
        import cramjam
        import requests

        body = bytes(cramjam.snappy.compress_raw(request.payload))
        for attempt in range(1, ATTEMPTS + 1):
            try:
                reply = self._session.post(self.url, data=body, timeout=self._timeout)
            except requests.RequestException as exc:
                failure = f"no answer from {self.url} ({type(exc).__name__})"
            else:
                if reply.status_code < 300:
                    self.bytes_sent += len(body)
                    return
                failure = self._refusal(reply.status_code, reply.text)
            if attempt == ATTEMPTS:
                raise PushError(f"{failure}, {ATTEMPTS} tries")
            log.warning("metrics push: %s; trying again", failure)
            time.sleep(min(2**attempt, 30))

    def _refusal(self, status: int, text: str) -> str:
        """The message for a refusal; raises at once when another try would be refused the same."""
        said = terminal_safe(text.strip().splitlines()[0][:300] if text.strip() else "")
        if status == 404:
            raise PushError(
                f"{self.url} answered 404: nothing takes remote write there. Prometheus takes it at /api/v1/write "
                "when started with --web.enable-remote-write-receiver"
            )
        if any(marker in said.lower() for marker in TOO_OLD):
            days = math.ceil((time.time() - self._oldest) / 86400) + 1
            raise PushError(
                f"{self.url} refused samples as old as {_when(self._oldest)} UTC ({status}: {said}). Prometheus takes "
                "samples older than its newest only within storage.tsdb.out_of_order_time_window: set it to at least "
                f"{days}d in its config file (storage: tsdb: out_of_order_time_window) and reload it; see "
                "docs/operations.md#metrics-history"
            )
        if status == 429 or status >= 500:
            return f"{self.url} answered {status} ({said})"
        raise PushError(f"{self.url} refused the history ({status}: {said})")

    def close(self) -> None:
        self._session.close()


@dataclass(frozen=True)
class Pushed:
    url: str
    series: int
    samples: int
    requests: int
    bytes: int
    grid: Grid
    seconds: float
    left_to_daemon: int = 0

    def describe(self) -> str:
        first, last = _when(self.grid.first), _when(self.grid.last)
        return (
            f"metrics: {self.series} series x {self.grid.steps + 1} samples ({self.grid.step}s apart), {first} to {last} UTC, "
            f"pushed to {self.url} in {self.requests} requests ({self.bytes / 1e6:,.1f} MB, {self.seconds:.1f}s)\n"
            + (
                f"metrics: {self.left_to_daemon} run(s) left out, counted by the daemon (above its first start's mark, "
                "or taken over in flight)\n"
                if self.left_to_daemon
                else ""
            )
            + f"metrics: the daemon's own samples for these job and instance labels must start after {last} UTC "
            "(docs/operations.md#metrics-history)"
        )


def check_receiver(history: MetricsHistory, url: str, headers: Iterable[tuple[str, str]], job: str, instance: str) -> None:
    """Sends the history's first sample, which the push sends again: a receiver that is away, or
    would refuse samples that old, says so before the backfill reads a run."""
    sender = RemoteWrite(url, headers, history.grid.first)
    try:
        sender.send(first_sample(history, history_series(history, job, instance)))
    finally:
        sender.close()


def push_history(
    history: MetricsHistory, url: str, headers: Iterable[tuple[str, str]], job: str, instance: str, progress: Progress
) -> Pushed:
    started = time.monotonic()
    series = history_series(history, job, instance)
    sender = RemoteWrite(url, headers, history.grid.first)
    total = (history.grid.steps + 1) * len(series)
    sent = {"samples": 0, "requests": 0}
    try:
        with progress(f"metrics push, {history.grid.steps + 1} steps", total) as advance:

            def delivered(request: Request) -> None:
                sent["samples"] += request.samples
                sent["requests"] += 1
                advance(sent["samples"], "samples")

            _send_while_encoding(write_requests(history, series), sender, delivered)
    finally:
        sender.close()
    return Pushed(
        url,
        len(series),
        sent["samples"],
        sent["requests"],
        sender.bytes_sent,
        history.grid,
        time.monotonic() - started,
        history.left_to_daemon,
    )


def _send_while_encoding(requests_: Iterator[Request], sender: RemoteWrite, delivered: Callable[[Request], None]) -> None:
    """Encodes the next request while a thread sends this one; the first failure stops both."""
    pending: queue.Queue[Request | None] = queue.Queue(maxsize=2)
    failure: list[BaseException] = []

    def send_all() -> None:
        try:
            while (request := pending.get()) is not None:
                sender.send(request)
                delivered(request)
        except BaseException as exc:  # handed to the encoding thread, which raises it
            failure.append(exc)
            while pending.get() is not None:  # let the encoder finish putting, then end
                pass

    thread = threading.Thread(target=send_all, name="metrics-push", daemon=True)
    thread.start()
    try:
        for request in requests_:
            if failure:
                break
            pending.put(request)
    finally:
        pending.put(None)
        thread.join()
    if failure:
        raise failure[0]
