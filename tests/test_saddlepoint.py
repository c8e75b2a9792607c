"""The standout test's tail (posstats.estimates.saddlepoint): the cumulant generating function
is right to its derivatives, and the calibrated z has the law of a standard normal's tail on
samples drawn from the pool itself, where the normal z does not."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import ndtr

from posstats.estimates.saddlepoint import JointCgf, calibrated_z, lower_tail_z
from posstats.estimates.standout import null_distance_to_pool


def _zipf(vocab: int) -> np.ndarray:
    p = 1.0 / (np.arange(vocab) + 1.0) ** 1.1
    return p / p.sum()


def test_cgf_at_zero_gives_the_poisson_moments():
    p = _zipf(300)
    cgf = JointCgf(p, 50.0)
    value, grad, hess = cgf(0.0, 0.0)
    assert value == pytest.approx(0.0, abs=1e-10)
    assert grad[1] == pytest.approx(50.0, rel=1e-10)  # E T = N
    assert hess[1, 1] == pytest.approx(50.0, rel=1e-10)  # Var T = N (Poisson)
    # E W and Var W against a direct sum over each token's Poisson mass
    from scipy.stats import poisson

    k = np.arange(200)
    mean = sum(math.sqrt(pv) * float(poisson.pmf(k, 50 * pv) @ np.sqrt(k)) for pv in p)
    var = sum(pv * float(poisson.pmf(k, 50 * pv) @ k - (poisson.pmf(k, 50 * pv) @ np.sqrt(k)) ** 2) for pv in p)
    assert grad[0] == pytest.approx(mean, rel=1e-9)
    assert hess[0, 0] == pytest.approx(var, rel=1e-8)


@pytest.mark.parametrize("point", [(-3.0, 0.4), (-20.0, 0.8), (1.5, -0.2)])
def test_cgf_gradient_and_hessian_match_finite_differences(point):
    cgf = JointCgf(_zipf(500), 200.0)
    s, t = point
    h = 1e-5
    _, grad, hess = cgf(s, t)
    for axis in range(2):
        e = np.zeros(2)
        e[axis] = h
        up, g_up, _ = cgf(*(np.array(point) + e))
        down, g_down, _ = cgf(*(np.array(point) - e))
        assert grad[axis] == pytest.approx((up - down) / (2 * h), rel=1e-6)
        assert hess[:, axis] == pytest.approx((g_up - g_down) / (2 * h), rel=1e-5)


def test_calibrated_z_is_below_the_normal_z_in_the_tail_that_matters():
    """d is skewed to the right (W, a sum of square roots, to the left): the normal tail is too
    light, so a calibrated z is smaller than the normal z above the mean, and grows with it."""
    p = _zipf(2000)
    for tokens in (50.0, 2000.0):
        mean, sd = null_distance_to_pool(p, np.array([tokens]))
        z = np.array([0.0, 2.0, 3.0, 5.0, 8.0])
        zc = calibrated_z(z, np.full(5, tokens), p, np.full(5, mean[0]), np.full(5, sd[0]))
        assert zc[0] == 0.0
        assert np.all(zc[1:] < z[1:]) and np.all(np.diff(zc) > 0)
        assert 4.0 < zc[3] < 5.0  # a normal z of 5 is a tail about 5-50 times more likely


def test_lower_tail_z_is_none_above_the_mean():
    p = _zipf(100)
    cgf = JointCgf(p, 100.0)
    _, grad, _ = cgf(0.0, 0.0)
    assert lower_tail_z(cgf, grad[0] * 1.01) is None
    assert lower_tail_z(cgf, grad[0] * 0.99)[0] > 0


def test_calibrated_tail_matches_samples_from_the_pool():
    """100,000 rows of N = 50 tokens drawn from a Zipf pool (V = 2,000): the count of rows with
    calibrated z above 3 and 3.5 is Binomial(100,000, Phi(-z)) under a right tail; the band
    is +- 4.5 binomial standard deviations (a seeded draw; a wrong tail of the size the
    normal law makes here, 1.7x at z = 3, falls far outside)."""
    vocab, tokens, rows = 2000, 50, 100_000
    p = _zipf(vocab)
    cdf = np.cumsum(p)
    cdf /= cdf[-1]
    rng = np.random.default_rng(20261126)
    mean, sd = null_distance_to_pool(p, np.array([float(tokens)]))
    d = np.empty(rows)
    for lo in range(0, rows, 10_000):
        draws = np.searchsorted(cdf, rng.random((10_000, tokens)), side="right")
        c = np.zeros((10_000, vocab))
        np.add.at(c, (np.repeat(np.arange(10_000), tokens), draws.ravel()), 1.0)
        d[lo : lo + 10_000] = 2 - 2 * (np.sqrt(c / tokens) @ np.sqrt(p))
    z = (d - mean[0]) / sd[0]
    zc = calibrated_z(z, np.full(rows, float(tokens)), p, np.full(rows, mean[0]), np.full(rows, sd[0]))
    for level in (3.0, 3.5):
        expected = rows * float(ndtr(-level))
        band = 4.5 * math.sqrt(expected * (1 - expected / rows))
        assert abs(int((zc > level).sum()) - expected) < band, (level, int((zc > level).sum()), expected)
    # the normal z (what posstats read before) is outside the band at z = 3
    expected = rows * float(ndtr(-3.0))
    assert int((z > 3.0).sum()) > expected + 4.5 * math.sqrt(expected)


def test_occupancies_that_differ_interpolate_between_nodes():
    p = _zipf(1000)
    occ = np.array([20.0, 20.0, 400.0, 5000.0, 5000.0])
    mean, sd = null_distance_to_pool(p, occ)
    z = np.full(5, 5.0)
    zc = calibrated_z(z, occ, p, mean, sd)
    assert zc[0] == zc[1] and zc[3] == zc[4]
    # each end agrees with a table built for it alone
    alone = calibrated_z(z[:1], occ[:1], p, mean[:1], sd[:1])
    assert zc[0] == pytest.approx(alone[0], abs=1e-9)
    assert zc[3] == pytest.approx(calibrated_z(z[3:4], occ[3:4], p, mean[3:4], sd[3:4])[0], abs=1e-9)


def _exact_lower_tail(p: np.ndarray, tokens: int, w: float) -> float:
    """P(sum_v sqrt(p_v x_v) <= w) for x ~ Multinomial(tokens, p), by enumeration (V = 4)."""
    import itertools

    from scipy.stats import multinomial

    total = 0.0
    for head in itertools.product(range(tokens + 1), repeat=p.size - 1):
        if sum(head) <= tokens:
            x = np.array([*head, tokens - sum(head)])
            if float(np.sqrt(p * x).sum()) <= w:
                total += float(multinomial.pmf(x, tokens, p))
    return total


@pytest.mark.parametrize("rare_share", [0.0, 0.2])  # every token tilted; the two rarest drawn as under the null
def test_importance_tail_is_unbiased_against_enumeration(rare_share):
    """The importance-sampling tail is exact in expectation: against the multinomial's law
    enumerated outright, within 4 of its own standard errors, at tails of 1e-6 and 1e-9."""
    from posstats.estimates.saddlepoint import importance_tail

    p, tokens = np.array([0.5, 0.3, 0.15, 0.05]), 12
    for w in (2.0331, 1.5421):
        exact = _exact_lower_tail(p, tokens, w)
        estimate, se = importance_tail(p, tokens, w, samples=100_000, seed=1, rare_share=rare_share)
        assert 1e-10 < exact < 1e-5 and se < 0.1 * exact
        assert abs(estimate - exact) < 4 * se, (w, estimate, exact, se)


@pytest.mark.parametrize("tokens", [20, 200, 2000])
def test_saddlepoint_tail_agrees_with_importance_sampling_where_the_threshold_reads_it(tokens):
    """Where the standout threshold reads the tail (z* about 5, P about 3e-7), a row's own
    saddlepoint solve is within 10 % of the importance-sampling tail (measured: within 1-5 %
    at N = 20 to 2,000; benchmarks/bench_standout_tail.py); the sampling error is 4 se."""
    from scipy.special import ndtri

    from posstats.estimates.saddlepoint import importance_tail

    p = _zipf(2000)
    mean, sd = null_distance_to_pool(p, np.array([float(tokens)]))
    cgf = JointCgf(p, tokens)
    for target in (4.0, 5.0):  # find the normal z whose saddlepoint z* is the target
        lo, hi = target, target + 4.0
        for _ in range(30):
            mid = 0.5 * (lo + hi)
            zs = lower_tail_z(cgf, math.sqrt(tokens) * (1 - (mean[0] + mid * sd[0]) / 2))[0]
            lo, hi = (mid, hi) if zs < target else (lo, mid)
        w = math.sqrt(tokens) * (1 - (mean[0] + lo * sd[0]) / 2)
        saddle = float(ndtr(-lower_tail_z(cgf, w)[0]))
        estimate, se = importance_tail(p, tokens, w, samples=40_000, seed=tokens)
        assert se < 0.05 * estimate
        assert abs(saddle / estimate - 1) < 0.10 + 4 * se / estimate, (target, saddle, estimate, se)
        assert float(-ndtri(estimate)) == pytest.approx(target, abs=0.05)


def test_rows_near_the_threshold_are_solved_one_by_one():
    """At N = 20 the tabulated correction is interpolated across the support's edge: a row
    at normal z = 6 reads z* = 5.6 from the table where its own solve (and importance
    sampling) says 5.2. Rows within [-0.5, +1] of a threshold take their own solve: the
    decision then follows the row's tail, not the table's."""
    from posstats.estimates.saddlepoint import solved_near

    p = _zipf(5000)
    occ = np.full(4, 20.0)
    mean, sd = null_distance_to_pool(p, occ)
    z = np.array([3.0, 5.8, 6.0, 6.3])
    table = calibrated_z(z, occ, p, mean, sd)
    cgf = JointCgf(p, 20.0)
    own = np.array([lower_tail_z(cgf, math.sqrt(20) * (1 - (mean[0] + zz * sd[0]) / 2))[0] for zz in z])
    assert table[2] > own[2] + 0.3  # the table reads 5.6 where the row's own tail says 5.2
    solved, count = solved_near(table, z, occ, p, mean, sd, threshold=5.4)
    near = (table >= 5.4 - 0.5) & (table <= 5.4 + 1.0)
    assert count == int(near.sum()) >= 2 and not near.all()
    np.testing.assert_allclose(solved[near], own[near], atol=1e-9)
    np.testing.assert_array_equal(solved[~near], table[~near])  # far rows keep the table's value
    capped, count = solved_near(table, z, occ, p, mean, sd, threshold=5.4, limit=1)
    assert count == 1 and np.count_nonzero(capped != table) == 1
    assert table[2] > 5.4 > solved[2]  # at a threshold of 5.4 the table alone would call it a standout


def test_wide_windows_summed_on_a_stride_give_the_same_cgf(monkeypatch):
    """A token's series wider than MAX_TERMS counts is summed every h-th count, weighted by
    h: with the limit lowered to 512 (N p_v up to 1e4 on strides of up to 8, 12 or more
    terms per standard deviation) K, its gradient and Hessian equal the full sums to 1e-9,
    and a row of 1e12 tokens builds and evaluates in a moment (it held 3e7 terms a token)."""
    import time

    from posstats.estimates import saddlepoint

    p = 1.0 / (np.arange(200) + 2.7) ** 1.1
    p /= p.sum()
    full = saddlepoint.JointCgf(p, 1e5)
    assert max(c.k.shape[1] for c in full.chunks) <= saddlepoint.MAX_TERMS  # every term at stride 1 here
    monkeypatch.setattr(saddlepoint, "MAX_TERMS", 512)
    strided = saddlepoint.JointCgf(p, 1e5)
    assert max(np.diff(c.k, axis=1).max() for c in strided.chunks) >= 8  # the head is strided
    for s, t in ((0.0, 0.0), (-0.5, 1e-4), (-2.0, -3e-4)):
        for a, b in zip(full(s, t), strided(s, t), strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-9 * max(float(np.max(np.abs(a))), 1.0))
    monkeypatch.undo()
    t0 = time.perf_counter()
    huge = saddlepoint.JointCgf(np.array([0.5, 0.5]), 1e12)
    value, grad, _ = huge(0.0, 0.0)
    assert time.perf_counter() - t0 < 5.0 and max(c.k.shape[1] for c in huge.chunks) <= saddlepoint.MAX_TERMS
    np.testing.assert_allclose(grad[1], 1e12, rtol=1e-9)  # E T = N
    assert abs(value) < 1e-6  # K(0, 0) = log 1


def test_log_poisson_is_exact_at_large_means():
    """Loader's form above 1e5 agrees with the direct one where both are exact (lam = 1e5,
    1e6: direct terms ~1e7, error ~1e-9), and at lam = 5e11 it sums to 1 over the window
    (the direct form's terms reach 1e13 there and cancel to an error of about 1e-3)."""
    from scipy.special import gammaln

    from posstats.estimates.saddlepoint import _log_poisson

    for lam in (1e5, 1e6):
        k = lam + np.arange(-2000.0, 2000.0, 7.0)
        direct = k * np.log(lam) - lam - gammaln(k + 1.0)
        np.testing.assert_allclose(_log_poisson(k, np.full_like(k, lam)), direct, rtol=0, atol=1e-7)
    lam = 5e11
    step = 1000.0
    k = lam + np.arange(-20 * np.sqrt(lam), 20 * np.sqrt(lam), step)
    total = float(np.exp(_log_poisson(k, np.full_like(k, lam))).sum() * step)
    assert abs(total - 1.0) < 1e-9
