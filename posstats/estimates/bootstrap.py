"""Shard bootstrap: confidence intervals from per-shard partial counts (THEORY.md section 7).

Counts are additive, so a corpus is the sum of its shards' partial counts ``C = sum_s C_s``
(:mod:`posstats.corpus.shard_store` keeps them). A bootstrap replicate resamples the S shards with
replacement, i.e. draws multiplicities ``w ~ Multinomial(S, 1/S)`` and recomputes every
statistic on ``C* = sum_s w_s C_s`` (exact integers). Shards, not tokens, are the unit:
tokens of one document (and documents of one shard) are dependent, and resampling whole
shards keeps that dependence, so the spread of the replicates is the sampling uncertainty
of a corpus drawn shard by shard.

Intervals. A replicate repeats shards, so its counts are noisier than the corpus' (about
twice the multinomial variance) and every plug-in quantity that sampling noise pushes
up (eigenvalues, ``d_H``) is pushed up further in the replicates: percentile intervals
would sit above the estimate. For a statistic with a full-corpus estimate ``t`` we
therefore report the basic (reverse-percentile) interval
``[2 t - q_97.5, 2 t - q_2.5]``, which removes such a shift to first order; integer
counts (rank, components above the null) get plain percentile intervals.

Per replicate: the top-k MDS eigenvalues (:func:`posstats.geometry.mds.classical_mds`), the numerical
rank, the number of eigenvalues above a given null threshold, the mean ``d_H``, and the
raw and scaled stress of each given encoding (a fixed matrix, or ``int d`` for the
replicate's own MDS encoding at width d) against the replicate's distances.

Positions whose replicate occupancy is 0 are left out of that replicate (counted in
``dropped``); with few shards and sparse deep positions, bucket first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from posstats.counting.counts import PositionalCounts
from posstats.geometry.hellinger import hellinger_sq
from posstats.geometry.mds import classical_mds
from posstats.geometry.stress import stress_report

__all__ = ["BootstrapResult", "resample_counts", "shard_bootstrap"]


def _interval(x: np.ndarray, axis: int = 0) -> np.ndarray:
    """Percentile interval (2, ...): rows 2.5 % and 97.5 %."""
    if x.size == 0 or np.all(np.isnan(x)):
        return np.full((2, *x.shape[1:]), np.nan) if x.ndim > 1 else np.full(2, np.nan)
    return np.nanpercentile(x, [2.5, 97.5], axis=axis)


def _basic(estimate: Any, x: np.ndarray) -> np.ndarray:
    """Basic (reverse-percentile) interval ``[2 t - q97.5, 2 t - q2.5]``."""
    q = _interval(x)
    t = np.asarray(estimate, dtype=np.float64)
    return np.stack([2 * t - q[1], 2 * t - q[0]])


@dataclass(frozen=True)
class BootstrapResult:
    """Replicates and 95 % percentile intervals of a shard bootstrap.

    Attributes:
        replicates: B.
        shards: S, the resampled units.
        eigenvalues: (B, k) top-k eigenvalues per replicate (NaN-padded).
        rank: (B,) numerical rank (eigenvalues > rank_rtol * largest) per replicate.
        above_null: (B,) eigenvalues above ``null_threshold`` (or None without one).
        mean_distance: (B,) mean off-diagonal ``d_H`` per replicate.
        stress, scaled_stress: name -> (B,) per replicate.
        dropped: (B,) positions left out (zero occupancy in the replicate).
    """

    replicates: int
    shards: int
    eigenvalues: np.ndarray
    rank: np.ndarray
    above_null: np.ndarray | None
    mean_distance: np.ndarray
    stress: dict[str, np.ndarray] = field(default_factory=dict)
    scaled_stress: dict[str, np.ndarray] = field(default_factory=dict)
    dropped: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    estimates: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready 95 % intervals (NaN becomes None)."""

        def pair(v: np.ndarray) -> list[float | None]:
            return [None if not math.isfinite(float(x)) else float(x) for x in v]

        est = self.estimates
        eig = _basic(est["eigenvalues"], self.eigenvalues) if self.eigenvalues.size else np.zeros((2, 0))
        out: dict[str, Any] = {
            "replicates": int(self.replicates),
            "shards": int(self.shards),
            "interval": "basic bootstrap (2 t - q97.5, 2 t - q2.5); percentile for integer counts",
            "eigenvalues_ci95": [pair(eig[:, c]) for c in range(eig.shape[1])],
            "rank_ci95": pair(_interval(self.rank.astype(np.float64))),
            "mean_d_h_ci95": pair(_basic(est["mean_distance"], self.mean_distance)),
            "stress_ci95": {k: pair(_basic(est["stress"][k], v)) for k, v in self.stress.items()},
            "scaled_stress_ci95": {
                k: pair(np.clip(_basic(est["scaled_stress"][k], v), 0.0, 1.0)) for k, v in self.scaled_stress.items()
            },
            "positions_dropped_max": int(self.dropped.max()) if self.dropped.size else 0,
        }
        if self.above_null is not None:
            out["components_above_null_ci95"] = pair(_interval(self.above_null.astype(np.float64)))
        return out


def _stack(partials: Sequence[PositionalCounts]) -> tuple[sp.csr_array, int, int]:
    """Partials as one (S, n * V) sparse matrix of flattened counts."""
    n, v = partials[0].positions, partials[0].vocab_size
    rows, keys, vals = [], [], []
    for s, p in enumerate(partials):
        if p.positions != n or p.vocab_size != v:
            msg = "every partial must have the same number of positions and vocabulary"
            raise ValueError(msg)
        coo = p.to_sparse().matrix.tocoo()
        keys.append(coo.row.astype(np.int64) * v + coo.col.astype(np.int64))
        vals.append(coo.data.astype(np.int64))
        rows.append(np.full(coo.nnz, s, dtype=np.int64))
    stacked = sp.csr_array(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(keys))), shape=(len(partials), n * v), dtype=np.int64
    )
    return stacked, n, v


def resample_counts(stacked: sp.csr_array, weights: np.ndarray, n: int, v: int) -> sp.csr_array:
    """``sum_s weights[s] * C_s`` as an (n, V) int64 CSR matrix (exact)."""
    w = sp.csr_array(np.asarray(weights, dtype=np.int64)[None, :])
    flat = (w @ stacked).tocoo()
    r, c = np.divmod(flat.col.astype(np.int64), v)
    out = sp.csr_array((flat.data.astype(np.int64), (r, c)), shape=(n, v), dtype=np.int64)
    out.sum_duplicates()
    return out


def _checked_encodings(encodings: Mapping[str, Any] | None, m: int) -> dict[str, Any]:
    """``encodings`` as a dict, each an int d or an (m, d) matrix (``ValueError`` otherwise)."""
    encodings = dict(encodings or {})
    for name, enc in encodings.items():
        if not isinstance(enc, (int, np.integer)) and np.shape(enc)[0] != m:
            msg = f"encoding {name!r} has {np.shape(enc)[0]} rows, not {m}"
            raise ValueError(msg)
    return encodings


@dataclass(frozen=True)
class _ReplicateOptions:
    """What every replicate computes (the keywords of :func:`shard_bootstrap`)."""

    k: int
    rank_rtol: float
    null_threshold: float | None
    distance_limit: int
    seed: int
    encodings: dict[str, Any]

    @property
    def max_dim(self) -> int:
        """The widest replicate MDS encoding asked for (an int d in ``encodings``), else 0."""
        return max([int(e) for e in self.encodings.values() if isinstance(e, (int, np.integer))], default=0)


@dataclass(frozen=True)
class _Replicate:
    """The statistics of one replicate (None / empty where not computed).

    Attributes:
        dropped: positions with zero occupancy in the replicate.
        eigenvalues: (kk,) top MDS eigenvalues, descending (None with < 3 positions left).
        rank: ``#{lambda > rank_rtol * lambda_1}`` (0 when ``lambda_1 <= 0``).
        above_null: ``#{lambda > null_threshold}`` (None without a threshold).
        mean_distance: mean off-diagonal ``d_H`` (None above ``distance_limit`` positions).
        stress, scaled_stress: name -> raw / scaled stress of that encoding.
    """

    dropped: int
    eigenvalues: np.ndarray | None = None
    rank: int = 0
    above_null: int | None = None
    mean_distance: float | None = None
    stress: dict[str, float] = field(default_factory=dict)
    scaled_stress: dict[str, float] = field(default_factory=dict)


def _spectrum_counts(lam: np.ndarray, opts: _ReplicateOptions) -> tuple[int, int | None]:
    """``(rank, above_null)`` of eigenvalues ``lam`` (descending): the numerical rank
    ``#{lambda > rank_rtol * lambda_1}`` (0 when ``lambda_1 <= 0``) and
    ``#{lambda > null_threshold}`` (None without a threshold).

    >>> _spectrum_counts(np.array([4.0, 1.0, 0.0]), _ReplicateOptions(2, 0.1, 0.5, 10, 0, {}))
    (2, 2)
    """
    rank = int(np.count_nonzero(lam > opts.rank_rtol * lam[0])) if lam[0] > 0 else 0
    above = None if opts.null_threshold is None else int(np.count_nonzero(lam > opts.null_threshold))
    return rank, above


def _distance_stats(counts: sp.csr_array, encoding: np.ndarray, keep: np.ndarray,
                    opts: _ReplicateOptions) -> tuple[float, dict[str, float], dict[str, float]]:
    """Mean off-diagonal ``d_H`` of the (m', V) replicate counts, and each encoding's raw
    and scaled stress against those distances: an int d is the replicate's own MDS
    ``encoding[:, :d]``, a matrix is restricted to the kept rows ``keep`` (m',)."""
    d = np.sqrt(hellinger_sq(counts))
    mean_d = float(d[~np.eye(keep.size, dtype=bool)].mean())
    stress, scaled = {}, {}
    for name, enc in opts.encodings.items():
        p = encoding[:, : int(enc)] if isinstance(enc, (int, np.integer)) else np.asarray(enc)[keep]
        r = stress_report(p, d)
        stress[name], scaled[name] = r.stress, r.scaled_stress
    return mean_d, stress, scaled


def _replicate(counts: sp.csr_array, opts: _ReplicateOptions) -> _Replicate:
    """The statistics of one replicate's (m, V) counts of the geometry rows.

    Rows with zero occupancy are dropped; with fewer than 3 left, nothing else is
    computed. MDS (dense up to 2048 rows, else Lanczos) keeps ``max(k, max_dim)``
    eigenpairs; distances and stress only up to ``distance_limit`` rows.
    """
    m = int(counts.shape[0])
    keep = np.flatnonzero(np.asarray(counts.sum(axis=1)).ravel() > 0)
    if keep.size < 3:
        return _Replicate(dropped=m - keep.size)
    counts = counts[keep]
    kk = min(max(opts.k, opts.max_dim), keep.size - 1)
    method = "dense" if keep.size <= 2048 else "lanczos"
    mds = classical_mds(counts, k=kk, method=method, seed=opts.seed)
    lam = mds.eigenvalues
    rank, above = _spectrum_counts(lam, opts)
    if keep.size > opts.distance_limit:
        return _Replicate(m - keep.size, lam, rank, above)
    mean_d, stress, scaled = _distance_stats(counts, mds.encoding, keep, opts)
    return _Replicate(m - keep.size, lam, rank, above, mean_d, stress, scaled)


@dataclass(frozen=True)
class _Table:
    """Per-replicate statistics of B replicates (the arrays of :class:`BootstrapResult`),
    filled row by row by :meth:`record`; NaN (0 for counts) where not computed."""

    eigenvalues: np.ndarray
    rank: np.ndarray
    above_null: np.ndarray | None
    mean_distance: np.ndarray
    stress: dict[str, np.ndarray]
    scaled_stress: dict[str, np.ndarray]
    dropped: np.ndarray

    @classmethod
    def empty(cls, b: int, k: int, names: Mapping[str, Any], *, with_null: bool) -> _Table:
        """B rows: eigenvalues (B, k) NaN, rank (B,) 0, above_null (B,) 0 or None,
        mean_distance (B,) NaN, stress / scaled_stress name -> (B,) NaN, dropped (B,) 0."""
        return cls(
            np.full((b, k), np.nan),
            np.zeros(b, dtype=np.int64),
            np.zeros(b, dtype=np.int64) if with_null else None,
            np.full(b, np.nan),
            {name: np.full(b, np.nan) for name in names},
            {name: np.full(b, np.nan) for name in names},
            np.zeros(b, dtype=np.int64),
        )

    def record(self, b: int, rep: _Replicate) -> None:
        """Row b from one replicate's statistics (the top k eigenvalues, NaN-padded)."""
        self.dropped[b] = rep.dropped
        if rep.eigenvalues is None:
            return
        k = int(self.eigenvalues.shape[1])
        self.eigenvalues[b, : min(k, rep.eigenvalues.size)] = rep.eigenvalues[:k]
        self.rank[b] = rep.rank
        if self.above_null is not None:
            self.above_null[b] = rep.above_null
        if rep.mean_distance is None:
            return
        self.mean_distance[b] = rep.mean_distance
        for name in self.stress:
            self.stress[name][b] = rep.stress[name]
            self.scaled_stress[name][b] = rep.scaled_stress[name]

    def estimates(self) -> dict[str, Any]:
        """Row 0 as the full-corpus estimates of :attr:`BootstrapResult.estimates`."""
        return {
            "eigenvalues": self.eigenvalues[0],
            "mean_distance": float(self.mean_distance[0]),
            "stress": {name: float(x[0]) for name, x in self.stress.items()},
            "scaled_stress": {name: float(x[0]) for name, x in self.scaled_stress.items()},
        }


def shard_bootstrap(
    partials: Sequence[PositionalCounts],
    /,
    *,
    replicates: int = 200,
    k: int = 16,
    positions: Any = None,
    encodings: Mapping[str, Any] | None = None,
    rank_rtol: float = 1e-10,
    null_threshold: float | None = None,
    distance_limit: int = 4096,
    seed: int = 0,
) -> BootstrapResult:
    """Bootstrap the geometry over shards (module docstring).

    Args:
        partials: the S per-shard partial counts (S >= 2), same spec.
        replicates: B.
        k: eigenvalues kept per replicate.
        positions: rows in the geometry (default: rows occupied in the full corpus).
        encodings: name -> (m, d) fixed encoding of those rows, or an int d for the
            replicate's own MDS encoding at width d (stress needs m <= distance_limit).
        rank_rtol: tolerance of the numerical rank.
        null_threshold: eigenvalue threshold of a null (:func:`posstats.estimates.noise.null_rank`).
        distance_limit: the largest m with distances (mean d_H, stress) per replicate.
        seed: seeds the resampling.

    Returns:
        :class:`BootstrapResult`.
    """
    if len(partials) < 2:
        msg = f"a shard bootstrap needs at least two partials, got {len(partials)}"
        raise ValueError(msg)
    stacked, n, v = _stack(partials)
    full = resample_counts(stacked, np.ones(len(partials), dtype=np.int64), n, v)
    occ_full = np.asarray(full.sum(axis=1)).ravel()
    rows = np.flatnonzero(occ_full > 0) if positions is None else np.asarray(positions, dtype=np.int64)
    encodings = _checked_encodings(encodings, rows.size)
    opts = _ReplicateOptions(k, rank_rtol, null_threshold, distance_limit, seed, encodings)
    s_count = len(partials)
    full_table = _Table.empty(1, k, encodings, with_null=False)
    full_table.record(0, _replicate(full[rows], opts))
    table = _Table.empty(replicates, k, encodings, with_null=null_threshold is not None)
    rng = np.random.default_rng(seed)
    for b in range(replicates):
        w = rng.multinomial(s_count, np.full(s_count, 1.0 / s_count))
        table.record(b, _replicate(resample_counts(stacked, w, n, v)[rows], opts))
    return BootstrapResult(replicates, s_count, table.eigenvalues, table.rank, table.above_null,
                           table.mean_distance, table.stress, table.scaled_stress, table.dropped,
                           full_table.estimates())
