"""The noise floor from the counts themselves: every counted token split at random.

At a fixed position every sequence contributes at most one token, so the ``occ[i]``
tokens of position i are ``occ[i]`` draws, one per sequence. Splitting them at random
into K parts (a multinomial thinning of every count ``C[i, v]``) gives K independent
samples of ``mu_i`` of about ``occ[i] / K`` tokens each, exactly as a split of the
sequences by parity would at that position, and their sum is the corpus' counts exactly.
The noise floor (:func:`posstats.estimates.noise.noise_floor`, split-half ``h_i``, quarter
``q_i``, bias ``b_i``) only compares parts position by position, so it needs nothing
more: no second pass over the corpus, no parts on disk.

The caveat is dependence *between sequences*: in ``chunk`` and ``pack`` mode a document
longer than n spans several sequences and can put correlated tokens at the same position
of two of them; a random split treats them as independent and can understate the noise.
A split by document (``posstats analyze --reread``) or by shard (``--store``) keeps such
tokens together. With ``truncate`` mode, or documents shorter than n, the two agree.

:func:`split_noise_floor` streams: rows are thinned and reduced block by block (about
:data:`BLOCK_ENTRIES` stored entries at a time), so its memory is a few copies of one
block whatever the corpus size, and it accumulates on the way the column noise ``c_v``
of the analytic null (:func:`posstats.estimates.null_rank.mp_edge`).

>>> import scipy.sparse as sp
>>> c = sp.csr_array(np.array([[3, 0, 1], [0, 2, 2]]))
>>> thin(c.data, 2, np.random.default_rng(0)).sum(axis=0).tolist()
[3, 1, 2, 2]
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from typing import Any

import numpy as np
import scipy.sparse as sp

from posstats.counting.rows import row_blocks
from posstats.estimates.noise import UNBIASED_METHOD, NoiseFloor, split_half, usable_rows
from posstats.estimates.sampling_variance import entries_sampling_variance
from posstats.geometry.products import thread_pool
from posstats.progress import progress

__all__ = ["BLOCK_ENTRIES", "range_noise_floor", "split_noise_floor", "thin"]

BLOCK_ENTRIES = 1 << 22  # stored entries thinned at a time (K x 32 MiB of int64 parts)


def thin(values: Any, parts: int, rng: np.random.Generator, /) -> np.ndarray:
    """Split every count of ``values`` (nnz,) uniformly at random into ``parts`` parts.

    Part k takes ``Binomial(left, 1 / (parts - k))`` of what the earlier parts left (a
    multinomial with equal probabilities); a count of 1, the common case, goes whole to a
    uniformly drawn part.

    Returns:
        (parts, nnz) int64 whose column sums are ``values``.
    """
    values = np.asarray(values).astype(np.int64, copy=False)
    out = np.zeros((int(parts), values.size), dtype=np.int64)
    single = np.flatnonzero(values == 1)
    out[rng.integers(0, parts, single.size), single] = 1
    many = np.flatnonzero(values > 1)
    left = values[many]
    for k in range(parts - 1):
        take = rng.binomial(left, 1.0 / (parts - k))
        out[k, many] = take
        left = left - take
    out[parts - 1, many] = left
    return out


class _Block:
    """One row block thinned into parts: paired distances between unions of parts."""

    def __init__(self, x: np.ndarray, row_of: np.ndarray, rows: int) -> None:
        self.x = x  # (K, nnz) thinned counts
        self.row_of = row_of  # (nnz,) row of every entry, 0..rows-1
        self.rows = rows
        self.sizes = _row_sums(x, row_of, rows)  # (K, rows) float64, exact
        self._sqrt: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}

    def sqrt_of(self, which: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(sqrt(C_part / N_part) per entry, N_part per row) of the union of parts ``which``
        (computed once per union); NaN in the rows where the union is empty."""
        if which not in self._sqrt:
            counts = self.x[which[0]] if len(which) == 1 else self.x[which[0]] + self.x[which[1]]
            for k in which[2:]:
                counts = counts + self.x[k]
            n = self.sizes[list(which)].sum(axis=0)
            with np.errstate(divide="ignore", invalid="ignore"):
                self._sqrt[which] = np.sqrt(counts / n[self.row_of]), n
        return self._sqrt[which]

    def d2(self, a: tuple[int, ...], b: tuple[int, ...]) -> np.ndarray:
        """(rows,) ``d_H^2`` between the unions ``a`` and ``b`` (difference form); NaN where
        either is empty (the only rows whose entries are NaN, so no entry is scrubbed)."""
        sa, na = self.sqrt_of(a)
        sb, nb = self.sqrt_of(b)
        diff = sa - sb
        diff *= diff
        out = np.bincount(self.row_of, weights=diff, minlength=self.rows)
        out[(na == 0) | (nb == 0)] = np.nan
        return out


def _row_sums(x: np.ndarray, row_of: np.ndarray, rows: int, /) -> np.ndarray:
    """(K, rows) float64 ``sum`` of each part's counts ``x`` (K, nnz) over the entries of
    each row (``row_of`` ascending): integer sums by ``reduceat`` when every row has an
    entry (exact, so equal to a float ``bincount``), else by ``bincount``."""
    starts = np.searchsorted(row_of, np.arange(rows))
    if x.shape[1] and rows and np.all(np.diff(np.append(starts, x.shape[1])) > 0):
        return np.add.reduceat(x, starts, axis=1).astype(np.float64)
    return np.stack([np.bincount(row_of, weights=xk, minlength=rows) for xk in x])


def split_noise_floor(
    rows: Any,
    /,
    *,
    parts: int = 4,
    seed: int | np.random.SeedSequence = 0,
    positions: Any = None,
    block: int = BLOCK_ENTRIES,
    show_progress: bool | None = None,
    quarters: bool = False,
) -> NoiseFloor:
    """The noise floor of the (m, V) counts ``rows`` from a random split of their tokens.

    Args:
        rows: (m, V) non-negative integer counts (scipy sparse or dense), one row per
            position of the geometry.
        parts: 2 (halves) or 4 (quarters): the split-half and quarter distances reported
            beside the bias (the bias itself comes from the counts, unbiased at every N).
        seed: seeds the split (results depend only on ``seed`` and ``rows``).
        positions: (m,) positions the rows stand for (default ``0..m-1``).
        block: stored entries thinned at a time.
        show_progress: a bar over the blocks (None: on a terminal).
        quarters: with 4 parts, also the quarter distances and the old power law's
            ``gamma`` (report-only diagnostics; otherwise None / NaN).

    Returns:
        :class:`~posstats.estimates.noise.NoiseFloor` with ``source = "token split"`` and
        ``column_noise`` (V,), the analytic null's column noise
        ``c_v = sum_i (b_i / h_i) (s_A[i, v] - s_B[i, v])^2`` over the usable rows, with
        halves A = parts 0 + 2 and B = parts 1 + 3 (parts 0 and 1 with two parts).
    """
    if int(parts) not in (2, 4):
        msg = f"the noise floor uses 2 or 4 parts, got {parts}"
        raise ValueError(msg)
    c = sp.csr_array(rows)
    if not c.has_canonical_format:
        c = c.copy()
        c.sum_duplicates()
    m, vocab = (int(x) for x in c.shape)
    rng = np.random.default_rng(seed)
    fields = {k: np.full(m, np.nan) for k in ("h", "q", "gamma", "na", "nb", "bias")}
    occ = np.zeros(m, dtype=np.int64)
    column_noise = np.zeros(vocab, dtype=np.float64)
    occupancy_column_noise = np.zeros(vocab, dtype=np.float64)
    fallback = 0
    halves = ((0, 2), (1, 3)) if parts == 4 else ((0,), (1,))
    blocks = row_blocks(c.indptr, int(block))

    def reduce(lo: int, hi: int, thinned: np.ndarray) -> tuple[int, int, dict[str, Any], np.ndarray, tuple[np.ndarray, np.ndarray]]:
        a, b = int(c.indptr[lo]), int(c.indptr[hi])
        lengths = np.diff(c.indptr[lo : hi + 1])
        blk = _Block(thinned, np.repeat(np.arange(hi - lo), lengths), hi - lo)
        split = split_half(blk.d2, blk.sizes, quarters=quarters)
        block_occ = blk.sizes.sum(axis=0)
        bias = entries_sampling_variance(c.data[a:b], blk.row_of, block_occ)
        values = {"h": split.h, "q": split.q, "gamma": split.gamma, "na": split.na, "nb": split.nb, "bias": bias}
        return lo, hi, values, block_occ, _column_noise(blk, halves, split.h, bias, block_occ, c.indices[a:b], vocab)

    def collect(done: tuple[int, int, dict[str, Any], np.ndarray, tuple[np.ndarray, np.ndarray]]) -> None:
        nonlocal column_noise, occupancy_column_noise
        lo, hi, values, block_occ, (noise, weighted_noise) = done
        for name, value in values.items():
            if value is not None:
                fields[name][lo:hi] = value
        occ[lo:hi] = block_occ.astype(np.int64)
        column_noise += noise  # in block order: the same sums as one thread's
        occupancy_column_noise += weighted_noise
        bar.update(int(c.indptr[hi]) - int(c.indptr[lo]))

    # The thinning draws stay on this thread, in block order (the results depend only on
    # the seed); each block's distances and bias run on the products' pool meanwhile, at
    # most two blocks ahead (memory: a few thinned blocks).
    pending: deque[Future[Any]] = deque()
    with progress(total=int(c.indptr[-1]), desc="noise floor", unit="entry", enabled=show_progress) as bar:
        for lo, hi in blocks:
            thinned = thin(c.data[int(c.indptr[lo]) : int(c.indptr[hi])], parts, rng)
            pending.append(thread_pool().submit(reduce, lo, hi, thinned))
            if len(pending) > 2:
                collect(pending.popleft().result())
        while pending:
            collect(pending.popleft().result())
    method = UNBIASED_METHOD if blocks else ""
    return NoiseFloor(
        positions=np.arange(m, dtype=np.int64) if positions is None else np.asarray(positions, dtype=np.int64),
        occupancy=occ,
        split_half=fields["h"],
        split_quarter=fields["q"] if parts == 4 and quarters else None,
        gamma=fields["gamma"],
        bias=fields["bias"],
        method=method,
        parts=int(parts),
        fallback=fallback,
        source="token split",
        column_noise=column_noise,
        occupancy_column_noise=occupancy_column_noise,
    )


def range_noise_floor(counts: Any, positions: Any, /, *, parts: int = 4, seed: int = 0) -> NoiseFloor:
    """The noise floor of one position range's (n_r, V) occupied counts (the rows of
    ``positions``, (n_r,)), as :func:`split_noise_floor` with the stream seeded by
    ``(seed, first position)``: each range draws its own, so the floor joined over ranges
    (:func:`posstats.estimates.noise.merge_noise_floors`) depends only on the seed and the
    cuts. Each row's bias ``b_i`` comes from its own counts, not from the split: it is the
    same whatever the cuts. The split-half distances and the analytic null's column noise
    (a sum over rows) come from the split."""
    positions = np.asarray(positions, dtype=np.int64)
    first = int(positions[0]) if positions.size else 0
    return split_noise_floor(counts, parts=int(parts), seed=np.random.SeedSequence([int(seed), first]),
                             positions=positions, show_progress=False)


def _column_noise(
    blk: _Block, halves: tuple[tuple[int, ...], tuple[int, ...]], h: np.ndarray, bias: np.ndarray,
    occupancy: np.ndarray, cols: np.ndarray, vocab: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(V,) this block's shares of ``c_v = sum_i (b_i / h_i) (s_A[i, v] - s_B[i, v])^2``
    and of the same sum with each row's term times its ``occupancy`` N_i."""
    sa, na = blk.sqrt_of(halves[0])
    sb, nb = blk.sqrt_of(halves[1])
    # h averages both pairings into halves, so it can be finite where the union read here
    # is empty (a position of one to three tokens): such a row has no difference to give
    ok = usable_rows(h, bias) & (na > 0) & (nb > 0)
    if not ok.any():
        return np.zeros(vocab), np.zeros(vocab)
    scale = np.where(ok, bias / np.where(ok, h, 1.0), 0.0)
    weights = sa - sb
    weights *= weights
    weights *= scale[blk.row_of]
    weights[~ok[blk.row_of]] = 0.0  # rows without a usable h (their entries may be NaN)
    weighted = weights * np.asarray(occupancy, dtype=np.float64)[blk.row_of]
    return np.bincount(cols, weights=weights, minlength=vocab), np.bincount(cols, weights=weighted, minlength=vocab)
