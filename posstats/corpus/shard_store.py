"""The run store: per-shard partial counts with completion markers, results, a manifest, a lock.

Layout of a store folder ``STORE``::

    STORE/store.json                 what the store counts (spec, reader options, tokenizer
                                     hash); written once, checked by every later run
    STORE/lock                       held (flock) by the one run using the store; holds its
                                     pid, hostname, start time and run id
    STORE/partials/<shard_id>/counts.safetensors | counts.parquet
                                     the shard's exact partial counts (posstats.counting.io;
                                     sparse when under 1/8 of the cells are non-zero)
    STORE/partials/<shard_id>/window-groups.safetensors
                                     the shard's windows counted in groups (truncate and chunk
                                     mode, when asked: posstats.counting.window_groups)
    STORE/partials/<shard_id>/done.json
                                     completion marker, written last (atomically): the shard,
                                     its totals, the counts file, who counted it and when
    STORE/partials/<shard_id>/started.json
                                     a note (pid, node, time) written when counting starts
    STORE/runs/<run_id>.json         the run record: status, shards planned / counted /
                                     reused, bad shards with their errors
    STORE/reduce/<run_id>/...        tree-reduce intermediates (removed after the run)
    STORE/results/<name>/counts.*    reduced totals; the manifest names the current one
    STORE/results/<name>/window-groups.safetensors
                                     their window groups, where every partial summed has them
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

Integrity of partials: :meth:`RunStore.write_partial` records in each marker the totals
and ``sha256`` of the partial's counts file; every reduction checks a marked partial
against them (:func:`posstats.counting.reduce.load_partial`). The Ray counting job
(``jobs/count.py``) deletes a corrupt partial (marker first) and counts that shard
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
decides (:func:`posstats.storage.locks.run_store_lock_is_stale`): the lock is stale when
its hostname is this host and its pid is gone (or now belongs to a process started after
the lock); a lock from another host is never presumed stale.

Runs, manifests and refreshes: :func:`store_config` is what a store is bound to,
:func:`derive_run_id` names a run after its inputs, :func:`refresh_source` reads
back what a store counts (for ``posstats refresh``), :meth:`RunStore.reduce_items` says
which saved counts (with signs) sum to a run's total, :meth:`RunStore.new_manifest` is the
manifest a successful run publishes and :func:`manifest_changes` what changed per input.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from posstats.corpus.remote import absolute
from posstats.corpus.source import CorpusSource
from posstats.corpus.tokenizer import check_tokenizer
from posstats.counting.counts import CountAccumulator, CountSpec, PositionalCounts
from posstats.counting.io import counts_file, save_accumulated, save_counts
from posstats.counting.reduce import PARTIAL_MARKER
from posstats.counting.window_groups_io import save_window_group_blocks
from posstats.errors import InputError, OptionError, PosstatsError
from posstats.ids import validate_id
from posstats.processes import process_start_ticks
from posstats.storage.jsontext import read_json_file, write_json_atomic
from posstats.storage.locks import (
    LockInfo,
    describe_lock_holder,
    run_store_lock_is_stale,
)
from posstats.storage.publish import file_sha256

__all__ = [
    "MANIFEST_SCHEMA",
    "STORE_SCHEMA",
    "RunStore",
    "config_key",
    "derive_run_id",
    "manifest_changes",
    "refresh_source",
    "store_config",
]

STORE_SCHEMA = "posstats.store/1"
MANIFEST_SCHEMA = "posstats.manifest/1"
MARKER = PARTIAL_MARKER
STARTED = "started.json"


def config_key(config: dict[str, Any], /) -> str:
    """sha256 of the canonical JSON of a counting configuration (16 hex digits)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def store_config(source: CorpusSource, spec: CountSpec, metadata: dict[str, str], /) -> dict[str, Any]:
    """What a store's partials depend on (bound in ``store.json``): spec and reader options.

    Input paths are not part of it (shard ids cover them); the tokenizer enters by hash.
    """
    return {
        "spec": spec.to_metadata(),
        "format": source.format,
        "column": source.column,
        "text_column": source.text_column,
        "tokenizer_hash": metadata.get("tokenizer_hash") if source.column is None else None,
        "metadata": dict(sorted(metadata.items())),
    }


def derive_run_id(files: Sequence[str], config: dict[str, Any], /, *, command: str = "count") -> str:
    """``run-`` (``refresh-`` for a refresh) + 16 hex digits of sha256(absolute input paths
    + counting configuration): the same inputs and configuration name the same run."""
    text = json.dumps([sorted(absolute(f) for f in files), config], sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"{'run' if command == 'count' else 'refresh'}-{digest}"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _read_json(path: Path) -> dict[str, Any] | None:
    return read_json_file(path, what="run-store file")


# ----------------------------------------------------------------------------- lock


class _Lock:
    def __init__(self, path: Path, info: LockInfo) -> None:
        self.path, self.info = path, info
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            held = exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
            holder = self._read()
            if held or not run_store_lock_is_stale(holder):
                os.close(fd)
                msg = (
                    f"run store {self.path.parent} is in use by {describe_lock_holder(holder or None)}; "
                    f"wait for it to finish, or use another {{store}}"
                )
                if not held:
                    msg += f" (no flock on this file system: delete {self.path} if that run is dead)"
                raise OptionError(msg) from None
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
            msg = f"run store {self.root} holds counts of another configuration ({detail}); use another {{store}}"
            raise OptionError(msg)
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
            "start_ticks": process_start_ticks(os.getpid()),
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

    def write_partial(self, shard: Any, counts: PositionalCounts | CountAccumulator, /, **info: Any) -> dict[str, Any]:
        """Persist a shard's partial counts, then its completion marker; return the marker.

        ``shard`` is a :class:`posstats.corpus.shards.Shard`; ``counts`` its counts or the
        accumulator that counted them (sparse counts are then written straight from their
        blocks, :func:`posstats.counting.io.save_accumulated`). The counts are stored as
        :func:`posstats.counting.io.choose_storage` decides (by size). The marker records
        the totals and the SHA-256 of the counts file (``sha256``), checked by
        :func:`posstats.counting.reduce.load_partial` when the partial is reduced. An
        accumulator that counted window groups (:func:`posstats.corpus.count_step.accumulate_shard`)
        has them written beside the counts (``window-groups.safetensors``), and the marker's
        ``window_groups`` records their file, SHA-256, K and full windows.
        """
        directory = self.partial_dir(shard.shard_id)
        groups = None
        if isinstance(counts, CountAccumulator):
            counter = counts.window_group_counter()
            path, counts, _ = save_accumulated(counts, directory)
            if counter is not None:
                groups_path, groups = save_window_group_blocks(counter, counts, directory)
                groups = {"file": groups_path.name, "sha256": file_sha256(groups_path), **groups}
        else:
            path = save_counts(counts, directory)
        marker = {
            "shard": shard.to_dict(),
            "counts_file": path.name,
            # read back from the page cache just written (posstats.counting.io writes the file)
            "sha256": file_sha256(path),
            "sequences": counts.sequences,
            "windows": counts.windows,
            "tokens": counts.tokens,
            "fingerprint": counts.fingerprint,
            **({"window_groups": groups} if groups is not None else {}),
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

    def is_up_to_date(self, previous: dict[str, Any] | None, planned: Sequence[str], /, *, todo: int) -> bool:
        """Whether the result ``previous`` names is already the total of ``planned``: no
        shard left to count (``todo == 0``), the same shard ids, none skipped as bad, and
        its counts file present."""
        return (
            previous is not None
            and not todo
            and previous.get("shard_ids") == list(planned)
            and not previous.get("bad_shards")
            and self.result_file(previous) is not None
        )

    def reduce_items(self, good: Sequence[str], /, *, added: Sequence[str], removed: Sequence[str],
                     old_result: Path | None) -> tuple[list[tuple[str, int]], str]:
        """The saved counts, with signs, whose sum is the new total; and the mode.

        ``"incremental"``: ``old total + added - removed`` (THEORY section 1: counts are
        additive), when an old result is given and every removed shard still has its
        partial. Otherwise ``"full"``: the sum of the partials of ``good`` (every shard of
        the corpus but the bad ones). ``added`` must exclude bad shards too.
        """
        if old_result is not None and all(self.is_done(sid) for sid in removed):
            items = [(str(old_result.parent), 1)]
            items += [(str(self.partial_dir(sid)), 1) for sid in added]
            items += [(str(self.partial_dir(sid)), -1) for sid in removed]
            return items, "incremental"
        return [(str(self.partial_dir(sid)), 1) for sid in good], "full"

    def new_manifest(self, reduced: dict[str, Any], /, *, run_id: str, command: str, finished: str,
                     config: dict[str, Any], inputs: Sequence[str], files: Sequence[str], out: str | None,
                     shards: Sequence[Any], bad: list[dict[str, Any]], result_dir: Path,
                     dense_budget: int) -> dict[str, Any]:
        """The manifest of a successful run (see the layout): ``reduced`` is the final
        reduce summary (:func:`posstats.counting.reduce.reduce_partials`), ``shards`` the
        :class:`~posstats.corpus.shards.Shard` s summed into it."""
        ordered = sorted(shards, key=lambda s: s.shard_id)
        return {
            "schema": MANIFEST_SCHEMA,
            "run_id": run_id,
            "command": command,
            "finished": finished,
            "config_key": config_key(config),
            "inputs": list(inputs),
            "files": [absolute(f) for f in files],
            "out": out,
            "shard_ids": [s.shard_id for s in ordered],
            "shards": [s.to_dict() for s in ordered],
            "bad_shards": bad,
            "result": os.path.relpath(result_dir, self.root),
            **{k: reduced[k] for k in ("counts_file", "sequences", "windows", "tokens", "fingerprint",
                                       "positions_occupied", "storage")},
            **({"window_groups": reduced["window_groups"]} if "window_groups" in reduced else {}),
            "dense_budget": dense_budget,
        }

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


def manifest_changes(previous: dict[str, Any] | None, shards: Sequence[Any], added: Sequence[str],
                     removed: Sequence[str], /) -> list[dict[str, Any]]:
    """Per input path: ``new`` / ``changed`` / ``gone``, with the numbers of shards added and
    removed, between the manifest ``previous`` and the planned ``shards``."""
    old = {s["shard_id"]: s for s in (previous or {}).get("shards", [])}
    old_paths = {absolute(s["path"]) for s in old.values()}
    new_paths = {absolute(s.path) for s in shards}
    by_id = {s.shard_id: s for s in shards}
    per: dict[str, list[int]] = {}
    for sid in added:
        per.setdefault(absolute(by_id[sid].path), [0, 0])[0] += 1
    for sid in removed:
        path = absolute(old[sid]["path"]) if sid in old else "(unknown input)"
        per.setdefault(path, [0, 0])[1] += 1
    out = []
    for path, (n_add, n_rm) in sorted(per.items()):
        status = "changed" if path in old_paths and path in new_paths else ("new" if path in new_paths else "gone")
        out.append({"path": path, "status": status, "shards_added": n_add, "shards_removed": n_rm})
    return out


def refresh_source(store: str, /, *, inputs: Sequence[str] | None = None, tokenizer: str | None = None,
                   storage_options: Mapping[str, Any] | None = None) -> tuple[CorpusSource, CountSpec, dict[str, str]]:
    """What the run store ``store`` counts, to refresh it: (source, spec, metadata).

    The source reads ``inputs`` (patterns, made absolute) or else the inputs of the last
    finished count, with the store's reader options; a store that counts text needs its
    tokenizer: ``tokenizer`` or the one remembered in ``store.json``, checked against the
    hash the store records (:func:`posstats.corpus.tokenizer.check_tokenizer`). URL inputs
    are read with ``storage_options`` (never stored: they may hold credentials).

    Raises:
        PosstatsError: no finished count in ``store``; a text store and no tokenizer; a
            tokenizer other than the store's.
    """
    rs = RunStore(os.path.abspath(store))
    stored, manifest = rs.config(), rs.manifest()
    if stored is None or manifest is None:
        msg = f"{store}: not a run store with a finished count (count into it first: posstats count with this {{store}})"
        raise OptionError(msg)
    cfg = stored["config"]
    metadata = dict(cfg.get("metadata", {}))
    tok_path = tokenizer or stored.get("tokenizer_path")
    if cfg.get("column") is None and not tok_path:
        msg = f"{store}: counts text; pass {{tokenizer}} (the tokenizer.json it was counted with)"
        raise OptionError(msg)
    if tok_path:
        recorded = {"tokenizer_hash": cfg.get("tokenizer_hash"), "tokenizer": metadata.get("tokenizer")}
        check_tokenizer(recorded, tok_path, counts=f"run store {store}")
    source = CorpusSource(
        inputs=tuple(absolute(p) for p in (inputs or manifest["inputs"])),
        format=cfg.get("format"),
        column=cfg.get("column"),
        text_column=cfg.get("text_column"),
        tokenizer=tok_path if cfg.get("column") is None else None,
        storage_options=dict(storage_options or {}),
    )
    return source, CountSpec.from_metadata(cfg["spec"]), metadata
