"""``posstats pipeline``: run the refresh pipeline (a Ray job) in this process."""

from __future__ import annotations

import argparse

HELP = "run the pipeline count -> reduce -> geometry -> report -> export into a run store (Ray)"
DESCRIPTION = """\
Run one pipeline run, configured by a TOML file (schema: docs/service.md; example:
deploy/pipeline.example.toml), into the run store it names (a folder or s3://bucket/prefix):
STORE/runs/RUN_ID/{config,count,reduce,geometry,report,export}/, each stage with a
completion marker, then STORE/runs/RUN_ID/done.json and the STORE/latest pointer.

Counting is incremental (only new or changed shards are counted); rerunning a run id
resumes it where it stopped and does nothing once it is complete; a second run on the
same store is refused while the first holds the store's lock. This is the same job as
'python -m jobs.pipeline' (what 'posstats submit' sends to a cluster).

examples:
  posstats pipeline --config deploy/pipeline.example.toml
  posstats pipeline --config pipeline.toml --run-id corpus-v2 --set count.positions=1024 --workers 4
  posstats pipeline --config pipeline.toml --store s3://bucket/posstats --print-config
"""


def add_pipeline_args(parser: argparse.ArgumentParser, *, ray_address: bool = True) -> None:
    """``--config`` and the override flags (argparse only; shared with jobs.pipeline).

    ``ray_address=False`` leaves out ``--address`` (``posstats submit`` uses that flag for
    the job server; a submitted job joins the cluster it runs on)."""
    parser.add_argument("--config", required=True, metavar="FILE", help="the pipeline's TOML configuration")
    g = parser.add_argument_group("overrides (win over the file)")
    g.add_argument("--run-id", metavar="ID",
                   help="name of the run (letters, digits, . _ -); rerun an id to resume it (default: the file's "
                        "run_id, else run-<UTC time>)")
    g.add_argument("--store", metavar="PATH_OR_URL", help="run store ([store] url)")
    g.add_argument("--input", action="append", metavar="PATH_OR_GLOB", help="inputs ([input] paths); repeatable")
    if ray_address:
        g.add_argument("--address", dest="ray_address", metavar="ADDR", help="Ray cluster to join ([ray] address)")
    g.add_argument("--workers", type=int, metavar="K", help="counting actors ([ray] workers)")
    g.add_argument("--set", action="append", default=[], metavar="TABLE.KEY=VALUE",
                   help="set any key, VALUE in TOML syntax (e.g. count.positions=1024, geometry.dims=[2,16]); repeatable")
    g.add_argument("--print-config", action="store_true", help="print the resolved configuration and exit")


def config_from_args(args: argparse.Namespace):
    """(PipelineConfig, run id or None) from ``--config`` and the overrides."""
    from posstats.pipeline_config import apply_overrides, load_config
    from posstats.store import validate_run_id

    cfg = load_config(args.config)
    cfg = apply_overrides(cfg, sets=args.set, run_id=args.run_id, store=args.store, inputs=args.input,
                          address=getattr(args, "ray_address", None), workers=args.workers)
    run_id = cfg.run_id
    if run_id is not None:
        validate_run_id(run_id)
    return cfg, run_id


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pipeline", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pipeline_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from jobs.pipeline import run_from_args  # imports ray lazily

    return run_from_args(args)
