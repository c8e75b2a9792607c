"""Read ahead: iterate an iterator on a background thread, a few items ahead of its consumer.

Decoding Parquet (pyarrow) and counting (numpy) both release the GIL, so reading the next
batch while the current one is counted overlaps the two: measured at n = 131,072 on
202 M tokens, reading is about a third of ``posstats count``'s time.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["prefetched"]

T = TypeVar("T")
_END = object()


def prefetched(items: Iterable[T], /, *, depth: int = 2) -> Iterator[T]:
    """Yield the items of ``items`` in order, produced on a daemon thread up to ``depth``
    items ahead. An exception raised while producing is re-raised here, at the item where
    it happened; closing this generator early (an error while consuming, ``break``) stops
    the thread and closes ``items`` on it.

    >>> list(prefetched(iter(range(5))))
    [0, 1, 2, 3, 4]
    """
    box: queue.Queue = queue.Queue(maxsize=max(1, int(depth)))
    stop = threading.Event()

    def put(entry: tuple) -> bool:
        while not stop.is_set():
            try:
                box.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        iterator = iter(items)
        try:
            for item in iterator:
                if not put((item, None)):
                    return
            put((_END, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, re-raised there
            put((_END, exc))
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="posstats-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, exc = box.get()
            if item is _END:
                if exc is not None:
                    raise exc
                return
            yield item
    finally:
        stop.set()
        thread.join()
