"""``posstats audit``: a checkpoint's learned position table against a corpus."""

from __future__ import annotations

import argparse
from pathlib import Path

from posstats.errors import PosstatsError
from posstats.jobs.output import print_json
from posstats.audit import audit_checkpoint
from posstats.reports.audit import format_audit
from posstats.storage.jsontext import write_json_atomic

HELP = "audit a checkpoint's learned position table (stress, separation, monotonicity, layer-wise projected stress)"
DESCRIPTION = """\
Read a safetensors checkpoint (or an .npy table) without executing code from it (pickled
.bin/.pt files are refused), find its learned position table (BERT
*embeddings.position_embeddings.weight or GPT-2 *wpe.weight; --key otherwise) and report,
against the corpus of --counts: stress, scaled stress, separation and monotonicity of the
table's rows (row i = position i), the MDS and sinusoidal encodings at the same width for
reference (when --counts is an analysed run folder), and the layer-wise projected stress
of P M_l, M_l = W_Q^T W_K (nn.Linear weights) for every attention layer found (BERT
encoder.layer.L.attention.self.{query,key}.weight, GPT-2 h.L.attn.c_attn.weight), per
head and averaged over heads (heads from config.json next to the checkpoint, or --heads).

example:
  posstats audit model/model.safetensors --counts runs/demo --out runs/demo/audit.json
  posstats audit path/to/model-folder --counts runs/demo    # config.json + model.safetensors
"""


# what --json prints (posstats.jobs.output); None: no result, no --json
JSON_RESULT: str | None = 'the audit (what --out writes)'

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="a .safetensors checkpoint, an .npy (n, d) table, or a model folder (config.json + model.safetensors)")
    p.add_argument("--counts", required=True, metavar="RUN_DIR", help="run folder ('posstats run'/'analyze') or counts folder ('posstats count')")
    p.add_argument("--key", metavar="NAME", help="tensor name of the position table (default: auto-detected)")
    p.add_argument("--heads", type=int, metavar="H", help="attention heads per layer (default: config.json next to the checkpoint)")
    p.add_argument("--min-occupancy", type=int, metavar="K", help="for a counts folder: leave out positions with fewer tokens (default 1)")
    p.add_argument("--offset", type=_offset, default="auto", metavar="K|auto",
                   help="compare corpus position i with table row i + K; auto (default): from the model and the "
                        "counts' exclusions (1 for BERT against counts without [CLS], which the model puts at row 0; "
                        "pad_token_id + 1 more for RoBERTa), said in the output")
    p.add_argument("--no-layers", action="store_true", help="skip the layer-wise projected stress")
    p.add_argument("--seed", type=int, default=0, help="seed of sampled monotonicity (default 0)")
    p.add_argument("--out", metavar="FILE.json", help="also write the audit as JSON")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    p.set_defaults(func=run)


def _offset(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer >= 0, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    if args.heads is not None and args.heads < 1:
        msg = f"--heads must be a positive integer; got {args.heads}"
        raise PosstatsError(msg)
    if args.out and Path(args.out).exists() and not args.force:
        msg = f"{args.out}: exists; pass --force to overwrite"
        raise PosstatsError(msg)
    result = audit_checkpoint(args.checkpoint, args.counts, key=args.key, heads=args.heads,
                              min_occupancy=args.min_occupancy, offset=args.offset, layers=not args.no_layers, seed=args.seed)
    print(format_audit(result))
    if args.out:
        write_json_atomic(args.out, result.to_dict())
        print(f"\naudit: {args.out}")
    print_json(args, result.to_dict())
    return 0
