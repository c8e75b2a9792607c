"""Names that become paths: the one rule for run ids, shard ids and result names.

Every name a store turns into a file or folder name (``runs/<run_id>``,
``STORE/runs/<run_id>.json``, ``STORE/reduce/<run_id>``, ``STORE/partials/<shard_id>``,
``STORE/results/<name>``, ``logs/<run_id>.log``) goes through :func:`validate_id` first,
so a name can never leave its folder (``../../victim``, ``/tmp/x``), hide itself
(``.x``), look like an option (``-x``) or smuggle a NUL or newline into a path.

The rule: 1-128 characters from ``A-Z a-z 0-9 . _ -``, starting with a letter or digit,
without ``..`` anywhere. Both stores (:mod:`posstats.service.pipeline_store`, :mod:`posstats.corpus.shard_store`)
and the command line use it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from posstats.errors import PosstatsError

__all__ = ["MAX_ID_CHARS", "is_valid_id", "join_inside", "relative_key_parts", "validate_id", "validate_run_id"]

MAX_ID_CHARS = 128
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,%d}" % (MAX_ID_CHARS - 1))


def is_valid_id(name: Any, /) -> bool:
    """True when ``name`` is a string that :func:`validate_id` accepts."""
    return isinstance(name, str) and _ID.fullmatch(name) is not None and ".." not in name


def validate_id(name: Any, /, *, kind: str = "run id") -> str:
    """Return ``name`` if it is a safe file/folder name, else raise :class:`PosstatsError`.

    Allowed: 1-128 characters from ``A-Z a-z 0-9 . _ -``, starting with a letter or digit,
    without ``..``. So no path separators, no absolute paths, no hidden names, no NUL or
    newline, nothing that leaves the folder it is joined to.

    Args:
        name: the candidate name.
        kind: what it names, for the message (``"run id"``, ``"shard id"``, ``"result name"``).

    Raises:
        PosstatsError: ``"invalid run id '../x': use 1-128 characters ..."`` (one line; the
            value is shown with ``repr`` so control characters stay visible).
    """
    if not isinstance(name, str):
        msg = f"{kind} must be a string, got {name!r}"
        raise PosstatsError(msg)
    if not is_valid_id(name):
        msg = (
            f"invalid {kind} {name[:200]!r}: use 1-{MAX_ID_CHARS} characters from A-Z a-z 0-9 . _ - starting "
            f"with a letter or digit, without '..' or path separators"
        )
        raise PosstatsError(msg)
    return name


def validate_run_id(run_id: Any, /) -> str:
    """:func:`validate_id` for a run id."""
    return validate_id(run_id, kind="run id")


def relative_key_parts(key: Any, /, *, what: str = "object key") -> tuple[str, ...]:
    """The '/'-separated parts of a relative key (an object key below a listed prefix, a
    file name a marker lists) that may become a path below a folder of ours.

    A leading ``/`` is dropped (fsspec keys of some stores have one); every other part must
    be a non-empty name other than ``.`` and ``..`` without NUL. So a key such as
    ``data/p/../../../../etc/x.pth`` can never climb out of the folder it is joined to.

    Raises:
        PosstatsError: one line naming the key (``repr``, at most 200 characters).
    """
    if not isinstance(key, str):
        msg = f"{what} must be a string, got {type(key).__name__}"
        raise PosstatsError(msg)
    parts = tuple(key.lstrip("/").split("/"))
    bad = next((p for p in parts if p in ("", ".", "..") or "\x00" in p), None)
    if bad is not None or not parts:
        msg = (f"{what} {key[:200]!r} is refused: its part {bad!r} could name a path outside the folder it is "
               "copied into (keys with '..', '.', empty parts or NUL are never written)")
        raise PosstatsError(msg)
    return parts


def join_inside(base: str | os.PathLike, key: Any, /, *, what: str = "object key") -> Path:
    """``base / key`` for an untrusted relative ``key``, guaranteed to lie inside ``base``.

    The key's parts are checked (:func:`relative_key_parts`), then the joined path is
    resolved (symbolic links followed, as a write would) and must still lie below the
    resolved ``base``: a link planted inside ``base`` cannot redirect a write either.

    Raises:
        PosstatsError: the key, or a link on its way, leads outside ``base``.
    """
    root = Path(base)
    dest = root.joinpath(*relative_key_parts(key, what=what))
    real_root, real_dest = os.path.realpath(root), os.path.realpath(dest)
    if os.path.commonpath([real_root, real_dest]) != real_root or real_dest == real_root:
        msg = f"{what} {str(key)[:200]!r} is refused: it leads outside {root} (through a symbolic link)"
        raise PosstatsError(msg)
    return dest
