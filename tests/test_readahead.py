"""The backfill's read-ahead: order kept, failures raised where they happened, the thread
stopped whatever the consumer does, and never more than ``depth`` items read ahead."""

from __future__ import annotations

import threading
import time

import pytest
from servers import wait_for

from run_otel.pipeline.readahead import ReadAhead
from run_otel.source.memo import Memo


def test_items_arrive_in_order_and_all_of_them():
    with ReadAhead(iter(range(1000))) as items:
        assert list(items) == list(range(1000))


def test_a_failure_in_the_reader_is_raised_to_the_consumer_after_the_items_before_it():
    def failing():
        yield 1
        yield 2
        raise ConnectionError("database went away")

    seen = []
    with pytest.raises(ConnectionError, match="went away"), ReadAhead(failing()) as items:
        for item in items:
            seen.append(item)
    assert seen == [1, 2]


def test_the_reader_stays_at_most_depth_items_ahead():
    produced: list[int] = []

    def counting():
        for n in range(100):
            produced.append(n)
            yield n

    with ReadAhead(counting(), depth=2) as items:
        iterator = iter(items)
        assert next(iterator) == 0
        # 0 was taken; 1 and 2 wait in the queue; 3 is read and waits for room ...
        wait_for(lambda: len(produced) >= 4, 10, "the reader to fill the queue")
        time.sleep(0.3)  # ... and no further, given ample time to run ahead if it could.
        assert len(produced) == 4


def test_a_consumer_that_fails_stops_the_reader():
    endless_started = threading.Event()

    def endless():
        n = 0
        while True:
            endless_started.set()
            yield n
            n += 1

    reader = ReadAhead(endless())
    with pytest.raises(RuntimeError), reader as items:
        for item in items:
            if item == 5:
                raise RuntimeError("export failed")
    assert endless_started.is_set()
    assert not reader._thread.is_alive()


def test_a_memo_computes_each_value_once_and_forgets_everything_when_full():
    calls: list[str] = []

    def upper(text: str) -> str:
        calls.append(text)
        return text.upper()

    memo = Memo(upper, size=3)
    assert [memo(t) for t in ("a", "b", "a", "c", "b")] == ["A", "B", "A", "C", "B"]
    assert calls == ["a", "b", "c"]
    memo("d")  # the fourth distinct value: the memo starts over
    assert len(memo) == 1
    memo("a")
    assert calls == ["a", "b", "c", "d", "a"]
