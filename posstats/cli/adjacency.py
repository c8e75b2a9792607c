"""``posstats adjacency``: self-cosine similarity and adjacency scores (THEORY section 9)."""

from __future__ import annotations

import argparse
import datetime as _dt
import math
from pathlib import Path
from typing import Any

import numpy as np

from posstats.baselines.adjacency import (
    AdjacencyResult,
    LayerAdjacency,
    adjacency,
    layer_adjacency,
    plot_similarity_matrices,
)
from posstats.baselines.random_transformer import (
    RandomTransformer,
    TransformerConfig,
    set_torch_threads,
)
from posstats.corpus.readers import read_token_batches, resolve_inputs
from posstats.corpus.tokenizer import load_tokenizer, special_token_ids, vocab_size
from posstats.counting.counts import first_id_outside
from posstats.errors import InputError, PosstatsError
from posstats.geometry.encodings import (
    DEFAULT_ENCODINGS,
    DEFAULT_MAX_ENCODINGS,
    check_encoding_count,
    encoding_dims,
    expand_encoding_specs,
    family_of,
    make_encoding,
    split_encoding_list,
)
from posstats.jobs.output import print_json
from posstats.memory import require_memory, transformer_bytes
from posstats.storage.jsontext import write_json_atomic
from posstats.storage.publish import staged_output

HELP = "adjacency score of encodings and of a random causal transformer's hidden states"
DESCRIPTION = """\
Does position information appear without a positional encoding (THEORY.md section 9;
Zuo, Guerzhoy & Guerzhoy, "Positional Information Can Emerge Through Causal Attention
Making Nearby Token Embeddings Similar Even Without Positional Encodings")? For vectors
X (n x d) the self-cosine-similarity matrix is Cs[i, j] = cos(X_i, X_j); the row score of row k is the fraction of pairs 0 <= i < j < k
with Cs[k, i] < Cs[k, j] (strict: ties are not adjacent), and the adjacency probability
score is the mean over rows k >= 2. About 0.5 = no positional signal, near 1 = nearby
positions are the most similar.

Scored here:
  the model    a randomly initialised transformer with no positional encoding (torch, CPU;
               NanoGPT-style pre-LN blocks, every weight ~ N(0, init_std^2)), run on
               --sequences windows of --seq-len tokens; the token embeddings and every
               layer's output (residual stream) are scored, mean +- std over the windows.
               Tokens come from a real corpus (--input + --tokenizer: documents are
               tokenised without special tokens, concatenated in order and cut into
               consecutive windows) or uniformly at random (--random-tokens).
  encodings    --encodings NAME,NAME: matrices of the encodings catalog with --seq-len
               positions and width --encoding-dim (mds needs corpus counts: skipped).

Writes OUT/adjacency.json (written last), OUT/adjacency-layers.png (heatmaps of the
first window, one panel per layer) and OUT/adjacency-encodings.png.

That paper reports ~0.5 for token embeddings, > 0.8 from the first causal layer at
init std 0.02, the pattern fading at std 0.2, and none with bidirectional attention.

examples:
  posstats adjacency --input data/fortunes-sample.jsonl \\
      --tokenizer data/tokenizers/gpt2.tokenizer.json --out runs/adjacency
  posstats adjacency --random-tokens --init-std 0.2 --layers 6 --out runs/adjacency-0.2
  posstats adjacency --random-tokens --bidirectional --out runs/adjacency-bidir
  posstats adjacency --encodings sinusoidal,rope,alibi,random --seq-len 256 --out runs/enc
"""

SCHEMA = "posstats.adjacency/1"
MAX_PANELS = 16


# what --json prints (posstats.jobs.output); None: no result, no --json
JSON_RESULT: str | None = "adjacency.json's document"

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("adjacency", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    i = p.add_argument_group("token sequences (for the model; one of --input or --random-tokens)")
    i.add_argument("--input", metavar="PATH",
                   help="corpus file (.jsonl, .txt (one document per line), .parquet, .csv, "
                        "optionally .gz) or HF dataset folder")
    i.add_argument("--tokenizer", metavar="TOKENIZER_JSON",
                   help="a Hugging Face tokenizer.json for the text of --input (its vocabulary sets the model's)")
    i.add_argument("--text-column", default="text", metavar="NAME",
                   help="column holding the text (default 'text'; ignored for .txt files)")
    i.add_argument("--column", metavar="NAME",
                   help="column holding token ids instead of text (needs --vocab-size)")
    i.add_argument("--random-tokens", action="store_true",
                   help="token ids drawn uniformly from [0, --vocab-size) with --seed")
    i.add_argument("--vocab-size", type=int, metavar="V",
                   help="vocabulary size with --random-tokens (default 32768) or --column")
    i.add_argument("--seq-len", type=int, default=64, metavar="N",
                   help="positions per sequence, also the encodings' positions (default 64)")
    i.add_argument("--sequences", type=int, default=16, metavar="K", help="number of sequences (default 16)")
    m = p.add_argument_group("model (randomly initialised, no positional encoding unless --rope)")
    m.add_argument("--layers", type=int, default=6, metavar="H", help="transformer blocks (default 6)")
    m.add_argument("--dim", type=int, default=384, metavar="D", help="model width (default 384)")
    m.add_argument("--heads", type=int, default=6, metavar="K", help="attention heads (default 6)")
    m.add_argument("--mlp-ratio", type=int, default=4, metavar="R", help="MLP width / D; 0 = no MLP (default 4)")
    m.add_argument("--init-std", type=float, default=0.02, metavar="S",
                   help="std of the Gaussian initialisation of every weight (default 0.02; the paper also uses 0.2)")
    m.add_argument("--bidirectional", action="store_true", help="bidirectional (unmasked) attention instead of causal")
    m.add_argument("--rope", action="store_true", help="rotary position embedding on queries and keys")
    m.add_argument("--norm", choices=("pre", "post"), default="pre",
                   help="LayerNorm before each sublayer (pre, GPT-2/NanoGPT; default) or after the residual add (post)")
    m.add_argument("--threads", type=int, default=1, metavar="T",
                   help="torch intra-op threads (default 1: the model is small and more threads mostly contend)")
    m.add_argument("--scaled-init", action="store_true",
                   help="NanoGPT's init_std/sqrt(2 layers) for the output projections (default: plain init_std)")
    e = p.add_argument_group("encodings")
    e.add_argument("--encodings", metavar="NAME,NAME",
                   help="encodings of the catalog to score, e.g. sinusoidal,rope,alibi,random,random:0.02 "
                        "(spec strings as in `posstats analyze`), or 'default' for the catalog's default "
                        "list; mds needs corpus counts and is skipped")
    e.add_argument("--encoding-dim", type=int, metavar="D", help="encoding width (default: --dim)")
    e.add_argument("--max-encodings", type=int, default=DEFAULT_MAX_ENCODINGS, metavar="N",
                   help=f"refuse --encodings that expand to more than N (sweeps multiply; default {DEFAULT_MAX_ENCODINGS})")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the model weights and of --random-tokens (default 0; a random encoding "
                        "takes its seed from its spec)")
    p.add_argument("--out", metavar="DIR",
                   help="write adjacency.json and heatmap PNGs here (old results replaced only on success)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Score the model's layers and/or the encodings; print a summary, write OUT on request."""
    specs = _encoding_specs(args)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "definition": "row k: fraction of 0 <= i < j < k with Cs[k,i] < Cs[k,j]; score: mean over k >= 2",
        "notes": [],
    }
    layers = _score_model(args, doc) if args.input or args.random_tokens else None
    encodings = _score_encodings(args, specs, doc) if specs else []
    _print_summary(layers, encodings, doc)
    if args.out:
        _write_outputs(args.out, layers, encodings, doc)
    print_json(args, doc)
    return 0


def _encoding_specs(args: argparse.Namespace) -> list[str]:
    """The encoding specs to score (``default`` expanded), once the arguments are checked."""
    if args.input and args.random_tokens:
        raise PosstatsError("give either --input or --random-tokens, not both")
    listed = split_encoding_list(args.encodings or "")
    check_encoding_count(listed, limit=args.max_encodings)
    specs = list(expand_encoding_specs(listed))
    if "default" in specs:
        specs = [x for s in specs for x in (_default_encodings() if s == "default" else [s])]
    if not (args.input or args.random_tokens) and not specs:
        raise PosstatsError("nothing to score: give --input FILE --tokenizer FILE, --random-tokens, or --encodings")
    if args.seq_len < 3:
        msg = f"--seq-len must be >= 3 (row k needs two earlier positions); got {args.seq_len}"
        raise PosstatsError(msg)
    if args.sequences < 1:
        msg = f"--sequences must be >= 1; got {args.sequences}"
        raise PosstatsError(msg)
    return specs


def _score_model(args: argparse.Namespace, doc: dict[str, Any]) -> LayerAdjacency:
    """Adjacency of the random transformer's embeddings and layers over the token windows;
    fills ``doc["model"]``."""
    tokens, vocab, source = _token_sequences(args)
    cfg = _model_config(args, vocab)
    doc["model"] = {"config": cfg.to_dict(), "tokens": source, "seq_len": args.seq_len,
                    "sequences": int(tokens.shape[0])}
    if args.threads < 1:
        msg = f"--threads must be >= 1; got {args.threads}"
        raise PosstatsError(msg)
    need, what, hint = transformer_bytes(layers=cfg.layers, dim=cfg.dim, vocab_size=cfg.vocab_size,
                                         mlp_ratio=cfg.mlp_ratio, tokens=int(tokens.size), itemsize=4)
    require_memory(need, what=what, hint=hint + ", --sequences or --seq-len", command="adjacency")
    try:
        set_torch_threads(args.threads)
        hidden = RandomTransformer(cfg).hidden_states(tokens)
    except ImportError as exc:
        raise PosstatsError(str(exc)) from None
    layers = layer_adjacency(hidden)
    doc["model"].update(layers.to_dict())
    return layers


def _score_encodings(args: argparse.Namespace, specs: list[str], doc: dict[str, Any]) -> list[AdjacencyResult]:
    """Adjacency of each catalog encoding (--seq-len positions, width --encoding-dim);
    fills ``doc["encodings"]`` and notes the skipped ones."""
    dim = args.encoding_dim or args.dim
    if dim >= 1:
        require_memory(3 * 8 * args.seq_len * dim, what=f"encodings of {args.seq_len:,} positions x width {dim:,}",
                       hint="lower --encoding-dim (or --dim)", command="adjacency")
    encodings = []
    for spec in specs:
        matrix, name, note = _encoding(spec, args.seq_len, dim)
        if matrix is None:
            doc["notes"].append(note)
            continue
        encodings.append(adjacency(matrix, name=name))
    doc["encodings"] = [{**r.to_dict(), "dim": dim} for r in encodings]
    return encodings


def _write_outputs(
    out: str, layers: LayerAdjacency | None, encodings: list[AdjacencyResult], doc: dict[str, Any]
) -> None:
    """OUT/adjacency.json (last) and the heatmaps of the first window's layers and of the encodings."""
    written = []
    with staged_output(out, last=("adjacency.json",)) as stage:
        if layers is not None:
            keep = _panel_indices(len(layers.names))
            fig = plot_similarity_matrices(
                [layers.example[i] for i in keep],
                [f"{layers.names[i]} ({layers.scores[0, i]:.2f})" for i in keep],
                suptitle="self-cosine similarity, sequence 0 (adjacency score)",
            )
            fig.savefig(stage / "adjacency-layers.png", dpi=100)
            written.append("adjacency-layers.png")
        if encodings:
            fig = plot_similarity_matrices(
                [r.similarity for r in encodings[:MAX_PANELS]],
                [f"{r.name} ({r.score:.2f})" for r in encodings[:MAX_PANELS]],
                suptitle="self-cosine similarity of encodings (adjacency score)",
            )
            fig.savefig(stage / "adjacency-encodings.png", dpi=100)
            written.append("adjacency-encodings.png")
        write_json_atomic(stage / "adjacency.json", doc)
    print(f"wrote {', '.join(str(Path(out) / n) for n in ['adjacency.json', *written])}")


def _panel_indices(n: int) -> list[int]:
    if n <= MAX_PANELS:
        return list(range(n))
    return sorted({int(round(v)) for v in np.linspace(0, n - 1, MAX_PANELS)})


def _model_config(args: argparse.Namespace, vocab: int) -> TransformerConfig:
    try:
        return TransformerConfig(
            layers=args.layers, dim=args.dim, heads=args.heads, vocab_size=vocab, mlp_ratio=args.mlp_ratio,
            init_std=args.init_std, causal=not args.bidirectional, rope=args.rope, norm=args.norm,
            scaled_residual_init=args.scaled_init, seed=args.seed,
        )
    except ValueError as exc:
        raise PosstatsError(f"bad model config: {exc}") from None


def _token_sequences(args: argparse.Namespace) -> tuple[np.ndarray, int, dict[str, Any]]:
    """(sequences x seq_len) token ids, the vocabulary size and a description of the source."""
    n, k = args.seq_len, args.sequences
    if args.random_tokens:
        vocab = 32768 if args.vocab_size is None else args.vocab_size
        if vocab < 1:
            msg = f"--vocab-size must be >= 1; got {vocab}"
            raise PosstatsError(msg)
        rng = np.random.default_rng(args.seed)
        return rng.integers(0, vocab, size=(k, n)), vocab, {"kind": "random", "vocab_size": vocab}
    batches, vocab, source, exclude = _corpus_batches(args)
    stream = _first_tokens(batches, n * k, vocab, exclude, args.input)
    source["exclude_ids"] = exclude
    source["packing"] = "documents concatenated in order, cut into consecutive windows"
    return stream.reshape(k, n), vocab, source


def _corpus_batches(args: argparse.Namespace) -> tuple[Any, int, dict[str, Any], list[int]]:
    """(token batches of --input, vocabulary size, source description, special ids to drop)."""
    source: dict[str, Any] = {"kind": "corpus", "input": args.input}
    if args.column:
        if args.vocab_size is None:
            raise PosstatsError("--column needs --vocab-size")
        return read_token_batches(resolve_inputs([args.input]), column=args.column), args.vocab_size, source, []
    if not args.tokenizer:
        raise PosstatsError("--input needs --tokenizer (or --column NAME --vocab-size V for token ids)")
    tok = load_tokenizer(args.tokenizer)
    vocab = vocab_size(tok) if args.vocab_size is None else args.vocab_size
    exclude = special_token_ids(tok)
    source["tokenizer"] = args.tokenizer
    batches = read_token_batches(resolve_inputs([args.input]), text_column=args.text_column, tokenizer=tok)
    return batches, vocab, source, exclude


def _first_tokens(batches: Any, need: int, vocab: int, exclude: list[int], input_name: str) -> np.ndarray:
    """The first ``need`` ids of the batches' token stream, ``exclude`` ids dropped; each
    id checked against [0, vocab)."""
    parts, have = [], 0
    for batch in batches:
        found = first_id_outside(batch, vocab)
        if found is not None:
            msg = f"{batch.source}: row {found[0]}: token id {found[1]} outside [0, {vocab})"
            raise InputError(msg)
        values = np.asarray(batch.values, dtype=np.int64)
        if exclude:
            values = values[~np.isin(values, exclude)]
        parts.append(values)
        have += values.size
        if have >= need:
            break
    if have < need:
        msg = (f"{input_name}: {have} tokens, fewer than --sequences x --seq-len = {need}; "
               "lower --sequences or --seq-len")
        raise InputError(msg)
    return np.concatenate(parts)[:need]


def _encoding(spec: str, n: int, dim: int) -> tuple[np.ndarray | None, str, str]:
    """(matrix, name, note): the catalog's encoding, or None and why it was skipped."""
    if family_of(spec).fitted:
        return None, spec, f"{spec}: skipped (the MDS encoding needs corpus counts)"
    if dim < 1:
        msg = f"--encoding-dim must be >= 1; got {dim}"
        raise PosstatsError(msg)
    enc = make_encoding(spec, np.arange(n), encoding_dims(spec, (dim,))[0])  # hf: its own head_dim
    return np.asarray(enc.matrix, dtype=np.float64), str(enc.name), ""


def _default_encodings() -> list[str]:
    """The catalog's default list without the encodings that need corpus counts."""
    return [s for s in DEFAULT_ENCODINGS if not family_of(s).fitted]


def _fmt(v: float) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.3f}"


def _print_summary(layers: Any, encodings: list[Any], doc: dict[str, Any]) -> None:
    if layers is not None:
        cfg = doc["model"]["config"]
        attn = "causal" if cfg["causal"] else "bidirectional"
        print(f"random transformer: {cfg['layers']} layers, d={cfg['dim']}, {cfg['heads']} heads, {attn}, "
              f"init std {cfg['init_std']:g}, {'RoPE' if cfg['rope'] else 'no positional encoding'}, "
              f"{cfg['norm']}-LN; {layers.scores.shape[0]} sequences x {doc['model']['seq_len']} tokens "
              f"({doc['model']['tokens']['kind']})")
        for name, mean, std in zip(layers.names, layers.mean, layers.std):
            print(f"  {name:12s} adjacency {_fmt(mean)} +- {_fmt(std)}")
    for r in encodings:
        print(f"encoding {r.name:24s} adjacency {_fmt(r.score)}")
    for note in doc["notes"]:
        print(f"note: {note}")
