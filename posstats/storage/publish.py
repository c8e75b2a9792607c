"""Output folders that switch from one complete set of files to the next in one step.

Layout of an output folder ``OUT`` (``posstats count|analyze|run|report ... --out OUT``)::

    OUT/.posstats/v-<id>/           one published version: every file of the folder
    OUT/.posstats/current           symbolic link to the current version (the pointer)
    OUT/count.json -> .posstats/current/count.json      one link per published name,
    OUT/counts.safetensors -> .posstats/current/...    through the pointer
    OUT/store/                      anything else (e.g. a run store) is left alone

A command writes its files into a new version folder *inside* ``OUT`` (so the same file
system: an ``OUT`` that is a mount point works, and nothing is staged next to it), carries
over, as hard links, the files of the current version it does not replace, and then
replaces the ``current`` link with one atomic :func:`os.replace`. Every top-level name
links through ``current``, so that one rename switches all of them together: a reader
sees the old set or the new set, never a mix, and a command killed at any point leaves
the old set published. :func:`published_dir` resolves the pointer once, so a reader that
opens several files reads them all from one version.

What a command replaces: the files it writes, the names in ``replaces``, and every file
the previous publish with the same completion marker(s) (``last``) wrote. So ``count``
into a folder that held sparse counts drops ``counts.parquet`` when it writes
``counts.safetensors``, while ``analyze`` into a counts folder keeps the counts.

Clean-up: after a switch, the previous version is kept (a reader that resolved the
pointer just before it may still be opening files) and older ones are deleted, as are the
unfinished versions of processes that died on this host (each unfinished version holds
an ``.owner.json`` with the pid, host and process start time until it is published).
One writer per folder at a time: two commands publishing into the same ``OUT`` at once
each publish a complete set, and the last one wins.

Single files are published the same way, by :func:`atomic_path`: the one
temp-file-then-rename helper of the package (the counts files, JSON records, markers and
store pointers), with the umask rule of :func:`apply_umask` and an optional fsync;
:func:`file_sha256` is the checksum markers record for the files they name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from posstats.errors import PosstatsError
from posstats.processes import process_gone, process_start_ticks

__all__ = ["METADATA_DIR", "apply_umask", "atomic_path", "file_sha256", "link_or_copy", "published_dir", "staged_output"]

METADATA_DIR = ".posstats"
CURRENT = "current"
INDEX = ".published.json"
OWNER = ".owner.json"
_VERSION_PREFIX = "v-"
_LEGACY_FOLDER = "figures"  # the one output folder of unversioned run folders (report figures)


def _umask() -> int:
    """The process' umask, read without changing it (Linux ``/proc``), else by a set/reset."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(path: str | os.PathLike, /) -> None:
    """Give ``path`` the mode a plain ``open``/``mkdir`` would: 0666 (0777 for a folder)
    less the umask. ``tempfile.mkstemp``/``mkdtemp`` create 0600/0700, which would hide
    a team's shared outputs from its group."""
    base = 0o777 if os.path.isdir(path) else 0o666
    os.chmod(path, base & ~_umask())


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, /, *, fsync: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success move it onto ``path``.

    On an exception the temporary file is removed and ``path`` is left untouched. The file
    gets the mode a plain ``open`` would give it (0666 less the umask), not mkstemp's 0600.
    ``fsync=True`` flushes the written file to disk before the rename, so that a crash
    (of the machine, not only of the process) never leaves ``path`` naming a file with
    holes: for markers and pointers whose presence means "complete".
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if fsync:
            _fsync_file(tmp_path)
        apply_umask(tmp_path)  # after the writer: some (safetensors) recreate the file
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def _fsync_file(path: Path) -> None:
    """Flush a closed file's data to disk (fsync through a new descriptor)."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def link_or_copy(src: str | os.PathLike, dst: str | os.PathLike, /) -> None:
    """Make ``dst`` a hard link to the complete, never-modified file ``src`` (no bytes
    copied: a 500 MB counts file of a run store appears in an output folder at once), or a
    copy where a link cannot be made (another file system, links not supported)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def file_sha256(path: str | os.PathLike, /) -> str:
    """SHA-256 (64 hex digits) of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            digest.update(view[:n])
    return digest.hexdigest()


def published_dir(folder: str | os.PathLike, /) -> Path:
    """The folder that holds ``folder``'s current files, resolved once.

    For a versioned output folder this is the current version (a fixed path: files read
    from it all belong to one publish); for any other folder, ``folder`` itself.
    """
    folder = Path(folder)
    pointer = folder / METADATA_DIR / CURRENT
    try:
        target = os.readlink(pointer)
    except OSError:
        return folder
    return folder / METADATA_DIR / target


@contextlib.contextmanager
def staged_output(
    destination: str | os.PathLike,
    /,
    *,
    last: tuple[str, ...] = (),
    replaces: Iterable[str] = (),
) -> Iterator[Path]:
    """Yield an empty staging folder; on success publish its files as ``destination``'s.

    Args:
        destination: the output folder (created if needed).
        last: the completion markers among the files (e.g. ``("count.json",)``); the
            files a previous publish with the same marker wrote are replaced too.
        replaces: further names dropped from the folder even when this command does not
            write them (e.g. the other kind of counts file).

    Raises:
        PosstatsError: ``destination`` exists and is not a folder.

    On an exception (or a kill) nothing published changes; the unfinished version is
    removed (or, after a kill, by the next command that publishes into the folder).
    """
    destination = Path(destination)
    if destination.exists() and not destination.is_dir():
        msg = f"{destination}: exists and is not a folder; choose another output folder"
        raise PosstatsError(msg)
    created = [d for d in (destination, destination / METADATA_DIR) if not d.exists()]
    meta = destination / METADATA_DIR
    meta.mkdir(parents=True, exist_ok=True)
    for d in created:
        apply_umask(d)
    _remove_stale_versions(meta)
    stage = _new_version(meta)
    try:
        yield stage
        _publish(destination, stage, markers=last, replaces=frozenset(replaces))
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        for d in reversed(created):  # a failed command leaves no trace in the folder
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


def _new_version(meta: Path) -> Path:
    for _ in range(100):
        stage = meta / f"{_VERSION_PREFIX}{time.time_ns():020d}-{os.getpid()}"
        try:
            stage.mkdir()
        except FileExistsError:
            continue
        apply_umask(stage)
        owner = {"pid": os.getpid(), "hostname": socket.gethostname(), "start_ticks": process_start_ticks(os.getpid())}
        (stage / OWNER).write_text(json.dumps(owner) + "\n")
        return stage
    msg = f"{meta}: cannot create a new version folder"
    raise PosstatsError(msg)


def _read_index(version: Path | None) -> dict[str, list[str]]:
    if version is None:
        return {}
    try:
        return json.loads((version / INDEX).read_text()).get("groups", {})
    except (OSError, ValueError, AttributeError):
        return {}


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link ``src`` (a file or a folder tree) at ``dst``; copy where links fail."""
    if src.is_dir() and not src.is_symlink():
        dst.mkdir()
        for child in src.iterdir():
            _link_tree(child, dst / child.name)
        return
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)


def _publish(destination: Path, stage: Path, *, markers: tuple[str, ...], replaces: frozenset[str]) -> None:
    meta = stage.parent
    old = published_dir(destination)
    old = old if old != destination else None
    groups = _read_index(old)
    new_names = sorted(p.name for p in stage.iterdir() if p.name not in (OWNER, INDEX))
    dropped = set(new_names) | replaces
    for m in markers:
        dropped.update(groups.get(m, ()))
    for child in _carried_entries(destination, old):
        if child.name not in dropped:
            _link_tree(child, stage / child.name)
    names = sorted(p.name for p in stage.iterdir() if p.name not in (OWNER, INDEX))
    groups = {m: [n for n in ns if n in names] for m, ns in groups.items() if m not in markers}
    groups.update({m: new_names for m in markers})
    (stage / INDEX).write_text(json.dumps({"groups": groups, "published": time.time()}, indent=1) + "\n")
    (stage / OWNER).unlink()
    _fsync_tree(stage)
    _switch_pointer(meta, stage.name)
    _link_top_level(destination, names, replaces=dropped)
    _remove_old_versions(meta, keep={stage.name, old.name if old is not None else ""})


def _carried_entries(destination: Path, old: Path | None) -> list[Path]:
    """What a new version may carry over: the current version's entries or, for a folder
    written before versions existed, its plain top-level files and its ``figures/`` (never
    other folders, such as a run store kept in ``OUT/store``)."""
    if old is not None:
        return [c for c in old.iterdir() if c.name not in (OWNER, INDEX)]
    return [c for c in destination.iterdir()
            if not c.name.startswith(".") and not c.is_symlink()
            and (c.is_file() or (c.name == _LEGACY_FOLDER and c.is_dir()))]


def _fsync_tree(root: Path) -> None:
    """Flush a version's files before the pointer names it (a crash must not publish holes)."""
    for path in sorted(root.rglob("*"), reverse=True):
        if path.is_file() and not path.is_symlink():
            with contextlib.suppress(OSError):
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)


def _switch_pointer(meta: Path, version: str) -> None:
    tmp = meta / f".{CURRENT}.{os.getpid()}.{time.time_ns()}"
    os.symlink(version, tmp)
    try:
        os.replace(tmp, meta / CURRENT)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):
        fd = os.open(meta, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _link_top_level(destination: Path, names: list[str], *, replaces: set[str]) -> None:
    """Point each published name at ``.posstats/current/<name>``; drop links to names gone.

    Top-level entries that are not ours (no link into the pointer) are left alone, except
    real files or folders of a published or replaced name (an older, unversioned layout).
    """
    prefix = f"{METADATA_DIR}/{CURRENT}/"
    for name in names:
        link = destination / name
        want = prefix + name
        if link.is_symlink() and os.readlink(link) == want:
            continue
        tmp = destination / f".{name}.link-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        os.symlink(want, tmp)
        if link.is_dir() and not link.is_symlink():
            trash = destination / METADATA_DIR / f".trash-{name}-{time.time_ns()}"
            os.replace(link, trash)
            os.replace(tmp, link)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, link)
    published = set(names)
    for entry in destination.iterdir():
        if entry.name in published or entry.name == METADATA_DIR:
            continue
        if entry.is_symlink() and os.readlink(entry).startswith(prefix):
            entry.unlink(missing_ok=True)
        elif entry.name in replaces and not entry.is_symlink():
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def _owner_dead(version: Path) -> bool:
    """True for an unfinished version whose writer no longer runs on this host."""
    try:
        owner = json.loads((version / OWNER).read_text())
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True
    if owner.get("hostname") != socket.gethostname():
        return False
    pid = int(owner.get("pid", -1))
    return pid != os.getpid() and process_gone(pid, owner.get("start_ticks")) is not None


def _versions(meta: Path) -> list[Path]:
    return sorted(p for p in meta.iterdir() if p.name.startswith(_VERSION_PREFIX) and p.is_dir())


def _remove_stale_versions(meta: Path) -> None:
    """Delete unfinished versions left by killed writers on this host (and stray temp links)."""
    for v in _versions(meta):
        if (v / OWNER).exists() and _owner_dead(v):
            shutil.rmtree(v, ignore_errors=True)
    for p in meta.glob(".trash-*"):
        shutil.rmtree(p, ignore_errors=True)


def _remove_old_versions(meta: Path, *, keep: set[str]) -> None:
    """Delete published versions other than ``keep`` (unfinished ones of live writers stay)."""
    for v in _versions(meta):
        if v.name not in keep and not (v / OWNER).exists():
            shutil.rmtree(v, ignore_errors=True)
