"""``posstats run``: count + analyse in one process."""

from __future__ import annotations

import argparse
from pathlib import Path

from posstats.cli._common import (
    add_analysis_args,
    analysis_config,
    print_report,
)
from posstats.counting.io import COUNTS_FILES
from posstats.jobs.count import count_to
from posstats.jobs.flags import (
    add_input_args,
    count_inputs_from_args,
    print_document_note,
)
from posstats.reports.analysis_folder import analyze_to
from posstats.runs.counts_folder import COUNT_MARKER
from posstats.storage.jsontext import write_json_atomic
from posstats.storage.publish import staged_output

HELP = "count a corpus and analyse it in one go (count + analyze)"
DESCRIPTION = """\
Count positional tokens of a corpus and analyse them in this process (the Ray version
is 'posstats count --ray'). Writes into OUT: config.json, counts.csr.safetensors (or
counts.safetensors, whichever is smaller), count.json, mds.safetensors, report.html with figures/*.png,
summary.md, report.md and report.json (last), and prints a summary table. If anything fails, OUT keeps its previous contents.

example (the bundled sample):
  posstats run --input data/fortunes-sample.jsonl --text-column text \\
      --tokenizer data/tokenizers/bert-base-uncased.tokenizer.json --positions 64 --out runs/demo
"""


# what --json prints (posstats.jobs.output); None: no result, no --json
JSON_RESULT: str | None = 'report.json'

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_args(p)
    add_analysis_args(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = analysis_config(args)  # validate analysis options before counting
    inputs = count_inputs_from_args(args)
    with staged_output(args.out, last=(COUNT_MARKER, "report.json"), replaces=COUNTS_FILES) as stage:
        counts, summary = count_to(inputs, stage, budget_bytes=args.memory_budget * 2**30)
        write_json_atomic(stage / COUNT_MARKER, summary)
        run_data = analyze_to(counts, config, stage, counts_path=args.out, name=Path(args.out).name)
    print_report(run_data.report, args, out=args.out)
    if not getattr(args, "quiet", False) and not getattr(args, "json", False):
        print_document_note(args)
    return 0
