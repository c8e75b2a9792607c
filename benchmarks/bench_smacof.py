"""Benchmark SMACOF: blocked iteration time at large n, and stress gained over classical MDS.

Prints one JSON object. Sections:

- ``blocked``: seconds per (plain) Guttman iteration at ``--n`` (default 16,384), ``--dim`` (64),
  measured as (time of ``smacof(max_iter=iters)`` - time of ``smacof(max_iter=0)``) / iters,
  so validation and the initial-stress pass are excluded.
- ``baseline``: the same iteration with a naive (n, n, d) difference tensor and explicit
  B(X), at ``--baseline-n`` (default 1,024), against the blocked code at that n, in the
  same process (ratio = naive / blocked).
- ``demo``: a seeded corpus-like n = 64 configuration: stress (and scaled stress) of classical
  MDS vs the SMACOF refinement (SQUAREM-accelerated, the default) at d = 2 and 16, with
  plain transforms (``plain_*``, the same 300-transform budget) as its baseline and a
  sinusoidal encoding for reference.
- ``stochastic``: :func:`stochastic_smacof` against blocked SMACOF at ``--stochastic-n``
  (default 1,024): stress estimate, its 95 % interval, the exact stress of the result.
- ``acceleration``: SQUAREM (the default) against plain transforms on the true distances
  of known corpora (:func:`posstats.testing.known_corpus`: every position planted, n = 64
  and 512, d = 16; a drift, n = 512, d = 2), each started from classical MDS with the
  default 300 transforms; the reference is the lower of two long runs (3,000 transforms
  each way). ``--skip-acceleration`` leaves it out (about 1 min on 2 cores).

Usage: ``python benchmarks/bench_smacof.py [--n N] [--dim D] [--iters K] [--xp numpy|cupy]``.
Keep it under ~5 minutes on a laptop-class CPU (the defaults take ~1-3 min on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

from posstats.geometry.backend import get_cupy, to_numpy
from posstats.geometry.mds import classical_mds as library_mds
from posstats.geometry.smacof import smacof, smacof_stress
from posstats.geometry.stochastic_smacof import stochastic_smacof


def sqrt_distributions(n: int, *, vocab: int = 256, seed: int = 0, tokens: int = 2000):
    """Rows s_i = sqrt(mu_i) of a synthetic corpus with positional drift (float64, n x V)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / n
    base = 1.5 * rng.normal(size=vocab)
    drift = rng.normal(size=(3, vocab))
    logits = (base + np.outer(np.sqrt(t), drift[0]) + 0.5 * np.outer(np.sin(6 * t), drift[1])
              + np.outer(t**2, drift[2]))
    mu = np.exp(logits - logits.max(axis=1, keepdims=True))
    mu /= mu.sum(axis=1, keepdims=True)
    occ = np.maximum((tokens * (1 - 0.9 * t)).astype(np.int64), 5)
    counts = np.stack([rng.multinomial(o, m) for o, m in zip(occ, mu, strict=True)])
    return np.sqrt(counts / counts.sum(axis=1, keepdims=True))


def hellinger(s):
    """d_H (n x n) from sqrt-distributions, Gram form, clipped, zero diagonal."""
    h = s @ s.T
    h *= -2.0
    h += 2.0
    np.maximum(h, 0.0, out=h)
    np.sqrt(h, out=h)
    np.fill_diagonal(h, 0.0)
    return h


def classical_mds(s, d):
    """P_MDS(d) = S_c V_d (THEORY section 3: PCA of the centred sqrt-distributions)."""
    sc = s - s.mean(axis=0)
    u, sig, _ = np.linalg.svd(sc, full_matrices=False)
    return u[:, :d] * sig[:d]


def scaled_stress(h, x):
    iu = np.triu_indices(h.shape[0], 1)
    diff = x[:, None, :] - x[None, :, :]
    e = np.sqrt((diff * diff).sum(-1))[iu]
    hh = h[iu]
    return float(1.0 - (e @ hh) ** 2 / ((e @ e) * (hh @ hh)))


def sinusoidal(n, d, base=10000.0):
    pos = np.arange(n)[:, None]
    w = base ** (-2.0 * np.arange(d // 2) / d)
    p = np.zeros((n, d))
    p[:, 0::2] = np.sin(pos * w)
    p[:, 1::2] = np.cos(pos * w)
    return p


def naive_iteration(h, x):
    """One Guttman transform with the (n, n, d) difference tensor (the unblocked textbook form)."""
    n = h.shape[0]
    diff = x[:, None, :] - x[None, :, :]
    e = np.sqrt((diff * diff).sum(-1))
    num = ((e - h) ** 2).sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(e > 0, h / e, 0.0)
    np.fill_diagonal(ratio, 0.0)
    b = -ratio
    np.fill_diagonal(b, ratio.sum(axis=1))
    return (b @ x) / n, num


ACCELERATION_CASES = (("all_planted", 64, 16), ("all_planted", 512, 16), ("drift", 512, 2))


def true_distances(kind: str, n: int, *, seed: int = 1):
    """(n, n) the true d_H of a known corpus of the calibration benchmark's coverage table
    (``all_planted``: every position mixes its own block at a weight in [0.05, 0.3]; else
    :func:`posstats.testing.known_corpus`'s kind)."""
    from bench_calibration import _coverage_corpus, _true_d2_matrix

    return np.sqrt(_true_d2_matrix(_coverage_corpus(kind, n, 1, seed), n))


def acceleration_table(cases=ACCELERATION_CASES, *, budget: int = 300, reference_budget: int = 3000) -> list[dict]:
    """SQUAREM against plain transforms at ``budget`` transforms, with the gap of each to
    the lowest stress found (the better of the two runs of ``reference_budget``)."""
    rows = []
    for kind, n, d in cases:
        h = true_distances(kind, n)
        init = library_mds(np.ones((n, 1)), k=d, method="dense", squared_distances=h**2).encoding[:, :d]
        runs = {acc: smacof(h, init, max_iter=budget, acceleration=acc) for acc in ("none", "squarem")}
        floor = min(smacof(h, init, max_iter=reference_budget, tol=0.0, acceleration=acc).stress
                    for acc in ("none", "squarem"))
        row = {"corpus": kind, "n": n, "dim": d, "lowest_stress_found": floor}
        for acc, r in runs.items():
            row[acc] = {"stress": r.stress, "relative_gap": (r.stress - floor) / floor if floor > 0 else None,
                        "transforms": r.iterations, "converged": r.converged, "seconds": r.seconds}
        rows.append(row)
    return rows


def _synchronize(xp) -> None:
    """Wait for the GPU's queued work (cupy runs asynchronously); a no-op on numpy."""
    if xp is not np:
        xp.cuda.Stream.null.synchronize()


def per_iteration(h, x, iters, block, xp):
    """Seconds per Guttman iteration: (time of ``iters`` iterations - time of none) / iters.

    One untimed warm-up call first (on a GPU it compiles the kernels and grows the memory
    pool, which would otherwise be charged to the first timed call and make the difference
    negative), and the device is synchronised before every clock read.
    """
    h_dev, x_dev = xp.asarray(h), xp.asarray(x)
    smacof(h_dev, x_dev, max_iter=1, tol=0.0, block=block, acceleration="none")
    _synchronize(xp)
    t0, c0 = time.perf_counter(), time.process_time()
    r0 = smacof(h_dev, x_dev, max_iter=0, block=block, acceleration="none")
    _synchronize(xp)
    t_setup, c_setup = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    rk = smacof(h_dev, x_dev, max_iter=iters, tol=0.0, block=block, acceleration="none")
    _synchronize(xp)
    t_total, c_total = time.perf_counter() - t0, time.process_time() - c0
    return {
        "seconds_per_iteration": (t_total - t_setup) / iters,
        "cpu_seconds_per_iteration": (c_total - c_setup) / iters,
        "seconds_setup": t_setup,
        "iterations": rk.iterations,
        "initial_stress": r0.stress,
        "stress_after": rk.stress,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16_384)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--block", type=int, default=2048)
    ap.add_argument("--baseline-n", type=int, default=1024)
    ap.add_argument("--stochastic-n", type=int, default=1024)
    ap.add_argument("--xp", choices=["numpy", "cupy"], default="numpy")
    ap.add_argument("--skip-large", action="store_true", help="skip the --n timing")
    ap.add_argument("--skip-acceleration", action="store_true", help="skip SQUAREM against plain transforms")
    args = ap.parse_args()
    xp = get_cupy() if args.xp == "cupy" else np
    out: dict = {
        "platform": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "loadavg_at_start": list(os.getloadavg()),
        "xp": args.xp,
        "note": "seconds are wall time; cpu_seconds are process CPU time (all threads), "
                "a work measure that is less sensitive to other load on a shared machine",
    }

    # --- blocked iteration time at large n
    if not args.skip_large:
        t0 = time.perf_counter()
        s = sqrt_distributions(args.n, seed=0)
        h = hellinger(s)
        init = classical_mds(s, args.dim)
        del s
        build = time.perf_counter() - t0
        res = per_iteration(h, init, args.iters, args.block, xp)
        res.update(n=args.n, dim=args.dim, block=args.block, seconds_build_distances=build,
                   gflop_per_iteration=6 * args.n**2 * args.dim / 2 / 1e9)
        out["blocked"] = res
        del h, init

    # --- naive baseline vs blocked at a smaller n, same process
    nb = args.baseline_n
    s = sqrt_distributions(nb, seed=1)
    h, init = hellinger(s), classical_mds(s, args.dim)
    x = init - init.mean(axis=0)
    t0, c0 = time.perf_counter(), time.process_time()
    reps = 2
    for _ in range(reps):
        naive_iteration(h, x)
    t_naive = (time.perf_counter() - t0) / reps
    c_naive = (time.process_time() - c0) / reps
    blocked_b = per_iteration(h, init, max(args.iters, 3), args.block, xp)
    out["baseline"] = {
        "n": nb,
        "dim": args.dim,
        "naive_seconds_per_iteration": t_naive,
        "blocked_seconds_per_iteration": blocked_b["seconds_per_iteration"],
        "ratio_naive_over_blocked": t_naive / blocked_b["seconds_per_iteration"],
        "cpu_ratio_naive_over_blocked": c_naive / blocked_b["cpu_seconds_per_iteration"],
        "naive_peak_bytes_at_n": 8 * nb * nb * args.dim,
        "naive_peak_bytes_at_large_n": 8 * args.n**2 * args.dim,
    }

    # --- corpus-like demonstration at n = 64
    s = sqrt_distributions(64, seed=3)
    h = hellinger(s)
    demo = {}
    for d in (2, 16):
        init = classical_mds(s, d)
        r = smacof(h, init)
        plain = smacof(h, init, acceleration="none")  # the baseline: unaccelerated transforms
        enc = to_numpy(r.encoding)
        demo[f"d={d}"] = {
            "classical_mds_stress": r.initial_stress,
            "smacof_stress": r.stress,
            "ratio": r.initial_stress / r.stress,
            "classical_mds_scaled_stress": scaled_stress(h, init),
            "smacof_scaled_stress": scaled_stress(h, enc),
            "sinusoidal_stress": smacof_stress(h, sinusoidal(64, d)),
            "sinusoidal_scaled_stress": scaled_stress(h, sinusoidal(64, d)),
            "iterations": r.iterations,
            "converged": r.converged,
            "seconds": r.seconds,
            "plain_smacof_stress": plain.stress,
            "plain_iterations": plain.iterations,
            "plain_converged": plain.converged,
        }
    out["demo_n64"] = demo

    # --- stochastic vs blocked at a moderate n
    ns = args.stochastic_n
    s = sqrt_distributions(ns, seed=2)
    h = hellinger(s)
    sto = {}
    for d in (2, 16):
        init = classical_mds(s, d)
        rb = smacof(h, init, max_iter=300)

        def dist_fn(i, j):  # d_H from sqrt-distributions, as a caller without n x n would
            return np.sqrt(np.clip(2.0 - 2.0 * np.einsum("kv,kv->k", s[i], s[j]), 0.0, None))

        rs = stochastic_smacof(dist_fn, init, seed=d)
        sto[f"d={d}"] = {
            "n": ns,
            "classical_mds_stress": rb.initial_stress,
            "blocked_stress": rb.stress,
            "blocked_iterations": rb.iterations,
            "blocked_seconds": rb.seconds,
            "stochastic_stress_estimate": rs.stress,
            "stochastic_stress_ci95": list(rs.stress_ci),
            "stochastic_stress_exact": smacof_stress(h, rs.encoding),
            "stochastic_sweeps": rs.iterations,
            "stochastic_seconds": rs.seconds,
        }
    out["stochastic"] = sto
    if not args.skip_acceleration:
        out["acceleration"] = acceleration_table()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
