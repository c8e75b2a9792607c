"""What every reader shares: :class:`ReaderSpec` (the reader options), the token-id check
against the vocabulary, and one-line descriptions of reading errors that name the file.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from posstats.counting.counts import first_id_outside
from posstats.counting.tokens import TokenBatch
from posstats.errors import InputError

_INT_STRING = re.compile(r"-?[0-9]+")  # what Arrow's string -> int64 cast accepts
_INT64_MAX = np.iinfo(np.int64).max


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


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
