"""Sparse counts held as blocks of consecutive positions, each in CSR order with the
narrowest dtypes that hold it: 16-bit token ids (V <= 2**16) and 16-bit counts where the
block's counts fit (most do: a count is at most the windows covering its position).

A count is written to a file straight from its blocks (:meth:`CountBlocks.indices` and
:meth:`CountBlocks.data` stream them in the dtypes the file stores), without assembling
one int32/int64 CSR array first: measured at n = 131,072 on 202 M tokens (126 M
non-zeros), 4 bytes per non-zero held instead of 8, and no 1 GB CSR copy to allocate.
:meth:`CountBlocks.to_csr` assembles the CSR array for the callers that need one.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from posstats.counting.scipy_sparse import sp

__all__ = ["BlockCounts", "CountBlocks", "narrow_count_dtype", "release_freed_memory"]


def _malloc_trim():
    """glibc's ``malloc_trim`` from the symbols already loaded (``dlopen(NULL)``: no search,
    no child process), or None (another C library)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _malloc_trim()


def release_freed_memory() -> None:
    """Hand the pages of freed heap blocks back to the OS (glibc ``malloc_trim(0)``; a no-op
    elsewhere). Block arrays of a few MB live on the heap (glibc raises its mmap threshold
    up to 32 MB as large arrays are freed), so freeing them as :meth:`CountBlocks.to_csr`
    copies them out would not lower the resident size without it: measured at n = 131,072,
    202 M tokens, 128 blocks, 3.6 GB peak without, against 2.0 GB with."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def narrow_count_dtype(largest: int, /) -> np.dtype:
    """The narrowest of uint16, int32 and int64 holding the counts ``0 .. largest``.

    >>> [narrow_count_dtype(x).name for x in (65535, 65536, 2**31)]
    ['uint16', 'int32', 'int64']
    """
    if largest < 2**16:
        return np.dtype(np.uint16)
    return np.dtype(np.int32 if largest < 2**31 else np.int64)


@dataclass
class BlockCounts:
    """The non-zero counts of positions ``first .. first + width - 1``: row j holds
    ``row_nnz[j]`` (int64, shape (width,)) entries of ``tokens`` (ascending ids) and
    ``counts`` (> 0), consecutive, in row order."""

    first: int
    row_nnz: np.ndarray
    tokens: np.ndarray
    counts: np.ndarray

    @property
    def width(self) -> int:
        return int(self.row_nnz.size)

    @classmethod
    def from_keys(cls, first: int, width: int, vocab_size: int, keys: np.ndarray, counts: np.ndarray,
                  token_dtype: np.dtype) -> BlockCounts:
        """From sorted unique local keys ``j V + v`` (uint32) and their counts (narrowed
        to :func:`narrow_count_dtype` of their largest).

        >>> b = BlockCounts.from_keys(4, 2, 10, np.array([3, 12, 17], np.uint32), np.array([1, 5, 2]), np.uint16)
        >>> b.row_nnz.tolist(), b.tokens.tolist(), b.counts.tolist(), b.counts.dtype.name
        ([1, 2], [3, 2, 7], [1, 5, 2], 'uint16')
        """
        row_nnz = np.bincount(keys // np.uint32(vocab_size), minlength=width).astype(np.int64, copy=False)
        tokens = np.remainder(keys, np.uint32(vocab_size)).astype(token_dtype, copy=False)
        largest = int(counts.max()) if counts.size else 0
        return cls(first, row_nnz, tokens, counts.astype(narrow_count_dtype(largest), copy=False))

    @classmethod
    def concatenate(cls, parts: list[BlockCounts], /) -> BlockCounts:
        """One block of consecutive ``parts`` (each starting where the previous ends).

        >>> a = BlockCounts(0, np.array([1]), np.array([4], np.uint16), np.array([2], np.uint16))
        >>> b = BlockCounts(1, np.array([0, 1]), np.array([7], np.uint16), np.array([70000]))
        >>> c = BlockCounts.concatenate([a, b])
        >>> c.first, c.row_nnz.tolist(), c.tokens.tolist(), c.counts.tolist(), c.counts.dtype.name
        (0, [1, 0, 1], [4, 7], [2, 70000], 'int64')
        """
        if len(parts) == 1:
            return parts[0]
        return cls(parts[0].first, np.concatenate([p.row_nnz for p in parts]),
                   np.concatenate([p.tokens for p in parts]), np.concatenate([p.counts for p in parts]))

    def keys(self, vocab_size: int, /) -> np.ndarray:
        """The sorted unique local keys ``j V + v`` (uint32) of the entries, for a merge."""
        keys = np.repeat(np.arange(self.width, dtype=np.uint32) * np.uint32(vocab_size), self.row_nnz)
        keys += self.tokens
        return keys


@dataclass
class CountBlocks:
    """Exact sparse counts of shape ``(n, V)`` as :class:`BlockCounts` covering
    positions ``0 .. n - 1`` in order (positions no block covers are empty)."""

    shape: tuple[int, int]
    blocks: list[BlockCounts]

    @property
    def nnz(self) -> int:
        return sum(b.tokens.size for b in self.blocks)

    def largest(self) -> int:
        """The largest count (0 when there is none)."""
        return max((int(b.counts.max()) for b in self.blocks if b.counts.size), default=0)

    def row_nnz(self) -> np.ndarray:
        """Stored entries per position, int64, shape (n,)."""
        out = np.zeros(self.shape[0], dtype=np.int64)
        for b in self.blocks:
            out[b.first : b.first + b.width] = b.row_nnz
        return out

    def indptr(self) -> np.ndarray:
        """CSR row pointers, int64, shape (n + 1,)."""
        out = np.zeros(self.shape[0] + 1, dtype=np.int64)
        np.cumsum(self.row_nnz(), out=out[1:])
        return out

    def row_sums(self) -> np.ndarray:
        """``occ[i] = sum_v C[i, v]``, int64, shape (n,)."""
        out = np.zeros(self.shape[0], dtype=np.int64)
        for b in self.blocks:
            filled = np.flatnonzero(b.row_nnz)
            if filled.size:
                starts = np.concatenate([[0], np.cumsum(b.row_nnz)[:-1]])[filled]
                out[b.first + filled] = np.add.reduceat(b.counts.astype(np.int64), starts)
        return out

    def indices(self, dtype: np.dtype, /) -> Iterator[np.ndarray]:
        """The token ids of every entry in CSR order, block by block, as ``dtype``."""
        for b in self.blocks:
            yield b.tokens.astype(dtype, copy=False)

    def data(self, dtype: np.dtype, /) -> Iterator[np.ndarray]:
        """The counts of every entry in CSR order, block by block, as ``dtype``."""
        for b in self.blocks:
            yield b.counts.astype(dtype, copy=False)

    def to_csr(self, *, compact: bool = False) -> sp.csr_array:
        """The counts as a CSR array: int64 counts, or int32 with ``compact`` where every
        count fits (as :func:`posstats.counting.io.load_counts` ``(compact=True)`` holds
        them); int32 token ids below ``2**31`` entries. Empties this object (its blocks
        are freed as they are copied)."""
        n, V = self.shape
        nnz = self.nnz
        indptr = self.indptr()
        index = np.int32 if max(nnz, n + 1) < 2**31 else np.int64
        wide = np.int32 if compact and self.largest() < 2**31 else np.int64
        indices = np.empty(nnz, dtype=index)
        data = np.empty(nnz, dtype=wide)
        at = 0
        self.blocks.reverse()
        while self.blocks:  # last in the list = next in the matrix: each block freed once copied
            b = self.blocks.pop()
            indices[at : at + b.tokens.size] = b.tokens
            data[at : at + b.counts.size] = b.counts
            at += b.tokens.size
            del b
            release_freed_memory()
        return sp.csr_array((data, indices, indptr.astype(index, copy=False)), shape=(n, V))
