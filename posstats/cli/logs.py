"""``posstats logs``: a submitted job's logs, or a scheduled run's log file."""

from __future__ import annotations

import argparse
import sys

from posstats.cli.submit import add_address_args, resolve_address
from posstats.errors import PosstatsError
from posstats.jobs.flags import storage_options
from posstats.jobs.submit import job_logs
from posstats.service.pipeline_store import Store, validate_run_id

HELP = "logs of a submitted pipeline job (JOB_ID [--follow]), or of a scheduled run (--store --run-id)"
DESCRIPTION = """\
With JOB_ID: the Ray job's driver log from the job server at --address; --follow streams
it until the job ends and exits 0 only if the job succeeded (1 otherwise).

With --store and --run-id: the log file 'posstats schedule' kept for that run
(STORE/logs/RUN_ID.log).

examples:
  posstats logs raysubmit_XyZ --address http://127.0.0.1:8265 --follow
  posstats logs --store /data/posstats --run-id sched-20240601T060000Z
"""


# what --json prints (posstats.jobs.output); None: no result, no --json
JSON_RESULT: str | None = None

def register(sub: argparse._SubParsersAction) -> None:

    p = sub.add_parser("logs", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job_id", nargs="?", metavar="JOB_ID", help="the job id printed by 'posstats submit'")
    add_address_args(p)
    p.add_argument("--follow", "-f", action="store_true", help="stream the log until the job ends")
    p.add_argument("--store", metavar="PATH_OR_URL", help="read a scheduled run's log from this store")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="fsspec option of --store (VALUE in TOML syntax; dotted keys nest); repeatable")
    p.add_argument("--run-id", metavar="ID", help="with --store: the run")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.store:

        if args.job_id:
            raise PosstatsError("give either JOB_ID or --store, not both")
        if not args.run_id:
            raise PosstatsError("--store needs --run-id (the scheduled run's id)")
        store = Store(args.store, storage_options=storage_options(args.storage_option))
        rel = store.log_rel(validate_run_id(args.run_id))
        data = store.read_bytes(rel)
        if data is None:
            raise PosstatsError(f"{store.display(rel)}: no such log (runs started by 'posstats schedule' keep one)")
        sys.stdout.write(data.decode("utf-8", errors="replace"))
        return 0
    if not args.job_id:
        raise PosstatsError("give a JOB_ID (printed by 'posstats submit') or --store PATH_OR_URL --run-id ID")

    address, token = resolve_address(args)

    status = job_logs(address, args.job_id, token=token, follow=args.follow)
    if args.follow:
        print(f"\njob {args.job_id}: {status}", file=sys.stderr)
        return 0 if status == "SUCCEEDED" else 1
    return 0
