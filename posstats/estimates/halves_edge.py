"""The noise edge of the rank test from two independent halves of the corpus.

Above 4,096 rows the rank test counts the eigenvalues of the Gram matrix
``B = J S S^T J`` (rows of ``S`` the square roots of each position's frequencies, ``J`` the
centring) above the top of the noise bulk. The analytic edge
(:func:`posstats.estimates.noise.mp_edge_value`) bounds that top from the noise's row and
column variances; it stands 1.3-2.2 times above it with independent tokens, and it does not
see the dependence of nearby tokens of one window, which lifts the bulk
(``benchmarks/bench_mp_edge.py``).

This module *measures* the bulk instead. Two halves of the corpus drawn independently of
each other (documents by parity, or the even and odd groups of windows: tokens that depend
on each other stay in one half) give ``D = (S_A - S_B) / 2``, a matrix of pure sampling
noise: the halves share every distribution, so the positional structure cancels, while
the correlation of nearby rows' noise inside one window or document is kept. Its entries
are rescaled column by column so that each column's summed variance is the unbiased one of
the whole corpus' entries, ``sum_i Var sqrt(C[i, v] / N_i)``
(:func:`posstats.estimates.sampling_variance.sqrt_count_variance`): half a corpus has the
wrong variance at small counts (at about one count, ``Var sqrt(X / N)`` is not ``1 / N``-
scaled), and the rescaling puts it on the data's scale without touching the correlation
between rows. The top eigenvalue of ``W^1/2 J D' D'^T J W^1/2`` (``D'`` rescaled, ``W`` the
occupancy weights or ``I``) is then a draw of the top of the data's noise bulk.

Measured against the bulk of corpora with known distributions (``bench_mp_edge.py``,
``top_over_halves``: the data's own top eigenvalue over the halves' one; V = 5,000, Zipf
1.1, n = 512 and 2,048, N = 200 to 20,000 tokens or windows a position, 10 corpora a cell):
mean 0.997-1.007 with independent tokens and 0.985-1.003 on streams repeating the previous
token half of the time (whose bulk is 1.1-2.0 times that of independent tokens); sd 0.3-1.3 %
from N = 2,000 on and 2.0-2.6 % at N = 200, where the data's own top eigenvalue varies by 2 %
from corpus to corpus, as the halves' does. The edge is that top times
``1 + HALVES_EDGE_MARGIN`` (10 %: 3.8 standard deviations of the ratio at N = 200; the
largest ratio measured, 1.054, is at N = 200). The analytic edge stands 1.2-2.3 times above
the bulk of independent tokens and falls to 0.63 times the bulk of the dependent streams.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator, eigsh

from posstats.estimates.sampling_variance import sqrt_count_variance

__all__ = ["HALVES_EDGE_MARGIN", "HalvesEdge", "halves_coverage", "halves_edge", "halves_noise_matrix", "noise_top"]

HALVES_EDGE_MARGIN = 0.10  # the edge over the halves' top noise eigenvalue (module docstring)


@dataclass(frozen=True)
class HalvesEdge:
    """The rank test's edge from two independent halves (module docstring).

    Attributes:
        noise_top: top eigenvalue of the rescaled halves' noise matrix (plug-in scale).
        margin: the edge's relative margin over it.
        rows: rows with tokens in both halves (the others carry no noise row).
        source: where the halves came from (``window groups`` or ``parts``).
        coverage: the smallest share of a row's tokens that the halves hold (the rows'
            relative noise comes from the halves: far below 1, as when most of a truncated
            corpus' documents are shorter than n and in neither window group, their
            pattern is not the data's).
    """

    noise_top: float
    margin: float
    rows: int
    source: str
    coverage: float = 1.0

    @property
    def edge(self) -> float:
        """``noise_top (1 + margin)``: eigenvalues above it count as components."""
        return self.noise_top * (1.0 + self.margin)

    def to_dict(self) -> dict[str, Any]:
        return {"method": "halves", "source": self.source, "noise_top": self.noise_top, "margin": self.margin,
                "edge": self.edge, "rows": self.rows, "coverage": self.coverage}


def _occupancy(c: sp.csr_array) -> np.ndarray:
    return np.asarray(c.sum(axis=1), dtype=np.float64).ravel()


def _sqrt_rows(counts: Any) -> tuple[sp.csr_array, np.ndarray]:
    """``(sqrt(C[i] / occ[i]) row by row as float64 CSR, (m,) occ)``; rows with ``occ[i] = 0``
    empty. One copy of ``counts``, square-rooted in place."""
    out = sp.csr_array(counts, dtype=np.float64, copy=True)
    occ = _occupancy(out)
    out.data /= np.repeat(np.where(occ > 0, occ, 1.0), np.diff(out.indptr))
    np.sqrt(out.data, out=out.data)
    return out, occ


_BLOCK = 1 << 22  # stored entries handled at a time: no temporary of the matrix' size


def _column_variance(full: sp.csr_array) -> tuple[np.ndarray, np.ndarray]:
    """``((V,) t_v = sum_i u(C[i, v]; N_i) / N_i, (m,) N_i)``: each column's unbiased
    summed variance of ``sqrt(C[i, v] / N_i)`` (multinomial rows), by blocks of entries."""
    occ = _occupancy(full)
    target = np.zeros(full.shape[1])
    rows = np.repeat(np.arange(full.shape[0], dtype=np.int64), np.diff(full.indptr)) if full.nnz <= _BLOCK else None
    for a in range(0, full.nnz, _BLOCK):
        b = min(a + _BLOCK, full.nnz)
        row = rows[a:b] if rows is not None else np.searchsorted(full.indptr, np.arange(a, b), side="right") - 1
        n_i = occ[row]
        u = sqrt_count_variance(np.rint(full.data[a:b]).astype(np.int64), total=n_i) / n_i
        target += np.bincount(full.indices[a:b], weights=u, minlength=full.shape[1])
    return target, occ


def halves_noise_matrix(half_a: Any, half_b: Any, full: Any, /) -> tuple[sp.csr_array, np.ndarray]:
    """``(D', both)``: the (m, V) rescaled noise matrix of two independent halves of the
    (m, V) counts ``full`` (module docstring) and the (m,) rows with tokens in both halves
    (the others are zero in ``D'``).

    ``D = (S_A - S_B) / 2`` on those rows; column ``v`` is scaled by
    ``sqrt(t_v / sum_i D[i, v]^2)``, ``t_v = sum_i u(C[i, v]; N_i) / N_i`` the unbiased
    variance of the full corpus' column (multinomial rows), 0 where ``D`` has nothing.
    The halves need not add up to ``full`` (a tail of short windows may sit in neither):
    the rescaling sets the scale, the halves the correlation between rows.
    """
    full = sp.csr_array(full)
    shapes = [np.shape(half_a), np.shape(half_b), full.shape]
    if not shapes[0] == shapes[1] == shapes[2]:
        msg = f"the halves and the counts must have one shape, got {shapes[0]}, {shapes[1]} and {shapes[2]}"
        raise ValueError(msg)
    s_a, occ_a = _sqrt_rows(half_a)
    s_b, occ_b = _sqrt_rows(half_b)
    both = (occ_a > 0) & (occ_b > 0)
    d = sp.csr_array(s_a - s_b)
    del s_a, s_b
    d.data *= np.repeat(np.where(both, 0.5, 0.0), np.diff(d.indptr))
    d.eliminate_zeros()
    target, _ = _column_variance(full)
    have = np.bincount(d.indices, weights=d.data**2, minlength=full.shape[1])
    scale = np.sqrt(np.divide(target, have, out=np.zeros_like(target), where=have > 0))
    d.data *= scale[d.indices]
    return d, both


def noise_top(d: sp.csr_array, weights: Any = None, /) -> float:
    """Top eigenvalue of ``W^1/2 J D D^T J W^1/2`` (``W = diag(weights)``, None: ``I``) by
    ARPACK on products with the (m, V) ``d`` (never m x m)."""
    m = d.shape[0]
    w = np.ones(m) if weights is None else np.sqrt(np.asarray(weights, dtype=np.float64).ravel())
    dt = d.T  # a CSC view: its products need no copy

    def product(x: np.ndarray) -> np.ndarray:
        y = w * x.ravel()
        y -= y.mean()
        y = d @ (dt @ y)
        y -= y.mean()
        return w * y

    if m < 3:
        dense = np.stack([product(e) for e in np.eye(m)], axis=1)
        return float(np.linalg.eigvalsh((dense + dense.T) / 2)[-1]) if m else math.nan
    op = LinearOperator((m, m), matvec=product, dtype=np.float64)
    v0 = np.random.default_rng(0).standard_normal(m)
    # relative tolerance 1e-4: the edge carries a 10 % margin (1e-6 took 1.7x the products
    # at n = 131,072 for the same value to 1e-6)
    return float(eigsh(op, k=1, which="LA", tol=1e-4, v0=v0, return_eigenvectors=False)[0])


def halves_edge(half_a: Any, half_b: Any, full: Any, /, *, weights: Any = None, source: str = "halves",
                margin: float = HALVES_EDGE_MARGIN) -> HalvesEdge:
    """The rank test's edge from two independent halves of the (m, V) counts ``full``
    (module docstring).

    Args:
        half_a, half_b: (m, V) counts of two halves drawn independently of each other
            (their tokens need not add up to ``full``).
        full: (m, V) the counts whose Gram eigenvalues are tested.
        weights: (m,) occupancy weights of the tested ``W^1/2 B W^1/2`` (None: ``W = I``).
        source: where the halves came from, for the report.
        margin: the edge's relative margin over the halves' top noise eigenvalue.

    Returns:
        :class:`HalvesEdge` (``edge`` NaN when fewer than two rows have tokens in both halves).
    """
    d, both = halves_noise_matrix(half_a, half_b, full)
    rows = int(np.count_nonzero(both))
    top = noise_top(d, weights) if rows >= 2 else math.nan
    return HalvesEdge(top, float(margin), rows, source, halves_coverage(half_a, half_b, full))


def halves_coverage(half_a: Any, half_b: Any, full: Any, /) -> float:
    """The smallest share of a row's tokens of ``full`` that the two halves hold together
    (over the rows with tokens; 0 when none has)."""
    def totals(x: Any) -> np.ndarray:
        return np.asarray(x.sum(axis=1), dtype=np.float64).ravel()

    occ, held = totals(full), totals(half_a) + totals(half_b)
    return float(np.min(held[occ > 0] / occ[occ > 0])) if np.any(occ > 0) else 0.0
