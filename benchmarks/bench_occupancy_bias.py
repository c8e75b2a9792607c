"""Benchmark: the corrected distance between positions of unequal occupancy.

    python benchmarks/bench_occupancy_bias.py [--vocab 5000,50257] [--pairs 200:2000,2000:20000,6300:184000]
        [--counts runs/c]

posstats corrects the plug-in ``d_H^2 = |s_hat_i - s_hat_j|^2`` by each position's unbiased
sampling variance ``b_i`` (docs/calibration.md, "The bias correction"). That leaves

    E[d_hat^2] - d^2 = |E s_hat_i - E s_hat_j|^2 - |s_i - s_j|^2

which is 0 for identical distributions *at equal occupancy* (every cell of the calibration
grid), but not when the occupancies differ: ``E sqrt(X / N)`` for a token seen about once
or less depends on N (the square root shrinks rare tokens the more, the fewer tokens a
position has), so two positions with the same distribution and occupancies N_1 != N_2 are
apart by ``sum_v (E sqrt(X_1 / N_1) - E sqrt(X_2 / N_2))^2`` in expectation. In truncate mode
occupancy falls along the context (every document reaches position 0, few reach n - 1), so
this spurious distance grows with the distance between positions, like real drift.

Two parts, printed as one JSON object:

- ``exact``: for each vocabulary (Zipf 1.1, the calibration suite's base) and occupancy
  pair, the expected corrected ``d_H^2`` between two samples of the one distribution, by
  exact binomial sums (no simulation), against the true 0; and, for scale, the true
  ``d_H^2`` of the calibration suite's drift 16 positions apart (n = 64).
- ``counts`` (with ``--counts DIR``, a counts folder): on a real corpus, the corrected
  geometry as posstats computes it against the same geometry with each position's
  expected shrinkage under the pooled distribution removed (``x_i = s_hat_i - m(N_i)``,
  ``m_v(N) = E sqrt(X / N) - sqrt(p_v)``, ``X ~ Binomial(N, p_v)`` with p the pooled
  distribution: exactly unbiased for positions that share it, and no change at equal
  occupancy): the top eigenvalues and the correlation of the top eigenvector with log
  occupancy, each (``--rows-step`` k: every k-th used position, so that the dense
  (m, V) arrays fit).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from scipy.stats import binom


def expected_sqrt(p: np.ndarray, n: int, /) -> np.ndarray:
    """(V,) ``E sqrt(X / n)`` for ``X ~ Binomial(n, p_v)``: exact sums where the mean count
    is below 60 (up to 200 counts, whose tail is negligible there), else
    ``sqrt(p) (1 - (1 - p) / (8 n p))``, the delta method's second order (error O(1/(np)^2))."""
    out = np.sqrt(p) * (1.0 - (1.0 - p) / (8.0 * np.maximum(n * p, 1e-300)))
    small = n * p < 60
    k = np.arange(min(n, 200) + 1)
    out[small] = (binom.pmf(k[None, :], n, p[small][:, None]) * np.sqrt(k)[None, :]).sum(axis=1) / np.sqrt(n)
    return out


def zipf(vocab: int, exponent: float = 1.1) -> np.ndarray:
    """The calibration suite's base distribution (``posstats.testing.known_corpus``)."""
    p = np.arange(1, vocab + 1, dtype=np.float64) ** -exponent
    return p / p.sum()


def exact_rows(vocabs: list[int], pairs: list[tuple[int, int]]) -> list[dict]:
    """The expected corrected distance between identical distributions, per pair."""
    from posstats.testing import known_corpus

    rows = []
    for vocab in vocabs:
        p = zipf(vocab)
        drift = known_corpus("drift", 64, tokens=1, seed=0, vocab=vocab) if vocab == 5000 else None
        scale = None if drift is None else float(np.sum((np.sqrt(drift.mu(0)) - np.sqrt(drift.mu(16))) ** 2))
        for n1, n2 in pairs:
            bias = float(np.sum((expected_sqrt(p, n1) - expected_sqrt(p, n2)) ** 2))
            rows.append({"vocab": vocab, "occupancies": [n1, n2], "true_d2": 0.0, "expected_corrected_d2": bias,
                         **({"drift_16_apart_true_d2": scale} if scale is not None else {})})
    return rows


def counts_rows(path: str, step: int) -> dict:
    """The corrected geometry of a counts folder with and without the expected shrinkage."""
    import scipy.sparse as sp

    from posstats.counting.io import load_counts
    from posstats.estimates.sampling_variance import position_sampling_variance

    counts = load_counts(path)
    rows = sp.csr_array(counts.matrix)
    occ = np.asarray(rows.sum(axis=1)).ravel()
    pooled = np.asarray(rows.sum(axis=0)).ravel().astype(np.float64)
    p = pooled / pooled.sum()
    keep = np.flatnonzero(occ > 0)[::step]
    rows, occ = rows[keep], occ[keep]
    s = np.sqrt((rows.astype(np.float64) / occ[:, None].astype(np.float64)).toarray())
    b = position_sampling_variance(rows)
    grid = {int(n): expected_sqrt(p, int(n)) - np.sqrt(p) for n in np.unique(occ)}
    shrink = np.stack([grid[int(n)] for n in occ])
    out = {"counts": path, "rows": int(keep.size), "rows_step": step, "occupancy": [int(occ.min()), int(occ.max())]}
    for name, x in (("posstats", s), ("shrinkage_removed", s - shrink)):
        g = x @ x.T
        sq = np.diag(g)
        d = sq[:, None] + sq[None, :] - 2.0 * g - b[:, None] - b[None, :]
        np.fill_diagonal(d, 0.0)
        h = np.eye(len(d)) - 1.0 / len(d)
        w, u = np.linalg.eigh(-0.5 * h @ d @ h)
        out[name] = {"top_eigenvalues": [round(float(v), 4) for v in w[::-1][:4]],
                     "top_vector_vs_log_occupancy": round(float(np.corrcoef(u[:, -1], np.log(occ))[0, 1]), 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", default="5000,50257")
    ap.add_argument("--pairs", default="200:2000,500:1000,2000:4000,2000:20000,20000:40000,6300:184000")
    ap.add_argument("--counts", default=None, help="a counts folder to measure the geometry of")
    ap.add_argument("--rows-step", type=int, default=1, help="with --counts: every k-th used position")
    args = ap.parse_args()
    t = time.perf_counter()
    pairs = [tuple(int(x) for x in pair.split(":")) for pair in args.pairs.split(",")]
    out = {"benchmark": "occupancy_bias", "exact": exact_rows([int(v) for v in args.vocab.split(",")], pairs)}
    if args.counts:
        out["counts"] = counts_rows(args.counts, max(1, args.rows_step))
    out["seconds"] = round(time.perf_counter() - t, 1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
