"""Token-noise intervals on stress from a fixed sample of pairs: a delete-a-group jackknife.

Up to 2,048 geometry rows an encoding's stress gets its interval from the delete-a-group
jackknife of :mod:`posstats.estimates.jackknife`, which recomputes the m x m distances and
refits the fitted encodings ten times. Above that this module measures the same sampling
noise of the corpus (its tokens) on a fixed sample of pairs, for encodings that are not
refitted (the fixed ones: sinusoidal, RoPE, ALiBi, ...).

**Replicates.** Every count is split at random into K = 10 groups (the multinomial split of
:func:`posstats.estimates.thinning.thin`), drawn one group at a time: group g is
``Binomial(rest, 1 / (K - g))`` of the tokens no earlier group took, so only the rest is
held (one integer array), never a K x nnz split (8 GB at 10^8 stored counts). Replicate g
drops group g, recomputes the per-position bias ``b_i`` from what is left, the corrected
distances of the P pairs, and the statistic on them: the delete-a-group jackknife of
:mod:`posstats.estimates.jackknife` (Kott 2001), with its variance
``(K - 1) / K sum_g (theta_(g) - theta_(.))^2`` and Student's t with K - 1 degrees of
freedom.

Why groups, not independent random deletions. With K deletions drawn independently (a
random delete-d jackknife, Shao 1989) the variance formula is the same, but the mean of
the replicates carries Monte Carlo noise that the bias correction multiplies by K - 1:
the corrected estimate's variance is then about 1.9 times the estimate's, which the
interval does not include (measured: on a drift at n = 4,096, N = 20,000, sinusoidal's
interval covered 5 of 8). With a partition the replicates of a linear statistic average
to the full value exactly, and the correction is free of that noise.

**Pairs.** Row i's noise reaches a stress through the pairs that contain it. With P pairs
drawn uniformly, a row is in ``2 P / m`` of them on average, and the variance of the stress
of P pairs is at least that of all pairs: ``1 + m / (2 P)`` times it when a row's noise
moves all its pairs alike (the rows' weights vary as Poisson counts do), more when it moves
each pair its own way (what P pairs do not average out). The interval is therefore never
narrower than one on all pairs. ``P = 4 m`` (1.125 times at most in the first case), fewer
when the pairs' rows would gather more than ``2^28`` stored entries a replicate (about 4 s
here), but never fewer than m (:func:`jackknife_pairs`).

**The interval** (:func:`pair_jackknife_interval`): the reported estimate (exact over all
pairs, or sampled) is shifted by the jackknife's bias measured on the P pairs, ``theta_J =
theta - (K - 1) (theta_. - theta_P)`` with ``theta_P`` the full data's value on those pairs,
and given ``+- t_{K-1, 0.975} sqrt(sd_tokens^2 + sd_pairs^2)``: a sampled estimate also
carries the error of its own pair sample (``sd_pairs``), independent of the tokens'.

**When the bias correction is too large to trust** (:data:`MAX_CORRECTION_SDS`). The
jackknife removes a bias of order 1/N. Pairs whose true ``d_H^2`` lies within the noise of
its estimate add another one: ``sqrt(max(d^2_hat, 0))`` there is biased by the order of the
noise's square root (order ``N^-1/2``), of which a 1/N extrapolation removes about half. It
does not shrink with the number of positions while the standard deviation does, so at
thousands of positions it dominates an encoding whose stress is small: on a drift at
n = 4,096, N = 20,000, ALiBi's scaled stress 0.0087 was corrected to 0.0073 (sd 0.00007)
against a truth of 0.0068. An interval is therefore given only while the correction
``|theta - theta_J|`` is at most ``MAX_CORRECTION_SDS`` of the interval's standard
deviation; above, the analysis gives none and keeps the range for ties (docs/calibration.md).

**Noise share** (:func:`pair_noise_share`): the share of the summed distances that
sampling noise alone reaches, for the analysis' rule that withholds intervals at 10 % or
more (docs/calibration.md). Up to 4,096 rows the shuffle null gives it; above, the rows of
a few thousand pairs are redrawn from the pooled distribution with their own occupancies
(a stationary corpus with the data's margins: the shuffle null's law, drawn with
replacement, which at these sizes is the same), pushed through the data's estimator, and
their summed distances divided by the data's on the same pairs.

The tokens of one document are dependent; a token split treats them as independent, so
with dependent tokens these intervals are too narrow (docs/calibration.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from posstats.estimates.jackknife import JACKKNIFE_GROUPS, jackknife_interval, jackknife_sd
from posstats.estimates.sampled import SampledGeometry, sample_pairs
from posstats.estimates.occupancy import OccupancyShrinkage
from posstats.estimates.sampling_variance import position_sampling_variance

__all__ = [
    "MAX_CORRECTION_SDS",
    "PAIR_ENTRIES_BUDGET",
    "SHARE_PAIRS",
    "PairInterval",
    "correction_trusted",
    "draw_jackknife_pairs",
    "jackknife_pairs",
    "pair_jackknife_interval",
    "pair_noise_share",
    "pair_replicates",
    "token_groups",
]

PAIR_ENTRIES_BUDGET = 1 << 28
MAX_CORRECTION_SDS = 2.0
SHARE_PAIRS = 4096
_TOKENS_PER_DRAW = 1 << 24  # null tokens drawn at a time (their int64 row and token ids: 256 MiB)
_THIN_BLOCK = 1 << 22  # counts split into groups at a time


def jackknife_pairs(m: int, /, *, entries_per_row: float = 0.0, budget: int = PAIR_ENTRIES_BUDGET) -> int:
    """Pairs the replicates are computed on: ``4 m``, or as many as gather ``budget``
    stored entries (a pair gathers its two rows) when that is fewer, and at least m
    (module docstring).

    >>> jackknife_pairs(4096), jackknife_pairs(131_072, entries_per_row=763.0)
    (16384, 175907)
    """
    m = int(m)
    if entries_per_row <= 0:
        return 4 * m
    return int(min(4 * m, max(m, budget // (2.0 * entries_per_row))))


def _binomial(counts: np.ndarray, p: float, rng: np.random.Generator, /) -> np.ndarray:
    """``Binomial(counts, p)`` in the counts' own integer type (no int64 copy of 1e8 counts),
    drawn a block at a time."""
    out = np.empty_like(counts)
    if p >= 1.0:
        out[:] = counts
        return out
    for a in range(0, counts.size, _THIN_BLOCK):
        out[a : a + _THIN_BLOCK] = rng.binomial(counts[a : a + _THIN_BLOCK], p)
    return out


def token_groups(counts: np.ndarray, groups: int, rng: np.random.Generator, /) -> Iterator[np.ndarray]:
    """The multinomial split of every count into ``groups`` random token groups, yielded one
    group at a time: group g is ``Binomial(rest, 1 / (groups - g))`` of what no earlier
    group took (module docstring). The groups sum to ``counts``; only the rest is held.

    A count of 1 (most stored counts of a sparse corpus) takes one uniform group label
    instead: the same multinomial law, one draw instead of K binomial ones, held as one
    byte per count (the binomial draws were most of the split's time).

    Args:
        counts: (nnz,) non-negative integer counts (not modified).
        groups: K >= 1.
        rng: the randomness.

    Yields:
        K arrays of the counts' shape and type.
    """
    label_type = np.int8 if groups <= np.iinfo(np.int8).max else np.int32
    label = np.full(counts.shape, -1, dtype=label_type)  # -1: not a single token
    single = counts == 1
    label[single] = rng.integers(0, groups, size=int(np.count_nonzero(single)), dtype=label_type)
    del single
    multi = np.flatnonzero(counts > 1)
    rest = counts[multi]  # a copy: what no earlier group took
    for g in range(groups):
        part = _binomial(rest, 1.0 / (groups - g), rng)  # the last group takes the rest
        rest -= part
        group = (label == g).astype(counts.dtype)
        group[multi] = part
        yield group


def pair_replicates(
    rows: Any,
    i: np.ndarray,
    j: np.ndarray,
    statistic: Callable[[np.ndarray], Mapping[Any, float]],
    /,
    *,
    corrected: bool,
    replicates: int = JACKKNIFE_GROUPS,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    occupancy: bool = False,
) -> dict[Any, np.ndarray]:
    """``statistic`` of the pairs' corpus distances ``d_H`` in ``replicates`` corpora that
    each leave out one of ``replicates`` random token groups (module docstring).

    Args:
        rows: (m, V) integer counts, every row occupied (sparse or dense).
        i, j: (P,) the pairs, row indices.
        statistic: maps the (P,) distances ``d_H`` of one replicate to named values.
        corrected: distances bias-corrected by each replicate's own ``b``
            (:func:`posstats.estimates.sampling_variance.position_sampling_variance`).
        replicates: K >= 2 groups.
        occupancy: with ``corrected``, each replicate's square roots' occupancy shrinkage
            removed first (:mod:`posstats.estimates.occupancy`, under the rows' pooled
            distribution), as the exact path's corpus distances are.
        seed: seeds the split.
        progress: called with 1 after each replicate.

    Returns:
        ``{name: (K,) replicate values}``.
    """
    if replicates < 2:
        msg = f"a delete-a-group jackknife needs at least 2 groups, got {replicates}"
        raise ValueError(msg)
    c = sp.csr_array(rows, dtype=np.int64) if not sp.issparse(rows) else sp.csr_array(rows)
    c.sum_duplicates()  # a no-op on canonical counts (no copy)
    pooled = np.asarray(c.sum(axis=0)).ravel() if corrected and occupancy else None
    touched, inverse = np.unique(np.concatenate([i, j]), return_inverse=True)
    if touched.size < c.shape[0]:  # only the pairs' rows are thinned and square-rooted
        c = c[touched]
        i, j = inverse[: i.size], inverse[i.size :]
    out: dict[Any, list[float]] = {}
    for group in token_groups(c.data, replicates, np.random.default_rng([seed, 13])):
        kept = sp.csr_array((c.data - group, c.indices, c.indptr), shape=c.shape)
        kept.has_canonical_format = True  # the counts' own pattern
        del group
        bias = position_sampling_variance(kept) if corrected else None
        shrinkage = OccupancyShrinkage.of(kept, pooled=pooled) if pooled is not None else None
        h = SampledGeometry(kept, bias=bias, shrinkage=shrinkage).distances(i, j)
        del kept
        for name, value in statistic(h).items():
            out.setdefault(name, []).append(float(value))
        if progress is not None:
            progress(1)
    return {name: np.asarray(v) for name, v in out.items()}


@dataclass(frozen=True)
class PairInterval:
    """A pair-sample jackknife interval (:func:`pair_jackknife_interval`).

    Attributes:
        interval: ``[low, high]`` cut to the quantity's range, or None when it lies
            entirely outside it.
        correction: ``estimate - theta_J``, the jackknife's bias estimate.
        sd: ``sqrt(sd_J^2 + pair_sd^2)``.
    """

    interval: list[float] | None
    correction: float
    sd: float

    @property
    def trusted(self) -> bool:
        """The correction is at most :data:`MAX_CORRECTION_SDS` standard deviations
        (module docstring)."""
        return correction_trusted(self.correction, self.sd)


def correction_trusted(correction: float, sd: float, /) -> bool:
    """Whether a jackknife's bias ``correction`` is at most :data:`MAX_CORRECTION_SDS` of
    the standard deviation ``sd`` (module docstring); False for a NaN sd."""
    return abs(correction) <= MAX_CORRECTION_SDS * sd


def pair_jackknife_interval(
    estimate: float,
    on_pairs: float,
    replicates: Any,
    /,
    *,
    pair_sd: float = 0.0,
    level: float = 0.95,
    bounds: tuple[float, float] | None = None,
) -> PairInterval:
    """``theta_J -+ t_{K-1} sqrt(sd_J^2 + pair_sd^2)`` around ``theta_J = estimate - (K - 1)
    (mean(replicates) - on_pairs)`` (module docstring).

    Args:
        estimate: the reported value (exact, or sampled from its own pairs).
        on_pairs: the full data's value on the jackknife's pairs.
        replicates: (K,) the replicates' values on those pairs (:func:`pair_replicates`).
        pair_sd: the standard error of ``estimate`` from sampling its pairs (0 when exact).
        level: two-sided level.
        bounds: the range the quantity can take; the interval is cut to it, and is None
            when it lies entirely outside (as :func:`posstats.estimates.jackknife.jackknife_interval`).

    Returns:
        :class:`PairInterval` (interval, correction, sd).
    """
    x = np.asarray(replicates, dtype=np.float64).ravel()
    interval = jackknife_interval(estimate, x, level=level, bounds=bounds, on_replicates_data=on_pairs,
                                  extra_sd=pair_sd)
    return PairInterval(interval, (x.size - 1) * (float(x.mean()) - float(on_pairs)),
                        float(np.hypot(jackknife_sd(x), pair_sd)))


def _alias_table(weights: np.ndarray, /) -> tuple[np.ndarray, np.ndarray]:
    """Walker's alias table of the distribution ``weights / sum(weights)`` (V,), by Vose's
    construction: ``(prob, alias)``, (V,) float64 and int64. A draw takes a uniform column
    j and a uniform u and is j when ``u < prob[j]``, else ``alias[j]`` (:func:`_alias_draws`):
    O(1) a draw, where the inverse CDF's binary search over V = 50,257 ids cost 7 s for the
    62 M tokens of the 1 B-token noise share."""
    v = int(weights.size)
    scaled = (weights * (v / float(weights.sum()))).tolist()
    prob = np.ones(v, dtype=np.float64)
    alias = np.arange(v, dtype=np.int64)
    small = [k for k, x in enumerate(scaled) if x < 1.0]
    large = [k for k, x in enumerate(scaled) if x >= 1.0]
    while small and large:
        s, big = small.pop(), large[-1]
        prob[s], alias[s] = scaled[s], big
        scaled[big] += scaled[s] - 1.0
        if scaled[big] < 1.0:
            small.append(large.pop())
    return prob, alias  # what is left in either list keeps prob 1 (rounding)


def _alias_draws(prob: np.ndarray, alias: np.ndarray, size: int, rng: np.random.Generator, /) -> np.ndarray:
    """(size,) int64 ids drawn from the distribution of the alias table ``(prob, alias)``
    (:func:`_alias_table`). One uniform double a draw: its integer part times V is the
    column, its fraction the coin (37 bits of it at V = 50,257: ample against ``prob``)."""
    x = rng.random(int(size))
    x *= prob.size
    j = x.astype(np.int64)
    x -= j
    return np.where(x < prob[j], j, alias[j])


def _pooled_null_rows(occupancy: np.ndarray, pooled: np.ndarray, rng: np.random.Generator) -> sp.csr_array:
    """(r, V) counts: row k holds ``occupancy[k]`` tokens drawn from ``pooled / sum(pooled)``,
    drawn in blocks of rows of at most ``_TOKENS_PER_DRAW`` tokens."""
    prob, alias = _alias_table(np.asarray(pooled, dtype=np.float64))
    vocab = pooled.size
    blocks = []
    lo = 0
    ends = np.cumsum(occupancy)
    while lo < occupancy.size:
        start = ends[lo] - occupancy[lo]
        hi = max(lo + 1, int(np.searchsorted(ends, start + _TOKENS_PER_DRAW, side="right")))
        occ = occupancy[lo:hi]
        tokens = _alias_draws(prob, alias, int(occ.sum()), rng)
        row_of = np.repeat(np.arange(hi - lo), occ)
        block = sp.csr_array((np.ones(tokens.size, dtype=np.int64), (row_of, tokens)), shape=(hi - lo, vocab))
        block.sum_duplicates()
        blocks.append(block)
        lo = hi
    return sp.csr_array(sp.vstack(blocks, format="csr"))


def pair_noise_share(
    rows: Any,
    i: np.ndarray,
    j: np.ndarray,
    h: np.ndarray,
    /,
    *,
    corrected: bool,
    pairs: int = SHARE_PAIRS,
    seed: int = 0,
    occupancy: Any = None,
    pooled: Any = None,
    occupancy_adjusted: bool = False,
) -> float | None:
    """The share of the pairs' summed distances that sampling noise alone reaches: the
    first ``pairs`` pairs' distances in a stationary corpus with the data's occupancies and
    pooled distribution (module docstring), over the data's ``h`` on the same pairs. None
    when the data's sum is 0.

    Args:
        rows: (m, V) integer counts; or None with ``occupancy`` and ``pooled`` (all the
            null needs: rows held apart give them without being gathered,
            :class:`posstats.geometry.ranged.RangedSqrt`).
        i, j: (P,) pairs; ``h``: (P,) their corpus distances ``d_H`` (plug-in or corrected,
            as ``corrected`` says).
        corrected: the null's distances corrected by its own ``b``.
        pairs: how many of the pairs (the first) are redrawn.
        seed: seeds the draw.
        occupancy: (m,) tokens of every row (instead of ``rows``).
        pooled: (V,) tokens of every vocabulary entry over the rows (instead of ``rows``).
        occupancy_adjusted: with ``corrected``, the null's square roots' occupancy shrinkage
            removed first, as ``h`` had (the exact path's corpus distances:
            :mod:`posstats.estimates.occupancy`).
    """
    if rows is not None:
        c = sp.csr_array(rows)
        occupancy = np.asarray(c.sum(axis=1)).ravel()
        pooled = np.asarray(c.sum(axis=0)).ravel()
    elif occupancy is None or pooled is None:
        msg = "pair_noise_share needs the rows, or their occupancy and pooled counts"
        raise ValueError(msg)
    i, j, h = i[:pairs], j[:pairs], np.asarray(h[:pairs], dtype=np.float64)
    data = float(h.sum())
    if not data > 0:
        return None
    touched, inverse = np.unique(np.concatenate([i, j]), return_inverse=True)
    occ = np.rint(np.asarray(occupancy, dtype=np.float64)).astype(np.int64)[touched]
    null = _pooled_null_rows(occ, np.asarray(pooled, dtype=np.float64), np.random.default_rng([seed, 17]))
    bias = position_sampling_variance(null) if corrected else None
    shrinkage = OccupancyShrinkage.of(null, pooled=pooled) if corrected and occupancy_adjusted else None
    ii, jj = inverse[: i.size], inverse[i.size :]
    return float(SampledGeometry(null, bias=bias, shrinkage=shrinkage).distances(ii, jj).sum()) / data


def draw_jackknife_pairs(m: int, /, *, entries_per_row: float = 0.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The jackknife's :func:`jackknife_pairs` pairs of m rows, uniform over i < j."""
    count = jackknife_pairs(m, entries_per_row=entries_per_row)
    return sample_pairs(m, count, rng=np.random.default_rng([seed, 19]))
