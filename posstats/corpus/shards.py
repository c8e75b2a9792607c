"""Shards: the units of distributed, resumable counting, with content-derived ids.

A shard is a piece of one input path that can be read on its own. :func:`plan_shards`
cuts a corpus into shards; :func:`read_shard` reads one into :class:`TokenBatch` es and
:func:`posstats.corpus.count_step.count_shard` counts it. The counts of all shards of a corpus add up exactly to the
single-process :func:`posstats.corpus.count_step.count_corpus` (THEORY section 1: counts are
additive; the shards partition the documents).

Kinds of shard (``Shard.kind``):

==============  ===============================================================
``row_group``   consecutive row groups of a Parquet file, joined up to
                ``shard_bytes`` (uncompressed; a bigger row group is a shard alone)
``hf_file``     one Arrow file of a Hugging Face ``save_to_disk`` dataset folder
``byte_range``  a range of lines of a big uncompressed JSONL / text file,
                cut at line boundaries (files over ``shard_bytes``)
``file``        a whole input path: every other input
==============  ===============================================================

``shard_bytes`` is the target size of a shard. Small shards balance the workers' load;
each shard costs a fixed overhead, though (an accumulator, a partial written and read
again by the reduce: at n = 131,072 a partial holds about as many entries as its shard
has tokens), so :func:`auto_shard_bytes` aims at two to four shards per worker.

Pack mode joins the documents of one input into one stream that restarts at each new
input (``TokenBatch.source``). A shard of part of an input is counted as a *piece* of that
stream, from position 0 (:meth:`CountAccumulator.start_piece`), and records what the
reduce needs to rotate it into place (:mod:`posstats.counting.pack`): so big inputs are
split in pack mode too, and the stitched total equals the whole-input count.

Every batch a shard yields carries the same ``source`` (the input path, as
:func:`~posstats.corpus.readers.resolve_inputs` spells it) and the same ``first_row`` (row
number within the input) as the single-process reader gives, so pack streams and error
messages ("file: row r: ...") match it.

Shard ids are content-derived: the sha256 of the input's absolute path, size and
modification time (for a folder, those of every file in it, see
:func:`posstats.corpus.source.file_fingerprint`), the shard's kind and position, and for Parquet
the row-group range, their row counts and a digest of the file's footer. Any change to an
input gives *all* its shards new ids; an unchanged input keeps them.

Fingerprints: the corpus fingerprint of ``count_corpus`` is the XOR of one fingerprint
per input path. Exactly one shard of each input (``index == 0``) carries that input's
fingerprint (:attr:`Shard.fingerprint`); the others carry ``""``, so the XOR over any
complete set of shards equals ``count_corpus``'s fingerprint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from posstats.corpus.readers import (
    ReaderSpec,
    arrow_batches,
    check_column,
    checked_lines,
    describe_exception,
    document_unit,
    guarded_reads,
    guess_format,
    jsonl_batches,
    text_batches,
)
from posstats.corpus.remote import hub_dataset, is_url, open_url, url_info
from posstats.corpus.source import CorpusSource, file_fingerprint
from posstats.corpus.tokenizer import load_tokenizer
from posstats.counting.counts import DEFAULT_DENSE_BUDGET, CountSpec
from posstats.counting.tokens import TokenBatch
from posstats.errors import InputError, PosstatsError

__all__ = [
    "DEFAULT_SHARD_BYTES",
    "KINDS",
    "MIN_AUTO_SHARD_BYTES",
    "Shard",
    "auto_shard_bytes",
    "corpus_bytes",
    "shard_bytes_for",
    "partial_is_dense",
    "plan_file",
    "plan_shards",
    "read_shard",
]

KINDS = ("file", "row_group", "byte_range", "hf_file")
DEFAULT_SHARD_BYTES = 256 * 2**20  # target shard size: line ranges of big files, joined row groups
MIN_AUTO_SHARD_BYTES = 16 * 2**20  # auto_shard_bytes never aims lower: per-shard overhead
SHARDS_PER_WORKER = 2  # auto_shard_bytes: 2 to 4 shards per worker (a power of two in between)
_SCHEMA = "posstats.shard/1"
_COMPRESSED = (".gz", ".bz2", ".xz")


@dataclass(frozen=True)
class Shard:
    """One independently readable piece of an input.

    Attributes:
        shard_id: content-derived id (64 hex digits), see the module docstring.
        path: the input path exactly as :func:`~posstats.corpus.readers.resolve_inputs` gives
            it; the ``source`` of every batch the shard yields.
        format: the reader format of ``path`` (one of :data:`posstats.corpus.readers.FORMATS`).
        kind: one of :data:`KINDS`.
        index: position of the shard within its input, 0-based.
        count: number of shards of that input.
        first_row: row number (0-based, within the input) of the shard's first row.
        first_line: ``byte_range`` only: 1-based line number of its first line.
        start, stop: ``row_group``: the first row group's index and the last one's + 1; ``byte_range``:
            the byte range ``[start, stop)``; ``hf_file``: the Arrow file's index in the
            dataset and index + 1; ``file``: 0 and the input's size in bytes.
        member: ``hf_file`` only: the Arrow file's path relative to ``path``.
        rows: rows in the shard when the input's metadata says (Parquet, HF), else -1.
        size_hint: bytes of data in the shard (uncompressed when known); a scheduling
            and storage hint only.
        input_fingerprint: :func:`posstats.corpus.source.file_fingerprint` of ``path``.
    """

    shard_id: str
    path: str
    format: str
    kind: str
    index: int
    count: int
    first_row: int
    first_line: int
    start: int
    stop: int
    member: str
    rows: int
    size_hint: int
    input_fingerprint: str

    @property
    def fingerprint(self) -> str:
        """This shard's share of the corpus fingerprint: the input's for shard 0, else ""."""
        return self.input_fingerprint if self.index == 0 else ""

    @property
    def is_whole_input(self) -> bool:
        """True when the shard is a whole input (in pack mode: a whole stream, not a piece)."""
        return self.kind == "file" or self.count == 1

    def label(self) -> str:
        """Short human description, e.g. ``"a.parquet row group 3 (4/8)"``."""
        where = {
            "file": "whole file",
            "row_group": f"row group {self.start}" if self.stop == self.start + 1 else
                         f"row groups {self.start}-{self.stop - 1}",
            "byte_range": f"bytes {self.start}-{self.stop} (from line {self.first_line})",
            "hf_file": f"arrow file {self.member}",
        }[self.kind]
        return f"{self.path} {where} ({self.index + 1}/{self.count}, shard {self.shard_id[:12]})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plain values."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], /) -> Shard:
        """Inverse of :meth:`to_dict`."""
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})


# ----------------------------------------------------------------------------- planning


def plan_shards(
    source: CorpusSource,
    spec: CountSpec,
    /,
    *,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> list[Shard]:
    """Cut the corpus of ``source`` into shards (inputs in sorted order, shards in input order).

    Reads only metadata (Parquet footers, HF ``state.json`` and Arrow batch headers) and,
    for JSONL / text files larger than ``shard_bytes``, scans their lines once to place
    cuts at line boundaries and number the rows of each range. Consecutive Parquet row
    groups are joined while their uncompressed size stays within ``shard_bytes``. Pack
    mode splits the same way (pieces of a stream are stitched by the reduce,
    :mod:`posstats.counting.pack`). The shards of an input depend only on the input and
    ``shard_bytes``: an unchanged input keeps its shard ids.

    Raises:
        InputError / PosstatsError: for a pattern matching nothing or contradictory
            reader options (as :meth:`CorpusSource.read` would). Unreadable inputs are
            not an error here: they become one whole-input shard, whose reading fails
            with the reader's message.
    """
    if shard_bytes < 1:
        msg = f"the shard size must be >= 1 byte, got {shard_bytes}"
        raise PosstatsError(msg)
    files = source.files()
    source.read(files)  # validates reader options and that files exist; reads nothing
    shards: list[Shard] = []
    for path in files:
        shards.extend(plan_file(path, source, shard_bytes=shard_bytes))
    return shards


def plan_file(path: str, source: CorpusSource, /, *, split: bool = True, shard_bytes: int = DEFAULT_SHARD_BYTES) -> list[Shard]:
    """The shards of one input path (at least one; exactly one when ``split`` is False)."""
    fmt = source.format or guess_format(path)
    fp = file_fingerprint(path, source.storage_options)
    remote = is_url(path)
    pieces: list[dict[str, Any]] | None = None
    if split:
        if fmt == "parquet":
            groups = _parquet_pieces(path, source)
            pieces = _join_row_groups(groups, shard_bytes) if groups else None
        elif fmt == "hf" and not remote and os.path.isdir(path):
            pieces = _hf_pieces(path, source.hf_split)
        elif fmt in ("jsonl", "text") and not remote and not path.lower().endswith(_COMPRESSED):
            # a URL's lines are one sequential read: one shard; so is a text file read one
            # document per paragraph or per file (a paragraph may span any cut)
            by_line = fmt == "jsonl" or document_unit(path, source.document_per) == "line"
            if by_line and os.path.getsize(path) > shard_bytes:
                pieces = _line_pieces(path, shard_bytes)
    if not pieces:
        size = _path_size(path, source)
        unit = document_unit(path, source.document_per) if fmt == "text" else "line"
        pieces = [dict(kind="file", start=0, stop=size, first_row=0, first_line=1 if fmt in ("jsonl", "text") else 0,
                       member="", rows=-1, size_hint=size,
                       extra="" if unit == "line" else f"document_per={unit}")]  # in the shard's identity
    abspath = path if remote else os.path.abspath(path)
    shards = []
    for i, p in enumerate(pieces):
        identity = json.dumps(
            [_SCHEMA, abspath, fp, fmt, p["kind"], i, len(pieces), p["start"], p["stop"], p["member"], p["extra"]],
            separators=(",", ":"),
        )
        shards.append(
            Shard(
                shard_id=hashlib.sha256(identity.encode()).hexdigest(),
                path=path,
                format=fmt,
                kind=p["kind"],
                index=i,
                count=len(pieces),
                first_row=p["first_row"],
                first_line=p["first_line"],
                start=p["start"],
                stop=p["stop"],
                member=p["member"],
                rows=p["rows"],
                size_hint=p["size_hint"],
                input_fingerprint=fp,
            )
        )
    return shards


def _path_size(path: str, source: CorpusSource) -> int:
    if is_url(path):
        return 0 if hub_dataset(path) else int(url_info(path, source.storage_options).get("size") or 0)
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(r, n)) for r, _, names in os.walk(path) for n in names)
    return os.path.getsize(path)


def _parquet_footer(f: Any, size: int) -> bytes | None:
    """The raw Thrift footer of a Parquet file (``f``, open, ``size`` bytes), or None when
    the file has no valid tail."""
    if size < 12:
        return None
    f.seek(0)
    if f.read(4) != b"PAR1":
        return None
    f.seek(size - 8)
    tail = f.read(8)
    if tail[4:] != b"PAR1":
        return None
    (length,) = struct.unpack("<I", tail[:4])
    if length + 12 > size:
        return None
    f.seek(size - 8 - length)
    return f.read(length)


def _open_binary(path: str, source: CorpusSource) -> contextlib.AbstractContextManager[Any]:
    """``path`` opened for binary reading: a local file, or a URL streamed with range requests."""
    return open_url(path, source.storage_options) if is_url(path) else open(path, "rb")


def _parquet_pieces(path: str, source: CorpusSource) -> list[dict[str, Any]] | None:
    try:
        with _open_binary(path, source) as f:
            size = f.seek(0, io.SEEK_END)
            footer = _parquet_footer(f, size)
            if footer is None:
                return None  # Arrow IPC, or a truncated file: one whole-file shard
            meta = pq.ParquetFile(f).metadata
    except (pa.ArrowException, OSError, InputError):
        return None  # unreadable footer: the whole-file shard reports it when read
    digest = hashlib.sha256(footer).hexdigest()
    pieces, row = [], 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        pieces.append(dict(kind="row_group", start=g, stop=g + 1, first_row=row, first_line=0, member="",
                           rows=rg.num_rows, size_hint=int(rg.total_byte_size), extra=f"{digest}:{rg.num_rows}"))
        row += rg.num_rows
    return pieces


def _join_row_groups(groups: list[dict[str, Any]], shard_bytes: int) -> list[dict[str, Any]]:
    """Consecutive row-group pieces joined while their ``size_hint`` sum stays within
    ``shard_bytes`` (a piece is never split: a bigger one is a shard alone).

    The ``extra`` identity of a joined piece is the footer digest and the row counts of
    its groups, so a lone row group keeps the id it had before row groups were joined.
    """
    runs: list[list[dict[str, Any]]] = []
    size = 0
    for g in groups:
        if runs and size + g["size_hint"] <= shard_bytes:
            runs[-1].append(g)
            size += g["size_hint"]
        else:
            runs.append([g])
            size = g["size_hint"]
    digest = groups[0]["extra"].split(":")[0]
    return [dict(kind="row_group", start=r[0]["start"], stop=r[-1]["stop"], first_row=r[0]["first_row"], first_line=0,
                 member="", rows=sum(g["rows"] for g in r), size_hint=sum(g["size_hint"] for g in r),
                 extra=f"{digest}:{','.join(str(g['rows']) for g in r)}") for r in runs]


def corpus_bytes(source: CorpusSource, /) -> int:
    """The size of the corpus of ``source`` in the units of ``shard_bytes``: uncompressed
    row groups for Parquet (footers only), bytes for every other input."""
    total = 0
    for path in source.files():
        fmt = source.format or guess_format(path)
        groups = _parquet_pieces(path, source) if fmt == "parquet" else None
        total += sum(g["size_hint"] for g in groups) if groups else _path_size(path, source)
    return total


def shard_bytes_for(source: CorpusSource, /, *, requested: int | None, recorded: int | None,
                    workers: Callable[[], int]) -> int:
    """The target shard size of a count, decided here only: ``requested`` (``--shard-size``,
    ``[count] shard_size_mib``), else the run store's ``recorded`` one (so that a resumed
    or refreshed run cuts unchanged inputs into the same shards, whatever its worker
    count), else :func:`auto_shard_bytes` of the corpus for ``workers()`` (called only
    then: finding a cluster's CPUs may mean joining it)."""
    if requested is not None:
        return int(requested)
    if recorded is not None:
        return int(recorded)
    return auto_shard_bytes(corpus_bytes(source), workers())


def auto_shard_bytes(total_bytes: int, workers: int, /) -> int:
    """A target shard size giving each of ``workers`` two to four shards of a corpus of
    ``total_bytes``: the power of two at or below ``total / (2 workers)``, within
    ``[MIN_AUTO_SHARD_BYTES, DEFAULT_SHARD_BYTES]`` (16 and 256 MiB).

    A power of two keeps the target, hence the shard ids, unchanged while a corpus grows
    or shrinks by less than a factor of two.

    >>> [auto_shard_bytes(t * 2**20, w) // 2**20 for t, w in ((800, 2), (1024, 16), (10, 2), (10**6, 4))]
    [128, 32, 16, 256]
    """
    share = max(1, int(total_bytes) // (SHARDS_PER_WORKER * max(1, int(workers))))
    return int(min(DEFAULT_SHARD_BYTES, max(MIN_AUTO_SHARD_BYTES, 1 << (share.bit_length() - 1))))


def _hf_saved_dir(path: str, split: str | None = None) -> str | None:
    """The folder holding ``state.json`` of a ``save_to_disk`` dataset (the split of a
    DatasetDict as the reader picks it: ``split``, else its only one), or None."""
    if os.path.isfile(os.path.join(path, "state.json")):
        return path
    dd = os.path.join(path, "dataset_dict.json")
    if not os.path.isfile(dd):
        return None
    try:
        with open(dd, encoding="utf-8") as f:
            splits = list(json.load(f).get("splits", []))
    except (OSError, ValueError, AttributeError):
        return None
    if split is None:
        if len(splits) != 1:
            return None  # the reader says which splits there are
        split = splits[0]
    sub = os.path.join(path, split)
    return sub if split in splits and os.path.isfile(os.path.join(sub, "state.json")) else None


def _hf_pieces(path: str, split: str | None = None) -> list[dict[str, Any]] | None:
    folder = _hf_saved_dir(path, split)
    if folder is None:
        return None  # a folder of raw data files: read whole through `datasets`
    try:
        with open(os.path.join(folder, "state.json"), encoding="utf-8") as f:
            state = json.load(f)
        names = [d["filename"] for d in state["_data_files"]]
        if state.get("_indices_data_files"):
            return None
        pieces, row = [], 0
        for i, name in enumerate(names):
            full = os.path.join(folder, name)
            with pa.memory_map(full) as mm:
                rows = sum(b.num_rows for b in pa.ipc.open_stream(mm))
            member = os.path.relpath(full, path)
            pieces.append(dict(kind="hf_file", start=i, stop=i + 1, first_row=row, first_line=0, member=member,
                               rows=rows, size_hint=os.path.getsize(full), extra=str(rows)))
            row += rows
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None  # let the whole-folder reader report what is wrong
    return pieces or None


def _line_pieces(path: str, shard_bytes: int) -> list[dict[str, Any]] | None:
    """Line ranges of about ``shard_bytes`` bytes, with each range's first line and row.

    Lines are split exactly as the reader splits them (universal newlines); a row is a
    non-blank line (``str.strip()`` non-empty), as in the JSONL and text readers. Bytes
    that are not UTF-8 are kept (``surrogateescape``: line ends are ASCII, so the cuts do
    not depend on them); the shard holding one reports it with its line number when read.
    """
    pieces = []
    start = pos = 0
    line_no = rows = 0  # lines / rows before the current position
    first_line, first_row = 1, 0
    try:
        with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
            for line in f:
                pos += len(line.encode("utf-8", "surrogateescape"))
                line_no += 1
                if line.strip():
                    rows += 1
                if pos - start >= shard_bytes:
                    pieces.append((start, pos, first_line, first_row))
                    start, first_line, first_row = pos, line_no + 1, rows
    except (UnicodeDecodeError, OSError):
        return None  # the whole-file reader names the bad line
    if pos > start or not pieces:
        pieces.append((start, pos, first_line, first_row))
    if len(pieces) == 1:
        return None
    return [dict(kind="byte_range", start=a, stop=b, first_row=r, first_line=ln, member="", rows=-1,
                 size_hint=b - a, extra="") for a, b, ln, r in pieces]


# ----------------------------------------------------------------------------- reading


def _reader_spec(source: CorpusSource, tokenizer: Any) -> ReaderSpec:
    """The reader options of ``source`` (tokenizer loaded when it counts text)."""
    tok = None
    if source.column is None:
        tok = tokenizer if tokenizer is not None else source.tokenizer
        if isinstance(tok, (str, os.PathLike)):
            tok = load_tokenizer(tok)
    return ReaderSpec(column=source.column, text_column=source.text_column, tokenizer=tok,
                      batch_size=source.batch_size, add_special_tokens=False, hf_streaming=source.hf_streaming,
                      hf_split=source.hf_split, storage_options=source.storage_options,
                      document_per=source.document_per)


def read_shard(shard: Shard, source: CorpusSource, /, *, tokenizer: Any = None) -> Iterator[TokenBatch]:
    """Iterate the :class:`TokenBatch` es of one shard, ``source`` and ``first_row`` as the
    single-process reader gives them.

    Args:
        shard: from :func:`plan_shards` (same ``source``).
        source: the reader options.
        tokenizer: a loaded ``tokenizers.Tokenizer`` (else ``source.tokenizer`` is loaded).

    Raises:
        InputError: for bad content, naming the file and the row, line or row group.
    """
    if shard.kind == "file":
        yield from source.read([shard.path], tokenizer)
        return
    spec = _reader_spec(source, tokenizer)
    if shard.kind == "row_group":
        yield from _read_row_group(shard, spec)
    elif shard.kind == "hf_file":
        yield from _read_hf_file(shard, spec)
    elif shard.kind == "byte_range":
        yield from _read_line_range(shard, spec)
    else:
        msg = f"unknown shard kind {shard.kind!r}"
        raise ValueError(msg)


def _read_row_group(shard: Shard, spec: ReaderSpec) -> Iterator[TokenBatch]:
    if is_url(shard.path):
        with open_url(shard.path, spec.storage_options) as f:
            yield from _row_group_batches(shard, spec, f)
    else:
        yield from _row_group_batches(shard, spec, shard.path)


def _row_group_batches(shard: Shard, spec: ReaderSpec, opened: Any) -> Iterator[TokenBatch]:
    """The batches of the shard's row groups, read from ``opened`` (a local path or an
    open file), one group after the other (errors name the group)."""
    path = shard.path
    try:
        parquet = pq.ParquetFile(opened)
        check_column(path, parquet.schema_arrow, spec)
    except (pa.ArrowException, OSError) as exc:
        msg = f"{path}: row group {shard.start}: not a valid Parquet file ({describe_exception(exc)})"
        raise InputError(msg) from exc
    row = shard.first_row
    for group in range(shard.start, shard.stop):
        where = f"{path}: row group {group}"
        try:
            # Streamed batch by batch (as the single-process reader does): decoding a whole
            # row group first would leave the kernel working on data far out of cache.
            batches = parquet.iter_batches(batch_size=spec.batch_size, row_groups=[group], columns=[spec.name])
        except (pa.ArrowException, OSError) as exc:
            msg = f"{where}: not a valid Parquet file ({describe_exception(exc)})"
            raise InputError(msg) from exc
        for batch in guarded_reads(batches, where, "Parquet"):
            yield from arrow_batches([batch.column(spec.name)], path, spec, first_row=row)
            row += batch.num_rows
    if shard.rows >= 0 and row - shard.first_row != shard.rows:
        groups = f"row group {shard.start}" if shard.stop == shard.start + 1 else f"row groups {shard.start}-{shard.stop - 1}"
        msg = f"{path}: {groups}: {row - shard.first_row} rows read, the footer says {shard.rows}"
        raise InputError(msg)


def _read_hf_file(shard: Shard, spec: ReaderSpec) -> Iterator[TokenBatch]:
    if spec.name is None:
        msg = f"{shard.path}: tokenizer= needs text_column= naming the text column"
        raise PosstatsError(msg)
    full = os.path.join(shard.path, shard.member)
    where = f"{shard.path}: arrow file {shard.member}"
    try:
        with pa.memory_map(full) as mm:
            reader = pa.ipc.open_stream(mm)
            check_column(shard.path, reader.schema, spec)
            table = reader.read_all()
    except (pa.ArrowException, OSError) as exc:
        msg = f"{where}: cannot read as a Hugging Face dataset ({describe_exception(exc)})"
        raise InputError(msg) from exc
    if shard.rows >= 0 and table.num_rows != shard.rows:
        msg = f"{where}: holds {table.num_rows} rows, expected {shard.rows}"
        raise InputError(msg)
    yield from arrow_batches([table.column(spec.name)], shard.path, spec, first_row=shard.first_row)


class _RangeIO(io.RawIOBase):
    """Raw reader of bytes ``[start, stop)`` of a file."""

    def __init__(self, path: str, start: int, stop: int) -> None:
        super().__init__()
        self._f = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._f.seek(start)
        self._left = stop - start

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._left <= 0:
            return 0
        view = memoryview(buffer)[: min(len(buffer), self._left)]
        n = self._f.readinto(view)
        self._left -= n or 0
        return n or 0

    def close(self) -> None:
        self._f.close()
        super().close()


def _range_lines(shard: Shard) -> Iterator[tuple[int, str]]:
    """(1-based line number in the file, line) of a byte range, decoded as the reader does."""
    path = shard.path
    try:
        raw = _RangeIO(path, shard.start, shard.stop)
    except OSError as exc:
        msg = f"{path}: cannot read ({describe_exception(exc)})"
        raise InputError(msg) from exc
    lineno = shard.first_line - 1
    # surrogateescape + a check per line (as the whole-file reader): a strict decoder fails
    # on a whole decoded chunk, before the lines in front of the bad byte are numbered.
    with io.TextIOWrapper(io.BufferedReader(raw, 1 << 20), encoding="utf-8", errors="surrogateescape") as f:
        try:
            for lineno, line in checked_lines(enumerate(f, shard.first_line), path):  # noqa: B007
                yield lineno, line
        except OSError as exc:
            msg = f"{path}: line {lineno + 1}: cannot read ({describe_exception(exc)})"
            raise InputError(msg) from exc


def _read_line_range(shard: Shard, spec: ReaderSpec) -> Iterator[TokenBatch]:
    """The readers' own batching, over the range's numbered lines."""
    batches = text_batches if shard.format == "text" else jsonl_batches
    yield from batches(_range_lines(shard), shard.path, spec, first_row=shard.first_row)


# ----------------------------------------------------------------------------- counting


def partial_is_dense(spec: CountSpec, shard: Shard, /, *, dense_budget: int = DEFAULT_DENSE_BUDGET) -> bool:
    """Whether to count ``shard`` into a dense ``n x V`` array (else by sorting each position's tokens):
    :meth:`CountSpec.prefers_dense` with an estimated token count of ``size_hint / 4``."""
    return spec.prefers_dense(dense_budget, shard.size_hint // 4)
