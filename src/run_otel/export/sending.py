"""A batch's spans into requests of at most ``export.max_request_bytes``, and what is
done when a receiver still refuses one as too large.

No run stops the pipeline: a run's spans may go out in several requests; a span too
large for any request is cut (see :mod:`limits`). A request the receiver refuses for
its size is never sent again unchanged: it is split in halves, down to single spans;
a single span is cut to half its size, again and again (``cut.py``); and only a span that is too
large even without any attribute is dropped, with a WARNING naming its run and
``run_otel_dropped_spans_total{reason="too_large"}``. The batch then goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from threading import Event

from .cut import cut_span, named
from .encoding import RequestFrame
from .sinks import Ack, Sink, TooLarge
from .wire import RunSpans

log = logging.getLogger(__name__)

# gRPC's default receive limit, which the collector, Jaeger and most receivers keep.
GRPC_DEFAULT_LIMIT = 4 * 1024 * 1024
TOO_LARGE = "too_large"
# A span's frame in the request: a tag and a length of up to 5 bytes.
_FRAME = 6


@dataclass
class Sent:
    rejected: int = 0  # spans the receiver rejected (partial_success)
    dropped: int = 0  # spans run-otel gave up on
    runs: int = 0  # the runs, from the first, each of whose spans is in an acknowledged request


class Interrupted(Exception):
    """A stop was requested between two requests: ``sent.runs`` runs went out whole, the rest not at all or in part."""

    def __init__(self, sent: Sent):
        super().__init__(f"stopped after {sent.runs} run(s) were acknowledged")
        self.sent = sent


# A span in a request: its run's id and its bytes. A plain tuple: one is made for every span sent.
_Item = tuple[str, bytes]


class RequestSender:
    def __init__(
        self,
        sink: Sink,
        frame: RequestFrame,
        max_request_bytes: int,
        list_length: int,
        on_drop: Callable[[str, int], None],
        on_ack: Callable[[], None] = lambda: None,
        on_sending: Callable[[bool], None] = lambda _active: None,
    ):
        self._sink = sink
        self._on_ack = on_ack
        # Told when a request goes out and when its answer (or failure) is in: readiness tells a
        # request in flight from a poll that waits on nothing it sent.
        self._on_sending = on_sending
        self._frame = frame
        self._list_length = list_length
        self._on_drop = on_drop
        # The resource, scope and nesting around the spans, with room for their lengths to grow.
        self._room = max_request_bytes - len(frame.request([])) - 16
        if max_request_bytes > GRPC_DEFAULT_LIMIT:
            log.warning(
                "export.max_request_bytes is %d, above the 4 MiB most receivers accept: a receiver that "
                "refuses a request as too large makes run-otel split it and cut its spans",
                max_request_bytes,
            )

    def send(self, runs: Iterable[RunSpans], stop: Event | None = None) -> Sent:
        """Sends every run's spans; raises ExportError unless each request was acknowledged. Once
        ``stop`` is set, no request is sent: Interrupted says how many runs went out whole."""
        sent = Sent()
        batch: list[_Item] = []
        size = 0
        budget = self._room - _FRAME
        whole = 0  # the runs before this one
        for run in runs:
            lengths = list(map(len, run.encoded))
            whole_run = sum(lengths) + _FRAME * len(lengths)
            if size + whole_run <= self._room:
                # The common case: the run fits beside what the request holds, so each of its spans
                # would be added in turn with no flush and no cut: added at once, without a loop here.
                batch.extend(zip(repeat(run.run_id, len(lengths)), run.encoded))
                size += whole_run
                whole += 1
                continue
            cut = 0
            for encoded in run.encoded:
                if len(encoded) > budget:
                    fitted = cut_span(encoded, budget, self._list_length)
                    if fitted is None:
                        self._drop((run.run_id, encoded), sent, "even its name and status exceed export.max_request_bytes")
                        continue
                    cut += 1
                    encoded = fitted
                if batch and size + len(encoded) + _FRAME > self._room:
                    self._flush(batch, sent, stop, whole)
                    batch, size = [], 0
                batch.append((run.run_id, encoded))
                size += len(encoded) + _FRAME
            if cut:
                log.warning(
                    "run %s: %d of its %d spans were cut to fit export.max_request_bytes; %s on each names what was removed",
                    run.run_id,
                    cut,
                    len(run.encoded),
                    "run_otel.attributes.cut",
                )
            whole += 1
        if batch:
            self._flush(batch, sent, stop, whole)
        sent.runs = whole
        return sent

    def _flush(self, items: list[_Item], sent: Sent, stop: Event | None, whole: int) -> None:
        """Sends one request; once acknowledged, the ``whole`` runs before the current one are sent."""
        if stop is not None and stop.is_set():
            raise Interrupted(sent)
        self._send(items, sent)
        sent.runs = whole

    def _send(self, items: list[_Item], sent: Sent, split: bool = False) -> None:
        request = self._frame.request(list(map(itemgetter(1), items)))
        try:
            ack = self._deliver(request)
        except TooLarge as exc:
            if len(items) == 1:
                self._shrink(items[0], sent, str(exc))
                return
            if not split:  # said once per request, not at every halving
                log.warning(
                    "the receiver refused a request of %d bytes and %d spans as too large (%s); sending it in smaller "
                    "requests: set export.max_request_bytes below the receiver's limit",
                    len(request),
                    len(items),
                    exc,
                )
            half = len(items) // 2
            self._send(items[:half], sent, split=True)
            self._send(items[half:], sent, split=True)
            return
        self._on_ack()
        self._note(ack, len(items))
        sent.rejected += ack.rejected_spans

    def _shrink(self, item: _Item, sent: Sent, why: str) -> None:
        """One span the receiver refused: cut to half its size until it is accepted, or dropped."""
        run_id, encoded_before = item
        budget = len(encoded_before) // 2
        while True:
            encoded = cut_span(encoded_before, budget, self._list_length)
            if encoded is None:
                self._drop(item, sent, f"the receiver refused it as too large even without its attributes ({why})")
                return
            try:
                ack = self._deliver(self._frame.request([encoded]))
            except TooLarge:
                budget = len(encoded) // 2
                continue
            log.warning(
                "run %s: span %s cut from %d to %d bytes: the receiver refused it as too large",
                run_id,
                named(encoded_before),
                len(encoded_before),
                len(encoded),
            )
            self._on_ack()
            self._note(ack, 1)
            sent.rejected += ack.rejected_spans
            return

    def _deliver(self, request: bytes) -> Ack:
        self._on_sending(True)
        try:
            return self._sink.send(request)
        finally:
            self._on_sending(False)

    def _drop(self, item: _Item, sent: Sent, why: str) -> None:
        log.warning("run %s: dropped span %s: %s; the export goes on without it", item[0], named(item[1]), why)
        sent.dropped += 1
        self._on_drop(TOO_LARGE, 1)

    @staticmethod
    def _note(ack: Ack, count: int) -> None:
        if ack.rejected_spans:
            log.warning("receiver rejected %d of %d spans: %s", ack.rejected_spans, count, ack.message or "no reason given")
        elif ack.message:
            # A partial_success with nothing rejected is the receiver's warning: say it, do not count it.
            log.warning("receiver accepted all %d spans with a warning: %s", count, ack.message)
