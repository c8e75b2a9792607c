"""The rows the geometry is computed from (:class:`_Rows`: the positions used, their counts
and occupancies, in this process or held apart over ranges), their noise floor, and the
per-position standout test.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from posstats.analysis.config import AnalysisConfig
from posstats.counting.buckets import Buckets, bucket_counts, parse_buckets
from posstats.counting.counts import PositionalCounts
from posstats.counting.io import DENSE_AS_SPARSE_ENTRIES, csr_from_dense
from posstats.counting.rows import select_rows
from posstats.errors import OptionError
from posstats.estimates.document_excess import document_excess, document_variance
from posstats.estimates.noise import bias_can_matter, merge_noise_floors, noise_floor
from posstats.estimates.rotation import rotated_distances_to_pool
from posstats.estimates.standout import _pooled_totals, _row_totals, standout_positions, standout_test
from posstats.estimates.thinning import split_noise_floor
from posstats.geometry.mds import MDSResult
from posstats.geometry.ranged import RangedSqrt
from posstats.memory import analysis_bytes, require_memory


@dataclass(frozen=True)
class _Rows:
    """The rows the geometry runs on.

    Attributes:
        geo: the counts, or their bucketed counts.
        buckets: the buckets, or None.
        index: (m,) rows of ``geo`` used (occupancy >= the minimum).
        positions: (m,) their positions (bucket midpoints with buckets).
        rows: (m, V) counts of those rows (dense or scipy CSR).
        occupancy: (m,) their occupancies.
        context: the counted sequence length n (RoPE variants that depend on it are built for it).
        replicates: with ``rows`` a :class:`~posstats.geometry.ranged.RangedSqrt` (the rows
            held apart, :func:`analyze_ranges`): ``replicates(groups, seed)`` starts every
            range's jackknife split and returns their runner
            (:func:`posstats.estimates.ranged_jackknife.ranged_pair_replicates`); else None.
        halves: with rows held apart and the counts' window groups beside them,
            ``halves(row_bins, bins)`` starts every range's rows of the halves' noise and
            returns their runner (:func:`posstats.estimates.ranged_halves.ranged_halves_noise`);
            else None.
        half_sums: with rows held apart and the counts' window groups beside them,
            ``half_sums(positions)`` reads the halves' tokens per vocabulary entry and
            occupancies (:func:`posstats.counting.window_groups_io.halves_sums`), for the
            standout test's document model; else None.
        halves_only: the counts' window groups are their windows' two halves only
            (``posstats count`` above 4,096 positions): no window can be rotated, so the
            ``auto`` null is the halves' edge, not shuffled corpora
            (:func:`posstats.analysis.null._null_choice`).
    """

    geo: PositionalCounts
    buckets: Buckets | None
    index: np.ndarray
    positions: np.ndarray
    rows: Any
    occupancy: np.ndarray
    context: int
    replicates: Any = None
    halves: Any = None
    half_sums: Any = None
    halves_only: bool = False

    @property
    def ranged(self) -> bool:
        """The rows are held apart (:class:`~posstats.geometry.ranged.RangedSqrt`)."""
        return isinstance(self.rows, RangedSqrt)

    def column_totals(self) -> np.ndarray:
        """(V,) tokens per vocabulary entry over the rows (computed once: over ranges it is
        a pass over every stored count, 2.2 s at 1 B tokens, and three steps ask for it)."""
        return self._totals

    @functools.cached_property
    def _totals(self) -> np.ndarray:
        if self.ranged:
            return self.rows.count_totals(np.ones(len(self.index), dtype=bool))
        return _column_totals(self.rows)

    def pooled_totals(self, keep: np.ndarray, /) -> np.ndarray:
        """(V,) tokens per vocabulary entry over the rows ``keep`` (bool (m,)) held apart
        (the standout test's pool): the held :meth:`column_totals` when that is every row."""
        keep = np.asarray(keep, dtype=bool)
        return self.column_totals() if bool(keep.all()) else self.rows.count_totals(keep)


def _geometry_rows(counts: PositionalCounts, config: AnalysisConfig) -> _Rows:
    """Bucket the counts if asked, keep rows with ``occupancy >= min_occupancy``
    (:func:`posstats.counting.rows.select_rows`), check that two or more are left and
    that the analysis fits in memory."""
    sel = select_rows(counts, min_occupancy=config.min_occupancy, buckets=parse_buckets(config.buckets, counts.positions))
    m = len(sel.index)
    if m < 2:
        what = "bucket(s)" if sel.buckets is not None else "position(s)"
        msg = (
            f"{m} {what} have at least {config.min_occupancy} counted token(s); "
            "the geometry needs two or more (count more text, or lower {min_occupancy})"
        )
        raise OptionError(msg)
    # large dense counts are held as CSR (every step works on CSR rows: converting the
    # dense matrix in each went through COO, 16 bytes of coordinates per non-zero)
    as_sparse = not sel.counts.is_sparse and m * sel.counts.vocab_size >= DENSE_AS_SPARSE_ENTRIES
    sparse = sel.counts.is_sparse or as_sparse
    stored = int(sel.counts.matrix.nnz) if sel.counts.is_sparse else 0  # as_sparse: dense m x V already held
    need, what, hint = analysis_bytes(m, sel.counts.vocab_size, dims=config.dims, encodings=len(config.encodings),
                                      exact=m <= config.exact_limit, dense_counts=not sparse, stored=stored)
    require_memory(need, what=what, hint=hint, command="analyze")
    rows = csr_from_dense(sel.rows(), compact=True) if as_sparse else sel.rows()
    return _Rows(sel.counts, sel.buckets, sel.index, sel.positions, rows, sel.occupancy(), counts.positions)


def _noise(
    parts: Any, g: _Rows, config: AnalysisConfig, timings: dict[str, float], show_progress: bool | None
) -> tuple[Any, list | None, dict | None]:
    """The split-half noise floor of the geometry rows, when ``config.noise_floor`` is on
    or ``auto`` and the plug-in bias can matter (:func:`bias_can_matter`): ``(NoiseFloor,
    the parts bucketed like the rows or None, the report's noise section)``. Without parts
    the counted tokens are split at random (:func:`split_noise_floor`)."""
    rule = None
    if config.noise_floor == "auto":
        rule = bias_can_matter(g.occupancy, g.column_totals())
    if config.noise_floor == "off" or (rule is not None and not rule["noise_floor"]):
        return None, None, ({"estimated": False, "rule": rule} if rule else {"estimated": False, "rule": "off"})
    t = time.perf_counter()
    if g.ranged:  # each range split its tokens as it read them (posstats.estimates.thinning.range_noise_floor)
        noise = merge_noise_floors(g.rows.ranges.call("noise"))
        geo_parts = None
    elif parts is None:
        noise = split_noise_floor(g.rows, parts=config.noise_parts, seed=config.seed, positions=g.index,
                                  show_progress=show_progress)
        geo_parts = None
    else:
        geo_parts = [bucket_counts(p, g.buckets) for p in parts] if g.buckets is not None else list(parts)
        noise = noise_floor(geo_parts, positions=g.index)
    entry = {"estimated": True, **noise.to_dict(), "rule": rule if rule else "on"}
    entry["positions"] = [int(x) for x in g.positions]
    timings["noise_floor"] = time.perf_counter() - t
    return noise, geo_parts, entry


def _column_totals(rows: Any) -> np.ndarray:
    """(V,) tokens per vocabulary entry of the (m, V) counts (sparse or dense)."""
    if sp.issparse(rows):
        c = sp.csr_array(rows)
        totals = np.zeros(c.shape[1])
        for a in range(0, c.nnz, 1 << 22):  # no float copy of all the counts at once
            totals += np.bincount(c.indices[a : a + (1 << 22)], weights=c.data[a : a + (1 << 22)], minlength=c.shape[1])
        return totals
    return np.asarray(rows, dtype=np.float64).sum(axis=0)


def _geometry_section(config: AnalysisConfig, *, corrected: bool, rows: int, large: bool) -> dict[str, Any]:
    """The ``geometry`` report section: which distances, exact or sampled stress."""
    return {
        "distances": "bias_corrected" if corrected else "plugin",
        "distances_formula": (
            "max(d_H^2 - b_i - b_j, 0), b from the split-half noise floor" if corrected else "plug-in d_H^2"
        ),
        "stress_method": "sampled" if large else "exact",
        "exact_limit": config.exact_limit,
        "rows": rows,
        "buckets": config.buckets,
    }


@dataclass(frozen=True)
class _Geometry:
    """What the exact or the sampled path computed (fields as in :class:`Analysis`)."""

    mds: MDSResult
    diagnostics: dict[str, Any]
    encodings: list[dict[str, Any]]
    hellinger_summary: dict[str, Any] | None
    distances: np.ndarray | None = None
    flat: bool = False  # every corpus distance is 0: no encoding is scored (stress would be 0/0)
    # the sampled path: the stress jackknife's pairs (i, j) and their corpus distances h
    jackknife_pairs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    # the exact path's corrected distances have the square roots' occupancy shrinkage removed
    # (posstats.estimates.occupancy): every estimate compared with them goes through it too
    occupancy_adjusted: bool = False
    shrinkage: Any = None  # the OccupancyShrinkage of the used rows (None: equal occupancies)
    # the rank test's occupancy-weighted eigenvalues and eigenvectors (None: not needed)
    rank_test: tuple[np.ndarray, np.ndarray] | None = None
    # max(w) / min(w) where those are the MDS's eigenvalues' upper bounds, not solved (weights equal to 1 %)
    rank_test_bound: float | None = None


class RotatedDistances:
    """``s_pool -> (R, m)`` distances of the rows ``g.index`` of R rotated corpora to a pool
    (:func:`posstats.estimates.rotation.rotated_distances_to_pool`, the rotation null's
    offsets at ``seed``), for the standout test; the last call's pool and distances kept, so
    that the rotation null reuses them (:meth:`homogeneity_statistics`)."""

    def __init__(self, groups: Any, rows: np.ndarray, /, *, replicates: int, seed: int) -> None:
        self.groups, self.rows, self.replicates, self.seed = groups, np.asarray(rows, dtype=np.int64), replicates, seed
        self.pool: np.ndarray | None = None
        self.distances: np.ndarray | None = None

    def __call__(self, s_pool: np.ndarray) -> np.ndarray:
        self.pool = np.asarray(s_pool, dtype=np.float64)
        self.distances = rotated_distances_to_pool(self.groups, self.pool, rows=self.rows, replicates=self.replicates,
                                                   seed=self.seed)
        return self.distances

    def homogeneity_statistics(self) -> np.ndarray | None:
        """(R,) ``S_r = sum_i N_i d_i^(r)``: the homogeneity statistic of each rotated corpus
        (:func:`posstats.estimates.rotation.rotated_statistic`), where the distances are
        those of every position to the corpus' pooled distribution; else None."""
        groups = self.groups
        if self.distances is None or not np.array_equal(self.rows, np.arange(groups.positions)):
            return None
        if not np.array_equal(self.pool, np.sqrt(groups.pooled / groups.occupancy.sum())):
            return None
        return self.distances @ groups.occupancy


class ModelledExcess:
    """``s_pool -> (m,)`` the excess of the rows' distances to a pool that documents
    differing from each other give, modelled and fitted to the corpus' two halves
    (:mod:`posstats.estimates.document_excess`), for the standout test where no window can
    be rotated. ``sums()`` gives the halves' ``(a, b, occ_a, occ_b)`` at the rows: tokens per
    vocabulary entry and occupancies (:func:`half_sums_of_groups` in this process,
    :func:`posstats.counting.window_groups_io.halves_sums` for rows held apart)."""

    def __init__(self, sums: Any, /) -> None:
        self.sums = sums

    def __call__(self, s_pool: np.ndarray) -> np.ndarray:
        a, b, occ_a, occ_b = self.sums()
        tau = document_variance(a, b, occ_a, occ_b)
        return document_excess(tau, np.asarray(s_pool, dtype=np.float64) ** 2, occ_a + occ_b)


def half_sums_of_groups(groups: Any, rows: np.ndarray, /) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(a, b, occ_a, occ_b)`` of the window groups' two halves at ``rows``
    (:meth:`~posstats.counting.window_groups.WindowGroups.halves`), without copying them."""
    rows = np.asarray(rows, dtype=np.int64)
    sums = []
    for half in groups.halves():
        c, occupancy = _row_totals(half)
        chosen = np.zeros(occupancy.size, dtype=bool)
        chosen[rows] = True
        sums.append((_pooled_totals(c, chosen), occupancy[rows]))
    (a, occ_a), (b, occ_b) = sums
    return a, b, occ_a, occ_b


def _modelled_excess(groups: Any, g: _Rows, /) -> ModelledExcess | None:
    """:class:`ModelledExcess` of the rows: in this process where the window groups are the
    corpus' two halves and hold every token (``halves_only`` or ``short_halves``), the rows
    not bucketed; held apart, where the counts' halves can be read (``g.half_sums``); else
    None."""
    if g.ranged:
        return None if g.half_sums is None else ModelledExcess(functools.partial(g.half_sums, g.index))
    if groups is None or g.buckets is not None or groups.groups < 2:
        return None
    if not (groups.halves_only or groups.short_halves):
        return None
    return ModelledExcess(functools.partial(half_sums_of_groups, groups, g.index))


def _standout(g: _Rows, rotated: RotatedDistances | None = None, modelled: ModelledExcess | None = None,
              /) -> dict[str, Any]:
    """The standout test (:func:`posstats.estimates.standout.standout_test`) of the rows: on the
    counts, or from the ranges' two reductions (pooled counts, distances to the pool). With
    ``rotated`` (usable window groups: :func:`_usable_window_groups`) each row's distance is
    taken less its mean excess in the rotated corpora: the documents' own variation, which
    the multinomial null leaves out; without, with ``modelled`` (the corpus' two halves), less
    that excess modelled (:func:`_modelled_excess`)."""
    if g.ranged:
        return standout_test(g.positions, g.occupancy, pooled_totals=g.pooled_totals,
                             distance_to=g.rows.distance_to, modelled=modelled)
    return standout_positions(g.rows, g.positions, rotated=rotated, modelled=None if rotated is not None else modelled)


def _usable_window_groups(groups: Any, counts: PositionalCounts, g: _Rows) -> tuple[Any, str | None]:
    """``(groups, None)`` when the null corpora can be rotated groups of windows: a corpus
    counted with its window groups, its rows neither bucketed nor held apart; else
    ``(None, why not)`` (the report's ``homogeneity.window_null``)."""
    if groups is None:
        return None, ("no window groups were counted (posstats count --window-groups K: in this process, or in steps "
                      "in truncate and chunk mode; count.json says why not)")
    if g.buckets is not None or g.ranged:
        return None, "the rows are bucketed or held apart"
    if groups.positions != counts.positions:
        return None, f"the window groups have {groups.positions} positions, the counts {counts.positions}"
    if groups.halves_only:
        return None, ("the counts keep only the two halves of their windows (posstats count keeps them above 4,096 "
                      "positions, for the rank test's edge), which no rotation may turn")
    if groups.rotated_share() == 0.0:
        return None, ("every counted token is in the window groups' unmoved tail (windows shorter than n, counted "
                      "before length classes): a rotation would move nothing")
    return groups, None


def _halves_window_groups(groups: Any, counts: PositionalCounts, g: _Rows) -> Any:
    """The window groups whose even and odd groups are halves for the rank test's edge
    (:class:`_HalvesEdges`): any counted with ``counts`` (the halves kept above 4,096
    positions included), the rows neither bucketed nor held apart; else None."""
    if groups is None or g.buckets is not None or g.ranged or groups.positions != counts.positions:
        return None
    return groups if groups.groups >= 2 else None
