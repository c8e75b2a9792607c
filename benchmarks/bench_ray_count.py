"""Distributed counting benchmark: the Ray count job with 1 and 2 workers against the
in-process ``count_corpus`` on the same generated Parquet corpus.

Run: ``python benchmarks/bench_ray_count.py [--tokens 256e6 --files 16 --positions 128]``

Prints one JSON object. The corpus (``--dir``, generated once and reused) holds Zipf
(exponent 1.1) token ids over a GPT-2-sized vocabulary in documents of 256..1535 tokens,
``--files`` Parquet files of ``--row-groups`` row groups each (one shard per row group).
Mode ``chunk``, so every token is counted.

Measured, all in this process and on this machine:

* ``in_process``: :func:`posstats.corpus.count_step.count_corpus` (read + kernel, dense), tokens/s;
* ``ray_startup_s``: ``ray.init(num_cpus=2, include_dashboard=False)``, the fixed cost
  (workers at niceness 0, as in the embedded Ray of ``posstats count --ray``; Ray's
  default of 15 lets every other program on a shared machine starve the actors);
* for each worker count: the job's wall time (planning, actor start, counting, tree
  reduce, result written; Ray already up), its counting phase, and the per-worker rate:
  tokens / counting phase / workers; and each actor's rate while counting (its tokens /
  its seconds inside ``count_shard``, from the markers: reading + kernel, not saving);
* ``speedup``: 1-worker time / 2-worker time, for the counting phase and the whole job;
* ``identical``: the Ray result equals the in-process counts (and fingerprint);
* ``controls_before`` / ``controls_after``: the speed-up two plain processes get over one
  on this machine at that moment, for a pure-Python loop and for ``count_corpus`` on half
  the files each: the ceiling for any 2-worker speed-up (a shared or cache-starved
  machine shows it well below 2);
* ``per_worker_vs_plain_2_processes``: the 2-worker per-worker rate against the rate of
  each of those two plain processes (Ray's own overhead, the machine's ceiling removed).

Each measurement is repeated ``--repeats`` times (Ray runs interleaved: 1, 2, 1, 2, ...;
the in-process count before and after them); the best is reported with all values.
The machine's load average is printed next to the figures: on a shared 2-core machine
other processes take CPU from the workers and the figures move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from posstats.corpus.source import CorpusSource
from posstats.corpus.count_step import count_corpus
from posstats.counting.counts import CountSpec
from posstats.counting.io import load_counts


def generate(root: Path, *, tokens: int, files: int, row_groups: int, vocab: int, seed: int) -> dict:
    """Write the corpus once; a stamp file records what was generated."""
    stamp = root / "corpus.json"
    want = {"tokens": tokens, "files": files, "row_groups": row_groups, "vocab": vocab, "seed": seed}
    if stamp.exists() and json.loads(stamp.read_text()).get("params") == want:
        return json.loads(stamp.read_text())
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    total = 0
    for f in range(files):
        rng = np.random.default_rng([seed, f])
        lengths = rng.integers(256, 1536, size=max(1, tokens // files // 896))
        offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        values = ((rng.zipf(1.1, size=int(offsets[-1])) - 1) % vocab).astype(np.int32)
        column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        rows_per_group = -(-len(lengths) // row_groups)
        pq.write_table(pa.table({"input_ids": column}), root / f"part-{f:04d}.parquet", row_group_size=rows_per_group)
        total += int(offsets[-1])
    info = {"params": want, "tokens_written": total, "bytes": sum(p.stat().st_size for p in root.glob("*.parquet"))}
    stamp.write_text(json.dumps(info))
    return info


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


_BUSY = "import time; t = time.perf_counter(); x = 0\nfor i in range(20_000_000): x += i\nprint(time.perf_counter() - t)"
_COUNT = """
import sys, time
from posstats.corpus.source import CorpusSource
from posstats.corpus.count_step import count_corpus
from posstats.counting.counts import CountSpec
t = time.perf_counter()
count_corpus(CorpusSource(inputs=tuple(sys.argv[3:]), column="input_ids"),
             CountSpec(int(sys.argv[1]), int(sys.argv[2]), "chunk"), dense=True, show_progress=False)
print(time.perf_counter() - t)
"""


def _processes(jobs: list[list[str]]) -> float:
    """Run ``python -c`` jobs at once; the longest time any of them reports (start-up excluded)."""
    procs = [subprocess.Popen([sys.executable, "-c", *job], stdout=subprocess.PIPE, text=True) for job in jobs]
    return max(float(p.communicate()[0].strip().splitlines()[-1]) for p in procs)


def controls(files: list[str], spec: CountSpec) -> dict:
    """What this machine allows right now, without Ray: the speed-up of two plain processes
    over one, for a pure-Python loop and for count_corpus on half the files each."""
    busy_1 = _processes([[_BUSY]])
    busy_2 = _processes([[_BUSY], [_BUSY]])
    args = [str(spec.positions), str(spec.vocab_size)]
    count_1 = _processes([[_COUNT, *args, *files]])
    count_2 = _processes([[_COUNT, *args, *files[0::2]], [_COUNT, *args, *files[1::2]]])
    return {
        "cpu_loop_speedup_2_processes": round(2 * busy_1 / busy_2, 2),
        "count_corpus_speedup_2_processes": round(count_1 / count_2, 2),
        "count_corpus_1_process_s": round(count_1, 2),
        "count_corpus_2_processes_s": round(count_2, 2),
        "load": load_average(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/posstats-bench-ray", help="corpus and run-store folder")
    ap.add_argument("--tokens", type=float, default=256e6)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--row-groups", type=int, default=1, help="row groups (= shards) per file")
    ap.add_argument("--positions", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import ray
    from posstats.jobs.count import JobOptions, count_job

    root = Path(args.dir)
    t = time.perf_counter()
    corpus = generate(root / "corpus", tokens=int(args.tokens), files=args.files, row_groups=args.row_groups,
                      vocab=args.vocab, seed=args.seed)
    generate_s = time.perf_counter() - t
    source = CorpusSource(inputs=(str(root / "corpus" / "*.parquet"),), column="input_ids")
    spec = CountSpec(args.positions, args.vocab, "chunk")
    report: dict = {
        "benchmark": "ray_count",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "ray": ray.__version__},
        "corpus": {**corpus, "generate_s": round(generate_s, 1)},
        "spec": {"positions": spec.positions, "vocab": spec.vocab_size, "mode": spec.mode,
                 "dense_bytes": spec.positions * spec.vocab_size * 8},
        "load_before": load_average(),
    }

    t = time.perf_counter()
    ref = count_corpus(source, spec, dense=True, show_progress=False)
    in_process = [time.perf_counter() - t]
    report["in_process"] = {
        "seconds": [round(x, 2) for x in in_process],
        "tokens": ref.tokens,
        "tokens_per_s": round(ref.tokens / min(in_process)),
        "load": load_average(),
    }

    files = sorted(str(p) for p in (root / "corpus").glob("*.parquet"))
    report["controls_before"] = controls(files, spec)

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_worker_niceness", "0")  # as the embedded Ray of `posstats count --ray`
    report["ray_worker_niceness"] = int(os.environ["RAY_worker_niceness"])
    t = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    report["ray_startup_s"] = round(time.perf_counter() - t, 2)

    worker_counts = [int(w) for w in args.workers.split(",")]
    trials: dict[int, list[dict]] = {w: [] for w in worker_counts}
    identical = True
    for r in range(args.repeats):  # interleaved, so every worker count sees the same load
        for workers in worker_counts:
            store = root / f"store-{workers}-{r}"
            shutil.rmtree(store, ignore_errors=True)
            t = time.perf_counter()
            summary = count_job(source, spec, {}, JobOptions(store=str(store), workers=workers, show_progress=False))
            wall = time.perf_counter() - t
            got = load_counts(summary["counts_path"])
            identical &= bool(got.equals(ref) and got.fingerprint == ref.fingerprint)
            busy: dict[int, list[float]] = {}  # pid -> [tokens, seconds counting]
            for marker in store.glob("partials/*/done.json"):
                m = json.loads(marker.read_text())
                acc = busy.setdefault(m["pid"], [0.0, 0.0])
                acc[0] += m["tokens"]
                acc[1] += m["seconds"]
            info = summary["ray"]
            trials[workers].append({
                "job_s": round(wall, 2),
                "count_s": info["count_s"],
                "reduce_s": info["reduce_s"],
                "actors_start_s": info["actors_start_s"],
                "shards": info["shards"],
                "per_worker_tokens_per_s": round(ref.tokens / info["count_s"] / workers),
                "per_actor_busy_tokens_per_s": [round(tok / sec) for tok, sec in busy.values()],
                "load": load_average(),
            })
            shutil.rmtree(store, ignore_errors=True)
    runs = {w: {"best": min(t, key=lambda x: x["count_s"]), "trials": t} for w, t in trials.items()}
    ray.shutdown()

    t = time.perf_counter()
    count_corpus(source, spec, dense=True, show_progress=False)
    in_process.append(time.perf_counter() - t)
    report["in_process"]["seconds"] = [round(x, 2) for x in in_process]
    report["in_process"]["tokens_per_s"] = round(ref.tokens / min(in_process))
    report["controls_after"] = controls(files, spec)
    report["ray"] = {str(k): v for k, v in runs.items()}
    if 1 in runs and 2 in runs:
        one, two = runs[1]["best"], runs[2]["best"]
        report["speedup"] = {
            "count_phase": round(one["count_s"] / two["count_s"], 2),
            "job": round(one["job_s"] / two["job_s"], 2),
        }
        base = report["in_process"]["tokens_per_s"]
        report["per_worker_vs_in_process"] = {
            str(w): round(runs[w]["best"]["per_worker_tokens_per_s"] / base, 2) for w in runs
        }
        # Against what two plain processes (half the files each) reach per process on this
        # machine: the 2-worker overhead of Ray itself, without the machine's own ceiling.
        plain_s = min(report["controls_before"]["count_corpus_2_processes_s"],
                      report["controls_after"]["count_corpus_2_processes_s"])
        report["per_worker_vs_plain_2_processes"] = round(two["per_worker_tokens_per_s"] / (ref.tokens / 2 / plain_s), 2)
    report["identical"] = identical
    report["load_after"] = load_average()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
