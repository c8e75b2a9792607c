"""The standout test: which positions stand out from the pooled distribution of all
positions, with a family-wise error of 2.5 % on a stationary corpus (one of the two
tests of :mod:`posstats.estimates.verdict`).

:func:`standout_positions`: position i's plug-in squared distance to the pooled distribution
``p`` of all geometry rows, ``d_i = d_H^2(mu_hat_i, p)``, against what a sample of the same
``N_i`` tokens drawn from ``p`` itself would give (:func:`null_distance_to_pool`: Poisson
moments of ``sqrt X``, series for small ``N p_v``, expansions above 50, the variance
conditioned on the sample's size). In the sparse regime that expectation is far above 0
(most tokens are unseen): comparing with it, not with 0, is what keeps noise from standing
out. The pool leaves out the most extreme positions (normal ``z_i = (d_i - E d) / sd`` above
the threshold and above half the largest new z) and the test is repeated until no new
position stands out (at most 32 rounds): a few very different positions (say the first
tokens of every document) would otherwise shift the pool and make every other position
differ from it. A position then stands out when its *calibrated* z, ``Phi^-1(1 - P_null(d >=
d_i))`` with the tail from a conditional saddlepoint (:mod:`posstats.estimates.saddlepoint`;
the normal tail is several times too light where it is read; tabulated, and solved per row
within [-0.5, +1] of the threshold), exceeds ``max(5, Phi^-1(1 - 0.025 / m))``: a Bonferroni
bound over the m positions, never below 5. Reported whatever the rank test says.

**Documents that differ.** The null above treats the pool as the law every position draws
from. Where documents differ from each other (real text: lists, dialogue, ASCII art) and
positions are reached by different numbers of documents (truncate mode, documents shorter
than n), the pool is not that: each position holds one token per document that reaches it,
while the pool weights a document by its length, so the longest few documents move it. With
document laws ``u_d`` of variance ``sigma^2`` around their mean, a position reached by every
one of D documents differs from the pool by an extra ``sigma^2 (1 / D_eff - 2 / D)`` in
expectation (``D_eff = (sum L_d)^2 / sum L_d^2``, the pool's effective number of documents),
and a deep position, reached only by long documents, is closer to it than the null says. On
corpora with no positional structure resampled from the bundled fortunes (each document one
fortune's law and another's length: :func:`posstats.testing.resampled_documents`), the test
named standouts, the shallowest positions, in 5 of 20 corpora at n = 256 and 12 of 20 at
n = 512. Where the corpus' windows can be rotated (:mod:`posstats.estimates.rotation`: the
window groups of ``posstats count``, up to 4,096 positions), R rotated corpora, which under
H0 have the data's law, measure that excess row by row: ``offset_i = mean_r d_i^(r) - E d_i``
(:func:`rotated_offset`), subtracted from ``d_i`` in every round, with the null's sd widened
by ``sqrt(1 + 1/R)`` for the mean of R draws. Structure at a position is moved by the
rotations, not kept, so its offset stays near the documents' (the fortunes' openings keep
z = 80-86). Where no window can be rotated but the counts keep their windows' two halves
(above 4,096 positions, in one process or in ranges held apart), the excess is modelled and
fitted to the halves instead (:mod:`posstats.estimates.document_excess`; lengths x16 at
n = 8,192: 583-660 standouts in 3 of 3 null corpora before, none after); its positive part
is subtracted and the sd widened by half of it (:func:`modelled_offset`). Counts without
window groups keep the test as before (docs/calibration.md, "Documents that differ").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.special import gammaln, ndtri

from posstats.counting.rows import row_blocks
from posstats.estimates.document_excess import MODEL_SPREAD
from posstats.estimates.saddlepoint import calibrated_z, solved_near

__all__ = [
    "FAMILY_LEVEL",
    "STANDOUT_Z",
    "THIN_SOLVED",
    "distance_to_pool",
    "modelled_offset",
    "null_distance_to_pool",
    "position_ranges",
    "rotated_offset",
    "standout_positions",
    "standout_test",
    "standout_threshold",
]

_LISTED = 64  # positions listed in the report (all are counted)


_BLOCK = 1 << 22  # stored entries handled at a time: no temporary of the matrix' size


def _row_totals(rows: Any) -> tuple[Any, np.ndarray]:
    """(rows as canonical CSR or a float ndarray, (m,) occupancies)."""
    if sp.issparse(rows):
        c = sp.csr_array(rows)
        occ = np.zeros(c.shape[0])
        for lo, hi in row_blocks(c.indptr, _BLOCK):
            a, b = int(c.indptr[lo]), int(c.indptr[hi])
            # by row number, not reduceat: reduceat fails on empty rows at a block's end
            row_of = np.repeat(np.arange(hi - lo), np.diff(c.indptr[lo : hi + 1]))
            occ[lo:hi] = np.bincount(row_of, weights=c.data[a:b].astype(np.float64), minlength=hi - lo)
        return c, occ
    c = np.asarray(rows, dtype=np.float64)
    return c, c.sum(axis=1)


def _pooled_totals(c: Any, keep: np.ndarray) -> np.ndarray:
    """(V,) tokens per vocabulary entry over the rows ``keep`` (bool (m,))."""
    if sp.issparse(c):
        totals = np.zeros(c.shape[1])
        for lo, hi in row_blocks(c.indptr, _BLOCK):
            a, b = int(c.indptr[lo]), int(c.indptr[hi])
            w = np.repeat(keep[lo:hi], np.diff(c.indptr[lo : hi + 1]))
            totals += np.bincount(c.indices[a:b][w], weights=c.data[a:b][w], minlength=c.shape[1])
        return totals
    return c[keep].sum(axis=0)


def _pool_sqrt(c: Any, keep: np.ndarray) -> np.ndarray:
    """(V,) ``sqrt(p)`` of the distribution pooled over the rows ``keep`` (bool (m,))."""
    totals = _pooled_totals(c, keep)
    return np.sqrt(totals / max(float(totals.sum()), 1.0))


def _distance_to(c: Any, occ: np.ndarray, s_pool: np.ndarray) -> np.ndarray:
    """(m,) ``2 - 2 sum_v sqrt(C_iv / occ_i) s_pool[v]``, clipped at 0."""
    if not sp.issparse(c):
        dots = np.sqrt(c / occ[:, None]) @ s_pool
    else:
        dots = np.zeros(c.shape[0])
        for lo, hi in row_blocks(c.indptr, _BLOCK):
            a, b = int(c.indptr[lo]), int(c.indptr[hi])
            lengths = np.diff(c.indptr[lo : hi + 1])
            w = np.sqrt(c.data[a:b] / np.repeat(occ[lo:hi], lengths)) * s_pool[c.indices[a:b]]
            dots[lo:hi] = np.bincount(np.repeat(np.arange(hi - lo), lengths), weights=w, minlength=hi - lo)
    return np.maximum(2.0 - 2.0 * dots, 0.0)


def distance_to_pool(rows: Any, /, *, keep: Any = None) -> np.ndarray:
    """(m,) plug-in ``d_H^2(mu_i, p) = 2 - 2 sum_v sqrt(C_iv / occ_i) sqrt(p_v)`` of every row
    to the distribution ``p`` pooled over the rows ``keep`` (bool (m,); default all).
    Rows must be occupied."""
    c, occ = _row_totals(rows)
    keep = np.ones(c.shape[0], dtype=bool) if keep is None else np.asarray(keep, dtype=bool)
    return _distance_to(c, occ, _pool_sqrt(c, keep))


def position_ranges(positions: Any, /) -> str:
    """Sorted positions as compact ranges.

    >>> position_ranges([0, 1, 2, 3, 7, 9, 10])
    '0-3, 7, 9-10'
    """
    p = np.unique(np.asarray(positions, dtype=np.int64))
    if not p.size:
        return ""
    breaks = np.flatnonzero(np.diff(p) != 1)
    starts = np.concatenate([[p[0]], p[breaks + 1]])
    stops = np.concatenate([p[breaks], [p[-1]]])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in zip(starts.tolist(), stops.tolist()))


_POOL_ROUNDS = 32  # the pool leaves out the positions that stand out, the most extreme first, until none is new
_SERIES_LIMIT = 50.0  # Poisson means above this use the asymptotic expansions
STANDOUT_Z = 5.0  # the smallest z a standout needs, whatever the number of positions
THIN_SOLVED = 64.0  # rows of at most this many tokens near or above the threshold get their own saddlepoint solve
FAMILY_LEVEL = 0.025  # family-wise level of the standout test (the homogeneity test has the other 2.5 %)


def standout_threshold(m: int, /) -> float:
    """The z a position needs to stand out among ``m``: ``max(5, Phi^-1(1 - 0.025 / m))``.

    >>> round(standout_threshold(64), 3), round(standout_threshold(131_072), 3)
    (5.0, 5.078)
    """
    return max(STANDOUT_Z, float(-ndtri(FAMILY_LEVEL / max(int(m), 1))))


def _sqrt_poisson_moments(lam: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(E sqrt X, Var sqrt X, Cov(sqrt X, X))`` for ``X ~ Poisson(lam)``, elementwise: the
    series below :data:`_SERIES_LIMIT`, else the expansions to second order,
    ``sqrt(lam) (1 - 1/(8 lam) - 7/(128 lam^2))``, ``1/4 + 3/(32 lam)`` and
    ``sqrt(lam) / 2 + 1 / (16 sqrt(lam))``.

    >>> m, v, c = _sqrt_poisson_moments(np.array([0.0, 1.0, 400.0]))
    >>> m.round(4).tolist(), v.round(4).tolist(), c.round(4).tolist()
    ([0.0, 0.7732, 19.9937], [0.0, 0.4022, 0.2502], [0.0, 0.5995, 10.0031])
    """
    lam = np.asarray(lam, dtype=np.float64)
    mean, var, cov = np.zeros(lam.shape), np.zeros(lam.shape), np.zeros(lam.shape)
    big = lam > _SERIES_LIMIT
    lb = lam[big]
    mean[big] = np.sqrt(lb) * (1.0 - 1.0 / (8.0 * lb) - 7.0 / (128.0 * lb**2))
    var[big] = 0.25 + 3.0 / (32.0 * lb)
    cov[big] = 0.5 * np.sqrt(lb) + 1.0 / (16.0 * np.sqrt(lb))
    small = np.flatnonzero(~big & (lam > 0))
    if small.size:
        # pooled counts are integers, so few distinct means: the series once per distinct
        # value, in ascending chunks, each summed to k = lam + 12 sqrt(lam) + 25 of its largest
        values, inverse = np.unique(lam[small], return_inverse=True)
        m_u, v_u, c_u = np.empty(values.size), np.empty(values.size), np.empty(values.size)
        for a in range(0, values.size, 4096):
            lam_c = values[a : a + 4096, None]
            top = float(lam_c[-1, 0])
            k = np.arange(int(np.ceil(top + 12.0 * np.sqrt(top) + 25.0)), dtype=np.float64)
            pmf = np.exp(k[None, :] * np.log(lam_c) - lam_c - gammaln(k + 1.0)[None, :])
            m1 = pmf @ np.sqrt(k)
            m_u[a : a + 4096] = m1
            v_u[a : a + 4096] = np.maximum(lam_c[:, 0] - m1**2, 0.0)
            c_u[a : a + 4096] = pmf @ k**1.5 - lam_c[:, 0] * m1
        mean[small], var[small], cov[small] = m_u[inverse], v_u[inverse], c_u[inverse]
    return mean, var, cov


def null_distance_to_pool(p: Any, occupancy: Any, /, *, grid: int = 48) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of ``d = d_H^2(mu_hat, p)`` for a sample of ``N`` tokens
    drawn from ``p`` itself, for every ``N`` of ``occupancy`` (m,).

    With Poisson counts ``X_v ~ Poisson(N p_v)`` and ``s_v = sqrt(X_v / N)``:
    ``E d = 2 - 2 sum_v sqrt(p_v) E s_v``; the variance is that of Poisson counts given
    their total ``T = N`` (a multinomial sample), to second order
    ``Var d = Var_P d - Cov_P(d, T)^2 / N`` with ``Var_P d = (4 / N) sum_v p_v Var sqrt X_v``
    and ``Cov_P(d, T) = -(2 / sqrt N) sum_v sqrt(p_v) Cov(sqrt X_v, X_v)`` (without the
    conditioning the first-order fluctuation, which a fixed total cancels, would dominate).
    Computed on ``grid`` log-spaced occupancies and interpolated in ``log N``.

    Returns:
        ((m,) mean, (m,) standard deviation).
    """
    p = np.asarray(p, dtype=np.float64)
    p = p[p > 0] / p.sum()
    sqrt_p = np.sqrt(p)
    occ = np.asarray(occupancy, dtype=np.float64)
    lo, hi = max(float(occ[occ > 0].min()) if np.any(occ > 0) else 1.0, 1.0), max(float(occ.max()), 1.0)
    grid_n = np.unique(np.geomspace(lo, hi, grid)) if hi > lo else np.array([lo])
    means, sds = [], []
    for n in grid_n:
        m1, v1, c1 = _sqrt_poisson_moments(n * p)
        means.append(2.0 - 2.0 * float(sqrt_p @ m1) / np.sqrt(n))
        var = 4.0 / n * (float(p @ v1) - float(sqrt_p @ c1) ** 2 / n)
        sds.append(np.sqrt(max(var, 0.0)))
    logn = np.log(np.maximum(occ, 1.0))
    return np.interp(logn, np.log(grid_n), means), np.interp(logn, np.log(grid_n), sds)


def standout_positions(rows: Any, positions: Any, /, *,
                       rotated: Callable[[np.ndarray], np.ndarray] | None = None,
                       modelled: Callable[[np.ndarray], np.ndarray] | None = None) -> dict[str, Any]:
    """The positions whose distribution stands out from the pooled one (module docstring).

    Args:
        rows: (m, V) counts of the geometry rows (every row occupied).
        positions: (m,) the positions the rows stand for.
        rotated, modelled: as :func:`standout_test`.

    Returns:
        JSON-ready ``{"count", "positions" (the first 64), "ranges", "z_threshold",
        "max_z", "family_level", "rule"}``, and ``"rotated_offset"`` with ``rotated``
        (``"modelled_offset"`` with ``modelled``).
    """
    c, occ = _row_totals(rows)
    return standout_test(positions, occ, pooled_totals=lambda keep: _pooled_totals(c, keep),
                         distance_to=lambda s_pool: _distance_to(c, occ, s_pool), rotated=rotated,
                         modelled=modelled)


def rotated_offset(rotated: Any, mean: Any, sd: Any, /) -> tuple[np.ndarray, float]:
    """``(offset, inflation)``: each row's mean excess over the multinomial null,
    ``offset_i = mean_r d_i^(r) - E d_i``, from the (R, m) distances ``rotated`` of R
    rotated corpora to the pool, and ``sqrt(1 + 1 / R)``, the factor by which subtracting
    that mean of R draws widens the null's standard deviation (module docstring, "Documents
    that differ"). ``mean``, ``sd``: (m,) the null's (:func:`null_distance_to_pool`).

    >>> off, f = rotated_offset(np.array([[0.5, 0.2], [0.7, 0.2]]), np.array([0.5, 0.25]), np.array([0.1, 0.1]))
    >>> off.round(6).tolist(), round(f, 4)
    ([0.1, -0.05], 1.2247)
    """
    rotated = np.atleast_2d(np.asarray(rotated, dtype=np.float64))
    return rotated.mean(axis=0) - np.asarray(mean, dtype=np.float64), float(np.sqrt(1.0 + 1.0 / rotated.shape[0]))


def modelled_offset(excess: Any, sd: Any, /) -> tuple[np.ndarray, np.ndarray]:
    """``(offset, inflation)`` from a modelled excess (m,) of each row's distance over the
    null (:func:`posstats.estimates.document_excess.document_excess`): the positive part is
    subtracted (a negative excess errs safe and is left), and the null's sd (m,) widened to
    ``sqrt(sd^2 + (MODEL_SPREAD offset)^2)``, returned as the factor on ``sd``.

    >>> off, f = modelled_offset(np.array([0.2, -0.1]), np.array([0.1, 0.1]))
    >>> off.tolist(), f.round(4).tolist()
    ([0.2, 0.0], [1.4142, 1.0])
    """
    offset = np.maximum(np.asarray(excess, dtype=np.float64), 0.0)
    sd = np.maximum(np.asarray(sd, dtype=np.float64), 1e-300)
    return offset, np.sqrt(1.0 + (MODEL_SPREAD * offset / sd) ** 2)


def standout_test(positions: Any, occupancy: Any, /, *, pooled_totals: Callable[[np.ndarray], np.ndarray],
                  distance_to: Callable[[np.ndarray], np.ndarray],
                  rotated: Callable[[np.ndarray], np.ndarray] | None = None,
                  modelled: Callable[[np.ndarray], np.ndarray] | None = None) -> dict[str, Any]:
    """:func:`standout_positions` of rows held anywhere (in this process, or in position
    ranges held apart: :class:`posstats.geometry.ranged.RangedSqrt`), through the two
    reductions it needs.

    Args:
        positions: (m,) the positions of the rows; ``occupancy``: (m,) their token counts.
        pooled_totals: ``keep`` (bool (m,)) -> (V,) the tokens of the rows ``keep`` per
            vocabulary entry.
        distance_to: ``s_pool`` (V,) -> (m,) plug-in ``d_H^2`` of every row to the
            distribution whose square root is ``s_pool``.
        rotated: ``s_pool`` (V,) -> (R, m) the same distances of the rows of R corpora
            whose windows were rotated (:func:`posstats.estimates.rotation.rotated_distances_to_pool`),
            or None. Called once, with the first round's pool (every row): each row's
            mean excess over the null (:func:`rotated_offset`) is subtracted from its
            distance in every round (module docstring, "Documents that differ").
        modelled: ``s_pool`` (V,) -> (m,) the excess of every row's distance over the
            null that documents differing from each other give, modelled where no window
            can be rotated (:mod:`posstats.estimates.document_excess`), or None; used
            only without ``rotated``. Called once, with the first round's pool; its
            positive part is subtracted in every round and widens the sd
            (:func:`modelled_offset`).

    Returns:
        As :func:`standout_positions`.
    """
    positions = np.asarray(positions, dtype=np.int64)
    occ = np.asarray(occupancy, dtype=np.float64)
    m = occ.size
    threshold = standout_threshold(m)
    pooled_out = np.zeros(m, dtype=bool)  # left out of the pool
    offset, inflation, offset_entry, model_entry = np.zeros(m), 1.0, None, None
    for round_ in range(_POOL_ROUNDS):
        totals = np.asarray(pooled_totals(~pooled_out), dtype=np.float64)
        s_pool = np.sqrt(totals / max(float(totals.sum()), 1.0))
        mean, sd = null_distance_to_pool(s_pool**2, occ)
        if round_ == 0 and rotated is not None:
            distances = np.asarray(rotated(s_pool), dtype=np.float64)
            offset, inflation = rotated_offset(distances, mean, sd)
            in_sd = offset / np.maximum(sd, 1e-300)
            offset_entry = {"replicates": int(distances.shape[0]), "inflation": inflation,
                            "largest_in_sd": float(in_sd.max()) if m else 0.0,
                            "smallest_in_sd": float(in_sd.min()) if m else 0.0}
        elif round_ == 0 and modelled is not None:
            offset, inflation = modelled_offset(modelled(s_pool), sd)
            in_sd = offset / np.maximum(sd, 1e-300)
            model_entry = {"spread": MODEL_SPREAD, "rows_offset": int(np.count_nonzero(offset)),
                           "largest_in_sd": float(in_sd.max()) if m else 0.0}
        z = (np.asarray(distance_to(s_pool), dtype=np.float64) - mean - offset) / np.maximum(sd * inflation, 1e-300)
        fresh = (z > threshold) & ~pooled_out
        if not fresh.any() or pooled_out.all():
            break
        # leave out the most extreme first: a pool shifted by a few very different positions
        # lifts every other z, and leaving out all that cross the threshold at once
        # oscillates (the pool left would be the deepest, rarest positions)
        pooled_out |= fresh & (z >= max(threshold, 0.5 * float(z[fresh].max())))
    # the normal z above picks what leaves the pool; the decision reads the saddlepoint's tail
    z_normal, z = z, calibrated_z(z, occ, s_pool**2, mean, sd)
    z, _ = solved_near(z, z_normal, occ, s_pool**2, mean, sd, threshold=threshold, thin=THIN_SOLVED)
    out = z > threshold
    picked = positions[out]
    return {
        "count": int(picked.size),
        "positions": picked[:_LISTED].tolist(),
        "ranges": position_ranges(picked) if picked.size <= 4096 else position_ranges(picked[:4096]) + ", ...",
        "z_threshold": threshold,
        "max_z": float(np.max(z)) if z.size else 0.0,
        "family_level": FAMILY_LEVEL,
        "rule": ("z_i = Phi^-1(1 - P_null(d >= d_H^2(mu_i, pool))) > max(5, Phi^-1(1 - 0.025 / m)), the null being N_i "
                 "tokens drawn from the pool, its tail by a conditional saddlepoint (solved per row near the threshold)"
                 + ("; d less each position's mean excess over that null in R corpora whose windows were rotated (the "
                    "documents' own variation), the null's sd widened by sqrt(1 + 1/R)" if offset_entry else "")
                 + ("; d less each position's excess over that null modelled from the documents' variance measured on "
                    f"their two halves (its positive part), the null's sd widened by {MODEL_SPREAD:g} of it"
                    if model_entry else "")),
        **({"rotated_offset": offset_entry} if offset_entry else {}),
        **({"modelled_offset": model_entry} if model_entry else {}),
    }
