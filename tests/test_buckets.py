"""Tests for posstats.counting.buckets: fixed-width and logarithmic position buckets, pooled counts."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from posstats.counting.buckets import (
    Buckets,
    bucket_counts,
    fixed_buckets,
    log_buckets,
    parse_buckets,
)
from posstats.counting.counts import CountSpec, PositionalCounts, count_sequences
from posstats.errors import PosstatsError


def test_fixed_and_log_edges_by_hand():
    np.testing.assert_array_equal(fixed_buckets(10, 4).edges, [0, 4, 8, 10])
    np.testing.assert_array_equal(fixed_buckets(8, 4).edges, [0, 4, 8])
    np.testing.assert_array_equal(log_buckets(20, 1).edges, [0, 1, 2, 4, 8, 16, 20])
    np.testing.assert_array_equal(log_buckets(10, 2).edges, [0, 1, 2, 3, 4, 6, 8, 10])
    assert fixed_buckets(10, 4).midpoints.tolist() == [1, 5, 8]
    assert log_buckets(20, 1).midpoints.tolist() == [0, 1, 2, 5, 11, 17]


@given(n=st.integers(1, 3000), param=st.integers(1, 40), scheme=st.sampled_from(["fixed", "log"]))
@settings(max_examples=80, deadline=None)
def test_buckets_partition_positions(n, param, scheme):
    b = fixed_buckets(n, param) if scheme == "fixed" else log_buckets(n, param)
    assert b.edges[0] == 0 and b.edges[-1] == n and np.all(np.diff(b.edges) > 0)
    owner = b.bucket_of(np.arange(n))
    np.testing.assert_array_equal(np.bincount(owner, minlength=len(b)), b.sizes)
    mids = b.midpoints
    assert np.all(np.diff(mids) > 0)
    np.testing.assert_array_equal(b.bucket_of(mids), np.arange(len(b)))


def test_log_buckets_grow_geometrically():
    b = log_buckets(131_072, 8)
    assert len(b) < 200  # 17 doublings x 8 + the unit-width start
    sizes = b.sizes
    assert sizes[0] == 1 and sizes[-2] > 1000
    ratio = sizes[-10:-1] / sizes[-11:-2]
    np.testing.assert_allclose(ratio, 2 ** (1 / 8), rtol=0.05)


def test_parse_buckets():
    assert parse_buckets(None, 10) is None
    assert parse_buckets("none", 10) is None
    assert parse_buckets("fixed:4", 10).edges.tolist() == [0, 4, 8, 10]
    assert parse_buckets("log:1", 20).scheme == "log"
    for bad in ("cubic:3", "fixed", "fixed:x", "log:0", "fixed:-2"):
        with pytest.raises(PosstatsError):
            parse_buckets(bad, 10)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("scheme", ["fixed:3", "log:2"])
def test_bucket_counts_pool_rows_exactly(sparse, scheme):
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 50, rng.integers(1, 40)).tolist() for _ in range(200)]
    c = count_sequences(seqs, positions=32, vocab_size=50, dense=not sparse)
    b = parse_buckets(scheme, 32)
    pooled = bucket_counts(c, b)
    assert pooled.is_sparse == sparse
    assert pooled.positions == len(b) and pooled.vocab_size == 50
    assert pooled.tokens == c.tokens and pooled.metadata["buckets"] == scheme
    dense = c.to_dense().matrix
    oracle = np.stack([dense[lo:hi].sum(axis=0) for lo, hi in zip(b.edges[:-1], b.edges[1:], strict=True)])
    np.testing.assert_array_equal(pooled.to_dense().matrix, oracle)
    np.testing.assert_array_equal(pooled.occupancy(), np.add.reduceat(c.occupancy(), b.edges[:-1]))


def test_bucketing_commutes_with_shard_sums():
    rng = np.random.default_rng(1)
    spec = CountSpec(positions=40, vocab_size=30)
    a = PositionalCounts(spec, sp.csr_array(rng.poisson(0.3, (40, 30)).astype(np.int64)))
    b = PositionalCounts(spec, sp.csr_array(rng.poisson(0.3, (40, 30)).astype(np.int64)))
    bk = log_buckets(40, 3)
    assert bucket_counts(a + b, bk).equals(bucket_counts(a, bk) + bucket_counts(b, bk))


def test_mismatched_buckets_raise():
    c = count_sequences([[1, 2, 3]], positions=3, vocab_size=5)
    with pytest.raises(ValueError, match="cover"):
        bucket_counts(c, fixed_buckets(4, 2))
    with pytest.raises(ValueError):
        Buckets(np.array([1, 2]), "fixed", 1)
    d = fixed_buckets(5, 2).to_dict()
    assert d["buckets"] == 3 and d["edges"] == [0, 2, 4, 5]
