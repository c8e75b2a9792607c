"""Benchmark: posstats diff at long context (issue "corpus drift").

    python benchmarks/bench_drift.py [--tokens 2.02e8] [--positions 131072] [--dir /tmp/posstats-bench-long]
        [--workdir DIR]

Prints one JSON object. Three corpora from the generator of ``bench_long_count.py``
(log-normal documents, Zipf tokens over V = 50,257; reused when their stamp matches), in
``truncate`` mode at n = 131,072:

- A: every document opens with 4 tokens drawn from 8 ids (``DIR-planted``, seed 0);
- B: the same distribution, another sample (seed 1): nothing changed;
- C: 6 opening tokens from the 8 ids (seed 2): positions 4 and 5 changed, nothing else.

Each is counted (``posstats count``) and analysed (``posstats analyze``, default options):
the **baseline** is those two analyses, what a user runs anyway to compare two reports by
hand. Then ``posstats diff`` of the run folders A/B and A/C is measured (wall seconds, peak
RSS of every process). Targets: A/B reports no changed position, A/C exactly [4, 5]; the diff
reads the counts in blocks (its peak memory stays below one analysis').
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_analysis import _brief, analyze, count  # noqa: E402 - the sibling benchmarks' tools
from bench_long_count import (  # noqa: E402
    VOCAB,
    child_env,
    generate,
    load_average,
    machine,
    run_measured,
)


def diff(ctx: dict, a: Path, b: Path, label: str) -> tuple[dict, dict | None]:
    """``posstats diff`` of two run folders: measurement and diff.json."""
    out = ctx["work"] / f"{label}-diff"
    cmd = [sys.executable, "-m", "posstats.cli", "diff", str(a), str(b), "--out", str(out)]
    t = run_measured(cmd, ctx["work"], label, sample_s=ctx["args"].sample_s, env=ctx["env"])
    if t["returncode"]:
        ctx["errors"].append({"case": label, "stderr_tail": t["stderr_tail"]})
        return _brief(t), None
    return _brief(t), json.loads((out / "diff.json").read_text())


def _facts(doc: dict | None) -> dict:
    if doc is None:
        return {}
    p = doc["positions"]
    return {"summary": doc["summary"], "changed": p["changed"][:20], "tested": p["tested"],
            "most_significant": [(x["position"], round(x["p_value"], 12)) for x in p["most_significant"][:5]],
            "rank": [doc["spectrum"]["a"]["rank"], doc["spectrum"]["b"]["rank"]],
            "mds_drift_median": doc["mds_drift"].get("median")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/posstats-bench-long", help="corpora: DIR-planted, DIR-drift-b, DIR-drift-c")
    ap.add_argument("--tokens", type=float, default=2.02e8)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--row-groups", type=int, default=4)
    ap.add_argument("--positions", type=int, default=131072)
    ap.add_argument("--vocab", type=int, default=VOCAB)
    ap.add_argument("--sample-s", type=float, default=0.5, help="ps sampling interval")
    ap.add_argument("--workdir", default=None, help="scratch folder (default: a fresh temp dir, removed)")
    args = ap.parse_args()
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="posstats-bench-drift-"))
    work.mkdir(parents=True, exist_ok=True)
    ctx: dict = {"args": args, "work": work, "env": child_env(), "errors": []}
    common = {"tokens": int(args.tokens), "files": args.files, "row_groups": args.row_groups, "vocab": args.vocab}
    report: dict = {"benchmark": "drift", "machine": machine(), "load_before": load_average(),
                    "params": {k: v for k, v in vars(args).items()}}
    try:
        corpora = {"a": (Path(f"{args.dir}-planted"), 0, 4), "b": (Path(f"{args.dir}-drift-b"), 1, 4),
                   "c": (Path(f"{args.dir}-drift-c"), 2, 6)}
        report["corpora"], runs, analyses = {}, {}, {}
        for name, (root, seed, planted) in corpora.items():
            report["corpora"][name] = generate(root, seed=seed, planted=planted, **common)
            counts, counted = count(ctx, root, "truncate", name)
            analyses[name], _ = analyze(ctx, counts, f"{name}-analysis")
            analyses[name]["count"] = counted
            runs[name] = work / f"{name}-analysis-analysis"
        report["baseline_analyses"] = analyses
        ab, ab_doc = diff(ctx, runs["a"], runs["b"], "diff-a-b")
        ac, ac_doc = diff(ctx, runs["a"], runs["c"], "diff-a-c")
        report["diff_a_b"] = {**ab, **_facts(ab_doc)}
        report["diff_a_c"] = {**ac, **_facts(ac_doc)}
        analysis_peak = min(a["peak_rss_gb"] for a in analyses.values())
        report["targets"] = {
            "a_b_nothing_changed": ab_doc is not None and ab_doc["positions"]["changed"] == [],
            "a_c_exactly_4_5": ac_doc is not None and ac_doc["positions"]["changed"] == [4, 5],
            "diff_peak_below_an_analysis": max(ab["peak_rss_gb"], ac["peak_rss_gb"]) < analysis_peak,
        }
        report["all_targets_met"] = all(report["targets"].values())
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    report["errors"] = ctx["errors"]
    report["machine"]["load_after"] = load_average()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
