"""``posstats.count``: positional counts of whatever holds the corpus, in one call.

Files and globs (every format of :mod:`posstats.corpus.readers`), a Hugging Face
``datasets.Dataset`` / ``IterableDataset`` / ``DatasetDict`` (with ``split``), a 2-D integer
numpy array or torch tensor (one row per sequence), or any iterable of integer sequences.
Token ids come from ``column`` (a list-of-ints column) or from raw text (``text_column``,
tokenised with ``tokenizer``); arrays and sequences are token ids already.

    >>> import numpy as np, posstats
    >>> c = posstats.count(np.array([[1, 2, 3], [1, 5, 3]]), positions=3, vocab_size=8)
    >>> c.matrix[0, 1], c.tokens
    (np.int64(2), 6)
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from posstats.corpus.inputs import CountOptions, InputOptions, count_inputs
from posstats.corpus.count_step import count_corpus
from posstats.corpus.tokenizer import (
    as_tokenizer,
    load_tokenizer,
    resolve_tokenizer,
    special_token_ids,
)
from posstats.corpus.tokenizer import vocab_size as tokenizer_vocab_size
from posstats.counting.counts import CountAccumulator, CountSpec, PositionalCounts
from posstats.counting.tokens import TokenBatch
from posstats.errors import InputError
from posstats.progress import progress

__all__ = ["count"]

_BATCH = 4096


def _is_paths(data: Any) -> bool:
    if isinstance(data, (str, os.PathLike)):
        return True
    return isinstance(data, (list, tuple)) and bool(data) and all(isinstance(x, (str, os.PathLike)) for x in data)


def _is_dataset(data: Any) -> bool:
    module = type(data).__module__
    return module.startswith("datasets.") and hasattr(data, "column_names")


def _tokenizer(tokenizer: Any) -> Any:
    """A loaded tokenizer from a path or model name, a ``tokenizers.Tokenizer`` or a
    transformers fast tokenizer (:func:`posstats.corpus.tokenizer.as_tokenizer`); None stays None."""
    if tokenizer is None:
        return None
    return load_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else as_tokenizer(tokenizer)


def _dataset_batches(ds: Any, *, split: str | None, column: str | None, text_column: str | None,
                     tokenizer: Any) -> Iterator[TokenBatch]:
    """TokenBatches of a Hugging Face dataset (a DatasetDict needs ``split`` unless it has one)."""
    if type(ds).__name__ in ("DatasetDict", "IterableDatasetDict"):
        splits = list(ds.keys())
        if split is None and len(splits) != 1:
            msg = f"the DatasetDict holds the splits {', '.join(splits)}; choose one with split="
            raise InputError(msg)
        split = split or splits[0]
        if split not in splits:
            msg = f"the DatasetDict has no split {split!r} (available: {', '.join(splits)})"
            raise InputError(msg)
        ds = ds[split]
    elif split is not None:
        msg = f"split={split!r} is for a DatasetDict; this is a single dataset"
        raise InputError(msg)
    name = column or text_column
    if name is None:
        msg = "give column= (a list-of-ints column of token ids) or text_column= with tokenizer="
        raise InputError(msg)
    names = ds.column_names
    if names is not None and name not in names:
        msg = f"the dataset has no column {name!r} (available: {', '.join(names)})"
        raise InputError(msg)
    if text_column is not None and tokenizer is None:
        raise InputError("text_column= needs tokenizer= (a tokenizer.json path or a tokenizers.Tokenizer)")
    row = 0
    for batch in ds.iter(batch_size=_BATCH):
        values = batch[name]
        if text_column is not None:
            values = [e.ids for e in tokenizer.encode_batch(list(values), add_special_tokens=False)]
        yield TokenBatch.from_sequences(values, source="<dataset>", first_row=row)
        row += len(values)


def _array_batches(data: Any) -> Iterator[TokenBatch]:
    """Row batches of a 2-D integer array or tensor, or of any iterable of integer sequences."""
    if type(data).__module__.startswith("torch"):
        data = data.detach().cpu().numpy()
    if isinstance(data, np.ndarray) and data.ndim == 2:
        if not np.issubdtype(data.dtype, np.integer):
            msg = f"token ids must be integers; got an array of dtype {data.dtype}"
            raise InputError(msg)
        for lo in range(0, data.shape[0], _BATCH):
            yield TokenBatch.from_sequences(list(data[lo : lo + _BATCH]), source="<array>", first_row=lo)
        return
    if isinstance(data, np.ndarray) and data.ndim != 1:
        msg = f"expected a 2-D (sequences x length) array of token ids; got shape {data.shape}"
        raise InputError(msg)
    chunk: list[Any] = []
    row = 0
    for seq in data:
        chunk.append(seq.detach().cpu().numpy() if type(seq).__module__.startswith("torch") else seq)
        if len(chunk) == _BATCH:
            yield TokenBatch.from_sequences(chunk, source="<sequences>", first_row=row)
            row, chunk = row + len(chunk), []
    if chunk:
        yield TokenBatch.from_sequences(chunk, source="<sequences>", first_row=row)


def count(
    data: Any,
    /,
    *,
    positions: int = 512,
    vocab_size: int | None = None,
    tokenizer: Any = None,
    column: str | None = None,
    text_column: str | None = None,
    split: str | None = None,
    mode: str = "truncate",
    exclude_tokens: Sequence[int] | None = None,
    separator: int | None = None,
    show_progress: bool | None = None,
) -> PositionalCounts:
    """Count ``data`` (module docstring) into exact positional counts ``C[i, v]``.

    Args:
        data: files / globs (a path or a list of them), a Hugging Face dataset, a 2-D integer
            array or tensor, or an iterable of integer sequences.
        positions, mode, separator: the counting spec (:class:`posstats.counting.counts.CountSpec`).
        vocab_size: default: the tokenizer's vocabulary (required without one).
        tokenizer: a ``tokenizer.json`` path, a model name in the local Hugging Face cache, a
            ``tokenizers.Tokenizer`` or a transformers fast tokenizer (``AutoTokenizer``) (for
            text; also sets the default vocabulary and the excluded special tokens).
        column / text_column: where a dataset or columnar file keeps token ids / raw text.
        split: a DatasetDict's split (a dataset or folder with several needs one).
        exclude_tokens: ids removed before positions are assigned (default: the tokenizer's
            special tokens; none without a tokenizer).
        show_progress: a progress bar (None: on a terminal).

    Raises:
        InputError: no way to get token ids, a missing column or split, ids outside the
            vocabulary, an unreadable file (one line each, as on the command line).
    """
    if _is_paths(data):
        paths = [data] if isinstance(data, (str, os.PathLike)) else list(data)
        if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
            # A transformers tokenizer loaded from a local folder or the local cache names its file.
            named = getattr(tokenizer, "name_or_path", None)
            found = resolve_tokenizer(named) if named else None
            if not (found and os.path.isfile(found)):
                raise InputError("for files, give tokenizer= as the path of a tokenizer.json or a model name in the local "
                                 "Hugging Face cache (its file is recorded with the counts)")
            tokenizer = found
        reading = InputOptions(column=column, text_column=text_column, split=split,
                               tokenizer=os.fspath(tokenizer) if tokenizer is not None else None)
        counting = CountOptions(positions=positions, vocab_size=vocab_size, mode=mode, separator=separator,
                                exclude_tokens=None if exclude_tokens is None else tuple(exclude_tokens))
        inputs = count_inputs([os.fspath(p) for p in paths], reading, counting)
        return count_corpus(inputs.source, inputs.spec, metadata=inputs.metadata, show_progress=show_progress)
    tok = _tokenizer(tokenizer)
    if vocab_size is None:
        if tok is None:
            raise InputError("give vocab_size= (or tokenizer=, whose vocabulary is the default)")
        vocab_size = tokenizer_vocab_size(tok)
    if exclude_tokens is None:
        exclude_tokens = special_token_ids(tok) if tok is not None else ()
    spec = CountSpec(positions, vocab_size, mode, tuple(exclude_tokens), separator)
    if _is_dataset(data):
        batches: Iterable[TokenBatch] = _dataset_batches(data, split=split, column=column, text_column=text_column,
                                                         tokenizer=tok)
    else:
        if column is not None or text_column is not None:
            raise InputError("column= / text_column= are for files and datasets; arrays and sequences are token ids")
        batches = _array_batches(data)
    acc = CountAccumulator(spec)
    with progress(desc="counting", unit="tok", enabled=show_progress) as bar:
        for batch in batches:
            bar.update(acc.add(batch))
    return acc.result()
