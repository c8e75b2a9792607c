"""CSV / TSV files as token batches: id strings (``"101 7592 102"`` or ``"101,7592,102"``)
split and parsed by Arrow compute kernels, or a text column tokenised; errors give the
row, and the line of a cell that is not UTF-8.
"""

from __future__ import annotations

import contextlib
import csv
import lzma
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from posstats.corpus.readers.arrow import arrow_batches
from posstats.corpus.readers.files import _OPENERS
from posstats.corpus.readers.spec import _INT64_MAX, _INT_STRING, ReaderSpec, describe_exception
from posstats.corpus.readers.text import _open_text, utf8_problem
from posstats.corpus.remote import is_url, open_url, url_info
from posstats.counting.tokens import TokenBatch
from posstats.errors import InputError

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
