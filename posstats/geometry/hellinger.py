"""Square-root distributions and blocked squared Hellinger distances (THEORY.md section 2).

For positional counts ``C`` (n x V) with occupancies ``occ[i] = sum_v C[i, v] > 0``:

    s_i = sqrt(C[i] / occ[i])                       (unit rows of S, float64)
    D[i, j] = d_H(i, j)^2 = sum_v (s_i[v] - s_j[v])^2 = 2 - 2 <s_i, s_j>   in [0, 2]

No 1/2 factor (the seed paper's convention), so ``d_H`` is in ``[0, sqrt 2]``.

Precision. The Gram form ``2 - 2 <s_i, s_j>`` is what makes the n x n matrix cheap (one
matrix product, sparse when ``C`` is), but it cancels: its absolute error is a few units
of ``eps`` (~1e-16 .. 1e-14) whatever ``D`` is, so for nearly identical rows (``D`` ~
1e-10, typical of deep positions of long contexts) the relative error is ~1e-5 or worse.
:func:`hellinger_sq` therefore recomputes every pair whose Gram value is below
``refine_below`` (default 1e-6) by :func:`hellinger_sq_pairs`, a difference form without
cancellation:

    s_i[v] - s_j[v] = (mu_i[v] - mu_j[v]) / (s_i[v] + s_j[v])
    mu_i[v] - mu_j[v] = (C[i, v] occ[j] - C[j, v] occ[i]) / (occ[i] occ[j])

The products ``C occ`` are formed exactly as float64 pairs (Dekker's two-product: no
int64 overflow for web-scale occupancies, and the same code on the GPU), so the
numerator is accurate to a few eps of itself (counts and occupancies must be below
2**53, where float64 holds integers exactly). The denominator is a sum of positive
numbers, so every term, and ``D`` itself, carries a relative error of a few ``eps`` even
when ``D`` is 1e-30. (The naive difference form
``sum (s_i - s_j)^2`` in float64 is not enough: the rounding of each ``s`` (~eps) gives
``D`` an absolute error ~ ``eps * d_H``.) Pairs at or above ``refine_below`` keep the Gram
value, whose relative error there is at most ~1e-14 / refine_below (~1e-8 on ``D``).
"""

from __future__ import annotations

import types
from typing import Any, NamedTuple

import numpy as np
import scipy.linalg.blas
import scipy.sparse as sp

from posstats.counting.csr_views import csr_rows_view
from posstats.geometry.backend import array_namespace

__all__ = ["distance_summary", "hellinger", "hellinger_sq", "hellinger_sq_pairs", "sqrt_distributions"]

# Bound on the elements of one temporary (pairs x V) array in the pairwise refinement,
# so that refining many pairs never needs more than ~8 MiB per temporary.
_PAIR_CHUNK_ELEMENTS = 1 << 20


class _Prepared(NamedTuple):
    """Validated counts with their occupancies and square-root distributions."""

    counts: Any  # dense xp array (original dtype) or canonical scipy CSR
    occ: Any  # (n,) int64 when counts are integers, else float64; on counts' device
    sqrt: Any  # (n, V) float64: dense xp array or scipy CSR with the pattern of counts
    sparse: bool
    xp: types.ModuleType


def _prepare(counts: Any, xp: types.ModuleType | None) -> _Prepared:
    if sp.issparse(counts):
        return _prepare_sparse(counts)
    xp = array_namespace(counts) if xp is None else xp
    c = xp.asarray(counts)
    if c.ndim != 2:
        msg = f"counts must be 2-D (positions, vocab); got shape {tuple(c.shape)}"
        raise ValueError(msg)
    kind = c.dtype.kind
    if kind not in "buif":
        msg = f"counts must be a real numeric array; got dtype {c.dtype}"
        raise TypeError(msg)
    if kind == "f" and not bool(xp.all(xp.isfinite(c))):
        msg = "counts contain NaN or infinite values"
        raise ValueError(msg)
    if kind in "if" and bool(xp.any(c < 0)):
        bad = xp.argwhere(c < 0)[0]
        msg = f"counts must be non-negative; got {c[bad[0], bad[1]].item()} at row {int(bad[0])}, column {int(bad[1])}"
        raise ValueError(msg)
    integer = kind in "biu"
    occ = c.sum(axis=1, dtype=xp.int64 if integer else xp.float64)
    _check_occupied(occ, xp)
    s = xp.sqrt(c.astype(xp.float64) / occ.astype(xp.float64)[:, None])
    return _Prepared(c, occ, s, False, xp)


def _prepare_sparse(counts: Any) -> _Prepared:
    if counts.ndim != 2:
        msg = f"counts must be 2-D (positions, vocab); got shape {tuple(counts.shape)}"
        raise ValueError(msg)
    csr_type = sp.csr_array if isinstance(counts, sp.sparray) else sp.csr_matrix
    # A canonical copy (summed duplicates, no stored zeros): the square root is taken per
    # stored entry, and the refinement relies on S having exactly the pattern of C.
    c = csr_type(counts, copy=True)
    c.sum_duplicates()
    c.eliminate_zeros()
    if c.nnz < 2**31 and max(c.shape) < 2**31:
        # int32 indices: a quarter less memory traffic in every sparse product.
        c = csr_type((c.data, c.indices.astype(np.int32), c.indptr.astype(np.int32)), shape=c.shape)
    kind = c.dtype.kind
    if kind not in "buif":
        msg = f"counts must be a real numeric array; got dtype {c.dtype}"
        raise TypeError(msg)
    if kind == "f" and not np.all(np.isfinite(c.data)):
        msg = "counts contain NaN or infinite values"
        raise ValueError(msg)
    if kind in "if" and c.data.size and c.data.min() < 0:
        pos = int(np.argmin(c.data))
        row = int(np.searchsorted(c.indptr, pos, side="right") - 1)
        msg = f"counts must be non-negative; got {c.data[pos].item()} at row {row}, column {int(c.indices[pos])}"
        raise ValueError(msg)
    integer = kind in "biu"
    n = c.shape[0]
    per_row = np.diff(c.indptr)
    if integer:
        csum = np.concatenate([[0], np.cumsum(c.data, dtype=np.int64)])
        occ = csum[c.indptr[1:]] - csum[c.indptr[:-1]]
        del csum
    else:
        occ = np.bincount(np.repeat(np.arange(n), per_row), weights=c.data.astype(np.float64), minlength=n)
    _check_occupied(occ, np)
    # in place, one temporary an entry (each row's occupancy): at 6e7 entries, 1.4 GB less
    data = c.data.astype(np.float64)
    data /= np.repeat(occ.astype(np.float64), per_row)
    np.sqrt(data, out=data)
    s = csr_type((data, c.indices.copy(), c.indptr.copy()), shape=c.shape)
    return _Prepared(c, occ, s, True, np)


def _check_occupied(occ: Any, xp: types.ModuleType) -> None:
    empty = xp.nonzero(occ == 0)[0]
    if empty.size:
        first = [int(i) for i in empty[:5].tolist()]
        msg = f"{int(empty.size)} row(s) have zero occupancy (first: {first}); remove unoccupied positions before computing distances"
        raise ValueError(msg)


def sqrt_distributions(counts: Any, /, *, xp: types.ModuleType | None = None) -> Any:
    """Square-root positional distributions ``S[i] = sqrt(C[i] / occ[i])``.

    Args:
        counts: (n, V) non-negative counts, integer or float; a numpy/cupy array or a
            scipy.sparse matrix/array. Every row must have positive occupancy.
        xp: array namespace; inferred from ``counts`` when None (ignored for sparse).

    Returns:
        (n, V) float64 with unit-norm rows: a dense array on the input's device, or for
        sparse input a scipy CSR (``csr_array`` for sparse arrays, ``csr_matrix`` for
        matrices) with the pattern of ``counts`` (duplicates summed, stored zeros removed).

    Raises:
        ValueError: not 2-D, negative or non-finite counts, or a row with zero occupancy.

    >>> sqrt_distributions(np.array([[1, 3], [0, 2]]))
    array([[0.5      , 0.8660254],
           [0.       , 1.       ]])
    """
    return _prepare(counts, xp).sqrt


def hellinger_sq_pairs(
    counts: Any, rows: Any, cols: Any, /, *, xp: types.ModuleType | None = None
) -> Any:
    """Squared Hellinger distances of the pairs ``(rows[p], cols[p])`` by the difference form.

    Uses ``s_i - s_j = (C_i occ_j - C_j occ_i) / (occ_i occ_j (s_i + s_j))`` with the
    products formed exactly (see the module docstring), so the result has
    a relative error of a few eps however close the two rows are. Cost O(pairs * V)
    (O(pairs * row nnz) for sparse input).

    Args:
        counts: (n, V) counts as for :func:`sqrt_distributions`.
        rows, cols: (m,) integer row indices.
        xp: array namespace; inferred from ``counts`` when None.

    Returns:
        (m,) float64 ``d_H^2`` on the input's device (numpy for sparse input).
    """
    prep = _prepare(counts, xp)
    pxp = prep.xp
    rows = pxp.asarray(rows, dtype=pxp.int64).reshape(-1)
    cols = pxp.asarray(cols, dtype=pxp.int64).reshape(-1)
    if rows.shape != cols.shape:
        msg = f"rows and cols must have the same length; got {rows.shape[0]} and {cols.shape[0]}"
        raise ValueError(msg)
    return _pairs(prep, rows, cols)


def _split(a: Any) -> tuple[Any, Any]:
    """Veltkamp split of float64 ``a`` into two 26-bit halves, ``a = hi + lo`` exactly."""
    c = 134217729.0 * a  # 2**27 + 1
    hi = c - (c - a)
    return hi, a - hi


def _two_product(a: Any, b: Any) -> tuple[Any, Any]:
    """Dekker's error-free product: ``a * b = p + e`` exactly, ``p = fl(a * b)``."""
    p = a * b
    a_hi, a_lo = _split(a)
    b_hi, b_lo = _split(b)
    e = ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo
    return p, e


def _pairs(prep: _Prepared, rows: Any, cols: Any) -> Any:
    xp = prep.xp
    m = int(rows.shape[0])
    out = xp.empty(m, dtype=xp.float64)
    if m == 0:
        return out
    c = prep.counts
    occ = prep.occ.astype(xp.float64)
    width = max(1, int(c.shape[1]))
    step = max(1, _PAIR_CHUNK_ELEMENTS // width)
    for a in range(0, m, step):
        i, j = rows[a : a + step], cols[a : a + step]
        scale = occ[i] * occ[j]
        if prep.sparse:
            out[a : a + step] = _pairs_sparse(prep, i, j, occ) / (scale * scale)
        else:
            p1, e1 = _two_product(c[i].astype(xp.float64), occ[j][:, None])
            p2, e2 = _two_product(c[j].astype(xp.float64), occ[i][:, None])
            # p1 - p2 is exact when the rows are close (Sterbenz), and e1 - e2 restores the
            # low parts of the products: the numerator to a few eps of itself.
            num = (p1 - p2) + (e1 - e2)
            den = prep.sqrt[i] + prep.sqrt[j]
            # Where both counts are 0 the numerator is 0 too; divide by 1 there.
            q = num / xp.where(den > 0, den, 1.0)
            out[a : a + step] = xp.sum(q * q, axis=1) / (scale * scale)
    return out


def _pairs_sparse(prep: _Prepared, i: np.ndarray, j: np.ndarray, occ: np.ndarray) -> np.ndarray:
    """Row sums of ((C_i occ_j - C_j occ_i) / (s_i + s_j))^2 with sparse row differences."""
    pa, ea = _scaled_rows(prep.counts[i], occ[j])
    pb, eb = _scaled_rows(prep.counts[j], occ[i])
    num = (pa - pb) + (ea - eb)  # union pattern
    den = prep.sqrt[i] + prep.sqrt[j]  # union pattern, every stored entry > 0
    den.data = 1.0 / den.data
    q = type(den)(num.multiply(den))  # the pattern of num is inside the pattern of den
    return np.bincount(
        np.repeat(np.arange(q.shape[0]), np.diff(q.indptr)),
        weights=np.asarray(q.data, dtype=np.float64) ** 2,
        minlength=q.shape[0],
    )


def _scaled_rows(m: Any, factor: np.ndarray) -> tuple[Any, Any]:
    """``m * factor[:, None]`` as the exact pair (product, error), both with m's pattern."""
    p, e = _two_product(m.data.astype(np.float64), np.repeat(factor, np.diff(m.indptr)))
    kind = type(m)
    return kind((p, m.indices, m.indptr), shape=m.shape), kind((e, m.indices, m.indptr), shape=m.shape)


# Columns of S denser than this go to dense blocks for the Gram product. A sparse-sparse
# product costs ~nnz_v^2 for column v at ~1e8 multiply-adds/s (scipy, one thread), a dense
# one ~n^2 at ~1e10 and more (BLAS); they break even near a column density of 1/10-1/20.
# Frequent tokens (Zipf's head) occur at nearly every position, so this moves most of
# the work to BLAS: ~10x faster than an all-sparse product on a GPT-2-vocabulary corpus.
_DENSE_COLUMN_DENSITY = 0.05
# Elements of one dense block (2**26 float64 = 512 MiB): the dense columns are densified
# and multiplied this many at a time, so every one of them goes to BLAS whatever their
# number (a single block capped at this size left 34,000 of GPT-2's 50,257 columns to the
# sparse product at 4,096 rows of 2e8 tokens).
_DENSE_BLOCK_ELEMENTS = 1 << 26
# Rows per sparse-sparse product inside a block.
_SPARSE_TILE = 512


def _split_columns(s: Any) -> tuple[Any, Any]:
    """Split sparse S (n, V) into (CSC of its dense columns, CSR of the rest), either None
    when empty. ``S S^T`` is the sum of the two parts' Gram matrices."""
    n, v = s.shape
    per_column = np.bincount(s.indices, minlength=v)
    heavy = per_column > _DENSE_COLUMN_DENSITY * n
    if not heavy.any():
        return None, s
    csc = s.tocsc()
    light = np.flatnonzero(~heavy)
    dense_part = csc[:, np.flatnonzero(heavy)] if light.size else csc  # every column dense: no copy
    sparse_part = csc[:, light].tocsr() if light.size else None
    if sparse_part is not None and sparse_part.nnz == 0:
        sparse_part = None
    return dense_part, sparse_part


def _dense_blocks(columns: Any) -> Any:
    """The (n, h) canonical CSC ``columns`` as Fortran-ordered float64 blocks of at most
    ``_DENSE_BLOCK_ELEMENTS`` elements, left to right, each written in that order (as the
    CSC gives them: a C copy of 512 MiB cost 2.6 s at 2,048 rows, and a C block made
    Fortran held a second 512 MiB). Every block is written into one buffer, which the next
    overwrites (use each before asking for the next), from a view of its columns: at
    4,096 rows of 1.9e8 tokens a fresh 512 MiB block and a copied column slice cost 5.5 s
    of the 14.6 s distance matrix, the buffer and views about 2.5 s."""
    n, h = columns.shape
    step = max(1, _DENSE_BLOCK_ELEMENTS // max(n, 1))
    buffer = np.empty((n, min(step, h)), dtype=np.float64, order="F")
    by_column = columns.T  # CSR of the columns (shares the CSC's arrays)
    for c0 in range(0, h, step):
        c1 = min(h, c0 + step)
        yield csr_rows_view(by_column, c0, c1).T.toarray(out=buffer[:, : c1 - c0])


def _gram_rows(x: Any, a: int, b: int, xp: types.ModuleType) -> Any:
    """``x[a:b] @ x[a:].T`` (b - a, n - a) for dense float64 ``x``; in its leading square only
    the upper triangle is meant to be used (numpy fills it by SYRK, half the work). A
    Fortran-ordered ``x`` (the sparse path's dense columns) is read in place when the block
    is all of it, else only the block's rows are copied."""
    if xp is not np:
        return x[a:b] @ x[a:].T
    if a == 0 and b == x.shape[0] and x.flags.f_contiguous:
        return scipy.linalg.blas.dsyrk(1.0, x, trans=0, lower=0)
    m = b - a
    out = np.empty((m, x.shape[0] - a), dtype=np.float64)
    rows = np.ascontiguousarray(x[a:b])
    # rows.T is Fortran-ordered, so SYRK gets it without a copy; the result's lower
    # triangle is zero and is discarded by the caller.
    out[:, :m] = scipy.linalg.blas.dsyrk(1.0, rows.T, trans=1, lower=0)
    if b < x.shape[0]:
        out[:, m:] = rows @ x[b:].T
    return out


def hellinger_sq(
    counts: Any,
    /,
    *,
    block: int = 4096,
    refine_below: float = 1e-6,
    xp: types.ModuleType | None = None,
) -> Any:
    """Squared Hellinger distances between the rows of ``counts``, float64, in [0, 2].

    ``D = 2 - 2 S S^T`` computed in row blocks of ``S`` against the rows at and after the
    block (upper block triangle, then mirrored), so the result is exactly symmetric and
    half the product is skipped (numpy: SYRK on the diagonal blocks). Dense input runs on
    its device in float64 (never TF32). Sparse input never densifies ``S`` as a whole: its
    densest columns (present at > 5% of the positions, Zipf's head) form dense blocks
    multiplied by BLAS, the rest stay sparse, and the two Gram
    matrices are added (about 10x faster than an all-sparse product on a GPT-2-vocabulary
    corpus, where the frequent tokens occur at almost every position; 512 MiB of them at a
    time, however many). The diagonal is exactly
    0, negatives are clipped to 0, and pairs whose Gram value is below ``refine_below``
    are recomputed by the cancellation-free difference form (:func:`hellinger_sq_pairs`;
    see the module docstring). ``refine_below=0`` turns the refinement off.

    Args:
        counts: (n, V) counts of occupied positions (dense numpy/cupy or scipy sparse).
        block: rows per block (memory ~ block * n floats per temporary).
        refine_below: Gram values of ``D`` below this are recomputed exactly.
        xp: array namespace; inferred from ``counts`` when None.

    Returns:
        (n, n) float64 ``D``; numpy for sparse input, else on the input's device.

    >>> hellinger_sq(np.array([[1, 0], [0, 1], [1, 1]])).round(4)
    array([[0.    , 2.    , 0.5858],
           [2.    , 0.    , 0.5858],
           [0.5858, 0.5858, 0.    ]])
    """
    if int(block) < 1:
        msg = f"block must be a positive integer; got {block}"
        raise ValueError(msg)
    block = int(block)
    if not refine_below >= 0:
        msg = f"refine_below must be >= 0; got {refine_below}"
        raise ValueError(msg)
    prep = _prepare(counts, xp)
    xp, s = prep.xp, prep.sqrt
    n = int(s.shape[0])
    if prep.sparse:
        dense_part, sparse_part = _split_columns(s)
    d = xp.empty((n, n), dtype=xp.float64)
    for a in range(0, n, block):
        b = min(a + block, n)
        m = b - a
        if prep.sparse:
            r = np.zeros((m, n - a), dtype=np.float64)
            if dense_part is not None:
                for dense in _dense_blocks(dense_part):
                    r += _gram_rows(dense, a, b, np)
            if sparse_part is not None:
                # Sub-tiles: a sparse product cannot skip the lower triangle, so keep the
                # part of each tile below the diagonal small.
                for t in range(a, b, _SPARSE_TILE):
                    u = min(t + _SPARSE_TILE, b)
                    r[t - a : u - a, t - a :] += (sparse_part[t:u] @ sparse_part[t:].T).toarray()
        else:
            r = _gram_rows(s, a, b, xp)
        r *= -2.0
        r += 2.0
        xp.maximum(r, 0.0, out=r)
        if refine_below > 0:
            cand = r < refine_below
            cand[:, :m] = xp.triu(cand[:, :m], 1)  # each unordered pair once, never i == i
            ii, jj = xp.nonzero(cand)
            if ii.size:
                r[ii, jj] = _pairs(prep, ii.astype(xp.int64) + a, jj.astype(xp.int64) + a)
        # Keep the strict upper triangle of the diagonal block and mirror it: exact
        # symmetry and an exactly zero diagonal (x + 0 and 0 + 0 are exact).
        upper = xp.triu(r[:, :m], 1)
        r[:, :m] = upper + upper.T
        d[a:b, a:] = r
        d[b:, a:b] = r[:, m:].T
    return d


def hellinger(
    counts: Any,
    /,
    *,
    block: int = 4096,
    refine_below: float = 1e-6,
    xp: types.ModuleType | None = None,
) -> Any:
    """Hellinger distances ``d_H = sqrt(hellinger_sq(counts))``, float64, in [0, sqrt 2].

    Same arguments as :func:`hellinger_sq`; (n, n) on the input's device (numpy for sparse).
    """
    d = hellinger_sq(counts, block=block, refine_below=refine_below, xp=xp)
    xp = array_namespace(d)
    return xp.sqrt(d, out=d)


def distance_summary(squared: np.ndarray, /) -> dict[str, float]:
    """min / mean / max of the off-diagonal Hellinger distances ``sqrt(squared)`` of an
    (n, n) matrix of squared distances; ``{}`` for n < 2."""
    off = np.sqrt(squared[~np.eye(squared.shape[0], dtype=bool)])
    return {"min": float(off.min()), "mean": float(off.mean()), "max": float(off.max())} if off.size else {}
