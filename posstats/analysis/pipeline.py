"""The analysis pipeline: counts -> Hellinger geometry -> MDS -> encodings -> report.

:func:`analyze` (one process) and :func:`analyze_ranges` (rows in ranges, for long contexts)
tie the single-concept modules together and return an :class:`~posstats.analysis.Analysis`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any

import numpy as np

from posstats.analysis.budget import halves_reader, halves_starter, ranges_refusal
from posstats.analysis.config import FLAT_REASON, AnalysisConfig, flat_skipped_encodings, skipped_encodings
from posstats.analysis.exact import _exact_geometry
from posstats.analysis.held_out import _held_out_section
from posstats.analysis.intervals import _stress_intervals
from posstats.analysis.null import _edge_weights, _HalvesEdges, _noise_level, _null_choice, _null_section, _untested
from posstats.analysis.result import Analysis
from posstats.analysis.rows import (
    _geometry_rows,
    _geometry_section,
    _halves_window_groups,
    _modelled_excess,
    _noise,
    _Rows,
    RotatedDistances,
    _standout,
    _usable_window_groups,
)
from posstats.analysis.sampled import _sampled_geometry, _triples, mds_device
from posstats.counting.counts import PositionalCounts, too_few_windows
from posstats.counting.io import counts_file, load_header
from posstats.errors import InputError, OptionError
from posstats.estimates.null_rank import edge_decision_level
from posstats.estimates.ranged_jackknife import local_replicates
from posstats.estimates.thinning import range_noise_floor
from posstats.estimates.verdict import non_stationarity
from posstats.geometry.ranged import RangedSqrt, local_ranges


def analyze(
    counts: PositionalCounts,
    config: AnalysisConfig | None = None,
    /,
    *,
    show_progress: bool | None = None,
    parts: Any = None,
    window_groups: Any = None,
) -> Analysis:
    """Run the geometry and encoding analysis of THEORY sections 2-7 on ``counts``.

    Args:
        counts: the corpus' positional counts.
        config: options (:class:`AnalysisConfig`).
        show_progress: progress bar on stderr (None: only on a terminal).
        parts: 2 or 4 :class:`PositionalCounts` whose sum is the corpus (document or shard
            parity, :mod:`posstats.estimates.noise`), for the noise floor; None: the counted
            tokens are split at random (:mod:`posstats.estimates.thinning`).
        window_groups: the counts by window group
            (:class:`~posstats.counting.window_groups.WindowGroups`, counted with
            ``counts``): the null corpora of the homogeneity and rank tests are then
            groups of windows rotated (:mod:`posstats.estimates.rotation`), which keeps
            the dependence inside windows, instead of tokens shuffled across positions.

    Up to ``config.exact_limit`` geometry rows the (m, m) squared distances
    ``D = hellinger_sq(rows)`` are computed once and shared by the MDS, the stress, the
    diagnostics and (as :attr:`Analysis.distances`, the one matrix, plug-in or
    bias-corrected) the report and the export.
    Above it no m x m matrix is formed (module :mod:`posstats.estimates.sampled`):
    block-Lanczos MDS, sampled stress with 95 % intervals, sampled corpus diagnostics; the
    report says ``stress_method: sampled``.

    Raises:
        OptionError: fewer than two positions reach the minimum occupancy (an InputError);
            ``device="gpu"`` without cupy or a CUDA device.
        PosstatsError: a noise floor without the parts it needs.
    """
    if not isinstance(counts, PositionalCounts):
        msg = (f"analyze() takes PositionalCounts (posstats.load_counts(folder) reads them), got "
               f"{type(counts).__name__}")
        raise TypeError(msg)
    if config is not None and not isinstance(config, AnalysisConfig):
        msg = f"analyze()'s config must be an AnalysisConfig, got {type(config).__name__}"
        raise TypeError(msg)
    config = config or AnalysisConfig()
    if config.device == "gpu":
        mds_device(config.device)  # no GPU here: refused before any work
    return _analysis(counts, config, _geometry_rows(counts, config), parts=parts, show_progress=show_progress,
                     window_groups=window_groups)


def analyze_ranges(
    counts: PositionalCounts,
    rows: RangedSqrt,
    config: AnalysisConfig | None = None,
    /,
    *,
    replicates: Any,
    counts_source: str | os.PathLike | None = None,
    show_progress: bool | None = None,
    halves: Any = None,
    half_sums: Any = None,
) -> Analysis:
    """:func:`analyze` with the counts' rows held apart, in position ranges (in this process
    or in Ray actors: :mod:`posstats.geometry.ranged`), so that no process holds every count.

    The same steps and the same report as :func:`analyze`'s sampled path: the ranges' own
    noise floors, joined (:func:`posstats.estimates.noise.merge_noise_floors`; each range's
    tokens split with the seed and its first position, so the split-half figures differ
    from one process' by the randomness of the split, the bias ``b_i`` does not); the
    standout test, the Lanczos MDS, the sampled stress and diagnostics, the pairs' noise
    share and the stress intervals' jackknife from reductions and pair products over the
    ranges.

    Args:
        counts: the counts' header (:func:`posstats.counting.io.load_header`: spec, totals,
            fingerprint, metadata; its matrix is not read).
        rows: the used rows (occupancy >= ``config.min_occupancy``) over ranges that were
            loaded with their noise floors
            (:func:`posstats.geometry.ranged.load_sqrt_range` with ``noise_of``).
        config: options; what needs the counts in one array is refused in one line:
            buckets, ``device="gpu"``, the exact path (rows up to ``exact_limit``), the shuffle
            null (up to 4,096 rows), held-out scores (``held_out="on"``).
        replicates: ``replicates(groups, seed)`` starts every range's jackknife split and
            returns the runner over them (:func:`posstats.estimates.ranged_jackknife.local_replicates`
            for ranges in this process; the Ray actors' ``start_replicates``).
        halves: ``halves(row_bins, bins)`` starts every range's rows of the window groups'
            halves and returns their runner, for the rank test's edge
            (:func:`posstats.estimates.ranged_halves.local_halves`; the Ray actors'
            ``start_halves``); None: the counts have no window groups (the analytic edge).
        half_sums: ``half_sums(positions)`` reads the halves' tokens per vocabulary entry
            and occupancies (:func:`posstats.counting.window_groups_io.halves_sums`), for the
            standout test's document model (:mod:`posstats.estimates.document_excess`);
            None: without it (no window groups beside the counts).
        counts_source: the counts file the ranges read, every row of it
            (:attr:`Analysis.counts_source`); its header's token total is checked against
            the rows read (:class:`~posstats.errors.InputError` when they differ), so the
            file has had every check of :func:`posstats.counting.io.check_counts_file`.
        show_progress: progress bars on stderr (None: only on a terminal).
    """
    config = config or AnalysisConfig()
    positions, occupancy = rows.held()
    problem = ranges_refusal(config, len(positions))
    if problem:
        raise OptionError(problem)
    read = rows.read_occupancy(counts.positions)
    if counts_source is not None and int(read.sum()) != int(counts.tokens):
        # the ranges read (and checked) every row of the file: with its token total the file
        # has had every check of check_counts_file, and the run's readers skip them
        msg = (f"{counts_source}: its header says {int(counts.tokens):,} tokens but its counts add up to "
               f"{int(read.sum()):,}; the file was changed after counting: count again")
        raise InputError(msg)
    g = _Rows(counts, None, positions, positions, rows, occupancy, counts.positions, replicates=replicates,
              halves=halves, half_sums=half_sums)
    analysis = _analysis(counts, config, g, parts=None, show_progress=show_progress, occupancy=read)
    analysis.sections["geometry"]["ranges"] = len(rows.ranges)  # the report says the rows were held apart
    return dataclasses.replace(analysis, counts_source=None if counts_source is None else str(counts_source))


def analyze_in_ranges(path: str | os.PathLike, parts: int, config: AnalysisConfig | None = None, /, *,
                      show_progress: bool | None = None) -> Analysis:
    """:func:`analyze_ranges` of a saved counts file cut into ``parts`` position ranges held in
    this process (:func:`posstats.geometry.ranged.local_ranges`, each range with its noise
    floor), the one code path the Ray actors also run (``jobs.ranges``)."""
    config = config or AnalysisConfig()
    noise_of = functools.partial(range_noise_floor, parts=config.noise_parts, seed=config.seed)
    ranges = local_ranges(path, parts, min_occupancy=config.min_occupancy, noise_of=noise_of)
    header = load_header(path)
    return analyze_ranges(header, RangedSqrt(ranges), config, show_progress=show_progress,
                          replicates=lambda groups, seed: local_replicates(ranges, groups=groups, seed=seed),
                          counts_source=counts_file(path), halves=halves_starter(path, header, ranges.ranges),
                          half_sums=halves_reader(path, header))


def _analysis(counts: PositionalCounts, config: AnalysisConfig, g: _Rows, /, *, parts: Any,
              show_progress: bool | None, occupancy: np.ndarray | None = None, window_groups: Any = None) -> Analysis:
    """The body of :func:`analyze` and :func:`analyze_ranges` on the selected rows ``g``."""
    if window_groups is not None and window_groups.halves_only and not g.halves_only:
        g = dataclasses.replace(g, halves_only=True)  # no rotation: the auto null is the halves' edge
    timings: dict[str, float] = {}
    sections: dict[str, Any] = {}
    if g.buckets is not None:
        sections["buckets"] = {**g.buckets.to_dict(), "occupancy": g.geo.occupancy().tolist(), "used": len(g.index)}
    noise, geo_parts, noise_entry = _noise(parts, g, config, timings, show_progress)
    sections["noise"] = noise_entry
    bias = noise.bias if (noise is not None and config.distances in ("auto", "corrected")) else None
    large = len(g.index) > config.exact_limit
    sections["geometry"] = _geometry_section(config, corrected=bias is not None, rows=len(g.index), large=large)
    windows = _usable_window_groups(window_groups, counts, g)
    rotated = None if windows[0] is None else RotatedDistances(windows[0], g.index, replicates=config.null_replicates,
                                                                   seed=config.seed)
    t = time.perf_counter()
    modelled = None if rotated is not None else _modelled_excess(_halves_window_groups(window_groups, counts, g), g)
    standout = _standout(g, rotated, modelled)  # before the geometry: it may decide its accuracy
    timings["standout"] = time.perf_counter() - t
    if large:
        untested = _untested(config, len(g.index), noise, standout, counts, halves_only=g.halves_only)
        if untested:  # every encoding will be tied: the stresses and the noise bulk are descriptive
            sections["geometry"]["untested"] = {"reason": untested,
                                                "stress_halfwidth": config.untested_stress_halfwidth,
                                                "lanczos_noise_share": config.untested_lanczos_noise_share,
                                                **dict(zip(("corpus_triples", "encoding_triples"),
                                                           _triples(config, untested=True), strict=True))}
    weights = _edge_weights(config, g, noise)
    halves = _HalvesEdges(config, g, noise, geo_parts, _halves_window_groups(window_groups, counts, g), bias)
    edge_level = None if weights is None else edge_decision_level(geo_parts, noise, bias, weights,
                                                                  edge=halves.edge(weights))
    if large:
        noise_level = _noise_level(bias, noise, geo_parts, config, len(g.index), untested=untested is not None,
                                   halves_only=g.halves_only,
                                   edge=halves.edge(None))
        halves.release()  # both edges are read: the halves' noise (1.5 GB at n = 131,072) goes before the MDS
        geometry = _sampled_geometry(g, bias, config, timings, show_progress, untested=untested is not None,
                                     noise_level=noise_level, rank_test=None if weights is None else (weights, edge_level))
    else:
        shuffled = _null_choice(config, len(g.index), noise, halves_only=g.halves_only) == "shuffle"
        geometry = _exact_geometry(g, bias, config, timings, show_progress,
                                   rank_test=shuffled or weights is not None, edge_level=edge_level)
    null, homogeneity, weighted = _null_section(
        geometry.mds, bias, noise, g, geo_parts, config, timings, show_progress, distances=geometry.distances,
        shrinkage=geometry.shrinkage, windows=windows, rank_test=geometry.rank_test, halves=halves,
        rank_test_bound=geometry.rank_test_bound,
        rotated_statistics=None if rotated is None else rotated.homogeneity_statistics())
    if null is not None:
        sections["null"] = null
    if halves.seconds:
        timings["halves_edge"] = halves.seconds
    # the verdict ties every encoding when no test found structure (estimates.verdict):
    # then no interval or range is computed for comparing them
    compared = not (non_stationarity(homogeneity, standout)[0] is False
                    or too_few_windows(counts.spec.mode, counts.windows))
    if geometry.encodings:
        t = time.perf_counter()
        share = _stress_intervals(geometry, g, corrected=bias is not None, config=config,
                                  noise_share=((null or {}).get("distance_noise") or {}).get("share"),
                                  show_progress=show_progress, compared=compared)
        if null is not None and share is not None and "distance_noise" not in null:
            # no shuffle null (the analytic edge): the share the intervals were judged by
            null["distance_noise"] = {"share": share, "method": "pairs (rows redrawn from the pooled distribution)"}
        timings["stress_intervals"] = time.perf_counter() - t
    if homogeneity is not None:
        sections["homogeneity"] = homogeneity
    skipped = flat_skipped_encodings(config) if geometry.flat else skipped_encodings(config, len(g.index))
    if skipped:
        sections["skipped_encodings"] = skipped
    held_out = ({"skipped": FLAT_REASON} if geometry.flat and config.held_out != "off" else
                _held_out_section(g, geo_parts, bias, config, timings, show_progress, compared=compared))
    if held_out is not None:
        sections["held_out"] = held_out
    return Analysis(counts, config, g.positions, geometry.distances, geometry.mds, geometry.diagnostics, geometry.encodings,
                    timings, sections, geometry.hellinger_summary, standout, occupancy, weighted_encoding=weighted)
