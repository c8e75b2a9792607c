"""Tail probabilities of a position's distance to the pool: a conditional saddlepoint.

The standout test (:mod:`posstats.estimates.verdict`) asks whether a position whose ``N``
tokens give ``d = d_H^2(mu_hat, p)`` could be ``N`` tokens drawn from the pool ``p``. With
``a_v = sqrt(p_v)``, ``d = 2 - 2 W / sqrt(N)`` where ``W = sum_v a_v sqrt(X_v)`` and
``X ~ Multinomial(N, p)``. The normal law with the exact first two moments is too light in
the tail that matters (large ``d``, small ``W``): on stationary corpora (V = 5,000, Zipf 1.1)
``z > 4`` happened 3.3 times (N = 200) and 2.9 times (N = 2,000) as often as the normal law
says, and at N = 200 ``z > 5`` 13 times as often; with a Bonferroni threshold over 131,072
positions (z = 5.08) a stationary corpus then "had" a standout position in about one run of
five.

Here the tail comes from the double saddlepoint approximation of Skovgaard (1987) to the
conditional law of ``W`` given ``T = sum_v X_v = N``, the ``X_v`` independent
``Poisson(N p_v)`` (conditioned on their total they are the multinomial exactly):

- ``K(s, t) = sum_v log E exp(s a_v sqrt(X_v) + t X_v)``, the joint cumulant generating
  function of ``(W, T)``, each term a series over the Poisson mass (:class:`JointCgf`);
- ``(s^, t^)`` solves ``grad K = (w, N)`` (the minimum of the convex ``K - s w - t N``); the
  denominator's saddlepoint is ``(0, 0)``, since ``E T = N``;
- ``r = sgn(s^) sqrt(-2 [K(s^, t^) - s^ w - t^ N])``, ``u = s^ sqrt(det K''(s^, t^) / N)``;
- ``P(W <= w | T = N) ~ Phi(r*)`` with ``r* = r + log(u / r) / r`` (Barndorff-Nielsen's
  form of the Lugannani-Rice/Skovgaard tail: the same order of accuracy, always a
  probability).

References: I. M. Skovgaard, "Saddlepoint expansions for conditional distributions",
J. Appl. Prob. 24 (1987); R. W. Butler, *Saddlepoint Approximations with Applications*
(2007), sections 1.2 and 4.2.

The result is expressed as a *calibrated z*, ``z* = Phi^-1(1 - P(d_null >= d))``, so the
threshold and the report keep their meaning. Solving per position would cost a saddlepoint
per row; :func:`calibrated_z` tabulates ``z* - z`` on a grid of normal z (1.5 to 12) and
occupancies and interpolates (the correction is smooth in both for N >= 60: within 0.05 of
a per-row solve; below, near the edge of the support, the interpolation is off by up to 0.6,
in either direction). :func:`solved_near` therefore solves the rows near a decision
threshold one by one.

:func:`importance_tail` computes the same conditional tail by importance sampling, unbiased
whatever the tilt (the saddlepoint's tilt makes it efficient), with its standard error: the
check that the saddlepoint is right where a Monte-Carlo count of null rows cannot reach
(``tests/test_saddlepoint.py``, ``benchmarks/bench_standout_tail.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import gammaln, xlogy

__all__ = ["MAX_TERMS", "JointCgf", "calibrated_z", "importance_tail", "lower_tail_z", "solved_near"]

Z_GRID = np.array([1.5, 2.5, 3.5, 4.5, 5.5, 7.0, 9.0, 12.0])
_CELLS = 1 << 21  # series terms held at a time (a chunk of distinct means x its window)
MAX_TERMS = 4096  # terms of one token's series: wider windows (N p_v above ~1e4) are summed on a stride


@dataclass(frozen=True)
class _Chunk:
    a: np.ndarray  # (U,) sqrt(p_v) of distinct pool probabilities
    mult: np.ndarray  # (U,) how many tokens share it
    k: np.ndarray  # (U, L) the counts each term's series runs over
    root_k: np.ndarray  # (U, L) sqrt(k)
    log_pmf: np.ndarray  # (U, L) log Poisson(k; N p_v)


_LARGE_MEAN = 1e5  # above, log Poisson(k; lam) by Loader's saddle-point form (no cancellation)


def _log_poisson(k: np.ndarray, lam: np.ndarray, /) -> np.ndarray:
    """``log Poisson(k; lam)`` for the windows of :class:`JointCgf` (k within ``lam +-
    (20 sqrt(lam) + 10)``). Below ``_LARGE_MEAN`` the direct ``k log lam - lam - log k!``;
    above, whose terms reach 1e13 at lam = 5e11 and cancel to an error of 1e-3, Loader's
    form ``-log(2 pi k) / 2 - stirlerr(k) - lam g(k / lam - 1)`` with ``g(u) = (1 + u)
    log1p(u) - u`` and the Stirling series ``stirlerr(k) = 1/(12 k) - 1/(360 k^3) +
    1/(1260 k^5)`` (Loader 2000, "Fast and accurate computation of binomial probabilities")."""
    k, lam = np.broadcast_arrays(np.asarray(k, dtype=np.float64), np.asarray(lam, dtype=np.float64))
    large = lam >= _LARGE_MEAN
    if not large.any():
        return k * np.log(lam) - lam - gammaln(k + 1.0)
    out = np.empty(k.shape)
    ks, ls = k[~large], lam[~large]
    out[~large] = ks * np.log(ls) - ls - gammaln(ks + 1.0)
    kl, ll = k[large], lam[large]  # kl >= ll - 20 sqrt(ll) - 10 > 9e4 here
    u = kl / ll - 1.0
    stirlerr = 1.0 / (12.0 * kl) - 1.0 / (360.0 * kl**3) + 1.0 / (1260.0 * kl**5)
    out[large] = -0.5 * np.log(2.0 * np.pi * kl) - stirlerr - ll * ((1.0 + u) * np.log1p(u) - u)
    return out


def _poisson_logpmf(k: Any, lam: Any, /) -> np.ndarray:
    """``log Poisson(k; lam) = xlogy(k, lam) - lam - log k!`` for any k >= 0 and lam >= 0
    (the formula of ``scipy.stats.poisson.logpmf``, whose import adds 0.8 s to every
    command's start)."""
    k = np.asarray(k, dtype=np.float64)
    return xlogy(k, lam) - lam - gammaln(k + 1.0)


class JointCgf:
    """``K(s, t)`` of ``(W, T) = (sum_v sqrt(p_v) sqrt(X_v), sum_v X_v)`` with independent
    ``X_v ~ Poisson(N p_v)``, and its gradient and Hessian.

    Each ``v`` contributes ``log sum_k Poisson(k; N p_v) exp(s sqrt(p_v k) + t k)``, the sum
    over a window of ``N p_v +- (20 sqrt(N p_v) + 10)`` counts (the tilts the tail needs move
    the mass by a few standard deviations); tokens sharing ``p_v`` (the pool's rare counts)
    are computed once. A window wider than :data:`MAX_TERMS` counts is summed every h-th
    count, weighted by h (a Riemann sum): the summand is smooth there, with at least 100
    terms per standard deviation of the count, so the sum is exact to rounding, and a
    row of 1e12 tokens costs what one of 1e4 does (it held 3e7 terms per token).

    Args:
        p: (V,) the pool's distribution (zeros are dropped; renormalised).
        tokens: N.
    """

    def __init__(self, p: np.ndarray, tokens: float, /) -> None:
        p = np.asarray(p, dtype=np.float64)
        p = p[p > 0] / p.sum()
        values, mult = np.unique(p, return_counts=True)
        lam = tokens * values
        spread = 20.0 * np.sqrt(lam)
        lo = np.maximum(np.floor(lam - spread - 10.0), 0.0)
        cells = np.ceil(lam + spread + 10.0) - lo + 1
        step = np.maximum(np.ceil(cells / MAX_TERMS), 1.0)  # 1 up to N p_v ~ 1e4
        width = np.ceil(cells / step).astype(np.int64)  # terms
        order = np.argsort(width, kind="stable")
        self.tokens = float(tokens)
        self.chunks: list[_Chunk] = []
        start = 0
        while start < order.size:
            stop = start + 1
            first = width[order[start]]
            while (stop < order.size and (stop - start + 1) * width[order[stop]] <= _CELLS
                   and width[order[stop]] <= 1.25 * first + 8):  # little padding: windows of similar size
                stop += 1
            rows = order[start:stop]
            span = int(width[rows].max())
            k = lo[rows, None] + step[rows, None] * np.arange(span, dtype=np.float64)[None, :]
            lam_r = lam[rows, None]
            log_pmf = _log_poisson(k, lam_r) + np.log(step[rows, None])
            self.chunks.append(_Chunk(np.sqrt(values[rows]), mult[rows].astype(np.float64), k, np.sqrt(k), log_pmf))
            start = stop

    def __call__(self, s: float, t: float, /) -> tuple[float, np.ndarray, np.ndarray]:
        """``(K, grad K (2,), Hessian (2, 2))`` at ``(s, t)``."""
        value = 0.0
        grad = np.zeros(2)
        hess = np.zeros((2, 2))
        for c in self.chunks:
            x = c.a[:, None] * c.root_k
            h = c.log_pmf + s * x + t * c.k
            top = h.max(axis=1)
            e = np.exp(h - top[:, None])
            total = e.sum(axis=1)
            q = e / total[:, None]
            ex, ek = (q * x).sum(axis=1), (q * c.k).sum(axis=1)
            exk = (q * x * c.k).sum(axis=1)
            ekk = (q * c.k * c.k).sum(axis=1)
            value += float(c.mult @ (top + np.log(total)))
            grad += (float(c.mult @ ex), float(c.mult @ ek))
            vxx = c.mult @ (c.a**2 * ek - ex**2)  # E x^2 = a^2 E k
            vxk = c.mult @ (exk - ex * ek)
            vkk = c.mult @ (ekk - ek**2)
            hess += np.array([[vxx, vxk], [vxk, vkk]])
        return value, grad, hess


def _saddlepoint(cgf: JointCgf, w: float, start: np.ndarray, /) -> tuple[np.ndarray, float, np.ndarray] | None:
    """Minimise ``F(s, t) = K(s, t) - s w - t N`` by damped Newton from ``start``:
    ``((s^, t^), F(s^, t^), K''(s^, t^))``, or None where it does not converge (``w``
    outside the support's interior)."""
    target = np.array([w, cgf.tokens])
    x = np.array(start, dtype=np.float64)
    value, grad, hess = cgf(*x)
    f = value - x @ target
    for _ in range(60):
        g = grad - target
        try:
            step = -np.linalg.solve(hess, g)
        except np.linalg.LinAlgError:
            return None
        decrement = float(-g @ step)
        if not math.isfinite(decrement):
            return None
        if decrement < 1e-14:
            return x, f, hess
        size = 1.0
        while size > 1e-8:
            trial = x + size * step
            v2, g2, h2 = cgf(*trial)
            f2 = v2 - trial @ target
            if math.isfinite(f2) and f2 <= f - 1e-4 * size * decrement:
                x, f, grad, hess = trial, f2, g2, h2
                break
            size *= 0.5
        else:
            return (x, f, hess) if decrement < 1e-10 else None
    return None


def lower_tail_z(cgf: JointCgf, w: float, /, *, start: np.ndarray | None = None) -> tuple[float, np.ndarray] | None:
    """The calibrated z of ``W = w`` in its lower tail given ``T = N``: ``-r*`` with
    ``P(W <= w | T = N) ~ Phi(r*)`` (module docstring), and the saddlepoint (a warm start
    for the next, nearby ``w``); None where no saddlepoint is found."""
    found = _saddlepoint(cgf, w, np.zeros(2) if start is None else start)
    if found is None:
        return None
    (s, _), f, hess = found
    if s >= 0 or f >= 0:
        return None  # w is not below the mean: not a lower tail
    r = -math.sqrt(-2.0 * f)
    det = float(np.linalg.det(hess))
    if det <= 0:
        return None
    u = s * math.sqrt(det / cgf.tokens)
    r_star = r + math.log(u / r) / r
    return -r_star, found[0]


def calibrated_z(z: np.ndarray, occupancy: np.ndarray, p: np.ndarray, mean: np.ndarray, sd: np.ndarray,
                 /, *, nodes: int = 8) -> np.ndarray:
    """(m,) the calibrated z of every row: ``z + delta(z, N)``, ``delta`` the saddlepoint's
    correction tabulated on :data:`Z_GRID` (up to the largest z) at up to ``nodes``
    occupancies a factor >= 2 apart, log-spaced, and interpolated linearly in z and in log N.
    Below z = 1.5 the correction fades linearly to 0 at z = 0; above z = 12 it stays the
    correction at 12; where a saddlepoint is not found, the previous grid point's.

    Args:
        z: (m,) the normal z, ``(d - mean) / sd`` of each row.
        occupancy: (m,) N of each row.
        p: (V,) the pool.
        mean, sd: (m,) the null mean and sd of ``d`` each z was computed with.
    """
    z = np.asarray(z, dtype=np.float64)
    occ = np.maximum(np.asarray(occupancy, dtype=np.float64), 1.0)
    if z.size == 0 or float(z.max()) <= 0.0:
        return z.copy()
    grid = Z_GRID[: int(np.searchsorted(Z_GRID, float(z.max()))) + 1]
    lo, hi = float(occ.min()), float(occ.max())
    count = min(nodes, 1 + math.ceil(math.log(hi / lo) / math.log(2.0))) if hi > 2.0 * lo else 1
    at = np.geomspace(lo, hi, count) if count > 1 else np.array([math.sqrt(lo * hi)])
    delta = np.zeros((at.size, grid.size))
    for g, (tokens, (m_g, s_g)) in enumerate(zip(at, _node_moments(at, occ, mean, sd), strict=True)):
        cgf = JointCgf(p, tokens)
        start = None
        for j, zz in enumerate(grid):
            d = m_g + zz * s_g
            out = lower_tail_z(cgf, math.sqrt(tokens) * (1.0 - d / 2.0), start=start) if d < 2.0 else None
            if out is None:
                delta[g, j] = delta[g, j - 1] if j else 0.0
                continue
            delta[g, j], start = out[0] - zz, out[1]
    per_node = np.empty((at.size, z.size))
    for g in range(at.size):
        inside = np.interp(z, grid, delta[g])
        per_node[g] = np.where(z < grid[0], delta[g, 0] * np.clip(z, 0.0, None) / grid[0], inside)
    if at.size == 1:
        return z + per_node[0]
    x, xs = np.log(occ), np.log(at)
    j = np.clip(np.searchsorted(xs, x) - 1, 0, xs.size - 2)
    frac = np.clip((x - xs[j]) / (xs[j + 1] - xs[j]), 0.0, 1.0)
    rows = np.arange(z.size)
    return z + (1 - frac) * per_node[j, rows] + frac * per_node[j + 1, rows]


def _node_moments(nodes: np.ndarray, occ: Any, mean: Any, sd: Any) -> list[tuple[float, float]]:
    """The null mean and sd of ``d`` at each node, read off the rows' (interpolated in log N
    from the rows nearest in occupancy; exact where a row has the node's occupancy)."""
    occ, mean, sd = (np.asarray(a, dtype=np.float64) for a in (occ, mean, sd))
    order = np.argsort(occ, kind="stable")
    lx = np.log(occ[order])
    return [(float(np.interp(math.log(n), lx, mean[order])), float(np.interp(math.log(n), lx, sd[order]))) for n in nodes]



def solved_near(z_star: np.ndarray, z: np.ndarray, occupancy: np.ndarray, p: np.ndarray, mean: np.ndarray,
                sd: np.ndarray, /, *, threshold: float, below: float = 0.5, above: float = 1.0,
                limit: int = 64, thin: float = 0.0, thin_limit: int = 512) -> tuple[np.ndarray, int]:
    """``(z*, solved)``: the interpolated ``z_star`` with the rows inside
    ``[threshold - below, threshold + above]`` replaced by a per-row saddlepoint solve
    (:func:`lower_tail_z`), at most ``limit`` of them, nearest the threshold first (the
    interpolation errs by up to 0.6 at N <= 35, so the decision of a row near the threshold
    is read from its own solve); a row whose solve fails keeps its interpolated value.
    Rows of at most ``thin`` tokens are solved from ``threshold - below`` up, however far
    above (at most ``thin_limit`` of them, the lowest first): on a few tokens ``d`` nears its
    maximum 2 within a few sd, the correction jumps between two points of the grid, and a
    row of 6 tokens at normal z 2.0 was read as 7.2 (its own solve: 2.4).
    ``solved`` counts the rows solved.

    Args:
        z_star: (m,) calibrated z from :func:`calibrated_z`.
        z, occupancy, mean, sd: (m,) each row's normal z, N and the null mean and sd of d.
        p: (V,) the pool.
    """
    out = np.array(z_star, dtype=np.float64)
    occupancy = np.asarray(occupancy, dtype=np.float64)
    thin_rows = np.flatnonzero((out >= threshold - below) & (occupancy <= thin))
    thin_rows = thin_rows[np.argsort(out[thin_rows], kind="stable")][:thin_limit]
    near = np.flatnonzero((out >= threshold - below) & (out <= threshold + above) & (occupancy > thin))
    near = near[np.argsort(np.abs(out[near] - threshold), kind="stable")][:limit]
    near = np.concatenate([thin_rows, near])
    solved = 0
    for tokens in np.unique(occupancy[near]):
        rows = near[occupancy[near] == tokens]
        rows = rows[np.argsort(z[rows], kind="stable")]  # nearby w: each solve starts from the last
        cgf, start = JointCgf(p, float(tokens)), None
        for i in rows:
            d = float(mean[i] + z[i] * sd[i])
            found = lower_tail_z(cgf, math.sqrt(tokens) * (1.0 - d / 2.0), start=start) if d < 2.0 else None
            if found is not None:
                out[i], start = found
                solved += 1
    return out, solved


def importance_tail(p: np.ndarray, tokens: int, w: float, /, *, samples: int = 20_000, seed: int = 0,
                    rare_share: float | None = None) -> tuple[float, float] | None:
    """``(P, se)``: ``P(W <= w | T = N)`` (module docstring) by importance sampling, and its
    standard error; None where no saddlepoint is found for ``w``.

    The tokens with ``lambda_v = N p_v >= common`` are drawn from the saddlepoint's tilt
    ``q_v(k) ~ Poisson(k; lambda_v) exp(s sqrt(p_v k) + t k)``; the rest (rare tokens, each
    nearly always 0 or 1) take up the remaining ``r = N - T_common`` tokens, drawn as under
    the null: ``r`` from the pool restricted to them, with weight ``Poisson(r; Lambda_rare)``.
    Each sample's weight is then exactly the null's probability over the proposal's, so the
    estimate is unbiased for any tilt; dividing by ``P(T = N) = Poisson(N; N)`` conditions
    on the row's total (the multinomial) without rejecting samples.

    Args:
        p: (V,) the pool. tokens: N. w: the row's ``sum_v sqrt(p_v) sqrt(x_v)``.
        samples: draws. seed: their generator's seed. common: the ``lambda_v`` from which a
            token is drawn from the tilt.
    """
    p = np.asarray(p, dtype=np.float64)
    p = p[p > 0] / p.sum()
    found = _saddlepoint(JointCgf(p, tokens), w, np.zeros(2))
    if found is None:
        return None
    (s, t), _, _ = found
    lam, a = tokens * p, np.sqrt(p)
    rng = np.random.default_rng(seed)
    share = min(0.4, 2.0 / math.sqrt(tokens)) if rare_share is None else rare_share
    order = np.argsort(lam, kind="stable")  # the rarest tokens, up to `share` of the pool, take up the rest
    big = np.sort(order[int(np.searchsorted(np.cumsum(p[order]), share, side="right")):])
    w_sum, t_sum, log_w = np.zeros(samples), np.zeros(samples, dtype=np.int64), 0.0
    for v in big:
        spread = 12.0 * math.sqrt(lam[v]) + 12.0
        k = np.arange(max(0, int(lam[v] - spread)), int(lam[v] + spread) + 1)
        h = k * math.log(lam[v]) - lam[v] - gammaln(k + 1.0) + s * a[v] * np.sqrt(k) + t * k
        top = float(h.max())
        e = np.exp(h - top)
        log_w += top + math.log(float(e.sum()))  # the tilt's normaliser, log E_null exp(s a sqrt X + t X)
        cdf = np.cumsum(e) / e.sum()
        x = k[np.minimum(np.searchsorted(cdf, rng.random(samples), side="right"), k.size - 1)]
        w_sum += a[v] * np.sqrt(x)
        t_sum += x
    log_weight = log_w - s * w_sum - t * t_sum
    rare = np.ones(p.size, dtype=bool)
    rare[big] = False
    left = tokens - t_sum
    if rare.any():
        log_weight += np.where(left >= 0, _poisson_logpmf(np.maximum(left, 0), float(lam[rare].sum())), -np.inf)
        w_sum += _rare_part(p[rare], np.maximum(left, 0), rng)
    else:
        log_weight = np.where(left == 0, log_weight, -np.inf)
    terms = np.where(w_sum <= w, np.exp(log_weight - _poisson_logpmf(tokens, tokens)), 0.0)
    return float(terms.mean()), float(terms.std() / math.sqrt(samples))


def _rare_part(p_rare: np.ndarray, draws: np.ndarray, rng: np.random.Generator, /) -> np.ndarray:
    """(samples,) ``sum_v sqrt(p_v) sqrt(x_v)`` over the rare tokens, ``x`` of sample ``i``
    being ``draws[i]`` tokens drawn from ``p_rare`` (renormalised)."""
    cdf = np.cumsum(p_rare)
    cdf /= cdf[-1]
    sample = np.repeat(np.arange(draws.size, dtype=np.int64), draws)
    token = np.minimum(np.searchsorted(cdf, rng.random(sample.size), side="right"), p_rare.size - 1)
    keys, counts = np.unique(sample * p_rare.size + token, return_counts=True)
    return np.bincount(keys // p_rare.size, weights=np.sqrt(p_rare[keys % p_rare.size] * counts), minlength=draws.size)
