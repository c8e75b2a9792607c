"""Counting a corpus on disk: readers -> counting kernel, with a fingerprint per file.

This is the single-process path (``posstats count`` / ``posstats run``); the Ray job
splits the same work into shards and sums the partial counts, which are exactly equal.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from posstats.corpus.readers import read_token_batches, resolve_inputs
from posstats.corpus.remote import (
    hub_dataset,
    is_url,
    object_version_ns,
    open_url,
    url_filesystem,
    url_info,
)
from posstats.counting.counts import fingerprint_of
from posstats.errors import InputError

__all__ = ["CorpusSource", "estimated_tokens", "file_fingerprint"]


@dataclass(frozen=True)
class CorpusSource:
    """Where token ids come from: the reader options of :func:`posstats.corpus.readers.read_token_batches`.

    Attributes:
        inputs: paths or glob patterns (expanded with :func:`resolve_inputs`).
        format: an input format, or None to guess from each file's suffix.
        column: a list<int> token-id column; or ``text_column`` + ``tokenizer`` for text.
        tokenizer: path of a ``tokenizer.json`` (needed for text).
        hf_streaming: stream Hugging Face datasets instead of caching them.
        batch_size: rows per batch.
        hf_split: the split of a Hugging Face ``DatasetDict`` (``--split``).
        storage_options: fsspec options for URL inputs (``--storage-option``); never
            written to a record (they may hold credentials).
        document_per: text files: ``line``, ``paragraph`` or ``file`` per document
            (``--document-per``); None: by suffix (:func:`posstats.corpus.readers.document_unit`).
    """

    inputs: tuple[str, ...]
    format: str | None = None
    column: str | None = None
    text_column: str | None = None
    tokenizer: str | None = None
    hf_streaming: bool = False
    batch_size: int = 4096
    hf_split: str | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    document_per: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plain values (``inputs`` as a list)."""
        return {**dataclasses.asdict(self), "inputs": list(self.inputs), "storage_options": dict(self.storage_options)}

    @classmethod
    def from_dict(cls, d: dict[str, Any], /) -> CorpusSource:
        """Inverse of :meth:`to_dict`."""
        return cls(**{**d, "inputs": tuple(d["inputs"])})

    def files(self) -> list[str]:
        """The resolved input paths, sorted."""
        return resolve_inputs(list(self.inputs), storage_options=self.storage_options)

    def read(self, paths: Sequence[str], tokenizer: Any = None):
        """Iterate the :class:`TokenBatch` es of ``paths``."""
        return read_token_batches(
            list(paths),
            format=self.format,
            column=self.column,
            text_column=self.text_column,
            tokenizer=tokenizer if tokenizer is not None else self.tokenizer,
            batch_size=self.batch_size,
            hf_streaming=self.hf_streaming,
            hf_split=self.hf_split,
            storage_options=self.storage_options,
            document_per=self.document_per,
        )


def file_fingerprint(path: str, /, storage_options: Mapping[str, Any] | None = None) -> str:
    """Fingerprint of one input file: sha256 of its name, size and modification time (of a
    URL: its size and version, :func:`posstats.corpus.remote.object_version_ns`).

    Content changes that keep size and mtime identical are not detected (as with make).
    """
    if hub_dataset(path):  # no version without the network: pin one with @REVISION
        return fingerprint_of(f"hub|{path}")
    if is_url(path):
        fs, key = url_filesystem(path, storage_options)
        info = url_info(path, storage_options)
        name = path.rstrip("/").rsplit("/", 1)[-1]
        return fingerprint_of(f"{name}|{info.get('size')}|{object_version_ns(fs, info, key)}")
    st = os.stat(path)
    if os.path.isdir(path):  # an HF dataset folder: fingerprint its files
        parts = []
        for root, _, names in sorted(os.walk(path)):
            for name in sorted(names):
                full = os.path.join(root, name)
                s = os.stat(full)
                parts.append(f"{os.path.relpath(full, path)}:{s.st_size}:{s.st_mtime_ns}")
        return fingerprint_of(f"{os.path.basename(os.path.abspath(path))}|" + "|".join(parts))
    return fingerprint_of(f"{os.path.basename(path)}|{st.st_size}|{st.st_mtime_ns}")


def estimated_tokens(path: str, column: str | None, /, storage_options: Mapping[str, Any] | None = None) -> int:
    """Tokens ``path`` is expected to give (progress bars, kernel choice): the values of a
    Parquet token-id ``column`` from the footer (exact unless some lists are empty or
    null), else the file's bytes / 4 (about right for English text and id lists)."""
    if is_url(path):
        return _estimated_url_tokens(path, column, storage_options)
    try:
        if column is not None and not os.path.isdir(path):
            meta = pq.ParquetFile(path).metadata
            leaf = [i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] == column]
            if leaf:
                return sum(meta.row_group(g).column(leaf[0]).num_values for g in range(meta.num_row_groups))
    except (pa.ArrowException, OSError):
        pass
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(r, n)) for r, _, names in os.walk(path) for n in names) // 4
    return os.path.getsize(path) // 4 if os.path.exists(path) else 0


def _estimated_url_tokens(path: str, column: str | None, storage_options: Mapping[str, Any] | None) -> int:
    """:func:`estimated_tokens` of a URL: the Parquet footer (one range request), else size / 4."""
    try:
        info = url_info(path, storage_options)
        if column is not None and info.get("type") == "file" and path.lower().endswith((".parquet", ".pq")):
            with open_url(path, storage_options) as f:
                meta = pq.ParquetFile(f).metadata
            leaf = [i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] == column]
            if leaf:
                return sum(meta.row_group(g).column(leaf[0]).num_values for g in range(meta.num_row_groups))
        return int(info.get("size") or 0) // 4
    except (pa.ArrowException, OSError, InputError):
        return 0  # the reader reports what is wrong with the file
