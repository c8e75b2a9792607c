"""The rank test against document halves next to the rotation null, in truncate mode.

    python benchmarks/bench_document_halves.py [--positions 64,256,1024] [--documents 3000]
        [--stay 0.9] [--vocab 200] [--seeds 40] [--planted 0.3] [--planted-seeds 20]

Where most documents of a truncate-mode corpus are shorter than the context, the rotation
null moves the documents' openings rather than removing them, so its count of components is
conservative; the report's caveat then names ``posstats analyze --null mp --reread``, the
rank test against the noise edge measured on two halves of the documents
(:mod:`posstats.estimates.halves_edge`). This benchmark measures both on the same corpora:

- corpora of ``--documents`` independent documents, each a successor stream (the next token
  is the previous one plus 1 modulo ``--vocab`` with probability ``--stay``, else uniform;
  :func:`posstats.testing.successor_stream`) started from its stationary law, of lengths
  uniform on ``[n / 32, 1.17 n]`` (most shorter than n), counted in truncate mode by
  posstats' own counter with its 64 window groups
  (:func:`posstats.testing.successor_documents`);
- null corpora (``--seeds`` a size): every position has one distribution, so any claim is
  false; ``planted`` corpora (``--planted-seeds``): positions 0-3 of every document draw a
  ``--planted`` share of their tokens from ids 0-9;
- each analysed twice: ``halves``, ``analyze(..., parts=[even documents, odd documents])``
  with ``null="mp"`` (what ``--null mp --reread`` does), and the baseline ``rotation``,
  the default null (rotated corpora, R = 39).

Prints one JSON object: per n, kind and null the number of corpora where the rank test
alone counted a component (``rank_test_alone``: before the verdict's gate), where the
verdict claimed components, and where any claim was made, each with its Clopper-Pearson
95 % interval.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

NULLS = {"halves": "mp", "rotation": "auto"}


def claims(report: dict) -> dict[str, bool]:
    """What one report claims: the rank test's components before the gate, the verdict's
    components, and any claim (components, standouts or non-stationarity)."""
    v, null = report["verdict"], report.get("null") or {}
    components = bool(v.get("components_above_noise"))
    return {"rank_test_alone": bool(null.get("components_above_null")), "components": components,
            "any_claim": components or bool(v.get("non_stationary"))
            or bool((v.get("standout_positions") or {}).get("count"))}


def run(positions: list[int], documents: int, stay: float, vocab: int, seeds: int, planted: float,
        planted_seeds: int) -> list[dict]:
    """One row per (n, kind): the tallies of each null (module docstring)."""
    from posstats.analysis import AnalysisConfig
    from posstats.analysis.pipeline import analyze
    from posstats.testing import proportion, successor_documents

    rows = []
    for n in positions:
        for kind, runs, share in (("null", seeds, 0.0), ("planted", planted_seeds, planted)):
            if runs == 0:
                continue
            tally = {name: dict.fromkeys(("rank_test_alone", "components", "any_claim"), 0) for name in NULLS}
            t = time.perf_counter()
            for seed in range(runs):
                counts, parts, groups = successor_documents(n, documents=documents, stay=stay, vocab=vocab,
                                                             planted=share, seed=seed)
                for name, null in NULLS.items():
                    cfg = AnalysisConfig(null=null, held_out="off", encodings=("mds",), dims=(2,), seed=seed)
                    said = claims(analyze(counts, cfg, parts=parts if name == "halves" else None,
                                          window_groups=groups).report())
                    for key, value in said.items():
                        tally[name][key] += int(value)
                print(f"  n={n} {kind} seed {seed}: {json.dumps(tally)}", file=sys.stderr, flush=True)
            rows.append({"positions": n, "kind": kind, "corpora": runs, "seconds": round(time.perf_counter() - t, 1),
                         **{name: {k: proportion(c, runs) for k, c in counts_.items()}
                            for name, counts_ in tally.items()}})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--positions", default="64,256,1024", help="context lengths n, comma-separated")
    ap.add_argument("--documents", type=int, default=3000, help="documents a corpus")
    ap.add_argument("--stay", type=float, default=0.9, help="probability that a token is its predecessor plus 1")
    ap.add_argument("--vocab", type=int, default=200, help="vocabulary size")
    ap.add_argument("--seeds", type=int, default=40, help="null corpora a context length")
    ap.add_argument("--planted", type=float, default=0.3, help="share of positions 0-3 drawn from ids 0-9")
    ap.add_argument("--planted-seeds", type=int, default=20, help="planted corpora a context length")
    args = ap.parse_args(argv)
    t = time.perf_counter()
    rows = run([int(x) for x in args.positions.split(",")], args.documents, args.stay, args.vocab, args.seeds,
               args.planted, args.planted_seeds)
    print(json.dumps({"benchmark": "document_halves", "setup": vars(args), "rows": rows,
                      "seconds": round(time.perf_counter() - t, 1)}, indent=1))


if __name__ == "__main__":
    main()
