"""Stress and monotonicity for very long contexts from sampled pairs and triples.

At n = 131,072 positions the n x n distance matrix has 8.6e9 pairs (137 GB); this module
never forms it. Corpus distances of any pair come straight from the square-root
distributions (THEORY.md section 2):

    d_H(i, j)^2 = 2 - 2 <s_i, s_j>,      <s_i, s_j> = sum_v sqrt(mu_i[v] mu_j[v])

as a sparse row dot product (``O(nnz_i + nnz_j)``), with pairs whose Gram value falls below
``refine_below`` recomputed by the cancellation-free difference form
(:func:`posstats.geometry.hellinger.hellinger_sq_pairs`); optionally bias-corrected as
``max(d_H^2 - b_i - b_j, 0)`` (:mod:`posstats.estimates.noise`). Encoding distances of a pair are
``|p_i - p_j|`` by the difference form.

**Stress.** For m pairs drawn uniformly (with replacement) from all pairs i < j, the four
quantities of THEORY section 4 are ratios of pair means, e.g.
``stress = mean((e - h)^2) / mean(h^2)``; ratios of means are consistent (bias O(1/m))
and, by the delta method, asymptotically normal with variance ``Var(psi) / m`` where
``psi`` is the per-pair influence function:

- ratio ``R = A / B``:           ``psi = (a - R b) / mean(b)``
- ``scaled = 1 - C^2 / (D B)`` (C = mean eh, D = mean e^2, B = mean h^2):
  ``psi = -(1 - scaled) (2 (c - C) / C - (d - D) / D - (b - B) / B)``
- Pearson ``r``: ``psi = e~ h~ - r (e~^2 + h~^2) / 2`` with standardised ``e~``, ``h~``.

The 95 % interval is ``estimate +- 1.96 sd(psi) / sqrt(m)`` (coverage is checked by
simulation in the tests). :meth:`SampledGeometry.stress` adds pairs until the scaled-stress
interval's half-width is at most ``target_halfwidth`` (default 1e-3) or ``max_pairs``.

**Monotonicity.** Triples are drawn as in :func:`posstats.geometry.diagnostics.monotonicity_violation_rate`
(uniform over valid triples, Wilson interval), with corpus or encoding distances of the
sampled pairs only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from posstats.geometry.diagnostics import Monotonicity, _as_positions, _monotonicity
from posstats.geometry.hellinger import hellinger_sq_pairs, sqrt_distributions
from posstats.geometry.products import product_threads, thread_map

__all__ = [
    "SampledGeometry",
    "SampledStress",
    "pair_chunks",
    "sample_pairs",
    "sampled_monotonicity",
    "stress_from_pairs",
]

_Z95 = 1.959963984540054
# Pairs whose row dot products are formed at a time (two gathered sparse row blocks), and
# the stored entries the rows of all chunks in flight (one a thread) may hold together:
# a gathered entry costs about 30 bytes until its chunk is summed, so 2**24 entries keep the
# step near 0.5 GB whatever the core count (with 2**23 a chunk, 16 threads held 2.4 GB more
# than 2 did at 200 M tokens, n = 131,072). A chunk never gets fewer than 2**20.
_PAIR_CHUNK = 1 << 13
_ENTRIES_IN_FLIGHT = 1 << 24
_CHUNK_ENTRIES_MIN = 1 << 20


def _chunk_entries(threads: int, /) -> int:
    """Stored entries one chunk of pairs may gather when ``threads`` chunks run at once.

    >>> _chunk_entries(2), _chunk_entries(16), _chunk_entries(64)
    (8388608, 1048576, 1048576)
    """
    return max(_CHUNK_ENTRIES_MIN, _ENTRIES_IN_FLIGHT // max(1, int(threads)))


def pair_chunks(cost: np.ndarray, budget: int, most: int, /) -> list[tuple[int, int]]:
    """Consecutive ``[a, b)`` ranges of pairs, each of at most ``most`` pairs whose ``cost``
    (stored entries gathered) sums to at most ``budget``, or a single pair above it.

    >>> pair_chunks(np.array([3, 3, 3, 10, 1]), 6, 8)
    [(0, 2), (2, 3), (3, 4), (4, 5)]
    """
    out, a, total = [], 0, np.cumsum(cost)
    while a < cost.size:
        base = total[a - 1] if a else 0
        b = int(np.searchsorted(total, base + budget, side="right"))
        b = min(max(b, a + 1), a + most, cost.size)
        out.append((a, b))
        a = b
    return out


def sample_pairs(n: int, m: int, /, *, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``m`` pairs ``(i, j)``, ``i < j``, uniform over the ``n (n - 1) / 2`` pairs, with
    replacement: two distinct uniform indices, ordered."""
    if n < 2:
        msg = f"sampling pairs needs n >= 2, got {n}"
        raise ValueError(msg)
    i = rng.integers(0, n, m)
    j = rng.integers(0, n - 1, m)
    j = np.where(j >= i, j + 1, j)  # uniform over the other n - 1 rows
    return np.minimum(i, j).astype(np.int64), np.maximum(i, j).astype(np.int64)


@dataclass(frozen=True)
class SampledStress:
    """Stress of an encoding estimated from sampled pairs, with 95 % intervals.

    Attributes mirror :class:`posstats.geometry.stress.StressResult`; each ``*_ci95`` is the
    (low, high) delta-method interval and ``pairs`` the sampled pairs used.
    """

    stress: float
    scaled_stress: float
    scale: float
    pearson: float
    stress_ci95: tuple[float, float]
    scaled_stress_ci95: tuple[float, float]
    scale_ci95: tuple[float, float]
    pearson_ci95: tuple[float, float]
    pairs: int

    @property
    def scaled_halfwidth(self) -> float:
        """Half-width of the scaled-stress interval."""
        lo, hi = self.scaled_stress_ci95
        return 0.5 * (hi - lo)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stress": float(self.stress),
            "scaled_stress": float(self.scaled_stress),
            "scale": float(self.scale),
            "pearson": float(self.pearson),
            "stress_ci95": [float(x) for x in self.stress_ci95],
            "scaled_stress_ci95": [float(x) for x in self.scaled_stress_ci95],
            "scale_ci95": [float(x) for x in self.scale_ci95],
            "pearson_ci95": [float(x) for x in self.pearson_ci95],
            "pairs": int(self.pairs),
        }


def _interval(estimate: float, psi: np.ndarray) -> tuple[float, float]:
    m = psi.size
    if m < 2 or not np.all(np.isfinite(psi)):
        return (math.nan, math.nan)
    half = _Z95 * float(np.std(psi, ddof=1)) / math.sqrt(m)
    return (estimate - half, estimate + half)


def stress_from_pairs(e: Any, h: Any, /) -> SampledStress:
    """Ratio estimators of stress, scaled stress, optimal scale and Pearson r from sampled
    pairs' encoding distances ``e`` and corpus distances ``h`` (both (m,), h not squared),
    with delta-method 95 % intervals (module docstring).

    Raises:
        ValueError: shapes differ, fewer than 2 pairs, or all sampled ``h`` are 0.
    """
    e = np.asarray(e, dtype=np.float64).ravel()
    h = np.asarray(h, dtype=np.float64).ravel()
    if e.shape != h.shape or e.size < 2:
        msg = f"e and h must be 1-D of the same length >= 2; got {e.shape} and {h.shape}"
        raise ValueError(msg)
    a = (e - h) ** 2
    b = h * h
    c = e * h
    d = e * e
    mb, mc, md = float(b.mean()), float(c.mean()), float(d.mean())
    if mb == 0.0:
        msg = "stress is undefined: every sampled corpus distance is 0"
        raise ValueError(msg)
    stress = float(a.mean()) / mb
    psi_stress = (a - stress * b) / mb
    if md == 0.0 or mc == 0.0:
        scale, scaled = 0.0, 1.0
        psi_scale = np.zeros_like(e)
        psi_scaled = np.zeros_like(e)
    else:
        scale = mc / md
        scaled = 1.0 - (mc / md) * (mc / mb)
        psi_scale = (c - scale * d) / md
        psi_scaled = -(1.0 - scaled) * (2.0 * (c - mc) / mc - (d - md) / md - (b - mb) / mb)
    se, sh = float(e.std()), float(h.std())
    if se > 0 and sh > 0:
        et = (e - e.mean()) / se
        ht = (h - h.mean()) / sh
        r = float(np.mean(et * ht))
        psi_r = et * ht - 0.5 * r * (et * et + ht * ht)
    else:
        r = math.nan
        psi_r = np.full_like(e, math.nan)
    scaled_c = min(1.0, max(0.0, scaled))
    return SampledStress(
        stress=stress,
        scaled_stress=scaled_c,
        scale=scale,
        pearson=r,
        stress_ci95=_interval(stress, psi_stress),
        scaled_stress_ci95=_interval(scaled, psi_scaled),
        scale_ci95=_interval(scale, psi_scale),
        pearson_ci95=_interval(r, psi_r),
        pairs=int(e.size),
    )


def _encoding_pair_distances(p: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    out = np.empty(i.size, dtype=np.float64)
    step = max(1, (1 << 22) // max(1, p.shape[1]))
    for a in range(0, i.size, step):
        diff = p[i[a : a + step]] - p[j[a : a + step]]
        out[a : a + step] = np.sqrt(np.einsum("ij,ij->i", diff, diff))
    return out


def _sqrt_rows(counts: Any) -> sp.csr_array:
    """``S = sqrt(C / occ)`` as CSR sharing the counts' index arrays when they are canonical
    (one float64 array more than the counts; at 131k x 50k with 3.4e8 stored entries the
    general path would hold two more copies of the indices)."""
    c = counts
    if not (isinstance(c, (sp.csr_array, sp.csr_matrix)) and c.has_canonical_format and c.dtype.kind in "iu"):
        return sp.csr_array(sqrt_distributions(counts))
    n = c.shape[0]
    data = np.empty(c.data.size, dtype=np.float64)
    lengths = np.diff(c.indptr)
    if np.any(lengths == 0):
        sqrt_distributions(c[np.flatnonzero(lengths == 0)[:1]])  # raises the library's error
    step = max(1, (1 << 23) // max(1, c.data.size // max(n, 1)))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        a, b = int(c.indptr[lo]), int(c.indptr[hi])
        vals = c.data[a:b]
        csum = np.concatenate([[0], np.cumsum(vals, dtype=np.int64)])
        occ = (csum[c.indptr[lo + 1 : hi + 1] - a] - csum[c.indptr[lo:hi] - a]).astype(np.float64)
        if np.any(vals < 0):
            msg = "counts must be non-negative"
            raise ValueError(msg)
        data[a:b] = np.sqrt(vals / np.repeat(occ, lengths[lo:hi]))
    return sp.csr_array((data, c.indices, c.indptr), shape=c.shape)


class _CSRDots:
    """Row dot products ``<s_i, s_j>`` of a CSR matrix (the interface of
    :func:`posstats.geometry.sqrt_operator.sqrt_operator`'s ``row_dots``)."""

    def __init__(self, s: sp.csr_array) -> None:
        self.s = s
        self.shape = s.shape

    def row_dots(self, i: np.ndarray, j: np.ndarray, /) -> np.ndarray:
        return np.asarray(self.s[i].multiply(self.s[j]).sum(axis=1), dtype=np.float64).ravel()


class SampledGeometry:
    """Corpus Hellinger distances of arbitrary pairs, without an n x n matrix.

    Args:
        counts: (n, V) counts of the used positions (scipy sparse or dense numpy), every
            row occupied; None with a ranged ``sqrt`` (rows held apart,
            :class:`posstats.geometry.ranged.RangedSqrt`: its ``row_dots``, ``row_entries``
            and ``difference_sq``).
        bias: optional (n,) per-position bias ``b_i`` (:attr:`posstats.estimates.noise.NoiseFloor.bias`):
            distances are then ``sqrt(max(d_H^2 - b_i - b_j, 0))``.
        refine_below: pairs with Gram ``d_H^2`` below this are recomputed by the difference
            form (exact to a few eps).
        seed: seeds the pair sample.
        sqrt: the square-root rows already built for the MDS
            (:func:`posstats.geometry.sqrt_operator.sqrt_operator` of the same counts), shared instead
            of building them again.
        shrinkage: with ``bias``, an :class:`~posstats.estimates.occupancy.OccupancyShrinkage`
            of these counts, or (rows held apart) its
            :class:`~posstats.estimates.occupancy.ShrinkageFeatures` of them: each pair's
            square roots' expected shrinkage at their occupancies removed before the bias.

    The square-root distributions are built once (CSR with the counts' pattern, float64),
    or shared with the MDS (``sqrt``).
    """

    def __init__(self, counts: Any, /, *, bias: Any = None, refine_below: float = 1e-6, seed: int = 0,
                 sqrt: Any = None, shrinkage: Any = None) -> None:
        if counts is None:  # rows held apart: the operator gives the dots, the entries and the difference form
            if sqrt is None or not hasattr(sqrt, "difference_sq"):
                msg = "SampledGeometry needs the counts, or a ranged square-root operator (posstats.geometry.ranged)"
                raise ValueError(msg)
            self.counts = None
            self.row_entries = np.asarray(sqrt.row_entries(), dtype=np.int64)
        else:
            self.counts = sp.csr_array(counts) if not sp.issparse(counts) else counts
            self.row_entries = np.diff(sp.csr_array(self.counts).indptr).astype(np.int64)  # (n,) stored entries per row
        self.s = _CSRDots(_sqrt_rows(self.counts)) if sqrt is None else sqrt
        self.n = int(self.s.shape[0])
        self.bias = None if bias is None else np.nan_to_num(np.asarray(bias, dtype=np.float64), nan=0.0)
        if self.bias is not None and self.bias.shape != (self.n,):
            msg = f"bias must have one entry per row ({self.n}); got shape {self.bias.shape}"
            raise ValueError(msg)
        if shrinkage is not None and self.bias is None:
            msg = "SampledGeometry's occupancy shrinkage applies to bias-corrected distances: give the bias"
            raise ValueError(msg)
        if shrinkage is not None and not hasattr(shrinkage, "pairs"):  # an OccupancyShrinkage: its features here
            if self.counts is None:
                msg = "SampledGeometry over ranges takes the shrinkage's features (ShrinkageFeatures), not the shrinkage"
                raise ValueError(msg)
            shrinkage = shrinkage.features(self.counts)
        self._shrinkage = shrinkage
        self.refine_below = float(refine_below)
        self.rng = np.random.default_rng(seed)
        self.i = np.zeros(0, dtype=np.int64)
        self.j = np.zeros(0, dtype=np.int64)
        self.h = np.zeros(0, dtype=np.float64)

    def squared(self, i: Any, j: Any, /) -> np.ndarray:
        """Plug-in (or bias-corrected, and occupancy-adjusted with a shrinkage) ``d_H^2`` of
        the pairs ``(i[p], j[p])``, float64."""
        i = np.asarray(i, dtype=np.int64).ravel()
        j = np.asarray(j, dtype=np.int64).ravel()
        lo_, hi_ = np.minimum(i, j), np.maximum(i, j)
        keys, inverse = np.unique(lo_ * self.n + hi_, return_inverse=True)
        if keys.size < i.size:
            # Repeated pairs (common when n is small): each distinct pair once.
            return self.squared(keys // self.n, keys % self.n)[inverse.reshape(-1)]
        def chunk(bounds: tuple[int, int]) -> np.ndarray:
            ii, jj = i[bounds[0] : bounds[1]], j[bounds[0] : bounds[1]]
            d2 = np.maximum(2.0 - 2.0 * self.s.row_dots(ii, jj), 0.0)
            d2[ii == jj] = 0.0
            small = np.flatnonzero((d2 < self.refine_below) & (ii != jj))
            if small.size:
                d2[small] = self._refined(ii[small], jj[small])
            return d2

        if self.counts is None:  # ranges held apart: they chunk and run in parallel themselves
            parts = [chunk((0, i.size))] if i.size else []
        else:
            # chunks of pairs on the cores' threads (the sparse row products release the GIL),
            # together gathering at most _ENTRIES_IN_FLIGHT stored entries: dense early rows of
            # a truncate-mode corpus would otherwise gather gigabytes per chunk
            budget = _chunk_entries(product_threads())
            parts = thread_map(chunk, pair_chunks(self.row_entries[i] + self.row_entries[j], budget, _PAIR_CHUNK))
        out = np.concatenate(parts) if parts else np.empty(0, dtype=np.float64)
        if self.bias is not None:
            if self._shrinkage is not None:
                out += self._shrinkage.pairs(i, j)
            out = np.maximum(out - self.bias[i] - self.bias[j], 0.0)
            out[i == j] = 0.0
        return out

    def _refined(self, i: np.ndarray, j: np.ndarray, /) -> np.ndarray:
        """Difference-form ``d_H^2`` of the pairs, from the counts of their rows only (the
        whole counts would be copied and square-rooted per call: 2.8 GB at 7e7 entries)."""
        if self.counts is None:
            return self.s.difference_sq(i, j)
        rows = np.union1d(i, j)
        return hellinger_sq_pairs(self.counts[rows], np.searchsorted(rows, i), np.searchsorted(rows, j))

    def distances(self, i: Any, j: Any, /) -> np.ndarray:
        """``d_H`` (not squared) of the pairs."""
        return np.sqrt(self.squared(i, j))

    @property
    def pairs(self) -> int:
        """Pairs sampled so far."""
        return int(self.i.size)

    def draw(self, m: int, /) -> None:
        """Add ``m`` uniformly sampled pairs (and their corpus distances) to the sample."""
        if m <= 0:
            return
        i, j = sample_pairs(self.n, int(m), rng=self.rng)
        self.i = np.concatenate([self.i, i])
        self.j = np.concatenate([self.j, j])
        self.h = np.concatenate([self.h, self.distances(i, j)])

    def stress_of(self, encoding: Any, /) -> SampledStress:
        """Sampled stress of ``encoding`` (n x d) on the pairs drawn so far."""
        p = np.asarray(encoding, dtype=np.float64)
        if p.ndim != 2 or p.shape[0] != self.n:
            msg = f"encoding must be (n, d) with n = {self.n}; got shape {p.shape}"
            raise ValueError(msg)
        return stress_from_pairs(_encoding_pair_distances(p, self.i, self.j), self.h)

    def stress(
        self,
        encodings: list[Any],
        /,
        *,
        target_halfwidth: float = 1e-3,
        initial_pairs: int = 200_000,
        max_pairs: int = 20_000_000,
        progress: Callable[[int, int, float], None] | None = None,
    ) -> list[SampledStress]:
        """Sampled stress of every encoding, drawing pairs until each scaled-stress interval
        has half-width <= ``target_halfwidth`` (or ``max_pairs`` are drawn).

        The pair sample is shared by all encodings (and kept for later calls). After the
        initial draw, the number still needed is predicted from the ``1 / sqrt(m)``
        scaling of the widest interval (+10 %), drawn, and checked again. ``progress`` is
        called as ``progress(pairs drawn, pairs aimed at, widest half-width)`` after each
        round (a progress bar's total grows with the aim).
        """
        if self.pairs < initial_pairs:
            self.draw(min(initial_pairs, max_pairs) - self.pairs)
        while True:
            results = [self.stress_of(e) for e in encodings]
            widest = max((r.scaled_halfwidth for r in results if math.isfinite(r.scaled_halfwidth)), default=0.0)
            done = widest <= target_halfwidth or self.pairs >= max_pairs
            need = self.pairs if done else min(int(math.ceil(self.pairs * (widest / target_halfwidth) ** 2 * 1.1)), max_pairs)
            if progress is not None:
                progress(self.pairs, need, widest)
            if done:
                return results
            self.draw(need - self.pairs)

    def monotonicity(self, *, positions: Any = None, samples: int = 200_000, seed: int = 0) -> Monotonicity:
        """Sampled corpus monotonicity (hypothesis A3) with a 95 % Wilson interval."""
        return sampled_monotonicity(self.distances, self.n, positions=positions, samples=samples, seed=seed)

    def min_sampled(self) -> tuple[float, tuple[int, int]]:
        """Smallest ``d_H`` over the adjacent rows (i, i+1) and the sampled pairs: an upper
        bound on the minimum over all pairs (hypothesis H1 at scale), and its pair."""
        adj_i = np.arange(self.n - 1, dtype=np.int64)
        d_adj = self.distances(adj_i, adj_i + 1)
        cand_d = np.concatenate([d_adj, self.h])
        cand_i = np.concatenate([adj_i, self.i])
        cand_j = np.concatenate([adj_i + 1, self.j])
        k = int(np.argmin(cand_d))
        return float(cand_d[k]), (int(cand_i[k]), int(cand_j[k]))


def sampled_monotonicity(
    pair_distances: Any,
    n: int,
    /,
    *,
    positions: Any = None,
    samples: int = 200_000,
    seed: int = 0,
) -> Monotonicity:
    """Monotonicity violation rate from ``samples`` uniformly sampled valid triples.

    Args:
        pair_distances: callable ``(i, j) -> distances`` for index arrays.
        n: number of rows.
        positions: 0-based sequence positions of the rows (default ``arange(n)``).

    Returns:
        :class:`posstats.geometry.diagnostics.Monotonicity` with ``method == "sampled"`` and a 95 %
        Wilson interval (n < 3: no triples, rate NaN, ``method == "exact"``).
    """
    pos = _as_positions(positions, n)

    def rows_of(lo: int, hi: int) -> np.ndarray:  # only reached when n < 3
        idx = np.arange(n)
        return np.stack([pair_distances(np.full(n, r), idx) for r in range(lo, hi)])

    return _monotonicity(n, pos, rows_of, pair_distances, exact_limit=2, samples=samples, seed=seed)
