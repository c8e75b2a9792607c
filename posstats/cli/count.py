"""``posstats count``: count positional tokens of a corpus into a counts folder."""

from __future__ import annotations

import argparse
import sys
import time

from posstats.cli._common import add_input_args, count_inputs

HELP = "count positional token occurrences C[i, v] of a corpus"
DESCRIPTION = """\
Count how often each token occurs at each position (THEORY.md section 1) and write the
exact int64 counts to OUT/counts.safetensors (dense) or OUT/counts.parquet (sparse COO),
with OUT/count.json (a summary, written last) and OUT/config.json (the resolved options).

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
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("count", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_args(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created; old results replaced only on success)")
    add_ray_args(p)
    p.set_defaults(func=run)


def add_ray_args(parser: argparse.ArgumentParser, *, switch: bool = True) -> None:
    """The ``--ray`` flags (argparse only: nothing here imports ray or jobs)."""
    g = parser.add_argument_group("distributed counting (Ray)")
    if switch:
        g.add_argument("--ray", action="store_true",
                       help="count as a Ray job: shards counted by a pool of actors, partials kept in a "
                            "resumable run store; same output files and counts")
    g.add_argument("--address", metavar="ADDR",
                   help="Ray cluster to join (e.g. 127.0.0.1:6379); default: $RAY_ADDRESS, else an "
                        "embedded local Ray started for this run")
    g.add_argument("--workers", type=int, metavar="K",
                   help="counting actors (default: one per CPU of the Ray cluster)")
    g.add_argument("--store", metavar="DIR",
                   help="run store: per-shard partial counts, markers, manifest, lock (default OUT/store); "
                        "must be on a file system every Ray node sees")
    g.add_argument("--run-id", metavar="ID",
                   help="name of the run; rerunning with the same id resumes it (default: a hash of the "
                        "inputs and the counting options)")
    g.add_argument("--skip-bad-shards", action="store_true",
                   help="record unreadable shards in the run manifest and finish without them "
                        "(default: fail, keeping the finished partials for a rerun)")
    g.add_argument("--shard-size", type=float, default=256.0, metavar="MiB",
                   help="uncompressed JSONL / text files larger than this are cut into line ranges "
                        "(default 256); Parquet is cut by row group, HF datasets by Arrow file")


def count_to(args: argparse.Namespace, stage) -> tuple:
    """Count the corpus of ``args`` into the staging folder; return (counts, summary)."""
    from posstats.corpus import count_corpus
    from posstats.memory import require_count_memory
    from posstats.storage import save_counts, write_json_atomic

    source, spec, metadata = count_inputs(args)
    files = source.files()
    write_json_atomic(stage / "config.json", {
        "command": "count",
        "inputs": files,
        "format": source.format,
        "column": source.column,
        "text_column": source.text_column,
        "tokenizer": args.tokenizer,
        **spec.to_metadata(),
        **metadata,
    })
    t = time.perf_counter()
    dense = spec.positions * spec.vocab_size * 8 <= args.memory_budget * 2**30
    require_count_memory(spec.positions, spec.vocab_size, memory_budget_gib=args.memory_budget)
    counts = count_corpus(source, spec, dense=dense, metadata=metadata)
    seconds = time.perf_counter() - t
    path = save_counts(counts, stage)
    summary = {
        "files": len(files),
        "sequences": counts.sequences,
        "windows": counts.windows,
        "tokens_counted": counts.tokens,
        "positions_occupied": int((counts.occupancy() > 0).sum()),
        "storage": "sparse" if counts.is_sparse else "dense",
        "counts_file": path.name,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(counts.tokens / seconds, 1) if seconds > 0 else None,
        "fingerprint": counts.fingerprint,
    }
    return counts, summary


def _check_ray_args(args: argparse.Namespace) -> None:
    from posstats.errors import PosstatsError

    if getattr(args, "ray", False):
        if args.workers is not None and args.workers < 1:
            raise PosstatsError(f"--workers must be >= 1, got {args.workers}")
        return
    given = [flag for flag, value in (("--address", getattr(args, "address", None)),
                                      ("--workers", getattr(args, "workers", None)),
                                      ("--store", getattr(args, "store", None)),
                                      ("--run-id", getattr(args, "run_id", None)),
                                      ("--skip-bad-shards", getattr(args, "skip_bad_shards", False))) if value]
    if given:
        raise PosstatsError(f"{', '.join(given)} only apply with --ray")


def run(args: argparse.Namespace) -> int:
    from posstats.outputs import staged_output
    from posstats.storage import COUNTS_FILES, write_json_atomic

    _check_ray_args(args)
    with staged_output(args.out, last=("count.json",), replaces=COUNTS_FILES) as stage:
        if getattr(args, "ray", False):
            from jobs.count import count_to as ray_count_to  # imports ray lazily

            _, summary = ray_count_to(args, stage)
        else:
            _, summary = count_to(args, stage)
        write_json_atomic(stage / "count.json", summary)
    print(
        f"counted {summary['tokens_counted']:,} tokens from {summary['sequences']:,} sequences in "
        f"{summary['files']} file(s): {summary['positions_occupied']:,}/{args.positions:,} positions occupied "
        f"({summary['storage']}) -> {args.out}",
        file=sys.stdout,
    )
    return 0
