"""Reading and writing the counts by window group (:mod:`posstats.counting.window_groups`)
next to the counts they belong to: ``OUT/window-groups.safetensors`` of a counts folder.

The file holds the ((K + 1 + C) n, V) CSR matrix (``indptr``, ``indices``, ``data``) and, as
metadata, K, n, the length classes C (n - 1 or 0; a file without the entry has none), the full
windows, the tokens and the counts' fingerprint; :func:`load_window_groups`
refuses a file that does not add up to the counts beside it (one line naming the file).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from posstats.counting.blocks import narrow_count_dtype
from posstats.counting.counts import PositionalCounts
from posstats.counting.io import TensorStream, _csr_from, _opened, index_dtype, write_safetensors
from posstats.counting.window_groups import WindowGroupCounter, WindowGroups
from posstats.errors import InputError
from posstats.storage.publish import atomic_path, published_dir

__all__ = ["WINDOW_GROUPS_FILE", "load_window_groups", "save_window_group_blocks", "save_window_groups",
           "window_groups_file"]

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
                  classes=groups.classes)


def save_window_group_blocks(counter: WindowGroupCounter, counts: PositionalCounts,
                             directory: str | os.PathLike, /) -> tuple[Path, dict[str, int]]:
    """:func:`save_window_groups` of what ``counter`` counted, streamed from its position
    blocks (:meth:`~posstats.counting.window_groups.WindowGroupCounter.finish`): no CSR
    matrix and no scipy, as ``posstats count`` writes its counts. Returns the file and
    ``{"groups": K, "windows": full windows}``."""
    blocks, rows = counter.finish()
    indptr = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(blocks.row_nnz()[rows], out=indptr[1:])  # the padding rows hold no entry
    nnz = int(indptr[-1])
    index, count = index_dtype(counter.vocab_size), narrow_count_dtype(blocks.largest())
    tensors = {"indptr": indptr,
               "indices": TensorStream(index, (nnz,), lambda: blocks.indices(index)),
               "data": TensorStream(count, (nnz,), lambda: blocks.data(count))}
    path = _write(directory, tensors, counter.groups, counter.positions, counter.vocab_size, counter.windows, counts,
                  classes=counter.classes)
    return path, {"groups": counter.groups, "windows": counter.windows}


def _write(directory: str | os.PathLike, tensors: dict, groups: int, positions: int, vocab: int, windows: int,
           counts: PositionalCounts, *, classes: int) -> Path:
    target = Path(directory) / WINDOW_GROUPS_FILE
    meta = {"schema": _SCHEMA, "groups": str(groups), "positions": str(positions), "vocab_size": str(vocab),
            "classes": str(classes), "windows": str(windows), "tokens": str(counts.tokens),
            "fingerprint": counts.fingerprint}
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


def load_window_groups(path: str | os.PathLike, counts: PositionalCounts, /) -> WindowGroups | None:
    """The counts by window group stored beside the counts at ``path``, or None without a
    file. Raises InputError (naming the file) when it is unreadable or does not belong to
    ``counts`` (other positions, vocabulary, tokens or fingerprint)."""
    target = window_groups_file(path)
    if target is None:
        return None
    with _opened(target) as f:
        meta = dict(f.metadata() or {})
        if meta.get("schema") != _SCHEMA:
            msg = f"{target}: schema {meta.get('schema')!r} is not {_SCHEMA!r}; count again"
            raise InputError(msg)
        try:
            k, n, vocab = int(meta["groups"]), int(meta["positions"]), int(meta["vocab_size"])
            windows, tokens = int(meta["windows"]), int(meta["tokens"])
            classes = int(meta.get("classes", "0"))  # written before length classes: none
        except (KeyError, ValueError) as exc:
            msg = f"{target}: metadata entry {exc} missing or not an integer; count again"
            raise InputError(msg) from exc
        expected = (counts.positions, counts.vocab_size, counts.tokens, counts.fingerprint)
        found = (n, vocab, tokens, meta.get("fingerprint", ""))
        if found != expected:
            msg = (f"{target}: belongs to other counts (positions, vocabulary, tokens, fingerprint {found} against "
                   f"{expected}); count again")
            raise InputError(msg)
        if k < 1:
            msg = f"{target}: groups = {k}, must be >= 1; count again"
            raise InputError(msg)
        if classes not in (0, n - 1):
            msg = f"{target}: classes = {classes}, must be 0 or {n - 1} (positions - 1); count again"
            raise InputError(msg)
        rows = (k + 1 + classes) * n
        indptr = f.get_tensor("indptr")
        if indptr.shape != (rows + 1,):
            msg = (f"{target}: {indptr.shape[0] - 1:,} rows stored, the header's {k} groups of {n} positions, "
                   f"their tail and {classes} length classes need {rows:,}; count again")
            raise InputError(msg)
        matrix = _csr_from(target, indptr, f.get_tensor("indices"), f.get_tensor("data"), (rows, vocab))
    if int(matrix.sum()) != tokens:
        msg = f"{target}: holds {int(matrix.sum()):,} tokens, the counts {tokens:,}; count again"
        raise InputError(msg)
    return WindowGroups(k, n, matrix, windows, classes)
