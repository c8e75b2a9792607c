"""The centred square-root operator ``S_c = S - 1 mean(S)^T``, ``S = sqrt(C / occ)``, applied
without forming it: the counts split by column into a dense head (BLAS) and a sparse tail
(threaded CSR products), on the host or a GPU; with a shift (``ShiftedSqrt``) for the
occupancy shrinkage. Classical MDS and the rank test multiply by it.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from posstats.geometry.backend import array_namespace, get_cupy_sparse
from posstats.geometry.hellinger import sqrt_distributions
from posstats.geometry.products import (
    _row_block_views,
    _RowBlocks,
    _transposed_views,
    blocks_t_times,
    blocks_times,
    product_threads,
)

__all__ = ["ShiftedSqrt", "shifted_operator", "sqrt_operator"]


class _CentredSqrt:
    """The implicit ``S_c = S - 1 m^T`` (n x V) with products on S's device.

    Sparse ``S`` stays sparse (the centring is a rank-one correction); a dense ``S`` is
    centred explicitly, which avoids the cancellation of ``S x - 1 (m . x)`` when the rows
    are nearly identical.
    """

    def __init__(self, counts: Any) -> None:
        self.sparse = sp.issparse(counts)
        s = sqrt_distributions(counts)
        self.xp = np if self.sparse else array_namespace(s)
        self.shape = tuple(int(x) for x in s.shape)
        if self.sparse:
            csr = s.tocsr()
            self.mean = np.asarray(csr.mean(axis=0), dtype=np.float64).reshape(-1)
            self._total = self._sparse_total_variance(csr)
            self.s = _RowBlocks(csr)
            self.st = _RowBlocks(csr.T.tocsr())  # row-major transpose: fast S^T y
        else:
            self.mean = s.mean(axis=0)
            self.s = s - self.mean[None, :]
            self.st = self.s.T
            self._total = float(self.xp.sum(self.s * self.s))

    def _sparse_total_variance(self, csr: sp.csr_array) -> float:
        """``||S_c||_F^2`` by a two-pass column variance (no cancellation against |S|^2)."""
        n = self.shape[0]
        dev = csr.data - self.mean[csr.indices]
        stored = np.bincount(csr.indices, minlength=self.shape[1])
        # Stored entries contribute (s - m)^2, each implicit zero of column v contributes m_v^2.
        return float(np.sum(dev * dev) + np.sum((n - stored) * self.mean**2))

    def total_variance(self) -> float:
        """``trace(B) = ||S_c||_F^2``."""
        return self._total

    def apply(self, x: Any) -> Any:
        """``S_c x`` for x of shape (V,) or (V, b)."""
        if self.sparse:
            # An elementwise sum, not a BLAS dot: threaded BLAS on one length-V vector per
            # Lanczos step cost more in wake-ups than the arithmetic (see _single_blas_thread).
            shift = (self.mean * x).sum() if x.ndim == 1 else self.mean @ x
            return self.s @ x - shift
        return self.s @ x

    def apply_t(self, y: Any) -> Any:
        """``S_c^T y`` for y of shape (n,) or (n, b)."""
        if self.sparse:
            ysum = y.sum(axis=0)
            return self.st @ y - (self.mean[:, None] * ysum if y.ndim == 2 else self.mean * ysum)
        return self.st @ y


# Columns of S at least this dense go to the dense block (see hellinger._DENSE_COLUMN_DENSITY);
# the block is capped at _SPLIT_DENSE_BYTES (2 GiB of float64).
_SPLIT_DENSITY = 0.05
_SPLIT_DENSE_BYTES = 1 << 31
_SPLIT_CHUNK_NNZ = 1 << 23  # stored entries handled at a time while splitting


def _canonical_counts(counts: Any) -> Any:
    """Sparse counts (n x V) as CSR in canonical format (sorted, no duplicate entries)."""
    c = counts if isinstance(counts, (sp.csr_array, sp.csr_matrix)) else sp.csr_array(counts)
    if not c.has_canonical_format:
        c = sp.csr_array(c, copy=True)
        c.sum_duplicates()
    return c


def _check_count_values(c: Any) -> None:
    """Refuse a non-numeric dtype (``TypeError``) or a negative / non-finite entry
    (``ValueError``) among the stored entries of the CSR counts ``c``."""
    if c.dtype.kind not in "buif":
        msg = f"counts must be a real numeric array; got dtype {c.dtype}"
        raise TypeError(msg)
    data = c.data
    if data.size and (data.min() < 0 or not np.all(np.isfinite(data))):
        msg = "counts must be finite and non-negative"
        raise ValueError(msg)


def _heavy_columns(per_col: np.ndarray, n: int) -> np.ndarray:
    """Sorted indices of the columns that go to the dense block: those stored in at least
    ``_SPLIT_DENSITY * n`` rows, densest first, at most ``_SPLIT_DENSE_BYTES / (8 n)``.

    ``per_col``: (V,) int, stored entries per column. Returns (h,) int64, ascending.

    >>> _heavy_columns(np.array([5, 0, 1, 5]), 10).tolist()
    [0, 2, 3]
    """
    order = np.argsort(per_col, kind="stable")[::-1]
    cap = max(0, _SPLIT_DENSE_BYTES // (8 * max(n, 1)))
    return np.sort(order[: min(cap, int(np.count_nonzero(per_col >= _SPLIT_DENSITY * n)))])


@dataclass(frozen=True)
class _SplitParts:
    """``S = sqrt(C / occ)`` (n x V) split by column, as host arrays.

    Attributes:
        dense: (n, h) float64, S's heavy columns (in ascending column order).
        light_data, light_indices, light_indptr: CSR parts of the rest of S, (nnz_l,)
            float64, (nnz_l,) int32 (int64 when V >= 2^31), (n + 1,) int64; the heavy
            columns' entries are left out.
        col_sum: (V,) float64, ``sum_i S_iv``.
        occupancy: (n,) float64, ``occ_i = sum_v C_iv`` (exact for integer counts).
    """

    dense: np.ndarray
    light_data: np.ndarray
    light_indices: np.ndarray
    light_indptr: np.ndarray
    col_sum: np.ndarray
    occupancy: np.ndarray


def _chunk_occupancy(vals: np.ndarray, indptr: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Row sums ``occ_i = sum_v C_iv`` (hi - lo,) float64 of rows lo..hi-1, whose stored
    values are ``vals`` (from ``indptr[lo]``); exact integer sums for integer counts.
    Raises ``ValueError`` for an empty row."""
    a = int(indptr[lo])
    csum = np.concatenate([[0], np.cumsum(vals, dtype=np.int64 if vals.dtype.kind in "biu" else np.float64)])
    occ_chunk = (csum[indptr[lo + 1 : hi + 1] - a] - csum[indptr[lo:hi] - a]).astype(np.float64)
    if np.any(occ_chunk == 0):
        empty = np.flatnonzero(occ_chunk == 0)[:5] + lo
        msg = f"row(s) with zero occupancy (first: {empty.tolist()}); remove unoccupied positions before computing distances"
        raise ValueError(msg)
    return occ_chunk


def _split_rows(c: Any, heavy: np.ndarray, per_col: np.ndarray) -> _SplitParts:
    """``S_iv = sqrt(C_iv / occ_i)`` of the CSR counts ``c`` (n x V), split into the
    ``heavy`` columns (dense) and the rest (CSR), in row chunks of about
    ``_SPLIT_CHUNK_NNZ`` stored entries (S is never held whole). Without heavy columns the
    CSR shares the counts' index arrays (only S's values are new)."""
    n, v = (int(x) for x in c.shape)
    data, indices, indptr = c.data, c.indices, c.indptr
    if not heavy.size and indices.dtype == np.int32:
        return _sqrt_sharing_pattern(c)
    lengths = np.diff(indptr)
    col_map = np.full(v, -1, dtype=np.int64)
    col_map[heavy] = np.arange(heavy.size)
    dense = np.zeros((n, heavy.size), dtype=np.float64)
    light_per_row = np.zeros(n, dtype=np.int64)
    nnz_light = int(data.size - per_col[heavy].sum())
    ldata = np.empty(nnz_light, dtype=np.float64)
    lind = np.empty(nnz_light, dtype=np.int32 if v < 2**31 else np.int64)
    col_sum = np.zeros(v, dtype=np.float64)
    occ = np.zeros(n, dtype=np.float64)
    pos = 0
    rows_per_chunk = max(1, int(_SPLIT_CHUNK_NNZ // max(1, data.size // max(n, 1))))
    for lo in range(0, n, rows_per_chunk):
        hi = min(n, lo + rows_per_chunk)
        a, b = int(indptr[lo]), int(indptr[hi])
        rows = np.repeat(np.arange(lo, hi), lengths[lo:hi])
        vals = data[a:b]
        occ_chunk = _chunk_occupancy(vals, indptr, lo, hi)
        occ[lo:hi] = occ_chunk
        s = np.sqrt(vals.astype(np.float64) / occ_chunk[rows - lo])
        cols = indices[a:b]
        hm = col_map[cols]
        is_h = hm >= 0
        dense[rows[is_h], hm[is_h]] = s[is_h]
        keep = ~is_h
        cnt = int(np.count_nonzero(keep))
        ldata[pos : pos + cnt] = s[keep]
        lind[pos : pos + cnt] = cols[keep]
        pos += cnt
        light_per_row[lo:hi] = np.bincount(rows[keep] - lo, minlength=hi - lo)
        col_sum += np.bincount(cols, weights=s, minlength=v)
    lptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(light_per_row, out=lptr[1:])
    return _SplitParts(dense, ldata, lind, lptr, col_sum, occ)


def _sqrt_sharing_pattern(c: Any) -> _SplitParts:
    """:func:`_split_rows` without heavy columns: S's values in the counts' own pattern
    (``light_indices`` / ``light_indptr`` are the counts' arrays, not copies)."""
    n, v = (int(x) for x in c.shape)
    data, indices, indptr = c.data, c.indices, c.indptr
    sdata = np.empty(data.size, dtype=np.float64)
    col_sum = np.zeros(v, dtype=np.float64)
    occ = np.zeros(n, dtype=np.float64)
    rows_per_chunk = max(1, int(_SPLIT_CHUNK_NNZ // max(1, data.size // max(n, 1))))
    for lo in range(0, n, rows_per_chunk):
        hi = min(n, lo + rows_per_chunk)
        a, b = int(indptr[lo]), int(indptr[hi])
        occ[lo:hi] = _chunk_occupancy(data[a:b], indptr, lo, hi)
        sdata[a:b] = np.sqrt(data[a:b] / np.repeat(occ[lo:hi], np.diff(indptr[lo : hi + 1])))
        col_sum += np.bincount(indices[a:b], weights=sdata[a:b], minlength=v)
    return _SplitParts(np.zeros((n, 0)), sdata, indices, indptr, col_sum, occ)


def _centred_frobenius_sq(parts: _SplitParts, mean: np.ndarray, heavy: np.ndarray, per_col: np.ndarray) -> float:
    """``||S_c||_F^2 = sum_iv (S_iv - m_v)^2`` by the two-pass column variance: the stored
    entries' ``(s - m_v)^2`` plus ``m_v^2`` per implicit zero of a light column
    (``n - per_col[v]`` of them), with no cancellation against ``|S|_F^2 = n``."""
    n = int(parts.dense.shape[0])
    ldata, lind = parts.light_data, parts.light_indices
    dev_sq = float(np.sum((parts.dense - mean[heavy][None, :]) ** 2)) if heavy.size else 0.0
    for a in range(0, int(ldata.size), _SPLIT_CHUNK_NNZ):
        dv = ldata[a : a + _SPLIT_CHUNK_NNZ] - mean[lind[a : a + _SPLIT_CHUNK_NNZ]]
        dev_sq += float(np.dot(dv, dv))
    light_cols = np.ones(mean.shape[0], dtype=bool)
    light_cols[heavy] = False
    dev_sq += float(np.sum(((n - per_col) * mean**2)[light_cols]))
    return dev_sq


class _SplitSqrt:
    """The implicit ``S_c = S - 1 m^T`` (n x V) as a dense block of S's densest columns plus
    a CSR matrix of the rest (``split``; else one CSR in the counts' own pattern, see
    :func:`sqrt_operator`), with blocked products ``S_c X`` and ``S_c^T Y``.

    Built from the counts in row chunks: ``S`` itself is never held whole (peak memory:
    the counts, the dense block and the sparse rest). A dense input is centred explicitly
    (no cancellation). ``xp=cupy`` moves both parts to the GPU.
    """

    def __init__(self, counts: Any, *, xp: types.ModuleType | None = None, split: bool | None = None) -> None:
        if not sp.issparse(counts):
            self._init_dense(counts, xp)
            return
        if split is None:  # measured on the host: one sparse part is faster and smaller there
            split = xp is not None and xp is not np
        self.xp = np if xp is None else xp
        c = _canonical_counts(counts)
        n, v = (int(x) for x in c.shape)
        self.shape = (n, v)
        _check_count_values(c)
        per_col = np.bincount(c.indices, minlength=v)
        heavy = _heavy_columns(per_col, n) if split else np.zeros(0, dtype=np.int64)
        parts = _split_rows(c, heavy, per_col)
        mean = parts.col_sum / n
        self._total = _centred_frobenius_sq(parts, mean, heavy, per_col)
        self.occupancy = parts.occupancy
        self._place(parts, mean, heavy)
        self.heavy_columns = int(heavy.size)
        self.light_nnz = int(parts.light_data.size)

    def _init_dense(self, counts: Any, xp: types.ModuleType | None) -> None:
        """A dense input: ``S_c`` held whole, centred explicitly (no cancellation)."""
        s = sqrt_distributions(counts)
        self.xp = array_namespace(s) if xp is None else xp
        s = self.xp.asarray(s)
        self.shape = tuple(int(x) for x in s.shape)
        mean = s.mean(axis=0)
        self.dense = s - mean[None, :]
        self.heavy = None
        self.rest = None
        self._total = float(self.xp.sum(self.dense * self.dense))
        self.mean = self.xp.zeros_like(mean)  # already centred

    def _place(self, parts: _SplitParts, mean: np.ndarray, heavy: np.ndarray) -> None:
        """The dense block, the CSR rest (n x V), the column means and the heavy column
        indices, on the host (numpy) or the GPU (cupy, with int32 CSR indices)."""
        n, v = self.shape
        ldata, lind, lptr = parts.light_data, parts.light_indices, parts.light_indptr
        if ldata.size < 2**31 and lind.dtype == np.int32:
            lptr = lptr.astype(np.int32)  # scipy would otherwise upcast the indices (a copy)
        xp_ = self.xp
        if xp_ is np:
            self.dense, self.mean, self.heavy = parts.dense, mean, heavy
            self.rest = sp.csr_array((ldata, lind, lptr), shape=(n, v))
            self._blocks = _row_block_views(self.rest, product_threads())
            self._blocks_t = _transposed_views(self._blocks)
            return
        self._to_gpu(parts.dense, (ldata, lind, lptr), mean, heavy)

    def _to_gpu(self, dense: np.ndarray, csr: tuple[np.ndarray, np.ndarray, np.ndarray], mean: np.ndarray,
                heavy: np.ndarray) -> None:
        """Place the parts on the GPU (``self.xp`` is cupy): the CSR rest with int32 indices
        and, built there (cuSPARSE csr2csc), its transpose, so that ``S_c^T Y`` is a plain
        CSR product instead of a transposed one."""
        xp_, csp = self.xp, get_cupy_sparse()
        data, indices, indptr = csr
        self.dense = xp_.asarray(dense)
        self.rest = csp.csr_matrix(
            (xp_.asarray(data), xp_.asarray(indices.astype(np.int32, copy=False)),
             xp_.asarray(indptr.astype(np.int32, copy=False))), shape=self.shape)
        self._rest_t = self.rest.T.tocsr()
        self.mean = xp_.asarray(mean)
        self.heavy = xp_.asarray(heavy)

    def to_device(self, xp: types.ModuleType, /) -> _SplitSqrt:
        """This host operator's copy on the GPU (``xp`` cupy), for the eigensolver's products:
        the arrays are copied as they are (about 12 bytes a non-zero and the transpose's
        as many again on the device), nothing is recomputed. The host operator stays
        usable (:meth:`row_dots` needs it)."""
        if self.xp is not np or self.rest is None:
            msg = "to_device copies a sparse operator that lives on the host"
            raise TypeError(msg)
        out = object.__new__(_SplitSqrt)
        out.xp, out.shape, out._total = xp, self.shape, self._total
        out.occupancy, out.heavy_columns, out.light_nnz = self.occupancy, self.heavy_columns, self.light_nnz
        rest = self.rest
        out._to_gpu(self.dense, (rest.data, rest.indices, rest.indptr), self.mean, self.heavy)
        return out

    def total_variance(self) -> float:
        """``trace(B) = ||S_c||_F^2``."""
        return self._total

    def row_dots(self, i: np.ndarray, j: np.ndarray, /) -> np.ndarray:
        """(p,) ``<s_i, s_j>`` of the uncentred square-root rows (host, sparse input only)."""
        if self.rest is None or self.xp is not np:
            msg = "row_dots needs a sparse input on the host"
            raise TypeError(msg)
        out = np.asarray(self.rest[i].multiply(self.rest[j]).sum(axis=1), dtype=np.float64).ravel()
        if self.heavy.size:
            out += np.einsum("ij,ij->i", self.dense[i], self.dense[j])
        return out

    def _rest_times(self, x: Any) -> Any:
        """``rest @ x``: on the host, row blocks on threads (:func:`blocks_times`)."""
        if self.xp is not np:
            return self.rest @ x
        return blocks_times(self._blocks, x, self.shape[1])

    def _rest_t_times(self, y: Any) -> Any:
        """``rest^T @ y``: on the host, row blocks on threads (:func:`blocks_t_times`)."""
        if self.xp is not np:
            return self._rest_t @ y
        return blocks_t_times(self._blocks_t, y, self.shape[1])

    def apply(self, x: Any) -> Any:
        """``S_c x`` for x of shape (V, b)."""
        if self.rest is None:
            return self.dense @ x
        out = self._rest_times(x)
        if self.heavy.size:
            out += self.dense @ x[self.heavy]
        out -= (self.mean @ x)[None, :]
        return out

    def apply_t(self, y: Any) -> Any:
        """``S_c^T y`` for y of shape (n, b)."""
        if self.rest is None:
            return self.dense.T @ y
        out = self._rest_t_times(y)
        if self.heavy.size:
            out[self.heavy] += self.dense.T @ y
        out -= self.mean[:, None] * y.sum(axis=0)[None, :]
        return out


def sqrt_operator(counts: Any, /, *, xp: types.ModuleType | None = None, split: bool | None = None) -> _SplitSqrt:
    """The implicit centred square-root operator ``S_c`` of (n, V) occupied counts, built
    once to be shared: :func:`classical_mds` (``method="lanczos"``) accepts it in place of
    the counts, and :class:`posstats.estimates.sampled.SampledGeometry` computes pair
    distances from it (:meth:`_SplitSqrt.row_dots`), so the square roots are held once.

    ``split=False`` keeps every column in the sparse part, which then shares the counts'
    index arrays: one float64 array of nnz values more than the counts, instead of that plus
    a copy of the indices and a dense block of the densest columns (up to 2 GiB).
    ``None`` (default): split only on a GPU (``xp`` cupy). On the host one sparse part is
    both smaller and faster with the threaded products: the top 64 of the bias-corrected
    operator of the 200 M-token benchmark counts (1.26e8 non-zeros) took 65 s and 5.1 GB
    unsplit against 84 s and 6.1 GB split."""
    return _SplitSqrt(counts, xp=xp, split=split)


class ShiftedSqrt:
    """The centred square-root operator of the rows ``s_i - l_i R`` (:func:`shifted_operator`):
    ``X_c = S_c - (L R)_c`` from a prebuilt ``S_c`` and an (n, K) by (K, V) low-rank shift,
    with the same products (:meth:`apply`, :meth:`apply_t`, :meth:`total_variance`, on the
    host); ``row_dots`` and the rest stay the unshifted operator's (``base``)."""

    def __init__(self, base: Any, left: np.ndarray, right: np.ndarray) -> None:
        if base.xp is not np:
            msg = "a shifted square-root operator lives on the host"
            raise TypeError(msg)
        n, v = base.shape
        if left.shape[0] != n or right.shape[1] != v or left.shape[1] != right.shape[0]:
            msg = f"shift {left.shape} x {right.shape} does not fit the operator's {base.shape}"
            raise ValueError(msg)
        self.base, self.xp, self.shape = base, np, base.shape
        self.left = left - left.mean(axis=0)[None, :]  # (L R)_c = (L - 1 mean(L)) R
        self.right = np.ascontiguousarray(right, dtype=np.float64)
        # ||S_c - L_c R||^2 = ||S_c||^2 - 2 tr(L_c^T S_c R^T) + tr(L_c (R R^T) L_c^T)
        cross = float(np.einsum("ik,ik->", self.left, base.apply(self.right.T)))
        shift = float(np.einsum("ik,kl,il->", self.left, self.right @ self.right.T, self.left))
        self._total = base.total_variance() - 2.0 * cross + shift

    def __getattr__(self, name: str) -> Any:
        if name == "base":  # not set yet (copies, pickling): no recursion
            raise AttributeError(name)
        return getattr(self.base, name)  # row_dots, occupancy, ...: the unshifted rows'

    def total_variance(self) -> float:
        """``||X_c||_F^2``."""
        return self._total

    def apply(self, x: Any) -> Any:
        """``X_c x`` for x of shape (V, b)."""
        return self.base.apply(x) - self.left @ (self.right @ x)

    def apply_t(self, y: Any) -> Any:
        """``X_c^T y`` for y of shape (n, b)."""
        return self.base.apply_t(y) - self.right.T @ (self.left.T @ y)


def shifted_operator(base: Any, left: Any, right: Any, /) -> ShiftedSqrt:
    """The centred square-root operator ``base`` (:func:`sqrt_operator`) of rows shifted by
    ``-left @ right`` ((n, K) and (K, V): the rows ``s_i - l_i R``), for
    :func:`classical_mds` (``method="lanczos"``): e.g. the square roots with their
    occupancy shrinkage removed (:mod:`posstats.estimates.occupancy`). Products cost K (n + V)
    more per vector."""
    return ShiftedSqrt(base, np.asarray(left, dtype=np.float64), np.asarray(right, dtype=np.float64))


def _is_operator(x: Any, /) -> bool:
    """True for a prebuilt centred square-root operator (:func:`sqrt_operator`, or
    :class:`posstats.geometry.ranged.RangedSqrt` over ranges held apart): an object with
    ``shape``, ``xp``, ``apply``, ``apply_t`` and ``total_variance``."""
    return all(hasattr(x, name) for name in ("xp", "apply", "apply_t", "total_variance"))


def _gram_product(op: Any, diag: Any, x: Any, /) -> Any:
    """``(S_c S_c^T - H diag(b) H) x`` for (n, b) ``x`` (without ``diag``: ``S_c S_c^T x``),
    the Gram matrix ``B`` (or ``B_c``) of the centred square-root operator ``op``."""
    out = op.apply(op.apply_t(x))
    if diag is not None:
        hx = x - x.mean(axis=0)[None, :]
        t = diag[:, None] * hx
        out -= t - t.mean(axis=0)[None, :]
    return out
