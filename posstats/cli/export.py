"""``posstats export``: a run's MDS encoding as a position table a model loads in one line."""

from __future__ import annotations

import argparse
import sys

from posstats.errors import InputError
from posstats.jobs.output import print_json
from posstats.memory import require_memory, table_bytes
from posstats.reports.export import export_run
from posstats.reports.model_target import model_target
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
(--strict refuses them). --for-model PATH reads all of that from a BERT or GPT-2 model
folder's config.json (max_position_embeddings / n_positions, hidden_size / n_embd, the
architecture's prefix); --match-norm scales the rows to the mean norm of the model's own
position table (from model.safetensors in that folder).

examples:
  posstats export runs/demo --dim 768 --layout bert --out pos/bert-pos.safetensors
  posstats export runs/demo --dim 768 --rank 16 --factors --layout gpt2 --format pt --out pos/wpe.pt
  posstats export runs/demo512 --dim 384 --layout bert --prefix bert. --rows 512 --license apache-2.0 \
      --base-model sentence-transformers/all-MiniLM-L6-v2 --out pos/minilm-pos.safetensors
  posstats export runs/demo512 --for-model path/to/all-MiniLM-L6-v2 --match-norm --out pos/minilm-pos.safetensors
  python -c "from posstats.torch import MDSPositionalEmbedding as M; print(M.from_file('pos/bert-pos.safetensors'))"
"""


# what --json prints (posstats.jobs.output); None: no result, no --json
JSON_RESULT: str | None = "the exported table's metadata, files and warnings"

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="folder written by 'posstats run' or 'posstats analyze'")
    p.add_argument("--dim", type=int, metavar="D",
                   help="model width D (columns of the table); required unless --for-model gives it")
    p.add_argument("--rank", type=int, metavar="R",
                   help="rank r <= D of the encoding (default: the MDS components above sampling noise in the run's "
                        "verdict, at most D; a run with none exports nothing unless R is given; without a null: "
                        "min(D, MDS coordinates in the run))")
    p.add_argument("--layout", choices=("bert", "gpt2", "plain"), help="tensor name convention (default plain, or --for-model's)")
    p.add_argument("--format", choices=("safetensors", "npy", "pt"), help="file format (default: from the suffix of --out)")
    p.add_argument("--out", required=True, metavar="FILE", help="output file")
    p.add_argument("--factors", action="store_true", help="also write the low-rank factors A (n x r) and W (D x r); needs --rank")
    p.add_argument("--basis", choices=("pad", "random"), default="pad",
                   help="the orthonormal map W: zero padding (default) or a seeded random orthonormal basis")
    p.add_argument("--seed", type=int, default=0, help="seed of --basis random (default 0)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="stored dtype (default float32)")
    p.add_argument("--no-card", action="store_true", help="do not write README.md and the figures next to FILE")
    p.add_argument("--force", action="store_true",
                   help="overwrite existing files, and export a table even when no MDS component stands above "
                        "sampling noise (with a warning; --rank R chooses how many components instead)")
    p.add_argument("--method", choices=("classical", "smacof"), default="classical",
                   help="classical MDS coordinates (default), or their SMACOF refinement at rank r: lower "
                        "stress at the same width (classical MDS minimises strain, not stress)")
    m = p.add_argument_group("for a real model")
    m.add_argument("--for-model", metavar="PATH",
                   help="a transformers model folder (or its config.json), BERT or GPT-2: fills --rows, --dim, --layout "
                        "and --prefix from its config (explicit ones must agree), so the table loads with a strict key check")
    m.add_argument("--match-norm", action="store_true",
                   help="scale the rows to the mean row norm of the model's own position table (needs --for-model with "
                        "model.safetensors in the folder); scaled stress is unchanged")
    m.add_argument("--rows", type=int, metavar="N",
                   help="a table for a model with N positions: the first N rows (default: every counted position; "
                        "more than were counted is refused)")
    m.add_argument("--prefix", metavar="PREFIX",
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


def _for_model(args: argparse.Namespace) -> float | None:
    """Fill --rows, --dim, --layout, --prefix (and --base-model) from --for-model; an explicit
    value that disagrees is refused. Returns the row norm to match (--match-norm), or None."""
    if args.for_model is None:
        if args.match_norm:
            raise InputError("--match-norm needs --for-model (the model whose position table sets the norm)")
        if args.dim is None:
            raise InputError("give --dim D (the model width), or --for-model PATH to read it from the model's config")
        args.layout = args.layout or "plain"
        args.prefix = args.prefix if args.prefix is not None else ""
        return None
    target = model_target(args.for_model)
    for flag, given, wanted in (("--rows", args.rows, target.rows), ("--dim", args.dim, target.dim),
                                ("--layout", args.layout, target.layout), ("--prefix", args.prefix, target.prefix)):
        if given is not None and given != wanted:
            msg = f"{flag} {given!r} disagrees with --for-model {args.for_model}, which needs {wanted!r}"
            raise InputError(msg)
    args.rows, args.dim, args.layout, args.prefix = target.rows, target.dim, target.layout, target.prefix
    args.base_model = args.base_model or target.name
    if args.match_norm and target.row_norm is None:
        msg = f"--match-norm: {args.for_model} has no model.safetensors holding {target.key} to take the norm from"
        raise InputError(msg)
    return target.row_norm if args.match_norm else None


def run(args: argparse.Namespace) -> int:
    row_norm = _for_model(args)
    run_data = load_run(args.run_dir)
    _check_memory(args, run_data)
    res = export_run(
        run_data, args.out, dim=args.dim, rank=args.rank, layout=args.layout, format=args.format,
        factors=args.factors, basis=args.basis, seed=args.seed, dtype=args.dtype, card=not args.no_card, force=args.force,
        method=args.method, smacof_max_iter=args.smacof_max_iter, smacof_tol=args.smacof_tol,
        rows=args.rows, prefix=args.prefix, min_tokens=args.min_tokens, strict=args.strict, license=args.license,
        datasets=tuple(args.dataset), base_model=args.base_model, row_norm=row_norm,
    )
    for warning in res.warnings:
        print(f"posstats: warning: {warning}", file=sys.stderr)
    m = res.metadata
    print(f"exported {res.key} ({m['n']} x {m['d']}, rank {m['rank']} ({m['rank_rule']}), {m['dtype']}, {m['method']}): "
          f"stress {m['stress']}, scaled stress {m['scaled_stress']}")
    for f in res.files:
        print(f"  {f}")
    print_json(args, {"key": res.key, "metadata": m, "files": [str(f) for f in res.files],
                      "warnings": list(res.warnings)})
    return 0


def _check_memory(args: argparse.Namespace, run_data: RunData) -> None:
    """Refuse a --dim whose table cannot fit in memory, before building it."""
    if args.dim < 1 or (args.rank is not None and not 1 <= args.rank <= args.dim):
        return  # export_run explains these
    rank = args.rank if args.rank is not None else min(args.dim, run_data.encoding.shape[1])
    need, what, hint = table_bytes(run_data.positions.size, args.dim, rank, itemsize=4 if args.dtype == "float32" else 8)
    require_memory(need, what=what, hint=hint, command="export")
