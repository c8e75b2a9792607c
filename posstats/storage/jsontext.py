"""JSON text as posstats writes it: standard JSON only, never NaN or Infinity.

Python's ``json`` writes ``NaN`` and ``Infinity`` by default; other parsers (JavaScript,
Go, jq, most JSON schema validators) reject them. Every JSON file and ``--json`` output of
posstats goes through :func:`dumps`: a non-finite number becomes ``null``, and a document
(a JSON object) that had any says where and why in its ``non_finite`` entry::

    "non_finite": {"paths": ["encodings[3].pearson"],
                   "why": "not a finite number (NaN or infinite): written as null"}
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from posstats.errors import PosstatsError
from posstats.storage.publish import atomic_path

__all__ = ["NON_FINITE_KEY", "dumps", "finite", "read_json_file", "write_json_atomic"]

NON_FINITE_KEY = "non_finite"
_WHY = "not a finite number (NaN or infinite): written as null"


def finite(obj: Any, /, path: str = "") -> tuple[Any, list[str]]:
    """``obj`` with every non-finite float (Python or numpy) replaced by None, numpy scalars
    and arrays made plain Python, and the JSON paths of what was replaced.

    >>> finite({"a": [1.0, float("nan")], "b": float("inf")})
    ({'a': [1.0, None], 'b': None}, ['a[1]', 'b'])
    """
    if isinstance(obj, (float, np.floating)):
        return (float(obj), []) if math.isfinite(obj) else (None, [path or "$"])
    if isinstance(obj, np.integer):
        return int(obj), []
    if isinstance(obj, np.bool_):
        return bool(obj), []
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "biu" or (obj.dtype.kind == "f" and bool(np.isfinite(obj).all())):
            return obj.tolist(), []  # nothing to replace: no walk over the elements
        obj = obj.tolist()
    if isinstance(obj, dict):
        out, bad = {}, []
        for k, v in obj.items():
            out[k], b = finite(v, f"{path}.{k}" if path else str(k))
            bad += b
        return out, bad
    if isinstance(obj, (list, tuple)):
        items, bad = [], []
        for i, v in enumerate(obj):
            if type(v) in _PLAIN:
                items.append(v)  # the common cases, without a path string per element
                continue
            if type(v) in _FLOATS and math.isfinite(v):
                items.append(float(v))
                continue
            item, b = finite(v, f"{path}[{i}]")
            items.append(item)
            bad += b
        return items, bad
    return obj, []


_PLAIN = (int, str, bool, type(None))  # exact types: a numpy scalar or a subclass takes the full path
_FLOATS = (float, np.float64, np.float32)


def dumps(obj: Any, /, *, indent: int | None = None, sort_keys: bool = False, note: bool = True) -> str:
    """Standard JSON text of ``obj`` (``json.dumps`` with ``allow_nan=False``) after
    :func:`finite`; with ``note``, an object that had non-finite values gets a
    ``non_finite`` entry naming their paths and why they are null."""
    clean, bad = finite(obj)
    if bad and note and isinstance(clean, dict):
        clean = {**clean, NON_FINITE_KEY: {"paths": bad, "why": _WHY}}
    return json.dumps(clean, indent=indent, sort_keys=sort_keys, allow_nan=False)


def write_json_atomic(path: str | os.PathLike, obj: Any, /) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically; return the path."""
    with atomic_path(path) as tmp:
        tmp.write_text(dumps(obj, indent=2) + "\n")
    return Path(path)


def read_json_file(path: str | os.PathLike, /, *, what: str) -> dict[str, Any] | None:
    """Parse a JSON file; None when it does not exist.

    Raises:
        PosstatsError: ``"<path>: unreadable <what> (<reason>)"`` for a file that exists but
            cannot be read or parsed.
    """
    try:
        # O_NONBLOCK: opening a FIFO someone named as a file must not wait for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        msg = f"{path}: unreadable {what} ({exc})"
        raise PosstatsError(msg) from exc
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            msg = f"{path}: not a regular file (a folder, FIFO, device or socket); give a {what} file"
            raise PosstatsError(msg)
        if st.st_size > _MAX_JSON_BYTES:
            msg = f"{path}: {st.st_size:,} bytes is too large for a {what} (at most {_MAX_JSON_BYTES:,})"
            raise PosstatsError(msg)
        try:
            return json.loads(f.read().decode("utf-8"), parse_constant=_no_constant)
        except (OSError, ValueError, RecursionError) as exc:
            text = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            msg = f"{path}: unreadable {what} ({text[:200]})"
            raise PosstatsError(msg) from None


_MAX_JSON_BYTES = 256 * 2**20  # far above any config, report or record posstats reads


def _no_constant(name: str) -> Any:
    """JSON has no NaN or Infinity; Python's parser accepts them unless told otherwise."""
    msg = f"{name} is not valid JSON (write null)"
    raise ValueError(msg)
