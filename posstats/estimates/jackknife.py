"""Intervals on statistics of the counts: a delete-a-group jackknife over random token groups.

An encoding's *exact* stress is exact only given the estimated distances; those come from a
sample of tokens, so the stress is an estimate too, and two encodings whose stresses differ
by less than its sampling error are not distinguishable. This module measures that error.

**Groups.** Every count ``C[i, v]`` of the rows is split at random into K groups
(:func:`posstats.estimates.thinning.thin`: a multinomial split of every token), so group
g is an independent thinning of the corpus. Replicate g recomputes the statistic on the
counts *without* group g (a fraction (K - 1)/K of every row).

**Delete-a-group jackknife** (Quenouille; Tukey; Kott 2001 for groups): with replicate
values ``theta_(g)`` and their mean ``theta_(.)``,

    var(theta_hat) = (K - 1) / K * sum_g (theta_(g) - theta_(.))^2

and the 95 % interval is ``theta_J -+ t_{K-1, 0.975} sd`` (Student's t with K - 1 degrees
of freedom: K is small), centred on the jackknife's bias-corrected estimate
``theta_J = theta_hat - (K - 1) (theta_(.) - theta_hat)``: stress is a nonlinear function of
the distances (square roots of noisy, clipped ``d_H^2``), so the plain estimate carries a
bias of order 1/N that an interval around it would not cover (on a drift at N = 2,000 the
bias of ALiBi's scaled stress is 4 sd). The interval can therefore exclude the reported
point estimate. Its measured coverage is in docs/calibration.md. Where the correction
(:func:`jackknife_correction`) exceeds
:data:`posstats.estimates.pair_jackknife.MAX_CORRECTION_SDS` standard deviations the bias
is not the 1/N one it models (near-zero pairs add one of order ``N^-1/2``, which dominates
an encoding that fits the distances almost exactly), and the analysis gives no interval:
on drifts at n = 512, N = 1e5, ALiBi's intervals covered 12 of 26 before that rule.

The tokens of one document are dependent; a token split treats them as independent, so
with dependent tokens these intervals are too narrow (docs/calibration.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.special import stdtrit

from posstats.estimates.thinning import thin

__all__ = ["JACKKNIFE_GROUPS", "delete_group_replicates", "jackknife_correction", "jackknife_interval", "jackknife_sd",
           "overshoot_tie_range", "without_group"]

JACKKNIFE_GROUPS = 10


def delete_group_replicates(
    rows: Any,
    statistic: Callable[[sp.csr_array], Mapping[Any, float]],
    /,
    *,
    groups: int = JACKKNIFE_GROUPS,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> dict[Any, np.ndarray]:
    """``statistic`` of the (m, V) integer counts without each of ``groups`` random token
    groups (module docstring).

    Args:
        rows: (m, V) integer counts (sparse or dense).
        statistic: maps (m, V) int64 CSR counts to named values.
        groups: K >= 2.
        seed: seeds the split.
        progress: called with 1 after each replicate.

    Returns:
        ``{name: (K,) replicate values}``.
    """
    if groups < 2:
        msg = f"a delete-a-group jackknife needs at least 2 groups, got {groups}"
        raise ValueError(msg)
    c = sp.csr_array(rows, copy=True)  # never the caller's arrays: replicates drop zeros in place
    c.sum_duplicates()
    parts = thin(c.data, groups, np.random.default_rng([seed, 7]))  # (K, nnz)
    out: dict[Any, list[float]] = {}
    for g in range(groups):
        kept = without_group(c, parts[g])
        for name, value in statistic(kept).items():
            out.setdefault(name, []).append(float(value))
        if progress is not None:
            progress(1)
    return {name: np.asarray(v) for name, v in out.items()}


def without_group(counts: sp.csr_array, group: np.ndarray, /) -> sp.csr_array:
    """Canonical CSR ``counts`` less one token group (``group``: (nnz,) on the same
    pattern), as a new matrix (the input's arrays untouched), zeros dropped."""
    kept = sp.csr_array((counts.data - group, counts.indices.copy(), counts.indptr.copy()), shape=counts.shape)
    kept.eliminate_zeros()
    return kept


def jackknife_sd(replicates: Any, /) -> float:
    """``sqrt((K - 1) / K * sum_g (theta_(g) - theta_(.))^2)`` of K replicate values."""
    x = np.asarray(replicates, dtype=np.float64).ravel()
    k = x.size
    return float(np.sqrt((k - 1) / k * np.sum((x - x.mean()) ** 2))) if k > 1 else float("nan")


def jackknife_correction(estimate: float, replicates: Any, /) -> float:
    """The jackknife's bias correction ``theta_J - theta_hat = -(K - 1) (theta_(.) - theta_hat)``
    of K replicate values (module docstring): what :func:`jackknife_interval` moves its centre by.

    >>> round(jackknife_correction(1.0, [1.1] * 10), 12)
    -0.9
    """
    x = np.asarray(replicates, dtype=np.float64).ravel()
    return -(x.size - 1) * (float(x.mean()) - float(estimate))


def jackknife_interval(
    estimate: float, replicates: Any, /, *, level: float = 0.95, bounds: tuple[float, float] | None = None,
    on_replicates_data: float | None = None, extra_sd: float = 0.0,
) -> list[float] | None:
    """``theta_J -+ t_{K-1} sqrt(sd^2 + extra_sd^2)`` (sd: :func:`jackknife_sd`) at the
    two-sided ``level``, centred on the bias-corrected ``theta_J = estimate - (K - 1)
    (theta_(.) - reference)`` (module docstring), ``reference`` being the full data's value
    on what the replicates were computed on (``on_replicates_data``; the estimate itself
    by default).

    ``bounds=(lo, hi)``: the range the quantity can take (scaled stress: [0, 1]); the
    interval is cut to it, which keeps its coverage (the truth lies in the range). An
    interval entirely outside the range (the bias correction overshot, e.g. a fitted
    encoding's stress extrapolated below 0) is no interval: None.
    """
    x = np.asarray(replicates, dtype=np.float64).ravel()
    k = x.size
    reference = float(estimate) if on_replicates_data is None else float(on_replicates_data)
    centre = float(estimate) - (k - 1) * (float(x.mean()) - reference)
    half = float(stdtrit(k - 1, 0.5 + level / 2)) * float(np.hypot(jackknife_sd(x), extra_sd))
    lo, hi = centre - half, centre + half
    if bounds is not None:
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
        if lo > hi:
            return None
    return [lo, hi]


def overshoot_tie_range(estimate: float, replicates: Any, /, *, level: float = 0.95,
                        extra_sd: float = 0.0) -> list[float]:
    """The range for ties of a quantity in ``[0, inf)`` whose bias-corrected interval lies
    below 0 (:func:`jackknife_interval` gave None: the 1/N extrapolation overshot a value
    near 0): ``[0, estimate + t_{K-1} sqrt(sd^2 + extra_sd^2)]`` (``extra_sd``: as in
    :func:`jackknife_interval`). Such a value is within its noise of 0; another
    encoding whose range reaches into this one's is tied with it, and none is named best
    on the point estimate alone.

    >>> overshoot_tie_range(0.002, [0.003] * 9 + [0.0031])[0]
    0.0
    """
    x = np.asarray(replicates, dtype=np.float64).ravel()
    half = float(stdtrit(x.size - 1, 0.5 + level / 2)) * float(np.hypot(jackknife_sd(x), extra_sd))
    return [0.0, float(estimate) + half]
