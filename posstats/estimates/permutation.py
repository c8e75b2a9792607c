"""The permutation null: corpora in which positions carry no information, and the two
Monte Carlo tests the verdict takes from them.

**Null hypothesis.** H0: every position has the same token distribution (the corpus is
stationary) and tokens are independent. Under H0 the tokens of the geometry rows are
exchangeable across positions, so the corpus with its tokens shuffled across positions,
keeping each position's occupancy and the pooled counts (:func:`shuffled_rows`), has the
same distribution as the corpus itself given those margins. This is the exact conditional
null; an earlier version drew Poisson counts from the pooled distribution, which spreads a
token seen once in the corpus over Poisson(1) occurrences and keeps no occupancy exactly.

**Monte Carlo tests** (Barnard 1963; Besag and Clifford 1989; Phipson and Smyth 2010): for
a statistic ``T`` and ``R`` shuffled corpora, ``p = (1 + #{r : T_r >= T}) / (R + 1)`` is a
valid p-value at every R (``P(p <= a) <= a`` under H0), never 0. With ``R = 39`` the test
at level 2.5 % rejects exactly when ``T`` exceeds all 39 null values.

- **Homogeneity** (:func:`homogeneity_statistic`): ``S = sum_i N_i d_H^2(mu_hat_i, p_hat)``,
  the occupancy-weighted plug-in distance of every row to the pooled distribution. It is
  the Hellinger analogue of the chi-square test of homogeneity (``4 S`` is that test's
  Hellinger-disparity statistic in the dense regime); the permutation null replaces the
  chi-square approximation, which fails when most tokens are rare. It is powerful against
  diffuse alternatives (many positions moving a little: a drift), where the per-position
  standout test is not.
- **Rank** (:func:`top_eigenvalue`): the largest eigenvalue of the classical-MDS Gram
  matrix on the data's scale (plug-in ``B``, or the bias-corrected ``B - H diag(b) H`` with
  each corpus' own unbiased sampling variances ``b``: the null goes through the same
  estimator as the data). A data eigenvalue counts as a component above noise when it
  exceeds the largest top eigenvalue of all R null corpora. Comparing every data eigenvalue
  with the null's *top* eigenvalue is conservative for the later ones; the first
  comparison holds the level.

  **Stopping once decided.** The count is ``#{lambda_j > max_r top_r}``, and the maximum
  only grows with r: once one null corpus' top eigenvalue reaches the data's largest
  tested eigenvalue, no eigenvalue can count whatever the others give. The null
  (:func:`permutation_null` and :func:`posstats.estimates.rotation.rotation_null_corpora`,
  ``stop_at``) then solves no further null corpus (each an m x m distance matrix and
  eigensolve, 16 s at m = 4,096):
  the decision and its level are the full test's (Besag and Clifford's 1991 sequential
  Monte Carlo test with h = 1: draw until one null value reaches the data's), only the
  threshold reported is then a lower bound of the full one
  (:attr:`PermutationNull.eigen_replicates` against ``null_top_eigenvalues.size``).
  The null corpora are solved a few at a time on threads, as cores and memory allow
  (:mod:`posstats.estimates.replicates`), with exactly the values and the stop of a loop.

  **Occupancy weighting.** Where occupancies differ (every truncate-mode corpus: documents
  shorter than the context leave the last positions thin), a position's sampling noise in
  ``B`` scales as ``1 / N_i``, and the top eigenvalue of a noise-only corpus is set by its
  thinnest positions: a structure on well-occupied positions sits under them (4 planted
  positions, n = 64, occupancy 2,000 falling to 100: 0 components above noise in 10 of 10
  corpora, where equal occupancy finds 4). The test then compares the eigenvalues of the
  whitened Gram matrix ``W^1/2 B W^1/2``, ``W = diag(N_i / mean N)`` (:func:`occupancy_weights`),
  on the data and on every null corpus alike (null corpora keep each occupancy, so they
  share ``W``): inverse-noise-variance weighting, the usual remedy for heteroscedastic
  noise in PCA (Hong, Balzano and Fessler 2023, "Optimally weighted PCA for
  high-dimensional heteroscedastic data"; Leeb and Romanov 2021 whiten before
  thresholding). A congruence by a positive diagonal matrix keeps the rank, so the count
  still estimates the number of dimensions of ``B``; at equal occupancy ``W = I`` and
  nothing changes. The eigenvalues compared are then not the spectrum's
  (``null.tested_eigenvalues`` in the report).

  The rows are centred on their occupancy-weighted mean, ``B_w = H_w B H_w^T`` with
  ``H_w = I - 1 w^T / sum(w)`` (:func:`posstats.geometry.mds.centre_on_weights_in_place`;
  since the fifty-sixth session), so the matrix tested is ``W^1/2 B_w W^1/2``
  (:data:`WEIGHTING_FORMULA`). The plain mean gave every position one share of the centre:
  where documents differ and a few long ones fill hundreds of thin positions, their shared
  deviation moved the centre, and so every well-occupied row the weights then make count.
  On documents resampled from the bundled fortunes (no positional structure) at 512 rows
  the tested top stood 1.28-1.39 times the halves' noise top on average and the rank test
  alone counted a component in 17 of 20 corpora; centred on the weighted mean, 1.05 and
  2-3 of 20 (docs/calibration.md, "Centred on the weighted mean"). Where tokens are
  independent the decisions keep their level and power; on a thin tail the contrast of
  thick and thin rows is now carried by the thin rows' weight, so fewer such components
  are counted ("What the centring costs in power"). The centring changes
  no distance between the rows, only the centre their variance is measured from, and it
  is the one the weighted strain of :func:`posstats.geometry.mds.weighted_coordinates`
  fits.
- **Noise share of the distances** (:func:`distance_sum`): the same null corpora give the
  sum of pairwise distances ``sum_{i<j} sqrt(max(D_ij - b_i - b_j, 0))`` that a stationary
  corpus of the data's occupancies reaches by sampling noise alone. Its mean over the null
  corpora, divided by the data's sum, is the share of the data's distances that noise
  explains: square roots of noisy near-zero squared distances are biased upward by about
  the square root of their noise, and no estimator removes that, so where the share is
  large, stresses computed from the distances (and their intervals) are biased toward the
  noise (docs/calibration.md measures how much). Shuffled corpora are that stationary
  corpus whatever null the tests use: rotated ones (:mod:`posstats.estimates.rotation`)
  keep the structure they move, and their sums with it, so with them the share comes from
  shuffled corpora of their own (:func:`null_distance_sums`). Dependence between nearby
  positions makes the data's near pairs closer than the shuffles' (their rows are
  correlated), so there the share leans high: a caveat given too often, never too rarely.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.linalg
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from posstats.estimates.occupancy import OccupancyShrinkage, adjusted
from posstats.estimates.replicates import (
    first_solve_alone,
    in_replicate_order,
    replicate_bytes,
    replicates_in_flight,
)
from posstats.estimates.sampling_variance import position_sampling_variance
from posstats.estimates.standout import distance_to_pool
from posstats.geometry.hellinger import hellinger_sq
from posstats.geometry.mds import centre_on_weights_in_place, gram_in_place

__all__ = [
    "WEIGHTING_FORMULA",
    "PermutationNull",
    "checked_replicates",
    "distance_sum",
    "gram_top_eigenvalues",
    "homogeneity_statistic",
    "monte_carlo_p_value",
    "null_distance_sums",
    "occupancy_weights",
    "permutation_null",
    "rank_test_eigenvalues",
    "rank_test_open",
    "shuffled_rows",
    "top_eigenpairs",
    "top_eigenvalue",
    "weighted_gram",
]

_DENSE_EIGEN_LIMIT = 512  # rows up to which the top eigenvalue comes from a dense subset solve
_SUBSET_EIGEN_LIMIT = 4096  # rows up to which the rank test's top k come from a dense subset solve (else ARPACK)


def _csr(rows: Any) -> sp.csr_array:
    """Integer counts as canonical CSR (duplicates summed)."""
    c = sp.csr_array(rows)
    c.sum_duplicates()
    return c


def _integer_csr(rows: Any) -> sp.csr_array:
    """:func:`_csr` of integer counts (float ones holding integers cast to int64; a one-line
    ValueError otherwise)."""
    c = _csr(rows)
    if c.dtype.kind not in "iu":
        if not np.array_equal(c.data, np.round(c.data)):
            msg = "a permutation null needs integer counts"
            raise ValueError(msg)
        c = c.astype(np.int64)
    return c


def shuffled_rows(rows: Any, rng: np.random.Generator, /) -> sp.csr_array:
    """The tokens of ``rows`` shuffled across rows: a uniformly random corpus with the same
    row sums (occupancies) and column sums (pooled counts).

    Two exact samplers of that one distribution, whichever is cheaper:

    - by token, O(tokens): token ``t`` of the pooled multiset (sorted by token id) goes to
      the row at place ``t`` of a random permutation of the row labels
      ``repeat(arange(m), occ)``;
    - by row, O(m V'), for many tokens per row (V' the tokens seen): row i is a
      multivariate hypergeometric draw of ``occ[i]`` tokens from what the rows before it
      left of the pool.

    Args:
        rows: (m, V) non-negative integer counts (sparse or dense).
        rng: the randomness (seeded draws are reproducible).

    Returns:
        (m, V) int64 CSR counts.
    """
    c = _csr(rows)
    m, vocab = c.shape
    occ = np.asarray(c.sum(axis=1)).ravel().astype(np.int64)
    pooled = np.asarray(c.sum(axis=0)).ravel().astype(np.int64)
    cols = np.flatnonzero(pooled)
    if _draws_by_row(m, cols.size, int(occ.sum())):
        return _shuffled_by_row(occ, cols, pooled[cols], vocab, rng)
    index_dtype = np.int32 if max(m, vocab) < 2**31 else np.int64
    tokens = np.repeat(cols.astype(index_dtype), pooled[cols])
    labels = np.repeat(np.arange(m, dtype=index_dtype), occ)
    rng.shuffle(labels)
    out = sp.csr_array((np.ones(tokens.size, dtype=np.int64), (labels, tokens)), shape=(m, vocab))
    out.sum_duplicates()
    return out


_ROW_DRAW_COST = 3  # a hypergeometric draw per (row, token seen) costs about 3 token moves


def _draws_by_row(rows: int, seen: int, tokens: int, /) -> bool:
    """Whether :func:`shuffled_rows` draws ``rows`` rows one by one (a draw per row and token
    id ``seen``) rather than moving each of ``tokens`` tokens: whichever is cheaper."""
    return _ROW_DRAW_COST * rows * seen < tokens


def _tokens_shuffled(rows: sp.csr_array, /) -> int:
    """The tokens :func:`shuffled_rows` moves one by one for the canonical CSR ``rows``
    (0 when it draws row by row): what its memory grows with."""
    tokens = int(rows.sum())
    seen = int(np.count_nonzero(np.asarray(rows.sum(axis=0)).ravel()))
    return 0 if _draws_by_row(rows.shape[0], seen, tokens) else tokens


def _shuffled_by_row(occ: np.ndarray, cols: np.ndarray, pooled: np.ndarray, vocab: int,
                     rng: np.random.Generator) -> sp.csr_array:
    """Rows drawn one after another without replacement from the pool ``pooled`` (counts of
    the tokens ``cols``): the by-row sampler of :func:`shuffled_rows`."""
    left = pooled.copy()
    indptr, indices, data = [0], [], []
    for n_i in occ.tolist():
        draw = rng.multivariate_hypergeometric(left, n_i, method="marginals") if n_i else np.zeros_like(left)
        left -= draw
        nz = np.flatnonzero(draw)
        indices.append(cols[nz])
        data.append(draw[nz])
        indptr.append(indptr[-1] + nz.size)
    out = sp.csr_array((np.concatenate(data).astype(np.int64), np.concatenate(indices), np.asarray(indptr)),
                       shape=(occ.size, vocab))
    return out


_CHUNK_TOKENS = 1 << 24  # tokens split among rows at a time by the chunked sampler (128 MiB of int64 labels)
_CHUNK_CELLS = 1 << 25  # (rows x tokens seen) cells counted at a time by it (256 MiB of int64)


def _shuffled_in_chunks(occ: np.ndarray, cols: np.ndarray, pooled: np.ndarray, vocab: int,
                        rng: np.random.Generator) -> sp.csr_array:
    """(r, V) rows of occupancies ``occ`` (r,) drawn one chunk of consecutive rows after
    another without replacement from the pool ``pooled`` (counts of the tokens ``cols``):
    the law of :func:`_shuffled_by_row`, at a cost of ``O(V')`` a chunk plus ``O(tokens)``
    instead of ``O(V')`` a row.

    A chunk of rows takes the multivariate hypergeometric draw of its total from what the
    chunks before it left (the union of its rows' tokens is a uniformly random subset of the
    remaining pool, as in a shuffle of every token), and that union is split among its rows
    by token (a uniformly random arrangement, :func:`shuffled_rows`' by-token sampler). A
    chunk holds at most :data:`_CHUNK_TOKENS` tokens and :data:`_CHUNK_CELLS` (row, token)
    cells, so memory stays bounded however many tokens the rows hold; a row above that is a
    chunk alone, its draw its counts. Used where a few rows of a large corpus are drawn
    (:func:`null_distance_sums`: 1,024 rows of 1.9e8 tokens took 12.6 s a replicate by row,
    2.2 s in three chunks)."""
    left = pooled.copy()
    remaining = int(left.sum())  # the pool's tokens not drawn yet (the rows may be a few of many)
    indptr, indices, data = [np.zeros(1, dtype=np.int64)], [], []
    rows_per_chunk = max(1, _CHUNK_CELLS // max(int(cols.size), 1))
    start = 0
    while start < occ.size:
        stop, tokens = start + 1, int(occ[start])
        while stop < occ.size and stop - start < rows_per_chunk and tokens + int(occ[stop]) <= _CHUNK_TOKENS:
            tokens += int(occ[stop])
            stop += 1
        if tokens == remaining:
            union = left.copy()  # rows that take every token left take them all
        else:
            union = rng.multivariate_hypergeometric(left, tokens, method="marginals") if tokens else np.zeros_like(left)
        left -= union
        remaining -= tokens
        seen = np.flatnonzero(union)
        if stop - start == 1:
            counts, row = union[seen], np.zeros(seen.size, dtype=np.int64)
            token = np.arange(seen.size)
        else:  # the union's tokens in id order, each given the row at its place of shuffled row labels
            labels = np.repeat(np.arange(stop - start, dtype=np.int64), occ[start:stop])
            rng.shuffle(labels)
            cell = labels * seen.size + np.repeat(np.arange(seen.size, dtype=np.int64), union[seen])
            flat = np.bincount(cell, minlength=(stop - start) * seen.size)
            nz = np.flatnonzero(flat)
            counts = flat[nz]
            row, token = np.divmod(nz, seen.size)
        indices.append(cols[seen[token]])
        data.append(counts.astype(np.int64))
        indptr.append(indptr[-1][-1] + np.cumsum(np.bincount(row, minlength=stop - start)))
        start = stop
    return sp.csr_array((np.concatenate(data) if data else np.zeros(0, dtype=np.int64),
                         np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64),
                         np.concatenate(indptr)), shape=(occ.size, vocab))


def homogeneity_statistic(rows: Any, /) -> float:
    """``S = sum_i N_i d_H^2(mu_hat_i, p_hat)`` for (m, V) counts with occupancies ``N_i``
    and pooled distribution ``p_hat = sum_i C_i / sum_i N_i`` (module docstring); rows
    must be occupied."""
    c = _csr(rows) if sp.issparse(rows) else np.asarray(rows, dtype=np.float64)
    occ = np.asarray(c.sum(axis=1), dtype=np.float64).ravel()
    return float(occ @ distance_to_pool(c))


def distance_sum(d2: Any, bias: Any = None, /) -> float:
    """``sum_{i<j} sqrt(max(D_ij - b_i - b_j, 0))`` of an (m, m) squared-distance matrix
    ``D`` (``b = 0`` when ``bias`` is None): the summed distances the stress is computed
    from. Row blocks of about 4 M entries, so no (m, m) temporary."""
    d = np.asarray(d2, dtype=np.float64)
    m = d.shape[0]
    b = np.zeros(m) if bias is None else np.nan_to_num(np.asarray(bias, dtype=np.float64), nan=0.0)
    step = max(1, (1 << 22) // max(m, 1))
    total = 0.0
    for lo in range(0, m, step):
        hi = min(m, lo + step)
        block = d[lo:hi] - b[lo:hi, None] - b[None, :]
        np.maximum(block, 0.0, out=block)
        np.sqrt(block, out=block)
        # upper triangle only: columns j > i of row i
        block[np.arange(hi - lo)[:, None] >= (np.arange(m)[None, :] - lo)] = 0.0
        total += float(block.sum())
    return total


def null_distance_sums(
    rows: Any,
    /,
    *,
    replicates: int,
    corrected: bool,
    seed: int = 0,
    max_rows: int | None = None,
    progress: Callable[[int], None] | None = None,
    shrinkage: Any = None,
) -> np.ndarray:
    """(R,) :func:`distance_sum` over all ``m (m - 1) / 2`` pairs of R shuffled corpora of
    the (m, V) counts ``rows`` (:func:`shuffled_rows`; replicate r draws from
    ``numpy.random.default_rng([seed, r, 1])``), for a null whose own corpora cannot give
    them: the rotation null's keep the structure they move (a planted position spread
    over K places), so their distances hold more than sampling noise (module docstring,
    docs/calibration.md).

    Above ``max_rows`` rows a replicate takes the distances among ``max_rows`` rows of
    its shuffled corpus drawn uniformly without replacement, and scales their sum by
    ``m (m - 1) / (r (r - 1))``: every pair is equally likely to be among them, so the
    estimate is unbiased, at ``(r / m)^2`` of the cost of all pairs. Those rows are drawn
    alone, a chunk of them after another from what the chunks before left of the pool
    (:func:`_shuffled_in_chunks`: the law they have in a shuffle of every row), so a
    replicate never forms the whole shuffled corpus (at 2e8 tokens that took 5 GB).
    With ``corrected`` the distances go through the data's estimator (:func:`null_geometry`;
    ``shrinkage`` as there). ``progress(1)`` after each replicate."""
    c = _integer_csr(rows)
    m, vocab = c.shape
    r = m if max_rows is None else max(2, min(m, int(max_rows)))
    occ = np.asarray(c.sum(axis=1)).ravel().astype(np.int64)
    pooled = np.asarray(c.sum(axis=0)).ravel().astype(np.int64)
    cols = np.flatnonzero(pooled)
    if corrected and shrinkage is None:  # the whole corpus' (a subset's own pool would differ)
        shrinkage = OccupancyShrinkage.of(c)

    def replicate(k: int, _: Any) -> float:
        rng = np.random.default_rng([seed, k, 1])
        if r < m:
            keep = np.sort(rng.choice(m, r, replace=False))
            shuffled = _shuffled_in_chunks(occ[keep], cols, pooled[cols], vocab, rng)
        else:
            shuffled = shuffled_rows(c, rng)
        d2 = _squared(shuffled, corrected=corrected, shrinkage=shrinkage)
        return distance_sum(d2, position_sampling_variance(shuffled) if corrected else None) * (m * (m - 1)) / (r * (r - 1))

    out = np.empty(int(replicates))
    stored = c.nnz if r == m else -(-c.nnz * r // m)  # a subset of r rows holds about r / m of them
    in_flight = replicates_in_flight(replicate_bytes(r, stored, shuffled_tokens=_tokens_shuffled(c) if r == m else 0),
                                     replicates=out.size)
    for k, total in in_replicate_order(replicate, out.size, in_flight=in_flight):
        out[k] = total
        if progress is not None:
            progress(1)
    return out


def null_geometry(rows: Any, /, *, corrected: bool, shrinkage: Any = None, weights: Any = None) -> tuple[float, float]:
    """``(top eigenvalue, distance sum)`` of one corpus: :func:`top_eigenvalue` and
    :func:`distance_sum` from one computation of its squared Hellinger distances, through
    the data's estimator: corrected by the corpus' own ``b`` and, with ``corrected``, the
    square roots' occupancy shrinkage removed (:mod:`posstats.estimates.occupancy`;
    ``shrinkage``: the data's, which null corpora of the same occupancies and pooled counts
    share; default: the corpus' own). With ``weights`` (m,) ``w``, the top eigenvalue is
    that of ``W^1/2 B W^1/2`` (module docstring, "Occupancy weighting"); the sum is not
    weighted."""
    d2, b = _estimated(rows, corrected=corrected, shrinkage=shrinkage)
    total = distance_sum(d2, b)
    return _top_of_gram(_weighted_in_place(gram_in_place(d2, b), weights)), total


WEIGHTING_FORMULA = ("W^1/2 B_w W^1/2, W = diag(N_i / mean N), B_w = H_w B H_w^T, "
                     "H_w = I - 1 w^T / sum(w)")  # the report's null.weighting_formula


def occupancy_weights(occupancy: Any, /) -> np.ndarray | None:
    """(m,) ``w_i = N_i / mean(N)``: the rank test's whitening weights (module docstring,
    "Occupancy weighting"); None when every occupancy is equal (then ``W = I``).

    >>> occupancy_weights([100, 300])
    array([0.5, 1.5])
    >>> occupancy_weights([7, 7]) is None
    True
    """
    occ = np.asarray(occupancy, dtype=np.float64).ravel()
    if not occ.size or occ.min() == occ.max():
        return None
    if not occ.min() > 0:
        msg = "occupancy weights need every occupancy above 0"
        raise ValueError(msg)
    return occ / occ.mean()


def _weighted_in_place(b: np.ndarray, weights: Any) -> np.ndarray:
    """``b <- W^1/2 H_w b H_w^T W^1/2`` (``W = diag(weights)``, ``H_w`` the centring on the
    weighted mean: :func:`posstats.geometry.mds.centre_on_weights_in_place`) in place and
    returned, for a Gram matrix ``b`` centred on the plain mean; ``b`` unchanged when
    ``weights`` is None (module docstring, "Occupancy weighting")."""
    if weights is not None:
        centre_on_weights_in_place(b, weights)
        root = np.sqrt(np.asarray(weights, dtype=np.float64))
        b *= root[:, None]
        b *= root[None, :]
    return b


def gram_top_eigenvalues(d2: np.ndarray, b: Any, /, *, k: int, weights: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """``(eigenvalues, vectors)``: the (min(k, m),) top eigenvalues, descending, of the
    (m, m) squared distances ``d2``'s Gram matrix ``B = -1/2 H D H`` (``- H diag(b) H`` with
    ``b``), whitened by ``weights`` (``W^1/2 B W^1/2``; module docstring, "Occupancy
    weighting"): the matrix the rank test reads; and their (m, min(k, m)) unit eigenvectors
    (the first: where the top component loads). ``d2`` is overwritten (:func:`weighted_gram`, then
    :func:`top_eigenpairs`)."""
    return top_eigenpairs(weighted_gram(d2, b, weights), k=k)


def weighted_gram(d2: np.ndarray, b: Any, weights: Any, /) -> np.ndarray:
    """``W^1/2 (-1/2 H D H - H diag(b) H) W^1/2`` of the (m, m) squared distances ``d2``,
    computed in place (``b`` None: no correction; ``weights`` None: ``W = I``)."""
    return _weighted_in_place(gram_in_place(d2, b), weights)


def top_eigenpairs(gram: np.ndarray, /, *, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(eigenvalues, vectors)``: the (min(k, m),) top eigenvalues, descending, of the
    symmetric (m, m) ``gram`` (not modified) and their (m, min(k, m)) unit eigenvectors, in
    the same order. A dense subset solve up to 4,096 rows, else ARPACK (relative tolerance
    1e-10)."""
    m = gram.shape[0]
    k = max(1, min(int(k), m))
    if m > _SUBSET_EIGEN_LIMIT and k < m - 1:  # a dense subset solve is O(m^3) whatever k
        v0 = np.random.default_rng(0).standard_normal(m)
        lam, vectors = spla.eigsh(gram, k=k, which="LA", tol=1e-10, v0=v0)
        order = np.argsort(lam)[::-1]
        return lam[order].copy(), np.ascontiguousarray(vectors[:, order])
    lam, vectors = scipy.linalg.eigh(gram, subset_by_index=[m - k, m - 1], driver="evr")
    return lam[::-1].copy(), np.ascontiguousarray(vectors[:, ::-1])


def rank_test_eigenvalues(rows: Any, /, *, corrected: bool, k: int, shrinkage: Any = None,
                          weights: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`gram_top_eigenvalues` of the (m, V) counts ``rows`` through
    :func:`null_geometry`'s estimator (the data's side of the rank test, where its MDS
    eigenvalues are not what the test reads)."""
    d2, b = _estimated(rows, corrected=corrected, shrinkage=shrinkage)
    return gram_top_eigenvalues(d2, b, k=k, weights=weights)


def _top_of_gram(b: np.ndarray) -> float:
    """Largest eigenvalue of a symmetric (m, m) matrix: a dense subset solve up to 512 rows,
    else ARPACK (k = 1, relative tolerance 1e-8, a fixed start vector)."""
    m = b.shape[0]
    if m <= _DENSE_EIGEN_LIMIT:
        return float(scipy.linalg.eigh(b, eigvals_only=True, subset_by_index=[m - 1, m - 1], driver="evr")[0])
    v0 = np.random.default_rng(0).standard_normal(m)
    return float(spla.eigsh(b, k=1, which="LA", tol=1e-8, v0=v0, return_eigenvectors=False)[0])


def top_eigenvalue(rows: Any, /, *, corrected: bool) -> float:
    """Largest eigenvalue of the classical-MDS Gram matrix of the rows' squared Hellinger
    distances ``D``: ``B = -1/2 H D H``, or with ``corrected`` ``B - H diag(b) H`` with
    ``b`` the rows' unbiased sampling variances
    (:func:`posstats.estimates.sampling_variance.position_sampling_variance`), the matrix
    :func:`posstats.geometry.mds.classical_mds` decomposes with ``diagonal=b``.

    Dense subset solve up to 512 rows, else ARPACK (``eigsh``, k = 1, relative tolerance
    1e-8) on the dense (m, m) matrix.
    """
    return _top_of_gram(gram_in_place(_squared(rows, corrected=corrected),
                                      position_sampling_variance(rows) if corrected else None))


def _estimated(rows: Any, /, *, corrected: bool, shrinkage: Any = None) -> tuple[np.ndarray, np.ndarray | None]:
    """``(d2, b)``: the rows' squared distances (:func:`_squared`) and, with ``corrected``,
    their unbiased sampling variances (else None): the data's estimator, which every null
    corpus goes through too."""
    return (_squared(rows, corrected=corrected, shrinkage=shrinkage),
            position_sampling_variance(rows) if corrected else None)


def _squared(rows: Any, /, *, corrected: bool, shrinkage: Any = None) -> np.ndarray:
    """(m, m) squared Hellinger distances of ``rows``: plug-in, or with ``corrected`` the
    square roots' occupancy shrinkage removed (:func:`posstats.estimates.occupancy.adjusted`;
    the bias ``b`` is subtracted by the caller)."""
    d2 = hellinger_sq(rows)
    return adjusted(d2, rows, shrinkage=shrinkage) if corrected else d2


def monte_carlo_p_value(observed: float, null: Any, /) -> float:
    """``(1 + #{null >= observed}) / (R + 1)`` for R null values (module docstring)."""
    null = np.asarray(null, dtype=np.float64).ravel()
    return float((1 + np.count_nonzero(null >= observed)) / (null.size + 1))


@dataclass(frozen=True)
class PermutationNull:
    """R shuffled corpora and the statistics the tests compare with the data's.

    Attributes:
        replicates: R.
        homogeneity: the data's ``S`` (:func:`homogeneity_statistic`).
        null_homogeneity: (R,) ``S`` of the shuffled corpora.
        null_top_eigenvalues: (R',) :func:`top_eigenvalue` of the first R' <= R shuffled corpora.
        corrected: whether the eigenvalues are on the bias-corrected scale.
        null_distance_sums: (R',) :func:`distance_sum` of the same R' corpora (on the same
            scale); empty when not computed.
        eigen_planned: the R' corpora the rank test was drawn for when it stopped before
            solving them all (module docstring, "Stopping once decided"); None when every
            one was solved.
    """

    replicates: int
    homogeneity: float
    null_homogeneity: np.ndarray
    null_top_eigenvalues: np.ndarray
    corrected: bool
    null_distance_sums: np.ndarray = field(default_factory=lambda: np.zeros(0))
    eigen_planned: int | None = None

    @property
    def eigen_replicates(self) -> int:
        """R': the null corpora the rank test is at level ``1 / (R' + 1)`` against (solved or
        not: a stopped test decides as the full one would)."""
        return int(self.null_top_eigenvalues.size if self.eigen_planned is None else self.eigen_planned)

    def distance_noise_share(self, data_distance_sum: float, /) -> float | None:
        """Mean null :func:`distance_sum` / the data's (module docstring); None without
        null sums or with a data sum of 0."""
        if not self.null_distance_sums.size or not data_distance_sum > 0:
            return None
        return float(np.mean(self.null_distance_sums) / data_distance_sum)

    @property
    def homogeneity_p_value(self) -> float:
        """Monte Carlo p-value of the homogeneity test."""
        return monte_carlo_p_value(self.homogeneity, self.null_homogeneity)

    @property
    def eigenvalue_threshold(self) -> float:
        """The largest top eigenvalue of the solved null corpora (of all R' unless the test
        stopped once decided: then a lower bound of theirs)."""
        return float(np.max(self.null_top_eigenvalues))

    def level(self) -> float:
        """The homogeneity test's level (it rejects when the data exceeds all R null values): 1 / (R + 1)."""
        return 1.0 / (self.replicates + 1)

    def eigenvalue_level(self) -> float:
        """The rank test's level for its first eigenvalue: 1 / (R' + 1)."""
        return 1.0 / (self.eigen_replicates + 1)


def rank_test_open(solved_tops: np.ndarray, stop_at: float | None, /) -> bool:
    """Whether the rank test still needs a null corpus solved: no ``stop_at`` (the data's
    largest tested eigenvalue), none solved yet, or the last one solved (``solved_tops[-1]``;
    the ones before it were all below) still below it (module docstring, "Stopping once
    decided").

    >>> rank_test_open(np.array([0.1, 0.3]), 0.25), rank_test_open(np.array([0.1]), 0.25)
    (False, True)
    """
    return stop_at is None or solved_tops.size == 0 or bool(solved_tops[-1] < stop_at)


def checked_replicates(replicates: int, eigen_replicates: int | None = None, /, *, null: str) -> int:
    """The number of replicates that also give eigenvalues (``eigen_replicates``, default
    all ``replicates``), after checking ``1 <= eigen_replicates <= replicates`` (a one-line
    ValueError naming the ``null``, e.g. ``"permutation"``, otherwise)."""
    if replicates < 1:
        msg = f"a {null} null needs at least 1 replicate, got {replicates}"
        raise ValueError(msg)
    eigen = replicates if eigen_replicates is None else int(eigen_replicates)
    if not 1 <= eigen <= replicates:
        msg = f"eigen_replicates must be in 1..{replicates}, got {eigen_replicates}"
        raise ValueError(msg)
    return eigen


def permutation_null(
    rows: Any,
    /,
    *,
    replicates: int = 39,
    eigen_replicates: int | None = None,
    corrected: bool = False,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    shrinkage: Any = None,
    weights: Any = None,
    stop_at: float | None = None,
) -> PermutationNull:
    """Draw ``replicates`` shuffled corpora of the (m, V) counts ``rows`` (every row
    occupied) and compute each one's homogeneity statistic and, for the first
    ``eigen_replicates`` of them (default all; the costly part for many rows), its top
    eigenvalue and distance sum (module docstring; ``shrinkage`` and ``weights`` as
    :func:`null_geometry`). ``stop_at``: the data's largest tested eigenvalue; once a
    shuffled corpus' top eigenvalue reaches it, no further one is solved (module docstring,
    "Stopping once decided"; ``eigen_planned`` is then set, and the distance sums are those
    of the solved corpora only).
    Replicate r uses ``numpy.random.default_rng([seed, r])``; ``progress(1)`` is called after each."""
    eigen = checked_replicates(replicates, eigen_replicates, null="permutation")
    c = _integer_csr(rows)
    s_null, top_null, sums_null = np.empty(replicates), np.empty(eigen), np.empty(eigen)
    solved = 0

    def open_at(r: int) -> bool:
        """Replicate r is solved in a loop: the rank test is not decided by those before it."""
        return r < eigen and rank_test_open(top_null[:solved], stop_at)

    def replicate(r: int, solve: bool) -> tuple[float, tuple[float, float] | None]:
        shuffled = shuffled_rows(c, np.random.default_rng([seed, r]))
        geometry = null_geometry(shuffled, corrected=corrected, shrinkage=shrinkage, weights=weights) if solve else None
        return homogeneity_statistic(shuffled), geometry

    # a few replicates at once (posstats.estimates.replicates); the results are the loop's
    in_flight = replicates_in_flight(replicate_bytes(c.shape[0], c.nnz, shuffled_tokens=_tokens_shuffled(c)),
                                     replicates=replicates)
    # no solve in vain at the most likely stop, the first null corpus
    order = first_solve_alone(eigen, replicates, in_flight=in_flight) if stop_at is not None else None
    for r, (statistic, geometry) in in_replicate_order(replicate, replicates, in_flight=in_flight, plan=open_at,
                                                           order=order):
        s_null[r] = statistic
        if geometry is not None and open_at(r):  # one started before the test was decided: not counted
            top_null[r], sums_null[r] = geometry
            solved += 1
        if progress is not None:
            progress(1)
    return PermutationNull(int(replicates), homogeneity_statistic(c), s_null, top_null[:solved], bool(corrected),
                           sums_null[:solved], eigen_planned=eigen if solved < eigen else None)

