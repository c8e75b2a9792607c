"""The long-context path: Lanczos MDS on the square-root rows (on the host or a GPU) and
encodings scored on sampled pairs and triples.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.spatial import cKDTree

from posstats.analysis.config import AnalysisConfig, encoding_jobs
from posstats.analysis.null import _rank_test_k
from posstats.analysis.rows import _Geometry, _Rows
from posstats.analysis.scoring import _details_entry
from posstats.analysis.sections import _HELLINGER_CONVENTION, _mean_interval
from posstats.errors import OptionError, PosstatsError
from posstats.estimates.null_rank import bounded_rank_test, first_then_all
from posstats.estimates.occupancy import OccupancyShrinkage
from posstats.estimates.pair_jackknife import draw_jackknife_pairs
from posstats.estimates.sampled import SampledGeometry
from posstats.geometry.backend import get_cupy, gpu_available
from posstats.geometry.diagnostics import monotonicity_of_encoding
from posstats.geometry.encodings import family_of, make_encoding
from posstats.geometry.mds import MDSResult, classical_mds, weighted_gram_eigenpairs
from posstats.geometry.sqrt_operator import shifted_operator, sqrt_operator
from posstats.progress import progress


def _sampled_encodings(g: _Rows, mds: MDSResult, config: AnalysisConfig) -> list[tuple[int, Any]]:
    """Every (width, encoding) of the config built on the m rows; SMACOF is refused (it
    needs the n x n distances)."""
    m = len(g.positions)
    encodings = []
    for dim, spec in encoding_jobs(config, m):
        if "distances" in family_of(spec).needs:
            msg = f"{spec}: SMACOF needs the n x n distances; not available above the exact limit ({m} > {config.exact_limit} rows)"
            raise PosstatsError(msg)
        encodings.append((dim, make_encoding(spec, g.positions, dim, mds=mds, occupancy=g.occupancy, context=g.context)))
    return encodings


def _triples(config: AnalysisConfig, *, untested: bool) -> tuple[int, int]:
    """(corpus, encoding) triples of the sampled monotonicity: ``config.corpus_triples`` and
    ``config.encoding_triples``, at most ``config.untested_triples`` when no test can find
    structure (:func:`_untested`: the figures are then descriptive)."""
    if not untested:
        return config.corpus_triples, config.encoding_triples
    return min(config.corpus_triples, config.untested_triples), min(config.encoding_triples, config.untested_triples)


def _sampled_diagnostics(sampled: SampledGeometry, positions: np.ndarray, config: AnalysisConfig, *,
                         triples: int) -> dict[str, Any]:
    """The ``diagnostics`` entry from sampled pairs (H1: an upper bound) and ``triples``
    sampled triples (A3)."""
    value, pair = sampled.min_sampled()
    mono = sampled.monotonicity(positions=positions, samples=triples, seed=config.seed)
    return {
        "h1": {
            "min_distance": value,
            "pair": [int(positions[pair[0]]), int(positions[pair[1]])],
            "nonstationary": bool(value > 0.0),
            "method": "sampled_upper_bound",
        },
        "a3": mono.to_dict(),
    }


def _sampled_hellinger_entry(sampled: SampledGeometry, *, corrected: bool) -> dict[str, Any]:
    """The ``hellinger`` report entry from the sampled pairs' d_H, with the 95 % interval of
    their mean from sampling the pairs (``mean_pairs_ci95``: not the token noise, nor the
    bias of near-zero corrected distances; not an interval on the true mean)."""
    h = sampled.h
    lo, hi = _mean_interval(h)
    return {
        "convention": _HELLINGER_CONVENTION,
        "method": "sampled",
        "pairs": int(h.size),
        "min": float(h.min()),
        "mean": float(h.mean()),
        "mean_pairs_ci95": [lo, hi],
        "max": float(h.max()),
        "distances": "bias_corrected" if corrected else "plugin",
    }


def _sampled_entry(dim: int, enc: Any, st: Any, sampled: SampledGeometry, positions: np.ndarray, config: AnalysisConfig,
                   *, triples: int) -> dict[str, Any]:
    """The report entry of one encoding on the sampled path: stress ``st`` with its 95 %
    intervals, separation (exact or an upper bound) and monotonicity (``triples`` sampled
    triples above ``config.monotonicity_exact_limit`` rows)."""
    sep_value, sep_pair, sep_method = _large_min_separation(enc.matrix, sampled)
    mono = monotonicity_of_encoding(enc.matrix, positions=positions, exact_limit=config.monotonicity_exact_limit,
                                  samples=triples, seed=config.seed)
    return {
        "name": enc.name,
        "dim": int(dim),
        "stress": st.stress,
        "scaled_stress": st.scaled_stress,
        "scale": st.scale,
        "pearson": st.pearson,
        "min_separation": sep_value,
        "min_separation_pair": [int(positions[sep_pair[0]]), int(positions[sep_pair[1]])],
        "monotonicity_violation_rate": mono.rate,
        "monotonicity_method": mono.method,
        "monotonicity_ci95": [mono.ci_low, mono.ci_high],
        "stress_method": "sampled",
        "stress_ci95": list(st.stress_ci95),
        "scaled_stress_ci95": list(st.scaled_stress_ci95),
        # the error of sampling pairs alone (the corpus' own sampling noise is added by the
        # stress intervals' jackknife, which replaces the two above); the optimal scale and
        # Pearson r have only these (not intervals on their truth: docs/calibration.md)
        "stress_pairs_ci95": list(st.stress_ci95),
        "scaled_stress_pairs_ci95": list(st.scaled_stress_ci95),
        "scale_pairs_ci95": list(st.scale_ci95),
        "pearson_pairs_ci95": list(st.pearson_ci95),
        "stress_pairs": st.pairs,
        "stress_interval": ("sampled pairs: the 95 % interval covers the error of sampling pairs, not the corpus' own "
                            "sampling noise (docs/calibration.md)"),
        "min_separation_method": sep_method,
        **_details_entry(enc),
    }


def mds_device(choice: str, /) -> Any:
    """The array namespace of the long-context Lanczos products for ``device=choice``:
    cupy for ``gpu`` (refused in one line when cupy or a CUDA device is missing) and for
    ``auto`` when :func:`~posstats.geometry.backend.gpu_available`, else None (the host)."""
    if choice == "cpu" or (choice == "auto" and not gpu_available()):
        return None
    try:
        cp = get_cupy()
    except ImportError as exc:
        raise OptionError(f"{{device}} gpu: {exc}") from None
    if not gpu_available():
        raise OptionError("{device} gpu: cupy is installed but no CUDA device answers (auto or cpu runs on the host)")
    return cp


def _lanczos_mds(products: Any, bias: np.ndarray | None, m: int, config: AnalysisConfig,
                 show_progress: bool | None, *, noise_level: tuple[float, float] | None, gpu: Any) -> MDSResult:
    """Classical MDS of the ``m`` rows by Lanczos on their square-root ``products``
    (:func:`posstats.geometry.mds.classical_mds`, ``diagonal=bias``), the top
    ``max(config.dims)`` eigenpairs; with a ``noise_level`` (level, residual) those inside
    the noise bulk only to its residual. ``gpu``: cupy, where the products run on the device."""
    with progress(desc=f"MDS (Lanczos{', GPU' if gpu else ''})", unit="products", enabled=show_progress) as bar:

        def report(done: int, residual: float) -> None:
            bar.update(done - bar.n)
            bar.set_postfix_str(f"residual {residual:.1e} (target {config.lanczos_tol:.0e})", refresh=False)

        level, residual = noise_level if noise_level is not None else (None, None)
        return classical_mds(products, k=min(max(config.dims), m - 1), method="lanczos", tol=config.lanczos_tol,
                             seed=config.seed, diagonal=bias, progress=report, noise_level=level,
                             noise_residual=residual, xp=gpu)


def _weighted_rank_test(
    products: Any, mds: MDSResult, bias: np.ndarray | None,
    rank_test: tuple[np.ndarray, tuple[float, float] | None], config: AnalysisConfig, show_progress: bool | None,
) -> tuple[tuple[np.ndarray, np.ndarray], float | None]:
    """``((eigenvalues, eigenvectors), bound)`` the analytic edge's rank test reads: of the
    occupancy-whitened operator, by Lanczos on the MDS's ``products``
    (:func:`posstats.geometry.mds.weighted_gram_eigenpairs`, as many as the count needs:
    :func:`posstats.estimates.null_rank.first_then_all`), ``bound`` None; or, where the
    weights are equal to 1 % (pack mode) and the MDS's top eigenvalue bounds them below the
    level, the bounds from the MDS (:func:`posstats.estimates.null_rank.bounded_rank_test`),
    ``bound`` the weights' ratio. ``rank_test``: ``(weights, (level, residual) or None)``."""
    weights, (w_level, w_residual) = rank_test[0], rank_test[1] or (None, None)
    bounded = None if w_level is None else bounded_rank_test(mds.eigenvalues, mds.residuals, mds.encoding,
                                                              weights, w_level)
    if bounded is not None:
        return bounded[:2], bounded[2]
    with progress(desc="rank test (occupancy-weighted Lanczos)", unit="products", enabled=show_progress) as bar:
        before = [0]

        def solve(k: int) -> tuple[np.ndarray, np.ndarray]:
            out = weighted_gram_eigenpairs(products, weights, k=k, diagonal=bias, tol=config.lanczos_tol,
                                           seed=config.seed, noise_level=w_level, noise_residual=w_residual,
                                           progress=lambda done, _: bar.update(before[0] + done - bar.n))
            before[0] = bar.n
            return out

        return first_then_all(solve, _rank_test_k(mds.eigenvalues.size), w_level), None


def _sampled_geometry(
    g: _Rows, bias: np.ndarray | None, config: AnalysisConfig, timings: dict[str, float], show_progress: bool | None,
    *, noise_level: tuple[float, float] | None = None, untested: bool = False,
    rank_test: tuple[np.ndarray, tuple[float, float] | None] | None = None,
) -> _Geometry:
    """The geometry above ``exact_limit``: no m x m matrix (see :func:`analyze`). With a
    ``noise_level`` (:func:`_noise_level`), the eigenpairs inside the noise bulk are
    computed to its residual only. ``untested`` (:func:`_untested`): the stresses are drawn
    to ``config.untested_stress_halfwidth``. ``rank_test``: ``(weights, noise level)`` when
    the analytic edge will test occupancy-weighted eigenvalues: they are computed here, by
    Lanczos on the MDS's own operator
    (:func:`posstats.geometry.mds.weighted_gram_eigenpairs`), or, where the weights are
    equal to 1 % and the MDS's top eigenvalue bounds them below the level, bounded from it
    (:func:`posstats.estimates.null_rank.bounded_rank_test`; ``rank_test_bound`` the
    weights' ratio)."""
    m = len(g.positions)
    t = time.perf_counter()
    # the corrected distances have the square roots' occupancy shrinkage removed, as on the
    # exact path (posstats.estimates.occupancy): the Lanczos products on the host, through
    # the low-rank shift of the operator (rows held apart too: from their totals)
    shrinkage = None if bias is None else OccupancyShrinkage.from_totals(g.occupancy, g.column_totals())
    op = sqrt_operator(g.rows) if sp.issparse(g.rows) else g.rows  # one square-root representation, shared
    gpu = None if g.ranged or shrinkage is not None else mds_device(config.device)
    products = op.to_device(gpu) if gpu is not None and op is not g.rows else op  # a dense input moves in classical_mds
    if shrinkage is not None:
        base = op if op is not g.rows or g.ranged else sqrt_operator(g.rows)  # a dense input gets its operator here
        products = shifted_operator(base, shrinkage.weights(g.occupancy), shrinkage.shrinkage)
    mds = _lanczos_mds(products, bias, m, config, show_progress, noise_level=noise_level, gpu=gpu)
    timings["mds"] = time.perf_counter() - t
    tested, bound = None, None
    if rank_test is not None:  # the same operator, whitened by the occupancy weights
        t = time.perf_counter()
        tested, bound = _weighted_rank_test(products, mds, bias, rank_test, config, show_progress)
        timings["rank_test_eigenvalues"] = time.perf_counter() - t
    del products  # the device copy: freed once the pool lets go of it
    if gpu is not None:
        gpu.get_default_memory_pool().free_all_blocks()

    t = time.perf_counter()
    if g.ranged:
        features = None
        if shrinkage is not None:  # <s_i, U_k> = (S_c U^T + 1 mean U^T)_ik, from the ranges' products
            features = shrinkage.operator_features(g.rows, g.occupancy)
        sampled = SampledGeometry(None, bias=bias, seed=config.seed, sqrt=g.rows, shrinkage=features)
    else:
        sampled = SampledGeometry(g.rows, bias=bias, seed=config.seed, sqrt=op if op is not g.rows else None,
                                  shrinkage=shrinkage)
    encodings = _sampled_encodings(g, mds, config)
    halfwidth = config.untested_stress_halfwidth if untested else config.stress_halfwidth
    corpus_triples, encoding_triples = _triples(config, untested=untested)
    with progress(desc="sampled stress", unit="pair", enabled=show_progress) as bar:

        def drawn(pairs: int, aim: int, widest: float) -> None:
            bar.total = max(aim, pairs)
            bar.update(pairs - bar.n)
            bar.set_postfix_str(f"widest half-width {widest:.1e} (target {halfwidth:.0e})", refresh=True)

        stresses = sampled.stress([e.matrix for _, e in encodings], target_halfwidth=halfwidth,
                                  max_pairs=config.stress_max_pairs, progress=drawn)
    timings["sampled_stress"] = time.perf_counter() - t

    t = time.perf_counter()
    with progress(total=2, desc="corpus diagnostics", unit="step", enabled=show_progress) as bar:
        bar.set_postfix_str("H1 (adjacent and sampled pairs), A3 (sampled triples)", refresh=True)
        diagnostics = _sampled_diagnostics(sampled, g.positions, config, triples=corpus_triples)
        bar.update(1)
        bar.set_postfix_str("Hellinger summary", refresh=True)
        summary = _sampled_hellinger_entry(sampled, corrected=bias is not None)
        if bias is not None:
            summary["occupancy_adjusted"] = shrinkage is not None
        bar.update(1)
    timings["corpus_diagnostics"] = time.perf_counter() - t

    t = time.perf_counter()
    results = []
    with progress(total=len(encodings), desc="encodings", unit="enc", enabled=show_progress) as bar:
        for (dim, enc), st in zip(encodings, stresses, strict=True):
            results.append(_sampled_entry(dim, enc, st, sampled, g.positions, config, triples=encoding_triples))
            bar.update(1)
    timings["encodings"] = time.perf_counter() - t
    # the stress intervals' pairs, drawn while the square-root rows are held
    i, j = draw_jackknife_pairs(m, entries_per_row=float(np.mean(sampled.row_entries)), seed=config.seed)
    return _Geometry(mds, diagnostics, results, summary, jackknife_pairs=(i, j, sampled.distances(i, j)),
                     occupancy_adjusted=bias is not None, shrinkage=shrinkage, rank_test=tested,
                     rank_test_bound=bound)


# Exact nearest-neighbour search (k-d tree) is fast only in low dimension.
_KDTREE_MAX_DIM = 8


def _large_min_separation(p: np.ndarray, sampled: Any) -> tuple[float, tuple[int, int], str]:
    """Minimum separation without an n x n pass: exact by a k-d tree for d <= 8, else an
    upper bound over adjacent rows and the sampled pairs."""
    p = np.asarray(p, dtype=np.float64)
    if p.shape[1] <= _KDTREE_MAX_DIM:
        dist, nn = cKDTree(p).query(p, k=2)
        i = int(np.argmin(dist[:, 1]))
        j = int(nn[i, 1])
        diff = p[i] - p[j]
        return float(np.sqrt(diff @ diff)), (min(i, j), max(i, j)), "exact"
    n = p.shape[0]
    ci = np.concatenate([np.arange(n - 1), sampled.i])
    cj = np.concatenate([np.arange(1, n), sampled.j])
    best, bi, bj = np.inf, 0, 1
    for a in range(0, ci.size, 1 << 16):
        diff = p[ci[a : a + (1 << 16)]] - p[cj[a : a + (1 << 16)]]
        d = np.sqrt(np.einsum("ij,ij->i", diff, diff))
        k = int(np.argmin(d))
        if d[k] < best:
            best, bi, bj = float(d[k]), int(ci[a + k]), int(cj[a + k])
    return best, (bi, bj), "sampled_upper_bound"
