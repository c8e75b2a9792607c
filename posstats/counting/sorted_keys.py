"""Sparse exact counting by sorting: cost follows the tokens and the non-zeros, not n x V.

The positions are cut into blocks of ``B`` positions (:func:`block_positions`: n / 32
within [16, 256], and at most ``floor(2**32 / V)``, so that a key local to a block,
``(p - b B) V + v``, fits uint32). The windows reaching a block give a ``(windows, W)`` array of their
token ids at its W positions (uint16 when V < 2**16; the dtype's largest value pads the
positions past a window's end). Compacting a block gathers its rows position-major and
sorts each position's tokens (:func:`sorted_rows`: a radix sort of short 16-bit rows, in
cache); run lengths give the counts (:func:`row_counts`), held as
:class:`~posstats.counting.blocks.BlockCounts` (CSR order, 16-bit ids and counts where
they fit). A block compacted again merges the parts by their local keys
(:func:`merge_sorted`). Counts are exact.

Cost: about 3-5 ns per token (against 32-39 ns per token for one sort of a block's uint32
keys on an AMD EPYC, where numpy has no SIMD sort; 3.5 ns with AVX-512 sorting on Intel),
plus ``O(nnz)`` per merge; memory: the buffered tokens (2 bytes each, 4 past V = 2**16, at
most ``buffer_keys`` of them, padding included) plus 4-12 bytes per non-zero. Compactions
happen when the buffer is full, so a corpus of fewer than ``buffer_keys`` tokens sorts
each token once and merges nothing; a compaction then sorts the blocks holding the most
buffered tokens until half the buffer is free, so small blocks are sorted once, at the end.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from posstats.counting.blocks import BlockCounts, CountBlocks, narrow_count_dtype
from posstats.counting.scipy_sparse import sp

__all__ = [
    "DEFAULT_BUFFER_KEYS", "SortedKeyCounter", "block_positions", "buffer_tokens", "merge_sorted", "row_counts",
    "sorted_rows", "token_dtype",
]

DEFAULT_BUFFER_KEYS = 2**28  # tokens (padding included) buffered before a compaction: 512 MiB as uint16
MIN_BUFFER_KEYS = 2**24  # buffer_tokens never goes lower: compactions would merge too often
BLOCKS = 32  # position blocks of a count, within the block widths below
MIN_BLOCK, MAX_BLOCK = 16, 256  # positions per block (fewer where n or 2**32 / V requires)
SORT_CELLS = 2**22  # tokens gathered and sorted at once (8 MiB of uint16)
SMALL_BLOCK_WINDOWS = 64  # blocks of at most this many windows are compacted several at once


def block_positions(positions: int, vocab_size: int, /) -> int:
    """Positions per block: ``n / 32`` kept within ``[16, 256]``, at most n and at most
    ``floor(2**32 / V)`` (so that the local keys ``(p - p0) V + v`` of a merge fit uint32).

    A window ending inside a block is padded to the block's end, so wide blocks waste
    memory and sorting where documents are shorter than n (truncate and chunk modes);
    narrow ones cost a Python step per block and batch where every window spans all n
    positions (pack). Measured on 202 M Zipf tokens in documents of ~1,100 tokens, V =
    50,257, n = 131,072, counting then compacting: truncate 2.2 s and 1.1 GB with 256
    positions against 8.8 s and 3.5 GB with 1,024; pack 2.3 s against 2.6 s (1.3 GB both);
    at n = 4096 (20 M tokens, pack) 0.36-0.39 s with 128 positions against 0.40-0.48 s with 32.

    >>> block_positions(131072, 50257), block_positions(4096, 50257), block_positions(100, 50257)
    (256, 128, 16)
    """
    return max(1, min(positions, 2**32 // vocab_size, max(MIN_BLOCK, min(MAX_BLOCK, -(-positions // BLOCKS)))))


def buffer_tokens(budget_bytes: float, vocab_size: int, /) -> int:
    """Tokens to buffer before a compaction under a memory budget: half of ``budget_bytes``
    in token ids (:func:`token_dtype`), at least ``MIN_BUFFER_KEYS``.

    Every compaction past the first merges each block's new counts into its old ones, so a
    bigger buffer means fewer passes over the growing counts: 1 B tokens at n = 131,072
    counted in 34 s and 3.6 GB with 2**28 tokens buffered (three merges), in 18.8 s and
    4.4 GB with 2**30 (none). A corpus smaller than the buffer never merges, and the
    buffer holds only what was added, so small counts use no more memory.

    >>> buffer_tokens(4 * 2**30, 50257) == 2**30, buffer_tokens(2**30, 50257) == 2**28, buffer_tokens(1, 10)
    (True, True, 16777216)
    """
    return max(MIN_BUFFER_KEYS, int(budget_bytes) // 2 // token_dtype(vocab_size).itemsize)


def merge_sorted(keys: np.ndarray, counts: np.ndarray, new_keys: np.ndarray, new_counts: np.ndarray):
    """Sum two sorted unique (key, count) sets into one: their concatenation is put in
    order by a stable argsort, which finds the two sorted runs and merges them in one
    linear pass (timsort), and a key found in both keeps one entry, its counts summed.

    Measured on blocks of 0.8 M and 0.5 M keys: 13 ms against 35 ms for a binary search
    of every new key followed by ``np.insert`` (at 400 M tokens, n = 131,072, the merges
    past ``buffer_keys`` took 10 of 10.4 s of counting that way).

    >>> k, c = merge_sorted(np.array([1, 4]), np.array([1, 1]), np.array([0, 4, 9]), np.array([2, 3, 5]))
    >>> k.tolist(), c.tolist()
    ([0, 1, 4, 9], [2, 1, 4, 5])
    """
    if keys.size == 0:
        return new_keys, new_counts
    if new_keys.size == 0:
        return keys, counts
    both = np.concatenate([keys, new_keys])
    order = np.argsort(both, kind="stable")
    keys, counts = both[order], np.concatenate([counts, new_counts])[order]
    twice = np.flatnonzero(keys[1:] == keys[:-1])  # entry i + 1 repeats key i (each set is unique)
    if twice.size == 0:
        return keys, counts
    counts[twice] += counts[twice + 1]
    keep = np.ones(keys.size, dtype=bool)
    keep[twice + 1] = False
    return keys[keep], counts[keep]


def token_dtype(vocab_size: int, /) -> np.dtype:
    """The narrowest unsigned dtype of token ids below ``vocab_size`` that leaves its
    largest value free to mark padding: uint16 when ``V < 2**16`` (numpy sorts it by
    radix: about 3 ns per id), else uint32."""
    return np.dtype(np.uint16 if vocab_size < 2**16 else np.uint32)


def sorted_rows(pieces: list[np.ndarray], start: int, stop: int, /) -> np.ndarray:
    """The tokens of ``pieces`` (each ``(k_i, W)``: k_i windows' tokens at the same W
    positions) at columns ``start:stop`` gathered position-major, shape ``(stop - start,
    sum k_i)``, each row sorted: row j holds every token seen at position ``start + j``,
    ascending.

    Sorting short rows of 16-bit ids is a radix sort in cache (``kind="stable"``), about 10x
    faster per token than sorting the block's uint32 keys in one array on machines where
    numpy has no SIMD sort (measured 3-4.5 ns against 32-39 ns per token on an AMD EPYC).
    """
    dtype = pieces[0].dtype
    rows = np.empty((stop - start, sum(p.shape[0] for p in pieces)), dtype=dtype)
    at = 0
    for piece in pieces:
        rows[:, at : at + piece.shape[0]] = piece[:, start:stop].T
        at += piece.shape[0]
    rows.sort(axis=1, kind="stable" if dtype.itemsize <= 2 else "quicksort")
    return rows


def row_counts(rows: np.ndarray, first: int, /) -> BlockCounts:
    """The :class:`~posstats.counting.blocks.BlockCounts` of row-sorted tokens ``rows``
    (shape ``(width, K)``, row j = the tokens at position ``first + j``; the dtype's
    largest value is padding, not a token), by run-length encoding each row; counts as
    uint16 when ``K < 2**16`` (no count can exceed K).

    >>> b = row_counts(np.array([[1, 1, 3, 65535], [0, 2, 2, 2]], np.uint16), 8)
    >>> b.first, b.row_nnz.tolist(), b.tokens.tolist(), b.counts.tolist()
    (8, [2, 2], [1, 3, 0, 2], [2, 1, 1, 3])
    """
    width, k = rows.shape
    pad = np.iinfo(rows.dtype).max
    flat = rows.reshape(-1)
    run = np.empty(flat.size, dtype=bool)  # run[i]: a run of equal tokens starts at i
    np.not_equal(flat[1:], flat[:-1], out=run[1:])
    run[::k] = True  # every row starts a run
    padded = rows[:, -1] == pad  # sorted: a row's padding is its last run
    starts = np.flatnonzero(run)
    counts = np.empty(starts.size, dtype=narrow_count_dtype(k))
    np.subtract(starts[1:], starts[:-1], out=counts[:-1], casting="unsafe")  # each run <= K
    counts[-1] = flat.size - starts[-1]
    row_nnz = np.diff(np.searchsorted(starts, np.arange(0, flat.size + 1, k)))
    tokens = flat[starts]
    if padded.any():
        keep = tokens != pad
        tokens, counts = tokens[keep], counts[keep]
        row_nnz -= padded
    return BlockCounts(first, row_nnz, tokens, counts)


class SortedKeyCounter:
    """Exact sparse counts of ``(position, token)`` keys, block by block (module docstring).

    Add the tokens of windows at the positions of block ``b`` (``[b B, (b + 1) B)``) with
    :meth:`add_rows`; read the result as blocks with :meth:`finish` (to write it) or as a
    CSR array with :meth:`to_csr`. ``block`` sets B (default :func:`block_positions`; at
    most ``floor(2**32 / V)``); it never changes the counts. ``threads`` blocks are
    compacted at once (numpy sorts and compares without holding the GIL).

    >>> c = SortedKeyCounter(positions=3, vocab_size=4, block=3)
    >>> c.add_rows(0, np.array([[1, 2, 65535], [1, 65535, 65535]], np.uint16))  # (0, 1) twice, (1, 2)
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
        self._rows: dict[int, list[np.ndarray]] = {}  # block -> (windows, block width) tokens
        self._buffered = 0
        self._done: dict[int, BlockCounts] = {}  # block -> its counts so far

    def width(self, block: int, /) -> int:
        """Positions of ``block``: B, fewer for the last one."""
        return min(self.block, self.positions - block * self.block)

    def add_rows(self, block: int, rows: np.ndarray, /) -> None:
        """Buffer the tokens of windows at the positions of ``block``: ``rows[w, j]`` is
        the token of window w at position ``block * B + j`` (shape ``(windows,
        width(block))``, :attr:`token_dtype`), or the dtype's largest value where the
        window has no token. ``rows`` is kept, not copied: the caller must not modify it
        afterwards. Compacts the largest blocks when the buffer is full."""
        if rows.size == 0:
            return
        if rows.ndim != 2 or rows.shape[1] != self.width(block) or rows.dtype != self.token_dtype:
            msg = (f"rows of block {block} must be {self.token_dtype} (windows, {self.width(block)}), "
                   f"got {rows.dtype} {rows.shape}")
            raise ValueError(msg)
        self._rows.setdefault(block, []).append(rows)
        self._buffered += rows.size
        if self._buffered >= self.buffer_keys:
            self._compact_largest()

    def compact(self) -> None:
        """Sort, run-length encode and merge every block's buffered rows."""
        self._compact_blocks(sorted(self._rows))
        self._buffered = 0

    def _compact_largest(self) -> None:
        """The buffer is full: compact the blocks holding the most buffered tokens, largest
        first, until at most half of ``buffer_keys`` is left buffered.

        Where a count has many small blocks (truncate and chunk mode's length classes: a
        block of a class holds a few windows of that length), compacting every block at
        every fill sorted each small block several times and merged it as often, at a
        Python step each; the small ones now wait for :meth:`finish` and are sorted once.
        Memory is bounded as before (at most ``buffer_keys`` tokens buffered)."""
        keep = self.buffer_keys // 2
        held = {block: sum(p.size for p in pieces) for block, pieces in self._rows.items()}
        picked: list[int] = []
        left = self._buffered
        for block in sorted(held, key=held.__getitem__, reverse=True):
            if left <= keep:
                break
            picked.append(block)
            left -= held[block]
        self._compact_blocks(sorted(picked))
        self._buffered = left

    def _compact_blocks(self, blocks: list[int]) -> None:
        """Compact ``blocks``: each large one, or one compacted before, on its own
        (:meth:`_compact_block`); the small ones (at most :data:`SMALL_BLOCK_WINDOWS`
        windows buffered, full width, never compacted) several at once, grouped by their
        number of windows to within a factor of 2 (:meth:`_compact_small`)."""
        large: list[int] = []
        small: dict[int, list[int]] = {}
        for block in blocks:
            windows = sum(p.shape[0] for p in self._rows[block])
            if windows <= SMALL_BLOCK_WINDOWS and block not in self._done and self.width(block) == self.block:
                small.setdefault(windows.bit_length(), []).append(block)
            else:
                large.append(block)
        tasks = [(self._compact_block, block) for block in large]
        for bits, group in small.items():
            per = max(1, SORT_CELLS // (self.block << bits))
            tasks += [(self._compact_small, group[i:i + per]) for i in range(0, len(group), per)]
        self._map(lambda task: task[0](task[1]), tasks)

    def _map(self, fn, items: list) -> None:
        """``fn(item)`` for every item, on ``threads`` threads."""
        if self.threads > 1 and len(items) > 1:
            with ThreadPoolExecutor(self.threads) as pool:
                list(pool.map(fn, items))
        else:
            for item in items:
                fn(item)

    def _compact_small(self, blocks: list[int]) -> None:
        """Compact small blocks never compacted before, in one sort: their rows stacked
        position-major, ``(len(blocks) B, k)`` with k the most windows any of them holds
        (the others padded), sorted and run-length encoded at once, then cut back into one
        :class:`BlockCounts` per block (views of the shared arrays). Where truncate and
        chunk mode's length classes give thousands of blocks of a few windows, this takes
        one pass of numpy calls for many blocks instead of one each."""
        width = self.block
        pieces = [self._rows.pop(block) for block in blocks]
        k = max(sum(p.shape[0] for p in group) for group in pieces)
        rows = np.full((len(blocks), width, k), np.iinfo(self.token_dtype).max, dtype=self.token_dtype)
        for stack, group in zip(rows, pieces):
            at = 0
            for piece in group:
                stack[:, at : at + piece.shape[0]] = piece.T
                at += piece.shape[0]
        del pieces
        rows = rows.reshape(len(blocks) * width, k)
        rows.sort(axis=1, kind="stable" if rows.dtype.itemsize <= 2 else "quicksort")
        counts = row_counts(rows, 0)
        del rows
        row_nnz = counts.row_nnz.reshape(len(blocks), width)
        ends = np.cumsum(row_nnz.sum(axis=1))
        for block, nnz, start, end in zip(blocks, row_nnz, np.r_[0, ends[:-1]], ends):
            self._done[block] = BlockCounts(block * width, nnz, counts.tokens[start:end], counts.counts[start:end])

    def _compact_block(self, block: int) -> None:
        width, V = self.width(block), self.vocab_size
        parts = [self._done.pop(block)] if block in self._done else []
        pieces = self._rows.pop(block, None)
        if pieces:
            # a few positions at a time where many windows reach the block (the first
            # blocks of short documents): the sorted copy stays small and in cache
            step = max(1, SORT_CELLS // sum(p.shape[0] for p in pieces))
            slices = [row_counts(sorted_rows(pieces, j, min(j + step, width)), block * self.block + j)
                      for j in range(0, width, step)]
            del pieces
            parts.append(BlockCounts.concatenate(slices))
        while len(parts) > 1:  # a block compacted before: merge (only past buffer_keys tokens)
            a, b = parts.pop(), parts.pop()
            merged = merge_sorted(a.keys(V), a.counts.astype(np.int64), b.keys(V), b.counts.astype(np.int64))
            parts.append(BlockCounts.from_keys(block * self.block, width, V, *merged, self.token_dtype))
        self._done[block] = parts[0]

    def finish(self) -> CountBlocks:
        """The counts as :class:`~posstats.counting.blocks.CountBlocks` (compacting what is
        buffered); the counter is empty afterwards."""
        self.compact()
        blocks = [self._done.pop(b) for b in sorted(self._done)]
        return CountBlocks((self.positions, self.vocab_size), blocks)

    def to_csr(self, *, compact: bool = False) -> sp.csr_array:
        """The counts as an int64 CSR array of shape (n, V), rows and columns sorted;
        ``compact``: int32 counts where every count fits, as
        :func:`posstats.counting.io.load_counts` ``(compact=True)`` loads them.

        Consumes the counter (its blocks are freed as they are copied into the result,
        which keeps the peak memory near the result's size); it is empty afterwards.
        """
        return self.finish().to_csr(compact=compact)
