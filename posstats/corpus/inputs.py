"""What to count: a corpus source and a counting spec, resolved from plain options.

One function for every entrypoint (``posstats count|run``, ``python -m posstats.jobs.count``, the
pipeline's count stage): keyword arguments in, a :class:`CountInputs` out. It also owns
the count configuration record (``config.json`` of a counts folder).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from posstats.corpus.readers import document_unit
from posstats.corpus.source import CorpusSource
from posstats.corpus.tokenizer import (
    load_tokenizer,
    special_token_ids,
    tokenizer_hash,
    vocab_size,
)
from posstats.counting.counts import CountSpec
from posstats.errors import OptionError

__all__ = ["CountInputs", "count_inputs"]


@dataclass(frozen=True)
class CountInputs:
    """A corpus to count and how.

    Attributes:
        source: the input files and how to read them.
        spec: positions, vocabulary, mode, excluded ids, separator.
        metadata: recorded with the counts (``tokenizer`` name and ``tokenizer_hash``).
        tokenizer: the tokenizer.json path given, if any.
    """

    source: CorpusSource
    spec: CountSpec
    metadata: dict[str, str] = field(default_factory=dict)
    tokenizer: str | None = None

    def record(self, *, command: str, files: Sequence[str] | None = None, **extra: Any) -> dict[str, Any]:
        """The count configuration record (``config.json``): command, inputs, reader
        options, tokenizer, the spec's fields, the metadata, then ``extra``."""
        return {
            "command": command,
            "inputs": list(files) if files is not None else self.source.files(),
            "format": self.source.format,
            "column": self.source.column,
            "text_column": self.source.text_column,
            "tokenizer": self.tokenizer,
            **self.spec.to_metadata(),
            **self.metadata,
            **extra,
        }


def count_inputs(
    *,
    inputs: Sequence[str],
    format: str | None = None,
    column: str | None = None,
    text_column: str | None = None,
    tokenizer: str | None = None,
    hf_streaming: bool = False,
    split: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    positions: int = 512,
    vocab_size_: int | None = None,
    exclude_tokens: Sequence[int] | None = None,
    mode: str = "truncate",
    separator: int | None = None,
    document_per: str | None = None,
) -> CountInputs:
    """Resolve counting options into a :class:`CountInputs`.

    ``vocab_size_`` defaults to the tokenizer's vocabulary and ``exclude_tokens`` to its
    special tokens (none without a tokenizer). Token ids come from ``column``; raw text
    (``text_column``, or text files) is tokenised with ``tokenizer``. ``inputs`` may be
    fsspec URLs, read with ``storage_options`` (:mod:`posstats.corpus.remote`).
    ``document_per`` says what a document is in text files (``line``, ``paragraph``,
    ``file``; None: by suffix, :func:`posstats.corpus.readers.document_unit`); when given it
    is recorded in the counts' metadata.

    Raises:
        PosstatsError: both or neither of a token-id column and a tokenizer, no vocabulary
            size, or a bad spec (:class:`~posstats.errors.OptionError`: the message names the
            parameters, the command line its flags).
    """
    if column and text_column:
        raise OptionError("give either {column} (token ids) or {text_column} (text), not both")
    metadata: dict[str, str] = {}
    if document_per is not None:
        metadata["document_per"] = document_unit("", document_per)
    vocab, exclude = vocab_size_, exclude_tokens
    if tokenizer:
        tok = load_tokenizer(tokenizer)
        metadata["tokenizer"] = Path(tokenizer).name
        metadata["tokenizer_hash"] = tokenizer_hash(tokenizer)
        if vocab is None:
            vocab = vocab_size(tok)
        if exclude is None:
            exclude = tuple(special_token_ids(tok))
    if vocab is None:
        raise OptionError("{vocab_size} is required when no {tokenizer} is given")
    if column is None and not tokenizer:
        raise OptionError("give {column} (the column of token ids) or {tokenizer} (a tokenizer.json, to tokenise text)")
    source = CorpusSource(
        inputs=tuple(inputs),
        format=format,
        column=column,
        text_column=text_column,
        tokenizer=tokenizer if column is None else None,
        hf_streaming=hf_streaming,
        hf_split=split,
        storage_options=dict(storage_options or {}),
        document_per=document_per,
    )
    spec = CountSpec(positions, vocab, mode, tuple(exclude or ()), separator)
    return CountInputs(source, spec, metadata, tokenizer)
