"""posstats.estimates.ranged_jackknife: the pair-sample jackknife's replicates over position
ranges are the replicates of the corpus whose every range drops the same token group
(checked against the explicit left-over counts through the one-array SampledGeometry), the
split is a multinomial split of every count, and the replicates' spread is the in-process
jackknife's."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from posstats.estimates.jackknife import jackknife_sd
from posstats.estimates.pair_jackknife import pair_replicates
from posstats.estimates.ranged_jackknife import RangeReplicates, local_replicates, ranged_pair_replicates
from posstats.estimates.sampled import SampledGeometry, sample_pairs
from posstats.estimates.sampling_variance import position_sampling_variance
from posstats.geometry.ranged import LocalRanges, SqrtRange, balanced_ranges
from posstats.testing import known_corpus


def _ranges(c: sp.csr_array, parts: int) -> LocalRanges:
    return LocalRanges([SqrtRange(c[a:b], positions=np.arange(a, b), threads=1)
                        for a, b in balanced_ranges(c.indptr, parts)])


def _stats(h: np.ndarray) -> dict[str, float]:
    return {"mean": float(h.mean()), "first": float(h[0]), "last": float(h[-1]), "sum_sq": float(np.sum(h * h))}


@pytest.fixture(scope="module")
def counts():
    return sp.csr_array(known_corpus("planted", 90, tokens=600, seed=5).counts.matrix, dtype=np.int64)


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("corrected", [False, True])
def test_replicates_are_those_of_the_left_over_counts(counts, parts, corrected):
    """Same seeds, stepped alongside: replicate g over the ranges equals SampledGeometry on
    the vstacked counts without group g (each range's own), bias from those counts."""
    i, j = sample_pairs(counts.shape[0], 700, rng=np.random.default_rng(2))
    i[:5], j[:5] = np.arange(5), np.arange(5) + 1  # neighbours: in one range, and across a cut
    got = ranged_pair_replicates(local_replicates(_ranges(counts, parts), groups=4, seed=9), i, j, _stats,
                                 corrected=corrected, vocab=counts.shape[1])
    twins = [RangeReplicates(r, groups=4, seed=9) for r in _ranges(counts, parts).ranges]
    for g in range(4):
        kept = sp.vstack([t.count_rows(np.arange(t.range.shape[0])) for t in twins if t.next_group() == g], format="csr")
        bias = position_sampling_variance(kept) if corrected else None
        want = _stats(SampledGeometry(kept, bias=bias).distances(i, j))
        for name, value in want.items():
            assert got[name][g] == pytest.approx(value, rel=1e-11, abs=1e-13), (name, g)
    assert all(v.shape == (4,) for v in got.values())


def test_the_groups_split_every_count(counts):
    """The K removed groups sum to the counts, each holds about 1/K of every count's tokens,
    and the split differs with the seed."""
    k = 5
    rep = RangeReplicates(_ranges(counts, 1).ranges[0], groups=k, seed=3)
    rows = np.arange(counts.shape[0])
    removed = [counts - rep.count_rows(rows) for _ in range(k) if rep.next_group() is not None]
    total = sum(removed)
    assert (total != counts).nnz == 0
    tokens = int(counts.sum())
    for part in removed:  # Binomial(tokens, 1/k): within 5 sd
        assert abs(int(part.sum()) - tokens / k) < 5 * np.sqrt(tokens * (1 / k) * (1 - 1 / k))
        assert part.min() >= 0
    big = counts.toarray() > 20  # larger counts are split too, not only the single tokens
    first = removed[0].toarray()[big]
    assert big.sum() > 20 and 0 < first.mean() < counts.toarray()[big].mean() and np.unique(first).size > 3
    other = RangeReplicates(_ranges(counts, 1).ranges[0], groups=k, seed=4)
    other.next_group()
    assert (other.count_rows(rows) != counts - removed[0]).nnz > 0
    with pytest.raises(ValueError, match="all 5 groups"):
        rep.next_group()
    with pytest.raises(ValueError, match="next_group"):
        RangeReplicates(_ranges(counts, 1).ranges[0], groups=k).count_rows(rows)
    with pytest.raises(ValueError, match="at least 2 groups"):
        RangeReplicates(_ranges(counts, 1).ranges[0], groups=1)


def test_the_spread_is_the_in_process_jackknifes():
    """Over 16 drift corpora the ranged replicates' jackknife sd of the mean corrected
    distance matches the in-process pair_replicates' (both estimate one sd; with K = 10 one
    estimate's relative sd is about 1 / sqrt(18) = 0.24, so a mean over 16 corpora about
    0.06, and their ratio (less: both see the same corpus) within 0.75-1.33, over 3.4 sd)."""
    n = 80
    i, j = sample_pairs(n, 4 * n, rng=np.random.default_rng(1))
    ranged_sd, local_sd = [], []
    for s in range(16):
        rows = sp.csr_array(known_corpus("drift", n, tokens=400, seed=700 + s).counts.matrix, dtype=np.int64)

        def mean(h):
            return {"mean": float(h.mean())}

        local_sd.append(jackknife_sd(pair_replicates(rows, i, j, mean, corrected=True, seed=s)["mean"]))
        ranged_sd.append(jackknife_sd(ranged_pair_replicates(local_replicates(_ranges(rows, 3), seed=s), i, j, mean,
                                                             corrected=True, vocab=rows.shape[1])["mean"]))
    ratio = np.mean(ranged_sd) / np.mean(local_sd)
    assert 0.75 < ratio < 1.33, ratio
