"""The analysis pipeline: counts -> Hellinger geometry -> MDS -> encodings -> report.

:func:`analyze` ties the single-concept modules together and returns an
:class:`Analysis` whose :meth:`Analysis.report` is the ``report.json`` document
(schema in docs/report.md).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np
import scipy.sparse as sp
from scipy.spatial import cKDTree

from posstats import __version__
from posstats.counting.buckets import Buckets, bucket_counts, parse_buckets
from posstats.counting.counts import PositionalCounts, too_few_windows
from posstats.counting.io import DENSE_AS_SPARSE_ENTRIES, counts_file, csr_from_dense, load_header
from posstats.counting.rows import select_rows
from posstats.counting.window_groups_io import window_groups_file
from posstats.errors import InputError, OptionError, PosstatsError
from posstats.estimates.held_out import (
    HELD_OUT_AUTO_LIMIT,
    HELD_OUT_CHOICES,
    held_out_scores,
    parts_halves,
    token_halves,
)
from posstats.estimates.jackknife import (
    JACKKNIFE_GROUPS,
    delete_group_replicates,
    jackknife_correction,
    jackknife_interval,
    jackknife_sd,
    overshoot_tie_range,
)
from posstats.estimates.noise import (
    bias_can_matter,
    bias_shift,
    corrected_squared_distances,
    edge_decision_level,
    first_then_all,
    merge_noise_floors,
    mp_edge,
    noise_floor,
    null_rank,
)
from posstats.estimates.pair_jackknife import (
    MAX_CORRECTION_SDS,
    correction_trusted,
    draw_jackknife_pairs,
    pair_jackknife_interval,
    pair_noise_share,
    pair_replicates,
)
from posstats.estimates.occupancy import OccupancyShrinkage, adjusted
from posstats.estimates.permutation import (
    null_distance_sums,
    occupancy_weights,
    permutation_null,
    rank_test_eigenvalues,
    top_eigenpairs,
    weighted_gram,
)
from posstats.estimates.halves_edge import HalvesEdge, HalvesNoise, halves_noise
from posstats.estimates.ranged_halves import HALVES_BYTES_PER_STORED_COUNT, local_halves, ranged_halves_noise
from posstats.estimates.rotation import rotation_null_corpora
from posstats.estimates.ranged_jackknife import local_replicates, ranged_pair_replicates
from posstats.estimates.sampled import SampledGeometry, _encoding_pair_distances, stress_from_pairs
from posstats.estimates.sampling_variance import position_sampling_variance
from posstats.estimates.thinning import range_noise_floor, split_noise_floor
from posstats.estimates.verdict import (
    DISTANCE_NOISE_CAVEAT,
    NOISE_WITHHELD,
    NO_STRUCTURE_INTERVAL,
    Verdict,
    non_stationarity,
    standout_positions,
    standout_test,
    verdict,
)
from posstats.geometry.diagnostics import (
    corpus_diagnostics,
    min_separation,
    monotonicity_of_encoding,
)
from posstats.geometry.encodings import (
    DEFAULT_ENCODINGS,
    DEFAULT_MAX_ENCODINGS,
    check_encoding_count,
    encoding_dims,
    encoding_sweeps,
    expand_encoding_specs,
    family_of,
    make_encoding,
    parse_encoding_spec,
    split_encoding_list,
)
from posstats.geometry.backend import get_cupy, gpu_available
from posstats.geometry.hellinger import hellinger_sq
from posstats.geometry.mds import (
    MDSResult,
    classical_mds,
    shifted_operator,
    sqrt_operator,
    weighted_coordinates,
    weighted_gram_eigenpairs,
)
from posstats.geometry.ranged import BYTES_PER_STORED_COUNT, RangedSqrt, local_ranges
from posstats.geometry.stress import stress_report
from posstats.memory import analysis_bytes, encoding_probe_bytes, require_memory
from posstats.options import option, option_values
from posstats.progress import progress
from posstats.report import Report

__all__ = ["SCHEMA_VERSION", "Analysis", "AnalysisConfig", "analyze", "analyze_in_ranges", "analyze_ranges",
           "ranges_refusal"]

SCHEMA_VERSION = 1
DEFAULT_DIMS = (2, 16, 64)
# The choices of the string options, as Literal types (a type checker catches a typo such as
# mds_method="dnese") and as the tuples the run-time checks and the CLI use.
MdsMethod = Literal["auto", "dense", "iterative", "lanczos"]
DistanceMatrix = Literal["auto", "plugin", "corrected"]
NoiseFloorChoice = Literal["auto", "on", "off"]
NullChoice = Literal["auto", "shuffle", "mp", "none"]
EdgeChoice = Literal["auto", "analytic"]
HeldOutChoice = Literal["auto", "on", "off"]
MDS_METHODS: tuple[str, ...] = get_args(MdsMethod)
Device = Literal["auto", "cpu", "gpu"]
DEVICES: tuple[str, ...] = get_args(Device)
DISTANCE_MATRICES: tuple[str, ...] = get_args(DistanceMatrix)
NOISE_FLOOR_CHOICES: tuple[str, ...] = get_args(NoiseFloorChoice)
NULL_CHOICES: tuple[str, ...] = get_args(NullChoice)
_LONG = "long contexts and honest estimates (docs/long-context.md)"  # the --help group of most options
_NULL_SHUFFLE_LIMIT = 4096  # auto: a shuffled-null corpus (3 extra solves) up to this many rows


@dataclass(frozen=True)
class _ProbeMDS:
    encoding: np.ndarray


@dataclass(frozen=True)
class AnalysisConfig:
    """Options of :func:`analyze`.

    Attributes:
        dims: encoding widths d to evaluate (each >= 1).
        encodings: encoding spec strings (see :mod:`posstats.geometry.encodings`).
        min_occupancy: positions with fewer counted tokens are left out of the geometry.
        rank_rtol: relative tolerance of the numerical rank.
        mds_method: ``auto`` | ``dense`` | ``iterative`` | ``lanczos`` (see :func:`classical_mds`).
        monotonicity_exact_limit: positions above which monotonicity is sampled.
        seed: seeds every random choice (random encodings, solvers, sampling).
        exact_limit: geometry rows above which no n x n matrix is formed: MDS by block
            Lanczos (k = max dims), stress from sampled pairs with 95 % intervals,
            corpus diagnostics from sampled pairs/triples (see :mod:`posstats.estimates.sampled`).
        stress_halfwidth: sampled path: pairs are drawn until every scaled-stress 95 %
            interval has at most this half-width (or ``stress_max_pairs``).
        stress_max_pairs: sampled path: the most pairs drawn.
        lanczos_tol: tolerance of the block Lanczos solver (relative to the top eigenvalue).
        device: ``auto`` | ``cpu`` | ``gpu``: where the sampled path's Lanczos products run
            (:func:`mds_device`); ``auto`` uses a GPU when cupy finds one.
        buckets: ``none``, ``fixed:W`` or ``log:P`` (:mod:`posstats.counting.buckets`): the geometry
            runs over buckets of pooled counts, represented by their midpoints.
        distances: ``auto``, ``plugin`` or ``corrected`` (the bias-corrected
            ``max(D - b_i - b_j, 0)`` of :mod:`posstats.estimates.noise`, which needs a noise
            floor); the one matrix the MDS, every encoding's stress, the corpus diagnostics
            and the report use. ``auto``: corrected whenever a noise floor is estimated.
        noise_floor: ``auto``, ``on`` or ``off`` (True / False accepted): estimate the
            split-half noise floor, from the parts the caller supplies or else from a random
            split of the counted tokens (:mod:`posstats.estimates.thinning`). ``auto``: on
            when the plug-in bias can matter (:func:`posstats.estimates.noise.bias_can_matter`).
        noise_parts: 2 (halves) or 4 (quarters: also fits the bias's decay).
        null: ``auto`` | ``shuffle`` | ``mp`` | ``none``: how the noise-aware rank is found
            (auto: shuffle up to 4096 rows, else mp when a noise floor exists).
        null_replicates: shuffled null corpora (the rank and homogeneity tests reject when
            the data exceeds all of them: level 1 / (R + 1), 2.5 % with the default 39).
        mp_edge: ``auto`` | ``analytic``: the ``mp`` null's edge. ``auto``: measured on two
            independent halves of the corpus where the counts have them (the noise floor's
            parts, else the even and odd window groups; :mod:`posstats.estimates.halves_edge`),
            else analytic (:func:`posstats.estimates.noise.mp_edge`).
        bootstrap: withdrawn; only 0 is accepted (the shard bootstrap's intervals covered no
            truth on corpora of known distributions: docs/calibration.md).
        corpus_triples: sampled path: triples for the corpus' own monotonicity (A3).
        encoding_triples: above ``monotonicity_exact_limit`` rows: triples for each encoding's
            monotonicity (200,000: a 95 % interval of at most +-0.0022).
        tokenizer: tokenizer.json for re-reading a text corpus by document parity (noise
            floor without a run store); default: the one recorded when counting.
        smacof_limit: geometry rows above which ``mds-smacof`` (O(m^2) per iteration, about
            3 s per width at 1024 rows) is left out of the scored encodings, with a note in
            the report (``skipped_encodings``).
        held_out: ``auto`` | ``on`` | ``off``: score every encoding fitted on one half of
            the corpus against the other (:mod:`posstats.estimates.held_out`); ``auto``: on up to
            :data:`~posstats.estimates.held_out.HELD_OUT_AUTO_LIMIT` rows.
        max_encodings: the most encodings ``encodings`` may expand to (sweeps multiply);
            more is refused before any work (:func:`~posstats.geometry.encodings.check_encoding_count`).
    """

    dims: tuple[int, ...] = option(
        DEFAULT_DIMS, help="encoding widths to evaluate; widths above the MDS rank get zero columns", metavar="D,D",
        minimum=1)
    encodings: tuple[str, ...] = option(
        DEFAULT_ENCODINGS, parse=split_encoding_list, metavar="SPEC,SPEC", config_default=None,
        help="encodings to score; also mds-lowrank:R, rope:layout=half, alibi:HEADS, random:SIGMA, "
             "learned:FILE[:key=NAME]; RoPE scaling: rope:type=linear|dynamic|yarn|longrope|llama3,factor=F,"
             "original=L[,theta=B,...] (docs/rope-scaling.md); a model's own RoPE at its head_dim: "
             "hf:PATH/config.json; a sweep scores every value and plots stress against it: "
             "'rope:type=yarn,original=4096,factor=8|16|32'")
    min_occupancy: int = option(1, help="leave out positions with fewer than K counted tokens", metavar="K",
                                minimum=1)
    rank_rtol: float = option(1e-10, help="relative tolerance of the reported numerical rank", metavar="TOL",
                              minimum=0)
    mds_method: MdsMethod = option(
        "auto", help="dense eigh, the iterative top-k solver (ARPACK), or block Lanczos for long contexts "
                     "(auto: dense up to 2048 positions)")
    monotonicity_exact_limit: int = option(
        4096, help="above this many positions the monotonicity of an encoding is measured on sampled triples",
        metavar="N", minimum=0, unit="positions", group=_LONG)
    seed: int = option(0, help="seed of every random choice", minimum=0)
    exact_limit: int = option(
        16_384, help="above N geometry rows no n x n matrix is formed: block-Lanczos MDS, stress from sampled "
                     "pairs with 95 % intervals", metavar="N", minimum=2, unit="rows", group=_LONG)
    stress_halfwidth: float = option(
        1e-3, help="sampled stress: draw pairs until every scaled-stress 95 % interval is within +-H", metavar="H",
        minimum=0, strict=True, group=_LONG)
    stress_max_pairs: int = option(20_000_000, help="sampled stress: the most pairs drawn", metavar="P", minimum=1,
                                   unit="pairs", group=_LONG)
    lanczos_tol: float = option(1e-8, help="tolerance of the block Lanczos solver, relative to the top eigenvalue",
                                metavar="TOL", minimum=0, strict=True, group=_LONG)
    lanczos_noise_share: float = option(
        1e-3, help="with the analytic null: eigenpairs inside the noise bulk are computed to this share of the "
                   "null's edge as an absolute residual, the others to the Lanczos tolerance (0: every pair to "
                   "it; docs/long-context.md)", metavar="S", minimum=0, group=_LONG)
    untested_stress_halfwidth: float = option(
        5e-3, help="sampled path, when no test can find structure (the analytic null has no homogeneity test "
                   "and the standout test found none, or the verdict is withheld: every encoding is then tied "
                   "whatever the geometry): the sampled stress half-width (docs/long-context.md)", metavar="H",
        minimum=0, strict=True, group=_LONG)
    untested_lanczos_noise_share: float = option(
        0.03, help="sampled path, when no test can find structure (as for --untested-stress-halfwidth): the "
                   "Lanczos noise share", metavar="S", minimum=0, group=_LONG)
    untested_triples: int = option(
        40_000, help="sampled path, when no test can find structure (as for --untested-stress-halfwidth): the "
                     "most triples for the corpus' and each encoding's monotonicity (a 95 % interval of at most "
                     "+-0.005 at 40,000)", metavar="T", minimum=1, unit="triples", group=_LONG)
    device: Device = option(
        "auto", group=_LONG, limit=True,
        help="where the long-context MDS (block Lanczos above --exact-limit rows) multiplies: gpu (cupy, the "
             "posstats[gpu] extra; the square-root operator is copied to the device, about 24 bytes a non-zero), "
             "cpu, or auto: gpu when cupy finds a CUDA device. The results agree to rounding")
    buckets: str = option("none", help="pool positions into buckets: fixed:W (W positions each) or log:P (P per "
                                       "doubling)", metavar="none|fixed:W|log:P", group=_LONG)
    distances: DistanceMatrix = option(
        "auto", help="the one distance matrix of MDS, stress, diagnostics and the report: plug-in, or "
                     "bias-corrected max(d^2 - b_i - b_j, 0) (needs the noise floor); auto: corrected whenever "
                     "the noise floor is estimated", group=_LONG)
    noise_floor: NoiseFloorChoice = option(
        "auto", const="on", group=_LONG,
        help="split-half noise floor: per-position split-half d_H and sampling bias, from a random split of the "
             "counted tokens (or --store / --parts / --reread). auto: on when the plug-in bias can matter, i.e. "
             "the median position has fewer than 500 tokens per effective vocabulary entry; a bare --noise-floor "
             "means on")
    noise_parts: Literal[2, 4] = option(4, help="parts for the noise floor: 4 also fits how the bias decays with "
                                                "occupancy", group=_LONG)
    null: NullChoice = option(
        "auto", help="noise-aware rank: eigenvalues above a shuffled-position null corpus, or an analytic "
                     "Marchenko-Pastur edge (needs the noise floor); auto: shuffle up to 4096 rows, else mp",
        group=_LONG)
    null_replicates: int = option(
        39, help="shuffled null corpora; the rank and homogeneity tests reject when the corpus exceeds all R "
                 "(level 1/(R+1): 2.5 % at 39)", metavar="R", minimum=1, group=_LONG)
    mp_edge: EdgeChoice = option(
        "auto", help="the mp null's edge: auto measures the top of the noise bulk on two independent halves of the "
                     "corpus (documents by parity from --parts / --store / --reread, else the even and odd window "
                     "groups) and counts eigenvalues 10 % above it; without such halves, and with analytic, the analytic "
                     "Marchenko-Pastur-type bound (1.3-2.2x above the bulk with independent tokens, blind to dependent "
                     "ones)", group=_LONG)
    bootstrap: int = option(
        0, help="withdrawn: the shard bootstrap's 95 % intervals covered none of 1,020 known truths "
                "(docs/calibration.md); only 0 is accepted. Stress intervals are given by default", metavar="B",
        minimum=0, group=_LONG, pipeline=False,
        why_not="withdrawn (docs/calibration.md, 'The shard bootstrap, withdrawn')")
    corpus_triples: int = option(200_000, help="sampled path: triples for the corpus' own monotonicity",
                                 metavar="T", minimum=1, unit="triples", group=_LONG)
    encoding_triples: int = option(
        200_000, help="above --monotonicity-exact-limit positions: triples for each encoding's monotonicity (the "
                      "report gives its 95 % interval, at most +-0.0022 at 200,000)",
        metavar="T", minimum=1, unit="triples", group=_LONG)
    tokenizer: str | None = option(
        None, help="tokenizer.json for re-reading a text corpus by document parity", cli=False, pipeline=False,
        why_not="set by analyze's --tokenizer with --reread; the pipeline's is [input] tokenizer")
    smacof_limit: int = option(
        1024, help="score mds-smacof (a default encoding) only up to M positions: it costs O(M^2) per iteration, "
                   "about 3 s per width at 1024", metavar="M", minimum=0, unit="positions", group=_LONG)
    held_out: HeldOutChoice = option(
        "auto", help="score every encoding fitted on one half of the corpus against the other half, so MDS and "
                     "SMACOF are not graded on their own training counts (halves: the noise floor's parts, else "
                     "the tokens split at random); auto: up to 2048 positions, where the scores get ranges for ties (on "
                     "above: without them, on the exact path, the held-out best ties every encoding)", group=_LONG)
    max_encodings: int = option(
        DEFAULT_MAX_ENCODINGS, help="refuse --encodings that expand to more than N encodings (sweeps multiply: "
                                    "a|b|c per key)", metavar="N", minimum=1, limit=True, group=_LONG)
    sweeps: tuple[dict[str, Any], ...] = field(default=(), init=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.noise_floor, bool):
            object.__setattr__(self, "noise_floor", "on" if self.noise_floor else "off")
        # ``key=a|b|c`` sweeps: counted first (a sweep can multiply into millions), remembered
        # for the report's figure, then expanded
        check_encoding_count(self.encodings, limit=self.max_encodings)
        object.__setattr__(self, "sweeps", tuple(encoding_sweeps(self.encodings)))
        object.__setattr__(self, "encodings", expand_encoding_specs(self.encodings))
        self._check_numbers()
        if not self.dims:
            raise OptionError("give at least one dimension ({dims})")
        for d in self.dims:
            if int(d) != d or d < 1:
                msg = f"dimensions must be positive integers, got {d!r}"
                raise PosstatsError(msg)
        need, what, hint = encoding_probe_bytes(self.dims)
        require_memory(need, what=what, hint=hint, command="analyze")
        if not self.encodings:
            raise OptionError("give at least one encoding ({encodings})")
        # Build every (encoding, width) on two positions so that unknown names, odd widths
        # for sinusoidal/RoPE or unreadable tables fail before any counting work.
        probe = _ProbeMDS(np.eye(2, max(self.dims)))
        probe_distances = np.array([[0.0, 1.0], [1.0, 0.0]])
        for d, spec in encoding_jobs(self):
            make_encoding(spec, np.arange(2), d, mds=probe, distances=probe_distances, occupancy=np.ones(2))
        if self.min_occupancy < 1:
            msg = f"the minimum occupancy must be >= 1, got {self.min_occupancy}"
            raise PosstatsError(msg)
        self._check_long_context_options()

    def _check_numbers(self) -> None:
        """Seeds, counts and tolerances in their ranges (NaN, negative seeds, ... refused in
        one line naming the option, before any work)."""
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or not 0 <= self.seed < 2**63:
            msg = f"the seed must be an integer in [0, 2^63), got {self.seed!r}"
            raise PosstatsError(msg)
        for name, low in (("min_occupancy", 1), ("monotonicity_exact_limit", 0), ("exact_limit", 2),
                          ("stress_max_pairs", 1), ("null_replicates", 0), ("bootstrap", 0), ("corpus_triples", 1),
                          ("encoding_triples", 1), ("untested_triples", 1), ("smacof_limit", 0),
                          ("max_encodings", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                msg = f"{name.replace('_', ' ')} must be an integer >= {low}, got {value!r}"
                raise PosstatsError(msg)
        for name, ok, rule in (("rank_rtol", lambda v: 0 <= v < 1, "in [0, 1)"),
                               ("lanczos_tol", lambda v: 0 < v < 1, "in (0, 1)"),
                               ("stress_halfwidth", lambda v: 0 < v < 1, "in (0, 1)"),
                               ("untested_stress_halfwidth", lambda v: 0 < v < 1, "in (0, 1)"),
                               ("lanczos_noise_share", lambda v: 0 <= v < 1, "in [0, 1)"),
                               ("untested_lanczos_noise_share", lambda v: 0 <= v < 1, "in [0, 1)")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
                msg = f"{name.replace('_', ' ')} must be a number {rule}, got {value!r}"
                raise PosstatsError(msg)

    def _check_long_context_options(self) -> None:
        parse_buckets(self.buckets, 1 << 20)
        if self.exact_limit < 2:
            msg = f"the exact limit must be >= 2 positions, got {self.exact_limit}"
            raise PosstatsError(msg)
        if not 0 < self.stress_halfwidth < 1:
            msg = f"the stress half-width must be in (0, 1), got {self.stress_halfwidth}"
            raise PosstatsError(msg)
        if self.mds_method not in MDS_METHODS:
            msg = f"unknown MDS method {self.mds_method!r}; choose one of {', '.join(MDS_METHODS)}"
            raise PosstatsError(msg)
        if self.distances not in DISTANCE_MATRICES:
            msg = f"unknown distance matrix {self.distances!r}; choose one of {', '.join(DISTANCE_MATRICES)}"
            raise PosstatsError(msg)
        if self.noise_floor not in NOISE_FLOOR_CHOICES:
            msg = f"unknown noise floor setting {self.noise_floor!r}; choose one of {', '.join(NOISE_FLOOR_CHOICES)}"
            raise PosstatsError(msg)
        if self.distances == "corrected" and self.noise_floor == "off":
            msg = "bias-corrected distances ({distances} corrected) need a noise floor (not {noise_floor} off)"
            raise OptionError(msg)
        if self.noise_parts not in (2, 4):
            msg = f"the noise floor uses 2 or 4 parts, got {self.noise_parts}"
            raise PosstatsError(msg)
        if self.null not in NULL_CHOICES:
            msg = f"unknown null {self.null!r}; choose one of {', '.join(NULL_CHOICES)}"
            raise PosstatsError(msg)
        if self.null == "mp" and self.noise_floor == "off":
            msg = "the analytic null ({null} mp) needs a noise floor (not {noise_floor} off)"
            raise OptionError(msg)
        if self.held_out not in HELD_OUT_CHOICES:
            msg = f"unknown held-out setting {self.held_out!r}; choose one of {', '.join(HELD_OUT_CHOICES)}"
            raise PosstatsError(msg)
        if self.device not in DEVICES:
            msg = f"unknown device {self.device!r}; choose one of {', '.join(DEVICES)}"
            raise PosstatsError(msg)
        if self.smacof_limit < 0:
            msg = f"the SMACOF limit must be >= 0 positions, got {self.smacof_limit}"
            raise PosstatsError(msg)
        for name in ("corpus_triples", "encoding_triples", "untested_triples"):  # each sizes three index arrays
            if getattr(self, name) > _MAX_TRIPLES:
                msg = (f"{{{name}}} {getattr(self, name)} is above {_MAX_TRIPLES:,} (three int64 arrays of that "
                       "length; 200,000 already gives a 95 % interval of +-0.0022)")
                raise OptionError(msg)
        if self.null_replicates > _MAX_NULL_REPLICATES:
            msg = (f"{{null_replicates}} {self.null_replicates} is above {_MAX_NULL_REPLICATES} (each one is a shuffled "
                   "corpus and, up to 1,024 rows, an m x m eigensolve)")
            raise OptionError(msg)
        if self.null_replicates < 1:
            msg = f"need {{null_replicates}} >= 1, got {self.null_replicates}"
            raise OptionError(msg)
        if self.bootstrap != 0:
            msg = (f"{{bootstrap}} {self.bootstrap}: the shard bootstrap was withdrawn. On corpora sampled from known "
                   "distributions its 95 % intervals (eigenvalues, rank, mean d_H, stress) covered the truth in 0 of "
                   "1,020 cases (docs/calibration.md, 'The shard bootstrap, withdrawn'); the stress intervals the report "
                   "gives by default are the calibrated ones")
            raise OptionError(msg)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: every option that decides the result (not the limits), and the sweeps."""
        return {**option_values(self, limits=False), "sweeps": list(self.sweeps)}



def encoding_jobs(config: AnalysisConfig, rows: int | None = None) -> list[tuple[int, str]]:
    """Every (width, encoding spec) scored, widths ascending: each spec at every width of
    ``config.dims``, except ``hf:`` specs, scored at their model's head dimension only.
    With ``rows`` (the geometry's), ``mds-smacof`` is left out above ``config.smacof_limit``
    or ``config.exact_limit`` (it needs the m x m distances; :func:`skipped_encodings` says so)."""
    widths = {spec: encoding_dims(spec, config.dims) for spec in config.encodings}
    every = sorted({d for ds in widths.values() for d in ds})
    jobs = [(d, spec) for d in every for spec in config.encodings if d in widths[spec]]
    if rows is not None and rows > min(config.smacof_limit, config.exact_limit):
        jobs = [(d, spec) for d, spec in jobs if not family_of(spec).quadratic]
    return jobs


FLAT_REASON = ("every corpus distance is 0: no positional structure beyond sampling noise, so an encoding's stress "
               "(sum (e - h)^2 / sum h^2) is 0/0 and no encoding is scored")


def flat_skipped_encodings(config: AnalysisConfig, /) -> list[dict[str, str]]:
    """The report's ``skipped_encodings`` when every corpus distance is 0: every spec, and why."""
    return [{"spec": spec, "reason": FLAT_REASON} for spec in config.encodings]


def skipped_encodings(config: AnalysisConfig, rows: int, /) -> list[dict[str, str]]:
    """The report's ``skipped_encodings``: specs :func:`encoding_jobs` leaves out at ``rows``, and why."""
    if rows > config.smacof_limit:
        reason = (f"SMACOF costs O(m^2) per iteration: {rows:,} geometry rows > --smacof-limit "
                  f"{config.smacof_limit:,} (raise it to score it)")
    elif rows > config.exact_limit:
        reason = (f"SMACOF needs the m x m distances, which the analysis does not form above --exact-limit "
                  f"{config.exact_limit:,} ({rows:,} geometry rows; raise it to score it)")
    else:
        return []
    return [{"spec": spec, "reason": reason} for spec in config.encodings if family_of(spec).quadratic]


@dataclass(frozen=True)
class Analysis:
    """Everything :func:`analyze` computed.

    Attributes:
        counts: the input counts.
        config: the options used.
        positions: (m,) 0-based occupied positions that entered the geometry (with
            buckets: the midpoints of the buckets used).
        distances: (m, m) Hellinger distances d_H between those positions (the matrix the
            encodings used: plug-in or bias-corrected), or None above ``exact_limit``.
        mds: the classical-MDS result for those positions.
        diagnostics: corpus diagnostics (H1, A3) as a JSON-ready dict.
        encodings: one JSON-ready dict per (dimension, encoding).
        timings: seconds per step.
        sections: further report sections (geometry, noise, null, buckets).
        hellinger_summary: the ``hellinger`` report entry when it is not computed from
            ``distances`` (sampled path, bias-corrected distances).
        standout: the positions that stand out from the pooled distribution
            (:func:`posstats.estimates.verdict.standout_positions`).
        occupancy: (n,) tokens at every position, when ``counts`` holds only the header
            (:func:`analyze_ranges`); None: ``counts.occupancy()``.
        counts_source: the counts file the ranges were read from (:func:`analyze_ranges`),
            where a run reads the rows it needs later (the report's distance sample).
        weighted_encoding: (m, k) the occupancy-weighted MDS coordinates of the k components
            the occupancy-weighted rank test counted
            (:func:`posstats.geometry.mds.weighted_coordinates`), where occupancies differ
            and it counted any; else None. ``posstats export`` writes them where the
            unweighted MDS's leading components load on thinly occupied positions.
    """

    counts: PositionalCounts
    config: AnalysisConfig
    positions: np.ndarray
    distances: np.ndarray | None
    mds: MDSResult
    diagnostics: dict[str, Any]
    encodings: list[dict[str, Any]]
    timings: dict[str, float] = field(default_factory=dict)
    sections: dict[str, Any] = field(default_factory=dict)
    hellinger_summary: dict[str, Any] | None = None
    standout: dict[str, Any] | None = None
    occupancy: np.ndarray | None = None
    counts_source: str | None = None
    weighted_encoding: np.ndarray | None = None

    def report(self) -> Report:
        """The report (:class:`posstats.report.Report`; ``report.json`` is its
        :meth:`~posstats.report.Report.to_dict`, documented in docs/report.md)."""
        report = {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "posstats", "version": __version__},
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "config": self.config.to_dict(),
            "corpus": _corpus_entry(self.counts),
            "positions": _positions_entry(self.counts.positions,
                                          self.counts.occupancy() if self.occupancy is None else self.occupancy,
                                          used=len(self.positions), min_occupancy=self.config.min_occupancy),
            "hellinger": self.hellinger_summary if self.hellinger_summary is not None else _hellinger_entry(self.distances),
            "diagnostics": self.diagnostics,
            "spectrum": _spectrum_entry(self.mds, rtol=self.config.rank_rtol, null=self.sections.get("null")),
            "encodings": self.encodings,
            "timings_s": {k: round(v, 4) for k, v in self.timings.items()},
        }
        report.update({k: v for k, v in self.sections.items() if k not in report})
        report["diagnostics"]["h1"]["distances"] = report["geometry"]["distances"] if "geometry" in report else "plugin"
        answer = verdict(report, self.standout)
        report["diagnostics"]["h1"].update(nonstationary=answer.non_stationary, test=answer.non_stationary_test)
        return dataclasses.replace(Report.from_dict({"verdict": answer.to_dict(), **report}), verdict=answer)

    def verdict(self) -> Verdict:
        """The report's decisions, typed (:class:`posstats.estimates.verdict.Verdict`):
        ``analysis.verdict().components_above_noise``; ``report()["verdict"]`` is its JSON."""
        return self.report().verdict


_HELLINGER_CONVENTION = "d_H^2 = sum_v (sqrt mu_i - sqrt mu_j)^2, in [0, 2]"


def _summary(values: np.ndarray, prefix: str = "") -> dict[str, float]:
    """``{prefix}min / mean / max`` of ``values`` (zeros when empty)."""
    if not values.size:
        return {f"{prefix}min": 0.0, f"{prefix}mean": 0.0, f"{prefix}max": 0.0}
    return {f"{prefix}min": float(values.min()), f"{prefix}mean": float(values.mean()), f"{prefix}max": float(values.max())}


def _off_diagonal(matrix: np.ndarray) -> np.ndarray:
    """The m (m - 1) off-diagonal entries of an (m, m) matrix, row by row."""
    return matrix[~np.eye(matrix.shape[0], dtype=bool)]


def _hellinger_entry(distances: np.ndarray) -> dict[str, Any]:
    """The ``hellinger`` report entry: min / mean / max of the off-diagonal d_H."""
    return {"convention": _HELLINGER_CONVENTION, **_summary(_off_diagonal(distances))}


def _corpus_entry(c: PositionalCounts) -> dict[str, Any]:
    """The ``corpus`` report entry: totals, counting spec, fingerprint and metadata."""
    return {
        "sequences": c.sequences,
        "windows": c.windows,
        "tokens_counted": c.tokens,
        "vocab_size": c.vocab_size,
        "mode": c.spec.mode,
        "exclude_ids": list(c.spec.exclude_ids),
        "separator_id": c.spec.separator_id,
        "fingerprint": c.fingerprint,
        **dict(c.metadata.items()),
    }


def _positions_entry(requested: int, occ: np.ndarray, *, used: int, min_occupancy: int) -> dict[str, Any]:
    """The ``positions`` report entry: occupancy ``occ`` (n,) of every position and its summary."""
    occ = np.asarray(occ)
    occ_used = occ[occ > 0]
    return {
        "requested": int(requested),
        "occupied": int(np.count_nonzero(occ)),
        "used": used,
        "min_occupancy": min_occupancy,
        "occupancy": occ.tolist(),
        "left_out": np.flatnonzero(occ < max(min_occupancy, 1)).tolist(),
        "occupancy_summary": {
            "min": int(occ_used.min()) if occ_used.size else 0,
            "median": float(np.median(occ_used)) if occ_used.size else 0.0,
            "max": int(occ_used.max()) if occ_used.size else 0,
        },
    }


def _spectrum_entry(mds: MDSResult, *, rtol: float, null: dict[str, Any] | None) -> dict[str, Any]:
    """The ``spectrum`` report entry: :meth:`MDSResult.spectrum` plus solver facts and the
    components above the null (when one was computed)."""
    spectrum = mds.spectrum(rtol=rtol).to_dict()
    spectrum.update(
        method=mds.method,
        solver_tol=mds.tol,
        max_residual=float(np.max(mds.residuals)) if mds.residuals.size else 0.0,
        device=mds.device,
    )
    if mds.noise_level is not None:  # the bulk below it was computed to noise_residual only
        spectrum.update(noise_level=mds.noise_level, noise_residual=mds.noise_residual)
    if null is not None:
        spectrum["components_above_null"] = null.get("components_above_null")
    return spectrum


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
    need, what, hint = analysis_bytes(m, sel.counts.vocab_size, dims=config.dims, encodings=len(config.encodings),
                                      exact=m <= config.exact_limit, dense_counts=not (sel.counts.is_sparse or as_sparse))
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
              halves=halves)
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
                          counts_source=counts_file(path), halves=halves_starter(path, header, ranges.ranges))


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


def _analysis(counts: PositionalCounts, config: AnalysisConfig, g: _Rows, /, *, parts: Any,
              show_progress: bool | None, occupancy: np.ndarray | None = None, window_groups: Any = None) -> Analysis:
    """The body of :func:`analyze` and :func:`analyze_ranges` on the selected rows ``g``."""
    timings: dict[str, float] = {}
    sections: dict[str, Any] = {}
    if g.buckets is not None:
        sections["buckets"] = {**g.buckets.to_dict(), "occupancy": g.geo.occupancy().tolist(), "used": len(g.index)}
    noise, geo_parts, noise_entry = _noise(parts, g, config, timings, show_progress)
    sections["noise"] = noise_entry
    bias = noise.bias if (noise is not None and config.distances in ("auto", "corrected")) else None
    large = len(g.index) > config.exact_limit
    sections["geometry"] = _geometry_section(config, corrected=bias is not None, rows=len(g.index), large=large)
    t = time.perf_counter()
    standout = _standout(g)  # before the geometry: it may decide its accuracy
    timings["standout"] = time.perf_counter() - t
    if large:
        untested = _untested(config, len(g.index), noise, standout, counts)
        if untested:  # every encoding will be tied: the stresses and the noise bulk are descriptive
            sections["geometry"]["untested"] = {"reason": untested,
                                                "stress_halfwidth": config.untested_stress_halfwidth,
                                                "lanczos_noise_share": config.untested_lanczos_noise_share,
                                                **dict(zip(("corpus_triples", "encoding_triples"),
                                                           _triples(config, untested=True), strict=True))}
    weights = _edge_weights(config, g, noise)
    windows = _usable_window_groups(window_groups, counts, g)
    halves = _HalvesEdges(config, g, noise, geo_parts, _halves_window_groups(window_groups, counts, g), bias)
    edge_level = None if weights is None else edge_decision_level(geo_parts, noise, bias, weights,
                                                                  edge=halves.edge(weights))
    if large:
        noise_level = _noise_level(bias, noise, geo_parts, config, len(g.index), untested=untested is not None,
                                   edge=halves.edge(None))
        halves.release()  # both edges are read: the halves' noise (1.5 GB at n = 131,072) goes before the MDS
        geometry = _sampled_geometry(g, bias, config, timings, show_progress, untested=untested is not None,
                                     noise_level=noise_level, rank_test=None if weights is None else (weights, edge_level))
    else:
        shuffled = _null_choice(config, len(g.index), noise) == "shuffle"
        geometry = _exact_geometry(g, bias, config, timings, show_progress,
                                   rank_test=shuffled or weights is not None, edge_level=edge_level)
    null, homogeneity, weighted = _null_section(
        geometry.mds, bias, noise, g, geo_parts, config, timings, show_progress, distances=geometry.distances,
        shrinkage=geometry.shrinkage, windows=windows, rank_test=geometry.rank_test, halves=halves)
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


def _standout(g: _Rows) -> dict[str, Any]:
    """The standout test (:func:`posstats.estimates.verdict.standout_test`) of the rows: on the
    counts, or from the ranges' two reductions (pooled counts, distances to the pool)."""
    if g.ranged:
        return standout_test(g.positions, g.occupancy, pooled_totals=g.pooled_totals,
                             distance_to=g.rows.distance_to)
    return standout_positions(g.rows, g.positions)


# ----------------------------------------------------------------------------- exact path


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


def _exact_encodings(
    distances: np.ndarray, mds: MDSResult, g: _Rows, config: AnalysisConfig, show_progress: bool | None
) -> list[dict[str, Any]]:
    """One report entry per (width, encoding): exact stress over all m (m - 1) / 2 pairs."""
    m = len(g.positions)
    results = []
    jobs = encoding_jobs(config, m)
    with progress(total=len(jobs), desc="encodings", unit="enc", enabled=show_progress) as bar:
        for dim, spec in jobs:
            entry = _evaluate(spec, g.positions, dim, distances, mds, config, g.occupancy, g.context)
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
    the analytic edge's ``edge_level``, :func:`posstats.estimates.noise.edge_decision_level`,
    only as many as the count needs: :func:`posstats.estimates.noise.first_then_all`)."""
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


_JACKKNIFE_LIMIT = 2048  # geometry rows up to which exact stresses get jackknife intervals
# Noise share from which the jackknife over all pairs (up to _JACKKNIFE_LIMIT rows) gives no
# 95 % interval: its coverage falls as the share rises (its sd misses the clipped near-zero
# pairs' spread; docs/calibration.md): 94-98 % at shares 0.021-0.033 (drift and all_planted,
# n = 64 and 512, N = 100,000), 89.8 % at 0.045 and 87.5 % at 0.050 (all_planted, N =
# 20,000, n = 64 and 512), 87.5 % at 0.07 (drift, n = 64, N = 20,000). The pair-sample
# jackknife above it, whose width adds the pairs' sampling error, covered 54 of 54 below
# DISTANCE_NOISE_CAVEAT.
JACKKNIFE_NOISE_LIMIT = 0.04
_JACKKNIFE_SMACOF_LIMIT = 128  # ... and SMACOF is refitted on every replicate (O(m^2) per iteration)
_SMACOF_NOT_REFITTED = f"none: SMACOF is not refitted above {_JACKKNIFE_SMACOF_LIMIT} rows"
_JACKKNIFE_MIN_OCCUPANCY = 20  # a row this full keeps a token in every replicate (P(empty) <= 0.1^20)
_THIN_ROWS = f"none: a geometry row has fewer than {_JACKKNIFE_MIN_OCCUPANCY} tokens (--min-occupancy raises the floor)"


def _stress_intervals(geometry: _Geometry, g: _Rows, *, corrected: bool, config: AnalysisConfig,
                      noise_share: float | None, show_progress: bool | None, compared: bool = True) -> float | None:
    """Jackknife intervals on the stresses (none when not ``compared``: no test found
    structure, the verdict ties every encoding and a stress against a geometry of
    identical positions has no truth to cover; :func:`_uncompared`): up to
    ``_JACKKNIFE_LIMIT`` rows the delete-a-group jackknife with refits (:func:`_jackknife_intervals`), above it the pair-sample jackknife
    of the fixed encodings (:func:`_pair_intervals`), given as 95 % intervals only while
    sampling noise alone stays below ``JACKKNIFE_NOISE_LIMIT`` (the former) or
    ``DISTANCE_NOISE_CAVEAT`` (the latter) of the summed distances
    (``null.distance_noise.share``, or the pairs' own share where no shuffle null gave it).
    Above it the stresses lean toward the noise and the intervals cover less than 95 %
    (docs/calibration.md: 87.5 % on drifts at a share of 0.07, 28-58 % on planted corpora),
    so the entry's ``*_ci95`` stay
    zero-width and the jackknife's range moves to ``scaled_stress_tie_range``: the verdict
    still calls encodings within it tied (no winner named inside the sampling spread),
    nothing prints it as an interval. Returns the noise share the intervals were judged by."""
    results = geometry.encodings
    if not compared:
        return _uncompared(geometry, g, corrected=corrected, config=config, noise_share=noise_share)
    if geometry.jackknife_pairs is None and len(g.positions) <= _JACKKNIFE_LIMIT:
        _jackknife_intervals(results, g, corrected=corrected, config=config, show_progress=show_progress)
        limit = JACKKNIFE_NOISE_LIMIT
    else:
        noise_share = _pair_intervals(geometry, g, corrected=corrected, config=config, noise_share=noise_share,
                                      show_progress=show_progress)
        limit = DISTANCE_NOISE_CAVEAT
    if noise_share is None or noise_share < limit:
        return noise_share
    why = (f"{NOISE_WITHHELD} {_share_text(noise_share)} of the summed distances "
           f"(>= {limit:.0%}): a 95 % interval would cover below 95 % (docs/calibration.md); "
           "the jackknife's range (scaled_stress_tie_range) only decides ties")
    for e in results:
        reason = str(e.get("stress_interval", ""))
        if reason.startswith("jackknife"):
            e["scaled_stress_tie_range"] = e["scaled_stress_ci95"]
            e["stress_ci95"], e["scaled_stress_ci95"] = [e["stress"]] * 2, [e["scaled_stress"]] * 2
            e["stress_interval"] = why
        elif reason.startswith((_BELOW_ZERO, _LARGE_CORRECTION, _FITTED_IN_SAMPLE)):
            # a stress within its noise of 0 (a fit to rounding, such as SMACOF at full width),
            # or one whose correction is not trusted: its tie range stays; the reason that
            # withholds every interval is the noise's
            e["stress_interval"] = why
    return noise_share


_BELOW_ZERO = "none: the jackknife's bias-corrected interval lies below 0"  # a stress_interval reason
_LARGE_CORRECTION = "none: the jackknife's bias correction"  # ... and how the next one starts
# a fitted encoding's in-sample stress: covered 57 of 82 (all_planted, n = 64, N = 20,000;
# 0 of 18 at d = 16), docs/calibration.md "Fitted encodings in-sample"
_FITTED_IN_SAMPLE = ("none: a fitted encoding's in-sample stress depends on the sampling noise through its fit "
                     "(the directions MDS keeps among near-equal eigenvalues, SMACOF's iterations) in a way the "
                     "jackknife does not remove (docs/calibration.md); scaled_stress_tie_range only decides ties, "
                     "and its held-out score compares it on other tokens")


def _large_correction_reason(correction: float, sd: float) -> str:
    """Why no interval is given where the jackknife's correction of the scaled stress
    exceeds ``MAX_CORRECTION_SDS`` of its sd (the range is kept for ties)."""
    return (f"{_LARGE_CORRECTION} of the scaled stress ({correction:+.2g}) is {abs(correction) / sd:.1f} of its "
            f"standard deviations (> {MAX_CORRECTION_SDS:g}): pairs inside their noise leave a bias it does not "
            "remove (docs/calibration.md); the range only decides ties")


def _share_text(share: float) -> str:
    """A noise share as a percentage for a message, to the precision that tells it from the
    limits it is compared with (0.07 is "7.0 %", not "7%" beside ">= 5%")."""
    return f"{min(share, 1.0):.1%}"


def _jackknife_intervals(results: list[dict[str, Any]], g: _Rows, *, corrected: bool, config: AnalysisConfig,
                         show_progress: bool | None) -> None:
    """Replace the exact path's zero-width stress intervals by delete-a-group jackknife
    intervals (:mod:`posstats.estimates.jackknife`): every replicate recomputes the
    distances (with their own bias correction), refits the fitted encodings and rescores
    every encoding. Entries say how (``stress_interval``); none is given above
    ``_JACKKNIFE_LIMIT`` rows or with rows of fewer than ``_JACKKNIFE_MIN_OCCUPANCY``
    tokens, nor for SMACOF above ``_JACKKNIFE_SMACOF_LIMIT`` rows, nor where the correction
    of the scaled stress exceeds ``MAX_CORRECTION_SDS`` of its sd (as on the pair-sample
    path), nor for a fitted encoding (its in-sample stress depends on the noise through its
    fit, beyond what the jackknife removes: ``_FITTED_IN_SAMPLE``); the interval is then kept
    as ``scaled_stress_tie_range``, for ties only."""
    m = len(g.positions)
    if float(np.min(g.occupancy)) < _JACKKNIFE_MIN_OCCUPANCY:
        for e in results:
            e["stress_interval"] = _THIN_ROWS
        return
    jobs = [(dim, spec) for dim, spec in encoding_jobs(config, m)
            if m <= _JACKKNIFE_SMACOF_LIMIT or not family_of(spec).quadratic]
    if not jobs:  # only SMACOF asked for, above its refit limit
        for e in results:
            e["stress_interval"] = _SMACOF_NOT_REFITTED
        return
    fitted = any(family_of(spec).fitted for _, spec in jobs)
    top = min(m, max(dim for dim, _ in jobs))  # the coordinates the fitted encodings read

    def statistic(rows: sp.csr_array) -> dict[tuple[int, str, str], float]:
        d2 = hellinger_sq(rows)
        if corrected:  # the data's estimator: the occupancy shrinkage removed (the replicate's own)
            adjusted(d2, rows)
        b = position_sampling_variance(rows) if corrected else None
        mds = classical_mds(rows, k=top, method="dense", diagonal=b, squared_distances=d2) if fitted else None
        dist = np.sqrt(corrected_squared_distances(d2, b)) if corrected else np.sqrt(d2)
        occ = np.asarray(rows.sum(axis=1), dtype=np.float64).ravel()
        out = {}
        for dim, spec in jobs:
            enc = make_encoding(spec, g.positions, dim, mds=mds, distances=dist, occupancy=occ, context=g.context)
            rep = stress_report(enc.matrix, dist)
            out[(dim, enc.name, "stress")], out[(dim, enc.name, "scaled_stress")] = rep.stress, rep.scaled_stress
        return out

    with progress(total=JACKKNIFE_GROUPS, desc="stress intervals", unit="replicate", enabled=show_progress) as bar:
        reps = delete_group_replicates(g.rows, statistic, groups=JACKKNIFE_GROUPS, seed=config.seed, progress=bar.update)
    for (_, spec), e in zip(encoding_jobs(config, m), results, strict=True):
        key = (int(e["dim"]), e["name"])
        if (*key, "stress") not in reps:
            e["stress_interval"] = _SMACOF_NOT_REFITTED
            continue
        raw = jackknife_interval(e["stress"], reps[(*key, "stress")], bounds=(0.0, math.inf))
        scaled = jackknife_interval(e["scaled_stress"], reps[(*key, "scaled_stress")], bounds=(0.0, 1.0))
        if raw is None or scaled is None:
            e["scaled_stress_tie_range"] = overshoot_tie_range(e["scaled_stress"], reps[(*key, "scaled_stress")])
            e["stress_interval"] = (f"{_BELOW_ZERO} (its 1/N extrapolation overshoots a stress within its noise of 0); "
                                    "scaled_stress_tie_range only decides ties")
            continue
        if family_of(spec).fitted:
            e["scaled_stress_tie_range"] = scaled
            e["stress_interval"] = _FITTED_IN_SAMPLE
            continue
        # judged on the scaled stress, the quantity the verdict compares: a correction of many
        # sds is a bias the 1/N extrapolation does not model (an encoding that fits the
        # distances almost exactly, ALiBi on a drift: covered 12 of 26 at n = 512, N = 1e5)
        correction = jackknife_correction(e["scaled_stress"], reps[(*key, "scaled_stress")])
        sd = jackknife_sd(reps[(*key, "scaled_stress")])
        if not correction_trusted(correction, sd):
            e["scaled_stress_tie_range"] = scaled
            e["stress_interval"] = _large_correction_reason(correction, sd)
            continue
        e["stress_ci95"], e["scaled_stress_ci95"] = raw, scaled
        e["stress_interval"] = f"jackknife, {JACKKNIFE_GROUPS} random token groups, cut to the quantity's range"


def _pair_intervals(geometry: _Geometry, g: _Rows, *, corrected: bool, config: AnalysisConfig,
                    noise_share: float | None, show_progress: bool | None) -> float | None:
    """Above ``_JACKKNIFE_LIMIT`` rows: token-noise intervals on the stresses of the fixed
    encodings from the pair-sample jackknife (:mod:`posstats.estimates.pair_jackknife`), on
    the exact path around the exact stress, on the sampled path around the sampled one
    with its pair-sampling error added. Fitted encodings (the replicates would have to
    refit them) get none: their pair-sampling interval, if any, moves to
    ``scaled_stress_tie_range``. Where the noise share reaches ``DISTANCE_NOISE_CAVEAT`` no
    interval will be given (:func:`_stress_intervals`), and the range for ties is computed
    on the first m/8 pairs only (their rows are fewer: at 202 M tokens, n = 131,072, about
    a third of the time). Returns the noise share the intervals are judged by: the null's,
    else the pairs' own (:func:`posstats.estimates.pair_jackknife.pair_noise_share`)."""
    results = geometry.encodings
    m = len(g.positions)
    sampled = geometry.jackknife_pairs is not None
    fitted_why = (f"none: a fitted encoding is refitted by the jackknife only on the exact path up to {_JACKKNIFE_LIMIT:,} geometry rows "
                  "(its interval would leave out its own fit to the noise)")
    jobs = list(zip(encoding_jobs(config, m), results, strict=True))
    fixed = [(dim, spec, e) for (dim, spec), e in jobs if not family_of(spec).fitted]
    thin = float(np.min(g.occupancy)) < _JACKKNIFE_MIN_OCCUPANCY
    for (_, spec), e in jobs:
        if family_of(spec).fitted or thin:
            if sampled:  # the pairs' interval leaves out the token noise: a range for ties only
                e["scaled_stress_tie_range"] = e["scaled_stress_ci95"]
                e["stress_ci95"], e["scaled_stress_ci95"] = [e["stress"]] * 2, [e["scaled_stress"]] * 2
            e["stress_interval"] = fitted_why if family_of(spec).fitted else _THIN_ROWS
    rows, i, j, h = _jackknife_pair_sample(geometry, g, config)
    if noise_share is None:
        noise_share = _pairs_noise_share(g, rows, i, j, h, corrected=corrected, seed=config.seed,
                                         occupancy_adjusted=geometry.occupancy_adjusted)
    if thin or not fixed:
        return noise_share
    noisy = noise_share is not None and noise_share >= DISTANCE_NOISE_CAVEAT
    if noisy:
        # no 95 % interval will be given, only a range for ties: on the first m/8 pairs (a
        # uniform sample too), whose rows are fewer; a range wider than on 4 m pairs, which
        # only calls more encodings tied
        count = min(i.size, max(m // 8, 1024))
        i, j, h = i[:count], j[:count], h[:count]
    e_of = {(dim, e["name"]): _encoding_pair_distances_of(spec, dim, g, i, j) for dim, spec, e in fixed}
    full = {key: stress_from_pairs(x, h) for key, x in e_of.items()}

    def statistic(h_r: np.ndarray) -> dict[tuple[int, str, str], float]:
        out = {}
        for key, x in e_of.items():
            rep = stress_from_pairs(x, h_r)
            out[(*key, "stress")], out[(*key, "scaled_stress")] = rep.stress, rep.scaled_stress
        return out

    with progress(total=JACKKNIFE_GROUPS, desc="stress intervals", unit="replicate", enabled=show_progress) as bar:
        if g.ranged:
            reps = ranged_pair_replicates(g.replicates(JACKKNIFE_GROUPS, config.seed), i, j, statistic,
                                          corrected=corrected, vocab=g.rows.shape[1], progress=bar.update,
                                          occupancy=geometry.occupancy_adjusted)
        else:
            reps = pair_replicates(rows, i, j, statistic, corrected=corrected, seed=config.seed, progress=bar.update,
                                   occupancy=geometry.occupancy_adjusted)
    for dim, _, e in fixed:
        key = (dim, e["name"])
        sd = {q: (e[f"{q}_ci95"][1] - e[f"{q}_ci95"][0]) / (2 * _Z95) if sampled else 0.0
              for q in ("stress", "scaled_stress")}
        raw = pair_jackknife_interval(e["stress"], full[key].stress, reps[(*key, "stress")], pair_sd=sd["stress"],
                                      bounds=(0.0, math.inf))
        scaled = pair_jackknife_interval(e["scaled_stress"], full[key].scaled_stress, reps[(*key, "scaled_stress")],
                                         pair_sd=sd["scaled_stress"], bounds=(0.0, 1.0))
        if raw.interval is None or scaled.interval is None:
            e["scaled_stress_tie_range"] = overshoot_tie_range(e["scaled_stress"], reps[(*key, "scaled_stress")],
                                                               extra_sd=sd["scaled_stress"])
            e["stress_interval"] = (f"{_BELOW_ZERO} (a stress within its noise of 0); scaled_stress_tie_range only "
                                    "decides ties")
            continue
        # judged on the scaled stress, the quantity the verdict compares; where noise withholds
        # every interval (_stress_intervals) that is the reason given
        if not scaled.trusted and not noisy:
            e["scaled_stress_tie_range"] = scaled.interval
            e["stress_ci95"], e["scaled_stress_ci95"] = [e["stress"]] * 2, [e["scaled_stress"]] * 2
            e["stress_interval"] = _large_correction_reason(scaled.correction, scaled.sd)
            continue
        e["stress_ci95"], e["scaled_stress_ci95"] = raw.interval, scaled.interval
        e["stress_interval"] = (f"jackknife, {JACKKNIFE_GROUPS} random token groups, on "
                                f"{i.size:,} sampled pairs" + (" plus the stress's own pair sampling" if sampled
                                                               else "") + ", cut to the quantity's range")
    return noise_share


_Z95 = 1.959963984540054


def _pairs_noise_share(g: _Rows, rows: sp.csr_array | None, i: np.ndarray, j: np.ndarray, h: np.ndarray, *,
                       corrected: bool, seed: int, occupancy_adjusted: bool = False) -> float | None:
    """:func:`posstats.estimates.pair_jackknife.pair_noise_share` of the pairs: from the rows,
    or (held apart) from their occupancies and pooled counts; ``occupancy_adjusted`` as the
    pairs' distances ``h`` were (the exact path)."""
    if rows is None:
        return pair_noise_share(None, i, j, h, corrected=corrected, seed=seed, occupancy=g.occupancy,
                                pooled=g.column_totals(), occupancy_adjusted=occupancy_adjusted)
    return pair_noise_share(rows, i, j, h, corrected=corrected, seed=seed, occupancy_adjusted=occupancy_adjusted)


def _jackknife_pair_sample(geometry: _Geometry, g: _Rows,
                           config: AnalysisConfig) -> tuple[sp.csr_array | None, np.ndarray, np.ndarray, np.ndarray]:
    """The canonical int64 CSR rows (None when held apart) and the pair-sample jackknife's
    pairs ``i, j`` with their corpus distances ``h``: the sampled geometry's own, else drawn
    (:func:`draw_jackknife_pairs`) and read from the exact distances."""
    if g.ranged:
        i, j, h = geometry.jackknife_pairs
        return None, i, j, h
    rows = sp.csr_array(g.rows, dtype=np.int64) if not sp.issparse(g.rows) else sp.csr_array(g.rows)
    rows.sum_duplicates()  # a no-op on canonical counts (no copy)
    if geometry.jackknife_pairs is not None:
        i, j, h = geometry.jackknife_pairs
    else:
        i, j = draw_jackknife_pairs(len(g.positions), entries_per_row=rows.nnz / len(g.positions), seed=config.seed)
        h = geometry.distances[i, j]
    return rows, i, j, h


def _uncompared(geometry: _Geometry, g: _Rows, *, corrected: bool, config: AnalysisConfig,
                noise_share: float | None) -> float | None:
    """Stress entries when no test found structure: no interval (``stress_interval`` says
    why); on the sampled path the pairs' interval, which leaves out the token noise, stays
    as the range for ties. Above ``_JACKKNIFE_LIMIT`` rows the noise share (for the report's
    caveat) still comes from the pairs when no null gave it. Returns the noise share."""
    for e in geometry.encodings:
        if geometry.jackknife_pairs is not None:
            e["scaled_stress_tie_range"] = e["scaled_stress_ci95"]
            e["stress_ci95"], e["scaled_stress_ci95"] = [e["stress"]] * 2, [e["scaled_stress"]] * 2
        e["stress_interval"] = NO_STRUCTURE_INTERVAL
    if noise_share is None and (geometry.jackknife_pairs is not None or len(g.positions) > _JACKKNIFE_LIMIT):
        rows, i, j, h = _jackknife_pair_sample(geometry, g, config)
        noise_share = _pairs_noise_share(g, rows, i, j, h, corrected=corrected, seed=config.seed,
                                         occupancy_adjusted=geometry.occupancy_adjusted)
    return noise_share


def _encoding_pair_distances_of(spec: str, dim: int, g: _Rows, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """``|p_i - p_j|`` of a fixed encoding over the pairs."""
    p = np.asarray(make_encoding(spec, g.positions, dim, occupancy=g.occupancy, context=g.context).matrix,
                   dtype=np.float64)
    return _encoding_pair_distances(p, i, j)


# ----------------------------------------------------------------------------- sampled path


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


def _null_choice(config: AnalysisConfig, m: int, noise: Any) -> str:
    """The null the analysis of ``m`` geometry rows draws: ``config.null``, with ``auto``
    resolved (the shuffled corpora up to :data:`_NULL_SHUFFLE_LIMIT` rows, else the analytic
    edge when a noise floor exists, else none)."""
    if config.null != "auto":
        return config.null
    return "shuffle" if m <= _NULL_SHUFFLE_LIMIT else ("mp" if noise is not None else "none")


def _untested(config: AnalysisConfig, m: int, noise: Any, standout: dict[str, Any] | None,
              counts: PositionalCounts) -> str | None:
    """Why no test of the analysis can find positional structure, known before the
    geometry, or None. The verdict then ties every encoding whatever the MDS and the
    stresses come out as (:func:`posstats.estimates.verdict.all_tied`): without the shuffle
    null there is no homogeneity test, so non-stationarity rests on the standout test, and
    it found no position (or the verdict is withheld for too few windows)."""
    if _null_choice(config, m, noise) == "shuffle":
        return None
    withheld = too_few_windows(counts.spec.mode, counts.windows)
    if withheld:
        return f"the verdict is withheld: {withheld}"
    if standout is None or int(standout.get("count") or 0) > 0:
        return None
    return "no standout position, and no homogeneity test without the shuffle null"


def _noise_level(bias: np.ndarray | None, noise: Any, geo_parts: Any, config: AnalysisConfig,
                 m: int, *, untested: bool = False, edge: float | None = None) -> tuple[float, float] | None:
    """``(level, residual)`` for the Lanczos MDS when the null is the analytic edge, known
    before the MDS: eigenvalues below ``level`` (the edge on the decomposed matrix's scale:
    plug-in, or shifted down by the mean bias for the corrected one) are sampling noise, and
    are computed to the absolute residual ``share x edge`` only, with share
    ``config.lanczos_noise_share`` (``untested_lanczos_noise_share`` when no test can find
    structure: :func:`_untested`); None (every pair to ``lanczos_tol``) otherwise.
    ``edge``: the edge measured on independent halves (:class:`_HalvesEdges`), else analytic."""
    share = config.untested_lanczos_noise_share if untested else config.lanczos_noise_share
    if not share:
        return None
    if _null_choice(config, m, noise) != "mp" or noise is None:
        return None
    edge = mp_edge(geo_parts, noise) if edge is None else edge
    if not math.isfinite(edge) or edge <= 0:
        return None
    return edge - bias_shift(bias), share * edge


HALVES_MIN_COVERAGE = 0.9  # the halves' least share of a row's tokens for their edge to be used


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
                and _null_choice(config, len(g.index), noise) == "mp"):
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
        """The halves' rescaled noise, once (none below :data:`HALVES_MIN_COVERAGE`)."""
        if self._g.ranged:
            return ranged_halves_noise(self._g.halves, self._g.occupancy, np.diff(self._g.rows.edges),
                                       self._g.rows.shape[1], source=self.source, min_coverage=HALVES_MIN_COVERAGE)
        a, b = self._halves()
        return halves_noise(a, b, self._g.rows, source=self.source, min_coverage=HALVES_MIN_COVERAGE)

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


def _edge_weights(config: AnalysisConfig, g: _Rows, noise: Any) -> np.ndarray | None:
    """The occupancy weights of the analytic edge's rank test
    (:func:`posstats.estimates.permutation.occupancy_weights`): None unless that null runs,
    occupancies differ and the noise floor can give the weighted edge (a token-split floor
    carries its weighted column noise; one from parts computes it)."""
    if _null_choice(config, len(g.index), noise) != "mp" or noise is None:
        return None
    if noise.column_noise is not None and noise.occupancy_column_noise is None:
        return None
    return occupancy_weights(g.occupancy)


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
    (:func:`posstats.geometry.mds.weighted_gram_eigenpairs`)."""
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
    with progress(desc=f"MDS (Lanczos{', GPU' if gpu else ''})", unit="products", enabled=show_progress) as bar:

        def report(products: int, residual: float) -> None:
            bar.update(products - bar.n)
            bar.set_postfix_str(f"residual {residual:.1e} (target {config.lanczos_tol:.0e})", refresh=False)

        level, residual = noise_level if noise_level is not None else (None, None)
        mds = classical_mds(products, k=min(max(config.dims), m - 1), method="lanczos", tol=config.lanczos_tol,
                            seed=config.seed, diagonal=bias, progress=report, noise_level=level,
                            noise_residual=residual, xp=gpu)
    timings["mds"] = time.perf_counter() - t
    tested = None
    if rank_test is not None:  # the same operator, whitened by the occupancy weights
        t = time.perf_counter()
        weights, (w_level, w_residual) = rank_test[0], rank_test[1] or (None, None)
        with progress(desc="rank test (occupancy-weighted Lanczos)", unit="products", enabled=show_progress) as bar:
            before = [0]

            def solve(k: int) -> tuple[np.ndarray, np.ndarray]:
                out = weighted_gram_eigenpairs(products, weights, k=k, diagonal=bias, tol=config.lanczos_tol,
                                               seed=config.seed, noise_level=w_level, noise_residual=w_residual,
                                               progress=lambda done, _: bar.update(before[0] + done - bar.n))
                before[0] = bar.n
                return out

            tested = first_then_all(solve, _rank_test_k(mds.eigenvalues.size), w_level)
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
                     occupancy_adjusted=bias is not None, shrinkage=shrinkage, rank_test=tested)


def _mean_interval(x: np.ndarray) -> list[float]:
    half = 1.959963984540054 * float(np.std(x, ddof=1)) / np.sqrt(x.size) if x.size > 1 else float("nan")
    return [float(x.mean()) - half, float(x.mean()) + half]


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


_MAX_NULL_REPLICATES = 999  # a config value bounds a loop: 999 gives p-values down to 0.001
_MAX_TRIPLES = 20_000_000  # sampled monotonicity triples (corpus or encoding): 480 MB of indices
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
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, np.ndarray | None]:
    """``(null, homogeneity, weighted)``: the report sections, how many MDS components stand
    above a null corpus (:func:`posstats.estimates.noise.null_rank`) and, from the same null corpora,
    the test of homogeneity (None without them). The null corpora are shuffled
    (:mod:`posstats.estimates.permutation`) or, with usable window groups (``windows =
    (groups, None)``; else ``(None, why not)``), rotated (:mod:`posstats.estimates.rotation`:
    the dependence inside windows kept, for both tests). With the exact path's (m, m)
    ``distances`` the null also says which share of their sum sampling noise alone reaches
    (``distance_noise``), always from shuffled corpora: rotated ones carry the structure
    they move (:func:`posstats.estimates.permutation.null_distance_sums`). ``rank_test``: the
    data's occupancy-weighted eigenvalues and eigenvectors when the geometry computed
    them (the exact path from its distance matrix; the sampled path, for the analytic edge,
    by Lanczos on its operator); for the shuffled or rotated null they are otherwise
    computed here where occupancies differ. ``weighted``: where the test was weighted and
    counts components, their (m, k) coordinates
    (:func:`posstats.geometry.mds.weighted_coordinates`), else None."""
    m = len(g.index)
    choice = _null_choice(config, m, noise)
    if choice == "none":
        return None, None, None
    adjust = {"shrinkage": shrinkage} if shrinkage is not None else {}
    t = time.perf_counter()
    lam = np.asarray(mds.eigenvalues, dtype=np.float64)
    homogeneity = None
    groups, why_not = windows
    weights = None
    if choice == "shuffle":
        # where occupancies differ, the rank test reads the occupancy-whitened Gram matrix
        # (posstats.estimates.permutation, "Occupancy weighting"): None at equal occupancy
        weights = occupancy_weights(g.occupancy)
        options = {"replicates": config.null_replicates, "corrected": bias is not None, "seed": config.seed,
                   "eigen_replicates": _eigen_replicates(m, config.null_replicates), "weights": weights}
        what = "rotated corpora" if groups is not None else "shuffled corpora"
        shuffled_sums = groups is not None and distances is not None  # the noise share's own shuffled corpora
        total = config.null_replicates + (options["eigen_replicates"] if shuffled_sums else 0)
        with progress(total=total, desc=what, unit="corpus", enabled=show_progress) as bar:
            if groups is not None:
                perm = rotation_null_corpora(groups, g.rows, rows=g.index, progress=bar.update, **options, **adjust)
            else:
                perm = permutation_null(g.rows, progress=bar.update, **options, **adjust)
            if shuffled_sums:
                noise_sums = null_distance_sums(g.rows, replicates=options["eigen_replicates"],
                                                corrected=bias is not None, seed=config.seed,
                                                max_rows=_EIGEN_REPLICATE_ROWS, progress=bar.update, **adjust)
        vectors = None
        top_vector = mds.encoding[:, 0] if mds.encoding.shape[1] else None
        if weights is None:
            tested = lam
        else:  # the exact path's, from its distance matrix (formed once), else from the rows
            tested, vectors = rank_test if rank_test is not None else rank_test_eigenvalues(
                g.rows, corrected=bias is not None, k=_rank_test_k(lam.size), weights=weights, **adjust)
            top_vector = vectors[:, 0]
        nr = null_rank(tested, method="shuffle", permutation=perm)
        scale = "bias_corrected" if bias is not None else "plugin"
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
    else:
        if noise is None:
            return {"method": "mp", "components_above_null": None, "note": "no noise floor"}, None, None
        # where occupancies differ, the edge tests the occupancy-whitened Gram matrix too,
        # its eigenvalues computed with the geometry (rank_test) and the edge weighted alike
        weights = occupancy_weights(g.occupancy) if rank_test is not None else None
        tested, vectors = rank_test if weights is not None else (lam, None)
        top_vector = None if vectors is None else vectors[:, 0]
        scale, shift = "plugin", 0.0
        if bias is not None:
            # B_c = B - H diag(b) H shifts the spectrum down by about mean(b) (W^1/2 B_c W^1/2:
            # by mean(w_i b_i)); the MP edge is plug-in, so compare on the plug-in scale (the
            # report keeps the eigenvalues on their own scale, the threshold on the edge's)
            shift = bias_shift(bias, weights)
            scale = "corrected + mean bias"
        measured = None if halves is None else halves.measured(weights)
        nr = null_rank(tested + shift, method="mp", parts=geo_parts, floor=noise, weighted=weights is not None,
                       threshold=None if measured is None else measured.edge)
    timings["null"] = time.perf_counter() - t
    out = nr.to_dict()
    out["eigenvalue_scale"] = scale
    if scale == "corrected + mean bias":
        out["eigenvalue_shift"] = shift  # threshold - shift is the level on the corrected eigenvalues' scale
    if choice == "mp":  # which edge: measured on independent halves, or the analytic bound
        out["edge"] = measured.to_dict() if measured is not None else {"method": "analytic"}
        why = None if halves is None else halves.not_used(weights)
        if why:
            out["edge"]["halves_not_used"] = why
    if choice == "shuffle":
        out["level"] = 1.0 / (nr.replicates + 1)
        out["null_corpora"] = "rotated" if groups is not None else "shuffled"
    out["weighting"] = "occupancy" if weights is not None else "none"
    weighted = None
    if weights is not None:  # the threshold is on this scale, not the spectrum's
        out["tested_eigenvalues"] = [float(x) for x in tested[:_TESTED_SHOWN]]
        out["weighting_formula"] = "W^1/2 B W^1/2, W = diag(N_i / mean N)"
    if top_vector is not None and tested.size and tested[0] > 0:  # the tested top component's (weighted or not)
        out["top_component_occupancy"] = _loaded_occupancy(top_vector, g.occupancy)
        out["median_occupancy"] = float(np.median(g.occupancy))
    if weights is not None and nr.components_above_null:
        # the MDS (unweighted) components the verdict's count stands for: where each loads
        # (a leading component on thin positions is their noise, not the structure tested)
        k = min(int(nr.components_above_null), mds.encoding.shape[1], _TESTED_SHOWN)
        out["mds_component_occupancy"] = [_loaded_occupancy(mds.encoding[:, j], g.occupancy) for j in range(k)]
        out["median_occupancy"] = float(np.median(g.occupancy))
        # the components that test counted, as coordinates (what an export writes where the
        # MDS's leading components are thin positions' noise: posstats.reports.export)
        counted = min(int(nr.components_above_null), vectors.shape[1])
        weighted = weighted_coordinates(vectors[:, :counted], np.asarray(tested[:counted]), weights)
        out["weighted_mds_components"] = counted
    if choice == "shuffle" and distances is not None:
        out["distance_noise"] = (_distance_noise_entry(perm.null_distance_sums, distances) if groups is None else
                                 _distance_noise_entry(noise_sums, distances,
                                                       rows_per_replicate=min(m, _EIGEN_REPLICATE_ROWS)))
    return out, homogeneity, weighted


def _loaded_occupancy(column: np.ndarray, occupancy: np.ndarray) -> float:
    """The median occupancy of the positions an MDS component loads on: the occupancy
    median weighted by the component's squared loadings (a component on thinly occupied
    positions, whose sampling noise is large, has a low one; the verdict's caveat reads it)."""
    order = np.argsort(occupancy, kind="stable")
    weight = np.cumsum(np.asarray(column, dtype=np.float64)[order] ** 2)
    return float(np.asarray(occupancy)[order][min(int(np.searchsorted(weight, 0.5 * weight[-1])), order.size - 1)])


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


def _held_out_section(g: _Rows, geo_parts: Any, bias: np.ndarray | None, config: AnalysisConfig,
                      timings: dict[str, float], show_progress: bool | None, *, compared: bool = True) -> dict[str, Any] | None:
    """The ``held_out`` section (:mod:`posstats.estimates.held_out`): halves from the
    parts the noise floor used, else from a random split of the counted tokens; None when
    ``config.held_out`` leaves it out (``auto`` above its row limit: the section says so).
    Without ``compared`` (no structure found) the scores get no jackknife ranges."""
    m = len(g.index)
    if config.held_out == "off":
        return None
    if config.held_out == "auto" and m > HELD_OUT_AUTO_LIMIT:
        return {"skipped": f"{m:,} geometry rows > {HELD_OUT_AUTO_LIMIT:,}, the rows up to which held-out scores get "
                           "their ranges for ties (--held-out on scores it: a second MDS and stress pass)"}
    if g.ranged:  # analyze_ranges refuses "on"
        return {"skipped": "the rows are held apart in position ranges; held-out scores need the counts in one process"}
    t = time.perf_counter()
    if geo_parts is not None and len(geo_parts) >= 2:
        a, b = parts_halves([p.rows(g.index) for p in geo_parts])
        split = f"the noise floor's {len(geo_parts)} parts, even against odd"
    else:
        a, b = token_halves(g.rows, seed=config.seed)
        split = "tokens at random"
    jobs = encoding_jobs(config, m)
    exact = m <= config.exact_limit
    with progress(total=(len(jobs) + 2 + compared if exact else 3) + (bias is not None), desc="held out", unit="step", enabled=show_progress) as bar:

        def step(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

        bias_of = None
        if bias is not None:
            def bias_of(rows: Any) -> np.ndarray:
                return split_noise_floor(rows, parts=config.noise_parts, seed=config.seed, show_progress=False).bias

        section = held_out_scores(a, b, g.positions, jobs, exact=exact, split=split, bias_of=bias_of,
                                  context=g.context, seed=config.seed, stress_halfwidth=config.stress_halfwidth,
                                  stress_max_pairs=config.stress_max_pairs, lanczos_tol=config.lanczos_tol,
                                  progress=step, ranges=compared)
    timings["held_out"] = time.perf_counter() - t
    return section


def _details_entry(enc: Any) -> dict[str, Any]:
    """How an encoding was built, under its report key: ``fit`` (SMACOF) or ``rope`` (a RoPE
    variant's type, head_dim, attention factor, sequence length, wavelength range)."""
    if not enc.details:
        return {}
    return {("rope" if enc.name.startswith(("rope", "hf:")) else "fit"): dict(enc.details)}


def _evaluate(
    spec: str,
    positions: np.ndarray,
    dim: int,
    distances: np.ndarray,
    mds: MDSResult,
    config: AnalysisConfig,
    occupancy: np.ndarray,
    context: int,
) -> dict[str, Any]:
    """Stress and diagnostics of one encoding at one width, as a report entry."""
    enc = make_encoding(spec, positions, dim, mds=mds, distances=distances, occupancy=occupancy, context=context)
    s = stress_report(enc.matrix, distances)
    sep = min_separation(enc.matrix)
    mono = monotonicity_of_encoding(enc.matrix, positions=positions, exact_limit=config.monotonicity_exact_limit,
                                  samples=config.encoding_triples, seed=config.seed)
    return {
        "name": enc.name,
        "dim": int(dim),
        "stress": s.stress,
        "scaled_stress": s.scaled_stress,
        "scale": s.scale,
        "pearson": s.pearson,
        "min_separation": sep.value,
        "min_separation_pair": [int(positions[sep.pair[0]]), int(positions[sep.pair[1]])],
        "monotonicity_violation_rate": mono.rate,
        "monotonicity_method": mono.method,
        "monotonicity_ci95": [mono.ci_low, mono.ci_high],
        **_details_entry(enc),
    }
