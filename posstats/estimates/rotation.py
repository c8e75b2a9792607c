"""The rotation null: a test of homogeneity that keeps the dependence inside windows.

**Why.** The permutation null (:mod:`posstats.estimates.permutation`) shuffles tokens
across positions, which is the exact null when tokens are independent. In ``pack`` mode a
window is consecutive text (in ``chunk`` mode too): its nearby tokens are dependent, and
the rows of the counts are correlated. Under that dependence the homogeneity statistic ``S`` has a wider law than
the shuffled corpora give it, and the test rejected 9 of 112 chunks of real packed text
(Shakespeare, n = 16) at its 2.5 % level (docs/calibration.md).

**Null hypothesis.** H0: the windows are cut from a stationary stream at offsets unrelated
to n, so that every position has the same token distribution, with any dependence between
nearby tokens. The windows are counted in K groups of consecutive blocks
(:mod:`posstats.counting.window_groups`). Rotating a group's rows by an offset s moves the
token at stream offset t to position ``(t + s) mod n``: the counts of the same stretches of
stream cut into windows s tokens later, which under H0 have the law of the data's. Each
group gets its own uniform offset, so the null corpora ``sum_g roll(C^g, s_g) + tail``
keep the data's occupancies and pooled counts and every pair of consecutive tokens inside
a block; only the joins between blocks are cut. This is the random toroidal shift of
spatial statistics (Lotwick and Silverman 1982; its asymptotic exactness for stationary
fields: Wi, Kim, Mrkvicka, Mateu and Park 2026, arXiv:2604.27569), on the one-dimensional
torus of a window's positions, one shift per stretch of stream.

**Test.** The same statistic and Monte Carlo p-value as the permutation test (Besag and
Clifford 1989): ``p = (1 + #{r : S_r >= S}) / (R + 1)``; with R = 39 it rejects at 2.5 %
when ``S`` exceeds all 39 rotated corpora. The cut joins (about K of them) make it
slightly liberal where dependence reaches far; measured on real text and on Markov streams
in docs/calibration.md ("The homogeneity test under dependent tokens").

In ``truncate`` mode a window is a document's first n tokens, one window a block: a rotated
window is that document's start turned on itself, with one join cut inside it (its first
and n-th tokens made neighbours), and under H0 (no position of a document special, its
first included) the rotated corpora have the data's law up to that cut. A window of
L < n tokens (a shorter document, or in ``chunk`` mode a document's last window) is turned
within its length: the windows of exactly L tokens form a length class with its own
offset modulo L, which keeps every position's occupancy. With independent tokens (a known
corpus) the test is exact: any rotation of a group's or class's rows keeps their law.

Power: a positional effect tied to the window grid (a planted position, a drift) is moved
to a different place in each group, so the rotated corpora spread it over the positions.
With K groups a rotated corpus still holds about ``1/sqrt(K)`` of the effect's spread, so K
must not be small: with K = 64 a planted effect on Shakespeare chunks was found about as
often as with one rotation per window (docs/calibration.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from posstats.counting.window_groups import WindowGroups
from posstats.estimates.permutation import (
    PermutationNull,
    checked_replicates,
    homogeneity_statistic,
    null_geometry,
    rank_test_open,
)
from posstats.estimates.replicates import (
    first_solve_alone,
    in_replicate_order,
    replicate_bytes,
    replicates_in_flight,
)

__all__ = ["rotated_affinities", "rotated_distances_to_pool", "rotated_statistic", "rotation_null",
           "rotation_null_corpora"]


def rotated_affinities(groups: WindowGroups, shifts: Any, sqrt_pool: Any, /) -> np.ndarray:
    """(n,) ``a_i = sum_v sqrt(C^r_iv) s_v`` of every row of the rotated corpus
    (:meth:`~posstats.counting.window_groups.WindowGroups.rotated`) with ``s = sqrt_pool``
    (V,), without forming it: one pass over the stored entries, a block of rows at a time
    (:meth:`~posstats.counting.window_groups.WindowGroups.rotated_blocks`), memory one block.
    A row of ``N_i`` tokens is at plug-in ``d_H^2 = 2 - 2 a_i / sqrt(N_i)`` from the
    distribution whose square root is ``s``."""
    sqrt_pool = np.asarray(sqrt_pool, dtype=np.float64)
    out = np.zeros(groups.positions)
    roots = None
    for a, b, block in groups.rotated_blocks(shifts):
        if roots is None:
            roots = np.empty(block.shape)  # one buffer for every block's square roots
        root = np.sqrt(block, out=roots[:b - a])
        out[a:b] = np.einsum("iv,v->i", root, sqrt_pool)  # numpy's loop, not BLAS: BLAS threads slow the null's threads
    return out


def rotated_statistic(groups: WindowGroups, shifts: Any, /) -> float:
    """``S`` (:func:`posstats.estimates.permutation.homogeneity_statistic`) of the rotated
    corpus (:meth:`~posstats.counting.window_groups.WindowGroups.rotated`) over all n rows,
    without forming it.

    Rotations keep every row's occupancy ``N_i`` and the pooled distribution ``p``, so
    ``S = sum_i (2 N_i - 2 sqrt(N_i) sum_v sqrt(C_iv) sqrt(p_v))`` needs only each rotated
    row's affinity to the pool (:func:`rotated_affinities`). Every row must be occupied.
    """
    occupancy = groups.occupancy  # computed once per groups: every rotation keeps them
    affinity = rotated_affinities(groups, shifts, np.sqrt(groups.pooled / occupancy.sum()))
    return 2.0 * float(occupancy.sum()) - 2.0 * float(np.sqrt(occupancy) @ affinity)


def rotated_distances_to_pool(groups: WindowGroups, sqrt_pool: Any, /, *, rows: Any = None, replicates: int = 39,
                              seed: int = 0) -> np.ndarray:
    """(R, m) plug-in ``d_H^2`` of the rows ``rows`` (positions; default all n, each occupied)
    of ``replicates`` rotated corpora to the distribution whose square root is ``sqrt_pool``
    (V,): ``2 - 2 a_i / sqrt(N_i)`` (:func:`rotated_affinities`; rotations keep every
    ``N_i``). Replicate r turns the corpus by the offsets of :func:`rotation_null`'s
    replicate r (``numpy.random.default_rng([seed, r])``), a few at once on threads.

    The standout test reads them (:func:`posstats.estimates.standout.standout_test`): under
    H0 a rotated corpus has the data's law, so a row's mean distance over the rotated
    corpora is its expected distance to the pool, documents' own variation included.
    """
    checked_replicates(replicates, null="rotation")
    groups = _shared(groups)
    pick = np.arange(groups.positions) if rows is None else np.asarray(rows, dtype=np.int64)
    root_n = np.sqrt(groups.occupancy[pick])
    if not np.all(root_n > 0):
        msg = "rotated distances to the pool need every row occupied"
        raise ValueError(msg)
    out = np.empty((int(replicates), pick.size))

    def replicate(r: int, _: Any) -> np.ndarray:
        shifts = groups.draw_shifts(np.random.default_rng([seed, r]))
        return 2.0 - 2.0 * rotated_affinities(groups, shifts, sqrt_pool)[pick] / root_n

    in_flight = replicates_in_flight(_STATISTIC_BYTES, replicates=replicates)
    for r, distances in in_replicate_order(replicate, replicates, in_flight=in_flight):
        out[r] = distances
    return out


def _rotated_bytes(groups: WindowGroups, stored: int | None, /) -> int:
    """The peak bytes of one rotated corpus of about ``stored`` stored counts formed and
    solved (:func:`posstats.estimates.replicates.replicate_bytes`), or with ``stored``
    None of its statistic alone: a block of the rotation at a time (0.07 GB measured at
    n = 4,096, V = 50,257)."""
    if stored is None:
        return _STATISTIC_BYTES
    return replicate_bytes(groups.positions, stored)


_STATISTIC_BYTES = 1 << 28  # one rotated corpus' statistic without forming it (rotated_statistic)


def _shared(groups: WindowGroups, /) -> WindowGroups:
    """``groups`` with its cached arrays computed, before threads share them (two threads'
    first reads would each build them)."""
    for name in ("occupancy", "pooled", "_held_classes"):
        getattr(groups, name)
    return groups


def rotation_null(
    groups: WindowGroups,
    /,
    *,
    rows: Any = None,
    replicates: int = 39,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """(R,) homogeneity statistics ``S`` of ``replicates`` rotated corpora (module docstring).

    Args:
        groups: the counts by window group.
        rows: the positions (row indices of the (n, V) counts) the statistic is computed
            on, as for the data (default all); each must be occupied.
        replicates: R.
        seed: replicate r draws its offsets from ``numpy.random.default_rng([seed, r])``
            (:meth:`~posstats.counting.window_groups.WindowGroups.draw_shifts`).
        progress: called with 1 after each replicate.

    Returns:
        (R,) float64: ``S`` of each rotated corpus, to compare with the data's
        (:func:`posstats.estimates.permutation.monte_carlo_p_value`).
    """
    checked_replicates(replicates, null="rotation")
    groups = _shared(groups)
    out = np.empty(replicates)
    every_row = rows is None or np.array_equal(np.asarray(rows), np.arange(groups.positions))

    def replicate(r: int, _: Any) -> float:
        shifts = groups.draw_shifts(np.random.default_rng([seed, r]))
        if every_row:
            return rotated_statistic(groups, shifts)
        return homogeneity_statistic(groups.rotated(shifts)[np.asarray(rows)])  # a subset of rows: its own pool

    in_flight = replicates_in_flight(_rotated_bytes(groups, None if every_row else groups.matrix.nnz),
                                     replicates=replicates)
    for r, statistic in in_replicate_order(replicate, replicates, in_flight=in_flight):
        out[r] = statistic
        if progress is not None:
            progress(1)
    return out


def rotation_null_corpora(
    groups: WindowGroups,
    data_rows: Any,
    /,
    *,
    rows: Any = None,
    replicates: int = 39,
    eigen_replicates: int | None = None,
    corrected: bool = False,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    shrinkage: Any = None,
    weights: Any = None,
    stop_at: float | None = None,
    statistics: Any = None,
) -> PermutationNull:
    """The rotation counterpart of :func:`posstats.estimates.permutation.permutation_null`:
    R rotated corpora and, from them, the homogeneity statistic of each and, for the first
    ``eigen_replicates``, the top eigenvalue of its MDS Gram matrix and its distance sum
    (:func:`posstats.estimates.permutation.null_geometry`), so that the rank test too
    compares the data with corpora that keep the dependence inside windows (dependence
    between nearby positions gives the shuffled corpora no such structure, and the rank
    test against them finds "components" in every dependent stream: docs/calibration.md).

    Args:
        groups: the counts by window group.
        data_rows: (m, V) the data's geometry rows (their ``S`` is the observed statistic).
        rows: the positions ``data_rows`` are (default all n).
        replicates, seed, progress: as :func:`rotation_null` (the same offsets).
        eigen_replicates: how many of them also give the top eigenvalue and distance sum
            (default all).
        corrected: eigenvalues on the bias-corrected scale.
        shrinkage, weights: as :func:`posstats.estimates.permutation.null_geometry`
            (rotated corpora keep every occupancy and the pooled counts, so they share the
            data's).
        stop_at: the data's largest tested eigenvalue: once a rotated corpus' top
            eigenvalue reaches it, the rank test counts no component whatever the others
            give, so no further corpus gets an eigenvalue or a distance sum (their
            homogeneity statistics are still computed; :mod:`posstats.estimates.permutation`,
            "Stopping once decided"). None: all ``eigen_replicates`` are solved.
        statistics: (R,) the homogeneity statistics of these rotated corpora, known
            already (the standout test's rotated distances to the pool, every row:
            ``S_r = sum_i N_i d_i^(r)``); replicates not solved take theirs from it instead
            of a pass over the stored counts. None: each is computed.

    Returns:
        A :class:`~posstats.estimates.permutation.PermutationNull` whose null corpora are
        the rotated ones (``eigen_planned`` set when it stopped early).
    """
    eigen = checked_replicates(replicates, eigen_replicates, null="rotation")
    groups = _shared(groups)
    every_row = rows is None or np.array_equal(np.asarray(rows), np.arange(groups.positions))
    s_null, top, sums = np.empty(replicates), np.empty(eigen), np.empty(eigen)
    solved = 0
    known = None if statistics is None else np.asarray(statistics, dtype=np.float64).ravel()
    if known is not None and known.size != replicates:
        msg = f"statistics must hold one value per replicate ({replicates}), got {known.size}"
        raise ValueError(msg)

    def open_at(r: int) -> bool:
        """Replicate r is solved in a loop: the rank test is not decided by those before it."""
        return r < eigen and rank_test_open(top[:solved], stop_at)

    def replicate(r: int, solve: bool) -> tuple[float, tuple[float, float] | None]:
        shifts = groups.draw_shifts(np.random.default_rng([seed, r]))
        if every_row and not solve:
            return (float(known[r]) if known is not None else rotated_statistic(groups, shifts)), None
        rotated = groups.rotated(shifts)
        rotated = rotated if every_row else rotated[np.asarray(rows)]
        geometry = null_geometry(rotated, corrected=corrected, shrinkage=shrinkage, weights=weights) if solve else None
        return homogeneity_statistic(rotated), geometry

    # a few replicates at once (posstats.estimates.replicates); the results are the loop's
    stored = sp.csr_array(data_rows).nnz if sp.issparse(data_rows) else int(np.count_nonzero(data_rows))
    in_flight = replicates_in_flight(_rotated_bytes(groups, stored), replicates=replicates)  # eigen >= 1 solve
    # no solve in vain at the most likely stop, the first null corpus
    order = first_solve_alone(eigen, replicates, in_flight=in_flight) if stop_at is not None else None
    for r, (statistic, geometry) in in_replicate_order(replicate, replicates, in_flight=in_flight, plan=open_at,
                                                           order=order):
        if geometry is not None and not open_at(r):  # started before the test was decided: not counted,
            statistic = replicate(r, False)[0]  # and its statistic the loop's (one pass, not the formed corpus)
            geometry = None
        s_null[r] = statistic
        if geometry is not None:
            top[r], sums[r] = geometry
            solved += 1
        if progress is not None:
            progress(1)
    return PermutationNull(int(replicates), homogeneity_statistic(data_rows), s_null, top[:solved], bool(corrected),
                           sums[:solved], eigen_planned=eigen if solved < eigen else None)
