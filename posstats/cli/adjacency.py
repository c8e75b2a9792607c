"""``posstats adjacency``: self-cosine similarity and adjacency scores (THEORY section 9)."""

from __future__ import annotations

import argparse
import datetime as _dt
import math
from pathlib import Path
from typing import Any

import numpy as np

from posstats.errors import InputError, PosstatsError

HELP = "adjacency score of encodings and of a random causal transformer's hidden states"
DESCRIPTION = """\
Does position information appear without a positional encoding (THEORY.md section 9,
papers/004)? For vectors X (n x d) the self-cosine-similarity matrix is
Cs[i, j] = cos(X_i, X_j); the row score of row k is the fraction of pairs 0 <= i < j < k
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

papers/004 reports ~0.5 for token embeddings, > 0.8 from the first causal layer at
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
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the model weights and of --random-tokens (default 0; a random encoding "
                        "takes its seed from its spec)")
    p.add_argument("--out", metavar="DIR",
                   help="write adjacency.json and heatmap PNGs here (old results replaced only on success)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posstats.baselines.adjacency import adjacency, layer_adjacency

    if args.input and args.random_tokens:
        raise PosstatsError("give either --input or --random-tokens, not both")
    wants_model = bool(args.input or args.random_tokens)
    specs = [s.strip() for s in (args.encodings or "").split(",") if s.strip()]
    if "default" in specs:
        specs = [x for s in specs for x in (_default_encodings() if s == "default" else [s])]
    if not wants_model and not specs:
        raise PosstatsError("nothing to score: give --input FILE --tokenizer FILE, --random-tokens, or --encodings")
    if args.seq_len < 3:
        msg = f"--seq-len must be >= 3 (row k needs two earlier positions); got {args.seq_len}"
        raise PosstatsError(msg)
    if args.sequences < 1:
        msg = f"--sequences must be >= 1; got {args.sequences}"
        raise PosstatsError(msg)

    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "definition": "row k: fraction of 0 <= i < j < k with Cs[k,i] < Cs[k,j]; score: mean over k >= 2",
        "notes": [],
    }
    layers = None
    if wants_model:
        tokens, vocab, source = _token_sequences(args)
        cfg = _model_config(args, vocab)
        doc["model"] = {"config": cfg.to_dict(), "tokens": source, "seq_len": args.seq_len,
                        "sequences": int(tokens.shape[0])}
        from posstats.baselines.random_transformer import RandomTransformer, set_torch_threads

        if args.threads < 1:
            msg = f"--threads must be >= 1; got {args.threads}"
            raise PosstatsError(msg)
        from posstats.memory import require_memory, transformer_bytes

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

    encodings = []
    if specs:
        dim = args.encoding_dim or args.dim
        if dim >= 1:
            from posstats.memory import require_memory

            require_memory(3 * 8 * args.seq_len * dim, what=f"encodings of {args.seq_len:,} positions x width {dim:,}",
                           hint="lower --encoding-dim (or --dim)", command="adjacency")
        for spec in specs:
            matrix, name, note = _encoding(spec, args.seq_len, dim)
            if matrix is None:
                doc["notes"].append(note)
                continue
            encodings.append(adjacency(matrix, name=name))
        doc["encodings"] = [{**r.to_dict(), "dim": dim} for r in encodings]

    _print_summary(layers, encodings, doc)
    if args.out:
        from posstats.baselines.adjacency import plot_similarity_matrices
        from posstats.runs.publish import staged_output
        from posstats.counting.io import write_json_atomic

        written = []
        with staged_output(args.out, last=("adjacency.json",)) as stage:
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
        print(f"wrote {', '.join(str(Path(args.out) / n) for n in ['adjacency.json', *written])}")
    return 0


def _panel_indices(n: int) -> list[int]:
    if n <= MAX_PANELS:
        return list(range(n))
    return sorted({int(round(v)) for v in np.linspace(0, n - 1, MAX_PANELS)})


def _model_config(args: argparse.Namespace, vocab: int) -> Any:
    try:
        from posstats.baselines.random_transformer import TransformerConfig

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

    from posstats.corpus.readers import read_token_batches, resolve_inputs

    exclude: list[int] = []
    source: dict[str, Any] = {"kind": "corpus", "input": args.input}
    if args.column:
        if args.vocab_size is None:
            raise PosstatsError("--column needs --vocab-size")
        vocab = args.vocab_size
        batches = read_token_batches(resolve_inputs([args.input]), column=args.column)
    else:
        if not args.tokenizer:
            raise PosstatsError("--input needs --tokenizer (or --column NAME --vocab-size V for token ids)")
        from posstats.corpus.tokenizer import load_tokenizer, special_token_ids, vocab_size

        tok = load_tokenizer(args.tokenizer)
        vocab = vocab_size(tok) if args.vocab_size is None else args.vocab_size
        exclude = special_token_ids(tok)
        source["tokenizer"] = args.tokenizer
        batches = read_token_batches(resolve_inputs([args.input]), text_column=args.text_column, tokenizer=tok)
    need = n * k
    parts, have = [], 0
    for batch in batches:
        values = np.asarray(batch.values, dtype=np.int64)
        if exclude:
            values = values[~np.isin(values, exclude)]
        if values.size and (values.min() < 0 or values.max() >= vocab):
            bad = int(values[(values < 0) | (values >= vocab)][0])
            msg = f"{batch.source}: token id {bad} outside [0, {vocab})"
            raise InputError(msg)
        parts.append(values)
        have += values.size
        if have >= need:
            break
    if have < need:
        msg = (f"{args.input}: {have} tokens, fewer than --sequences x --seq-len = {need}; "
               "lower --sequences or --seq-len")
        raise InputError(msg)
    stream = np.concatenate(parts)[:need]
    source["exclude_ids"] = exclude
    source["packing"] = "documents concatenated in order, cut into consecutive windows"
    return stream.reshape(k, n), vocab, source


def _encoding(spec: str, n: int, dim: int) -> tuple[np.ndarray | None, str, str]:
    """(matrix, name, note): the catalog's encoding, or None and why it was skipped."""
    if spec.split(":", 1)[0] in ("mds", "mds-lowrank"):
        return None, spec, f"{spec}: skipped (the MDS encoding needs corpus counts)"
    if dim < 1:
        msg = f"--encoding-dim must be >= 1; got {dim}"
        raise PosstatsError(msg)
    try:
        from posstats.geometry.encodings import make_encoding
    except ModuleNotFoundError as exc:
        if exc.name != "posstats.geometry.encodings":
            raise
        if spec != "sinusoidal":
            msg = f"unknown encoding {spec!r}: this checkout has no encodings catalog; only 'sinusoidal' is available"
            raise PosstatsError(msg) from None
        return _sinusoidal(n, dim), "sinusoidal", ""
    enc = make_encoding(spec, np.arange(n), dim)
    return np.asarray(enc.matrix, dtype=np.float64), str(enc.name), ""


def _default_encodings() -> list[str]:
    try:
        from posstats.geometry.encodings import DEFAULT_ENCODINGS
    except ModuleNotFoundError as exc:
        if exc.name != "posstats.geometry.encodings":
            raise
        return ["sinusoidal"]
    return [s for s in DEFAULT_ENCODINGS if s.split(":", 1)[0] not in ("mds", "mds-lowrank")]


def _sinusoidal(n: int, dim: int) -> np.ndarray:
    """THEORY section 5: P[i, 2k] = sin(i w_k), P[i, 2k+1] = cos(i w_k), w_k = 10000^(-2k/d)."""
    if dim % 2:
        msg = f"sinusoidal needs an even width; got {dim}"
        raise PosstatsError(msg)
    w = 10000.0 ** (-2.0 * np.arange(dim // 2) / dim)
    ang = np.arange(n, dtype=np.float64)[:, None] * w[None, :]
    out = np.empty((n, dim))
    out[:, 0::2] = np.sin(ang)
    out[:, 1::2] = np.cos(ang)
    return out


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
