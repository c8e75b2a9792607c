"""The exact path (up to 4,096 positions by default): the full distance matrix, its
correction, classical MDS, and every encoding scored on all pairs.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from posstats.analysis.config import AnalysisConfig, encoding_jobs
from posstats.analysis.null import _rank_test_k
from posstats.analysis.rows import _Geometry, _Rows
from posstats.analysis.scoring import _evaluate
from posstats.analysis.sections import _HELLINGER_CONVENTION, _off_diagonal, _summary
from posstats.estimates.noise import corrected_squared_distances
from posstats.estimates.null_rank import first_then_all
from posstats.estimates.occupancy import OccupancyShrinkage
from posstats.estimates.permutation import (
    occupancy_weights,
    top_eigenpairs,
    weighted_gram,
)
from posstats.estimates.replicates import in_replicate_order, replicates_in_flight
from posstats.geometry.diagnostics import corpus_diagnostics
from posstats.geometry.hellinger import hellinger_sq
from posstats.geometry.mds import MDSResult, classical_mds
from posstats.progress import progress


def _corrected(d2: np.ndarray, bias: np.ndarray, rows: Any) -> tuple[np.ndarray, dict[str, Any], Any]:
    """Bias-corrected ``d_H = sqrt(max(D' - b_i - b_j, 0))`` (m, m) with ``D'`` the plug-in
    ``d2`` with the square roots' occupancy shrinkage removed, **in place**
    (:mod:`posstats.estimates.occupancy`; no change where every occupancy is equal); the
    ``hellinger`` report entry of both the plug-in and the corrected distances; and the
    rows' :class:`~posstats.estimates.occupancy.OccupancyShrinkage` (None: equal occupancies)."""
    plugin = _summary(np.sqrt(_off_diagonal(d2)))
    shrinkage = OccupancyShrinkage.of(rows)
    if shrinkage is not None:
        d2 += shrinkage.adjustment(rows)
    distances = np.sqrt(corrected_squared_distances(d2, bias))
    summary = {
        "convention": _HELLINGER_CONVENTION,
        **plugin,
        **_summary(_off_diagonal(distances), "corrected_"),
        "occupancy_adjusted": shrinkage is not None,  # False: every occupancy equal, nothing to remove
    }
    return distances, summary, shrinkage


def _exact_mds(rows: Any, d2: np.ndarray, bias: np.ndarray | None, config: AnalysisConfig, *,
               dense: bool = False) -> MDSResult:
    """Classical MDS of the m geometry rows: dense from ``D = d2`` (``mds_method`` dense, or
    auto with m <= 2048), else top-``max(dims)`` by ARPACK, or by block Lanczos when
    bias-corrected (ARPACK's path has no bias correction). ``dense``: ``d2`` holds what the
    rows' square roots alone do not (the occupancy adjustment), so the top-``max(dims)``
    pairs come from it by the dense solver whatever m."""
    m = d2.shape[0]
    method = config.mds_method
    if method == "dense" or (method == "auto" and m <= 2048):
        return classical_mds(rows, k=None, method="dense", seed=config.seed, tol=1e-10, diagonal=bias, squared_distances=d2)
    if dense:
        return classical_mds(rows, k=min(max(config.dims), m), method="dense", seed=config.seed, tol=1e-10,
                             diagonal=bias, squared_distances=d2)
    if method == "auto":
        method = "iterative"
    if bias is not None and method == "iterative":
        method = "lanczos"
    tol = config.lanczos_tol if method == "lanczos" else 1e-10
    return classical_mds(rows, k=min(max(config.dims), m), method=method, seed=config.seed, tol=tol, diagonal=bias)


def _corpus_diagnostics_entry(distances: np.ndarray, positions: np.ndarray, config: AnalysisConfig) -> dict[str, Any]:
    """The ``diagnostics`` report entry from the (m, m) d_H: H1 (minimum distance, its pair
    of positions, non-stationarity) and A3 (the corpus' own monotonicity)."""
    diag = corpus_diagnostics(distances, positions=positions, exact_limit=config.monotonicity_exact_limit, seed=config.seed)
    return {
        "h1": {
            "min_distance": float(diag.min_distance),
            "pair": [int(positions[diag.pair[0]]), int(positions[diag.pair[1]])],
            "nonstationary": bool(diag.nonstationary),
        },
        "a3": diag.monotonicity.to_dict(),
    }


# Bytes one encoding's scoring holds at its peak, an upper figure: the stress's row blocks
# of up to 2**23 pairs (the distances, their upper triangle's values and differences, the
# moments' temporaries: six float64 arrays, 384 MiB), the monotonicity count's blocks of
# 2**21 cells (about 90 bytes a cell: 180 MiB) or SMACOF's (2,048, 2,048) tiles (96 MiB).
_SCORING_BYTES = 512 * 2**20


def _encodings_in_flight(jobs: int, /) -> int:
    """How many encodings are scored at once on threads: one per core the process may use
    and as many as fit in the memory available at :data:`_SCORING_BYTES` each
    (:func:`posstats.estimates.replicates.replicates_in_flight`). Each score is computed
    as in a loop, reads the shared distances only, and is handed back in job order, so the
    entries are the loop's (numpy's kernels release the GIL: on 2 cores, the 18 default
    scores of m = 4,096 rows took 25.4 s against 39.8 s; more cores, more at once)."""
    return replicates_in_flight(_SCORING_BYTES, replicates=int(jobs))


def _exact_encodings(
    distances: np.ndarray, mds: MDSResult, g: _Rows, config: AnalysisConfig, show_progress: bool | None
) -> list[dict[str, Any]]:
    """One report entry per (width, encoding): exact stress over all m (m - 1) / 2 pairs."""
    m = len(g.positions)
    results = []
    jobs = encoding_jobs(config, m)

    def evaluate(r: int, _: Any) -> dict[str, Any]:
        dim, spec = jobs[r]
        return _evaluate(spec, g.positions, dim, distances, mds, config, g.occupancy, g.context)

    with progress(total=len(jobs), desc="encodings", unit="enc", enabled=show_progress) as bar:
        for _, entry in in_replicate_order(evaluate, len(jobs), in_flight=_encodings_in_flight(len(jobs))):
            entry.update(
                stress_method="exact",
                stress_ci95=[entry["stress"], entry["stress"]],
                scaled_stress_ci95=[entry["scaled_stress"], entry["scaled_stress"]],
                stress_pairs=m * (m - 1) // 2,
            )
            results.append(entry)
            bar.update(1)
    return results


def _exact_geometry(
    g: _Rows, bias: np.ndarray | None, config: AnalysisConfig, timings: dict[str, float], show_progress: bool | None,
    *, rank_test: bool = False, edge_level: tuple[float, float] | None = None,
) -> _Geometry:
    """The geometry up to ``exact_limit`` rows: ``D = hellinger_sq(rows)`` once, shared by
    the MDS (dense path), the stress, the diagnostics and, with ``rank_test`` (a null will
    run) where occupancies differ, the rank test's occupancy-weighted eigenvalues
    (:func:`posstats.estimates.permutation.weighted_gram`, then ``top_eigenpairs``; with
    the analytic edge's ``edge_level``, :func:`posstats.estimates.null_rank.edge_decision_level`,
    only as many as the count needs: :func:`posstats.estimates.null_rank.first_then_all`)."""
    t = time.perf_counter()
    d2 = hellinger_sq(g.rows)
    corrected, summary, shrinkage = _corrected(d2, bias, g.rows) if bias is not None else (None, None, None)
    timings["hellinger"] = time.perf_counter() - t

    t = time.perf_counter()
    mds = _exact_mds(g.rows, d2, bias, config, dense=shrinkage is not None)
    timings["mds"] = time.perf_counter() - t
    weights = occupancy_weights(g.occupancy) if rank_test else None
    tested = None
    if weights is not None:  # from D (D' with a correction) as the null corpora's: in place when not kept
        t = time.perf_counter()
        source = d2 if corrected is not None else d2.copy()
        full = _rank_test_k(mds.eigenvalues.size)
        gram = weighted_gram(source, bias, weights)  # in place
        tested = first_then_all(lambda k: top_eigenpairs(gram, k=k), full,
                                 None if edge_level is None else edge_level[0])
        del source, gram
        timings["rank_test_eigenvalues"] = time.perf_counter() - t
    # after the MDS, which read D; with a correction the plug-in matrix is not kept
    distances = corrected if corrected is not None else np.sqrt(d2, out=d2)
    del d2

    t = time.perf_counter()
    diagnostics = _corpus_diagnostics_entry(distances, g.positions, config)
    timings["corpus_diagnostics"] = time.perf_counter() - t

    t = time.perf_counter()
    flat = not np.any(distances)
    results = [] if flat else _exact_encodings(distances, mds, g, config, show_progress)
    timings["encodings"] = time.perf_counter() - t
    return _Geometry(mds, diagnostics, results, summary, distances, flat=flat, occupancy_adjusted=bias is not None,
                     shrinkage=shrinkage, rank_test=tested)
