"""Null corpora solved a few at a time (posstats.estimates.replicates): the results, their
order and every decision are the loop's, whatever the number of threads."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import scipy.sparse as sp

from posstats.estimates import replicates
from posstats.estimates.permutation import (
    null_distance_sums,
    permutation_null,
    top_eigenvalue,
)
from posstats.estimates.replicates import (
    first_solve_alone,
    in_replicate_order,
    replicate_bytes,
    replicates_in_flight,
)
from posstats.estimates.rotation import rotation_null, rotation_null_corpora
from posstats.testing import known_corpus


def _slow_square(r: int, planned: object) -> tuple[int, object]:
    """Later replicates finish first (so order can only come from the consumer)."""
    time.sleep(0.002 * (8 - r % 8))
    return r * r, planned


@pytest.mark.parametrize("in_flight", [1, 2, 5])
def test_results_come_in_replicate_order_with_the_plan_of_their_start(in_flight):
    consumed: list[int] = []
    seen_at_start: dict[int, int] = {}

    def plan(r: int) -> int:
        assert threading.current_thread() is threading.main_thread()  # the consumer's thread
        seen_at_start[r] = len(consumed)
        return -r

    out = []
    for r, result in in_replicate_order(_slow_square, 17, in_flight=in_flight, plan=plan):
        consumed.append(r)
        out.append((r, result))
    assert out == [(r, (r * r, -r)) for r in range(17)]
    for r, seen in seen_at_start.items():
        # replicate r starts once every result before r - in_flight + 1 is consumed (a loop: all before r)
        assert seen == max(0, r - in_flight + 1)


@pytest.mark.parametrize("in_flight", [1, 2, 4])
def test_a_test_stopped_by_its_first_null_corpus_solves_no_other(in_flight):
    """The order of :func:`first_solve_alone`: replicate 0 is solved beside one that never
    is, so when replicate 0 decides the test no other solve has started; the results still
    come back in that order, every replicate once."""
    stopped: list[bool] = []
    solves: list[int] = []
    lock = threading.Lock()

    def task(r: int, solve: bool) -> int:
        if solve:
            with lock:
                solves.append(r)
        return r

    order = first_solve_alone(6, 15, in_flight=in_flight)
    head = [0, *range(6, 6 + max(1, in_flight - 1)), 1]  # replicate 0 beside never-solved ones
    assert order[:len(head)] == head and sorted(order) == list(range(15))
    got = []
    for r, result in in_replicate_order(task, 15, in_flight=in_flight, order=order,
                                        plan=lambda r: r < 6 and not stopped):
        got.append(result)
        if r == 0:
            stopped.append(True)  # replicate 0's null corpus reached the data's top eigenvalue
    assert got == order and solves == [0]
    with pytest.raises(ValueError, match="permutation of 0..3"):
        list(in_replicate_order(task, 4, in_flight=2, order=[0, 1, 1, 3]))


def test_an_error_is_raised_at_its_replicate_and_nothing_more_starts():
    started: list[int] = []
    lock = threading.Lock()

    def task(r: int, _: object) -> int:
        with lock:
            started.append(r)
        if r == 3:
            msg = "replicate 3 failed"
            raise ValueError(msg)
        return r

    got = []
    with pytest.raises(ValueError, match="replicate 3 failed"):
        for r, result in in_replicate_order(task, 50, in_flight=3):
            got.append(result)
    assert got == [0, 1, 2]
    assert max(started) <= 3 + 2  # at most in_flight - 1 started after it, none once it was raised


def test_how_many_at_once_follows_cores_memory_and_replicates(monkeypatch):
    monkeypatch.setattr(replicates, "product_threads", lambda: 8)
    gib = 2**30
    assert replicates_in_flight(5 * gib, replicates=19, available=100 * gib) == 8  # the cores
    assert replicates_in_flight(5 * gib, replicates=3, available=100 * gib) == 3  # the replicates
    assert replicates_in_flight(5 * gib, replicates=19, available=20 * gib) == 3  # 80 % of 20 GiB: 3 of 5 GiB
    assert replicates_in_flight(5 * gib, replicates=19, available=4 * gib) == 1  # always one
    monkeypatch.setattr(replicates, "available_memory", lambda: None)
    assert replicates_in_flight(5 * gib, replicates=19) == 8  # memory unknown: the cores decide
    # the measured peak of a rotated corpus at m = 4,096 (5.11 GB) and of a shuffle by token (5.92 GB)
    assert 5.0e9 < replicate_bytes(4096, 60_288_259) < 5.3e9
    assert 5.9e9 < replicate_bytes(4096, 60_288_259, shuffled_tokens=186_155_348) < 6.1e9


def _nulls(rows, corpus, top):
    """Every null of the permutation and rotation tests on one corpus, with and without a stop."""
    return {
        "shuffled": permutation_null(rows, replicates=9, eigen_replicates=6, corrected=True, seed=4),
        "shuffled_stopped": permutation_null(rows, replicates=9, eigen_replicates=6, corrected=True, seed=4,
                                             stop_at=top),
        "rotated": rotation_null_corpora(corpus.window_groups, rows, replicates=9, eigen_replicates=6,
                                         corrected=True, seed=4),
        "rotated_stopped": rotation_null_corpora(corpus.window_groups, rows, replicates=9, eigen_replicates=6,
                                                 corrected=True, seed=4, stop_at=top),
        "sums": null_distance_sums(rows, replicates=5, corrected=True, seed=4, max_rows=20),
        "rotation_statistics": rotation_null(corpus.window_groups, replicates=7, seed=4),
    }


def test_every_null_on_threads_equals_the_loop_bit_for_bit(monkeypatch):
    """One thread (the loop) against four: the same statistics, eigenvalues and distance
    sums, the same corpora solved before the stop, on stationary corpora (which stop early)
    and a planted one (which solves all)."""
    stops = 0
    for kind, seed in [("stationary", 0), ("stationary", 1), ("planted", 0)]:
        corpus = known_corpus(kind, 32, tokens=800, seed=seed, window_groups=16)
        rows = sp.csr_array(corpus.counts.matrix)
        top = top_eigenvalue(rows, corrected=True)
        monkeypatch.setattr(replicates, "product_threads", lambda: 1)
        loop = _nulls(rows, corpus, top)
        monkeypatch.setattr(replicates, "product_threads", lambda: 4)
        threaded = _nulls(rows, corpus, top)
        for name, a in loop.items():
            b = threaded[name]
            if isinstance(a, np.ndarray):
                np.testing.assert_array_equal(a, b, err_msg=name)
                continue
            for field in ("null_homogeneity", "null_top_eigenvalues", "null_distance_sums"):
                np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=f"{name}.{field}")
            assert (a.eigen_planned, a.homogeneity) == (b.eigen_planned, b.homogeneity), name
        stops += loop["shuffled_stopped"].eigen_planned is not None
        if kind == "planted":  # the data's top above every null corpus: all solved, threads or not
            assert threaded["rotated_stopped"].null_top_eigenvalues.size == 6
    assert stops >= 1  # the stop was exercised on threads (started replicates past it ignored)


def _without_seconds(entries):
    """Report entries with their wall-clock fields dropped (the only values allowed to differ)."""
    return [{k: ({f: v for f, v in val.items() if f != "seconds"} if isinstance(val, dict) else val)
             for k, val in e.items()} for e in entries]


def test_encodings_scored_on_threads_equal_the_loop(monkeypatch):
    """The exact path scores its encodings a few at a time on threads: every entry (stress,
    separation, monotonicity, SMACOF's fit) equals the loop's, in the same order."""
    from posstats import analyze
    from posstats.analysis import exact
    from posstats.analysis.config import AnalysisConfig

    corpus = known_corpus("planted", 48, tokens=600, seed=3)
    config = AnalysisConfig(dims=(2, 8), encodings=("mds", "mds-smacof", "sinusoidal", "rope", "random"),
                            held_out="off")
    monkeypatch.setattr(replicates, "product_threads", lambda: 1)
    assert exact._encodings_in_flight(10) == 1
    loop = analyze(corpus.counts, config).report()["encodings"]
    monkeypatch.setattr(replicates, "product_threads", lambda: 4)
    assert exact._encodings_in_flight(10) == 4
    threaded = analyze(corpus.counts, config).report()["encodings"]
    assert [(e["name"], e["dim"]) for e in loop] == [(e["name"], e["dim"]) for e in threaded]
    assert len(loop) == 10
    assert _without_seconds(loop) == _without_seconds(threaded)
