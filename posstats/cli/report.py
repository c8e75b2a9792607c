"""``posstats report``: a self-contained HTML report of a run, with PNGs and a Markdown summary."""

from __future__ import annotations

import argparse
from pathlib import Path

from posstats.errors import PosstatsError
from posstats.jobs.output import print_json
from posstats.reports.html import (
    FIGURES_DIR,
    HTML_FILE,
    SUMMARY_FILE,
    render_html_report,
)
from posstats.runs.run_folder import load_run
from posstats.storage.publish import staged_output

HELP = "write report.html (self-contained), figures/*.png and summary.md for a run folder"
DESCRIPTION = """\
Read a run folder written by 'posstats run' or 'posstats analyze' (report.json,
mds.safetensors and the counts, from the folder or report.json inputs.counts) and write
into it:

  report.html   one file with every figure embedded (opens offline, no scripts)
  figures/*.png occupancy, d_H heatmap, eigenspectrum, MDS encoding in 2-D / 3-D,
                stress against width, low-rank trade-off, monotonicity
  summary.md    key numbers and tables for a pull request or a model card

example:
  posstats report runs/demo && xdg-open runs/demo/report.html
"""


# what --json prints (posstats.jobs.output); None: no result, no --json
JSON_RESULT: str | None = 'the paths written (report.html, figures, summary.md)'

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="folder written by 'posstats run' or 'posstats analyze'")
    p.add_argument("--width", type=int, metavar="D",
                   help="model width d of the rank / stress / parameter table (default: the largest analysed width)")
    p.add_argument("--max-positions", type=int, default=2048, metavar="N",
                   help="recompute distances on at most N used positions, an even sample above (default 2048)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.width is not None and args.width < 1:
        msg = f"--width must be a positive integer; got {args.width}"
        raise PosstatsError(msg)
    if args.max_positions < 2:
        msg = f"--max-positions must be >= 2; got {args.max_positions}"
        raise PosstatsError(msg)
    run_data = load_run(args.run_dir)  # a missing or foreign folder fails before anything is staged in it
    with staged_output(args.run_dir) as stage:
        render_html_report(run_data, width=args.width, max_positions=args.max_positions,
                           name=Path(args.run_dir).resolve().name, out=stage)
    run_dir = Path(args.run_dir)
    print(f"report: {run_dir / HTML_FILE}\nfigures: {run_dir / FIGURES_DIR}\nsummary: {run_dir / SUMMARY_FILE}")
    print_json(args, {"report": str(run_dir / HTML_FILE), "figures": str(run_dir / FIGURES_DIR),
                      "summary": str(run_dir / SUMMARY_FILE)})
    return 0
