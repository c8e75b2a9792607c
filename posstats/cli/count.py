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
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("count", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_args(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created; old results replaced only on success)")
    p.set_defaults(func=run)


def count_to(args: argparse.Namespace, stage) -> tuple:
    """Count the corpus of ``args`` into the staging folder; return (counts, summary)."""
    from posstats.corpus import count_corpus
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


def run(args: argparse.Namespace) -> int:
    from posstats.outputs import staged_output
    from posstats.storage import write_json_atomic

    with staged_output(args.out, last=("count.json",)) as stage:
        counts, summary = count_to(args, stage)
        write_json_atomic(stage / "count.json", summary)
    print(
        f"counted {summary['tokens_counted']:,} tokens from {summary['sequences']:,} sequences in "
        f"{summary['files']} file(s): {summary['positions_occupied']:,}/{counts.positions:,} positions occupied "
        f"({summary['storage']}) -> {args.out}",
        file=sys.stdout,
    )
    return 0
