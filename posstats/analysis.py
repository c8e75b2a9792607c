"""The analysis pipeline: counts -> Hellinger geometry -> MDS -> encodings -> report.

:func:`analyze` ties the single-concept modules together and returns an
:class:`Analysis` whose :meth:`Analysis.report` is the ``report.json`` document
(schema in README.md, "report.json").
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from posstats import __version__
from posstats.counts import PositionalCounts
from posstats.diagnostics import corpus_diagnostics, min_separation, monotonicity_of_encoding
from posstats.encodings import DEFAULT_ENCODINGS, make_encoding, parse_encoding_spec
from posstats.errors import InputError, PosstatsError
from posstats.hellinger import hellinger_sq
from posstats.mds import MDSResult, classical_mds
from posstats.progress import progress
from posstats.stress import stress_report

__all__ = ["SCHEMA_VERSION", "Analysis", "AnalysisConfig", "analyze"]

SCHEMA_VERSION = 1
DEFAULT_DIMS = (2, 16, 64)


@dataclass(frozen=True)
class _ProbeMDS:
    encoding: np.ndarray


@dataclass(frozen=True)
class AnalysisConfig:
    """Options of :func:`analyze`.

    Attributes:
        dims: encoding widths d to evaluate (each >= 1).
        encodings: encoding spec strings (see :mod:`posstats.encodings`).
        min_occupancy: positions with fewer counted tokens are left out of the geometry.
        rank_rtol: relative tolerance of the numerical rank.
        mds_method: ``auto`` | ``dense`` | ``iterative`` (see :func:`classical_mds`).
        monotonicity_exact_limit: positions above which monotonicity is sampled.
        seed: seeds every random choice (random encodings, solvers, sampling).
    """

    dims: tuple[int, ...] = DEFAULT_DIMS
    encodings: tuple[str, ...] = DEFAULT_ENCODINGS
    min_occupancy: int = 1
    rank_rtol: float = 1e-10
    mds_method: str = "auto"
    monotonicity_exact_limit: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.dims:
            raise PosstatsError("give at least one dimension (--dims)")
        for d in self.dims:
            if int(d) != d or d < 1:
                msg = f"dimensions must be positive integers, got {d!r}"
                raise PosstatsError(msg)
        if not self.encodings:
            raise PosstatsError("give at least one encoding (--encodings)")
        # Build every (encoding, width) on two positions so that unknown names, odd widths
        # for sinusoidal/RoPE or unreadable tables fail before any counting work.
        probe = _ProbeMDS(np.eye(2, max(self.dims)))
        probe_distances = np.array([[0.0, 1.0], [1.0, 0.0]])
        for spec in self.encodings:
            parse_encoding_spec(spec)
            for d in self.dims:
                make_encoding(spec, np.arange(2), int(d), mds=probe, distances=probe_distances, occupancy=np.ones(2))
        if self.min_occupancy < 1:
            msg = f"the minimum occupancy must be >= 1, got {self.min_occupancy}"
            raise PosstatsError(msg)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "dims": list(self.dims),
            "encodings": list(self.encodings),
            "min_occupancy": self.min_occupancy,
            "rank_rtol": self.rank_rtol,
            "mds_method": self.mds_method,
            "monotonicity_exact_limit": self.monotonicity_exact_limit,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class Analysis:
    """Everything :func:`analyze` computed.

    Attributes:
        counts: the input counts.
        config: the options used.
        positions: (m,) 0-based occupied positions that entered the geometry.
        distances: (m, m) Hellinger distances d_H between those positions.
        mds: the classical-MDS result for those positions.
        diagnostics: corpus diagnostics (H1, A3) as a JSON-ready dict.
        encodings: one JSON-ready dict per (dimension, encoding).
        timings: seconds per step.
    """

    counts: PositionalCounts
    config: AnalysisConfig
    positions: np.ndarray
    distances: np.ndarray
    mds: MDSResult
    diagnostics: dict[str, Any]
    encodings: list[dict[str, Any]]
    timings: dict[str, float] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        """The ``report.json`` document (see README.md for the schema)."""
        c = self.counts
        occ = c.occupancy()
        spectrum = self.mds.spectrum(rtol=self.config.rank_rtol).to_dict()
        spectrum.update(
            method=self.mds.method,
            solver_tol=self.mds.tol,
            max_residual=float(np.max(self.mds.residuals)) if self.mds.residuals.size else 0.0,
        )
        off = self.distances[~np.eye(len(self.positions), dtype=bool)]
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "posstats", "version": __version__},
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "config": self.config.to_dict(),
            "corpus": {
                "sequences": c.sequences,
                "windows": c.windows,
                "tokens_counted": c.tokens,
                "vocab_size": c.vocab_size,
                "mode": c.spec.mode,
                "exclude_ids": list(c.spec.exclude_ids),
                "separator_id": c.spec.separator_id,
                "fingerprint": c.fingerprint,
                **{k: v for k, v in c.metadata.items()},
            },
            "positions": {
                "requested": c.positions,
                "occupied": int(np.count_nonzero(occ)),
                "used": len(self.positions),
                "min_occupancy": self.config.min_occupancy,
                "occupancy": occ.tolist(),
                "left_out": np.flatnonzero(occ < max(self.config.min_occupancy, 1)).tolist(),
            },
            "hellinger": {
                "convention": "d_H^2 = sum_v (sqrt mu_i - sqrt mu_j)^2, in [0, 2]",
                "min": float(off.min()) if off.size else 0.0,
                "mean": float(off.mean()) if off.size else 0.0,
                "max": float(off.max()) if off.size else 0.0,
            },
            "diagnostics": self.diagnostics,
            "spectrum": spectrum,
            "encodings": self.encodings,
            "timings_s": {k: round(v, 4) for k, v in self.timings.items()},
        }


def analyze(counts: PositionalCounts, config: AnalysisConfig | None = None, /, *, show_progress: bool | None = None) -> Analysis:
    """Run the geometry and encoding analysis of THEORY sections 2-6 on ``counts``.

    Raises:
        InputError: fewer than two positions reach the minimum occupancy.
    """
    config = config or AnalysisConfig()
    timings: dict[str, float] = {}
    positions = counts.occupied_positions(min_occupancy=config.min_occupancy)
    if len(positions) < 2:
        msg = (
            f"{len(positions)} position(s) have at least {config.min_occupancy} counted token(s); "
            "the geometry needs two or more (count more text, or lower --min-occupancy)"
        )
        raise InputError(msg)
    rows = counts.rows(positions)

    t = time.perf_counter()
    distances = np.sqrt(hellinger_sq(rows))
    timings["hellinger"] = time.perf_counter() - t

    t = time.perf_counter()
    m = len(positions)
    k = None if config.mds_method == "dense" or (config.mds_method == "auto" and m <= 2048) else min(max(config.dims), m)
    mds = classical_mds(rows, k=k, method=config.mds_method, seed=config.seed)
    timings["mds"] = time.perf_counter() - t

    t = time.perf_counter()
    diag = corpus_diagnostics(distances, positions=positions, exact_limit=config.monotonicity_exact_limit, seed=config.seed)
    diagnostics = {
        "h1": {
            "min_distance": float(diag.min_distance),
            "pair": [int(positions[diag.pair[0]]), int(positions[diag.pair[1]])],
            "nonstationary": bool(diag.nonstationary),
        },
        "a3": diag.monotonicity.to_dict(),
    }
    timings["corpus_diagnostics"] = time.perf_counter() - t

    occupancy = counts.occupancy()[positions]
    results = []
    jobs = [(d, spec) for d in config.dims for spec in config.encodings]
    t = time.perf_counter()
    with progress(total=len(jobs), desc="encodings", unit="enc", enabled=show_progress) as bar:
        for dim, spec in jobs:
            results.append(_evaluate(spec, positions, dim, distances, mds, config, occupancy))
            bar.update(1)
    timings["encodings"] = time.perf_counter() - t
    return Analysis(counts, config, positions, distances, mds, diagnostics, results, timings)


def _evaluate(
    spec: str,
    positions: np.ndarray,
    dim: int,
    distances: np.ndarray,
    mds: MDSResult,
    config: AnalysisConfig,
    occupancy: np.ndarray,
) -> dict[str, Any]:
    """Stress and diagnostics of one encoding at one width, as a report entry."""
    enc = make_encoding(spec, positions, dim, mds=mds, distances=distances, occupancy=occupancy)
    s = stress_report(enc.matrix, distances)
    sep = min_separation(enc.matrix)
    mono = monotonicity_of_encoding(enc.matrix, positions=positions, exact_limit=config.monotonicity_exact_limit, seed=config.seed)
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
        **({"fit": dict(enc.details)} if enc.details else {}),
    }
