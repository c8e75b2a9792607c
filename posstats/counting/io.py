"""Saving and loading positional counts, atomically.

Dense counts go to ``counts.safetensors`` (tensor ``counts``, int64, shape (n, V));
sparse counts go to ``counts.parquet`` in long COO form (``position`` int32,
``token`` int32, ``count`` int64). Both carry the same string-to-string metadata:
``schema``, the :class:`~posstats.counting.counts.CountSpec` fields, ``sequences``, ``windows``,
``tokens``, ``fingerprint`` and free-form entries prefixed ``meta.``.

Every write goes to a temporary file in the destination folder and is moved into place
with :func:`os.replace` (:func:`posstats.runs.publish.atomic_path`), so a reader never
sees a half-written file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp
from safetensors import safe_open
from safetensors.numpy import save_file

from posstats.counting.counts import CountSpec, PositionalCounts
from posstats.errors import InputError, PosstatsError
from posstats.runs.publish import atomic_path, published_dir

__all__ = [
    "COUNTS_FILES",
    "COUNTS_SCHEMA",
    "counts_file",
    "load_counts",
    "read_json_file",
    "save_counts",
    "write_json_atomic",
]

COUNTS_SCHEMA = "posstats.counts/1"
DENSE_FILE = "counts.safetensors"
SPARSE_FILE = "counts.parquet"
COUNTS_FILES = (DENSE_FILE, SPARSE_FILE)
# Completion markers that name the counts file of their folder: a counts folder's
# count.json, a run-store partial's done.json.
MARKERS = ("count.json", "done.json")


def write_json_atomic(path: str | os.PathLike, obj: Any, /) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically; return the path."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, allow_nan=True) + "\n")
    return Path(path)


def read_json_file(path: str | os.PathLike, /, *, what: str) -> dict[str, Any] | None:
    """Parse a JSON file; None when it does not exist.

    Raises:
        PosstatsError: ``"<path>: unreadable <what> (<reason>)"`` for a file that exists but
            cannot be read or parsed.
    """
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        msg = f"{path}: unreadable {what} ({exc})"
        raise PosstatsError(msg) from exc


def _metadata(counts: PositionalCounts) -> dict[str, str]:
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


def _from_metadata(meta: dict[str, str], matrix, source: Path) -> PositionalCounts:
    if meta.get("schema") != COUNTS_SCHEMA:
        msg = f"{source}: not a posstats counts file (schema {meta.get('schema')!r}, expected {COUNTS_SCHEMA!r})"
        raise InputError(msg)
    spec = CountSpec.from_metadata(meta)
    if tuple(matrix.shape) != (spec.positions, spec.vocab_size):
        msg = f"{source}: counts shape {tuple(matrix.shape)} does not match its metadata ({spec.positions}, {spec.vocab_size})"
        raise InputError(msg)
    _check_nonnegative(matrix, source)
    return PositionalCounts(
        spec=spec,
        matrix=matrix,
        sequences=int(meta["sequences"]),
        windows=int(meta["windows"]),
        tokens=int(meta["tokens"]),
        fingerprint=meta.get("fingerprint", ""),
        metadata={k[5:]: v for k, v in meta.items() if k.startswith("meta.")},
    )


def _int32_if_fits(matrix: np.ndarray, /) -> np.ndarray:
    """``matrix`` as int32 when every entry fits, else as int64 (C-contiguous)."""
    info = np.iinfo(np.int32)
    if matrix.size and info.min <= int(matrix.min()) and int(matrix.max()) <= info.max:
        return matrix.astype(np.int32, order="C")
    return np.ascontiguousarray(matrix, dtype=np.int64)


def save_counts(counts: PositionalCounts, directory: str | os.PathLike, /, *, narrow: bool = False) -> Path:
    """Write ``counts`` into ``directory`` (created if needed); return the file written.

    Dense counts -> ``counts.safetensors``; sparse -> ``counts.parquet``. A file of the
    other kind left from an earlier run is removed after the new one is in place.
    ``narrow=True`` stores dense counts as int32 when every count fits (a shard of fewer
    than 2**31 tokens always does): half the bytes to write and read back, which is most
    of a counting worker's per-shard overhead. :func:`load_counts` returns int64 either way.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta = _metadata(counts)
    if counts.is_sparse:
        target, stale = directory / SPARSE_FILE, directory / DENSE_FILE
        coo = counts.matrix.tocoo()
        table = pa.table(
            {
                "position": pa.array(coo.row.astype(np.int32)),
                "token": pa.array(coo.col.astype(np.int32)),
                "count": pa.array(coo.data.astype(np.int64)),
            }
        ).replace_schema_metadata(meta)
        with atomic_path(target) as tmp:
            pq.write_table(table, tmp)
    else:
        target, stale = directory / DENSE_FILE, directory / SPARSE_FILE
        with atomic_path(target) as tmp:
            matrix = _int32_if_fits(counts.matrix) if narrow else np.ascontiguousarray(counts.matrix, dtype=np.int64)
            save_file({"counts": matrix}, str(tmp), metadata=meta)
    stale.unlink(missing_ok=True)
    return target


def counts_file(path: str | os.PathLike, /) -> Path:
    """The counts file for ``path``: the file itself, or the one a folder holds.

    For a folder, the file its completion marker (``count.json`` or a run-store
    partial's ``done.json``) names under ``counts_file``, read from the folder's current
    published version (:func:`posstats.runs.publish.published_dir`). Without a marker the one
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
            msg = f"{path}: holds both {DENSE_FILE} and {SPARSE_FILE} and no count.json names one; delete the stale one or count again"
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


def load_counts(path: str | os.PathLike, /) -> PositionalCounts:
    """Load counts saved by :func:`save_counts` (a folder or the file itself)."""
    path = counts_file(path)
    loader: Callable[[Path], PositionalCounts] = _load_parquet if path.suffix == ".parquet" else _load_safetensors
    return loader(path)


def _load_safetensors(path: Path) -> PositionalCounts:
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = dict(f.metadata() or {})
            matrix = f.get_tensor("counts")
    except Exception as exc:  # noqa: BLE001 - safetensors raises several kinds
        msg = f"{path}: not a readable safetensors counts file ({exc})"
        raise InputError(msg) from exc
    return _from_metadata(meta, matrix.astype(np.int64, copy=False), path)


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
