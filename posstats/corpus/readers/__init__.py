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

Modules: ``files`` (inputs, formats, documents), ``spec`` (the options every reader shares),
``arrow``, ``text``, ``jsonl``, ``delimited`` (CSV/TSV) and ``hf`` (one per format), and
``stream`` (:func:`read_token_batches`, every input as one stream).
"""

from posstats.corpus.readers.arrow import arrow_batches, check_column
from posstats.corpus.readers.files import (
    DOCUMENT_UNITS,
    FORMATS,
    document_note,
    document_unit,
    guess_format,
    resolve_inputs,
)
from posstats.corpus.readers.jsonl import jsonl_batches
from posstats.corpus.readers.spec import ReaderSpec, describe_exception, guarded_reads, validate_ids
from posstats.corpus.readers.stream import read_token_batches
from posstats.corpus.readers.text import checked_lines, text_batches

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
