"""A counts folder (``posstats count --out OUT``): ``config.json``, the counts file, and
``count.json`` (the completion marker, which names the counts file), published together.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from posstats.corpus.inputs import CountInputs
from posstats.corpus.source import estimated_tokens
from posstats.corpus.count_step import accumulate_corpus, halves_only_note
from posstats.counting.counts import PositionalCounts, too_few_windows
from posstats.counting.io import (
    COUNTS_FILES,
    SPARSE_FILE,
    save_accumulated,
    save_counts,
)
from posstats.counting.window_groups_io import WINDOW_GROUPS_FILE, save_window_group_blocks
from posstats.memory import require_count_memory
from posstats.storage.jsontext import write_json_atomic
from posstats.storage.publish import staged_output

__all__ = ["COUNT_MARKER", "count_in_process", "count_line", "count_summary", "few_windows_warning", "publish_counts",
           "window_groups_to_count"]

COUNT_MARKER = "count.json"


def count_summary(counts: PositionalCounts, /, *, files: int, counts_file: str, seconds: float,
                  occupied: int | None = None) -> dict[str, Any]:
    """The ``count.json`` record of counts written as ``counts_file`` (``occupied``: the
    positions with a count, when ``counts`` is a header without its counts)."""
    if occupied is None:
        occupied = int((counts.occupancy() > 0).sum())
    return {
        "files": files,
        "sequences": counts.sequences,
        "windows": counts.windows,
        "tokens_counted": counts.tokens,
        "positions_occupied": occupied,
        "storage": "sparse" if counts_file == SPARSE_FILE else "dense",
        "counts_file": counts_file,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(counts.tokens / seconds, 1) if seconds > 0 else None,
        "fingerprint": counts.fingerprint,
    }


def count_in_process(inputs: CountInputs, stage: Path, /, *, budget_bytes: float,
                     keep: bool = True) -> tuple[PositionalCounts | None, dict[str, Any]]:
    """The local executor of :func:`posstats.jobs.count.count_to` (the one entry of every
    count): count ``inputs`` in this process into ``stage`` (``config.json`` and the counts file);
    return the counts and their ``count.json`` record. In pack mode with
    ``inputs.window_groups`` the counts by window group are written beside them
    (:func:`~posstats.counting.window_groups_io.save_window_group_blocks`) where
    :func:`window_groups_to_count` allows; ``count.json`` says why not otherwise. The kernel is dense only where
    ``8 n V`` bytes fit ``budget_bytes`` and the corpus is big enough
    (:meth:`~posstats.counting.counts.CountSpec.prefers_dense`); the file is stored by size.
    ``keep=False``: sparse counts are written straight from their position blocks
    (:func:`~posstats.counting.io.save_blocks`: no CSR array is assembled) and None is
    returned in place of the counts."""
    files = inputs.source.files()
    write_json_atomic(stage / "config.json", inputs.record(command="count", files=files))
    tokens = sum(estimated_tokens(path, inputs.source.column, inputs.source.storage_options) for path in files)
    dense = inputs.spec.prefers_dense(budget_bytes, tokens)
    require_count_memory(inputs.spec, budget_bytes=budget_bytes, tokens=tokens)
    t = time.perf_counter()
    groups, skipped = window_groups_to_count(inputs, tokens=tokens, budget_bytes=budget_bytes)
    acc = accumulate_corpus(inputs.source, inputs.spec, dense=dense, dense_budget=budget_bytes, metadata=inputs.metadata,
                            expected_tokens=tokens, files=files, window_groups=groups)
    seconds = time.perf_counter() - t
    groups = acc.window_group_counter()  # None unless counted
    if keep:
        counts = acc.result(copy=False)
        path = save_counts(counts, stage)
        summary = count_summary(counts, files=len(files), counts_file=path.name, seconds=seconds)
    else:
        path, counts, occupancy = save_accumulated(acc, stage)
        summary = count_summary(counts, files=len(files), counts_file=path.name, seconds=seconds,
                                occupied=int(np.count_nonzero(occupancy)))
        counts = None
    if groups is not None:
        _, written = save_window_group_blocks(groups, acc.header(), stage)
        note = halves_only_note(inputs.spec.positions, int(inputs.window_groups))
        summary["window_groups"] = {"file": WINDOW_GROUPS_FILE, **written, **({"kept": note} if note else {})}
    elif skipped:
        summary["window_groups"] = {"skipped": skipped}
    return counts, summary


# a held (key, count) pair per non-zero, at most one per token, while K groups' blocks are
# merged. The halves (above 4,096 positions) cost the count less, about 2 bytes a token,
# but far more time than that at this size (n = 131,072, 1e9 generated tokens, pack: 48.7 s
# and 5.57 GB with them against 18.7 s and 3.62 GB without); the same cap keeps them to
# counts an analysis in one process can hold (past 2.7e8 tokens, at the default 4 GiB, it
# cannot: 1e9 tokens need 20 GiB, posstats.memory.ANALYSIS_BYTES_PER_STORED_COUNT). Over
# ranges the halves of 1e9 tokens were measured (427 s, 13.0 GB the largest process):
# count such corpora with --ray, whose pack-mode shards by rank parity are the halves, or
# raise --memory-budget.
WINDOW_GROUP_BYTES_PER_TOKEN = 16


def window_groups_to_count(inputs: CountInputs, /, *, tokens: int, budget_bytes: float) -> tuple[int, str | None]:
    """``(K, why not)``: the window groups a count in this process asks for (0 and the
    reason when none): ``inputs.window_groups`` (every mode) while ``16 x tokens`` bytes fit
    ``budget_bytes`` (the groups' keys and counts). Above
    :data:`~posstats.corpus.count_step.WINDOW_GROUP_POSITIONS` positions the count keeps
    the even and odd stretches of the K only (:func:`~posstats.corpus.count_step.kept_window_groups`)."""
    k = int(inputs.window_groups)
    if k <= 0:
        return 0, None
    if WINDOW_GROUP_BYTES_PER_TOKEN * tokens > budget_bytes:
        return 0, (f"{tokens:,} tokens need about {WINDOW_GROUP_BYTES_PER_TOKEN * tokens / 2**30:.1f} GiB for the "
                   f"window groups, over the memory budget of {budget_bytes / 2**30:.1f} GiB")
    return k, None


def publish_counts(out: str | os.PathLike, count: Callable[[Path], dict[str, Any]], /) -> dict[str, Any]:
    """Run ``count(stage)`` (it writes ``config.json`` and the counts file and returns the
    summary), write ``count.json`` and publish the folder as ``out``; return the summary.
    The other kind of counts file, if ``out`` held one, is dropped."""
    with staged_output(out, last=(COUNT_MARKER,), replaces=(*COUNTS_FILES, WINDOW_GROUPS_FILE)) as stage:
        summary = count(stage)
        write_json_atomic(stage / COUNT_MARKER, summary)
    return summary


def _rate(summary: dict[str, Any]) -> str:
    """`` [12.3 s counting, 16.4 M tokens/s]``: the counting phase alone (reading and
    counting, not start-up or saving), when the summary has it."""
    seconds, rate = summary.get("seconds"), summary.get("tokens_per_s")
    if not seconds or not rate:
        return ""
    return f" [{seconds:.1f} s counting, {rate / 1e6:.1f} M tokens/s]"


def few_windows_warning(summary: dict[str, Any], /, *, mode: str) -> str | None:
    """The warning ``posstats count`` prints when pack or chunk mode gave too few windows for
    an honest verdict (:func:`posstats.counting.counts.too_few_windows`: the analysis will
    withhold it), else None."""
    why = too_few_windows(mode, int(summary.get("windows") or 0))
    return None if why is None else f"{why} (the analysis will withhold its verdict)"


def count_line(summary: dict[str, Any], /, *, positions: int, out: str | os.PathLike) -> str:
    """The one line ``posstats count`` prints."""
    return (
        f"counted {summary['tokens_counted']:,} tokens from {summary['sequences']:,} sequences in "
        f"{summary['files']} file(s): {summary['positions_occupied']:,}/{positions:,} positions occupied "
        f"({summary['storage']}) -> {out}{_rate(summary)}"
    )
