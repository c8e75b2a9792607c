"""Minimum separation, monotonicity (exact vs O(n^3) brute force, sampled) and corpus checks,
on every backend (the ``xp`` fixture; positions stay host arrays)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posstats.geometry.diagnostics import (
    CorpusDiagnostics,
    Monotonicity,
    Separation,
    corpus_diagnostics,
    min_separation,
    monotonicity_of_encoding,
    monotonicity_violation_rate,
)


def brute_counts(dist, pos):
    """(violations, triples) by the definition: ordered distinct (i, j, k), |i-j| < |i-k|."""
    dist = np.asarray(dist, dtype=np.float64)
    pos = np.asarray(pos)
    n = pos.shape[0]
    violations = triples = 0
    idx = np.arange(n)
    for i in range(n):
        s = np.abs(pos - pos[i])
        valid = (s[:, None] < s[None, :]) & (idx[:, None] != i) & (idx[None, :] != i)
        triples += int(valid.sum())
        violations += int((valid & (dist[i][:, None] > dist[i][None, :])).sum())
    return violations, triples


def brute_triple_loop(dist, pos):
    """The same by an explicit O(n^3) loop (a second, independent oracle for tiny n)."""
    n = len(pos)
    v = t = 0
    for i in range(n):
        for j in range(n):
            for k in range(n):
                if len({i, j, k}) == 3 and abs(pos[i] - pos[j]) < abs(pos[i] - pos[k]):
                    t += 1
                    v += dist[i][j] > dist[i][k]
    return v, t


def naive_distances(p):
    return np.sqrt(((p[:, None, :] - p[None, :, :]) ** 2).sum(axis=2))


# ---------------------------------------------------------------------------------------
# monotonicity: exact


@pytest.mark.parametrize("n", [12, 17, 25])
@pytest.mark.parametrize("levels", [2, 3, 5])
def test_exact_equals_triple_loop_with_ties(xp, n, levels):
    rng = np.random.default_rng(n * 10 + levels)
    dist = rng.integers(0, levels, (n, n)).astype(np.float64)  # many ties in distance
    pos = np.arange(n)  # every anchor has ties in sequence distance (left and right)
    got = monotonicity_violation_rate(xp.asarray(dist), positions=pos)
    v, t = brute_triple_loop(dist.tolist(), pos.tolist())
    assert (got.violations, got.triples) == (v, t)
    np.testing.assert_allclose(got.rate, v / t, rtol=1e-15)
    assert got.method == "exact"
    assert got.ci_low == got.rate == got.ci_high


@pytest.mark.parametrize("n", [3, 16, 17, 33, 70, 129])
def test_exact_equals_brute_force_across_merge_levels(xp, n):
    rng = np.random.default_rng(n)
    dist = rng.integers(0, 6, (n, n)).astype(np.float64)
    pos = np.sort(rng.choice(4 * n, n, replace=False))
    got = monotonicity_violation_rate(xp.asarray(dist), positions=pos)
    assert (got.violations, got.triples) == brute_counts(dist, pos)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 24),
    levels=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
    shuffle=st.booleans(),
)
def test_property_exact_equals_brute_force(xp, n, levels, seed, shuffle):
    rng = np.random.default_rng(seed)
    dist = rng.integers(0, levels, (n, n)).astype(np.float64)
    pos = rng.choice(3 * n + 1, n, replace=False)
    if not shuffle:
        pos = np.sort(pos)
    got = monotonicity_violation_rate(xp.asarray(dist), positions=pos)
    v, t = brute_counts(dist, pos)
    assert (got.violations, got.triples) == (v, t)
    if t == 0:
        assert math.isnan(got.rate)
    else:
        assert got.rate == v / t


def test_monotone_and_antimonotone_matrices(xp):
    n = 40
    lag = xp.asarray(np.abs(np.subtract.outer(np.arange(n), np.arange(n))).astype(np.float64))
    assert monotonicity_violation_rate(lag).rate == 0.0
    assert monotonicity_violation_rate(xp.sqrt(lag)).rate == 0.0
    assert monotonicity_violation_rate(n - lag).rate == 1.0
    # Ties are not violations: a constant matrix has none.
    assert monotonicity_violation_rate(xp.ones((n, n))).rate == 0.0


def test_positions_give_sequence_distance(xp):
    # Rows 0..3 sit at positions 0, 1, 10, 11: distances that follow positions are monotone,
    # distances that follow row indices are not.
    pos = np.array([0, 1, 10, 11])
    by_pos = np.abs(np.subtract.outer(pos, pos)).astype(float)
    by_row = np.abs(np.subtract.outer(np.arange(4), np.arange(4))).astype(float) ** 3
    assert monotonicity_violation_rate(xp.asarray(by_pos), positions=pos).rate == 0.0
    v, t = brute_counts(by_row, pos)
    got = monotonicity_violation_rate(xp.asarray(by_row), positions=pos)
    assert (got.violations, got.triples) == (v, t)


def test_small_n_has_no_triples(xp):
    for n in (0, 1, 2):
        got = monotonicity_violation_rate(xp.zeros((n, n)))
        assert got.triples == 0
        assert math.isnan(got.rate)


@pytest.mark.parametrize(
    ("positions", "match"),
    [([0, 0, 1, 2], "distinct"), ([0, 1, 2], "one entry per row"), ([0.0, 1.0, 2.0, 3.0], "integers")],
)
def test_bad_positions_raise(xp, positions, match):
    with pytest.raises(ValueError, match=match):
        monotonicity_violation_rate(xp.zeros((4, 4)), positions=positions)


def test_non_square_and_non_finite_raise(xp):
    with pytest.raises(ValueError, match="square"):
        monotonicity_violation_rate(xp.zeros((3, 4)))
    d = np.zeros((5, 5))
    d[1, 2] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        monotonicity_violation_rate(xp.asarray(d))


def test_random_encoding_is_about_one_half(xp):
    p = np.random.default_rng(0).standard_normal((300, 32))
    got = monotonicity_of_encoding(xp.asarray(p))
    assert got.method == "exact"
    assert 0.45 < got.rate < 0.55


def test_encoding_path_equals_matrix_path(xp):
    rng = np.random.default_rng(1)
    p = rng.standard_normal((90, 6))
    pos = np.sort(rng.choice(500, 90, replace=False))
    a = monotonicity_of_encoding(xp.asarray(p), positions=pos)
    b = monotonicity_violation_rate(xp.asarray(naive_distances(p)), positions=pos)
    assert (a.violations, a.triples) == (b.violations, b.triples) == brute_counts(naive_distances(p), pos)


def test_alibi_like_rank_one_encoding_is_exactly_monotone(xp):
    slopes = 2.0 ** -np.arange(1, 9)
    p = np.multiply.outer(np.arange(500.0), slopes)
    assert monotonicity_of_encoding(xp.asarray(p)).violations == 0


# ---------------------------------------------------------------------------------------
# monotonicity: sampled


def test_sampled_contains_exact_within_its_interval(xp):
    rng = np.random.default_rng(2)
    n = 80
    # A partly monotone matrix (rate well away from 0 and 0.5) with ties.
    lag = np.abs(np.subtract.outer(np.arange(n), np.arange(n)))
    dist = xp.asarray(np.round(lag / 8 + rng.integers(0, 4, (n, n))))
    exact = monotonicity_violation_rate(dist)
    sampled = monotonicity_violation_rate(dist, exact_limit=10, samples=200_000, seed=3)
    assert sampled.method == "sampled"
    assert sampled.triples == 200_000
    assert sampled.ci_low <= sampled.rate <= sampled.ci_high
    assert sampled.ci_low <= exact.rate <= sampled.ci_high
    assert sampled.ci_high - sampled.ci_low < 0.01
    again = monotonicity_violation_rate(dist, exact_limit=10, samples=200_000, seed=3)
    assert again == sampled  # seeded


def test_sampled_encoding_path_matches_matrix_path(xp):
    p = np.random.default_rng(4).standard_normal((200, 5))
    pos = np.arange(200) * 3
    a = monotonicity_of_encoding(xp.asarray(p), positions=pos, exact_limit=50, samples=50_000, seed=9)
    b = monotonicity_violation_rate(
        xp.asarray(naive_distances(p)), positions=pos, exact_limit=50, samples=50_000, seed=9
    )
    assert a == b
    exact = monotonicity_of_encoding(xp.asarray(p), positions=pos)
    # Unbiased: within 4 standard errors (a 95 % interval misses 1 seed in 20).
    assert abs(a.rate - exact.rate) <= 4 * math.sqrt(exact.rate * (1 - exact.rate) / a.triples)


def test_sampled_monotone_matrix_has_zero_rate_and_tight_interval(xp):
    n = 100
    lag = np.abs(np.subtract.outer(np.arange(n), np.arange(n))).astype(float)
    got = monotonicity_violation_rate(xp.asarray(lag), exact_limit=10, samples=20_000)
    assert got.rate == 0.0
    assert got.ci_low == 0.0
    assert 0.0 < got.ci_high < 1e-3


def test_monotonicity_to_dict(xp):
    got = monotonicity_violation_rate(xp.asarray(np.random.default_rng(0).random((10, 10))))
    d = got.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert set(d) >= {"rate", "method", "triples", "ci_low", "ci_high"}
    assert isinstance(got, Monotonicity)


# ---------------------------------------------------------------------------------------
# minimum separation


def brute_min_separation(p):
    d = naive_distances(p)
    n = p.shape[0]
    best = (math.inf, (0, 1))
    for i in range(n):
        for j in range(i + 1, n):
            if d[i, j] < best[0]:
                best = (d[i, j], (i, j))
    return best


@pytest.mark.parametrize("block", [1, 3, 2048])
def test_min_separation_matches_brute_force(xp, block):
    p = np.random.default_rng(5).standard_normal((40, 3))
    value, pair = brute_min_separation(p)
    got = min_separation(xp.asarray(p), block=block)
    assert got.pair == pair
    np.testing.assert_allclose(got.value, value, rtol=1e-12)


def test_min_separation_near_identical_rows_is_exact(xp):
    rng = np.random.default_rng(6)
    p = rng.standard_normal((30, 16)) * 1e3  # large norms: the Gram form cancels to noise
    p[17] = p[4] + 1e-7 * rng.standard_normal(16)
    got = min_separation(xp.asarray(p), block=7)
    assert got.pair == (4, 17)
    np.testing.assert_allclose(got.value, np.linalg.norm(p[17] - p[4]), rtol=1e-6)


def test_min_separation_duplicates_and_ties(xp):
    p = xp.asarray([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    assert min_separation(p) == Separation(0.0, (0, 2))
    q = xp.asarray([[0.0], [1.0], [2.0], [3.0]])  # all neighbours at 1: the first pair wins
    assert min_separation(q) == Separation(1.0, (0, 1))
    assert min_separation(xp.zeros((5, 3))) == Separation(0.0, (0, 1))


def test_min_separation_errors_and_dict(xp):
    with pytest.raises(ValueError, match="at least 2"):
        min_separation(xp.zeros((1, 3)))
    d = min_separation(xp.eye(3)).to_dict()
    assert json.loads(json.dumps(d)) == d
    np.testing.assert_allclose(d["value"], math.sqrt(2), rtol=1e-15)


# ---------------------------------------------------------------------------------------
# corpus diagnostics


def hellinger(mu):
    s = np.sqrt(mu)
    return np.sqrt(((s[:, None, :] - s[None, :, :]) ** 2).sum(axis=2))


def test_corpus_diagnostics_h1_and_a3(xp):
    rng = np.random.default_rng(7)
    mu = rng.dirichlet(np.ones(20), size=15)
    dh = hellinger(mu)
    pos = np.arange(15) * 2
    got = corpus_diagnostics(xp.asarray(dh), positions=pos)
    iu = np.triu_indices(15, 1)
    k = int(np.argmin(dh[iu]))
    assert got.pair == (int(iu[0][k]), int(iu[1][k]))
    assert got.min_distance == dh[iu][k]
    assert got.nonstationary
    assert got.monotonicity == monotonicity_violation_rate(dh, positions=pos)
    d = got.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert isinstance(got, CorpusDiagnostics)


def test_corpus_diagnostics_stationary_corpus(xp):
    mu = np.tile(np.array([[0.5, 0.25, 0.25]]), (6, 1))
    mu[3] = [0.2, 0.3, 0.5]
    got = corpus_diagnostics(xp.asarray(hellinger(mu)), positions=None)
    assert got.min_distance == 0.0
    assert got.pair == (0, 1)
    assert not got.nonstationary


def test_corpus_diagnostics_needs_two_rows(xp):
    with pytest.raises(ValueError, match="n >= 2"):
        corpus_diagnostics(xp.zeros((1, 1)), positions=None)
