"""Parquet / Arrow files and Arrow columns as token batches: ``list<int>`` id columns by
reinterpreting Arrow's values/offsets buffers (no Python work per token), text columns
tokenised in batches.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from posstats.corpus.readers.spec import _INT64_MAX, ReaderSpec, describe_exception, guarded_reads
from posstats.corpus.remote import is_url, open_url
from posstats.corpus.tokenizer import encode_texts
from posstats.counting.tokens import TokenBatch
from posstats.errors import InputError


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
