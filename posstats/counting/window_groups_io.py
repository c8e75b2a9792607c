"""Reading and writing the counts by window group (:mod:`posstats.counting.window_groups`)
next to the counts they belong to: ``OUT/window-groups.safetensors`` of a counts folder.

The file holds the ((K + 1 + C + S) n, V) CSR matrix (``indptr``, ``indices``, ``data``) and, as
metadata, K, n, the length classes C (n - 1 or 0; a file without the entry has none), the full
windows, the tokens, the counts' fingerprint, ``halves_only`` ("1": the two halves kept
above 4,096 positions, never rotated; a file without the entry is not) and ``short_halves``
("1": S = 1, the odd short windows' block follows; a file without the entry has none);
:func:`load_window_groups`
refuses a file that does not add up to the counts beside it (one line naming the file).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import operator
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from posstats.counting.blocks import narrow_count_dtype
from posstats.counting.counts import PositionalCounts
from posstats.counting.io import TensorStream, _csr_from, _opened, index_dtype, write_safetensors
from posstats.counting.scipy_sparse import sp
from posstats.counting.window_groups import WindowGroupCounter, WindowGroups
from posstats.errors import InputError
from posstats.storage.publish import atomic_path, published_dir

__all__ = ["WINDOW_GROUPS_FILE", "halves_sums", "load_halves_rows", "load_window_groups", "save_halves_from_ranges", "save_window_group_blocks",
           "save_window_groups", "sum_window_group_files", "window_groups_file"]

WINDOW_GROUPS_FILE = "window-groups.safetensors"
_SCHEMA = "posstats.window-groups/1"


def save_window_groups(groups: WindowGroups, counts: PositionalCounts, directory: str | os.PathLike, /) -> Path:
    """Write ``groups`` (counted with ``counts``) as ``directory/window-groups.safetensors``
    (atomically); return the file."""
    m = groups.matrix
    tensors = {"indptr": m.indptr.astype(np.int64, copy=False),
               "indices": m.indices.astype(index_dtype(groups.vocab_size), copy=False),
               "data": m.data.astype(narrow_count_dtype(int(m.data.max()) if m.nnz else 0), copy=False)}
    return _write(directory, tensors, groups.groups, groups.positions, groups.vocab_size, groups.windows, counts,
                  classes=groups.classes, halves_only=groups.halves_only, short_halves=groups.short_halves)


def save_window_group_blocks(counter: WindowGroupCounter, counts: PositionalCounts,
                             directory: str | os.PathLike, /) -> tuple[Path, dict[str, int]]:
    """:func:`save_window_groups` of what ``counter`` counted, streamed from its position
    blocks (:meth:`~posstats.counting.window_groups.WindowGroupCounter.finish`): no CSR
    matrix and no scipy, as ``posstats count`` writes its counts. Returns the file and
    ``{"groups": K, "windows": full windows}`` (and ``"short_halves": True`` where kept)."""
    blocks, rows = counter.finish()
    indptr = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(blocks.row_nnz()[rows], out=indptr[1:])  # the padding rows hold no entry
    nnz = int(indptr[-1])
    index, count = index_dtype(counter.vocab_size), narrow_count_dtype(blocks.largest())
    tensors = {"indptr": indptr,
               "indices": TensorStream(index, (nnz,), lambda: blocks.indices(index)),
               "data": TensorStream(count, (nnz,), lambda: blocks.data(count))}
    path = _write(directory, tensors, counter.groups, counter.positions, counter.vocab_size, counter.windows, counts,
                  classes=counter.classes, halves_only=counter.halves_only, short_halves=counter.short_halves)
    return path, {"groups": counter.groups, "windows": counter.windows,
                  **({"short_halves": True} if counter.short_halves else {})}


def _write(directory: str | os.PathLike, tensors: dict, groups: int, positions: int, vocab: int, windows: int,
           counts: PositionalCounts, *, classes: int, halves_only: bool = False, short_halves: bool = False) -> Path:
    target = Path(directory) / WINDOW_GROUPS_FILE
    meta = {"schema": _SCHEMA, "groups": str(groups), "positions": str(positions), "vocab_size": str(vocab),
            "classes": str(classes), "windows": str(windows), "tokens": str(counts.tokens),
            "fingerprint": counts.fingerprint, **({"halves_only": "1"} if halves_only else {}),
            **({"short_halves": "1"} if short_halves else {})}
    with atomic_path(target) as tmp:
        write_safetensors(tmp, tensors, meta)
    return target


def window_groups_file(path: str | os.PathLike, /) -> Path | None:
    """The window-groups file beside the counts at ``path`` (a counts folder or its counts
    file), or None when there is none."""
    path = Path(path)
    folder = published_dir(path) if path.is_dir() else path.parent
    target = folder / WINDOW_GROUPS_FILE
    return target if target.is_file() else None


@dataclass(frozen=True)
class _Header:
    """A window-groups file's checked metadata (:func:`_header`)."""

    groups: int
    positions: int
    vocab_size: int
    classes: int
    windows: int
    tokens: int
    fingerprint: str
    halves_only: bool = False
    short_halves: bool = False

    @property
    def counted_rows(self) -> int:
        """(K + 1 + C) n: the rows that add up to the counts."""
        return (self.groups + 1 + self.classes) * self.positions

    @property
    def rows(self) -> int:
        """(K + 1 + C + S) n: the stored rows (the short halves' block last)."""
        return self.counted_rows + (self.positions if self.short_halves else 0)

    @property
    def layout(self) -> tuple[int, int, int, int, bool, bool]:
        """(K, n, V, C, halves_only, short_halves): what files summed together must share."""
        return (self.groups, self.positions, self.vocab_size, self.classes, self.halves_only, self.short_halves)


def _header(target: Path, f: Any) -> _Header:
    """The metadata of the open window-groups file ``f`` at ``target``, checked: the schema,
    integer entries, K >= 1, C in {0, n - 1} and ``indptr`` of (K + 1 + C) n + 1 entries
    (InputError naming the file otherwise)."""
    meta = dict(f.metadata() or {})
    if meta.get("schema") != _SCHEMA:
        msg = f"{target}: schema {meta.get('schema')!r} is not {_SCHEMA!r}; count again"
        raise InputError(msg)
    try:
        h = _Header(int(meta["groups"]), int(meta["positions"]), int(meta["vocab_size"]),
                    int(meta.get("classes", "0")),  # written before length classes: none
                    int(meta["windows"]), int(meta["tokens"]), meta.get("fingerprint", ""),
                    meta.get("halves_only", "0") == "1", meta.get("short_halves", "0") == "1")
    except (KeyError, ValueError) as exc:
        msg = f"{target}: metadata entry {exc} missing or not an integer; count again"
        raise InputError(msg) from exc
    if h.groups < 1:
        msg = f"{target}: groups = {h.groups}, must be >= 1; count again"
        raise InputError(msg)
    for flag in ("halves_only", "short_halves"):
        if meta.get(flag, "0") not in ("0", "1"):
            msg = f"{target}: {flag} = {meta[flag]!r}, must be 0 or 1; count again"
            raise InputError(msg)
    if h.halves_only and h.short_halves:
        msg = f"{target}: halves_only and short_halves are both set (the halves hold every window already); count again"
        raise InputError(msg)
    if h.classes not in (0, h.positions - 1):
        msg = f"{target}: classes = {h.classes}, must be 0 or {h.positions - 1} (positions - 1); count again"
        raise InputError(msg)
    stored = f.get_slice("indptr").get_shape()
    if list(stored) != [h.rows + 1]:
        msg = (f"{target}: {stored[0] - 1 if stored else 0:,} rows stored, the header's {h.groups} groups of "
               f"{h.positions} positions, their tail, {h.classes} length classes"
               f"{' and the short halves' if h.short_halves else ''} need {h.rows:,}; count again")
        raise InputError(msg)
    return h


def load_window_groups(path: str | os.PathLike, counts: PositionalCounts, /) -> WindowGroups | None:
    """The counts by window group stored beside the counts at ``path``, or None without a
    file. Raises InputError (naming the file) when it is unreadable or does not belong to
    ``counts`` (other positions, vocabulary, tokens or fingerprint)."""
    target = window_groups_file(path)
    if target is None:
        return None
    with _opened(target) as f:
        h = _header(target, f)
        expected = (counts.positions, counts.vocab_size, counts.tokens, counts.fingerprint)
        found = (h.positions, h.vocab_size, h.tokens, h.fingerprint)
        if found != expected:
            msg = (f"{target}: belongs to other counts (positions, vocabulary, tokens, fingerprint {found} against "
                   f"{expected}); count again")
            raise InputError(msg)
        k, n, vocab, windows, tokens, classes, rows = (h.groups, h.positions, h.vocab_size, h.windows, h.tokens,
                                                       h.classes, h.rows)
        halves_only, short_halves = h.halves_only, h.short_halves
        indptr = f.get_tensor("indptr")
        matrix = _csr_from(target, indptr, f.get_tensor("indices"), f.get_tensor("data"), (rows, vocab))
    held = int(matrix.data[: matrix.indptr[h.counted_rows]].sum())
    if held != tokens:
        msg = f"{target}: holds {held:,} tokens, the counts {tokens:,}; count again"
        raise InputError(msg)
    if short_halves and int(matrix.data[matrix.indptr[h.counted_rows]:].sum()) > held:
        msg = f"{target}: its short halves hold more tokens than the counts ({held:,}); count again"
        raise InputError(msg)
    return WindowGroups(k, n, matrix, windows, classes, halves_only, short_halves)


def load_halves_rows(path: str | os.PathLike, positions: Any, expected: tuple[int, int, int, str], /
                     ) -> tuple[sp.csr_array, sp.csr_array]:
    """((m, V), (m, V)) int64 CSR: the even groups' and the odd groups' counts
    (:meth:`~posstats.counting.window_groups.WindowGroups.halves`) at ``positions`` (sorted,
    m of them) of the window-groups file beside the counts at ``path``, reading only the
    rows between the first and the last position of each group: what a range of rows held
    apart needs (:mod:`posstats.estimates.ranged_halves`). ``expected``: the counts'
    (positions, vocabulary, tokens, fingerprint), as :func:`load_window_groups` checks.

    Raises:
        InputError: no such file, or one that is unreadable or belongs to other counts.
    """
    target = window_groups_file(path)
    if target is None:
        msg = f"{path}: no {WINDOW_GROUPS_FILE} beside the counts"
        raise InputError(msg)
    pos = np.asarray(positions, dtype=np.int64)
    with _opened(target) as f:
        h = _header(target, f)
        found = (h.positions, h.vocab_size, h.tokens, h.fingerprint)
        if found != tuple(expected):
            msg = (f"{target}: belongs to other counts (positions, vocabulary, tokens, fingerprint {found} against "
                   f"{tuple(expected)}); count again")
            raise InputError(msg)
        if pos.size and (pos[0] < 0 or pos[-1] >= h.positions or np.any(np.diff(pos) <= 0)):
            msg = f"positions must be sorted, distinct and within [0, {h.positions}), got {pos[:3]}..."
            raise ValueError(msg)
        halves = [sp.csr_array((pos.size, h.vocab_size), dtype=np.int64) for _ in range(2)]
        if not pos.size:
            return halves[0], halves[1]
        lo, hi = int(pos[0]), int(pos[-1]) + 1
        every = pos.size == hi - lo  # sorted and distinct: every row from lo to hi, no selection needed
        for g in range(h.groups):
            block = _file_rows(target, f, h, g * h.positions + lo, hi - lo, pos - lo, every)
            # a half's first group is taken as read (adding it to the empty half would copy it)
            halves[g % 2] = block if g < 2 else halves[g % 2] + block
        if h.short_halves:  # the tail and the length classes: their even windows to the even half
            rest = [_file_rows(target, f, h, b * h.positions + lo, hi - lo, pos - lo, every)
                    for b in range(h.groups, h.groups + 2 + h.classes)]
            odd = rest.pop()
            even = functools.reduce(operator.add, rest) - odd
            even.eliminate_zeros()
            halves = [halves[0] + even, halves[1] + odd]
    return sp.csr_array(halves[0]), sp.csr_array(halves[1])


_SUM_ROWS = 4096  # positions read at a time by halves_sums


def halves_sums(path: str | os.PathLike, positions: Any, expected: tuple[int, int, int, str], /
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(a, b, occ_a, occ_b)``: the even and the odd half's tokens per vocabulary entry
    ((V,) each) and occupancies ((m,) each) at ``positions`` (sorted, m of them) of the
    window-groups file beside the counts at ``path``, read :data:`_SUM_ROWS` positions at a
    time (:func:`load_halves_rows`, whose checks it shares): what the standout test's
    document model needs where the rows are held apart
    (:mod:`posstats.estimates.document_excess`), in the memory of a few thousand rows."""
    pos = np.asarray(positions, dtype=np.int64)
    a, b = np.zeros(int(expected[1])), np.zeros(int(expected[1]))
    occ_a, occ_b = np.zeros(pos.size), np.zeros(pos.size)
    for lo in range(0, pos.size, _SUM_ROWS):
        even, odd = load_halves_rows(path, pos[lo : lo + _SUM_ROWS], expected)
        a += np.asarray(even.sum(axis=0), dtype=np.float64).ravel()
        b += np.asarray(odd.sum(axis=0), dtype=np.float64).ravel()
        occ_a[lo : lo + _SUM_ROWS] = np.asarray(even.sum(axis=1), dtype=np.float64).ravel()
        occ_b[lo : lo + _SUM_ROWS] = np.asarray(odd.sum(axis=1), dtype=np.float64).ravel()
    return a, b, occ_a, occ_b


def _file_rows(target: Path, f: Any, h: _Header, first: int, rows: int, pick: np.ndarray, every: bool,
               ) -> sp.csr_array:
    """((m, V)) CSR: the stored rows ``first .. first + rows - 1`` of the open file ``f``,
    those at ``pick`` (offsets into them) unless ``every``."""
    bounds = f.get_slice("indptr")[first : first + rows + 1].astype(np.int64)
    e0, e1 = int(bounds[0]), int(bounds[-1])
    indices = f.get_slice("indices")[e0:e1] if e1 > e0 else np.zeros(0, np.int32)
    data = f.get_slice("data")[e0:e1] if e1 > e0 else np.zeros(0, np.int64)
    block = _csr_from(target, bounds - e0, indices, data, (rows, h.vocab_size))
    return block if every else sp.csr_array(block[pick])


_RANGE_ENTRIES = 1 << 24  # stored entries of all items summed at a time (about 400 MiB of temporaries)


def sum_window_group_files(items: Sequence[tuple[str | os.PathLike, int]], counts: PositionalCounts,
                           directory: str | os.PathLike, /) -> tuple[Path, dict[str, int]]:
    """The signed sum ``sum_i sign_i G_i`` of the window groups beside each item (a counts
    folder, a run-store partial or result: :func:`window_groups_file`) written as
    ``directory/window-groups.safetensors`` of ``counts`` (the items' reduced counts: the
    file must add up to their tokens and carries their fingerprint). Window groups are
    additive as the counts are: group g of a corpus is the union of group g of its parts,
    any union of whole windows being a valid group in truncate and chunk mode
    (:mod:`posstats.counting.window_groups`), and a refresh subtracts what left the corpus.

    Rows are summed a range at a time (about ``2**24`` stored entries of all items), each
    range into a scratch file that the result then streams in order: memory one range.

    Returns the file and ``{"groups": K, "windows": full windows}`` (and ``"short_halves": True``
    where every item kept them). Raises InputError
    (naming the file) for an item without window groups, with another K, n, V or number of
    length classes or another ``halves_only`` than the rest (the short halves are kept where every item has them,
    else dropped), a sum with a negative count (a refresh subtracting what is
    not there), or one that does not add up to ``counts``' tokens.
    """
    if not items:
        msg = "sum_window_group_files needs at least one item"
        raise ValueError(msg)
    files = []
    for path, _ in items:
        target = window_groups_file(path)
        if target is None:
            msg = f"{path}: no {WINDOW_GROUPS_FILE} to sum"
            raise InputError(msg)
        files.append(target)
    signs = [int(sign) for _, sign in items]
    with contextlib.ExitStack() as stack:
        opened = [stack.enter_context(_opened(target)) for target in files]
        headers = [_header(target, f) for target, f in zip(files, opened, strict=True)]
        first = headers[0]
        # the short halves are summed only when every item has them (else they are dropped:
        # items counted before them sum with new ones)
        first = dataclasses.replace(first, short_halves=all(h.short_halves for h in headers))
        shape = first.layout[:5]
        for target, h in zip(files, headers, strict=True):
            if h.layout[:5] != shape or shape[1:3] != (counts.positions, counts.vocab_size):
                msg = (f"{target}: groups, positions, vocabulary, length classes and halves_only "
                       f"{h.layout[:5]} differ from the other items' {shape} or the counts' ({counts.positions}, "
                       f"{counts.vocab_size}); count again")
                raise InputError(msg)
        scratch = Path(directory) / ".window-groups-ranges"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        try:
            parts = _summed_ranges(opened, files, signs, first, scratch)
            total = sum(p["total"] for p in parts)
            if total != counts.tokens:
                msg = (f"{directory}: the window groups of {len(files)} item(s) add up to {total:,} tokens, the "
                       f"counts to {counts.tokens:,}; count again")
                raise InputError(msg)
            nnz = sum(p["nnz"] for p in parts)
            index = index_dtype(first.vocab_size)
            count = narrow_count_dtype(max((p["largest"] for p in parts), default=0))
            tensors = {"indptr": TensorStream(np.int64, (first.rows + 1,), lambda: _range_indptr(parts)),
                       "indices": TensorStream(index, (nnz,), lambda: _range_tensor(parts, "indices", index)),
                       "data": TensorStream(count, (nnz,), lambda: _range_tensor(parts, "data", count))}
            windows = sum(sign * h.windows for sign, h in zip(signs, headers, strict=True))
            path = _write(directory, tensors, first.groups, first.positions, first.vocab_size, windows, counts,
                          classes=first.classes, halves_only=first.halves_only, short_halves=first.short_halves)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return path, {"groups": first.groups, "windows": windows, **({"short_halves": True} if first.short_halves else {})}


def _summed_ranges(opened: list[Any], files: list[Path], signs: list[int], h: _Header,
                   scratch: Path) -> list[dict[str, Any]]:
    """Sum the items' rows a range at a time into scratch files; their summaries in order
    (``path``, ``nnz``, ``largest``, ``total``)."""
    ends = [int(f.get_slice("indptr")[h.rows:h.rows + 1][0]) for f in opened]
    ranges = max(1, -(-sum(ends) // _RANGE_ENTRIES))
    bounds = [r * h.rows // ranges for r in range(ranges + 1)]
    parts = []
    for j, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        total = None
        for target, f, sign in zip(files, opened, signs, strict=True):
            indptr = f.get_slice("indptr")[a:b + 1].astype(np.int64)
            e0, e1 = int(indptr[0]), int(indptr[-1])
            data, indices = (f.get_slice("data")[e0:e1], f.get_slice("indices")[e0:e1]) if e1 > e0 else ([], [])
            block = sp.csr_array((np.asarray(data, dtype=np.int64) * sign, np.asarray(indices, dtype=np.int32),
                                  indptr - e0), shape=(b - a, h.vocab_size))
            total = block if total is None else total + block
        total.sum_duplicates()
        total.eliminate_zeros()
        if total.nnz and int(total.data.min()) < 0:
            row = a + int(np.searchsorted(total.indptr, int(np.argmin(total.data)), side="right")) - 1
            msg = (f"{files[0].parent}: the signed sum of the window groups has a negative count at row {row:,}: "
                   "the items subtracted are not part of the total; count again")
            raise InputError(msg)
        path = scratch / f"range-{j:05d}.safetensors"
        write_safetensors(path, {"indptr": total.indptr.astype(np.int64), "indices": total.indices.astype(np.int32),
                                 "data": total.data.astype(np.int64)}, {})
        counted = total.indptr[min(b, h.counted_rows) - a] if a < h.counted_rows else 0  # not the short halves
        parts.append({"path": path, "nnz": int(total.nnz), "largest": int(total.data.max()) if total.nnz else 0,
                      "total": int(total.data[:counted].sum())})
    return parts


def _range_indptr(parts: Sequence[dict[str, Any]]) -> Iterator[np.ndarray]:
    """The summed file's row pointers, one range file at a time."""
    offset = 0
    yield np.zeros(1, np.int64)
    for part in parts:
        with safe_open(str(part["path"]), framework="numpy") as f:
            indptr = f.get_tensor("indptr")
        yield indptr[1:] + offset
        offset += int(indptr[-1])


def _range_tensor(parts: Sequence[dict[str, Any]], name: str, dtype: np.dtype) -> Iterator[np.ndarray]:
    """The summed file's ``indices`` or ``data``, one range file at a time, as ``dtype``."""
    for part in parts:
        with safe_open(str(part["path"]), framework="numpy") as f:
            yield f.get_tensor(name).astype(dtype, copy=False)


def save_halves_from_ranges(halves: Sequence[Sequence[dict[str, Any]]], counts: PositionalCounts,
                            directory: str | os.PathLike, /) -> tuple[Path, dict[str, int]]:
    """Write ``directory/window-groups.safetensors`` as the two halves (``halves_only``, no
    tail, no length classes) of ``counts`` from the range files of each half (two lists of
    :func:`posstats.counting.ranges.sum_row_range` summaries, each covering ``[0, n)``),
    one range file read at a time: what a pack-mode count in steps keeps above 4,096
    positions, its shards by rank parity (``jobs.count``). Returns the file and
    ``{"groups": 2, "windows": counts.windows}``. Raises InputError when the halves do not
    cover the positions or add up to ``counts``' tokens (nothing is written then)."""
    n, vocab = counts.positions, counts.vocab_size
    ordered = []
    for half in halves:
        parts = sorted(half, key=lambda p: p["start"])
        if [(p["start"], p["stop"]) for p in parts] != list(zip([0] + [p["stop"] for p in parts[:-1]],
                                                              [p["stop"] for p in parts])) or parts[-1]["stop"] != n:
            msg = f"{directory}: the halves' range files do not cover the {n:,} positions exactly once"
            raise InputError(msg)
        ordered.append(parts)
    if len(ordered) != 2:
        msg = f"save_halves_from_ranges needs two halves, got {len(ordered)}"
        raise ValueError(msg)
    parts = [*ordered[0], *ordered[1]]
    total = 0
    for part in parts:
        with safe_open(str(part["path"]), framework="numpy") as f:
            total += int(f.get_tensor("data").sum(dtype=np.int64))
    if total != counts.tokens:
        msg = f"{directory}: the halves add up to {total:,} tokens, the counts to {counts.tokens:,}; count again"
        raise InputError(msg)

    def indptr() -> Iterator[np.ndarray]:
        last = np.zeros(1, np.int64)
        for piece in _range_indptr(parts):
            last = piece[-1:] if piece.size else last
            yield piece
        yield np.repeat(last, n)  # the tail's n rows: empty

    nnz = sum(int(p["nnz"]) for p in parts)
    index = index_dtype(vocab)
    count = narrow_count_dtype(max((int(p["largest"]) for p in parts), default=0))
    tensors = {"indptr": TensorStream(np.int64, (3 * n + 1,), indptr),
               "indices": TensorStream(index, (nnz,), lambda: _range_tensor(parts, "indices", index)),
               "data": TensorStream(count, (nnz,), lambda: _range_tensor(parts, "data", count))}
    path = _write(directory, tensors, 2, n, vocab, counts.windows, counts, classes=0, halves_only=True)
    return path, {"groups": 2, "windows": counts.windows}
