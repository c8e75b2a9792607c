"""The documents' excess in the standout test where no window can be rotated: a model
fitted to the two halves of the documents.

**Why.** Position i holds one token of every window (document) that reaches it, while the
pool weights a document by its length. Where documents differ from each other and
occupancy falls (truncate and chunk mode), a position is then farther from the pool than
the multinomial null of :mod:`posstats.estimates.standout` says (docs/calibration.md,
"Documents that differ"). Up to 4,096 positions ``posstats count`` keeps the window groups
with their length classes, and rotated corpora measure that excess row by row
(:func:`posstats.estimates.standout.rotated_offset`). Above, it keeps only the two halves
of the windows (even and odd), which no rotation may turn. This module models the excess
instead and fits the model's one unknown, the documents' variance, to the halves.

**Model.** Documents are independent; document d's tokens are exchangeable with law
``u_d`` (its own mixture of topics), ``E u_d = m`` at every length. Counted in the first
``l_d`` positions, its tokens are ``l_d`` draws from ``u_d``. Position i holds one token of
each of the ``N_i`` documents with ``l_d > i``; the pool ``p_hat`` holds all ``T = sum_d
l_d`` tokens. Over documents, the pool's law varies by ``Var(p_hat_v) = tau_v W`` beyond
its multinomial noise, with ``tau_v = Var_d(u_dv)`` and ``W = (sum_d l_d^2 - T) / T^2``, and
row i's tokens covary with it by ``tau_v (S_i / N_i - 1) / T``, ``S_i = sum_{d : l_d > i}
l_d``. The standout statistic ``d_i = 2 - 2 sum_v sqrt(C_iv / N_i) sqrt(p_hat_v)`` is
compared with its mean ``2 - 2 sum_v sqrt(p_hat_v) h(N_i p_hat_v) / sqrt(N_i)`` for a
sample drawn from ``p_hat`` (``h(lam) = E sqrt(X)``, ``X ~ Poisson(lam)``). To second order
in the documents' deviation the difference of the two is

    ``excess_i = sum_v tau_v (N_i / sqrt(lam_v)) [W (h'(lam_v) + lam_v h''(lam_v))
                 - h'(lam_v) (S_i / N_i - 1) / T]``,   ``lam_v = N_i p_hat_v``,

which for well-sampled tokens is ``sum_v tau_v / (4 p_v) [W - 2 (S_i / N_i - 1) / T]``:
positive where the documents reaching i are shorter on average than the pool's
length-weighted mean (the shallow positions), negative deeper down.

**Fit.** Occupancy in every mode is nested (a window covers positions ``0 .. l_d - 1``),
so the lengths' moments follow from the occupancy: ``T = sum_j N_j``, ``sum_d l_d^2 =
sum_j (2 j + 1) N_j`` and ``S_i = i N_i + sum_{j >= i} N_j`` (j, i counted over the rows
used). The two halves are independent samples of documents, each with the same law, so
``E (p_A - p_B)_v^2 = p_v (1 - p_v) (1 / T_A + 1 / T_B) + tau_v (W_A + W_B)``, solved for
``tau_v`` token by token (:func:`document_variance`; unbiased, noisy alone, summed over
thousands of tokens). Positional structure is the same in both halves, so it does not
enter the fit: a planted position keeps its distance and the model's offset stays that of
its depth.

**Accuracy and use.** The second-order expansion is loosest on the tokens seen a few times
(the sparse regime of real text), where a document's rare tokens move the pool by more
than a small amount. Measured against rotated corpora on documents resampled from the
bundled fortunes (docs/calibration.md, "Documents that differ"), the model's offset of the
shallowest rows was 0.69-1.1 times the rotated corpora's. The standout test therefore
subtracts only a positive offset (a negative one, deep rows, errs safe and is left out)
and widens the null's sd by :data:`MODEL_SPREAD` of the offset:
``sd' = sqrt(sd^2 + (0.5 offset)^2)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import gammaln

__all__ = ["MODEL_SPREAD", "document_excess", "document_variance", "length_moments", "sqrt_poisson_slopes"]

MODEL_SPREAD = 0.5  # relative uncertainty of the modelled offset, widening the null's sd (module docstring)
_SERIES_LIMIT = 50.0  # Poisson means above this use the asymptotic expansions
_SERIES_TERMS = 160  # k = 0 .. 159: the Poisson(50) mass beyond is below 1e-30


def sqrt_poisson_slopes(lam: Any, /) -> tuple[np.ndarray, np.ndarray]:
    """``(h'(lam), h'(lam) + lam h''(lam))`` for ``h(lam) = E sqrt(X)``, ``X ~ Poisson(lam)``,
    elementwise: ``h' = E[sqrt(X + 1) - sqrt(X)]`` and ``h'' = E[sqrt(X + 2) - 2 sqrt(X + 1) +
    sqrt(X)]`` by their series up to :data:`_SERIES_LIMIT`, else the expansions
    ``1 / (2 sqrt(lam)) + 1 / (16 lam^1.5) + 21 / (256 lam^2.5)`` and ``1 / (4 sqrt(lam)) - 1 /
    (32 lam^1.5)`` (derivatives of ``sqrt(lam) (1 - 1/(8 lam) - 7/(128 lam^2))``).

    >>> d1, da = sqrt_poisson_slopes(np.array([0.0, 1.0, 400.0]))
    >>> d1.round(4).tolist(), da.round(4).tolist()
    ([1.0, 0.5995, 0.025], [1.0, 0.337, 0.0125])
    """
    lam = np.asarray(lam, dtype=np.float64)
    d1, da = np.empty(lam.shape), np.empty(lam.shape)
    big = lam > _SERIES_LIMIT
    lb = lam[big]
    d1[big] = 0.5 / np.sqrt(lb) + 1.0 / (16.0 * lb**1.5) + 21.0 / (256.0 * lb**2.5)
    da[big] = 0.25 / np.sqrt(lb) - 1.0 / (32.0 * lb**1.5)
    small = np.flatnonzero(~big)
    if small.size:
        values, inverse = np.unique(lam[small], return_inverse=True)
        k = np.arange(_SERIES_TERMS, dtype=np.float64)
        root = np.sqrt(k)
        step1 = np.sqrt(k + 1.0) - root
        step2 = np.sqrt(k + 2.0) - 2.0 * np.sqrt(k + 1.0) + root
        s1, sa = np.empty(values.size), np.empty(values.size)
        for a in range(0, values.size, 2048):
            lam_c = values[a : a + 2048, None]
            with np.errstate(divide="ignore", invalid="ignore"):
                log_pmf = k[None, :] * np.log(lam_c) - lam_c - gammaln(k + 1.0)[None, :]
            log_pmf[:, 0] = -lam_c[:, 0]  # 0 * log(0) is 0: Poisson(0) is all at k = 0
            pmf = np.exp(log_pmf)
            e1, e2 = pmf @ step1, pmf @ step2
            s1[a : a + 2048], sa[a : a + 2048] = e1, e1 + lam_c[:, 0] * e2
        d1[small], da[small] = s1[inverse], sa[inverse]
    return d1, da


def length_moments(occupancy: Any, /) -> tuple[float, float, np.ndarray]:
    """``(T, W, S)`` of documents counted at the rows with ``occupancy`` (m,), nonincreasing
    (nested windows, module docstring): ``T = sum_j N_j`` tokens, ``W = (sum_d l_d^2 - T) /
    T^2`` with ``sum_d l_d^2 = sum_j (2 j + 1) N_j``, and ``S_i = i N_i + sum_{j >= i} N_j``
    (m,), the tokens of the documents that reach row i.

    >>> T, W, S = length_moments([2.0, 1.0])  # documents of lengths 2 and 1
    >>> T, W, S.tolist()
    (3.0, 0.2222222222222222, [3.0, 2.0])
    """
    occ = np.asarray(occupancy, dtype=np.float64)
    j = np.arange(occ.size, dtype=np.float64)
    total = float(occ.sum())
    if total <= 0:
        return 0.0, 0.0, np.zeros(occ.size)
    squares = float(((2.0 * j + 1.0) * occ).sum())
    return total, (squares - total) / total**2, j * occ + np.cumsum(occ[::-1])[::-1]


def document_variance(half_a: Any, half_b: Any, occupancy_a: Any, occupancy_b: Any, /) -> np.ndarray:
    """(V,) ``tau_v``: the variance of the documents' laws, token by token, from the tokens
    per vocabulary entry of the two halves (``half_a``, ``half_b``: (V,)) and their
    occupancies at the rows used (module docstring, "Fit"):
    ``((p_A - p_B)^2 - p (1 - p) (1 / T_A + 1 / T_B)) / (W_A + W_B)``, 0 where the halves
    hold no document of two tokens or more (``W_A + W_B = 0``: nothing to fit).

    >>> document_variance(np.array([10.0, 0.0]), np.array([0.0, 10.0]), [5.0, 5.0], [5.0, 5.0]).round(3).tolist()
    [4.75, 4.75]
    """
    a, b = np.asarray(half_a, dtype=np.float64), np.asarray(half_b, dtype=np.float64)
    t_a, w_a, _ = length_moments(occupancy_a)
    t_b, w_b, _ = length_moments(occupancy_b)
    if t_a <= 0 or t_b <= 0 or w_a + w_b <= 0:
        return np.zeros(a.size)
    p = (a + b) / (t_a + t_b)
    return ((a / t_a - b / t_b) ** 2 - p * (1.0 - p) * (1.0 / t_a + 1.0 / t_b)) / (w_a + w_b)


def document_excess(tau: Any, pool: Any, occupancy: Any, /, *, grid: int = 48) -> np.ndarray:
    """(m,) the modelled excess of every row's plug-in distance to the pool over the
    multinomial null (module docstring, "Model"), from ``tau`` (V,) of
    :func:`document_variance`, the pool's law ``pool`` (V,) and the rows' ``occupancy``
    (m,), nonincreasing. The sums over the vocabulary are taken on ``grid`` log-spaced
    occupancies and interpolated in ``log N``.

    >>> p = np.full(4, 0.25)
    >>> document_excess(np.zeros(4), p, [100.0, 50.0]).tolist()
    [0.0, 0.0]
    """
    tau = np.asarray(tau, dtype=np.float64)
    p = np.asarray(pool, dtype=np.float64)
    p = p / max(float(p.sum()), 1e-300)
    occ = np.asarray(occupancy, dtype=np.float64)
    total, w, s = length_moments(occ)
    seen = (p > 0) & (tau != 0)
    if not seen.any() or total <= 0:
        return np.zeros(occ.size)
    tau, p = tau[seen], p[seen]
    lo, hi = max(float(occ[occ > 0].min()), 1.0), max(float(occ.max()), 1.0)
    grid_n = np.unique(np.geomspace(lo, hi, grid)) if hi > lo else np.array([lo])
    pool_term, shared_term = np.empty(grid_n.size), np.empty(grid_n.size)
    for k, n in enumerate(grid_n):
        lam = n * p
        d1, da = sqrt_poisson_slopes(lam)
        weight = tau * n / np.sqrt(lam)
        pool_term[k], shared_term[k] = float(weight @ da), float(weight @ d1)
    logn = np.log(np.maximum(occ, 1.0))
    a = np.interp(logn, np.log(grid_n), pool_term)
    b = np.interp(logn, np.log(grid_n), shared_term)
    return w * a - (s / np.maximum(occ, 1.0) - 1.0) / total * b
