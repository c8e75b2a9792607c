"""Honest estimates (THEORY.md section 7): the noise floor and the bias-corrected distances.

``mu_i`` is estimated from ``occ[i]`` tokens, and the plug-in ``d_H`` is biased upward:
two samples of the *same* distribution are apart. For a Zipf-like 50k vocabulary and
10^4 tokens per position the plug-in ``d_H`` between two such samples is 0.5-0.8, so
without a noise floor the geometry of deep positions is mostly sampling noise. This
module measures that noise and corrects for it.

**Parts.** Everything here starts from the corpus split into independent parts whose
sum is the corpus: documents by index (:func:`posstats.runs.noise_parts.count_parts`: row
``r`` of every input file goes to part ``r mod K``), the shards of a Ray run store
(:func:`posstats.runs.noise_parts.parts_from_store`:
shards in sorted shard-id order, rank ``mod K``, i.e. shard-id parity for ``K = 2``), or,
for generated corpora, a random split of every token (:func:`posstats.testing.split_counts`).
In ``pack`` mode each part packs only its own documents, so the parts' sum differs
slightly from the corpus' counts there (same distribution, different stream); elsewhere
it is exact.

**Noise floor.** For position i with parts A and B (the two halves) the split-half
distance ``h_i = d_H^2(A_i, B_i)`` is what two independent estimates of the *same*
distribution differ by: the resolution of the geometry at position i.

**Sampling contribution.** Write ``beta_i(N) = E |s_hat_i - E s_hat_i|^2`` for the total
sampling variance of the square-root distribution estimated from N tokens. Two independent
estimates of one distribution are then ``E d_H^2 = beta(N_1) + beta(N_2)`` apart, and for
two positions ``E d_H^2(i, j) ~= d_H^2(i, j) + beta_i(N_i) + beta_j(N_j)`` (the remainder is
the squared difference of the two estimates' means against the truth's, which vanishes
when ``mu_i = mu_j``). ``b_i = beta_i(N_i)`` is estimated from position i's counts without
bias at every N (:mod:`posstats.estimates.sampling_variance`: the UMVUE of ``Var
sqrt(X)``); the parts no longer enter it (method ``unbiased-variance``). An earlier version
fitted a power law ``beta(N) = c N^-gamma`` to the split halves and quarters, which
over-corrected by 1-18 % and drifted with N; :func:`fitted_bias` keeps that fit for
comparison (the calibration benchmark prints both). The split-half distance ``h_i`` stays
in the report as a diagnostic (and feeds the analytic null's column noise); the quarters'
distances and ``gamma``, which only that old fit read, are computed on request
(``quarters=True``), not by the analysis: they were about 40 % of its noise floor's time.

**Bias-corrected distances.** ``D_c[i, j] = max(D[i, j] - b_i - b_j, 0)`` off the
diagonal, 0 on it (:func:`corrected_squared_distances`). Classical MDS of the unclipped
``D - b 1^T - 1 b^T`` with the diagonal pinned to 0 is ``B_c = B - H diag(b) H``: the
double centring removes the ``b_i + b_j`` part and what is left subtracts each position's
own noise variance from the diagonal of the Gram matrix ``S_c S_c^T``.

How many MDS components stand above this noise is :mod:`posstats.estimates.null_rank`'s.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp

from posstats.counting.counts import CountSpec, PositionalCounts
from posstats.estimates.sampling_variance import entries_sampling_variance
from posstats.geometry.hellinger import hellinger_sq_pairs

__all__ = [
    "BIAS_RULE_D_H2",
    "UNBIASED_METHOD",
    "NoiseFloor",
    "bias_can_matter",
    "corrected_squared_distances",
    "fitted_bias",
    "merge_noise_floors",
    "noise_floor",
    "split_half",
    "usable_rows",
]


def _rows_csr(counts: PositionalCounts, rows: np.ndarray) -> sp.csr_array:
    m = counts.matrix[rows] if counts.is_sparse else sp.csr_array(np.asarray(counts.matrix)[rows])
    return sp.csr_array(m, dtype=np.int64)


def _union(mats: list[sp.csr_array], which: tuple[int, ...]) -> sp.csr_array:
    """The sum of the parts ``mats[k]`` for k in ``which``."""
    out = mats[which[0]]
    for k in which[1:]:
        out = out + mats[k]
    return out


def _paired_d2(a: sp.csr_array, b: sp.csr_array) -> np.ndarray:
    """``d_H^2(a_i, b_i)`` row by row (difference form); NaN where either row is empty."""
    m = a.shape[0]
    occ_a = np.asarray(a.sum(axis=1)).ravel()
    occ_b = np.asarray(b.sum(axis=1)).ravel()
    ok = (occ_a > 0) & (occ_b > 0)
    out = np.full(m, np.nan)
    idx = np.flatnonzero(ok)
    if idx.size:
        stacked = sp.vstack([a[idx], b[idx]], format="csr")
        k = idx.size
        out[idx] = hellinger_sq_pairs(stacked, np.arange(k), np.arange(k, 2 * k))
    return out


def _solve_gamma(ratio_sizes_q: np.ndarray, ratio_sizes_h: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Per position, gamma in [0, 1] with f(gamma) = target by bisection (f increasing)."""
    lo = np.zeros(target.shape)
    hi = np.ones(target.shape)
    # f(gamma) = mean_pairs(Na^-g + Nb^-g) / (NA^-g + NB^-g); grows with g for sizes that
    # halve. ratio_sizes_q: (pairs, 2, m) quarter sizes; ratio_sizes_h: (2, m) half sizes.
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        qv = np.mean(np.sum(ratio_sizes_q ** (-mid[None, None, :]), axis=1), axis=0)
        hv = np.sum(ratio_sizes_h ** (-mid[None, :]), axis=0)
        val = qv / hv
        up = val < target
        lo = np.where(up, mid, lo)
        hi = np.where(up, hi, mid)
    return 0.5 * (lo + hi)


@contextlib.contextmanager
def _quiet_nan_mean() -> Iterator[None]:
    """Silence numpy's 'Mean of empty slice' (an all-NaN position stays NaN, by design)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


@dataclass(frozen=True)
class NoiseFloor:
    """Per-position sampling noise of the square-root distributions (module docstring).

    Attributes:
        positions: (m,) 0-based positions (rows of the parts) described.
        occupancy: (m,) tokens of the whole corpus at each position (sum of the parts).
        split_half: (m,) ``h_i = d_H^2`` between the two halves (NaN where a half is empty).
        split_quarter: (m,) mean ``d_H^2`` between two of four parts, or None (two parts, or
            not asked for).
        gamma: (m,) decay exponent of the old power-law fit (1 for two parts; NaN unless
            the quarters were asked for).
        bias: (m,) ``b_i``, the expected sampling contribution of position i's own estimate
            to every plug-in ``d_H^2(i, j)`` of the whole corpus.
        method: ``"unbiased-variance"`` (the bias from the counts; module doc).
        parts: number of parts used.
        fallback: 0 (kept for the report's schema: the bias no longer falls back).
        source: where the parts came from: ``"token split"`` (every count split at random,
            :mod:`posstats.estimates.thinning`), ``"store shards"``, ``"documents"`` or
            ``"parts"`` (given).
        column_noise: (V,) ``c_v`` of the analytic null (:func:`mp_edge`), when computed
            with the floor (token split); else None (computed from the parts on demand).
        occupancy_column_noise: (V,) ``sum_i N_i (b_i / h_i) (s_A[i, v] - s_B[i, v])^2``,
            the same sum with each row weighted by its occupancy (the weighted edge,
            :func:`mp_edge` with ``weighted=True``); None where ``column_noise`` is.
    """

    positions: np.ndarray
    occupancy: np.ndarray
    split_half: np.ndarray
    split_quarter: np.ndarray | None
    gamma: np.ndarray
    bias: np.ndarray
    method: str
    parts: int
    fallback: int
    source: str = "parts"
    column_noise: np.ndarray | None = None
    occupancy_column_noise: np.ndarray | None = None

    @property
    def split_half_distance(self) -> np.ndarray:
        """(m,) ``d_H`` between the halves (the per-position noise floor)."""
        return np.sqrt(self.split_half)

    def to_dict(self, *, per_position: bool = True) -> dict[str, Any]:
        """JSON-ready summary (NaN becomes None) with per-position lists on request."""

        def stats(x: np.ndarray) -> dict[str, float | None]:
            v = x[np.isfinite(x)]
            if not v.size:
                return {"min": None, "median": None, "mean": None, "max": None}
            return {"min": float(v.min()), "median": float(np.median(v)), "mean": float(v.mean()), "max": float(v.max())}

        out: dict[str, Any] = {
            "method": self.method,
            "source": self.source,
            "parts": int(self.parts),
            "fallback_positions": int(self.fallback),
            "split_half_d_h": stats(self.split_half_distance),
            "bias_d_h2": stats(self.bias),
            "gamma": stats(self.gamma),
        }
        if per_position:
            out["positions"] = [int(p) for p in self.positions]
            out["split_half_d_h_per_position"] = [None if not math.isfinite(x) else float(x) for x in self.split_half_distance]
            out["bias_per_position"] = [None if not math.isfinite(x) else float(x) for x in self.bias]
        return out


def noise_floor(parts: Sequence[PositionalCounts], /, *, positions: Any = None, quarters: bool = False) -> NoiseFloor:
    """Split-half noise floor and per-position bias ``b_i`` from 2 or 4 parts of a corpus.

    Args:
        parts: 2 (halves) or 4 (quarters) :class:`PositionalCounts` of the same spec whose
            sum is the corpus (see the module docstring for how ``b_i`` is estimated).
        positions: rows to describe (default: every position).
        quarters: with 4 parts, also the quarter distances and ``gamma`` (diagnostics).

    Returns:
        :class:`NoiseFloor`.
    """
    spec = _common_spec(parts)
    rows = np.arange(spec.positions, dtype=np.int64) if positions is None else np.asarray(positions, dtype=np.int64)
    mats = [_rows_csr(p, rows) for p in parts]
    sizes = np.stack([np.asarray(m.sum(axis=1)).ravel().astype(np.float64) for m in mats])  # (k, m)
    total = mats[0]
    for m in mats[1:]:
        total = total + m
    occ = sizes.sum(axis=0)

    def d2_of(a: tuple[int, ...], b: tuple[int, ...]) -> np.ndarray:
        return _paired_d2(_union(mats, a), _union(mats, b))

    split = split_half(d2_of, sizes, quarters=quarters)
    total = sp.csr_array(total)
    total.sum_duplicates()
    row_of = np.repeat(np.arange(total.shape[0]), np.diff(total.indptr))
    bias, fallback = entries_sampling_variance(total.data, row_of, occ), 0
    return NoiseFloor(
        positions=rows,
        occupancy=occ.astype(np.int64),
        split_half=split.h,
        split_quarter=split.q,
        gamma=split.gamma,
        bias=bias,
        method=UNBIASED_METHOD,
        parts=len(parts),
        fallback=fallback,
    )


# The auto noise floor is on when the plug-in bias of a median position pair exceeds this.
BIAS_RULE_D_H2 = 1e-3


def bias_can_matter(occupancy: Any, column_totals: Any, /, *, threshold: float = BIAS_RULE_D_H2) -> dict[str, Any]:
    """Whether a noise floor can matter: the rule of ``noise_floor = "auto"``.

    The plug-in ``d_H^2`` between two positions with ``N`` tokens each is inflated by about
    ``2 beta(N)``; the delta method gives ``beta(N) = (K_eff - 1) / (4 N)``, a lower bound
    (the bias falls more slowly than ``1 / N`` where most tokens are rare, see the module
    docstring). The floor is on when this lower bound for the median position,
    ``(K_eff - 1) / (2 N_median)``, exceeds ``threshold``, i.e. when the median position has
    fewer than ``(K_eff - 1) / (2 threshold)`` tokens (500 per effective vocabulary entry
    at the default 1e-3). ``K_eff = exp(H(p))`` is the effective vocabulary (perplexity)
    of the pooled token distribution ``p``.

    Args:
        occupancy: (m,) tokens per position of the geometry rows.
        column_totals: (V,) tokens per vocabulary entry, pooled over those rows.

    Returns:
        JSON-ready ``{"noise_floor": bool, "median_occupancy", "effective_vocabulary",
        "expected_bias_d_h2", "threshold", "formula"}``.
    """
    occ = np.asarray(occupancy, dtype=np.float64)
    totals = np.asarray(column_totals, dtype=np.float64)
    p = totals[totals > 0] / max(totals.sum(), 1.0)
    k_eff = float(np.exp(-np.sum(p * np.log(p)))) if p.size else 1.0
    occupied = occ[occ > 0]
    median = float(np.median(occupied)) if occupied.size else 0.0
    expected = (k_eff - 1.0) / (2.0 * median) if median > 0 else math.inf
    return {
        "noise_floor": bool(expected > threshold),
        "median_occupancy": median,
        "effective_vocabulary": k_eff,
        "expected_bias_d_h2": expected,
        "threshold": float(threshold),
        "formula": "on when (K_eff - 1) / (2 N_median) > threshold; K_eff = exp(entropy of the pooled tokens)",
    }


def _common_spec(parts: Sequence[PositionalCounts]) -> CountSpec:
    """The spec shared by 2 or 4 parts (same positions and vocabulary), else ValueError."""
    if len(parts) not in (2, 4):
        msg = f"noise_floor needs 2 or 4 parts, got {len(parts)}"
        raise ValueError(msg)
    spec = parts[0].spec
    if any(p.spec.positions != spec.positions or p.spec.vocab_size != spec.vocab_size for p in parts):
        msg = "all parts must have the same number of positions and vocabulary"
        raise ValueError(msg)
    return spec


class SplitHalf(NamedTuple):
    """Split-half statistics of m positions and the fitted decay of ``beta(N) = c N^-gamma``."""

    h: np.ndarray  # (m,) d_H^2 between the two halves (NaN where a half is empty)
    q: np.ndarray | None  # (m,) mean d_H^2 between two quarters; None with two parts
    gamma: np.ndarray  # (m,) decay exponent in [0, 1]
    na: np.ndarray  # (m,) tokens of half A
    nb: np.ndarray  # (m,) tokens of half B
    method: str


# Quarters (a, b) compared for q, and the two ways of pairing quarters into halves for h.
_QUARTER_PAIRS = ((0, 1), (2, 3), (0, 2), (1, 3), (0, 3), (1, 2))
_HALF_PAIRINGS = (((0, 2), (1, 3)), ((0, 1), (2, 3)))


# d2_of(a, b): (m,) d_H^2 between the union of parts ``a`` and the union of parts ``b``
# (tuples of part indices), NaN where either union is empty at a position.
PairedDistance = Callable[[tuple[int, ...], tuple[int, ...]], np.ndarray]


def _halves(d2_of: PairedDistance, sizes: np.ndarray) -> SplitHalf:
    """Two parts (sizes (2, m)): ``h`` between them, first-order ``gamma = 1``."""
    na, nb = sizes
    return SplitHalf(d2_of((0,), (1,)), None, np.ones(na.size), na, nb, "halves-first-order")


def _quarters(d2_of: PairedDistance, sizes: np.ndarray, *, quarters: bool = True) -> SplitHalf:
    """Four parts (sizes (4, m)): ``h`` averaged over both pairings into halves, ``q`` over
    the six quarter pairs, and ``gamma`` solving ``q / h`` per position (1 where undefined);
    without ``quarters``, ``q`` is None and ``gamma`` NaN (neither computed)."""
    hs, nas, nbs = [], [], []
    for (a0, a1), (b0, b1) in _HALF_PAIRINGS:
        hs.append(d2_of((a0, a1), (b0, b1)))
        nas.append(sizes[a0] + sizes[a1])
        nbs.append(sizes[b0] + sizes[b1])
    with np.errstate(invalid="ignore"), _quiet_nan_mean():
        h = np.nanmean(hs, axis=0)
        na, nb = np.mean(nas, axis=0), np.mean(nbs, axis=0)
        if not quarters:
            return SplitHalf(h, None, np.full(h.size, np.nan), na, nb, "quarters")
        q = np.nanmean([d2_of((a,), (b,)) for a, b in _QUARTER_PAIRS], axis=0)
    qsizes = np.stack([np.stack([sizes[a], sizes[b]]) for a, b in _QUARTER_PAIRS])  # (6, 2, m)
    ok = np.isfinite(h) & np.isfinite(q) & (q > 0) & np.all(sizes > 0, axis=0)
    gamma = np.ones(h.size)
    if ok.any():
        gamma[ok] = _solve_gamma(qsizes[:, :, ok], np.stack([na, nb])[:, ok], q[ok] / h[ok])
    return SplitHalf(h, q, gamma, na, nb, "quarters")


def split_half(d2_of: PairedDistance, sizes: np.ndarray, *, quarters: bool = True) -> SplitHalf:
    """Split-half statistics of 2 or 4 parts with ``sizes`` (K, m) tokens per part and
    position; ``d2_of`` gives the paired distances between unions of parts; ``quarters``
    (4 parts): also the quarter distances and ``gamma`` of the old power-law fit."""
    return _halves(d2_of, sizes) if sizes.shape[0] == 2 else _quarters(d2_of, sizes, quarters=quarters)


UNBIASED_METHOD = "unbiased-variance"


def fitted_bias(split: SplitHalf, occ: np.ndarray, distinct: np.ndarray) -> tuple[np.ndarray, int]:
    """``b_i = c_i occ_i^-gamma_i`` with ``c_i = h_i / (N_A^-gamma_i + N_B^-gamma_i)``, and how
    many occupied positions fell back to the delta method ``(K_i - 1) / (4 occ_i)``
    (``K_i = distinct`` tokens) because that was not finite; NaN where ``occ_i = 0``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        c = split.h / (split.na ** (-split.gamma) + split.nb ** (-split.gamma))
        bias = c * occ ** (-split.gamma)
    bad = ~np.isfinite(bias)
    fallback = int(np.count_nonzero(bad & (occ > 0)))
    if bad.any():
        with np.errstate(divide="ignore", invalid="ignore"):
            delta = (distinct - 1.0) / (4.0 * occ)
        bias = np.where(bad, delta, bias)
        bias = np.where(occ > 0, bias, np.nan)
    return bias, fallback


def corrected_squared_distances(d2: Any, bias: Any, /) -> np.ndarray:
    """Bias-corrected squared distances ``max(D[i, j] - b_i - b_j, 0)``, exact 0 diagonal.

    Args:
        d2: (m, m) plug-in ``d_H^2`` (e.g. :func:`posstats.geometry.hellinger.hellinger_sq`).
        bias: (m,) ``b_i`` of the same rows (:attr:`NoiseFloor.bias`); NaN counts as 0.

    Returns:
        (m, m) float64, exactly symmetric, in [0, 2].

    Symmetric by construction: the upper triangle of ``d2`` is mirrored (a no-op for a
    symmetric input) and the bias is subtracted as one sum ``b_i + b_j``, which IEEE
    addition makes identical for ``(i, j)`` and ``(j, i)``; two in-place steps
    ``(D - b_i) - b_j`` round differently on each side of the diagonal, and square roots
    near 0 blew that up into asymmetries a symmetry check rejected.
    """
    d = np.array(d2, dtype=np.float64)
    b = np.nan_to_num(np.asarray(bias, dtype=np.float64), nan=0.0)
    if d.ndim != 2 or d.shape[0] != d.shape[1] or b.shape != (d.shape[0],):
        msg = f"d2 must be (m, m) and bias (m,); got {d.shape} and {b.shape}"
        raise ValueError(msg)
    m = d.shape[0]
    step = max(1, (1 << 22) // max(m, 1))  # rows per block: temporaries of ~32 MiB, never (m, m)
    tile = 256
    for lo in range(0, m, tile):  # the upper triangle mirrored, tile by tile: exactly symmetric
        hi = min(m, lo + tile)
        block = d[lo:hi, lo:hi]
        block[...] = np.triu(block) + np.triu(block, 1).T
        for c in range(hi, m, tile):
            d[c:c + tile, lo:hi] = d[lo:hi, c:c + tile].T
    for lo in range(0, m, step):
        hi = min(m, lo + step)
        d[lo:hi] -= b[lo:hi, None] + b[None, :]
    np.maximum(d, 0.0, out=d)
    np.fill_diagonal(d, 0.0)
    return d


def merge_noise_floors(floors: Sequence[NoiseFloor], /) -> NoiseFloor:
    """One :class:`NoiseFloor` of the rows of ``floors`` taken in turn (the position ranges
    of :mod:`posstats.geometry.ranged`): per-row fields concatenated, the column noise
    ``c_v`` (a sum over rows) summed, so :func:`mp_edge` of the result is the edge of the
    whole.

    Raises:
        ValueError: no floor, or floors of different methods, parts or sources.
    """
    floors = list(floors)
    if not floors:
        msg = "no noise floor to merge"
        raise ValueError(msg)
    kinds = {(f.method, int(f.parts), f.source) for f in floors}
    if len(kinds) != 1:
        msg = f"noise floors of different kinds cannot be merged: {sorted(kinds)}"
        raise ValueError(msg)

    def joined(name: str) -> np.ndarray:
        return np.concatenate([np.asarray(getattr(f, name)) for f in floors])

    quarters = [f.split_quarter for f in floors]
    columns = [f.column_noise for f in floors]
    weighted_columns = [f.occupancy_column_noise for f in floors]
    first = floors[0]
    return NoiseFloor(
        positions=joined("positions").astype(np.int64),
        occupancy=joined("occupancy"),
        split_half=joined("split_half"),
        split_quarter=None if any(q is None for q in quarters) else np.concatenate(quarters),
        gamma=joined("gamma"),
        bias=joined("bias"),
        method=first.method,
        parts=int(first.parts),
        fallback=int(sum(int(f.fallback) for f in floors)),
        source=first.source,
        column_noise=None if any(c is None for c in columns) else np.sum(columns, axis=0),
        occupancy_column_noise=(None if any(c is None for c in weighted_columns)
                                else np.sum(weighted_columns, axis=0)),
    )


def usable_rows(split_half: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """(m,) bool: positions whose split-half distance is positive and bias finite (the
    rows that enter the column noise of :func:`mp_edge`)."""
    return np.isfinite(split_half) & (split_half > 0) & np.isfinite(bias)
