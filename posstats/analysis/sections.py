"""Small report sections built from arrays: the Hellinger summary, the corpus, the positions
used and the spectrum (schema in docs/report.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from posstats.counting.counts import PositionalCounts
from posstats.geometry.mds import MDSResult

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


def _mean_interval(x: np.ndarray) -> list[float]:
    half = 1.959963984540054 * float(np.std(x, ddof=1)) / np.sqrt(x.size) if x.size > 1 else float("nan")
    return [float(x.mean()) - half, float(x.mean()) + half]
