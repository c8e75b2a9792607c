"""Stitching a pack stream that was counted in pieces (THEORY section 1, pack mode).

Pack mode joins the documents of one input into one stream cut into windows of n, so the
position of a token is its index in the stream modulo n. To count one big input on several
workers, its pieces (Parquet row groups, Arrow files, line ranges) are counted separately,
each as if its stream started at position 0 (:meth:`CountAccumulator.start_piece`). A
piece's counts are then exactly the input's counts of those tokens with rows *rotated*:
a token at index ``j`` of the piece is at index ``o + j`` of the input's stream, ``o`` the
stream length of the pieces before it, so its true position is ``(o + j) mod n`` and row
``p`` of the piece's counts is row ``(p + o) mod n`` of the input's.

Separators: a piece that is not the first assumes a document before it, so a separator
precedes its first document. When no earlier piece has a document, that separator is not
in the input's stream: the stitching drops it (one count at the piece's row 0) and the
piece starts one index earlier. Windows: ``ceil(L / n)`` for the input's stream length L.

:func:`stitch` turns (counts, sign) items into :class:`Placement` s (rotation and dropped
separator per item) and the adjustments of the totals; the range reduce
(:mod:`posstats.counting.ranges`) reads rotated rows. Integers only: the result is
bit-identical to counting the whole input in one stream.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from posstats.counting.counts import CountSpec, PositionalCounts
from posstats.counting.io import load_header
from posstats.errors import InputError

__all__ = ["PIECE_KEYS", "Placement", "piece_metadata", "stitch"]

PIECE_KEYS = ("pack_input", "pack_version", "pack_index", "pack_count", "pack_stream", "pack_documents",
              "pack_leading_separator")


@dataclass(frozen=True)
class Placement:
    """One summand of a reduce: counts at ``path`` times ``sign``, rows rotated by
    ``shift`` (row p of the file is row ``(p + shift) mod n`` of the sum), minus one
    separator count at the file's row 0 when ``drop_separator``."""

    path: str
    sign: int
    shift: int = 0
    drop_separator: bool = False


def piece_metadata(input_path: str, version: str, index: int, count: int, piece: dict[str, Any]) -> dict[str, str]:
    """The metadata a piece's counts carry (:data:`PIECE_KEYS`): which input and version
    of it, the piece's index among ``count``, and :meth:`CountAccumulator.piece`."""
    return {
        "pack_input": input_path,
        "pack_version": version,
        "pack_index": str(index),
        "pack_count": str(count),
        "pack_stream": str(piece["stream"]),
        "pack_documents": "1" if piece["documents"] else "0",
        "pack_leading_separator": "1" if piece["leading_separator"] else "0",
    }


def _stream(header: PositionalCounts) -> tuple[tuple[str, str], int, int, int, bool, bool] | None:
    """(input key, index, count, stream, documents, leading separator) of a piece, or None."""
    m = header.metadata
    if "pack_input" not in m:
        return None
    missing = [k for k in PIECE_KEYS if k not in m]
    if missing:
        msg = f"{m['pack_input']}: a pack-stream piece without {', '.join(missing)} in its counts; count it again"
        raise InputError(msg)
    return ((m["pack_input"], m["pack_version"]), int(m["pack_index"]), int(m["pack_count"]), int(m["pack_stream"]),
            m["pack_documents"] == "1", m["pack_leading_separator"] == "1")


def stitch(items: Sequence[tuple[str | os.PathLike, int]], spec: CountSpec, /) -> tuple[list[Placement], int, int]:
    """Place every item of a signed sum (module docstring).

    Items that are not pieces are placed as they are. The pieces of one input version
    must all be there, with one sign.

    Returns:
        (placements in the items' order, windows to add, tokens to add): the pieces'
        windows (``ceil(L / n)`` per input stream, signed) and minus the separators dropped.

    Raises:
        InputError: the pieces of an input are incomplete or of mixed signs.
    """
    n = spec.positions
    groups: dict[tuple[str, str], list[tuple[int, int, int, bool, bool, int]]] = defaultdict(list)
    placements: list[Placement | None] = []
    for k, (path, sign) in enumerate(items):
        piece = _stream(load_header(path))
        if piece is None:
            placements.append(Placement(str(path), int(sign)))
            continue
        key, index, count, stream, documents, lead = piece
        groups[key].append((index, count, stream, documents, lead, k))
        placements.append(None)
    windows = tokens = 0
    for (input_path, _), pieces in groups.items():
        pieces.sort()
        count = pieces[0][1]
        signs = {int(items[k][1]) for *_, k in pieces}
        if [p[0] for p in pieces] != list(range(count)) or len(signs) != 1:
            have = sorted(p[0] for p in pieces)
            msg = (f"{input_path}: pack mode needs every piece of an input once and with one sign to place its "
                   f"stream; have pieces {have} of {count} with signs {sorted(signs)} (a bad or missing shard)")
            raise InputError(msg)
        sign = signs.pop()
        offset, seen = 0, False
        for index, _, stream, documents, lead, k in pieces:
            drop = lead and not seen
            placements[k] = Placement(str(items[k][0]), sign, (offset - drop) % n, drop)
            offset += stream - drop
            tokens -= sign * drop
            seen = seen or documents
        windows += sign * -(-offset // n)
    return [p for p in placements if p is not None], windows, tokens
