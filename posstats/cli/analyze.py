"""``posstats analyze``: geometry, MDS and encoding stress from saved counts."""

from __future__ import annotations

import argparse
from pathlib import Path

from posstats.cli._common import (
    add_analysis_args,
    analysis_config,
    print_report,
)
from posstats.corpus.tokenizer import check_tokenizer
from posstats.counting.io import load_counts
from posstats.reports.analysis_folder import analyze_to
from posstats.runs.noise_parts import describe_counts
from posstats.storage.publish import staged_output

HELP = "analyse saved counts: Hellinger geometry, MDS spectrum, encoding stress"
DESCRIPTION = """\
Read counts written by 'posstats count' and compute the Hellinger geometry of the
occupied positions, classical MDS (the information-optimal encoding P_MDS, its spectrum
and rank) and, for every encoding and width, raw and scaled stress, optimal scale,
Pearson correlation, minimum separation and monotonicity (THEORY.md sections 2-6).

Writes OUT/report.json (schema in docs/report.md; written last), OUT/report.html (figures
embedded, opens offline), OUT/figures/*.png, OUT/summary.md and OUT/report.md,
OUT/mds.safetensors (the MDS coordinates of the used positions) and
OUT/analysis-config.json, and prints a summary table.

example:
  posstats analyze --counts runs/counts --dims 2,16,64 --encodings mds,sinusoidal,rope --out runs/analysis

honest by default (docs/long-context.md): when the plug-in bias can matter (the median
position has fewer than 500 tokens per effective vocabulary entry) the split-half noise
floor is estimated from a random split of the counted tokens, every distance is
bias-corrected, and the summary opens with the verdict: how many MDS components stand
above sampling noise, which positions stand out, which encodings fit best beyond their
intervals. --noise-floor off and --distances plugin give the plain plug-in geometry.

  posstats analyze --counts runs/counts --buckets log:8 --out runs/analysis

Other splits for the noise floor: the shards of a Ray run store (--store), explicit part
counts (--parts), or the corpus re-read and split by document parity (--reread; keeps the
tokens of one long document together in chunk and pack mode). --bootstrap is withdrawn
(its intervals did not cover the truth: docs/calibration.md).
"""


# what --json prints (posstats.jobs.output); None: no result, no --json
JSON_RESULT: str | None = 'report.json'

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--counts", required=True, metavar="DIR", help="folder (or file) written by 'posstats count'")
    add_analysis_args(p)
    p.add_argument("--store", metavar="DIR",
                   help="Ray run store of the counts: its shards give the noise-floor parts (by shard-id rank "
                        "parity)")
    p.add_argument("--parts", metavar="DIR,DIR[,DIR,DIR]",
                   help="2 or 4 count folders whose sum is the corpus, for the noise floor")
    p.add_argument("--reread", action="store_true",
                   help="noise floor from the corpus re-read and split by document parity (default: a random "
                        "split of the counted tokens)")
    p.add_argument("--tokenizer", metavar="TOKENIZER_JSON",
                   help="tokenizer for re-reading a text corpus by document parity (default: the recorded one)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = analysis_config(args)
    counts = load_counts(args.counts, compact=True)  # int32 where exact: half the memory of int64
    if args.tokenizer:
        # even when no option re-reads the corpus: a tokenizer given with other counts is a mistake
        check_tokenizer(counts.metadata, args.tokenizer, counts=describe_counts(args.counts))
    with staged_output(args.out, last=("report.json",)) as stage:
        run_data = analyze_to(counts, config, stage, counts_path=args.counts, name=Path(args.out).name,
                              store=args.store, parts_dirs=[d for d in (args.parts or "").split(",") if d] or None,
                              reread=args.reread)
    print_report(run_data.report, args, out=args.out)
    return 0
