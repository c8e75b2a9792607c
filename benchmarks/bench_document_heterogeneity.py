"""Every claim of the verdict on corpora with no positional structure whose documents differ as real ones do.

    python benchmarks/bench_document_heterogeneity.py [--positions 64,128,256,512] [--seeds 20]
        [--documents 3000] [--analyses default,halves_reread,halves_groups] [--first-seed 0]
        [--length-scale 1] [--planted 0] [--stay 0] [--topics 1]

The simulated nulls of the calibration suite draw every document from one law (independent
tokens, Markov or successor streams). Real documents differ from each other: the bundled
fortunes hold ASCII art, lists and dialogue, and a document's kind shows at every position
it reaches. This benchmark keeps that and removes everything positional
(:func:`posstats.testing.resampled_documents`): each simulated document takes the tokens of a
random fortune (drawn with replacement) and the length of another, independent fortune, so
every position has the same law and any claim is false.

Each corpus (``--documents`` documents, counted in truncate mode at n positions with the
window groups ``posstats count`` keeps: 64 with their length classes up to 4,096 positions,
the two halves above) is analysed three ways:

- ``default``: ``null="auto"`` (what ``posstats analyze`` does);
- ``halves_reread``: ``null="mp"`` against the edge measured on the even and odd documents
  (what ``--null mp --reread`` does, the remedy the verdict's caveat names);
- ``halves_groups``: ``null="mp"`` against the window groups' halves (``--null mp``).

Prints one JSON object: per n and analysis, the number of corpora where the rank test alone
counted a component (before the verdict's gate, which claims components only where the
homogeneity or the standout test rejects), where the verdict claimed components, named a
standout position, or called the corpus non-stationary, and where it made any of these
three claims, each with its Clopper-Pearson 95 % interval; and, for the halves, the corpus'
top tested eigenvalue over the halves' noise top on the same scale (``top_over_halves``:
mean, min, max; about 1 or below on the corpora the halves' margin was set on).

``--length-scale k`` multiplies every drawn length by k: long documents of the same laws,
for contexts above 4,096 positions, where no window can be rotated and the standout test
models the documents' excess instead (:mod:`posstats.estimates.document_excess`).
``--planted a`` plants one dimension (positions 0-3 draw a share ``a`` of their tokens from
ids 1-10): the corpora are then no null, and ``standouts_exact`` counts the analyses whose
standouts are exactly positions 0-3 (the power). ``--stay s`` makes each document's tokens
dependent (each repeats the previous one with probability s, else a fresh draw from the
document's law: :func:`posstats.testing.sticky_draws`): still a null, but no longer
exchangeable within a document, which the model of the documents' excess assumes.
``--topics k`` cuts each document into k pieces at uniform points, each piece drawn from a
source of its own (:func:`posstats.testing.topic_pieces`): documents whose topic drifts
along their length, still a null, which that model (one law a document) does not describe.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FORTUNES = ROOT / "data" / "fortunes-sample.jsonl"
TOKENIZER = ROOT / "data" / "tokenizers" / "bert-base-uncased.tokenizer.json"
EXCLUDED = (0, 101, 102, 103)  # [PAD], [CLS], [SEP], [MASK]: what the README's count leaves out
ANALYSES = {"default": ("auto", None), "halves_reread": ("mp", "parts"), "halves_groups": ("mp", "groups")}
CLAIMS = ("rank_test_alone", "components", "standouts", "non_stationary", "any_claim", "standouts_exact")
PLANTED = [0, 1, 2, 3]


def fortune_documents() -> tuple[list[np.ndarray], int]:
    """The bundled fortunes as BERT ids (special tokens left out) and the vocabulary size."""
    from posstats.corpus.tokenizer import load_tokenizer

    tok = load_tokenizer(TOKENIZER)
    texts = [json.loads(line)["text"] for line in FORTUNES.read_text(encoding="utf-8").splitlines() if line.strip()]
    drop = np.array(EXCLUDED)
    docs = [np.asarray(e.ids, dtype=np.int64) for e in tok.encode_batch(texts)]
    return [d[~np.isin(d, drop)] for d in docs], int(tok.get_vocab_size())


def claims(report: dict) -> dict[str, bool]:
    """What one report claims: the rank test's count before the verdict's gate
    (``rank_test_alone``), the verdict's components, standouts and non-stationarity, and
    any of the verdict's three (``any_claim``)."""
    v, null = report["verdict"], report.get("null") or {}
    said = {"components": bool(v.get("components_above_noise")),
            "standouts": bool((v.get("standout_positions") or {}).get("count")),
            "non_stationary": bool(v.get("non_stationary"))}
    said["any_claim"] = any(said.values())
    said["rank_test_alone"] = bool(null.get("components_above_null"))
    standouts = v.get("standout_positions") or {}
    said["standouts_exact"] = standouts.get("count") == len(PLANTED) and standouts.get("positions") == PLANTED
    return said


def top_over_halves(report: dict) -> float | None:
    """The corpus' top tested eigenvalue over the halves' noise top, both on the edge's
    (plug-in) scale: ``(t_1 + shift) / (noise_top + shift)``; None without a halves edge."""
    null = report.get("null") or {}
    edge = null.get("edge") or {}
    tested = null.get("tested_eigenvalues") or []
    if not tested or "noise_top" not in edge:
        return None
    shift = float(edge.get("shift", 0.0))
    return (float(tested[0]) + shift) / (float(edge["noise_top"]) + shift)


def run(positions: list[int], seeds: int, documents: int, analyses: list[str] | None = None,
        first_seed: int = 0, length_scale: int = 1, planted: float = 0.0, stay: float = 0.0,
        topics: int = 1) -> list[dict]:
    """One row per n: the tallies of each analysis (module docstring; ``analyses``: a subset
    of :data:`ANALYSES`, default all), on the corpora of seeds ``first_seed ..``."""
    from posstats.analysis import AnalysisConfig
    from posstats.analysis.pipeline import analyze
    from posstats.testing import proportion, resampled_documents

    chosen = list(ANALYSES) if analyses is None else analyses
    unknown = sorted(set(chosen) - set(ANALYSES))
    if unknown:
        msg = f"unknown analyses {unknown}; choose from {', '.join(ANALYSES)}"
        raise ValueError(msg)
    sources, vocab = fortune_documents()
    rows = []
    for n in positions:
        tally = {name: dict.fromkeys(CLAIMS, 0) for name in chosen}
        ratios: dict[str, list[float]] = {name: [] for name in chosen}
        t = time.perf_counter()
        for seed in range(first_seed, first_seed + seeds):
            counts, parts, groups = resampled_documents(sources, n, vocab=vocab, documents=documents, seed=seed,
                                                        length_scale=length_scale, planted=planted, stay=stay,
                                                        topics=topics)
            for name in chosen:
                null, halves = ANALYSES[name]
                cfg = AnalysisConfig(null=null, held_out="off", encodings=("mds",), dims=(2,), seed=seed)
                report = analyze(counts, cfg, parts=parts if halves == "parts" else None, window_groups=groups).report()
                for key, value in claims(report).items():
                    tally[name][key] += int(value)
                ratio = top_over_halves(report) if halves else None
                if ratio is not None:
                    ratios[name].append(ratio)
            print(f"  n={n} seed {seed}: {json.dumps(tally)}", file=sys.stderr, flush=True)
        row = {"positions": n, "corpora": seeds, "seconds": round(time.perf_counter() - t, 1)}
        for name in chosen:
            row[name] = {k: proportion(c, seeds) for k, c in tally[name].items()}
            if ratios[name]:
                r = np.array(ratios[name])
                row[name]["top_over_halves"] = {"mean": round(float(r.mean()), 3), "min": round(float(r.min()), 3),
                                                "max": round(float(r.max()), 3)}
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--positions", default="64,128,256,512", help="context lengths n, comma-separated")
    ap.add_argument("--seeds", type=int, default=20, help="corpora a context length")
    ap.add_argument("--documents", type=int, default=3000, help="documents a corpus (the fortunes: 3,000)")
    ap.add_argument("--analyses", default=",".join(ANALYSES), help="which analyses, comma-separated")
    ap.add_argument("--first-seed", type=int, default=0, help="seed of the first corpus (fresh corpora: a new range)")
    ap.add_argument("--length-scale", type=int, default=1,
                    help="multiply every document's length by this (long documents for n above 4,096)")
    ap.add_argument("--planted", type=float, default=0.0,
                    help="plant positions 0-3 with this share of ids 1-10 (power; 0: the null)")
    ap.add_argument("--stay", type=float, default=0.0,
                    help="each token repeats the previous one with this probability (dependent tokens; 0: none)")
    ap.add_argument("--topics", type=int, default=1,
                    help="cut each document into this many pieces, each of its own source's law (1: one law a document)")
    args = ap.parse_args(argv)
    t = time.perf_counter()
    try:
        rows = run([int(x) for x in args.positions.split(",")], args.seeds, args.documents,
                   [a.strip() for a in args.analyses.split(",") if a.strip()], args.first_seed, args.length_scale,
                   args.planted, args.stay, args.topics)
    except ValueError as exc:
        ap.error(str(exc))
    print(json.dumps({"benchmark": "document_heterogeneity", "setup": vars(args), "rows": rows,
                      "seconds": round(time.perf_counter() - t, 1)}, indent=1))


if __name__ == "__main__":
    main()
