"""JSON Lines files as token batches: one record a line, ids type-checked per batch.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from posstats.corpus.readers.spec import _INT64_MAX, ReaderSpec, _short
from posstats.corpus.readers.text import _numbered_lines
from posstats.corpus.tokenizer import encode_texts
from posstats.counting.tokens import TokenBatch
from posstats.errors import InputError


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
