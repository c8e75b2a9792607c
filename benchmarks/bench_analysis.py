"""Benchmark: honest analysis at long context, as a user runs it (issue "honest by default").

    python benchmarks/bench_analysis.py [--cases stationary,planted,rope,held_out,pipeline] [--tokens 2.02e8]
        [--baselines plugin,reread] [--dir /tmp/posstats-bench-long] [--workdir DIR]

Prints one JSON object. Each case generates its corpus (the generator of
``bench_long_count.py``: log-normal documents, Zipf tokens over V = 50,257; reused when
its stamp matches), counts it with ``posstats count`` (in-process, n = 131,072) and runs
``posstats analyze`` with **default options**, measured as a subprocess (wall seconds,
peak RSS of every process):

- ``stationary``: 200 M tokens in ``pack`` mode (a stationary stream: nothing positional
  to find). Targets: a noise floor reported, 0 components above the null, H1 not flagged
  non-stationary, <= 8 GB peak and <= 5 min.
- ``planted``: the same size in ``truncate`` mode, every document opening with 4 tokens
  drawn from 8 ids. Targets: >= 1 component above the null, and the verdict names
  positions 0-3 as the ones that stand out.
- ``rope``: the planted corpus analysed with RoPE scaling variants at head dims 64 and 128
  (a YaRN factor sweep 4|8|16|32, PI, dynamic NTK, Llama 3 at factor 32 from a 4k original,
  and ``hf:`` of a YaRN Llama config written by transformers), sampled stress. Baseline:
  the same analysis scoring only ``sinusoidal,rope``: the cost of the variants.
- ``held_out``: the planted corpus analysed with ``--held-out on`` (above the exact limit:
  a Lanczos MDS of one half of the tokens, sampled stress on both halves), default
  encodings. Baseline: the default analysis (held-out scores are ``auto``: off at this
  size). Reports the cost and the in-sample against held-out scaled stress of MDS.
- ``pipeline``: 1 B tokens (40 files, ``--billion-tokens``) through ``posstats pipeline``
  (count -> reduce -> geometry -> report -> export) on the embedded Ray with 2 workers,
  pack mode, default analysis, once per ``--geometry-cpus`` value (``[ray] geometry_cpus``,
  ``default`` leaving the key out;
  the first run is the baseline of the others). Targets (issue #31): <= 6 min end to end
  to report.html and the export (a table, or the README of an export refused for a table
  of noise), no process above 4 GB; the time of every stage (from its marker) and the
  peak memory of every process.

Baselines, measured in the same run on the same counts (``--baselines``):

- ``plugin``: ``posstats analyze --noise-floor off --distances plugin`` (what analyze did
  by default before: no noise estimate, plug-in rank and non-stationarity);
- ``strict``: ``--lanczos-noise-share 0 --untested-lanczos-noise-share 0`` (every eigenpair
  to the Lanczos tolerance, the noise bulk included: what the MDS cost before its accuracy
  followed the null);
- ``tested``: ``--untested-stress-halfwidth 0.001 --untested-lanczos-noise-share 0.001``
  (the accuracy of a tested geometry even when no test can find structure: what analyze
  did before the fifteenth session; ``geometry.untested``, docs/long-context.md);
- ``reread``: ``--noise-floor on --reread`` (the noise floor from the corpus re-read and
  split by document parity: the earlier honest path, 5.8 min and 19 GB at this size);
- ``cpu``: ``--device cpu`` (the host's Lanczos products: on a machine with a GPU the
  default, ``auto``, multiplies there).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_long_count import (  # noqa: E402 - the sibling benchmark's corpus and measuring tools
    VOCAB,
    child_env,
    corpus_files,
    generate,
    load_average,
    machine,
    run_cases,
    run_measured,
)

TARGET_S = 300.0
TARGET_GB = 8.0


def count(ctx: dict, root: Path, mode: str, label: str) -> tuple[Path, dict]:
    """``posstats count`` of the corpus in ``root`` (n = --positions, ``mode``)."""
    args, work = ctx["args"], ctx["work"]
    out = work / f"{label}-counts"
    cmd = [sys.executable, "-m", "posstats.cli", "count"]
    for f in corpus_files(root):
        cmd += ["--input", f]
    cmd += ["--column", "input_ids", "--positions", str(args.positions), "--vocab-size", str(args.vocab),
            "--mode", mode, "--out", str(out)]
    t = run_measured(cmd, work, f"{label}-count", sample_s=args.sample_s, env=ctx["env"])
    return out, _brief(t)


def analyze(ctx: dict, counts: Path, label: str, *extra: str) -> tuple[dict, dict | None]:
    """``posstats analyze`` of ``counts`` (defaults plus ``extra``): measurement and report."""
    out = ctx["work"] / f"{label}-analysis"
    cmd = [sys.executable, "-m", "posstats.cli", "analyze", "--counts", str(counts), "--out", str(out), *extra]
    t = run_measured(cmd, ctx["work"], label, sample_s=ctx["args"].sample_s, env=ctx["env"])
    report = json.loads((out / "report.json").read_text()) if t["returncode"] == 0 else None
    if t["returncode"]:
        ctx["errors"].append({"case": label, "stderr_tail": t["stderr_tail"]})
    return _brief(t), report


def _brief(t: dict) -> dict:
    """The parts of a measurement worth printing."""
    return {"seconds": round(t["seconds"], 1), "peak_rss_gb": round(t["peak_rss_gb"], 2), "returncode": t["returncode"],
            "stderr_tail": t["stderr_tail"] if t["returncode"] else [], "load": load_average()}


def _facts(report: dict | None) -> dict:
    """What a reader checks in a report: verdict, noise floor, H1, timings."""
    if report is None:
        return {}
    v, noise, h1 = report["verdict"], report.get("noise") or {}, report["diagnostics"]["h1"]
    return {
        "components_above_noise": v["components_above_noise"],
        "null": {k: (report.get("null") or {}).get(k) for k in ("method", "threshold")},
        "positions_distinguishable": v["positions_distinguishable"],
        "standout": {k: (v.get("standout_positions") or {}).get(k) for k in ("count", "ranges", "max_z")},
        "noise_floor": bool(noise.get("estimated")),
        "noise_source": noise.get("source"),
        "median_bias_d_h2": (noise.get("bias_d_h2") or {}).get("median"),
        "distances": report["geometry"]["distances"],
        "h1_nonstationary": h1["nonstationary"],
        "h1_min_distance": h1["min_distance"],
        "best_encodings": [(b["dim"], b["best"], b["tied_with"]) for b in v["best_encodings"]],
        "scaled_stress": {f"{e['name']}@{e['dim']}": round(e["scaled_stress"], 6) for e in report["encodings"]},
        "lanczos": {k: report["spectrum"].get(k) for k in ("max_residual", "noise_level", "noise_residual", "device")},
        "untested": report["geometry"].get("untested"),
        "top_eigenvalues": [round(x, 6) for x in report["spectrum"].get("eigenvalues", [])[:4]],
        "timings_s": report["timings_s"],
    }


def _baselines(ctx: dict, counts: Path, label: str) -> dict:
    out = {}
    for name in ctx["args"].baseline_list:
        extra = {"plugin": ("--noise-floor", "off", "--distances", "plugin"),
                 "reread": ("--noise-floor", "on", "--reread"),
                 "strict": ("--lanczos-noise-share", "0", "--untested-lanczos-noise-share", "0"),
                 "tested": ("--untested-stress-halfwidth", "0.001", "--untested-lanczos-noise-share", "0.001"),
                 "cpu": ("--device", "cpu")}[name]
        measured, report = analyze(ctx, counts, f"{label}-{name}", *extra)
        out[name] = {**measured, "options": " ".join(extra), **_facts(report)}
    return out


def case_stationary(ctx: dict) -> dict:
    """200 M packed tokens: nothing positional; the defaults must say so, within budget."""
    counts, counted = count(ctx, ctx["roots"]["stationary"], "pack", "stationary")
    measured, report = analyze(ctx, counts, "stationary-default")
    facts = _facts(report)
    ok = report is not None
    targets = {
        "noise_floor_reported": ok and facts["noise_floor"],
        "zero_components_above_null": ok and facts["components_above_noise"] == 0,
        "h1_not_flagged": ok and not facts["h1_nonstationary"],
        "peak_le_8_gb": measured["peak_rss_gb"] <= TARGET_GB,
        "time_le_5_min": measured["seconds"] <= TARGET_S,
    }
    return {"mode": "pack", "count": counted, "default": {**measured, **facts}, "targets": targets,
            "all_targets_met": all(targets.values()), "baselines": _baselines(ctx, counts, "stationary")}


def case_planted(ctx: dict) -> dict:
    """Truncate mode, documents opening with 4 tokens from 8 ids: found, and named."""
    counts, counted = count(ctx, ctx["roots"]["planted"], "truncate", "planted")
    measured, report = analyze(ctx, counts, "planted-default")
    facts = _facts(report)
    ok = report is not None
    targets = {
        "components_above_null_ge_1": ok and (facts["components_above_noise"] or 0) >= 1,
        "names_positions_0_to_3": ok and str(facts["standout"]["ranges"]).startswith("0-3"),
    }
    return {"mode": "truncate", "planted": "positions 0-3 from 8 ids", "count": counted, "default": {**measured, **facts},
            "used_positions": report["positions"]["used"] if ok else None, "targets": targets,
            "all_targets_met": all(targets.values()), "baselines": _baselines(ctx, counts, "planted")}


ROPE_SWEEP = ("sinusoidal,rope,rope:type=linear,original=4096,factor=32,rope:type=dynamic,original=4096,factor=32,"
              "rope:type=yarn,original=4096,factor=4|8|16|32,"
              "rope:type=llama3,original=4096,factor=32,low_freq_factor=1,high_freq_factor=4")


def case_rope(ctx: dict) -> dict:
    """RoPE scaling variants at n = 131,072 on the planted corpus (truncate): a YaRN factor
    sweep, PI, dynamic NTK, Llama 3 and a model config (hf:, YaRN at head_dim 128), all
    with sampled stress. Baseline: the same analysis scoring only sinusoidal and plain RoPE."""
    from transformers import (
        LlamaConfig,  # the model config is written by transformers itself
    )

    model = ctx["work"] / "yarn-model"
    LlamaConfig(hidden_size=4096, num_attention_heads=32, max_position_embeddings=131072,
                rope_parameters={"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                                 "rope_theta": 500000.0}).save_pretrained(model)
    counts, counted = count(ctx, ctx["roots"]["rope"], "truncate", "rope")
    dims = ("--dims", "64,128")
    measured, report = analyze(ctx, counts, "rope-sweep", *dims, "--encodings", f"{ROPE_SWEEP},hf:{model}")
    baseline, base_report = analyze(ctx, counts, "rope-baseline", *dims, "--encodings", "sinusoidal,rope")
    ok = report is not None
    entries = report["encodings"] if ok else []
    scores = {f"{e['name'].replace(str(model), 'MODEL')}@{e['dim']}": [round(e["scaled_stress"], 5), [round(x, 5) for x in e["scaled_stress_ci95"]]]
              for e in entries}
    targets = {
        "completed": ok,
        "every_variant_scored": ok and len(entries) == 2 * 9 + 1,
        "sampled_stress": ok and all(e["stress_method"] == "sampled" for e in entries),
        "hf_at_head_dim_128": ok and any(e["name"].startswith("hf:") and e["dim"] == 128 for e in entries),
    }
    return {"mode": "truncate", "count": counted, "sweep": {**measured, **_facts(report)},
            "sweep_verdict": report["verdict"]["sweeps"] if ok else None, "scaled_stress": scores,
            "baseline": {**baseline, "options": "--encodings sinusoidal,rope", **_facts(base_report)},
            "targets": targets, "all_targets_met": all(targets.values())}


def case_held_out(ctx: dict) -> dict:
    """``--held-out on`` at n = 131,072 on the planted corpus, against the default analysis."""
    counts, counted = count(ctx, ctx["roots"]["held_out"], "truncate", "held-out")
    measured, report = analyze(ctx, counts, "held-out-on", "--held-out", "on")
    baseline, base_report = analyze(ctx, counts, "held-out-default")
    ok = report is not None and "encodings" in (report.get("held_out") or {})
    held = report["held_out"] if ok else {}
    scores = {f"{e['name']}@{e['dim']}": {"fit": round(e["fit_scaled_stress"], 5), "held_out": round(e["held_out_scaled_stress"], 5),
                                          "held_out_ci95": [round(x, 5) for x in e["held_out_scaled_stress_ci95"]]}
              for e in held.get("encodings", [])}
    targets = {
        "completed": ok,
        "sampled": ok and held["stress_method"] == "sampled",
        "every_encoding_scored": ok and len(held["encodings"]) == len([e for e in report["encodings"]]),
        "smacof_skipped_with_a_note": ok and any(s["spec"] == "mds-smacof" for s in report.get("skipped_encodings", [])),
        "default_skips_held_out": base_report is not None and "skipped" in (base_report.get("held_out") or {}),
    }
    return {"mode": "truncate", "count": counted, "held_out_on": {**measured, **_facts(report)},
            "split": held.get("split"), "tokens": held.get("tokens"), "positions": held.get("positions"),
            "held_out_best": report["verdict"]["held_out_best"] if ok else None, "scaled_stress": scores,
            "baseline": {**baseline, "options": "(defaults: --held-out auto)", **_facts(base_report)},
            "targets": targets, "all_targets_met": all(targets.values())}


PIPELINE_TOML = """\
[store]
url = "{store}"
work_dir = "{work}"

[input]
paths = ["{inputs}"]
column = "input_ids"

[count]
positions = {positions}
vocab_size = {vocab}
mode = "pack"

[ray]
workers = {workers}
{geometry_cpus}
[export]
dim = 768
layout = "gpt2"
"""


def case_pipeline(ctx: dict) -> dict:
    """1 B tokens through the whole pipeline on the embedded Ray (2 workers), once per
    ``--geometry-cpus`` value (the first is the baseline of the others, same run)."""
    args = ctx["args"]
    runs = [_pipeline_run(ctx, cpus) for cpus in args.geometry_cpus]
    out = {"tokens": int(args.billion_tokens), "workers": args.workers, **runs[0]}
    if len(runs) > 1:
        out["with_geometry_cpus"] = runs[1:]
    return out


def _pipeline_run(ctx: dict, cpus: float | None) -> dict:
    """One pipeline run with ``[ray] geometry_cpus = cpus`` (None: the pipeline's default):
    wall time, every stage's time (from its marker), every process' peak, the verdict's facts
    and the targets."""
    args = ctx["args"]
    work = ctx["work"] / ("pipeline-cpus-default" if cpus is None else f"pipeline-cpus-{cpus:g}")
    work.mkdir(parents=True, exist_ok=True)
    root = ctx["roots"]["pipeline"]
    config = work / "pipeline.toml"
    config.write_text(PIPELINE_TOML.format(store=work / "store", work=work / "pipeline-work", inputs=root / "*.parquet",
                                           positions=args.positions, vocab=args.vocab, workers=args.workers,
                                           geometry_cpus="" if cpus is None else f"geometry_cpus = {cpus}\n"))
    cmd = [sys.executable, "-m", "posstats.cli", "pipeline", "--config", str(config), "--run-id", "bench"]
    t = run_measured(cmd, work, "pipeline", sample_s=args.sample_s, env=ctx["env"])
    run = work / "store" / "runs" / "bench"
    stages, skipped = {}, None
    for stage in ("config", "count", "reduce", "geometry", "report", "export"):
        marker = run / stage / "done.json"  # the stage's completion marker (seconds: its build time)
        info = json.loads(marker.read_text()) if marker.is_file() else {}
        stages[stage] = info.get("seconds")
        skipped = skipped or (info.get("info") or {}).get("skipped") or info.get("skipped")
    report = run / "report" / "report.json"
    facts = _facts(json.loads(report.read_text())) if report.is_file() else {}
    sampled = t["sampled"]
    exported = stages["export"] is not None or any((run / "export").rglob("positions.*"))
    targets = {
        # an export refused for a table of noise (0 components above it) writes a README saying why
        "completed": t["returncode"] == 0 and (run / "report" / "report.html").is_file() and exported,
        "time_le_6_min": t["seconds"] <= 360,
        "no_process_above_4_gb": sampled["max_process_gb"] <= 4.0,
    }
    if t["returncode"]:
        ctx["errors"].append({"case": "pipeline", "geometry_cpus": cpus, "stderr_tail": t["stderr_tail"]})
    return {"geometry_cpus": cpus, **_brief(t), "stages_s": stages, "export_skipped": skipped, "memory": sampled,
            "report": facts, "targets": targets, "all_targets_met": all(targets.values())}


CASES = {"stationary": case_stationary, "planted": case_planted, "pipeline": case_pipeline, "rope": case_rope,
         "held_out": case_held_out}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="stationary,planted", help="comma-separated: stationary,planted,pipeline,rope,held_out")
    ap.add_argument("--baselines", default="plugin", help="comma-separated: plugin,reread,strict,tested,cpu (or none)")
    ap.add_argument("--dir", default="/tmp/posstats-bench-long", help="stationary corpus (planted: DIR-planted)")
    ap.add_argument("--tokens", type=float, default=2.02e8)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--row-groups", type=int, default=4)
    ap.add_argument("--positions", type=int, default=131072)
    ap.add_argument("--vocab", type=int, default=VOCAB)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--billion-tokens", type=float, default=1e9, help="tokens of the pipeline case")
    ap.add_argument("--billion-files", type=int, default=40)
    ap.add_argument("--workers", type=int, default=2, help="Ray workers of the pipeline case")
    ap.add_argument("--geometry-cpus", default="default", help="pipeline case: comma-separated [ray] geometry_cpus "
                    "values, one run each (the first is the baseline); 'default' leaves the key out (every free CPU "
                    "of the largest node)")
    ap.add_argument("--sample-s", type=float, default=0.5, help="ps sampling interval")
    ap.add_argument("--workdir", default=None, help="scratch folder (default: a fresh temp dir, removed)")
    args = ap.parse_args()
    args.case_list = [c.strip() for c in args.cases.split(",") if c.strip()]
    args.baseline_list = [b.strip() for b in args.baselines.split(",") if b.strip() and b.strip() != "none"]
    try:
        args.geometry_cpus = [None if c.strip() == "default" else float(c) for c in args.geometry_cpus.split(",") if c.strip()]
    except ValueError:
        ap.error(f"--geometry-cpus: numbers or 'default', got {args.geometry_cpus!r}")
    if set(args.case_list) - set(CASES) or set(args.baseline_list) - {"plugin", "reread", "strict", "tested", "cpu"}:
        ap.error(f"cases from {sorted(CASES)}, baselines from plugin, reread, strict, tested, cpu")
    return args


def main() -> None:
    args = parse_args()
    report: dict = {"benchmark": "analysis", "machine": machine(), "load_before": load_average(),
                    "params": {k: v for k, v in vars(args).items() if k not in ("case_list", "baseline_list")}}
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="posstats-bench-analysis-"))
    work.mkdir(parents=True, exist_ok=True)
    ctx: dict = {"args": args, "work": work, "env": child_env(), "errors": [], "roots": {}}
    common = {"tokens": int(args.tokens), "files": args.files, "row_groups": args.row_groups, "vocab": args.vocab,
              "seed": args.seed}
    try:
        report["corpora"] = {}
        if "stationary" in args.case_list:
            ctx["roots"]["stationary"] = Path(args.dir)
            report["corpora"]["stationary"] = generate(Path(args.dir), **common)
        if "planted" in args.case_list:
            ctx["roots"]["planted"] = Path(f"{args.dir}-planted")
            report["corpora"]["planted"] = generate(ctx["roots"]["planted"], planted=4, **common)
        for case in ("rope", "held_out"):
            if case in args.case_list:
                ctx["roots"][case] = Path(f"{args.dir}-planted")
                report["corpora"][case] = generate(ctx["roots"][case], planted=4, **common)
        if "pipeline" in args.case_list:
            ctx["roots"]["pipeline"] = Path(f"{args.dir}-billion")
            report["corpora"]["pipeline"] = generate(ctx["roots"]["pipeline"], **{
                **common, "tokens": int(args.billion_tokens), "files": args.billion_files})
        run_cases(CASES, args.case_list, ctx, report)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    report["errors"] = ctx["errors"]
    report["machine"]["load_after"] = load_average()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
