"""The rank test's edge on independent halves when the rows are held apart in position ranges.

:mod:`posstats.estimates.halves_edge` measures the top of the noise bulk on the halves'
rescaled noise matrix ``D'`` (m, V). Over position ranges (:mod:`posstats.geometry.ranged`:
in this process or in Ray actors, so that no process holds every count) each range builds
its own rows of ``D'`` beside its rows of ``S``, and the steps that need every row are
reductions of small arrays:

1. every range reads its rows of the two halves (the window groups' even and odd groups
   beside the counts: :func:`posstats.counting.window_groups_io.load_halves_rows`) and its
   exact counts (recovered from its square roots), forms ``D = (S_A - S_B) / 2`` on its rows,
   and returns its (bins, V) sums of ``D^2`` and of the counts' unbiased variances by
   occupancy bin, with its halves' coverage (:class:`RangeHalves`);
2. the caller adds them up, and every range rescales its rows by the one factor per (bin,
   column) that the sums give (:func:`ranged_halves_noise`): the same ``D'`` as in one
   process, to rounding;
3. the Lanczos products ``D' D'^T x`` are assembled from the ranges as the MDS's are:
   ``D'^T Y = sum_r D_r^T Y_r`` ((V, b) blocks in), ``D' X = [D_r X]_r`` ((n_r, b) out)
   (:class:`RangedNoise`).

The occupancy bins are those of all the rows (:func:`posstats.estimates.halves_edge.occupancy_bins`
of the rows' occupancies, which the caller holds), each range given its rows' bins.

Memory: while the edge is measured a range holds its rows of ``D'`` beside those of ``S``:
12 bytes an entry, at most one entry per stored count (``D``'s support is within the
counts'; at n = 131,072 over 2.02e8 tokens 1.26e8 entries for 1.26e8 stored counts), built
a row block at a time; :data:`HALVES_BYTES_PER_STORED_COUNT` is what the range budget adds
for it (:func:`posstats.analysis.budgeted_stored_counts`). The ranges let it go once the
edges are read (``release``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from posstats.counting.window_groups_io import load_halves_rows
from posstats.estimates.halves_edge import HalvesNoise, cell_sums, noise_scale, occupancy_bins, rescale_noise, unscaled_noise
from posstats.geometry.products import _row_block_views, _transposed_views, blocks_t_times, blocks_times
from posstats.geometry.ranged import LocalRanges

__all__ = ["HALVES_BYTES_PER_STORED_COUNT", "LocalHalves", "RangeHalves", "RangedNoise", "local_halves",
           "ranged_halves_noise"]

# What a range holds for its rows of D' per stored count of its counts: a float64 value and
# an int32 index per entry, at most one entry per stored count (D's support is the counts').
HALVES_BYTES_PER_STORED_COUNT = 12


class RangeHalves:
    """One range's rows of the halves' noise matrix (module docstring, step 1), built and
    held in row blocks of about :data:`BLOCK_ENTRIES` stored counts, so that the range
    holds its rows of ``D'`` (at most one entry per stored count: ``D``'s support is within
    the counts') and one block's temporaries.

    Args:
        rows: the range (:class:`~posstats.geometry.ranged.SqrtRange`: its ``positions``,
            ``occupancy``, ``row_entries`` and
            :meth:`~posstats.geometry.ranged.SqrtRange.count_rows`).
        path: the counts file (or folder) whose window-groups file holds the halves.
        expected: the counts' (positions, vocabulary, tokens, fingerprint).
        row_bin: (n_r,) occupancy bin of each of the range's rows (over all the rows).
        bins: the number of bins.
    """

    def __init__(self, rows: Any, path: str, expected: tuple[int, int, int, str], row_bin: Any, bins: int) -> None:
        n_r = int(rows.shape[0])
        self.row_bin = np.asarray(row_bin, dtype=np.int64)
        if self.row_bin.shape != (n_r,):
            msg = f"row_bin must have shape ({n_r},); got {self.row_bin.shape}"
            raise ValueError(msg)
        self.vocab = int(rows.shape[1])
        occ = np.asarray(rows.occupancy, dtype=np.float64)
        self.coverage, self.rows_both = 1.0, 0
        self.have = self.target = np.zeros(int(bins) * self.vocab)
        self.blocks: list[tuple[int, int, Any]] = []  # (first row, stop row, D rows as CSR)
        for a, b in _row_blocks(np.asarray(rows.row_entries(), dtype=np.int64)):
            half_a, half_b = load_halves_rows(path, rows.positions[a:b], expected)
            held = np.asarray(half_a.sum(axis=1), dtype=np.float64).ravel() + np.asarray(half_b.sum(axis=1)).ravel()
            used = occ[a:b] > 0
            if used.any():
                self.coverage = min(self.coverage, float(np.min(held[used] / occ[a:b][used])))
            d, both = unscaled_noise(half_a, half_b)
            del half_a, half_b
            self.rows_both += int(np.count_nonzero(both))
            have, target = cell_sums(d, rows.count_rows(np.arange(a, b, dtype=np.int64)), self.row_bin[a:b], int(bins))
            self.have, self.target = self.have + have, self.target + target
            self.blocks.append((a, b, d))
        self._views: list[tuple[list[Any], list[Any]]] = []

    def sums(self) -> tuple[np.ndarray, np.ndarray, float, int]:
        """((bins V,) ``sum D^2``, (bins V,) the counts' unbiased variances, the halves'
        least share of a row's tokens, rows with tokens in both halves)."""
        return self.have, self.target, self.coverage, self.rows_both

    def rescale(self, scale: np.ndarray, /) -> None:
        """Scale the rows by the (bins V,) factors of all the ranges (step 2); ready for
        the products."""
        scale = np.asarray(scale, dtype=np.float64)
        for a, b, d in self.blocks:
            rescale_noise(d, self.row_bin[a:b], scale)
        self.have = self.target = None  # type: ignore[assignment]
        self._views = [(views, _transposed_views(views)) for views in
                       (_row_block_views(d, 1) for _, _, d in self.blocks)]

    def times(self, x: np.ndarray, /) -> np.ndarray:
        """``D_r X`` (n_r, b) for X (V, b)."""
        x = np.ascontiguousarray(x, dtype=np.float64)
        if not self._views:
            return np.zeros((0, x.shape[1]))
        return np.concatenate([blocks_times(views, x, self.vocab) for views, _ in self._views], axis=0)

    def t_times(self, y: np.ndarray, /) -> np.ndarray:
        """``D_r^T Y_r`` (V, b) for this range's rows Y_r (n_r, b)."""
        y = np.ascontiguousarray(y, dtype=np.float64)
        out = np.zeros((self.vocab, y.shape[1]))
        for (a, b, _), (_, views_t) in zip(self.blocks, self._views, strict=True):
            out += blocks_t_times(views_t, np.ascontiguousarray(y[a:b]), self.vocab)
        return out

    def release(self) -> None:
        """Drop the rows."""
        self.blocks, self._views = [], []


BLOCK_ENTRIES = 1 << 22  # stored counts of a range's rows built at a time (about 200 MB of temporaries)


def _row_blocks(entries: np.ndarray, /) -> list[tuple[int, int]]:
    """``[(a, b)]`` row blocks covering the rows, each of about :data:`BLOCK_ENTRIES`
    stored entries (one row above it goes alone).

    >>> _row_blocks(np.array([3, 3, 3])), _row_blocks(np.array([], dtype=np.int64))
    ([(0, 3)], [])
    """
    out, a, n = [], 0, int(entries.size)
    cum = np.cumsum(entries)
    while a < n:
        base = int(cum[a - 1]) if a else 0
        b = max(int(np.searchsorted(cum, base + BLOCK_ENTRIES, side="right")), a + 1)
        out.append((a, min(b, n)))
        a = min(b, n)
    return out


class RangedNoise:
    """``D'`` (m, V) whose rows the ranges hold (:class:`RangeHalves` behind a
    :class:`~posstats.geometry.ranged.RangeRunner`), with the products
    :func:`posstats.estimates.halves_edge.noise_top` takes (step 3)."""

    def __init__(self, runner: Any, sizes: Sequence[int], vocab: int, /) -> None:
        self.runner = runner
        self.edges = np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))])
        self.shape = (int(self.edges[-1]), int(vocab))

    def times(self, x: np.ndarray, /) -> np.ndarray:
        """``D' X`` (m, b): every range's rows in range order."""
        return np.concatenate(self.runner.call("times", [(x,)] * len(self.runner)), axis=0)

    def t_times(self, y: np.ndarray, /) -> np.ndarray:
        """``D'^T Y`` (V, b): the ranges' partial products summed."""
        e = self.edges
        parts = self.runner.call("t_times", [(y[e[r] : e[r + 1]],) for r in range(len(self.runner))])
        out = np.array(parts[0], dtype=np.float64)
        for part in parts[1:]:
            out += part
        return out


def ranged_halves_noise(start: Callable[[list[np.ndarray], int], Any], occupancy: Any, sizes: Sequence[int],
                        vocab: int, /, *, source: str = "window groups", min_coverage: float = 0.0) -> HalvesNoise:
    """:class:`~posstats.estimates.halves_edge.HalvesNoise` of the rows held apart (module
    docstring): ``start(row_bins, bins)`` starts a :class:`RangeHalves` on every range (each
    given its rows' occupancy bins) and returns their runner; ``occupancy`` (m,) the rows'
    occupancies in range order, ``sizes`` the ranges' row counts. No matrix (and the ranges'
    rows let go) when the halves hold less than ``min_coverage`` of some row's tokens."""
    row_bin = occupancy_bins(occupancy)
    edges = np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))])
    runner = start([row_bin[edges[r] : edges[r + 1]] for r in range(len(sizes))], int(row_bin.max()) + 1)
    sums = runner.call("sums")
    coverage = min(float(c) for _, _, c, _ in sums)
    rows = sum(int(b) for _, _, _, b in sums)
    if coverage < min_coverage:
        runner.release()
        return HalvesNoise(None, 0, coverage, source)
    have = np.sum([h for h, _, _, _ in sums], axis=0)
    target = np.sum([t for _, t, _, _ in sums], axis=0)
    del sums
    runner.call("rescale", [(noise_scale(have, target),)] * len(runner))
    return HalvesNoise(RangedNoise(runner, sizes, vocab), rows, coverage, source)


class LocalHalves(LocalRanges):
    """The :class:`RangeHalves` of ranges held in this process (their runner), with
    ``release`` letting them go."""

    def release(self) -> None:
        """Drop every range's rows of ``D'``."""
        for r in self.ranges:
            r.release()


def local_halves(ranges: Sequence[Any], path: str, expected: tuple[int, int, int, str], /
                 ) -> Callable[[list[np.ndarray], int], LocalHalves]:
    """``start(row_bins, bins)`` for :func:`ranged_halves_noise` over ranges held in this
    process (:class:`~posstats.geometry.ranged.SqrtRange` s): a :class:`RangeHalves` each."""
    def start(row_bins: list[np.ndarray], bins: int) -> LocalHalves:
        return LocalHalves([RangeHalves(r, path, expected, rb, bins) for r, rb in zip(ranges, row_bins, strict=True)])

    return start
