"""``posstats diff``: what changed between two corpora or two refreshes, beyond sampling noise."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from posstats.cli._common import add_analysis_args, analysis_config
from posstats.drift import diff, format_diff_summary, load_side, store_sides, write_diff
from posstats.drift.report import DIFF_HTML, DIFF_JSON
from posstats.errors import InputError
from posstats.jobs.flags import storage_options, str_list
from posstats.jobs.output import print_json
from posstats.progress import progress
from posstats.service.pipeline_store import enclosing_store
from posstats.storage.publish import staged_output

HELP = "compare two corpora or two refreshes: which positions changed beyond sampling noise"
DESCRIPTION = """\
Compare corpus A (before) with corpus B (after), position by position and as a whole.
A and B are count folders ('posstats count'), run folders ('posstats run' / 'analyze'),
or two runs of a pipeline store (--store URL [--runs ID,ID]; default: the run before
'latest' and 'latest'). Both must have been counted with the same positions, vocabulary,
mode, exclusions and tokenizer.

Per position i: d_H(A_i, B_i), the distance sampling alone gives at both occupancies
(a permutation null: under no change, the tokens counted at i are exchangeable between A
and B), a p-value, and "changed" with family-wise error control over all positions
(Holm, --level, default 5 %). Positions occupied on one side only are listed apart.
The counts are read a block of positions at a time. Globally: both MDS spectra and
ranks, the stress of every encoding on both sides with its change, and how far each
position moved in the MDS encoding after the best rotation (Procrustes). Count folders are
analysed first with the analysis flags below; run folders bring their own analysis.

Writes OUT/diff.json (schema in docs/report.md), OUT/diff.html (figures embedded) and
OUT/figures/*.png, and prints a summary whose first line says how many positions changed.

exit status: 0 done; 3 with --fail-on-change when a position changed (for cron and CI);
2 bad input (different counting options, missing folders).

examples:
  posstats diff runs/before runs/after --out runs/diff
  posstats diff --store /data/store --out runs/diff --fail-on-change
  posstats diff --store s3://bucket/store --runs 20261101,20261124 --out runs/diff --level 0.01
"""


# what --json prints (posstats.jobs.output); None: no result, no --json
JSON_RESULT: str | None = 'diff.json'

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diff", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sides", nargs="*", metavar="A B", help="two count folders or run folders (A before, B after)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (diff.json, diff.html, figures/)")
    p.add_argument("--store", metavar="PATH_OR_URL", help="compare two runs of this pipeline store instead")
    p.add_argument("--runs", type=str_list, metavar="ID,ID", help="with --store: the two run ids (default: the run "
                   "before latest, and latest)")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="fsspec option of --store (VALUE in TOML syntax; dotted keys nest); repeatable")
    p.add_argument("--level", type=float, default=0.05, metavar="ALPHA",
                   help="family-wise error level of the per-position decisions (default 0.05)")
    p.add_argument("--drift-dim", type=int, default=16, metavar="K",
                   help="MDS coordinates aligned for the encoding drift (default 16)")
    p.add_argument("--fail-on-change", action="store_true", help="exit 3 when any position changed")
    add_analysis_args(p)  # for count folders
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 0 < args.level < 1:
        raise InputError(f"--level must be in (0, 1), got {args.level}")
    if args.drift_dim < 1:
        raise InputError(f"--drift-dim must be >= 1, got {args.drift_dim}")
    store = enclosing_store(args.out)
    if store is not None:
        raise InputError(f"--out {args.out} lies inside the run store {store}: a store changes only through its "
                         "pipeline (its stage markers vouch for every file); choose an output folder outside it")
    # a remote store's runs are downloaded here and removed with it, whatever happens
    with tempfile.TemporaryDirectory(prefix="posstats-diff-") as cache:
        if args.store:
            if args.sides:
                raise InputError("give either two folders A B or --store, not both")
            a, b = store_sides(args.store, list(args.runs) if args.runs else None,
                               storage_options=storage_options(args.storage_option) or None, cache=cache)
        else:
            if len(args.sides) != 2:
                raise InputError(f"give two count folders or run folders A B (or --store), got {len(args.sides)}")
            if args.runs:
                raise InputError("--runs needs --store")
            a, b = (load_side(s) for s in args.sides)
        config = analysis_config(args) if "counts" in (a.kind, b.kind) else None
        with progress(total=a.header.positions, desc="positions", unit="pos") as bar:
            done = [0]

            def advance(n: int) -> None:
                bar.update(n - done[0])
                done[0] = n

            result = diff(a, b, level=args.level, config=config, drift_dim=args.drift_dim, progress=advance)
    # published as one set: an interrupted write (a kill, a full disk) leaves the previous set whole
    with staged_output(args.out, last=(DIFF_JSON,)) as stage:
        write_diff(stage, result.document)
    out = Path(args.out)
    if args.json:
        print_json(args, result.document)
    else:
        print(format_diff_summary(result.document))
        print(f"\ndiff: {out / DIFF_HTML} ({DIFF_JSON})")
    return 3 if args.fail_on_change and result.document["positions"]["count_changed"] else 0
