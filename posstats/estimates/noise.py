"""Honest estimates (THEORY.md section 7): noise floor, bias-corrected distances, null rank.

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

**Null rank.** How many MDS components stand above sampling noise: the eigenvalues of
``B`` compared with those of a *null corpus* in which positions carry no information
(:func:`null_rank`):

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

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp

from posstats.counting.counts import (
    CountSpec,
    PositionalCounts,
)
from posstats.estimates.permutation import PermutationNull, permutation_null
from posstats.estimates.sampling_variance import entries_sampling_variance
from posstats.geometry.hellinger import hellinger_sq_pairs, sqrt_distributions

__all__ = [
    "BIAS_RULE_D_H2",
    "EDGE_DECISION_SHARE",
    "EDGE_RANK_TEST_FIRST",
    "NULL_METHODS",
    "UNBIASED_METHOD",
    "NoiseFloor",
    "NullRank",
    "bias_can_matter",
    "bias_shift",
    "corrected_squared_distances",
    "edge_decision_level",
    "first_then_all",
    "fitted_bias",
    "merge_noise_floors",
    "mp_edge",
    "mp_edge_value",
    "noise_floor",
    "null_rank",
    "poisson_rows",
    "split_half",
    "usable_rows",
]

NULL_METHODS = ("shuffle", "mp")
_CHUNK_ELEMENTS = 1 << 22  # rows x columns per temporary in the samplers (32 MiB of int64)


# ---------------------------------------------------------------------------------------
# Noise floor


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


# ---------------------------------------------------------------------------------------
# Samplers (null corpora here; generated corpora with known truth in posstats.testing)


def _alias_table(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker's alias table of a probability vector: O(1) per draw."""
    k = p.size
    prob = p * (k / p.sum())
    alias = np.arange(k, dtype=np.int64)
    small = list(np.flatnonzero(prob < 1.0))
    large = list(np.flatnonzero(prob >= 1.0))
    while small and large:
        s, g = small.pop(), large[-1]
        alias[s] = g
        prob[g] -= 1.0 - prob[s]
        if prob[g] < 1.0:
            large.pop()
            small.append(g)
    prob[small + large] = 1.0
    return prob, alias


def poisson_rows(
    n: int,
    vocab: int,
    *,
    dense_cols: np.ndarray,
    dense_rates: Any,
    tail_cols: np.ndarray,
    tail_p: np.ndarray,
    tail_rate: np.ndarray,
    rng: np.random.Generator,
) -> sp.csr_array:
    """(n, vocab) sparse int64 Poisson counts, drawn in row blocks (never an n x vocab array).

    ``C[i, dense_cols] ~ Poisson(dense_rates(lo, hi)[i - lo])`` for the columns drawn
    densely, and ``C[i, tail_cols] ~ Poisson(tail_rate[i] * tail_p)`` for the tail, drawn
    as ``Poisson(tail_rate[i])`` tokens per row placed by an alias table of ``tail_p``
    (O(tokens)). The sampler of the null corpora here and of the generated corpora of
    :mod:`posstats.testing`.

    Args:
        n, vocab: shape of the result.
        dense_cols: (h,) columns drawn densely.
        dense_rates: ``(lo, hi) -> (hi - lo, h)`` Poisson means of rows ``lo .. hi - 1``.
        tail_cols: (t,) the other columns with mass.
        tail_p: (t,) distribution over ``tail_cols`` (empty when t = 0).
        tail_rate: (n,) expected tail tokens per row.
        rng: consumed in row-block order (seeded draws are reproducible).
    """
    chunk = max(1, min(n, _CHUNK_ELEMENTS // max(1, dense_cols.size + 1)))
    prob, alias = _alias_table(tail_p) if tail_cols.size else (None, None)
    pieces = []
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        b = hi - lo
        rates = dense_rates(lo, hi)
        front = rng.poisson(rates) if dense_cols.size else np.zeros((b, 0), dtype=np.int64)
        fr, fc = np.nonzero(front)
        rows_parts = [fr.astype(np.int64)]
        cols_parts = [dense_cols[fc].astype(np.int64)]
        vals_parts = [front[fr, fc].astype(np.int64)]
        if tail_cols.size:
            ntail = rng.poisson(tail_rate[lo:hi])
            m = int(ntail.sum())
            j = rng.integers(0, tail_cols.size, m)
            j = np.where(rng.random(m) < prob[j], j, alias[j])
            keys = np.repeat(np.arange(b, dtype=np.int64) * tail_cols.size, ntail) + j
            keys, cnt = np.unique(keys, return_counts=True)
            r, c = np.divmod(keys, tail_cols.size)
            rows_parts.append(r)
            cols_parts.append(tail_cols[c].astype(np.int64))
            vals_parts.append(cnt.astype(np.int64))
        piece = sp.csr_array(
            (np.concatenate(vals_parts), (np.concatenate(rows_parts), np.concatenate(cols_parts))),
            shape=(b, vocab),
            dtype=np.int64,
        )
        piece.sum_duplicates()
        pieces.append(piece)
    return _concatenate_rows(pieces, n, vocab)


def _concatenate_rows(pieces: list[sp.csr_array], n: int, vocab: int) -> sp.csr_array:
    """Stack CSR row blocks (n rows in all) into one (n, vocab) CSR, emptying ``pieces``.

    By hand rather than ``sp.vstack``: one copy of the data, and int32 indices / indptr
    when they fit (scipy upcasts both if either is int64): a third less memory.
    """
    nnz = sum(int(p.nnz) for p in pieces)
    index_dtype = np.int32 if nnz < 2**31 and vocab < 2**31 else np.int64
    data = np.empty(nnz, dtype=np.int64)
    indices = np.empty(nnz, dtype=index_dtype)
    indptr = np.zeros(n + 1, dtype=index_dtype)
    pos, row = 0, 0
    while pieces:
        p = pieces.pop(0)
        data[pos : pos + p.nnz] = p.data
        indices[pos : pos + p.nnz] = p.indices
        indptr[row + 1 : row + 1 + p.shape[0]] = p.indptr[1:] + pos
        pos += int(p.nnz)
        row += int(p.shape[0])
    return sp.csr_array((data, indices, indptr), shape=(n, vocab))


# ---------------------------------------------------------------------------------------
# Null rank


@dataclass(frozen=True)
class NullRank:
    """How many MDS components stand above the null (module docstring).

    Attributes:
        method: ``"shuffle"`` or ``"mp"``.
        threshold: shuffle: the largest top eigenvalue of the shuffled corpora; mp: the
            analytic edge.
        components_above_null: eigenvalues of the data strictly above ``threshold``.
        null_eigenvalues: (replicates, 1) top eigenvalue of each shuffled corpus, else empty.
        replicates: null corpora drawn (shuffle).
        saturated: every given data eigenvalue is above the null (the true count may be
            larger than the number computed).
    """

    method: str
    threshold: float
    components_above_null: int
    null_eigenvalues: np.ndarray
    replicates: int
    saturated: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "threshold": float(self.threshold),
            "components_above_null": int(self.components_above_null),
            "null_top_eigenvalues": [[float(x) for x in row] for row in np.atleast_2d(self.null_eigenvalues)],
            "replicates": int(self.replicates),
            "saturated": bool(self.saturated),
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
            ``W^1/2 B W^1/2``; the edge is weighted alike (:func:`mp_edge`).
        threshold: ``mp``: the edge measured from independent halves
            (:mod:`posstats.estimates.halves_edge`), in place of the analytic one.

    Returns:
        :class:`NullRank`.
    """
    lam = np.sort(np.asarray(eigenvalues, dtype=np.float64).ravel())[::-1]
    if method == "shuffle":
        if permutation is None:
            if counts is None:
                msg = "null_rank(method='shuffle') needs the counts"
                raise ValueError(msg)
            rows = np.arange(counts.positions) if positions is None else np.asarray(positions, dtype=np.int64)
            mat = counts.matrix[rows] if counts.is_sparse else np.asarray(counts.matrix)[rows]
            permutation = permutation_null(mat, replicates=replicates, corrected=corrected, seed=seed)
        null_arr = permutation.null_top_eigenvalues[:, None]
        threshold, reps = permutation.eigenvalue_threshold, int(permutation.null_top_eigenvalues.size)
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
    return NullRank(method, threshold, above, null_arr, reps, bool(lam.size and above == lam.size))
