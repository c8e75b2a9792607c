"""The null rank (THEORY.md section 7): how many MDS components stand above sampling noise.

The eigenvalues of ``B`` are compared with those of a *null corpus* in which positions carry
no information (:func:`null_rank`):

- ``shuffle``: the permutation null of :mod:`posstats.estimates.permutation` (the tokens
  shuffled across positions, each position's occupancy and the pooled counts kept, 39
  corpora by default). An eigenvalue counts when it exceeds the largest top eigenvalue of
  every shuffled corpus: a Monte Carlo test at level 1 / (R + 1). The null goes through
  the data's own estimator (plug-in or bias-corrected with its own ``b``), so the scales
  match exactly; artefacts of unequal occupancy are in the null too. An earlier rule (the
  largest of 3 Poisson-drawn null corpora plus two standard deviations) claimed a
  component in 7-25 % of stationary corpora.
- ``mp``: an analytic Marchenko-Pastur-type edge ``(sqrt(max_i r_i) + sqrt(max_v c_v))^2``
  from the noise variance of each row (``r_i = b_i``) and each column
  (``c_v = sum_i (b_i / h_i) (s_A[i, v] - s_B[i, v])^2``, the split halves' differences
  scaled to the bias). For independent noise of equal variance this is exactly the MP
  edge ``sigma^2 (1 + sqrt(n / V))^2``; with unequal variances the maxima make it an
  upper estimate. It needs the parts but no second solve (for very long contexts); its
  level is not calibrated (docs/calibration.md).

The ``mp`` edge is on the plug-in scale (``B``, not ``B_c``): the analysis shifts
bias-corrected eigenvalues back by the mean bias before comparing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from posstats.counting.counts import PositionalCounts
from posstats.estimates.noise import NoiseFloor, _rows_csr, _union, usable_rows
from posstats.estimates.permutation import PermutationNull, permutation_null
from posstats.geometry.hellinger import sqrt_distributions

__all__ = [
    "EDGE_DECISION_SHARE",
    "EDGE_RANK_TEST_FIRST",
    "EQUAL_WEIGHTS",
    "NULL_METHODS",
    "NullRank",
    "bias_shift",
    "bounded_rank_test",
    "bulk_residual",
    "congruence_upper_bound",
    "edge_decision_level",
    "equal_weights_ratio",
    "first_then_all",
    "mp_edge",
    "mp_edge_value",
    "null_rank",
    "tested_bound_entry",
]


NULL_METHODS = ("shuffle", "mp")


@dataclass(frozen=True)
class NullRank:
    """How many MDS components stand above the null (module docstring).

    Attributes:
        method: ``"shuffle"`` or ``"mp"``.
        threshold: shuffle: the largest top eigenvalue of the shuffled corpora; mp: the
            analytic edge.
        components_above_null: eigenvalues of the data strictly above ``threshold``.
        null_eigenvalues: (solved, 1) top eigenvalue of each solved null corpus, else empty.
        replicates: null corpora the test is at level ``1 / (replicates + 1)`` against (shuffle).
        saturated: every given data eigenvalue is above the null (the true count may be
            larger than the number computed).
        solved: how many of them were solved when the test stopped once decided (a null
            corpus' top eigenvalue reached the data's largest: no component can count, and
            ``threshold`` is a lower bound of the full one;
            :mod:`posstats.estimates.permutation`, "Stopping once decided"); None when all were.
    """

    method: str
    threshold: float
    components_above_null: int
    null_eigenvalues: np.ndarray
    replicates: int
    saturated: bool
    solved: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "threshold": float(self.threshold),
            "components_above_null": int(self.components_above_null),
            "null_top_eigenvalues": [[float(x) for x in row] for row in np.atleast_2d(self.null_eigenvalues)],
            "replicates": int(self.replicates),
            "saturated": bool(self.saturated),
            **({"replicates_solved": int(self.solved)} if self.solved is not None else {}),
        }


def mp_edge(parts: Sequence[PositionalCounts], floor: NoiseFloor, /, *, weighted: bool = False) -> float:
    """Analytic Marchenko-Pastur-type edge of the noise eigenvalues of ``B`` (module docstring).

    Uses :attr:`NoiseFloor.column_noise` when the floor carries it (a floor from a token
    split, :mod:`posstats.estimates.thinning`); else the first two parts' union halves
    (parts 0+2 vs 1+3 with four parts) for the per-entry differences and
    :attr:`NoiseFloor.bias` for their scale.

    ``weighted``: the edge of ``W^1/2 B W^1/2``, ``W = diag(N_i / mean N)`` over the
    floor's positions (the occupancy-weighted rank test, module docstring): each row's
    noise scaled by its weight, ``r_i = w_i b_i`` and ``c_v = sum_i w_i (b_i / h_i)
    (s_A[i, v] - s_B[i, v])^2``. At equal occupancy it is the unweighted edge.
    """
    ok = usable_rows(floor.split_half, floor.bias)
    m = floor.positions.size
    occ = np.asarray(floor.occupancy, dtype=np.float64)
    weights = occ / occ.mean() if weighted and occ.size and occ.mean() > 0 else np.ones(m)
    if floor.column_noise is not None:
        if not weighted:
            return mp_edge_value(floor.bias[ok], floor.column_noise, m)
        if floor.occupancy_column_noise is None:
            msg = "this noise floor has no occupancy-weighted column noise (computed with the token split)"
            raise ValueError(msg)
        return mp_edge_value((weights * floor.bias)[ok], floor.occupancy_column_noise / occ.mean(), m)
    rows = floor.positions
    mats = [_rows_csr(p, rows) for p in parts]
    a, b = (_union(mats, (0, 2)), _union(mats, (1, 3))) if len(mats) == 4 else mats
    # with four parts h averages both pairings into halves: it can be finite where the
    # union read here is empty (a position of one to three tokens), which gives no difference
    ok &= (np.asarray(a.sum(axis=1)).ravel() > 0) & (np.asarray(b.sum(axis=1)).ravel() > 0)
    idx = np.flatnonzero(ok)
    if idx.size == 0:
        return math.nan
    sa = sqrt_distributions(a[idx])
    sb = sqrt_distributions(b[idx])
    diff = sp.csr_array(sa - sb)
    scale = weights[idx] * floor.bias[idx] / floor.split_half[idx]
    diff.data = diff.data**2 * np.repeat(scale, np.diff(diff.indptr))
    col = np.asarray(diff.sum(axis=0)).ravel()
    return mp_edge_value((weights * floor.bias)[idx], col, m)


def mp_edge_value(bias: np.ndarray, column_noise: np.ndarray, m: int, /) -> float:
    """``(sqrt(max_i b_i (1 - 1/m)) + sqrt(max_v c_v))^2`` for the row noise ``bias`` of
    the usable rows (:func:`usable_rows`) of m positions and the (V,) column noise
    ``c_v = sum_i (b_i / h_i) (s_A[i, v] - s_B[i, v])^2``; NaN when no row is usable."""
    b = np.asarray(bias, dtype=np.float64)
    if not b.size or not np.size(column_noise):
        return math.nan
    row_max = float(b.max()) * (1.0 - 1.0 / max(int(m), 1))
    return (math.sqrt(row_max) + math.sqrt(max(float(np.max(column_noise)), 0.0))) ** 2


EDGE_RANK_TEST_FIRST = 16  # weighted eigenvalues the edge's rank test computes first (all: when every one is above)
EDGE_DECISION_SHARE = 0.1  # the weighted rank test's solve: residual of the eigenvalues decided below the edge


def bias_shift(bias: Any, weights: Any = None, /) -> float:
    """The shift between the bias-corrected eigenvalues and the plug-in scale the analytic
    edge is on: ``B_c = B - H diag(b) H`` lowers the noise bulk by about ``mean(b)``, and the
    occupancy-weighted ``W^1/2 B_c W^1/2`` by about ``mean(w_i b_i)``; 0 without a
    correction (``bias`` None)."""
    if bias is None:
        return 0.0
    b = np.asarray(bias, dtype=np.float64)
    return float(np.nanmean(b if weights is None else np.asarray(weights, dtype=np.float64) * b))


def bulk_residual(share: float, edge: float, analytic: float, /) -> float:
    """The absolute Lanczos residual of the MDS eigenpairs inside the noise bulk: ``share``
    of the ``analytic`` edge (:func:`mp_edge`), or of the ``edge`` the rank test reads where
    the analytic one is not positive and finite.

    The shares (``lanczos_noise_share``, ``untested_lanczos_noise_share``) were set on the
    analytic edge's scale (docs/long-context.md: at 0.03 of it the scaled stress of P_MDS at
    d = 64 moved by 0.002, inside the +-0.005 it is given to). The edge measured on the
    corpus' halves (:mod:`posstats.estimates.halves_edge`) stands 1.1 times above the
    bulk's top where the analytic one stands 1.3-2.2 times above it, so the same share of
    it asked twice the accuracy: 328 operator columns instead of 216 at n = 131,072
    (2.02e8 packed tokens) for a description the stress interval cannot tell apart.

    >>> bulk_residual(0.03, 40.0, 80.0), bulk_residual(0.03, 40.0, float("nan"))
    (2.4, 1.2)
    """
    scale = analytic if math.isfinite(analytic) and analytic > 0 else edge
    return float(share) * float(scale)


EQUAL_WEIGHTS = 0.01  # occupancy weights within this ratio of each other: the weighted spectrum is bounded, not solved


def equal_weights_ratio(weights: Any, /, *, tol: float = EQUAL_WEIGHTS) -> float | None:
    """``max(w) / min(w)`` when the positive ``weights`` lie within ``1 + tol`` of each other
    (pack mode: every window fills every position but the last one's), else None.

    >>> equal_weights_ratio([0.999, 1.003]) is not None, equal_weights_ratio([0.9, 1.1])
    (True, None)
    """
    w = np.asarray(weights, dtype=np.float64).ravel()
    if not w.size or not float(w.min()) > 0:
        return None
    ratio = float(w.max() / w.min())
    return ratio if ratio <= 1.0 + float(tol) else None


def congruence_upper_bound(eigenvalues: Any, weights: Any, /) -> np.ndarray:
    """Upper bounds on the eigenvalues of ``W^1/2 H_w A H_w^T W^1/2`` (``W = diag(weights)``,
    positive; ``H_w = I - 1 pi^T``, ``pi = w / sum(w)``, the centring on the weighted mean
    the rank test reads: :func:`posstats.geometry.mds.centre_on_weights_in_place`) from
    those of the symmetric, centred ``A = H A H``, descending both.

    By Ostrowski's theorem ``lambda_k(S A S^T) = theta_k lambda_k(A)`` with ``theta_k``
    between the least and the largest squared singular value of ``S`` (Horn and Johnson,
    *Matrix Analysis*, Theorem 4.5.9; ``S`` maps onto the centred vectors here, where ``A``
    lives). ``S = W^1/2 H_w``: ``H_w`` is a projection (``H_w 1 = 0``), so its non-zero
    singular values are 1 and one of ``||H_w||^2 = m ||pi||^2 = 1 + m ||pi - 1/m||^2``.
    So ``max(w) (1 + m ||pi - 1/m||^2) lambda_k`` bounds it where ``lambda_k >= 0``
    (1e-4 over ``max(w) lambda_k`` at weights equal to 1 %) and ``min(w) lambda_k`` below 0.

    >>> congruence_upper_bound([10.0, -2.0], [0.99, 1.01]).round(5).tolist()
    [10.10101, -1.98]
    """
    lam = np.asarray(eigenvalues, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64).ravel()
    pi = w / w.sum()
    centring = 1.0 + w.size * float(np.sum(np.square(pi - 1.0 / w.size)))
    return np.where(lam >= 0, lam * float(w.max()) * centring, lam * float(w.min()))


def bounded_rank_test(eigenvalues: Any, residuals: Any, vectors: Any, weights: Any, level: float, /,
                      *, shown: int = EDGE_RANK_TEST_FIRST) -> tuple[np.ndarray, np.ndarray, float] | None:
    """The occupancy-weighted rank test decided from the unweighted MDS, without a solve of
    its own, or None (solve it).

    Where the ``weights`` are equal to :data:`EQUAL_WEIGHTS` (:func:`equal_weights_ratio`)
    the top eigenvalue of ``W^1/2 B_w W^1/2`` (centred on the weighted mean) is at most
    ``c = max(w) ||H_w||^2`` times that of ``B`` (:func:`congruence_upper_bound`). The MDS's
    top Ritz value ``theta_1`` has an eigenvalue within its absolute residual ``r_1``; when
    ``c (theta_1 + r_1)`` is at
    most the weighted ``level`` (:func:`edge_decision_level`, on the tested scale) no
    weighted eigenvalue is above the edge, the count the weighted solve would give (it
    decides a Ritz value below the level the same way, ``theta + r <= level``). At
    n = 131,072 in pack mode this is the 16-eigenvalue solve of the rank test (5-12 s of
    the sampled path at 2.02e8 tokens, 37 s over ranges at 1e9).

    Args:
        eigenvalues: (k,) the MDS's Ritz values of ``B``, descending.
        residuals: (k,) their residuals relative to ``|theta_1|`` (:class:`MDSResult`).
        vectors: (n, k) the MDS's coordinate columns ``U sqrt(lambda)`` (normalised here).
        weights: (n,) the occupancy weights.
        level: the weighted edge on the tested eigenvalues' scale.

    Returns:
        ``(values, unit vectors, ratio)``: the first ``shown`` Ritz values' upper bounds
        ``congruence_upper_bound`` (what the report lists as the tested eigenvalues, all at
        or below ``level``), the MDS's unit eigenvectors and the weights' ``max / min``
        (:func:`tested_bound_entry`), or None where the weights differ by more or the bound
        does not decide.
    """
    lam = np.asarray(eigenvalues, dtype=np.float64)
    ratio = equal_weights_ratio(weights)
    if lam.size == 0 or ratio is None:
        return None
    top = abs(float(lam[0])) or 1.0
    reach = float(lam[0]) + float(np.asarray(residuals, dtype=np.float64)[0]) * top
    if not congruence_upper_bound([reach], weights)[0] <= float(level):
        return None
    k = min(int(shown), lam.size)
    cols = np.asarray(vectors, dtype=np.float64)[:, :k]
    return congruence_upper_bound(lam[:k], weights), cols / np.maximum(np.linalg.norm(cols, axis=0), 1e-300), ratio


def tested_bound_entry(ratio: float, /) -> dict[str, Any]:
    """The report's ``null.tested_bound`` (and the eigensolve job's ``noise.tested_bound``):
    the tested eigenvalues are :func:`bounded_rank_test`'s upper bounds, weights ``ratio``
    = ``max(w) / min(w)``."""
    return {"method": "ostrowski", "weights_ratio": float(ratio),
            "formula": "max(w) x the unweighted MDS eigenvalues (upper bounds)"}


def edge_decision_level(parts: Sequence[PositionalCounts], floor: NoiseFloor, bias: Any, weights: Any,
                        /, *, edge: float | None = None) -> tuple[float, float] | None:
    """``(level, residual)`` for the solve of the occupancy-weighted rank test against the
    analytic edge: ``level`` is the weighted edge (:func:`mp_edge`) on the scale of the
    eigenvalues solved for (``W^1/2 B_c W^1/2`` with ``bias``: shifted by :func:`bias_shift`).
    The test only needs to know which eigenvalues are above it: a Ritz value
    ``theta <= level - r`` whose residual is ``r`` has an eigenvalue within ``r``, below the
    edge, so it is decided at ``r = EDGE_DECISION_SHARE x edge`` (0.1); values nearer the
    edge, or above it, converge to the solver's tolerance. None when the edge is not
    positive and finite. ``edge``: the weighted edge measured otherwise
    (:mod:`posstats.estimates.halves_edge`) in place of the analytic one."""
    edge = mp_edge(parts, floor, weighted=True) if edge is None else float(edge)
    if not math.isfinite(edge) or edge <= 0:
        return None
    return edge - bias_shift(bias, weights), EDGE_DECISION_SHARE * edge


def first_then_all(solve: Callable[[int], tuple[np.ndarray, np.ndarray]], full: int, level: float | None,
                   /) -> tuple[np.ndarray, np.ndarray]:
    """``solve(k)`` (the top k eigenvalues, descending, and a vector) for a rank test against
    ``level``: the first :data:`EDGE_RANK_TEST_FIRST` only, unless every one of them is above
    ``level``: then all ``full``. The count above the level is the same; below it no
    eigenvalue is needed. ``level`` None: all ``full`` at once."""
    for k in [full] if level is None else sorted({min(EDGE_RANK_TEST_FIRST, full), full}):
        out = solve(k)
        if level is None or out[0][-1] <= level:
            break
    return out


def null_rank(
    eigenvalues: Any,
    /,
    *,
    method: str = "shuffle",
    counts: PositionalCounts | None = None,
    positions: Any = None,
    parts: Sequence[PositionalCounts] | None = None,
    floor: NoiseFloor | None = None,
    replicates: int = 39,
    corrected: bool = False,
    permutation: PermutationNull | None = None,
    seed: int = 0,
    weighted: bool = False,
    threshold: float | None = None,
) -> NullRank:
    """Count the data's MDS eigenvalues above those of a null corpus.

    Args:
        eigenvalues: the data's (top-k) eigenvalues, on the scale ``corrected`` names for
            ``shuffle`` (plug-in ``B`` or the bias-corrected ``B - H diag(b) H``), on the
            plug-in scale for ``mp``.
        method: ``"shuffle"`` (needs ``counts``, or a ``permutation`` null drawn already:
            :mod:`posstats.estimates.permutation`) or ``"mp"`` (needs the ``floor``, and
            its ``parts`` unless the floor carries :attr:`NoiseFloor.column_noise`).
        positions: rows of ``counts`` in the geometry (every one occupied).
        replicates: shuffled corpora for ``shuffle``; the threshold is the largest of their
            top eigenvalues, a Monte Carlo test at level ``1 / (replicates + 1)`` (2.5 % with
            the default 39).
        corrected: ``shuffle``: the eigenvalues are bias-corrected (the null is too).
        permutation: ``shuffle``: a null drawn already (``counts``, ``replicates``,
            ``corrected`` and ``seed`` are then not used).
        seed: seeds the shuffled corpora.
        weighted: ``mp``: the eigenvalues are those of the occupancy-whitened
            ``W^1/2 B_w W^1/2`` (``B_w`` centred on the weighted mean); the edge is weighted
            alike (:func:`mp_edge`).
        threshold: ``mp``: the edge measured from independent halves
            (:mod:`posstats.estimates.halves_edge`), in place of the analytic one.

    Returns:
        :class:`NullRank`.
    """
    lam = np.sort(np.asarray(eigenvalues, dtype=np.float64).ravel())[::-1]
    solved = None
    if method == "shuffle":
        if permutation is None:
            if counts is None:
                msg = "null_rank(method='shuffle') needs the counts"
                raise ValueError(msg)
            rows = np.arange(counts.positions) if positions is None else np.asarray(positions, dtype=np.int64)
            mat = counts.matrix[rows] if counts.is_sparse else np.asarray(counts.matrix)[rows]
            permutation = permutation_null(mat, replicates=replicates, corrected=corrected, seed=seed)
        null_arr = permutation.null_top_eigenvalues[:, None]
        threshold, reps = permutation.eigenvalue_threshold, permutation.eigen_replicates
        if permutation.eigen_planned is not None:
            solved = int(permutation.null_top_eigenvalues.size)
    elif method == "mp":
        if threshold is not None:
            threshold, null_arr, reps = float(threshold), np.zeros((0, 0)), 0
        elif floor is None or (parts is None and floor.column_noise is None):
            msg = "null_rank(method='mp') needs a noise floor, and the parts unless it carries its column noise"
            raise ValueError(msg)
        else:
            threshold, null_arr, reps = mp_edge(parts, floor, weighted=weighted), np.zeros((0, 0)), 0
    else:
        msg = f"unknown null method {method!r}; choose one of {', '.join(NULL_METHODS)}"
        raise ValueError(msg)
    above = int(np.count_nonzero(lam > threshold)) if math.isfinite(threshold) else 0
    if solved is not None and above:
        msg = (f"the null stopped after {solved} of {reps} corpora at {threshold:.6g}, below the largest eigenvalue "
               f"tested here ({lam[0]:.6g}): it was stopped at another eigenvalue than these")
        raise ValueError(msg)
    return NullRank(method, threshold, above, null_arr, reps, bool(lam.size and above == lam.size), solved)
