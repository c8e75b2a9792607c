"""The causal-residual (Cesaro) influence baseline (THEORY section 8, ``papers/003_*``).

At initialisation causal attention is uniform, so one layer mixes positions by the Cesaro
matrix ``M[i, j] = 1/i`` for ``j <= i`` (1-based) and a residual layer by
``N = (1 - a) I + a M`` (``a`` = residual mixing weight, ``a = 1``: no residual). The
influence of input position j on the last position L after H layers is

    w[j] = (N^H)[L, j],     j = 1..L      (the influence profile; sums to 1)

computed by applying ``N^T`` H times to ``e_L``, where ``(M^T v)_j = sum_{i >= j} v_i / i``
is a suffix sum: O(L H) time, O(L) memory. Every term is non-negative, so nothing cancels
and float64 keeps ~15 significant digits for L in the millions (the paper's alternating
binomial closed form, :func:`cesaro_influence_exact` here, needs exact rationals).

Continuous limit (x = j / L, ``L w[j] ~= rho_H(x)`` for interior j):

    rho_H(x) = (1-a)^H delta(1-x) + sum_{r=1..H} C(H,r) (1-a)^(H-r) a^r (ln 1/x)^(r-1)/(r-1)!

Summary quantities (all defined on the discrete profile, positions 1-based):

- primacy tail: ``primacy_mass`` = sum of w over the first ``ceil(tail_fraction * L)``
  positions (uniform influence would give ``tail_fraction``), and ``primacy_ratio`` =
  ``L * w[1]``, the first position's influence relative to the uniform share 1/L.
- recency weight: ``w[L]``, the last position's influence on itself; the continuous
  limit splits it into the residual delta ``(1-a)^H`` plus an O(1/L) smooth part.
- dead-zone minimum: ``min w[j]`` over the interior ``1 < j < L`` and the j attaining it
  (the largest such j on ties). On ``1..L-1`` the profile is non-increasing (``N^T``
  maps non-increasing vectors to non-increasing vectors), so the trough sits at
  ``j = L - 1``, just before the recency spike; the minimum is reported for depth.
- peak-to-trough ratio: ``max_j w[j] / dead-zone minimum`` (infinite when the interior
  receives nothing, e.g. H = 0 or a = 0).
- dead zone: the positions with ``w[j] < dead_zone_fraction / L`` (default 0.5: less
  than half the uniform share).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from scipy.optimize import minimize_scalar

from posstats.errors import PosstatsError

__all__ = [
    "InfluenceProfile",
    "ProfileComparison",
    "InfluenceWeighting",
    "cesaro_influence",
    "cesaro_influence_exact",
    "cesaro_matrix",
    "compare_with_theory",
    "dead_zone_mask",
    "fit_residual",
    "influence_density",
    "influence_profile",
    "influence_weighted_distinctiveness",
    "mean_distance_to_others",
    "plot_influence",
    "spearman",
]

DEFAULT_TAIL_FRACTION = 0.1
DEFAULT_DEAD_ZONE_FRACTION = 0.5


def _check(length: int, depth: int, residual: float) -> None:
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
        msg = f"length L must be an integer >= 1; got {length!r}"
        raise PosstatsError(msg)
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 0:
        msg = f"depth H must be an integer >= 0; got {depth!r}"
        raise PosstatsError(msg)
    if not (0.0 <= float(residual) <= 1.0):
        msg = f"residual weight a must lie in [0, 1]; got {residual!r}"
        raise PosstatsError(msg)


def cesaro_influence(length: int, depth: int, /, *, residual: float = 1.0) -> np.ndarray:
    """The discrete influence profile ``w[j-1] = (N^H)[L, j]``, j = 1..L.

    ``N = (1 - a) I + a M`` with the Cesaro matrix ``M[i, j] = 1/i`` (j <= i), computed by
    H suffix-sum passes ``v <- (1 - a) v + a S(v / i)`` starting from ``v = e_L``.

    Args:
        length: L >= 1 (the number of positions; millions are fine).
        depth: H >= 0 (layers; H = 0 gives e_L).
        residual: the residual mixing weight a in [0, 1]; 1 means no residual.

    Returns:
        float64 array (L,), non-negative, summing to 1 (rows of N^H are stochastic).

    Raises:
        PosstatsError: L < 1, H < 0 or a outside [0, 1].

    Example:
        >>> cesaro_influence(3, 1)
        array([0.33333333, 0.33333333, 0.33333333])
    """
    _check(length, depth, residual)
    a = float(residual)
    v = np.zeros(int(length))
    v[-1] = 1.0
    inv = 1.0 / np.arange(1, length + 1, dtype=np.float64)
    for _ in range(int(depth)):
        suffix = np.cumsum((v * inv)[::-1])[::-1]
        v = (1.0 - a) * v + a * suffix
    return v


def cesaro_matrix(length: int, /, *, residual: float = 1.0) -> np.ndarray:
    """The dense residual Cesaro matrix ``N = (1 - a) I + a M`` (L x L, float64).

    For checks and small L only (O(L^2) memory); use :func:`cesaro_influence` otherwise.
    """
    _check(length, 1, residual)
    i = np.arange(1, length + 1, dtype=np.float64)
    m = np.tril(np.ones((length, length))) / i[:, None]
    return (1.0 - residual) * np.eye(length) + residual * m


def cesaro_influence_exact(length: int, depth: int, /, *, residual: Any = 1) -> list[Fraction]:
    """The paper's closed form (``papers/003_*`` eq. 2) in exact rational arithmetic.

        (N^H)[L, j] = (1-a)^H [j = L] + sum_{r=1..H} C(H,r) a^r (1-a)^(H-r)
                      * C(L-1, j-1) sum_{m=j..L} (-1)^(m-j) C(L-j, m-j) m^(-r)

    The alternating sum cancels catastrophically in floating point beyond L of a few dozen,
    so every term is a :class:`fractions.Fraction`. Cost O(H L^2) big-number operations:
    for checks with small L.

    Args:
        length: L >= 1. depth: H >= 0.
        residual: a in [0, 1] as an int, Fraction, or float (a float is taken exactly as
            the binary rational it holds).

    Returns:
        L exact fractions, entry j - 1 for position j.
    """
    _check(length, depth, float(residual))
    a = Fraction(residual)
    big_l = int(length)
    h = int(depth)
    out: list[Fraction] = []
    for j in range(1, big_l + 1):
        inner = [Fraction(0)] * (h + 1)  # inner[r] = (M^r)[L, j] for r >= 1
        for m in range(j, big_l + 1):
            c = math.comb(big_l - j, m - j) * (-1 if (m - j) % 2 else 1)
            for r in range(1, h + 1):
                inner[r] += Fraction(c, m**r)
        lead = math.comb(big_l - 1, j - 1)
        total = (1 - a) ** h if j == big_l else Fraction(0)
        for r in range(1, h + 1):
            total += math.comb(h, r) * a**r * (1 - a) ** (h - r) * lead * inner[r]
        out.append(total)
    return out


def influence_density(x: Any, depth: int, /, *, residual: float = 1.0) -> np.ndarray:
    """The smooth part of the continuous influence density rho_H(x), x in (0, 1].

        rho_H(x) = sum_{r=1..H} C(H, r) (1-a)^(H-r) a^r (ln 1/x)^(r-1) / (r-1)!

    The residual delta ``(1-a)^H delta(1-x)`` at x = 1 is not included (it is
    ``recency_delta`` of :class:`InfluenceProfile`); the smooth part integrates to
    ``1 - (1-a)^H``. For a discrete profile w of length L, ``L w[j] ~= rho_H(j / L)``.

    Args:
        x: positions in (0, 1], any shape.
        depth: H >= 0 (H = 0 gives 0 everywhere).
        residual: a in [0, 1].

    Returns:
        float64 array shaped like ``x``.
    """
    _check(1, depth, residual)
    xs = np.asarray(x, dtype=np.float64)
    if np.any(xs <= 0) or np.any(xs > 1):
        msg = "x must lie in (0, 1]"
        raise ValueError(msg)
    log_inv = -np.log(xs)
    a = float(residual)
    h = int(depth)
    out = np.zeros_like(xs)
    for r in range(1, h + 1):
        coef = math.comb(h, r) * (1.0 - a) ** (h - r) * a**r / math.factorial(r - 1)
        if coef:
            out += coef * log_inv ** (r - 1)
    return out


@dataclass(frozen=True)
class InfluenceProfile:
    """The influence profile of the last position and its summary (see the module doc).

    Attributes:
        length, depth, residual: L, H, a.
        profile: float64 (L,), ``(N^H)[L, j]`` at index j - 1.
        tail_fraction: the fraction of positions that ``primacy_mass`` sums over.
        primacy_mass: sum of the profile over the first ``ceil(tail_fraction L)`` positions.
        primacy_ratio: ``L * profile[0]`` (first position vs the uniform share).
        recency_weight: ``profile[L-1]``, the last position's influence.
        recency_delta: ``(1 - a)^H``, the continuous limit's delta at x = 1.
        dead_zone_min: minimum over interior positions 1 < j < L (None when L < 3).
        dead_zone_position: the 1-based j attaining it (largest on ties; None when L < 3).
        peak_to_trough: ``max(profile) / dead_zone_min`` (inf when the minimum is 0,
            None when L < 3).
        dead_zone_fraction: the threshold, as a multiple of 1/L, defining the dead zone.
        dead_zone_size: how many positions have influence below that threshold.
    """

    length: int
    depth: int
    residual: float
    profile: np.ndarray
    tail_fraction: float
    primacy_mass: float
    primacy_ratio: float
    recency_weight: float
    recency_delta: float
    dead_zone_min: float | None
    dead_zone_position: int | None
    peak_to_trough: float | None
    dead_zone_fraction: float
    dead_zone_size: int

    def summary(self) -> dict[str, Any]:
        """The scalar fields as JSON-ready values (inf -> None)."""
        return {
            "length": self.length,
            "depth": self.depth,
            "residual": self.residual,
            "tail_fraction": self.tail_fraction,
            "primacy_mass": _json_float(self.primacy_mass),
            "primacy_ratio": _json_float(self.primacy_ratio),
            "recency_weight": _json_float(self.recency_weight),
            "recency_delta": _json_float(self.recency_delta),
            "dead_zone_min": _json_float(self.dead_zone_min),
            "dead_zone_position": self.dead_zone_position,
            "dead_zone_x": None
            if self.dead_zone_position is None
            else self.dead_zone_position / self.length,
            "peak_to_trough": _json_float(self.peak_to_trough),
            "dead_zone_fraction": self.dead_zone_fraction,
            "dead_zone_size": self.dead_zone_size,
            "dead_zone_share": self.dead_zone_size / self.length,
        }

    def to_dict(self, *, max_points: int | None = None) -> dict[str, Any]:
        """Summary plus the profile (all L values, or ``max_points`` log-spaced ones).

        The profile is listed as ``positions`` (1-based) and ``influence``; when thinned,
        the positions are log-spaced (dense near j = 1, where the profile changes fastest)
        and always include 1, L - 1 and L.
        """
        positions = _thin_positions(self.length, max_points)
        return {
            **self.summary(),
            "positions": positions.tolist(),
            "influence": self.profile[positions - 1].tolist(),
        }


def influence_profile(
    length: int,
    depth: int,
    /,
    *,
    residual: float = 1.0,
    tail_fraction: float = DEFAULT_TAIL_FRACTION,
    dead_zone_fraction: float = DEFAULT_DEAD_ZONE_FRACTION,
) -> InfluenceProfile:
    """Compute the profile :func:`cesaro_influence` and its summary quantities.

    Args:
        length, depth, residual: L >= 1, H >= 0, a in [0, 1].
        tail_fraction: in (0, 1]; the primacy tail is the first ``ceil(tail_fraction L)``
            positions.
        dead_zone_fraction: > 0; the dead zone is where influence < ``dead_zone_fraction/L``.

    Raises:
        PosstatsError: for out-of-range arguments.
    """
    if not (0.0 < tail_fraction <= 1.0):
        msg = f"tail fraction must lie in (0, 1]; got {tail_fraction!r}"
        raise PosstatsError(msg)
    if not (dead_zone_fraction > 0.0 and math.isfinite(dead_zone_fraction)):
        msg = f"dead-zone fraction must be a positive number; got {dead_zone_fraction!r}"
        raise PosstatsError(msg)
    w = cesaro_influence(length, depth, residual=residual)
    big_l = int(length)
    n_tail = max(1, math.ceil(tail_fraction * big_l))
    if big_l >= 3:
        interior = w[1:-1]
        lo = float(interior.min())
        pos = int(np.flatnonzero(interior == lo)[-1]) + 2
        peak = float(w.max())
        ratio = math.inf if lo == 0.0 else peak / lo
    else:
        lo, pos, ratio = None, None, None
    return InfluenceProfile(
        length=big_l,
        depth=int(depth),
        residual=float(residual),
        profile=w,
        tail_fraction=float(tail_fraction),
        primacy_mass=float(w[:n_tail].sum()),
        primacy_ratio=float(big_l * w[0]),
        recency_weight=float(w[-1]),
        recency_delta=float((1.0 - float(residual)) ** int(depth)),
        dead_zone_min=lo,
        dead_zone_position=pos,
        peak_to_trough=ratio,
        dead_zone_fraction=float(dead_zone_fraction),
        dead_zone_size=int(np.count_nonzero(dead_zone_mask(w, fraction=dead_zone_fraction))),
    )


def dead_zone_mask(influence: Any, /, *, fraction: float = DEFAULT_DEAD_ZONE_FRACTION) -> np.ndarray:
    """Boolean mask of the dead zone: positions with ``influence[j] < fraction / L``.

    ``influence`` is a profile summing to 1 over its L positions (uniform = 1/L each).
    """
    w = np.asarray(influence, dtype=np.float64)
    if w.ndim != 1 or w.size == 0:
        msg = f"influence must be a non-empty 1-D array; got shape {w.shape}"
        raise ValueError(msg)
    return w < fraction / w.size


def _average_ranks(x: Any, /) -> np.ndarray:
    """(n,) ranks 1..n of the (n,) values ``x``, tied values sharing their mean rank."""
    x = np.asarray(x, dtype=np.float64).ravel()
    order = np.argsort(x, kind="stable")
    xs = x[order]
    starts = np.concatenate([[0], np.flatnonzero(xs[1:] != xs[:-1]) + 1])
    ends = np.concatenate([starts[1:], [x.size]])
    ranks = np.empty(x.size)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)  # mean of ranks start+1 .. end
    return ranks


def spearman(a: Any, b: Any, /) -> float:
    """Spearman's rank correlation of two (n,) profiles: Pearson's r of their
    :func:`_average_ranks` (as ``scipy.stats.spearmanr``, whose module adds 0.8 s to every
    command's start); NaN when either is constant."""
    ra, rb = _average_ranks(a), _average_ranks(b)
    ra -= ra.mean()
    rb -= rb.mean()
    den = float(np.sqrt(np.dot(ra, ra) * np.dot(rb, rb)))
    return float(np.dot(ra, rb) / den) if den > 0 else math.nan


def fit_residual(measured: Any, depth: int, /) -> float:
    """The residual weight a whose Cesaro profile best matches a measured profile.

    Minimises ``mean_j (log w_a[j] - log m[j] + c)^2`` over a in [0, 1] and the free
    offset c (the measured scale, e.g. the gain ``gamma^H`` of ``papers/003_*`` eq. 61,
    is arbitrary), by a grid then a bounded scalar search, over the positions with
    ``m[j] > 0`` (an a giving zero influence at one of them is ruled out). Spearman correlation does not identify a (the profile's ranks are the same
    for every a in (0, 1)); this log-space fit does.

    Args:
        measured: positive array (L,), e.g. a Jacobian-norm profile.
        depth: H >= 1.

    Returns:
        the fitted a.
    """

    m = np.asarray(measured, dtype=np.float64)
    if m.ndim != 1 or m.size < 2:
        msg = f"measured must be a 1-D array with at least 2 positions; got shape {m.shape}"
        raise ValueError(msg)
    if depth < 1:
        msg = f"depth must be >= 1 to fit a residual weight; got {depth}"
        raise ValueError(msg)
    if not np.isfinite(m).all() or np.any(m < 0):
        msg = "measured must be finite and non-negative"
        raise ValueError(msg)
    seen = m > 0
    if np.count_nonzero(seen) < 2:
        msg = "measured must have at least 2 positive positions"
        raise ValueError(msg)
    log_m = np.log(m[seen])

    def loss(a: float) -> float:
        w = cesaro_influence(m.size, depth, residual=a)[seen]
        if np.any(w <= 0):  # the theory rules out influence that was measured
            return math.inf
        diff = np.log(w) - log_m
        return float(np.mean((diff - diff.mean()) ** 2))

    # The loss has a single basin in practice but is flat near a = 0: a coarse grid
    # picks the bracket, the bounded search refines it.
    grid = np.linspace(0.0, 1.0, 41)
    best = int(np.argmin([loss(float(a)) for a in grid]))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, grid.size - 1)]
    res = minimize_scalar(loss, bounds=(float(lo), float(hi)), method="bounded", options={"xatol": 1e-6})
    return float(res.x)


@dataclass(frozen=True)
class ProfileComparison:
    """How well a measured influence profile follows the Cesaro theory.

    Attributes:
        depth: H used for the theory.
        residual: the a of the theory profile behind ``spearman``.
        spearman: Spearman rank correlation of measured vs ``(N^H)[L, j]`` at ``residual``.
        fitted_residual: the a of :func:`fit_residual` (log-space least squares).
        spearman_fitted: Spearman correlation with the profile at ``fitted_residual``.
        log10_rms: root-mean-square of ``log10 measured - log10 theory`` at the fitted a,
            after the best constant offset (0 = identical shape on the paper's log plot).
    """

    depth: int
    residual: float
    spearman: float
    fitted_residual: float
    spearman_fitted: float
    log10_rms: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plain values."""
        return {k: _json_float(v) if isinstance(v, float) else v for k, v in self.__dict__.items()}


def compare_with_theory(measured: Any, depth: int, /, *, residual: float | None = None) -> ProfileComparison:
    """Compare a measured profile (e.g. Jacobian norms, position j at index j - 1) with theory.

    Args:
        measured: non-negative array (L,) with at least 2 positive entries; its scale
            does not matter.
        depth: H >= 1.
        residual: the a to compare with; None uses the fitted a.

    Returns:
        a :class:`ProfileComparison`. The Spearman correlation barely depends on a: for
        every a in (0, 1) the theory profile decreases over j = 1..L-1 and spikes at L, so
        only the rank of the last position moves.
    """

    m = np.asarray(measured, dtype=np.float64)
    fitted = fit_residual(m, depth)
    a = fitted if residual is None else float(residual)
    _check(m.size, depth, a)
    theory = cesaro_influence(m.size, depth, residual=a)
    theory_fit = cesaro_influence(m.size, depth, residual=fitted)
    seen = (m > 0) & (theory_fit > 0)
    diff = np.log10(theory_fit[seen]) - np.log10(m[seen])
    return ProfileComparison(
        depth=int(depth),
        residual=float(a),
        spearman=spearman(m, theory),
        fitted_residual=float(fitted),
        spearman_fitted=spearman(m, theory_fit),
        log10_rms=float(np.sqrt(np.mean((diff - diff.mean()) ** 2))),
    )


@dataclass(frozen=True)
class InfluenceWeighting:
    """How much of a corpus' positional structure the architecture lets through.

    With influence w (sums to 1) and distinctiveness d >= 0 per position (e.g. the mean
    Hellinger distance of position i to all others), over the positions where d is known:

    Attributes:
        positions: number of positions with known distinctiveness.
        dead_zone_fraction: the threshold (multiple of 1/L) defining the dead zone.
        dead_zone_positions: how many of those positions are in the dead zone.
        structure_in_dead_zone: ``sum_{dead} d / sum d``, the share of the corpus'
            positional distinctiveness sitting in dead-zone positions.
        weighted_mass_in_dead_zone: ``sum_{dead} w d / sum w d``, the share of the
            influence-weighted distinctiveness (what reaches the last position) that
            comes from the dead zone.
        influence_weighted_mean: ``sum w d / sum w``, the distinctiveness as seen
            through the influence profile.
        uniform_mean: the plain mean of d.
        effective_ratio: ``influence_weighted_mean / uniform_mean`` (1 means the
            architecture neither helps nor hurts; None if the uniform mean is 0).
    """

    positions: int
    dead_zone_fraction: float
    dead_zone_positions: int
    structure_in_dead_zone: float | None
    weighted_mass_in_dead_zone: float | None
    influence_weighted_mean: float | None
    uniform_mean: float
    effective_ratio: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plain values."""
        return {k: _json_float(v) if isinstance(v, float) else v for k, v in self.__dict__.items()}


def influence_weighted_distinctiveness(
    influence: Any,
    distinctiveness: Any,
    /,
    *,
    dead_zone_fraction: float = DEFAULT_DEAD_ZONE_FRACTION,
) -> InfluenceWeighting:
    """Weight each position's distinctiveness by its influence; report the dead zone's share.

    Args:
        influence: array (L,), an influence profile summing to 1, e.g.
            ``cesaro_influence(L, H, residual=a)`` (position j at index j - 1).
        distinctiveness: array (L,) of non-negative numbers, position i at index i (the
            same positions, 0-based as in THEORY section 1), e.g.
            :func:`mean_distance_to_others` of the Hellinger distance matrix. NaN marks a
            position with no data (unoccupied); it is left out of every sum.
        dead_zone_fraction: dead zone = positions with ``influence < fraction / L``, L the
            full length of ``influence``.

    Returns:
        an :class:`InfluenceWeighting` (ratios are None when a denominator is 0).
    """
    w = np.asarray(influence, dtype=np.float64)
    d = np.asarray(distinctiveness, dtype=np.float64)
    if w.ndim != 1 or d.shape != w.shape:
        msg = f"influence and distinctiveness must be 1-D of equal length; got {w.shape}, {d.shape}"
        raise ValueError(msg)
    if np.any(w < 0) or not np.isfinite(w).all():
        msg = "influence must be finite and non-negative"
        raise ValueError(msg)
    known = ~np.isnan(d)
    if np.any(d[known] < 0) or not np.isfinite(d[known]).all():
        msg = "distinctiveness must be non-negative and finite (NaN marks missing positions)"
        raise ValueError(msg)
    dead = dead_zone_mask(w, fraction=dead_zone_fraction) & known
    wk, dk = w[known], d[known]
    total_d = float(dk.sum())
    total_wd = float((wk * dk).sum())
    total_w = float(wk.sum())
    uniform = float(dk.mean()) if dk.size else math.nan
    weighted_mean = total_wd / total_w if total_w > 0 else None
    return InfluenceWeighting(
        positions=int(known.sum()),
        dead_zone_fraction=float(dead_zone_fraction),
        dead_zone_positions=int(dead.sum()),
        structure_in_dead_zone=float(d[dead].sum()) / total_d if total_d > 0 else None,
        weighted_mass_in_dead_zone=float((w[dead] * d[dead]).sum()) / total_wd
        if total_wd > 0
        else None,
        influence_weighted_mean=weighted_mean,
        uniform_mean=uniform,
        effective_ratio=weighted_mean / uniform
        if weighted_mean is not None and uniform > 0
        else None,
    )


def mean_distance_to_others(distances: Any, /) -> np.ndarray:
    """Per-position distinctiveness: the mean distance of row i to every other row.

    ``dist[i] = sum_{j != i} D[i, j] / (n - 1)`` for a square distance matrix D (e.g.
    Hellinger distances d_H, not squared). float64 (n,); 0 for n = 1.
    """
    dmat = np.asarray(distances, dtype=np.float64)
    if dmat.ndim != 2 or dmat.shape[0] != dmat.shape[1]:
        msg = f"distances must be a square matrix; got shape {dmat.shape}"
        raise ValueError(msg)
    n = dmat.shape[0]
    if n < 2:
        return np.zeros(n)
    off = dmat.sum(axis=1) - np.diagonal(dmat)
    return off / (n - 1)


def plot_influence(
    result: InfluenceProfile,
    /,
    *,
    measured: Mapping[str, Any] | None = None,
    max_points: int = 4000,
) -> Any:
    """Plot the influence profile on a log scale, with the continuous density for comparison.

    x axis: relative position x = j / L; y axis (log): ``L * w[j]`` (1 = uniform share),
    the smooth density ``rho_H(x)``, the dead-zone threshold and the recency point, and
    optionally measured profiles (label -> array (L,), normalised here to sum 1).
    matplotlib is imported here, with the Agg canvas (no display needed).

    Returns:
        a ``matplotlib.figure.Figure``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    big_l = result.length
    positions = _thin_positions(big_l, max_points)
    x = positions / big_l
    y = big_l * result.profile[positions - 1]
    fig = Figure(figsize=(7.5, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    positive = y > 0
    ax.plot(x[positive], y[positive], lw=1.5, label="discrete  L (N^H)[L, j]")
    if result.depth >= 1 and result.residual > 0:
        xs = np.unique(np.concatenate([np.geomspace(1.0 / big_l, 1.0, 400), x]))
        rho = influence_density(xs, result.depth, residual=result.residual)
        ok = rho > 0
        ax.plot(xs[ok], rho[ok], lw=1.0, ls="--", label="continuous  rho_H(x)")
    for label, prof in (measured or {}).items():
        mp = np.asarray(prof, dtype=np.float64)
        if mp.shape != (big_l,) or not mp.sum() > 0:
            msg = f"measured profile {label!r} must be a non-negative array of length {big_l}"
            raise ValueError(msg)
        my = big_l * mp[positions - 1] / mp.sum()
        ok = my > 0
        ax.plot(x[ok], my[ok], lw=1.0, marker=".", ms=3, label=f"measured: {label}")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":", label="uniform (1/L)")
    ax.axhline(result.dead_zone_fraction, color="tab:red", lw=0.8, ls=":", label="dead-zone threshold")
    if result.recency_weight > 0:
        ax.scatter([1.0], [big_l * result.recency_weight], color="tab:orange", zorder=3, s=20, label="recency (j = L)")
    ax.set_yscale("log")
    if big_l > 10:
        ax.set_xscale("log")
    ax.set_xlabel("relative position x = j / L")
    ax.set_ylabel("influence x L  (log)")
    ax.set_title(f"Cesaro influence on the last position: L={big_l}, H={result.depth}, a={result.residual:g}")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    return fig


def _thin_positions(length: int, max_points: int | None) -> np.ndarray:
    """1-based positions: all of them, or about ``max_points`` log-spaced ones."""
    if max_points is None or length <= max_points:
        return np.arange(1, length + 1)
    if max_points < 4:
        msg = f"max_points must be >= 4; got {max_points}"
        raise ValueError(msg)
    pos = np.unique(np.geomspace(1, length, max_points - 2).round().astype(np.int64))
    return np.unique(np.concatenate([pos, [1, length - 1, length]]))


def _json_float(v: Any) -> Any:
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None
