"""Benchmark: estimators of sqrt(p) for the far-pair remainder of the corrected distances.

    python benchmarks/bench_sqrt_estimators.py [--tokens 2000,20000] [--vocab 5000]

The corrected squared Hellinger distance subtracts each position's own bias from the plug-in
``2 - 2 <s_i, s_j>``; what is left for truly different pairs is the *remainder*
``sum_v (E g(c_iv) - E g(c_jv))^2 - (sqrt p_iv - sqrt p_jv)^2`` (docs/calibration.md). This
computes it exactly (binomial sums, no simulation), with ``c ~ Binomial(N, p)`` per token, for
the plug-in ``g(c) = sqrt(c / N)`` (the baseline, what posstats uses) and for
polynomial-approximation estimators in the manner of Jiao, Venkat, Han and Weissman (2015):
below ``c0`` counts the unbiased estimate ``sum_k a_k (c)_k / (N)_k`` of a degree-``K``
polynomial without constant term fitted to ``sqrt`` on ``[0, 2 c0 / N]`` (Chebyshev-weighted
least squares), above it the plug-in with its second-order correction
``(1 - c/N) / (8 sqrt(c N))``; and (``--shifts``) the shifted square root
``sqrt((c + a) / N)`` for ``c >= 1`` (0 at ``c = 0``), whose shift ``a`` offsets the plug-in's
``-1 / (8 sqrt(N p))`` for well-sampled tokens (Anscombe's ``a = 3/8`` in the variance
stabilising transform); and (``--jackknife``) Quenouille's delete-one jackknife, which the
calibration issue named: per entry, ``J(c) = N g(c) - (N - 1) E[g(c - B) | c]`` with
``g(c) = sqrt(c / N)`` before and ``sqrt(c' / (N - 1))`` after deleting one of the N tokens
(``B`` = 1 when the deleted token is this entry's, probability ``c / N``), as one more
estimator of ``sqrt(p)`` under the exact per-position correction; and the two-sample
jackknife of the whole plug-in distance, ``T_J = T + (N - 1)(T - mean_i T_(-1)) + (N -
1)(T - mean_j T_(-1))`` over deleting one token at either position, which needs no
per-position correction of its own. Since ``T = 2 - 2 sum_v s(x_v) s(y_v)`` before and
after a deletion, ``T_J = 2 - 2 sum_v [J(x_v) s(y_v) + s(x_v) J(y_v) - s(x_v) s(y_v)]``: a
pair-aware (bilinear) correction. Its rows (``two_sample_jackknife``) give its exact error on
identical positions too, where the per-position correction posstats uses is unbiased.

Pairs (the truths of ``posstats.testing.known_corpus``, V = ``--vocab``, Zipf 1.1): the drift's
ends (positions 0 and 63 of 64), drift 16 apart, a planted position against the base. For
each (N, estimator, pair): ``bias`` of ``2 - 2 <g_i, g_j>`` without any per-position
correction, ``remainder`` after the exact per-position correction (and its split by the
token's mean count on the rarer side, ``N min(p_v, q_v)``: below 1, 1-10, 10 and more), and
the standard deviation of the estimate. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
from scipy.special import gammaln
from scipy.stats import binom

from posstats.testing import known_corpus


def sqrt_polynomial(degree: int, /) -> np.ndarray:
    """(degree,) ``b_1..b_K`` of ``Q(t) = sum_k b_k t^k ~ sqrt(t)`` on [0, 1], ``Q(0) = 0``,
    by least squares on 2,000 Chebyshev nodes (near the minimax fit)."""
    j = np.arange(2000)
    t = (1 - np.cos(np.pi * (j + 0.5) / 2000)) / 2
    design = np.stack([t**k for k in range(1, degree + 1)], axis=1)
    coef, *_ = np.linalg.lstsq(design, np.sqrt(t), rcond=None)
    return coef


def plugin(n: int, /) -> np.ndarray:
    """(n + 1,) ``sqrt(c / n)`` for c = 0..n."""
    return np.sqrt(np.arange(n + 1) / n)


def polynomial_estimator(n: int, c0: int, degree: int, /) -> np.ndarray:
    """(n + 1,) the hybrid estimator's value at every count c = 0..n (module docstring)."""
    c = np.arange(n + 1, dtype=np.float64)
    delta = 2.0 * c0 / n
    a = [math.sqrt(delta) * b / delta**k for k, b in enumerate(sqrt_polynomial(degree), start=1)]
    g = np.sqrt(c / n) + np.where(c > 0, (1 - c / n) / (8 * np.sqrt(np.maximum(c, 1) * n)), 0.0)
    poly = np.zeros(n + 1)
    for k, ak in enumerate(a, start=1):
        falling = gammaln(c + 1) - gammaln(np.maximum(c - k + 1, 1)) - (gammaln(n + 1) - gammaln(n - k + 1))
        poly += ak * np.where(c >= k, np.exp(falling), 0.0)  # (c)_k / (n)_k: unbiased for p^k
    return np.where(c <= c0, poly, g)


def shifted_estimator(n: int, shift: float, /) -> np.ndarray:
    """(n + 1,) ``sqrt((c + shift) / n)`` for c = 1..n, 0 at c = 0 (an unseen token adds nothing)."""
    c = np.arange(n + 1, dtype=np.float64)
    return np.where(c > 0, np.sqrt((c + shift) / n), 0.0)


def jackknife_estimator(n: int, /) -> np.ndarray:
    """(n + 1,) the delete-one jackknife ``J(c) = n s(c) - (n - 1) h(c)`` of ``s(c) =
    sqrt(c / n)``, ``h(c) = (c / n) sqrt((c - 1) / (n - 1)) + (1 - c / n) sqrt(c / (n - 1))``
    the mean of ``s`` over the n samples with one token deleted (module docstring)."""
    c = np.arange(n + 1, dtype=np.float64)
    h = (c / n) * np.sqrt(np.maximum(c - 1, 0) / (n - 1)) + (1 - c / n) * np.sqrt(c / (n - 1))
    return n * np.sqrt(c / n) - (n - 1) * h


def two_sample_jackknife_errors(p: np.ndarray, q: np.ndarray, n: int, /) -> dict:
    """Truth, exact bias and sd of the two-sample jackknife ``T_J`` of the plug-in ``d_H^2``
    between positions of n tokens each drawn from ``p`` and ``q`` (module docstring), per
    token ``J(x) s(y) + s(x) J(y) - s(x) s(y)``, tokens independent binomials as in
    :func:`pair_errors`; also the bias as a share of the plug-in's."""
    s, jack = plugin(n), jackknife_estimator(n)
    truth = float(((np.sqrt(p) - np.sqrt(q)) ** 2).sum())
    es_p, vs_p = moments(s, p, n)
    es_q, vs_q = moments(s, q, n)
    ej_p, vj_p = moments(jack, p, n)
    ej_q, vj_q = moments(jack, q, n)
    esj_p, esj_q = moments(s * jack, p, n)[0], moments(s * jack, q, n)[0]
    mean_v = ej_p * es_q + es_p * ej_q - es_p * es_q
    # E[(J_x s_y + s_x (J_y - s_y))^2], x ~ p and y ~ q independent
    second_v = ((vj_p + ej_p**2) * q + p * (vj_q + ej_q**2 - 2 * esj_q + q)
                + 2 * esj_p * (esj_q - q))
    plugin_bias = 2 - 2 * float(es_p @ es_q) - truth
    bias = 2 - 2 * float(mean_v.sum()) - truth
    return {"d2": round(truth, 5), "bias": round(bias, 5),
            "share_of_plugin_bias": round(bias / plugin_bias, 4) if plugin_bias else None,
            "sd": round(2 * math.sqrt(max(float((second_v - mean_v**2).sum()), 0.0)), 5)}


def moments(g: np.ndarray, p: np.ndarray, n: int, /, *, chunk: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """((V,) E g(c), (V,) Var g(c)) with ``c ~ Binomial(n, p_v)``: the binomial sums over the
    counts within 12 sd (and 12 counts) of the mean, whose outside mass is below 1e-30."""
    mean, var = np.zeros(p.size), np.zeros(p.size)
    order = np.argsort(p)  # a chunk of near-equal p shares one short range of counts
    for a in range(0, p.size, chunk):
        idx = order[a : a + chunk]
        lo_p, hi_p = float(p[idx[0]]), float(p[idx[-1]])
        lo = max(0, math.floor(n * lo_p - 12 * math.sqrt(n * lo_p) - 12))
        hi = min(n, math.ceil(n * hi_p + 12 * math.sqrt(n * hi_p) + 12))
        k = np.arange(lo, hi + 1)
        w = binom.pmf(k[None, :], n, p[idx, None])
        mean[idx] = w @ g[lo : hi + 1]
        var[idx] = w @ g[lo : hi + 1] ** 2 - mean[idx] ** 2
    return mean, var


# bounds of the rarer side's mean count N min(p_v, q_v) by which the remainder is split
_RARER_BINS = (0.0, 1.0, 10.0, math.inf)


def pair_errors(g: np.ndarray, p: np.ndarray, q: np.ndarray, n: int, /) -> dict:
    """Truth, bias without correction, remainder after the exact per-position correction, sd,
    and the remainder split by the token's mean count on its rarer side, ``N min(p_v, q_v)``
    (``remainder_by_rarer_count``: below 1, 1-10, 10 and more), and its part below 1 split by
    the other side's mean count (``rarer_below_1_by_other_side``: below 1 too, or not)."""
    truth_v = (np.sqrt(p) - np.sqrt(q)) ** 2
    ep, vp = moments(g, p, n)
    eq, vq = moments(g, q, n)
    remainder_v = (ep - eq) ** 2 - truth_v
    rarer = n * np.minimum(p, q)
    by_count = {f"{lo:g}-{hi:g}": round(float(remainder_v[(rarer >= lo) & (rarer < hi)].sum()), 5)
                for lo, hi in zip(_RARER_BINS[:-1], _RARER_BINS[1:])}
    # of the tokens seen less than once on their rarer side: also less than once on the other
    # (whether two positions share them is not identifiable from counts), or more there
    other = n * np.maximum(p, q)
    by_sides = {side: round(float(remainder_v[(rarer < 1.0) & pick].sum()), 5)
                for side, pick in (("both_below_1", other < 1.0), ("other_at_least_1", other >= 1.0))}
    truth = float(truth_v.sum())
    return {"d2": round(truth, 5), "bias": round(2 - 2 * float(ep @ eq) - truth, 5),
            "remainder": round(float(remainder_v.sum()), 5), "remainder_by_rarer_count": by_count,
            "rarer_below_1_by_other_side": by_sides,
            "sd": round(2 * math.sqrt(float(vp @ eq**2 + vq @ ep**2 + vp @ vq)), 5)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="2000,20000", help="comma-separated N (tokens a position)")
    ap.add_argument("--vocab", type=int, default=5000)
    ap.add_argument("--estimators", default="4:4,8:6", help="comma-separated c0:K of the polynomial estimators")
    ap.add_argument("--shifts", default="", help="comma-separated shifts a of the shifted square root (none by default)")
    ap.add_argument("--jackknife", action="store_true",
                    help="also the delete-one jackknife: of sqrt(p) per entry, and of the whole distance (two-sample)")
    args = ap.parse_args(argv)
    drift = known_corpus("drift", 64, tokens=10, seed=0, vocab=args.vocab)
    planted = known_corpus("planted", 64, tokens=10, seed=0, vocab=args.vocab)
    pairs = {"drift_ends": (drift.mu(0), drift.mu(63)), "drift_16_apart": (drift.mu(0), drift.mu(16)),
             "planted_vs_base": (planted.mu(0), planted.mu(10))}
    t0 = time.perf_counter()
    rows, jackknife_rows = [], []
    for n in (int(float(x)) for x in args.tokens.split(",")):
        estimators = {"plugin": plugin(n)}
        for spec in args.estimators.split(","):
            c0, degree = (int(x) for x in spec.split(":"))
            estimators[f"polynomial c0={c0} K={degree}"] = polynomial_estimator(n, c0, degree)
        for shift in (float(x) for x in args.shifts.split(",") if x):
            estimators[f"shifted a={shift:g}"] = shifted_estimator(n, shift)
        if args.jackknife:
            estimators["jackknife"] = jackknife_estimator(n)
            with_identical = {"identical": (drift.mu(0), drift.mu(0)), **pairs}
            jackknife_rows.append({"N": n, **{k: two_sample_jackknife_errors(p, q, n)
                                              for k, (p, q) in with_identical.items()}})
        for name, g in estimators.items():
            rows.append({"N": n, "estimator": name, **{k: pair_errors(g, p, q, n) for k, (p, q) in pairs.items()}})
    out = {"benchmark": "sqrt_estimators", "vocab": args.vocab, "baseline": "plugin", "rows": rows}
    if args.jackknife:
        out["two_sample_jackknife"] = jackknife_rows
    print(json.dumps(out | {"seconds": round(time.perf_counter() - t0, 1)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
