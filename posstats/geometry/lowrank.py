"""The rank / stress / parameter trade-off of the low-rank MDS encodings ``P_MDS(r)``
(the paper's Table 2): what a model team gives up in stress for a table of ``r(n + d)``
parameters instead of ``n d``. Computed here; the export's model card and report.html
draw it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from posstats.geometry.stress import stress_report

__all__ = ["default_ranks", "lowrank_tradeoff"]


def default_ranks(k: int, /, *, width: int | None = None, extra: Sequence[int] = ()) -> list[int]:
    """Ranks for the low-rank trade-off: 1..8, then powers of two, plus ``extra``, up to
    ``min(k, width)``.

    >>> default_ranks(20, width=16, extra=(11,))
    [1, 2, 3, 4, 5, 6, 7, 8, 11, 16]
    """
    top = k if width is None else min(k, width)
    ranks = set(range(1, min(8, top) + 1))
    p = 16
    while p <= top:
        ranks.add(p)
        p *= 2
    ranks.update(int(r) for r in extra if r is not None and 1 <= int(r) <= top)
    if top >= 1:
        ranks.add(top)
    return sorted(ranks)


def lowrank_tradeoff(
    encoding: np.ndarray, distances: np.ndarray, /, *, width: int, ranks: Sequence[int] | None = None, n: int | None = None
) -> list[dict[str, Any]]:
    """Stress and parameter count of the rank-r MDS encodings (the paper's Table 2).

    ``P_MDS(r)`` = the first r columns of ``encoding``; embedded in width ``width`` with an
    orthonormal map its distances, and so its stress, do not change. It costs ``r(n + d)``
    parameters (``P = A W^T``) instead of ``n d``.

    Args:
        encoding: (m, k) MDS coordinates of the positions ``distances`` is about.
        distances: (m, m) d_H.
        width: model width d.
        ranks: ranks to evaluate (default :func:`default_ranks`); each must be <= k.
        n: positions for the parameter count (default m; pass the full count when
            ``encoding`` and ``distances`` are a subsample).

    Returns:
        One dict per rank: ``rank``, ``stress``, ``scaled_stress``, ``parameters``
        (``r(n + d)``), ``free_parameters`` (``n d``), ``saving`` (``1 - r(n+d)/(n d)``);
        none when every corpus distance is 0 (stress is then undefined).
    """
    enc = np.asarray(encoding, dtype=np.float64)
    m, k = enc.shape
    if not np.any(np.asarray(distances)):
        return []  # every corpus distance is 0: stress is 0/0 at every rank (no structure to trade off)
    n = m if n is None else int(n)
    ranks = default_ranks(k, width=width) if ranks is None else [int(r) for r in ranks]
    rows = []
    for r in ranks:
        if not 1 <= r <= k:
            msg = f"rank {r} is outside 1..{k} (the MDS coordinates available)"
            raise ValueError(msg)
        s = stress_report(enc[:, :r], distances)
        params = r * (n + width)
        rows.append({
            "rank": r,
            "stress": float(s.stress),
            "scaled_stress": float(s.scaled_stress),
            "parameters": params,
            "free_parameters": n * width,
            "saving": 1.0 - params / (n * width),
        })
    return rows
