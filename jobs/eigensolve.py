"""Ray job: top-k MDS of saved counts by block Lanczos, on a GPU when there is one.

    python -m posstats.jobs.eigensolve --counts runs/counts --k 64 --out runs/mds [--address ADDR]
        [--tol 1e-8] [--block 8] [--device auto|cpu|gpu] [--min-occupancy K] [--buckets log:8]
        [--memory-budget GiB | --ranges K] [--distances auto|plugin|corrected] [--stress-dims 2,16,64]

On a GPU (``--device gpu``, or ``auto`` on a cluster with one), or with ``--buckets``, one
:class:`jobs.hellinger.GeometryWorker` actor (``num_gpus=1``, else ``num_cpus=1``) reads the counts and calls
:func:`posstats.geometry.mds.classical_mds` with ``method="lanczos"``: block Lanczos on the implicit
centred square-root operator, never an n x n matrix and never a densified ``S_c``; on the
GPU its products run with cupy / ``cupyx.scipy.sparse`` (float64). It writes
``OUT/mds.safetensors`` (positions, eigenvalues, encoding, residuals); the driver writes
``OUT/eigensolve.json`` last: eigenvalues, the tolerance, the largest residual
``||A x - theta x|| / theta_1`` (the Lanczos recurrence's, equal to the explicit one up to
rounding), device and seconds.

Otherwise, and always with ``--memory-budget GiB`` or ``--ranges K``, no process holds the
whole counts and no core is left idle: the rows are cut into K position ranges of about
equal stored counts (by default one per CPU of the cluster, at most 64), K large enough
that each range's process fits the budget (a 256 MiB baseline plus 16 bytes a stored count
while a range is read, 12 kept), and one :class:`jobs.ranges.RangeWorker` actor per range
reads only its rows. The
driver runs the same block Lanczos on :class:`posstats.geometry.ranged.RangedSqrt`, whose
products gather (n_r, b) rows and sum (V, b) partials from the actors. The summary adds
``ranges`` (each range's positions, stored counts, bytes held, pid and peak memory) and the
driver's peak memory. Ranges run on CPUs (``--device auto`` or ``cpu``) with ``--buckets none``.

``--distances corrected`` (ranges only; the default ``auto`` chooses it wherever the job runs
on ranges, and plug-in distances on one GPU actor or with ``--buckets``, where the summary's
``noise`` says that no rank test ran) decomposes the bias-corrected ``B - H diag(b) H``
that ``posstats analyze`` reports by default, with the square roots' occupancy shrinkage
removed as there (:mod:`posstats.estimates.occupancy`: the Lanczos products through the
operator shifted by ``W U``, the sampled pairs adjusted; ``noise.occupancy_adjusted``): each actor computes its rows' noise floor
from a random split of their tokens (:func:`posstats.estimates.thinning.range_noise_floor`,
seeded by ``--seed`` and the range) while it reads them; the driver joins the floors
(:func:`posstats.estimates.noise.merge_noise_floors`), takes the per-position bias ``b`` as
the diagonal, the rank test's edge as the noise level (eigenpairs inside the noise bulk
to ``--lanczos-noise-share`` x the analytic edge, the others to ``--tol``, as the analysis does),
and counts the components above that edge. The edge is the analysis': where a
window-groups file is beside the counts (``posstats count`` keeps one) it is measured on
the corpus' two independent halves, the even and odd window groups, each actor building
its rows of their noise (:func:`posstats.estimates.ranged_halves.ranged_halves_noise`,
let go once the edges are read); otherwise, or with ``--mp-edge analytic``, the analytic
Marchenko-Pastur edge (the summary's ``noise.edge_method`` says which, and why not the
halves). Where occupancies differ, the occupancy-weighted eigenvalues are counted
against the weighted edge, as the analysis
(``noise.weighting``, ``noise.tested_eigenvalues``), and the counted components'
occupancy-weighted coordinates go to ``mds.safetensors`` as ``weighted_encoding``
(``noise.weighted_mds_components``). The summary's ``noise`` entry gives
the edge, the bias and ``components_above_noise``.

On ranges the summary also gives ``standout_positions``: the analysis' per-position test
against the pooled distribution (:func:`posstats.estimates.standout.standout_test`, the
same decision as ``posstats analyze``'s), from two reductions over the ranges (the pooled
counts, recovered exactly from the square roots, and each row's distance to the pool);
and ``stress``: the sampled stress of P_MDS at each width of ``--stress-dims`` against the
corpus distances (plug-in or bias-corrected, as ``--distances``), pairs drawn until every
scaled-stress 95 % interval is within ``--stress-halfwidth``
(:class:`posstats.estimates.sampled.SampledGeometry` over the ranges: a pair's rows meet in
the range that holds one of them, so no process gathers the counts). Its intervals cover
the error of sampling pairs, not the corpus' own sampling noise (docs/long-context.md).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from posstats.analysis import HALVES_MIN_COVERAGE, halves_unusable, stored_with_halves
from posstats.counting.io import counts_file, load_header, load_indptr
from posstats.counting.window_groups_io import halves_sums, window_groups_file
from posstats.estimates.null_rank import (
    bias_shift,
    bounded_rank_test,
    bulk_residual,
    edge_decision_level,
    first_then_all,
    mp_edge,
    null_rank,
    tested_bound_entry,
)
from posstats.estimates.noise import merge_noise_floors
from posstats.estimates.permutation import WEIGHTING_FORMULA, occupancy_weights
from posstats.estimates.occupancy import OccupancyShrinkage, ShrinkageFeatures, halves_pool_shift
from posstats.estimates.halves_edge import HalvesEdge
from posstats.estimates.pair_jackknife import SHARE_PAIRS, pair_noise_share
from posstats.estimates.ranged_halves import ranged_halves_noise
from posstats.estimates.sampled import SampledGeometry
from posstats.estimates.standout import standout_test
from posstats.geometry.mds import classical_mds, weighted_coordinates, weighted_gram_eigenpairs
from posstats.geometry.sqrt_operator import shifted_operator
from posstats.geometry.lanczos import wanted_residuals
from posstats.geometry.ranged import RangedSqrt, file_ranges
from posstats.runs.run_folder import MDS_FILE, write_mds

from posstats.errors import PosstatsError
from posstats.storage import jsontext
from posstats.storage.jsontext import write_json_atomic

from .hellinger import add_common_args, connect, run_job
from .output import ArgumentParser, peak_rss_bytes
from .ranges import ActorRanges, actor_halves, budget_ranges, range_flags_problem, start_range_workers

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m posstats.jobs.eigensolve", description=__doc__.split("\n\n")[0])
    add_common_args(p)
    p.add_argument("--k", type=int, default=64, help="leading eigenpairs (default 64)")
    p.add_argument("--tol", type=float, default=1e-8, help="residual tolerance relative to the top eigenvalue (default 1e-8)")
    p.add_argument("--block", type=int, default=8, help="Lanczos block size (default 8)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the Lanczos start vectors, the noise floor's token split and the sampled pairs "
                        "(default 0)")
    p.add_argument("--memory-budget", type=float, metavar="GiB",
                   help="memory per process: cut the counts into position ranges, one Ray actor each, so that each "
                        "actor stays within it (a 256 MiB baseline plus 16 bytes a stored count; the driver holds the "
                        "Krylov basis, at most 1 GiB). Default: no budget")
    p.add_argument("--ranges", type=int, metavar="K",
                   help="at least this many position ranges, one Ray actor each (with or without --memory-budget; "
                        "their products run in parallel). Default on CPUs: one per CPU of the cluster, at most 64")
    p.add_argument("--distances", choices=("auto", "plugin", "corrected"), default="auto",
                   help="auto (default): corrected where the job runs on position ranges (its default on CPUs), "
                        "plugin on one GPU actor or with --buckets, where no rank test runs; plugin: B of the "
                        "plug-in distances, every eigenpair reported, noise included; corrected: the "
                        "bias-corrected B - H diag(b) H that 'posstats analyze' reports, with each range's noise "
                        "floor, the rank test's noise edge and the components above it (ranges only)")
    p.add_argument("--mp-edge", choices=("auto", "analytic"), default="auto",
                   help="corrected distances (--distances auto on ranges, or corrected): the noise edge. auto "
                        "(default) measures the top of the noise bulk on the corpus' two independent halves (the "
                        "even and odd window groups 'posstats count' keeps beside the counts) and counts eigenvalues "
                        "10 %% above it from 512 rows, more below (20 %% at 64), as 'posstats analyze'; without a "
                        "window-groups file, and with analytic, the "
                        "analytic Marchenko-Pastur edge (an upper estimate)")
    p.add_argument("--noise-parts", type=int, choices=(2, 4), default=4,
                   help="corrected distances: the random split of each range's tokens into 2 or 4 parts (default 4)")
    p.add_argument("--stress-dims", default=None, metavar="D,D",
                   help="ranges: widths of P_MDS whose sampled stress is reported, each at most --k (default: those of "
                        "2,16,64 up to --k; 'none' leaves the stress out)")
    p.add_argument("--stress-halfwidth", type=float, default=1e-3, metavar="H",
                   help="ranges: draw pairs until every scaled-stress 95 %% interval is within +-H (default 1e-3)")
    p.add_argument("--stress-max-pairs", type=int, default=20_000_000, metavar="P",
                   help="ranges: the most pairs drawn for the stress (default 20,000,000)")
    p.add_argument("--lanczos-noise-share", type=float, default=1e-3, metavar="S",
                   help="corrected distances: eigenpairs inside the noise bulk to the absolute residual S x the "
                        "analytic edge, the others to --tol (default 1e-3, as 'posstats analyze'; 0: every pair to --tol)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.k < 1:
        print(f"posstats: error: --k must be >= 1, got {args.k}", file=sys.stderr)
        return 2
    problem = _option_problem(args)
    if problem:
        print(f"posstats: error: {problem}", file=sys.stderr)
        return 2
    explicit = args.memory_budget is not None or args.ranges is not None or args.distances == "corrected"
    problem = _ranged_problem(args) if explicit else None
    if problem:
        print(f"posstats: error: {problem}", file=sys.stderr)
        return 2
    started = False
    try:
        counts_file(args.counts)  # a missing or foreign path fails here, before Ray starts
        started = connect(args.address)
        if explicit or _ranges_by_default(args):
            summary = run_ranged(args)
        else:
            summary = run_job(args, "eigensolve", k=args.k, tol=args.tol, block=args.block,
                              min_occupancy=args.min_occupancy, buckets=args.buckets, seed=args.seed,
                              extra={"distances": "plugin", "noise": {"tested": False, "reason": ONE_ACTOR_NOISE}})
    except PosstatsError as exc:
        print(f"posstats: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if started:
            import ray

            ray.shutdown()
    print(jsontext.dumps(summary))
    return 0


ONE_ACTOR_NOISE = ("plug-in distances on one actor (a GPU or --buckets): no noise floor and no rank test, so every "
                   "eigenpair is reported, sampling noise included; on CPUs over position ranges (the default there) "
                   "the job decomposes the bias-corrected geometry and counts its components above noise")
MAX_STRESS_DIMS = 16  # widths of P_MDS whose stress is sampled: each one's pairs cost the same as the others'


def _stress_dims(text: str, /) -> list[int]:
    """The widths of ``--stress-dims`` ('none': no stress), each >= 1, in the order given.

    >>> _stress_dims("2,16,64"), _stress_dims("none")
    ([2, 16, 64], [])
    """
    if text.strip().lower() == "none":
        return []
    try:
        dims = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--stress-dims takes widths like 2,16,64 or none, got {text!r}") from None
    if not dims or min(dims) < 1 or len(dims) > MAX_STRESS_DIMS:
        raise ValueError(f"--stress-dims takes 1 to {MAX_STRESS_DIMS} widths >= 1 (or none), got {text!r}")
    return dims


def _option_problem(args: argparse.Namespace) -> str | None:
    """Why these option values cannot run, or None."""
    if not 0 <= args.lanczos_noise_share < 1:
        return f"--lanczos-noise-share must be in [0, 1), got {args.lanczos_noise_share}"
    if not 0 < args.stress_halfwidth < 1:
        return f"--stress-halfwidth must be in (0, 1), got {args.stress_halfwidth}"
    if args.stress_max_pairs < 1:
        return f"--stress-max-pairs must be >= 1, got {args.stress_max_pairs}"
    if args.stress_dims is None:
        return None
    try:
        dims = _stress_dims(args.stress_dims)
    except ValueError as exc:
        return str(exc)
    if dims and max(dims) > args.k:
        return f"--stress-dims {args.stress_dims}: every width must be at most --k {args.k}"
    return None


DEFAULT_STRESS_DIMS = (2, 16, 64)


def _chosen_stress_dims(args: argparse.Namespace, /) -> list[int]:
    """``--stress-dims``, or by default the widths of :data:`DEFAULT_STRESS_DIMS` up to ``--k``."""
    if args.stress_dims is None:
        return [d for d in DEFAULT_STRESS_DIMS if d <= args.k] or [args.k]
    return _stress_dims(args.stress_dims)


def _ranges_by_default(args: argparse.Namespace) -> bool:
    """Without --memory-budget / --ranges: ranges (one per CPU of the cluster, so that no
    core is left idle) unless a GPU actor is asked for or available, or --buckets is set."""
    import ray

    if args.buckets != "none" or args.device == "gpu":
        return False
    return args.device == "cpu" or float(ray.cluster_resources().get("GPU", 0)) < 1


DEFAULT_MAX_RANGES = 64  # ranges a cluster's CPUs ask for without --ranges


def _ranged_problem(args: argparse.Namespace) -> str | None:
    """Why the ranged eigensolve cannot run with these options, or None."""
    problem = range_flags_problem(args.ranges, args.memory_budget)
    if problem:
        return problem
    which = "--distances corrected" if args.distances == "corrected" else "--memory-budget / --ranges"
    if args.buckets != "none":
        return f"{which} holds position ranges and needs --buckets none, got --buckets {args.buckets}"
    if args.device == "gpu":
        return f"{which} runs on position ranges on CPUs; use --device auto or cpu (or drop it for one GPU actor)"
    return None


def _range_count(args: argparse.Namespace, stored: int, cpus: float, path: str | os.PathLike) -> int:
    """K: at least ``--ranges`` (default: one per CPU of the cluster, at most
    :data:`DEFAULT_MAX_RANGES`), and enough that one range's build fits ``--memory-budget``
    (with its rows of the halves' noise when the edge is measured on them:
    :func:`posstats.analysis.stored_with_halves`)."""
    at_least = args.ranges or max(1, min(int(cpus), DEFAULT_MAX_RANGES))
    if args.memory_budget is None:
        return at_least
    if args.distances in ("auto", "corrected") and args.mp_edge == "auto":
        stored = stored_with_halves(path, stored)
    return budget_ranges(args.memory_budget, stored, at_least=at_least)


def _corrected_solve(floor: Any, share: float, /, *, edge: float | None = None) -> dict[str, Any]:
    """``classical_mds`` arguments for the bias-corrected operator: the diagonal ``b`` and,
    with a finite positive edge (``edge``, measured on the halves; None: the analytic one)
    and ``share > 0``, the noise level (the edge on the corrected scale, ``edge - mean(b)``)
    and residual ``share x`` the analytic edge (:func:`posstats.estimates.null_rank.bulk_residual`),
    as :func:`posstats.analysis.analyze` gives them."""
    out: dict[str, Any] = {"diagonal": np.nan_to_num(np.asarray(floor.bias, dtype=np.float64), nan=0.0)}
    analytic = mp_edge([], floor)
    edge = analytic if edge is None else float(edge)
    if share > 0 and math.isfinite(edge) and edge > 0:
        out["noise_level"] = edge - float(np.nanmean(floor.bias))
        out["noise_residual"] = bulk_residual(share, edge, analytic)
    return out


def _rank_test_weights(floor: Any, /) -> np.ndarray | None:
    """The occupancy weights of the rank test (:func:`posstats.estimates.permutation.occupancy_weights`):
    None at equal occupancy or where the floor cannot give the weighted analytic edge."""
    weights = occupancy_weights(floor.occupancy)
    return None if weights is None or floor.occupancy_column_noise is None else weights


def _weighted_rank_test(products: Any, floor: Any, solve: dict[str, Any], args: argparse.Namespace, mds: Any,
                        /, *, edge: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, float | None] | None:
    """Where occupancies differ, the occupancy-weighted eigenpairs of the bias-corrected
    operator the weighted edge tests (``edge``, measured on the halves; None: analytic), as
    the analysis computes them (:func:`posstats.geometry.mds.weighted_gram_eigenpairs`, as
    many as the count needs: :func:`posstats.estimates.null_rank.first_then_all`; or, where
    the weights are equal to 1 % and the unweighted ``mds`` bounds them below the level,
    its eigenvalues' upper bounds: :func:`posstats.estimates.null_rank.bounded_rank_test`):
    ``(eigenvalues, weights, vectors, bound)``, ``bound`` the weights' max/min ratio where
    the eigenvalues are bounds (else None); None at equal occupancy."""
    weights = _rank_test_weights(floor)
    if weights is None:
        return None
    level = edge_decision_level([], floor, solve["diagonal"], weights, edge=edge)
    w_level, w_residual = level if level is not None else (None, None)
    bounded = None if w_level is None else bounded_rank_test(mds.eigenvalues, mds.residuals, mds.encoding,
                                                              weights, w_level)
    if bounded is not None:
        return bounded[0], weights, bounded[1], bounded[2]
    tested, vectors = first_then_all(
        lambda k: weighted_gram_eigenpairs(products, weights, k=k, diagonal=solve["diagonal"], tol=args.tol,
                                           block=args.block, seed=args.seed, noise_level=w_level,
                                           noise_residual=w_residual),
        args.k, w_level)
    return tested, weights, vectors, None


def _weighted_encoding(weighted: tuple[np.ndarray, np.ndarray, np.ndarray] | None, noise: dict[str, Any],
                       /) -> np.ndarray | None:
    """The (n, k) coordinates of the k occupancy-weighted components counted above the
    weighted edge (:func:`posstats.geometry.mds.weighted_coordinates`; what ``posstats
    export --weighting occupancy`` writes), recorded as ``noise.weighted_mds_components``;
    None when the test was not weighted or counted none."""
    if weighted is None or not noise.get("components_above_noise"):
        return None
    tested, weights, vectors = weighted[:3]
    k = min(int(noise["components_above_noise"]), vectors.shape[1])
    noise["weighted_mds_components"] = k
    return weighted_coordinates(vectors[:, :k], tested[:k], weights)


NO_WINDOW_GROUPS = ("the counts have no window groups (posstats count keeps their halves beside them; count.json "
                    "says why not)")


@dataclass(frozen=True)
class _Edges:
    """The rank test's edges over the ranges: ``found`` maps weighted (True) or not (False)
    to the :class:`~posstats.estimates.halves_edge.HalvesEdge` measured on the counts'
    halves; an edge missing or unusable there (:data:`posstats.analysis.HALVES_MIN_COVERAGE`)
    is the analytic one, for the reason ``why_not`` or the halves' own
    (:func:`posstats.analysis.halves_unusable`)."""

    found: dict[bool, HalvesEdge]
    why_not: str | None = None

    def measured(self, weighted: bool, /) -> HalvesEdge | None:
        """The usable halves' edge, or None (analytic)."""
        found = self.found.get(weighted)
        return found if found is not None and halves_unusable(found) is None else None

    def edge(self, weighted: bool, /) -> float | None:
        """The halves' edge on the plug-in scale, or None (analytic)."""
        found = self.measured(weighted)
        return None if found is None else found.edge

    def entry(self, weighted: bool, /) -> dict[str, Any]:
        """The summary's ``noise.edge_method``: the halves' edge (``HalvesEdge.to_dict``) or
        ``{"method": "analytic", "halves_not_used": why}``, as the report's ``null.edge``."""
        measured = self.measured(weighted)
        if measured is not None:
            return measured.to_dict()
        found = self.found.get(weighted)
        why = self.why_not if found is None else halves_unusable(found)
        return {"method": "analytic", **({"halves_not_used": why} if why else {})}


def _measure_edges(args: argparse.Namespace, path: str, header: Any, actors: list[Any], op: RangedSqrt,
                   positions: np.ndarray, occupancy: np.ndarray, floor: Any, /) -> _Edges:
    """The rank test's edges of the corrected solve, unweighted and (where occupancies
    differ) occupancy-weighted, measured on the even and odd window groups beside the counts
    at ``path``: each actor builds its rows of the halves' noise
    (:func:`posstats.estimates.ranged_halves.ranged_halves_noise`; at ``positions``, with
    the halves' analogue of the pool's shrinkage error where the solve removes the
    occupancy shrinkage: :func:`posstats.estimates.occupancy.halves_pool_shift`), both
    edges are read, and the rows are let go before the MDS. None measured (the analytic edge) with
    ``--mp-edge analytic`` or no window-groups file."""
    if args.mp_edge != "auto":
        return _Edges({}, "--mp-edge analytic")
    if window_groups_file(path) is None:
        return _Edges({}, NO_WINDOW_GROUPS)
    expected = (header.positions, header.vocab_size, header.tokens, header.fingerprint)
    noise = ranged_halves_noise(actor_halves(actors, os.path.abspath(path), expected), occupancy, np.diff(op.edges),
                                header.vocab_size, source="window groups", min_coverage=HALVES_MIN_COVERAGE)
    if noise.matrix is not None and floor.bias is not None:  # the solve removes the occupancy shrinkage, as here
        shift = halves_pool_shift(occupancy, *halves_sums(path, positions, expected)[:2])
        noise = noise if shift is None else noise.pool_shifted(*shift)
    try:
        found = {False: noise.edge(None, floor.bias)}
        weights = _rank_test_weights(floor)
        if weights is not None:
            found[True] = noise.edge(weights, floor.bias)
    finally:
        if noise.matrix is not None:
            noise.matrix.runner.release()
    return _Edges(found)


def _noise_entry(floor: Any, eigenvalues: Any, solve: dict[str, Any], edges: _Edges, /,
                 weighted: tuple[np.ndarray, np.ndarray] | None = None, *,
                 tested_bound: float | None = None) -> dict[str, Any]:
    """The summary's ``noise``: the edge (``edges``: measured on the halves, else analytic)
    and ``edge_method`` saying which, the components above it (eigenvalues compared on the
    plug-in scale, shifted up by the mean bias, as the analysis does; with ``weighted`` =
    ``(eigenvalues, weights)``, those occupancy-weighted eigenvalues against the weighted
    edge; ``tested_bound``: the weights' max/min ratio where those are the unweighted
    eigenvalues' upper bounds, as the report's ``null.tested_bound``), the bias and the
    split-half distances."""
    tested, weights = weighted if weighted is not None else (eigenvalues, None)
    shift = bias_shift(floor.bias, weights)
    measured = edges.measured(weighted is not None)
    nr = null_rank(np.asarray(tested, dtype=np.float64) + shift, method="mp", floor=floor, weighted=weighted is not None,
                   threshold=None if measured is None else measured.edge)

    def stats(x: np.ndarray) -> dict[str, float | None]:
        v = x[np.isfinite(x)]
        return {"min": float(v.min()), "mean": float(v.mean()), "max": float(v.max())} if v.size else {}

    return {
        "method": floor.method,
        "source": floor.source,
        "parts": int(floor.parts),
        "edge": float(nr.threshold),
        "edge_method": edges.entry(weighted is not None),
        "eigenvalue_shift": shift,
        "components_above_noise": int(nr.components_above_null),
        "saturated": bool(nr.saturated),
        "weighting": "occupancy" if weighted is not None else "none",
        **({"tested_eigenvalues": [float(x) for x in tested[:16]],
            "weighting_formula": WEIGHTING_FORMULA} if weighted is not None else {}),
        **({"tested_bound": tested_bound_entry(tested_bound)}
           if weighted is not None and tested_bound is not None else {}),
        "noise_level": solve.get("noise_level"),
        "noise_residual": solve.get("noise_residual"),
        "bias_d_h2": stats(np.asarray(floor.bias, dtype=np.float64)),
        "split_half_d_h2": stats(np.asarray(floor.split_half, dtype=np.float64)),
    }


def _sampled_stress(op: Any, mds: Any, dims: list[int], bias: Any, args: argparse.Namespace,
                    shrinkage: ShrinkageFeatures | None = None) -> tuple[list[dict[str, Any]], SampledGeometry | None]:
    """The sampled stress of P_MDS at each width against the corpus distances (bias-corrected
    with ``bias``, the occupancy shrinkage removed with ``shrinkage``), over the ranges
    (:class:`posstats.estimates.sampled.SampledGeometry`), and the sampled geometry (its
    pairs), or None without widths."""
    if not dims:
        return [], None
    sampled = SampledGeometry(None, bias=bias, seed=args.seed, sqrt=op, shrinkage=shrinkage)
    results = sampled.stress([mds.encoding[:, :d] for d in dims], target_halfwidth=args.stress_halfwidth,
                             max_pairs=args.stress_max_pairs)
    return [{"encoding": "mds", "dim": int(d), **r.to_dict(),
             "interval": "sampled pairs: the error of sampling pairs, not the corpus' own sampling noise"}
            for d, r in zip(dims, results, strict=True)], sampled


def _occupancy_shrinkage(op: Any, occupancy: np.ndarray, /) -> tuple[OccupancyShrinkage, ShrinkageFeatures] | None:
    """The square roots' occupancy shrinkage of the rows held apart and their features
    (``<s_i, U_k>`` from one product over the ranges), as the analysis removes it from the
    corrected distances (:mod:`posstats.estimates.occupancy`); None at equal occupancy."""
    shrinkage = OccupancyShrinkage.from_totals(occupancy, op.count_totals(np.ones(occupancy.size, dtype=bool)))
    if shrinkage is None:
        return None
    return shrinkage, shrinkage.operator_features(op, occupancy)


def _distance_noise(sampled: SampledGeometry | None, op: Any, occupancy: np.ndarray, *, corrected: bool,
                    seed: int) -> dict[str, Any] | None:
    """The summary's ``distance_noise``: the share of the sampled pairs' summed distances that
    sampling noise alone reaches, from the rows' occupancies and pooled counts only
    (:func:`posstats.estimates.pair_jackknife.pair_noise_share`, as the analysis' null gives
    it above 4,096 rows); None without sampled pairs."""
    if sampled is None or not sampled.pairs:
        return None
    pooled = op.count_totals(np.ones(occupancy.size, dtype=bool))
    share = pair_noise_share(None, sampled.i, sampled.j, sampled.h, corrected=corrected, seed=seed,
                             occupancy=occupancy, pooled=pooled, occupancy_adjusted=corrected)
    return {"share": share, "pairs": int(min(sampled.pairs, SHARE_PAIRS)),
            "method": "pairs (rows redrawn from the pooled distribution)"}


def run_ranged(args: argparse.Namespace) -> dict[str, Any]:
    """The eigensolve over position ranges held by Ray actors; writes OUT/mds.safetensors,
    then OUT/eigensolve.json last; returns the summary."""
    import ray
    import ray.exceptions

    path = counts_file(args.counts)  # a missing or foreign path fails here, before any actor starts
    header = load_header(path)
    t = time.perf_counter()
    started = connect(args.address)
    actors: list[Any] = []
    try:
        indptr = load_indptr(path)
        stored = int(indptr[-1]) if indptr is not None else header.positions * header.vocab_size
        bounds = file_ranges(path, _range_count(args, stored, float(ray.cluster_resources().get("CPU", 1)), path))
        corrected = args.distances in ("auto", "corrected")
        actors, _ = start_range_workers(os.path.abspath(path), bounds, min_occupancy=args.min_occupancy,
                                        noise_parts=args.noise_parts if corrected else None, seed=args.seed)
        loaded = time.perf_counter() - t
        noise: dict[str, Any] | None = None
        try:
            op = RangedSqrt(ActorRanges(actors))
            t_standout = time.perf_counter()
            positions, occupancy = op.held()
            standout = standout_test(positions, occupancy, pooled_totals=op.count_totals, distance_to=op.distance_to)
            t_standout = time.perf_counter() - t_standout
            floor = merge_noise_floors(op.ranges.call("noise")) if corrected else None
            t_edges = time.perf_counter()
            edges = (_measure_edges(args, path, header, actors, op, positions, occupancy, floor)
                     if floor is not None else None)
            t_edges = time.perf_counter() - t_edges
            solve = (_corrected_solve(floor, args.lanczos_noise_share, edge=edges.edge(False))
                     if floor is not None else {})
            # corrected distances have the square roots' occupancy shrinkage removed, as in the analysis
            shrunk = _occupancy_shrinkage(op, occupancy) if floor is not None else None
            products = op if shrunk is None else shifted_operator(op, shrunk[0].weights(occupancy), shrunk[0].shrinkage)
            mds = classical_mds(products, k=args.k, method="lanczos", tol=args.tol, block=args.block, seed=args.seed,
                                **solve)
            weighted = None
            if floor is not None:
                test = _weighted_rank_test(products, floor, solve, args, mds, edge=edges.edge(True))
                noise = _noise_entry(floor, mds.eigenvalues, solve, edges, None if test is None else test[:2],
                                     tested_bound=None if test is None else test[3])
                noise["edge_seconds"] = round(t_edges, 3)
                noise["occupancy_adjusted"] = shrunk is not None
                weighted = _weighted_encoding(test, noise)
            t_stress = time.perf_counter()
            stress, sampled = _sampled_stress(op, mds, _chosen_stress_dims(args), solve.get("diagonal"), args,
                                              None if shrunk is None else shrunk[1])
            distance_noise = _distance_noise(sampled, op, occupancy, corrected=floor is not None, seed=args.seed)
            t_stress = time.perf_counter() - t_stress
        except ValueError as exc:  # no occupied position at --min-occupancy
            raise PosstatsError(f"{path}: {exc} (at --min-occupancy {args.min_occupancy})") from None
        except ray.exceptions.RayActorError as exc:
            msg = (f"a range's actor died ({type(exc).__name__}); if it ran out of memory, give --memory-budget "
                   "(or a lower one) so that each range is smaller")
            raise PosstatsError(msg) from None
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_mds(out / MDS_FILE, positions, mds, fingerprint=header.fingerprint, residuals=True,
                  metadata={"device": "cpu", "ranges": str(len(bounds))}, weighted=weighted)
        ranges = ray.get([a.where.remote() for a in actors])
        summary = {
            "positions_used": int(positions.size),
            "k": int(mds.eigenvalues.size),
            "device": "cpu",
            "tol": float(args.tol),
            "max_residual": float(mds.residuals.max()),
            # every pair within 10x of its target: --tol, or inside the noise bulk the noise-matched residual
            "converged": bool(np.all(mds.residuals <= 10 * wanted_residuals(
                mds.eigenvalues, abs(float(mds.eigenvalues[0])) or 1.0, args.tol, mds.noise_level, mds.noise_residual))),
            "total_variance": float(mds.total_variance),
            "eigenvalues": [float(x) for x in mds.eigenvalues],
            "distances": "bias_corrected" if noise is not None else "plugin",
            **({"noise": noise} if noise is not None else {}),
            "standout_positions": standout,
            "standout_seconds": round(t_standout, 3),
            "stress": stress,
            "distance_noise": distance_noise,
            "stress_seconds": round(t_stress, 3),
            "memory_budget_bytes": None if args.memory_budget is None else int(args.memory_budget * 2**30),
            "ranges": ranges,
            "largest_range_peak_rss_bytes": max(r["peak_rss_bytes"] for r in ranges),
            "driver_peak_rss_bytes": peak_rss_bytes(),
            "peak_rss_bytes": max(peak_rss_bytes(), *(r["peak_rss_bytes"] for r in ranges)),
            "load_seconds": round(loaded, 3),
            "seconds": round(time.perf_counter() - t, 3),
        }
        write_json_atomic(out / "eigensolve.json", summary)
        return summary
    finally:
        for a in actors:
            ray.kill(a, no_restart=True)
        if started:
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
