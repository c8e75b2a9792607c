"""Long-context counting benchmark: ``posstats count`` end to end against the scripts a user
would write, at n = 131,072 positions (and n = 4096), V = 50,257, mode ``pack``.

Run (full scale; the corpora are generated once under ``--dir`` and reused)::

    python benchmarks/bench_long_count.py                      # cases long,ray,short
    python benchmarks/bench_long_count.py --cases billion      # 1e9 tokens, Ray; many minutes
    python benchmarks/bench_long_count.py --tokens 2e6 --files 2 --short-tokens 1e6   # smoke test

Prints one JSON object on stdout (progress on stderr). Every measured command runs as its
own subprocess, timed with ``time.perf_counter`` around it (interpreter start-up, imports,
reading, counting and writing included) and under ``/usr/bin/time -f %M`` for its peak
RSS (the largest resident set of any one process of its tree; without ``/usr/bin/time``,
the ``RUSAGE_CHILDREN`` maximum of a fresh Python wrapper). While a command runs, a
background thread samples ``ps`` every ``--sample-s`` seconds for every process of its
tree: the peak RSS per process name (``raylet``, ``gcs_server``, ``ray::...`` actors, ...)
and the peak of their sum.

The corpus (``generate``): ``--files`` Parquet files of ``--row-groups`` row groups each,
column ``input_ids: list<int32>``, Zipf (exponent 1.1) token ids ``(zipf - 1) % V`` in
documents of log-normal length (``lognormal(6.5, 1.0)``, at least 1 token; mean ~1100).

Cases (``--cases``, default ``long,ray,short``):

* ``long``: ``--tokens`` (2.02e8) tokens in ``--files`` (8) files, n = 131,072, pack.
  ``baseline``: the scipy script a user would write (per file: read the column, positions
  ``arange % n``, ``coo_matrix((1, (pos, tok))).tocsr()``, summed), against ``posstats
  count``. Reports wall seconds and peak RSS of each, ``speedup`` (baseline / posstats,
  target 3.0), ``memory_ratio`` (posstats peak / baseline peak) and ``identical`` (the
  baseline's CSR, saved with ``save_npz`` and its save time taken off its wall time,
  equals the counts ``posstats`` wrote).
* ``ray``: the same corpus, ``posstats count --ray --workers 2`` (a fresh out/store each
  repeat, embedded local Ray) against the in-process ``posstats count`` of ``long`` (run
  again here if ``long`` is not selected): ``speedup`` (in-process / Ray, target 1.6),
  ``identical`` (matrices and token totals), peak RSS per Ray process.
* ``short``: ``--short-tokens`` (2e7) tokens in ``--short-files`` files (``--dir``-short),
  n = 4096, pack. ``baseline``: pyarrow + ``np.add.at`` into a dense int64 (n, V) array,
  against ``posstats count``: ``speedup`` (target 4.0), ``identical``.
* ``billion`` (only when named): ``--billion-tokens`` (1e9) in ``--billion-files`` (40)
  files (``--dir``-billion), n = 131,072, ``posstats count --ray --workers 2``: wall time,
  exit code, last stderr line, peak RSS per process (target: no process above 6 GB).

``--repeats`` N: each measurement N times; the best (fastest) is reported with all values.

JSON (top level): ``benchmark``, ``machine`` (platform, cpus, versions, load before/after),
``params``, ``corpora`` (their stamps), one object per selected case, ``errors`` (commands
or cases that failed; a failed case holds ``{"error": ...}``). Every timed command reports
``{"seconds": [...], "best_s", "peak_rss_gb": [...], "best_peak_rss_gb" (lowest over the
repeats), "cpu_s": [...], "cores_busy" (CPU seconds per wall second of the fastest trial),
"returncode": [...], "stderr_tail", "sampled": {"per_process_peak_gb",
"processes_per_name", "max_process_gb", "tree_sum_peak_gb"}, "load"}`` (a baseline also
``wall_with_save_s``, ``nnz``, ``total``); the comparisons add ``speedup``,
``target_speedup``, ``memory_ratio``, ``meets_target`` and ``identical`` (with ``check``).
Speed-ups are None when a command failed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from importlib import metadata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp

VOCAB = 50257
TIME = "/usr/bin/time"


def log(*parts: object) -> None:
    """Progress line on stderr."""
    print(f"[bench_long_count {time.strftime('%H:%M:%S')}]", *parts, file=sys.stderr, flush=True)


def load_average() -> list[float]:
    """The 1/5/15-minute load averages, rounded."""
    return [round(x, 2) for x in os.getloadavg()]


# --------------------------------------------------------------------------- corpus


def _document_lengths(rng: np.random.Generator, tokens: int, mean: float, sigma: float) -> np.ndarray:
    """Log-normal document lengths (>= 1) summing to exactly ``tokens`` (the last one cut)."""
    typical = float(np.exp(mean + sigma**2 / 2))
    parts, total = [], 0
    while total < tokens:
        draw = np.maximum(rng.lognormal(mean, sigma, size=max(16, int(1.2 * (tokens - total) / typical))), 1)
        draw = draw.astype(np.int64)
        parts.append(draw)
        total += int(draw.sum())
    lengths = np.concatenate(parts)
    ends = np.cumsum(lengths)
    keep = int(np.searchsorted(ends, tokens)) + 1  # first document reaching the target
    lengths = lengths[:keep]
    lengths[-1] -= int(ends[keep - 1]) - tokens
    return lengths[lengths > 0]


PLANTED_VOCAB = 8  # planted documents open with tokens from this many ids (the last ones of V)


def generate(root: Path, *, tokens: int, files: int, row_groups: int, vocab: int, seed: int,
             mean: float = 6.5, sigma: float = 1.0, planted: int = 0) -> dict:
    """Write the corpus once; a stamp file records what was generated (reused when equal).

    ``planted > 0``: the first ``planted`` tokens of every document come from the last
    :data:`PLANTED_VOCAB` ids of the vocabulary (a positional structure at positions
    ``0 .. planted - 1`` in truncate mode)."""
    stamp = root / "corpus.json"
    want = {"tokens": tokens, "files": files, "row_groups": row_groups, "vocab": vocab, "seed": seed,
            "lengths": f"lognormal({mean}, {sigma})", "zipf": 1.1, **({"planted": planted} if planted else {})}
    if stamp.exists() and json.loads(stamp.read_text()).get("params") == want:
        log(f"corpus {root} up to date")
        return json.loads(stamp.read_text())
    log(f"generating {tokens:,} tokens in {files} files under {root}")
    t = time.perf_counter()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    total = documents = 0
    for f in range(files):
        rng = np.random.default_rng([seed, f])
        per_file = tokens // files + (1 if f < tokens % files else 0)
        lengths = _document_lengths(rng, max(per_file, 1), mean, sigma)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        values = ((rng.zipf(1.1, size=int(offsets[-1])) - 1) % vocab).astype(np.int32)
        for k in range(planted):
            starts = offsets[:-1][lengths > k]
            values[starts + k] = vocab - PLANTED_VOCAB + rng.integers(0, PLANTED_VOCAB, starts.size)
        column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        rows_per_group = -(-len(lengths) // row_groups)
        pq.write_table(pa.table({"input_ids": column}), root / f"part-{f:04d}.parquet", row_group_size=rows_per_group)
        total += int(offsets[-1])
        documents += len(lengths)
        del values, column, offsets
    info = {"params": want, "tokens_written": total, "documents": documents,
            "bytes": sum(p.stat().st_size for p in root.glob("*.parquet")),
            "generate_s": round(time.perf_counter() - t, 1)}
    stamp.write_text(json.dumps(info))
    return info


def corpus_files(root: Path) -> list[str]:
    """The corpus' Parquet files, sorted."""
    return sorted(str(p) for p in root.glob("*.parquet"))


# --------------------------------------------------------------------------- baselines

BASELINE_SCIPY = r'''
"""The scipy script a user would write: per file, positions arange % n, COO -> CSR, summed."""
import sys, time
from pathlib import Path
import numpy as np
import pyarrow.parquet as pq
import scipy.sparse as sp

folder, n, V = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
total = None
for path in sorted(Path(folder).glob("*.parquet")):
    tok = pq.read_table(path).column(0).combine_chunks().values.to_numpy()
    pos = np.arange(tok.size) % n
    part = sp.coo_matrix((np.ones(tok.size, np.int64), (pos, tok)), shape=(n, V)).tocsr()
    total = part if total is None else total + part
    del tok, pos, part
print("nnz", total.nnz, "total", int(total.sum()))
if len(sys.argv) > 4:
    t = time.perf_counter()
    sp.save_npz(sys.argv[4], total, compressed=False)
    print("save_s", time.perf_counter() - t)
'''

BASELINE_ADD_AT = r'''
"""pyarrow + np.add.at into a dense int64 (n, V) array (pack: positions arange % n per file)."""
import sys, time
from pathlib import Path
import numpy as np
import pyarrow.parquet as pq
import scipy.sparse as sp

folder, n, V = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
C = np.zeros((n, V), dtype=np.int64)
for path in sorted(Path(folder).glob("*.parquet")):
    column = pq.read_table(path).column(0).combine_chunks()
    offsets = column.offsets.to_numpy()
    tok = column.values.to_numpy()[offsets[0]:offsets[-1]]
    pos = np.arange(tok.size) % n
    np.add.at(C, (pos, tok), 1)
    del column, tok, pos
print("nnz", int(np.count_nonzero(C)), "total", int(C.sum()))
if len(sys.argv) > 4:
    t = time.perf_counter()
    sp.save_npz(sys.argv[4], sp.csr_array(C), compressed=False)
    print("save_s", time.perf_counter() - t)
'''


def write_script(text: str, workdir: Path, name: str) -> str:
    """Write a baseline script's text to a file; its path."""
    path = workdir / name
    path.write_text(text)
    return str(path)


def _script_value(stdout: str, key: str) -> float | None:
    """The value printed after ``key`` by a baseline script (``key value`` pairs), or None."""
    for line in stdout.splitlines():
        words = line.split()
        for i, w in enumerate(words[:-1]):
            if w == key:
                return float(words[i + 1])
    return None


# --------------------------------------------------------------------------- measuring


def _ps_snapshot() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, rss KiB, name) of every process, from ``ps``; ``ray::X`` titles kept."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,rss=,comm=,args="], capture_output=True, text=True, check=False).stdout
    table = {}
    for line in out.splitlines():
        parts = line.split(None, 4)
        if len(parts) < 4:
            continue
        args = parts[4] if len(parts) > 4 else ""
        name = args.split()[0] if args.startswith("ray::") else parts[3]
        if name.startswith("python") and args:  # name Python processes by their script / module
            words = args.split()
            script = next((w for w in words[1:] if not w.startswith("-")), "")
            if "-m" in words:
                script = words[words.index("-m") + 1] if words.index("-m") + 1 < len(words) else script
            name = f"python:{Path(script).name}" if script else name
        if parts[0].isdigit() and parts[1].isdigit() and parts[2].isdigit():
            table[int(parts[0])] = (int(parts[1]), int(parts[2]), name)
    return table


def _descendants(table: dict[int, tuple[int, int, str]], root: int) -> list[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        if pid in table:
            found.append(pid)
        stack.extend(children.get(pid, []))
    return found


class TreeSampler(threading.Thread):
    """Samples the RSS of a process tree every ``interval`` s while it runs: the peak per
    process name (and the number of distinct pids seen under it) and the peak of the sum."""

    def __init__(self, root_pid: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.root_pid, self.interval = root_pid, interval
        self.stop_event = threading.Event()
        self.peak: dict[int, int] = {}  # pid -> peak RSS, KiB
        self.proc_name: dict[int, str] = {}  # pid -> its most telling name seen
        self.peak_sum = 0
        self.samples = 0

    def _remember(self, pid: int, rss: int, name: str) -> None:
        """Record one process' RSS; a Ray actor keeps its class name (``ray::CountWorker``),
        not the method it is running or ``ray::IDLE``."""
        self.peak[pid] = max(self.peak.get(pid, 0), rss)
        if name.startswith("ray::"):
            name = name.split(".")[0]
        if pid not in self.proc_name or self.proc_name[pid] in ("ray::IDLE", "python:default_worker.py"):
            self.proc_name[pid] = name

    def run(self) -> None:
        """Sample until stopped."""
        while not self.stop_event.is_set():
            try:
                table = _ps_snapshot()
            except (OSError, ValueError):  # ps missing or unreadable: sample nothing more
                break
            total = 0
            for pid in _descendants(table, self.root_pid):
                _, rss, name = table[pid]
                if rss == 0 or name == Path(TIME).name:  # zombies; the /usr/bin/time wrapper
                    continue
                total += rss
                self._remember(pid, rss, name)
            self.peak_sum = max(self.peak_sum, total)
            self.samples += 1
            self.stop_event.wait(self.interval)

    def report(self) -> dict:
        """Peaks in GB (10^9 bytes): per process name (the largest of the processes with that
        name, and how many there were), the largest process, and the tree's summed RSS."""
        per_name: dict[str, int] = {}
        count: dict[str, int] = {}
        for pid, kib in self.peak.items():
            per_name[self.proc_name[pid]] = max(per_name.get(self.proc_name[pid], 0), kib)
            count[self.proc_name[pid]] = count.get(self.proc_name[pid], 0) + 1
        names = sorted(per_name, key=per_name.get, reverse=True)
        return {
            "per_process_peak_gb": {n: round(per_name[n] * 1024 / 1e9, 3) for n in names},
            "processes_per_name": {n: count[n] for n in names},
            "max_process_gb": round(max(self.peak.values(), default=0) * 1024 / 1e9, 3),
            "tree_sum_peak_gb": round(self.peak_sum * 1024 / 1e9, 3),
            "samples": self.samples,
        }


_RUSAGE_WRAPPER = (
    "import resource, subprocess, sys; rc = subprocess.call(sys.argv[2:]);"
    "u = resource.getrusage(resource.RUSAGE_CHILDREN);"
    "open(sys.argv[1], 'w').write(f'{u.ru_maxrss} {u.ru_utime} {u.ru_stime}'); sys.exit(rc)"
)


def run_measured(cmd: list[str], workdir: Path, label: str, *, sample_s: float, env: dict | None = None) -> dict:
    """Run ``cmd`` once as a subprocess: wall seconds, peak RSS (one process, GB), CPU
    seconds (user + system of the command and the children it waited for: all its threads;
    not Ray's actors, which its raylet starts), exit code, stdout, last stderr lines, and
    the sampled per-process RSS of its tree."""
    rss_file = workdir / f"{label}.maxrss"
    if Path(TIME).exists():
        full = [TIME, "-f", "%M %U %S", "-o", str(rss_file), *cmd]
    else:  # a fresh Python per measurement, so RUSAGE_CHILDREN is this command's alone
        full = [sys.executable, "-c", _RUSAGE_WRAPPER, str(rss_file), *cmd]
    out_path, err_path = workdir / f"{label}.stdout", workdir / f"{label}.stderr"
    log(f"{label}: {' '.join(cmd[:6])}{' ...' if len(cmd) > 6 else ''}")
    with open(out_path, "w") as out, open(err_path, "w") as err:
        t = time.perf_counter()
        proc = subprocess.Popen(full, stdout=out, stderr=err, env=env)
        sampler = TreeSampler(proc.pid, sample_s)
        sampler.start()
        rc = proc.wait()
        wall = time.perf_counter() - t
    sampler.stop_event.set()
    sampler.join()
    try:
        fields = rss_file.read_text().strip().splitlines()[-1].split()
        peak_kib, cpu = int(fields[0]), float(fields[1]) + float(fields[2])
    except (OSError, ValueError, IndexError):
        peak_kib, cpu = 0, None
    stderr_lines = [ln for ln in err_path.read_text(errors="replace").splitlines() if ln.strip()]
    if Path(TIME).exists() and stderr_lines and stderr_lines[-1].startswith("Command exited with non-zero status"):
        stderr_lines = stderr_lines[:-1]
    log(f"{label}: rc={rc} {wall:.2f} s, peak {peak_kib / 1e6 * 1.024:.2f} GB")
    return {
        "seconds": wall,
        "peak_rss_gb": peak_kib * 1024 / 1e9,
        "cpu_s": cpu,
        "returncode": rc,
        "stdout": out_path.read_text(errors="replace"),
        "stderr_tail": stderr_lines[-5:],
        "sampled": sampler.report(),
    }


def summarize(trials: list[dict], *, seconds: list[float] | None = None) -> dict:
    """Best-of-N summary of ``run_measured`` trials (``seconds`` overrides their wall times)."""
    secs = seconds if seconds is not None else [t["seconds"] for t in trials]
    best = int(np.argmin(secs))
    return {
        "seconds": [round(s, 3) for s in secs],
        "best_s": round(secs[best], 3),
        "peak_rss_gb": [round(t["peak_rss_gb"], 3) for t in trials],
        "best_peak_rss_gb": round(min(t["peak_rss_gb"] for t in trials), 3),
        "cpu_s": [None if t.get("cpu_s") is None else round(t["cpu_s"], 2) for t in trials],
        # CPU seconds per wall second of the fastest trial: how many cores it kept busy
        "cores_busy": (round(trials[best]["cpu_s"] / secs[best], 2)
                       if trials[best].get("cpu_s") is not None and secs[best] > 0 else None),
        "returncode": [t["returncode"] for t in trials],
        "stderr_tail": trials[best]["stderr_tail"],
        "sampled": trials[best]["sampled"],
        "load": load_average(),
        **({"phases_s": [t.get("phases_s") for t in trials]} if any("phases_s" in t for t in trials) else {}),
    }


def posstats_cmd(files: list[str], out: Path, n: int, vocab: int, *extra: str) -> list[str]:
    """``posstats count`` over ``files`` in pack mode (``python -m posstats.cli``)."""
    cmd = [sys.executable, "-m", "posstats.cli", "count"]
    for f in files:
        cmd += ["--input", f]
    return [*cmd, "--column", "input_ids", "--positions", str(n), "--vocab-size", str(vocab),
            "--mode", "pack", "--out", str(out), *extra]


def child_env() -> dict:
    """Environment for the subprocesses: an embedded local Ray (no ``RAY_ADDRESS``), no usage stats."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    return env


# --------------------------------------------------------------------------- checking


def _as_csr(matrix) -> sp.csr_array:
    """An int64 CSR array of a dense or sparse matrix."""
    return sp.csr_array(matrix, dtype=np.int64)


def same_counts(a, b) -> bool:
    """Equal shapes and entries (dense or sparse inputs)."""
    a, b = _as_csr(a), _as_csr(b)
    return a.shape == b.shape and (a != b).nnz == 0


def compare_to_npz(out_dir: Path, npz: Path) -> dict:
    """``posstats`` counts in ``out_dir`` against a baseline's ``save_npz`` file."""
    from posstats.counting.io import load_counts

    try:
        got = load_counts(out_dir)
        ref = sp.load_npz(npz)
        result = {"identical": same_counts(got.matrix, ref), "posstats_tokens": int(got.tokens),
                  "baseline_tokens": int(ref.sum()), "posstats_sparse": bool(got.is_sparse)}
        result["identical"] &= result["posstats_tokens"] == result["baseline_tokens"]
    except Exception as exc:  # noqa: BLE001 - report, do not crash the benchmark
        result = {"identical": False, "error": f"{type(exc).__name__}: {exc}"}
    gc.collect()
    return result


def compare_outputs(a_dir: Path, b_dir: Path) -> dict:
    """Two ``posstats count`` outputs: matrices, token totals and fingerprints."""
    from posstats.counting.io import load_counts

    try:
        a, b = load_counts(a_dir), load_counts(b_dir)
        result = {"identical": same_counts(a.matrix, b.matrix) and a.tokens == b.tokens,
                  "tokens": [int(a.tokens), int(b.tokens)], "same_fingerprint": a.fingerprint == b.fingerprint}
    except Exception as exc:  # noqa: BLE001 - reported in the JSON
        result = {"identical": False, "error": f"{type(exc).__name__}: {exc}"}
    gc.collect()
    return result


# --------------------------------------------------------------------------- cases


def versus(baseline: dict, ours: dict, target: float) -> dict:
    """Speed-up and memory ratio of ``posstats`` against a baseline (best of each); None
    where either command failed in any repeat."""
    ok = not any(baseline["returncode"]) and not any(ours["returncode"]) and ours["best_s"] > 0
    speedup = baseline["best_s"] / ours["best_s"] if ok else None
    ratio = ours["best_peak_rss_gb"] / baseline["best_peak_rss_gb"] if ok and baseline["best_peak_rss_gb"] else None
    return {
        "speedup": None if speedup is None else round(speedup, 3),
        "target_speedup": target,
        "memory_ratio": None if ratio is None else round(ratio, 3),
        "meets_target": {"speedup": bool(speedup is not None and speedup >= target),
                         "memory_not_above_baseline": None if ratio is None else bool(ratio <= 1.0)},
    }


def baseline_vs_posstats(ctx: dict, root: Path, *, n: int, script: str, name: str, target: float) -> dict:
    """A baseline script and ``posstats count`` on the corpus in ``root``, ``--repeats`` times
    each (interleaved); the posstats output of the best run is kept in ``ctx``."""
    args, work = ctx["args"], ctx["work"]
    files = corpus_files(root)
    script_path = write_script(script, work, f"baseline_{name}.py")
    base_trials, base_secs, ours_trials, outs, check = [], [], [], [], {}
    for r in range(args.repeats):
        npz = work / f"{name}-baseline-{r}.npz"
        t = run_measured([sys.executable, script_path, str(root), str(n), str(args.vocab), str(npz)],
                         work, f"{name}-baseline-{r}", sample_s=args.sample_s, env=ctx["env"])
        save_s = _script_value(t["stdout"], "save_s") or 0.0
        base_trials.append(t)
        base_secs.append(t["seconds"] - save_s)
        if t["returncode"]:
            ctx["errors"].append({"case": name, "what": "baseline", "stderr_tail": t["stderr_tail"]})
        out = work / f"{name}-posstats-{r}"
        t = run_measured(posstats_cmd(files, out, n, args.vocab), work, f"{name}-posstats-{r}",
                         sample_s=args.sample_s, env=ctx["env"])
        ours_trials.append(t)
        outs.append(out)
        if t["returncode"]:
            ctx["errors"].append({"case": name, "what": "posstats count", "stderr_tail": t["stderr_tail"]})
        elif not check and npz.exists():
            check = compare_to_npz(out, npz)
        npz.unlink(missing_ok=True)
    baseline = summarize(base_trials, seconds=base_secs)
    baseline["wall_with_save_s"] = [round(t["seconds"], 3) for t in base_trials]
    baseline["nnz"] = _script_value(base_trials[0]["stdout"], "nnz")
    baseline["total"] = _script_value(base_trials[0]["stdout"], "total")
    ours = summarize(ours_trials)
    ok = [i for i, t in enumerate(ours_trials) if t["returncode"] == 0]
    ctx[f"{name}_out"] = outs[min(ok, key=lambda i: ours_trials[i]["seconds"])] if ok else None
    ctx[f"{name}_inprocess_s"] = ours["best_s"] if ok else None
    for i, out in enumerate(outs):
        if out != ctx[f"{name}_out"]:
            shutil.rmtree(out, ignore_errors=True)
    return {"positions": n, "mode": "pack", "baseline": baseline, "posstats": ours,
            **versus(baseline, ours, target), "identical": bool(check.get("identical", False)), "check": check}


def case_long(ctx: dict) -> dict:
    """n = 131,072: the scipy COO->CSR script against ``posstats count``."""
    result = baseline_vs_posstats(ctx, ctx["long_root"], n=ctx["args"].positions, script=BASELINE_SCIPY,
                                  name="long", target=3.0)
    result["baseline_script"] = "scipy coo_matrix(...).tocsr() per file, summed"
    return result


def ray_phases(out: Path) -> dict:
    """The Ray run's phase times from its ``count.json`` (start-up, counting, reduce steps)."""
    info = json.loads((out / "count.json").read_text()).get("ray", {})
    return {k: info[k] for k in sorted(info) if k.endswith("_s")} | {"shards": info.get("shards"),
                                                                      "reduce_ranges": info.get("reduce_ranges")}


def case_ray(ctx: dict) -> dict:
    """``posstats count --ray --workers 2`` against the in-process ``posstats count``."""
    args, work, env = ctx["args"], ctx["work"], ctx["env"]
    files = corpus_files(ctx["long_root"])
    n = args.positions
    inproc_out = ctx.get("long_out")
    if inproc_out is None:  # case long not run (or failed): run the in-process count here
        trials = []
        for r in range(args.repeats):
            out = work / f"ray-inprocess-{r}"
            trials.append(run_measured(posstats_cmd(files, out, n, args.vocab), work, f"ray-inprocess-{r}",
                                       sample_s=args.sample_s, env=env))
        inproc = summarize(trials)
        ok = [i for i, t in enumerate(trials) if t["returncode"] == 0]
        inproc_out = work / f"ray-inprocess-{min(ok, key=lambda i: trials[i]['seconds'])}" if ok else None
        for r in range(args.repeats):
            if work / f"ray-inprocess-{r}" != inproc_out:
                shutil.rmtree(work / f"ray-inprocess-{r}", ignore_errors=True)
        inproc_s = inproc["best_s"] if ok else None
        if not ok:
            ctx["errors"].append({"case": "ray", "what": "posstats count (in-process)",
                                  "stderr_tail": trials[0]["stderr_tail"]})
    else:
        inproc, inproc_s = {"from_case": "long"}, ctx["long_inprocess_s"]
    ray_trials, check = [], {}
    for r in range(args.repeats):
        out = work / f"ray-{r}"
        store = work / f"ray-store-{r}"
        t = run_measured(posstats_cmd(files, out, n, args.vocab, "--ray", "--workers", str(args.workers),
                                      "--store", str(store)),
                         work, f"ray-{r}", sample_s=args.sample_s, env=env)
        ray_trials.append(t)
        if t["returncode"]:
            ctx["errors"].append({"case": "ray", "what": "posstats count --ray", "stderr_tail": t["stderr_tail"]})
        else:
            t["phases_s"] = ray_phases(out)
            if not check and inproc_out is not None:
                check = compare_outputs(inproc_out, out)
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)
    ray = summarize(ray_trials)
    speedup = inproc_s / ray["best_s"] if inproc_s and not any(ray["returncode"]) else None
    return {
        "positions": n, "workers": args.workers, "in_process": inproc, "in_process_best_s": inproc_s, "ray": ray,
        "speedup": None if speedup is None else round(speedup, 3), "target_speedup": 1.6,
        "meets_target": {"speedup": bool(speedup is not None and speedup >= 1.6)},
        "identical": bool(check.get("identical", False)), "check": check,
        "ray_processes_peak_gb": ray["sampled"]["per_process_peak_gb"],
    }


def case_short(ctx: dict) -> dict:
    """n = 4096: pyarrow + ``np.add.at`` into a dense array against ``posstats count``."""
    result = baseline_vs_posstats(ctx, ctx["short_root"], n=ctx["args"].short_positions, script=BASELINE_ADD_AT,
                                  name="short", target=4.0)
    result["baseline_script"] = "pyarrow + np.add.at into dense int64 (n, V), positions arange % n per file"
    return result


def case_billion(ctx: dict) -> dict:
    """1e9 tokens, n = 131,072, ``posstats count --ray --workers 2``: time and per-process memory."""
    args, work = ctx["args"], ctx["work"]
    out, store = work / "billion-out", work / "billion-store"
    t = run_measured(posstats_cmd(corpus_files(ctx["billion_root"]), out, args.positions, args.vocab,
                                  "--ray", "--workers", str(args.workers), "--store", str(store)),
                     work, "billion", sample_s=args.sample_s, env=ctx["env"])
    if t["returncode"]:
        ctx["errors"].append({"case": "billion", "what": "posstats count --ray", "stderr_tail": t["stderr_tail"]})
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(store, ignore_errors=True)
    sampled = t["sampled"]
    return {
        "positions": args.positions, "workers": args.workers, "seconds": round(t["seconds"], 2),
        "returncode": t["returncode"], "last_stderr_line": t["stderr_tail"][-1] if t["stderr_tail"] else "",
        "peak_rss_gb": round(t["peak_rss_gb"], 3), "sampled": sampled,
        "target_max_process_gb": 6,
        "meets_target": {"max_process_gb": bool(t["returncode"] == 0 and max(sampled["max_process_gb"],
                                                                               t["peak_rss_gb"]) <= 6)},
        "load": load_average(),
    }


CASES = {"long": case_long, "ray": case_ray, "short": case_short, "billion": case_billion}


# --------------------------------------------------------------------------- main


def run_cases(cases: dict, selected: list[str], ctx: dict, report: dict) -> None:
    """Run the ``selected`` cases in ``cases``' order into ``report`` (each with its
    ``case_s``); a failing case is reported (and listed in ``ctx["errors"]``), not fatal."""
    for name in [c for c in cases if c in selected]:
        log(f"case {name}")
        t = time.perf_counter()
        try:
            report[name] = cases[name](ctx)
        except Exception as exc:  # noqa: BLE001 - one failing case does not lose the others
            log(traceback.format_exc())
            report[name] = {"error": f"{type(exc).__name__}: {exc}"}
            ctx["errors"].append({"case": name, "what": "benchmark", "error": report[name]["error"]})
        report[name]["case_s"] = round(time.perf_counter() - t, 1)


def machine() -> dict:
    """Platform, CPUs and library versions."""
    versions = {}
    for pkg in ("numpy", "scipy", "pyarrow", "ray", "posstats"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1),
            "peak_rss_method": "/usr/bin/time -f %M" if Path(TIME).exists() else "RUSAGE_CHILDREN of a fresh Python",
            "versions": versions}


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="long,ray,short", help="comma-separated: long,ray,short,billion")
    ap.add_argument("--dir", default="/tmp/posstats-bench-long", help="corpus folder (short: DIR-short, billion: DIR-billion)")
    ap.add_argument("--tokens", type=float, default=2.02e8)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--row-groups", type=int, default=4, help="row groups (= Ray shards) per file")
    ap.add_argument("--positions", type=int, default=131072)
    ap.add_argument("--vocab", type=int, default=VOCAB)
    ap.add_argument("--short-tokens", type=float, default=2e7)
    ap.add_argument("--short-files", type=int, default=4)
    ap.add_argument("--short-positions", type=int, default=4096)
    ap.add_argument("--billion-tokens", type=float, default=1e9)
    ap.add_argument("--billion-files", type=int, default=40)
    ap.add_argument("--workers", type=int, default=2, help="Ray workers (cases ray, billion)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sample-s", type=float, default=0.2, help="ps sampling interval")
    ap.add_argument("--workdir", default=None, help="scratch folder for outputs (default: a fresh temp dir, removed)")
    args = ap.parse_args()
    args.case_list = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = set(args.case_list) - set(CASES)
    if unknown:
        ap.error(f"unknown cases: {sorted(unknown)}; choose from {sorted(CASES)}")
    return args


def prepare_corpora(args: argparse.Namespace, ctx: dict) -> dict:
    """Generate (or reuse) the corpora the selected cases need; their stamp infos."""
    base = Path(args.dir)
    ctx["long_root"], ctx["short_root"], ctx["billion_root"] = base, Path(f"{args.dir}-short"), Path(f"{args.dir}-billion")
    corpora = {}
    common = {"row_groups": args.row_groups, "vocab": args.vocab, "seed": args.seed}
    if {"long", "ray"} & set(args.case_list):
        corpora["long"] = generate(base, tokens=int(args.tokens), files=args.files, **common)
    if "short" in args.case_list:
        corpora["short"] = generate(ctx["short_root"], tokens=int(args.short_tokens), files=args.short_files, **common)
    if "billion" in args.case_list:
        corpora["billion"] = generate(ctx["billion_root"], tokens=int(args.billion_tokens), files=args.billion_files,
                                      **common)
    return corpora


def main() -> None:
    """Run the selected cases; print the JSON report."""
    args = parse_args()
    report: dict = {"benchmark": "long_count", "machine": machine(), "load_before": load_average(),
                    "params": {k: v for k, v in vars(args).items() if k != "case_list"}}
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="posstats-bench-long-"))
    work.mkdir(parents=True, exist_ok=True)
    ctx: dict = {"args": args, "work": work, "env": child_env(), "errors": []}
    try:
        report["corpora"] = prepare_corpora(args, ctx)
        run_cases(CASES, args.case_list, ctx, report)  # long before ray
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    report["errors"] = ctx["errors"]
    report["machine"]["load_after"] = load_average()
    report["machine"]["load_before"] = report.pop("load_before")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
