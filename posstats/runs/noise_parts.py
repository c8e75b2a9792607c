"""The corpus in parts, for the noise floor of an analysis: the parts are read out of a run
store or re-read out of the corpus here, so that the estimates themselves
(:mod:`posstats.estimates`) take counts, never stores.

By default the split-half noise floor needs no parts at all: it splits the counted
tokens at random (:mod:`posstats.estimates.thinning`). :func:`corpus_parts` finds parts
when the user asks for another split: explicit part count folders (``parts_dirs``); else
the Ray run store given (``store``): parts by shard-id rank parity; else, with ``reread``,
the corpus named in the counting ``config.json``, re-read with the tokenizer the counts
were made with (checked by hash) and split by document parity into ``noise_parts`` parts;
else none (the token split).

A store's pack-mode shards are pieces of one stream: their partials are placed where they
sit in it (:func:`posstats.counting.pack.stitch`), so they sum to the store's result.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posstats.corpus.shard_store import RunStore
from posstats.corpus.source import CorpusSource, file_fingerprint
from posstats.corpus.tokenizer import check_tokenizer, load_tokenizer, tokenizer_hash
from posstats.counting.counts import (
    CountAccumulator,
    CountSpec,
    PositionalCounts,
    combine_fingerprints,
)
from posstats.counting.io import counts_file, load_counts
from posstats.counting.pack import stitch
from posstats.counting.ranges import placed_sum
from posstats.counting.tokens import TokenBatch
from posstats.errors import InputError, OptionError, PosstatsError

__all__ = [
    "count_parts",
    "parts_from_store",
    "corpus_config",
    "corpus_parts",
    "describe_counts",
    "find_tokenizer",
    "reread_parts",
]


def _take_rows(batch: Any, parity: int, parts: int) -> Any:
    """The rows of a TokenBatch whose row number in its file is ``parity`` mod ``parts``."""
    lengths = np.diff(batch.offsets)
    row_no = batch.first_row + np.arange(lengths.size, dtype=np.int64)
    keep_rows = (row_no % parts) == parity
    keep_tokens = np.repeat(keep_rows, lengths)
    offsets = np.zeros(int(keep_rows.sum()) + 1, dtype=np.int64)
    np.cumsum(lengths[keep_rows], out=offsets[1:])
    # first_row of a subset only feeds error messages; the batch's own first row is right
    # for the first kept row up to a few rows, and errors are raised on the full batch.
    return TokenBatch(batch.values[keep_tokens], offsets, batch.source, batch.first_row)


def count_parts(
    source: Any,
    spec: CountSpec,
    /,
    *,
    parts: int = 4,
    dense: bool | None = None,
    metadata: dict[str, str] | None = None,
) -> tuple[PositionalCounts, ...]:
    """Count a corpus as ``parts`` document-parity parts in one pass.

    Row (document) r of every input file goes to part ``r mod parts``; each part is counted
    by its own :class:`~posstats.counting.counts.CountAccumulator` under ``spec``. Outside ``pack``
    mode the parts sum exactly to :func:`posstats.corpus.count_step.count_corpus`; in ``pack`` mode
    each part packs its own documents (see the module docstring).

    Args:
        source: a :class:`posstats.corpus.source.CorpusSource`.
        spec: what to count.
        parts: number of parts K >= 2 (4 lets :func:`noise_floor` fit the bias's decay).
        dense: storage of each part (None: by the accumulator's memory budget).
        metadata: metadata of every part (``part`` = ``"k/K"`` is added).

    Returns:
        K :class:`PositionalCounts`; each carries the whole corpus' fingerprint.

    Raises:
        InputError: bad input (as for counting), or an empty corpus.
    """
    parts = int(parts)
    if parts < 2:
        msg = f"parts must be >= 2, got {parts}"
        raise ValueError(msg)
    files = source.files()
    tokenizer = load_tokenizer(source.tokenizer) if source.tokenizer else None
    meta = dict(metadata or {})
    accs = [CountAccumulator(spec, dense=dense, metadata={**meta, "part": f"{k}/{parts}"}) for k in range(parts)]
    fingerprint = ""
    for path in files:
        for batch in source.read([path], tokenizer):
            for k, acc in enumerate(accs):
                acc.add(_take_rows(batch, k, parts))
        fingerprint = combine_fingerprints(fingerprint, file_fingerprint(path, source.storage_options))
    out = tuple(dataclasses.replace(acc.result(), fingerprint=fingerprint) for acc in accs)
    if sum(p.sequences for p in out) == 0:
        msg = f"empty corpus: no sequences in {', '.join(files)}"
        raise InputError(msg)
    return out


def parts_from_store(store: str | os.PathLike, /, *, parts: int = 4, dense_budget: int = 4 * 2**30) -> tuple[PositionalCounts, ...]:
    """Group a Ray run store's per-shard partials into ``parts`` parts.

    The shards of the current result (its manifest) are sorted by shard id and shard of
    rank r goes to part ``r mod parts`` (shard-id parity for 2 parts); each part is the
    exact sum of its partials, pack-mode pieces placed where they sit in the stream
    (:func:`posstats.counting.pack.stitch`, :func:`posstats.counting.ranges.placed_sum`),
    so the parts sum to the store's result. With fewer shards than parts, two parts are
    made (halves) if there are at least two shards. Sequence and window totals of the
    parts are not kept (0).

    Raises:
        PosstatsError: no finished count in the store, or fewer than two shards.
    """
    rs = RunStore(store)
    manifest = rs.manifest()
    record = rs.config()
    if manifest is None or record is None:
        msg = f"run store {store} has no finished count (no manifest.json); count into it first (posstats count with this {{store}})"
        raise OptionError(msg)
    ids = sorted(manifest.get("shard_ids", []))
    if len(ids) < 2:
        msg = f"run store {store} holds {len(ids)} shard(s); a noise floor needs at least two (count with a smaller {{shard_size}})"
        raise OptionError(msg)
    k = int(parts) if len(ids) >= int(parts) else 2
    spec = CountSpec.from_metadata(record["config"]["spec"])
    # pack-mode shards are pieces of one stream, placed (rotated) by stitching them all
    placements, _, _ = stitch([(str(rs.partial_dir(sid)), 1) for sid in ids], spec)
    out = []
    for p in range(k):
        matrix = placed_sum(placements[p::k], spec, 0, spec.positions)
        dense = np.asarray(matrix.toarray()) if spec.fits_dense(dense_budget) else matrix
        meta = {"part": f"{p}/{k}", "store": str(store)}
        out.append(PositionalCounts(spec, dense, 0, 0, int(matrix.sum()), manifest.get("fingerprint", ""), meta))
    return tuple(out)


Place = str | os.PathLike | None


def corpus_config(*places: Place) -> dict[str, Any] | None:
    """The counting ``config.json`` of the first place (a folder, or a file next to it) that has one."""
    for place in places:
        if place is None:
            continue
        path = Path(place)
        path = path / "config.json" if path.is_dir() else path.parent / "config.json"
        if path.is_file():
            return json.loads(path.read_text())
    return None


def find_tokenizer(cfg: dict[str, Any], /, *, override: str | None = None) -> str | None:
    """The tokenizer.json to re-read a text corpus with: ``override``, the recorded path, or a
    file of the recorded name (and hash) in the working directory, next to the inputs or in
    data/tokenizers; None for a pre-tokenised corpus (``column``).

    Raises:
        PosstatsError: a tokenizer is recorded but found nowhere.
    """
    if cfg.get("column") is not None:
        return None
    if override:
        return override
    recorded = cfg.get("tokenizer")
    if not recorded:
        return None
    if Path(recorded).is_file():
        return recorded
    name = Path(recorded).name
    dirs = [Path.cwd(), Path.cwd() / "data" / "tokenizers", *(Path(i).parent for i in cfg.get("inputs", []))]
    for d in dirs:
        cand = d / name
        if cand.is_file() and (not cfg.get("tokenizer_hash") or tokenizer_hash(str(cand)) == cfg["tokenizer_hash"]):
            return str(cand)
    msg = f"cannot find the tokenizer {name!r} the corpus was counted with; give {{tokenizer}} PATH"
    raise OptionError(msg)


def describe_counts(path: Place = None, /) -> str:
    """The counts in words for messages: their file when known."""
    if path is None:
        return "the counts"
    try:
        name = counts_file(path).name
    except Exception:  # noqa: BLE001 - only for a message
        return f"the counts {path}"
    return f"the counts {Path(path) / name if Path(path).is_dir() else path}"


def _source_of(cfg: dict[str, Any], tokenizer: str | None) -> CorpusSource:
    """The corpus a counting ``config.json`` describes, read with ``tokenizer``."""
    return CorpusSource(
        inputs=tuple(cfg["inputs"]),
        format=cfg.get("format"),
        column=cfg.get("column"),
        text_column=cfg.get("text_column"),
        tokenizer=tokenizer,
    )


def reread_parts(
    counts: PositionalCounts, cfg: dict[str, Any] | None, /, *, parts: int, tokenizer: str | None = None, counts_path: Place = None
) -> list[PositionalCounts]:
    """Count the corpus of a counting ``config.json`` again as ``parts`` document-parity
    parts, with the tokenizer the counts were made with (checked by hash).

    Raises:
        PosstatsError: no config naming the corpus, another counting spec, or a corpus that
            changed since it was counted (fingerprints differ).
    """
    if not cfg or "inputs" not in cfg:
        msg = ("the noise floor needs the corpus in parts: give {store} (Ray run store) or {parts}, "
               "or analyse counts whose folder has the config.json written by 'posstats count'")
        raise OptionError(msg)
    tok_path = find_tokenizer(cfg, override=tokenizer)
    if tok_path:
        check_tokenizer(counts.metadata, tok_path, counts=describe_counts(counts_path))
    spec = CountSpec.from_metadata({k: str(v) for k, v in cfg.items() if k in counts.spec.to_metadata()})
    if spec != counts.spec:
        msg = f"config.json describes {spec}, but the counts were made with {counts.spec}"
        raise PosstatsError(msg)
    out = count_parts(_source_of(cfg, tok_path), spec, parts=parts, dense=not counts.is_sparse)
    if counts.fingerprint and out[0].fingerprint != counts.fingerprint:
        msg = "the corpus changed since it was counted (fingerprints differ); count it again first"
        raise PosstatsError(msg)
    return list(out)


def corpus_parts(
    counts: PositionalCounts,
    /,
    *,
    noise_floor: bool = False,
    noise_parts: int = 4,
    tokenizer: str | None = None,
    store: str | os.PathLike | None = None,
    parts_dirs: Sequence[str | os.PathLike] | None = None,
    reread: bool = False,
    places: Sequence[Place] = (),
) -> tuple[PositionalCounts, ...] | list[PositionalCounts] | None:
    """The noise floor's parts of the corpus of ``counts`` (module docstring).

    Args:
        counts: the analysed counts.
        noise_floor: find ``noise_parts`` (2 or 4) parts for the noise floor, if asked
            for by ``parts_dirs``, ``store`` or ``reread`` (else None: the token split).
        tokenizer: tokenizer.json for re-reading a text corpus (default: the recorded one).
        store: a Ray run store of the counts.
        parts_dirs: 2 or 4 count folders whose sum is the corpus (noise floor only).
        reread: noise floor: re-read the corpus and split it by document parity.
        places: folders (or files) whose counting ``config.json`` names the corpus, the
            first found wins; the last given one is the counts, for messages.

    Returns:
        The parts, or None (the analysis then splits the counted tokens).
    """
    cfg = corpus_config(*places)
    where = next((p for p in reversed(places) if p is not None), None)
    parts = None
    if noise_floor:
        if parts_dirs:
            parts = tuple(load_counts(d) for d in parts_dirs)
            if len(parts) not in (2, 4):
                raise OptionError(f"{{parts}} needs 2 or 4 count folders, got {len(parts)}")
        elif store:
            parts = parts_from_store(store, parts=noise_parts)
        elif reread:
            parts = reread_parts(counts, cfg, parts=noise_parts, tokenizer=tokenizer, counts_path=where)
    return parts
