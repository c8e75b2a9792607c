"""Sparse exact counting by sorting keys: cost follows the tokens and the non-zeros, not n x V.

Every counted token becomes a key ``k = p V + v`` (position p, token v). The positions are
cut into blocks of ``B`` positions (:func:`block_positions`: about n / 128, and at most
``floor(2**32 / V)``), so a key *local* to its block, ``(p - b B) V + v``, fits in uint32:
half the bytes of int64 keys and a sort about twice as fast (numpy sorts uint32 with SIMD).
Keys are buffered per block; compacting a block sorts its buffered keys in place,
run-length encodes them into (unique key, count) and merges those into the block's sorted
unique keys. Counts are exact: int32 while fewer than 2**31 keys were added, int64 after;
the result (:meth:`SortedKeyCounter.to_csr`) is int64.

Cost: one sort of every key (``O(N log N)`` with a small constant: about 3.5 ns per key
on one AVX-512 core) plus one merge per compaction, ``O(nnz)``; memory: the buffered keys
(4 bytes each, at most ``buffer_keys``) plus 8 bytes per non-zero (12 past 2**31 keys).
Compactions happen when the buffer is full, so a corpus of fewer than ``buffer_keys``
tokens sorts each key exactly once and merges nothing.
"""

from __future__ import annotations

import ctypes
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp

__all__ = [
    "DEFAULT_BUFFER_KEYS", "SortedKeyCounter", "block_positions", "merge_sorted", "row_run_lengths", "run_lengths",
    "sorted_rows", "token_dtype",
]

DEFAULT_BUFFER_KEYS = 2**28  # 1 GiB of uint32 keys buffered before a compaction
BLOCKS = 128  # position blocks of a count (more where 2**32 / V requires)


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
    up to 32 MB as large arrays are freed), so freeing them as :meth:`SortedKeyCounter.to_csr`
    copies them out would not lower the resident size without it: measured at n = 131,072,
    202 M tokens, 128 blocks, 3.6 GB peak without, against 2.0 GB with."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def block_positions(positions: int, vocab_size: int, /) -> int:
    """Positions per block: at most ``floor(2**32 / V)``, so that the local keys
    ``(p - p0) V + v`` of a block fit uint32, and about ``n / 128`` (at least one): blocks
    small enough that compacting one touches little memory and that two threads can
    compact different blocks at once, also when the tokens crowd the first positions
    (truncate and chunk modes: documents shorter than n). Measured on 50 M Zipf tokens,
    V = 50,257: n / 128 against n / 16, truncate at n = 131,072 2.8 s against 4.8-6.0 s,
    pack 1.8 s against 2.0-2.3 s, n = 4096 0.52 s against 0.72 s; n / 512 is no faster."""
    return max(1, min(2**32 // vocab_size, -(-positions // BLOCKS)))


def run_lengths(sorted_keys: np.ndarray, /, *, dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
    """(unique keys, counts as ``dtype``) of a sorted 1-D array, by run-length encoding.

    >>> [a.tolist() for a in run_lengths(np.array([2, 2, 5, 7, 7, 7], np.uint32))]
    [[2, 5, 7], [2, 1, 3]]
    """
    if sorted_keys.size == 0:
        return sorted_keys, np.zeros(0, dtype)
    first = np.empty(sorted_keys.size, dtype=bool)  # first[i]: a run starts at i
    first[0] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    counts = np.empty(starts.size, dtype=dtype)
    np.subtract(starts[1:], starts[:-1], out=counts[:-1], casting="unsafe")  # each run <= len(sorted_keys)
    counts[-1] = sorted_keys.size - starts[-1]
    return sorted_keys[first], counts


def merge_sorted(keys: np.ndarray, counts: np.ndarray, new_keys: np.ndarray, new_counts: np.ndarray):
    """Sum two sorted unique (key, count) sets into one: ``O(len(keys) + len(new_keys))``
    memory moves plus a binary search per new key.

    >>> k, c = merge_sorted(np.array([1, 4]), np.array([1, 1]), np.array([0, 4, 9]), np.array([2, 3, 5]))
    >>> k.tolist(), c.tolist()
    ([0, 1, 4, 9], [2, 1, 4, 5])
    """
    if keys.size == 0:
        return new_keys, new_counts
    if new_keys.size == 0:
        return keys, counts
    at = np.searchsorted(keys, new_keys)
    found = at < keys.size
    found[found] = keys[at[found]] == new_keys[found]
    counts = counts.copy()
    counts[at[found]] += new_counts[found]
    fresh = ~found
    return np.insert(keys, at[fresh], new_keys[fresh]), np.insert(counts, at[fresh], new_counts[fresh])


def token_dtype(vocab_size: int, /) -> np.dtype:
    """The narrowest unsigned dtype of token ids below ``vocab_size``: uint16 when
    ``V <= 2**16`` (numpy sorts it by radix: about 3 ns per id), else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def sorted_rows(pieces: list[np.ndarray], width: int, dtype: np.dtype, /) -> np.ndarray:
    """The tokens of ``pieces`` (each ``(k_i, width)``: k_i windows' tokens at the same
    ``width`` positions) gathered position-major, shape ``(width, sum k_i)``, each row
    sorted: row j holds every token seen at position j, ascending.

    Sorting short rows of 16-bit ids is a radix sort in cache (``kind="stable"``), about 10x
    faster per token than sorting the block's uint32 keys in one array on machines where
    numpy has no SIMD sort (measured 3-4.5 ns against 32-39 ns per token on an AMD EPYC).
    """
    rows = np.empty((width, sum(p.shape[0] for p in pieces)), dtype=dtype)
    at = 0
    for piece in pieces:
        rows[:, at : at + piece.shape[0]] = piece.T  # < V: exact in dtype
        at += piece.shape[0]
    rows.sort(axis=1, kind="stable" if dtype.itemsize <= 2 else "quicksort")
    return rows


def row_run_lengths(rows: np.ndarray, vocab_size: int, /, *, dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique local keys ``j V + v``, counts as ``dtype``) of row-sorted tokens
    ``rows`` (shape ``(width, K)``, row j = the tokens at local position j).

    >>> keys, counts = row_run_lengths(np.array([[1, 1, 3], [0, 2, 2]], np.uint16), 4)
    >>> keys.tolist(), counts.tolist()
    ([1, 3, 4, 6], [2, 1, 1, 2])
    """
    width, k = rows.shape
    if rows.size == 0:
        return np.zeros(0, np.uint32), np.zeros(0, dtype)
    flat = rows.reshape(-1)
    first = np.empty(flat.size, dtype=bool)  # first[i]: a run starts at i
    np.not_equal(flat[1:], flat[:-1], out=first[1:])
    first[::k] = True  # every row starts a run
    starts = np.flatnonzero(first)
    counts = np.empty(starts.size, dtype=dtype)
    np.subtract(starts[1:], starts[:-1], out=counts[:-1], casting="unsafe")  # each run <= K
    counts[-1] = flat.size - starts[-1]
    keys = (starts // k).astype(np.uint32)
    keys *= np.uint32(vocab_size)
    keys += flat[starts]
    return keys, counts


class SortedKeyCounter:
    """Exact sparse counts of ``(position, token)`` keys, block by block (module docstring).

    Add uint32 *local* keys of block ``b`` (positions ``[b B, (b + 1) B)``) with
    :meth:`add`, or the tokens of windows that cover the whole block with
    :meth:`add_rows`; read the result as a CSR array with :meth:`to_csr`. ``block`` sets B
    (default :func:`block_positions`; at most ``floor(2**32 / V)``); it never changes the counts.
    Counts are held as int32 while fewer than ``2**31`` keys were added (no count can
    exceed that), as int64 from then on. ``threads`` blocks are compacted at once (numpy
    sorts and compares without holding the GIL).

    >>> c = SortedKeyCounter(positions=3, vocab_size=4, block=3)
    >>> c.add(0, np.array([1, 1, 4 + 2], np.uint32))  # (0, 1) twice, (1, 2) once
    >>> c.add_rows(0, np.array([[3, 0, 1]], np.uint16))  # (0, 3), (1, 0), (2, 1)
    >>> c.to_csr().toarray().tolist()
    [[0, 2, 0, 1], [1, 0, 1, 0], [0, 1, 0, 0]]
    """

    def __init__(self, *, positions: int, vocab_size: int, buffer_keys: int = DEFAULT_BUFFER_KEYS,
                 block: int | None = None, threads: int = 2) -> None:
        self.positions, self.vocab_size = positions, vocab_size
        default = block_positions(positions, vocab_size)
        self.block = default if block is None else max(1, min(int(block), positions, 2**32 // vocab_size))
        self.buffer_keys = max(1, int(buffer_keys))
        self.threads = max(1, int(threads))
        self.token_dtype = token_dtype(vocab_size)
        self.added = 0  # keys ever added
        self._buffers: dict[int, list[np.ndarray]] = {}  # block -> local keys
        self._rows: dict[int, list[np.ndarray]] = {}  # block -> (windows, block width) tokens
        self._buffered = 0
        self._keys: dict[int, np.ndarray] = {}  # block -> sorted unique local keys (uint32)
        self._counts: dict[int, np.ndarray] = {}  # block -> their counts (count_dtype)

    @property
    def count_dtype(self) -> np.dtype:
        """int32 while no count can exceed ``2**31 - 1``, else int64."""
        return np.dtype(np.int32 if self.added < 2**31 else np.int64)

    def width(self, block: int, /) -> int:
        """Positions of ``block``: B, fewer for the last one."""
        return min(self.block, self.positions - block * self.block)

    def add(self, block: int, keys: np.ndarray, /) -> None:
        """Buffer uint32 local keys of ``block``; compacts every block when the buffer is full.

        ``keys`` is kept (not copied): the caller must not modify it afterwards.
        """
        if keys.size == 0:
            return
        if keys.dtype != np.uint32:
            msg = f"local keys must be uint32, got {keys.dtype}"
            raise TypeError(msg)
        self._buffer(self._buffers, block, keys)

    def add_rows(self, block: int, rows: np.ndarray, /) -> None:
        """Buffer the tokens of windows covering all of ``block``: ``rows[w, j]`` is the
        token of window w at position ``block * B + j``, shape ``(windows, width(block))``,
        ids in ``[0, V)`` of an unsigned dtype. Kept, not copied, like :meth:`add`'s keys."""
        if rows.size == 0:
            return
        if rows.ndim != 2 or rows.shape[1] != self.width(block) or rows.dtype.kind != "u":
            msg = f"rows of block {block} must be unsigned (windows, {self.width(block)}), got {rows.dtype} {rows.shape}"
            raise ValueError(msg)
        self._buffer(self._rows, block, rows)

    def _buffer(self, buffers: dict[int, list[np.ndarray]], block: int, array: np.ndarray) -> None:
        buffers.setdefault(block, []).append(array)
        self._buffered += array.size
        self.added += array.size
        if self._buffered >= self.buffer_keys:
            self.compact()

    def compact(self) -> None:
        """Sort, run-length encode and merge every block's buffered keys and rows."""
        dtype = self.count_dtype
        for block, counts in self._counts.items():
            self._counts[block] = counts.astype(dtype, copy=False)
        self._map(self._compact_block, sorted(set(self._buffers) | set(self._rows)))
        self._buffered = 0

    def _map(self, fn, items: list) -> None:
        """``fn(item)`` for every item, on ``threads`` threads."""
        if self.threads > 1 and len(items) > 1:
            with ThreadPoolExecutor(self.threads) as pool:
                list(pool.map(fn, items))
        else:
            for item in items:
                fn(item)

    def _compact_block(self, block: int) -> None:
        dtype = self.count_dtype
        keys, counts = self._keys.get(block, np.zeros(0, np.uint32)), self._counts.get(block, np.zeros(0, dtype))
        pieces = self._rows.pop(block, None)
        if pieces:
            rows = sorted_rows(pieces, self.width(block), self.token_dtype)
            del pieces
            keys, counts = merge_sorted(keys, counts, *row_run_lengths(rows, self.vocab_size, dtype=dtype))
            del rows
        pieces = self._buffers.pop(block, None)
        if pieces:
            new = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
            del pieces
            new.sort()
            keys, counts = merge_sorted(keys, counts, *run_lengths(new, dtype=dtype))
            del new
        self._keys[block], self._counts[block] = keys, counts

    def to_csr(self, *, compact: bool = False) -> sp.csr_array:
        """The counts as an int64 CSR array of shape (n, V), rows and columns sorted;
        ``compact``: int32 counts while every count fits (fewer than ``2**31`` keys were
        added), as :func:`posstats.counting.io.load_counts` ``(compact=True)`` loads them:
        half the memory, and no int64 copy to narrow again when saving.

        Consumes the counter (its blocks are freed as they are copied into the result,
        which keeps the peak memory near the result's size); it is empty afterwards.
        """
        self.compact()
        n, V = self.positions, self.vocab_size
        blocks = sorted(self._keys)
        starts = np.cumsum([0] + [self._keys[b].size for b in blocks])
        nnz = int(starts[-1])
        per_row = np.zeros(n, dtype=np.int64)
        indices = np.empty(nnz, dtype=np.int32 if max(nnz, n + 1) < 2**31 else np.int64)
        data = np.empty(nnz, dtype=self.count_dtype if compact else np.int64)

        def fill(i: int) -> None:
            block = blocks[i]
            keys, counts = self._keys.pop(block), self._counts.pop(block)
            lo, hi = starts[i], starts[i + 1]
            hist = np.bincount(keys // np.uint32(V))
            per_row[block * self.block : block * self.block + hist.size] = hist
            np.remainder(keys, np.uint32(V), out=indices[lo:hi], casting="unsafe")  # < V <= 2**31
            data[lo:hi] = counts
            del keys, counts
            release_freed_memory()

        self._map(fill, list(range(len(blocks))))
        indptr = np.zeros(n + 1, dtype=indices.dtype)
        np.cumsum(per_row, out=indptr[1:])
        self.added = 0
        return sp.csr_array((data, indices, indptr), shape=(n, V))
