"""The pair-sample jackknife's replicates over position ranges held apart (issue #31).

:func:`posstats.estimates.pair_jackknife.pair_replicates` splits the tokens of the pairs'
rows into K random groups and recomputes the pairs' distances K times, each time without
one group. It holds those rows' counts in one process: at 1 B tokens and n = 131,072 the
pairs touch most rows, several GB. Here the rows stay where they are, in the ranges of
:mod:`posstats.geometry.ranged` (in this process or in Ray actors, ``jobs.ranges``):

- each range splits the tokens of *its own* rows into the K groups once
  (:class:`RangeReplicates`: the multinomial split of
  :func:`~posstats.estimates.pair_jackknife.token_groups`, a group label of one byte per
  count of 1, the rest drawn group by group), seeded by ``(seed, first position)``, and
  keeps only that split (about 1 byte a stored count, 8 more for each count above 1);
- replicate g: every range recovers its rows' counts from the square roots
  (``C = rint(occ s^2)``, exact), removes group g, and gives the per-position bias of
  what is left (:func:`~posstats.estimates.sampling_variance.position_sampling_variance`)
  and the dot products ``<s_i, s_j>`` of the left-over square roots: pairs inside a range
  there, pairs across two by moving one side's rows in rounds
  (:func:`posstats.geometry.ranged.pair_dots`), as the corpus' own pair distances do.

The replicates are those of the in-process jackknife with another draw of the same split
(the split is the range's, not the touched rows'): the same law, not the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp

from posstats.geometry.ranged import LocalRanges, RangeRunner, SqrtRange, pair_difference_sq, pair_dots

from .jackknife import JACKKNIFE_GROUPS
from .occupancy import OccupancyShrinkage, ShrinkageFeatures
from .pair_jackknife import _binomial
from .sampled import SampledGeometry, pair_chunks
from .sampling_variance import position_sampling_variance

__all__ = ["RangeReplicates", "local_replicates", "ranged_pair_replicates"]

_CHUNK = 1 << 22  # stored counts handled at a time (a few int64 / float64 temporaries of 32 MiB)


def _entries_of(indptr: np.ndarray, local: np.ndarray, /) -> tuple[np.ndarray, np.ndarray]:
    """The stored-entry indices of the CSR rows ``local`` (in that order) and the rows'
    lengths: ``((sum lengths,) int64, (len(local),) int64)``."""
    starts = indptr[local].astype(np.int64)
    lengths = indptr[local + 1].astype(np.int64) - starts
    total = int(lengths.sum())
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return offsets + np.arange(total, dtype=np.int64), lengths


class RangeReplicates:
    """One range's delete-a-group replicates: its rows' tokens split into ``groups`` random
    groups (module docstring), and, for the current replicate (:meth:`next_group`), the
    rows without that group.

    Args:
        rows: the range (:class:`posstats.geometry.ranged.SqrtRange`: square roots and
            occupancies; the counts are recovered from them).
        groups: K >= 2.
        seed: seeds the split, with the range's first position.

    The methods :meth:`row_dots`, :meth:`rows`, :meth:`dots_with`, :meth:`count_rows` and
    :meth:`row_entries` are those :func:`posstats.geometry.ranged.pair_dots` and
    :func:`~posstats.geometry.ranged.pair_difference_sq` call, for the current replicate.
    """

    def __init__(self, rows: SqrtRange, /, *, groups: int = JACKKNIFE_GROUPS, seed: int = 0) -> None:
        if groups < 2:
            msg = f"a delete-a-group jackknife needs at least 2 groups, got {groups}"
            raise ValueError(msg)
        self.range = rows
        self.groups = int(groups)
        self.group = -1  # no replicate yet
        first = int(rows.positions[0]) if rows.shape[0] else 0
        self.rng = np.random.default_rng(np.random.SeedSequence([int(seed), 13, first]))
        s = rows.s
        nnz = int(s.nnz)
        self.labels = np.full(nnz, -1, dtype=np.int8)  # a count of 1: its group; -1: a larger count
        multi, rest = [], []
        indptr = s.indptr
        row = 0
        while row < rows.shape[0]:  # rows in blocks of about _CHUNK stored counts
            stop = min(max(int(np.searchsorted(indptr, int(indptr[row]) + _CHUNK, side="right")) - 1, row + 1),
                       rows.shape[0])
            a, b = int(indptr[row]), int(indptr[stop])
            counts = self._counts(np.arange(a, b, dtype=np.int64), np.diff(indptr[row : stop + 1]),
                                  np.arange(row, stop))
            single = np.flatnonzero(counts == 1)
            self.labels[a + single] = self.rng.integers(0, self.groups, size=single.size, dtype=np.int8)
            big = np.flatnonzero(counts > 1)
            multi.append((a + big).astype(np.int64))
            rest.append(counts[big])
            row = stop
        self.multi = np.concatenate(multi) if multi else np.zeros(0, dtype=np.int64)  # ascending entry indices
        self.rest = np.concatenate(rest) if rest else np.zeros(0, dtype=np.int64)  # what no group took yet
        self.part = np.zeros_like(self.rest)  # the current group's share of each larger count

    def _counts(self, entries: np.ndarray, lengths: np.ndarray, local: np.ndarray, /) -> np.ndarray:
        """(e,) int64 counts ``rint(occ_i s_iv^2)`` of the stored ``entries`` of the rows
        ``local`` (whose lengths are ``lengths``)."""
        data = self.range.s.data[entries]
        return np.rint(data * data * np.repeat(self.range.occupancy[local], lengths)).astype(np.int64)

    def next_group(self) -> int:
        """Draw the next group (the multinomial split's group g: ``Binomial(rest, 1 / (K - g))``
        of each larger count) and make it the current replicate's; returns g."""
        if self.group + 1 >= self.groups:
            msg = f"all {self.groups} groups are drawn"
            raise ValueError(msg)
        self.group += 1
        self.part = _binomial(self.rest, 1.0 / (self.groups - self.group), self.rng)
        self.rest -= self.part
        return self.group

    def _kept(self, local: np.ndarray, /) -> sp.csr_array:
        """(len(local), V) int64 counts of the rows ``local`` without the current group
        (explicit zeros kept: the counts' own pattern)."""
        if self.group < 0:
            msg = "no replicate yet: call next_group() first"
            raise ValueError(msg)
        local = np.asarray(local, dtype=np.int64)
        entries, lengths = _entries_of(self.range.s.indptr, local)
        counts = self._counts(entries, lengths, local)
        label = self.labels[entries]
        removed = (label == self.group).astype(np.int64)
        larger = np.flatnonzero(label < 0)
        removed[larger] = self.part[np.searchsorted(self.multi, entries[larger])]
        indptr = np.concatenate([[0], np.cumsum(lengths)])
        out = sp.csr_array((counts - removed, self.range.s.indices[entries], indptr),
                           shape=(local.size, self.range.shape[1]))
        out.has_canonical_format = True
        return out

    def _kept_sqrt(self, local: np.ndarray, /) -> sp.csr_array:
        """:meth:`_kept` as square-root distributions ``sqrt(C' / occ')`` (a row left empty
        by the group: zeros)."""
        kept = self._kept(local)
        lengths = np.diff(kept.indptr)
        occ = np.bincount(np.repeat(np.arange(kept.shape[0]), lengths), weights=kept.data,
                          minlength=kept.shape[0]).astype(np.float64)
        scale = np.repeat(np.divide(1.0, occ, out=np.zeros_like(occ), where=occ > 0), lengths)
        out = sp.csr_array((np.sqrt(kept.data * scale), kept.indices, kept.indptr), shape=kept.shape)
        out.has_canonical_format = True
        return out

    def bias(self) -> np.ndarray:
        """(n_r,) per-position bias ``b_i`` of the current replicate's rows
        (:func:`~posstats.estimates.sampling_variance.position_sampling_variance`), a block of
        rows at a time."""
        indptr = self.range.s.indptr
        n_r = self.range.shape[0]
        out = np.zeros(n_r, dtype=np.float64)
        row = 0
        while row < n_r:
            stop = min(max(int(np.searchsorted(indptr, int(indptr[row]) + _CHUNK, side="right")) - 1, row + 1), n_r)
            out[row:stop] = position_sampling_variance(self._kept(np.arange(row, stop)))
            row = stop
        return out

    def _row_blocks(self) -> Any:
        """``(row, stop)`` blocks of about ``_CHUNK`` stored counts covering the range's rows."""
        indptr = self.range.s.indptr
        n_r = self.range.shape[0]
        row = 0
        while row < n_r:
            stop = min(max(int(np.searchsorted(indptr, int(indptr[row]) + _CHUNK, side="right")) - 1, row + 1), n_r)
            yield row, stop
            row = stop

    def kept_totals(self) -> tuple[np.ndarray, np.ndarray]:
        """``((n_r,) occupancies, (V,) tokens per vocabulary entry)`` of the current
        replicate's rows: what its occupancy shrinkage is built from
        (:class:`~posstats.estimates.occupancy.OccupancyShrinkage`)."""
        occ = np.zeros(self.range.shape[0], dtype=np.float64)
        totals = np.zeros(self.range.shape[1], dtype=np.float64)
        for row, stop in self._row_blocks():
            kept = self._kept(np.arange(row, stop))
            occ[row:stop] = np.asarray(kept.sum(axis=1), dtype=np.float64).ravel()
            totals += np.asarray(kept.sum(axis=0), dtype=np.float64).ravel()
        return occ, totals

    def shrinkage_dots(self, shrinkage: np.ndarray, /) -> np.ndarray:
        """(n_r, K) ``<s'_i, U_k>`` of the current replicate's square-root rows with the
        (K, V) ``shrinkage`` (:meth:`posstats.estimates.occupancy.OccupancyShrinkage.features`)."""
        out = np.zeros((self.range.shape[0], shrinkage.shape[0]), dtype=np.float64)
        for row, stop in self._row_blocks():
            out[row:stop] = np.asarray(self._kept_sqrt(np.arange(row, stop)) @ shrinkage.T)
        return out

    def group_count(self) -> int:
        """K."""
        return self.groups

    def row_entries(self) -> np.ndarray:
        """(n_r,) stored entries of every row (the counts' pattern)."""
        return self.range.row_entries()

    def rows(self, local: np.ndarray, /) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(data, indices, indptr)`` of the current replicate's square-root rows ``local``."""
        sub = self._kept_sqrt(local)
        return sub.data, sub.indices, sub.indptr

    def count_rows(self, local: np.ndarray, /) -> sp.csr_array:
        """(len(local), V) int64 counts of the current replicate's rows ``local``."""
        return self._kept(local)

    def row_dots(self, i: np.ndarray, j: np.ndarray, /) -> np.ndarray:
        """(p,) ``<s'_i, s'_j>`` of pairs of this range's rows (local) in the current replicate."""
        i = np.asarray(i, dtype=np.int64)
        j = np.asarray(j, dtype=np.int64)
        out = np.empty(i.size, dtype=np.float64)
        entries = self.row_entries()
        for a, b in pair_chunks(entries[i] + entries[j], _CHUNK, i.size):
            rows, inverse = np.unique(np.concatenate([i[a:b], j[a:b]]), return_inverse=True)
            s = self._kept_sqrt(rows)
            out[a:b] = np.asarray(s[inverse[: b - a]].multiply(s[inverse[b - a :]]).sum(axis=1)).ravel()
        return out

    def dots_with(self, i: np.ndarray, data: np.ndarray, indices: np.ndarray, indptr: np.ndarray,
                  j: np.ndarray, /) -> np.ndarray:
        """(p,) ``<s'_i, t_j>``: this range's rows ``i`` (local) in the current replicate with
        rows ``j`` of the rows ``t`` another range gave (:meth:`rows`)."""
        i = np.asarray(i, dtype=np.int64)
        j = np.asarray(j, dtype=np.int64)
        t = sp.csr_array((data, indices, indptr), shape=(int(np.asarray(indptr).size - 1), self.range.shape[1]))
        out = np.empty(i.size, dtype=np.float64)
        for a, b in pair_chunks(self.row_entries()[i], _CHUNK, i.size):
            rows, inverse = np.unique(i[a:b], return_inverse=True)
            s = self._kept_sqrt(rows)
            out[a:b] = np.asarray(s[inverse].multiply(t[j[a:b]]).sum(axis=1)).ravel()
        return out


def local_replicates(ranges: LocalRanges, /, *, groups: int = JACKKNIFE_GROUPS, seed: int = 0) -> LocalRanges:
    """The :class:`RangeReplicates` of ranges held in this process (a runner for
    :func:`ranged_pair_replicates`)."""
    return LocalRanges([RangeReplicates(r, groups=groups, seed=seed) for r in ranges.ranges])


class _ReplicateRows:
    """The current replicate's square-root rows over the ranges, as
    :class:`~posstats.estimates.sampled.SampledGeometry` reads a ranged operator."""

    def __init__(self, ranges: RangeRunner, edges: np.ndarray, entries: np.ndarray, vocab: int) -> None:
        self.ranges, self.edges, self.entries = ranges, edges, entries
        self.shape = (int(edges[-1]), int(vocab))

    def row_entries(self) -> np.ndarray:
        return self.entries

    def row_dots(self, i: np.ndarray, j: np.ndarray, /) -> np.ndarray:
        return pair_dots(self.ranges, self.edges, i, j)

    def difference_sq(self, i: np.ndarray, j: np.ndarray, /) -> np.ndarray:
        return pair_difference_sq(self.ranges, self.edges, i, j)


def ranged_pair_replicates(
    ranges: RangeRunner,
    i: np.ndarray,
    j: np.ndarray,
    statistic: Callable[[np.ndarray], Mapping[Any, float]],
    /,
    *,
    corrected: bool,
    vocab: int,
    progress: Callable[[int], None] | None = None,
    occupancy: bool = False,
) -> dict[Any, np.ndarray]:
    """:func:`posstats.estimates.pair_jackknife.pair_replicates` over ranges held apart
    (``occupancy``: with ``corrected``, each replicate's square roots' occupancy shrinkage
    removed first, built from its kept totals: :meth:`RangeReplicates.kept_totals`).

    Args:
        ranges: a runner over every range's :class:`RangeReplicates`, none drawn yet
            (:func:`local_replicates`, or the Ray actors' ``jobs.ranges``); K is theirs.
        i, j: (P,) the pairs, row indices in the ranges' row order.
        statistic: maps the (P,) distances ``d_H`` of one replicate to named values.
        corrected: distances bias-corrected by each replicate's own ``b``.
        vocab: V.
        progress: called with 1 after each replicate.

    Returns:
        ``{name: (K,) replicate values}``.
    """
    entries = [np.asarray(x, dtype=np.int64) for x in ranges.call("row_entries")]
    edges = np.concatenate([[0], np.cumsum([x.size for x in entries])]).astype(np.int64)
    rows = _ReplicateRows(ranges, edges, np.concatenate(entries), vocab)
    out: dict[Any, list[float]] = {}
    for _ in range(_groups(ranges)):
        ranges.call("next_group")
        bias = np.concatenate(ranges.call("bias")) if corrected else None
        features = _replicate_shrinkage(ranges) if corrected and occupancy else None
        h = SampledGeometry(None, sqrt=rows, bias=bias, shrinkage=features).distances(i, j)
        for name, value in statistic(h).items():
            out.setdefault(name, []).append(float(value))
        if progress is not None:
            progress(1)
    return {name: np.asarray(v) for name, v in out.items()}


def _replicate_shrinkage(ranges: RangeRunner, /) -> ShrinkageFeatures | None:
    """The current replicate's occupancy-shrinkage features over the ranges (None: equal
    occupancies): its shrinkage from the ranges' kept totals, the dots with it from each."""
    parts = ranges.call("kept_totals")
    occ = np.concatenate([o for o, _ in parts])
    shrinkage = OccupancyShrinkage.from_totals(occ, np.sum([t for _, t in parts], axis=0))
    if shrinkage is None:
        return None
    dots = np.concatenate(ranges.call("shrinkage_dots", [(shrinkage.shrinkage,)] * len(parts)))
    return ShrinkageFeatures(dots, shrinkage.weights(occ), shrinkage.gram)


def _groups(ranges: RangeRunner, /) -> int:
    """K, the ranges' number of groups (they agree: one call)."""
    found = {int(k) for k in ranges.call("group_count")}
    if len(found) != 1:
        msg = f"the ranges disagree on the number of jackknife groups: {sorted(found)}"
        raise ValueError(msg)
    return found.pop()
