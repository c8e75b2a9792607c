"""``posstats analyze``: geometry, MDS and encoding stress from saved counts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from posstats.analysis import AnalysisConfig, budgeted_stored_counts, ranges_refusal
from posstats.cli._common import (
    add_analysis_args,
    analysis_config,
    print_report,
)
from posstats.corpus.tokenizer import check_tokenizer
from posstats.counting.io import counts_file, load_counts, load_header, load_indptr
from posstats.errors import OptionError
from posstats.jobs.ranges import analyze_over_actors, budget_ranges, range_flags_problem
from posstats.reports.analysis_folder import analyze_to, write_analysis
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

counts too large for one process (docs/long-context.md, "Analysis over position ranges"):
  posstats analyze --counts runs/counts --memory-budget 4 --out runs/analysis
  posstats analyze --counts runs/counts --ranges 8 --address 10.0.0.1:6379 --out runs/analysis

--ranges K cuts the positions into K ranges of about equal stored counts, each held by a
Ray actor (an embedded Ray on this machine, or the cluster at --address); --memory-budget
GIB picks K so that each range's process fits GIB, and analyses in this process when one
fits. Same report (geometry.ranges says K); what needs every count in one process is
refused in one line: buckets, --device gpu, the exact path, the shuffle null, --held-out
on, and --store / --parts / --reread.
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
    where = p.add_mutually_exclusive_group()
    where.add_argument("--ranges", type=int, metavar="K",
                       help="hold the counts in K position ranges, one Ray actor each; default: the whole counts "
                            "in this process")
    where.add_argument("--memory-budget", type=float, metavar="GIB",
                       help="as many ranges (Ray actors) as keep each process within GIB GiB; in this process "
                            "when one fits")
    p.add_argument("--address", metavar="HOST:PORT",
                   help="Ray cluster for --ranges / --memory-budget (default: $RAY_ADDRESS, else an embedded Ray "
                        "on this machine)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = analysis_config(args)
    ranges = _ranges(args, config)
    if ranges:
        return _run_over_ranges(args, config, ranges)
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


def _ranges(args: argparse.Namespace, config: AnalysisConfig) -> int:
    """The position ranges the analysis is held in (0: this process) from ``--ranges`` /
    ``--memory-budget``; an option that needs every count in one process is an
    :class:`~posstats.errors.OptionError` naming both."""
    if args.ranges is None and args.memory_budget is None:
        if args.address:
            raise OptionError("--address names the Ray cluster of --ranges / --memory-budget; give one of them")
        return 0
    flag = f"--ranges {args.ranges}" if args.ranges is not None else f"--memory-budget {args.memory_budget:g}"
    problem = range_flags_problem(args.ranges, args.memory_budget)
    if problem:
        raise OptionError(problem)
    indptr = load_indptr(counts_file(args.counts))
    if indptr is None:
        raise OptionError(f"{flag}: {counts_file(args.counts)} holds dense counts; ranges read sparse ones")
    k = args.ranges or budget_ranges(args.memory_budget, budgeted_stored_counts(args.counts, int(indptr[-1]), config))
    if args.ranges is None and k < 2:
        return 0  # one process fits the budget
    one_process = next((o for o in ("store", "parts", "reread") if getattr(args, o)), None)
    problem = (f"--{one_process} splits the corpus in one process" if one_process else
               ranges_refusal(config, int(np.count_nonzero(np.diff(indptr)))))
    if problem:
        raise OptionError(f"{flag} ({k} range(s)): {problem}")
    return k


def _run_over_ranges(args: argparse.Namespace, config: AnalysisConfig, ranges: int) -> int:
    """The analysis over ``ranges`` Ray range actors (:func:`posstats.jobs.ranges.analyze_over_actors`),
    written as the in-process one is; the driver reads only the counts' header."""
    header = load_header(counts_file(args.counts))
    if args.tokenizer:
        check_tokenizer(header.metadata, args.tokenizer, counts=describe_counts(args.counts))
    if not getattr(args, "quiet", False):
        print(f"posstats: analysing {header.positions:,} positions in {ranges} range(s), one Ray actor each",
              file=sys.stderr)
    result = analyze_over_actors(args.counts, config, ranges, address=args.address)
    with staged_output(args.out, last=("report.json",)) as stage:
        run_data = write_analysis(stage, result, inputs={"counts": str(Path(args.counts).resolve())},
                                  name=Path(args.out).name)
    print_report(run_data.report, args, out=args.out)
    return 0
