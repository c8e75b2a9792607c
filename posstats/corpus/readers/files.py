"""Which files a set of inputs names (globs, folders, URLs), the reader format each has (by
suffix, compression included), and what one document is in a text file (``document_per``).
"""

from __future__ import annotations

import bz2
import glob
import gzip
import lzma
import os
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from posstats.corpus.remote import hub_dataset, is_url, list_objects, local_path, url_info
from posstats.errors import InputError, OptionError, PosstatsWarning

FORMATS = ("parquet", "jsonl", "hf", "text", "csv")

_SUFFIX_FORMATS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".arrow": "parquet",
    ".feather": "parquet",
    ".ipc": "parquet",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".csv": "csv",
    ".tsv": "csv",
}
_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
_HF_BUILDERS = {"parquet": "parquet", "jsonl": "json", "csv": "csv", "text": "text"}
_GLOB_CHARS = re.compile(r"[*?\[]")


def resolve_inputs(patterns: Iterable[str | os.PathLike[str]], /, *,
                   storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """Expand glob patterns (``**`` recursive, ``~`` expanded) into a sorted list of unique paths.

    A literal path must exist; files and directories (Hugging Face dataset folders) are
    both kept. ``file://`` URLs are local paths; other URLs (``s3://``, ``gs://``, ``hf://``,
    ...) are listed through fsspec (:mod:`posstats.corpus.remote`, with ``storage_options``)
    and kept as URLs, globs on them expanded to files.

    Raises:
        InputError: ``"no input matches 'x/*.parquet'"`` for a pattern matching nothing, or
            a listing that failed (network, permissions).
        PosstatsError: a URL scheme without an installed fsspec backend.

    >>> resolve_inputs(["data/*.jsonl"])  # doctest: +SKIP
    ['data/fortunes-sample.jsonl']
    """
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    found: set[str] = set()
    for pattern in patterns:
        pattern = os.path.expanduser(local_path(os.fspath(pattern)))
        if hub_dataset(pattern):  # a hub dataset: `datasets` resolves it (offline: its cache)
            found.add(pattern)
            continue
        if is_url(pattern):
            fs, objects = list_objects(pattern, storage_options)
            found.update(fs.unstrip_protocol(path) for path, _ in objects)  # one spelling per object
            continue
        if _GLOB_CHARS.search(pattern):
            matches = glob.glob(pattern, recursive=True)
        else:
            matches = [pattern] if os.path.exists(pattern) else []
        if not matches:
            msg = f"no input matches {pattern!r}"
            raise InputError(msg)
        found.update(os.path.normpath(m) for m in matches)
    return _one_path_per_file(sorted(found))


def _one_path_per_file(paths: list[str], /) -> list[str]:
    """``paths`` with every local file counted once: a symbolic link loop (``**`` through a
    link to a parent folder), a link beside its target or two patterns naming one file give
    several paths of one real file; the first (sorted) is kept and the rest dropped, with
    a :class:`PosstatsWarning` saying how many."""
    kept: dict[str, str] = {}
    dropped = []
    for path in paths:
        real = path if is_url(path) or hub_dataset(path) else os.path.realpath(path)
        if real in kept:
            dropped.append(path)
        else:
            kept[real] = path
    if dropped:
        msg = (f"{len(dropped)} input path(s) name a file already counted (symbolic links; e.g. {dropped[0]!r} is "
               f"{kept[os.path.realpath(dropped[0])]!r}): each file is counted once")
        warnings.warn(msg, PosstatsWarning, stacklevel=3)
    return list(kept.values())


DOCUMENT_UNITS = ("line", "paragraph", "file")


def document_unit(path: str | os.PathLike[str], given: str | None = None, /) -> str:
    """What one document is in a text file (``--document-per``): ``given``, else by suffix:
    a paragraph (lines up to a blank line) in Markdown (``.md``, also compressed), a line
    elsewhere (``.txt``, ``.text``: one sentence or record per line)."""
    if given is not None:
        if given not in DOCUMENT_UNITS:
            msg = f"{{document_per}} must be one of {', '.join(DOCUMENT_UNITS)}, got {given!r}"
            raise OptionError(msg)
        return given
    base, suffix = os.path.splitext(os.fspath(path).rstrip("/"))
    if suffix.lower() in _OPENERS:
        suffix = os.path.splitext(base)[1]
    return "paragraph" if suffix.lower() == ".md" else "line"


def document_note(inputs: Sequence[str], /, *, format: str | None = None, document_per: str | None = None) -> str | None:  # noqa: A002
    """One line saying how text inputs are cut into documents (printed when counting: a
    Markdown file read line by line, or a novel read as one document, changes every
    position's counts), or None when no input is a text file. Judged from the input
    patterns' suffixes, without listing them."""
    texts = []
    for pattern in inputs:
        try:
            fmt = format or guess_format(pattern)
        except InputError:
            continue
        if fmt == "text":
            texts.append(pattern)
    if not texts:
        return None
    units = sorted({document_unit(p, document_per) for p in texts})
    how = "--document-per" if document_per else "by suffix: a paragraph in .md, a line elsewhere"
    return (f"text input read as one document per {' / '.join(units)} ({how}; change with "
            "--document-per line|paragraph|file)")


def guess_format(path: str | os.PathLike[str], /) -> str:
    """The reader for ``path``, one of :data:`FORMATS`, from its suffix.

    ``.parquet .pq`` and Arrow IPC ``.arrow .feather .ipc`` -> ``"parquet"`` (that reader
    tells the two apart by their magic bytes); ``.jsonl .ndjson .json`` -> ``"jsonl"``
    (JSON Lines, not one JSON array); ``.txt .text .md`` -> ``"text"``; ``.csv .tsv`` ->
    ``"csv"``; a directory -> ``"hf"``. A trailing ``.gz .bz2 .xz`` is looked through
    (``corpus.jsonl.gz`` is ``"jsonl"``). A URL without a known suffix is a dataset folder
    or repository (``hf://datasets/ORG/NAME``, ``s3://bucket/saved_dataset``): ``"hf"``.

    Raises:
        InputError: for an unknown suffix.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        return "hf"
    base, suffix = os.path.splitext(path.rstrip("/"))
    if suffix.lower() in _OPENERS:
        suffix = os.path.splitext(base)[1]
    fmt = _SUFFIX_FORMATS.get(suffix.lower())
    if fmt is None and is_url(path):
        return "hf"
    if fmt is None:
        msg = f"{path}: cannot tell the format from the suffix {suffix or '(none)'!r}; choose one of {', '.join(FORMATS)}"
        raise InputError(msg)
    return fmt


def _check_file(path: str, storage_options: Mapping[str, Any]) -> None:
    if is_url(path):
        if url_info(path, storage_options).get("type") == "directory":
            msg = f"{path}: is a folder (use format='hf' for a Hugging Face dataset folder)"
            raise InputError(msg)
        return
    if os.path.isdir(path):
        msg = f"{path}: is a directory (use format='hf' for a Hugging Face dataset folder)"
        raise InputError(msg)
    if not os.path.exists(path):
        msg = f"{path}: no such file"
        raise InputError(msg)
