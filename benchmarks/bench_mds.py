"""Benchmark: top-k classical MDS, iterative (Lanczos on the implicit centred operator)
against dense (squared Hellinger matrix, double centring, LAPACK eigh), in one process.

    python benchmarks/bench_mds.py [--n 4096 --vocab 50257 --k 64 --docs 500,1000,2000,4000]

Prints one JSON object with one row per corpus size (``corpora``): nnz of S, dense_s (with
its parts hellinger_s and eigh_s), iterative_s, speedup (dense_s / iterative_s),
max_rel_err (largest relative difference of the top-k eigenvalues between the two
methods) and the iterative residuals; ``target_5x_met_up_to_nnz`` is the largest nnz at
which the iterative method ran at least 5x faster.

The corpora are synthetic and seeded: Zipf-like token frequencies, documents whose lengths
are log-normal (so occupancy falls with depth), a distinctive first position, and a mix of
"topics" (Zipf distributions over random token subsets) whose weights drift smoothly with
log position. Counts are sampled, so the spectrum has a few planted directions on top of a
sampling-noise bulk, as real corpora do: the top-64 lie mostly in that bulk, where Lanczos
needs ~7k products, each two passes over the nnz of S. The dense method's cost barely
depends on nnz (its O(n^3) eigh dominates), the iterative one's grows with it: the rows
show where the two cross. Wall-clock times on a shared machine vary with its load
(reported). The iterative solver runs ARPACK on one BLAS thread when threadpoolctl is
installed, and its sparse products on ``product_threads`` threads (reported).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import scipy.sparse as sp

from posstats.geometry.hellinger import hellinger_sq
from posstats.geometry.mds import classical_mds
from posstats.geometry.products import product_threads


def _zipf_cdf(size: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    p = 1.0 / (np.arange(size) + 2.7) ** exponent
    rng.shuffle(p[50:])  # keep the head, scramble the tail a little
    cdf = np.cumsum(p)
    return cdf / cdf[-1]


def make_counts(n: int, vocab: int, *, seed: int = 0, docs: int = 4000, topics: int = 24) -> sp.csr_array:
    """Seeded (n, vocab) sparse int64 positional counts with positional structure."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(np.exp(rng.normal(np.log(n / 2), 1.0, size=docs)).astype(np.int64) + 1, n)
    occ = (lengths[None, :] > np.arange(n)[:, None]).sum(axis=1)  # documents reaching position i
    occ = np.maximum(occ, 1)

    t = np.log1p(np.arange(n)) / np.log1p(n)  # log-position in [0, 1)
    centres = rng.uniform(0.0, 1.0, topics)
    widths = rng.uniform(0.05, 0.3, topics)
    strength = rng.uniform(0.5, 3.0, topics)
    logits = strength[None, :] * np.exp(-0.5 * ((t[:, None] - centres[None, :]) / widths[None, :]) ** 2)
    weights = np.concatenate([np.full((n, 1), 2.0), np.exp(logits) - 1.0], axis=1)
    weights[0] = 0.0
    weights[0, -1] = 1.0  # position 0: a distribution of its own (document openings)
    weights /= weights.sum(axis=1, keepdims=True)

    base_cdf = _zipf_cdf(vocab, 1.07, rng)
    comp_tokens = [np.arange(vocab)]
    comp_cdfs = [base_cdf]
    for _ in range(topics):
        support = rng.choice(vocab, size=min(vocab, 4000), replace=False)
        comp_tokens.append(support)
        comp_cdfs.append(_zipf_cdf(support.size, 1.2, rng))

    per_comp = np.stack([rng.multinomial(o, w) for o, w in zip(occ, weights, strict=True)])  # (n, comps)
    rows, cols = [], []
    for c, (tokens, cdf) in enumerate(zip(comp_tokens, comp_cdfs, strict=True)):
        m = per_comp[:, c]
        draws = np.searchsorted(cdf, rng.random(int(m.sum())), side="right")
        rows.append(np.repeat(np.arange(n), m))
        cols.append(tokens[np.minimum(draws, tokens.size - 1)])
    rows_a, cols_a = np.concatenate(rows), np.concatenate(cols)
    counts = sp.coo_array((np.ones(rows_a.size, dtype=np.int64), (rows_a, cols_a)), shape=(n, vocab))
    return counts.tocsr()


def measure(n: int, vocab: int, k: int, *, docs: int, topics: int, seed: int, tol: float) -> dict:
    """Time both methods on one generated corpus; accuracy of the iterative eigenvalues."""
    t0 = time.perf_counter()
    counts = make_counts(n, vocab, seed=seed, docs=docs, topics=topics)
    build_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    iterative = classical_mds(counts, k=k, method="iterative", tol=tol, seed=seed)
    iterative_s = time.perf_counter() - t0

    # The dense path timed as a whole, and its Hellinger matrix alone for the breakdown.
    t0 = time.perf_counter()
    dense = classical_mds(counts, k=k, method="dense")
    dense_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    hellinger_sq(counts)
    hellinger_s = time.perf_counter() - t0

    ref = dense.eigenvalues
    rel = np.abs(iterative.eigenvalues - ref) / np.abs(ref)
    return {
        "docs": docs,
        "nnz": int(counts.nnz),
        "nnz_per_position": round(counts.nnz / n, 1),
        "build_s": round(build_s, 3),
        "dense_s": round(dense_s, 3),
        "hellinger_s": round(hellinger_s, 3),
        "eigh_s": round(max(dense_s - hellinger_s, 0.0), 3),
        "iterative_s": round(iterative_s, 3),
        "speedup": round(dense_s / iterative_s, 2),
        "max_rel_err": float(rel.max()),
        "accurate_1e-8": bool(rel.max() <= 1e-8),
        "max_residual": float(iterative.residuals.max()),
        "lambda_1": float(ref[0]),
        "lambda_k": float(ref[-1]),
        "total_variance": iterative.total_variance,
        "load_avg_1min": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tol", type=float, default=1e-10)
    parser.add_argument(
        "--docs",
        default="500,1000,2000,4000",
        help="comma-separated corpus sizes in documents (occupancy of position 0); one row each",
    )
    parser.add_argument("--topics", type=int, default=24, help="positional topic components")
    args = parser.parse_args(argv)
    docs = [int(d) for d in args.docs.split(",") if d.strip()]

    try:
        import threadpoolctl  # noqa: F401, PLC0415 - only reported
        has_threadpoolctl = True
    except ImportError:
        has_threadpoolctl = False

    rows = [
        measure(args.n, args.vocab, args.k, docs=d, topics=args.topics, seed=args.seed, tol=args.tol) for d in docs
    ]
    result = {
        "benchmark": "mds_top_k",
        "n": args.n,
        "V": args.vocab,
        "k": args.k,
        "topics": args.topics,
        "tol": args.tol,
        "corpora": rows,
        "target_5x_met_up_to_nnz": max((r["nnz"] for r in rows if r["speedup"] >= 5), default=None),
        # Wall-clock times on a shared machine: say how busy it was and how BLAS threads.
        "cpus": os.cpu_count(),
        "product_threads": product_threads(),
        "threadpoolctl": has_threadpoolctl,
        "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS"),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
