"""posstats.counting.reduce: exact signed sums of saved counts (any order, dense or sparse
accumulation, subtraction), and the storage saved partials take."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from posstats.counting.counts import (
    PositionalCounts,
    combine_fingerprints,
    count_sequences,
)
from posstats.counting.io import load_counts, save_counts
from posstats.counting.reduce import sum_partials
from posstats.errors import InputError
from tests.test_shard_store import SPEC, random_counts


def test_saved_partials_take_the_smaller_storage(tmp_path):
    dense_data = random_counts(4, docs=400)
    assert save_counts(dense_data, tmp_path / "d").name == "counts.safetensors"  # nearly every cell is non-zero
    few = count_sequences([[1, 2]], positions=50, vocab_size=1000)
    assert save_counts(few, tmp_path / "s").name == "counts.csr.safetensors"
    with_zeros = PositionalCounts(few.spec, sp.csr_array(few.matrix * 0 + few.matrix), 1, 1, 2)
    save_counts(with_zeros, tmp_path / "z")
    assert load_counts(tmp_path / "z").matrix.nnz == 2  # explicit zeros are not stored


@settings(max_examples=30, deadline=None)
@given(
    seeds=st.lists(st.integers(0, 10_000), min_size=1, max_size=6, unique=True),
    signs=st.lists(st.sampled_from([1, -1]), min_size=6, max_size=6),
    kinds=st.lists(st.booleans(), min_size=6, max_size=6),
    dense=st.booleans(),
)
def test_sum_partials_is_the_exact_signed_sum(tmp_path_factory, seeds, signs, kinds, dense):
    root = tmp_path_factory.mktemp("sum")
    items, expected = [], np.zeros((6, 20), dtype=np.int64)
    totals = np.zeros(3, dtype=np.int64)
    fp = ""
    for k, seed in enumerate(seeds):
        c = random_counts(seed, sparse=kinds[k])
        save_counts(c, root / str(k))
        items.append((root / str(k), signs[k]))
        expected += signs[k] * c.to_dense().matrix
        totals += signs[k] * np.array([c.sequences, c.windows, c.tokens])
        fp = combine_fingerprints(fp, c.fingerprint)
    got = sum_partials(items, SPEC, dense=dense, metadata={"tokenizer": "t"})
    assert got.is_sparse is (not dense)
    np.testing.assert_array_equal(got.to_dense().matrix, expected)
    assert [got.sequences, got.windows, got.tokens] == totals.tolist()
    assert got.fingerprint == fp and got.metadata == {"tokenizer": "t"}
    if not dense:
        assert np.all(got.matrix.data != 0)  # cancelled cells are dropped, not stored as 0
    assert sum_partials(list(reversed(items)), SPEC, dense=not dense).equals(got)


def test_sum_partials_subtracting_a_shard_removes_it(tmp_path):
    parts = [random_counts(s) for s in range(4)]
    for i, c in enumerate(parts):
        save_counts(c, tmp_path / str(i))
    total = functools.reduce(lambda a, b: a + b, parts)
    save_counts(total, tmp_path / "total")
    got = sum_partials([(tmp_path / "total", 1), (tmp_path / "2", -1)], SPEC, dense=True)
    rest = parts[0] + parts[1] + parts[3]
    assert got.equals(rest) and got.fingerprint == rest.fingerprint


def test_sum_partials_refuses_other_specs(tmp_path):
    save_counts(count_sequences([[1]], positions=3, vocab_size=20), tmp_path / "a")
    with pytest.raises(InputError, match="counted under"):
        sum_partials([(tmp_path / "a", 1)], SPEC, dense=True)
