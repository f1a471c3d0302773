"""A receiver's requested delay, held as a not-before for every next request to it.

A receiver that answers gRPC RESOURCE_EXHAUSTED or UNAVAILABLE with a google.rpc.RetryInfo, or
HTTP 429 or 503 with Retry-After, asks for no request before then: not only no retry of the
request it refused, but no next poll's request, no rating and no probe either. Waiting only
between the attempts of one send sent the next poll's request, and the daemon's probes, within a
second of a request to wait 5 s. One ``Throttle`` per receiver, shared by every sink that sends
to it (the traces and the log records go to one endpoint), holds the time before which nothing
is sent, and every request waits for it.

What a receiver may ask for is capped at ``MAX_THROTTLE_SECONDS``: a wrong clock behind an HTTP
date, or a receiver asking for an hour, must not stop the export without a line saying why.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc

# The longest wait a receiver's RetryInfo or Retry-After is honoured for; a longer one is cut to it.
MAX_THROTTLE_SECONDS = 30.0


class Throttle:
    def __init__(self, on_throttled: Callable[[], None] = lambda: None, cap: float = MAX_THROTTLE_SECONDS):
        self._on_throttled = on_throttled
        self.cap = cap
        self._not_before = 0.0  # time.monotonic()
        self._sending = 0  # sends under way, waiting included
        self._lock = threading.Lock()  # the poll's sends and the daemon's probe share it

    @contextmanager
    def sending(self) -> Iterator[None]:
        """Around a whole send, its waits included: a probe meanwhile would be a second request at once."""
        with self._lock:
            self._sending += 1
        try:
            yield
        finally:
            with self._lock:
                self._sending -= 1

    def may_probe(self) -> str | None:
        """Why a probe must not go now (the receiver's window, or a send under way), or None."""
        with self._lock:
            if (left := self._not_before - time.monotonic()) > 0:
                return f"the receiver asked for no request for {left:.1f}s more"
            return "a request to it is under way" if self._sending else None

    def answered(self, asked: float | None) -> float | None:
        """The receiver throttled a request, asking for ``asked`` seconds (None: it named no delay).
        Counts it, and holds every next request until then, ``cap`` at most. Returns the wait held."""
        self._on_throttled()
        if asked is None:
            return None
        wait = min(max(asked, 0.0), self.cap)
        with self._lock:
            self._not_before = max(self._not_before, time.monotonic() + wait)
        return wait

    def remaining(self) -> float:
        """Seconds until the receiver may be sent a request again; 0 when it may now."""
        return max(self._not_before - time.monotonic(), 0.0)

    def wait(self) -> float:
        """Sleeps until the receiver may be sent a request; returns the seconds waited. A throttle
        answered meanwhile (by another sender) is waited for too."""
        waited = 0.0
        while (left := self.remaining()) > 0:
            time.sleep(left)
            waited += left
        return waited


def grpc_retry_delay(error: grpc.RpcError) -> float | None:
    """The delay in a google.rpc.RetryInfo detail of the call's status, if any."""
    from google.rpc import error_details_pb2, status_pb2

    trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    for key, value in trailers or ():
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                info = error_details_pb2.RetryInfo()
                detail.Unpack(info)
                return info.retry_delay.seconds + info.retry_delay.nanos / 1e9
    return None


def http_retry_delay(header: str | None) -> float | None:
    """Retry-After in seconds, or as an HTTP date."""
    if not header:
        return None
    try:
        return max(float(header), 0.0)
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            return max(parsedate_to_datetime(header).timestamp() - time.time(), 0.0)
        except (TypeError, ValueError):
            return None
