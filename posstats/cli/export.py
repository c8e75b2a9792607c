"""``posstats export``: a run's MDS encoding as a position table a model loads in one line."""

from __future__ import annotations

import argparse
import sys

from posstats.memory import require_memory, table_bytes
from posstats.reports.export import export_run
from posstats.runs.run_folder import RunData, load_run

HELP = "export the MDS encoding of a run as a BERT / GPT-2 / plain position table"
DESCRIPTION = """\
Write the run's information-optimal (MDS) positional encoding as an n x D table, where
n = the used positions (they must be exactly 0..n-1: re-run the analysis with a smaller
--positions or a lower --min-occupancy otherwise) and D = --dim. The table is the rank-r
MDS encoding P_MDS(r) embedded in width D by an orthonormal map W (D x r); r defaults to
the components that stand above sampling noise in the run's verdict (a run with none
exports nothing: its table would be noise; --rank R exports R components anyway, with a
warning). Every pairwise distance of the table is that of P_MDS(r); --factors also
writes A = P_MDS(r) (n x r) and W, with table = A W^T.

Keys: embeddings.position_embeddings.weight (--layout bert), wpe.weight (gpt2),
position_embeddings (plain); factors posstats.lowrank.A / posstats.lowrank.W.
safetensors files carry string metadata (corpus fingerprint, tokenizer hash, n, d, rank,
stress, scaled stress, tool version, run id). A model card is written next to FILE:
README.md, or <stem>.README.md when the folder's README.md belongs to something else (so
several exports share a folder); YAML front matter (license, datasets, base_model, the
numbers as numbers), key numbers, caveats (rows counted from few tokens, noise), figures
<stem>.spectrum.png / <stem>.lowrank.png, and a transformers loading snippet with a key
check. Files are written atomically; existing ones are kept unless --force.

For a real model: --rows N cuts the table to a model with N positions, --prefix puts the
key under the head class' module (bert. for BertForMaskedLM, transformer. for
GPT2LMHeadModel), and rows counted from fewer than --min-tokens tokens are warned about
(--strict refuses them).

examples:
  posstats export runs/demo --dim 768 --layout bert --out pos/bert-pos.safetensors
  posstats export runs/demo --dim 768 --rank 16 --factors --layout gpt2 --format pt --out pos/wpe.pt
  posstats export runs/demo512 --dim 384 --layout bert --prefix bert. --rows 512 --license apache-2.0 \
      --base-model sentence-transformers/all-MiniLM-L6-v2 --out pos/minilm-pos.safetensors
  python -c "from posstats.torch import MDSPositionalEmbedding as M; print(M.from_file('pos/bert-pos.safetensors'))"
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="folder written by 'posstats run' or 'posstats analyze'")
    p.add_argument("--dim", type=int, required=True, metavar="D", help="model width D (columns of the table)")
    p.add_argument("--rank", type=int, metavar="R",
                   help="rank r <= D of the encoding (default: the MDS components above sampling noise in the run's "
                        "verdict, at most D; a run with none exports nothing unless R is given; without a null: "
                        "min(D, MDS coordinates in the run))")
    p.add_argument("--layout", choices=("bert", "gpt2", "plain"), default="plain", help="tensor name convention (default plain)")
    p.add_argument("--format", choices=("safetensors", "npy", "pt"), help="file format (default: from the suffix of --out)")
    p.add_argument("--out", required=True, metavar="FILE", help="output file")
    p.add_argument("--factors", action="store_true", help="also write the low-rank factors A (n x r) and W (D x r); needs --rank")
    p.add_argument("--basis", choices=("pad", "random"), default="pad",
                   help="the orthonormal map W: zero padding (default) or a seeded random orthonormal basis")
    p.add_argument("--seed", type=int, default=0, help="seed of --basis random (default 0)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="stored dtype (default float32)")
    p.add_argument("--no-card", action="store_true", help="do not write README.md and the figures next to FILE")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.add_argument("--method", choices=("classical", "smacof"), default="classical",
                   help="classical MDS coordinates (default), or their SMACOF refinement at rank r: lower "
                        "stress at the same width (classical MDS minimises strain, not stress)")
    m = p.add_argument_group("for a real model")
    m.add_argument("--rows", type=int, metavar="N",
                   help="a table for a model with N positions: the first N rows (default: every counted position; "
                        "more than were counted is refused)")
    m.add_argument("--prefix", default="", metavar="PREFIX",
                   help="put before the key: 'bert.' for BertForMaskedLM, 'transformer.' for GPT2LMHeadModel "
                        "(default none: BertModel / GPT2Model)")
    m.add_argument("--min-tokens", type=int, default=10, metavar="K",
                   help="warn about rows counted from fewer than K tokens (default 10): they are mostly noise")
    m.add_argument("--strict", action="store_true", help="refuse the export when a row has fewer than --min-tokens")
    m.add_argument("--license", metavar="ID", help="the model card's license (e.g. apache-2.0; default unknown)")
    m.add_argument("--dataset", action="append", default=[], metavar="NAME",
                   help="a dataset the corpus came from, for the model card; repeatable")
    m.add_argument("--base-model", metavar="NAME", help="the model the table is for, for the model card and its snippet")
    p.add_argument("--smacof-max-iter", type=int, default=300, metavar="K", help="SMACOF iteration cap (default 300)")
    p.add_argument("--smacof-tol", type=float, default=1e-6, metavar="TOL",
                   help="SMACOF stops when the relative stress decrease is below TOL (default 1e-6)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    run_data = load_run(args.run_dir)
    _check_memory(args, run_data)
    res = export_run(
        run_data, args.out, dim=args.dim, rank=args.rank, layout=args.layout, format=args.format,
        factors=args.factors, basis=args.basis, seed=args.seed, dtype=args.dtype, card=not args.no_card, force=args.force,
        method=args.method, smacof_max_iter=args.smacof_max_iter, smacof_tol=args.smacof_tol,
        rows=args.rows, prefix=args.prefix, min_tokens=args.min_tokens, strict=args.strict, license=args.license,
        datasets=tuple(args.dataset), base_model=args.base_model,
    )
    for warning in res.warnings:
        print(f"posstats: warning: {warning}", file=sys.stderr)
    m = res.metadata
    print(f"exported {res.key} ({m['n']} x {m['d']}, rank {m['rank']} ({m['rank_rule']}), {m['dtype']}, {m['method']}): "
          f"stress {m['stress']}, scaled stress {m['scaled_stress']}")
    for f in res.files:
        print(f"  {f}")
    return 0


def _check_memory(args: argparse.Namespace, run_data: RunData) -> None:
    """Refuse a --dim whose table cannot fit in memory, before building it."""
    if args.dim < 1 or (args.rank is not None and not 1 <= args.rank <= args.dim):
        return  # export_run explains these
    rank = args.rank if args.rank is not None else min(args.dim, run_data.encoding.shape[1])
    need, what, hint = table_bytes(run_data.positions.size, args.dim, rank, itemsize=4 if args.dtype == "float32" else 8)
    require_memory(need, what=what, hint=hint, command="export")
