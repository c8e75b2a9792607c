"""posstats.geometry.ranged: the centred square-root operator over position ranges held
apart equals the one-array operator (products, trace, the block Lanczos with and without
the bias-corrected diagonal), and ranges are cut and sized as documented; each range's
noise floor joins into the whole's (posstats.estimates.noise.merge_noise_floors)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import scipy.sparse as sp

from posstats.counting.counts import count_sequences
from posstats.counting.io import save_counts
from posstats.estimates.noise import merge_noise_floors
from posstats.estimates.null_rank import mp_edge
from posstats.estimates.sampling_variance import position_sampling_variance
from posstats.estimates.sampled import SampledGeometry
from posstats.estimates.thinning import range_noise_floor
from posstats.estimates.standout import standout_positions, standout_test
from posstats.geometry import ranged
from posstats.geometry.hellinger import hellinger_sq_pairs, sqrt_distributions
from posstats.geometry.mds import classical_mds
from posstats.geometry.sqrt_operator import sqrt_operator
from posstats.geometry.ranged import (
    BYTES_PER_STORED_COUNT,
    PROCESS_BASELINE_BYTES,
    LocalRanges,
    RangedSqrt,
    SqrtRange,
    balanced_ranges,
    file_ranges,
    load_sqrt_range,
    local_ranges,
    ranges_for_budget,
)
from posstats.testing import known_corpus, synthetic_counts


@pytest.fixture(scope="module")
def counts():
    syn = synthetic_counts(300, 2000, tokens=2500, rank=3, strength=0.4, block_tokens=24, seed=3)
    return sp.csr_array(syn.counts.matrix)


def _ranged(c: sp.csr_array, parts: int) -> RangedSqrt:
    bounds = balanced_ranges(c.indptr, parts)
    return RangedSqrt(LocalRanges([SqrtRange(c[a:b], positions=np.arange(a, b), threads=1) for a, b in bounds]))


@pytest.mark.parametrize("parts", [1, 2, 5])
def test_products_and_trace_equal_the_explicit_centred_matrix(counts, parts):
    s = np.asarray(sqrt_distributions(counts.toarray()))
    sc = s - s.mean(axis=0)[None, :]
    op = _ranged(counts, parts)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((counts.shape[1], 3)), rng.standard_normal((counts.shape[0], 3))
    np.testing.assert_allclose(op.apply(x), sc @ x, rtol=0, atol=1e-12)
    np.testing.assert_allclose(op.apply_t(y), sc.T @ y, rtol=0, atol=1e-12)
    assert op.total_variance() == pytest.approx(float(np.sum(sc * sc)), rel=1e-13)
    assert op.shape == counts.shape and len(op.ranges) == parts
    positions, occupancy = op.held()
    np.testing.assert_array_equal(positions, np.arange(counts.shape[0]))
    np.testing.assert_array_equal(occupancy, np.asarray(counts.sum(axis=1)).ravel())


@pytest.mark.parametrize("parts", [2, 7])
def test_lanczos_over_ranges_equals_the_one_array_operator(counts, parts):
    ref = classical_mds(sqrt_operator(counts), k=12, method="lanczos", tol=1e-10)
    got = classical_mds(_ranged(counts, parts), k=12, method="lanczos", tol=1e-10)
    np.testing.assert_allclose(got.eigenvalues, ref.eigenvalues, rtol=0, atol=1e-12 * ref.eigenvalues[0])
    assert got.total_variance == pytest.approx(ref.total_variance, rel=1e-13)
    # the leading (well separated) directions, up to the sign convention both apply
    np.testing.assert_allclose(got.encoding[:, :3], ref.encoding[:, :3], rtol=0, atol=1e-8)
    bias = np.random.default_rng(1).random(counts.shape[0]) * 1e-3
    ref_c = classical_mds(counts, k=6, method="lanczos", tol=1e-10, diagonal=bias)
    got_c = classical_mds(_ranged(counts, parts), k=6, method="lanczos", tol=1e-10, diagonal=bias)
    np.testing.assert_allclose(got_c.eigenvalues, ref_c.eigenvalues, rtol=0, atol=1e-12 * ref_c.eigenvalues[0])
    assert got_c.total_variance == pytest.approx(ref_c.total_variance, rel=1e-13)


def test_balanced_ranges_cover_every_row_once_with_even_stored_counts():
    indptr = np.concatenate([[0], np.cumsum(np.random.default_rng(2).integers(1, 50, size=1000))])
    for parts in (1, 3, 8, 1000, 5000):
        bounds = balanced_ranges(indptr, parts)
        assert bounds[0][0] == 0 and bounds[-1][1] == 1000
        assert all(a < b for a, b in bounds) and all(b == a2 for (_, b), (a2, _) in zip(bounds[:-1], bounds[1:]))
        assert len(bounds) <= min(parts, 1000)
        stored = [int(indptr[b] - indptr[a]) for a, b in bounds]
        # each cut lands on a row boundary within one row (< 50 counts) of its share
        assert max(stored) - min(stored) <= 2 * 50 or len(bounds) > 100


def test_ranges_for_budget_is_the_ceiling_of_the_bytes_over_the_budget():
    stored = 3 * 10**7
    full = stored * BYTES_PER_STORED_COUNT
    assert ranges_for_budget(stored, PROCESS_BASELINE_BYTES + full) == 1
    assert ranges_for_budget(stored, PROCESS_BASELINE_BYTES + full - 1) == 2
    assert ranges_for_budget(stored, PROCESS_BASELINE_BYTES + full // 3) == 3
    assert ranges_for_budget(stored, PROCESS_BASELINE_BYTES + full // 3 - 1) == 4
    assert ranges_for_budget(stored, PROCESS_BASELINE_BYTES + full, at_least=5) == 5
    for nothing_left in (0, PROCESS_BASELINE_BYTES):
        with pytest.raises(ValueError, match="leaves nothing for the counts"):
            ranges_for_budget(stored, nothing_left)


def test_ranges_read_from_a_file_keep_occupied_positions_only(tmp_path):
    # truncate-mode documents of lengths 1..6 at n = 9: positions 6, 7, 8 stay empty
    rng = np.random.default_rng(4)
    docs = [rng.integers(0, 40, size=1 + i % 6).tolist() for i in range(300)]
    c = count_sequences(docs, positions=9, vocab_size=40)
    save_counts(c, tmp_path)
    for parts in (1, 2, 4):
        runner = local_ranges(tmp_path, parts, min_occupancy=1)
        op = RangedSqrt(runner)
        positions, occupancy = op.held()
        np.testing.assert_array_equal(positions, np.arange(6))
        np.testing.assert_array_equal(occupancy, c.occupancy()[:6])
        ref = classical_mds(sp.csr_array(c.matrix)[:6], k=3, method="lanczos", tol=1e-12)
        got = classical_mds(op, k=3, method="lanczos", tol=1e-12)
        np.testing.assert_allclose(got.eigenvalues, ref.eigenvalues, rtol=0, atol=1e-12)
    # min_occupancy drops the thin positions (documents of length >= 5 are a third of them)
    thin = load_sqrt_range(tmp_path, 0, 9, min_occupancy=int(c.occupancy()[4]))
    np.testing.assert_array_equal(thin.positions, np.flatnonzero(c.occupancy() >= c.occupancy()[4]))
    assert len(file_ranges(tmp_path, 3)) == 3


def test_a_range_refuses_negative_counts_and_empty_operators():
    with pytest.raises(ValueError, match="non-negative"):
        SqrtRange(sp.csr_array(np.array([[1, -1], [2, 0]])))
    with pytest.raises(ValueError, match="zero occupancy"):
        SqrtRange(sp.csr_array(np.array([[1, 1], [0, 0]])))
    with pytest.raises(ValueError, match="at least one range"):
        LocalRanges([])
    empty = SqrtRange(sp.csr_array((0, 4), dtype=np.int64))
    with pytest.raises(ValueError, match="no occupied position"):
        RangedSqrt(LocalRanges([empty]))


def test_an_empty_range_among_others_changes_nothing(counts):
    empty = SqrtRange(sp.csr_array((0, counts.shape[1]), dtype=np.int64), threads=1)
    whole = SqrtRange(counts, threads=1)
    op = RangedSqrt(LocalRanges([empty, whole, empty]))
    ref = sqrt_operator(counts)
    x = np.random.default_rng(5).standard_normal((counts.shape[1], 2))
    np.testing.assert_allclose(op.apply(x), ref.apply(x), rtol=0, atol=1e-12)
    assert op.total_variance() == pytest.approx(ref.total_variance(), rel=1e-13)


def test_range_noise_floors_join_into_the_whole_corpus_floor(tmp_path):
    """Each range keeps the noise floor of its rows; joined, the per-row bias is the
    unbiased one of the whole (no random split: the same at any cut), the occupancies and
    positions are the whole's, the column noise is the sum of the ranges' (so the analytic
    edge is the whole's), and one range gives exactly range_noise_floor of every row. The
    bias-corrected MDS over the ranges equals dense eigh of B - H diag(b) H."""
    syn = synthetic_counts(240, 1500, tokens=np.linspace(3000, 300, 240), rank=2, strength=0.4, seed=11)
    save_counts(syn.counts, tmp_path)
    c = sp.csr_array(syn.counts.matrix)
    noise_of = functools.partial(range_noise_floor, parts=4, seed=5)
    whole = range_noise_floor(c, np.arange(240), parts=4, seed=5)
    one = merge_noise_floors(local_ranges(tmp_path, 1, noise_of=noise_of).call("noise"))
    for name in ("positions", "occupancy", "split_half", "bias", "column_noise"):
        np.testing.assert_array_equal(getattr(one, name), getattr(whole, name))
    runner = local_ranges(tmp_path, 3, noise_of=noise_of)
    floors = runner.call("noise")
    joined = merge_noise_floors(floors)
    np.testing.assert_array_equal(joined.positions, np.arange(240))
    np.testing.assert_array_equal(joined.occupancy, syn.counts.occupancy())
    np.testing.assert_allclose(joined.bias, position_sampling_variance(c), rtol=1e-12, atol=0)
    np.testing.assert_allclose(joined.column_noise, sum(f.column_noise for f in floors), rtol=1e-12)
    # another split of the same tokens: the edge moves by sampling noise only
    assert joined.source == "token split" and 0.8 < mp_edge([], joined) / mp_edge([], whole) < 1.25
    # the three ranges drew three different streams (seeded by their first position)
    assert not np.array_equal(joined.split_half, whole.split_half)
    op = RangedSqrt(runner)
    got = classical_mds(op, k=6, method="lanczos", tol=1e-12, diagonal=joined.bias)
    ref = classical_mds(c, k=6, method="dense", diagonal=joined.bias)
    np.testing.assert_allclose(got.eigenvalues, ref.eigenvalues, rtol=0, atol=1e-11 * ref.eigenvalues[0])
    with pytest.raises(ValueError, match="built without its noise floor"):
        local_ranges(tmp_path, 2).call("noise")
    with pytest.raises(ValueError, match="no noise floor"):
        merge_noise_floors([])
    other = range_noise_floor(c[:10], np.arange(10), parts=2, seed=5)
    with pytest.raises(ValueError, match="different kinds"):
        merge_noise_floors([floors[0], other])


@pytest.mark.parametrize("parts", [1, 4])
def test_standout_test_over_ranges_equals_the_one_array_test(parts):
    """The standout test through the ranges' two reductions (pooled counts recovered from
    the square roots, distances to the pool) gives the in-process test's answer: the same
    positions (the planted 0-3), thresholds and z to rounding; the pooled counts exact."""
    kc = known_corpus("planted", 600, tokens=2000, seed=4)
    c = sp.csr_array(kc.counts.matrix)
    op = _ranged(c, parts)
    keep = np.ones(600, dtype=bool)
    keep[[0, 1, 2, 3, 17]] = False
    np.testing.assert_array_equal(op.count_totals(keep), np.asarray(c[keep].sum(axis=0)).ravel())
    positions, occupancy = op.held()
    got = standout_test(positions, occupancy, pooled_totals=op.count_totals, distance_to=op.distance_to)
    ref = standout_positions(c, np.arange(600))
    assert got["positions"] == ref["positions"] == [0, 1, 2, 3] and got["count"] == 4
    assert got["z_threshold"] == ref["z_threshold"]
    np.testing.assert_allclose(got["max_z"], ref["max_z"], rtol=1e-9)


@pytest.mark.parametrize(("parts", "round_entries"), [(1, 1 << 22), (3, 1 << 22), (5, 700), (9, 1 << 22)])
def test_pair_dots_across_ranges_equal_the_one_array_ones(counts, parts, round_entries, monkeypatch):
    """Row dot products of any pairs (inside one range, across two, in both orders,
    repeated, i == j) equal the one-array operator's; with a round budget of 700 stored
    entries (a row or two) the rows move in many steps and the answer is the same. The
    difference form on counts recovered from the square roots equals the one on the counts."""
    monkeypatch.setattr(ranged, "PAIR_ROUND_ENTRIES", round_entries)
    op = _ranged(counts, parts)
    rng = np.random.default_rng(8)
    i = np.concatenate([rng.integers(0, 300, 2000), [0, 299, 5, 5]])
    j = np.concatenate([rng.integers(0, 300, 2000), [299, 0, 5, 5]])
    ref = sqrt_operator(counts).row_dots(i, j)
    np.testing.assert_allclose(op.row_dots(i, j), ref, rtol=1e-13, atol=1e-15)
    np.testing.assert_array_equal(op.row_entries(), np.diff(counts.indptr))
    np.testing.assert_allclose(op.difference_sq(i[:300], j[:300]), hellinger_sq_pairs(counts, i[:300], j[:300]),
                               rtol=1e-12, atol=0)
    assert op.row_dots(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)).shape == (0,)


def test_sampled_geometry_over_ranges_equals_the_one_array_one(counts):
    """SampledGeometry on rows held apart (no counts in this process) draws the same pairs
    and gives the same bias-corrected distances, stresses and monotonicity as on the
    counts; a pair of identical rows (Gram form below refine_below) goes through the
    difference form on counts recovered from the ranges: exactly 0."""
    c = sp.vstack([counts, counts[7]], format="csr")  # row 300 repeats row 7
    bias = position_sampling_variance(c)
    op = _ranged(c, 4)
    ref = SampledGeometry(c, bias=bias, seed=3, sqrt=sqrt_operator(c))
    got = SampledGeometry(None, bias=bias, seed=3, sqrt=op)
    i = np.array([7, 300, 0, 150, 299])
    j = np.array([300, 7, 299, 151, 2])
    np.testing.assert_allclose(got.squared(i, j), ref.squared(i, j), rtol=1e-12, atol=1e-15)
    assert got.squared(np.array([7]), np.array([300]))[0] == 0.0
    enc = np.random.default_rng(2).standard_normal((301, 3))
    a, b = got.stress([enc], target_halfwidth=1e-2, initial_pairs=5000)[0], ref.stress([enc], target_halfwidth=1e-2,
                                                                                     initial_pairs=5000)[0]
    assert a.pairs == b.pairs
    np.testing.assert_allclose(a.scaled_stress, b.scaled_stress, rtol=1e-12)
    np.testing.assert_allclose(got.min_sampled()[0], ref.min_sampled()[0], rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="ranged square-root operator"):
        SampledGeometry(None, sqrt=sqrt_operator(c))
