"""The counting step and its two uses: one shard's checked token batches into an accumulator.

A *step* reads one :class:`~posstats.corpus.shards.Shard` (a whole input is a shard) with
:func:`shard_batches`: its batches, between two checks that the input did not change
since the shard was planned (size and modification time), so that counts always hold the
content their fingerprint names. Both executors run it:

- in-process (``posstats count``, :func:`accumulate_corpus`): every input is one
  whole-input shard (:func:`~posstats.corpus.shards.plan_file` with ``split=False``) and
  their batches stream, read one step ahead on a thread, into one accumulator;
- per shard (the Ray actors and the local executor of ``posstats.jobs.count``,
  :func:`accumulate_shard`): one accumulator per shard, saved as a partial with its
  completion marker and summed by the range reduce.

The two agree exactly (THEORY section 1: counts are additive over shards);
``tests/test_shards.py`` checks it for every format and mode.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Sequence
from typing import Any

from posstats.corpus.prefetch import prefetched
from posstats.corpus.remote import is_url
from posstats.corpus.shards import Shard, partial_is_dense, plan_file, read_shard
from posstats.corpus.source import CorpusSource, estimated_tokens, file_fingerprint
from posstats.corpus.tokenizer import load_tokenizer
from posstats.counting.counts import (
    DEFAULT_DENSE_BUDGET,
    CountAccumulator,
    CountSpec,
    PositionalCounts,
    combine_fingerprints,
)
from posstats.counting.pack import piece_metadata
from posstats.counting.tokens import TokenBatch
from posstats.errors import InputError
from posstats.progress import progress

__all__ = ["HALVES_GROUPS", "WINDOW_GROUP_POSITIONS", "accumulate_corpus", "accumulate_shard", "count_corpus",
           "count_shard", "halves_only_note", "kept_window_groups", "shard_batches", "shard_window_groups", "window_block"]


def shard_batches(shard: Shard, source: CorpusSource, /, *, tokenizer: Any = None) -> Iterator[TokenBatch]:
    """The step's reader: the :class:`TokenBatch` es of ``shard``
    (:func:`~posstats.corpus.shards.read_shard`), between two checks that its input is
    unchanged since the shard was planned (a ``stat`` each, or a request for a URL): a
    deleted or rewritten input is named before any reading, and one that changes while
    it is read is refused after.

    Raises:
        InputError: bad content (naming the file and row, line or row group), or an input
            that changed (size or modification time) since the shard was planned.
    """
    _check_unchanged(shard, source)
    yield from read_shard(shard, source, tokenizer=tokenizer)
    _check_unchanged(shard, source)


def _check_unchanged(shard: Shard, source: CorpusSource) -> None:
    try:
        current = file_fingerprint(shard.path, source.storage_options)
    except OSError as exc:
        msg = f"{shard.path}: cannot read ({exc.strerror or exc})"
        raise InputError(msg) from exc
    if current != shard.input_fingerprint:
        msg = f"{shard.path}: changed since the shards were planned (size or modification time); run again"
        raise InputError(msg)


# ----------------------------------------------------------------------------- in-process


def count_corpus(
    source: CorpusSource,
    spec: CountSpec,
    /,
    *,
    dense: bool | None = None,
    dense_budget: int = DEFAULT_DENSE_BUDGET,
    metadata: dict[str, str] | None = None,
    show_progress: bool | None = None,
    expected_tokens: int | None = None,
) -> PositionalCounts:
    """Count every file of ``source`` under ``spec`` in this process: exact int64 counts
    (:func:`accumulate_corpus`, then its :meth:`~CountAccumulator.result`)."""
    acc = accumulate_corpus(source, spec, dense=dense, dense_budget=dense_budget, metadata=metadata,
                            show_progress=show_progress, expected_tokens=expected_tokens)
    return acc.result(copy=False)


def window_block(expected_tokens: int | None, positions: int, groups: int, /, *, mode: str = "pack") -> int:
    """Consecutive windows per block of the window groups: the expected windows over the
    groups (at least 1), so that each group is about one stretch of the stream and the
    rotation null breaks the stream only between groups
    (:mod:`posstats.counting.window_groups`). In ``truncate`` mode 1: a window is a
    document's start, no two are consecutive text, and the tokens of a long document
    would make the expected windows far too many (every document in one group).

    >>> window_block(64_000, 16, 64), window_block(None, 16, 64), window_block(100, 16, 0)
    (62, 1, 1)
    >>> window_block(64_000, 16, 64, mode="truncate")
    1
    """
    if not expected_tokens or groups < 1 or mode == "truncate":
        return 1
    return max(1, int(expected_tokens) // int(positions) // int(groups))


WINDOW_GROUP_POSITIONS = 4096  # analyze's shuffle null (and so its homogeneity test) stops here by default
HALVES_GROUPS = 2  # above it: the even and odd stretches only, the rank test's independent halves


def kept_window_groups(positions: int, groups: int, /) -> int:
    """The window groups a count keeps when ``groups`` (K) are asked for: all K up to
    :data:`WINDOW_GROUP_POSITIONS` positions, where ``analyze`` rotates them (its shuffle
    null); above it :data:`HALVES_GROUPS`, the even and the odd ones of the K stretches
    (:func:`window_block` is still taken for K, so the two groups alternate stretch by
    stretch as K groups' parities would; every window in the group of its order, short
    ones included: ``halves_only``, :mod:`posstats.counting.window_groups`): the independent halves on which ``analyze``
    measures its rank test's edge (:mod:`posstats.estimates.halves_edge`), at a fraction
    of the K groups' cost (n = 131,072, 2.02e8 tokens, pack: 5.4-5.6 s and 1.45-1.48 GB
    against 3.6-3.7 s and 0.96-1.0 GB without any group, +17 s for 64 groups;
    docs/long-context.md).

    >>> kept_window_groups(4096, 64), kept_window_groups(4097, 64), kept_window_groups(131_072, 0)
    (64, 2, 0)
    """
    if groups <= 0:
        return 0
    return int(groups) if positions <= WINDOW_GROUP_POSITIONS else min(int(groups), HALVES_GROUPS)


def halves_only_note(positions: int, groups: int, /, *, shards: bool = False) -> str | None:
    """What ``count.json``'s ``window_groups`` says when :func:`kept_window_groups` kept
    fewer groups than the ``groups`` asked for, else None. ``shards``: the halves are a
    pack-mode count's shards by rank parity (``jobs.count``)."""
    kept = kept_window_groups(positions, groups)
    if not 0 < kept < groups:
        return None
    what = ("the shards of even and of odd rank (pack mode in steps: its streams straddle shards)" if shards else
            f"the even and the odd of {groups} stretches of windows")
    return (f"above {WINDOW_GROUP_POSITIONS:,} positions only two halves are kept, {what}: the independent halves "
            "on which analyze measures its rank test's edge (the rotation null, which turns window groups, runs up "
            f"to {WINDOW_GROUP_POSITIONS:,} rows)")


def shard_window_groups(spec: CountSpec, groups: int, /) -> tuple[int, str | None]:
    """``(K, why not)``: the window groups a count in steps keeps (0 and the reason when
    none). Truncate and chunk mode only: their shards hold whole documents, so each shard's
    groups are unions of whole windows and the groups of all shards add up to valid groups
    of the corpus; a pack-mode shard is a piece of a stream whose windows the reduce
    stitches across shards. Above 4,096 positions the two halves only, as in one process
    (:func:`kept_window_groups`)."""
    if groups <= 0:
        return 0, None
    if spec.mode == "pack":
        return 0, ("pack mode counted in steps: a stream's windows straddle its shards, which are counted apart, "
                   "so no window groups are kept; analyze tests homogeneity with the permutation null")
    return kept_window_groups(spec.positions, groups), None


def accumulate_corpus(
    source: CorpusSource,
    spec: CountSpec,
    /,
    *,
    dense: bool | None = None,
    dense_budget: int = DEFAULT_DENSE_BUDGET,
    metadata: dict[str, str] | None = None,
    show_progress: bool | None = None,
    expected_tokens: int | None = None,
    files: Sequence[str] | None = None,
    window_groups: int = 0,
) -> CountAccumulator:
    """Count every file of ``source`` under ``spec`` in this process, each a whole-input
    shard through the step (:func:`shard_batches`) into one accumulator; return it (its
    :meth:`~CountAccumulator.result`, or its :meth:`~CountAccumulator.blocks` to write
    them without one CSR array).

    ``dense`` forces a kernel; None picks it with :meth:`CountSpec.prefers_dense` from
    ``dense_budget`` (which also sizes the sparse kernel's token buffer) and the expected
    tokens (:func:`estimated_tokens`), which also give the progress bar its total (tokens/s
    and an ETA; ``expected_tokens`` when the caller has estimated them already: a remote
    footer is not fetched twice). Batches are read one step ahead on a thread
    (:func:`~posstats.corpus.prefetch.prefetched`), across the inputs' boundaries. The
    fingerprint combines each input's (:func:`file_fingerprint`). Raises
    :class:`InputError` for an empty corpus. ``files``: the inputs as the caller resolved
    them already (default: :meth:`CorpusSource.files`; a remote listing is not repeated).
    ``window_groups``: also count the windows in that many groups
    (:meth:`~CountAccumulator.window_groups`), blocks of :func:`window_block` consecutive
    windows each; above 4,096 positions the even and odd blocks only
    (:func:`kept_window_groups`).
    """
    files = list(files) if files is not None else source.files()
    tokenizer = load_tokenizer(source.tokenizer) if source.tokenizer else None
    shards = [plan_file(path, source, split=False)[0] for path in files]
    expected = expected_tokens
    if expected is None:
        expected = sum(estimated_tokens(path, source.column, source.storage_options) for path in files)
    if dense is None:
        dense = spec.prefers_dense(dense_budget, expected)
    block = window_block(expected, spec.positions, window_groups, mode=spec.mode)
    acc = CountAccumulator(spec, dense=dense, dense_budget=dense_budget, metadata=metadata,
                           window_groups=kept_window_groups(spec.positions, window_groups), window_block=block,
                           window_halves=spec.positions > WINDOW_GROUP_POSITIONS)
    steps = (zip(itertools.repeat(i), shard_batches(s, source, tokenizer=tokenizer)) for i, s in enumerate(shards))
    with progress(total=expected or None, desc="counting", unit="tok", enabled=show_progress) as bar:
        for i, batch in prefetched(itertools.chain.from_iterable(steps)):
            bar.set_postfix_str(f"file {i + 1}/{len(files)}", refresh=False)
            bar.update(acc.add(batch))
        for s in shards:
            acc.fingerprint = combine_fingerprints(acc.fingerprint, s.input_fingerprint)
        bar.set_postfix_str("sorting counts", refresh=True)
        acc.compact()
    if acc.sequences == 0:
        msg = f"empty corpus: no sequences in {', '.join(files)}"
        raise InputError(msg)
    return acc


# ----------------------------------------------------------------------------- per shard


def count_shard(
    shard: Shard,
    source: CorpusSource,
    spec: CountSpec,
    /,
    *,
    tokenizer: Any = None,
    dense: bool | None = None,
    dense_budget: int = DEFAULT_DENSE_BUDGET,
    metadata: dict[str, str] | None = None,
    out: Any = None,
) -> PositionalCounts:
    """Exact partial counts of one shard (:func:`accumulate_shard`, then its result);
    their fingerprint is :attr:`Shard.fingerprint`. ``out``: a reusable int64 ``(n, V)``
    buffer for a dense count (ignored when sparse); the result then shares it, so save or
    copy the result before the next shard."""
    acc = accumulate_shard(shard, source, spec, tokenizer=tokenizer, dense=dense, dense_budget=dense_budget,
                           metadata=metadata, out=out)
    return acc.result(copy=False)  # the accumulator ends here: no n x V copy


def accumulate_shard(
    shard: Shard,
    source: CorpusSource,
    spec: CountSpec,
    /,
    *,
    tokenizer: Any = None,
    dense: bool | None = None,
    dense_budget: int = DEFAULT_DENSE_BUDGET,
    metadata: dict[str, str] | None = None,
    out: Any = None,
    window_groups: int = 0,
) -> CountAccumulator:
    """Count one shard through the step (:func:`shard_batches`) into its own accumulator;
    return it (to save with :func:`posstats.counting.io.save_accumulated`, or its result).

    Args:
        dense: force dense or sparse accumulation; None uses
            :func:`~posstats.corpus.shards.partial_is_dense`.
        out: a reusable int64 ``(n, V)`` buffer for a dense count (ignored when sparse).
        window_groups: K > 0 also counts the shard's windows in K groups (truncate and
            chunk mode, where a shard holds whole documents: :func:`shard_window_groups`),
            blocks of :func:`window_block` of the shard's expected windows, so that each
            shard spreads over every group; the groups of the shards add up to the corpus'.

    Raises:
        InputError: as :func:`shard_batches`; the message ends with the shard
            (``[shard ...]``).

    A pack-mode shard of part of an input is counted as a piece of the input's stream; its
    metadata carries :func:`posstats.counting.pack.piece_metadata` for the reduce to place it.
    """
    piece = spec.mode == "pack" and not shard.is_whole_input
    if dense is None:
        dense = partial_is_dense(spec, shard, dense_budget=dense_budget)
    groups = shard_window_groups(spec, window_groups)[0]
    block = window_block(shard.size_hint // 4, spec.positions, window_groups if groups else 0, mode=spec.mode)
    acc = CountAccumulator(spec, dense=dense, dense_budget=dense_budget, fingerprint=shard.fingerprint, metadata=metadata,
                           out=out if dense else None, window_groups=groups, window_block=block,
                           window_halves=spec.positions > WINDOW_GROUP_POSITIONS)
    if piece:
        acc.start_piece(shard.path, first=shard.index == 0)
    try:
        for batch in prefetched(shard_batches(shard, source, tokenizer=tokenizer)):
            acc.add(batch)
    except InputError as exc:
        msg = f"{exc} [shard: {shard.label()}]"
        raise InputError(msg) from exc
    if piece:
        path = shard.path if is_url(shard.path) else os.path.abspath(shard.path)
        acc.metadata.update(piece_metadata(path, shard.input_fingerprint, shard.index, shard.count, acc.piece()))
    acc.compact()
    return acc
