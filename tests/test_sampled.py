"""Tests for posstats.estimates.sampled: pair distances from square-root rows, sampled stress with
delta-method intervals (coverage checked by simulation), sampled monotonicity."""

from __future__ import annotations

import numpy as np
import pytest

from posstats.estimates.noise import corrected_squared_distances
from posstats.estimates.sampled import (
    SampledGeometry,
    sample_pairs,
    sampled_monotonicity,
    stress_from_pairs,
)
from posstats.geometry.diagnostics import (
    monotonicity_of_encoding,
    monotonicity_violation_rate,
)
from posstats.geometry.hellinger import hellinger, hellinger_sq
from posstats.geometry.mds import classical_mds
from posstats.geometry.stress import pairwise_distances, stress_report
from posstats.testing import synthetic_counts


@pytest.fixture(scope="module")
def corpus():
    syn = synthetic_counts(150, 600, tokens=3000, rank=3, strength=0.4, block_tokens=16, seed=4)
    return syn.counts.matrix


def test_sample_pairs_uniform_over_pairs():
    rng = np.random.default_rng(0)
    i, j = sample_pairs(5, 200_000, rng=rng)
    assert np.all(i < j) and i.min() >= 0 and j.max() <= 4
    freq = np.bincount(i * 5 + j, minlength=25).reshape(5, 5)[np.triu_indices(5, 1)] / 200_000
    np.testing.assert_allclose(freq, 0.1, atol=0.004)


def test_pair_distances_match_the_full_matrix(corpus):
    geo = SampledGeometry(corpus)
    d2 = hellinger_sq(corpus)
    rng = np.random.default_rng(1)
    i, j = rng.integers(0, 150, 5000), rng.integers(0, 150, 5000)
    np.testing.assert_allclose(geo.squared(i, j), d2[i, j], rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(geo.squared([3], [3]), [0.0])


@pytest.mark.parametrize("threads", [1, 16])
def test_pairs_in_flight_are_bounded_whatever_the_thread_count(corpus, monkeypatch, threads):
    """The chunks of pairs running at once gather at most _ENTRIES_IN_FLIGHT stored entries
    together (16 threads once held 2.4 GB more than 2), and the distances do not change."""
    import posstats.estimates.sampled as sampled

    seen = []
    real = sampled.pair_chunks

    def spy(cost, budget, most):
        seen.append(budget)
        return real(cost, budget, most)

    monkeypatch.setattr(sampled, "_ENTRIES_IN_FLIGHT", 4096)
    monkeypatch.setattr(sampled, "_CHUNK_ENTRIES_MIN", 64)
    monkeypatch.setattr(sampled, "product_threads", lambda: threads)
    monkeypatch.setattr(sampled, "pair_chunks", spy)
    geo = SampledGeometry(corpus)
    rng = np.random.default_rng(2)
    i, j = rng.integers(0, 150, 3000), rng.integers(0, 150, 3000)
    np.testing.assert_allclose(geo.squared(i, j), hellinger_sq(corpus)[i, j], rtol=1e-12, atol=1e-15)
    assert seen and set(seen) == {4096 // threads}
    assert sampled._chunk_entries(10**6) == 64  # never below the floor


def test_near_identical_rows_keep_relative_precision():
    base = np.array([[5_000_000, 3_000_000, 2_000_000, 1]])
    near = np.array([[5_000_000, 3_000_000, 2_000_000, 2]])
    counts = np.concatenate([base, near, [[1, 2, 3, 4]]])
    geo = SampledGeometry(counts)
    exact = hellinger_sq(counts)[0, 1]  # difference form below refine_below
    assert 0 < exact < 1e-6
    np.testing.assert_allclose(geo.squared([0], [1]), [exact], rtol=1e-12)


def test_bias_corrected_pairs(corpus):
    b = np.linspace(0.01, 0.05, 150)
    geo = SampledGeometry(corpus, bias=b)
    dc = corrected_squared_distances(hellinger_sq(corpus), b)
    i, j = np.triu_indices(150, 1)
    np.testing.assert_allclose(geo.squared(i, j), dc[i, j], rtol=1e-11, atol=1e-14)


def test_all_pairs_give_the_exact_stress(corpus):
    d = hellinger(corpus)
    p = np.random.default_rng(2).normal(size=(150, 4))
    exact = stress_report(p, d)
    i, j = np.triu_indices(150, 1)
    e = pairwise_distances(p)[i, j]
    est = stress_from_pairs(e, d[i, j])
    np.testing.assert_allclose(
        [est.stress, est.scaled_stress, est.scale, est.pearson],
        [exact.stress, exact.scaled_stress, exact.scale, exact.pearson],
        rtol=1e-10,
    )
    assert est.stress_ci95[0] < est.stress < est.stress_ci95[1]


@pytest.mark.parametrize("kind", ["sinusoidal", "noisy-mds"])
def test_delta_method_intervals_cover_at_95_percent(corpus, kind):
    """Coverage by simulation: 300 independent samples of 2000 pairs from a population of
    150 positions whose exact stress is known; each 95 % interval must cover about 95 %."""
    d = hellinger(corpus)
    n = 150
    pos = np.arange(n)
    if kind == "sinusoidal":
        k = np.arange(4)
        w = 10000.0 ** (-2 * k / 8)
        p = np.concatenate([np.sin(pos[:, None] * w), np.cos(pos[:, None] * w)], axis=1)
    else:
        p = classical_mds(corpus, k=3, method="dense").encoding + np.random.default_rng(3).normal(scale=0.05, size=(n, 3))
    exact = stress_report(p, d)
    e_all = pairwise_distances(p)
    rng = np.random.default_rng(7)
    hits = np.zeros(4)
    reps = 300
    for _ in range(reps):
        i, j = sample_pairs(n, 2000, rng=rng)
        r = stress_from_pairs(e_all[i, j], d[i, j])
        for t, (est, truth) in enumerate(
            [
                (r.stress_ci95, exact.stress),
                (r.scaled_stress_ci95, exact.scaled_stress),
                (r.scale_ci95, exact.scale),
                (r.pearson_ci95, exact.pearson),
            ]
        ):
            hits[t] += est[0] <= truth <= est[1]
    coverage = hits / reps
    assert np.all(coverage >= 0.91), coverage
    assert np.all(coverage <= 0.99), coverage


def test_adaptive_sampling_reaches_the_target_halfwidth(corpus):
    geo = SampledGeometry(corpus, seed=1)
    p = np.random.default_rng(0).normal(size=(150, 8))
    (res,) = geo.stress([p], target_halfwidth=3e-3, initial_pairs=2000)
    assert res.scaled_halfwidth <= 3e-3
    assert geo.pairs == res.pairs > 2000
    exact = stress_report(p, hellinger(corpus))
    assert abs(res.scaled_stress - exact.scaled_stress) < 4 * res.scaled_halfwidth
    capped = SampledGeometry(corpus, seed=2)
    (res2,) = capped.stress([p], target_halfwidth=1e-6, initial_pairs=1000, max_pairs=5000)
    assert res2.pairs == 5000 and res2.scaled_halfwidth > 1e-6


def test_sampled_monotonicity_agrees_with_exact(corpus):
    d = hellinger(corpus)
    exact = monotonicity_violation_rate(d)
    geo = SampledGeometry(corpus)
    est = geo.monotonicity(samples=40_000, seed=3)
    assert est.method == "sampled" and est.triples == 40_000
    assert est.ci_low - 0.01 <= exact.rate <= est.ci_high + 0.01
    p = np.random.default_rng(4).normal(size=(150, 3))
    exact_p = monotonicity_of_encoding(p)

    def enc_dist(i, j):
        return np.sqrt(((p[i] - p[j]) ** 2).sum(axis=1))

    est_p = sampled_monotonicity(enc_dist, 150, samples=40_000, seed=5)
    assert est_p.ci_low - 0.01 <= exact_p.rate <= est_p.ci_high + 0.01


def test_min_sampled_is_an_upper_bound(corpus):
    geo = SampledGeometry(corpus)
    geo.draw(3000)
    value, (i, j) = geo.min_sampled()
    d = hellinger(corpus)
    exact = d[np.triu_indices(150, 1)].min()
    assert value >= exact - 1e-15
    np.testing.assert_allclose(value, d[i, j], rtol=1e-12)


def test_bad_inputs():
    with pytest.raises(ValueError):
        stress_from_pairs([1.0], [1.0])
    with pytest.raises(ValueError, match="every sampled corpus distance is 0"):
        stress_from_pairs([1.0, 2.0], [0.0, 0.0])
    with pytest.raises(ValueError):
        sample_pairs(1, 3, rng=np.random.default_rng(0))
    geo = SampledGeometry(np.array([[1, 2], [2, 1], [1, 1]]))
    with pytest.raises(ValueError, match="encoding must be"):
        geo.stress_of(np.zeros((4, 2)))
    with pytest.raises(ValueError, match="bias"):
        SampledGeometry(np.array([[1, 2], [2, 1]]), bias=[0.1])
