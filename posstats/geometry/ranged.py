"""The centred square-root operator over position ranges held apart (issue #31).

``S_c = S - 1 m^T`` (n x V, ``S_iv = sqrt(C_iv / occ_i)``, ``m`` the column means) with the
rows of ``S`` cut into K position ranges ``r = [a_r, b_r)``. Each range's rows ``S_r`` are
held by one :class:`SqrtRange`: in this process (:class:`LocalRanges`, the ranges on
threads) or in a Ray actor each (``jobs.eigensolve --memory-budget``), so that no process
holds every non-zero. The products the eigensolver needs are assembled from the ranges::

    S_c X   = [S_r X]_r  -  1 (m^T X)          each range returns its (n_r, b) rows
    S_c^T Y = sum_r S_r^T Y_r  -  m (1^T Y)    each range returns a (V, b) partial sum

so only (V, b) and (n_r, b) blocks move between processes. ``m = sum_r colsum(S_r) / n``
takes one pass over the ranges before the first product, and the trace of the Gram matrix
``||S_c||_F^2 = sum_r [sum_stored (s_iv - m_v)^2 + (n_r - stored_rv) m_v^2]`` one more (the
two-pass column variance of :func:`posstats.geometry.sqrt_operator.sqrt_operator`, no cancellation).

:class:`RangedSqrt` has the interface of :func:`posstats.geometry.sqrt_operator.sqrt_operator`'s
operator that :func:`posstats.geometry.mds.classical_mds` (``method="lanczos"``) uses, so the
block Lanczos, its tolerances and the bias-corrected ``diagonal`` are one code path whether
the counts sit in one array or in many processes. The results equal the in-process
operator's to rounding (the same sums in another order).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp

from posstats.counting.counts import csr_row_sums
from posstats.counting.io import load_header, load_indptr, load_rows

from .hellinger import hellinger_sq_pairs
from .products import (
    _csr_view,
    _row_block_views,
    _transposed_views,
    blocks_t_times,
    blocks_times,
    product_threads,
    thread_map,
)
from .sqrt_operator import _canonical_counts, _check_count_values, _sqrt_sharing_pattern

__all__ = [
    "BYTES_PER_STORED_COUNT",
    "PAIR_ROUND_ENTRIES",
    "PROCESS_BASELINE_BYTES",
    "LocalRanges",
    "RangeRunner",
    "RangedSqrt",
    "SqrtRange",
    "balanced_ranges",
    "file_ranges",
    "load_sqrt_range",
    "local_ranges",
    "pair_difference_sq",
    "pair_dots",
    "ranges_for_budget",
]

# Bytes one stored count takes while a range is built: the file's value (2 or 4 bytes) and
# index as read, the int32 index and the float64 square root (SqrtRange keeps 12: the
# square root and the index). Measured: 15 bytes a stored count above the process'
# baseline (a range of 6.3e7 uint16 counts of the 202 M-token benchmark peaked at 1.11 GB).
BYTES_PER_STORED_COUNT = 16
# What a range's process holds besides its range: the interpreter, numpy, scipy and, in
# an actor, Ray's worker (about 170 MB measured), with room for the product blocks.
PROCESS_BASELINE_BYTES = 256 << 20
# Ranges at most, one Ray actor each: more is a mistyped count or a budget far too small.
MAX_RANGES = 1024


_CHUNK = 1 << 22  # stored counts per step of a pass over a range's arrays


def _stored_per_column(indices: np.ndarray, vocab: int, /) -> np.ndarray:
    """(V,) int64 stored entries per column, counted ``_CHUNK`` indices at a time
    (``np.bincount`` of the whole int32 array would make an int64 copy of it first)."""
    out = np.zeros(int(vocab), dtype=np.int64)
    for a in range(0, int(indices.size), _CHUNK):
        out += np.bincount(indices[a : a + _CHUNK], minlength=int(vocab))
    return out


class SqrtRange:
    """Rows ``[start, start + n_r)`` of ``S = sqrt(C / occ)``, uncentred, as CSR, with the
    products one range contributes to :class:`RangedSqrt`.

    Args:
        counts: (n_r, V) counts of occupied positions (every row sum > 0), scipy sparse or
            dense; integer or float, finite and non-negative.
        positions: (n_r,) the rows' positions in the whole corpus (for the caller; default
            ``start + arange(n_r)``).
        threads: threads for this range's products (default: the cores this process may
            use; a Ray actor gets its ``num_cpus``).
        noise: what the caller derived from the range's counts while they were at hand
            (the jobs keep its noise floor:
            :func:`posstats.estimates.thinning.range_noise_floor`); :meth:`noise` returns it.
        read: ((r,) positions, (r,) occupancies) of every position read for this range, kept
            or not (:func:`load_sqrt_range`); default the kept rows' own.

    Memory: 12 bytes per stored count (float64 square root, int32 column index) plus the
    (V,) column sums; the counts' own values are not kept.
    """

    def __init__(self, counts: Any, /, *, positions: Any = None, threads: int | None = None,
                 noise: Any = None, read: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        c = _canonical_counts(counts if sp.issparse(counts) else sp.csr_array(np.asarray(counts)))
        _check_count_values(c)
        n_r, v = (int(x) for x in c.shape)
        if c.indices.dtype != np.int32 and v < 2**31 and c.nnz < 2**31:
            # scipy keeps one index type for both arrays: the row pointers go to int32 too
            c = sp.csr_array((c.data, c.indices.astype(np.int32), c.indptr.astype(np.int32)), shape=c.shape)
        parts = _sqrt_sharing_pattern(c) if c.indices.dtype == np.int32 else None
        if parts is None:  # V or one range's stored counts >= 2**31
            msg = (f"a range of {c.nnz:,} stored counts over {v:,} ids needs int64 indices, which a range does not "
                   "support (cut the counts into more ranges)")
            raise ValueError(msg)
        indptr = parts.light_indptr
        if parts.light_data.size < 2**31:
            indptr = indptr.astype(np.int32)
        self.shape = (n_r, v)
        self.positions = np.arange(n_r, dtype=np.int64) if positions is None else np.asarray(positions, dtype=np.int64)
        if self.positions.shape != (n_r,):
            msg = f"positions must have shape ({n_r},); got {self.positions.shape}"
            raise ValueError(msg)
        self.s = _csr_view(parts.light_data, parts.light_indices, indptr, (n_r, v))
        self.column_sum = parts.col_sum
        self.stored_per_column = _stored_per_column(parts.light_indices, v)
        self.occupancy = parts.occupancy
        self.noise_floor = noise
        self.read = read if read is not None else (self.positions, np.rint(self.occupancy).astype(np.int64))
        self._blocks = _row_block_views(self.s, product_threads() if threads is None else int(threads))
        self._blocks_t = _transposed_views(self._blocks)

    @property
    def nbytes(self) -> int:
        """Bytes held: the square roots, indices, row pointers and per-column sums."""
        return int(self.s.data.nbytes + self.s.indices.nbytes + self.s.indptr.nbytes
                   + self.column_sum.nbytes + self.stored_per_column.nbytes + self.occupancy.nbytes)

    def held(self) -> tuple[np.ndarray, np.ndarray]:
        """((n_r,) positions, (n_r,) float64 occupancy) of the rows this range holds."""
        return self.positions, self.occupancy

    def read_occupancy(self) -> tuple[np.ndarray, np.ndarray]:
        """((r,) positions, (r,) int64 occupancies) of every position read from the file for
        this range, including those left out below the minimum occupancy: the report's
        occupancy of every position, without the counts."""
        return self.read

    def stats(self) -> tuple[np.ndarray, int]:
        """((V,) ``sum_i S_iv`` over this range's rows, n_r)."""
        return self.column_sum, self.shape[0]

    def row_entries(self) -> np.ndarray:
        """(n_r,) stored entries of every row."""
        return np.diff(self.s.indptr).astype(np.int64)

    def noise(self) -> Any:
        """The range's noise floor (given as ``noise``;
        :func:`posstats.estimates.noise.merge_noise_floors` joins the ranges')."""
        if self.noise_floor is None:
            msg = "this range was built without its noise floor (load_sqrt_range(..., noise_of=...))"
            raise ValueError(msg)
        return self.noise_floor

    def count_totals(self, keep: np.ndarray, /) -> np.ndarray:
        """(V,) tokens per vocabulary entry over the rows ``keep`` (bool (n_r,)): the counts
        ``C_iv = occ_i s_iv^2`` recovered from the square roots, summed, and rounded (each
        term is within 2 eps of an integer, so the sums of up to 2^40 tokens round exactly)."""
        keep = np.asarray(keep, dtype=bool)
        weight = np.where(keep, self.occupancy, 0.0)
        data, idx, indptr = self.s.data, self.s.indices, self.s.indptr
        out = np.zeros(self.shape[1], dtype=np.float64)
        lengths = np.diff(indptr)
        row = 0
        while row < self.shape[0]:  # rows in blocks of about _CHUNK stored counts
            stop = int(np.searchsorted(indptr, int(indptr[row]) + _CHUNK, side="right")) - 1
            stop = min(max(stop, row + 1), self.shape[0])
            a, b = int(indptr[row]), int(indptr[stop])
            w = data[a:b] * data[a:b] * np.repeat(weight[row:stop], lengths[row:stop])
            out += np.bincount(idx[a:b], weights=w, minlength=self.shape[1])
            row = stop
        return np.rint(out)

    def distance_to(self, s_pool: np.ndarray, /) -> np.ndarray:
        """(n_r,) plug-in ``d_H^2 = max(2 - 2 <s_i, s_pool>, 0)`` of every row to the
        distribution whose square root is ``s_pool`` (V,)."""
        dots = self.times(np.asarray(s_pool, dtype=np.float64).reshape(-1, 1))[:, 0]
        return np.maximum(2.0 - 2.0 * dots, 0.0)

    def rows(self, local: np.ndarray, /) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(data, indices, indptr)`` of the square-root rows ``local`` (indices into this
        range), in that order: what another range needs for :meth:`dots_with`."""
        sub = self.s[np.asarray(local, dtype=np.int64)]
        return sub.data, sub.indices, sub.indptr

    def count_rows(self, local: np.ndarray, /) -> sp.csr_array:
        """(len(local), V) int64 counts of the rows ``local``, recovered exactly from the
        square roots: ``C_iv = rint(occ_i s_iv^2)``."""
        local = np.asarray(local, dtype=np.int64)
        sub = self.s[local]
        counts = np.rint(sub.data * sub.data * np.repeat(self.occupancy[local], np.diff(sub.indptr))).astype(np.int64)
        return sp.csr_array((counts, sub.indices, sub.indptr), shape=sub.shape)

    def row_dots(self, i: np.ndarray, j: np.ndarray, /) -> np.ndarray:
        """(p,) ``<s_i, s_j>`` of pairs of this range's rows (local indices)."""
        return _gathered_dots(self.s, np.asarray(i, dtype=np.int64), self.s, np.asarray(j, dtype=np.int64))

    def dots_with(self, i: np.ndarray, data: np.ndarray, indices: np.ndarray, indptr: np.ndarray,
                  j: np.ndarray, /) -> np.ndarray:
        """(p,) ``<s_i, t_j>``: this range's rows ``i`` (local) with rows ``j`` of the
        square-root rows ``t`` another range gave (:meth:`rows`: data, indices, indptr)."""
        t = sp.csr_array((data, indices, indptr), shape=(int(np.asarray(indptr).size - 1), self.shape[1]))
        return _gathered_dots(self.s, np.asarray(i, dtype=np.int64), t, np.asarray(j, dtype=np.int64))

    def centred_frobenius_sq(self, mean: np.ndarray, /) -> float:
        """``sum_{i in r, v} (S_iv - m_v)^2`` for the global column means ``m`` (V,): the
        stored entries' squared deviations plus ``m_v^2`` per implicit zero."""
        data, idx = self.s.data, self.s.indices
        step = _CHUNK
        dev_sq = 0.0
        for a in range(0, int(data.size), step):
            dv = data[a : a + step] - mean[idx[a : a + step]]
            dev_sq += float(np.dot(dv, dv))
        return dev_sq + float(np.dot(self.shape[0] - self.stored_per_column, mean * mean))

    def times(self, x: np.ndarray, /) -> np.ndarray:
        """``S_r X`` (n_r, b) for X (V, b)."""
        return blocks_times(self._blocks, np.ascontiguousarray(x, dtype=np.float64), self.shape[1])

    def t_times(self, y: np.ndarray, /) -> np.ndarray:
        """``S_r^T Y_r`` (V, b) for this range's rows Y_r (n_r, b)."""
        return blocks_t_times(self._blocks_t, np.ascontiguousarray(y, dtype=np.float64), self.shape[1])


# Stored entries of the rows gathered at a time for pair dot products (about 30 bytes each
# until a chunk is summed): 2**22 keeps a range's pair step near 120 MB.
_PAIR_GATHER_ENTRIES = 1 << 22


def _gathered_dots(a: sp.csr_array, i: np.ndarray, b: sp.csr_array, j: np.ndarray, /) -> np.ndarray:
    """(p,) ``<a_i, b_j>`` of CSR rows, the pairs taken in chunks whose gathered rows hold at
    most :data:`_PAIR_GATHER_ENTRIES` stored entries (one pair above it goes alone)."""
    out = np.empty(i.size, dtype=np.float64)
    if not i.size:
        return out
    cost = np.cumsum(np.diff(a.indptr)[i] + np.diff(b.indptr)[j])
    start = 0
    while start < i.size:
        base = cost[start - 1] if start else 0
        stop = max(int(np.searchsorted(cost, base + _PAIR_GATHER_ENTRIES, side="right")), start + 1)
        ii, jj = i[start:stop], j[start:stop]
        out[start:stop] = np.asarray(a[ii].multiply(b[jj]).sum(axis=1), dtype=np.float64).ravel()
        start = stop
    return out


class RangeRunner(Protocol):
    """Where the ranges live. ``call(method, args)`` runs ``SqrtRange.method`` on every
    range, in range order, with no arguments (``args=None``) or with ``args[r]`` for range
    r, and returns the results in range order."""

    def __len__(self) -> int: ...

    def call(self, method: str, args: Sequence[tuple[Any, ...]] | None = None, /) -> list[Any]: ...


class LocalRanges:
    """Ranges held in this process, their products on the products' threads (one thread
    per range; give each range ``threads=1`` to avoid nesting the pools)."""

    def __init__(self, ranges: Sequence[SqrtRange], /) -> None:
        if not ranges:
            msg = "LocalRanges needs at least one range"
            raise ValueError(msg)
        self.ranges = list(ranges)

    def __len__(self) -> int:
        return len(self.ranges)

    def call(self, method: str, args: Sequence[tuple[Any, ...]] | None = None, /) -> list[Any]:
        calls = [()] * len(self.ranges) if args is None else list(args)
        if len(self.ranges) == 1:
            return [getattr(self.ranges[0], method)(*calls[0])]
        return thread_map(lambda rc: getattr(rc[0], method)(*rc[1]), list(zip(self.ranges, calls, strict=True)))


class RangedSqrt:
    """The implicit ``S_c`` (n x V) whose rows are held by ranges (:class:`RangeRunner`),
    with the products :func:`posstats.geometry.mds.classical_mds` uses (``lanczos``).

    Rows are in range order: row ``i`` of ``S_c X`` is the ``i``-th row over the ranges'
    rows taken in turn (their positions: :attr:`positions` when every range reports them).
    """

    xp = np

    def __init__(self, ranges: RangeRunner, /) -> None:
        self.ranges = ranges
        stats = ranges.call("stats")
        rows = np.array([int(r) for _, r in stats], dtype=np.int64)
        if rows.sum() < 1:
            msg = "the ranges hold no occupied position"
            raise ValueError(msg)
        vocab = {int(np.asarray(col).shape[0]) for col, _ in stats}
        if len(vocab) != 1:
            msg = f"the ranges disagree on the vocabulary size: {sorted(vocab)}"
            raise ValueError(msg)
        n = int(rows.sum())
        col_sum = np.zeros(vocab.pop(), dtype=np.float64)
        for col, _ in stats:
            col_sum += col
        self.shape = (n, int(col_sum.shape[0]))
        self.edges = np.concatenate([[0], np.cumsum(rows)])
        self.mean = col_sum / n
        self._total = float(math.fsum(ranges.call("centred_frobenius_sq", [(self.mean,)] * len(ranges))))

    def total_variance(self) -> float:
        """``trace(B) = ||S_c||_F^2``."""
        return self._total

    def held(self) -> tuple[np.ndarray, np.ndarray]:
        """((n,) positions, (n,) occupancy) of the rows, in the operator's row order."""
        parts = self.ranges.call("held")
        return (np.concatenate([np.asarray(p, dtype=np.int64) for p, _ in parts]),
                np.concatenate([np.asarray(o, dtype=np.float64) for _, o in parts]))

    def read_occupancy(self, positions: int, /) -> np.ndarray:
        """(positions,) int64 occupancy of every position of the file, kept or not
        (:meth:`SqrtRange.read_occupancy` of each range; 0 where no range read it)."""
        out = np.zeros(int(positions), dtype=np.int64)
        for read, occ in self.ranges.call("read_occupancy"):
            out[np.asarray(read, dtype=np.int64)] = occ
        return out

    def count_totals(self, keep: np.ndarray, /) -> np.ndarray:
        """(V,) tokens per vocabulary entry over the rows ``keep`` (bool (n,), the
        operator's row order): each range's :meth:`SqrtRange.count_totals`, summed."""
        e = self.edges
        parts = self.ranges.call("count_totals", [(np.asarray(keep, dtype=bool)[e[r] : e[r + 1]],)
                                                  for r in range(len(self.ranges))])
        return np.sum(parts, axis=0)

    def distance_to(self, s_pool: np.ndarray, /) -> np.ndarray:
        """(n,) plug-in ``d_H^2`` of every row to the distribution whose square root is
        ``s_pool`` (:meth:`SqrtRange.distance_to` of each range, in row order)."""
        return np.concatenate(self.ranges.call("distance_to", [(s_pool,)] * len(self.ranges)))

    def row_entries(self) -> np.ndarray:
        """(n,) stored entries of every row, in row order."""
        return np.concatenate([np.asarray(x, dtype=np.int64) for x in self.ranges.call("row_entries")])

    def row_dots(self, i: np.ndarray, j: np.ndarray, /) -> np.ndarray:
        """(p,) ``<s_i, s_j>`` of the uncentred square-root rows of any pairs (operator row
        order), without gathering the ranges (:func:`pair_dots`)."""
        return pair_dots(self.ranges, self.edges, i, j)

    def difference_sq(self, i: np.ndarray, j: np.ndarray, /) -> np.ndarray:
        """(p,) ``d_H^2`` of the pairs by the cancellation-free difference form, for the few
        pairs whose Gram form cancels (:func:`pair_difference_sq`)."""
        return pair_difference_sq(self.ranges, self.edges, i, j)

    def apply(self, x: np.ndarray) -> np.ndarray:
        """``S_c X`` (n, b) for X (V, b)."""
        out = np.concatenate(self.ranges.call("times", [(x,)] * len(self.ranges)))
        out -= (self.mean @ x)[None, :]
        return out

    def apply_t(self, y: np.ndarray) -> np.ndarray:
        """``S_c^T Y`` (V, b) for Y (n, b)."""
        e = self.edges
        parts = self.ranges.call("t_times", [(y[e[r] : e[r + 1]],) for r in range(len(self.ranges))])
        out = parts[0].copy()
        for part in parts[1:]:
            out += part
        out -= self.mean[:, None] * y.sum(axis=0)[None, :]
        return out


def pair_dots(ranges: RangeRunner, edges: np.ndarray, i: np.ndarray, j: np.ndarray, /) -> np.ndarray:
    """(p,) ``<s_i, s_j>`` of square-root rows of any pairs, the rows held by ``ranges``
    (``edges``: (K + 1,) their first rows in the callers' row order), without gathering
    them: pairs inside one range are summed there (its ``row_dots``); for pairs across two,
    the range holding ``j`` gives those rows (its ``rows``: each needed row once a round,
    at most :data:`PAIR_ROUND_ENTRIES` stored entries a range and round) to the range
    holding ``i`` (its ``dots_with``), all ranges at once. Only the gathered rows move.

    The ranges may be :class:`SqrtRange` (the corpus' rows) or anything with those three
    methods and ``row_entries`` (a jackknife replicate's rows,
    :class:`posstats.estimates.ranged_jackknife.RangeReplicates`)."""
    i = np.asarray(i, dtype=np.int64).ravel()
    j = np.asarray(j, dtype=np.int64).ravel()
    k = len(ranges)
    ri = np.searchsorted(edges, i, side="right") - 1
    rj = np.searchsorted(edges, j, side="right") - 1
    # the pairs of every (range of i, range of j) block, by one sort
    order = np.argsort(ri * k + rj, kind="stable")
    starts = np.searchsorted((ri * k + rj)[order], np.arange(k * k + 1))

    def block(taker: int, source: int) -> np.ndarray:
        b = taker * k + source
        return order[starts[b] : starts[b + 1]]

    out = np.empty(i.size, dtype=np.float64)
    same = [block(r, r) for r in range(k)]
    parts = ranges.call("row_dots", [(i[p] - edges[r], j[p] - edges[r]) for r, p in enumerate(same)])
    for p, part in zip(same, parts, strict=True):
        out[p] = part
    entries = np.concatenate([np.asarray(x, dtype=np.int64) for x in ranges.call("row_entries")]) if k > 1 else None
    for shift in range(1, k):  # round by round, range r takes rows from range (r + shift) mod k
        plans = [_CrossPlan(i, j, block(r, (r + shift) % k), r, (r + shift) % k, edges, entries) for r in range(k)]
        for step in range(max(len(plan.chunks) for plan in plans)):
            # the rows each range gives: the ones its taker needs in this step
            give = [()] * k
            for plan in plans:
                give[plan.source] = (plan.rows_needed(step),)
            rows = ranges.call("rows", give)
            args = [plan.dots_args(step, rows[plan.source]) for plan in plans]
            for plan, got in zip(plans, ranges.call("dots_with", args), strict=True):
                out[plan.pairs_of(step)] = got
    return out


def pair_difference_sq(ranges: RangeRunner, edges: np.ndarray, i: np.ndarray, j: np.ndarray, /) -> np.ndarray:
    """(p,) ``d_H^2`` of the pairs by the cancellation-free difference form
    (:func:`posstats.geometry.hellinger.hellinger_sq_pairs`) on their rows' counts, which
    the ranges give (their ``count_rows``) and are gathered here: for the few pairs whose
    Gram form cancels (``d_H^2`` near 0)."""
    i = np.asarray(i, dtype=np.int64).ravel()
    j = np.asarray(j, dtype=np.int64).ravel()
    rows = np.union1d(i, j)
    owner = np.searchsorted(edges, rows, side="right") - 1
    pieces = ranges.call("count_rows", [(rows[owner == r] - edges[r],) for r in range(len(ranges))])
    counts = sp.vstack([sp.csr_array(p) for p in pieces], format="csr")  # rows in ascending order
    return hellinger_sq_pairs(counts, np.searchsorted(rows, i), np.searchsorted(rows, j))


# Stored entries of the rows one range gives another in one round of RangedSqrt.row_dots
# (about 12 bytes each as they move, through Ray's shared-memory object store, whose pages
# an actor touches count in its RSS): 2**20, 12 MB a range and round. Measured at 1 B
# tokens, 3 ranges: 2**22 lifted the ranges to 3.07-3.23 GB during the stress, 2**20 to
# 2.94-3.01 GB (products: 2.36 GB), for 7 % more stress time (112.0 s against 104.8 s).
PAIR_ROUND_ENTRIES = 1 << 20


class _CrossPlan:
    """The pairs ``sel`` (indices into ``i``, ``j``), whose ``i`` lies in range ``taker`` and
    ``j`` in range ``source``, cut into steps whose distinct ``j`` rows hold at most
    :data:`PAIR_ROUND_ENTRIES` stored entries."""

    def __init__(self, i: np.ndarray, j: np.ndarray, sel: np.ndarray, taker: int, source: int,
                 edges: np.ndarray, entries: np.ndarray) -> None:
        self.taker, self.source = taker, source
        order = np.argsort(j[sel], kind="stable")
        self.sel = sel[order]  # pairs sorted by j: a step's rows are a run of distinct j
        self.i_local = i[self.sel] - edges[taker]
        self.j_local = j[self.sel] - edges[source]
        self.rows, self.first = np.unique(self.j_local, return_index=True)
        cost = np.cumsum(entries[self.rows + edges[source]]) if self.rows.size else np.zeros(0, dtype=np.int64)
        self.chunks: list[tuple[int, int]] = []  # [a, b) over self.rows
        a = 0
        while a < self.rows.size:
            base = cost[a - 1] if a else 0
            b = max(int(np.searchsorted(cost, base + PAIR_ROUND_ENTRIES, side="right")), a + 1)
            self.chunks.append((a, b))
            a = b

    def _pair_span(self, step: int) -> tuple[int, int]:
        if step >= len(self.chunks):
            return 0, 0
        a, b = self.chunks[step]
        stop = self.first[b] if b < self.rows.size else self.sel.size
        return int(self.first[a]), int(stop)

    def rows_needed(self, step: int) -> np.ndarray:
        """The source's local rows this step moves (none once the plan is done)."""
        if step >= len(self.chunks):
            return np.zeros(0, dtype=np.int64)
        a, b = self.chunks[step]
        return self.rows[a:b]

    def dots_args(self, step: int, rows: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[Any, ...]:
        """The taker's :meth:`SqrtRange.dots_with` arguments for this step."""
        p, q = self._pair_span(step)
        if p == q:
            return (np.zeros(0, dtype=np.int64), *rows, np.zeros(0, dtype=np.int64))
        a, _ = self.chunks[step]
        return (self.i_local[p:q], *rows, np.searchsorted(self.rows, self.j_local[p:q]) - a)

    def pairs_of(self, step: int) -> np.ndarray:
        """The positions (in the caller's pair arrays) this step's dots go to."""
        p, q = self._pair_span(step)
        return self.sel[p:q]


def balanced_ranges(indptr: np.ndarray, parts: int, /) -> list[tuple[int, int]]:
    """``parts`` (or fewer) consecutive row ranges ``[a, b)`` covering ``0..n`` with about
    equal stored counts (``indptr``: (n + 1,) CSR row pointers), none empty.

    >>> balanced_ranges(np.array([0, 5, 6, 7, 8, 13]), 2)
    [(0, 2), (2, 5)]
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    n = int(indptr.size - 1)
    parts = max(1, min(int(parts), n))
    cuts = np.searchsorted(indptr, np.linspace(0, int(indptr[-1]), parts + 1)[1:-1], side="left")
    edges = [0, *sorted({int(c) for c in cuts} - {0, n}), n]
    return list(zip(edges[:-1], edges[1:], strict=True))


def ranges_for_budget(stored: int, budget_bytes: int, /, *, at_least: int = 1) -> int:
    """How many ranges keep each range's process within ``budget_bytes``: its baseline
    (:data:`PROCESS_BASELINE_BYTES`) plus :data:`BYTES_PER_STORED_COUNT` per stored count
    of its range; and at least ``at_least``.

    >>> ranges_for_budget(10**8, 2 * 10**9), ranges_for_budget(10**8, 10**9, at_least=4)
    (1, 4)

    Raises:
        ValueError: a budget that does not exceed the baseline.
    """
    room = int(budget_bytes) - PROCESS_BASELINE_BYTES
    if room <= 0:
        msg = (f"a memory budget of {int(budget_bytes) / 2**30:.3g} GiB leaves nothing for the counts: each range's "
               f"process needs about {PROCESS_BASELINE_BYTES / 2**30:.2g} GiB besides them")
        raise ValueError(msg)
    return max(int(at_least), math.ceil(int(stored) * BYTES_PER_STORED_COUNT / room), 1)


def load_sqrt_range(path: str | os.PathLike, start: int, stop: int, /, *, min_occupancy: int = 1,
                    threads: int | None = None, noise_of: Callable[[Any, np.ndarray], Any] | None = None) -> SqrtRange:
    """The :class:`SqrtRange` of rows ``[start, stop)`` of a saved counts file, keeping the
    positions with at least ``min_occupancy`` counted tokens (and at least one), reading
    only those rows (:func:`posstats.counting.io.load_rows`). With ``noise_of``, the range
    also keeps ``noise_of(counts, positions)`` of its kept rows (their noise floor),
    computed before the counts are let go."""
    rows = load_rows(path, int(start), int(stop), dtype=None)  # the stored type, not int64
    occ = csr_row_sums(rows)
    keep = np.flatnonzero(occ >= max(1, int(min_occupancy)))
    rows = rows[keep] if keep.size < rows.shape[0] else rows
    positions = int(start) + keep
    noise = noise_of(rows, positions) if noise_of is not None and keep.size else None
    return SqrtRange(rows, positions=positions, threads=threads, noise=noise,
                     read=(np.arange(int(start), int(start) + occ.size, dtype=np.int64), np.asarray(occ, dtype=np.int64)))


def file_ranges(path: str | os.PathLike, parts: int, /) -> list[tuple[int, int]]:
    """:func:`balanced_ranges` of a saved sparse counts file's rows (its ``indptr`` only);
    a dense or Parquet counts file is cut into equal row ranges."""
    indptr = load_indptr(path)
    if indptr is None:
        n = load_header(path).positions
        indptr = np.arange(n + 1, dtype=np.int64)
    return balanced_ranges(indptr, parts)


def local_ranges(path: str | os.PathLike, parts: int, /, *, min_occupancy: int = 1,
                 noise_of: Callable[[Any, np.ndarray], Any] | None = None) -> LocalRanges:
    """``parts`` ranges of a saved counts file held in this process, one product thread
    each (each with ``noise_of`` of its counts, as :func:`load_sqrt_range`)."""
    bounds = file_ranges(path, parts)
    return LocalRanges([load_sqrt_range(path, a, b, min_occupancy=min_occupancy, threads=1, noise_of=noise_of)
                        for a, b in bounds])
