"""posstats.estimates.sampling_variance: the unbiased estimate of Var sqrt(X) and of each
position's sampling variance, checked against exact expectations (Poisson and binomial
sums) and by simulation against corpora of known distributions."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.stats import binom, poisson

from posstats.estimates.noise import fitted_bias, split_half
from posstats.estimates.sampling_variance import (
    TABLE_MAX_COUNT,
    position_sampling_variance,
    sqrt_count_variance,
)
from posstats.geometry.hellinger import hellinger_sq
from posstats.testing import known_corpus


def _poisson_moments(lam: float) -> tuple[np.ndarray, np.ndarray, float]:
    k = np.arange(int(lam + 40 * np.sqrt(lam) + 60))
    p = poisson.pmf(k, lam)
    m = float((p * np.sqrt(k)).sum())
    return k, p, lam - m * m


@pytest.mark.parametrize("lam", [1e-3, 0.05, 0.5, 1.0, 2.5, 7.0, 30.0, 150.0, 390.0, 400.0, 410.0, 1200.0, 20000.0])
def test_the_estimate_is_unbiased_for_poisson_counts(lam):
    """E V(X) = Var sqrt(X) to 1e-4 relative at every lambda: the table (exact) below 400,
    the asymptotic series above, and across the junction."""
    k, p, var = _poisson_moments(lam)
    np.testing.assert_allclose((p * sqrt_count_variance(k)).sum(), var, rtol=1e-4)


@pytest.mark.parametrize("n", [200, 2000, 20000])
@pytest.mark.parametrize("prob", [1e-4, 1e-2, 0.05, 0.3])
def test_the_multinomial_factor_keeps_fixed_n_counts_nearly_unbiased(n, prob):
    k = np.arange(n + 1)
    pm = binom.pmf(k, n, prob)
    var = n * prob - float((pm * np.sqrt(k)).sum()) ** 2
    np.testing.assert_allclose((pm * sqrt_count_variance(k, total=n)).sum(), var, rtol=0.006)


def test_values_and_refusals():
    np.testing.assert_allclose(sqrt_count_variance([0, 1, 2, 3, 4]), [0, 1, 0, 0.5147186257614297, 0.0847190364032628])
    assert TABLE_MAX_COUNT == 400 and sqrt_count_variance(10**9) == pytest.approx(0.25, abs=1e-9)
    with pytest.raises(ValueError):
        sqrt_count_variance([-1])
    with pytest.raises(ValueError):
        sqrt_count_variance([0.5])


def test_position_variance_sparse_and_dense_agree_and_empty_rows_are_zero():
    rng = np.random.default_rng(0)
    dense = rng.poisson(0.7, size=(6, 50))
    dense[3] = 0
    a = position_sampling_variance(dense)
    b = position_sampling_variance(sp.csr_array(dense))
    np.testing.assert_allclose(a, b, rtol=1e-14)
    assert a[3] == 0.0
    n = dense.sum(1)
    manual = (sqrt_count_variance(dense) * (1 - dense / np.maximum(n, 1)[:, None])).sum(1) / np.maximum(n, 1)
    np.testing.assert_allclose(a, manual, rtol=1e-14)


def _relative_errors(tokens: int, seeds: range) -> tuple[np.ndarray, np.ndarray]:
    """Per corpus (60 stationary positions, V = 5,000, Zipf 1.1): the mean corrected d_H^2
    over the 1,770 pairs relative to the mean plug-in d_H^2 (the plug-in bias, since the
    truth is 0), with this module's b_i and with the power law of split quarters it replaced."""
    from posstats.testing import split_counts

    off = ~np.eye(60, dtype=bool)
    new, old = [], []
    for seed in seeds:
        kc = known_corpus("stationary", 60, tokens=tokens, seed=seed)
        c = kc.counts.matrix
        d2 = hellinger_sq(c)
        plugin = d2[off].mean()
        b = position_sampling_variance(c)
        new.append((d2 - b[:, None] - b[None, :])[off].mean() / plugin)
        parts = split_counts(kc.counts, parts=4, seed=seed)
        old_b = _power_law_bias(parts)
        old.append((d2 - old_b[:, None] - old_b[None, :])[off].mean() / plugin)
    return np.array(new), np.array(old)


def _power_law_bias(parts) -> np.ndarray:
    """The bias of the previous noise floor: a power law fitted to split halves and quarters."""
    from posstats.estimates.noise import _paired_d2, _rows_csr, _union

    rows = np.arange(parts[0].positions)
    mats = [_rows_csr(p, rows) for p in parts]
    sizes = np.stack([np.asarray(m.sum(axis=1)).ravel().astype(np.float64) for m in mats])
    total = mats[0] + mats[1] + mats[2] + mats[3]
    split = split_half(lambda a, b: _paired_d2(_union(mats, a), _union(mats, b)), sizes)
    return fitted_bias(split, sizes.sum(axis=0), np.diff(sp.csr_array(total).indptr).astype(np.float64))[0]


@pytest.mark.parametrize("tokens", [200, 2000, 20000])
def test_identical_positions_are_corrected_to_zero_on_average(tokens):
    """Calibration, CI-sized: the mean corrected d_H^2 between positions of one distribution
    is within 2 % of the plug-in bias (the issue's target), averaged over 5 corpora.

    One corpus' relative error has a standard deviation of 0.8 % at N = 200 and 0.3 % above
    (measured over 20 seeds), so the 5-corpus mean's is below 0.37 %: 2 % is more than 5
    standard deviations, a false failure below 1e-7. The power law it replaced misses the
    same bound at N >= 2,000 (+2.9 % and +9.4 % in the issue's measurements): the test can fail.
    """
    new, old = _relative_errors(tokens, range(100 * tokens, 100 * tokens + 5))
    assert abs(new.mean()) < 0.02, new
    if tokens >= 2000:
        assert abs(old.mean()) > 0.02, old
