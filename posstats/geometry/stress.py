"""Stress of an encoding against the corpus' Hellinger distances (THEORY.md section 4).

For an encoding ``P`` (n x d, rows p_i) and corpus distances ``h_ij = d_H(i, j)`` (not
squared), with ``e_ij = |p_i - p_j|`` and all sums over the pairs i < j::

    stress        = sum (e - h)^2 / sum h^2                  (the paper's eq. 4)
    scaled_stress = min_a stress(a P) = 1 - (sum e h)^2 / (sum e^2 sum h^2)
    scale         = a* = sum e h / sum e^2
    pearson       = corr(e, h) over the pairs

Everything is blocked over rows: ``e`` is formed for a block of rows at a time, never as an
n x n x d tensor, and the n x n matrix ``e`` is never held whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np  # noqa: F401 - the doctests use it

from posstats.errors import InputError
from posstats.geometry.backend import array_namespace

__all__ = ["StressResult", "pairwise_distances", "projected_stress", "stress_report"]

# One row block holds at most this many entries per temporary (float64: 64 MiB), whatever
# `block` says, so that long contexts do not run the host or the GPU out of memory.
_MAX_BLOCK_ENTRIES = 1 << 23


@dataclass(frozen=True)
class StressResult:
    """Stress of an encoding against corpus distances.

    Attributes:
        stress: raw stress ``sum (e - h)^2 / sum h^2`` (unbounded; dominated by the
            encoding's overall scale).
        scaled_stress: ``min_a stress(a P)``, in [0, 1].
        scale: the minimising factor ``a* = sum e h / sum e^2`` (0 when all e are 0).
        pearson: Pearson correlation of e and h over the pairs; ``nan`` when e or h is
            constant over the pairs (for instance when all e are 0).
        pairs: number of pairs i < j, ``n (n - 1) / 2``.
    """

    stress: float
    scaled_stress: float
    scale: float
    pearson: float
    pairs: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plain values (``nan`` stays a float ``nan``)."""
        return {
            "stress": float(self.stress),
            "scaled_stress": float(self.scaled_stress),
            "scale": float(self.scale),
            "pearson": float(self.pearson),
            "pairs": int(self.pairs),
        }


def _rows_per_block(block: int, n: int) -> int:
    if block < 1:
        msg = f"block must be a positive number of rows, got {block}"
        raise ValueError(msg)
    return max(1, min(int(block), _MAX_BLOCK_ENTRIES // max(n, 1)))


def _centred_float64(encoding: Any, xp: Any) -> tuple[Any, Any]:
    """Rows of ``encoding`` as float64 minus their mean, and their squared norms.

    Distances do not change under translation, and centring shrinks the norms that the Gram
    form ``|a|^2 + |b|^2 - 2 <a, b>`` cancels (ALiBi rows ``i m`` lose half their norm).
    """
    p = xp.asarray(encoding, dtype=xp.float64)
    if p.ndim != 2:
        msg = f"encoding must be 2-D (positions, dim); got shape {tuple(p.shape)}"
        raise ValueError(msg)
    if p.shape[0]:
        p = p - xp.mean(p, axis=0, keepdims=True)
    sq = xp.sum(p * p, axis=1)
    return p, sq


def _distance_block(p: Any, sq: Any, lo: int, hi: int, col_lo: int, xp: Any) -> Any:
    """Euclidean distances between rows ``lo:hi`` and rows ``col_lo:`` of centred ``p``.

    float64 Gram form, negatives (rounding) clipped to 0, and the entries with equal row and
    column index set to exactly 0. Shape (hi - lo, n - col_lo).
    """
    g = p[lo:hi] @ p[col_lo:].T
    e2 = sq[lo:hi, None] + sq[None, col_lo:] - 2.0 * g
    xp.maximum(e2, 0.0, out=e2)
    e = xp.sqrt(e2, out=e2)
    # Diagonal entries (i == j) fall at column i - col_lo of row i - lo.
    first = max(lo, col_lo)
    last = min(hi, p.shape[0])
    if first < last:
        idx = xp.arange(first, last)
        e[idx - lo, idx - col_lo] = 0.0
    return e


def pairwise_distances(encoding: Any, /, *, block: int = 2048, xp: Any = None) -> Any:
    """Euclidean distances between the rows of ``encoding`` (n x d) -> (n x n) float64.

    ``D[i, j] = |p_i - p_j|`` by the float64 Gram form on mean-centred rows, negatives
    clipped to 0. ``D`` is exactly symmetric (each block is mirrored, not recomputed) with
    an exact zero diagonal. ``block`` is the number of rows formed at a time (capped so a
    block has at most 2**23 entries). The output is on the input's device.

    >>> pairwise_distances(np.array([[0.0, 0.0], [3.0, 4.0]])).tolist()
    [[0.0, 5.0], [5.0, 0.0]]
    """
    xp = array_namespace(encoding) if xp is None else xp
    p, sq = _centred_float64(encoding, xp)
    n = p.shape[0]
    out = xp.empty((n, n), dtype=xp.float64)
    rows = _rows_per_block(block, n)
    for lo in range(0, n, rows):
        hi = min(n, lo + rows)
        e = _distance_block(p, sq, lo, hi, lo, xp)
        out[lo:hi, lo:] = e
        out[lo:, lo:hi] = e.T
    return out


class _Moments:
    """Streaming count, means, centred second moments and co-moment of (e, h) (Chan et al.)."""

    def __init__(self) -> None:
        self.count = 0
        self.mean_e = 0.0
        self.mean_h = 0.0
        self.m2_e = 0.0
        self.m2_h = 0.0
        self.c_eh = 0.0

    def add(self, e: Any, h: Any, xp: Any) -> None:
        nb = int(e.shape[0])
        if nb == 0:
            return
        me = float(xp.mean(e))
        mh = float(xp.mean(h))
        de = e - me
        dh = h - mh
        m2e = float(xp.dot(de, de))
        m2h = float(xp.dot(dh, dh))
        ceh = float(xp.dot(de, dh))
        na = self.count
        tot = na + nb
        delta_e = me - self.mean_e
        delta_h = mh - self.mean_h
        w = na * nb / tot
        self.mean_e += delta_e * nb / tot
        self.mean_h += delta_h * nb / tot
        self.m2_e += m2e + delta_e * delta_e * w
        self.m2_h += m2h + delta_h * delta_h * w
        self.c_eh += ceh + delta_e * delta_h * w
        self.count = tot

    def pearson(self) -> float:
        if self.m2_e <= 0.0 or self.m2_h <= 0.0:
            return math.nan
        r = self.c_eh / math.sqrt(self.m2_e * self.m2_h)
        return min(1.0, max(-1.0, r))


def stress_report(encoding: Any, distances: Any, /, *, block: int = 2048, xp: Any = None) -> StressResult:
    """Raw and scaled stress, optimal scale and Pearson r of an encoding against ``d_H``.

    Args:
        encoding: ``P``, shape (n, d), any real dtype (computed in float64).
        distances: ``h = d_H``, shape (n, n), NOT squared; only the upper triangle
            (i < j) is read.
        block: rows of ``e`` formed at a time (also capped at 2**23 entries per block).
        xp: array namespace; inferred from the inputs when None (numpy or cupy).

    Returns:
        :class:`StressResult` with, over the pairs i < j and ``e_ij = |p_i - p_j|``::

            stress        = sum (e - h)^2 / sum h^2
            scaled_stress = 1 - (sum e h)^2 / (sum e^2 sum h^2)     (clipped to [0, 1])
            scale         = sum e h / sum e^2
            pearson       = corr(e, h)

        Degenerate encodings (all e = 0, e.g. every row equal) give ``stress = 1``,
        ``scaled_stress = 1``, ``scale = 0`` and ``pearson = nan``.

    Raises:
        ValueError: shapes do not match or n < 2.
        InputError: all corpus distances are 0 (stress is undefined); an ``InputError`` is
            also a ``ValueError``.

    ``e`` is formed by the float64 Gram form on mean-centred rows (negatives clipped), one
    row block at a time; the sums are float64 and the Pearson moments are merged across
    blocks with the pairwise (Chan) update, so no n x n x d or n x n array is built.

    >>> p = np.array([[0.0], [1.0], [3.0]])
    >>> h = np.abs(p - p.T)
    >>> stress_report(p, h).stress
    0.0
    """
    xp = array_namespace(encoding, distances) if xp is None else xp
    p, sq = _centred_float64(encoding, xp)
    h_all = xp.asarray(distances)
    n = p.shape[0]
    if h_all.ndim != 2 or tuple(h_all.shape) != (n, n):
        msg = f"distances must be (n, n) = ({n}, {n}) to match the encoding; got shape {tuple(h_all.shape)}"
        raise ValueError(msg)
    if n < 2:
        msg = f"stress needs at least 2 positions; got {n}"
        raise ValueError(msg)
    rows = _rows_per_block(block, n)
    s_eh = s_ee = s_hh = s_diff = 0.0
    moments = _Moments()
    for lo in range(0, n, rows):
        hi = min(n, lo + rows)
        e = _distance_block(p, sq, lo, hi, lo, xp)
        # Row lo + a, column lo + b is a pair i < j exactly when b > a.
        upper = xp.triu(xp.ones(e.shape, dtype=bool), k=1)
        ev = e[upper]
        hv = xp.asarray(h_all[lo:hi, lo:], dtype=xp.float64)[upper]
        s_eh += float(xp.dot(ev, hv))
        s_ee += float(xp.dot(ev, ev))
        s_hh += float(xp.dot(hv, hv))
        diff = ev - hv
        s_diff += float(xp.dot(diff, diff))
        moments.add(ev, hv, xp)
    if not math.isfinite(s_hh) or not math.isfinite(s_ee):
        msg = "stress: the encoding or the distances contain non-finite values"
        raise ValueError(msg)
    if s_hh == 0.0:
        msg = f"stress is undefined: all {n * (n - 1) // 2} corpus distances are 0 (every position has the same distribution)"
        raise InputError(msg)
    if s_ee == 0.0:
        scale = 0.0
        scaled = 1.0
    else:
        scale = s_eh / s_ee
        scaled = min(1.0, max(0.0, 1.0 - (s_eh / s_ee) * (s_eh / s_hh)))
    return StressResult(
        stress=s_diff / s_hh,
        scaled_stress=scaled,
        scale=scale,
        pearson=moments.pearson(),
        pairs=n * (n - 1) // 2,
    )


def projected_stress(table: np.ndarray, wq: np.ndarray, wk: np.ndarray, distances: np.ndarray, /, *, heads: int | None = None) -> dict[str, Any]:
    """Stress of the rows of ``P M`` against d_H, for the whole layer and per head.

    Args:
        table: (m, d_in) position rows P (the used positions).
        wq, wk: (out, d_in) query / key weights (``nn.Linear`` form).
        distances: (m, m) d_H.
        heads: number of heads (``out`` must divide evenly), or None for the layer only.

    Returns:
        ``{"stress", "scaled_stress", "heads": [{"stress", "scaled_stress"}, ...] | None,
        "head_mean_stress", "head_mean_scaled_stress"}``.
    """
    if wq.shape != wk.shape or wq.shape[1] != table.shape[1]:
        msg = f"query {wq.shape} / key {wk.shape} weights do not fit a table of width {table.shape[1]}"
        raise InputError(msg)
    s = stress_report(table @ (wq.T @ wk), distances)
    out: dict[str, Any] = {"stress": float(s.stress), "scaled_stress": float(s.scaled_stress), "heads": None,
                           "head_mean_stress": None, "head_mean_scaled_stress": None}
    if heads:
        if wq.shape[0] % heads:
            msg = f"{wq.shape[0]} query dimensions do not split into {heads} heads"
            raise InputError(msg)
        dh = wq.shape[0] // heads
        per = []
        for h in range(heads):
            sl = slice(h * dh, (h + 1) * dh)
            sh = stress_report(table @ (wq[sl].T @ wk[sl]), distances)
            per.append({"stress": float(sh.stress), "scaled_stress": float(sh.scaled_stress)})
        out["heads"] = per
        out["head_mean_stress"] = float(np.mean([p["stress"] for p in per]))
        out["head_mean_scaled_stress"] = float(np.mean([p["scaled_stress"] for p in per]))
    return out
