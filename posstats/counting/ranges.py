"""The range reduce: a signed sum of saved counts computed one range of positions at a time.

``total = sum_i sign_i C_i`` is row-separable: rows ``[a, b)`` of the total are the
signed sum of rows ``[a, b)`` of the items. So the sum is cut into ranges of positions
(:func:`row_ranges`), each range is summed independently (:func:`sum_row_range`, reading
only those rows of every item, see :func:`posstats.counting.io.load_rows`) into a range
file, and the range files are streamed, in order, into one counts file
(:func:`assemble_ranges`), which holds one range in memory at a time. Ranges can run in
parallel on several processes or machines; no process ever holds the whole total.

Integer sums do not depend on the order of the items or on the ranges, so the result is
bit-identical to an in-process count of the same corpus.

How a range is summed (:func:`placed_sum`): scipy adds the items' CSR rows pairwise,
which moves every entry ``log2 k`` times for k items. Where many items hold small counts
(long contexts: at n = 131,072 nearly every count of a shard's partial is 1), it is
cheaper to expand the rows back into the tokens they count and count those again with the
counting kernel's row sort (:func:`sum_by_sorting`: one radix sort of each position's
tokens, in cache), whose cost follows the tokens and not ``log2 k``;
:func:`sorting_pays` decides by the measured cost of each. Measured on ranges of 2,849
positions of the 1 B-token benchmark (40 partials, 16.5 M entries): 0.27-0.36 s against
0.40-0.68 s; with 8 partials the two are even (0.16 s against 0.13-0.15 s), and scipy is
kept. The items a refresh subtracts are always subtracted by scipy.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from posstats.counting.blocks import BlockCounts
from posstats.counting.counts import (
    CountSpec,
    PositionalCounts,
    combine_fingerprints,
    csr_row_sums,
)
from posstats.counting.io import (
    DENSE_FILE,
    SPARSE_FILE,
    TensorStream,
    choose_storage,
    count_dtype,
    counts_metadata,
    index_dtype,
    load_header,
    load_rows,
    write_safetensors,
)
from posstats.counting.pack import Placement
from posstats.counting.scipy_sparse import sp
from posstats.counting.sorted_keys import SORT_CELLS, row_counts, token_dtype
from posstats.errors import InputError
from posstats.storage.publish import atomic_path

__all__ = ["assemble_ranges", "placed_sum", "row_ranges", "sorting_pays", "sum_by_sorting", "sum_row_range"]

RANGE_SCHEMA = "posstats.count-range/1"
# Measured costs (AMD EPYC VM, numpy 2.4): scipy's pairwise add moves an entry per level in
# about 5 ns; sum_by_sorting spends about 17 ns per expanded token (scatter, sort, count).
ADD_NS_PER_ENTRY_LEVEL, SORT_NS_PER_TOKEN = 5.0, 17.0


def row_ranges(positions: int, parts: int, /) -> list[tuple[int, int]]:
    """``parts`` (at most ``positions``) contiguous ranges covering ``[0, positions)``,
    sizes differing by at most one.

    >>> row_ranges(10, 3)
    [(0, 3), (3, 6), (6, 10)]
    """
    parts = max(1, min(int(parts), positions))
    bounds = [i * positions // parts for i in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def _signed_sum(blocks: list[sp.csr_array], signs: list[int]) -> sp.csr_array:
    """Exact ``sum sign_k B_k`` of int64 CSR blocks of one shape, added pairwise (scipy's
    linear merge of sorted rows; ``O(nnz log k)`` for k blocks). Measured on the 200 M-token
    benchmark, faster than one packed 64-bit sort of all entries, which moves more memory."""
    blocks = [b if sign > 0 else -b for b, sign in zip(blocks, signs)]
    while len(blocks) > 1:
        blocks = [blocks[i] + blocks[i + 1] if i + 1 < len(blocks) else blocks[i] for i in range(0, len(blocks), 2)]
    return blocks[0]


def _wide(blocks: Sequence[sp.csr_array], /) -> list[sp.csr_array]:
    """The blocks with int64 counts, for scipy's sums (a narrow type would wrap)."""
    return [b if b.dtype == np.int64 else b.astype(np.int64) for b in blocks]


def sorting_pays(tokens: int, entries: int, items: int, /) -> bool:
    """Whether :func:`sum_by_sorting` of ``items`` CSR arrays holding ``entries`` stored
    counts that sum to ``tokens`` beats scipy's pairwise adds:
    ``17 ns x tokens < 5 ns x entries x log2(items)`` (the measured costs above).

    >>> sorting_pays(16_500_000, 16_500_000, 40), sorting_pays(9_600_000, 9_600_000, 8), sorting_pays(10**9, 10**6, 40)
    (True, False, False)
    """
    return items > 1 and SORT_NS_PER_TOKEN * tokens < ADD_NS_PER_ENTRY_LEVEL * entries * math.log2(items)


def sum_by_sorting(blocks: Sequence[sp.csr_array], vocab_size: int, /) -> sp.csr_array:
    """``sum_k B_k`` of non-negative integer CSR arrays of one shape ``(m, V)``, rows and
    columns sorted, as an int64 CSR array (at least one array). Its cost follows the
    tokens the arrays count, ``sum B_k``: see :func:`sorting_pays`.

    Each row's entries ``(v, c)`` of every block are expanded into ``c`` copies of ``v``,
    written side by side into one row of a ``(rows, max row total)`` array of token ids
    (padding: the dtype's largest value), and counted as the counting kernel counts a
    block (:func:`~posstats.counting.sorted_keys.sorted_rows` /
    :func:`~posstats.counting.sorted_keys.row_counts`): a radix sort per short row, in
    cache, instead of scipy's pairwise merges that move every entry ``log2 k`` times.

    >>> one = sp.csr_array(np.array([[1, 0, 1], [0, 0, 1]]))
    >>> sum_by_sorting([one] * 16 + [sp.csr_array(np.array([[0, 1, 0], [0, 0, 0]]))], 3).toarray().tolist()
    [[16, 1, 16], [0, 0, 16]]
    """
    total = _sorted_counts(blocks, vocab_size)
    indptr = np.zeros(blocks[0].shape[0] + 1, np.int64)
    np.cumsum(total.row_nnz, out=indptr[1:])
    return sp.csr_array((total.counts.astype(np.int64), total.tokens.astype(np.int32), indptr),
                        shape=(blocks[0].shape[0], vocab_size))


def _sorted_counts(blocks: Sequence[sp.csr_array], vocab_size: int, /) -> BlockCounts:
    """:func:`sum_by_sorting` as the counting kernel's :class:`BlockCounts` (first row 0;
    token ids and counts in their narrow types), before any conversion to a CSR array."""
    m = blocks[0].shape[0]
    row_tokens = [csr_row_sums(b) for b in blocks]  # the tokens each row counts
    lengths = np.sum(row_tokens, axis=0)
    dtype = token_dtype(vocab_size)
    pad = np.iinfo(dtype).max
    step = max(1, SORT_CELLS // max(1, int(lengths.max(initial=0))))  # rows sorted at once: ~8 MiB
    parts = []
    for r0 in range(0, m, step):
        r1 = min(r0 + step, m)
        width = int(lengths[r0:r1].max(initial=0))
        if width == 0:
            parts.append(BlockCounts(r0, np.zeros(r1 - r0, np.int64), np.zeros(0, dtype), np.zeros(0, np.uint16)))
            continue
        rows = np.full((r1 - r0, width), pad, dtype)
        cells = rows.reshape(-1)
        free = np.arange(r1 - r0, dtype=np.int64) * width  # each row's next free cell
        for block, tokens in zip(blocks, row_tokens):
            lo, hi = block.indptr[r0], block.indptr[r1]
            ids, counts = block.indices[lo:hi], block.data[lo:hi]
            if counts.size and counts.max() > 1:
                ids = np.repeat(ids, counts)
            if ids.size == 0:
                continue
            per_row = tokens[r0:r1]
            first = np.zeros(r1 - r0, np.int64)  # where each row's tokens start in ids
            np.cumsum(per_row[:-1], out=first[1:])
            cells[np.repeat(free - first, per_row) + np.arange(ids.size)] = ids
            free += per_row
        rows.sort(axis=1, kind="stable" if dtype.itemsize <= 2 else "quicksort")
        parts.append(row_counts(rows, r0))
    return BlockCounts.concatenate(parts)


def _placement(item: Placement | tuple[str | os.PathLike, int]) -> Placement:
    return item if isinstance(item, Placement) else Placement(str(item[0]), int(item[1]))


def _placed_rows(p: Placement, start: int, stop: int, spec: CountSpec, *, check: bool) -> sp.csr_array:
    """Rows ``[start, stop)`` of the placed counts: rows ``(r - shift) mod n`` of the file
    (two slices where they wrap), minus its dropped separator (:mod:`posstats.counting.pack`).
    The counts keep the file's integer type (uint16 for most partials), or int64 where the
    separator is dropped."""
    n, length = spec.positions, stop - start
    lo = (start - p.shift) % n
    if lo + length <= n:
        rows = load_rows(p.path, lo, lo + length, check=check, dtype=None)
    else:
        rows = sp.csr_array(sp.vstack([load_rows(p.path, lo, n, check=check, dtype=None),
                                       load_rows(p.path, 0, lo + length - n, check=check, dtype=None)], format="csr"))
    if p.drop_separator and start <= p.shift < stop:
        one = sp.csr_array(([1], ([p.shift - start], [spec.separator_id])), shape=rows.shape, dtype=np.int64)
        rows = rows - one
    return rows


def placed_sum(items: Sequence[Placement | tuple[str | os.PathLike, int]], spec: CountSpec, start: int, stop: int,
               /, *, check: bool = True) -> sp.csr_array:
    """Rows ``[start, stop)`` of ``sum(sign * counts(path))`` as an int64 CSR of shape
    ``(stop - start, V)``, canonical, no stored zeros (items as for :func:`sum_row_range`).

    Raises:
        InputError: an item counted under another spec, or unreadable.
    """
    indptr, indices, data = _range_sum(items, spec, start, stop, check=check)
    return sp.csr_array((data.astype(np.int64, copy=False), indices.astype(np.int32, copy=False), indptr),
                        shape=(stop - start, spec.vocab_size))


def _range_sum(items: Sequence[Placement | tuple[str | os.PathLike, int]], spec: CountSpec, start: int, stop: int,
               /, *, check: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indptr (stop - start + 1,) int64, token ids, counts) of :func:`placed_sum`'s rows,
    canonical, no stored zeros, the ids and counts in whatever integer types the sum left
    them (the sorting sum keeps the items' narrow ones: no int64 copy of a range's counts
    is made only to be narrowed again when the range is written)."""
    placed = [_placement(item) for item in items]
    blocks = []
    for p in placed:
        header = load_header(p.path)
        if header.spec != spec:
            msg = f"{p.path}: counted under {header.spec}, not {spec}"
            raise InputError(msg)
        blocks.append(_placed_rows(p, start, stop, spec, check=check))
    added = [b for b, p in zip(blocks, placed) if p.sign > 0]
    removed = [b for b, p in zip(blocks, placed) if p.sign < 0]
    if added and sorting_pays(sum(int(b.data.sum()) for b in added), sum(b.nnz for b in added), len(added)):
        summed = _sorted_counts(added, spec.vocab_size)
        indptr = np.zeros(stop - start + 1, np.int64)
        np.cumsum(summed.row_nnz, out=indptr[1:])
        if not removed:  # sorted, unique and positive already
            return indptr, summed.tokens, summed.counts
        total = sp.csr_array((summed.counts.astype(np.int64), summed.tokens.astype(np.int32), indptr),
                             shape=(stop - start, spec.vocab_size))
        total = sp.csr_array(total - _signed_sum(_wide(removed), [1] * len(removed)), dtype=np.int64)  # a refresh
    elif blocks:
        total = sp.csr_array(_signed_sum(_wide(blocks), [p.sign for p in placed]), dtype=np.int64)
    else:
        total = sp.csr_array((stop - start, spec.vocab_size), dtype=np.int64)
    total.eliminate_zeros()
    total.sort_indices()
    return total.indptr.astype(np.int64, copy=False), total.indices, total.data


def sum_row_range(items: Sequence[Placement | tuple[str | os.PathLike, int]], spec: CountSpec, start: int, stop: int,
                  out: str | os.PathLike, /, *, verified: bool = False) -> dict[str, Any]:
    """Rows ``[start, stop)`` of ``sum(sign * counts(path))``, written to ``out`` (a CSR
    safetensors file of shape ``(stop - start, V)``); return its summary. Items are
    ``(path, sign)`` pairs or :class:`~posstats.counting.pack.Placement` s (rotated pieces
    of pack streams). ``verified=True`` (every item already checked against its checksum,
    :func:`posstats.counting.reduce.check_partial`) skips re-checking the rows read.

    Returns:
        ``{"path", "start", "stop", "nnz", "smallest", "largest", "occupied"}``: the
        smallest and largest non-zero count of the range (0 if empty), and how many of its
        rows are non-zero.

    Raises:
        InputError: an item counted under another spec, or unreadable.
    """
    V = spec.vocab_size
    indptr, indices, data = _range_sum(items, spec, start, stop, check=not verified)
    smallest, largest = (int(data.min()), int(data.max())) if data.size else (0, 0)
    meta = {"schema": RANGE_SCHEMA, "start": str(start), "stop": str(stop), "vocab_size": str(V)}
    with atomic_path(out) as tmp:  # narrow types: the assembly reads every range file once
        write_safetensors(tmp, {"indptr": indptr, "indices": indices.astype(index_dtype(V), copy=False),
                                "data": data.astype(count_dtype(smallest, largest), copy=False)}, meta)
    occupied = int(np.count_nonzero(np.diff(indptr)))
    return {"path": str(out), "start": start, "stop": stop, "nnz": int(data.size), "smallest": smallest,
            "largest": largest, "occupied": occupied}


def _read_range(path: str) -> sp.csr_array:
    """A range file written by :func:`sum_row_range`."""
    with safe_open(path, framework="numpy") as f:
        meta = f.metadata() or {}
        shape = (int(meta["stop"]) - int(meta["start"]), int(meta["vocab_size"]))
        return sp.csr_array((f.get_tensor("data"), f.get_tensor("indices").astype(np.int32), f.get_tensor("indptr")),
                            shape=shape)


def _range_pieces(parts: Sequence[dict[str, Any]], what: str, dtype: np.dtype) -> Iterator[np.ndarray]:
    """The pieces of one tensor of the assembled file, one range file read at a time
    (only the tensor needed, converted only where its stored dtype differs)."""
    offset = 0
    if what == "indptr":
        yield np.zeros(1, np.int64)
    for part in parts:
        if what == "counts":
            yield _read_range(part["path"]).toarray().astype(dtype)
            continue
        with safe_open(part["path"], framework="numpy") as f:
            tensor = f.get_tensor(what)
        if what == "indptr":
            yield tensor[1:].astype(np.int64) + offset
            offset += int(tensor[-1])
        else:
            yield tensor.astype(dtype, copy=False)


def _totals(items: Sequence[Placement | tuple[str | os.PathLike, int]], spec: CountSpec,
            metadata: dict[str, str] | None, adjust: tuple[int, int]) -> PositionalCounts:
    """Signed totals and XORed fingerprint of the items (their headers only), plus the
    (windows, tokens) ``adjust`` ments of pack stitching."""
    sequences = 0
    windows, tokens = adjust
    fingerprint = ""
    for item in items:
        path, sign = _placement(item).path, _placement(item).sign
        h = load_header(path)
        sequences, windows, tokens = sequences + sign * h.sequences, windows + sign * h.windows, tokens + sign * h.tokens
        fingerprint = combine_fingerprints(fingerprint, h.fingerprint)
    empty = sp.csr_array((spec.positions, spec.vocab_size), dtype=np.int64)
    return PositionalCounts(spec, empty, sequences, windows, tokens, fingerprint, dict(metadata or {}))


def assemble_ranges(parts: Sequence[dict[str, Any]], items: Sequence[Placement | tuple[str | os.PathLike, int]],
                    spec: CountSpec, out: str | os.PathLike, /, *, metadata: dict[str, str] | None = None,
                    adjust: tuple[int, int] = (0, 0)) -> dict[str, Any]:
    """Stream the range files ``parts`` (summaries of :func:`sum_row_range` covering
    ``[0, n)``) into one counts file in ``out``, in the storage
    :func:`~posstats.counting.io.choose_storage` picks; the totals and fingerprint are the
    items' signed sums plus ``adjust`` (windows, tokens: see
    :func:`posstats.counting.pack.stitch`). Holds one range in memory at a time.

    Returns:
        ``{"path", "counts_file", "sequences", "windows", "tokens", "fingerprint",
        "storage", "positions_occupied"}``.
    """
    parts = sorted(parts, key=lambda p: p["start"])
    covered = [(p["start"], p["stop"]) for p in parts]
    expected = list(zip([0] + [b for _, b in covered[:-1]], [b for _, b in covered]))
    if covered != expected or (covered and covered[-1][1] != spec.positions):
        msg = f"range files {covered} do not cover the {spec.positions} positions exactly once"
        raise ValueError(msg)
    total = _totals(items, spec, metadata, adjust)
    nnz = sum(p["nnz"] for p in parts)
    smallest = min((p["smallest"] for p in parts), default=0)
    largest = max((p["largest"] for p in parts), default=0)
    storage = choose_storage(spec.positions, spec.vocab_size, nnz, smallest, largest)
    n, V = spec.positions, spec.vocab_size
    if storage.kind == "sparse":
        name = SPARSE_FILE
        tensors = {
            "indptr": TensorStream(np.dtype(np.int64), (n + 1,), lambda: _range_pieces(parts, "indptr", np.int64)),
            "indices": TensorStream(index_dtype(V), (nnz,), lambda: _range_pieces(parts, "indices", index_dtype(V))),
            "data": TensorStream(storage.dtype, (nnz,), lambda: _range_pieces(parts, "data", storage.dtype)),
        }
    else:
        name = DENSE_FILE
        tensors = {"counts": TensorStream(storage.dtype, (n, V), lambda: _range_pieces(parts, "counts", storage.dtype))}
    Path(out).mkdir(parents=True, exist_ok=True)
    with atomic_path(Path(out) / name) as tmp:
        write_safetensors(tmp, tensors, counts_metadata(total))
    return {
        "path": str(out),
        "counts_file": name,
        "sequences": total.sequences,
        "windows": total.windows,
        "tokens": total.tokens,
        "fingerprint": total.fingerprint,
        "storage": storage.kind,
        "positions_occupied": sum(p["occupied"] for p in parts),
    }
