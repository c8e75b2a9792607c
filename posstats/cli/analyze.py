"""``posstats analyze``: geometry, MDS and encoding stress from saved counts."""

from __future__ import annotations

import argparse
from pathlib import Path

from posstats.cli._common import add_analysis_args, analysis_config

HELP = "analyse saved counts: Hellinger geometry, MDS spectrum, encoding stress"
DESCRIPTION = """\
Read counts written by 'posstats count' and compute the Hellinger geometry of the
occupied positions, classical MDS (the information-optimal encoding P_MDS, its spectrum
and rank) and, for every encoding and width, raw and scaled stress, optimal scale,
Pearson correlation, minimum separation and monotonicity (THEORY.md sections 2-6).

Writes OUT/report.json (schema in README.md; written last), OUT/report.html (figures
embedded, opens offline), OUT/figures/*.png, OUT/summary.md and OUT/report.md,
OUT/mds.safetensors (the MDS coordinates of the used positions) and
OUT/analysis-config.json, and prints a summary table.

example:
  posstats analyze --counts runs/counts --dims 2,16,64 --encodings mds,sinusoidal,rope --out runs/analysis
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--counts", required=True, metavar="DIR", help="folder (or file) written by 'posstats count'")
    add_analysis_args(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.set_defaults(func=run)


def analyze_to(counts, config, stage, *, counts_path=None, name=None) -> dict:
    """Analyse ``counts`` and write mds.safetensors + report.json into ``stage``; return the report."""
    import numpy as np
    from safetensors.numpy import save_file

    from posstats.analysis import analyze
    from posstats.html_report import write_html_report
    from posstats.report import format_markdown
    from posstats.storage import atomic_path, write_json_atomic

    write_json_atomic(stage / "analysis-config.json", config.to_dict())
    result = analyze(counts, config)
    with atomic_path(stage / "mds.safetensors") as tmp:
        save_file(
            {
                "positions": result.positions.astype("int64"),
                "eigenvalues": np.ascontiguousarray(result.mds.eigenvalues),
                "encoding": np.ascontiguousarray(result.mds.encoding),
            },
            str(tmp),
            metadata={"schema": "posstats.mds/1", "method": result.mds.method, "fingerprint": counts.fingerprint},
        )
    report = result.report()
    report["inputs"] = {"counts": str(Path(counts_path).resolve()) if counts_path else None}
    with atomic_path(stage / "report.md") as tmp:
        tmp.write_text(format_markdown(report))
    write_json_atomic(stage / "report.json", report)
    write_html_report(stage, name=name)
    return report


def run(args: argparse.Namespace) -> int:
    from posstats.outputs import staged_output
    from posstats.report import format_summary
    from posstats.storage import load_counts

    config = analysis_config(args)
    counts = load_counts(args.counts)
    with staged_output(args.out, last=("report.json",)) as stage:
        report = analyze_to(counts, config, stage, counts_path=args.counts, name=Path(args.out).name)
    print(format_summary(report))
    print(f"\nreport: {args.out}/report.html (summary.md, report.json)")
    return 0
