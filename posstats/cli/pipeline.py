"""``posstats pipeline``: run the refresh pipeline (a Ray job) in this process."""

from __future__ import annotations

import argparse

from posstats.jobs.pipeline import add_pipeline_args, run_from_args

HELP = "run the pipeline count -> reduce -> geometry -> report -> export into a run store (Ray)"
DESCRIPTION = """\
Run one pipeline run, configured by a TOML file (schema: docs/service.md; example:
deploy/pipeline.example.toml), into the run store it names (a folder or s3://bucket/prefix):
STORE/runs/RUN_ID/{config,count,reduce,geometry,report,export}/, each stage with a
completion marker, then STORE/runs/RUN_ID/done.json and the STORE/latest pointer.

Counting is incremental (only new or changed shards are counted); rerunning a run id
resumes it where it stopped and does nothing once it is complete; a second run on the
same store is refused while the first holds the store's lock. This is the same job as
'python -m posstats.jobs.pipeline' (what 'posstats submit' sends to a cluster).

examples:
  posstats pipeline --config deploy/pipeline.example.toml
  posstats pipeline --config pipeline.toml --run-id corpus-v2 --set count.positions=1024 --workers 4
  posstats pipeline --config pipeline.toml --store s3://bucket/posstats --print-config
"""


# what --json prints (posstats.jobs.output); None: no result, no --json
JSON_RESULT: str | None = "the run's completion marker (or, with --print-config, the resolved configuration)"

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pipeline", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pipeline_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return run_from_args(args)
