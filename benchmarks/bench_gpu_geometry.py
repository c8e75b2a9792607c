"""Benchmark the GPU (cupy) geometry paths against numpy, in one process, on one corpus.

    python benchmarks/bench_gpu_geometry.py [--n 8192 --vocab 50257 --k 64 --docs 2000]
    python benchmarks/bench_gpu_geometry.py --counts DIR [--k 64]

Two timings, each numpy then cupy on the same seeded counts (``bench_mds.make_counts``:
Zipf tokens, log-normal document lengths, drifting topics):

- ``hellinger``: the dense (n, n) squared Hellinger matrix :func:`hellinger_sq` from the
  (n, V) counts, as ``jobs/hellinger.py --device gpu`` computes it (counts densified and
  copied to the GPU, the result copied back; both copies are timed).
- ``lanczos``: the top-``k`` classical MDS by block Lanczos on the implicit operator
  (``classical_mds(method="lanczos", xp=cupy)``, as ``jobs/eigensolve.py --device gpu``).

``--counts DIR`` (a folder ``posstats count`` wrote, e.g. the 200 M-token counts at
n = 131,072 of ``bench_long_count.py``) replaces both by what the long-context analysis does
on them (the dense (n, n) matrix does not fit there):

- ``operator``: building the centred square-root operator :func:`sqrt_operator` (host:
  one sparse part sharing the counts' indices; GPU: the split parts made on the host and
  copied to the device) and ``copied_s``: the host operator copied as it is
  (``to_device``, what ``posstats analyze --device gpu`` does).
- ``products`` / ``products_copied``: one block product ``S_c (S_c^T X)`` with ``X`` of
  shape (n, ``--k``), the step every eigensolver and noise-floor pass repeats, on the split
  and on the copied GPU operator; agreement is the largest relative column difference.

Each row reports wall seconds (best of ``--repeats``, after one untimed warm-up run on the
GPU so that kernel compilation is not timed), the speed-up numpy / cupy, and agreement:
``max_abs_diff`` of the distances, the largest relative difference of the eigenvalues.
Prints one JSON object; exits 2 with a message when cupy or a CUDA device is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mds import make_counts  # noqa: E402

from posstats.geometry.backend import get_cupy, gpu_available, to_numpy  # noqa: E402
from posstats.geometry.hellinger import hellinger_sq  # noqa: E402
from posstats.counting.io import load_counts  # noqa: E402
from posstats.geometry.mds import classical_mds
from posstats.geometry.sqrt_operator import sqrt_operator  # noqa: E402


def _best(fn, repeats: int) -> tuple[float, object]:
    """(best wall seconds over ``repeats`` calls of ``fn``, the last result)."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def bench_hellinger(counts, cp, repeats: int) -> dict:
    """Dense squared Hellinger distances: sparse numpy path vs dense cupy path (with copies)."""

    def on_gpu():
        d = hellinger_sq(cp.asarray(counts.toarray()))
        host = to_numpy(d)
        cp.cuda.Stream.null.synchronize()
        return host

    cpu_s, d_cpu = _best(lambda: hellinger_sq(counts), repeats)
    on_gpu()  # warm-up: kernels compiled, memory pool grown
    gpu_s, d_gpu = _best(on_gpu, repeats)
    cp.get_default_memory_pool().free_all_blocks()
    return {"numpy_s": round(cpu_s, 3), "cupy_s": round(gpu_s, 3), "speedup": round(cpu_s / gpu_s, 2),
            "max_abs_diff": float(np.abs(np.asarray(d_cpu) - np.asarray(d_gpu)).max())}


def bench_lanczos(counts, cp, k: int, tol: float, repeats: int) -> dict:
    """Top-k block-Lanczos MDS on the host and on the GPU."""

    def run(xp):
        res = classical_mds(counts, k=k, method="lanczos", tol=tol, xp=xp)
        if xp is not None:
            cp.cuda.Stream.null.synchronize()
        return res

    cpu_s, r_cpu = _best(lambda: run(None), repeats)
    run(cp)  # warm-up
    gpu_s, r_gpu = _best(lambda: run(cp), repeats)
    e_cpu, e_gpu = np.asarray(r_cpu.eigenvalues), to_numpy(r_gpu.eigenvalues)
    return {"k": k, "tol": tol, "numpy_s": round(cpu_s, 3), "cupy_s": round(gpu_s, 3),
            "speedup": round(cpu_s / gpu_s, 2),
            "max_rel_eigenvalue_diff": float((np.abs(e_cpu - e_gpu) / np.abs(e_cpu)).max()),
            "max_residual_gpu": float(to_numpy(r_gpu.residuals).max())}


def bench_products(counts, cp, k: int, repeats: int, seed: int) -> dict:
    """The square-root operator and its block product ``S_c (S_c^T X)``, host against GPU."""
    t0 = time.perf_counter()
    op_cpu = sqrt_operator(counts)
    build_cpu = time.perf_counter() - t0
    t0 = time.perf_counter()
    op_gpu = sqrt_operator(counts, xp=cp)
    cp.cuda.Stream.null.synchronize()
    build_gpu = time.perf_counter() - t0
    t0 = time.perf_counter()
    op_copy = op_cpu.to_device(cp)
    cp.cuda.Stream.null.synchronize()
    copy_gpu = time.perf_counter() - t0
    x = np.random.default_rng(seed).standard_normal((counts.shape[0], k))
    x_gpu = cp.asarray(x)

    def on_gpu(op):
        def run():
            y = op.apply(op.apply_t(x_gpu))
            cp.cuda.Stream.null.synchronize()
            return y
        run()  # warm-up
        return _best(run, repeats)

    cpu_s, y_cpu = _best(lambda: op_cpu.apply(op_cpu.apply_t(x)), repeats)
    out = {"operator": {"numpy_s": round(build_cpu, 3), "cupy_s": round(build_gpu, 3),
                        "copied_s": round(copy_gpu, 3)}}
    for name, op in (("products", op_gpu), ("products_copied", op_copy)):
        gpu_s, y_gpu = on_gpu(op)
        y_gpu = to_numpy(y_gpu)
        rel = np.linalg.norm(y_cpu - y_gpu, axis=0) / np.maximum(np.linalg.norm(y_cpu, axis=0), 1e-300)
        out[name] = {"k": k, "numpy_s": round(cpu_s, 3), "cupy_s": round(gpu_s, 3),
                     "speedup": round(cpu_s / gpu_s, 2), "max_rel_column_diff": float(rel.max())}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=8192, help="positions (rows)")
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--docs", type=int, default=2000, help="documents (occupancy of position 0)")
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--tol", type=float, default=1e-8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--counts", default=None, help="a counts folder: time the square-root operator's products on it instead")
    args = ap.parse_args(argv)
    try:
        cp = get_cupy()
    except ImportError as exc:
        print(f"bench_gpu_geometry: {exc}", file=sys.stderr)
        return 2
    if not gpu_available():
        print("bench_gpu_geometry: cupy is installed but no CUDA device answers", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    if args.counts:
        counts = load_counts(args.counts, compact=True).matrix
    else:
        counts = make_counts(args.n, args.vocab, seed=args.seed, docs=args.docs, topics=24)
    keep = np.flatnonzero(np.asarray(counts.sum(axis=1)).ravel() > 0)
    counts = counts[keep]
    out = {
        "benchmark": "gpu_geometry",
        "platform": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "cupy": cp.__version__,
        "n_occupied": int(counts.shape[0]), "V": args.vocab, "nnz": int(counts.nnz),
        "build_s": round(time.perf_counter() - t0, 3),
    }
    if args.counts:
        out.update(counts_folder=args.counts, **bench_products(counts, cp, args.k, args.repeats, args.seed))
    else:
        out.update(hellinger=bench_hellinger(counts, cp, args.repeats),
                   lanczos=bench_lanczos(counts, cp, args.k, args.tol, args.repeats))
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
