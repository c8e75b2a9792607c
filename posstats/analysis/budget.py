"""Memory budgets and refusals for the ranged analysis (``--ranges``): what the stored counts
and halves cost, and which options cannot run on ranges.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from posstats.analysis.config import _NULL_SHUFFLE_LIMIT, AnalysisConfig
from posstats.counting.counts import PositionalCounts
from posstats.counting.window_groups_io import halves_sums, window_groups_file
from posstats.estimates.ranged_halves import HALVES_BYTES_PER_STORED_COUNT, local_halves
from posstats.geometry.ranged import BYTES_PER_STORED_COUNT


def halves_starter(path: str | os.PathLike, header: PositionalCounts, ranges: Any, /, *,
                   start: Any = None) -> Any:
    """The ``halves`` of :func:`analyze_ranges` for the counts at ``path`` (``header``): None
    without a window-groups file beside them, else ``start`` (the Ray actors' starter) or
    the starter of ``ranges`` held in this process
    (:func:`posstats.estimates.ranged_halves.local_halves`)."""
    if window_groups_file(path) is None:
        return None
    if start is not None:
        return start
    expected = (header.positions, header.vocab_size, header.tokens, header.fingerprint)
    return local_halves(ranges, str(path), expected)


def halves_reader(path: str | os.PathLike, header: PositionalCounts, /) -> Any:
    """The ``half_sums`` of :func:`analyze_ranges` for the counts at ``path`` (``header``):
    ``positions -> (a, b, occ_a, occ_b)`` read from the window-groups file beside them
    (:func:`posstats.counting.window_groups_io.halves_sums`), or None without one. The last
    positions' sums are kept: the standout test's document model and the halves' pool
    shift ask for the same rows, and each read passes over the whole halves' file. The
    arrays are shared between callers, which only read them."""
    if window_groups_file(path) is None:
        return None
    expected = (header.positions, header.vocab_size, header.tokens, header.fingerprint)
    kept: dict[bytes, tuple[Any, Any, Any, Any]] = {}

    def read(positions: Any) -> tuple[Any, Any, Any, Any]:
        key = np.asarray(positions, dtype=np.int64).tobytes()
        if key not in kept:
            kept.clear()
            kept[key] = halves_sums(path, positions, expected)
        return kept[key]

    return read


def budgeted_stored_counts(path: str | os.PathLike, stored: int, config: AnalysisConfig, /) -> int:
    """The stored counts a range budget is sized for (:func:`posstats.geometry.ranged.ranges_for_budget`):
    ``stored``, plus what each range holds of the halves' noise while the rank test's edge is
    measured (:data:`posstats.estimates.ranged_halves.HALVES_BYTES_PER_STORED_COUNT` per
    stored count, in stored counts' worth) when a window-groups file is beside the counts
    at ``path`` and ``config.mp_edge`` is ``auto``."""
    if config.mp_edge != "auto" or config.null not in ("auto", "mp"):
        return int(stored)
    return stored_with_halves(path, stored)


def stored_with_halves(path: str | os.PathLike, stored: int, /) -> int:
    """``stored`` counts plus, when a window-groups file is beside the counts at ``path``,
    what a range holds of the halves' noise while the edge is measured on them, in stored
    counts' worth (:data:`posstats.estimates.ranged_halves.HALVES_BYTES_PER_STORED_COUNT`
    per stored count against :data:`posstats.geometry.ranged.BYTES_PER_STORED_COUNT`)."""
    if window_groups_file(path) is None:
        return int(stored)
    return int(stored) + -(-int(stored) * HALVES_BYTES_PER_STORED_COUNT // BYTES_PER_STORED_COUNT)


def ranges_refusal(config: AnalysisConfig, m: int, /) -> str | None:
    """Why :func:`analyze_ranges` cannot analyse ``m`` rows held apart with ``config``, or None."""
    if m < 2:
        return (f"{m} position(s) have at least {config.min_occupancy} counted token(s); the geometry needs two or "
                "more (count more text, or lower {min_occupancy})")
    if config.buckets != "none":
        return f"an analysis over position ranges needs {{buckets}} none, got {config.buckets}"
    if config.device == "gpu":
        return "{device} gpu: an analysis over position ranges runs on CPUs (auto or cpu)"
    if config.null == "shuffle":
        return "{null} shuffle draws shuffled corpora from the counts in one process; over position ranges use auto or mp"
    limit = max(config.exact_limit, _NULL_SHUFFLE_LIMIT if config.null in ("auto", "shuffle") else 0)
    if m <= limit:
        return (f"{m:,} geometry rows: an analysis over position ranges serves more than {limit:,} rows (the exact "
                "path and the shuffle null need the counts in one process); analyse these counts in one process")
    if config.held_out == "on":
        return "{held_out} on needs the counts in one process; an analysis over position ranges takes auto or off"
    return None
