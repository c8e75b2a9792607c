"""Argument groups shared by several subcommands (input selection, analysis options)."""

from __future__ import annotations

import argparse
from pathlib import Path

from posstats.counts import MODES, CountSpec
from posstats.errors import PosstatsError

__all__ = ["add_analysis_args", "add_input_args", "analysis_config", "count_inputs", "int_list"]


def int_list(text: str) -> tuple[int, ...]:
    """Parse ``"1,2,3"`` into a tuple of ints (argparse type)."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        msg = f"expected comma-separated integers, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None


def str_list(text: str) -> tuple[str, ...]:
    """Parse ``"a,b"`` into a tuple of non-empty strings (argparse type)."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def add_input_args(parser: argparse.ArgumentParser) -> None:
    """The corpus-selection and counting flags of ``count`` / ``run``."""
    from posstats.readers import FORMATS

    g = parser.add_argument_group("input corpus")
    g.add_argument("--input", action="append", required=True, metavar="PATH_OR_GLOB",
                   help="input file, folder (HF dataset) or glob; repeatable")
    g.add_argument("--format", choices=FORMATS, default=None,
                   help="input format (default: guessed from each file's suffix: .parquet/.arrow, "
                        ".jsonl/.json, .txt/.md (one text per line), .csv/.tsv, folder = HF dataset)")
    g.add_argument("--column", metavar="NAME", help="column holding token ids (a list of ints per row)")
    g.add_argument("--text-column", metavar="NAME",
                   help="column holding raw text, tokenised with --tokenizer (not needed for .txt files)")
    g.add_argument("--tokenizer", metavar="TOKENIZER_JSON",
                   help="a Hugging Face tokenizer.json (padding and truncation are switched off)")
    g.add_argument("--hf-streaming", action="store_true", help="stream HF datasets instead of caching them")
    c = parser.add_argument_group("counting")
    c.add_argument("--positions", type=int, default=512, metavar="N",
                   help="number of positions n (window length); default 512")
    c.add_argument("--vocab-size", type=int, metavar="V",
                   help="vocabulary size (default: the tokenizer's; required with --column and no tokenizer)")
    c.add_argument("--exclude-tokens", type=int_list, metavar="ID,ID",
                   help="token ids removed before positions are assigned (default: the tokenizer's "
                        "special tokens, or none); pass '' to keep everything")
    c.add_argument("--mode", choices=MODES, default="truncate",
                   help="truncate: first n tokens of each document (default); chunk: consecutive "
                        "windows of n; pack: documents concatenated (per file) and cut into windows of n")
    c.add_argument("--separator", type=int, metavar="ID", help="pack mode: token id inserted between documents")
    c.add_argument("--memory-budget", type=float, default=4.0, metavar="GiB",
                   help="dense n x V counts are used while 8*n*V bytes fit this budget, sparse otherwise (default 4)")


def count_inputs(args: argparse.Namespace):
    """Build (CorpusSource, CountSpec, metadata) from parsed input flags."""
    from posstats.corpus import CorpusSource
    from posstats.tokenizer import load_tokenizer, special_token_ids, tokenizer_hash, vocab_size

    if args.column and args.text_column:
        raise PosstatsError("give either --column (token ids) or --text-column (text), not both")
    metadata: dict[str, str] = {}
    vocab, exclude = args.vocab_size, args.exclude_tokens
    if args.tokenizer:
        tok = load_tokenizer(args.tokenizer)
        metadata["tokenizer"] = Path(args.tokenizer).name
        metadata["tokenizer_hash"] = tokenizer_hash(args.tokenizer)
        if vocab is None:
            vocab = vocab_size(tok)
        if exclude is None:
            exclude = tuple(special_token_ids(tok))
    if vocab is None:
        raise PosstatsError("--vocab-size is required when no --tokenizer is given")
    if args.column is None and not args.tokenizer:
        raise PosstatsError("give --column NAME (token ids) or --tokenizer tokenizer.json (to tokenise text)")
    source = CorpusSource(
        inputs=tuple(args.input),
        format=args.format,
        column=args.column,
        text_column=args.text_column,
        tokenizer=args.tokenizer if args.column is None else None,
        hf_streaming=args.hf_streaming,
    )
    spec = CountSpec(args.positions, vocab, args.mode, tuple(exclude or ()), args.separator)
    return source, spec, metadata


def add_analysis_args(parser: argparse.ArgumentParser) -> None:
    """The geometry / encoding flags of ``analyze`` / ``run``."""
    from posstats.analysis import DEFAULT_DIMS
    from posstats.encodings import DEFAULT_ENCODINGS

    g = parser.add_argument_group("analysis")
    g.add_argument("--dims", type=int_list, default=DEFAULT_DIMS, metavar="D,D",
                   help=f"encoding widths to evaluate (default {','.join(map(str, DEFAULT_DIMS))}); "
                        "widths above the MDS rank get zero columns")
    g.add_argument("--encodings", type=str_list, default=DEFAULT_ENCODINGS, metavar="NAME,NAME",
                   help=f"encodings to score (default {','.join(DEFAULT_ENCODINGS)}); also mds-lowrank:R, "
                        "rope:layout=half, alibi:HEADS, random:SIGMA, learned:FILE[:key=NAME]")
    g.add_argument("--min-occupancy", type=int, default=1, metavar="K",
                   help="leave out positions with fewer than K counted tokens (default 1)")
    g.add_argument("--rank-rtol", type=float, default=1e-10, metavar="TOL",
                   help="relative tolerance of the reported numerical rank (default 1e-10)")
    g.add_argument("--mds-method", choices=("auto", "dense", "iterative", "lanczos"), default="auto",
                   help="dense eigh, the iterative top-k solver (ARPACK), or block Lanczos for long contexts "
                        "(auto: dense up to 2048 positions)")
    g.add_argument("--seed", type=int, default=0, help="seed of every random choice (default 0)")
    lc = parser.add_argument_group("long contexts and honest estimates (docs/long-context.md)")
    lc.add_argument("--exact-limit", type=int, default=16_384, metavar="N",
                    help="above N geometry rows no n x n matrix is formed: block-Lanczos MDS, stress from "
                         "sampled pairs with 95%% intervals (default 16384)")
    lc.add_argument("--stress-halfwidth", type=float, default=1e-3, metavar="H",
                    help="sampled stress: draw pairs until every scaled-stress 95%% interval is within +-H (default 1e-3)")
    lc.add_argument("--buckets", default="none", metavar="none|fixed:W|log:P",
                    help="pool positions into buckets: fixed:W (W positions each) or log:P (P per doubling)")
    lc.add_argument("--noise-floor", action="store_true",
                    help="split the corpus into document-parity parts (or the run store's shards) and report the "
                         "per-position split-half d_H and sampling bias")
    lc.add_argument("--noise-parts", type=int, choices=(2, 4), default=4,
                    help="parts for the noise floor: 4 also fits how the bias decays with occupancy (default 4)")
    lc.add_argument("--distances", choices=("plugin", "corrected"), default="plugin",
                    help="distance matrix for MDS, stress and diagnostics: plug-in, or bias-corrected "
                         "max(d^2 - b_i - b_j, 0) (needs --noise-floor)")
    lc.add_argument("--null", choices=("auto", "shuffle", "mp", "none"), default="auto",
                    help="noise-aware rank: eigenvalues above a shuffled-position null corpus, or an analytic "
                         "Marchenko-Pastur edge (needs --noise-floor); auto: shuffle up to 4096 rows, else mp")
    lc.add_argument("--null-replicates", type=int, default=3, metavar="R", help="shuffled null corpora (default 3)")
    lc.add_argument("--bootstrap", type=int, default=0, metavar="B",
                    help="shard-bootstrap replicates for intervals on eigenvalues, rank and stress (default 0: off)")


def analysis_config(args: argparse.Namespace):
    """An :class:`AnalysisConfig` from parsed analysis flags."""
    from posstats.analysis import AnalysisConfig

    return AnalysisConfig(
        dims=tuple(args.dims),
        encodings=tuple(args.encodings),
        min_occupancy=args.min_occupancy,
        rank_rtol=args.rank_rtol,
        mds_method=args.mds_method,
        seed=args.seed,
        exact_limit=args.exact_limit,
        stress_halfwidth=args.stress_halfwidth,
        buckets=args.buckets,
        distances=args.distances,
        noise_floor=args.noise_floor,
        noise_parts=args.noise_parts,
        null=args.null,
        null_replicates=args.null_replicates,
        bootstrap=args.bootstrap,
        tokenizer=getattr(args, "tokenizer", None) if (args.noise_floor or args.bootstrap) else None,
    )
