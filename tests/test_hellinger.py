"""Tests for posstats.geometry.hellinger against brute-force oracles (THEORY.md section 2).

Dense inputs run on every backend (the ``xp`` fixture); scipy.sparse inputs are host-only.
"""

from __future__ import annotations

import decimal
import math

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from posstats.geometry.backend import array_namespace, to_numpy
from posstats.geometry.hellinger import (
    hellinger,
    hellinger_sq,
    hellinger_sq_pairs,
    sqrt_distributions,
)


def brute_sq(counts: np.ndarray) -> np.ndarray:
    """Difference form sum_v (s_i[v] - s_j[v])^2, pair by pair, float64."""
    c = np.asarray(counts, dtype=np.float64)
    s = np.sqrt(c / c.sum(axis=1, keepdims=True))
    n = s.shape[0]
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            out[i, j] = np.sum((s[i] - s[j]) ** 2)
    return out


def decimal_sq(ci: np.ndarray, cj: np.ndarray, digits: int = 60) -> float:
    """The difference form in 60-digit decimal arithmetic: an independent high-precision oracle."""
    with decimal.localcontext() as ctx:
        ctx.prec = digits
        oi, oj = decimal.Decimal(int(ci.sum())), decimal.Decimal(int(cj.sum()))
        total = decimal.Decimal(0)
        for a, b in zip(ci.tolist(), cj.tolist(), strict=True):
            diff = (decimal.Decimal(int(a)) / oi).sqrt() - (decimal.Decimal(int(b)) / oj).sqrt()
            total += diff * diff
        return float(total)


@st.composite
def count_matrices(draw, max_n: int = 8, max_v: int = 6) -> np.ndarray:
    n = draw(st.integers(1, max_n))
    v = draw(st.integers(1, max_v))
    c = draw(hnp.arrays(np.int64, (n, v), elements=st.integers(0, 30)))
    # Every row occupied: put at least one count in a drawn column of each empty row.
    col = draw(st.integers(0, v - 1))
    c[c.sum(axis=1) == 0, col] = 1
    return c


def test_small_example_matches_formula(xp):
    c = xp.asarray([[1, 0], [0, 1], [1, 1]])
    d = to_numpy(hellinger_sq(c))
    expected = np.array([[0, 2, 2 - math.sqrt(2)], [2, 0, 2 - math.sqrt(2)], [2 - math.sqrt(2), 2 - math.sqrt(2), 0]])
    np.testing.assert_allclose(d, expected, rtol=0, atol=1e-15)


@settings(max_examples=60, deadline=None)
@given(c=count_matrices())
def test_properties_and_brute_force(xp, c):
    out = hellinger_sq(xp.asarray(c))
    assert array_namespace(out) is xp  # the output stays on the input's device
    d = to_numpy(out)
    assert d.dtype == np.float64
    np.testing.assert_array_equal(d, d.T)
    np.testing.assert_array_equal(np.diag(d), np.zeros(c.shape[0]))
    assert d.min() >= 0.0
    assert d.max() <= 2.0
    np.testing.assert_allclose(d, brute_sq(c), rtol=0, atol=1e-14)
    dh = to_numpy(hellinger(xp.asarray(c)))
    np.testing.assert_allclose(dh, np.sqrt(d), rtol=1e-15, atol=0)
    assert dh.max() <= math.sqrt(2.0)


@settings(max_examples=60, deadline=None)
@given(count_matrices(), st.booleans())
def test_sparse_equals_dense(c, as_array):
    kind = sp.csr_array if as_array else sp.csr_matrix
    ds = hellinger_sq(kind(c))
    assert isinstance(ds, np.ndarray)
    np.testing.assert_allclose(ds, hellinger_sq(c), rtol=0, atol=1e-14)
    np.testing.assert_array_equal(ds, ds.T)


def check_blocked_equals_unblocked(x, block: int) -> None:
    """``hellinger_sq(x, block=block)`` equals one block, exactly symmetric, zero diagonal."""
    ref = to_numpy(hellinger_sq(x, block=4096))
    d = to_numpy(hellinger_sq(x, block=block))
    np.testing.assert_allclose(d, ref, rtol=0, atol=1e-14)
    np.testing.assert_array_equal(d, d.T)
    np.testing.assert_array_equal(np.diag(d), 0.0)


@settings(max_examples=40, deadline=None)
@given(c=count_matrices(max_n=12), block=st.integers(1, 13))
def test_blocked_equals_unblocked(xp, c, block):
    check_blocked_equals_unblocked(xp.asarray(c), block)


@settings(max_examples=40, deadline=None)
@given(c=count_matrices(max_n=12), block=st.integers(1, 13))
def test_blocked_equals_unblocked_sparse(c, block):
    check_blocked_equals_unblocked(sp.csr_array(c), block)


def medium_counts() -> np.ndarray:
    """(50, 400) seeded Poisson counts with 10 dense columns (the dense/sparse column split)."""
    rng = np.random.default_rng(3)
    c = rng.poisson(0.3, size=(50, 400))
    c[:, :10] += rng.poisson(40, size=(50, 10))
    c[:, 0] += 1
    return c


def check_blocked_medium(x, c: np.ndarray, block: int) -> None:
    d = to_numpy(hellinger_sq(x, block=block))
    np.testing.assert_allclose(d, brute_sq(c), rtol=0, atol=1e-14)
    np.testing.assert_array_equal(d, d.T)


@pytest.mark.parametrize("block", [1, 7, 32, 50, 64, 1000])
def test_blocked_medium(xp, block):
    c = medium_counts()
    check_blocked_medium(xp.asarray(c), c, block)


@pytest.mark.parametrize("block", [1, 7, 32, 50, 64, 1000])
def test_blocked_medium_sparse(block):
    c = medium_counts()
    check_blocked_medium(sp.csr_array(c), c, block)


@pytest.mark.parametrize("elements", [50, 150, 50 * 9, 10**9])
@pytest.mark.parametrize("block", [7, 1000])
def test_dense_columns_in_several_blocks(monkeypatch, elements, block):
    """The dense columns (here the 10 heavy ones and the densest light ones) multiplied a
    block of ``_DENSE_BLOCK_ELEMENTS`` at a time give the same distances as in one block:
    1, 3, 9 and all of them a block, every one of them in a dense block."""
    import posstats.geometry.hellinger as h

    monkeypatch.setattr(h, "_DENSE_BLOCK_ELEMENTS", elements)
    c = medium_counts()
    dense, light = h._split_columns(h.sqrt_distributions(sp.csr_array(c)))
    per_column = (c > 0).sum(axis=0)
    assert dense.shape[1] == int((per_column > 0.05 * c.shape[0]).sum()) > 10  # none left to the sparse part
    assert sum(b.shape[1] for b in h._dense_blocks(dense)) == dense.shape[1]
    assert max(b.shape[1] for b in h._dense_blocks(dense)) == min(dense.shape[1], max(1, elements // 50))
    check_blocked_medium(sp.csr_array(c), c, block)


def _near_identical(rng: np.random.Generator, scale: int) -> np.ndarray:
    """Rows equal up to a few counts at very large occupancy: d_H^2 ~ 1e-10 .. 1e-20."""
    base = rng.integers(1, 1000, size=40) * scale
    rows = [base.copy()]
    for bump in (1, 2, 5, 1000, 10**5):
        r = base.copy()
        r[rng.integers(0, 40)] += bump
        rows.append(r)
    r = base.copy()
    r[3] += 1
    r[17] -= 1  # same occupancy, two counts moved
    rows.append(r)
    rows.append(base * 3)  # identical distribution, different occupancy: distance exactly 0
    return np.array(rows, dtype=np.int64)


def check_near_identical_rows(x, c: np.ndarray) -> None:
    """Against a 60-digit oracle, d_H^2 of nearly identical rows is exact to ~1e-13 relative.

    The Gram form alone (refine_below=0) has an absolute error ~1e-16, i.e. a relative
    error of 1e-6 or worse at these distances; the refinement is what this checks.
    """
    n = c.shape[0]
    oracle = np.array([[decimal_sq(c[i], c[j]) for j in range(n)] for i in range(n)])
    assert 0 < oracle[0, 1] < 1e-8  # really near-identical
    np.testing.assert_array_equal(oracle[0, -1], 0.0)
    d = to_numpy(hellinger_sq(x))
    near = oracle < 1e-6  # the pairs refine_below (default 1e-6) sends to the difference form
    assert near.sum() > n + 10
    np.testing.assert_allclose(d[near], oracle[near], rtol=1e-13, atol=1e-300)
    # Elsewhere the Gram form's absolute error (a few eps) is at most ~1e-10 relative.
    np.testing.assert_allclose(d[~near], oracle[~near], rtol=0, atol=1e-14)
    # d_H itself, where the user sees it: relative precision too.
    np.testing.assert_allclose(to_numpy(hellinger(x))[near], np.sqrt(oracle[near]), rtol=1e-13, atol=1e-300)
    # The Gram form is measurably worse on these pairs (why the refinement exists).
    gram = to_numpy(hellinger_sq(x, refine_below=0.0))
    mask = oracle > 0
    assert np.max(np.abs(gram[mask] - oracle[mask]) / oracle[mask]) > 1e-6


@pytest.mark.parametrize("scale", [10**3, 10**7])
def test_near_identical_rows_relative_precision(xp, scale):
    c = _near_identical(np.random.default_rng(11), scale)
    check_near_identical_rows(xp.asarray(c), c)


@pytest.mark.parametrize("scale", [10**3, 10**7])
def test_near_identical_rows_relative_precision_sparse(scale):
    c = _near_identical(np.random.default_rng(11), scale)
    check_near_identical_rows(sp.csr_array(c), c)


def pairs_case() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(counts (6, 30), rows, cols of every pair i < j, their 60-digit d_H^2)."""
    rng = np.random.default_rng(5)
    c = rng.integers(0, 50, size=(6, 30))
    c[:, 0] += 1
    rows, cols = np.triu_indices(6, 1)
    want = np.array([decimal_sq(c[i], c[j]) for i, j in zip(rows, cols, strict=True)])
    return c, rows, cols, want


def test_pairs_difference_form_matches_oracle(xp):
    c, rows, cols, want = pairs_case()
    got = hellinger_sq_pairs(xp.asarray(c), rows, cols)
    assert array_namespace(got) is xp
    np.testing.assert_allclose(to_numpy(got), want, rtol=1e-14, atol=0)


def test_pairs_difference_form_matches_oracle_sparse():
    c, rows, cols, want = pairs_case()
    np.testing.assert_allclose(hellinger_sq_pairs(sp.csr_matrix(c), rows, cols), want, rtol=1e-14, atol=0)


def test_pairs_huge_counts_fall_back_to_float(xp):
    # C * occ overflows int64 here; the float64 numerator still gives full precision at
    # moderate distances.
    rng = np.random.default_rng(8)
    c = rng.integers(1, 2**40, size=(3, 20), dtype=np.int64)
    got = to_numpy(hellinger_sq_pairs(xp.asarray(c), [0, 0, 1], [1, 2, 2]))
    want = [decimal_sq(c[0], c[1]), decimal_sq(c[0], c[2]), decimal_sq(c[1], c[2])]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


def test_float_counts_accepted(xp):
    c = np.array([[0.5, 1.5, 0.0], [1.0, 1.0, 2.0]])
    np.testing.assert_allclose(to_numpy(hellinger_sq(xp.asarray(c))), brute_sq(c), rtol=0, atol=1e-15)


def test_sqrt_distributions_dense(xp):
    c = np.array([[1, 3, 0], [0, 2, 2]])
    out = sqrt_distributions(xp.asarray(c))
    assert array_namespace(out) is xp
    s = to_numpy(out)
    assert s.dtype == np.float64
    np.testing.assert_allclose(s, np.sqrt(c / c.sum(axis=1, keepdims=True)), rtol=1e-15, atol=0)
    np.testing.assert_allclose(np.sum(s * s, axis=1), 1.0, rtol=1e-15)


def test_sqrt_distributions_sparse():
    c = np.array([[1, 3, 0], [0, 2, 2]])
    s = sqrt_distributions(c)
    sa = sqrt_distributions(sp.csr_array(c))
    sm = sqrt_distributions(sp.csr_matrix(c))
    assert isinstance(sa, sp.csr_array) and sa.dtype == np.float64
    assert isinstance(sm, sp.csr_matrix) and sm.dtype == np.float64
    np.testing.assert_allclose(sa.toarray(), s, rtol=1e-15, atol=0)
    np.testing.assert_allclose(sm.toarray(), s, rtol=1e-15, atol=0)


def test_sparse_duplicates_and_stored_zeros():
    # COO with duplicate entries and an explicit zero: sqrt must apply to the summed count.
    rows = np.array([0, 0, 0, 1, 1])
    cols = np.array([1, 1, 2, 0, 2])
    vals = np.array([1, 2, 0, 4, 4])
    coo = sp.coo_array((vals, (rows, cols)), shape=(2, 3))
    dense = coo.toarray()
    np.testing.assert_allclose(sqrt_distributions(coo).toarray(), sqrt_distributions(dense), rtol=1e-15, atol=0)
    np.testing.assert_allclose(hellinger_sq(coo), brute_sq(dense), rtol=0, atol=1e-15)


def check_zero_occupancy_row_raises(x) -> None:
    with pytest.raises(ValueError, match=r"zero occupancy \(first: \[1\]\)"):
        hellinger_sq(x)
    with pytest.raises(ValueError, match="zero occupancy"):
        sqrt_distributions(x)


def test_zero_occupancy_row_raises(xp):
    check_zero_occupancy_row_raises(xp.asarray([[1, 2], [0, 0], [3, 0]]))


def test_zero_occupancy_row_raises_sparse():
    check_zero_occupancy_row_raises(sp.csr_array(np.array([[1, 2], [0, 0], [3, 0]])))


def test_negative_counts_raise(xp):
    with pytest.raises(ValueError, match="non-negative.*row 1, column 1"):
        hellinger_sq(xp.asarray([[1, 2], [3, -1]]))


def test_negative_counts_raise_sparse():
    with pytest.raises(ValueError, match="non-negative.*row 1, column 1"):
        hellinger_sq(sp.csr_array(np.array([[1, 2], [3, -1]])))


def test_bad_shapes_and_values_raise(xp):
    with pytest.raises(ValueError, match="2-D"):
        hellinger_sq(xp.asarray([1, 2, 3]))
    with pytest.raises(ValueError, match="NaN"):
        hellinger_sq(xp.asarray([[1.0, np.nan]]))
    with pytest.raises(ValueError, match="block"):
        hellinger_sq(xp.asarray([[1, 2]]), block=0)


def test_non_numeric_dtype_raises():
    # Host only: cupy has no string arrays.
    with pytest.raises(TypeError, match="dtype"):
        hellinger_sq(np.array([["a", "b"]]))


def test_empty_input(xp):
    d = hellinger_sq(xp.zeros((0, 4), dtype=xp.int64))
    assert d.shape == (0, 0)


IDENTICAL_ROWS = np.array([[1, 2, 3], [2, 4, 6], [10, 20, 30], [0, 0, 1]])


def test_identical_rows_exact_zero(xp):
    d = to_numpy(hellinger_sq(xp.asarray(IDENTICAL_ROWS)))
    np.testing.assert_array_equal(d[:3, :3], np.zeros((3, 3)))


def test_identical_rows_exact_zero_sparse():
    d = hellinger_sq(sp.csr_array(IDENTICAL_ROWS))
    np.testing.assert_array_equal(d[:3, :3], np.zeros((3, 3)))
