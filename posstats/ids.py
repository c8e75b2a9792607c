"""Names that become paths: the one rule for run ids, shard ids and result names.

Every name a store turns into a file or folder name (``runs/<run_id>``,
``STORE/runs/<run_id>.json``, ``STORE/reduce/<run_id>``, ``STORE/partials/<shard_id>``,
``STORE/results/<name>``, ``logs/<run_id>.log``) goes through :func:`validate_id` first,
so a name can never leave its folder (``../../victim``, ``/tmp/x``), hide itself
(``.x``), look like an option (``-x``) or smuggle a NUL or newline into a path.

The rule: 1-128 characters from ``A-Z a-z 0-9 . _ -``, starting with a letter or digit,
without ``..`` anywhere. Both stores (:mod:`posstats.service.pipeline_store`, :mod:`posstats.service.shard_store`)
and the command line use it.
"""

from __future__ import annotations

import re
from typing import Any

from posstats.errors import PosstatsError

__all__ = ["MAX_ID_CHARS", "is_valid_id", "validate_id", "validate_run_id"]

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
