"""``posstats export``: a run's MDS encoding as a position table a model loads in one line."""

from __future__ import annotations

import argparse

from posstats.memory import require_memory, table_bytes
from posstats.reports.export import export_run
from posstats.runs.run_folder import RunData, load_run

HELP = "export the MDS encoding of a run as a BERT / GPT-2 / plain position table"
DESCRIPTION = """\
Write the run's information-optimal (MDS) positional encoding as an n x D table, where
n = the used positions (they must be exactly 0..n-1: re-run the analysis with a smaller
--positions or a lower --min-occupancy otherwise) and D = --dim. With --rank r the table
is the rank-r MDS encoding P_MDS(r) embedded in width D by an orthonormal map W (D x r),
so every pairwise distance is that of P_MDS(r); --factors also writes A = P_MDS(r) (n x r)
and W, with table = A W^T.

Keys: embeddings.position_embeddings.weight (--layout bert), wpe.weight (gpt2),
position_embeddings (plain); factors posstats.lowrank.A / posstats.lowrank.W.
safetensors files carry string metadata (corpus fingerprint, tokenizer hash, n, d, rank,
stress, scaled stress, tool version, run id). A model card README.md (YAML front matter,
key numbers, figures <stem>.spectrum.png / <stem>.lowrank.png) is written next to FILE.
Files are written atomically; existing ones are kept unless --force.

examples:
  posstats export runs/demo --dim 768 --layout bert --out pos/bert-pos.safetensors
  posstats export runs/demo --dim 768 --rank 16 --factors --layout gpt2 --format pt --out pos/wpe.pt
  python -c "from posstats.torch import MDSPositionalEmbedding as M; print(M.from_file('pos/bert-pos.safetensors'))"
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="folder written by 'posstats run' or 'posstats analyze'")
    p.add_argument("--dim", type=int, required=True, metavar="D", help="model width D (columns of the table)")
    p.add_argument("--rank", type=int, metavar="R", help="rank r <= D of the encoding (default: min(D, MDS coordinates in the run))")
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
    )
    m = res.metadata
    print(f"exported {res.key} ({m['n']} x {m['d']}, rank {m['rank']}, {m['dtype']}, {m['method']}): "
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
