"""Stress-optimal metric MDS by majorisation (SMACOF), refined from classical MDS.

Classical MDS (THEORY section 3) minimises *strain*, the error in the double-centred Gram
matrix ``B = -1/2 H D H``; it does not minimise the stress of THEORY section 4. SMACOF
(Scaling by MAjorizing a COmplicated Function; de Leeuw 1977, de Leeuw & Mair 2009)
minimises the (optionally weighted) raw stress directly:

    stress_w(P) = sum_{i<j} w_ij (e_ij - h_ij)^2 / sum_{i<j} w_ij h_ij^2,
    e_ij = |p_i - p_j|,  h_ij = d_H(i, j)

which is THEORY eq. 4 when all ``w_ij = 1``. Each iteration is one Guttman transform

    X <- V^+ B(X) X,
    V = diag(W 1) - W                           (weighted Laplacian; V = n I - 1 1^T if w = 1)
    B(X)_ij = -w_ij h_ij / e_ij  (i != j, e_ij > 0; 0 where e_ij = 0),  B_ii = -sum_{j!=i} B_ij

which never increases the stress (majorisation). Started from P_MDS(d), the result is at
least as faithful (in stress) as classical MDS at the same width d.

The transforms converge linearly, slowly where the geometry's trailing eigenvalues are
nearly equal (thousands of transforms at d = 16 on a corpus whose every position differs).
By default :func:`smacof` extrapolates them with SQUAREM (Varadhan & Roland 2008, scheme
S3; an accelerator for any monotone fixed-point map such as an MM/EM step): from X_0,
X_1 = T(X_0) and X_2 = T(X_1), with r = X_1 - X_0 and v = X_2 - 2 X_1 + X_0, the step
X' = X_0 - 2 a r + a^2 v with a = -|r| / |v| (clamped to [-64, -1]; a = -1 gives X_2).
X' is kept only if its stress is at most T(X_0)'s, else a is halved towards -1, so every
kept iterate is at least as good as one plain transform (a = -1 is two) and the stress
never increases. After the default 300 transforms it ends about 3 times closer to the
minimum than plain transforms on the calibration corpora, and where plain transforms
converge slowly but surely it needs a fraction of them (docs/calibration.md).

Public functions:

- :func:`smacof`: blocked O(n^2 d) iterations on numpy or cupy (one code path), the
  n x n distances given. Never allocates n x n x d; one ``block x block`` tile at a time.
- :func:`smacof_lowrank`: refine at rank r, embed in width D by zero padding.
- :func:`smacof_stress`: the weighted raw stress, blocked.
- :func:`pair_weights`: per-pair weights (uniform, occupancy, sequence-local).

Beyond n = 16,384, where the n x n distances do not fit, :mod:`posstats.geometry.stochastic_smacof`
refines from sampled pairs instead.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from posstats.errors import InputError
from posstats.geometry.backend import array_namespace, to_numpy

__all__ = ["ACCELERATIONS", "DENSE_SOLVER_LIMIT", "SmacofResult", "pair_weights", "smacof", "smacof_lowrank",
           "smacof_stress"]


#: Largest n for which weighted SMACOF inverts V densely (``solver="auto"``); above it,
#: conjugate gradients. An n x n inverse costs O(n^3) once and n^2 floats of memory.
DENSE_SOLVER_LIMIT = 4_096

# Squared distances below this fraction of max |x_i|^2 are recomputed from coordinate
# differences: the Gram form |x_i|^2 + |x_j|^2 - 2 <x_i, x_j> has an absolute error of a few
# eps * max |x|^2, which would make h_ij / e_ij meaningless for near-coincident rows.
_GRAM_RECOMPUTE = 1e-8

# SQUAREM's extrapolation length |a| is clamped to [1, _SQUAREM_MAX_STEP] (a longer step
# than this is rarely accepted, and each rejection costs a transform).
_SQUAREM_MAX_STEP = 64.0

#: The accelerations :func:`smacof` runs: SQUAREM around the Guttman transforms, or none.
ACCELERATIONS = ("squarem", "none")

# A stress this small is an exact fit up to rounding (relative distance errors ~1e-10);
# the relative-decrease rule alone would run on to max_iter through rounding noise.
_STRESS_FLOOR = 1e-20


@dataclass(frozen=True)
class SmacofResult:
    """Outcome of a SMACOF refinement.

    Attributes:
        encoding: the refined configuration, float64, shape (n, d), on the input's device.
        stress: weighted raw stress of ``encoding`` (THEORY eq. 4 with weights); for the
            stochastic path, estimated from sampled pairs (see ``stress_ci``).
        initial_stress: the same stress of the starting configuration (for an init from
            classical MDS: the classical-MDS stress).
        iterations: Guttman transforms that produced ``encoding`` (blocked), or sweeps
            run (stochastic).
        converged: True when the stopping rule fired before ``max_iter``.
        seconds: wall-clock time of the refinement (validation included).
        history: stress after 0, 1, ..., ``iterations`` steps (``history[0]`` is
            ``initial_stress``); with SQUAREM, of the start and of each kept iterate (fewer
            entries than transforms); for the stochastic path, estimated on a fixed
            monitoring sample of pairs.
        method: ``"blocked"`` or ``"stochastic"``.
        acceleration: ``"squarem"`` or ``"none"`` (blocked), ``"none"`` (stochastic).
        solver: how ``V^+`` was applied: ``"guttman"`` (unweighted, V^+ = H / n),
            ``"dense"`` (explicit inverse), ``"cg"`` (conjugate gradients), or ``"sgd"``.
        rank: number of refined (non-padding) columns of ``encoding``.
        stress_ci: 95 % interval of ``stress`` when it is a sampled estimate, else None.
        sampled_pairs: number of pairs the sampled ``stress`` was estimated from, else None.
        best_iteration: stochastic path: the sweep whose iterate is returned (the best
            monitored one, ``history[best_iteration]``); None for the blocked path, which
            returns the last iterate.
    """

    encoding: Any
    stress: float
    initial_stress: float
    iterations: int
    converged: bool
    seconds: float
    history: tuple[float, ...]
    method: str = "blocked"
    solver: str = "guttman"
    rank: int | None = None
    stress_ci: tuple[float, float] | None = None
    sampled_pairs: int | None = None
    best_iteration: int | None = None
    acceleration: str = "none"

    def to_dict(self, *, include_encoding: bool = False) -> dict[str, Any]:
        """JSON-ready summary (plain Python values); the encoding only when asked for."""
        n, d = (int(s) for s in self.encoding.shape)
        out: dict[str, Any] = {
            "method": self.method,
            "acceleration": self.acceleration,
            "solver": self.solver,
            "n": n,
            "dim": d,
            "rank": d if self.rank is None else int(self.rank),
            "stress": float(self.stress),
            "initial_stress": float(self.initial_stress),
            "iterations": int(self.iterations),
            "converged": bool(self.converged),
            "seconds": float(self.seconds),
            "history": [float(s) for s in self.history],
            "stress_ci": None if self.stress_ci is None else [float(c) for c in self.stress_ci],
            "sampled_pairs": None if self.sampled_pairs is None else int(self.sampled_pairs),
            "best_iteration": None if self.best_iteration is None else int(self.best_iteration),
        }
        if include_encoding:
            out["encoding"] = to_numpy(self.encoding).tolist()
        return out


# --------------------------------------------------------------------------- weights


def pair_weights(
    positions,
    /,
    *,
    occupancy=None,
    kind: str = "uniform",
    scale: float = 1.0,
    pairs: tuple[Any, Any] | None = None,
    xp=None,
):
    """Per-pair stress weights ``w_ij`` for :func:`smacof` / :func:`stochastic_smacof`.

    Args:
        positions: 1-D int array (n,), the original 0-based positions of the occupied rows
            (THEORY section 1: geometry functions take only occupied rows).
        occupancy: 1-D array (n,) of ``occ[i] > 0``; required by the occupancy kinds.
        kind: one of
            - ``"uniform"``: ``w_ij = 1`` (THEORY eq. 4 exactly).
            - ``"occupancy"``: inverse sampling variance of the estimated ``d_H``.
              ``mu_i`` is estimated from ``occ[i]`` tokens; by the delta method the
              square-root estimate ``s_i = sqrt(mu_i)`` has covariance about
              ``(I - s_i s_i^T) / (4 occ[i])`` (the square root stabilises multinomial
              variance), so ``d_H(i, j) = |s_i - s_j|`` has variance about
              ``1/(4 occ[i]) + 1/(4 occ[j])`` (THEORY section 7). Inverse-variance weights
              are then proportional to ``occ_i occ_j / (occ_i + occ_j)``, i.e. half the
              harmonic mean; we use ``w_ij = hm(occ_i, occ_j) / mean(occ)`` so that equal
              occupancies give ``w = 1``. Rare (noisy) deep positions count less; a pair
              is dominated by its rarer position. (Weights fix variance, not the upward
              bias of ``d_H`` at low occupancy; use a minimum-occupancy threshold for that.)
            - ``"local"``: ``w_ij = 1 / (1 + |pos_i - pos_j| / scale)``, which favours
              faithfulness between positions close in the sequence (scale in tokens).
            - ``"occupancy-local"``: the product of the two.
        scale: sequence-distance scale of ``"local"`` (tokens, > 0).
        pairs: optional ``(i_idx, j_idx)`` integer index arrays; then the weights of those
            pairs only are returned (1-D), for the stochastic path with large n. The
            formula (and the normalisation, which is O(n)) is the same as for the matrix.
        xp: array namespace; None infers it from ``positions`` / ``occupancy``.

    Returns:
        float64 (n, n) symmetric matrix with zero diagonal, or (len(i_idx),) when
        ``pairs`` is given (0 where ``i == j``).

    Stress is invariant to a common scale of all weights; the scale matters only for the
    step sizes of :func:`stochastic_smacof`, which assume weights of order 1.

    >>> pair_weights(np.arange(3), kind="local", scale=1.0)[0].tolist()
    [0.0, 0.5, 0.3333333333333333]
    """
    xp = array_namespace(positions, occupancy) if xp is None else xp
    kinds = ("uniform", "occupancy", "local", "occupancy-local")
    if kind not in kinds:
        msg = f"kind must be one of {kinds}; got {kind!r}"
        raise ValueError(msg)
    pos = xp.asarray(positions)
    if pos.ndim != 1:
        msg = f"positions must be 1-D; got shape {tuple(pos.shape)}"
        raise ValueError(msg)
    pos = pos.astype(xp.float64)
    n = int(pos.shape[0])
    occ = None
    if "occupancy" in kind:
        if occupancy is None:
            msg = f"kind={kind!r} needs occupancy"
            raise ValueError(msg)
        occ = xp.asarray(occupancy, dtype=xp.float64)
        if occ.shape != (n,):
            msg = f"occupancy must have shape ({n},) like positions; got {tuple(occ.shape)}"
            raise ValueError(msg)
        if n and not bool(xp.all(occ > 0)):
            bad = int(xp.argmin(occ))
            msg = f"occupancy must be > 0 (occupied rows only); row {bad} has {float(occ[bad])}"
            raise InputError(msg)
    if "local" in kind and not scale > 0:
        msg = f"scale must be > 0; got {scale!r}"
        raise ValueError(msg)

    if pairs is None:
        ii, jj = pos[:, None], pos[None, :]
        oi, oj = (occ[:, None], occ[None, :]) if occ is not None else (None, None)
    else:
        i_idx, j_idx = (xp.asarray(p) for p in pairs)
        ii, jj = pos[i_idx], pos[j_idx]
        oi, oj = (occ[i_idx], occ[j_idx]) if occ is not None else (None, None)

    gap = xp.abs(ii - jj)
    w = xp.ones(gap.shape, dtype=xp.float64)
    if occ is not None:
        w = w * (2.0 * oi * oj / (oi + oj)) / xp.mean(occ)
    if "local" in kind:
        w = w / (1.0 + gap / scale)
    if pairs is None:
        w[xp.arange(n), xp.arange(n)] = 0.0
    else:
        w = xp.where(xp.asarray(pairs[0]) == xp.asarray(pairs[1]), 0.0, w)
    return w


# --------------------------------------------------------------------------- validation


def _check_square(xp, m, name: str, *, block: int, symmetric_tol: float | None = None) -> None:
    """Finite, >= 0 and symmetric n x n, in O(n^2) reads with no (n, n) temporary.

    Symmetry is tested by a random probe: for Gaussian v, E |(M - M^T) v|^2 equals
    |M - M^T|_F^2, so comparing the two matrix-vector products ``M v`` and ``v M`` detects
    any asymmetry above ``symmetric_tol`` x (their norm) with probability ~1. The default
    tolerance follows float64 error: the two products of an exactly symmetric matrix may
    differ by their summation order's rounding, at most ``n * eps`` of their norm, so
    ``max(1e-12, 4 n eps)``. Only when a check fails is the matrix scanned tile by tile to
    name the offending entry. A non-finite entry makes ``M v`` non-finite.
    """
    n = int(m.shape[0])
    if symmetric_tol is None:
        symmetric_tol = max(1e-12, 4 * n * float(np.finfo(np.float64).eps))
    lo = float(xp.min(m))
    probe = xp.asarray(np.random.default_rng(0).standard_normal(n))
    mv, vm = m @ probe, probe @ m
    finite = bool(xp.all(xp.isfinite(mv))) and math.isfinite(lo)
    gap = float(xp.linalg.norm(mv - vm)) if finite else 0.0
    scale = float(xp.linalg.norm(mv)) + float(xp.linalg.norm(vm)) if finite else 0.0
    if finite and lo >= 0 and gap <= symmetric_tol * scale:
        return
    worst, where = -1.0, (0, 0)
    for a in range(0, n, block):
        b = min(n, a + block)
        for c in range(a, n, block):
            d = min(n, c + block)
            upper, lower = m[a:b, c:d], m[c:d, a:b]
            for tile, r0, c0 in ((upper, a, c), (lower, c, a)):
                bad = ~xp.isfinite(tile)
                what = "has a non-finite entry"
                if not bool(xp.any(bad)):
                    bad, what = tile < 0, "must be >= 0; it has a negative entry"
                if bool(xp.any(bad)):
                    r, col = (int(v[0]) for v in xp.nonzero(bad))
                    msg = f"{name} {what} at ({r0 + r}, {c0 + col}): {float(tile[r, col])}"
                    raise InputError(msg)
            diff = xp.abs(upper - lower.T)
            g = float(xp.max(diff))
            if g > worst:
                r, col = (int(v[0]) for v in xp.nonzero(diff == g))
                worst, where = g, (a + r, c + col)
    msg = f"{name} must be symmetric; entries {where} and {where[::-1]} differ by {worst:.3g}"
    raise InputError(msg)


def _prepare(distances, init, weights, xp, block):
    xp = array_namespace(distances, init, weights) if xp is None else xp
    h = xp.asarray(distances, dtype=xp.float64)
    x = xp.array(init, dtype=xp.float64, copy=True)
    if h.ndim != 2 or h.shape[0] != h.shape[1]:
        msg = f"distances must be a square (n, n) matrix; got shape {tuple(h.shape)}"
        raise ValueError(msg)
    n = int(h.shape[0])
    if x.ndim != 2 or x.shape[0] != n:
        msg = f"init must have shape ({n}, d) to match distances; got {tuple(x.shape)}"
        raise ValueError(msg)
    if n < 2 or x.shape[1] < 1:
        msg = f"need n >= 2 positions and d >= 1 columns; got init shape {tuple(x.shape)}"
        raise ValueError(msg)
    if not isinstance(block, int | np.integer) or block < 1:
        msg = f"block must be a positive integer; got {block!r}"
        raise ValueError(msg)
    if not bool(xp.all(xp.isfinite(x))):
        msg = "init has non-finite entries"
        raise InputError(msg)
    _check_square(xp, h, "distances", block=block)
    w = None
    if weights is not None:
        w = xp.asarray(weights, dtype=xp.float64)
        if w.shape != h.shape:
            msg = f"weights must have shape {tuple(h.shape)} like distances; got {tuple(w.shape)}"
            raise ValueError(msg)
        _check_square(xp, w, "weights", block=block)
    x -= xp.mean(x, axis=0)  # stress is translation-free; centring keeps the Gram form exact
    return xp, h, x, w


# --------------------------------------------------------------------------- kernels


def _tile_sq_distances(xp, xa, xc, sqa, sqc, out, thr: float):
    """Squared distances between the rows of xa and xc into ``out`` (len(xa), len(xc)).

    Gram form for speed (one GEMM); entries below ``thr`` (near-coincident rows, and the
    diagonal of a diagonal tile) are recomputed from differences, so they are exact to
    rounding and never negative.
    """
    xp.matmul(xa, xc.T, out=out)
    out *= -2.0
    out += sqa[:, None]
    out += sqc[None, :]
    small = xp.flatnonzero(out < thr)
    if small.size:
        cols = int(out.shape[1])
        chunk = max(1, (1 << 22) // int(xa.shape[1]))
        for s in range(0, int(small.shape[0]), chunk):
            rr, cc = small[s:s + chunk] // cols, small[s:s + chunk] % cols
            diff = xa[rr] - xc[cc]
            out[rr, cc] = xp.sum(diff * diff, axis=1)
    xp.maximum(out, 0.0, out=out)
    return out


def _pass(xp, h, x, w, block: int, want_bx: bool):
    """One sweep over the upper-triangular tiles: sum_{i!=j} w (e - h)^2 and B(X) X.

    Tiles (I, J), I <= J, of ``block x block`` pairs; by symmetry of h, w and e an
    off-diagonal tile also gives the (J, I) contributions, which halves the O(n^2 d) work.
    Memory: two (block, block) float64 buffers; never (n, n) or (n, n, d).
    """
    n = int(x.shape[0])
    sq = xp.sum(x * x, axis=1)
    thr = _GRAM_RECOMPUTE * float(xp.max(sq))
    side = min(block, n)
    buf_e = xp.empty((side * side,), dtype=xp.float64)
    buf_r = xp.empty((side * side,), dtype=xp.float64)
    num = xp.zeros((), dtype=xp.float64)
    bx = xp.zeros_like(x) if want_bx else None
    for a in range(0, n, block):
        b = min(n, a + block)
        xa = x[a:b]
        diag = xp.arange(b - a)
        for c in range(a, n, block):
            d = min(n, c + block)
            xc = x[c:d]
            shape = (b - a, d - c)
            e = _tile_sq_distances(xp, xa, xc, sq[a:b], sq[c:d],
                                   buf_e[: shape[0] * shape[1]].reshape(shape), thr)
            xp.sqrt(e, out=e)
            hb = h[a:b, c:d]
            wb = None if w is None else w[a:b, c:d]
            res = xp.subtract(e, hb, out=buf_r[: shape[0] * shape[1]].reshape(shape))
            if a == c:
                res[diag, diag] = 0.0
            res *= res
            if wb is not None:
                res *= wb
            num = num + (1.0 if a == c else 2.0) * xp.sum(res)
            if want_bx:
                # b_ij = w h / e, and 0 where e = 0 (de Leeuw's convention): h / inf = 0.
                e[e == 0.0] = xp.inf
                ratio = xp.divide(hb, e, out=res)
                if wb is not None:
                    ratio *= wb
                if a == c:
                    ratio[diag, diag] = 0.0
                bx[a:b] += xp.sum(ratio, axis=1)[:, None] * xa - ratio @ xc
                if a != c:
                    bx[c:d] += xp.sum(ratio, axis=0)[:, None] * xc - ratio.T @ xa
    return num, bx


def _denominator(xp, h, w, block: int) -> float:
    """sum_{i != j} w_ij h_ij^2 (twice the i < j sum, like the numerator of _pass)."""
    n = int(h.shape[0])
    den = xp.zeros((), dtype=xp.float64)
    for a in range(0, n, block):
        hb = h[a:a + block].ravel()
        if w is None:
            den = den + xp.vdot(hb, hb)
        else:
            den = den + xp.vdot(hb * hb, w[a:a + block].ravel())
    hd = xp.diagonal(h)
    den = den - (xp.vdot(hd, hd) if w is None else xp.vdot(hd * hd, xp.diagonal(w)))
    return float(den)


def _positive_denominator(xp, h, w, block: int) -> float:
    """:func:`_denominator`, refused (``InputError``) when it is not > 0: stress is then 0 / 0."""
    den = _denominator(xp, h, w, block)
    if den <= 0:
        msg = "distances (times weights) are all zero off the diagonal; stress is undefined"
        raise InputError(msg)
    return den


def smacof_stress(distances, config, /, *, weights=None, block: int = 2048, xp=None) -> float:
    """Weighted raw stress ``sum_{i<j} w (e - h)^2 / sum_{i<j} w h^2`` (THEORY eq. 4).

    Args:
        distances: h = d_H, (n, n), symmetric, >= 0 (not squared). Diagonal ignored.
        config: (n, d) configuration P; e_ij = |p_i - p_j|.
        weights: optional (n, n) symmetric w_ij >= 0 (diagonal ignored); None means 1.
        block: tile side (memory ~ two ``block * block`` float64 tiles).

    Returns:
        float. Equals the unweighted THEORY stress when ``weights`` is None.
    """
    xp, h, x, w = _prepare(distances, config, weights, xp, block)
    den = _positive_denominator(xp, h, w, block)
    num, _ = _pass(xp, h, x, w, block, want_bx=False)
    return float(num) / den


# --------------------------------------------------------------------------- solvers


def _laplacian_parts(xp, w, block: int):
    n = int(w.shape[0])
    diag_w = xp.diagonal(w).copy()
    deg = xp.empty((n,), dtype=xp.float64)
    for a in range(0, n, block):
        b = min(n, a + block)
        deg[a:b] = xp.sum(w[a:b], axis=1)
    deg -= diag_w
    if not bool(xp.all(deg > 0)):
        bad = int(xp.argmin(deg))
        msg = f"weights: position {bad} has zero total weight; the weight graph must be connected"
        raise InputError(msg)
    return deg, diag_w


def _dense_vplus(xp, w, deg, diag_w):
    """V^+ applied to centred vectors as one dense matrix: (V + c 1 1^T / n)^{-1}.

    For y with 1^T y = 0, z = (V + c J)^{-1} y satisfies 1^T z = 0 and V z = y, i.e.
    z = V^+ y when the weight graph is connected; c (the mean degree) keeps the shift on
    the scale of V's spectrum.
    """
    n = int(w.shape[0])
    c = float(xp.mean(deg))
    a = -w + (c / n)
    idx = xp.arange(n)
    a[idx, idx] = deg + (c / n)
    msg = ("weights: the weighted Laplacian is singular (is the weight graph connected?); "
           "solver='cg' handles a disconnected graph")
    try:
        inv = xp.linalg.inv(a)
    except Exception as exc:  # numpy and cupy each raise their own LinAlgError
        if type(exc).__name__ != "LinAlgError":
            raise
        raise InputError(msg) from exc
    # A disconnected graph leaves V + c J singular, but rounding may still yield a finite
    # "inverse"; check it on a centred probe vector instead of trusting it.
    probe = xp.asarray(np.random.default_rng(0).normal(size=n))
    probe -= xp.mean(probe)
    z = inv @ probe
    resid = deg * z - (w @ z - diag_w * z) - probe
    if not float(xp.linalg.norm(resid)) <= 1e-6 * float(xp.linalg.norm(probe)):
        raise InputError(msg)
    return inv


def _cg_vplus(xp, w, deg, diag_w, y, x0, *, tol: float, maxiter: int):
    """Solve V z = y (columns of y centred) by Jacobi-preconditioned CG, warm-started at x0.

    Warm-starting at the current configuration keeps SMACOF monotone even when CG stops
    early: CG iterates decrease the majorising quadratic tr z^T V z - 2 tr z^T y, which at
    x0 already equals the stress bound at the current point.
    """
    def mat(z):
        return deg[:, None] * z - (w @ z - diag_w[:, None] * z)

    z = x0.copy()
    r = y - mat(z)
    r -= xp.mean(r, axis=0)
    minv = (1.0 / deg)[:, None]
    p = minv * r
    rz = xp.sum(r * p, axis=0)
    target = tol * xp.sqrt(xp.sum(y * y, axis=0))
    for _ in range(maxiter):
        if bool(xp.all(xp.sqrt(xp.sum(r * r, axis=0)) <= target)):
            break
        q = mat(p)
        pq = xp.sum(p * q, axis=0)
        alpha = xp.where(pq > 0, rz / xp.where(pq > 0, pq, 1.0), 0.0)
        z += alpha * p
        r -= alpha * q
        s = minv * r
        rz_new = xp.sum(r * s, axis=0)
        beta = xp.where(rz > 0, rz_new / xp.where(rz > 0, rz, 1.0), 0.0)
        p = s + beta * p
        rz = rz_new
    return z - xp.mean(z, axis=0)


def _resolve_solver(solver: str, *, weighted: bool, n: int) -> str:
    """The ``V^+`` solver that :func:`smacof` runs: ``"guttman"``, ``"dense"`` or ``"cg"``.

    Unweighted: ``"guttman"`` (``V^+ = H / n``), the only choice. Weighted: ``"dense"`` or
    ``"cg"`` as asked; ``"auto"`` picks ``"dense"`` for ``n <= DENSE_SOLVER_LIMIT``.

    >>> _resolve_solver("auto", weighted=True, n=10)
    'dense'
    """
    if not weighted:
        if solver not in ("auto", "guttman"):
            msg = f"solver={solver!r} applies to weighted SMACOF only; use 'auto'"
            raise ValueError(msg)
        return "guttman"
    if solver not in ("auto", "dense", "cg"):
        msg = f"solver must be 'auto', 'dense' or 'cg'; got {solver!r}"
        raise ValueError(msg)
    if solver == "auto":
        return "dense" if n <= DENSE_SOLVER_LIMIT else "cg"
    return solver


@dataclass(frozen=True)
class _VPlus:
    """How one Guttman transform applies ``V^+`` (see :func:`_apply_vplus`).

    Attributes:
        solver: ``"guttman"``, ``"dense"`` or ``"cg"``.
        w: (n, n) weights (None for ``"guttman"``).
        deg, diag_w: (n,) weighted degrees ``sum_{j != i} w_ij`` and ``diag(w)``
            (``"dense"`` and ``"cg"``; None for ``"guttman"``).
        inverse: (n, n) ``(V + c 1 1^T / n)^{-1}`` for ``"dense"``, else None.
        cg_tol, cg_maxiter: the CG solver's relative residual and step cap.
    """

    solver: str
    w: Any = None
    deg: Any = None
    diag_w: Any = None
    inverse: Any = None
    cg_tol: float = 1e-10
    cg_maxiter: int = 500


def _make_vplus(xp, w, solver: str, *, block: int, cg_tol: float, cg_maxiter: int) -> _VPlus:
    """The parts of ``V = diag(W 1) - W`` that ``solver`` needs, checked once (O(n^2), or
    O(n^3) for the dense inverse). Raises ``InputError`` for a disconnected weight graph."""
    if solver == "guttman":
        return _VPlus(solver)
    deg, diag_w = _laplacian_parts(xp, w, block)
    inverse = _dense_vplus(xp, w, deg, diag_w) if solver == "dense" else None
    return _VPlus(solver, w, deg, diag_w, inverse, cg_tol, cg_maxiter)


def _apply_vplus(xp, vplus: _VPlus, bx, x):
    """The next configuration ``V^+ B(X) X`` (n, d), centred, from ``bx = B(X) X`` (n, d).

    ``"guttman"``: ``bx / n``; ``"dense"``: ``inverse @ bx``; ``"cg"``: CG on ``V z = bx``
    warm-started at ``x``.
    """
    if vplus.solver == "guttman":
        x = bx / int(x.shape[0])
    elif vplus.solver == "dense":
        x = vplus.inverse @ bx
    else:
        x = _cg_vplus(xp, vplus.w, vplus.deg, vplus.diag_w, bx, x, tol=vplus.cg_tol, maxiter=vplus.cg_maxiter)
    x -= xp.mean(x, axis=0)  # the update is centred in exact arithmetic; stop drift
    return x


# --------------------------------------------------------------------------- SMACOF


def _has_converged(history: list[float], tol: float) -> bool:
    """The stopping rule on stresses ``s_0, ..., s_k`` (k >= 1): ``s_k <= 1e-20``, or
    ``s_{k-1} <= 0``, or relative decrease ``(s_{k-1} - s_k) / s_{k-1} < tol``.

    >>> _has_converged([1.0, 0.9999999], 1e-6)
    True
    """
    prev, s = history[-2], history[-1]
    return s <= _STRESS_FLOOR or prev <= 0 or (prev - s) / prev < tol


def _guttman_iterations(xp, h, x, w, vplus: _VPlus, *, den: float, block: int, max_iter: int, tol: float):
    """Guttman transforms ``X <- V^+ B(X) X`` from ``x`` (n, d) until the stopping rule.

    ``stress_k = sum_{i != j} w (e - h)^2 / den`` of every iterate, the last included.

    Returns:
        ``(x, history, k, converged)``: the last iterate (n, d), the stresses
        ``[s_0, ..., s_k]``, the transforms run k, and whether the rule fired.
    """
    history: list[float] = []
    k = 0
    while True:
        # Stress and B(X) X share one pass over the tiles; when this pass ends the run,
        # its B(X) X is discarded (cheaper than a separate stress pass per iteration).
        num, bx = _pass(xp, h, x, w, block, want_bx=k < max_iter)
        history.append(float(num) / den)
        if k >= 1 and _has_converged(history, tol):
            return x, history, k, True
        if k >= max_iter:
            return x, history, k, False
        x = _apply_vplus(xp, vplus, bx, x)
        k += 1


def _norm(xp, a) -> float:
    """The Frobenius norm of ``a`` as a Python float (numpy or cupy)."""
    return float(xp.sqrt(xp.sum(a * a)))


def _squarem_iterations(xp, h, x, w, vplus: _VPlus, *, den: float, block: int, max_iter: int, tol: float):
    """Guttman transforms ``T`` accelerated by SQUAREM (module docstring), from ``x`` (n, d).

    Each cycle from ``x0`` (stress ``s0``, ``x1 = T(x0)`` known) runs ``x2 = T(x1)``, whose
    pass also gives ``s1 = stress(x1)``; then tries ``x' = x0 - 2 a r + a^2 v`` and keeps it
    when ``stress(x') <= s1`` (else ``a <- (a - 1) / 2``, or ``a = -1`` from above -2:
    ``x' = x2``, which majorisation keeps at most ``s1``). The pass at ``x'`` gives
    its stress and ``T(x')``, the next cycle's ``x1``. The stopping rule
    (:func:`_has_converged`) reads the kept iterates' stresses.

    Returns:
        ``(x, history, k, converged)``: the last kept iterate (n, d), the stresses of the
        start and of every kept iterate, the transforms run k (each costs one pass, the
        rejected tries included; ``k <= max_iter``), and whether the rule fired.
    """
    def transform(y, want: bool):
        num, by = _pass(xp, h, y, w, block, want_bx=want)
        return float(num) / den, (_apply_vplus(xp, vplus, by, y) if want else None)

    s0, x1 = transform(x, max_iter >= 1)
    history, k = [s0], int(x1 is not None)
    while x1 is not None:
        s1, x2 = transform(x1, k < max_iter)
        if x2 is None:  # out of transforms: x1 = T(x0) is the better of the two known
            history.append(s1)
            return x1, history, k, _has_converged(history, tol)
        k += 1
        r = x1 - x
        v = x2 - x1 - r
        nr, nv = _norm(xp, r), _norm(xp, v)
        a = -min(max(nr / nv, 1.0), _SQUAREM_MAX_STEP) if nv > 0 else -1.0
        while True:
            xn = x2 if a == -1.0 else x - (2 * a) * r + (a * a) * v
            sn, tn = transform(xn, k < max_iter)
            k += int(tn is not None)
            if sn <= s1 or a == -1.0:
                break
            if tn is None:  # rejected with no transform left: keep x1 = T(x0)
                xn, sn = x1, s1
                break
            a = -1.0 if a > -2.0 else (a - 1) / 2
        history.append(sn)
        x, x1 = xn, tn
        if _has_converged(history, tol):
            return x, history, k, True
    return x, history, k, False


def smacof(
    distances,
    init,
    /,
    *,
    weights=None,
    max_iter: int = 300,
    tol: float = 1e-6,
    acceleration: str = "squarem",
    block: int = 2048,
    solver: str = "auto",
    cg_tol: float = 1e-10,
    cg_maxiter: int = 500,
    xp=None,
) -> SmacofResult:
    """Metric MDS by majorisation: refine ``init`` to (locally) minimise stress.

    Minimises ``stress_w(X) = sum_{i<j} w_ij (e_ij - h_ij)^2 / sum_{i<j} w_ij h_ij^2``
    (THEORY eq. 4; ``w = 1`` by default) by Guttman transforms ``X <- V^+ B(X) X``
    (see the module docstring). Each transform never increases the stress, so the result's
    stress is at most ``initial_stress``; with ``init = P_MDS(d)`` it is at most the
    classical-MDS stress at the same width.

    Stopping rule: stop at the first iterate k >= 1 whose relative decrease
    ``(stress_{k-1} - stress_k) / stress_{k-1}`` is below ``tol``, or whose stress is below
    1e-20 (an exact fit up to rounding) (``converged=True``), or after ``max_iter``
    transforms (``converged=False``). The returned encoding is the last
    iterate, whose stress is computed exactly (so one pass more than transforms).
    With ``acceleration="squarem"`` (the default) the iterates are SQUAREM's kept
    extrapolations (module docstring), each of two or more transforms; ``"none"`` runs
    plain transforms, one iterate each.

    Cost per iteration: O(n^2 d): the upper-triangular ``block x block`` tiles of the
    current distance matrix, each from one GEMM, then B(X) X from two GEMMs per tile
    (symmetry halves the work; never an (n, n, d) array). float64 throughout.
    Memory: the (n, n) distances (and weights) plus two (block, block) tiles.

    Weighted ``V^+`` (``solver``):
        - ``"guttman"`` (the only choice without weights): ``V^+ = H / n``, no solve.
        - ``"dense"``: one explicit (V + c 1 1^T / n)^{-1}, O(n^3) once, then one
          O(n^2 d) product per iteration; ``"auto"`` picks it for n <= 4,096.
        - ``"cg"``: Jacobi-preconditioned conjugate gradients on V, warm-started at the
          current X (keeps the iteration monotone even if CG stops early); O(n^2 d) per CG
          step, no n x n extra memory; ``"auto"`` picks it for n > 4,096.

    Args:
        distances: h = d_H (not squared), (n, n), symmetric, >= 0, diagonal ignored.
        init: (n, d) starting configuration, e.g. classical-MDS coordinates P_MDS(d).
        weights: optional (n, n) symmetric w_ij >= 0 (see :func:`pair_weights`); every
            position needs a positive total weight, and ``"dense"`` needs a connected
            weight graph (``"cg"`` accepts a disconnected one: each component is fitted,
            their relative placement is arbitrary).
        max_iter: most Guttman transforms.
        tol: relative stress-decrease tolerance of the stopping rule.
        acceleration: ``"squarem"`` (extrapolate the transforms; never a higher stress than
            the transforms it ran would reach one at a time from the same iterate) or
            ``"none"`` (plain transforms, as in de Leeuw & Mair 2009).
        block: tile side (rows and columns per tile).
        solver: ``"auto"``, ``"dense"`` or ``"cg"`` (weighted only).
        cg_tol, cg_maxiter: relative residual and step cap of the CG solver.
        xp: array namespace; None infers it (cupy if any input is on the GPU).

    Returns:
        :class:`SmacofResult`; ``encoding`` is centred, on the inputs' device.

    >>> rng = np.random.default_rng(0); pts = rng.normal(size=(20, 2))
    >>> h = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    >>> res = smacof(h, pts + 0.1 * rng.normal(size=pts.shape))
    >>> res.stress < 1e-8 < res.initial_stress
    True
    """
    t0 = time.perf_counter()
    if max_iter < 0 or not tol >= 0:
        msg = f"max_iter must be >= 0 and tol >= 0; got max_iter={max_iter!r}, tol={tol!r}"
        raise ValueError(msg)
    if acceleration not in ACCELERATIONS:
        msg = f"acceleration must be one of {', '.join(ACCELERATIONS)}; got {acceleration!r}"
        raise ValueError(msg)
    xp, h, x, w = _prepare(distances, init, weights, xp, block)
    solver = _resolve_solver(solver, weighted=w is not None, n=int(h.shape[0]))
    den = _positive_denominator(xp, h, w, block)
    vplus = _make_vplus(xp, w, solver, block=block, cg_tol=cg_tol, cg_maxiter=cg_maxiter)
    iterate = _squarem_iterations if acceleration == "squarem" else _guttman_iterations
    x, history, k, converged = iterate(xp, h, x, w, vplus, den=den, block=block, max_iter=max_iter, tol=tol)
    return SmacofResult(
        encoding=x,
        stress=history[-1],
        initial_stress=history[0],
        iterations=k,
        converged=converged,
        seconds=time.perf_counter() - t0,
        history=tuple(history),
        method="blocked",
        solver=solver,
        rank=int(x.shape[1]),
        acceleration=acceleration,
    )


def smacof_lowrank(distances, init, /, rank: int, dim: int, **kwargs) -> SmacofResult:
    """Refine at rank r, then embed in width D with zero padding (THEORY section 3).

    Runs :func:`smacof` on the first ``rank`` columns of ``init`` (classical-MDS columns
    are ordered by eigenvalue, so this starts from P_MDS(r)) and pads the result with
    ``dim - rank`` zero columns: ``P = X W^T`` with ``W = [I_r; 0]`` orthonormal columns,
    so every pairwise distance, hence the stress, is that of the rank-r refinement.

    Args:
        distances, init: as for :func:`smacof`; ``init`` needs at least ``rank`` columns.
        rank: refined rank r (>= 1).
        dim: model width D (>= rank).
        **kwargs: keyword options of :func:`smacof`.

    Returns:
        :class:`SmacofResult` with ``encoding`` of shape (n, dim) and ``rank=rank``.
    """
    if rank < 1 or rank > dim:
        msg = f"need 1 <= rank <= dim; got rank={rank}, dim={dim}"
        raise ValueError(msg)
    if getattr(init, "ndim", 0) != 2 or init.shape[1] < rank:
        msg = f"init needs at least rank={rank} columns; got shape {tuple(getattr(init, 'shape', ()))}"
        raise ValueError(msg)
    res = smacof(distances, init[:, :rank], **kwargs)
    xp = array_namespace(res.encoding)
    n = int(res.encoding.shape[0])
    padded = xp.zeros((n, dim), dtype=xp.float64)
    padded[:, :rank] = res.encoding
    return SmacofResult(
        encoding=padded,
        stress=res.stress,
        initial_stress=res.initial_stress,
        iterations=res.iterations,
        converged=res.converged,
        seconds=res.seconds,
        history=res.history,
        method=res.method,
        solver=res.solver,
        rank=rank,
        acceleration=res.acceleration,
    )
