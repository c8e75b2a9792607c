"""``posstats count``: count positional tokens of a corpus into a counts folder."""

from __future__ import annotations

import argparse

from posstats.errors import PosstatsError
from posstats.jobs import count as ray_count
from posstats.jobs.flags import (
    add_input_args,
    add_ray_args,
)

HELP = "count positional token occurrences C[i, v] of a corpus"
DESCRIPTION = """\
Count how often each token occurs at each position (THEORY.md section 1) and write the
exact counts to OUT/counts.csr.safetensors (sparse CSR) or OUT/counts.safetensors (dense),
whichever is smaller, in the narrowest integer type that holds them (loaders return exact
int64), with OUT/count.json (a summary, written last: tokens, positions occupied, the
counting rate) and OUT/config.json (the resolved options).

examples:
  posstats count --input data/fortunes-sample.jsonl --text-column text \\
      --tokenizer data/tokenizers/bert-base-uncased.tokenizer.json --positions 64 --out runs/counts
  posstats count --input 'shards/*.parquet' --column input_ids --vocab-size 50257 \\
      --mode pack --separator 50256 --positions 1024 --out runs/counts

distributed (Ray; see docs/ray.md): the same files in OUT, bit-identical counts, plus a
resumable run store (OUT/store by default):
  posstats count --ray --input 'shards/*.parquet' --column input_ids --vocab-size 50257 \\
      --positions 1024 --out runs/counts                  # embedded local Ray, one worker per CPU
  posstats count --ray --address 127.0.0.1:6379 --workers 8 ...   # join a running cluster

the same counting steps in this process, no Ray (a resumable, refreshable store; slower than
the one-pass default, which keeps nothing between runs):
  posstats count --store runs/store --input 'shards/*.parquet' --column input_ids --vocab-size 50257 \
      --positions 1024 --out runs/counts
"""


# what --json prints (posstats.jobs.output); None: no result, no --json
JSON_RESULT: str | None = "count.json's record (tokens, sequences, windows, occupancy, files)"

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("count", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_args(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created; old results replaced only on success)")
    add_ray_args(p)
    p.set_defaults(func=run)


def _check_ray_args(args: argparse.Namespace) -> None:
    if getattr(args, "ray", False):
        if args.workers is not None and args.workers < 1:
            raise PosstatsError(f"--workers must be >= 1, got {args.workers}")
        return
    given = [flag for flag, value in (("--address", getattr(args, "address", None)),
                                      ("--workers", getattr(args, "workers", None)),
                                      ("--dashboard", getattr(args, "dashboard", False))) if value]
    if given:
        raise PosstatsError(f"{', '.join(given)} only apply with --ray (--store, --run-id, --skip-bad-shards and "
                            "--shard-size without --ray run the same counting steps in this process)")


def run(args: argparse.Namespace) -> int:
    """In this process, or on Ray with ``--ray``: one :func:`posstats.jobs.count.count_to`."""
    _check_ray_args(args)
    return ray_count.run(args)
