"""Benchmark: the long-context geometry at n = 131,072 positions, V = 50,257, >= 1e9 tokens.

    python benchmarks/bench_long_context.py [--n 131072 --vocab 50257 --tokens 7700 --k 64]
        [--steps generate,encode,sampled,accuracy,monotonicity] [--cache DIR]

Prints one JSON object. Each step runs in its own subprocess so that its peak memory
(``ru_maxrss``) is its own:

- ``generate``: seeded counts with a known structure (:func:`posstats.testing.synthetic_counts`:
  a Zipf base over the GPT-2 vocabulary plus a planted rank-8 positional component,
  Poisson counts built as CSR directly), saved to a safetensors cache (data, indices,
  indptr). About a minute.
- ``encode``: load the counts and compute the top-k MDS encoding by block Lanczos on the
  implicit centred square-root operator (``classical_mds(method="lanczos")``): the target
  is <= 10 minutes and <= 16 GB peak. Reports time, peak memory, residuals, and the
  planted eigenvalues next to the computed ones.
- ``sampled``: sampled stress (95 % intervals, half-width <= 1e-3 on scaled stress) of
  MDS, sinusoidal and random encodings, and sampled corpus monotonicity, at full n.
- ``accuracy``: iterative (Lanczos) against dense ``eigh`` at n = 8192 (same generator):
  the largest relative eigenvalue error of the top-k and the residuals.
- ``monotonicity``: exact monotonicity of a d = 64 encoding and of the corpus' own d_H at
  n = 8192 (target <= 60 s each), and the exact (blocked) d_H matrix plus stress of one
  encoding at n = 16,384.
- ``real``: the noise floor on the team's shared corpora (fortunes, Shakespeare; GPT-2
  tokens, 128 positions, document quarters) in truncate and pack mode: split-half d_H,
  bias, plug-in and bias-corrected mean d_H, components above the shuffled null.

The baseline in the same run is the dense solver at n = 8192 (``accuracy``: dense
seconds and Lanczos seconds at that size).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux: KiB


def _cache_paths(cache: Path, n: int, vocab: int, tokens: float, rank: int, seed: int) -> Path:
    return cache / f"counts-n{n}-v{vocab}-t{tokens:g}-r{rank}-s{seed}.safetensors"


def step_generate(args: argparse.Namespace) -> dict:
    from safetensors.numpy import save_file

    from posstats.testing import synthetic_counts

    path = _cache_paths(Path(args.cache), args.n, args.vocab, args.tokens, args.rank, args.seed)
    if path.exists():
        return {"cached": str(path)}
    t = time.perf_counter()
    syn = synthetic_counts(args.n, args.vocab, tokens=args.tokens, rank=args.rank, strength=0.3, seed=args.seed)
    seconds = time.perf_counter() - t
    m = syn.counts.matrix
    tmp = path.with_suffix(".tmp")
    save_file(
        {"data": m.data, "indices": m.indices, "indptr": m.indptr, "true_eigenvalues": syn.true_eigenvalues},
        str(tmp),
        metadata={"n": str(args.n), "vocab": str(args.vocab), "tokens": str(int(m.sum()))},
    )
    os.replace(tmp, path)
    return {"seconds": round(seconds, 1), "nnz": int(m.nnz), "tokens": int(syn.counts.tokens), "peak_gb": round(_peak_gb(), 2)}


def _load(args: argparse.Namespace):
    import scipy.sparse as sp
    from safetensors.numpy import load_file

    path = _cache_paths(Path(args.cache), args.n, args.vocab, args.tokens, args.rank, args.seed)
    t = load_file(str(path))
    m = sp.csr_array((t["data"], t["indices"], t["indptr"]), shape=(args.n, args.vocab))
    return m, t["true_eigenvalues"]


def step_encode(args: argparse.Namespace) -> dict:
    from posstats.geometry.mds import classical_mds

    t0 = time.perf_counter()
    counts, true = _load(args)
    load_s = time.perf_counter() - t0
    t = time.perf_counter()
    cpu = time.process_time()
    mds = classical_mds(counts, k=args.k, method="lanczos", tol=args.tol, block=args.block, seed=0)
    seconds = time.perf_counter() - t
    cpu = time.process_time() - cpu
    out = {
        "n": args.n,
        "vocab": args.vocab,
        "k": args.k,
        "nnz": int(counts.nnz),
        "tokens": int(counts.sum()),
        "load_s": round(load_s, 1),
        "encode_s": round(seconds, 1),
        "encode_cpu_s": round(cpu, 1),  # both cores when BLAS runs threaded; > wall is fine
        "peak_gb": round(_peak_gb(), 2),
        "tol": args.tol,
        "block": args.block,
        "max_residual": float(mds.residuals.max()),
        "eigenvalues_top10": [round(float(x), 4) for x in mds.eigenvalues[:10]],
        "eigenvalue_k": float(mds.eigenvalues[-1]),
        "planted_eigenvalues": [round(float(x), 4) for x in true],
        "total_variance": mds.total_variance,
    }
    np.save(Path(args.cache) / f"mds-n{args.n}.npy", mds.encoding)
    return out


def step_sampled(args: argparse.Namespace) -> dict:
    from posstats.estimates.sampled import SampledGeometry
    from posstats.geometry.encodings import make_encoding

    counts, _ = _load(args)
    mds = np.load(Path(args.cache) / f"mds-n{args.n}.npy")
    t = time.perf_counter()
    geo = SampledGeometry(counts, seed=0)
    prep_s = time.perf_counter() - t
    positions = np.arange(args.n)
    encs = {
        "mds:2": mds[:, :2],
        "mds:64": mds[:, :64],
        "sinusoidal:64": make_encoding("sinusoidal", positions, 64).matrix,
        "random:64": make_encoding("random", positions, 64).matrix,
    }
    t = time.perf_counter()
    res = geo.stress(list(encs.values()), target_halfwidth=1e-3)
    stress_s = time.perf_counter() - t
    t = time.perf_counter()
    mono = geo.monotonicity(samples=200_000, seed=0)
    mono_s = time.perf_counter() - t
    return {
        "prep_s": round(prep_s, 1),
        "stress_s": round(stress_s, 1),
        "pairs": geo.pairs,
        "stress": {name: r.to_dict() for name, r in zip(encs, res, strict=True)},
        "corpus_monotonicity": mono.to_dict(),
        "monotonicity_s": round(mono_s, 1),
        "peak_gb": round(_peak_gb(), 2),
    }


def step_accuracy(args: argparse.Namespace) -> dict:
    from posstats.geometry.mds import classical_mds
    from posstats.testing import synthetic_counts

    n = 8192
    syn = synthetic_counts(n, args.vocab, tokens=args.tokens, rank=args.rank, strength=0.3, seed=args.seed + 1)
    c = syn.counts.matrix
    t = time.perf_counter()
    dense = classical_mds(c, k=args.k, method="dense")
    dense_s = time.perf_counter() - t
    t = time.perf_counter()
    lz = classical_mds(c, k=args.k, method="lanczos", tol=args.tol, block=args.block)
    lz_s = time.perf_counter() - t
    rel = np.abs(lz.eigenvalues - dense.eigenvalues) / dense.eigenvalues[0]
    rel_own = np.abs(lz.eigenvalues - dense.eigenvalues) / np.abs(dense.eigenvalues)
    return {
        "n": n,
        "dense_s": round(dense_s, 1),
        "lanczos_s": round(lz_s, 1),
        "max_abs_err_rel_to_lambda1": float(rel.max()),
        "max_rel_err_per_eigenvalue": float(rel_own.max()),
        "lanczos_max_residual": float(lz.residuals.max()),
        "dense_max_residual": float(dense.residuals.max()),
        "peak_gb": round(_peak_gb(), 2),
    }


def step_monotonicity(args: argparse.Namespace) -> dict:
    from posstats.geometry.diagnostics import (
        monotonicity_of_encoding,
        monotonicity_violation_rate,
    )
    from posstats.geometry.encodings import make_encoding
    from posstats.geometry.hellinger import hellinger
    from posstats.geometry.stress import stress_report
    from posstats.testing import synthetic_counts

    out = {}
    n = 8192
    enc = make_encoding("sinusoidal", np.arange(n), 64).matrix
    t = time.perf_counter()
    m = monotonicity_of_encoding(enc, exact_limit=n)
    out["encoding_exact_n8192_s"] = round(time.perf_counter() - t, 1)
    out["encoding_rate"] = m.rate
    syn = synthetic_counts(n, args.vocab, tokens=args.tokens, rank=args.rank, seed=args.seed + 2)
    d = hellinger(syn.counts.matrix)
    t = time.perf_counter()
    m = monotonicity_violation_rate(d, exact_limit=n)
    out["corpus_exact_n8192_s"] = round(time.perf_counter() - t, 1)
    out["corpus_rate"] = m.rate
    del d
    n = 16384
    syn = synthetic_counts(n, args.vocab, tokens=args.tokens, rank=args.rank, seed=args.seed + 3)
    t = time.perf_counter()
    d = hellinger(syn.counts.matrix)
    out["hellinger_exact_n16384_s"] = round(time.perf_counter() - t, 1)
    t = time.perf_counter()
    s = stress_report(make_encoding("sinusoidal", np.arange(n), 64).matrix, d)
    out["stress_exact_n16384_s"] = round(time.perf_counter() - t, 1)
    out["stress_exact_n16384"] = s.to_dict()
    out["peak_gb"] = round(_peak_gb(), 2)
    return out


def _real_corpora(shared: Path, work: Path) -> dict[str, Path]:
    """The team's shared corpora as JSONL documents: fortunes (records between '%' lines),
    Shakespeare (paragraphs: a speaker's speech, a heading, a stage direction)."""
    import gzip

    out = {}
    fortunes = shared / "fortunes.txt.gz"
    if fortunes.exists():
        docs = [d.strip() for d in gzip.open(fortunes, "rt", encoding="utf-8").read().split("\n%\n") if d.strip()]
        path = work / "fortunes.jsonl"
        path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
        out["fortunes"] = path
    plays = shared / "shakespeare.md.gz"
    if plays.exists():
        text = gzip.open(plays, "rt", encoding="utf-8").read()
        docs = [d.strip() for d in text.split("\n\n") if d.strip()]
        path = work / "shakespeare.jsonl"
        path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
        out["shakespeare"] = path
    return out


def step_real(args: argparse.Namespace) -> dict:
    """Noise floor, bias-corrected mean d_H and null rank on the shared real corpora, in
    truncate and pack mode (GPT-2 tokens, 128 positions, document quarters)."""
    from posstats.corpus.source import CorpusSource
    from posstats.counting.counts import CountSpec
    from posstats.estimates.noise import corrected_squared_distances, noise_floor
    from posstats.estimates.null_rank import null_rank
    from posstats.runs.noise_parts import count_parts
    from posstats.geometry.hellinger import hellinger_sq
    from posstats.geometry.mds import classical_mds

    repo = Path(__file__).resolve().parents[1]
    tokenizer = str(repo / "data" / "tokenizers" / "gpt2.tokenizer.json")
    corpora = _real_corpora(Path(args.shared), Path(args.cache))
    out: dict = {"positions": args.real_positions, "tokenizer": "gpt2", "parts": 4}
    for name, path in corpora.items():
        source = CorpusSource(inputs=(str(path),), text_column="text", tokenizer=tokenizer)
        for mode, sep in (("truncate", None), ("pack", 50256)):
            t = time.perf_counter()
            spec = CountSpec(args.real_positions, 50257, mode, (50256,), sep)
            parts = count_parts(source, spec, parts=4, dense=False)
            total = parts[0] + parts[1] + parts[2] + parts[3]
            occ = total.occupancy()
            used = np.flatnonzero(occ >= 100)
            nf = noise_floor(parts, positions=used)
            d2 = hellinger_sq(total.matrix[used])
            off = ~np.eye(used.size, dtype=bool)
            dc = corrected_squared_distances(d2, nf.bias)
            mds = classical_mds(total.matrix[used], method="dense")
            nr = null_rank(mds.eigenvalues[:64], method="shuffle", counts=total, positions=used, replicates=3, seed=0)
            out[f"{name}/{mode}"] = {
                "documents": int(sum(p.sequences for p in parts)),
                "tokens": int(total.tokens),
                "positions_used": int(used.size),
                "occupancy_min_median": [int(occ[used].min()), float(np.median(occ[used]))],
                "split_half_d_h_median": float(np.nanmedian(nf.split_half_distance)),
                "split_half_d_h_first_last": [float(nf.split_half_distance[0]), float(nf.split_half_distance[-1])],
                "bias_mean": float(np.nanmean(nf.bias)),
                "gamma_median": float(np.nanmedian(nf.gamma)),
                "plugin_mean_d_h": float(np.sqrt(d2[off]).mean()),
                "corrected_mean_d_h": float(np.sqrt(dc[off]).mean()),
                "corrected_mean_d_h_without_position_0": float(np.sqrt(dc[1:, 1:][off[1:, 1:]]).mean()),
                "components_above_null": nr.components_above_null,
                "null_threshold": nr.threshold,
                "top_eigenvalues": [round(float(x), 5) for x in mds.eigenvalues[:5]],
                "seconds": round(time.perf_counter() - t, 1),
            }
    return out


STEPS = {
    "generate": step_generate,
    "encode": step_encode,
    "sampled": step_sampled,
    "accuracy": step_accuracy,
    "monotonicity": step_monotonicity,
    "real": step_real,
}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=131_072)
    p.add_argument("--vocab", type=int, default=50_257)
    p.add_argument("--tokens", type=float, default=7700.0, help="expected tokens per position")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--k", type=int, default=64)
    p.add_argument("--tol", type=float, default=1e-8)
    p.add_argument("--block", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", default="generate,encode,sampled,accuracy,monotonicity,real")
    p.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared" / "corpora"),
                   help="folder with fortunes.txt.gz and shakespeare.md.gz (step real)")
    p.add_argument("--real-positions", type=int, default=128)
    p.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "posstats-bench-long-context"))
    p.add_argument("--one", help=argparse.SUPPRESS)  # run one step in this process
    args = p.parse_args(argv)
    Path(args.cache).mkdir(parents=True, exist_ok=True)
    if args.one:
        result = STEPS[args.one](args)
        print(json.dumps(result))
        return result
    report: dict = {"machine": {"cpus": os.cpu_count()}, "steps": {}}
    for step in [s.strip() for s in args.steps.split(",") if s.strip()]:
        cmd = [sys.executable, __file__, "--one", step, "--n", str(args.n), "--vocab", str(args.vocab),
               "--tokens", str(args.tokens), "--rank", str(args.rank), "--k", str(args.k), "--tol", str(args.tol),
               "--block", str(args.block), "--seed", str(args.seed), "--cache", args.cache,
               "--shared", args.shared, "--real-positions", str(args.real_positions)]
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            report["steps"][step] = {"error": proc.stderr.strip().splitlines()[-1:] or ["?"], "wall_s": round(wall, 1)}
            continue
        report["steps"][step] = {**json.loads(proc.stdout.strip().splitlines()[-1]), "wall_s": round(wall, 1)}
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
