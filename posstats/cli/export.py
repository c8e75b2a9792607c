"""``posstats export``: a run's MDS encoding as a position table a model loads in one line."""

from __future__ import annotations

import argparse
import sys

from posstats.errors import InputError
from posstats.jobs.output import print_json
from posstats.memory import require_memory, table_bytes
from posstats.jobs.flags import add_options, options_from_args
from posstats.reports.export import ExportOptions, export_run
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

Where occupancy falls steeply, the unweighted P_MDS's leading components can be the
sampling noise of positions with a few tokens (the report's caveat names them). At the
informative rank the table then holds the occupancy-weighted MDS instead, A = W^-1/2 U
sqrt(lambda) from the top eigenpairs of W^1/2 B_w W^1/2 (W = diag(N_i / mean N), B_w
the Gram matrix centred on the occupancy-weighted mean): the
components the occupancy-weighted rank test counted, fitted to each position in
proportion to its tokens (nearer the true geometry in 48 of 48 simulated corpora with
4-10 tokens a tail position; docs/calibration.md). --weighting none keeps P_MDS,
--weighting occupancy asks for the weighted one; metadata mds_weighting says which.

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
    p.add_argument("--out", required=True, metavar="FILE", help="output file")
    p.add_argument("--force", action="store_true",
                   help="overwrite existing files, and export a table even when no MDS component stands above "
                        "sampling noise (with a warning; --rank R chooses how many components instead)")
    add_options(p, ExportOptions)  # every table option, declared once on ExportOptions
    m = next(g for g in p._action_groups if g.title == "for a real model")
    m.add_argument("--for-model", metavar="PATH",
                   help="a transformers model folder (or its config.json), BERT or GPT-2: fills --rows, --dim, --layout "
                        "and --prefix from its config (explicit ones must agree), so the table loads with a strict key check")
    m.add_argument("--match-norm", action="store_true",
                   help="scale the rows to the mean row norm of the model's own position table (needs --for-model with "
                        "model.safetensors in the folder); scaled stress is unchanged")
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
    opts = options_from_args(ExportOptions, args)  # checked here, before the run is read
    run_data = load_run(args.run_dir)
    _check_memory(opts, run_data)
    res = export_run(run_data, args.out, opts, force=args.force, row_norm=row_norm)
    for warning in res.warnings:
        print(f"posstats: warning: {warning}", file=sys.stderr)
    m = res.metadata
    weighted = ", occupancy-weighted MDS" if m.get("mds_weighting") == "occupancy" else ""
    print(f"exported {res.key} ({m['n']} x {m['d']}, rank {m['rank']} ({m['rank_rule']}), {m['dtype']}, {m['method']}"
          f"{weighted}): stress {m['stress']}, scaled stress {m['scaled_stress']}")
    if weighted:
        print("  the unweighted MDS's leading components are thinly occupied positions' noise (the report's caveat): the "
              "table holds the occupancy-weighted components the rank test counted (--weighting none: P_MDS)")
    for f in res.files:
        print(f"  {f}")
    print_json(args, {"key": res.key, "metadata": m, "files": [str(f) for f in res.files],
                      "warnings": list(res.warnings)})
    return 0


def _check_memory(opts: ExportOptions, run_data: RunData) -> None:
    """Refuse a --dim whose table cannot fit in memory, before building it."""
    dim = int(opts.dim or 1)
    rank = opts.rank if opts.rank is not None else min(dim, run_data.encoding.shape[1])
    need, what, hint = table_bytes(run_data.positions.size, dim, rank, itemsize=4 if opts.dtype == "float32" else 8)
    require_memory(need, what=what, hint=hint, command="export")
