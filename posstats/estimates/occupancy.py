"""Corrected distances between positions of unequal occupancy: the square root's shrinkage removed.

**Why.** The corrected ``d_H^2`` subtracts each position's unbiased sampling variance ``b_i``
of the plug-in ``|s_hat_i - s_hat_j|^2`` (:mod:`posstats.estimates.sampling_variance`).
What is left in expectation is ``|E s_hat_i - E s_hat_j|^2``, which is the true ``d_H^2``
only where ``E s_hat`` is ``s``. It is not: for a token seen about once or less,
``E sqrt(X / N)`` falls below ``sqrt(p)`` (the square root shrinks rare tokens), and by
how much depends on the occupancy N. At equal occupancy the shrinkage is the same on both
sides and cancels for identical distributions (the calibration grid, every position N
tokens); at unequal occupancy it does not. Two positions of one Zipf(1.1) distribution
over 50,257 tokens with 6,300 and 184,000 tokens are apart by 0.072 in expectation (the
truth: 0), with 2,000 and 20,000 by 0.045: the size of real structure (the calibration
suite's drift 16 positions apart is 0.162). In truncate mode occupancy falls along the
context, so this distance grows with the distance between positions, a smooth structure
of its own: on a 2e8-token corpus at n = 4,096 it was the geometry's top two components,
correlated 0.93 with log occupancy, which ALiBi "fitted best" (``benchmarks/bench_occupancy_bias.py``).

**The correction.** Each position's expected shrinkage under the pooled distribution
``p`` (the corpus' distribution when positions do not differ, estimated from every token)
is removed from its square roots:

    x_i = s_hat_i - m(N_i),    m_v(N) = E sqrt(X / N) - sqrt(p_v) = sqrt(p_v) f(N p_v),
    f(lam) = E sqrt(Poisson(lam)) / sqrt(lam) - 1,

and the corrected distance is ``|x_i - x_j|^2 - b_i - b_j`` (``b`` unchanged: removing a
constant vector changes no variance). Where both positions have the pooled distribution
its expectation is exactly 0 at any occupancies; at equal occupancy ``m(N_i) = m(N_j)`` and
it is today's estimator exactly; between different distributions it keeps today's
second-order remainder (docs/calibration.md), plus terms in ``m`` computed under ``p``
instead of each position's own distribution, of the order of ``p``'s square root on the
tokens where they differ. This is an empirical-Bayes style plug-in of the null's
expectation, not an unbiased estimator of ``sqrt(p)`` (none exists: ``sqrt`` is not
analytic at 0), and it is what makes identical positions identical at any occupancies.

**Computation.** ``f`` is tabulated once (exact Poisson sums below ``lam = 400``, the
asymptotic series above). ``m(N)`` is smooth in ``log N``, so the (m, V) matrix ``M`` of the
positions' shrinkages is ``W U``: ``U`` (K, V) the shrinkage at K occupancies on a
geometric grid (steps of 5 % in N), ``W`` (m, K) each position's linear interpolation
weights in ``log N``. Then, with ``A = S U^T`` (m, K) and ``G = U U^T`` (K, K),

    |x_i - x_j|^2 = D_ij + |m_i - m_j|^2 - 2 <s_i - s_j, m_i - m_j>,
    |m_i - m_j|^2 = (w_i - w_j) G (w_i - w_j)^T,  <s_i, m_j> = A_i . w_j,

so a full (m, m) adjustment costs ``nnz(S) K + m^2 K`` and a pair ``K^2``: never an (m, V)
dense matrix. Null corpora (shuffled or rotated) keep every occupancy and the pooled
counts, so they share the data's ``U`` and ``W``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.special import gammaln, xlogy

from posstats.geometry.products import _row_block_views, blocks_times, product_threads

__all__ = ["OccupancyShrinkage", "ShrinkageFeatures", "adjusted", "halves_pool_shift", "shrinkage_on_grid", "sqrt_shrinkage"]

_GRID_STEP = 0.05  # log-occupancy step of the grid (5 % in N): interpolation error ~1e-4 of m
_SERIES_FROM = 400.0  # lam above which f is the asymptotic series


@functools.lru_cache(maxsize=1)
def _table() -> tuple[np.ndarray, np.ndarray]:
    """``(log lam, f(lam))`` on a grid of 4,001 points from 1e-8 to ``_SERIES_FROM``."""
    lam = np.geomspace(1e-8, _SERIES_FROM, 4001)
    k = np.arange(int(_SERIES_FROM + 12 * np.sqrt(_SERIES_FROM) + 40), dtype=np.float64)
    # the Poisson pmf from scipy.special (scipy.stats costs every command a second of start-up)
    pmf = np.exp(xlogy(k[:, None], lam[None, :]) - lam[None, :] - gammaln(k + 1.0)[:, None])
    mean_sqrt = np.sqrt(k) @ pmf
    return np.log(lam), mean_sqrt / np.sqrt(lam) - 1.0


def sqrt_shrinkage(lam: Any, /) -> np.ndarray:
    """``f(lam) = E sqrt(X) / sqrt(lam) - 1`` for ``X ~ Poisson(lam)``: the relative shrinkage
    of the square root of a count with mean ``lam``, in (-1, 0]; -1 + sqrt(lam) near 0, and
    ``-1/(8 lam) - 7/(128 lam^2) - 33/(1024 lam^3)`` above ``lam = 400``.

    >>> sqrt_shrinkage([1e-6, 1.0, 1000.0]).round(6)
    array([-0.999   , -0.226808, -0.000125])
    """
    lam = np.asarray(lam, dtype=np.float64)
    log_lam, f = _table()
    out = np.interp(np.log(np.maximum(lam, 1e-300)), log_lam, f)
    tiny = lam < 1e-8
    out[tiny] = np.sqrt(lam[tiny]) - 1.0  # E sqrt(X) = P(X = 1) + ... = lam e^-lam + O(lam^2)
    big = lam > _SERIES_FROM
    inv = 1.0 / lam[big]
    out[big] = -inv / 8.0 - 7.0 * inv**2 / 128.0 - 33.0 * inv**3 / 1024.0
    return out


def shrinkage_on_grid(grid: Any, p: Any, /) -> np.ndarray:
    """(K, V) ``m_v(N_k) = sqrt(p_v) f(N_k p_v)``: the shrinkage of the square roots at the
    (K,) occupancies ``grid`` under the (V,) frequencies ``p`` (not renormalised)."""
    p = np.asarray(p, dtype=np.float64).ravel()
    return np.sqrt(p)[None, :] * sqrt_shrinkage(np.asarray(grid, dtype=np.float64)[:, None] * p[None, :])


@dataclass(frozen=True)
class OccupancyShrinkage:
    """The expected shrinkage of the square roots at every occupancy of a corpus, on a grid
    (module docstring), and the adjustment it makes to squared distances.

    Attributes:
        grid: (K,) occupancies, geometric from the smallest to the largest.
        shrinkage: (K, V) ``m(N_k)``: ``sqrt(p) f(N_k p)`` for the pooled distribution p.
    """

    grid: np.ndarray
    shrinkage: np.ndarray

    @classmethod
    def of(cls, rows: Any, /, *, pooled: Any = None) -> OccupancyShrinkage | None:
        """The shrinkage of the (m, V) counts ``rows`` at their occupancies under their
        pooled distribution (``pooled``: (V,) counts to pool instead, e.g. a whole corpus
        of which ``rows`` are some positions); None when every row has the same occupancy
        (the adjustment is then exactly 0)."""
        return cls.from_totals(_occupancy(rows), rows.sum(axis=0) if pooled is None else pooled)

    @classmethod
    def from_totals(cls, occupancy: Any, pooled: Any, /) -> OccupancyShrinkage | None:
        """:meth:`of` from the rows' (m,) occupancies and the (V,) pooled counts alone."""
        occ = np.asarray(occupancy, dtype=np.float64).ravel()
        lo, hi = float(occ.min()), float(occ.max())
        if lo == hi:
            return None
        if not lo > 0:
            msg = "every row needs an occupancy above 0 for the occupancy adjustment"
            raise ValueError(msg)
        totals = np.asarray(pooled, dtype=np.float64).ravel()
        p = totals / totals.sum()
        steps = max(1, int(np.ceil(np.log(hi / lo) / _GRID_STEP)))
        grid = np.geomspace(lo, hi, steps + 1)
        return cls(grid, shrinkage_on_grid(grid, p))

    @functools.cached_property
    def gram(self) -> np.ndarray:
        """(K, K) ``U U^T``."""
        return self.shrinkage @ self.shrinkage.T

    def weights(self, occupancy: Any, /) -> np.ndarray:
        """(m, K) linear interpolation weights in log occupancy (each row sums to 1; at most
        two entries); occupancies outside the grid are refused."""
        occ = np.asarray(occupancy, dtype=np.float64).ravel()
        if occ.size and (occ.min() < self.grid[0] * (1 - 1e-12) or occ.max() > self.grid[-1] * (1 + 1e-12)):
            msg = (f"occupancies {occ.min():g}..{occ.max():g} outside the shrinkage grid "
                   f"{self.grid[0]:g}..{self.grid[-1]:g}")
            raise ValueError(msg)
        g = np.log(self.grid)
        x = np.clip(np.log(occ), g[0], g[-1])
        k = np.clip(np.searchsorted(g, x, side="right") - 1, 0, g.size - 2)
        t = (x - g[k]) / (g[k + 1] - g[k])
        w = np.zeros((occ.size, g.size))
        rows = np.arange(occ.size)
        w[rows, k] = 1.0 - t
        w[rows, k + 1] += t
        return w

    def features(self, rows: Any, /) -> ShrinkageFeatures:
        """The (m, V) counts ``rows``' features for their adjustments: ``<s_i, U_k>`` and
        the interpolation weights of their occupancies (one sparse product, ``nnz K``)."""
        c = sp.csr_array(rows)
        if not c.has_canonical_format:  # duplicates summed in a copy, never in the caller's counts
            c = c.copy()
            c.sum_duplicates()
        occ = np.asarray(c.sum(axis=1), dtype=np.float64).ravel()
        per_row = np.diff(c.indptr)
        # s_i = sqrt(C_i / N_i) on C's pattern, in place: one temporary an entry
        data = c.data.astype(np.float64)
        data *= np.repeat(1.0 / occ, per_row)
        np.sqrt(data, out=data)
        s = sp.csr_array((data, c.indices, c.indptr), shape=c.shape)
        # row blocks on threads: each row's dot products as one product computes them
        dots = blocks_times(_row_block_views(s, product_threads()), self._shrinkage_t, int(s.shape[1]))
        return ShrinkageFeatures(dots, self.weights(occ), self.gram)

    @functools.cached_property
    def _shrinkage_t(self) -> np.ndarray:
        """(V, K) ``U^T``, contiguous (the right-hand side of :meth:`features`' product)."""
        return np.ascontiguousarray(self.shrinkage.T)

    def operator_features(self, op: Any, occupancy: Any, /) -> ShrinkageFeatures:
        """:meth:`features` of rows held as a centred square-root operator ``op`` (e.g. over
        position ranges held apart: an object with ``apply`` and the column ``mean``), from
        their (m,) ``occupancy``: ``S U^T = S_c U^T + 1 (mean U^T)``, one product."""
        dots = op.apply(self.shrinkage.T) + (op.mean @ self.shrinkage.T)[None, :]
        return ShrinkageFeatures(dots, self.weights(occupancy), self.gram)

    def adjustment(self, rows: Any, /) -> np.ndarray:
        """(m, m) ``|x_i - x_j|^2 - |s_hat_i - s_hat_j|^2`` of the (m, V) counts ``rows``
        (module docstring): add it to their plug-in squared distances."""
        return self.features(rows).full()

    def pair_adjustment(self, rows: Any, i: Any, j: Any, /) -> np.ndarray:
        """(P,) the adjustment of the pairs ``(i[p], j[p])`` of ``rows`` alone."""
        return self.features(rows).pairs(i, j)


@dataclass(frozen=True)
class ShrinkageFeatures:
    """What the adjustment of a set of rows needs (:meth:`OccupancyShrinkage.features`).

    Attributes:
        a: (m, K) ``A = S U^T``: ``a[i] . w[j] = <s_i, m_j>``.
        w: (m, K) interpolation weights (``m_i = w[i] U``).
        gram: (K, K) ``U U^T``.
    """

    a: np.ndarray
    w: np.ndarray
    gram: np.ndarray

    def full(self) -> np.ndarray:
        """(m, m) adjustment, exactly symmetric with a 0 diagonal."""
        q = self.w @ self.gram @ self.w.T
        r = self.a @ self.w.T  # r[i, j] = <s_i, m_j>
        qd, rd = np.diag(q).copy(), np.diag(r).copy()
        out = (qd[:, None] + qd[None, :]) - (q + q.T)  # |m_i - m_j|^2
        out -= 2.0 * ((rd[:, None] + rd[None, :]) - (r + r.T))
        np.fill_diagonal(out, 0.0)
        return out

    @functools.cached_property
    def _interpolation(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Each row's two grid weights (at most two entries of ``w`` are non-zero: grid
        points ``k_i`` and ``k_i + 1``): ``(k, lo, hi, q, r)`` with ``lo = w[i, k_i]``,
        ``hi = w[i, k_i + 1]``, ``q_i = |m_i|^2 = w_i G w_i^T`` and ``r_i = <s_i, m_i>``."""
        m, kk = self.w.shape
        k = np.minimum(np.argmax(self.w > 0, axis=1), max(kk - 2, 0)).astype(np.int64)
        rows = np.arange(m)
        lo = self.w[rows, k]
        hi = self.w[rows, k + 1] if kk > 1 else np.zeros(m)
        q = _bilinear(self.gram, k, lo, hi, k, lo, hi)
        r = lo * self.a[rows, k] + (hi * self.a[rows, k + 1] if kk > 1 else 0.0)
        return k, lo, hi, q, r

    def pairs(self, i: Any, j: Any, /) -> np.ndarray:
        """(P,) the adjustment of the pairs ``(i[p], j[p])`` (no (m, m) matrix); 0 where
        ``i == j``. Each row's ``w`` has two entries, so every term is a gather of a few
        numbers per pair: ``|m_i - m_j|^2 = q_i + q_j - 2 w_i G w_j^T`` and
        ``<s_i - s_j, m_i - m_j> = r_i + r_j - <s_i, m_j> - <s_j, m_i>``, O(P) time and memory
        (the (P, K) differences took 12 GB and 3 minutes for 1.55 M pairs at K = 244)."""
        i, j = np.asarray(i, dtype=np.int64).ravel(), np.asarray(j, dtype=np.int64).ravel()
        k, lo, hi, q, r = self._interpolation
        kk = self.w.shape[1]
        ki, kj = k[i], k[j]
        mm = q[i] + q[j] - 2.0 * _bilinear(self.gram, ki, lo[i], hi[i], kj, lo[j], hi[j])

        def dot(a_rows: np.ndarray, kb: np.ndarray, lb: np.ndarray, hb: np.ndarray) -> np.ndarray:
            """``<s_a, m_b>`` = ``a[a_rows] . w_b``."""
            out = lb * self.a[a_rows, kb]
            if kk > 1:
                out += hb * self.a[a_rows, kb + 1]
            return out

        cross = r[i] + r[j] - dot(i, kj, lo[j], hi[j]) - dot(j, ki, lo[i], hi[i])  # <s_i - s_j, m_i - m_j>
        out = mm - 2.0 * cross
        out[i == j] = 0.0
        return out


def _bilinear(gram: np.ndarray, ka: np.ndarray, la: np.ndarray, ha: np.ndarray,
              kb: np.ndarray, lb: np.ndarray, hb: np.ndarray) -> np.ndarray:
    """(P,) ``w_a G w_b^T`` for interpolation weights with two entries each
    (``la`` at ``ka``, ``ha`` at ``ka + 1``; likewise b)."""
    kk = gram.shape[0]
    out = la * lb * gram[ka, kb]
    if kk > 1:
        out += la * hb * gram[ka, kb + 1] + ha * lb * gram[ka + 1, kb] + ha * hb * gram[ka + 1, kb + 1]
    return out


def halves_pool_shift(occupancy: Any, pooled_a: Any, pooled_b: Any, /) -> tuple[sp.csr_array, np.ndarray] | None:
    """``(weights, shift)``: what the pooled distribution's own sampling error does to the
    corrected rows, drawn for two independent halves of the corpus.

    The corrected rows are ``x_i = s_hat_i - m(N_i)``, ``m`` computed under the pooled
    distribution ``p`` (module docstring) rather than the law ``mu`` the positions share.
    To first order that puts ``-g(N_i) (p - mu)`` into row i, ``g`` the derivative of the
    shrinkage in ``p``: a vector common to every row, scaled along occupancy, and so a
    structure along falling occupancy. Where documents differ from each other it is
    large: the longest documents move ``p``, and a row holds one token of each document
    that reaches it. Two halves of independent documents carry its analogue: their pools
    ``p_A`` and ``p_B`` deviate from each other by ``2 e``, ``e = (p_A - p_B) / 2`` of the
    variance of ``p - mu`` (each half has half the documents), with the same correlation
    with the halves' difference of the rows (docs/calibration.md, "Documents that differ").

    The analogue is taken on the side of the lower half, token by token:

        shift_v(N) = sign(e_v) (m_v(N; min(p_A, p_B)) - m_v(N; c)),    c = (p_A + p_B) / 2,

    so ``-(m(c) - m(p_B))`` where ``p_A > p_B`` and ``-(m(p_A) - m(c))`` where ``p_B > p_A``:
    the pool ``c`` against the half it stands above, ``|e|`` apart, in the place of ``p``
    against ``mu``. To first order it is ``-g(N) e``, as the data's term is ``-g(N) (p -
    mu)``. Beyond it, the shrinkage ``m_v(N; q) = sqrt(q) f(N q)`` bends most where
    ``N q`` is a few tokens, and a token carried by a few documents has its pool above
    ``mu`` (``mu`` near 0, ``p`` raised by the documents that hold it); the half without
    them is near ``mu``, so the lower half stands in for the truth there. The symmetric
    ``-(m(p_A) - m(p_B)) / 2`` (the fifty-fifth session's form) spans ``2 |e|`` around
    ``c`` and averages the flatter upper side in: on resampled fortunes at 512 rows its
    top stood 10-13 % below the data's pool term alone, where the two linearised terms
    agree to 4 %, and the rank test alone counted a component in 3 of 20 null corpora
    (1 of 20 with this form, as with the true law's shrinkage; docs/calibration.md,
    "Documents that differ", the fifty-ninth session).

    Args:
        occupancy: (m,) the rows' occupancies, as the corrected rows were shrunk at.
        pooled_a, pooled_b: (V,) each half's tokens per vocabulary entry over those rows.

    Returns:
        ``weights`` (m, K) CSR, the rows' interpolation weights on the occupancy grid, and
        ``shift`` (K, V) on that grid's occupancies, so that the rows' analogue is
        ``weights @ shift``; None at equal occupancy (no shrinkage is removed) or when a
        half has no tokens.
    """
    occ = np.asarray(occupancy, dtype=np.float64).ravel()
    a = np.asarray(pooled_a, dtype=np.float64).ravel()
    b = np.asarray(pooled_b, dtype=np.float64).ravel()
    if not (a.sum() > 0 and b.sum() > 0):
        return None
    used = occ > 0
    if not used.any():
        return None
    lo = float(occ[used].min())
    grid_occ = np.where(used, occ, lo)  # rows without tokens carry no noise row; any grid point will do
    p_a, p_b = a / a.sum(), b / b.sum()
    centre = OccupancyShrinkage.from_totals(grid_occ, (p_a + p_b) / 2.0)
    if centre is None:
        return None
    lower = np.minimum(p_a, p_b)
    shift = shrinkage_on_grid(centre.grid, lower)
    shift -= centre.shrinkage
    shift *= np.sign(p_a - p_b)[None, :]
    weights = sp.csr_array(centre.weights(grid_occ) * used[:, None])
    return weights, shift


def _occupancy(rows: Any) -> np.ndarray:
    """(m,) float64 row sums of counts."""
    return np.asarray(rows.sum(axis=1), dtype=np.float64).ravel()


def adjusted(d2: np.ndarray, rows: Any, /, *, shrinkage: OccupancyShrinkage | None = None,
             pooled: Any = None) -> np.ndarray:
    """``d2`` (the rows' (m, m) plug-in squared distances) with the occupancy adjustment
    added in place, and returned: ``shrinkage`` when given (null corpora share the data's),
    else :meth:`OccupancyShrinkage.of` the rows (``pooled`` as there); unchanged when every
    occupancy is equal."""
    shrink = shrinkage if shrinkage is not None else OccupancyShrinkage.of(rows, pooled=pooled)
    if shrink is not None:
        d2 += shrink.adjustment(rows)
    return d2
