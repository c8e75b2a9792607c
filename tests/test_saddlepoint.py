"""The standout test's tail (posstats.estimates.saddlepoint): the cumulant generating function
is right to its derivatives, and the calibrated z has the law of a standard normal's tail on
samples drawn from the pool itself, where the normal z does not."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import ndtr

from posstats.estimates.saddlepoint import JointCgf, calibrated_z, lower_tail_z
from posstats.estimates.verdict import null_distance_to_pool


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
