"""Saving and loading positional counts, atomically, in the storage that suits them.

The storage is chosen by size, not by the in-memory layout (:func:`choose_storage`, the
one place that decides), as whichever of these two files is smaller:

* ``counts.safetensors``: dense, tensor ``counts`` of shape (n, V): ``w n V`` bytes;
* ``counts.csr.safetensors``: CSR rows, tensors ``indptr`` (int64, n + 1), ``indices``
  (token ids, uint16 when V <= 65,536 else int32, sorted within each row) and ``data``
  (the non-zero counts): ``8 (n + 1) + (i + w) nnz`` bytes. A row range reads as three
  slices (:func:`load_rows`), without reading the rest of the file.

(``w`` = 2, 4 or 8 bytes per count: uint16, int32 or int64, the narrowest that holds
every count; ``i`` = 2 or 4 bytes per token id.) Loaders return exact int64 counts either way. Sparse
counts written by older versions (``counts.parquet``, long COO form) still load. Every
file carries the same string-to-string metadata: ``schema``, the
:class:`~posstats.counting.counts.CountSpec` fields, ``sequences``, ``windows``,
``tokens``, ``fingerprint`` and free-form entries prefixed ``meta.``.

Every write goes to a temporary file in the destination folder and is moved into place
with :func:`os.replace` (:func:`posstats.storage.publish.atomic_path`), so a reader never
sees a half-written file.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow.parquet as pq
from safetensors import safe_open

from posstats.counting.blocks import CountBlocks
from posstats.counting.counts import CountAccumulator, CountSpec, PositionalCounts
from posstats.counting.scipy_sparse import sp
from posstats.errors import InputError
from posstats.storage.publish import atomic_path, published_dir

__all__ = [
    "COUNTS_FILES",
    "DENSE_AS_SPARSE_ENTRIES",
    "COUNTS_SCHEMA",
    "SPARSE_FILE",
    "Storage",
    "TensorStream",
    "choose_storage",
    "count_dtype",
    "check_counts_file",
    "csr_from_dense",
    "counts_file",
    "load_counts",
    "load_header",
    "load_indptr",
    "load_rows",
    "load_selected_rows",
    "counts_metadata",
    "index_dtype",
    "save_accumulated",
    "save_blocks",
    "save_counts",
    "write_safetensors",
]

COUNTS_SCHEMA = "posstats.counts/1"
DENSE_FILE = "counts.safetensors"
SPARSE_FILE = "counts.csr.safetensors"
LEGACY_SPARSE_FILE = "counts.parquet"  # long COO form, written before 0.2; read only
COUNTS_FILES = (DENSE_FILE, SPARSE_FILE, LEGACY_SPARSE_FILE)
# Completion markers that name the counts file of their folder: a counts folder's
# count.json, a run-store partial's done.json.
MARKERS = ("count.json", "done.json")




def counts_metadata(counts: PositionalCounts) -> dict[str, str]:
    meta = {
        "schema": COUNTS_SCHEMA,
        **counts.spec.to_metadata(),
        "sequences": str(counts.sequences),
        "windows": str(counts.windows),
        "tokens": str(counts.tokens),
        "fingerprint": counts.fingerprint,
    }
    meta.update({f"meta.{k}": str(v) for k, v in counts.metadata.items()})
    return meta


def _check_nonnegative(matrix, source: Path) -> None:
    """Counts are never negative: a negative cell means a corrupt or hand-edited file."""
    values = matrix.data if sp.issparse(matrix) else matrix
    if values.size == 0 or int(values.min()) >= 0:
        return
    if sp.issparse(matrix):
        coo = matrix.tocoo()
        bad = np.flatnonzero(coo.data < 0)
        where, value = (int(coo.row[bad[0]]), int(coo.col[bad[0]])), int(coo.data[bad[0]])
    else:
        bad = np.flatnonzero(np.asarray(matrix).reshape(-1) < 0)
        where = tuple(int(x) for x in np.unravel_index(bad[0], matrix.shape))
        value = int(matrix[where])
    msg = (f"{source}: {len(bad):,} negative count(s), first C[{where[0]}, {where[1]}] = {value}; "
           "counts are never negative (a corrupt or edited file): count again")
    raise InputError(msg)


def _from_metadata(meta: dict[str, str], matrix, source: Path, *, check: bool = True,
                   check_total: bool = True) -> PositionalCounts:
    if meta.get("schema") != COUNTS_SCHEMA:
        msg = f"{source}: not a posstats counts file (schema {meta.get('schema')!r}, expected {COUNTS_SCHEMA!r})"
        raise InputError(msg)
    spec = CountSpec.from_metadata(meta)
    if tuple(matrix.shape) != (spec.positions, spec.vocab_size):
        msg = f"{source}: counts shape {tuple(matrix.shape)} does not match its metadata ({spec.positions}, {spec.vocab_size})"
        raise InputError(msg)
    totals = {key: _header_int(meta, key, source) for key in ("sequences", "windows", "tokens")}
    if check:
        _check_nonnegative(matrix, source)
    if check and check_total:
        counted = int(matrix.sum(dtype=np.int64)) if sp.issparse(matrix) else int(np.asarray(matrix).sum(dtype=np.int64))
        if counted != totals["tokens"]:
            msg = (f"{source}: its header says {totals['tokens']:,} tokens but its counts add up to {counted:,}; "
                   "the file was changed after counting: count again")
            raise InputError(msg)
    return PositionalCounts(
        spec=spec,
        matrix=matrix,
        **totals,
        fingerprint=meta.get("fingerprint", ""),
        metadata={k[5:]: v for k, v in meta.items() if k.startswith("meta.")},
    )


def _header_int(meta: dict[str, str], key: str, source: Path) -> int:
    """A non-negative integer field of a counts header (InputError naming it otherwise)."""
    text = meta.get(key)
    try:
        value = int(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = -1
    if value < 0:
        msg = f"{source}: header field {key!r} is {text!r}, not a non-negative integer; the file is damaged, count again"
        raise InputError(msg)
    return value


@dataclass(frozen=True)
class Storage:
    """How counts are stored: ``kind`` "dense" or "sparse", the count ``dtype`` (int32 or
    int64) and the file's size in bytes (without its header)."""

    kind: str
    dtype: np.dtype
    nbytes: int


def count_dtype(smallest: int, largest: int, /) -> np.dtype:
    """The narrowest of uint16, int32 and int64 holding every count in ``[smallest, largest]``."""
    if smallest >= 0 and largest < 2**16:
        return np.dtype(np.uint16)
    if -(2**31) <= smallest and largest < 2**31:
        return np.dtype(np.int32)
    return np.dtype(np.int64)


def index_dtype(vocab_size: int, /) -> np.dtype:
    """Token ids of a sparse file: uint16 when ``V <= 2**16``, else int32."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.int32)


def choose_storage(positions: int, vocab_size: int, nnz: int, smallest: int, largest: int, /) -> Storage:
    """The one storage rule: counts as the narrowest of uint16 / int32 / int64 that holds
    them all (:func:`count_dtype`, ``w`` bytes each), and sparse CSR (``8 (n + 1) +
    (i + w) nnz`` bytes, ``i`` = 2 or 4 bytes per token id, :func:`index_dtype`) when it
    is smaller than dense (``w n V`` bytes).

    >>> choose_storage(131072, 50257, 126_000_000, 1, 9_000)
    Storage(kind='sparse', dtype=dtype('uint16'), nbytes=505048584)
    >>> choose_storage(64, 100, 6_000, 0, 3).kind
    'dense'
    """
    dtype = count_dtype(min(smallest, 0), largest)
    dense = positions * vocab_size * dtype.itemsize
    sparse = 8 * (positions + 1) + (index_dtype(vocab_size).itemsize + dtype.itemsize) * nnz
    return Storage("sparse", dtype, sparse) if sparse < dense else Storage("dense", dtype, dense)


def _storage_of(counts: PositionalCounts) -> Storage:
    """:func:`choose_storage` for ``counts`` (one pass over the stored values)."""
    values = counts.matrix.data if counts.is_sparse else np.asarray(counts.matrix)
    nnz = int(np.count_nonzero(values))
    smallest, largest = (int(values.min()), int(values.max())) if values.size else (0, 0)
    return choose_storage(counts.spec.positions, counts.spec.vocab_size, nnz, smallest, largest)


DENSE_AS_SPARSE_ENTRIES = 1 << 25  # n x V at which the analysis holds dense counts as CSR


def csr_from_dense(matrix: np.ndarray, /, *, compact: bool = False, block_entries: int = 1 << 24) -> sp.csr_array:
    """The non-zeros of a dense ``(n, V)`` count matrix as a CSR array, converted a block of
    rows (about ``block_entries`` cells) at a time: the temporaries are one block's, never
    the full matrix's coordinates (``scipy.sparse.csr_array(dense)`` goes through COO and
    holds two int64 coordinate arrays of every non-zero: 16 bytes each, on top of the data).

    Token ids and row pointers are int32 (int64 from 2**31 ids or stored counts); the counts
    are int32 when ``compact`` and every count fits (exact, half the memory of int64), else
    int64.

    >>> csr_from_dense(np.array([[0, 2, 0], [0, 0, 0], [5, 0, 1]]), compact=True).toarray().tolist()
    [[0, 2, 0], [0, 0, 0], [5, 0, 1]]
    """
    matrix = np.asarray(matrix)
    n, V = (int(x) for x in matrix.shape)
    step = max(1, int(block_entries) // max(V, 1))
    fits = compact and (matrix.size == 0 or (int(matrix.min()) >= -(2**31) and int(matrix.max()) < 2**31))
    data_dtype = np.int32 if fits else np.int64
    index = np.int32 if V < 2**31 else np.int64
    per_row = np.zeros(n, dtype=np.int64)
    data, indices = [], []
    for lo in range(0, n, step):
        block = matrix[lo : lo + step]
        rows, cols = np.nonzero(block)
        per_row[lo : lo + block.shape[0]] = np.bincount(rows, minlength=block.shape[0])
        data.append(block[rows, cols].astype(data_dtype))
        indices.append(cols.astype(index))
    nnz = int(per_row.sum())
    if index == np.int32 and nnz >= 2**31:
        index = np.int64
    indptr = np.zeros(n + 1, dtype=index)  # scipy keeps the ids' width only when the pointers share it
    np.cumsum(per_row, out=indptr[1:])
    return sp.csr_array((np.concatenate(data) if data else np.zeros(0, data_dtype),
                         np.concatenate(indices).astype(index, copy=False) if indices else np.zeros(0, index), indptr),
                        shape=(n, V))


def _dense_to_csr(matrix: np.ndarray) -> sp.csr_array:
    """The non-zeros of a dense ``(n, V)`` matrix as a CSR array (rows in order), int64 counts."""
    return csr_from_dense(matrix)


_CHUNK = 1 << 22  # elements converted at a time while writing (small buffers, reused)


def _converted(array: np.ndarray, dtype: np.dtype) -> TensorStream:
    """``array`` as ``dtype``, converted chunk by chunk while it is written (no second
    full-size array)."""
    dtype = np.dtype(dtype)
    if array.dtype == dtype:
        return TensorStream(dtype, array.shape, lambda: iter((array,)))
    chunks = lambda: (array[i : i + _CHUNK].astype(dtype) for i in range(0, array.size, _CHUNK))  # noqa: E731
    return TensorStream(dtype, array.shape, chunks)


def _csr_tensors(matrix, dtype: np.dtype) -> dict[str, np.ndarray | TensorStream]:
    """``indptr`` (int64), ``indices`` (:func:`index_dtype`), ``data`` (``dtype``) of
    counts, zeros dropped."""
    csr = sp.csr_array(matrix) if sp.issparse(matrix) else _dense_to_csr(np.asarray(matrix))
    if not csr.has_canonical_format:
        csr.sum_duplicates()
    if csr.nnz and int(np.count_nonzero(csr.data)) < csr.nnz:
        csr = csr.copy()
        csr.eliminate_zeros()
    return {
        "indptr": csr.indptr.astype(np.int64, copy=False),
        "indices": _converted(csr.indices, index_dtype(csr.shape[1])),
        "data": _converted(csr.data, dtype),
    }


_SAFETENSORS_DTYPES = {np.dtype(np.uint16): "U16", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64"}


@dataclass(frozen=True)
class TensorStream:
    """A tensor written piece by piece: ``dtype``, ``shape`` and ``pieces``, a callable
    returning an iterator of arrays whose bytes, in order, are the tensor's."""

    dtype: np.dtype
    shape: tuple[int, ...]
    pieces: Callable[[], Iterator[np.ndarray]]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def write_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray | TensorStream],
                      metadata: dict[str, str], /) -> None:
    """Write a safetensors file, streaming each array (no in-memory copy of the file).

    Layout: an 8-byte little-endian header length, the JSON header (tensor name -> dtype,
    shape, byte offsets; ``__metadata__``) padded with spaces to 8 bytes, then the raw
    little-endian arrays back to back. A :class:`TensorStream` is written piece by piece,
    so a tensor larger than memory can be assembled from parts.
    """
    streams = {name: t if isinstance(t, TensorStream) else TensorStream(t.dtype, t.shape, lambda t=t: iter((t,)))
               for name, t in tensors.items()}
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, t in streams.items():
        header[name] = {"dtype": _SAFETENSORS_DTYPES[np.dtype(t.dtype)], "shape": list(t.shape),
                        "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for name, t in streams.items():
            written = 0
            for piece in t.pieces():
                piece = np.ascontiguousarray(piece, dtype=np.dtype(t.dtype).newbyteorder("<"))
                f.write(memoryview(piece).cast("B"))
                written += piece.nbytes
            if written != t.nbytes:
                msg = f"{path}: tensor {name} got {written} bytes, its header says {t.nbytes}"
                raise ValueError(msg)


def save_counts(counts: PositionalCounts, directory: str | os.PathLike, /) -> Path:
    """Write ``counts`` into ``directory`` (created if needed) in the storage
    :func:`choose_storage` picks; return the file written. Counts files of another kind
    left from an earlier run are removed after the new one is in place."""
    storage = _storage_of(counts)
    if storage.kind == "sparse":
        return _write_counts(directory, SPARSE_FILE, _csr_tensors(counts.matrix, storage.dtype), counts)
    matrix = counts.matrix.toarray() if counts.is_sparse else np.asarray(counts.matrix)
    return _write_counts(directory, DENSE_FILE, {"counts": matrix.astype(storage.dtype, copy=False)}, counts)


def save_blocks(header: PositionalCounts, blocks: CountBlocks, directory: str | os.PathLike, /) -> Path:
    """:func:`save_counts` of counts held as position blocks (``header``: their totals and
    metadata, :meth:`~posstats.counting.counts.CountAccumulator.header`). A sparse file is
    streamed block by block in its stored dtypes, without assembling a CSR array; a dense
    one (small ``n x V``) is assembled (which empties ``blocks``) and goes through
    :func:`save_counts`."""
    n, V = blocks.shape
    nnz = blocks.nnz
    storage = choose_storage(n, V, nnz, 0, blocks.largest())
    if storage.kind != "sparse":
        return save_counts(dataclasses.replace(header, matrix=blocks.to_csr()), directory)
    index = index_dtype(V)
    tensors = {
        "indptr": blocks.indptr(),
        "indices": TensorStream(index, (nnz,), lambda: blocks.indices(index)),
        "data": TensorStream(storage.dtype, (nnz,), lambda: blocks.data(storage.dtype)),
    }
    return _write_counts(directory, SPARSE_FILE, tensors, header)


def save_accumulated(acc: CountAccumulator, directory: str | os.PathLike,
                     /) -> tuple[Path, PositionalCounts, np.ndarray]:
    """Write what ``acc`` counted (:func:`save_counts`; sparse counts straight from their
    blocks, :func:`save_blocks`); return the file, the counts' header (totals, fingerprint,
    metadata; its matrix is empty for sparse counts) and the occupancy ``occ[i] = sum_v
    C[i, v]`` (int64, shape (n,)). Ends the accumulator."""
    if acc.dense:
        counts = acc.result(copy=False)
        return save_counts(counts, directory), counts, counts.occupancy()
    header, blocks = acc.header(), acc.blocks()
    occupancy = blocks.row_sums()
    return save_blocks(header, blocks, directory), header, occupancy


def _write_counts(directory: str | os.PathLike, name: str, tensors: dict, counts: PositionalCounts) -> Path:
    """Write ``tensors`` as ``directory/name`` (atomically) with the metadata of
    ``counts``, then remove a counts file of the other kind."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / name
    with atomic_path(target) as tmp:
        write_safetensors(tmp, tensors, counts_metadata(counts))
    for other in COUNTS_FILES:
        if other != target.name:
            (directory / other).unlink(missing_ok=True)
    return target


def counts_file(path: str | os.PathLike, /) -> Path:
    """The counts file for ``path``: the file itself, or the one a folder holds.

    For a folder, the file its completion marker (``count.json`` or a run-store
    partial's ``done.json``) names under ``counts_file``, read from the folder's current
    published version (:func:`posstats.storage.publish.published_dir`). Without a marker the one
    counts file present; both kinds present and no marker to choose is an error, never a
    silent pick.
    """
    path = Path(path)
    if path.is_dir():
        folder = published_dir(path)
        for marker in MARKERS:
            named = _named_counts_file(folder / marker)
            if named is not None:
                if not (folder / named).is_file():
                    msg = f"{folder / marker}: names {named}, which is not in {path}; the folder is damaged, count again"
                    raise InputError(msg)
                return folder / named
        present = [folder / name for name in COUNTS_FILES if (folder / name).is_file()]
        if len(present) == 1:
            return present[0]
        if present:
            names = " and ".join(p.name for p in present)
            msg = f"{path}: holds both {names} and no count.json names one; delete the stale one or count again"
            raise InputError(msg)
        msg = f"{path}: no {DENSE_FILE} or {SPARSE_FILE} in this folder (run 'posstats count' first)"
        raise InputError(msg)
    if not path.exists():
        msg = f"{path}: no such file or folder"
        raise InputError(msg)
    return path


def _named_counts_file(marker: Path) -> str | None:
    """The ``counts_file`` a marker names (a plain file name), or None without one."""
    try:
        record = json.loads(marker.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        msg = f"{marker}: unreadable completion marker ({exc})"
        raise InputError(msg) from exc
    name = record.get("counts_file") if isinstance(record, dict) else None
    if name is None:
        return None
    if name not in COUNTS_FILES:
        msg = f"{marker}: counts_file {name!r} is not one of {', '.join(COUNTS_FILES)}"
        raise InputError(msg)
    return name


def load_counts(path: str | os.PathLike, /, *, compact: bool = False, check_total: bool = True) -> PositionalCounts:
    """Load counts saved by :func:`save_counts` (a folder or the file itself); int64.

    ``compact=True`` (sparse files): counts stored as uint16 or int32 are held as int32,
    exact, in half the memory of int64 data (what the analysis of long contexts loads);
    int64 files stay int64. A dense file of :data:`DENSE_AS_SPARSE_ENTRIES` cells or more
    is then held as int32 CSR too (:func:`csr_from_dense`): a dense int64 matrix of
    131,072 positions x 5,000 ids is 5.2 GB, and every analysis step turned it into CSR
    again. The counts must add up to the header's ``tokens`` (a file edited after counting
    is refused); ``check_total=False`` leaves that to the caller
    (:func:`posstats.counting.reduce.load_partial` checks it against its marker)."""
    path = counts_file(path)
    if path.name.endswith(".parquet"):
        return _load_parquet(path)
    with _opened(path) as f:
        meta = dict(f.metadata() or {})
        if "counts" in f.keys():
            matrix = f.get_tensor("counts")
            if compact and matrix.size >= DENSE_AS_SPARSE_ENTRIES:
                matrix = csr_from_dense(matrix, compact=True)
            else:
                matrix = matrix.astype(np.int64, copy=False)
        else:
            data = f.get_tensor("data")
            wide = np.int32 if compact and data.dtype.itemsize <= 4 and data.dtype != np.uint32 else np.int64
            matrix = _csr_from(path, f.get_tensor("indptr"), f.get_tensor("indices"), data, _shape(meta), dtype=wide)
    return _from_metadata(meta, matrix, path, check_total=check_total)


def load_header(path: str | os.PathLike, /) -> PositionalCounts:
    """The spec, totals, fingerprint and metadata of saved counts, without their counts:
    the returned ``matrix`` is an empty (all-zero) CSR array of shape (n, V)."""
    path = counts_file(path)
    if path.name.endswith(".parquet"):
        counts = _load_parquet(path)
        meta = counts_metadata(counts)
    else:
        with _opened(path) as f:
            meta = dict(f.metadata() or {})
            _check_tensor_shapes(f, _shape(meta), path)
    return _from_metadata(meta, sp.csr_array(_shape(meta), dtype=np.int64), path, check=False)


def _check_tensor_shapes(f: Any, shape: tuple[int, int], path: Path) -> None:
    """The stored tensors have the shapes the header's positions and vocabulary give (read
    from the file's header only): readers that take rows one block at a time rely on it."""
    n, V = shape
    keys = set(f.keys())
    if "counts" in keys:
        got, want = tuple(f.get_slice("counts").get_shape()), (n, V)
    else:
        missing = {"indptr", "indices", "data"} - keys
        if missing:
            msg = f"{path}: not a counts file (no {sorted(missing)[0]!r} tensor); the file is damaged, count again"
            raise InputError(msg)
        got, want = tuple(f.get_slice("indptr").get_shape()), (n + 1,)
        nnz = (tuple(f.get_slice("indices").get_shape()), tuple(f.get_slice("data").get_shape()))
        if nnz[0] != nnz[1]:
            msg = f"{path}: damaged sparse counts ({nnz[0]} token ids but {nnz[1]} counts); count again"
            raise InputError(msg)
    if got != want:
        msg = f"{path}: damaged counts (stored shape {got}, its header's positions and vocabulary give {want}); count again"
        raise InputError(msg)


def load_indptr(path: str | os.PathLike, /) -> np.ndarray | None:
    """The (n + 1,) row pointers of a sparse counts file (how many stored counts each row
    range holds, without reading them), or None for a dense or Parquet file."""
    path = counts_file(path)
    if path.name.endswith(".parquet"):
        return None
    with _opened(path) as f:
        return f.get_tensor("indptr").astype(np.int64) if "indptr" in f.keys() else None


def load_rows(path: str | os.PathLike, start: int, stop: int, /, *, check: bool = True,
              dtype: Any = np.int64) -> sp.csr_array:
    """Rows ``[start, stop)`` of saved counts as an int64 CSR array of shape
    ``(stop - start, V)``, reading only those rows of a safetensors counts file.
    ``check=False`` skips the structural and sign checks of the rows (for files already
    verified against a checksum). ``dtype=None`` keeps a sparse file's stored integer type
    (the narrowest that holds its counts: half or a quarter of int64's memory)."""
    path = counts_file(path)
    if path.name.endswith(".parquet"):
        return sp.csr_array(_load_parquet(path).to_sparse().matrix[start:stop])
    with _opened(path) as f:
        meta = dict(f.metadata() or {})
        n, V = _shape(meta)
        if not 0 <= start <= stop <= n:
            msg = f"rows [{start}, {stop}) are outside the {n} positions of {path}"
            raise ValueError(msg)
        if "counts" in f.keys():
            rows = sp.csr_array(f.get_slice("counts")[start:stop].astype(np.int64, copy=False))
        else:
            bounds = f.get_slice("indptr")[start : stop + 1].astype(np.int64)
            lo, hi = int(bounds[0]), int(bounds[-1])
            # (safetensors refuses an empty slice at the end of a tensor)
            indices = f.get_slice("indices")[lo:hi] if hi > lo else np.zeros(0, np.int32)
            data = f.get_slice("data")[lo:hi] if hi > lo else np.zeros(0, np.int64)
            rows = _csr_from(path, bounds - lo, indices, data, (stop - start, V), check=check,
                             dtype=data.dtype if dtype is None else dtype)
    if check:
        _check_nonnegative(rows, path)
    return rows


_CHECK_BLOCK_ENTRIES = 1 << 24  # stored counts read at a time by check_counts_file


def check_counts_file(path: str | os.PathLike, /) -> PositionalCounts:
    """Every check :func:`load_counts` makes of a counts file (structure, signs, the header's
    token total), reading a sparse file a block of rows at a time instead of whole
    (memory: about ``_CHECK_BLOCK_ENTRIES`` stored counts); returns its header
    (:func:`load_header`). A dense or Parquet file is loaded whole.

    Raises:
        InputError: naming the file and what is wrong, as :func:`load_counts` does.
    """
    path = counts_file(path)
    indptr = load_indptr(path)
    if indptr is None:
        return load_counts(path)
    header = load_header(path)
    steps = np.diff(indptr)
    if indptr.size and (int(indptr[0]) != 0 or bool(np.any(steps < 0))):
        msg = f"{path}: damaged sparse counts (indptr must be a non-decreasing sequence starting at 0); count again"
        raise InputError(msg)
    total, row, n = 0, 0, int(indptr.size - 1)
    while row < n:
        stop = min(max(int(np.searchsorted(indptr, int(indptr[row]) + _CHECK_BLOCK_ENTRIES, side="right")) - 1,
                       row + 1), n)
        total += int(load_rows(path, row, stop, dtype=None).sum(dtype=np.int64))
        row = stop
    if total != header.tokens:
        msg = (f"{path}: its header says {header.tokens:,} tokens but its counts add up to {total:,}; "
               "the file was changed after counting: count again")
        raise InputError(msg)
    return header


def load_selected_rows(path: str | os.PathLike, rows: Any, /) -> sp.csr_array:
    """(len(rows), V) int64 counts of the given rows of saved counts (any order), reading
    only those rows of a safetensors counts file (one slice per row: for a few thousand
    rows of a large file, such as the report's distance sample); a Parquet file is read
    whole."""
    rows = np.asarray(rows, dtype=np.int64).ravel()
    path = counts_file(path)
    if path.name.endswith(".parquet"):
        return sp.csr_array(_load_parquet(path).to_sparse().matrix[rows])
    with _opened(path) as f:
        n, V = _shape(dict(f.metadata() or {}))
        if rows.size and not (0 <= int(rows.min()) and int(rows.max()) < n):
            msg = f"rows {int(rows.min())}..{int(rows.max())} are outside the {n} positions of {path}"
            raise ValueError(msg)
        if "counts" in f.keys():
            dense = f.get_slice("counts")
            out = sp.csr_array(np.vstack([dense[int(r) : int(r) + 1] for r in rows]).astype(np.int64, copy=False)
                               if rows.size else np.zeros((0, V), dtype=np.int64))
        else:
            indptr = f.get_slice("indptr")[:].astype(np.int64)
            lengths = indptr[rows + 1] - indptr[rows]
            indices = np.empty(int(lengths.sum()), dtype=np.int64)
            data = np.empty(indices.size, dtype=np.int64)
            at = 0
            for r, size in zip(rows.tolist(), lengths.tolist(), strict=True):
                if size:
                    indices[at : at + size] = f.get_slice("indices")[int(indptr[r]) : int(indptr[r]) + size]
                    data[at : at + size] = f.get_slice("data")[int(indptr[r]) : int(indptr[r]) + size]
                    at += size
            out = _csr_from(path, np.concatenate([[0], np.cumsum(lengths)]), indices, data, (rows.size, V),
                            check=True, dtype=np.int64)
    _check_nonnegative(out, path)
    return out


@contextmanager
def _opened(path: Path):
    """``safe_open`` of a counts file; unreadable -> InputError naming the file."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            yield f
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors raises several kinds
        msg = f"{path}: not a readable safetensors counts file ({exc})"
        raise InputError(msg) from exc


def _shape(meta: dict[str, str]) -> tuple[int, int]:
    try:
        return int(meta["positions"]), int(meta["vocab_size"])
    except (KeyError, ValueError):
        return (0, 0)


def _csr_from(path: Path, indptr, indices, data, shape: tuple[int, int], *, check: bool = True,
              dtype: Any = np.int64) -> sp.csr_array:
    """An int64 (or ``dtype``) CSR array from stored tensors, checked unless ``check=False``
    (InputError naming ``path``)."""
    # int32 row pointers too (while nnz < 2**31): with int64 ones scipy widens the indices
    # to int64, a copy twice their stored size that every consumer then holds
    index = np.int32 if (int(indptr[-1]) if len(indptr) else 0) < 2**31 else np.int64
    try:
        matrix = sp.csr_array((data.astype(dtype, copy=False), indices.astype(index, copy=False),
                               indptr.astype(index, copy=False)), shape=shape)
        matrix.check_format(full_check=check)
    except ValueError as exc:
        msg = f"{path}: damaged sparse counts ({exc}); count again"
        raise InputError(msg) from exc
    # posstats writes each row's token ids sorted and unique; a repeated id would be summed
    # silently by every consumer, an unsorted one breaks the merges
    if check and not matrix.has_canonical_format:
        msg = f"{path}: damaged sparse counts (a row repeats a token id or lists them out of order); count again"
        raise InputError(msg)
    return matrix


def _load_parquet(path: Path) -> PositionalCounts:
    try:
        table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds
        msg = f"{path}: not a valid Parquet counts file ({exc})"
        raise InputError(msg) from exc
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    missing = {"position", "token", "count"} - set(table.column_names)
    if missing:
        msg = f"{path}: missing column(s) {sorted(missing)} in a counts table"
        raise InputError(msg)
    spec = CountSpec.from_metadata(meta) if meta.get("schema") == COUNTS_SCHEMA else None
    shape = (spec.positions, spec.vocab_size) if spec else (0, 0)
    rows = table.column("position").to_numpy()
    cols = table.column("token").to_numpy()
    data = table.column("count").to_numpy().astype(np.int64)
    matrix = sp.csr_array((data, (rows, cols)), shape=shape, dtype=np.int64) if spec else np.zeros(shape)
    return _from_metadata(meta, matrix, path)
