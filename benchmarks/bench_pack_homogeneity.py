"""The homogeneity test on real packed text: a null corpus with the dependence of real text.

    python benchmarks/bench_pack_homogeneity.py [--text PATH] [--positions 16,64,256]
        [--windows 1000] [--replicates 39] [--tokenizer data/tokenizers/gpt2.tokenizer.json]
    python benchmarks/bench_pack_homogeneity.py --mode truncate [--document-lengths 8-32] [--positions 16,64]
    python benchmarks/bench_pack_homogeneity.py --markov-stay 0.8 --markov-vocab 256 --streams 100 \
        --positions 4096 --windows 200
    python benchmarks/bench_pack_homogeneity.py --reader posstats --windows 0 --positions 101:700:9 --no-permutation

In pack mode a corpus is one stream of text cut into windows of n tokens. Documents start
at offsets unrelated to n, so every position has the same token distribution: the
verdict's null hypothesis holds, while tokens at nearby positions of a window are
dependent, as in real text. The permutation test of homogeneity
(:mod:`posstats.estimates.permutation`, level 1/(R + 1) = 2.5 % at R = 39) assumes
independent tokens; this measures what dependence does to it, and how the rotation test
(:mod:`posstats.estimates.rotation`: the same statistic against corpora whose groups of
windows are rotated, ``--window-groups`` groups as ``posstats count`` counts them) holds
its level on the same chunks.

The text (default ``../shared/corpora/shakespeare.md.gz`` where it exists, else the bundled
``data/shakespeare-sample.txt``; ``.gz`` read as gzip) is tokenized (GPT-2 BPE) into one
stream, cut into disjoint chunks of ``--windows`` windows of n tokens, and each chunk's
(n, V) counts are tested. The baseline, measured in the same run on the same chunks: the
chunk's tokens shuffled across its positions (independent tokens with the same counts,
:func:`posstats.estimates.permutation.shuffled_rows`), which the test's level covers by
construction.

With ``--mode truncate`` the stream is cut into consecutive documents of random lengths
(``--document-lengths``, default n/2 to 2n), counted in truncate mode: each document from
its first token, the first n kept, a chunk being ``--windows`` documents. A document starts
at an offset unrelated to n, so H0 holds too, with the dependence of real text inside each
truncated document (the case of a truncate-mode corpus of running text); the rotation null
rotates the full ones, the shorter ones stay in place.

``--reader posstats`` reads the text as ``posstats count`` does (its documents: paragraphs
in ``.md``, lines elsewhere, each line stripped, :func:`posstats.corpus.readers.read_token_batches`)
and packs the documents' ids into the stream, so a cell's counts are those of ``posstats
count --mode pack``; the default (``stream``) tokenises the raw text. ``--windows 0`` makes
one chunk of every full window of the stream at each n (the whole corpus, as a user would
count it), and ``--positions A:B:S`` takes the context lengths ``range(A, B, S)``: one
corpus tested at many n, each a different folding of the same text, is a null replicate
of its own (a multiple of another n shares its alignment: 128, 256 and 512 fold the
stream alike). ``--no-permutation`` runs the rotation test alone (the permutation test
and its shuffled baseline shuffle every token 39 times a cell). The JSON's ``over_cells``
sums the rotation test's rejections over the cells.

With ``--markov-stay`` the null corpora are ``--streams`` Markov streams instead
(:func:`posstats.testing.markov_stream`: one stream of ``--windows`` windows of n tokens,
each token repeating the previous one with probability ``--markov-stay``, else a fresh
Zipf(1.1) draw over ``--markov-vocab`` ids; stream k has seed 900,000 + k). Until
2026-11-30 these were independent windows (``markov_packed_counts(sampler="counts")``),
which keep no windows to rotate; a stream's windows continue each other, the harder case
for the rotation null, which does not keep that link.

Prints one JSON object: per n, how many chunks each test rejects at its level (with a
Clopper-Pearson 95 % interval): ``real`` (permutation null), ``real_rotation`` (rotation
null) and ``baseline_shuffled`` (permutation null on the shuffled chunks), each with the
mean and sd of ``z = (S - mean of the R null S) / their sd``, which would be about 0 and 1
if the null described the data. Chunks of one text are not independent replicates
of a corpus (they share its author and genre), but each is a null corpus of its own.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "corpora" / "shakespeare.md.gz"
BUNDLED = REPO / "data" / "shakespeare-sample.txt"

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from posstats.testing import proportion  # noqa: E402


def read_text(path: Path) -> str:
    """The text of ``path`` (gzip when it ends in ``.gz``)."""
    return gzip.open(path, "rt", encoding="utf-8").read() if path.suffix == ".gz" else path.read_text(encoding="utf-8")


def document_stream(path: Path, tokenizer: Path) -> tuple[np.ndarray, int]:
    """``(ids, vocab)``: the documents of ``path`` as ``posstats count`` reads them
    (:func:`posstats.corpus.readers.read_token_batches`), their ids in order as one stream."""
    from posstats.corpus.readers import read_token_batches
    from posstats.corpus.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer)
    values = [np.asarray(b.values, dtype=np.int64) for b in read_token_batches(path, tokenizer=tok)]
    return np.concatenate(values) if values else np.zeros(0, dtype=np.int64), tok.get_vocab_size()


def context_lengths(text: str, parser: argparse.ArgumentParser) -> list[int]:
    """``--positions``: comma-separated n, or ``A:B:S`` for ``range(A, B, S)``; a bad value
    is a one-line parser error."""
    try:
        if ":" in text:
            a, b, step = (int(x) for x in text.split(":"))
            values = list(range(a, b, step))
        else:
            values = [int(x) for x in text.split(",")]
    except ValueError:
        parser.error(f"--positions takes N,N,... or A:B:S, got {text!r}")
    if not values or min(values) < 2:
        parser.error(f"--positions needs context lengths of at least 2, got {text!r}")
    return values


def token_stream(text: str, tokenizer: Path) -> tuple[np.ndarray, int]:
    """``(ids, vocab)``: the text as one stream of token ids (1 MB pieces, split at newlines)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    tok.no_padding()
    tok.no_truncation()
    pieces, start = [], 0
    while start < len(text):
        stop = text.find("\n", start + (1 << 20))
        stop = len(text) if stop < 0 else stop + 1
        pieces.append(np.asarray(tok.encode(text[start:stop]).ids, dtype=np.int64))
        start = stop
    return np.concatenate(pieces), tok.get_vocab_size()


def packed_counts(ids: np.ndarray, n: int, vocab: int, groups: int = 0) -> tuple[sp.csr_array, object]:
    """``(counts, window groups)`` of the stream ``ids`` (a multiple of n long) in pack
    mode, by posstats' own counter: row i of the (n, vocab) counts holds the tokens at
    place i of each consecutive window of n; the window groups (``groups`` > 0, else None)
    are what ``posstats count --window-groups`` writes."""
    from posstats.counting.counts import CountAccumulator, CountSpec

    block = max(1, ids.size // n // groups) if groups else 1  # consecutive windows per block, as posstats count
    acc = CountAccumulator(CountSpec(positions=n, vocab_size=vocab, mode="pack"), dense=False, window_groups=groups,
                           window_block=block)
    acc.add_sequences([ids])
    window_groups = acc.window_groups()
    return sp.csr_array(acc.result().matrix), window_groups


def truncated_counts(ids: np.ndarray, lengths: np.ndarray, n: int, vocab: int, groups: int = 0) -> tuple[sp.csr_array, object]:
    """``(counts, window groups)`` of the stream ``ids`` cut into consecutive documents of
    ``lengths`` tokens (summing to ``ids.size``), counted in truncate mode by posstats' own
    counter (each document's first n tokens; a shorter one in the groups' tail) with the
    window groups ``posstats count`` writes (one window a block: no two are consecutive text)."""
    from posstats.corpus.count_step import window_block
    from posstats.counting.counts import CountAccumulator, CountSpec

    acc = CountAccumulator(CountSpec(positions=n, vocab_size=vocab, mode="truncate"), dense=False, window_groups=groups,
                           window_block=window_block(ids.size, n, groups, mode="truncate"))
    acc.add_sequences(np.split(ids, np.cumsum(lengths)[:-1]))
    window_groups = acc.window_groups()
    return sp.csr_array(acc.result().matrix), window_groups


def document_lengths(total: int, lo: int, hi: int, rng: np.random.Generator) -> np.ndarray:
    """Lengths uniform on ``[lo, hi]`` that cut ``total`` tokens into documents (the last
    one takes the rest, at most ``hi``)."""
    lengths = rng.integers(lo, hi + 1, total // lo + 1)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), total)) + 1]
    lengths[-1] -= int(lengths.sum()) - total
    return lengths[lengths > 0]


def markov_corpus(n: int, windows: int, stay: float, vocab: int, k: int, groups: int = 0) -> tuple[sp.csr_array, object]:
    """Null corpus k of the ``--markov-stay`` mode and its window groups (``groups`` > 0):
    one Markov stream cut into windows (:func:`posstats.testing.markov_stream`, seed
    900,000 + k), whose windows continue each other."""
    from posstats.testing import markov_stream

    return packed_counts(markov_stream(n, windows=windows, stay=stay, vocab=vocab, seed=900_000 + k), n, vocab, groups)


def rotation_test(counts: sp.csr_array, groups: object, replicates: int, seed: int) -> tuple[float, float]:
    """``(p, z)`` of the homogeneity test with the rotation null
    (:func:`posstats.estimates.rotation.rotation_null`, replicate seeds ``[seed, r]``)."""
    from posstats.estimates.permutation import homogeneity_statistic, monte_carlo_p_value
    from posstats.estimates.rotation import rotation_null

    s = homogeneity_statistic(counts)
    null = rotation_null(groups, replicates=replicates, seed=seed)
    return monte_carlo_p_value(s, null), float((s - null.mean()) / null.std(ddof=1))


def chunk_test(counts: sp.csr_array, replicates: int, rng: np.random.Generator) -> tuple[float, float]:
    """``(p, z)`` of the homogeneity test on ``counts``: the Monte Carlo p-value against
    ``replicates`` shuffled corpora and the statistic's z against their mean and sd."""
    from posstats.estimates.permutation import homogeneity_statistic, monte_carlo_p_value, shuffled_rows

    s = homogeneity_statistic(counts)
    null = np.array([homogeneity_statistic(shuffled_rows(counts, rng)) for _ in range(replicates)])
    return monte_carlo_p_value(s, null), float((s - null.mean()) / null.std(ddof=1))


def _summary(p: list[float], z: list[float], level: float) -> dict:
    z_arr = np.asarray(z)
    return {"rejected": proportion(int(np.sum(np.asarray(p) <= level)), len(p)),
            "z_mean": round(float(z_arr.mean()), 3), "z_sd": round(float(z_arr.std(ddof=1)), 3) if z_arr.size > 1 else None}


def _lengths(text: str | None, n: int, parser: argparse.ArgumentParser) -> tuple[int, int]:
    """``(lo, hi)`` of ``--document-lengths`` (default ``(n // 2, 2 n)``); a bad range is a
    one-line parser error."""
    if text is None:
        return max(1, n // 2), 2 * n
    try:
        lo, hi = (int(x) for x in text.split("-"))
    except ValueError:
        parser.error(f"--document-lengths takes LO-HI (two integers), got {text!r}")
    if not 1 <= lo <= hi:
        parser.error(f"--document-lengths needs 1 <= LO <= HI, got {text!r}")
    return lo, hi


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", type=Path, default=SHARED if SHARED.exists() else BUNDLED,
                   help="plain or .gz text (default ../shared/corpora/shakespeare.md.gz, else data/shakespeare-sample.txt)")
    p.add_argument("--tokenizer", type=Path, default=REPO / "data" / "tokenizers" / "gpt2.tokenizer.json")
    p.add_argument("--positions", default="16,64,256",
                   help="window lengths n, comma-separated, or A:B:S for range(A, B, S) (default 16,64,256)")
    p.add_argument("--windows", type=int, default=1000,
                   help="windows per chunk; 0: one chunk of every full window at each n (default 1000)")
    p.add_argument("--reader", choices=("stream", "posstats"), default="stream",
                   help="stream: the raw text tokenised as one stream; posstats: its documents as posstats count reads "
                        "them, packed in order (default stream)")
    p.add_argument("--no-permutation", action="store_true",
                   help="the rotation test alone (no permutation test, no shuffled baseline)")
    p.add_argument("--replicates", type=int, default=39, help="shuffled corpora per test (default 39: level 2.5 %%)")
    p.add_argument("--markov-stay", type=float, default=None,
                   help="null corpora from Markov streams with this repeat probability instead of the text")
    p.add_argument("--markov-vocab", type=int, default=5000, help="the Markov streams' vocabulary (default 5000)")
    p.add_argument("--streams", type=int, default=100, help="Markov streams per n (default 100)")
    p.add_argument("--mode", choices=("pack", "truncate"), default="pack",
                   help="pack: a chunk is --windows consecutive windows of n; truncate: --windows consecutive documents "
                        "of --document-lengths tokens, each counted from its first token (its first n kept)")
    p.add_argument("--document-lengths", default=None, metavar="LO-HI",
                   help="truncate mode: document lengths, uniform on [LO, HI] (default n/2 to 2n: about a third "
                        "shorter than n)")
    p.add_argument("--window-groups", type=int, default=64,
                   help="groups of windows of the rotation null (default 64, as posstats count); 0: no rotation test")
    args = p.parse_args(argv)
    if args.mode == "truncate" and args.markov_stay is not None:
        p.error("--mode truncate cuts the text into documents; it takes no --markov-stay")
    if args.windows < 0 or (args.windows == 0 and (args.mode == "truncate" or args.markov_stay is not None)):
        p.error(f"--windows must be >= 1 (0, the whole stream, in pack mode on text only), got {args.windows}")
    if args.no_permutation and not args.window_groups:
        p.error("--no-permutation runs the rotation test alone: it needs --window-groups > 0")
    positions = context_lengths(args.positions, p)
    _lengths(args.document_lengths, 1, p)  # a bad range is refused before the text is read
    t = time.perf_counter()
    from posstats.estimates.permutation import shuffled_rows

    level = 1.0 / (args.replicates + 1)
    out = {"benchmark": "pack_homogeneity", "windows_per_chunk": args.windows, "replicates": args.replicates,
           "level": level, "cells": []}
    if args.markov_stay is None:
        if args.reader == "posstats":
            ids, vocab = document_stream(args.text, args.tokenizer)
        else:
            ids, vocab = token_stream(read_text(args.text), args.tokenizer)
        out |= {"text": args.text.name, "reader": args.reader, "tokens": int(ids.size), "vocab": vocab}
    else:
        out |= {"markov": {"stay": args.markov_stay, "vocab": args.markov_vocab, "streams": args.streams}}
    out["mode"] = args.mode
    all_rot_p: list[float] = []
    all_rot_z: list[float] = []
    for n in positions:
        size = n * (args.windows or ids.size // n)
        chunks = args.streams if args.markov_stay is not None else (ids.size // size if size else 0)
        real_p, real_z, base_p, base_z, rot_p, rot_z = [], [], [], [], [], []
        if args.mode == "truncate":
            lo, hi = _lengths(args.document_lengths, n, p)
            lengths = document_lengths(int(ids.size), lo, hi, np.random.default_rng(n))
            chunks = lengths.size // args.windows
            ends = np.r_[0, np.cumsum(lengths)]
        for k in range(chunks):
            rng = np.random.default_rng(k)
            if args.mode == "truncate":
                docs = lengths[k * args.windows:(k + 1) * args.windows]
                counts, groups = truncated_counts(ids[ends[k * args.windows]:ends[(k + 1) * args.windows]], docs, n,
                                                  vocab, args.window_groups)
            elif args.markov_stay is not None:
                counts, groups = markov_corpus(n, args.windows, args.markov_stay, args.markov_vocab, k,
                                               args.window_groups)
            else:
                counts, groups = packed_counts(ids[k * size:(k + 1) * size], n, vocab, args.window_groups)
            if not args.no_permutation:
                pk, zk = chunk_test(counts, args.replicates, rng)
                real_p.append(pk)
                real_z.append(zk)
            if groups is not None:
                pk, zk = rotation_test(counts, groups, args.replicates, seed=k)
                rot_p.append(pk)
                rot_z.append(zk)
            if not args.no_permutation:
                pk, zk = chunk_test(shuffled_rows(counts, rng), args.replicates, rng)
                base_p.append(pk)
                base_z.append(zk)
        cell = {"positions": n, "chunks": chunks}
        if args.mode == "truncate":
            cell["document_lengths"] = [lo, hi]
        if real_p:
            cell |= {"real": _summary(real_p, real_z, level), "baseline_shuffled": _summary(base_p, base_z, level)}
        if rot_p:
            cell["real_rotation"] = _summary(rot_p, rot_z, level)
            all_rot_p += rot_p
            all_rot_z += rot_z
        out["cells"].append(cell)
        print(f"n={n}: {json.dumps(cell)}", file=sys.stderr, flush=True)
    if all_rot_p:
        out["over_cells"] = {"real_rotation": _summary(all_rot_p, all_rot_z, level),
                             "rejected_at": [c["positions"] for c in out["cells"]
                                             if (c.get("real_rotation") or {}).get("rejected", {}).get("count")]}
    out["seconds"] = round(time.perf_counter() - t, 1)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
