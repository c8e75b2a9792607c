"""The spectrum of an MDS Gram matrix summarised (THEORY.md section 3): effective ranks,
the share of variance at each coverage level, the negative mass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from posstats.geometry.backend import to_numpy

__all__ = ["Spectrum", "spectrum_summary"]


_COVERAGE_LEVELS = (0.9, 0.95, 0.99, 0.999)


@dataclass(frozen=True)
class Spectrum:
    """Summary of an MDS spectrum (see :func:`spectrum_summary`).

    Attributes:
        eigenvalues: (k,) float64, descending.
        rank: number of eigenvalues ``> rank_rtol * eigenvalues[0]`` (among those given;
            a lower bound when the spectrum is truncated and every given one counts).
        rank_rtol: the relative tolerance used for ``rank``.
        explained_variance: (k,) cumulative ``sum_{j<=r} max(lambda_j, 0) / total_variance``:
            the share of the positive variance, monotone and at most 1 (negative eigenvalues
            of a bias-corrected ``B`` explain nothing; their share is ``negative_mass``).
        components_for: smallest ``r`` whose cumulative explained variance reaches each
            level ``"0.9", "0.95", "0.99", "0.999"``, or None if none of the given
            eigenvalues reaches it.
        negative_mass: ``sum |lambda < 0| / sum |lambda|`` over the given eigenvalues.
        total_variance: the denominator of ``explained_variance``.
        denominator: ``"positive_eigenvalues"`` (the sum of the positive given
            eigenvalues: the spectrum was taken as complete), ``"total_variance"``
            (``trace(B)`` supplied by the caller, as needed when only the top-k are known)
            or ``"computed_positive_eigenvalues"`` (the supplied trace was below the sum of
            the positive top-k, as negative eigenvalues beyond them make it: the top-k's
            positive sum, so the shares are of the computed components only).
    """

    eigenvalues: np.ndarray
    rank: int
    rank_rtol: float
    explained_variance: np.ndarray
    components_for: dict[str, int | None]
    negative_mass: float
    total_variance: float
    denominator: Literal["positive_eigenvalues", "total_variance", "computed_positive_eigenvalues"]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plain Python values."""
        return {
            "eigenvalues": [float(x) for x in self.eigenvalues],
            "rank": int(self.rank),
            "rank_rtol": float(self.rank_rtol),
            "explained_variance": [float(x) for x in self.explained_variance],
            "components_for": {key: (None if r is None else int(r)) for key, r in self.components_for.items()},
            "negative_mass": float(self.negative_mass),
            "total_variance": float(self.total_variance),
            "denominator": self.denominator,
        }


def _negative_mass(eigenvalues: np.ndarray) -> float:
    absolute = float(np.sum(np.abs(eigenvalues)))
    if absolute == 0.0:
        return 0.0
    return float(np.sum(np.abs(eigenvalues[eigenvalues < 0]))) / absolute


def spectrum_summary(eigenvalues: Any, /, *, total_variance: float | None = None, rtol: float = 1e-10) -> Spectrum:
    """Rank, cumulative explained variance and negative mass of MDS eigenvalues.

    Args:
        eigenvalues: (k,) eigenvalues of ``B`` (any order; sorted descending here), numpy
            or cupy.
        total_variance: ``trace(B) = ||S_c||_F^2``. Pass it when ``eigenvalues`` holds only
            the top-k: it is then the denominator of the explained variance (or the sum of
            the positive top-k, when that is larger: see :class:`Spectrum`). When None the
            eigenvalues are taken as the whole spectrum and the denominator is the sum of
            the positive ones (THEORY.md section 3). Only positive eigenvalues count in the
            numerator, so the cumulative share is monotone and at most 1.
        rtol: relative tolerance of the numerical rank.

    Returns:
        :class:`Spectrum`.

    >>> spectrum_summary(np.array([3.0, 1.0, 0.0])).components_for["0.9"]
    2
    """
    lam = np.sort(np.asarray(to_numpy(eigenvalues), dtype=np.float64).reshape(-1))[::-1].copy()
    if not rtol >= 0:
        msg = f"rtol must be >= 0; got {rtol}"
        raise ValueError(msg)
    top = float(lam[0]) if lam.size else 0.0
    rank = int(np.count_nonzero(lam > rtol * top)) if top > 0 else 0
    positive = np.maximum(lam, 0.0)
    positive_sum = float(np.sum(positive))
    denominator: Literal["positive_eigenvalues", "total_variance", "computed_positive_eigenvalues"]
    if total_variance is None:
        denominator, total = "positive_eigenvalues", positive_sum
    elif float(total_variance) >= positive_sum:
        denominator, total = "total_variance", float(total_variance)
    else:
        denominator, total = "computed_positive_eigenvalues", positive_sum
    cumulative = np.cumsum(positive) / total if total > 0 else np.zeros_like(lam)
    np.minimum(cumulative, 1.0, out=cumulative)  # rounding of the cumulative sum
    components_for: dict[str, int | None] = {}
    for level in _COVERAGE_LEVELS:
        reached = np.nonzero(cumulative >= level)[0]
        components_for[str(level)] = int(reached[0]) + 1 if reached.size else None
    return Spectrum(
        eigenvalues=lam,
        rank=rank,
        rank_rtol=float(rtol),
        explained_variance=cumulative,
        components_for=components_for,
        negative_mass=_negative_mass(lam),
        total_variance=total,
        denominator=denominator,
    )
