"""SMACOF's stress refinement where the n x n distances do not fit (beyond n = 16,384): the
stress of THEORY eq. 4 estimated from uniformly sampled pairs with a 95 % interval, and
stochastic gradient descent on sampled pairs.

- :func:`sampled_stress`: the stress estimated from uniformly sampled pairs, with a 95 %
  interval (delta method for a ratio estimator).
- :func:`stochastic_smacof`: stochastic gradient on sampled pairs (random perfect matchings
  as mini-batches), with the sampled stress and a 95 % interval.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from posstats.errors import InputError
from posstats.geometry.backend import array_namespace
from posstats.geometry.smacof import SmacofResult

__all__ = ["STOCHASTIC_THRESHOLD", "sampled_stress", "stochastic_smacof"]


#: Largest n for which :func:`~posstats.geometry.smacof.smacof` (n x n distances in memory) is
#: the intended path; above it use :func:`stochastic_smacof`. Advisory: ``smacof`` does not
#: refuse larger n.
STOCHASTIC_THRESHOLD = 16_384

_Z95 = 1.959963984540054



def _sample_pairs(xp, rng: np.random.Generator, n: int, m: int):
    """m pairs (i, j), i != j, uniform over the n(n-1)/2 unordered pairs, on xp's device.

    Drawn on the host so that a seed gives the same pairs on numpy and cupy.
    """
    i = rng.integers(0, n, size=m)
    j = (i + rng.integers(1, n, size=m)) % n
    return xp.asarray(i), xp.asarray(j)


def _ratio_ci(xp, a, b):
    """Ratio estimate sum(a)/sum(b) and its 95 % interval (delta method)."""
    m = int(a.shape[0])
    mb = float(xp.mean(b))
    if mb <= 0:
        msg = "sampled pairs have zero total (weighted) distance; stress is undefined"
        raise InputError(msg)
    r = float(xp.mean(a)) / mb
    resid = a - r * b
    var = float(xp.var(resid)) * m / max(m - 1, 1) / (m * mb * mb)
    half = _Z95 * math.sqrt(max(var, 0.0))
    return r, (max(r - half, 0.0), r + half)


def _pair_terms(xp, x, i, j, hv, wv):
    diff = x[i] - x[j]
    e = xp.sqrt(xp.sum(diff * diff, axis=1))
    wv = 1.0 if wv is None else wv
    return wv * (e - hv) ** 2, wv * hv * hv


def _as_rng(seed) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _fetch(xp, fn, i, j, name: str):
    """Call a pair function on device index arrays and check what it returns."""
    v = xp.asarray(fn(i, j), dtype=xp.float64)
    if v.shape != (int(i.shape[0]),):
        msg = f"{name} must return one value per pair, shape ({int(i.shape[0])},); got {tuple(v.shape)}"
        raise ValueError(msg)
    if not bool(xp.all(xp.isfinite(v) & (v >= 0))):
        msg = f"{name} returned a non-finite or negative value"
        raise InputError(msg)
    return v


@dataclass(frozen=True)
class _PairSample:
    """m sampled pairs with their distances: ``i``, ``j`` (m,) int on the device,
    ``h`` (m,) float64 ``d_H(i, j)``, ``w`` (m,) float64 weights or None (w = 1)."""

    i: Any
    j: Any
    h: Any
    w: Any


def _draw_pair_sample(xp, rng: np.random.Generator, n: int, m: int, dist_fn, weights_fn) -> _PairSample:
    """m uniform pairs (:func:`_sample_pairs`), then ``dist_fn`` and ``weights_fn`` on them."""
    i, j = _sample_pairs(xp, rng, n, m)
    h = _fetch(xp, dist_fn, i, j, "dist_fn")
    w = None if weights_fn is None else _fetch(xp, weights_fn, i, j, "weights_fn")
    return _PairSample(i, j, h, w)


def _sample_terms(xp, x, sample: _PairSample):
    """Per-pair numerator and denominator terms ``(w (e - h)^2, w h^2)``, each (m,)."""
    return _pair_terms(xp, x, sample.i, sample.j, sample.h, sample.w)


def _monitored_stress(xp, x, sample: _PairSample) -> float:
    """Sampled stress ``sum_k w_k (e_k - h_k)^2 / sum_k w_k h_k^2`` of x (n, d)."""
    a, b = _sample_terms(xp, x, sample)
    return float(xp.sum(a)) / float(xp.sum(b))


def sampled_stress(
    dist_fn: Callable[[Any, Any], Any],
    config,
    /,
    *,
    weights_fn: Callable[[Any, Any], Any] | None = None,
    n_pairs: int = 200_000,
    seed: int | np.random.Generator = 0,
    xp=None,
) -> tuple[float, tuple[float, float]]:
    """Stress estimated from ``n_pairs`` uniformly sampled pairs, with a 95 % interval.

    ``stress ~ sum_k w_k (e_k - h_k)^2 / sum_k w_k h_k^2`` over sampled pairs k (a ratio
    estimator, consistent for THEORY eq. 4); the interval is the delta-method normal
    interval ``r +- 1.96 sd(a - r b) / (sqrt(m) mean(b))``. Pairs are drawn with
    replacement, so the interval is slightly conservative for small n.

    Args:
        dist_fn: ``dist_fn(i_idx, j_idx) -> h`` (1-D, float) for integer index arrays.
        config: (n, d) configuration.
        weights_fn: optional ``weights_fn(i_idx, j_idx) -> w``; None means w = 1.
        n_pairs: sample size m.
        seed: int or numpy Generator (indices are drawn on the host, so results are the
            same on numpy and cupy).

    Returns:
        ``(stress, (low, high))``.
    """
    x = config
    xp = array_namespace(x) if xp is None else xp
    x = xp.asarray(x, dtype=xp.float64)
    n = int(x.shape[0])
    if n < 2:
        msg = f"need n >= 2 rows; got {n}"
        raise ValueError(msg)
    sample = _draw_pair_sample(xp, _as_rng(seed), n, int(n_pairs), dist_fn, weights_fn)
    return _ratio_ci(xp, *_sample_terms(xp, x, sample))


def _check_stochastic_options(xp, x, *, max_iter: int, tol: float, patience: int, matchings: int,
                              eval_pairs: int, step_max: float, step_min: float) -> None:
    """Refuse what :func:`stochastic_smacof` cannot run: x not (n, d) with n >= 2, d >= 1,
    options out of range (``ValueError``), or a non-finite x (``InputError``)."""
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 1:
        msg = f"init must have shape (n, d) with n >= 2, d >= 1; got {tuple(x.shape)}"
        raise ValueError(msg)
    if max_iter < 0 or not tol >= 0 or patience < 1 or matchings < 1 or eval_pairs < 2:
        msg = (f"need max_iter >= 0, tol >= 0, patience >= 1, matchings >= 1, eval_pairs >= 2; "
               f"got {max_iter}, {tol}, {patience}, {matchings}, {eval_pairs}")
        raise ValueError(msg)
    if not 0 < step_min <= step_max:
        msg = f"need 0 < step_min <= step_max; got step_min={step_min}, step_max={step_max}"
        raise ValueError(msg)
    if not bool(xp.all(xp.isfinite(x))):
        msg = "init has non-finite entries"
        raise InputError(msg)


def _matching_step(xp, x, rng: np.random.Generator, eta: float, dist_fn, weights_fn) -> None:
    """One mini-batch, in place on x (n, d): a random perfect matching (i_k, j_k) of the
    n points (one host permutation), each pair moved a fraction mu of the way to h:

        r = mu (e - h) / 2 * (x_i - x_j) / e,  x_i -= r,  x_j += r,  mu = min(1, w eta).

    The pairs touch disjoint points, so the vectorised update equals the sequential one.
    """
    n = int(x.shape[0])
    half = n // 2
    perm = xp.asarray(rng.permutation(n))
    ii, jj = perm[:half], perm[half:2 * half]
    hv = _fetch(xp, dist_fn, ii, jj, "dist_fn")
    mu = eta if weights_fn is None else xp.minimum(
        _fetch(xp, weights_fn, ii, jj, "weights_fn") * eta, 1.0)
    diff = x[ii] - x[jj]
    e = xp.sqrt(xp.sum(diff * diff, axis=1))
    # Coincident points have no direction; those pairs wait for the next matching.
    coef = xp.where(e > 0, mu * (e - hv) / (2.0 * xp.where(e > 0, e, 1.0)), 0.0)
    r = coef[:, None] * diff
    x[ii] -= r
    x[jj] += r


@dataclass(frozen=True)
class _SgdRun:
    """What :func:`_sgd_sweeps` ran: the monitored stresses after 0..sweeps sweeps, the
    best monitored iterate (n, d) and its sweep, the sweeps run, whether it converged."""

    history: list[float]
    best_x: Any
    best_iteration: int
    sweeps: int
    converged: bool


def _sgd_sweeps(xp, x, rng: np.random.Generator, monitor: _PairSample, dist_fn, weights_fn, *,
                max_iter: int, tol: float, patience: int, matchings: int, step_max: float,
                step_min: float) -> _SgdRun:
    """Sweeps of ``matchings`` mini-batches (:func:`_matching_step`), in place on x (n, d).

    Step size ``eta_t = step_max * decay^t``, ``decay = (step_min / step_max)^(1 / (max_iter - 1))``.
    After each sweep the stress is measured on ``monitor``; stop when the best has not
    decreased by a relative ``tol`` for ``patience`` sweeps, or after ``max_iter``.
    """
    history = [_monitored_stress(xp, x, monitor)]
    best, best_x, best_iter, stale = history[0], x.copy(), 0, 0
    decay = (step_min / step_max) ** (1.0 / max(max_iter - 1, 1))
    sweeps = 0
    for t in range(max_iter):
        eta = step_max * decay**t
        for _ in range(matchings):
            _matching_step(xp, x, rng, eta, dist_fn, weights_fn)
        sweeps = t + 1
        s = _monitored_stress(xp, x, monitor)
        history.append(s)
        stale = 0 if s < best * (1.0 - tol) else stale + 1
        if s < best:
            best, best_x, best_iter = s, x.copy(), sweeps
        if stale >= patience:
            return _SgdRun(history, best_x, best_iter, sweeps, True)
    return _SgdRun(history, best_x, best_iter, sweeps, False)


def stochastic_smacof(
    dist_fn: Callable[[Any, Any], Any],
    init,
    /,
    *,
    weights_fn: Callable[[Any, Any], Any] | None = None,
    max_iter: int = 100,
    tol: float = 1e-4,
    patience: int = 10,
    matchings: int = 32,
    step_max: float = 0.05,
    step_min: float = 0.002,
    eval_pairs: int = 200_000,
    seed: int | np.random.Generator = 0,
    xp=None,
) -> SmacofResult:
    """Stress refinement for large n from sampled pairs (no n x n matrix anywhere).

    Stochastic gradient descent on the weighted stress (Zheng, Pawar & Goodman, "Graph
    drawing by stochastic gradient descent", IEEE TVCG 2019), in vectorised mini-batches:
    each mini-batch is a random perfect matching of the n points, so its n/2 pair updates
    touch disjoint points and equal the sequential per-pair updates

        r = mu (e_ij - h_ij) / 2 * (x_i - x_j) / e_ij,  x_i -= r,  x_j += r,
        mu = min(1, w_ij * eta_t),

    i.e. each pair is moved a fraction mu of the way to its target distance. A sweep is
    ``matchings`` mini-batches (O(matchings * n * d) work, ``matchings * n / 2`` calls'
    worth of ``dist_fn`` values); eta decays geometrically from ``step_max`` to
    ``step_min`` over ``max_iter`` sweeps (small steps, since ``init`` is already close:
    classical MDS). The per-sweep stress is measured on a fixed monitoring sample of
    ``eval_pairs`` pairs (common random numbers, so sweeps are compared on equal terms).

    Stopping rule: stop when the best monitored stress has not decreased by a relative
    ``tol`` for ``patience`` consecutive sweeps (``converged=True``), or after
    ``max_iter`` sweeps. The returned encoding is the best monitored iterate (the init
    included, so the monitored stress never exceeds the initial one).

    Reported ``stress`` / ``initial_stress`` / ``stress_ci`` are estimated on a *fresh*
    sample of ``eval_pairs`` pairs (the same pairs for both, so their comparison is
    paired), independent of the pairs that chose the iterate; ``stress_ci`` is the 95 %
    delta-method interval of :func:`sampled_stress`.

    Args:
        dist_fn: ``dist_fn(i_idx, j_idx) -> h`` for 1-D integer index arrays (on the
            device of ``init``), returning d_H of each pair (1-D float, >= 0); e.g. from
            square-root distributions ``sqrt(max(2 - 2 <s_i, s_j>, 0))`` without n x n.
        init: (n, d) starting configuration (classical MDS).
        weights_fn: optional ``weights_fn(i_idx, j_idx) -> w`` (see :func:`pair_weights`
            with ``pairs=``); weights of order 1.
        max_iter: most sweeps; also the length of the step-size schedule.
        tol, patience: stopping rule.
        matchings: mini-batches (random perfect matchings) per sweep.
        step_max, step_min: learning-rate schedule eta (per unit weight).
        eval_pairs: size of the monitoring sample and of the final estimation sample.
        seed: int or numpy Generator; indices are drawn on the host, so the same seed gives
            the same pairs on numpy and cupy.
        xp: array namespace; None infers it from ``init``.

    Returns:
        :class:`SmacofResult` with ``method="stochastic"``, ``solver="sgd"``,
        ``stress_ci`` and ``sampled_pairs`` set.
    """
    t0 = time.perf_counter()
    xp = array_namespace(init) if xp is None else xp
    x = xp.array(init, dtype=xp.float64, copy=True)
    _check_stochastic_options(xp, x, max_iter=max_iter, tol=tol, patience=patience, matchings=matchings,
                              eval_pairs=eval_pairs, step_max=step_max, step_min=step_min)
    n, d = (int(s) for s in x.shape)
    rng = _as_rng(seed)
    x -= xp.mean(x, axis=0)
    init_c = x.copy()
    monitor = _draw_pair_sample(xp, rng, n, eval_pairs, dist_fn, weights_fn)
    run = _sgd_sweeps(xp, x, rng, monitor, dist_fn, weights_fn, max_iter=max_iter, tol=tol, patience=patience,
                      matchings=matchings, step_max=step_max, step_min=step_min)
    final = _draw_pair_sample(xp, rng, n, eval_pairs, dist_fn, weights_fn)
    s_fin, ci = _ratio_ci(xp, *_sample_terms(xp, run.best_x, final))
    s_init, _ = _ratio_ci(xp, *_sample_terms(xp, init_c, final))
    best_x = run.best_x
    best_x -= xp.mean(best_x, axis=0)
    return SmacofResult(
        encoding=best_x,
        stress=s_fin,
        initial_stress=s_init,
        iterations=run.sweeps,
        converged=run.converged,
        seconds=time.perf_counter() - t0,
        history=tuple(run.history),
        best_iteration=run.best_iteration,
        method="stochastic",
        solver="sgd",
        rank=d,
        stress_ci=ci,
        sampled_pairs=int(eval_pairs),
    )
