"""Read-ahead of batches on a background thread: order, errors, early stop."""

from __future__ import annotations

import threading
import time

import pytest

from posstats.corpus.prefetch import prefetched
from posstats.errors import InputError


def test_items_come_in_order_and_run_ahead_on_another_thread():
    producers = []

    def items():
        for i in range(20):
            producers.append(threading.current_thread().name)
            yield i

    assert list(prefetched(items(), depth=3)) == list(range(20))
    assert set(producers) == {"posstats-prefetch"}


def test_an_error_while_producing_is_raised_at_its_item():
    def items():
        yield 1
        yield 2
        raise InputError("corpus.parquet: row 7: negative token id: -3")

    got = []
    with pytest.raises(InputError, match="row 7"):
        for item in prefetched(items()):
            got.append(item)
    assert got == [1, 2]


def test_stopping_early_closes_the_source_and_ends_the_thread():
    closed = threading.Event()

    def items():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    before = threading.active_count()
    stream = prefetched(items(), depth=2)
    assert next(stream) == 0
    stream.close()
    assert closed.wait(5)
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before


def test_an_error_while_consuming_stops_the_producer():
    produced = []

    def items():
        for i in range(1000):
            produced.append(i)
            yield i

    with pytest.raises(ValueError, match="bad batch"):
        for item in prefetched(items(), depth=2):
            if item == 3:
                raise ValueError("bad batch")
    assert len(produced) <= 3 + 1 + 2 + 1  # the items consumed, the queue, one in hand
