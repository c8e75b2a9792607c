"""The noise edge of the rank test from two independent halves of the corpus.

Above 4,096 rows the rank test counts the eigenvalues of the Gram matrix
``B = J S S^T J`` (rows of ``S`` the square roots of each position's frequencies, ``J`` the
centring) above the top of the noise bulk. The analytic edge
(:func:`posstats.estimates.null_rank.mp_edge_value`) bounds that top from the noise's row and
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
between rows. Where occupancies differ the factor is one per column and occupancy bin
(:func:`occupancy_bins`): thin rows are in that small-count regime more often than thick
ones, and one factor per column put the weighted noise 13 % too high at falling occupancy.
The top eigenvalue of ``W^1/2 H_w (D' D'^T - diag(b)) H_w^T W^1/2`` (``D'`` rescaled, ``W``
the occupancy weights or ``I``, ``H_w = I - 1 w^T / sum(w)`` the centring on the weighted
mean as the tested rows are centred, ``b`` the rows' sampling variances when the tested
eigenvalues are bias-corrected) is then a draw of the top of the data's noise bulk, on the
tested eigenvalues' scale.

Measured against the bulk of corpora with known distributions (``bench_mp_edge.py``,
``top_over_halves``: the data's own top eigenvalue over the halves' one; V = 5,000, Zipf
1.1, n = 512 and 2,048, N = 200 to 20,000 tokens or windows a position, 10 corpora a cell):
mean 0.997-1.007 with independent tokens and 0.985-1.003 on streams repeating the previous
token half of the time (whose bulk is 1.1-2.0 times that of independent tokens); sd 0.3-1.3 %
at N = 2,000 and above, 2.0-2.6 % at N = 200, where the data's own top eigenvalue varies by
2 % between corpora, as the halves' does. The edge is that top times
``1 + HALVES_EDGE_MARGIN`` (10 %: 3.8 standard deviations of the ratio at N = 200; the
largest ratio measured, 1.054, is at N = 200) from 512 rows; below, the ratio spreads more
and the margin grows as ``(512 / rows)^(1/3)`` (:func:`halves_margin`: 20 % at 64 rows).
The analytic edge stands 1.2-2.3 times above the bulk of independent tokens and falls to
0.63 times the bulk of the dependent streams.
At falling occupancy (truncated documents, 5-30 % of N at the last position, the parts two
halves of the documents; the weighted, bias-corrected eigenvalues the analysis tests) the
ratio is 0.994-1.013 on average, sd 1.0-1.5 % at N = 2,000 and above, 3.4 % at N = 200.

**The pool's shrinkage error** (fifty-fifth session). Where occupancies differ and the
tested distances are corrected, the tested rows have the square roots' shrinkage removed
under the pooled distribution ``p`` (:mod:`posstats.estimates.occupancy`), whose own
sampling error puts ``-g(N_i) (p - mu)`` into row i: one token vector scaled along
occupancy. ``D`` alone lacks it. Where documents differ from each other it is large (the
longest documents move ``p``), and it lifted the tested top 20-50 % above the halves' noise
on resampled fortunes with no positional structure at n = 256. The halves carry its
analogue, of the same variance and the same correlation with ``D``: the halves' pools'
midpoint against the lower of the two, token by token (the half without the documents that
carry a token stands in for the truth, as the shrinkage bends where a token is seen a few
times). :class:`PoolShiftedNoise` adds it (``D' + Z L``, low rank,
:func:`posstats.estimates.occupancy.halves_pool_shift`). In the symmetric form
``-(m_A(N_i) - m_B(N_i)) / 2`` (fifty-fifth session) it brought that ratio to 1.08 on
average over 20 corpora (from 1.32), and with the weighted centring to 1.05-1.07 at 256 to
1,024 rows; taken on the lower side (fifty-ninth session), 0.96-0.99, as with the
shrinkage under the true law. With documents of one kind it moves the noise top by 0.2 %
or less.

The rank test reads the edges sequentially (:meth:`HalvesNoise.deflated_edges`): the top
component against the whole noise' top, the (j + 1)-th against the top of the noise with
the data's top j components projected off. Where the noise has an outlying direction of its
own along the structure (two halves of documents of different kinds: the fortunes at 512
rows, where the whole top spread by 34 % between splits and the projected one by 5 %), the
whole top is that direction, which the first component holds; by Courant-Fischer the next
eigenvalue competes with the noise off it (docs/calibration.md, "One split is one draw").

Cost: the top eigenvalue is found by Lanczos on products with ``D'`` (never m x m), on
threads (:func:`noise_top`). Where the occupancy weights are equal to 1 % (pack mode: all
but the last window's positions) the weighted top is not solved again: by Ostrowski's
theorem the top of ``W^1/2 H_w A H_w^T W^1/2`` lies between ``min(w)`` and
``max(w) ||H_w||^2`` times the top of ``A`` (centred), so that multiple of the unweighted
top bounds it from above, 1 % at most over it
(:func:`posstats.estimates.null_rank.congruence_upper_bound`; :meth:`HalvesNoise.edge`,
``weights_bound`` in the report).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator, eigsh

from posstats.estimates.null_rank import (
    EQUAL_WEIGHTS,
    bias_shift,
    congruence_upper_bound,
    equal_weights_ratio,
)
from posstats.estimates.sampling_variance import sqrt_count_variance
from posstats.geometry.mds import centring_weights
from posstats.geometry.products import (
    _row_block_views,
    _transposed_views,
    blocks_t_times,
    blocks_times,
    product_threads,
)

__all__ = ["EQUAL_WEIGHTS", "HALVES_EDGE_MARGIN", "HALVES_MARGIN_ROWS", "HalvesEdge", "HalvesNoise", "PoolShiftedNoise",
           "cell_sums",
           "halves_coverage", "halves_edge", "halves_margin", "halves_noise", "halves_noise_matrix", "noise_scale",
           "noise_top", "occupancy_bins", "rescale_noise", "unscaled_noise"]

HALVES_EDGE_MARGIN = 0.10  # the edge over the halves' top noise eigenvalue, from HALVES_MARGIN_ROWS rows
HALVES_MARGIN_ROWS = 512  # below this many rows the margin grows as (HALVES_MARGIN_ROWS / rows)^(1/3)
# ARPACK's relative tolerance for the noise top: the Ritz value is then within 0.1 % of the
# eigenvalue, against the edge's 10 % margin and the ratio's sd of 0.3-2.6 %. At n = 131,072
# (2.02e8 packed tokens) it took 41 products against 71 at 1e-4 (20 s -> 15 s) for a value
# 2.8e-5 lower (1e-6 took 1.7x the products of 1e-4 for the same value to 1e-6).
NOISE_TOP_TOL = 1e-3


def halves_margin(rows: int, /) -> float:
    """The edge's relative margin over the halves' top noise eigenvalue for ``rows``
    geometry rows: ``HALVES_EDGE_MARGIN * max(1, (HALVES_MARGIN_ROWS / rows)^(1/3))``,
    10 % from 512 rows, 12.6 % at 256, 15.9 % at 128, 20 % at 64.

    The ratio of the corpus' top noise eigenvalue to the halves' spreads more with fewer
    rows. On truncate-mode corpora of strongly dependent documents mostly shorter than n
    (``benchmarks/bench_document_halves.py``'s null corpora: successor streams, stay 0.9,
    V = 200; the harshest case measured) its sd was 0.079 / 0.065 / 0.048 / 0.039 at
    n = 64 / 128 / 256 / 512 (200, 200, 200 and 111 corpora), falling about as
    ``n^(-1/3)``, and a fixed 10 % margin let the rank test alone reject 14 / 8 / 5 / 2.7 %
    of them. With the growing margin, on 200 fresh corpora a size: 0, 2 and 1 of 200 at
    n = 64, 128 and 256, with every planted corpus (positions 0-3, 30 %) still found
    (docs/calibration.md).
    """
    return HALVES_EDGE_MARGIN * max(1.0, (HALVES_MARGIN_ROWS / max(int(rows), 1)) ** (1.0 / 3.0))


@dataclass(frozen=True)
class HalvesEdge:
    """The rank test's edge from two independent halves (module docstring).

    Attributes:
        noise_top: top eigenvalue of the rescaled halves' noise matrix, on the scale of the
            tested eigenvalues (plug-in, or bias-corrected: :func:`noise_top`).
        margin: the edge's relative margin over it (on the plug-in scale).
        rows: rows with tokens in both halves (the others carry no noise row).
        source: where the halves came from (``window groups`` or ``parts``).
        coverage: the smallest share of a row's tokens that the halves hold (the rows'
            relative noise comes from the halves: far below 1, as when most of a truncated
            corpus' documents are shorter than n and in neither window group, their
            pattern is not the data's).
        shift: what takes bias-corrected eigenvalues to the plug-in scale the edge is
            stated on (:func:`posstats.estimates.null_rank.bias_shift`; 0 for plug-in ones).
        weights_bound: ``max(w) / min(w)`` where the weighted top is the unweighted one
            times the largest weight (weights equal to :data:`EQUAL_WEIGHTS`: an upper
            bound at most that much above it); None where it was solved.
        deflated: j, the data's top components projected off the noise before its top
            was taken (:meth:`HalvesNoise.deflated_edges`); 0 for the whole noise.
        pool_shift: the noise carries the halves' analogue of the pooled distribution's
            error in the occupancy shrinkage (:class:`PoolShiftedNoise`).
    """

    noise_top: float
    margin: float
    rows: int
    source: str
    coverage: float = 1.0
    shift: float = 0.0
    weights_bound: float | None = None
    deflated: int = 0  # the data's top components projected off the noise (HalvesNoise.deflated_edges)
    pool_shift: bool = False  # the noise carries the pool's shrinkage error (PoolShiftedNoise)

    @property
    def edge(self) -> float:
        """``(noise_top + shift) (1 + margin)``, on the plug-in scale: tested eigenvalues
        plus ``shift`` above it count as components."""
        return (self.noise_top + self.shift) * (1.0 + self.margin)

    def to_dict(self) -> dict[str, Any]:
        return {"method": "halves", "source": self.source, "noise_top": self.noise_top, "shift": self.shift,
                "margin": self.margin, "edge": self.edge, "rows": self.rows, "coverage": self.coverage,
                **({"weights_bound": self.weights_bound} if self.weights_bound is not None else {}),
                **({"deflated": self.deflated} if self.deflated else {}),
                **({"pool_shift": True} if self.pool_shift else {})}


def _occupancy(c: Any) -> np.ndarray:
    """(m,) float64 row sums of the CSR ``c``: one ``np.add.reduceat`` over the runs of the
    non-empty rows (scipy's ``sum(axis=1)`` took 0.56 s for a half of 6e7 entries at n =
    131,072, this 0.02 s); integer counts are summed as int64 (exact)."""
    c = c if isinstance(c, sp.csr_array) else sp.csr_array(c)
    out = np.zeros(c.shape[0])
    ptr = np.asarray(c.indptr, dtype=np.int64)
    filled = np.flatnonzero(ptr[1:] > ptr[:-1])
    if filled.size:
        kind = np.int64 if np.issubdtype(c.data.dtype, np.integer) else np.float64
        # one cast of the whole array: reduceat casting int32 run by run took 1 s at 6e7
        out[filled] = np.add.reduceat(c.data[: ptr[-1]].astype(kind, copy=False), ptr[filled])
    return out


def _sqrt_rows(counts: Any) -> tuple[sp.csr_array, np.ndarray]:
    """``(sqrt(C[i] / occ[i]) row by row as float64 CSR, (m,) occ)``; rows with ``occ[i] = 0``
    empty. One copy of ``counts``, square-rooted in place."""
    out = sp.csr_array(counts, dtype=np.float64, copy=True)
    occ = _occupancy(out)
    out.data /= np.repeat(np.where(occ > 0, occ, 1.0), np.diff(out.indptr))
    np.sqrt(out.data, out=out.data)
    return out, occ


_BLOCK = 1 << 22  # stored entries handled at a time: no temporary of the matrix' size


def occupancy_bins(occupancy: Any, /, *, bins: int = 8) -> np.ndarray:
    """(m,) int64 bin of each row by occupancy: ``bins`` quantile bins of ``log N_i`` (one
    bin, all 0, when every occupancy is equal). The rescaling of the halves' noise is done
    per (bin, column): at a few tokens a position, half of them have another variance
    pattern than all of them (module docstring), so one factor per column would move
    variance between thin and thick rows."""
    occ = np.asarray(occupancy, dtype=np.float64).ravel()
    used = occ > 0
    if not used.any() or occ[used].min() == occ[used].max():
        return np.zeros(occ.size, dtype=np.int64)
    logs = np.log(np.where(used, occ, 1.0))
    edges = np.quantile(logs[used], np.linspace(0.0, 1.0, bins + 1)[1:-1])
    return np.searchsorted(edges, logs, side="right").astype(np.int64)


def _row_runs(c: sp.csr_array, a: int, b: int) -> tuple[slice, np.ndarray]:
    """``(rows, per_row)`` of the stored entries ``a .. b - 1`` of CSR ``c`` (``a < b``): the
    slice of rows the block spans and how many of its entries each holds (two searches, not
    one per entry). ``np.repeat(x[rows], per_row)`` spreads a per-row ``x`` over the entries
    (a gather through a per-entry row index took 2-3x as long at 1.3e8 entries)."""
    first, last = (int(r) for r in np.searchsorted(c.indptr, [a, b - 1], side="right") - 1)
    ptr = np.asarray(c.indptr[first : last + 2], dtype=np.int64)
    return slice(first, last + 1), np.minimum(ptr[1:], b) - np.maximum(ptr[:-1], a)


def _entry_cells(c: sp.csr_array, a: int, b: int, row_offset: np.ndarray) -> np.ndarray:
    """(b - a,) int64 ``row_offset[row] + column`` of the stored entries ``a .. b - 1``: with
    ``row_offset = bin * V`` the (occupancy bin, column) cell of each entry."""
    rows, per_row = _row_runs(c, a, b)
    cell = np.repeat(row_offset[rows], per_row)
    cell += c.indices[a:b]
    return cell


def _cell_variance(full: sp.csr_array, row_bin: np.ndarray, bins: int) -> np.ndarray:
    """(bins * V,) ``t[k, v] = sum_{i in bin k} u(C[i, v]; N_i) / N_i``: the unbiased summed
    variance of ``sqrt(C[i, v] / N_i)`` (multinomial rows) by (bin, column), by blocks of
    entries."""
    occ = _occupancy(full)
    vocab = full.shape[1]
    offset = row_bin * vocab
    integer = np.issubdtype(full.data.dtype, np.integer)
    target = np.zeros(bins * vocab)
    for a in range(0, full.nnz, _BLOCK):
        b = min(a + _BLOCK, full.nnz)
        rows, per_row = _row_runs(full, a, b)
        n_i = np.repeat(occ[rows], per_row)
        k = full.data[a:b] if integer else np.rint(full.data[a:b]).astype(np.int64)
        u = sqrt_count_variance(k, total=n_i)
        u /= n_i
        target += np.bincount(_entry_cells(full, a, b, offset), weights=u, minlength=bins * vocab)
    return target


def unscaled_noise(half_a: Any, half_b: Any, /) -> tuple[sp.csr_array, np.ndarray]:
    """``(D, both)``: ``D = (S_A - S_B) / 2`` of two halves' (m, V) counts on the (m,) rows
    ``both`` with tokens in each half, zero elsewhere (before :func:`rescale_noise`)."""
    s_a, occ_a = _sqrt_rows(half_a)
    s_b, occ_b = _sqrt_rows(half_b)
    both = (occ_a > 0) & (occ_b > 0)
    half = np.where(both, 0.5, 0.0)  # exact in binary: 0.5 (x - y) = 0.5 x - 0.5 y
    for s in (s_a, s_b):
        s.data *= np.repeat(half, np.diff(s.indptr))
    # the difference stores no zero (scipy drops them): rows outside ``both`` vanish here
    d = sp.csr_array(s_a - s_b)
    return d, both


def cell_sums(d: sp.csr_array, full: Any, row_bin: np.ndarray, bins: int, /) -> tuple[np.ndarray, np.ndarray]:
    """``(have, target)``, each (bins * V,): ``sum_{i in bin k} D[i, v]^2`` and the full
    counts' unbiased ``t[k, v]`` (:func:`halves_noise_matrix`) over the rows at hand. Sums:
    rows held apart add theirs (:mod:`posstats.estimates.ranged_halves`)."""
    full = sp.csr_array(full)
    vocab = full.shape[1]
    target = _cell_variance(full, row_bin, bins)
    have = np.zeros(bins * vocab)
    offset = row_bin * vocab
    for a in range(0, d.nnz, _BLOCK):
        b = min(a + _BLOCK, d.nnz)
        have += np.bincount(_entry_cells(d, a, b, offset), weights=np.square(d.data[a:b]), minlength=bins * vocab)
    return have, target


def noise_scale(have: np.ndarray, target: np.ndarray, /) -> np.ndarray:
    """(bins * V,) ``sqrt(target / have)``, 0 where ``D`` has nothing."""
    return np.sqrt(np.divide(target, have, out=np.zeros_like(target), where=have > 0))


def rescale_noise(d: sp.csr_array, row_bin: np.ndarray, scale: np.ndarray, /) -> None:
    """Multiply each entry of ``d`` in place by its (bin of its row, column) ``scale``."""
    offset = row_bin * d.shape[1]
    for a in range(0, d.nnz, _BLOCK):
        b = min(a + _BLOCK, d.nnz)
        d.data[a:b] *= scale[_entry_cells(d, a, b, offset)]


def halves_noise_matrix(half_a: Any, half_b: Any, full: Any, /) -> tuple[sp.csr_array, np.ndarray]:
    """``(D', both)``: the (m, V) rescaled noise matrix of two independent halves of the
    (m, V) counts ``full`` (module docstring) and the (m,) rows with tokens in both halves
    (the others are zero in ``D'``).

    ``D = (S_A - S_B) / 2`` on those rows; column ``v`` of the rows of occupancy bin ``k``
    (:func:`occupancy_bins`; one bin at equal occupancy) is scaled by
    ``sqrt(t[k, v] / sum_{i in k} D[i, v]^2)``, ``t[k, v] = sum_{i in k} u(C[i, v]; N_i) / N_i``
    the unbiased variance of the full corpus' entries there (multinomial rows), 0 where
    ``D`` has nothing.
    The halves need not add up to ``full`` (a tail of short windows may sit in neither):
    the rescaling sets the scale, the halves the correlation between rows.
    """
    full = sp.csr_array(full)
    shapes = [np.shape(half_a), np.shape(half_b), full.shape]
    if not shapes[0] == shapes[1] == shapes[2]:
        msg = f"the halves and the counts must have one shape, got {shapes[0]}, {shapes[1]} and {shapes[2]}"
        raise ValueError(msg)
    d, both = unscaled_noise(half_a, half_b)
    row_bin = occupancy_bins(_occupancy(full))
    have, target = cell_sums(d, full, row_bin, int(row_bin.max()) + 1)
    rescale_noise(d, row_bin, noise_scale(have, target))
    return d, both


def noise_top(d: Any, weights: Any = None, diagonal: Any = None, /, *, tol: float | None = None,
              deflate: Any = None) -> float:
    """Top eigenvalue of ``W^1/2 H_w (D D^T - diag(b)) H_w^T W^1/2`` (``W = diag(weights)``,
    None: ``I``; ``H_w = I - 1 pi^T`` the centring on the weighted mean, ``pi = w / sum(w)``,
    as the rank test's data are centred: :func:`posstats.geometry.mds.centre_on_weights_in_place`;
    ``b = diagonal``, None: 0) by ARPACK on products with the (m, V) ``d`` (never
    m x m): a CSR matrix (products on threads), or rows held apart, any object with
    ``shape``, ``times(X)`` (``D X``) and ``t_times(Y)`` (``D^T Y``) for (V, b) and (m, b)
    blocks (:class:`posstats.estimates.ranged_halves.RangedNoise`). With ``b`` the rows'
    sampling variances it is on the scale of the bias-corrected Gram matrix
    ``B - H diag(b) H`` the rank test reads. ``tol``: ARPACK's relative tolerance
    (None: :data:`NOISE_TOP_TOL`).

    ``deflate``: (m, j) orthonormal columns ``U`` (the data's top j tested components):
    the top eigenvalue of ``P N P`` instead, ``P = I - U U^T``, the noise off those
    components. By Courant-Fischer the (j + 1)-th eigenvalue of ``S + N`` with ``S`` of rank
    j along ``U`` is at most that top, the bound the (j + 1)-th component is tested against
    (:meth:`HalvesNoise.deflated_edges`)."""
    m, vocab = d.shape
    w = np.ones(m) if weights is None else np.sqrt(np.asarray(weights, dtype=np.float64).ravel())
    pi = centring_weights(w * w)  # 1 / m unweighted: the plain mean
    b = None if diagonal is None else np.asarray(diagonal, dtype=np.float64).ravel()
    u = None if deflate is None else np.asarray(deflate, dtype=np.float64).reshape(m, -1)
    if sp.issparse(d):
        blocks = _row_block_views(sp.csr_array(d), product_threads())  # views of d's arrays, on threads
        blocks_t = _transposed_views(blocks)

        def gram(y: np.ndarray) -> np.ndarray:
            return blocks_times(blocks, blocks_t_times(blocks_t, y[:, None], vocab), vocab).ravel()
    else:
        def gram(y: np.ndarray) -> np.ndarray:
            return np.asarray(d.times(d.t_times(y[:, None])), dtype=np.float64).ravel()

    def noise(x: np.ndarray) -> np.ndarray:
        y = w * x.ravel()
        y -= pi * y.sum()  # H_w^T y
        z = gram(y)
        if b is not None:
            z -= b * y
        z -= pi @ z  # H_w z
        return w * z

    def product(x: np.ndarray) -> np.ndarray:
        if u is None:
            return noise(x)
        x = x.ravel() - u @ (u.T @ x.ravel())
        z = noise(x)
        return z - u @ (u.T @ z)

    if m < 3:
        dense = np.stack([product(e) for e in np.eye(m)], axis=1)
        return float(np.linalg.eigvalsh((dense + dense.T) / 2)[-1]) if m else math.nan
    op = LinearOperator((m, m), matvec=product, dtype=np.float64)
    v0 = np.random.default_rng(0).standard_normal(m)
    tol = NOISE_TOP_TOL if tol is None else float(tol)
    return float(eigsh(op, k=1, which="LA", tol=tol, v0=v0, return_eigenvectors=False)[0])


class PoolShiftedNoise:
    """``D' + Z L`` (m, V): the halves' rescaled noise ``D'`` (a CSR matrix, or rows held
    apart: any ``d`` of :func:`noise_top`) plus a low-rank term, ``Z`` (m, K) sparse
    interpolation weights and ``L`` (K, V), with the products :func:`noise_top` takes.

    The term is the halves' analogue of the error the pooled distribution puts into the
    corrected rows' occupancy shrinkage (:func:`posstats.estimates.occupancy.halves_pool_shift`):
    the tested rows carry ``-g(N_i) (p - mu)``, a structure along falling occupancy that
    ``D'`` alone lacks. Where documents differ it lifted the tested top above the halves'
    noise by 20-50 % on corpora with no positional structure (docs/calibration.md).
    Products cost those of ``D'`` plus ``2 m + V K`` a column: ``Z`` has two entries a row.
    """

    def __init__(self, noise: Any, weights: Any, shift: Any, /) -> None:
        self.noise = noise
        self.weights = sp.csr_array(weights)
        self.shift = np.ascontiguousarray(shift, dtype=np.float64)
        self.shape = tuple(noise.shape)
        if self.weights.shape != (self.shape[0], self.shift.shape[0]) or self.shift.shape[1] != self.shape[1]:
            msg = (f"a shift of (m, K) {self.weights.shape} and (K, V) {self.shift.shape} does not fit a noise of "
                   f"{self.shape}")
            raise ValueError(msg)
        if sp.issparse(noise):
            self._blocks = _row_block_views(sp.csr_array(noise), product_threads())  # views, on threads
            self._blocks_t = _transposed_views(self._blocks)

    @property
    def runner(self) -> Any:
        """The ranges' runner of a noise held apart (to let its rows go); AttributeError
        for a CSR noise, which has none."""
        return self.noise.runner

    def times(self, x: np.ndarray, /) -> np.ndarray:
        """``(D' + Z L) X`` (m, b) for a (V, b) block ``X``."""
        x = np.asarray(x, dtype=np.float64)
        if sp.issparse(self.noise):
            out = blocks_times(self._blocks, x, self.shape[1])
        else:
            out = np.array(self.noise.times(x), dtype=np.float64)
        out += self.weights @ (self.shift @ x)
        return out

    def t_times(self, y: np.ndarray, /) -> np.ndarray:
        """``(D' + Z L)^T Y`` (V, b) for an (m, b) block ``Y``."""
        y = np.asarray(y, dtype=np.float64)
        if sp.issparse(self.noise):
            out = blocks_t_times(self._blocks_t, y, self.shape[1])
        else:
            out = np.array(self.noise.t_times(y), dtype=np.float64)
        out += self.shift.T @ (self.weights.T @ y)
        return out


@dataclass(frozen=True)
class HalvesNoise:
    """The halves' rescaled noise matrix (:func:`halves_noise_matrix`), computed once and
    read on as many scales as the analysis tests (:meth:`edge`).

    Attributes:
        matrix: (m, V) the rescaled noise matrix (CSR, or rows held apart: any ``d`` of
            :func:`noise_top`), or None when the halves' ``coverage`` was below the least
            asked for (then it would not be used).
        rows: rows with tokens in both halves (0 without a matrix).
        coverage: :func:`halves_coverage`.
        source: where the halves came from, for the report.
    """

    matrix: sp.csr_array | None
    rows: int
    coverage: float
    source: str
    _unweighted: dict = field(default_factory=dict, compare=False, repr=False)  # bias bytes -> top with W = I

    def edge(self, weights: Any = None, bias: Any = None, /, *, margin: float | None = None) -> HalvesEdge:
        """The :class:`HalvesEdge` on the scale of the tested eigenvalues: ``weights`` the
        occupancy weights of ``W^1/2 B W^1/2`` (None: ``W = I``), ``bias`` the rows'
        sampling variances when they are bias-corrected (None: plug-in), ``margin`` the
        edge's relative margin (None: :func:`halves_margin` of the rows); ``edge`` NaN when
        fewer than two rows have tokens in both halves. Weights equal to
        :data:`EQUAL_WEIGHTS` take the unweighted top (solved once for a ``bias``) times the
        largest weight, an upper bound (module docstring)."""
        shift = bias_shift(bias, weights)
        margin = halves_margin(self.rows) if margin is None else margin
        pooled = isinstance(self.matrix, PoolShiftedNoise)
        if self.matrix is None or self.rows < 2:
            return HalvesEdge(math.nan, float(margin), self.rows, self.source, self.coverage, shift)
        w = None if weights is None else np.asarray(weights, dtype=np.float64).ravel()
        ratio = None if w is None else equal_weights_ratio(w)
        if w is not None and ratio is None:
            return HalvesEdge(noise_top(self.matrix, w, bias), float(margin), self.rows, self.source, self.coverage,
                              shift, pool_shift=pooled)
        key = None if bias is None else np.asarray(bias, dtype=np.float64).tobytes()
        if key not in self._unweighted:
            self._unweighted[key] = noise_top(self.matrix, None, bias)
        top = self._unweighted[key]
        if w is None:
            return HalvesEdge(top, float(margin), self.rows, self.source, self.coverage, shift, pool_shift=pooled)
        scaled = float(congruence_upper_bound([top], w)[0])  # Ostrowski: the larger end bounds it
        return HalvesEdge(scaled, float(margin), self.rows, self.source, self.coverage, shift, weights_bound=ratio,
                          pool_shift=pooled)

    def pool_shifted(self, weights: Any, shift: Any, /) -> HalvesNoise:
        """This noise with the halves' analogue of the pool's shrinkage error added
        (:class:`PoolShiftedNoise`; ``weights`` (m, K) and ``shift`` (K, V) from
        :func:`posstats.estimates.occupancy.halves_pool_shift`); itself without a matrix."""
        if self.matrix is None:
            return self
        return HalvesNoise(PoolShiftedNoise(self.matrix, weights, shift), self.rows, self.coverage, self.source)


    def deflated_edges(self, tested: Any, vectors: Any, weights: Any = None, bias: Any = None, /, *,
                       first: HalvesEdge, steps: int) -> list[HalvesEdge]:
        """The edges a sequential rank test reads: ``first`` (the top of the whole noise,
        :meth:`edge`) for the data's top component and, while the j-th tested eigenvalue
        (``tested``, on the tested scale: the edge's ``shift`` is added) stands above its
        edge, the edge of the noise off the data's top j components (``vectors``, (m, k)
        orthonormal: :func:`noise_top` with ``deflate``) for the (j + 1)-th, at most
        ``steps`` of them. Every edge has ``first``'s margin and shift. The list ends with
        the edge the first component that did not count was compared with (or the last
        one computed); those edges never rise (each deflation projects off more), so the
        last one bounds every later component.

        Why: where the noise has an outlying direction of its own along the structure
        (the halves' mix of documents of different kinds moves the openings' strength),
        the whole noise' top is that direction, which the data's first component already
        holds; the second component competes with the noise off it
        (docs/calibration.md, "One split is one draw")."""
        lam = np.asarray(tested, dtype=np.float64).ravel()
        vec = np.asarray(vectors, dtype=np.float64)
        w = None if weights is None else np.asarray(weights, dtype=np.float64).ravel()
        edges = [first]
        j = 0
        while (self.matrix is not None and j < min(steps, vec.shape[1], lam.size - 1)
               and lam[j] + first.shift > edges[-1].edge):
            j += 1
            top = noise_top(self.matrix, w, bias, deflate=vec[:, :j])
            edges.append(dataclasses.replace(first, noise_top=min(top, edges[-1].noise_top), deflated=j,
                                             weights_bound=None))
        return edges


def halves_noise(half_a: Any, half_b: Any, full: Any, /, *, source: str = "halves",
                 min_coverage: float = 0.0) -> HalvesNoise:
    """:class:`HalvesNoise` of two independent halves of the (m, V) counts ``full``
    (their tokens need not add up to ``full``); no matrix when the halves hold less than
    ``min_coverage`` of some row's tokens."""
    coverage = halves_coverage(half_a, half_b, full)
    if coverage < min_coverage:
        return HalvesNoise(None, 0, coverage, source)
    d, both = halves_noise_matrix(half_a, half_b, full)
    return HalvesNoise(d, int(np.count_nonzero(both)), coverage, source)


def halves_edge(half_a: Any, half_b: Any, full: Any, /, *, weights: Any = None, bias: Any = None,
                source: str = "halves", margin: float | None = None) -> HalvesEdge:
    """The rank test's edge from two independent halves of the (m, V) counts ``full``
    (module docstring): :func:`halves_noise` read once by :meth:`HalvesNoise.edge`.

    Args:
        half_a, half_b: (m, V) counts of two halves drawn independently of each other
            (their tokens need not add up to ``full``).
        full: (m, V) the counts whose Gram eigenvalues are tested.
        weights: (m,) occupancy weights of the tested ``W^1/2 B W^1/2`` (None: ``W = I``).
        bias: (m,) the rows' sampling variances ``b`` when the tested eigenvalues are the
            bias-corrected ``W^1/2 (B - H diag(b) H) W^1/2``'s (None: plug-in).
        source: where the halves came from, for the report.
        margin: the edge's relative margin over the halves' top noise eigenvalue (None:
            :func:`halves_margin` of the rows with tokens in both halves).

    Returns:
        :class:`HalvesEdge` (``edge`` NaN when fewer than two rows have tokens in both halves).
    """
    return halves_noise(half_a, half_b, full, source=source).edge(weights, bias, margin=margin)


def halves_coverage(half_a: Any, half_b: Any, full: Any, /) -> float:
    """The smallest share of a row's tokens of ``full`` that the two halves hold together
    (over the rows with tokens; 0 when none has)."""
    occ, held = _occupancy(full), _occupancy(half_a) + _occupancy(half_b)
    return float(np.min(held[occ > 0] / occ[occ > 0])) if np.any(occ > 0) else 0.0
