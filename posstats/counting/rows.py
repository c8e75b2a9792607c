"""The geometry rows of counts: bucket them (optionally), keep the occupied ones.

The geometry (THEORY sections 2-3) works on occupied rows only: row ``i`` of the (possibly
bucketed) counts ``C`` is used when ``occ[i] = sum_v C[i, v] >= max(min_occupancy, 1)``.
Where sequence distance matters, a row stands for its *position*: the row index itself,
or the bucket's integer midpoint (:mod:`posstats.counting.buckets`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from posstats.counting.buckets import Buckets, bucket_counts
from posstats.counting.counts import PositionalCounts

__all__ = ["RowSelection", "row_blocks", "select_rows"]


@dataclass(frozen=True)
class RowSelection:
    """The rows of counts that enter the geometry.

    Attributes:
        counts: the counts the rows are taken from: the input, or its bucketed counts
            (``len(buckets)`` positions) when ``buckets`` is given.
        buckets: the bucketing applied, or None.
        index: (m,) int64, ascending: the occupied rows of ``counts``.
        positions: (m,) int64: the sequence position of each row (``index``, or the
            bucket midpoints ``buckets.midpoints[index]``).
    """

    counts: PositionalCounts
    buckets: Buckets | None
    index: np.ndarray
    positions: np.ndarray

    def occupancy(self) -> np.ndarray:
        """(m,) int64: ``occ`` of the selected rows."""
        return self.counts.occupancy()[self.index]

    def rows(self) -> np.ndarray | sp.csr_array:
        """(m, V) int64 counts of the selected rows, same storage kind as ``counts``.

        All rows of a sparse matrix are returned without a copy (a fancy index would copy
        every stored entry); take this after any memory check, as it may allocate m x V.
        """
        counts = self.counts
        if counts.is_sparse and self.index.size == counts.positions:
            return counts.matrix
        return counts.rows(self.index)


def select_rows(counts: PositionalCounts, /, *, min_occupancy: int = 1, buckets: Buckets | None = None) -> RowSelection:
    """Bucket ``counts`` when ``buckets`` is given, then select the rows with
    ``occ >= max(min_occupancy, 1)`` (see :class:`RowSelection`).

    >>> from posstats.counting.counts import count_sequences
    >>> select_rows(count_sequences([[1, 2]], positions=3, vocab_size=4)).positions.tolist()
    [0, 1]
    """
    geo = bucket_counts(counts, buckets) if buckets is not None else counts
    index = geo.occupied_positions(min_occupancy=min_occupancy)
    positions = buckets.midpoints[index] if buckets is not None else index
    return RowSelection(geo, buckets, index, positions)


def row_blocks(indptr: np.ndarray, block: int) -> list[tuple[int, int]]:
    """Consecutive row ranges ``[lo, hi)`` of a CSR (row pointers ``indptr``) with about
    ``block`` stored entries each (a single row larger than ``block`` is its own range):
    how long-context code streams over counts without an nnz-sized temporary.

    >>> row_blocks(np.array([0, 5, 5, 30, 31]), 10)
    [(0, 2), (2, 3), (3, 4)]
    """
    m = indptr.size - 1
    cuts = np.searchsorted(indptr, np.arange(block, int(indptr[-1]), block), side="right") - 1
    edges = np.unique(np.concatenate([[0], np.clip(cuts, 1, m), [m]]))
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]
