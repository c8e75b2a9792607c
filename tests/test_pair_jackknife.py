"""Token-noise intervals on stress from a fixed pair sample (posstats.estimates.pair_jackknife)
and the analysis' intervals above the exact jackknife's limit and on the sampled path."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.stats import t as student_t

import posstats.analysis.intervals as intervals_module
from posstats.analysis import AnalysisConfig, analyze
from posstats.estimates.jackknife import jackknife_sd
from posstats.estimates.pair_jackknife import (
    MAX_CORRECTION_SDS,
    jackknife_pairs,
    pair_jackknife_interval,
    pair_noise_share,
    pair_replicates,
    token_groups,
)
from posstats.estimates.sampled import SampledGeometry, sample_pairs
from posstats.estimates.sampling_variance import position_sampling_variance
from posstats.geometry.encodings import make_encoding
from posstats.geometry.stress import stress_report
from posstats.testing import known_corpus


def test_token_groups_split_every_count_and_leave_the_input():
    counts = np.array([5000, 300, 4000, 100, 0, 1], dtype=np.int32)
    before = counts.copy()
    groups = list(token_groups(counts, 10, np.random.default_rng(0)))
    np.testing.assert_array_equal(counts, before)
    assert len(groups) == 10 and all(g.dtype == counts.dtype and np.all(g >= 0) for g in groups)
    np.testing.assert_array_equal(np.sum(groups, axis=0), counts)  # a partition of the tokens
    # each group is Binomial(count, 1/10) marginally: 500 +- 21 of the first count
    first = np.array([g[0] for g in groups])
    assert np.all(np.abs(first - 500) < 5 * 21.2)


def test_token_groups_give_single_tokens_uniform_groups():
    """Counts of 1 take a uniform group label (the multinomial law of one token): each of
    10 groups holds 1/10 of 100,000 single tokens (sd 95), and every count, single or not,
    is split exactly; more groups than an int8 label holds still partition."""
    counts = np.r_[np.ones(100_000, dtype=np.int64), np.full(1_000, 7, dtype=np.int64)]
    groups = np.array(list(token_groups(counts, 10, np.random.default_rng(3))))
    np.testing.assert_array_equal(groups.sum(axis=0), counts)
    assert set(np.unique(groups[:, :100_000])) == {0, 1}
    assert np.all(np.abs(groups[:, :100_000].sum(axis=1) - 10_000) < 5 * 95)
    many = np.array(list(token_groups(counts[:5_000], 200, np.random.default_rng(4))))
    np.testing.assert_array_equal(many.sum(axis=0), counts[:5_000])
    assert np.all(np.abs(many.sum(axis=1) - 25) < 5 * 5)  # Binomial(5,000, 1/200): sd 5


def test_pairs_follow_the_rows_and_the_gathering_budget():
    assert jackknife_pairs(4096) == 4 * 4096
    assert jackknife_pairs(100_000, entries_per_row=10.0) == 400_000
    assert jackknife_pairs(131_072, entries_per_row=1e5) == 131_072  # never fewer than m
    assert 131_072 < jackknife_pairs(131_072, entries_per_row=763.0) < 4 * 131_072


def test_interval_by_hand():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    sd = jackknife_sd(x)  # sqrt(3/4 * 5)
    r = pair_jackknife_interval(2.5, 2.0, x, pair_sd=1.0)
    centre = 2.5 - 3 * (2.5 - 2.0)  # the bias is measured on the pairs (2.0), applied to the estimate
    half = student_t.ppf(0.975, 3) * np.hypot(sd, 1.0)
    assert r.interval == [pytest.approx(centre - half), pytest.approx(centre + half)]
    assert r.correction == pytest.approx(1.5) and r.sd == pytest.approx(np.hypot(sd, 1.0))
    assert r.trusted == (1.5 <= MAX_CORRECTION_SDS * np.hypot(sd, 1.0))
    far = pair_jackknife_interval(0.01, 0.01, np.array([0.05, 0.051, 0.049, 0.05]), bounds=(0.0, 1.0))
    assert far.interval is None and not far.trusted  # corrected 0.12 down, 0.0008 sd


def _mean_h(h):
    return {"mean": float(h.mean())}


def test_replicate_sd_matches_the_spread_over_corpora():
    """The mean corrected d_H over a fixed pair sample: its sd over 24 independent drift
    corpora and the jackknife's estimate from each corpus agree (ratio of the mean jackknife
    sd to the observed sd in 0.6-1.6; 24 corpora give the observed sd to about +-15 %)."""
    n = 96
    i, j = sample_pairs(n, 4 * n, rng=np.random.default_rng(5))
    values, sds = [], []
    for s in range(24):
        rows = sp.csr_array(known_corpus("drift", n, tokens=400, seed=500 + s).counts.matrix, dtype=np.int64)
        h = SampledGeometry(rows, bias=position_sampling_variance(rows)).distances(i, j)
        values.append(h.mean())
        sds.append(jackknife_sd(pair_replicates(rows, i, j, _mean_h, corrected=True, seed=s)["mean"]))
    assert 0.6 < np.mean(sds) / np.std(values, ddof=1) < 1.6


def test_noise_share_is_near_one_without_structure_and_small_with_it():
    """Corrected distances, as the analysis uses them by default."""
    n = 200
    i, j = sample_pairs(n, 2000, rng=np.random.default_rng(1))
    for kind, low, high in (("stationary", 0.7, 1.4), ("drift", 0.0, 0.2)):
        rows = sp.csr_array(known_corpus(kind, n, tokens=20_000 if kind == "drift" else 500, seed=7).counts.matrix,
                            dtype=np.int64)
        h = SampledGeometry(rows, bias=position_sampling_variance(rows)).distances(i, j)
        share = pair_noise_share(rows, i, j, h, corrected=True, pairs=2000)
        assert low < share < high, (kind, share)
    assert pair_noise_share(rows, i, j, np.zeros(i.size), corrected=False) is None


def test_noise_share_from_the_margins_is_the_one_from_the_rows():
    """Rows held apart give only their occupancies and pooled counts: the same null, drawn alike."""
    n = 120
    i, j = sample_pairs(n, 600, rng=np.random.default_rng(3))
    rows = sp.csr_array(known_corpus("planted", n, tokens=300, seed=11).counts.matrix, dtype=np.int64)
    h = SampledGeometry(rows).distances(i, j)
    from_rows = pair_noise_share(rows, i, j, h, corrected=False, pairs=500, seed=4)
    from_margins = pair_noise_share(None, i, j, h, corrected=False, pairs=500, seed=4,
                                    occupancy=rows.sum(axis=1).astype(np.float64), pooled=rows.sum(axis=0))
    assert from_rows == from_margins
    assert from_rows != pair_noise_share(rows, i, j, h, corrected=False, pairs=500, seed=5)
    with pytest.raises(ValueError, match="occupancy and pooled"):
        pair_noise_share(None, i, j, h, corrected=False, occupancy=rows.sum(axis=1))


def _truth(kc, n, name, dim):
    i, j = np.triu_indices(n, 1)
    d = np.zeros((n, n))
    d[i, j] = np.sqrt(kc.true_d2(i, j))
    return stress_report(make_encoding(name, np.arange(n), dim).matrix, d + d.T).scaled_stress


@pytest.mark.parametrize("path", ["exact", "sampled"])
def test_intervals_above_the_limit_cover_and_say_how(path, monkeypatch):
    """Above the exact jackknife's limit (lowered here to 32 rows; on the sampled path the
    pair-sample jackknife is always used): drift corpora (n = 64, N = 20,000, 12 seeds), the
    fixed encodings' intervals cover the true scaled stress in >= 9 of 12 (at 90 %
    coverage P(X <= 8) = 0.026), fitted ones give none and keep a tie range only."""
    monkeypatch.setattr(intervals_module, "_JACKKNIFE_LIMIT", 32)
    extra = {"exact_limit": 32} if path == "sampled" else {}
    cfg = AnalysisConfig(dims=(2,), encodings=("sinusoidal", "mds"), held_out="off", null="none", **extra)
    n, covered, given = 64, 0, 0
    for s in range(12):
        kc = known_corpus("drift", n, tokens=20_000, seed=600 + s)
        r = analyze(kc.counts, cfg).report()
        assert r["encodings"][0]["stress_method"] == path
        for e in r["encodings"]:
            if e["name"] == "mds":
                assert e["stress_interval"].startswith("none: a fitted encoding")
                assert e["scaled_stress_ci95"] == [e["scaled_stress"]] * 2
                assert ("scaled_stress_tie_range" in e) == (path == "sampled")
                continue
            how = e["stress_interval"]
            assert how.startswith("jackknife, 10 random token groups, on") or how.startswith("none: the jackknife's bias"), how
            assert ("plus the stress's own pair sampling" in how) == (path == "sampled" and how.startswith("jackknife"))
            if how.startswith("jackknife"):
                given += 1
                lo, hi = e["scaled_stress_ci95"]
                covered += int(lo <= _truth(kc, n, "sinusoidal", 2) <= hi)
    assert given >= 10 and covered >= given - 3, (covered, given)


def test_the_pairs_noise_share_reaches_the_report_and_the_verdict():
    """With the analytic edge (no shuffled corpora) the share the intervals were judged by is
    reported as null.distance_noise, and a noisy corpus gets the verdict's caveat: a
    stationary one (no interval computed: no structure found, every encoding tied) and a
    drift at N = 400 (share 0.19-0.32 over seeds 0-9: the jackknife's interval withheld for
    noise; at N = 2,000 the share, 0.10-0.16 over seeds, straddles the 0.1 that withholds)."""
    cfg = AnalysisConfig(dims=(2,), encodings=("sinusoidal",), held_out="off", null="mp", exact_limit=32)
    r = analyze(known_corpus("stationary", 64, tokens=2000, seed=3).counts, cfg).report()
    noise = r["null"]["distance_noise"]
    assert noise["method"].startswith("pairs") and noise["share"] > 0.5
    assert r["verdict"]["non_stationary"] is False
    assert r["encodings"][0]["stress_interval"].startswith("none: no test found positional structure")
    assert any("null.distance_noise" in c for c in r["verdict"]["caveats"])
    r = analyze(known_corpus("drift", 64, tokens=400, seed=3).counts, cfg).report()
    assert r["verdict"]["non_stationary"] is True and 0.1 <= r["null"]["distance_noise"]["share"] < 0.5
    assert r["encodings"][0]["stress_interval"].startswith("none: sampling noise alone gives")
    assert any("null.distance_noise" in c for c in r["verdict"]["caveats"])


def test_thin_rows_get_no_interval_on_the_sampled_path():
    """A row of fewer than 20 tokens could be emptied by a replicate: no jackknife, and the
    pairs' interval (which leaves out the token noise) becomes a tie range, not a 95 % one."""
    cfg = AnalysisConfig(dims=(2,), encodings=("sinusoidal",), held_out="off", null="none", exact_limit=32)
    # strong planted rows: structure the standout test finds at 15 tokens a row
    r = analyze(known_corpus("planted", 64, tokens=15, strength=0.9, vocab=50, seed=4).counts, cfg).report()
    assert r["verdict"]["non_stationary"] is True
    e = r["encodings"][0]
    assert e["stress_interval"].startswith("none: a geometry row has fewer than 20 tokens")
    assert e["scaled_stress_ci95"] == [e["scaled_stress"]] * 2
    assert e["scaled_stress_tie_range"] == e["scaled_stress_pairs_ci95"]


def test_the_pooled_null_draws_tokens_from_the_pooled_distribution():
    """The alias table behind the pooled null rows gives every id exactly its probability
    (prob[k] / V plus the shares aliased to it), never an id of weight 0, and its draws
    match the distribution (chi-square at 1e-3 over 10 seeds: a wrong table fails)."""
    from scipy import stats

    from posstats.estimates.pair_jackknife import _alias_draws, _alias_table

    rng = np.random.default_rng(0)
    weights = rng.zipf(1.3, 500).astype(np.float64)
    weights[::7] = 0.0
    p = weights / weights.sum()
    prob, alias = _alias_table(weights)
    implied = prob / p.size + np.bincount(alias, weights=1.0 - prob, minlength=p.size) / p.size
    np.testing.assert_allclose(implied, p, rtol=0, atol=1e-12)
    fails = 0
    for seed in range(10):
        draws = _alias_draws(prob, alias, 200_000, np.random.default_rng(seed))
        seen = np.bincount(draws, minlength=p.size)
        assert seen[weights == 0].sum() == 0
        keep = p * draws.size >= 5  # chi-square cells with enough expected counts, the rest pooled
        observed = np.append(seen[keep], seen[~keep].sum())
        expected = np.append(p[keep], p[~keep].sum()) * draws.size
        fails += stats.chisquare(observed, expected).pvalue < 1e-3
    assert fails <= 1  # P(2 or more of 10 below 1e-3) < 5e-5
