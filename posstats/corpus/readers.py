"""Readers: Parquet / Arrow, JSON Lines, Hugging Face datasets, plain text and CSV files
turned into a stream of :class:`~posstats.counting.tokens.TokenBatch`.

Each input row is one document (one token-id sequence). A row comes either

* from a **token-id column** (``column=``): a ``list<int>`` column (Parquet/Arrow/HF), a
  JSON array of integers (JSONL), or a string of integers separated by spaces and/or
  commas (CSV/TSV, e.g. ``"101 7592 102"`` or ``"101,7592,102"``); or
* from a **text column** (``text_column=`` plus ``tokenizer=``), tokenised in batches.
  In ``text`` files a row is one document, no column is named, and what a document is
  comes from ``document_per`` (:func:`document_unit`): a non-blank line (the default, and
  for ``.txt``), a paragraph of non-blank lines up to a blank one (the default for ``.md``)
  or the whole file; surrounding whitespace of each line is stripped.

Every batch carries ``source`` (the file or folder read) and ``first_row``, so errors can
name the file and the row. Rows are numbered from 0 in the order the format defines them:
Parquet/Arrow/HF/CSV data rows (header excluded), JSONL records (blank lines skipped),
text non-blank lines. Messages about JSONL and text files also give the 1-based *line*
number, which is what an editor shows; so do those about CSV cells that are not UTF-8.

No Python work is done per token: list columns are converted by reinterpreting Arrow's
values/offsets buffers, CSV id strings are split and parsed by Arrow compute kernels,
and texts are tokenised by one ``encode_batch`` call per batch. JSON Lines are parsed one
line at a time (the format forces it); their ids are type-checked per batch at C speed.
"""

from __future__ import annotations

import bz2
import contextlib
import csv
import dataclasses
import glob
import gzip
import itertools
import json
import lzma
import os
import re
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from posstats.corpus.remote import (
    hub_dataset,
    is_url,
    list_objects,
    local_path,
    open_url,
    url_filesystem,
    url_info,
)
from posstats.corpus.tokenizer import encode_texts, load_tokenizer
from posstats.counting.counts import first_id_outside
from posstats.counting.tokens import TokenBatch
from posstats.errors import InputError, OptionError, PosstatsError, PosstatsWarning

__all__ = [
    "DOCUMENT_UNITS",
    "FORMATS",
    "ReaderSpec",
    "arrow_batches",
    "check_column",
    "checked_lines",
    "describe_exception",
    "document_note",
    "document_unit",
    "guarded_reads",
    "guess_format",
    "jsonl_batches",
    "read_token_batches",
    "resolve_inputs",
    "text_batches",
    "validate_ids",
]

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
_INT_STRING = re.compile(r"-?[0-9]+")  # what Arrow's string -> int64 cast accepts
_INT64_MAX = np.iinfo(np.int64).max


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


@dataclasses.dataclass(frozen=True)
class ReaderSpec:
    """How rows become token ids: the options of :func:`read_token_batches` (see there),
    with ``tokenizer`` loaded. Shared with the shard readers (:mod:`posstats.corpus.shards`),
    which read pieces of a file with the same per-format batching."""

    column: str | None
    text_column: str | None
    tokenizer: Any
    batch_size: int
    add_special_tokens: bool
    hf_streaming: bool
    hf_split: str | None
    storage_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    document_per: str | None = None  # text files: line, paragraph or file (None: by suffix, document_unit)

    @property
    def name(self) -> str | None:
        return self.column if self.column is not None else self.text_column


def read_token_batches(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    /,
    *,
    format: str | None = None,  # noqa: A002 - the user-facing option is called "format"
    column: str | None = None,
    text_column: str | None = None,
    tokenizer: Any = None,
    batch_size: int = 4096,
    add_special_tokens: bool = False,
    hf_streaming: bool = False,
    hf_split: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    document_per: str | None = None,
) -> Iterator[TokenBatch]:
    """Iterate over the token-id sequences of ``paths`` (in order) in batches of at most ``batch_size`` rows.

    Args:
        paths: files (or, for ``"hf"``, folders), e.g. from :func:`resolve_inputs`; local
            paths or fsspec URLs (streamed, see :mod:`posstats.corpus.remote`).
        format: one of :data:`FORMATS` for every path; ``None`` guesses per path
            (:func:`guess_format`).
        column: name of a token-id column (see the module docstring for each format).
        text_column: name of a text column, tokenised with ``tokenizer``. Not needed for
            ``text`` files; for the HF ``text`` builder it defaults to ``"text"``.
        tokenizer: a ``tokenizers.Tokenizer`` or the path of a ``tokenizer.json``
            (loaded with padding/truncation off). Unused when ``column`` is given, so a
            caller may always pass the tokenizer that defines its vocabulary.
        batch_size: rows per batch (a batch may be smaller, never larger).
        add_special_tokens: passed to the tokenizer (BERT adds ``[CLS]``/``[SEP]``).
        hf_streaming: ``"hf"`` only: stream with ``datasets`` instead of building an Arrow
            cache first.
        hf_split: ``"hf"`` only: the split of a ``DatasetDict``; by default its only
            split (a dataset with several is an error that lists them: never a silent pick).
        storage_options: options of the fsspec filesystem of URL inputs (endpoint,
            credentials...).
        document_per: ``text`` files only: one document per ``line``, ``paragraph``
            (non-blank lines up to a blank one, joined by newlines) or ``file``; None:
            by suffix (:func:`document_unit`: paragraphs in ``.md``, lines elsewhere).

    Either ``column`` or ``tokenizer`` (with ``text_column`` where the format has
    columns) gives the ids. Files with no rows yield nothing. Token ids are not
    range-checked here: see :func:`validate_ids`.

    Raises:
        PosstatsError: on the call, for contradictory options (both ``column`` and
            ``text_column``; neither ``column`` nor ``tokenizer``; an unknown format).
        InputError: on the call for a missing file or an unknown suffix; while iterating
            for bad content, with a one-line message naming the file and row or value.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    _check_options(format, batch_size, column, text_column, tokenizer)
    if column is not None:
        tokenizer = None
    elif isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer(tokenizer)
    if document_per is not None:
        document_unit("", document_per)  # refused on the call, not while iterating
    spec = ReaderSpec(column, text_column, tokenizer, batch_size, add_special_tokens, hf_streaming, hf_split,
                      dict(storage_options or {}), document_per)
    return _read_all(_plan_reads([os.fspath(p) for p in paths], format, spec), spec)


def _check_options(format: str | None, batch_size: Any, column: str | None, text_column: str | None,  # noqa: A002
                   tokenizer: Any) -> None:
    """Refuse contradictory reader options (PosstatsError), before any file is looked at."""
    if format is not None and format not in FORMATS:
        msg = f"unknown input format {format!r}; choose one of {', '.join(FORMATS)}"
        raise PosstatsError(msg)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        msg = f"batch_size must be a positive integer, got {batch_size!r}"
        raise PosstatsError(msg)
    if column is not None and text_column is not None:
        msg = "give either column= (token ids) or text_column= (text), not both"
        raise PosstatsError(msg)
    if column is None and tokenizer is None:
        msg = "give column= (a token-id column) or a tokenizer= to tokenise text"
        raise PosstatsError(msg)


def _plan_reads(paths: list[str], format: str | None, spec: ReaderSpec) -> list[tuple[str, str]]:  # noqa: A002
    """(path, format) of every input, each checked to fit the options and to exist.

    Every format is guessed before anything is read, so a bad suffix fails fast.
    """
    jobs = [(p, format or guess_format(p)) for p in paths]
    for path, fmt in jobs:
        if fmt == "text":
            if spec.column is not None:
                msg = f"{path}: a text file has no token-id column; pass tokenizer= instead of column="
                raise PosstatsError(msg)
        elif fmt != "hf" and spec.column is None and spec.text_column is None:
            msg = f"{path}: tokenizer= needs text_column= naming the text column"
            raise PosstatsError(msg)
    for path, fmt in jobs:
        if fmt != "hf":
            _check_file(path, spec.storage_options)
    return jobs


def _read_all(jobs: list[tuple[str, str]], spec: ReaderSpec) -> Iterator[TokenBatch]:
    for path, fmt in jobs:
        yield from _READERS[fmt](path, spec)


def validate_ids(batch: TokenBatch, vocab_size: int, /) -> None:
    """Check that every id of ``batch`` is in ``[0, vocab_size)`` (vectorised; numpy or cupy;
    :func:`posstats.counting.counts.first_id_outside`).

    Raises:
        InputError: ``"<source>: row <r>: token id <v> is out of range [0, <V>)"`` for the
            first offending id.
    """
    found = first_id_outside(batch, vocab_size)
    if found is not None:
        row, value = found
        msg = f"{batch.source}: row {row}: token id {value} is out of range [0, {vocab_size})"
        raise InputError(msg)


# ----------------------------------------------------------------------------------------
# Arrow arrays -> TokenBatch (shared by the parquet, arrow, csv and hf readers)


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


def check_column(path: str, schema: pa.Schema, spec: ReaderSpec) -> None:
    """Raise InputError unless ``schema`` has the column ``spec`` reads, of the right type
    (a list of integers for ``column``, text for ``text_column``)."""
    name = spec.name
    if name not in schema.names:
        msg = f"{path}: no column {name!r} (available: {', '.join(schema.names) or 'none'})"
        raise InputError(msg)
    dtype = schema.field(name).type
    if spec.column is not None and not _is_int_list(dtype):
        msg = f"{path}: column {name!r} has type {dtype}; expected a list of integer token ids (text needs text_column=)"
        raise InputError(msg)
    if spec.column is None and not _is_text(dtype):
        msg = f"{path}: column {name!r} has type {dtype}; expected text (token-id lists need column=)"
        raise InputError(msg)


def _is_int_list(dtype: pa.DataType) -> bool:
    is_list = pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype)
    return is_list and pa.types.is_integer(dtype.value_type)


def _is_text(dtype: pa.DataType) -> bool:
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    return pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or getattr(pa.types, "is_string_view", bool)(dtype)


def arrow_batches(
    arrays: Iterable[pa.Array | pa.ChunkedArray], path: str, spec: ReaderSpec, /, *, first_row: int = 0
) -> Iterator[TokenBatch]:
    """Re-slice a stream of Arrow columns (list<int> ids or text) into TokenBatches of at
    most ``batch_size`` rows, numbering rows from ``first_row``."""
    row = first_row
    for array in arrays:
        chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
        for chunk in chunks:
            for start in range(0, len(chunk), spec.batch_size):
                part = chunk.slice(start, spec.batch_size)
                if spec.column is not None:
                    yield _ids_from_list_array(part, path, row, spec.column)
                else:
                    yield _encode_arrow_texts(part, path, row, spec)
                row += len(part)


def _ids_from_list_array(array: pa.Array, path: str, first_row: int, name: str) -> TokenBatch:
    """Zero-copy view of a (possibly sliced) list<int> array as values (int32 as stored,
    other integer types as int64) + offsets (int64)."""
    if array.null_count:
        row = first_row + _first_true(array.is_null())
        msg = f"{path}: row {row}: column {name!r} is null instead of a list of token ids"
        raise InputError(msg)
    n = len(array)
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        offsets = np.arange(n + 1, dtype=np.int64) * size
        values = array.values.slice(array.offset * size, n * size)
    else:
        # .values ignores the slice; .offsets honours it, so cut values to the slice's range.
        raw = numpy_view(array.offsets)
        offsets = raw.astype(np.int64) - int(raw[0])
        values = array.values.slice(int(raw[0]), int(raw[-1] - raw[0]))
    if values.null_count:
        index = _first_true(values.is_null())
        row = first_row + int(np.searchsorted(offsets, index, side="right")) - 1
        msg = f"{path}: row {row}: column {name!r} holds a null token id"
        raise InputError(msg)
    ids = numpy_view(values)
    if ids.dtype == np.uint64 and ids.size and ids.max() > _INT64_MAX:
        index = int(np.argmax(ids > _INT64_MAX))
        row = first_row + int(np.searchsorted(offsets, index, side="right")) - 1
        msg = f"{path}: row {row}: token id {int(ids[index])} does not fit in int64"
        raise InputError(msg)
    # int32 ids stay int32 (no copy: half the memory of int64, and most corpora store them so)
    return TokenBatch(ids if ids.dtype == np.int32 else ids.astype(np.int64, copy=False), offsets, path, first_row)


_NUMPY_INTEGERS = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
                   pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.uint64(): np.uint64}


def numpy_view(array: pa.Array, /) -> np.ndarray:
    """The values of an Arrow array as numpy: a zero-copy read-only view of an integer
    array without nulls, else ``to_numpy``. (pyarrow's ``to_numpy`` imports pandas, when
    it is installed, at its first call: 0.16 s of every ``posstats count``.)

    >>> numpy_view(pa.array([1, 2, 3], pa.int32()).slice(1)).tolist()
    [2, 3]
    """
    dtype = _NUMPY_INTEGERS.get(array.type)
    if dtype is None or array.null_count:
        return array.to_numpy(zero_copy_only=False)
    dtype = np.dtype(dtype)
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def _encode_arrow_texts(array: pa.Array, path: str, first_row: int, spec: ReaderSpec) -> TokenBatch:
    if array.null_count:
        row = first_row + _first_true(array.is_null())
        msg = f"{path}: row {row}: text column {spec.text_column!r} is null"
        raise InputError(msg)
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return encode_texts(
        spec.tokenizer,
        array.to_pylist(),
        add_special_tokens=spec.add_special_tokens,
        source=path,
        first_row=first_row,
    )


def _first_true(mask: pa.Array) -> int:
    return int(np.argmax(mask.to_numpy(zero_copy_only=False)))


def describe_exception(exc: BaseException) -> str:
    """``"TypeName: message"`` on one line (whitespace collapsed, at most 300 characters),
    for messages that quote a library's error."""
    text = " ".join(str(exc).split())
    text = text[:300] if text else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def guarded_reads(items: Iterator[Any], path: str, what: str) -> Iterator[Any]:
    """Turn Arrow/OS errors raised while *reading* (not while converting) into InputError."""
    while True:
        try:
            item = next(items)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as exc:
            msg = f"{path}: not a valid {what} file ({describe_exception(exc)})"
            raise InputError(msg) from exc
        yield item


# ----------------------------------------------------------------------------------------
# Parquet and Arrow IPC


def _read_columnar(path: str, spec: ReaderSpec) -> Iterator[TokenBatch]:
    if is_url(path):  # streamed: the footer, then one row group (or batch) at a time
        with open_url(path, spec.storage_options) as f:
            head = f.read(8)
            f.seek(0)
            yield from _columnar_batches(path, head, f, spec)
        return
    with open(path, "rb") as f:
        head = f.read(8)
    yield from _columnar_batches(path, head, None, spec)


def _columnar_batches(path: str, head: bytes, opened: Any, spec: ReaderSpec) -> Iterator[TokenBatch]:
    """Batches of a Parquet / Arrow IPC file (kind told by ``head``, its first bytes), read
    from ``opened`` (a seekable binary file) or, when None, from the local ``path``."""
    what = "Parquet"
    try:
        if head[:4] == b"PAR1":
            parquet = pq.ParquetFile(path if opened is None else opened)
            schema = parquet.schema_arrow
            check_column(path, schema, spec)
            batches = parquet.iter_batches(batch_size=spec.batch_size, columns=[spec.name])
        elif head[:6] == b"ARROW1":
            what = "Arrow IPC"
            reader = pa.ipc.open_file(pa.memory_map(path) if opened is None else opened)
            schema = reader.schema
            check_column(path, schema, spec)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        elif head[:4] == b"\xff\xff\xff\xff":
            what = "Arrow IPC"
            reader = pa.ipc.open_stream(pa.memory_map(path) if opened is None else opened)
            schema = reader.schema
            check_column(path, schema, spec)
            batches = iter(reader)
        else:
            msg = f"{path}: not a valid Parquet file (no Parquet or Arrow magic bytes at its start)"
            raise InputError(msg)
    except (pa.ArrowException, OSError) as exc:
        msg = f"{path}: not a valid {what} file ({describe_exception(exc)})"
        raise InputError(msg) from exc
    columns = (batch.column(spec.name) for batch in guarded_reads(iter(batches), path, what))
    yield from arrow_batches(columns, path, spec)


# ----------------------------------------------------------------------------------------
# Line-oriented files: JSON Lines and plain text


def _open_text(path: str, storage_options: Mapping[str, Any] | None = None) -> contextlib.AbstractContextManager[Any]:
    """``path`` as text, UTF-8, bad bytes kept as lone surrogates (see :func:`checked_lines`);
    ``.gz .bz2 .xz`` decompressed; URLs streamed (:func:`posstats.corpus.remote.open_url`).

    Strict decoding would fail on the whole decoded chunk (8 KiB and more), before the
    lines in front of the bad byte are even seen, so its line number would be wrong; the
    lines are split exactly as before (universal newlines), and each one is checked.
    """
    if is_url(path):
        return open_url(path, storage_options, text=True, compression="infer")
    opener = _OPENERS.get(os.path.splitext(path)[1].lower())
    if opener is None:
        return open(path, encoding="utf-8", errors="surrogateescape")  # noqa: SIM115 - closed by the caller's with
    return opener(path, "rt", encoding="utf-8", errors="surrogateescape")


def utf8_problem(line: str, /, *, what: str = "line") -> str | None:
    """Why ``line`` (decoded with ``errors="surrogateescape"``) is not UTF-8, or None when it is.

    >>> utf8_problem(b"ok \\xff".decode("utf-8", "surrogateescape"))
    'invalid start byte 0xff at byte 4 of the line'
    """
    if line.isascii():
        return None
    try:
        line.encode("utf-8")  # valid text holds no escaped bytes
    except UnicodeEncodeError:
        raw = line.encode("utf-8", "surrogateescape")  # the bytes as read
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"{exc.reason} 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the {what}"
    return None


def checked_lines(lines: Iterable[tuple[int, str]], path: str) -> Iterator[tuple[int, str]]:
    """Pass ``(line number, line)`` pairs through, raising InputError at the first line that
    is not UTF-8, with its own line number."""
    for lineno, line in lines:
        problem = utf8_problem(line)
        if problem is not None:
            msg = f"{path}: line {lineno}: not UTF-8 text ({problem})"
            raise InputError(msg)
        yield lineno, line


def _numbered_lines(path: str, spec: ReaderSpec) -> Iterator[tuple[int, str]]:
    """(1-based line number, line) pairs; decoding errors become one-line InputErrors."""
    with _open_text(path, spec.storage_options) as f:
        lineno = 0
        try:
            for lineno, line in checked_lines(enumerate(f, 1), path):  # noqa: B007 - lineno is used after the loop
                yield lineno, line
        except (OSError, EOFError, lzma.LZMAError) as exc:
            msg = f"{path}: line {lineno + 1}: cannot read ({describe_exception(exc)})"
            raise InputError(msg) from exc


def _read_text(path: str, spec: ReaderSpec) -> Iterator[TokenBatch]:
    return text_batches(_numbered_lines(path, spec), path, spec)


def _documents(lines: Iterable[tuple[int, str]], unit: str) -> Iterator[str]:
    """The documents of numbered text lines: each non-blank line (``line``), each run of
    non-blank lines up to a blank one, joined by newlines (``paragraph``), or all non-blank
    lines joined (``file``). Lines are stripped of surrounding white space."""
    if unit == "line":
        for _, line in lines:
            text = line.strip()
            if text:
                yield text
        return
    parts: list[str] = []
    for _, line in lines:
        text = line.strip()
        if text:
            parts.append(text)
        elif parts and unit == "paragraph":
            yield "\n".join(parts)
            parts = []
    if parts:
        yield "\n".join(parts)


def text_batches(lines: Iterable[tuple[int, str]], path: str, spec: ReaderSpec, *, first_row: int = 0) -> Iterator[TokenBatch]:
    """Tokenised batches of the documents (:func:`document_unit`: lines, paragraphs or the
    whole file) of the numbered lines (``(1-based line number, text)``) of ``path``.

    Shared by whole-file reading and by byte-range shards (``posstats.corpus.shards``, which
    cut only files read one document per line); rows count the documents, from ``first_row``.
    """
    texts: list[str] = []
    row = first_row
    for text in _documents(lines, document_unit(path, spec.document_per)):
        texts.append(text)
        if len(texts) == spec.batch_size:
            yield encode_texts(spec.tokenizer, texts, add_special_tokens=spec.add_special_tokens, source=path, first_row=row)
            row += len(texts)
            texts = []
    if texts:
        yield encode_texts(spec.tokenizer, texts, add_special_tokens=spec.add_special_tokens, source=path, first_row=row)


def _read_jsonl(path: str, spec: ReaderSpec) -> Iterator[TokenBatch]:
    return jsonl_batches(_numbered_lines(path, spec), path, spec)


def jsonl_batches(lines: Iterable[tuple[int, str]], path: str, spec: ReaderSpec, *, first_row: int = 0) -> Iterator[TokenBatch]:
    """Batches from numbered JSON lines (``(1-based line number, text)``) of ``path``.

    Shared by whole-file reading and by byte-range shards (``posstats.corpus.shards``), which
    pass the lines of their range and the row number of its first record.
    """
    key = spec.name
    cells: list[Any] = []
    linenos: list[int] = []
    row = first_row
    for lineno, line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            msg = f"{path}: line {lineno}: not valid JSON ({exc.msg} at column {exc.colno})"
            raise InputError(msg) from exc
        if not isinstance(record, dict):
            msg = f"{path}: line {lineno}: expected a JSON object, got {_short(record)}"
            raise InputError(msg)
        if key not in record:
            msg = f"{path}: line {lineno}: no key {key!r} (keys: {', '.join(map(str, record)) or 'none'})"
            raise InputError(msg)
        cells.append(record[key])
        linenos.append(lineno)
        if len(cells) == spec.batch_size:
            yield _jsonl_batch(cells, linenos, path, row, spec)
            row += len(cells)
            cells, linenos = [], []
    if cells:
        yield _jsonl_batch(cells, linenos, path, row, spec)


def _jsonl_batch(cells: list[Any], linenos: list[int], path: str, first_row: int, spec: ReaderSpec) -> TokenBatch:
    key = spec.name
    if spec.column is None:
        for r, cell in enumerate(cells):
            if not isinstance(cell, str):
                msg = f"{path}: line {linenos[r]}: row {first_row + r}: {key!r} is {_short(cell)}, expected a string"
                raise InputError(msg)
        return encode_texts(spec.tokenizer, cells, add_special_tokens=spec.add_special_tokens, source=path, first_row=first_row)

    for r, cell in enumerate(cells):
        if type(cell) is not list:
            msg = f"{path}: line {linenos[r]}: row {first_row + r}: {key!r} is {_short(cell)}, expected a list of integer token ids"
            raise InputError(msg)
    lengths = np.fromiter(map(len, cells), dtype=np.int64, count=len(cells))
    offsets = np.zeros(len(cells) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = list(itertools.chain.from_iterable(cells))
    # One C-level pass over the batch; bool is a subclass of int, hence `type` not isinstance.
    if set(map(type, flat)) - {int}:
        index = next(i for i, v in enumerate(flat) if type(v) is not int)
        r = int(np.searchsorted(offsets, index, side="right")) - 1
        msg = f"{path}: line {linenos[r]}: row {first_row + r}: token id {_short(flat[index])} is not an integer"
        raise InputError(msg)
    try:
        values = np.array(flat, dtype=np.int64)
    except OverflowError as exc:
        index = next(i for i, v in enumerate(flat) if not -_INT64_MAX - 1 <= v <= _INT64_MAX)
        r = int(np.searchsorted(offsets, index, side="right")) - 1
        msg = f"{path}: line {linenos[r]}: row {first_row + r}: token id {flat[index]} does not fit in int64"
        raise InputError(msg) from exc
    return TokenBatch(values, offsets, path, first_row)


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ----------------------------------------------------------------------------------------
# CSV / TSV


def _csv_source(path: str, spec: ReaderSpec) -> contextlib.AbstractContextManager[Any]:
    """What Arrow's CSV reader opens: the local path (Arrow decompresses by suffix), or a URL
    streamed and decompressed by fsspec."""
    if is_url(path):
        return open_url(path, spec.storage_options, compression="infer")
    return contextlib.nullcontext(path)


def _read_csv(path: str, spec: ReaderSpec) -> Iterator[TokenBatch]:
    size = url_info(path, spec.storage_options).get("size") if is_url(path) else os.path.getsize(path)
    if size == 0:
        return
    base = path[: -len(os.path.splitext(path)[1])] if os.path.splitext(path)[1].lower() in _OPENERS else path
    delimiter = "\t" if base.lower().endswith(".tsv") else ","
    parse = pcsv.ParseOptions(delimiter=delimiter, newlines_in_values=True)
    convert = pcsv.ConvertOptions(include_columns=[spec.name], column_types={spec.name: pa.string()})
    with _csv_source(path, spec) as source:
        try:
            reader = pcsv.open_csv(source, parse_options=parse, convert_options=convert)
        except (pa.ArrowException, OSError) as exc:
            if "include_columns" in str(exc):
                try:
                    with _csv_source(path, spec) as again:
                        names = pcsv.open_csv(again, parse_options=parse).schema.names
                except UnicodeDecodeError as bad:  # a column name that is not UTF-8
                    raise _csv_error(path, bad, spec, delimiter) from exc
                except (pa.ArrowException, OSError):
                    names = []
                msg = f"{path}: no column {spec.name!r} (available: {', '.join(names) or 'none'})"
                raise InputError(msg) from exc
            if "Empty CSV file" in str(exc):
                return
            raise _csv_error(path, exc, spec, delimiter) from exc
        yield from _csv_rows(reader, path, spec, delimiter)


def _csv_rows(reader: Any, path: str, spec: ReaderSpec, delimiter: str) -> Iterator[TokenBatch]:
    """Token batches of an open Arrow CSV reader: ids parsed from strings, or texts tokenised."""
    columns = (batch.column(spec.name) for batch in _csv_guarded(iter(reader), path, spec, delimiter))
    if spec.column is None:
        yield from arrow_batches(columns, path, spec)
        return
    row = 0
    for array in columns:
        for start in range(0, len(array), spec.batch_size):
            part = array.slice(start, spec.batch_size)
            yield _ids_from_strings(part, path, row, spec.column)
            row += len(part)


def _csv_guarded(batches: Iterator[Any], path: str, spec: ReaderSpec, delimiter: str) -> Iterator[Any]:
    """Turn Arrow/OS errors raised while reading CSV batches into one-line InputErrors."""
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as exc:
            raise _csv_error(path, exc, spec, delimiter) from exc
        yield batch


def _csv_error(path: str, exc: BaseException, spec: ReaderSpec, delimiter: str) -> InputError:
    """The InputError for a CSV file Arrow cannot read; for bad UTF-8, where it is."""
    text = str(exc).lower()
    if "utf8" in text or "utf-8" in text:
        where = _csv_utf8_location(path, spec.name, delimiter, spec.storage_options)
        if where is not None:
            return InputError(f"{path}: {where}")
    return InputError(f"{path}: not a valid CSV file ({describe_exception(exc)})")


def _csv_utf8_location(path: str, name: str, delimiter: str, storage_options: Mapping[str, Any]) -> str | None:
    """``"line L: row R: column 'x' is not UTF-8 text (...)"`` for the first bad cell of
    column ``name`` (or a bad header), re-reading the file with Python's csv module (the
    error path only: Arrow says neither the row nor the line)."""
    try:
        with _open_text(path, storage_options) as f:
            reader = csv.reader(f, delimiter=delimiter, strict=False)
            start, row, col = 1, -1, None
            for record in reader:
                if record:
                    if col is None:  # the header
                        bad = next((c for c in record if utf8_problem(c)), None)
                        if bad is not None:
                            return f"line {start}: header: not UTF-8 text ({utf8_problem(bad, what='column name')})"
                        if name not in record:
                            return None
                        col = record.index(name)
                    else:
                        row += 1
                        cell = record[col] if col < len(record) else ""
                        problem = utf8_problem(cell, what="cell")
                        if problem is not None:
                            first_bad = next(i for i, ch in enumerate(cell) if "\udc80" <= ch <= "\udcff")
                            line = start + sum(c.count("\n") for c in record[:col]) + cell[:first_bad].count("\n")
                            return f"line {line}: row {row}: column {name!r} is not UTF-8 text ({problem})"
                start = reader.line_num + 1
    except (csv.Error, OSError, EOFError, lzma.LZMAError):
        return None
    return None


def _ids_from_strings(array: pa.Array, path: str, first_row: int, name: str) -> TokenBatch:
    """Parse cells like ``"5 6 7"`` or ``"5,6,7"`` into a TokenBatch with Arrow kernels."""
    import pyarrow.compute as pc  # only id strings need Arrow's kernels (~25 ms of start-up)

    # Splitting on ASCII whitespace is several times faster than a regex split; leading,
    # trailing or repeated separators give empty pieces, dropped below.
    pieces = pc.ascii_split_whitespace(pc.replace_substring(array, pattern=",", replacement=" "))
    raw = pieces.offsets.to_numpy().astype(np.int64)
    strings = pieces.values.slice(int(raw[0]), int(raw[-1] - raw[0]))
    raw -= raw[0]
    keep = pc.not_equal(strings, "").to_numpy(zero_copy_only=False)
    kept_before = np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])
    offsets = kept_before[raw]
    strings = strings.filter(pa.array(keep))
    try:
        values = pc.cast(strings, pa.int64()).to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid as exc:
        texts = strings.to_pylist()
        bad = (i for i, s in enumerate(texts) if not _INT_STRING.fullmatch(s) or not -_INT64_MAX - 1 <= int(s) <= _INT64_MAX)
        index = next(bad, None)
        if index is None:
            msg = f"{path}: rows {first_row}-{first_row + len(array) - 1}: column {name!r}: {describe_exception(exc)}"
            raise InputError(msg) from exc
        row = first_row + int(np.searchsorted(offsets, index, side="right")) - 1
        msg = f"{path}: row {row}: column {name!r}: {texts[index]!r:.60} is not an int64 token id"
        raise InputError(msg) from exc
    return TokenBatch(values.astype(np.int64, copy=False), offsets, path, first_row)


# ----------------------------------------------------------------------------------------
# Hugging Face datasets (offline: local folders and files only)


def _import_datasets() -> Any:
    """The ``datasets`` package (an optional extra: only Hugging Face inputs need it)."""
    try:
        import datasets
    except ImportError:
        msg = "reading a Hugging Face dataset needs the datasets package: pip install 'posstats[hf]'"
        raise InputError(msg) from None
    return datasets


def _read_hf(path: str, spec: ReaderSpec) -> Iterator[TokenBatch]:
    datasets = _import_datasets()  # heavy; only imported when an HF input is read

    if is_url(path):
        saved, builder = _hf_url_kind(path, spec)
    else:
        if not os.path.exists(path):
            msg = f"{path}: no such file or folder"
            raise InputError(msg)
        saved = os.path.isdir(path) and any(
            os.path.isfile(os.path.join(path, marker)) for marker in ("state.json", "dataset_dict.json")
        )
        builder = None if os.path.isdir(path) else _HF_BUILDERS[guess_format(path)]
    if spec.name is None:
        if builder != "text":
            msg = f"{path}: tokenizer= needs text_column= naming the text column"
            raise PosstatsError(msg)
        spec = dataclasses.replace(spec, text_column="text")  # the text builder's only column
    remote = {"storage_options": dict(spec.storage_options)} if is_url(path) and spec.storage_options else {}
    try:
        if saved:
            ds = datasets.load_from_disk(path, **remote)
        elif builder is None:
            revision = path.rstrip("/").partition("@")[2] or None
            ds = datasets.load_dataset(hub_dataset(path) or path, revision=revision, streaming=spec.hf_streaming)
        else:
            kwargs = {"delimiter": "\t"} if builder == "csv" and ".tsv" in path.lower() else {}
            ds = datasets.load_dataset(builder, data_files=[path], streaming=spec.hf_streaming, **remote, **kwargs)
    except Exception as exc:  # noqa: BLE001 - datasets raises many unrelated types
        msg = f"{path}: cannot load as a Hugging Face dataset ({describe_exception(exc)})"
        raise InputError(msg) from exc
    ds = _pick_split(ds, path, spec.hf_split)
    if spec.hf_streaming and isinstance(ds, datasets.Dataset):
        ds = ds.to_iterable_dataset()
    names = ds.column_names  # None for a streamed dataset whose features are unknown
    if names is not None and spec.name not in names:
        msg = f"{path}: no column {spec.name!r} (available: {', '.join(names) or 'none'})"
        raise InputError(msg)
    yield from arrow_batches(_hf_columns(ds, path, spec), path, spec)


def _hf_url_kind(path: str, spec: ReaderSpec) -> tuple[bool, str | None]:
    """``(saved, builder)`` of a URL read as a Hugging Face dataset: a ``save_to_disk``
    folder, a hub repository (``hf://datasets/ORG/NAME``, builder None), or a data file
    (its builder)."""
    if hub_dataset(path):
        return False, None
    fs, root = url_filesystem(path, spec.storage_options)
    info = url_info(path, spec.storage_options)
    if info.get("type") != "directory":
        fmt = guess_format(path)
        if fmt == "hf":
            msg = f"{path}: cannot tell the format of this file; choose one of {', '.join(FORMATS)}"
            raise InputError(msg)
        return False, _HF_BUILDERS[fmt]
    if any(fs.exists(f"{root.rstrip('/')}/{marker}") for marker in ("state.json", "dataset_dict.json")):
        return True, None
    msg = f"{path}: a folder URL must be a dataset saved with save_to_disk (state.json or dataset_dict.json)"
    raise InputError(msg)


def _hf_columns(ds: Any, path: str, spec: ReaderSpec) -> Iterator[pa.ChunkedArray]:
    tables = iter(ds.with_format("arrow").iter(batch_size=spec.batch_size))
    checked = False
    while True:
        try:
            table = next(tables)
        except StopIteration:
            return
        except Exception as exc:  # noqa: BLE001 - datasets raises many unrelated types
            msg = f"{path}: cannot read as a Hugging Face dataset ({describe_exception(exc)})"
            raise InputError(msg) from exc
        if not checked:
            check_column(path, table.schema, spec)
            checked = True
        yield table.column(spec.name)


def _pick_split(ds: Any, path: str, split: str | None) -> Any:
    datasets = _import_datasets()

    if not isinstance(ds, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        if split is not None:
            msg = f"{path}: is a single dataset without splits; drop hf_split={split!r}"
            raise InputError(msg)
        return ds
    splits = list(ds.keys())
    if split is None:
        if len(splits) != 1:
            msg = f"{path}: holds the splits {', '.join(splits)}; choose one with {{split}} (hf_split=)"
            raise OptionError(msg)
        split = splits[0]
    if split not in splits:
        msg = f"{path}: no split {split!r} (available: {', '.join(splits)}); choose one with {{split}} (hf_split=)"
        raise OptionError(msg)
    return ds[split]


_READERS = {
    "parquet": _read_columnar,
    "jsonl": _read_jsonl,
    "hf": _read_hf,
    "text": _read_text,
    "csv": _read_csv,
}
