"""What the spectrum figures of a run show: the cumulative explained share and the noise threshold.

Shared by report.html (:mod:`posstats.reports.html`) and the export's model card
(:mod:`posstats.reports.export`), so both draw the same curve and the same line.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from posstats.estimates.null_rank import EQUAL_WEIGHTS
from posstats.geometry.spectrum import Spectrum, spectrum_summary

__all__ = ["explained_label", "explained_share", "noise_threshold", "null_stopped", "rank_test_bound",
           "rank_test_eigenvalues", "threshold_phrase", "weighting_phrase", "weights_ratio"]


def _spectrum(eigenvalues: Any, report: dict[str, Any]) -> Spectrum:
    """:func:`spectrum_summary` of ``eigenvalues`` over the denominator the report recorded:
    its total variance for a truncated spectrum (``total_variance``), else the positive
    eigenvalues given (``positive_eigenvalues``, or ``computed_positive_eigenvalues`` when
    the trace fell below the top k's positive sum). Following the record, not recomputing
    the choice, keeps the curve and its label in step with the report's key numbers when
    the two sums are within rounding of each other."""
    spectrum = report.get("spectrum") or {}
    total = spectrum.get("total_variance") if spectrum.get("denominator") == "total_variance" else None
    return spectrum_summary(eigenvalues, total_variance=total)


def explained_share(eigenvalues: Any, report: dict[str, Any], /) -> np.ndarray:
    """(k,) cumulative share of the positive variance of ``eigenvalues`` (monotone, <= 1;
    :func:`posstats.geometry.spectrum.spectrum_summary`). Recomputed rather than read from the
    report: reports written before 2026-11-26 counted negative eigenvalues, so their curve
    fell after reaching 1."""
    return _spectrum(eigenvalues, report).explained_variance


def explained_label(eigenvalues: Any, report: dict[str, Any], /) -> str:
    """The legend of :func:`explained_share`'s curve: the share of the positive variance, or,
    when only the top k were computed and the trace was below their positive sum (negative
    eigenvalues beyond them), the share of those k components' variance only."""
    recorded = (report.get("spectrum") or {}).get("denominator")
    if recorded == "computed_positive_eigenvalues" or (
            recorded is None and _spectrum(eigenvalues, report).denominator == "computed_positive_eigenvalues"):
        return f"cumulative share of the top {len(eigenvalues)} components' variance"
    return "cumulative share of the positive variance"


def noise_threshold(report: dict[str, Any], /) -> float | None:
    """The eigenvalue level above which components count as structure, on the scale of the
    report's eigenvalues: the null's threshold (``null.threshold``; the ``mp`` edge is on
    the plug-in scale, so with corrected eigenvalues the mean bias it was compared after,
    ``null.eigenvalue_shift``, is taken off), else an explicit ``noise_floor`` (a number,
    or an object with an ``eigenvalue``); None when the report has none. When the rank test
    read occupancy-weighted eigenvalues the threshold is on their scale
    (:func:`rank_test_eigenvalues`), not the spectrum's."""
    null = report.get("null") or {}
    threshold = null.get("threshold")
    if isinstance(threshold, (int, float)) and math.isfinite(threshold):
        if null.get("eigenvalue_scale") == "corrected + mean bias":
            shift = null.get("eigenvalue_shift")
            return float(threshold) - float(shift) if isinstance(shift, (int, float)) else None
        return float(threshold)
    nf = report.get("noise_floor")
    if isinstance(nf, dict):
        nf = nf.get("eigenvalue")
    return float(nf) if isinstance(nf, (int, float)) else None


def null_stopped(report: dict[str, Any], /) -> tuple[int, int] | None:
    """``(solved, replicates)`` where the rank test stopped solving null corpora once one's
    top eigenvalue reached the corpus' largest (``null.replicates_solved`` below
    ``null.replicates``; :mod:`posstats.estimates.permutation`, "Stopping once decided"): no
    component can count, and :func:`noise_threshold` is a lower bound of the full test's.
    None when every null corpus was solved (or the report predates the stop)."""
    null = report.get("null") or {}
    solved, planned = null.get("replicates_solved"), null.get("replicates")
    if isinstance(solved, int) and isinstance(planned, int) and solved < planned:
        return solved, planned
    return None


def threshold_phrase(report: dict[str, Any], value: str, /) -> str:
    """How the verdict line gives the rank test's threshold (``value``, formatted): the
    threshold itself, or, where the test stopped once decided (:func:`null_stopped`), a
    lower bound and why.

    >>> threshold_phrase({"null": {"replicates": 39, "replicates_solved": 2}}, "0.19")
    "threshold at least 0.19: null corpus 2 of 39 already reached the corpus' top eigenvalue, so none can count and the other 37 were not solved"
    """
    stopped = null_stopped(report)
    if stopped is None:
        return f"threshold {value}"
    solved, planned = stopped
    return (f"threshold at least {value}: null corpus {solved} of {planned} already reached the corpus' top eigenvalue, "
            f"so none can count and the other {planned - solved} were not solved")


def rank_test_eigenvalues(report: dict[str, Any], /) -> list[float] | None:
    """The eigenvalues the rank test compared with :func:`noise_threshold` when they are not
    the spectrum's: the occupancy-weighted ones (``null.tested_eigenvalues``, where
    ``null.weighting`` is ``occupancy``); None otherwise."""
    null = report.get("null") or {}
    tested = null.get("tested_eigenvalues")
    if null.get("weighting") != "occupancy" or not isinstance(tested, list):
        return None
    return [float(x) for x in tested]


def weights_ratio(report: dict[str, Any], /) -> float | None:
    """``max(w) / min(w)`` of the rank test's occupancy weights (``null.weights_ratio``), or
    None (no weighting, or a report written before the ratio was recorded)."""
    ratio = (report.get("null") or {}).get("weights_ratio")
    return float(ratio) if isinstance(ratio, (int, float)) else None


def weighting_phrase(ratio: float | None, /) -> str:
    """What the occupancy weighting did, in the report's words (the verdict line and the
    scree figure's caption): weights within
    :data:`~posstats.estimates.null_rank.EQUAL_WEIGHTS` of each other (pack mode: only the
    last window is short) are as good as none; otherwise (or with ``ratio`` None, a report
    before it was recorded) thin positions' noise is down-weighted, the case it is for.

    >>> weighting_phrase(1.0002), weighting_phrase(3.0)
    ('weights within 0.02%: as good as unweighted', "the thin positions' noise down-weighted")
    """
    if ratio is not None and ratio <= 1.0 + EQUAL_WEIGHTS:
        return f"weights within {ratio - 1.0:.2%}: as good as unweighted"
    return "the thin positions' noise down-weighted"


def rank_test_bound(report: dict[str, Any], /) -> float | None:
    """``max(w) / min(w)`` where the rank test's eigenvalues (:func:`rank_test_eigenvalues`)
    are upper bounds from the unweighted spectrum, not solved (``null.tested_bound``), else
    None."""
    bound = (report.get("null") or {}).get("tested_bound")
    ratio = bound.get("weights_ratio") if isinstance(bound, dict) else None
    return float(ratio) if isinstance(ratio, (int, float)) else None
