"""The pipeline run store: one folder (or object prefix) per run, completion markers, a
``latest`` pointer, and a lock that a crashed run cannot hold forever.

A store is a local folder or an fsspec URL (``s3://bucket/prefix``, ``gs://...``, ``memory://``).
Layout (relative to the store's root)::

    lock                              the lock of the run using the store (JSON, see below)
    latest                            JSON pointer to the newest complete run; replaced
                                      atomically, only after that run's marker exists
    runs/<run_id>/config/config.json  the resolved configuration, written first
    runs/<run_id>/count/              count summary (files, shards counted / reused)
    runs/<run_id>/reduce/             counts.safetensors | counts.parquet, count.json
    runs/<run_id>/geometry/           mds.safetensors, report.json, report.md
    runs/<run_id>/report/             report.html, figures/, summary.md (+ report.json)
    runs/<run_id>/export/             positions.safetensors (the table), README.md, figures
    runs/<run_id>/<stage>/done.json   the stage's completion marker, written last: the
                                      stage's files with their sizes and sha256
    runs/<run_id>/done.json           the run's completion marker, written after every stage
    logs/<run_id>.log                 the log of a scheduled run (``posstats schedule``)
    work/                             local stores only, by default: the counting run store
                                      (per-shard partials) and staging folders

Rules:

* A stage is published by moving (local) or uploading (fsspec) its files into
  ``runs/<run_id>/<stage>/`` with ``done.json`` last; a stage folder without its marker is
  incomplete and is deleted and redone by the next attempt. Rerunning a run id skips every
  stage that has its marker, and a run whose ``done.json`` exists is not run again.
* ``latest`` names a run only after that run's ``done.json`` exists, and never moves to a
  run that finished before the one it names. Locally it is written to a temporary file and
  ``os.replace``-d (atomic on POSIX). On object stores it is written as a temporary object
  and then moved (server-side copy onto ``latest``, then delete of the temporary): a
  single-object PUT/COPY is atomic on S3 and reads after it are strongly consistent, so a
  reader sees the old or the new pointer, never a mixture; a temporary object may be left
  behind by a crash between the copy and the delete (harmless, removed next time).
* Run ids match ``[A-Za-z0-9][A-Za-z0-9._-]{0,127}`` and contain no ``..``: no path
  separators, nothing hidden, nothing that climbs out of ``runs/``.
* Nothing read from a store is unpickled: markers, pointers and the lock are JSON.
* A marker vouches only for what it lists (:func:`check_stage_marker`): its stage and run
  id, its finish time and every file with its size and sha256. A blanked or forged marker
  is *damaged*: the stage counts as incomplete and is never read. Readers take a stage
  through :meth:`Store.stage_dir`, which checks every listed file (and, locally, refuses
  files the marker does not list) before anything is used; a remote stage is downloaded
  file by file into a folder the caller owns, each name kept inside it
  (:func:`posstats.ids.join_inside`). Writes into a store go through :class:`Store` only:
  other commands refuse an output folder inside a store (:func:`enclosing_store`).

Lock rule (:class:`StoreLock`): the lock is the JSON file/object ``lock`` holding the
holder's run id, pid, hostname, start time, a random token and a *heartbeat* time that the
holder refreshes every ``heartbeat_s`` seconds (default: a tenth of ``stale_after_s``,
at most 30 s). A lock is **stale** (:func:`posstats.storage.locks.pipeline_lock_is_stale`)
when

1. its heartbeat is older than ``stale_after_s`` (default 600 s = 10 minutes), whatever
   host holds it, or
2. it was taken on this host (same hostname) and its pid is gone, or now belongs to a
   process started after the lock was taken (pid reuse), or
3. it cannot be parsed (a lock is always written whole, so this means damage).

A run that finds a live lock refuses at once, naming the holder. A stale lock is taken
over. Local stores serialise the check-and-take with an ``flock`` on ``.lock.guard`` (held
for milliseconds), so two runs never both take over; object stores create the lock with
an exclusive (``If-None-Match``) write and take over a stale one by delete + exclusive
create. A holder that finds a different token in the lock at its next heartbeat (it was
presumed dead, e.g. after a pause longer than ``stale_after_s``) stops before publishing
its next stage, and every run re-checks its token just before it moves ``latest``.
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
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import fsspec

from posstats.corpus.remote import (
    is_url,  # re-exported: the store and the config tell URLs apart
)
from posstats.errors import PosstatsError, os_error_kind
from posstats.errors import describe_os_error as _describe_os_error
from posstats.ids import (  # validate_run_id: re-exported
    is_valid_id,
    join_inside,
    relative_key_parts,
    validate_run_id,
)
from posstats.processes import process_start_ticks
from posstats.storage import jsontext
from posstats.storage.locks import describe_lock_holder, pipeline_lock_is_stale
from posstats.storage.publish import atomic_path, file_sha256

__all__ = [
    "DEFAULT_STALE_AFTER_S",
    "DamagedMarker",
    "MARKER",
    "STAGES",
    "Store",
    "check_stage_marker",
    "enclosing_store",
    "StoreLock",
    "describe_os_error",
    "is_url",
    "sorted_runs",
    "utc_now",
    "validate_run_id",
]

STAGES = ("config", "count", "reduce", "geometry", "diff", "report", "export")
MARKER = "done.json"
LATEST = "latest"
LOCK = "lock"
GUARD = ".lock.guard"
RUNS = "runs"
LOGS = "logs"
DEFAULT_STALE_AFTER_S = 600.0
STORE_SCHEMA = "posstats.pipeline-store/1"


# ----------------------------------------------------------------------------- helpers


def utc_now() -> str:
    """The current UTC time, ISO 8601 with microseconds (sortable as text)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


_STORE_ADVICE = {
    "space": "free space and rerun the same --run-id to resume",
    "read-only": "the store must be writable (lock, stages, latest pointer); use a writable --store",
    "permission": "the store must be writable by this user",
}


def describe_os_error(exc: BaseException, /) -> str | None:
    """A one-line explanation for storage failures users must act on (full disk, read-only
    or forbidden store), or None for other errors. Looks through wrapped causes
    (:func:`posstats.errors.describe_os_error` with the store's advice)."""
    found = os_error_kind(exc)
    if found is None or found[0] not in _STORE_ADVICE:
        return None
    return _describe_os_error(exc, advice=_STORE_ADVICE)


class DamagedMarker(PosstatsError):
    """A completion marker that exists but cannot vouch for its stage."""


_SHA256_HEX = frozenset("0123456789abcdef")


def check_stage_marker(marker: Mapping[str, Any], /, *, run_id: str, stage: str) -> str | None:
    """What is wrong with a stage's completion marker, or None when it is sound.

    A sound marker names its ``stage`` and ``run_id``, has a ``finished`` time, and lists
    in ``files`` every file it vouches for (possibly none) as ``{name: {"bytes": int >= 0,
    "sha256": 64 hex digits}}`` with names that stay inside the stage folder. A blanked
    (``{}``) or hand-edited marker is not: nothing it holds is trusted.
    """
    if marker.get("stage") != stage or marker.get("run_id") != run_id:
        return f"it names stage {marker.get('stage')!r} of run {marker.get('run_id')!r}"
    if not isinstance(marker.get("finished"), str):
        return "no finish time"
    files = marker.get("files")
    if not isinstance(files, dict):
        return "no list of the files it vouches for"
    for name, meta in files.items():
        try:
            relative_key_parts(name, what="file name")
        except PosstatsError:
            return f"file name {name[:100]!r} leaves the stage folder"
        if not isinstance(meta, dict):
            return f"{name}: no size and checksum"
        size, digest = meta.get("bytes"), meta.get("sha256")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            return f"{name}: size {size!r} is not a byte count"
        if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _SHA256_HEX:
            return f"{name}: {digest!r} is not a sha256"
    return None


def enclosing_store(path: str | os.PathLike, /) -> Path | None:
    """The local pipeline store that ``path`` lies in (or is), or None.

    A store is recognised by its layout: a ``runs/`` folder next to ``latest``, ``lock``
    or ``.lock.guard``. Outputs of other commands must never be written there: a store
    changes only through :class:`Store`, which records every file in a stage marker.
    """
    p = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    for folder in (p, *p.parents):
        if (folder / RUNS).is_dir() and any((folder / name).exists() for name in (LATEST, LOCK, GUARD)):
            return folder
    return None


# ----------------------------------------------------------------------------- store


class Store:
    """A pipeline run store at a local path or an fsspec URL (layout and rules: module doc).

    Args:
        url: a local folder (created on first write) or ``scheme://...``.
        storage_options: fsspec options for URLs (endpoint, credentials...).
    """

    def __init__(self, url: str, /, *, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = str(url)
        self.local = not is_url(self.url)
        self.fs: Any = None
        if self.local:
            path = self.url[len("file://"):] if self.url.startswith("file://") else self.url
            self.root = os.path.abspath(os.path.expanduser(path))
        else:
            try:
                self.fs, root = fsspec.core.url_to_fs(self.url, **dict(storage_options or {}))
            except ImportError as exc:
                msg = f"{self.url}: this kind of store needs an fsspec backend that is not installed ({exc})"
                raise PosstatsError(msg) from exc
            except (ValueError, TypeError) as exc:
                msg = f"{self.url}: not a usable store URL ({exc})"
                raise PosstatsError(msg) from exc
            self.root = root.rstrip("/")
            # listings must never be cached: markers and the lock change under us
            with contextlib.suppress(Exception):
                self.fs.invalidate_cache()

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    # -- primitives (paths are relative, '/'-separated) ---------------------------------

    def path(self, rel: str = "", /) -> str:
        """The full local path or URL path of ``rel``."""
        if self.local:
            return os.path.join(self.root, *[p for p in rel.split("/") if p])
        return f"{self.root}/{rel}".rstrip("/") if rel else self.root

    def display(self, rel: str = "", /) -> str:
        """``rel`` as a user would type it (a local path or a URL)."""
        if self.local:
            return self.path(rel)
        proto = self.fs.protocol[0] if isinstance(self.fs.protocol, (tuple, list)) else self.fs.protocol
        return f"{proto}://{self.path(rel)}"

    def _invalidate(self) -> None:
        if not self.local:
            with contextlib.suppress(Exception):
                self.fs.invalidate_cache()

    def exists(self, rel: str, /) -> bool:
        if self.local:
            return os.path.exists(self.path(rel))
        self._invalidate()
        return bool(self.fs.exists(self.path(rel)))

    def read_bytes(self, rel: str, /) -> bytes | None:
        """The bytes of ``rel``, or None when it does not exist."""
        try:
            if self.local:
                return Path(self.path(rel)).read_bytes()
            self._invalidate()
            return self.fs.cat_file(self.path(rel))
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            return None

    def read_json(self, rel: str, /) -> dict[str, Any] | None:
        """Parse a JSON file of the store (never pickle); None when missing.

        Raises:
            PosstatsError: the file exists but is not JSON.
        """
        data = self.read_bytes(rel)
        if data is None:
            return None
        try:
            obj = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            msg = f"{self.display(rel)}: not readable JSON ({exc})"
            raise PosstatsError(msg) from exc
        if not isinstance(obj, dict):
            msg = f"{self.display(rel)}: expected a JSON object"
            raise PosstatsError(msg)
        return obj

    def write_bytes(self, rel: str, data: bytes, /) -> None:
        """Write ``rel`` whole: temp file + fsync + ``os.replace`` locally, one PUT remotely."""
        if self.local:
            with atomic_path(self.path(rel), fsync=True) as tmp:
                tmp.write_bytes(data)
        else:
            self.fs.pipe_file(self.path(rel), data)
            self._invalidate()

    def write_json(self, rel: str, obj: Any, /) -> None:
        self.write_bytes(rel, (jsontext.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"))

    def create_exclusive(self, rel: str, data: bytes, /) -> bool:
        """Create ``rel`` with ``data`` only if it does not exist; return whether it did."""
        if self.local:
            target = Path(self.path(rel))
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            return True
        try:
            with self.fs.open(self.path(rel), "xb") as f:
                f.write(data)
        except FileExistsError:
            return False
        finally:
            self._invalidate()
        return True

    def remove(self, rel: str, /) -> None:
        """Delete a file or a whole folder/prefix (missing is fine)."""
        if self.local:
            p = Path(self.path(rel))
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
            return
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.path(rel), recursive=True)
        self._invalidate()

    def listdir(self, rel: str = "", /) -> list[str]:
        """Names directly under ``rel`` (empty when missing)."""
        if self.local:
            try:
                return sorted(os.listdir(self.path(rel)))
            except (FileNotFoundError, NotADirectoryError):
                return []
        self._invalidate()
        try:
            entries = self.fs.ls(self.path(rel), detail=False)
        except FileNotFoundError:
            return []
        return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries})

    def replace_atomic(self, rel: str, data: bytes, /) -> None:
        """Replace ``rel`` so that readers see the old or the new content, never a mixture
        (local: temp + ``os.replace``; object stores: temporary object + server-side move)."""
        if self.local:
            self.write_bytes(rel, data)
            return
        tmp = f"{rel}.tmp-{uuid.uuid4().hex}"
        self.fs.pipe_file(self.path(tmp), data)
        try:
            self.fs.mv(self.path(tmp), self.path(rel))
        finally:
            with contextlib.suppress(Exception):
                self.fs.rm(self.path(tmp))
            self._invalidate()

    def put_file(self, local: str | os.PathLike, rel: str, /) -> None:
        """Copy a local file into the store whole (temp + rename locally, one upload remotely)."""
        if self.local:
            with atomic_path(self.path(rel), fsync=True) as tmp:
                shutil.copyfile(local, tmp)
        else:
            self.fs.put_file(str(local), self.path(rel))
            self._invalidate()

    def file_digest(self, rel: str, /) -> tuple[int, str] | None:
        """(size in bytes, sha256 hex) of the file ``rel``, read in 8 MiB blocks; None when
        it does not exist."""
        h = hashlib.sha256()
        size = 0
        try:
            if self.local:
                f = open(self.path(rel), "rb")  # noqa: SIM115 (closed below)
            else:
                self._invalidate()
                f = self.fs.open(self.path(rel), "rb")
        except (FileNotFoundError, IsADirectoryError):
            return None
        with f:
            while block := f.read(1 << 23):
                h.update(block)
                size += len(block)
        return size, h.hexdigest()

    def list_files(self, rel: str, /) -> list[str]:
        """Every file below the folder ``rel``, as '/'-separated paths relative to it (sorted)."""
        base = self.path(rel)
        if self.local:
            root = Path(base)
            if not root.is_dir():
                return []
            return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink())
        self._invalidate()
        try:
            found = self.fs.find(base)
        except FileNotFoundError:
            return []
        prefix = base.rstrip("/") + "/"
        return sorted(k[len(prefix):] for k in found if k.startswith(prefix))

    # -- runs and stages ------------------------------------------------------------------
    # -- runs and stages ------------------------------------------------------------------

    @staticmethod
    def run_rel(run_id: str, /) -> str:
        return f"{RUNS}/{validate_run_id(run_id)}"

    @classmethod
    def stage_rel(cls, run_id: str, stage: str, /) -> str:
        if stage not in STAGES:
            msg = f"unknown stage {stage!r}"
            raise ValueError(msg)
        return f"{cls.run_rel(run_id)}/{stage}"

    def stage_marker(self, run_id: str, stage: str, /) -> dict[str, Any] | None:
        """The stage's completion marker, or None while it is not complete.

        Raises:
            DamagedMarker: the marker exists but is not a marker of this stage that lists
                the files it vouches for (:func:`check_stage_marker`).
        """
        rel = f"{self.stage_rel(run_id, stage)}/{MARKER}"
        try:
            marker = self.read_json(rel)
        except PosstatsError as exc:
            raise DamagedMarker(str(exc)) from None
        if marker is not None:
            problem = check_stage_marker(marker, run_id=run_id, stage=stage)
            if problem:
                msg = f"{self.display(rel)}: damaged completion marker ({problem}); delete the stage folder to redo it"
                raise DamagedMarker(msg)
        return marker

    def stage_dir(self, run_id: str, stage: str, local: str | os.PathLike | None = None, /) -> Path:
        """A local folder holding a complete stage's files, each checked against its marker.

        A local store's stage folder is checked in place and returned; a remote one's files
        (those its marker lists, nothing else) are downloaded into ``local`` and checked
        there. So no reader ever uses a file its marker does not vouch for.

        Raises:
            PosstatsError: the stage is not complete, its marker is damaged, or a file is
                missing, differs from its recorded size or sha256, or is not listed.
        """
        marker = self.stage_marker(run_id, stage)
        rel = self.stage_rel(run_id, stage)
        if marker is None:
            msg = f"{self.display(rel)}: the {stage} stage of run {run_id} is not complete"
            raise PosstatsError(msg)
        if self.local:
            problems = self.verify_stage(run_id, stage)
            folder = Path(self.path(rel))
        else:
            if local is None:
                msg = "stage_dir of a remote store needs a local folder"
                raise ValueError(msg)
            folder = Path(local)
            folder.mkdir(parents=True, exist_ok=True)
            problems = []
            for name, meta in marker["files"].items():
                dest = join_inside(folder, name, what=f"file name in {self.display(rel)}/{MARKER}")
                dest.parent.mkdir(parents=True, exist_ok=True)
                try:
                    self.fs.get_file(self.path(f"{rel}/{name}"), str(dest))
                except FileNotFoundError:
                    problems.append(f"{stage}/{name}: missing")
                    continue
                if (dest.stat().st_size, file_sha256(dest)) != (meta["bytes"], meta["sha256"]):
                    problems.append(f"{stage}/{name}: content differs from its marker")
        if problems:
            msg = (f"{self.display(rel)}: run {run_id}'s {stage} stage fails its checksums ({'; '.join(problems[:3])}"
                   f"{'; ...' if len(problems) > 3 else ''}); it is not used")
            raise PosstatsError(msg)
        return folder

    def run_marker(self, run_id: str, /) -> dict[str, Any] | None:
        """The run's completion marker, or None while the run is not complete.

        Raises:
            DamagedMarker: the marker exists but does not name this run and its finish time.
        """
        rel = f"{self.run_rel(run_id)}/{MARKER}"
        try:
            marker = self.read_json(rel)
        except PosstatsError as exc:
            raise DamagedMarker(str(exc)) from None
        if marker is not None and (marker.get("run_id") != run_id or not isinstance(marker.get("finished"), str)):
            msg = f"{self.display(rel)}: damaged completion marker (it does not name run {run_id} and its finish time)"
            raise DamagedMarker(msg)
        return marker

    def clear_stage(self, run_id: str, stage: str, /) -> None:
        """Delete an incomplete stage folder (a marker-less leftover of a killed attempt)."""
        self.remove(self.stage_rel(run_id, stage))

    def publish_stage(self, run_id: str, stage: str, local_dir: str | os.PathLike, /, *,
                      info: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Move/upload the files of ``local_dir`` into the stage folder, then its marker.

        The marker holds ``info`` plus ``stage``, ``run_id``, ``finished`` and ``files``
        (every file with its size and sha256; these keys win over ``info``). Returns it.
        """
        local_dir = Path(local_dir)
        rel = self.stage_rel(run_id, stage)
        files: dict[str, dict[str, Any]] = {}
        paths = sorted(p for p in local_dir.rglob("*") if p.is_file() and p.name != MARKER)
        for p in paths:
            name = p.relative_to(local_dir).as_posix()
            files[name] = {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
        for p in paths:
            name = p.relative_to(local_dir).as_posix()
            target = f"{rel}/{name}"
            if self.local:
                dest = Path(self.path(target))
                dest.parent.mkdir(parents=True, exist_ok=True)
                try:
                    if os.stat(p).st_dev == os.stat(dest.parent).st_dev:
                        os.replace(p, dest)
                        continue
                except OSError as exc:
                    if exc.errno != errno.EXDEV:
                        raise
                self.put_file(p, target)
            else:
                self.put_file(p, target)
        marker = {**dict(info or {}), "stage": stage, "run_id": run_id, "finished": utc_now(), "files": files}
        self.write_json(f"{rel}/{MARKER}", marker)
        return marker

    def verify_stage(self, run_id: str, stage: str, /) -> list[str]:
        """Problems with a complete stage (damaged marker; a listed file missing or differing
        from its size or sha256; a file its marker does not list); [] if fine."""
        try:
            marker = self.stage_marker(run_id, stage)
        except DamagedMarker as exc:
            return [f"{stage}: {exc}"]
        if marker is None:
            return [f"{stage}: no completion marker"]
        rel = self.stage_rel(run_id, stage)
        problems = []
        for name, meta in marker["files"].items():
            digest = self.file_digest(f"{rel}/{name}")
            if digest is None:
                problems.append(f"{stage}/{name}: missing")
            elif digest != (meta["bytes"], meta["sha256"]):
                problems.append(f"{stage}/{name}: content differs from its marker")
        listed = set(marker["files"]) | {MARKER}
        problems += [f"{stage}/{name}: not listed in its marker" for name in self.list_files(rel) if name not in listed]
        return problems

    def finish_run(self, run_id: str, info: Mapping[str, Any], /) -> dict[str, Any]:
        """Write the run's completion marker (after every stage marker exists); return it."""
        missing = [s for s in STAGES if self.stage_marker(run_id, s) is None]
        if missing:
            msg = f"run {run_id}: cannot mark complete, stage(s) {', '.join(missing)} not complete"
            raise PosstatsError(msg)
        marker = {"run_id": run_id, "finished": utc_now(), **dict(info)}
        self.write_json(f"{self.run_rel(run_id)}/{MARKER}", marker)
        return marker

    def run_ids(self) -> list[str]:
        """Every run id with a folder in the store (sorted)."""
        return [name for name in self.listdir(RUNS) if is_valid_id(name)]

    def run_status(self, run_id: str, /) -> dict[str, Any]:
        """{run_id, complete, finished, stages: {stage: finished time or None}, damaged:
        [stages whose marker is damaged, "run" for the run's own]}."""
        try:
            marker = self.run_marker(run_id)
        except DamagedMarker:
            marker = None
            run_damaged = True
        else:
            run_damaged = False
        stages, damaged = {}, []
        for s in STAGES:
            try:
                m = self.stage_marker(run_id, s)
            except DamagedMarker:
                m = None  # not complete, never used; verify_stage names the damage
                damaged.append(s)
            stages[s] = m.get("finished") if m else None
        if run_damaged:
            damaged.append("run")
        return {"run_id": run_id, "complete": marker is not None and not damaged,
                "finished": marker.get("finished") if marker else None, "stages": stages, "damaged": damaged}

    # -- latest -----------------------------------------------------------------------------

    def latest(self) -> dict[str, Any] | None:
        """The ``latest`` pointer ({run_id, finished, path, ...}), or None.

        Raises:
            DamagedMarker: a pointer that does not name a valid run id and its finish time.
        """
        try:
            pointer = self.read_json(LATEST)
        except PosstatsError as exc:
            raise DamagedMarker(str(exc)) from None
        if pointer is not None and (not is_valid_id(pointer.get("run_id")) or not isinstance(pointer.get("finished"), str)):
            msg = f"{self.display(LATEST)}: damaged pointer (it does not name a run id and its finish time)"
            raise DamagedMarker(msg)
        return pointer

    def move_latest(self, run_id: str, /, *, extra: Mapping[str, Any] | None = None) -> bool:
        """Point ``latest`` at a complete run unless it names a run that finished later.

        Returns whether the pointer now names ``run_id``.

        Raises:
            PosstatsError: the run has no completion marker.
        """
        marker = self.run_marker(run_id)
        if marker is None:
            msg = f"run {run_id} is not complete: latest stays where it is"
            raise PosstatsError(msg)
        try:
            current = self.latest()
        except DamagedMarker:
            current = None  # a damaged pointer is replaced
        if current and current.get("run_id") == run_id:
            return True
        if current and str(current.get("finished", "")) > str(marker["finished"]):
            return False
        pointer = {"schema": STORE_SCHEMA, "run_id": run_id, "finished": marker["finished"],
                   "path": self.run_rel(run_id), "moved": utc_now(), **dict(extra or {})}
        self.replace_atomic(LATEST, (json.dumps(pointer, indent=2, sort_keys=True) + "\n").encode())
        return True

    # -- logs and lock ----------------------------------------------------------------------

    @staticmethod
    def log_rel(run_id: str, /) -> str:
        return f"{LOGS}/{validate_run_id(run_id)}.log"

    def read_lock(self) -> tuple[dict[str, Any] | None, bool]:
        """(the lock record or None when unparsable, whether a lock exists)."""
        data = self.read_bytes(LOCK)
        if data is None:
            return None, False
        try:
            obj = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None, True
        return (obj if isinstance(obj, dict) else None), True

    @contextlib.contextmanager
    def lock(self, *, run_id: str, command: str = "pipeline", stale_after: float = DEFAULT_STALE_AFTER_S,
             heartbeat: float | None = None, log: Callable[[str], None] | None = None) -> Iterator[StoreLock]:
        """Hold the store's lock for a run (the rule is in the module docstring).

        Raises:
            PosstatsError: the store is in use by a live run (the message names it).
        """
        lk = StoreLock(self, run_id=run_id, command=command, stale_after=stale_after, heartbeat=heartbeat, log=log)
        lk.acquire()
        try:
            yield lk
        finally:
            lk.release()


class StoreLock:
    """The lock of a store, held by one run, kept alive by a heartbeat thread."""

    def __init__(self, store: Store, *, run_id: str, command: str, stale_after: float = DEFAULT_STALE_AFTER_S,
                 heartbeat: float | None = None, log: Callable[[str], None] | None = None) -> None:
        if stale_after <= 0:
            msg = f"the lock's stale timeout must be > 0 s, got {stale_after}"
            raise PosstatsError(msg)
        self.store = store
        self.stale_after = float(stale_after)
        self.heartbeat = float(heartbeat) if heartbeat else max(0.5, min(30.0, self.stale_after / 10))
        self.log = log or (lambda _m: None)
        self.hostname = socket.gethostname()
        self.token = uuid.uuid4().hex
        now = time.time()
        self.info = {
            "schema": "posstats.lock/1",
            "token": self.token,
            "run_id": run_id,
            "command": command,
            "pid": os.getpid(),
            "hostname": self.hostname,
            "start_ticks": process_start_ticks(os.getpid()),
            "started": utc_now(),
            "started_ts": now,
            "heartbeat": utc_now(),
            "heartbeat_ts": now,
            "stale_after_s": self.stale_after,
        }
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._held = False

    # -- guard (local stores): serialises check-and-take, heartbeat and release ------------

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        if not self.store.local:
            yield
            return
        os.makedirs(self.store.root, exist_ok=True)
        fd = os.open(self.store.path(GUARD), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the flock

    def _payload(self) -> bytes:
        return (json.dumps(self.info, sort_keys=True) + "\n").encode()

    def _stale(self, info: dict[str, Any] | None) -> tuple[bool, str]:
        return pipeline_lock_is_stale(info, now=time.time(), hostname=self.hostname, stale_after=self.stale_after)

    def _busy(self, holder: dict[str, Any] | None, why: str) -> PosstatsError:
        return PosstatsError(
            f"run store {self.store.display()} is in use by {describe_lock_holder(holder)}, {why}; a lock is stale "
            f"only when its heartbeat is older than {self.stale_after:.0f} s or its process is gone on the same "
            f"host: wait for that run to finish, or use another store"
        )

    def acquire(self) -> None:
        """Take the lock, taking over a stale one; start the heartbeat."""
        with self._guard():
            if self.store.local:
                holder, exists = self.store.read_lock()
                if exists:
                    stale, why = self._stale(holder)
                    if not stale:
                        raise self._busy(holder, why)
                    self.log(f"taking over the stale lock of {describe_lock_holder(holder)}: {why}")
                self.store.write_bytes(LOCK, self._payload())
            elif not self.store.create_exclusive(LOCK, self._payload()):
                holder, _ = self.store.read_lock()
                stale, why = self._stale(holder)
                if not stale:
                    raise self._busy(holder, why)
                self.log(f"taking over the stale lock of {describe_lock_holder(holder)}: {why}")
                self.store.remove(LOCK)
                if not self.store.create_exclusive(LOCK, self._payload()):
                    holder, _ = self.store.read_lock()
                    raise self._busy(holder, "it took over the same stale lock a moment ago")
        self._held = True
        self._thread = threading.Thread(target=self._beat_loop, name="posstats-lock-heartbeat", daemon=True)
        self._thread.start()

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat):
            try:
                self.beat()
            except Exception as exc:  # noqa: BLE001 - a failed beat is retried; staleness handles the rest
                self.log(f"lock heartbeat failed ({exc}); retrying")
            if self.lost:
                return

    def beat(self) -> None:
        """Refresh the heartbeat, or note that the lock was taken over."""
        with self._guard():
            holder, _ = self.store.read_lock()
            if not holder or holder.get("token") != self.token:
                self.lost = f"the lock now belongs to {describe_lock_holder(holder)}"
                return
            now = time.time()
            self.info["heartbeat"], self.info["heartbeat_ts"] = utc_now(), now
            self.store.write_bytes(LOCK, self._payload())

    def check(self) -> None:
        """Raise if this run no longer holds the lock (re-reads it)."""
        if not self.lost:
            holder, _ = self.store.read_lock()
            if not holder or holder.get("token") != self.token:
                self.lost = f"the lock now belongs to {describe_lock_holder(holder)}"
        if self.lost:
            msg = (
                f"run {self.info['run_id']} lost the lock of store {self.store.display()}: {self.lost} (this run "
                f"was presumed dead); stopping without publishing more"
            )
            raise PosstatsError(msg)

    def release(self) -> None:
        """Stop the heartbeat and delete the lock if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if not self._held:
            return
        self._held = False
        with contextlib.suppress(OSError, PosstatsError), self._guard():
            holder, _ = self.store.read_lock()
            if holder and holder.get("token") == self.token:
                self.store.remove(LOCK)


def sorted_runs(runs: Sequence[dict[str, Any]], /) -> list[dict[str, Any]]:
    """Run statuses ordered by finish time (incomplete runs last, by id)."""
    return sorted(runs, key=lambda r: (r["finished"] is None, r["finished"] or "", r["run_id"]))
