""":func:`read_token_batches`: the rows of every input, whatever its format, as one stream
of :class:`~posstats.counting.tokens.TokenBatch` in input order.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from posstats.corpus.readers.arrow import _read_columnar
from posstats.corpus.readers.delimited import _read_csv
from posstats.corpus.readers.files import FORMATS, _check_file, document_unit, guess_format
from posstats.corpus.readers.hf import _read_hf
from posstats.corpus.readers.jsonl import _read_jsonl
from posstats.corpus.readers.spec import ReaderSpec
from posstats.corpus.readers.text import _read_text
from posstats.corpus.tokenizer import load_tokenizer
from posstats.counting.tokens import TokenBatch
from posstats.errors import PosstatsError


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


_READERS = {
    "parquet": _read_columnar,
    "jsonl": _read_jsonl,
    "hf": _read_hf,
    "text": _read_text,
    "csv": _read_csv,
}
