"""Scores one encoding against the corpus' distances: stress, its details and diagnostics.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from posstats.analysis.config import AnalysisConfig
from posstats.geometry.diagnostics import min_separation, monotonicity_of_encoding
from posstats.geometry.encodings import make_encoding
from posstats.geometry.mds import MDSResult
from posstats.geometry.stress import stress_report


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
