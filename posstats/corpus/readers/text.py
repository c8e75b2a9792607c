"""Plain text files as token batches: lines checked for UTF-8, grouped into documents (a
line, a paragraph or the whole file), tokenised in batches; opening compressed or remote
text.
"""

from __future__ import annotations

import contextlib
import lzma
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from posstats.corpus.readers.files import _OPENERS, document_unit
from posstats.corpus.readers.spec import ReaderSpec, describe_exception
from posstats.corpus.remote import is_url, open_url
from posstats.corpus.tokenizer import encode_texts
from posstats.counting.tokens import TokenBatch
from posstats.errors import InputError

def _open_text(path: str, storage_options: Mapping[str, Any] | None = None) -> contextlib.AbstractContextManager[Any]:
    """``path`` as text, UTF-8, bad bytes kept as lone surrogates (see :func:`checked_lines`);
    ``.gz .bz2 .xz`` decompressed; URLs streamed (:func:`posstats.corpus.remote.open_url`).

    Strict decoding would fail on the whole decoded chunk (8 KiB and more), before the
    lines in front of the bad byte are even seen, so its line number would be wrong; the
    lines are split exactly as before (universal newlines), and each one is checked.
    """
    if is_url(path):
        return open_url(path, storage_options, text=True, compression="infer")
    opener = _OPENERS.get(os.path.splitext(path)[1].lower())
    if opener is None:
        return open(path, encoding="utf-8", errors="surrogateescape")  # noqa: SIM115 - closed by the caller's with
    return opener(path, "rt", encoding="utf-8", errors="surrogateescape")


def utf8_problem(line: str, /, *, what: str = "line") -> str | None:
    """Why ``line`` (decoded with ``errors="surrogateescape"``) is not UTF-8, or None when it is.

    >>> utf8_problem(b"ok \\xff".decode("utf-8", "surrogateescape"))
    'invalid start byte 0xff at byte 4 of the line'
    """
    if line.isascii():
        return None
    try:
        line.encode("utf-8")  # valid text holds no escaped bytes
    except UnicodeEncodeError:
        raw = line.encode("utf-8", "surrogateescape")  # the bytes as read
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"{exc.reason} 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the {what}"
    return None


def checked_lines(lines: Iterable[tuple[int, str]], path: str) -> Iterator[tuple[int, str]]:
    """Pass ``(line number, line)`` pairs through, raising InputError at the first line that
    is not UTF-8, with its own line number."""
    for lineno, line in lines:
        problem = utf8_problem(line)
        if problem is not None:
            msg = f"{path}: line {lineno}: not UTF-8 text ({problem})"
            raise InputError(msg)
        yield lineno, line


def _numbered_lines(path: str, spec: ReaderSpec) -> Iterator[tuple[int, str]]:
    """(1-based line number, line) pairs; decoding errors become one-line InputErrors."""
    with _open_text(path, spec.storage_options) as f:
        lineno = 0
        try:
            for lineno, line in checked_lines(enumerate(f, 1), path):  # noqa: B007 - lineno is used after the loop
                yield lineno, line
        except (OSError, EOFError, lzma.LZMAError) as exc:
            msg = f"{path}: line {lineno + 1}: cannot read ({describe_exception(exc)})"
            raise InputError(msg) from exc


def _read_text(path: str, spec: ReaderSpec) -> Iterator[TokenBatch]:
    return text_batches(_numbered_lines(path, spec), path, spec)


def _documents(lines: Iterable[tuple[int, str]], unit: str) -> Iterator[str]:
    """The documents of numbered text lines: each non-blank line (``line``), each run of
    non-blank lines up to a blank one, joined by newlines (``paragraph``), or all non-blank
    lines joined (``file``). Lines are stripped of surrounding white space."""
    if unit == "line":
        for _, line in lines:
            text = line.strip()
            if text:
                yield text
        return
    parts: list[str] = []
    for _, line in lines:
        text = line.strip()
        if text:
            parts.append(text)
        elif parts and unit == "paragraph":
            yield "\n".join(parts)
            parts = []
    if parts:
        yield "\n".join(parts)


def text_batches(lines: Iterable[tuple[int, str]], path: str, spec: ReaderSpec, *, first_row: int = 0) -> Iterator[TokenBatch]:
    """Tokenised batches of the documents (:func:`document_unit`: lines, paragraphs or the
    whole file) of the numbered lines (``(1-based line number, text)``) of ``path``.

    Shared by whole-file reading and by byte-range shards (``posstats.corpus.shards``, which
    cut only files read one document per line); rows count the documents, from ``first_row``.
    """
    texts: list[str] = []
    row = first_row
    for text in _documents(lines, document_unit(path, spec.document_per)):
        texts.append(text)
        if len(texts) == spec.batch_size:
            yield encode_texts(spec.tokenizer, texts, add_special_tokens=spec.add_special_tokens, source=path, first_row=row)
            row += len(texts)
            texts = []
    if texts:
        yield encode_texts(spec.tokenizer, texts, add_special_tokens=spec.add_special_tokens, source=path, first_row=row)
