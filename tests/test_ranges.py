"""The range reduce (posstats.counting.ranges) gives exactly the in-process signed sum."""

from __future__ import annotations

import numpy as np
import pytest

from posstats.counting.counts import CountSpec, count_sequences
from posstats.counting.io import load_counts, save_counts
from posstats.counting.ranges import assemble_ranges, row_ranges, sum_row_range
from posstats.counting.reduce import sum_partials


def _partials(tmp_path, n, V, k, seed):
    rng = np.random.default_rng(seed)
    items = []
    for j in range(k):
        seqs = [list(rng.integers(0, V, size=rng.integers(0, 3 * n))) for _ in range(rng.integers(1, 6))]
        c = count_sequences(seqs, positions=n, vocab_size=V, mode="chunk")
        save_counts(c, tmp_path / f"p{j}")
        items.append((str(tmp_path / f"p{j}"), 1))
    return items


@pytest.mark.parametrize(("n", "V", "ranges"), [(5, 7, 1), (5, 7, 3), (5, 7, 5), (40, 50, 4), (40, 50, 7)])
def test_range_reduce_equals_the_in_process_sum(tmp_path, n, V, ranges):
    items = _partials(tmp_path, n, V, k=4, seed=n * ranges)
    items += [items[1], (items[1][0], -1)]  # a shard counted twice, then removed once
    spec = CountSpec(n, V, "chunk")
    expected = sum_partials(items, spec, dense=False)
    parts = [sum_row_range(items, spec, a, b, tmp_path / f"range-{a}") for a, b in row_ranges(n, ranges)]
    summary = assemble_ranges(parts[::-1], items, spec, tmp_path / "total")
    got = load_counts(tmp_path / "total")
    assert got.equals(expected) and got.fingerprint == expected.fingerprint
    assert summary["tokens"] == expected.tokens
    assert summary["positions_occupied"] == int((expected.occupancy() != 0).sum())
    # the same storage rule as an in-process save
    assert summary["counts_file"] == save_counts(expected, tmp_path / "direct").name


def test_ranges_must_cover_every_position_once(tmp_path):
    items = _partials(tmp_path, 6, 5, k=2, seed=1)
    spec = CountSpec(6, 5, "chunk")
    parts = [sum_row_range(items, spec, a, b, tmp_path / f"r{a}") for a, b in [(0, 3), (3, 6)]]
    with pytest.raises(ValueError, match="do not cover"):
        assemble_ranges(parts[:1], items, spec, tmp_path / "t")
    with pytest.raises(ValueError, match="do not cover"):
        assemble_ranges([parts[0], parts[0], parts[1]], items, spec, tmp_path / "t")


def test_row_ranges_cover_without_gaps():
    for n in (1, 2, 7, 131072):
        for k in (1, 3, 16, 10**6):
            r = row_ranges(n, k)
            assert r[0][0] == 0 and r[-1][1] == n and all(a < b for a, b in r)
            assert all(r[i][1] == r[i + 1][0] for i in range(len(r) - 1))


@pytest.mark.parametrize("largest", [1, 2**16, 2**40, 2**60])
@pytest.mark.parametrize("signs", [(1, 1, 1), (1, -1, 1), (1,)])
def test_signed_sum_of_blocks_is_exact(largest, signs):
    """Pairwise sums of blocks with signs give the exact integers, large counts included."""
    import scipy.sparse as sp

    from posstats.counting.ranges import _signed_sum

    rng = np.random.default_rng(largest % 1000)
    dense = [rng.integers(0, 3, size=(7, 11)) * (rng.random((7, 11)) < 0.4) for _ in signs]
    dense[0][3, 4] = largest
    blocks = [sp.csr_array(d.astype(np.int64)) for d in dense]
    got = _signed_sum(blocks, list(signs))
    expected = sum(s * d.astype(np.int64) for s, d in zip(signs, dense))
    np.testing.assert_array_equal(got.toarray(), expected)
    got.sum_duplicates()
    assert got.has_sorted_indices


def test_range_reduce_without_removals_is_exact(tmp_path):
    items = _partials(tmp_path, 40, 50, k=5, seed=3)
    spec = CountSpec(40, 50, "chunk")
    expected = sum_partials(items, spec, dense=False)
    parts = [sum_row_range(items, spec, a, b, tmp_path / f"range-{a}") for a, b in row_ranges(40, 3)]
    assemble_ranges(parts, items, spec, tmp_path / "total")
    assert load_counts(tmp_path / "total").equals(expected)


@pytest.mark.parametrize("V", [7, 300, 70_000])  # 70,000: uint32 token rows
@pytest.mark.parametrize("seed", range(4))
def test_sum_by_sorting_equals_the_pairwise_sum(V, seed):
    """Expanding rows into tokens and sorting them gives scipy's sum: the same canonical
    CSR (sorted, no zeros), empty rows and one-array sums included."""
    import scipy.sparse as sp

    from posstats.counting.ranges import sum_by_sorting

    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 30))
    blocks = []
    for _ in range(int(rng.integers(1, 6))):
        dense = rng.integers(1, 4, size=(m, V)) * (rng.random((m, V)) < rng.random() * 0.2)
        dense[rng.random(m) < 0.3] = 0  # empty rows
        blocks.append(sp.csr_array(dense.astype(np.int64)))
    got = sum_by_sorting(blocks, V)
    expected = sum(b.toarray() for b in blocks)
    np.testing.assert_array_equal(got.toarray(), expected)
    assert got.has_canonical_format and got.nnz == np.count_nonzero(expected) and got.dtype == np.int64


def test_sorting_pays_for_many_partials_of_small_counts():
    from posstats.counting.ranges import sorting_pays

    assert sorting_pays(16_500_000, 16_500_000, 40)  # 40 partials at n = 131,072: counts of 1
    assert not sorting_pays(9_600_000, 9_600_000, 8)  # 8 partials: scipy's 3 levels are as cheap
    assert not sorting_pays(10**9, 10**6, 40)  # large counts: too many tokens to expand
    assert not sorting_pays(10, 10, 1)


def test_range_reduce_of_many_partials_sorts_and_subtracts_exactly(tmp_path):
    """20 partials of a long context (counts mostly 1): the sorting sum, then a refresh's
    removal subtracted by scipy; equal to the in-process signed sum."""
    from posstats.counting.io import load_rows
    from posstats.counting.ranges import sorting_pays

    n, V = 200, 40
    items = _partials(tmp_path, n, V, k=20, seed=11)
    rows = [load_rows(path, 0, n) for path, _ in items]
    assert sorting_pays(sum(int(r.data.sum()) for r in rows), sum(r.nnz for r in rows), len(rows))
    items += [(items[3][0], -1)]
    spec = CountSpec(n, V, "chunk")
    expected = sum_partials(items, spec, dense=False)
    parts = [sum_row_range(items, spec, a, b, tmp_path / f"range-{a}") for a, b in row_ranges(n, 3)]
    assemble_ranges(parts, items, spec, tmp_path / "total")
    got = load_counts(tmp_path / "total")
    assert got.equals(expected) and got.tokens == expected.tokens
