"""``posstats run``: count + analyse in one process."""

from __future__ import annotations

import argparse
from pathlib import Path

from posstats.cli._common import add_analysis_args, add_input_args, analysis_config

HELP = "count a corpus and analyse it in one go (count + analyze)"
DESCRIPTION = """\
Count positional tokens of a corpus and analyse them in this process (the Ray version
is 'posstats count --ray'). Writes into OUT: config.json, counts.safetensors (or
counts.parquet), count.json, mds.safetensors, report.html with figures/*.png,
summary.md, report.md and report.json (last), and prints a summary table. If anything fails, OUT keeps its previous contents.

example (the bundled sample):
  posstats run --input data/fortunes-sample.jsonl --text-column text \\
      --tokenizer data/tokenizers/bert-base-uncased.tokenizer.json --positions 64 --out runs/demo
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_args(p)
    add_analysis_args(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posstats.cli.analyze import analyze_to
    from posstats.cli.count import count_to
    from posstats.outputs import staged_output
    from posstats.report import format_summary
    from posstats.storage import COUNTS_FILES, write_json_atomic

    config = analysis_config(args)  # validate analysis options before counting
    with staged_output(args.out, last=("count.json", "report.json"), replaces=COUNTS_FILES) as stage:
        counts, summary = count_to(args, stage)
        write_json_atomic(stage / "count.json", summary)
        report = analyze_to(counts, config, stage, counts_path=args.out, name=Path(args.out).name)
    print(format_summary(report))
    print(f"\nreport: {args.out}/report.html (summary.md, report.json)")
    return 0
