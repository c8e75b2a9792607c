"""The run store: per-shard partial counts with completion markers, results, a manifest, a lock.

Layout of a store folder ``STORE``::

    STORE/store.json                 what the store counts (spec, reader options, tokenizer
                                     hash); written once, checked by every later run
    STORE/lock                       held (flock) by the one run using the store; holds its
                                     pid, hostname, start time and run id
    STORE/partials/<shard_id>/counts.safetensors | counts.parquet
                                     the shard's exact partial counts (posstats.counting.io;
                                     sparse when under 1/8 of the cells are non-zero)
    STORE/partials/<shard_id>/done.json
                                     completion marker, written last (atomically): the shard,
                                     its totals, the counts file, who counted it and when
    STORE/partials/<shard_id>/started.json
                                     a note (pid, node, time) written when counting starts
    STORE/runs/<run_id>.json         the run record: status, shards planned / counted /
                                     reused, bad shards with their errors
    STORE/reduce/<run_id>/...        tree-reduce intermediates (removed after the run)
    STORE/results/<name>/counts.*    reduced totals; the manifest names the current one
    STORE/manifest.json              written last by every successful run: the shards in
                                     the current result, bad shards skipped, the result
                                     folder, totals and fingerprint

Rules that make runs exact and resumable:

* A shard whose marker exists is never counted again; a marker is written only after its
  counts file is complete (both atomic: temp file + ``os.replace``), so a counter killed
  mid-shard leaves no marker and the shard is counted again, once.
* Partials are keyed by content-derived shard ids (:mod:`posstats.corpus.shards`), and a store
  is bound to one counting configuration (``store.json``), so a marked partial is always
  the right one to reuse.
* Reductions read partials in sorted shard-id order; integer sums and the XOR of
  fingerprints do not depend on the order anyway.
* Every name that becomes a path here (run ids, shard ids, result folder names, the
  manifest's ``result``) passes :func:`posstats.ids.validate_id` first: nothing a user
  types (``--run-id ../../x``) or a store file says can reach outside ``STORE``.

Integrity of partials (:func:`load_partial`, used by :func:`sum_partials` for every item
that is a marked partial): the marker records the totals of the partial and ``sha256``,
the SHA-256 of its counts file, taken when :meth:`RunStore.write_partial` writes it. A
partial read for a reduction must have that checksum (markers of older stores have none:
then only the totals are checked) and a matrix whose sum equals both the marker's and the
file's ``tokens``. Otherwise it is corrupt: :class:`CorruptPartialError`, one line naming
the partial and the two totals. The Ray counting job (``jobs/count.py``) does not stop
there: it logs the corrupt partial, deletes it (marker first) and counts that shard
again, exactly like a shard that never got its marker, then reduces again (once; a
partial still corrupt after its recount fails the run). A corrupt partial of a shard
that left the corpus (a refresh subtracting it) is deleted and the total is summed from
the remaining partials instead. Elsewhere (the noise floor from a store) the error tells
the user to delete the partial and rerun.

Lock rule (:meth:`RunStore.lock`): a run takes an exclusive ``flock`` on ``STORE/lock``
for its whole duration and writes its pid, hostname, start time and run id into the file.
The kernel drops the flock when the process ends, even by SIGKILL, so a lock left by a
dead run never blocks the next one. A second run while the first lives refuses with a
one-line message naming the holder. Where the file system has no ``flock``, the pid rule
is used instead: the lock is stale when its hostname is this host and its pid is gone
(or now belongs to a process started after the lock); a lock from another host is never
presumed stale.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import errno
import hashlib
import json
import os
import shutil
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from posstats.processes import pid_alive, process_start_ticks
from posstats.counting.counts import CountSpec, PositionalCounts, combine_fingerprints
from posstats.errors import InputError, PosstatsError
from posstats.ids import validate_id
from posstats.counting.io import counts_file, load_counts, save_counts, write_json_atomic

__all__ = [
    "STORE_SCHEMA",
    "CorruptPartialError",
    "LockInfo",
    "RunStore",
    "compact_counts",
    "config_key",
    "file_sha256",
    "load_partial",
    "lock_is_stale",
    "sum_partials",
]

STORE_SCHEMA = "posstats.store/1"
MARKER = "done.json"
STARTED = "started.json"


def config_key(config: dict[str, Any], /) -> str:
    """sha256 of the canonical JSON of a counting configuration (16 hex digits)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def file_sha256(path: str | os.PathLike, /) -> str:
    """SHA-256 (64 hex digits) of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            digest.update(view[:n])
    return digest.hexdigest()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        msg = f"{path}: unreadable run-store file ({exc})"
        raise PosstatsError(msg) from exc


# ----------------------------------------------------------------------------- lock

LockInfo = dict  # {"pid", "hostname", "started", "start_ticks", "run_id", "command"}


_pid_alive = pid_alive
_proc_start_ticks = process_start_ticks


def lock_is_stale(info: LockInfo, /, *, hostname: str | None = None) -> bool:
    """The pid rule: a lock is stale when it was taken on this host by a process that is
    gone (or whose pid now belongs to a process started later). A lock from another host
    is never presumed stale; an empty or unreadable lock is stale."""
    if not info or "pid" not in info:
        return True
    if info.get("hostname") != (hostname or socket.gethostname()):
        return False
    pid = int(info["pid"])
    if not _pid_alive(pid):
        return True
    recorded, current = info.get("start_ticks"), _proc_start_ticks(pid)
    return recorded is not None and current is not None and int(recorded) != current


def _describe_lock(info: LockInfo) -> str:
    if not info:
        return "another run"
    return (
        f"run {info.get('run_id', '?')!s} ({info.get('command', '?')}, pid {info.get('pid', '?')} on "
        f"{info.get('hostname', '?')}, started {info.get('started', '?')})"
    )


class _Lock:
    def __init__(self, path: Path, info: LockInfo) -> None:
        self.path, self.info = path, info
        self._fd: int | None = None

    def acquire(self) -> None:
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            held = exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
            holder = self._read()
            if held or not lock_is_stale(holder):
                os.close(fd)
                msg = (
                    f"run store {self.path.parent} is in use by {_describe_lock(holder)}; "
                    f"wait for it to finish, or use another --store"
                )
                if not held:
                    msg += f" (no flock on this file system: delete {self.path} if that run is dead)"
                raise PosstatsError(msg) from None
            # No flock here and the holder is dead on this host: take over (pid rule).
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(self.info) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def _read(self) -> LockInfo:
        try:
            return json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}

    def release(self) -> None:
        if self._fd is None:
            return
        # Never unlink: another process may already wait on this inode. Emptying it marks
        # the store as free for the pid rule too.
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)
        self._fd = None


# ----------------------------------------------------------------------------- store


class RunStore:
    """A run-store folder (see the module docstring for the layout and the rules)."""

    def __init__(self, root: str | os.PathLike, /) -> None:
        self.root = Path(root)

    # -- configuration -------------------------------------------------------------

    @property
    def config_path(self) -> Path:
        return self.root / "store.json"

    def config(self) -> dict[str, Any] | None:
        """The configuration this store is bound to, or None for a new store."""
        return _read_json(self.config_path)

    def bind(self, config: dict[str, Any], /) -> dict[str, Any]:
        """Bind a new store to ``config`` (counting spec + reader options), or check that an
        existing store was made with the same one; return the stored record.

        Raises:
            PosstatsError: the store holds counts of another configuration.
        """
        key = config_key(config)
        current = self.config()
        if current is None:
            record = {"schema": STORE_SCHEMA, "key": key, "config": config, "created": _now()}
            write_json_atomic(self.config_path, record)
            return record
        if current.get("schema") != STORE_SCHEMA:
            msg = f"{self.root}: not a posstats run store (schema {current.get('schema')!r})"
            raise PosstatsError(msg)
        if current.get("key") != key:
            old, new = current.get("config", {}), config
            diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            detail = "; ".join(f"{k}: {old.get(k)!r} in the store, {new.get(k)!r} now" for k in diff)
            msg = f"run store {self.root} holds counts of another configuration ({detail}); use another --store"
            raise PosstatsError(msg)
        return current

    # -- lock ----------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, *, run_id: str, command: str) -> Iterator[LockInfo]:
        """Hold the store's lock for a run (see the lock rule in the module docstring).

        Raises:
            PosstatsError: ``"run store S is in use by run R (count, pid P on H, started T)..."``.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        info = {
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "started": _now(),
            "start_ticks": _proc_start_ticks(os.getpid()),
            "run_id": run_id,
            "command": command,
        }
        lock = _Lock(self.root / "lock", info)
        lock.acquire()
        try:
            yield info
        finally:
            lock.release()

    # -- partials --------------------------------------------------------------------

    def partial_dir(self, shard_id: str, /) -> Path:
        return self.root / "partials" / validate_id(shard_id, kind="shard id")

    def marker(self, shard_id: str, /) -> dict[str, Any] | None:
        """The completion marker of a shard, or None when it is not (completely) counted."""
        return _read_json(self.partial_dir(shard_id) / MARKER)

    def is_done(self, shard_id: str, /) -> bool:
        return (self.partial_dir(shard_id) / MARKER).is_file()

    def mark_started(self, shard_id: str, /, **info: Any) -> None:
        """Note who started counting a shard (diagnostics; never read for correctness)."""
        write_json_atomic(self.partial_dir(shard_id) / STARTED, {"started": _now(), **info})

    def write_partial(self, shard: Any, counts: PositionalCounts, /, **info: Any) -> dict[str, Any]:
        """Persist a shard's partial counts, then its completion marker; return the marker.

        ``shard`` is a :class:`posstats.corpus.shards.Shard`. The counts are stored sparse when
        that is smaller (see :func:`compact_counts`), dense ones as int32 when they fit.
        The marker records the totals and the SHA-256 of the counts file (``sha256``),
        checked by :func:`load_partial` when the partial is reduced.
        """
        directory = self.partial_dir(shard.shard_id)
        path = save_counts(compact_counts(counts), directory, narrow=True)
        marker = {
            "shard": shard.to_dict(),
            "counts_file": path.name,
            # read back from the page cache just written (posstats.counting.io writes the file)
            "sha256": file_sha256(path),
            "sequences": counts.sequences,
            "windows": counts.windows,
            "tokens": counts.tokens,
            "fingerprint": counts.fingerprint,
            "finished": _now(),
            **info,
        }
        write_json_atomic(directory / MARKER, marker)
        return marker

    def remove_partial(self, shard_id: str, /) -> None:
        """Delete a shard's partial: the marker first, so a half-deleted partial is never done."""
        directory = self.partial_dir(shard_id)
        (directory / MARKER).unlink(missing_ok=True)
        shutil.rmtree(directory, ignore_errors=True)

    def done_ids(self) -> set[str]:
        """Ids of every shard with a marker in the store."""
        base = self.root / "partials"
        if not base.is_dir():
            return set()
        return {p.name for p in base.iterdir() if (p / MARKER).is_file()}

    # -- runs, results, manifest -------------------------------------------------------

    def run_path(self, run_id: str, /) -> Path:
        return self.root / "runs" / f"{validate_id(run_id, kind='run id')}.json"

    def read_run(self, run_id: str, /) -> dict[str, Any] | None:
        return _read_json(self.run_path(run_id))

    def write_run(self, run_id: str, record: dict[str, Any], /) -> None:
        write_json_atomic(self.run_path(run_id), record)

    def reduce_dir(self, run_id: str, /) -> Path:
        return self.root / "reduce" / validate_id(run_id, kind="run id")

    def new_result_dir(self, run_id: str, /) -> Path:
        """A fresh folder ``results/<run id>-<UTC time>-<i>`` for a run's reduced total
        (never an existing one); a long run id is cut so that the name stays valid."""
        validate_id(run_id, kind="run id")
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
        base = self.root / "results"
        for i in range(1000):
            path = base / validate_id(f"{run_id[:100]}-{stamp}-{i}", kind="result name")
            if not path.exists():
                return path
        msg = f"{base}: cannot pick a new result folder"
        raise PosstatsError(msg)

    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    def manifest(self) -> dict[str, Any] | None:
        """The manifest of the last successful run, or None."""
        return _read_json(self.manifest_path)

    def result_file(self, manifest: dict[str, Any] | None = None, /) -> Path | None:
        """The counts file of the current result, or None when there is none."""
        manifest = self.manifest() if manifest is None else manifest
        if not manifest or not manifest.get("result"):
            return None
        result = str(manifest["result"])
        parts = result.split("/")
        if len(parts) != 2 or parts[0] != "results":
            msg = f"{self.manifest_path}: result {result!r} is not a folder results/<name> of the store"
            raise PosstatsError(msg)
        validate_id(parts[1], kind="result name")
        try:
            return counts_file(self.root / result)
        except InputError:
            return None

    def publish(self, manifest: dict[str, Any], /) -> None:
        """Write the manifest (the store's completion marker), then drop results it no longer names."""
        write_json_atomic(self.manifest_path, manifest)
        keep = manifest.get("result")
        base = self.root / "results"
        if base.is_dir():
            for p in base.iterdir():
                if p.is_dir() and os.path.join("results", p.name) != keep:
                    shutil.rmtree(p, ignore_errors=True)

    def clean_temporary(self, run_id: str, /) -> None:
        """Remove a run's reduce folder and temp files left by killed writers.

        Call only while holding the lock, after every counter of the run has stopped.
        """
        shutil.rmtree(self.reduce_dir(run_id), ignore_errors=True)
        base = self.root / "partials"
        if base.is_dir():
            for tmp in base.glob("*/.*.tmp"):
                tmp.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- counts


def _dense_to_csr(matrix: np.ndarray) -> sp.csr_array:
    n, V = matrix.shape
    flat = matrix.reshape(-1)
    nz = np.flatnonzero(flat)
    rows = nz // V
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    return sp.csr_array((flat[nz], (nz - rows * V), indptr), shape=(n, V), dtype=np.int64)


def compact_counts(counts: PositionalCounts, /) -> PositionalCounts:
    """The same counts in the storage that suits them: sparse when fewer than ``n V / 8``
    cells are non-zero (Parquet COO, 16 bytes per non-zero: at most a quarter of the dense
    ``8 n V`` bytes), else dense. Exact either way.

    Writing a dense safetensors file runs at memory speed while a COO table costs about
    0.1 us per non-zero, so sparse storage is chosen only where it saves a lot of space.
    """
    n, V = counts.spec.positions, counts.spec.vocab_size
    if counts.is_sparse:
        matrix = counts.matrix.copy()
        matrix.eliminate_zeros()
        if matrix.nnz * 8 < n * V:
            return dataclasses.replace(counts, matrix=matrix)
        return counts.to_dense()
    nnz = int(np.count_nonzero(counts.matrix))
    if nnz * 8 < n * V:
        return PositionalCounts(counts.spec, _dense_to_csr(counts.matrix), counts.sequences, counts.windows,
                                counts.tokens, counts.fingerprint, dict(counts.metadata))
    return counts


class CorruptPartialError(PosstatsError):
    """A marked partial whose counts file does not match its marker (see the module
    docstring). ``path`` is the partial's folder as given, ``detail`` the message without
    the advice to delete it."""

    path: str = ""
    detail: str = ""


def _matrix_total(counts: PositionalCounts) -> int:
    if counts.is_sparse:
        return int(counts.matrix.data.sum(dtype=np.int64))
    return int(np.asarray(counts.matrix).sum(dtype=np.int64))


def load_partial(path: str | os.PathLike, /) -> PositionalCounts:
    """Load saved counts; when ``path`` is a marked partial (its folder holds ``done.json``
    naming this counts file), check it against the marker first.

    The checks: the SHA-256 of the counts file equals the marker's ``sha256`` (skipped for
    markers written before checksums existed), and the sum of the matrix equals both the
    marker's and the file's ``tokens`` (``tokens = C.sum()``). Costs one extra read of the
    file (about 0.1 s for 51 MB); other counts (reduce intermediates, results) load as
    :func:`posstats.counting.io.load_counts` does.

    Raises:
        CorruptPartialError: ``"<folder>: corrupt partial: its counts sum to A tokens, its
            marker records B (...); delete <folder> and rerun to count that shard again"``.
        InputError: an unreadable counts file (as :func:`~posstats.counting.io.load_counts`).
    """
    folder = Path(path) if os.path.isdir(path) else Path(path).parent
    file = counts_file(path)
    marker = _read_json(folder / MARKER)
    if not marker or marker.get("counts_file") != file.name:
        return load_counts(file)
    recorded = marker.get("sha256")
    actual = file_sha256(file) if recorded else None
    part = load_counts(file)
    total = _matrix_total(part)
    expected = marker.get("tokens")
    problems = []
    if recorded and actual != recorded:
        problems.append(f"sha256 {actual[:16]}... of {file.name}, the marker records {str(recorded)[:16]}...")
    if part.tokens != expected:
        problems.append(f"its file says {part.tokens:,} tokens")
    if problems or total != expected:
        exp = f"{expected:,}" if isinstance(expected, int) else repr(expected)
        detail = (
            f"{folder}: corrupt partial: its counts sum to {total:,} tokens, its marker records {exp} "
            f"({'; '.join(problems) or 'the file was changed after it was written'})"
        )
        exc = CorruptPartialError(f"{detail}; delete {folder} and rerun to count that shard again")
        exc.path, exc.detail = str(folder), detail
        raise exc
    return part


def sum_partials(
    items: Sequence[tuple[str | os.PathLike, int]],
    spec: CountSpec,
    /,
    *,
    dense: bool,
    metadata: dict[str, str] | None = None,
    corrupt: list[CorruptPartialError] | None = None,
) -> PositionalCounts:
    """Exact signed sum of saved counts: ``sum(sign * counts(path))``.

    Args:
        items: (counts folder or file, +1 or -1) pairs; -1 subtracts (a shard that left
            the corpus). Loaded one at a time, marked partials checked against their
            markers (:func:`load_partial`).
        spec: every item must have been counted under it.
        dense: accumulate in a dense int64 ``n x V`` array (else sorted sparse keys).
        metadata: metadata of the result (items' metadata is not merged).
        corrupt: None raises at the first corrupt partial; a list collects every corrupt
            partial's error instead (and leaves it out of the sum, which is then not the
            requested total: the caller must look at the list).

    Returns:
        PositionalCounts whose totals are the signed sums and whose fingerprint is the XOR
        of the items' (XOR is its own inverse, so subtracting removes a fingerprint).

    Raises:
        CorruptPartialError: a partial does not match its marker (``corrupt`` is None).
    """
    n, V = spec.positions, spec.vocab_size
    total = np.zeros(n * V, dtype=np.int64) if dense else None
    keys: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    sequences = windows = tokens = 0
    fingerprint = ""
    for path, sign in items:
        if sign not in (1, -1):
            msg = f"sign must be +1 or -1, got {sign!r}"
            raise ValueError(msg)
        try:
            part = load_partial(path)
        except CorruptPartialError as exc:
            if corrupt is None:
                raise
            corrupt.append(exc)
            continue
        if part.spec != spec:
            msg = f"{path}: counted under {part.spec}, not {spec}"
            raise InputError(msg)
        sequences += sign * part.sequences
        windows += sign * part.windows
        tokens += sign * part.tokens
        fingerprint = combine_fingerprints(fingerprint, part.fingerprint)
        if part.is_sparse:
            coo = part.matrix.tocoo()
            k = coo.row.astype(np.int64) * V + coo.col.astype(np.int64)
            v = coo.data.astype(np.int64) * sign
        elif dense:
            flat = np.asarray(part.matrix, dtype=np.int64).reshape(-1)
            if sign > 0:
                np.add(total, flat, out=total)
            else:
                np.subtract(total, flat, out=total)
            continue
        else:
            flat = np.asarray(part.matrix, dtype=np.int64).reshape(-1)
            k = np.flatnonzero(flat)
            v = flat[k] * sign
        if dense:
            np.add.at(total, k, v)
        else:
            keys.append(k)
            vals.append(v)
    if dense:
        matrix: np.ndarray | sp.csr_array = total.reshape(n, V)
    else:
        k = np.concatenate(keys) if keys else np.zeros(0, np.int64)
        v = np.concatenate(vals) if vals else np.zeros(0, np.int64)
        order = np.argsort(k, kind="stable")
        k, v = k[order], v[order]
        first = np.ones(len(k), dtype=bool)
        first[1:] = k[1:] != k[:-1]
        starts = np.flatnonzero(first)
        k = k[starts]
        v = np.add.reduceat(v, starts) if len(v) else v
        keep = v != 0
        k, v = k[keep], v[keep]
        rows, cols = np.divmod(k, V)
        matrix = sp.csr_array((v, (rows, cols)), shape=(n, V), dtype=np.int64)
    return PositionalCounts(spec, matrix, sequences, windows, tokens, fingerprint, dict(metadata or {}))

