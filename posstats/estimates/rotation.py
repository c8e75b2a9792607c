"""The rotation null: a test of homogeneity that keeps the dependence inside windows.

**Why.** The permutation null (:mod:`posstats.estimates.permutation`) shuffles tokens
across positions, which is the exact null when tokens are independent. In ``pack`` mode a
window is consecutive text: its nearby tokens are dependent, and the rows of the counts
are correlated. Under that dependence the homogeneity statistic ``S`` has a wider law than
the shuffled corpora give it, and the test rejected 9 of 112 chunks of real packed text
(Shakespeare, n = 16) at its 2.5 % level (docs/calibration.md).

**Null hypothesis.** H0: the windows are cut from a stationary stream at offsets unrelated
to n, so that every position has the same token distribution, with any dependence between
nearby tokens. The windows are counted in K groups of consecutive blocks
(:mod:`posstats.counting.window_groups`). Rotating a group's rows by an offset s moves the
token at stream offset t to position ``(t + s) mod n``: the counts of the same stretches of
stream cut into windows s tokens later, which under H0 have the law of the data's. Each
group gets its own uniform offset, so the null corpora ``sum_g roll(C^g, s_g) + tail``
keep the data's occupancies and pooled counts and every pair of consecutive tokens inside
a block; only the joins between blocks are cut. This is the random toroidal shift of
spatial statistics (Lotwick and Silverman 1982; its asymptotic exactness for stationary
fields: Wi, Kim, Mrkvicka, Mateu and Park 2026, arXiv:2604.27569), on the one-dimensional
torus of a window's positions, one shift per stretch of stream.

**Test.** The same statistic and Monte Carlo p-value as the permutation test (Besag and
Clifford 1989): ``p = (1 + #{r : S_r >= S}) / (R + 1)``; with R = 39 it rejects at 2.5 %
when ``S`` exceeds all 39 rotated corpora. The cut joins (about K of them) make it
slightly liberal where dependence reaches far; measured on real text and on Markov streams
in docs/calibration.md ("The homogeneity test under dependent tokens").

Power: a positional effect tied to the window grid (a planted position, a drift) is moved
to a different place in each group, so the rotated corpora spread it over the positions;
with K = 64 groups the rotation null keeps the power of one rotation per window
(``benchmarks/bench_pack_homogeneity.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from posstats.counting.window_groups import WindowGroups
from posstats.estimates.permutation import homogeneity_statistic

__all__ = ["rotation_null"]


def rotation_null(
    groups: WindowGroups,
    /,
    *,
    rows: Any = None,
    replicates: int = 39,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """(R,) homogeneity statistics ``S`` of ``replicates`` rotated corpora (module docstring).

    Args:
        groups: the counts by window group.
        rows: the positions (row indices of the (n, V) counts) the statistic is computed
            on, as for the data (default all); each must be occupied.
        replicates: R.
        seed: replicate r draws its K offsets from ``numpy.random.default_rng([seed, r])``.
        progress: called with 1 after each replicate.

    Returns:
        (R,) float64: ``S`` of each rotated corpus, to compare with the data's
        (:func:`posstats.estimates.permutation.monte_carlo_p_value`).
    """
    if replicates < 1:
        msg = f"a rotation null needs at least 1 replicate, got {replicates}"
        raise ValueError(msg)
    out = np.empty(replicates)
    for r in range(replicates):
        shifts = np.random.default_rng([seed, r]).integers(0, groups.positions, groups.groups)
        rotated = groups.rotated(shifts)
        out[r] = homogeneity_statistic(rotated if rows is None else rotated[np.asarray(rows)])
        if progress is not None:
            progress(1)
    return out

