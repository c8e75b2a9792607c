"""The rank test: how many MDS components stand above noise (shuffled, rotated or analytic
null; the edge measured on independent halves above 4,096 rows) and the report's ``null``
section (docs/calibration.md).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any

import numpy as np
import scipy.sparse as sp

from posstats.analysis.config import _NULL_SHUFFLE_LIMIT, AnalysisConfig
from posstats.analysis.rows import _Rows
from posstats.counting.counts import PositionalCounts, too_few_windows
from posstats.estimates.halves_edge import HalvesEdge, HalvesNoise, halves_noise
from posstats.estimates.null_rank import (
    NullRank,
    bias_shift,
    bulk_residual,
    mp_edge,
    null_rank,
    tested_bound_entry,
)
from posstats.estimates.occupancy import halves_pool_shift
from posstats.estimates.permutation import (
    WEIGHTING_FORMULA,
    null_distance_sums,
    occupancy_weights,
    permutation_null,
    rank_test_eigenvalues,
)
from posstats.estimates.ranged_halves import ranged_halves_noise
from posstats.estimates.rotation import rotation_null_corpora
from posstats.estimates.standout import _pooled_totals
from posstats.geometry.mds import MDSResult, weighted_coordinates
from posstats.progress import progress


def _null_choice(config: AnalysisConfig, m: int, noise: Any, *, halves_only: bool = False) -> str:
    """The null the analysis of ``m`` geometry rows draws: ``config.null``, with ``auto``
    resolved (the shuffled corpora up to :data:`_NULL_SHUFFLE_LIMIT` rows, else the analytic
    edge when a noise floor exists, else none). ``halves_only``: the counts keep only their
    windows' two halves (``posstats count`` above 4,096 positions), so no window can be
    rotated and shuffled corpora, which make every token independent, would be the only
    homogeneity null: under documents that differ they are liberal (documents resampled
    from the fortunes, 4,200 positions of which about 4,000 used: homogeneity rejected in 2
    of 2 corpora with no positional structure). ``auto`` then takes the edge measured on
    the halves at any m (docs/calibration.md, "Documents that differ")."""
    if config.null != "auto":
        return config.null
    if m <= _NULL_SHUFFLE_LIMIT and not (halves_only and noise is not None):
        return "shuffle"
    return "mp" if noise is not None else "none"


def _untested(config: AnalysisConfig, m: int, noise: Any, standout: dict[str, Any] | None,
              counts: PositionalCounts, *, halves_only: bool = False) -> str | None:
    """Why no test of the analysis can find positional structure, known before the
    geometry, or None. The verdict then ties every encoding whatever the MDS and the
    stresses come out as (:func:`posstats.estimates.verdict.all_tied`): without the shuffle
    null there is no homogeneity test, so non-stationarity rests on the standout test, and
    it found no position (or the verdict is withheld for too few windows)."""
    if _null_choice(config, m, noise, halves_only=halves_only) == "shuffle":
        return None
    withheld = too_few_windows(counts.spec.mode, counts.windows)
    if withheld:
        return f"the verdict is withheld: {withheld}"
    if standout is None or int(standout.get("count") or 0) > 0:
        return None
    return "no standout position, and no homogeneity test without the shuffle null"


def _noise_level(bias: np.ndarray | None, noise: Any, geo_parts: Any, config: AnalysisConfig,
                 m: int, *, untested: bool = False, edge: float | None = None,
                 halves_only: bool = False) -> tuple[float, float] | None:
    """``(level, residual)`` for the Lanczos MDS when the null is the analytic edge, known
    before the MDS: eigenvalues below ``level`` (the edge on the decomposed matrix's scale:
    plug-in, or shifted down by the mean bias for the corrected one) are sampling noise, and
    are computed to the absolute residual ``share x`` the analytic edge only
    (:func:`~posstats.estimates.null_rank.bulk_residual`), with share
    ``config.lanczos_noise_share`` (``untested_lanczos_noise_share`` when no test can find
    structure: :func:`_untested`); None (every pair to ``lanczos_tol``) otherwise.
    ``edge``: the edge measured on independent halves (:class:`_HalvesEdges`), else analytic."""
    share = config.untested_lanczos_noise_share if untested else config.lanczos_noise_share
    if not share:
        return None
    if _null_choice(config, m, noise, halves_only=halves_only) != "mp" or noise is None:
        return None
    analytic = mp_edge(geo_parts, noise)
    edge = analytic if edge is None else edge
    if not math.isfinite(edge) or edge <= 0:
        return None
    return edge - bias_shift(bias), bulk_residual(share, edge, analytic)


HALVES_MIN_COVERAGE = 0.9  # the halves' least share of a row's tokens for their edge to be used
DEFLATION_STEPS = 16  # components projected off the halves' noise at most; later ones meet the last edge


def halves_unusable(found: HalvesEdge, /) -> str | None:
    """Why the edge ``found`` on two halves is not used (the analytic one is), or None: the
    halves hold less than :data:`HALVES_MIN_COVERAGE` of some row's tokens, or fewer than
    two rows have tokens in both (its edge is not finite and positive)."""
    if found.coverage < HALVES_MIN_COVERAGE:
        return (f"the {found.source} hold {found.coverage:.0%} of some position's tokens (below "
                f"{HALVES_MIN_COVERAGE:.0%}: the rest, short windows or documents, is in neither half)")
    if not (math.isfinite(found.edge) and found.edge > 0):
        return f"the {found.source} leave fewer than two positions with tokens in both halves"
    return None


class _HalvesEdges:
    """The ``mp`` null's edge measured on two independent halves of the geometry rows
    (:func:`posstats.estimates.halves_edge.halves_edge`), unweighted and occupancy-weighted,
    each computed once when first asked for. The halves: the noise floor's parts (documents
    by parity, or a run store's shards: 0 + 2 against 1 + 3 with four), else the even and
    odd window groups; none (``edge`` returns None: the analytic edge is used) with
    ``mp_edge = analytic``, another null, rows held apart or neither source. With ``bias``
    (the bias-corrected eigenvalues are tested) the halves' noise is corrected alike
    (:func:`posstats.estimates.halves_edge.noise_top`), and the edge stated on the plug-in
    scale as the analytic one is (``shift``)."""

    def __init__(self, config: AnalysisConfig, g: _Rows, noise: Any, geo_parts: Any, groups: Any,
                 bias: np.ndarray | None) -> None:
        self._g, self._parts, self._groups, self._bias = g, geo_parts, groups, bias
        self._edges: dict[bool, HalvesEdge] = {}
        self.source: str | None = None
        self.no_source: str | None = None  # why no halves, where the analytic edge is the default's fallback
        self.seconds = 0.0  # spent measuring the edges
        self.released = False
        if (config.mp_edge == "auto" and noise is not None
                and _null_choice(config, len(g.index), noise, halves_only=g.halves_only) == "mp"):
            if g.ranged and g.halves is not None:
                self.source = "window groups"
            elif g.ranged:
                self.no_source = ("the rows are held apart in position ranges and the counts have no window groups "
                                  "(posstats count keeps their halves beside them; count.json says why not)")
            elif geo_parts is not None and len(geo_parts) in (2, 4):
                self.source = "parts"
            elif groups is not None:
                self.source = "window groups"
            else:
                self.no_source = ("no independent halves: the noise floor split the counted tokens at random, and the "
                                  "counts have no window groups (analyse with --reread, --store or --parts to measure "
                                  "the edge on documents by parity)")

    def _halves(self) -> tuple[sp.csr_array, sp.csr_array]:
        index = self._g.index
        every = index.size == self._g.geo.positions and bool(np.all(index == np.arange(index.size)))
        if self.source == "parts":
            mats = [sp.csr_array(p.matrix if every else p.matrix[index]) if p.is_sparse
                    else sp.csr_array(np.asarray(p.matrix)[index]) for p in self._parts]
            return (mats[0] + mats[2], mats[1] + mats[3]) if len(mats) == 4 else (mats[0], mats[1])
        return self._groups.halves(None if every else index)

    @functools.cached_property
    def _noise(self) -> HalvesNoise:
        """The halves' rescaled noise, once (none below :data:`HALVES_MIN_COVERAGE`), with
        the halves' analogue of the pool's shrinkage error where the tested rows have their
        occupancy shrinkage removed (:meth:`_pool_shifted`)."""
        if self._g.ranged:
            noise = ranged_halves_noise(self._g.halves, self._g.occupancy, np.diff(self._g.rows.edges),
                                        self._g.rows.shape[1], source=self.source, min_coverage=HALVES_MIN_COVERAGE)
            sums = self._g.half_sums(self._g.index)[:2] if self._g.half_sums is not None else None
            return self._pool_shifted(noise, sums)
        a, b = self._halves()
        noise = halves_noise(a, b, self._g.rows, source=self.source, min_coverage=HALVES_MIN_COVERAGE)
        every = np.ones(a.shape[0], dtype=bool)
        return self._pool_shifted(noise, (_pooled_totals(a, every), _pooled_totals(b, every)))

    def _pool_shifted(self, noise: HalvesNoise, sums: tuple[np.ndarray, np.ndarray] | None) -> HalvesNoise:
        """``noise`` with :func:`posstats.estimates.occupancy.halves_pool_shift` of the halves'
        ``sums`` (tokens per vocabulary entry) added where the tested eigenvalues are the
        bias-corrected ones, whose rows have their occupancy shrinkage removed under the
        pooled distribution (docs/calibration.md, "Documents that differ"); unchanged for
        plug-in eigenvalues, at equal occupancy or without the sums."""
        if self._bias is None or sums is None or noise.matrix is None:
            return noise
        shift = halves_pool_shift(self._g.occupancy, *sums)
        return noise if shift is None else noise.pool_shifted(*shift)

    def release(self) -> None:
        """Let the halves' noise go (the ranges' rows of it too) once the edges the
        analysis reads are measured; an edge not measured by then is not (analytic)."""
        noise = self.__dict__.pop("_noise", None)
        if noise is not None and hasattr(noise.matrix, "runner"):
            noise.matrix.runner.release()
        self.released = True

    def measured(self, weights: np.ndarray | None) -> HalvesEdge | None:
        """The :class:`HalvesEdge` for the ``weights`` (None: unweighted), or None."""
        if self.source is None:
            return None
        key = weights is not None
        if key not in self._edges and self.released:
            return None
        if key not in self._edges:
            t = time.perf_counter()
            self._edges[key] = self._noise.edge(weights, self._bias)
            self.seconds += time.perf_counter() - t
        found = self._edges[key]
        return found if halves_unusable(found) is None else None

    def not_used(self, weights: np.ndarray | None) -> str | None:
        """Why the halves were measured for the ``weights`` but the analytic edge is used,
        or None."""
        found = self._edges.get(weights is not None)
        return self.no_source if found is None else halves_unusable(found)

    def edge(self, weights: np.ndarray | None) -> float | None:
        """The edge for the ``weights``, or None (use the analytic one)."""
        found = self.measured(weights)
        return None if found is None else found.edge

    def deflated(self, first: HalvesEdge, tested: np.ndarray, vectors: np.ndarray | None,
                 weights: np.ndarray | None) -> list[HalvesEdge]:
        """The sequential test's edges (:meth:`HalvesNoise.deflated_edges
        <posstats.estimates.halves_edge.HalvesNoise.deflated_edges>`, at most
        :data:`DEFLATION_STEPS`) where the halves' noise is still held and the data's
        eigenvectors are known; else ``[first]`` (the whole noise' top bounds every
        component: conservative)."""
        if self.released or vectors is None or self._g.ranged:
            return [first]
        t = time.perf_counter()
        edges = self._noise.deflated_edges(tested, vectors, weights, self._bias, first=first, steps=DEFLATION_STEPS)
        self.seconds += time.perf_counter() - t
        return edges


def _edge_weights(config: AnalysisConfig, g: _Rows, noise: Any) -> np.ndarray | None:
    """The occupancy weights of the analytic edge's rank test
    (:func:`posstats.estimates.permutation.occupancy_weights`): None unless that null runs,
    occupancies differ and the noise floor can give the weighted edge (a token-split floor
    carries its weighted column noise; one from parts computes it)."""
    if _null_choice(config, len(g.index), noise, halves_only=g.halves_only) != "mp" or noise is None:
        return None
    if noise.column_noise is not None and noise.occupancy_column_noise is None:
        return None
    return occupancy_weights(g.occupancy)
_TESTED_SHOWN = 16  # occupancy-weighted eigenvalues the report lists beside the null's threshold
_RANK_TEST_K = 128  # occupancy-weighted eigenvalues the rank test computes at most (more above: saturated)


def _rank_test_k(computed: int, /) -> int:
    """How many occupancy-weighted eigenvalues the rank test computes: as many as the MDS
    gave, at most :data:`_RANK_TEST_K` (the count is then saturated, as when every computed
    MDS eigenvalue is above the threshold)."""
    return max(1, min(int(computed), _RANK_TEST_K))


_EIGEN_REPLICATE_ROWS = 1024  # above this many rows the rank test uses 19 of the shuffled corpora


def _eigen_replicates(m: int, replicates: int) -> int:
    """How many shuffled corpora get a top eigenvalue: all up to 1,024 rows, else at most 19
    (an m x m solve each; the rank test is then at level 5 %, its claims still gated by the
    homogeneity and standout tests, whose levels are unchanged)."""
    return replicates if m <= _EIGEN_REPLICATE_ROWS else min(replicates, 19)


@dataclasses.dataclass(frozen=True)
class _RankTest:
    """What one null decided, before the report's ``null`` entry is written from it.

    Attributes:
        rank: the rank test (:func:`posstats.estimates.null_rank.null_rank`).
        tested: the eigenvalues it compared with the null: the MDS's, or the
            occupancy-weighted ones where ``weights`` is not None.
        vectors: (m, k) eigenvectors of the weighted ones, else None.
        top_vector: (m,) the tested top component, or None.
        weights: the occupancy weights, None where the test is unweighted.
        scale: the ``tested`` eigenvalues' scale (``null.eigenvalue_scale``).
        entry: the null's own entries (shuffled or rotated: ``level``, ``null_corpora``;
            the edge: ``eigenvalue_shift``, ``edge``).
        homogeneity: the report's ``homogeneity`` section (shuffled or rotated null), else None.
        distance_noise: ``null.distance_noise`` (shuffled or rotated null with the exact
            path's distances), else None.
    """

    rank: NullRank
    tested: np.ndarray
    vectors: np.ndarray | None
    top_vector: np.ndarray | None
    weights: np.ndarray | None
    scale: str
    entry: dict[str, Any]
    homogeneity: dict[str, Any] | None = None
    distance_noise: dict[str, Any] | None = None


def _resampled_test(
    mds: MDSResult,
    bias: np.ndarray | None,
    g: _Rows,
    config: AnalysisConfig,
    show_progress: bool | None,
    *,
    distances: np.ndarray | None,
    windows: tuple[Any, str | None],
    shrinkage: Any,
    rank_test: tuple[np.ndarray, np.ndarray] | None,
    rotated_statistics: np.ndarray | None = None,
) -> _RankTest:
    """The rank test and the test of homogeneity against null corpora: shuffled
    (:mod:`posstats.estimates.permutation`) or, with usable window groups (``windows =
    (groups, None)``; else ``(None, why not)``), rotated (:mod:`posstats.estimates.rotation`).
    Where occupancies differ the rank test reads the occupancy-whitened Gram matrix
    (``rank_test`` when the geometry computed its eigenpairs, else computed here). With the
    exact path's ``distances``, the share of their sum that sampling noise reaches, from
    shuffled corpora: the rotated null's carry the structure they move, so they get shuffled
    corpora of their own, as does a shuffle null that stopped once decided."""
    m = len(g.index)
    adjust = {"shrinkage": shrinkage} if shrinkage is not None else {}
    lam = np.asarray(mds.eigenvalues, dtype=np.float64)
    groups, why_not = windows
    weights = occupancy_weights(g.occupancy)  # None at equal occupancy
    options = {"replicates": config.null_replicates, "corrected": bias is not None, "seed": config.seed,
               "eigen_replicates": _eigen_replicates(m, config.null_replicates), "weights": weights}
    what = "rotated corpora" if groups is not None else "shuffled corpora"
    shuffled_sums = groups is not None and distances is not None  # the noise share's own shuffled corpora
    total = config.null_replicates + (options["eigen_replicates"] if shuffled_sums else 0)
    vectors = None
    top_vector = mds.encoding[:, 0] if mds.encoding.shape[1] else None
    if weights is None:
        tested = lam
    else:  # the exact path's, from its distance matrix (formed once), else from the rows
        tested, vectors = rank_test if rank_test is not None else rank_test_eigenvalues(
            g.rows, corrected=bias is not None, k=_rank_test_k(lam.size), weights=weights, **adjust)
        top_vector = vectors[:, 0]
    # null corpora are solved until one reaches the data's top: then no component can count
    options["stop_at"] = float(np.max(tested)) if np.size(tested) else None
    with progress(total=total, desc=what, unit="corpus", enabled=show_progress) as bar:
        if groups is not None:
            perm = rotation_null_corpora(groups, g.rows, rows=g.index, progress=bar.update,
                                         statistics=rotated_statistics, **options, **adjust)
        else:
            perm = permutation_null(g.rows, progress=bar.update, **options, **adjust)
            if perm.eigen_planned is not None and distances is not None:
                # the solved shuffled corpora are too few for the noise share: draw its own
                shuffled_sums = True
                bar.total += options["eigen_replicates"]
                bar.refresh()
        if shuffled_sums:
            noise_sums = null_distance_sums(g.rows, replicates=options["eigen_replicates"],
                                            corrected=bias is not None, seed=config.seed,
                                            max_rows=_EIGEN_REPLICATE_ROWS, progress=bar.update, **adjust)
    nr = null_rank(tested, method="shuffle", permutation=perm)
    homogeneity = {
        "method": "permutation" if groups is None else "rotation",
        **({"window_groups": int(groups.groups), "rotated_share": groups.rotated_share()}
           if groups is not None else {}),
        **({"window_null": why_not} if why_not else {}),
        "statistic": perm.homogeneity,
        "statistic_formula": "S = sum_i N_i d_H^2(mu_hat_i, pooled), plug-in",
        "null_max": float(np.max(perm.null_homogeneity)),
        "p_value": perm.homogeneity_p_value,
        "replicates": perm.replicates,
        "level": perm.level(),
        "rejected": bool(perm.homogeneity > np.max(perm.null_homogeneity)),
    }
    distance_noise = None
    if distances is not None:
        distance_noise = (_distance_noise_entry(noise_sums, distances, rows_per_replicate=min(m, _EIGEN_REPLICATE_ROWS))
                          if shuffled_sums else _distance_noise_entry(perm.null_distance_sums, distances))
    return _RankTest(
        rank=nr, tested=tested, vectors=vectors, top_vector=top_vector, weights=weights,
        scale="bias_corrected" if bias is not None else "plugin",
        entry={"level": 1.0 / (nr.replicates + 1), "null_corpora": "rotated" if groups is not None else "shuffled"},
        homogeneity=homogeneity, distance_noise=distance_noise,
    )


def _edge_test(
    mds: MDSResult,
    bias: np.ndarray | None,
    noise: Any,
    g: _Rows,
    geo_parts: Any,
    *,
    rank_test: tuple[np.ndarray, np.ndarray] | None,
    halves: _HalvesEdges | None,
) -> _RankTest:
    """The rank test against the edge of the noise bulk (``mp``): measured on independent
    halves (``halves``) where they are usable, else the analytic bound. Where occupancies
    differ the geometry computed the weighted eigenpairs (``rank_test``) and the edge is
    weighted alike. With ``bias`` the tested eigenvalues are bias-corrected and are
    compared on the edge's plug-in scale: ``B_c = B - H diag(b) H`` shifts the spectrum
    down by about ``mean(b)`` (``mean(w_i b_i)`` weighted), which is added back."""
    weights = occupancy_weights(g.occupancy) if rank_test is not None else None
    tested, vectors = rank_test if weights is not None else (np.asarray(mds.eigenvalues, dtype=np.float64), None)
    scale, shift = "plugin", 0.0
    if bias is not None:
        shift = bias_shift(bias, weights)
        scale = "corrected + mean bias"
    measured = None if halves is None else halves.measured(weights)
    edges = [] if measured is None else halves.deflated(measured, tested, _unit_vectors(mds, vectors), weights)
    threshold = None
    if edges:  # sequential: the j-th component against the noise off the j - 1 before it
        j = 0
        while j < tested.size and tested[j] + shift > edges[min(j, len(edges) - 1)].edge:
            j += 1
        threshold = edges[min(j, len(edges) - 1)].edge
    nr = null_rank(tested + shift, method="mp", parts=geo_parts, floor=noise, weighted=weights is not None,
                   threshold=threshold)
    entry: dict[str, Any] = {"eigenvalue_shift": shift} if bias is not None else {}  # threshold - shift: the
    # level on the corrected eigenvalues' scale (the report keeps them on their own scale)
    entry["edge"] = measured.to_dict() if measured is not None else {"method": "analytic"}
    if len(edges) > 1:
        entry["edge"]["deflated"] = [{"components_off": e.deflated, "noise_top": e.noise_top, "edge": e.edge}
                                     for e in edges[1:]]
    why = None if halves is None else halves.not_used(weights)
    if why:
        entry["edge"]["halves_not_used"] = why
    return _RankTest(rank=nr, tested=tested, vectors=vectors, top_vector=None if vectors is None else vectors[:, 0],
                     weights=weights, scale=scale, entry=entry)


def _unit_vectors(mds: MDSResult, vectors: np.ndarray | None) -> np.ndarray | None:
    """(m, k) orthonormal eigenvectors of the tested eigenvalues: the weighted test's
    ``vectors``, else the MDS's (its encoding's columns of positive eigenvalues, normed:
    ``P = U diag(sqrt(lambda))``); None when there are none."""
    if vectors is not None:
        return vectors
    lam = np.asarray(mds.eigenvalues, dtype=np.float64)
    k = int(np.count_nonzero(lam > 0))
    if not k:
        return None
    p = np.asarray(mds.encoding[:, :k], dtype=np.float64)
    return p / np.linalg.norm(p, axis=0)


def _weighting_entries(test: _RankTest, mds: MDSResult, occupancy: np.ndarray,
                       rank_test_bound: float | None) -> tuple[dict[str, Any], np.ndarray | None]:
    """``(entries, weighted)``: the ``null`` entries on the occupancy weighting and on where
    the tested and the counted components load, and where the test was weighted and counts
    components, their (m, k) occupancy-weighted coordinates
    (:func:`posstats.geometry.mds.weighted_coordinates`), else None."""
    out: dict[str, Any] = {"weighting": "occupancy" if test.weights is not None else "none"}
    tested, weights, counted = test.tested, test.weights, int(test.rank.components_above_null)
    if weights is not None:  # the threshold is on this scale, not the spectrum's
        out["tested_eigenvalues"] = [float(x) for x in tested[:_TESTED_SHOWN]]
        out["weighting_formula"] = WEIGHTING_FORMULA
        out["weights_ratio"] = float(np.max(weights) / np.min(weights))  # max(w) / min(w): how unequal
        if rank_test_bound is not None:  # not solved: bounds from the unweighted MDS, all below the edge
            out["tested_bound"] = tested_bound_entry(rank_test_bound)
    if test.top_vector is not None and tested.size and tested[0] > 0:  # the tested top component's
        out["top_component_occupancy"] = _loaded_occupancy(test.top_vector, occupancy)
        out["median_occupancy"] = float(np.median(occupancy))
    weighted = None
    if weights is not None and counted:
        # the MDS (unweighted) components the verdict's count stands for: where each loads
        # (a leading component on thin positions is their noise, not the structure tested)
        k = min(counted, mds.encoding.shape[1], _TESTED_SHOWN)
        out["mds_component_occupancy"] = [_loaded_occupancy(mds.encoding[:, j], occupancy) for j in range(k)]
        out["median_occupancy"] = float(np.median(occupancy))
        # the components that test counted, as coordinates (what an export writes where the
        # MDS's leading components are thin positions' noise: posstats.reports.export)
        counted = min(counted, test.vectors.shape[1])
        weighted = weighted_coordinates(test.vectors[:, :counted], np.asarray(tested[:counted]), weights)
        out["weighted_mds_components"] = counted
    return out, weighted


def _null_section(
    mds: MDSResult,
    bias: np.ndarray | None,
    noise: Any,
    g: _Rows,
    geo_parts: Any,
    config: AnalysisConfig,
    timings: dict[str, float],
    show_progress: bool | None,
    *,
    distances: np.ndarray | None = None,
    windows: tuple[Any, str | None] = (None, None),
    shrinkage: Any = None,
    rank_test: tuple[np.ndarray, np.ndarray] | None = None,
    halves: _HalvesEdges | None = None,
    rank_test_bound: float | None = None,
    rotated_statistics: np.ndarray | None = None,
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, np.ndarray | None]:
    """``(null, homogeneity, weighted)``: the report sections, how many MDS components stand
    above a null (:func:`posstats.estimates.null_rank.null_rank`) and, from the same null
    corpora, the test of homogeneity (None without them): against shuffled or rotated
    corpora (:func:`_resampled_test`) or the edge of the noise bulk (:func:`_edge_test`),
    as :func:`_null_choice` says. ``rank_test``: the data's occupancy-weighted eigenvalues
    and eigenvectors when the geometry computed them (the exact path from its distance
    matrix; the sampled path, for the analytic edge, by Lanczos on its operator).
    ``rank_test_bound``: ``max(w) / min(w)`` where the weighted eigenvalues are the MDS's
    times ``max(w)``, upper bounds that decided the test
    (:func:`posstats.estimates.null_rank.bounded_rank_test`). ``weighted``: where the test
    was weighted and counts components, their (m, k) coordinates
    (:func:`posstats.geometry.mds.weighted_coordinates`), else None. ``rotated_statistics``:
    the homogeneity statistics of the rotated corpora the standout test already formed
    (:meth:`posstats.analysis.rows.RotatedDistances.homogeneity_statistics`), or None."""
    choice = _null_choice(config, len(g.index), noise, halves_only=g.halves_only)
    if choice == "none":
        return None, None, None
    if choice == "mp" and noise is None:
        return {"method": "mp", "components_above_null": None, "note": "no noise floor"}, None, None
    t = time.perf_counter()
    if choice == "shuffle":
        test = _resampled_test(mds, bias, g, config, show_progress, distances=distances, windows=windows,
                               shrinkage=shrinkage, rank_test=rank_test, rotated_statistics=rotated_statistics)
    else:
        test = _edge_test(mds, bias, noise, g, geo_parts, rank_test=rank_test, halves=halves)
    timings["null"] = time.perf_counter() - t
    weighting, weighted = _weighting_entries(test, mds, g.occupancy, rank_test_bound)
    out = {**test.rank.to_dict(), "eigenvalue_scale": test.scale, **test.entry, **weighting}
    if test.distance_noise is not None:
        out["distance_noise"] = test.distance_noise
    return out, test.homogeneity, weighted


def _loaded_occupancy(column: np.ndarray, occupancy: np.ndarray) -> float:
    """The median occupancy of the positions an MDS component loads on: the occupancy
    median weighted by the component's squared loadings (a component on thinly occupied
    positions, whose sampling noise is large, has a low one; the verdict's caveat reads it)."""
    order = np.argsort(occupancy, kind="stable")
    weight = np.cumsum(np.asarray(column, dtype=np.float64)[order] ** 2)
    return float(np.asarray(occupancy)[order][min(int(np.searchsorted(weight, 0.5 * weight[-1])), order.size - 1)])


def _distance_noise_entry(null_sums: np.ndarray, distances: np.ndarray, *,
                          rows_per_replicate: int | None = None) -> dict[str, Any]:
    """The ``null.distance_noise`` entry: the data's summed pairwise distances, the mean sum
    of shuffled corpora (stationary, same occupancies, same estimator; ``null_sums``) and
    their ratio, the share of the distances that sampling noise alone reaches
    (:meth:`posstats.estimates.permutation.PermutationNull.distance_noise_share`).
    ``rows_per_replicate``: the rows of each shuffled corpus its sum was estimated from
    (:func:`posstats.estimates.permutation.null_distance_sums`), when they were drawn apart
    from the tests' null corpora."""
    data = float(np.sum(distances, dtype=np.float64)) / 2.0  # symmetric, zero diagonal: the sum over i < j
    share = float(np.mean(null_sums)) / data if null_sums.size and data > 0 else None
    return {
        "data_sum": data,
        "null_mean_sum": float(np.mean(null_sums)),
        "replicates": int(null_sums.size),
        "null_corpora": "shuffled",
        **({"rows_per_replicate": int(rows_per_replicate)} if rows_per_replicate is not None else {}),
        "share": share,
    }
