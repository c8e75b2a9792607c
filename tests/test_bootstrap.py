"""Tests for posstats.estimates.bootstrap: exact shard resampling and percentile intervals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from posstats.estimates.bootstrap import _stack, resample_counts, shard_bootstrap
from posstats.geometry.hellinger import hellinger
from posstats.geometry.mds import classical_mds
from posstats.geometry.stress import stress_report
from posstats.testing import split_counts, synthetic_counts


@pytest.fixture(scope="module")
def shards():
    syn = synthetic_counts(60, 500, tokens=4000, rank=3, strength=0.4, block_tokens=16, seed=8)
    return syn, split_counts(syn.counts, parts=12, seed=1)


def test_resampling_is_the_exact_weighted_sum(shards):
    syn, parts = shards
    stacked, n, v = _stack(parts)
    ones = resample_counts(stacked, np.ones(len(parts), dtype=np.int64), n, v)
    np.testing.assert_array_equal(ones.toarray(), syn.counts.to_dense().matrix)
    w = np.array([3, 0, 1, 0, 0, 2, 0, 1, 0, 4, 1, 0])
    expected = sum(int(wi) * p.to_dense().matrix for wi, p in zip(w, parts, strict=True))
    np.testing.assert_array_equal(resample_counts(stacked, w, n, v).toarray(), expected)


def test_basic_intervals_cover_the_planted_eigenvalues(shards):
    """Replicates repeat shards, so their eigenvalues carry about twice the noise of the
    corpus'; the basic interval removes that shift and covers the noise-free truth."""
    syn, parts = shards
    full = syn.counts.matrix
    mds = classical_mds(full, k=8, method="dense")
    d = hellinger(full)
    fixed = np.random.default_rng(0).normal(size=(60, 4))
    res = shard_bootstrap(parts, replicates=60, k=8, encodings={"mds:2": 2, "random": fixed}, null_threshold=0.5, seed=3)
    out = res.to_dict()
    json.dumps(out)
    np.testing.assert_allclose(res.estimates["eigenvalues"], mds.eigenvalues, rtol=1e-10)
    for c, truth in enumerate(syn.true_eigenvalues):
        lo, hi = out["eigenvalues_ci95"][c]
        assert lo < truth < hi
    assert np.all(np.percentile(res.eigenvalues[:, 0], 2.5) > mds.eigenvalues[0] - 0.05)  # replicates shifted up
    lo, hi = out["eigenvalues_ci95"][5]  # a noise eigenvalue: compatible with 0
    assert lo < 0.02
    assert out["rank_ci95"] == [8.0, 8.0]
    lo, hi = out["mean_d_h_ci95"]
    plug_in = d[~np.eye(60, dtype=bool)].mean()
    assert lo < hi < plug_in  # the noise-free mean distance is below the plug-in one
    np.testing.assert_allclose(res.estimates["scaled_stress"]["random"], stress_report(fixed, d).scaled_stress, rtol=1e-12)
    lo, hi = out["scaled_stress_ci95"]["random"]
    assert 0.0 <= lo < hi <= 1.0
    assert out["components_above_null_ci95"][0] >= 2
    assert set(out["stress_ci95"]) == {"mds:2", "random"}
    again = shard_bootstrap(parts, replicates=60, k=8, encodings={"mds:2": 2, "random": fixed}, null_threshold=0.5, seed=3)
    np.testing.assert_array_equal(again.eigenvalues, res.eigenvalues)


def test_more_data_narrows_the_intervals():
    widths = []
    for tokens in (1000, 16000):
        syn = synthetic_counts(40, 400, tokens=tokens, rank=2, strength=0.3, block_tokens=16, seed=2)
        res = shard_bootstrap(split_counts(syn.counts, parts=10, seed=0), replicates=40, k=4, seed=1)
        lo, hi = np.percentile(res.mean_distance, [2.5, 97.5])
        widths.append(hi - lo)
    assert widths[1] < 0.5 * widths[0]


def test_bad_inputs(shards):
    _, parts = shards
    with pytest.raises(ValueError, match="at least two"):
        shard_bootstrap(parts[:1])
    with pytest.raises(ValueError, match="rows"):
        shard_bootstrap(parts, replicates=2, encodings={"x": np.zeros((5, 2))})
