"""Benchmark: exact monotonicity violation rate (O(n^2 log n) inversion counting) at large n,
against a direct per-anchor O(n^2) count at a smaller n, and the sampled estimate, in one process.

    python benchmarks/bench_monotonicity.py [--n 8192 --dim 64 --baseline-n 768 --seed 0]

Prints one JSON object:
- exact_s: wall seconds of ``monotonicity_violation_rate`` (exact) on an (n x n) distance
  matrix with n = --n (exact_cpu_s: process CPU seconds, less sensitive to a busy machine);
  exact_encoding_s: ``monotonicity_of_encoding`` on the (n x dim) encoding itself (distance
  rows formed on the fly); both must give the same count.
- baseline_s / fast_s: the direct per-anchor count (an (n x n) boolean comparison per anchor,
  O(n^3) in all) and the exact method at n = --baseline-n, their counts checked equal;
  speedup = baseline_s / fast_s; baseline_extrapolated_s: baseline_s * (n / baseline_n)^3.
- sampled_s, sampled_rate, ci95: the sampled method at n (2,000,000 triples), and whether
  the exact rate lies in its interval.

The encoding is a seeded random Gaussian one plus a slowly drifting sinusoidal component, so
the rate is well below 0.5 (neither trivially monotone nor random) and has few ties.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from posstats.geometry.diagnostics import (
    monotonicity_of_encoding,
    monotonicity_violation_rate,
)
from posstats.geometry.encodings import random_encoding, sinusoidal
from posstats.geometry.stress import pairwise_distances


def direct_counts(dist: np.ndarray, pos: np.ndarray) -> tuple[int, int]:
    """(violations, triples) by comparing all pairs per anchor: O(n^2) memory and time per anchor."""
    n = pos.shape[0]
    idx = np.arange(n)
    violations = triples = 0
    for i in range(n):
        s = np.abs(pos - pos[i])
        valid = (s[:, None] < s[None, :]) & (idx[:, None] != i) & (idx[None, :] != i)
        triples += int(np.count_nonzero(valid))
        violations += int(np.count_nonzero(valid & (dist[i][:, None] > dist[i][None, :])))
    return violations, triples


def make_encoding(n: int, dim: int, seed: int) -> np.ndarray:
    return sinusoidal(n, dim, base=4.0 * n) * 3.0 + random_encoding(n, dim, seed=seed)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--baseline-n", type=int, default=768)
    parser.add_argument("--samples", type=int, default=2_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    # Baseline against the exact method at a size where the direct count is affordable.
    small = make_encoding(args.baseline_n, args.dim, args.seed)
    d_small = pairwise_distances(small)
    pos_small = np.arange(args.baseline_n)
    t0 = time.perf_counter()
    direct = direct_counts(d_small, pos_small)
    baseline_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    fast = monotonicity_violation_rate(d_small, exact_limit=args.baseline_n)
    fast_s = time.perf_counter() - t0
    if (fast.violations, fast.triples) != direct:
        msg = f"exact method disagrees with the direct count: {(fast.violations, fast.triples)} != {direct}"
        raise AssertionError(msg)

    enc = make_encoding(args.n, args.dim, args.seed)
    dist = pairwise_distances(enc)
    t0, c0 = time.perf_counter(), time.process_time()
    exact = monotonicity_violation_rate(dist, exact_limit=args.n)
    exact_s, exact_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    t0 = time.perf_counter()
    exact_enc = monotonicity_of_encoding(enc, exact_limit=args.n)
    exact_encoding_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    sampled = monotonicity_violation_rate(dist, exact_limit=args.n - 1, samples=args.samples, seed=args.seed)
    sampled_s = time.perf_counter() - t0

    result = {
        "n": args.n,
        "dim": args.dim,
        "triples": exact.triples,
        "violations": exact.violations,
        "rate": exact.rate,
        "exact_s": round(exact_s, 3),
        "exact_cpu_s": round(exact_cpu_s, 3),
        "exact_encoding_s": round(exact_encoding_s, 3),
        "encoding_path_agrees": exact_enc.violations == exact.violations and exact_enc.triples == exact.triples,
        "baseline_n": args.baseline_n,
        "baseline_s": round(baseline_s, 3),
        "fast_s": round(fast_s, 4),
        "speedup": round(baseline_s / fast_s, 1),
        "baseline_extrapolated_s": round(baseline_s * (args.n / args.baseline_n) ** 3, 1),
        "sampled_s": round(sampled_s, 3),
        "samples": sampled.triples,
        "sampled_rate": sampled.rate,
        "ci95": [sampled.ci_low, sampled.ci_high],
        "exact_in_ci": sampled.ci_low <= exact.rate <= sampled.ci_high,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
