"""Null corpora computed a few at a time, on threads, with the results of a loop.

**Why.** A null corpus of the permutation or rotation test (and each shuffled corpus of the
noise share) is drawn from its own seeded generator and solved apart from the others, and
most of a solve runs outside BLAS: drawing or rotating the counts, their square roots,
sparse format changes, the sampling variances. At m = 4,096 positions and 6e7 stored
counts a rotated corpus took 19.5 s on 2 cores, of which the Gram matrix's BLAS product
was about 4 s; the rest ran on one core. numpy's and scipy's kernels release the GIL, so
two corpora solved at once on threads took 56 s for four where a loop took 78 s
(1.39x), bitwise the same values; on more cores the share outside BLAS, and the gain,
is larger.

**What stays the same.** :func:`in_replicate_order` hands the results back in replicate
order, so the caller's loop body is unchanged: each replicate's arithmetic is its own (its
generator ``default_rng([seed, r])``, its own arrays), and the BLAS used (OpenBLAS's
SYRK) gave the same bits with one or two threads. A decision that depends on earlier
replicates (the rank test's stop once decided,
:mod:`posstats.estimates.permutation`) is taken by ``plan`` when a replicate is started;
a replicate started before an earlier one decided the test is solved anyway and its
extra result ignored by the caller, so the caller's results equal the loop's, at the
cost of at most ``in_flight - 1`` solves. The first null corpus is solved beside one that
is never solved (:func:`first_solve_alone`), so a corpus whose test stops at its first
null corpus (the most likely stop) solves none in vain.

**How many at once** (:func:`replicates_in_flight`): one per core the process may use
(:func:`posstats.geometry.products.product_threads`: ``OMP_NUM_THREADS`` when set, as Ray
sets it), and no more than fit in 80 % of the memory available when the null starts, at
the measured peak of one solve (:func:`replicate_bytes`, an upper figure: the peaks of
solves running together rarely coincide). One at a time runs in the caller's
thread, exactly a loop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from posstats.geometry.products import product_threads
from posstats.memory import available_memory

__all__ = ["REPLICATE_BYTES_PER_STORED_COUNT", "first_solve_alone", "in_replicate_order", "replicate_bytes",
           "replicates_in_flight"]

# The peak of one null corpus' solve above what the process held before it, per stored
# count of the corpus and per (m, m) entry: measured at m = 4,096, 6.03e7 stored counts
# (a rotated corpus: 5.11 GB, of which the (m, m) matrices' share is m^2 x 48 bytes).
REPLICATE_BYTES_PER_STORED_COUNT = 72
_BYTES_PER_DISTANCE = 48  # the distance matrix, its adjustment's (m, m) temporaries
# A shuffle by token (posstats.estimates.permutation.shuffled_rows) holds each token's id
# and row label and their sparse sum: 5.92 GB for 1.86e8 tokens at m = 4,096.
_BYTES_PER_SHUFFLED_TOKEN = 32
_MEMORY_SHARE = 0.8  # of the memory available when the null starts, for the solves in flight


def replicate_bytes(rows: int, stored: int, /, *, shuffled_tokens: int = 0) -> int:
    """Bytes one null corpus of ``rows`` positions and ``stored`` stored counts holds at
    the peak of its solve (its counts, their square roots in two sparse formats, the
    distance matrix and its adjustment's temporaries), or of its shuffle by token when
    ``shuffled_tokens`` tokens are shuffled that way, whichever is larger (module
    docstring).

    >>> round(replicate_bytes(4096, 60_288_259) / 1e9, 1)
    5.1
    >>> round(replicate_bytes(4096, 60_288_259, shuffled_tokens=186_155_348) / 1e9, 1)
    6.0
    """
    solve = REPLICATE_BYTES_PER_STORED_COUNT * int(stored) + _BYTES_PER_DISTANCE * int(rows) ** 2
    return int(max(solve, _BYTES_PER_SHUFFLED_TOKEN * int(shuffled_tokens)))


def replicates_in_flight(per_replicate: int, /, *, replicates: int, available: int | None = None) -> int:
    """How many null corpora are solved at once: at most one per core the process may use,
    ``replicates``, and as many as ``per_replicate`` bytes each fit in 80 % of
    ``available`` (default: :func:`posstats.memory.available_memory` now; unknown: the
    cores decide). At least 1.

    >>> replicates_in_flight(5 * 2**30, replicates=19, available=16 * 2**30) <= 2
    True
    >>> replicates_in_flight(5 * 2**30, replicates=19, available=8 * 2**30)
    1
    """
    cap = min(product_threads(), int(replicates))
    free = available_memory() if available is None else available
    if free is not None and per_replicate > 0:
        cap = min(cap, int(free * _MEMORY_SHARE // int(per_replicate)))
    return max(1, cap)


def in_replicate_order(
    task: Callable[[int, Any], Any],
    count: int,
    /,
    *,
    in_flight: int,
    plan: Callable[[int], Any] = lambda r: None,
    order: Sequence[int] | None = None,
) -> Iterator[tuple[int, Any]]:
    """``(r, task(r, plan(r)))`` for every replicate ``r`` of ``order`` (default ``0 ..
    count - 1``; a permutation of them), in that order, with at most ``in_flight`` tasks
    running at once on threads of their own (module docstring).

    ``plan(r)`` is called in the consumer's thread when replicate r is started: after the
    results of every replicate before it in ``order`` but the last ``in_flight - 1`` have
    been consumed (one at a time: after all before it). A task's exception is raised when
    its result is reached; closing the iterator early cancels the replicates not started
    and waits for the running ones.
    """
    sequence = list(range(count)) if order is None else [int(r) for r in order]
    if sorted(sequence) != list(range(count)):
        msg = f"order must be a permutation of 0..{count - 1}"
        raise ValueError(msg)
    if in_flight <= 1 or count <= 1:
        for r in sequence:
            yield r, task(r, plan(r))
        return
    pool = ThreadPoolExecutor(max_workers=min(int(in_flight), int(count)), thread_name_prefix="posstats-null")
    pending: deque[tuple[int, Future[Any]]] = deque()
    upcoming = iter(sequence)
    try:
        for r in upcoming:
            pending.append((r, pool.submit(task, r, plan(r))))
            if len(pending) == in_flight:
                break
        while pending:
            r, future = pending.popleft()
            yield r, future.result()
            following = next(upcoming, None)
            if following is not None:
                pending.append((following, pool.submit(task, following, plan(following))))
    finally:
        for _, future in pending:
            future.cancel()
        pool.shutdown(wait=True)


def first_solve_alone(solved: int, count: int, /, *, in_flight: int) -> list[int]:
    """The order of ``count`` replicates of which the first ``solved`` may be solved for a
    test that can stop once decided (:mod:`posstats.estimates.permutation`), with
    ``in_flight`` at once: replicate 0, then up to ``in_flight - 1`` of those never solved
    (``solved ..``), then the rest in order. Replicate 0's solve then runs beside
    replicates that never are, and replicate 1 starts only once replicate 0 has decided
    whether it must be solved: a stationary corpus, whose test most often stops at its
    first null corpus, solves no corpus in vain (measured at n = 4,096: two solves at once
    took 28 s, one 20 s).

    >>> first_solve_alone(3, 6, in_flight=2)
    [0, 3, 1, 2, 4, 5]
    >>> first_solve_alone(3, 6, in_flight=4)
    [0, 3, 4, 5, 1, 2]
    >>> first_solve_alone(4, 4, in_flight=2)
    [0, 1, 2, 3]
    """
    if not 0 < solved < count:
        return list(range(count))
    beside = range(solved, min(count, solved + max(1, int(in_flight) - 1)))
    rest = [r for r in range(1, count) if r not in beside]  # a range's membership is arithmetic
    return [0, *beside, *rest]
