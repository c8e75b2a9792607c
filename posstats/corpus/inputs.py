"""What to count: a corpus source and a counting spec, resolved from their options.

The options are declared once (:mod:`posstats.options`): :class:`InputOptions` (how the
inputs are read) and :class:`CountOptions` (the counting spec and its memory budget)
generate the flags of ``posstats count|run`` and ``python -m posstats.jobs.count`` and the
pipeline's ``[input]`` and ``[count]`` tables. One function for every entrypoint,
:func:`count_inputs`: paths and options in, a :class:`CountInputs` out. It also owns the
count configuration record (``config.json`` of a counts folder).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

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
from posstats.options import first_problem, option

__all__ = ["CountInputs", "CountOptions", "InputOptions", "count_inputs"]

_INPUT, _COUNTING = "input corpus", "counting"


def _checked(obj: Any) -> None:
    """Every declared option of ``obj`` against its rule (kind, choices, bounds)."""
    problem = first_problem(obj)
    if problem:
        raise OptionError(problem)


@dataclass(frozen=True)
class InputOptions:
    """How the input files are read, each option declared once (:mod:`posstats.options`)."""

    format: Literal["parquet", "jsonl", "hf", "text", "csv"] | None = option(
        None, group=_INPUT,
        help="input format (default: guessed from each file's suffix: .parquet/.arrow, .jsonl/.json, .txt/.md (text, "
             "see document_per), .csv/.tsv, folder = HF dataset)")
    document_per: Literal["line", "paragraph", "file"] | None = option(
        None, group=_INPUT,
        help="what one document is in a text file: a line, a paragraph (lines up to a blank line) or the whole file "
             "(default by suffix: paragraph for .md, line for .txt; printed when counting)")
    column: str | None = option(None, group=_INPUT, metavar="NAME", help="column holding token ids (a list of ints per row)")
    text_column: str | None = option(None, group=_INPUT, metavar="NAME",
                                     help="column holding raw text, tokenised with the tokenizer (not needed for .txt files)")
    tokenizer: str | None = option(None, group=_INPUT, metavar="TOKENIZER_JSON", config_kind="url",
                                   help="a Hugging Face tokenizer.json (padding and truncation are switched off)")
    hf_streaming: bool = option(False, group=_INPUT, help="stream HF datasets instead of caching them", pipeline=False,
                                why_not="the pipeline counts HF datasets from their saved files")
    split: str | None = option(None, group=_INPUT, metavar="NAME", pipeline=False,
                               why_not="the pipeline counts files, not a DatasetDict's splits",
                               help="the split of a Hugging Face DatasetDict folder (required when it has several)")

    def __post_init__(self) -> None:
        _checked(self)


@dataclass(frozen=True)
class CountOptions:
    """The counting spec (:class:`~posstats.counting.counts.CountSpec`, before the tokenizer
    fills its defaults) and the memory budget, each option declared once."""

    positions: int = option(512, group=_COUNTING, metavar="N", minimum=1, help="number of positions n (window length)")
    vocab_size: int | None = option(None, group=_COUNTING, metavar="V", minimum=1,
                                    help="vocabulary size V (default: the tokenizer's; required with a token-id column "
                                         "and no tokenizer)")
    exclude_tokens: tuple[int, ...] | None = option(
        None, group=_COUNTING, metavar="ID,ID",
        help="token ids removed before positions are assigned (default: the tokenizer's special tokens, or none); "
             "an empty list keeps everything")
    mode: Literal["truncate", "chunk", "pack"] = option(
        "truncate", group=_COUNTING,
        help="truncate: first n tokens of each document; chunk: consecutive windows of n; pack: documents "
             "concatenated (per file) and cut into windows of n (THEORY.md section 1)")
    separator: int | None = option(None, group=_COUNTING, metavar="ID", minimum=0,
                                   help="pack mode: token id inserted between documents")
    window_groups: int = option(
        64, group=_COUNTING, metavar="K", minimum=0,
        help="also count the windows (truncate: each document's first n tokens) in K groups "
             "(OUT/window-groups.safetensors), so that analyze tests homogeneity with a null that keeps each window's "
             "tokens together (rotation; docs/calibration.md); above 4,096 positions only their even and odd halves, "
             "on which analyze measures its rank test's edge; 0: off. In this process while 16 bytes a token fit "
             "--memory-budget; in steps (--ray, --store, the pipeline) in truncate and chunk mode, each shard's "
             "groups summed by the reduce, and above 4,096 positions in pack mode, the shards by rank parity as halves")
    memory_budget: float = option(
        4.0, group=_COUNTING, metavar="GiB", unit="GiB", minimum=0.0, strict=True, key="memory_budget_gib",
        help="count into a dense n x V array while 8*n*V bytes fit this budget and the corpus has at least n*V/8 "
             "tokens; sort each position's tokens otherwise, buffering up to half the budget of token ids between "
             "sorts (same counts; files are stored by size)")

    def __post_init__(self) -> None:
        _checked(self)
        if self.separator is not None and self.mode != "pack":
            raise OptionError("{separator} only applies in pack {mode}")

    @property
    def budget_bytes(self) -> int:
        """The memory budget in bytes."""
        return int(self.memory_budget * 2**30)


@dataclass(frozen=True)
class CountInputs:
    """A corpus to count and how.

    Attributes:
        source: the input files and how to read them.
        spec: positions, vocabulary, mode, excluded ids, separator.
        metadata: recorded with the counts (``tokenizer`` name and ``tokenizer_hash``).
        tokenizer: the tokenizer.json path given, if any.
        window_groups: K of :mod:`posstats.counting.window_groups` (counted in this
            process; 0: none).
    """

    source: CorpusSource
    spec: CountSpec
    metadata: dict[str, str] = field(default_factory=dict)
    tokenizer: str | None = None
    window_groups: int = 0

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
            **({"window_groups": self.window_groups} if self.window_groups else {}),
            **extra,
        }


def count_inputs(
    inputs: Sequence[str],
    reading: InputOptions | None = None,
    counting: CountOptions | None = None,
    /,
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> CountInputs:
    """Resolve the options of a count into a :class:`CountInputs`.

    ``counting.vocab_size`` defaults to the tokenizer's vocabulary and
    ``counting.exclude_tokens`` to its special tokens (none without a tokenizer). Token ids
    come from ``reading.column``; raw text (``text_column``, or text files) is tokenised
    with ``reading.tokenizer``. ``inputs`` may be fsspec URLs, read with
    ``storage_options`` (:mod:`posstats.corpus.remote`). ``reading.document_per`` says what
    a document is in text files (``line``, ``paragraph``, ``file``; None: by suffix,
    :func:`posstats.corpus.readers.document_unit`); when given it is recorded in the
    counts' metadata.

    Raises:
        PosstatsError: both or neither of a token-id column and a tokenizer, no vocabulary
            size, or a bad spec (:class:`~posstats.errors.OptionError`: the message names the
            parameters, the command line its flags).
    """
    reading, counting = reading or InputOptions(), counting or CountOptions()
    column, text_column, tokenizer, document_per = reading.column, reading.text_column, reading.tokenizer, reading.document_per
    if column and text_column:
        raise OptionError("give either {column} (token ids) or {text_column} (text), not both")
    metadata: dict[str, str] = {}
    if document_per is not None:
        metadata["document_per"] = document_unit("", document_per)
    vocab, exclude = counting.vocab_size, counting.exclude_tokens
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
        format=reading.format,
        column=column,
        text_column=text_column,
        tokenizer=tokenizer if column is None else None,
        hf_streaming=reading.hf_streaming,
        hf_split=reading.split,
        storage_options=dict(storage_options or {}),
        document_per=document_per,
    )
    spec = CountSpec(counting.positions, vocab, counting.mode, tuple(exclude or ()), counting.separator)
    return CountInputs(source, spec, metadata, tokenizer, counting.window_groups)
