"""``posstats refresh``: bring a run store up to date with its inputs (a Ray job)."""

from __future__ import annotations

import argparse

from posstats.ids import validate_run_id
from posstats.jobs.count import refresh_to
from posstats.jobs.flags import add_ray_args
from posstats.jobs.output import print_json

HELP = "recount only new or changed shards of a run store, subtract vanished ones (Ray)"
DESCRIPTION = """\
Update the counts of a run store made by 'posstats count --ray' after its inputs changed.
The inputs are planned into shards again (content-derived ids: path, size, modification
time, Parquet row group and footer); shards that are new or changed are counted, shards
that disappeared are subtracted from the stored total, unchanged ones are reused. The
result equals a full recount. Prints what it reused, added and removed; writes OUT
(config.json, counts.*, count.json) when --out is given or the store remembers its OUT.

examples:
  posstats refresh --store runs/counts/store
  posstats refresh --store runs/counts/store --input 'shards/*.parquet' --address 127.0.0.1:6379
"""


# what --json prints (posstats.jobs.output); None: no result, no --json
JSON_RESULT: str | None = "the refreshed count's record, with what was reused, added and removed"

def register(sub: argparse._SubParsersAction) -> None:

    p = sub.add_parser("refresh", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", action="append", metavar="PATH_OR_GLOB",
                   help="input files / folders / globs (repeatable); default: the store's inputs")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="fsspec option of URL inputs (as for 'posstats count'; the store never keeps them); repeatable")
    p.add_argument("--tokenizer", metavar="TOKENIZER_JSON",
                   help="the tokenizer.json the store counts text with (default: the path it remembers)")
    p.add_argument("--out", metavar="DIR", help="write config.json, counts.*, count.json here (default: the store's OUT)")
    p.add_argument("--memory-budget", type=float, default=None, metavar="GiB",
                   help="dense n x V arrays per process while 8*n*V bytes fit this budget (default: the value "
                        "the store was counted with)")
    add_ray_args(p, switch=False)
    p.add_argument("--local", action="store_true",
                   help="run the counting steps in this process (the local executor) instead of on Ray")
    p.set_defaults(func=run)
    # --store is required here (the group added it as optional)
    for action in p._actions:
        if action.dest == "store":
            action.required = True
            action.help = "the run store to refresh (made by 'posstats count --ray' or 'posstats count --store')"


def run(args: argparse.Namespace) -> int:
    if args.run_id is not None:
        validate_run_id(args.run_id)  # it names files in the store: refuse '../x' before anything runs

    print_json(args, refresh_to(args))
    return 0
