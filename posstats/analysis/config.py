"""The analysis' options: :class:`AnalysisConfig` (each option declared once, with its type,
default, choices and help) and which encodings a run scores at which dimensions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from posstats.counting.buckets import parse_buckets
from posstats.errors import OptionError, PosstatsError
from posstats.estimates.held_out import HELD_OUT_CHOICES
from posstats.geometry.encodings import (
    DEFAULT_ENCODINGS,
    DEFAULT_MAX_ENCODINGS,
    check_encoding_count,
    encoding_dims,
    encoding_sweeps,
    expand_encoding_specs,
    family_of,
    make_encoding,
    split_encoding_list,
)
from posstats.memory import encoding_probe_bytes, require_memory
from posstats.options import option, option_values

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
            else analytic (:func:`posstats.estimates.null_rank.mp_edge`).
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
                   "analytic edge as an absolute residual, the others to the Lanczos tolerance (0: every pair to "
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
                     "groups) and counts eigenvalues 10 % above it from 512 rows, more below, where the top "
                     "varies more (20 % at 64 rows: docs/calibration.md); without such halves, and with analytic, "
                     "the analytic Marchenko-Pastur-type bound (1.3-2.2x above the bulk with independent tokens, "
                     "blind to dependent ones)", group=_LONG)
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


_MAX_NULL_REPLICATES = 999  # a config value bounds a loop: 999 gives p-values down to 0.001
_MAX_TRIPLES = 20_000_000  # sampled monotonicity triples (corpus or encoding): 480 MB of indices
