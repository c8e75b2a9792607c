"""Did position i's token distribution change between two corpora? A two-sample test per position.

For one position, corpus A has counts ``a_v`` (``N_a`` tokens) and corpus B ``b_v`` (``N_b``).
The statistic is the plug-in squared Hellinger distance

    D = d_H^2(a / N_a, b / N_b) = sum_v (sqrt(a_v / N_a) - sqrt(b_v / N_b))^2     in [0, 2].

**Null model: tokens exchangeable between the corpora.** If position i has one distribution
in both corpora, each of the ``N = N_a + N_b`` tokens counted there was equally likely to be
one of A's: given the pooled counts ``c_v = a_v + b_v``, A's counts are a random draw of
``N_a`` of the ``N`` tokens (a permutation test; multivariate hypergeometric ``a``). This is
the noise model of the noise floor (:mod:`posstats.estimates.thinning`: a random split of the
counted tokens), and like it, it treats tokens as independent draws; tokens of one document
are not, so long documents that fill many positions make the test liberal (see
docs/drift.md). It needs no second pass over either corpus.

**Null distribution of D.** ``a_v`` is hypergeometric (``N``, ``c_v``, ``N_a``). Per token,
``T_v = (sqrt(a_v / N_a) - sqrt((c_v - a_v) / N_b))^2``:

- ``c_v <= 64``: its mean, variance and third central moment by enumerating the ``c_v + 1``
  outcomes;
- larger ``c_v``: the delta method, ``T_v ~ e chi2_1`` with
  ``e = (1/N_a + 1/N_b) / 4 * (N - c_v) / (N - 1)`` (a square of a near-normal difference
  whose mean is 0).

The moments of D are the sums over tokens, leaving out the covariances of a hypergeometric
draw (negative for the variance, which is then larger: conservative). The p-value is the
upper tail of the shifted gamma law (Pearson type III) with D's mean, variance and skewness;
a skewness below the one of the two-moment gamma law through 0 is raised to it (a heavier
tail: conservative). Matching the skewness matters in the far tail that a family-wise
decision over 131,072 positions reads (p ~ 4e-7): with two moments only, the p-values below
1e-5 were 8x too many on a generated null; with three they are within Monte-Carlo error
(tests/test_drift.py, docs/drift.md).

**Checked by simulation.** With few tokens D is discrete, and one frequent token puts an
atom near D's maximum (every copy on one side) that three moments do not see: at 69 pooled
tokens, one of them 11 times, the approximation said 3e-7 where a million permutations
give 2.2e-4. So every position Holm would flag that has at most 5,000 pooled tokens and a p-value
within a factor 1000 of the Bonferroni level (more significant ones stay flagged whatever
the approximation's error) is checked: its permutation null is simulated (up to a million
splits and 2e7 token draws, about a second; stopping as soon as it refutes), and when the simulation's 99.9 %
lower confidence bound on the p-value is larger than the approximation, it replaces it and
Holm is run again (``PositionTest.checked`` records each
check). Above 5,000 tokens the sum over many cells is smooth and the approximation stands.

**Decision.** Position i *changed* when Holm's step-down procedure rejects at the family-wise
level ``level`` (default 5 %) over all positions tested (occupied in both corpora): the
probability that any unchanged position is reported is at most ``level``. A position occupied
in one corpus only is reported apart, as empty on the other side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.special import betaincinv, gammaincc, gammainccinv, gammaln

__all__ = ["BLOCK_ENTRIES", "EXACT_LIMIT", "PositionTest", "block_bounds", "compare_positions", "holm", "null_moments"]

EXACT_LIMIT = 64  # pooled counts up to this are enumerated exactly
_ENUMERATED = 1 << 22  # outcomes enumerated at a time (cells x (c + 1)): bounds the temporaries
BLOCK_ENTRIES = 1 << 22  # stored counts (both corpora) read and tested at a time


@dataclass(frozen=True)
class PositionTest:
    """Per-position two-sample results, all of shape (n,) (NaN where not tested).

    Attributes:
        occupancy_a, occupancy_b: tokens counted at each position in A and in B.
        d_h: plug-in ``d_H(A_i, B_i)``.
        expected_d_h: ``sqrt(E D)``: the distance sampling alone gives, under the null.
        sd_d2: standard deviation of ``D = d_H^2`` under the null.
        third_d2: its third central moment under the null.
        p_value: upper-tail p-value of the observed D.
        changed: bool, Holm's rejections at ``level``.
        level: the family-wise level.
        checked: position -> the permutation check of its p-value (``draws``, ``exceeding``,
            ``p_lower``, ``replaced``), for the positions Holm would flag.
    """

    occupancy_a: np.ndarray
    occupancy_b: np.ndarray
    d_h: np.ndarray
    expected_d_h: np.ndarray
    sd_d2: np.ndarray
    third_d2: np.ndarray
    p_value: np.ndarray
    changed: np.ndarray
    level: float
    checked: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def tested(self) -> np.ndarray:
        """(n,) bool: positions occupied in both corpora."""
        return (self.occupancy_a > 0) & (self.occupancy_b > 0)

    @property
    def empty_in_a(self) -> np.ndarray:
        """Positions with tokens in B but none in A."""
        return np.flatnonzero((self.occupancy_a == 0) & (self.occupancy_b > 0))

    @property
    def empty_in_b(self) -> np.ndarray:
        """Positions with tokens in A but none in B."""
        return np.flatnonzero((self.occupancy_b == 0) & (self.occupancy_a > 0))

    def quantile_d_h(self, upper_tail: float) -> np.ndarray:
        """(n,) the d_H exceeded with probability ``upper_tail`` under the null (Pearson III law)."""
        return np.sqrt(_quantile(self.expected_d_h**2, self.sd_d2, self.third_d2, upper_tail))

    def threshold_d_h(self) -> np.ndarray:
        """(n,) the d_H above which a position would be flagged on its own at the Bonferroni
        level ``level / tested`` (Holm's first step): the top of the noise band in the figure."""
        m = max(int(self.tested.sum()), 1)
        return np.sqrt(_quantile(self.expected_d_h**2, self.sd_d2, self.third_d2, self.level / m))


def _log_hypergeom_pmf(k: np.ndarray, total: np.ndarray, c: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """log P(k) for a hypergeometric draw of ``draws`` from ``total`` holding ``c`` marked."""

    def log_choose(n: Any, r: Any) -> Any:
        return gammaln(n + 1) - gammaln(r + 1) - gammaln(n - r + 1)

    with np.errstate(invalid="ignore"):
        out = log_choose(c, k) + log_choose(total - c, draws - k) - log_choose(total, draws)
    valid = (k >= 0) & (k <= c) & (draws - k >= 0) & (draws - k <= total - c)
    return np.where(valid, out, -np.inf)


def null_moments(c: np.ndarray, n_a: np.ndarray, n_b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, variance and third central moment of ``T = (sqrt(a / N_a) - sqrt((c - a) / N_b))^2``
    for hypergeometric ``a`` (``c`` of ``N = N_a + N_b`` tokens, ``N_a`` drawn), elementwise
    (module docstring).

    >>> m, v, k3 = null_moments(np.array([1]), np.array([1]), np.array([1]))
    >>> float(m[0]), float(v[0]), float(k3[0])  # a = 0 or 1, each with probability 1/2: T = 1 either way
    (1.0, 0.0, 0.0)
    """
    c = np.asarray(c, dtype=np.float64)
    n_a = np.asarray(n_a, dtype=np.float64)
    n_b = np.asarray(n_b, dtype=np.float64)
    total = n_a + n_b
    mean = np.empty_like(c)
    var = np.empty_like(c)
    third = np.empty_like(c)
    large = c > EXACT_LIMIT
    if large.any():
        e = (1.0 / n_a[large] + 1.0 / n_b[large]) / 4.0 * (total[large] - c[large]) / np.maximum(total[large] - 1.0, 1.0)
        mean[large], var[large], third[large] = e, 2.0 * e * e, 8.0 * e**3  # e times a chi-square with 1 df
    order = np.argsort(c, kind="stable")
    sorted_c = c[order]
    for value in np.unique(c[~large]).astype(np.int64):
        lo, hi = np.searchsorted(sorted_c, [value, value + 0.5])
        cells = order[int(lo) : int(hi)]
        # the moments depend on (c, N_a, N_b) only: the cells of one position share N_a and
        # N_b, so each distinct (N_a, N_b) with this c is enumerated once
        sizes, where = _distinct_pairs(n_a[cells], n_b[cells])
        m1, m2, m3 = _enumerated_moments(int(value), sizes[:, 0], sizes[:, 1])
        mean[cells], var[cells], third[cells] = m1[where], m2[where], m3[where]
    return mean, var, third


def _distinct_pairs(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((u, 2) the distinct rows of ``[x, y]``, (len(x),) the index of each row among them).

    >>> u, where = _distinct_pairs(np.array([3.0, 1.0, 3.0]), np.array([2.0, 2.0, 2.0]))
    >>> u.tolist(), where.tolist()
    ([[1.0, 2.0], [3.0, 2.0]], [1, 0, 1])
    """
    pairs = np.stack([x, y], axis=1)
    if pairs.shape[0] <= 1:
        return pairs, np.zeros(pairs.shape[0], dtype=np.int64)
    order = np.lexsort((y, x))
    ordered = pairs[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = np.any(ordered[1:] != ordered[:-1], axis=1)
    where = np.empty(len(order), dtype=np.int64)
    where[order] = np.cumsum(new) - 1
    return ordered[new], where


def _enumerated_moments(value: int, n_a: np.ndarray, n_b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, variance and third central moment of T (see :func:`null_moments`) for a pooled
    count ``value`` and each (n_a, n_b), by enumerating the hypergeometric law of ``a``, at
    most :data:`_ENUMERATED` outcomes at a time."""
    total = n_a + n_b
    out = np.empty((3, n_a.size))
    step = max(1, _ENUMERATED // (value + 1))  # bounds the (cells, c + 1) temporaries
    k = np.arange(value + 1, dtype=np.float64)
    for start in range(0, n_a.size, step):
        sel = slice(start, start + step)
        p = np.exp(_log_hypergeom_pmf(k[None, :], total[sel, None], float(value), n_a[sel, None]))
        t = (np.sqrt(k[None, :] / n_a[sel, None]) - np.sqrt((value - k[None, :]) / n_b[sel, None])) ** 2
        m1 = (p * t).sum(axis=1)
        dev = t - m1[:, None]
        out[0, sel] = m1
        out[1, sel] = (p * dev * dev).sum(axis=1)
        out[2, sel] = (p * dev**3).sum(axis=1)
    return out[0], out[1], out[2]


def _pearson3(mean: np.ndarray, sd: np.ndarray, third: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(shape, scale, location) of the shifted gamma law (Pearson type III) with this mean,
    standard deviation and third central moment; a skewness below that of the two-moment gamma
    law through 0 (``2 sd / mean``) falls back to that law (location 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        skew = np.where(sd > 0, third / np.where(sd > 0, sd, 1.0) ** 3, 0.0)
        floor = np.where(mean > 0, 2.0 * sd / np.where(mean > 0, mean, 1.0), 0.0)
        skew = np.maximum(skew, floor)
        shape = np.where(skew > 0, 4.0 / np.where(skew > 0, skew, 1.0) ** 2, np.inf)
        scale = sd * skew / 2.0
        location = mean - shape * scale  # inf * 0 where sd is 0: NaN, never read (callers mask those)
    return shape, scale, location


def _tail(x: np.ndarray, mean: np.ndarray, sd: np.ndarray, third: np.ndarray) -> np.ndarray:
    """P(D >= x) under the Pearson type III law of these moments (a point mass where sd is 0)."""
    out = np.where(x > mean, 0.0, 1.0)
    shape, scale, loc = _pearson3(mean, sd, third)
    ok = (sd > 0) & np.isfinite(shape) & (scale > 0)
    z = np.maximum(x[ok] - loc[ok], 0.0) / scale[ok]
    out[ok] = gammaincc(shape[ok], z)
    return out


def _quantile(mean: np.ndarray, sd: np.ndarray, third: np.ndarray, tail: float) -> np.ndarray:
    """x with ``P(D >= x) = tail`` under the same law (the mean where sd is 0)."""
    out = np.array(mean, dtype=np.float64, copy=True)
    shape, scale, loc = _pearson3(mean, sd, third)
    ok = (sd > 0) & np.isfinite(shape) & (scale > 0)
    out[ok] = loc[ok] + gammainccinv(shape[ok], tail) * scale[ok]
    return out


SIMULATION_MAX_TOKENS = 5_000  # positions with more pooled tokens are left to the approximation
_MAX_DRAWS = 1_000_000  # permutations per position checked
_MAX_TOKEN_DRAWS = 20_000_000  # permutations x tokens per position checked (about a second)
_SAFETY = 1000.0  # positions whose p-value is this far below the Bonferroni level are not checked


def permutation_exceedances(a_row: Any, b_row: Any, observed: float, /, *, draws: int, seed: int = 0,
                            stop: Callable[[int, int], bool] | None = None) -> tuple[int, int]:
    """``(exceeding, done)``: how many of ``done`` random splits of the position's pooled
    tokens (``N_a`` to A, the rest to B) give ``D >= observed`` (up to rounding), the
    permutation null simulated; ``draws`` at most, fewer when ``stop(exceeding, done)`` says
    so after a batch."""
    a = np.asarray(sp.csr_array(a_row).toarray(), dtype=np.int64).reshape(-1)
    b = np.asarray(sp.csr_array(b_row).toarray(), dtype=np.int64).reshape(-1)
    pooled = a + b
    types = np.flatnonzero(pooled)
    colors = pooled[types]
    n_a, n, k = int(a.sum()), int(colors.sum()), int(types.size)
    rng = np.random.default_rng(seed)
    batch = max(1, (1 << 22) // max(n, k))
    hits, done = 0, 0
    while done < draws:
        rows = min(batch, draws - done)
        # A's counts of each token type in a random split: the multivariate hypergeometric
        # law, drawn directly (5x faster than permuting the pooled tokens, the same law)
        counts_a = rng.multivariate_hypergeometric(colors, n_a, size=rows, method="count")
        overlap = np.sqrt(counts_a * (colors[None, :] - counts_a)).sum(axis=1)
        d2 = 2.0 - 2.0 * overlap / np.sqrt(n_a * (n - n_a))
        hits += int(np.count_nonzero(d2 >= observed - 1e-12))
        done += rows
        if stop is not None and stop(hits, done):
            break
    return hits, done


def _check_rejections(p: np.ndarray, d2: np.ndarray, pooled: np.ndarray, read_a: Callable[[int, int], Any],
                      read_b: Callable[[int, int], Any], *, level: float, seed: int) -> dict[int, dict[str, Any]]:
    """Check, by simulating the permutation null, the approximate p-values of the positions
    Holm would flag whose pooled tokens are few enough (:data:`SIMULATION_MAX_TOKENS`): with
    few tokens, D is discrete and a dominant token puts an atom near D's maximum that three
    moments cannot see. A p-value is replaced by the simulation's 99.9 % lower confidence
    bound when that bound is larger (the approximation refuted); ``p`` is changed in place,
    and Holm is re-run until no flagged position is left unchecked."""
    def lower_bound(hits: int, done: int) -> float:
        return float(betaincinv(hits, done - hits + 1, 0.001)) if hits else 0.0  # the Beta quantile

    checked: dict[int, dict[str, Any]] = {}
    for _ in range(8):
        # positions far below the Bonferroni level stay flagged even if the approximation is
        # off by 1000x: only the borderline ones are checked
        floor = level / max(int(np.count_nonzero(~np.isnan(p))), 1) / _SAFETY
        todo = [int(i) for i in np.flatnonzero(holm(p, level))
                if int(i) not in checked and pooled[i] <= SIMULATION_MAX_TOKENS and p[i] > floor]
        if not todo:
            break
        for i in todo:
            draws = int(min(_MAX_DRAWS, max(1000, _MAX_TOKEN_DRAWS // max(int(pooled[i]), 1))))
            approximate = float(p[i])
            hits, draws = permutation_exceedances(read_a(i, i + 1), read_b(i, i + 1), float(d2[i]), draws=draws,
                                                  seed=seed + i, stop=lambda h, d, q=approximate: lower_bound(h, d) > q)
            lower = lower_bound(hits, draws)
            replaced = bool(lower > p[i])
            checked[i] = {"draws": draws, "exceeding": hits, "p_lower": lower, "p_approximate": float(p[i]), "replaced": replaced}
            if replaced:
                p[i] = lower
    return checked


def holm(p_values: np.ndarray, level: float) -> np.ndarray:
    """Holm's step-down rejections (bool) at family-wise level ``level``; NaN p-values are
    not tested.

    >>> holm(np.array([0.001, 0.03, 0.04, np.nan]), 0.05).tolist()
    [True, False, False, False]
    """
    p = np.asarray(p_values, dtype=np.float64)
    tested = np.flatnonzero(~np.isnan(p))
    m = tested.size
    reject = np.zeros(p.shape, dtype=bool)
    if not m:
        return reject
    order = tested[np.argsort(p[tested], kind="stable")]
    thresholds = level / (m - np.arange(m))
    passed = p[order] <= thresholds
    stop = m if passed.all() else int(np.argmin(passed))
    reject[order[:stop]] = True
    return reject


def _csr(rows: Any) -> sp.csr_array:
    return sp.csr_array(rows) if sp.issparse(rows) else sp.csr_array(np.asarray(rows))


def _block_statistics(a: sp.csr_array, b: sp.csr_array) -> tuple[np.ndarray, ...]:
    """(occ_a, occ_b, D, E D, Var D, third central moment of D) of the rows of two count blocks, NaN
    where a row is empty on either side. ``D = 2 - 2 sum_v sqrt(a_v b_v / (N_a N_b))``
    needs only the cells stored on both sides; the null moments need the pooled ``c_v``."""
    occ_a = np.asarray(a.sum(axis=1), dtype=np.float64).reshape(-1)
    occ_b = np.asarray(b.sum(axis=1), dtype=np.float64).reshape(-1)
    tested = (occ_a > 0) & (occ_b > 0)
    both = sp.csr_array(a.multiply(b))
    both.sum_duplicates()
    overlap = np.asarray(sp.csr_array((np.sqrt(both.data.astype(np.float64)), both.indices, both.indptr), shape=both.shape)
                         .sum(axis=1)).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        d2 = np.clip(2.0 - 2.0 * overlap / np.sqrt(occ_a * occ_b), 0.0, 2.0)
    pooled = sp.csr_array(a + b)
    pooled.sum_duplicates()
    rows = np.repeat(np.arange(pooled.shape[0]), np.diff(pooled.indptr))
    keep = tested[rows]
    moments = null_moments(pooled.data[keep], occ_a[rows[keep]], occ_b[rows[keep]])
    # (float even when no row of the block is tested: bincount of nothing is int64)
    e, v, k3 = (np.bincount(rows[keep], weights=w, minlength=pooled.shape[0]).astype(np.float64) for w in moments)
    d2[~tested] = e[~tested] = v[~tested] = k3[~tested] = np.nan
    return occ_a, occ_b, d2, e, v, k3


def block_bounds(indptr_a: np.ndarray | None, indptr_b: np.ndarray | None, n: int, /, *,
                 entries: int = BLOCK_ENTRIES, max_rows: int = 4096) -> list[int]:
    """Row boundaries ``[0, ..., n]`` of blocks holding about ``entries`` stored counts of
    both corpora together (from their CSR row pointers; None: dense, ``max_rows`` rows), and
    at most ``max_rows`` rows: long contexts put most tokens in the first positions, so
    blocks of equal rows would not bound memory."""
    if indptr_a is None or indptr_b is None:
        return list(range(0, n, max_rows)) + [n]
    load = np.asarray(indptr_a, dtype=np.int64) + np.asarray(indptr_b, dtype=np.int64)
    bounds, lo = [0], 0
    while lo < n:
        hi = int(np.searchsorted(load, load[lo] + entries, side="right")) - 1
        hi = min(max(hi, lo + 1), lo + max_rows, n)
        bounds.append(hi)
        lo = hi
    return bounds


def compare_positions(
    a: Any,
    b: Any,
    /,
    *,
    level: float = 0.05,
    n: int | None = None,
    rows_per_block: int = 4096,
    bounds: list[int] | None = None,
    progress: Callable[[int], None] | None = None,
    seed: int = 0,
) -> PositionTest:
    """The two-sample test at every position (module docstring).

    Args:
        a, b: (n, V) counts of the two corpora (dense or scipy sparse), or callables
            ``(start, stop) -> rows`` reading a row range (then ``n`` is required), so that
            long contexts are tested block by block without loading either corpus whole.
        level: family-wise error level of the ``changed`` decisions (Holm).
        n: number of positions, when ``a`` and ``b`` are readers.
        rows_per_block: positions handled at a time, unless ``bounds`` gives the blocks
            (:func:`block_bounds`: by stored counts, which bounds the memory).
        progress: called with the number of positions done after each block.
        seed: of the permutations that check the positions Holm would flag (module docstring).

    Returns:
        :class:`PositionTest`.
    """
    if not 0 < level < 1:
        msg = f"the level must be in (0, 1), got {level}"
        raise ValueError(msg)
    if callable(a):
        if n is None:
            raise ValueError("give n with row readers")
        read_a, read_b = a, b
    else:
        ca, cb = _csr(a), _csr(b)
        if ca.shape != cb.shape:
            msg = f"the two count matrices differ in shape: {ca.shape} and {cb.shape}"
            raise ValueError(msg)
        n = ca.shape[0]

        def read_a(lo: int, hi: int) -> Any:
            return ca[lo:hi]

        def read_b(lo: int, hi: int) -> Any:
            return cb[lo:hi]

    parts = []
    done = 0
    edges = bounds if bounds is not None else [*range(0, n, rows_per_block), n]
    for lo, hi in zip(edges[:-1], edges[1:]):
        parts.append(_block_statistics(_csr(read_a(lo, hi)), _csr(read_b(lo, hi))))
        done += parts[-1][0].shape[0]
        if progress is not None:
            progress(done)
    occ_a, occ_b, d2, e, v, k3 = (np.concatenate(column) for column in zip(*parts, strict=True)) if parts else (np.zeros(0),) * 6
    sd = np.sqrt(v)
    p = np.full(n, np.nan)
    tested = ~np.isnan(d2)
    p[tested] = _tail(d2[tested], e[tested], sd[tested], k3[tested])
    checked = _check_rejections(p, d2, occ_a + occ_b, read_a, read_b, level=level, seed=seed)
    return PositionTest(occ_a, occ_b, np.sqrt(d2), np.sqrt(e), sd, k3, p, holm(p, level), float(level), checked)
