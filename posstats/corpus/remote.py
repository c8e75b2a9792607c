"""Inputs at fsspec URLs (``s3://``, ``gs://``, ``hf://``, ``memory://``...): listing,
opening and versioning, in one place.

Local paths (and ``file://`` URLs, which are local paths) never come through here: the
readers keep their local fast paths (memory maps, Arrow's own file readers). A URL is read
through the fsspec filesystem of its scheme, streamed: Parquet / Arrow files with range
requests (footer first, then the row groups), line formats and CSV as one sequential read
(``.gz`` / ``.bz2`` / ``.xz`` decompressed on the fly). Options of the filesystem
(endpoint, credentials...) come from ``storage_options`` and, as for every fsspec user, from
fsspec's own configuration (``FSSPEC_S3_ENDPOINT_URL=...`` style variables, or
``~/.config/fsspec/*.json``); the cloud SDKs' usual credential chains apply.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import glob
import hashlib
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from typing import IO, Any

from posstats.errors import InputError, PosstatsError

__all__ = [
    "parse_value",
    "MAX_OPTION_DEPTH",
    "absolute",
    "check_storage_options",
    "hub_dataset",
    "is_url",
    "list_objects",
    "local_path",
    "object_version_ns",
    "open_url",
    "url_filesystem",
    "url_info",
]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


# fsspec options whose value is itself a table of keyword arguments (s3fs, gcsfs, adlfs, http)
_TABLE_OPTIONS = frozenset({"client_kwargs", "config_kwargs", "s3_additional_kwargs", "headers", "kwargs",
                            "storage_options", "target_options", "open_kwargs"})
MAX_OPTION_DEPTH = 8


def parse_value(text: str, /) -> Any:
    """A TOML value, as ``--set`` and ``--storage-option`` values are written (``128``, ``[2, 16]``, ``"x"``, ``true``); a bare word is a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def check_storage_options(options: Any, /, *, where: str = "--storage-option") -> dict[str, Any]:
    """``options`` if they can be handed to fsspec, else a one-line :class:`PosstatsError`.

    A table of string keys, nested at most :data:`MAX_OPTION_DEPTH` levels, in which the
    options fsspec backends take as keyword tables (``client_kwargs``, ``config_kwargs``,
    ``headers``, ...) are tables: ``client_kwargs=5`` fails here, not as an
    ``AttributeError`` deep inside botocore.
    """
    def walk(node: Any, path: str, depth: int) -> None:
        if depth > MAX_OPTION_DEPTH:
            msg = f"{where}: {path[:80]}... nests more than {MAX_OPTION_DEPTH} levels"
            raise PosstatsError(msg)
        for key, value in node.items():
            if not isinstance(key, str) or not key:
                msg = f"{where}: option names must be non-empty strings, got {key!r} in {path or 'the options'}"
                raise PosstatsError(msg)
            name = f"{path}.{key}" if path else key
            if key in _TABLE_OPTIONS and not isinstance(value, Mapping):
                msg = f"{where}: {name} must be a table of keyword arguments (e.g. {name}.endpoint_url=...), got {value!r}"
                raise PosstatsError(msg)
            if isinstance(value, Mapping):
                walk(value, name, depth + 1)

    if not isinstance(options, Mapping):
        msg = f"{where}: fsspec options must be a table, got {options!r}"
        raise PosstatsError(msg)
    walk(options, "", 1)
    return dict(options)


def is_url(path: object, /) -> bool:
    """True for ``scheme://...`` with any scheme but ``file://`` (which is a local path)."""
    return isinstance(path, str) and bool(_URL.match(path)) and not path.startswith("file://")


_HUB_DATASET = re.compile(r"^hf://datasets/([^/@]+/[^/@]+|[^/@]+)(@[^/]+)?/?$")


def hub_dataset(path: str, /) -> str | None:
    """``ORG/NAME`` of a bare hub dataset URL ``hf://datasets/ORG/NAME[@REVISION]`` (read
    by ``datasets.load_dataset``, from its local cache when offline), else None (files and
    globs inside a repository are ordinary fsspec URLs)."""
    m = _HUB_DATASET.match(path)
    return m.group(1) if m else None


def local_path(path: str, /) -> str:
    """``path`` with a leading ``file://`` removed (``file:///data/x`` -> ``/data/x``)."""
    return path[len("file://"):] if path.startswith("file://") else path


def absolute(path: str, /) -> str:
    """An input's stable spelling: a URL as given, a local path (``file://`` dropped) absolute."""
    return path if is_url(path) else os.path.abspath(local_path(path))


def url_filesystem(url: str, storage_options: Mapping[str, Any] | None = None, /) -> tuple[Any, str]:
    """``(filesystem, path inside it)`` of ``url``.

    Raises:
        PosstatsError: no fsspec backend for the scheme is installed (names the package when
            fsspec knows it, e.g. s3fs for ``s3://``).
    """
    import fsspec.core  # only URL inputs pay its import (~50 ms of every command's start-up)

    try:
        return fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    except (ImportError, ValueError) as exc:
        msg = f"{url}: reading this URL needs an fsspec backend that is not installed ({_first_line(exc)})"
        raise PosstatsError(msg) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


@contextlib.contextmanager
def _one_line_errors(url: str, verb: str, /) -> Iterator[None]:
    """Backend errors inside the block as one-line InputErrors naming ``url``:
    ``"<url>: no such file"`` or ``"<url>: cannot <verb> (<error>)"``."""
    try:
        yield
    except FileNotFoundError:
        msg = f"{url}: no such file"
        raise InputError(msg) from None
    except (InputError, PosstatsError):
        raise
    except Exception as exc:  # noqa: BLE001 - network / permission errors of any backend
        msg = f"{url}: cannot {verb} ({_first_line(exc)})"
        raise InputError(msg) from exc


def list_objects(url: str, storage_options: Mapping[str, Any] | None = None, /, *,
                 must_match: bool = True) -> tuple[Any, list[tuple[str, Mapping[str, Any]]]]:
    """The files a URL or a glob on one names: ``(filesystem, [(path, info), ...])``, sorted.

    A literal URL naming a folder gives the folder itself (``info["type"] == "directory"``:
    a Hugging Face dataset folder); a glob keeps files only.

    Raises:
        PosstatsError: no backend for the scheme.
        InputError: the listing failed (network, permissions: one line naming the URL);
            nothing matches (with ``must_match``).
    """
    fs, path = url_filesystem(url, storage_options)
    with contextlib.suppress(Exception):
        fs.invalidate_cache()
    try:
        if glob.has_magic(path):
            found = fs.glob(path, detail=True)
            objects = sorted((p, i) for p, i in found.items() if i.get("type") == "file")
        else:
            info = fs.info(path)
            objects = [(path, info)] if info.get("type") in ("file", "directory") else []
    except FileNotFoundError:
        objects = []
    except Exception as exc:  # noqa: BLE001 - network / permission errors of any backend
        msg = f"{url}: cannot list the input ({_first_line(exc)})"
        raise InputError(msg) from exc
    if not objects and must_match:
        msg = f"no input matches {url!r}"
        raise InputError(msg)
    return fs, objects


def url_info(url: str, storage_options: Mapping[str, Any] | None = None, /) -> Mapping[str, Any]:
    """fsspec's ``info`` of ``url`` (``size``, ``type``, backend fields such as ``ETag``).

    Raises:
        InputError: ``"<url>: no such file"``, or the backend's error in one line.
    """
    fs, path = url_filesystem(url, storage_options)
    with _one_line_errors(url, "read"):
        return fs.info(path)


def object_version_ns(fs: Any, info: Mapping[str, Any], path: str, /) -> int:
    """A modification time in ns standing for an object's version: its last-modified second,
    plus sub-second digits from its content identity (ETag, else fsspec's ``ukey``), so it
    changes exactly when the object does (stores keep whole seconds at best)."""
    stamp = info.get("LastModified") or info.get("mtime") or info.get("last_modified") or info.get("created")
    seconds = 0
    if isinstance(stamp, _dt.datetime):
        seconds = int(stamp.timestamp())
    elif isinstance(stamp, (int, float)):
        seconds = int(stamp)
    identity = info.get("ETag") or info.get("etag")
    if not identity:
        try:
            identity = fs.ukey(path)
        except Exception:  # noqa: BLE001 - any backend-specific failure: fall back to the size
            identity = str(info.get("size"))
    sub = int(hashlib.sha256(str(identity).encode()).hexdigest()[:8], 16) % 1_000_000_000
    return seconds * 1_000_000_000 + sub


@contextlib.contextmanager
def open_url(url: str, storage_options: Mapping[str, Any] | None = None, /, *, text: bool = False,
             compression: str | None = None) -> Iterator[IO[Any]]:
    """``with open_url(url) as f``: ``url`` opened for reading, streamed.

    Binary by default (seekable: Parquet and Arrow readers use range requests); ``text=True``
    decodes UTF-8 keeping bad bytes as lone surrogates (the readers name the line), and
    ``compression="infer"`` decompresses ``.gz`` / ``.bz2`` / ``.xz`` on the fly. Every layer
    (decoder, decompressor, remote file) is closed on exit.

    Raises:
        InputError: the object is missing or cannot be opened (one line naming the URL).
    """
    import fsspec.core

    fs, path = url_filesystem(url, storage_options)
    opened = fsspec.core.OpenFile(fs, path, "rt" if text else "rb", compression=_compression(url, compression),
                                  encoding="utf-8" if text else None, errors="surrogateescape" if text else None)
    with _one_line_errors(url, "open"):
        f = opened.__enter__()
    try:
        yield f
    finally:
        opened.__exit__(None, None, None)


def _compression(url: str, compression: str | None) -> str | None:
    if compression == "infer":
        import fsspec.utils

        return fsspec.utils.infer_compression(url)
    return compression
