"""Diagnostics beyond stress (THEORY.md section 6).

- :func:`min_separation`: ``min_{i != j} |p_i - p_j|`` and the pair attaining it.
- :func:`monotonicity_violation_rate`: over ordered triples of distinct rows (i, j, k)
  with ``|pos_i - pos_j| < |pos_i - pos_k|``, the fraction with ``dist[i, j] > dist[i, k]``
  (strict; ties are not violations). Exact in O(n^2 log n) by counting inversions per
  anchor, or estimated from uniformly sampled triples with a 95 % Wilson interval.
- :func:`corpus_diagnostics`: non-stationarity (H1, ``min_{i != j} d_H > 0``) and the
  corpus' own monotonicity (A3) from a ``d_H`` matrix.

Monotonicity and the corpus checks run on the host (numpy); cupy inputs are copied over
one row block at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from posstats.geometry.backend import array_namespace, to_numpy
from posstats.geometry.stress import _centred_float64, _distance_block, _rows_per_block

__all__ = [
    "CorpusDiagnostics",
    "Monotonicity",
    "Separation",
    "corpus_diagnostics",
    "min_separation",
    "monotonicity_of_encoding",
    "monotonicity_violation_rate",
]

_Z95 = 1.959963984540054  # two-sided 95 % standard-normal quantile
# Anchor rows per exact-monotonicity block: about 2**21 entries per temporary.
_ANCHOR_BLOCK_ENTRIES = 1 << 21
# Sampled triples whose encoding distances are formed at a time (each row of d floats).
_SAMPLE_CHUNK = 1 << 16


@dataclass(frozen=True)
class Separation:
    """Smallest distance between two distinct rows, and the pair (i < j) attaining it.

    Ties are broken by the smallest ``i``, then the smallest ``j``.
    """

    value: float
    pair: tuple[int, int]

    def to_dict(self) -> dict[str, Any]:
        return {"value": float(self.value), "pair": [int(self.pair[0]), int(self.pair[1])]}


@dataclass(frozen=True)
class Monotonicity:
    """Monotonicity violation rate and how it was obtained.

    Attributes:
        rate: violations / triples; ``nan`` when there are no triples (n < 3).
        method: ``"exact"`` (all triples counted) or ``"sampled"``.
        triples: number of triples considered: all of them (exact) or the sample size.
        ci_low, ci_high: 95 % Wilson score interval for sampled rates; equal to ``rate``
            for exact ones.
        violations: number of violating triples among those considered.
    """

    rate: float
    method: str
    triples: int
    ci_low: float
    ci_high: float
    violations: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate": float(self.rate),
            "method": self.method,
            "triples": int(self.triples),
            "ci_low": float(self.ci_low),
            "ci_high": float(self.ci_high),
            "violations": int(self.violations),
        }


@dataclass(frozen=True)
class CorpusDiagnostics:
    """Hypotheses H1 and A3 of the seed paper, checked on the corpus' ``d_H``.

    Attributes:
        min_distance: ``min_{i != j} d_H(i, j)`` (H1).
        pair: the pair (i < j, row indices) attaining it.
        nonstationary: ``min_distance > 0``: no two positions share a distribution.
        monotonicity: the violation rate with ``d_H`` as the distance (A3).
    """

    min_distance: float
    pair: tuple[int, int]
    nonstationary: bool
    monotonicity: Monotonicity

    def to_dict(self) -> dict[str, Any]:
        return {
            "min_distance": float(self.min_distance),
            "pair": [int(self.pair[0]), int(self.pair[1])],
            "nonstationary": bool(self.nonstationary),
            "monotonicity": self.monotonicity.to_dict(),
        }


# ---------------------------------------------------------------------------------------
# Minimum separation


def min_separation(encoding: Any, /, *, block: int = 2048, xp: Any = None) -> Separation:
    """Minimum Euclidean distance between distinct rows of ``encoding`` (n x d), n >= 2.

    Candidates are found blockwise with the float64 Gram form, whose error on a squared
    distance is at most ``tol = 4 (d + 4) eps max|p|^2`` (rows mean-centred first); every pair
    whose Gram value is within ``2 tol`` of the running minimum is then recomputed by the
    difference form ``sqrt(sum (p_i - p_j)^2)``, so the reported value is the exact
    (difference-form) minimum even for near-identical rows, where the Gram form alone
    would cancel to noise. Duplicate rows give exactly 0.

    >>> min_separation(np.array([[0.0, 0.0], [3.0, 4.0], [3.0, 4.5]]))
    Separation(value=0.5, pair=(1, 2))
    """
    xp = array_namespace(encoding) if xp is None else xp
    p, sq = _centred_float64(encoding, xp)
    n, d = p.shape
    if n < 2:
        msg = f"min_separation needs at least 2 rows; got {n}"
        raise ValueError(msg)
    max_sq = float(xp.max(sq)) if n else 0.0
    if not math.isfinite(max_sq):
        msg = "min_separation: the encoding contains non-finite values"
        raise ValueError(msg)
    tol = 4.0 * (d + 4) * np.finfo(np.float64).eps * max_sq
    rows = _rows_per_block(block, n)
    best_gram = math.inf
    best_sq = math.inf
    best_pair = (0, 1)
    for lo in range(0, n, rows):
        hi = min(n, lo + rows)
        g = p[lo:hi] @ p[lo:].T
        e2 = sq[lo:hi, None] + sq[None, lo:] - 2.0 * g
        # Only pairs i < j: row lo + a, column lo + b with b > a.
        e2 = xp.where(xp.triu(xp.ones(e2.shape, dtype=bool), k=1), e2, xp.inf)
        block_min = float(xp.min(e2))
        best_gram = min(best_gram, block_min)
        cand = to_numpy(xp.argwhere(e2 <= best_gram + 2.0 * tol))
        if cand.size == 0:
            continue
        ii = cand[:, 0] + lo
        jj = cand[:, 1] + lo
        # argwhere is row-major, so a strict '<' keeps the lexicographically first pair.
        for c0 in range(0, ii.size, _SAMPLE_CHUNK):
            ci = ii[c0 : c0 + _SAMPLE_CHUNK]
            cj = jj[c0 : c0 + _SAMPLE_CHUNK]
            diff = p[xp.asarray(ci)] - p[xp.asarray(cj)]
            exact = to_numpy(xp.sum(diff * diff, axis=1))
            k = int(np.argmin(exact))
            if exact[k] < best_sq:
                best_sq = float(exact[k])
                best_pair = (int(ci[k]), int(cj[k]))
            if best_sq == 0.0:
                break
        if best_sq == 0.0:
            break
    return Separation(value=math.sqrt(best_sq), pair=best_pair)


def _min_offdiagonal(distances: Any, /, *, block: int = 2048) -> tuple[float, tuple[int, int]]:
    """Smallest entry above the diagonal of an (n x n) matrix, and its (i < j) pair."""
    n = distances.shape[0]
    rows = _rows_per_block(block, n)
    best = math.inf
    pair = (0, 1)
    for lo in range(0, n - 1, rows):
        hi = min(n - 1, lo + rows)
        blk = np.array(to_numpy(distances[lo:hi, lo:]), dtype=np.float64)
        blk[~np.triu(np.ones(blk.shape, dtype=bool), k=1)] = np.inf
        k = int(np.argmin(blk))
        a, b = divmod(k, blk.shape[1])
        if blk[a, b] < best:
            best = float(blk[a, b])
            pair = (lo + a, lo + b)
    return best, pair


# ---------------------------------------------------------------------------------------
# Monotonicity


def _as_positions(positions: Any, n: int) -> np.ndarray:
    if positions is None:
        return np.arange(n, dtype=np.int64)
    pos = np.asarray(positions)
    if pos.ndim != 1 or pos.shape[0] != n:
        msg = f"positions must be 1-D with one entry per row ({n}); got shape {pos.shape}"
        raise ValueError(msg)
    if pos.size and not np.issubdtype(pos.dtype, np.integer):
        msg = f"positions must be integers (0-based sequence indices); got dtype {pos.dtype}"
        raise ValueError(msg)
    pos = pos.astype(np.int64)
    if np.unique(pos).size != n:
        msg = "positions must be distinct (one row per sequence position)"
        raise ValueError(msg)
    return pos


def _block_inversions(vals: np.ndarray, nbits: int) -> int:
    """Total strict inversions over the rows of ``vals`` (B x m), ints in [0, 2**nbits).

    An inversion of a row v is a pair a < b with v[a] > v[b]. Bottom-up merge sort, all rows
    at once: blocks of 16 are counted by brute force; then, merging sorted runs L and R of
    length s, the keys ``2 v`` (L) and ``2 v + 1`` (R) put each element of L that is <= an
    element b of R before b, so with pos_b = b's place in the merged order,
    ``#{a in L: v_a > v_b} = s - (pos_b - rank of b within R)`` and the cross count of the
    merge is ``s^2 + s (s - 1) / 2 - sum_b pos_b``. Rows are padded with the largest value
    (which adds no inversion) to a power of two.
    """
    rows, m = vals.shape
    if m < 2 or rows == 0:
        return 0
    width = 1 << int(m - 1).bit_length()
    dtype = np.int16 if nbits + 1 <= 15 else (np.int32 if nbits + 1 <= 31 else np.int64)
    x = np.full((rows, width), (1 << nbits) - 1, dtype=dtype)
    x[:, :m] = vals
    k = min(16, width)
    blocks = x.reshape(-1, k)
    upper = np.triu(np.ones((k, k), dtype=bool), k=1)
    total = 0
    step = max(1, (1 << 22) // (k * k))
    for a in range(0, blocks.shape[0], step):
        b = blocks[a : a + step]
        total += int(np.count_nonzero((b[:, :, None] > b[:, None, :]) & upper))
    x = np.sort(blocks, axis=1).reshape(rows, width)
    s = k
    while s < width:
        pairs = x.reshape(-1, 2, s)
        pairs <<= 1
        pairs[:, 1, :] |= 1
        merged = pairs.reshape(-1, 2 * s)
        # numpy's SIMD quicksort wins on short rows; on long rows made of two sorted runs
        # timsort (the stable kind) merges them in linear time.
        z = np.sort(merged, axis=1, kind="quicksort" if 2 * s <= 1024 else "stable")
        right = np.bitwise_and(z, 1).sum(axis=0, dtype=np.int64)
        sum_pos = int(np.dot(right, np.arange(2 * s, dtype=np.int64)))
        total += merged.shape[0] * (s * s + s * (s - 1) // 2) - sum_pos
        np.right_shift(z, 1, out=z)
        x = z
        s *= 2
    return total


def _min_ranks(rows: np.ndarray) -> np.ndarray:
    """Per row, the rank of each entry in ascending order, equal entries sharing the lowest rank."""
    b, n = rows.shape
    order = np.argsort(rows, axis=1)
    srt = np.take_along_axis(rows, order, axis=1)
    start = np.empty((b, n), dtype=bool)
    start[:, :1] = True
    np.not_equal(srt[:, 1:], srt[:, :-1], out=start[:, 1:])
    ranks_sorted = np.where(start, np.arange(n, dtype=np.int32), np.int32(0))
    np.maximum.accumulate(ranks_sorted, axis=1, out=ranks_sorted)
    ranks = np.empty((b, n), dtype=np.int32)
    np.put_along_axis(ranks, order, ranks_sorted, axis=1)
    return ranks


def _exact_counts(rows_of: Callable[[int, int], np.ndarray], pos: np.ndarray) -> tuple[int, int]:
    """(violations, triples) over all anchors; ``rows_of(lo, hi)`` gives distance rows lo:hi."""
    n = pos.shape[0]
    if n < 3:
        return 0, 0
    nbits = max(1, int(n - 1).bit_length())
    rows = max(1, _ANCHOR_BLOCK_ENTRIES // n)
    violations = 0
    triples = 0
    m = n - 1
    for lo in range(0, n, rows):
        hi = min(n, lo + rows)
        dist = np.asarray(rows_of(lo, hi), dtype=np.float64)
        if not np.all(np.isfinite(dist)):
            msg = f"distances rows {lo}..{hi - 1} contain non-finite values"
            raise ValueError(msg)
        ranks = _min_ranks(dist)
        seq = np.abs(pos[None, :] - pos[lo:hi, None])
        # The anchor is the only entry at sequence distance 0, so it sorts first (dropped).
        order = np.argsort(seq, axis=1, kind="stable")
        seq_sorted = np.take_along_axis(seq, order, axis=1)[:, 1:]
        r = np.take_along_axis(ranks, order, axis=1)[:, 1:]
        # With distinct positions, at most two rows share a sequence distance from the anchor
        # (one each side). Such a pair is not a triple: order it by ascending distance so
        # that it can never count as an inversion.
        tie = seq_sorted[:, 1:] == seq_sorted[:, :-1]
        first, second = r[:, :-1], r[:, 1:]
        low = np.minimum(first, second)
        high = np.maximum(first, second)
        np.copyto(first, low, where=tie)
        np.copyto(second, high, where=tie)
        violations += _block_inversions(r, nbits)
        triples += (hi - lo) * (m * (m - 1) // 2) - int(np.count_nonzero(tie))
    return violations, triples


def _wilson(k: int, t: int, z: float = _Z95) -> tuple[float, float]:
    if t == 0:
        return math.nan, math.nan
    phat = k / t
    denom = 1.0 + z * z / t
    centre = (phat + z * z / (2 * t)) / denom
    half = z * math.sqrt(phat * (1.0 - phat) / t + z * z / (4 * t * t)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _sample_triples(pos: np.ndarray, samples: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``samples`` triples drawn uniformly from all (i, j, k) with |pos_i - pos_j| < |pos_i - pos_k|.

    Distinct ordered triples are drawn uniformly and those with equal sequence distances
    rejected; ordering the rest so that j is the nearer gives each valid triple exactly two
    preimages, hence a uniform draw.
    """
    n = pos.shape[0]
    rng = np.random.default_rng(seed)
    out_i, out_j, out_k = [], [], []
    have = 0
    while have < samples:
        want = samples - have
        draw = want + want // 8 + 64
        i = rng.integers(0, n, draw)
        j = rng.integers(0, n, draw)
        k = rng.integers(0, n, draw)
        sj = np.abs(pos[i] - pos[j])
        sk = np.abs(pos[i] - pos[k])
        ok = (i != j) & (i != k) & (j != k) & (sj != sk)
        i, j, k, sj, sk = i[ok], j[ok], k[ok], sj[ok], sk[ok]
        swap = sj > sk
        j, k = np.where(swap, k, j), np.where(swap, j, k)
        take = min(want, i.size)
        out_i.append(i[:take])
        out_j.append(j[:take])
        out_k.append(k[:take])
        have += take
    return np.concatenate(out_i), np.concatenate(out_j), np.concatenate(out_k)


def _monotonicity(
    n: int,
    pos: np.ndarray,
    rows_of: Callable[[int, int], np.ndarray],
    pair_dist: Callable[[np.ndarray, np.ndarray], np.ndarray],
    *,
    exact_limit: int,
    samples: int,
    seed: int,
) -> Monotonicity:
    if n <= exact_limit or n < 3:
        violations, triples = _exact_counts(rows_of, pos)
        rate = violations / triples if triples else math.nan
        return Monotonicity(rate, "exact", triples, rate, rate, violations)
    if samples < 1:
        msg = f"samples must be positive, got {samples}"
        raise ValueError(msg)
    i, j, k = _sample_triples(pos, samples, seed)
    violations = 0
    for c in range(0, samples, _SAMPLE_CHUNK):
        sl = slice(c, c + _SAMPLE_CHUNK)
        dij = pair_dist(i[sl], j[sl])
        dik = pair_dist(i[sl], k[sl])
        if not (np.all(np.isfinite(dij)) and np.all(np.isfinite(dik))):
            msg = "distances contain non-finite values"
            raise ValueError(msg)
        violations += int(np.count_nonzero(dij > dik))
    lo, hi = _wilson(violations, samples)
    return Monotonicity(violations / samples, "sampled", samples, lo, hi, violations)


def monotonicity_violation_rate(
    distances: Any,
    /,
    *,
    positions: Any = None,
    exact_limit: int = 8192,
    samples: int = 2_000_000,
    seed: int = 0,
) -> Monotonicity:
    """Fraction of triples where the sequence-nearer row is strictly farther.

    Args:
        distances: (n x n) matrix of any distance (encoding distances or ``d_H``); row i
            is read as the distances from anchor i (symmetry is not assumed).
        positions: original 0-based sequence indices of the rows (distinct integers);
            default ``arange(n)``. Sequence distance is ``|pos_i - pos_j|``.
        exact_limit: largest n counted exactly; above it triples are sampled.
        samples: number of sampled triples (sampled method only).
        seed: seed of the sampler.

    Returns:
        :class:`Monotonicity`. Over ordered triples of distinct rows (i, j, k) with
        ``|pos_i - pos_j| < |pos_i - pos_k|`` (rows at equal sequence distance from i form
        no triple), the rate is the fraction with ``distances[i, j] > distances[i, k]``;
        equal distances are not violations. Exact: per anchor, the others are ordered by
        sequence distance and the strict inversions of their distance ranks are counted,
        O(n^2 log n) time and O(n) rows of memory at a time. Sampled: ``samples`` triples
        drawn uniformly (seeded) from the valid ones, with a 95 % Wilson interval.
        Fewer than 3 rows: no triples, rate ``nan``.

    A sequence-monotone matrix gives 0; a random one about 0.5.

    >>> d = np.abs(np.subtract.outer(np.arange(5.0), np.arange(5.0)))
    >>> monotonicity_violation_rate(d).rate
    0.0
    """
    if not hasattr(distances, "shape"):
        distances = np.asarray(distances)
    shape = tuple(distances.shape)
    if len(shape) != 2 or shape[0] != shape[1]:
        msg = f"distances must be a square (n, n) matrix; got shape {shape}"
        raise ValueError(msg)
    n = shape[0]
    pos = _as_positions(positions, n)

    def rows_of(lo: int, hi: int) -> np.ndarray:
        return to_numpy(distances[lo:hi])

    def pair_dist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        xp = array_namespace(distances)
        return np.asarray(to_numpy(distances[xp.asarray(a), xp.asarray(b)]), dtype=np.float64)

    return _monotonicity(n, pos, rows_of, pair_dist, exact_limit=exact_limit, samples=samples, seed=seed)


def monotonicity_of_encoding(
    encoding: Any,
    /,
    *,
    positions: Any = None,
    exact_limit: int = 8192,
    samples: int = 2_000_000,
    seed: int = 0,
) -> Monotonicity:
    """:func:`monotonicity_violation_rate` with Euclidean distances between encoding rows.

    ``encoding`` is (n x d). Exact (n <= exact_limit): distance rows are formed a block of
    anchors at a time by the float64 Gram form (no n x n matrix is kept). Sampled: the
    distances of the sampled pairs are computed by the difference form. Gram rounding
    (relative ~1e-16 of the squared row norms) can break a tie between two distances
    that are equal in exact arithmetic; such triples may then count either way.
    """
    xp = array_namespace(encoding)
    p, sq = _centred_float64(encoding, xp)
    n = p.shape[0]
    pos = _as_positions(positions, n)

    def rows_of(lo: int, hi: int) -> np.ndarray:
        return to_numpy(_distance_block(p, sq, lo, hi, 0, xp))

    def pair_dist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        diff = p[xp.asarray(a)] - p[xp.asarray(b)]
        return to_numpy(xp.sqrt(xp.sum(diff * diff, axis=1)))

    return _monotonicity(n, pos, rows_of, pair_dist, exact_limit=exact_limit, samples=samples, seed=seed)


def corpus_diagnostics(
    distances: Any,
    /,
    *,
    positions: Any,
    exact_limit: int = 8192,
    samples: int = 2_000_000,
    seed: int = 0,
) -> CorpusDiagnostics:
    """H1 (non-stationarity) and A3 (Hellinger monotonicity) of a corpus.

    Args:
        distances: ``d_H`` between the occupied positions, (n x n), symmetric with n >= 2
            (the minimum is taken over the upper triangle).
        positions: the original 0-based sequence indices of the rows (``None`` means
            ``arange(n)``, i.e. every position occupied).
        exact_limit, samples, seed: as in :func:`monotonicity_violation_rate`.
    """
    if not hasattr(distances, "shape"):
        distances = np.asarray(distances)
    shape = tuple(distances.shape)
    if len(shape) != 2 or shape[0] != shape[1] or shape[0] < 2:
        msg = f"distances must be a square (n, n) matrix with n >= 2; got shape {shape}"
        raise ValueError(msg)
    value, pair = _min_offdiagonal(distances)
    mono = monotonicity_violation_rate(
        distances, positions=positions, exact_limit=exact_limit, samples=samples, seed=seed
    )
    return CorpusDiagnostics(min_distance=value, pair=pair, nonstationary=value > 0.0, monotonicity=mono)
