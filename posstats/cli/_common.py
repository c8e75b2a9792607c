"""The analysis flags shared by ``posstats analyze`` and ``posstats run`` (the input and
counting flags, shared with the job entrypoints too, are in :mod:`posstats.jobs.flags`)."""

from __future__ import annotations

import argparse
import sys

from posstats.analysis import DEFAULT_DIMS, MDS_METHODS, AnalysisConfig
from posstats.geometry.encodings import (
    DEFAULT_ENCODINGS,
    DEFAULT_MAX_ENCODINGS,
    split_encoding_list,
)
from posstats.jobs.flags import int_list
from posstats.jobs.output import print_json
from posstats.reports.summary import format_summary

__all__ = ["add_analysis_args", "analysis_config", "print_report"]


def add_analysis_args(parser: argparse.ArgumentParser) -> None:
    """The geometry / encoding flags of ``analyze`` / ``run``."""
    g = parser.add_argument_group("analysis")
    g.add_argument("--dims", type=int_list, default=DEFAULT_DIMS, metavar="D,D",
                   help=f"encoding widths to evaluate (default {','.join(map(str, DEFAULT_DIMS))}); "
                        "widths above the MDS rank get zero columns")
    g.add_argument("--encodings", type=split_encoding_list, default=DEFAULT_ENCODINGS, metavar="SPEC,SPEC",
                   help=f"encodings to score (default {','.join(DEFAULT_ENCODINGS)}); also mds-lowrank:R, "
                        "rope:layout=half, alibi:HEADS, random:SIGMA, learned:FILE[:key=NAME]; RoPE scaling: "
                        "rope:type=linear|dynamic|yarn|longrope|llama3,factor=F,original=L[,theta=B,...] "
                        "(docs/rope-scaling.md); a model's own RoPE at its head_dim: hf:PATH/config.json; "
                        "a sweep scores every value and plots stress against it: "
                        "'rope:type=yarn,original=4096,factor=8|16|32'")
    g.add_argument("--min-occupancy", type=int, default=1, metavar="K",
                   help="leave out positions with fewer than K counted tokens (default 1)")
    g.add_argument("--rank-rtol", type=float, default=1e-10, metavar="TOL",
                   help="relative tolerance of the reported numerical rank (default 1e-10)")
    g.add_argument("--mds-method", choices=MDS_METHODS, default="auto",
                   help="dense eigh, the iterative top-k solver (ARPACK), or block Lanczos for long contexts "
                        "(auto: dense up to 2048 positions)")
    g.add_argument("--seed", type=int, default=0, help="seed of every random choice (default 0)")
    lc = parser.add_argument_group("long contexts and honest estimates (docs/long-context.md)")
    lc.add_argument("--exact-limit", type=int, default=16_384, metavar="N",
                    help="above N geometry rows no n x n matrix is formed: block-Lanczos MDS, stress from "
                         "sampled pairs with 95%% intervals (default 16384)")
    lc.add_argument("--stress-halfwidth", type=float, default=1e-3, metavar="H",
                    help="sampled stress: draw pairs until every scaled-stress 95%% interval is within +-H (default 1e-3)")
    lc.add_argument("--buckets", default="none", metavar="none|fixed:W|log:P",
                    help="pool positions into buckets: fixed:W (W positions each) or log:P (P per doubling)")
    lc.add_argument("--noise-floor", nargs="?", const="on", default="auto", choices=("auto", "on", "off"),
                    help="split-half noise floor: per-position split-half d_H and sampling bias, from a random split "
                         "of the counted tokens (or --store / --parts / --reread). auto (default): on when the "
                         "plug-in bias can matter, i.e. the median position has fewer than 500 tokens per effective "
                         "vocabulary entry; a bare --noise-floor means on")
    lc.add_argument("--noise-parts", type=int, choices=(2, 4), default=4,
                    help="parts for the noise floor: 4 also fits how the bias decays with occupancy (default 4)")
    lc.add_argument("--distances", choices=("auto", "plugin", "corrected"), default="auto",
                    help="the one distance matrix of MDS, stress, diagnostics and the report: plug-in, or "
                         "bias-corrected max(d^2 - b_i - b_j, 0) (needs the noise floor); auto (default): corrected "
                         "whenever the noise floor is estimated")
    lc.add_argument("--null", choices=("auto", "shuffle", "mp", "none"), default="auto",
                    help="noise-aware rank: eigenvalues above a shuffled-position null corpus, or an analytic "
                         "Marchenko-Pastur edge (needs the noise floor); auto: shuffle up to 4096 rows, else mp")
    lc.add_argument("--null-replicates", type=int, default=39, metavar="R",
                    help="shuffled null corpora; the rank and homogeneity tests reject when the corpus exceeds all R "
                         "(level 1/(R+1); default 39: 2.5 %%)")
    lc.add_argument("--held-out", choices=("auto", "on", "off"), default="auto",
                    help="score every encoding fitted on one half of the corpus against the other half, so MDS and "
                         "SMACOF are not graded on their own training counts (halves: the noise floor's parts, else "
                         "the tokens split at random); auto (default): up to 4096 positions")
    lc.add_argument("--max-encodings", type=int, default=DEFAULT_MAX_ENCODINGS, metavar="N",
                    help=f"refuse --encodings that expand to more than N encodings (sweeps multiply: "
                         f"a|b|c per key; default {DEFAULT_MAX_ENCODINGS})")
    lc.add_argument("--smacof-limit", type=int, default=1024, metavar="M",
                    help="score mds-smacof (a default encoding) only up to M positions: it costs O(M^2) per "
                         "iteration, about 3 s per width at 1024 (default 1024)")
    lc.add_argument("--bootstrap", type=int, default=0, metavar="B",
                    help="shard-bootstrap replicates for intervals on eigenvalues, rank and stress (default 0: off)")


def analysis_config(args: argparse.Namespace):
    """An :class:`AnalysisConfig` from parsed analysis flags."""
    return AnalysisConfig(
        dims=tuple(args.dims),
        encodings=tuple(args.encodings),
        min_occupancy=args.min_occupancy,
        rank_rtol=args.rank_rtol,
        mds_method=args.mds_method,
        seed=args.seed,
        exact_limit=args.exact_limit,
        stress_halfwidth=args.stress_halfwidth,
        buckets=args.buckets,
        distances=args.distances,
        noise_floor=args.noise_floor,
        noise_parts=args.noise_parts,
        null=args.null,
        null_replicates=args.null_replicates,
        bootstrap=args.bootstrap,
        held_out=args.held_out,
        smacof_limit=args.smacof_limit,
        max_encodings=args.max_encodings,
        tokenizer=getattr(args, "tokenizer", None) if (getattr(args, "reread", False) or args.bootstrap) else None,
    )


def print_report(report: dict, args: argparse.Namespace, *, out: str) -> None:
    """What ``run`` / ``analyze`` print: the summary, or report.json (``--json``); with ``-v``
    the seconds of every step on stderr (``-q`` drops the summary: :mod:`posstats.jobs.output`)."""
    if args.json:
        print_json(args, report)
    else:
        print(format_summary(report))
        print(f"\nreport: {out}/report.html (summary.md, report.json)")
    if args.verbose:
        steps = report.get("timings_s") or {}
        print("seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in steps.items()), file=sys.stderr)
