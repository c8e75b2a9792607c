"""Counts by window group: what a homogeneity null that respects windows needs.

In ``pack`` mode a corpus is one stream cut into windows of n tokens, and nearby tokens of
a window are dependent (consecutive text). The counts ``C[i, v]`` keep no windows, so a
null built from them alone (the permutation null, :mod:`posstats.estimates.permutation`)
treats a window's tokens as independent. Counting the windows in ``K`` groups keeps enough
of them: window ``w`` (0-based, in stream order, over every stream of the count) goes to
group ``floor(w / B) mod K``, blocks of B consecutive windows (B: the expected windows
over K, :func:`posstats.corpus.count_step.window_block`, so that a group is about one
stretch of the stream), and group ``g`` holds its own counts ``C^g`` (n, V).

Rotating a group's rows by an offset s, ``roll(C^g, s)``, puts the token at stream offset t
of its blocks at position ``(t + s) mod n``: exactly the counts of those stretches of
stream cut into windows s tokens later. Every pair of consecutive tokens inside a block
stays consecutive; only the joins between blocks are cut
(:mod:`posstats.estimates.rotation`).

A window cut short (the end of a pack-mode stream, or a document's last window in
``chunk`` mode, or a document shorter than n in ``truncate`` mode: L < n tokens at positions
0 .. L-1) cannot be rotated by n without moving tokens to positions it does not reach. In
chunk and truncate mode such windows are counted by their length, in *length classes*:
class L holds the windows of exactly L tokens, and a rotation turns it by its own offset
modulo L, which keeps every position's occupancy (the class fills positions 0 .. L-1 in
each of its windows). Other short windows (a pack-mode stream's last) go to a last block of
rows, the *tail*, which no rotation moves. In ``chunk``
mode the full windows of consecutive documents form the blocks; a block then spans a few
document boundaries, which a rotation treats as stream (the null: positions of a document
are not special, its first included). In ``truncate`` mode a window is a document's first n
tokens: the full ones go to group ``w mod K`` (blocks of one window: no two are consecutive
text), shorter documents to the tail. ``sum_g C^g + tail`` is the corpus' counts
(:meth:`WindowGroups.total`).

Above 4,096 positions, where no rotation null runs by default, a count keeps only the
*halves*: two groups, the even and the odd blocks (``halves_only``), each window in the
group of its order whatever its length (no length classes), for the rank test's edge
measured on independent halves (:mod:`posstats.estimates.halves_edge`). Such groups are
never rotated: a short window in a group would be turned past its end.

The *short halves* (``short_halves``; counts made since the fifty-second session, up to 4,096
positions): the windows outside the groups (the tail and the length classes, mostly whole
documents shorter than n in ``truncate`` mode) are also counted every other one, in order,
in one more block of rows: the odd ones. :meth:`WindowGroups.halves` then puts the even ones
in the even half and the odd ones in the odd half, so the halves hold every token and each
short window stays whole in one of them (the edge measured on independent halves needs
them where most documents are shorter than the context: docs/calibration.md). That block
is a copy, never rotated and never part of the corpus' counts.

Storage: one ((K + 1 + C + S) n, V) int64 CSR matrix, rows ``g n + i`` (group g, position i),
the tail's rows ``K n + i``, with length classes (C = n - 1; 0 in pack mode and in
files written before them) class L's rows ``(K + L) n + i`` for i < L and, with the short
halves (S = 1; else 0), the odd short windows' rows ``(K + 1 + C) n + i``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from posstats.counting.blocks import CountBlocks
from posstats.counting.csr_views import csr_rows_view
from posstats.counting.scipy_sparse import sp
from posstats.counting.sorted_keys import SortedKeyCounter, block_positions

__all__ = ["DEFAULT_WINDOW_GROUPS", "WindowGroupCounter", "WindowGroups"]

DEFAULT_WINDOW_GROUPS = 64  # groups rotated apart; about the power of one per window (docs/calibration.md)
_BLOCK_CELLS = 1 << 19  # cells of one dense block of a rotated corpus (4 MiB as int64: in cache)
_BUFFER_KEYS = 1 << 26  # token ids buffered before they are sorted into the held counts (128 MiB as uint16)


@dataclass(frozen=True)
class WindowGroups:
    """Counts by window group (module docstring).

    Attributes:
        groups: K.
        positions: n.
        matrix: ((K + 1 + classes + short_halves) n, V) int64 CSR: rows ``g n + i`` count
            position i of the full windows of group g; rows ``K n + i`` the short windows no
            rotation moves (the tail); rows ``(K + L) n + i`` (i < L) those of exactly L
            tokens; with ``short_halves``, rows ``(K + 1 + C) n + i`` every other window of
            the tail and the length classes (the odd ones, a copy).
        windows: full windows counted (over all groups).
        classes: C, the length classes stored (n - 1, or 0: none).
        halves_only: the two halves of the corpus (module docstring): every window,
            short ones included, in the group of its order; for
            :meth:`halves`, never to be rotated.
        short_halves: the odd short windows are stored too (module docstring), so that
            :meth:`halves` holds every token.
    """

    groups: int
    positions: int
    matrix: sp.csr_array
    windows: int
    classes: int = 0
    halves_only: bool = False
    short_halves: bool = False

    @property
    def counted_rows(self) -> int:
        """(K + 1 + C) n: the rows whose sum is the corpus' counts (the short halves'
        block, a copy, follows them)."""
        return (self.groups + 1 + self.classes) * self.positions

    def _counted(self) -> sp.csr_array:
        """The counted rows of :attr:`matrix` (a view: no copy of the entries)."""
        if not self.short_halves:
            return self.matrix
        return csr_rows_view(self.matrix, 0, self.counted_rows)

    @property
    def periods(self) -> np.ndarray:
        """(K + C,) int64: the period of each rotation, n for a group and L for class L;
        :meth:`rotated` takes one offset in ``[0, period)`` for each."""
        return np.concatenate([np.full(self.groups, self.positions, dtype=np.int64),
                               np.arange(1, self.classes + 1, dtype=np.int64)])

    def draw_shifts(self, rng: np.random.Generator, /) -> np.ndarray:
        """(K + C,) offsets of one rotated corpus: the groups' K uniform on ``[0, n)`` drawn
        first (the draws of the rotation null before length classes), then each class L's
        uniform on ``[0, L)``."""
        shifts = rng.integers(0, self.positions, self.groups)
        if not self.classes:
            return shifts
        return np.concatenate([shifts, rng.integers(0, np.arange(1, self.classes + 1))])

    @functools.cached_property
    def occupancy(self) -> np.ndarray:
        """(n,) float64 tokens at each position of the corpus (every rotation keeps them)."""
        k, c, n = self.groups, self.classes, self.positions
        return np.asarray(self._counted().sum(axis=1)).ravel().reshape(k + 1 + c, n).sum(axis=0).astype(np.float64)

    @functools.cached_property
    def pooled(self) -> np.ndarray:
        """(V,) float64 tokens of each vocabulary entry (every rotation keeps them)."""
        return np.asarray(self._counted().sum(axis=0), dtype=np.float64).ravel()

    @property
    def vocab_size(self) -> int:
        """V."""
        return int(self.matrix.shape[1])

    def rotated_share(self) -> float:
        """The share of the tokens a rotation moves (in the groups and the length classes;
        the tail's stay), 0 for an empty corpus."""
        m, n, k = self.matrix, self.positions, self.groups
        total = float(m.data[: m.indptr[self.counted_rows]].sum())
        tail = float(m.data[m.indptr[k * n]: m.indptr[(k + 1) * n]].sum())
        return (total - tail) / total if total else 0.0

    def total(self) -> sp.csr_array:
        """(n, V) int64 CSR: the corpus' counts, ``sum_g C^g + tail + sum_L T^L``."""
        return self.rotated(np.zeros(self.groups + self.classes, dtype=np.int64))

    def halves(self, rows: Any = None, /) -> tuple[sp.csr_array, sp.csr_array]:
        """((m, V), (m, V)) CSR: the counts of the even groups and of the odd groups at
        ``rows`` (positions; None: all n). Consecutive windows fall in one group, so tokens
        that depend on each other stay in one half; the tail and the length classes are in
        neither (:mod:`posstats.estimates.halves_edge` rescales the halves' noise), unless
        the short halves are stored: then their even windows join the even half and their
        odd ones the odd half, and the two halves add up to the corpus. Each
        half is a pairwise (tree) sum of its groups' row blocks: every stored entry is merged
        about log2(K / 2) times, and no more than two levels are held at once; with one group
        a half (counts above 4,096 positions keep only the halves) each half is a view of
        the groups' storage (:func:`posstats.counting.csr_views.csr_rows_view`): read it, do not
        write to it."""
        n = self.positions
        pick = None if rows is None else np.asarray(rows, dtype=np.int64)
        halves = []
        for first in (0, 1):
            level = []
            for g in range(first, self.groups, 2):
                block = csr_rows_view(self.matrix, g * n, (g + 1) * n)  # no copy of the group's entries
                level.append(block if pick is None else sp.csr_array(block[pick]))
            if not level:
                level = [sp.csr_array((n if pick is None else pick.size, self.vocab_size), dtype=self.matrix.dtype)]
            while len(level) > 1:
                level = [level[k] + level[k + 1] if k + 1 < len(level) else level[k] for k in range(0, len(level), 2)]
            halves.append(level[0])
        if self.short_halves:
            odd = csr_rows_view(self.matrix, self.counted_rows, self.counted_rows + n)
            odd = sp.csr_array(odd if pick is None else odd[pick])
            even = self._short_windows(pick) - odd
            even.eliminate_zeros()
            halves = [halves[0] + even, halves[1] + odd]
        return halves[0], halves[1]

    def _short_windows(self, pick: np.ndarray | None, /) -> sp.csr_array:
        """((m, V)) int64 CSR: the tail's and every length class's counts at the positions
        ``pick`` (None: all n), summed (the rows ``K n + i`` .. ``(K + C) n + i``)."""
        n, k = self.positions, self.groups
        rest = csr_rows_view(self.matrix, k * n, self.counted_rows).tocoo()
        summed = sp.csr_array((rest.data, (rest.row % n, rest.col)), shape=(n, self.vocab_size))
        summed.sum_duplicates()
        return summed if pick is None else sp.csr_array(summed[pick])

    def checked_shifts(self, shifts: Any, /) -> np.ndarray:
        """``shifts`` as (K + C,) int64 (:attr:`periods`), or a one-line ValueError."""
        shifts = np.asarray(shifts, dtype=np.int64)
        want = self.groups + self.classes
        if shifts.shape != (want,):
            msg = f"rotated() needs one shift per group and length class, {want}; got shape {shifts.shape}"
            raise ValueError(msg)
        return shifts

    def rotated_blocks(self, shifts: Any, /, *, cells: int = _BLOCK_CELLS) -> Iterator[tuple[int, int, np.ndarray]]:
        """The rotated corpus of :meth:`rotated`, a block of rows at a time: yields ``(a, b,
        block)`` with ``block`` the (b - a, V) int64 counts of rows ``a .. b - 1``, blocks
        of about ``cells`` cells (at least one row) covering rows 0 .. n - 1 in order. Each
        block is written into one buffer, which the next overwrites: copy what you keep.

        Output row t of a block sums, over every group and length class (and the tail,
        which stays), the stored row that lands on it: row ``(t - s) mod P`` of a part
        turned by s with period P, for each part whose period exceeds t (class L reaches
        rows 0 .. L-1 only). Those stored rows are gathered target by target in one row
        selection of the storage (compiled: the rows' entries are copied whole), and the
        block is that selection read as a CSR matrix of b - a rows with repeated columns,
        made dense with the repeats added: one copy of each stored entry per corpus, memory
        one block and its selection (about ``cells`` entries at the corpora of
        docs/benchmarks.md). Blocks of 2**19 cells (4 MiB) keep the additions in cache:
        1.4 s a corpus at n = 4,096 with 1.6e8 stored counts, against 2.9 s for a
        ``bincount`` of 32 MiB blocks (the code before)."""
        parts, period, shift = self._parts(self.checked_shifts(shifts))
        n, vocab, m = self.positions, self.vocab_size, self.matrix
        step = max(1, int(cells) // max(vocab, 1))
        buffer = np.empty((min(step, n), vocab), dtype=m.dtype)
        for a in range(0, n, step):
            b = min(n, a + step)
            target = np.arange(a, b, dtype=np.int64)[:, None]
            lands = target < period  # (b - a, parts): which parts reach each target row
            source = parts * n + (target - shift) % period  # the stored row landing on it
            selected = m[source[lands]]
            bounds = selected.indptr[np.r_[0, np.cumsum(lands.sum(axis=1))]]
            with_repeats = sp.csr_array((selected.data, selected.indices, bounds), shape=(b - a, vocab))
            yield a, b, with_repeats.toarray(out=buffer[:b - a])

    @functools.cached_property
    def _held_classes(self) -> np.ndarray:
        """(C',) int64: the lengths L of the length classes that hold a window."""
        k, c, n = self.groups, self.classes, self.positions
        stored = np.diff(self.matrix.indptr[: self.counted_rows + 1]).reshape(k + 1 + c, n)
        return np.flatnonzero(stored[k + 1:].any(axis=1)) + 1

    def _parts(self, shifts: np.ndarray, /) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """((P,), (P,), (P,)) int64: the stored blocks of rows a rotation turns (the groups,
        the tail, the length classes that hold a window), each one's period (n for a group
        and the tail, L for class L) and offset (0 for the tail)."""
        k, n, lengths = self.groups, self.positions, self._held_classes
        parts = np.concatenate([np.arange(k + 1), k + lengths])
        period = np.concatenate([np.full(k + 1, n), lengths])
        shift = np.concatenate([shifts[:k], [0], shifts[k + lengths - 1]])
        return parts.astype(np.int64), period.astype(np.int64), shift.astype(np.int64)

    def rotated(self, shifts: Any, /) -> sp.csr_array:
        """(n, V) int64 CSR ``sum_g roll(C^g, s_g) + tail + sum_L roll_L(T^L, s_L)``: group g's
        row i moved to row ``(i + s_g) mod n``, class L's to ``(i + s_L) mod L``; the tail
        stays (``shifts``: (K + C,) integers, :attr:`periods`). Formed from
        :meth:`rotated_blocks`: memory the result and one block."""
        vocab = self.vocab_size
        indptr, indices, data = [np.zeros(1, dtype=np.int64)], [], []
        for a, b, block in self.rotated_blocks(shifts):
            flat = block.reshape(-1)
            nz = np.flatnonzero(flat)
            row, col = np.divmod(nz, vocab)
            indices.append(col.astype(np.int32 if vocab < 2**31 else np.int64))
            data.append(flat[nz])
            indptr.append(indptr[-1][-1] + np.cumsum(np.bincount(row, minlength=b - a)))
        pointers = np.concatenate(indptr)
        if pointers[-1] < 2**31 and vocab < 2**31:  # int32 indices stay int32 (scipy widens both to the wider)
            pointers = pointers.astype(np.int32)
        return sp.csr_array((np.concatenate(data), np.concatenate(indices), pointers), shape=(self.positions, vocab))


class WindowGroupCounter:
    """Counts the windows of a corpus by group (module docstring).

    Fed by :class:`~posstats.counting.counts.CountAccumulator` with the windows it cuts,
    so both count the same tokens at the same positions: in pack mode :meth:`add_windows`
    once a batch and :meth:`end_stream` when a stream ends (the window left open is the
    tail's); in chunk and truncate mode :meth:`add_complete_windows`, whose short windows
    go to their length classes with ``classes=True``. The counting is the accumulator's
    sorting kernel (:class:`~posstats.counting.sorted_keys.SortedKeyCounter`) over
    ``K + 1 (+ n - 1)`` stacked copies of the positions, each padded to whole position
    blocks: 2 bytes a token buffered (V < 2**16), 4-12 bytes a non-zero.
    """

    def __init__(self, positions: int, vocab_size: int, /, *, groups: int = DEFAULT_WINDOW_GROUPS,
                 block: int = 1, buffer_keys: int = _BUFFER_KEYS, classes: bool = False,
                 halves_only: bool = False, short_halves: bool = False) -> None:
        if groups < 1 or block < 1:
            msg = f"window groups and their block must be >= 1, got {groups} and {block}"
            raise ValueError(msg)
        self.positions, self.vocab_size, self.groups = int(positions), int(vocab_size), int(groups)
        self.halves_only = bool(halves_only)
        self.classes = self.positions - 1 if classes and not self.halves_only else 0
        self.short_halves = bool(short_halves) and not self.halves_only
        self.block = int(block)
        self.windows = 0  # full windows committed
        self._seen = 0  # windows of any length given to add_complete_windows (halves_only: their order)
        self._short = 0  # windows committed to the tail or a length class (short_halves: their order)
        width = block_positions(self.positions, self.vocab_size)
        self._blocks = -(-self.positions // width)  # position blocks of one group
        self._padded = self._blocks * width
        self._stored = self.groups + 1 + self.classes + int(self.short_halves)  # blocks of rows
        self._sorted = SortedKeyCounter(positions=self._stored * self._padded,
                                        vocab_size=self.vocab_size, buffer_keys=buffer_keys, block=width)
        self._pad = int(np.iinfo(self._sorted.token_dtype).max)
        self._open = np.full(self._padded, self._pad, dtype=self._sorted.token_dtype)  # the window still open
        self._open_len = 0

    def add_windows(self, values: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                    head: tuple[int, int] | None, /) -> None:
        """One batch's windows as the accumulator cut them: window k holds
        ``values[starts[k] + j]`` at position j < ``lengths[k]``; ``head = (phase, skip)``
        continues the open window at positions ``phase ..`` with ``values[:skip]``. Only
        the last window may be short (it stays open)."""
        n = self.positions
        if head is not None:
            phase, skip = head
            if phase != self._open_len:
                msg = f"window groups: a batch continues position {phase} of a window open at {self._open_len}"
                raise ValueError(msg)
            self._open[phase:phase + skip] = values[:skip]
            self._open_len += skip
            if self._open_len == n:
                self._commit(self._open[None, :].copy(), (self.windows // self.block) % self.groups)
                self.windows += 1
                self._open[:] = self._pad
                self._open_len = 0
        starts, lengths = np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
        full = lengths == n
        k = int(np.count_nonzero(full))
        if k and not full[:k].all():
            msg = "window groups: a short window before a full one"
            raise ValueError(msg)
        if k:
            values = values.astype(self._sorted.token_dtype, copy=False)
            group = ((self.windows + np.arange(k, dtype=np.int64)) // self.block) % self.groups
            cuts = np.flatnonzero(np.diff(group)) + 1  # consecutive windows share a group
            for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, k]):
                self._commit_full(values, starts[lo:hi], int(group[lo]))
            self.windows += k
        if k < lengths.size:
            if k != lengths.size - 1 or self._open_len:
                msg = "window groups: more than one window left open"
                raise ValueError(msg)
            length = int(lengths[-1])
            self._open[:length] = values[starts[-1]:starts[-1] + length]
            self._open_len = length

    def add_complete_windows(self, values: np.ndarray, starts: np.ndarray, lengths: np.ndarray, /) -> None:
        """One batch's windows in ``chunk`` or ``truncate`` mode, each complete (window k
        holds ``values[starts[k] + j]`` at position j < ``lengths[k]``): the full ones go to
        their groups in order, the short ones (a document's last window, or a document
        shorter than n) to their length classes (``classes``; else to the tail)."""
        n = self.positions
        starts, lengths = np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
        if self.halves_only:
            self._add_by_order(values, starts, lengths)
            return
        full = lengths == n
        if full.any():
            self.add_windows(values, starts[full], lengths[full], None)
        short = ~full & (lengths > 0)
        if not short.any():
            return
        short_starts, short_lengths = starts[short], lengths[short]
        self._commit_odd_short(values, short_starts, short_lengths)
        width = self._sorted.block
        if not self.classes:
            columns = -(-int(short_lengths.max()) // width) * width  # the blocks the longest reaches
            self._commit(self._short_rows(values, short_starts, short_lengths, columns=columns), self.groups,
                         length=min(columns, n))
            return
        order = np.argsort(short_lengths, kind="stable")
        short_starts, short_lengths = short_starts[order], short_lengths[order]
        cuts = np.flatnonzero(np.diff(short_lengths)) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, short_lengths.size]):
            length = int(short_lengths[lo])
            columns = -(-length // width) * width  # a class's windows reach only its first blocks
            rows = self._short_rows(values, short_starts[lo:hi], short_lengths[lo:hi], columns=columns)
            self._commit(rows, self.groups + length, length=length)

    def _add_by_order(self, values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
        """``halves_only``: window w of the corpus (any length) goes to group ``floor(w /
        block) mod K``; each group's windows are committed by how many position blocks they
        reach, so a short window costs its own length, not n."""
        order = self._seen + np.arange(lengths.size, dtype=np.int64)
        self._seen += lengths.size
        self.windows += int(np.count_nonzero(lengths == self.positions))
        width = self._sorted.block
        reach = -(-lengths // width)  # position blocks each window reaches
        group = (order // self.block) % self.groups
        for g in range(self.groups):
            for b in np.unique(reach[(group == g) & (lengths > 0)]):
                pick = (group == g) & (reach == b) & (lengths > 0)
                self._commit(self._short_rows(values, starts[pick], lengths[pick], columns=int(b) * width), g,
                             length=min(int(b) * width, self.positions))

    def _short_rows(self, values: np.ndarray, starts: np.ndarray, lengths: np.ndarray, *,
                    columns: int | None = None) -> np.ndarray:
        """(k, padded n) token ids of k short windows (``values[starts[w] + j]`` at j <
        ``lengths[w]``), padding past their ends; only the first ``columns`` (a whole number
        of position blocks, covering every window) when given."""
        n = self.positions
        columns = self._padded if columns is None else int(columns)
        rows = np.full((starts.size, columns), self._pad, dtype=self._sorted.token_dtype)
        if starts.size and lengths.min() == lengths.max() <= columns:  # one length class: no mask to apply
            rows[:, : lengths[0]] = values[starts[:, None] + np.arange(lengths[0], dtype=np.int64)]
            return rows
        j = np.arange(min(n, columns), dtype=np.int64)
        inside = j < lengths[:, None]
        rows[:, : j.size][inside] = values[(starts[:, None] + j)[inside]]
        return rows

    def _commit_odd_short(self, values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
        """Count the next ``lengths.size`` windows bound for the tail or a length class (in
        order) and, with ``short_halves``, the odd ones among them (by their order over the
        count) again into the short halves' block."""
        order = self._short + np.arange(lengths.size, dtype=np.int64)
        self._short += lengths.size
        odd = order % 2 == 1
        if not (self.short_halves and odd.any()):
            return
        width = self._sorted.block
        reach = -(-lengths // width)  # position blocks each window reaches: a window costs its own length
        for b in np.unique(reach[odd]):
            pick = odd & (reach == b)
            self._commit(self._short_rows(values, starts[pick], lengths[pick], columns=int(b) * width),
                         self._stored - 1, length=min(int(b) * width, self.positions))

    def end_stream(self) -> None:
        """The stream ended: its open window (cut short) goes to the tail."""
        if self._open_len:
            self._commit_odd_short(self._open, np.zeros(1, dtype=np.int64), np.array([self._open_len]))
            self._commit(self._open[None, :].copy(), self.groups)
        self._open[:] = self._pad
        self._open_len = 0

    def finish(self) -> tuple[CountBlocks, np.ndarray]:
        """``(blocks, rows)``: the counts as position blocks over the stacked, padded rows
        (:class:`~posstats.counting.blocks.CountBlocks`; the open window counted as the
        tail's) and the ((K + 1 + C + S) n,) indices of the real rows among them, in order (the
        padding rows are empty). Ends the counter; no scipy (a count writes them straight
        to a file, :func:`posstats.counting.window_groups_io.save_window_group_blocks`)."""
        self.end_stream()
        rows = (np.arange(self._stored, dtype=np.int64)[:, None] * self._padded
                + np.arange(self.positions, dtype=np.int64)).ravel()
        return self._sorted.finish(), rows

    def result(self) -> WindowGroups:
        """The counts as :class:`WindowGroups` (a CSR matrix); ends the counter."""
        blocks, rows = self.finish()
        stacked = blocks.to_csr()
        matrix = sp.csr_array(stacked[rows]) if rows.size != stacked.shape[0] else stacked
        return WindowGroups(self.groups, self.positions, matrix, self.windows, self.classes, self.halves_only,
                            self.short_halves)

    def _commit_full(self, values: np.ndarray, starts: np.ndarray, group: int) -> None:
        """Count full windows (window w holds ``values[starts[w] + j]`` at position j < n)
        into ``group``'s rows, one position block at a time: each block's rows are slices
        of a sliding-window view of ``values`` (one copy each, no (windows x n) index grid;
        padding only in the last block, past n)."""
        width, n = self._sorted.block, self.positions
        view = sliding_window_view(values, width)  # a full window lies in values: values.size >= n >= width
        first = group * self._blocks
        for b in range(self._blocks):
            p0 = b * width
            if p0 + width <= n:
                rows = view[starts + p0]
            else:
                rows = np.full((starts.size, width), self._pad, dtype=self._sorted.token_dtype)
                rows[:, : min(width, n - p0)] = values[starts[:, None] + np.arange(p0, min(p0 + width, n))]
            self._sorted.add_rows(first + b, rows)

    def _commit(self, rows: np.ndarray, group: int, *, length: int | None = None) -> None:
        """Count windows (``rows``: (k, padded n) token ids, padding past n, or past
        ``length`` for a length class: its blocks beyond are padding only) into ``group``'s
        rows, one position block at a time."""
        width = self._sorted.block
        first = group * self._blocks
        for b in range(self._blocks if length is None else -(-length // width)):
            self._sorted.add_rows(first + b, np.ascontiguousarray(rows[:, b * width:(b + 1) * width]))
