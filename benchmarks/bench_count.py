"""Counting-kernel benchmark: tokens/s of posstats' dense kernel vs plain ``np.add.at``.

Run: ``python benchmarks/bench_count.py [--positions 8192 --vocab 50257 --tokens 50000000]``

Prints one JSON object. Tokens are Zipf-distributed (exponent 1.1) over the vocabulary,
documents have lengths drawn around the window size, mode ``truncate``. Both methods run on
the same batch, in this process, into pre-touched accumulators (first-touch page faults of
the n x V array are a one-off cost, reported separately as ``alloc_s``). The baseline is
the textbook ``np.add.at(C, (positions, tokens), 1)``; ``flat_add_at`` is the best plain
numpy variant, reported for transparency.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np

from posstats.counting.counts import CountAccumulator, CountSpec
from posstats.counting.tokens import TokenBatch


def zipf_batch(tokens: int, positions: int, vocab: int, seed: int) -> TokenBatch:
    """Seeded documents of Zipf tokens, lengths uniform in [positions/2, 3*positions/2]."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(positions // 2, 3 * positions // 2 + 1, size=tokens // positions + 1)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = (rng.zipf(1.1, size=int(offsets[-1])) - 1) % vocab
    return TokenBatch(values.astype(np.int64), offsets, "<zipf>", 0)


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--positions", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--tokens", type=int, default=40_000_000, help="approximate tokens per batch")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n, V = args.positions, args.vocab
    batch = zipf_batch(args.tokens, n, V, args.seed)
    spec = CountSpec(n, V)

    t = time.perf_counter()
    acc = CountAccumulator(spec, dense=True)
    acc._matrix.fill(0)  # pre-touch the pages so the timing is the kernel, not page faults
    alloc_s = time.perf_counter() - t
    counted = acc.add(batch)  # warm-up, also gives the number of counted tokens
    kernel_s = best_of(lambda: acc.add(batch), args.repeats)

    # Baseline: the positions/tokens a plain implementation would build, then np.add.at.
    lengths = np.diff(batch.offsets)
    pos = np.arange(len(batch.values)) - np.repeat(batch.offsets[:-1], lengths)
    mask = pos < n
    pos, tok = pos[mask], batch.values[mask]
    C = np.zeros((n, V), dtype=np.int64)
    C.fill(0)
    baseline_s = best_of(lambda: np.add.at(C, (pos, tok), 1), args.repeats)
    # Same counts: the kernel ran 1 + repeats times, the baseline repeats times.
    r = args.repeats
    identical = all(
        np.array_equal(acc._matrix[i : i + 256] * r, C[i : i + 256] * (r + 1)) for i in range(0, n, 256)
    )
    flat = C.reshape(-1)
    keys = pos * V + tok
    flat_s = best_of(lambda: np.add.at(flat, keys, 1), args.repeats)

    report = {
        "benchmark": "count_kernel",
        "positions": n,
        "vocab": V,
        "tokens_counted_per_run": int(counted),
        "kernel_tokens_per_s": counted / kernel_s,
        "baseline_np_add_at_2d_tokens_per_s": counted / baseline_s,
        "flat_add_at_tokens_per_s (index prebuilt)": counted / flat_s,
        "speedup_vs_baseline": baseline_s / kernel_s,
        "identical_counts": identical,
        "kernel_includes": "id validation, positions, keys, exact int64 scatter",
        "alloc_s": alloc_s,
        "machine": platform.machine(),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
