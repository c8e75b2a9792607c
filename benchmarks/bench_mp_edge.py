"""How far the analytic edge of the rank test stands above the noise bulk, and why.

    python benchmarks/bench_mp_edge.py [--positions 2048,8192] [--tokens 200,2000,20000]
        [--seeds 3] [--kinds stationary,markov]

Above 4,096 rows the rank test counts the eigenvalues of the centred Gram matrix above the
analytic edge ``(sqrt(max_i b_i) + sqrt(max_v c_v))^2`` (:func:`posstats.estimates.null_rank.mp_edge_value`),
an upper estimate. This benchmark measures it against the bulk it bounds, on corpora whose
every position has one known distribution (:func:`posstats.testing.known_corpus`,
``stationary``, V = 5,000, Zipf 1.1, N tokens a position, the ``counts`` sampler), and on
the dependent ``markov`` streams of the same marginal (pack mode, each token repeating the
previous one with probability ``--stay``, 0.5 by default, N windows:
:func:`posstats.testing.markov_packed_counts`).

For each corpus, on the plug-in scale the edge is stated on:

- ``top``: the largest eigenvalues of ``J S S^T J`` (rows of ``S`` the square roots of each
  position's frequencies; the noise bulk's top, as the rank test reads it);
- ``edge``: the analytic edge the analysis uses, from the token split's noise floor;
- ``gmp``: the edge of the generalized Marchenko-Pastur law (Silverstein and Bai 1995) for
  ``m`` independent rows whose entry ``v`` has the *exact* variance ``t_v`` of
  ``sqrt(X / N)``, ``X ~ Binomial(N, p_v)`` (binomial sums from the known ``p``): the
  minimum over ``s`` in ``(-1 / max t, 0)`` of ``m (-1 / s + sum_v t_v / (m (1 + t_v s)))``.
  It is what an edge sharp for independent tokens would be;
- ``bound_exact``: the analytic edge's form with those exact variances,
  ``(sqrt(sum_v t_v) + sqrt(m max_v t_v))^2``, which separates the bound's own slack from
  the column noise's;
- ``halves``: the top of the noise bulk measured on two independent halves of the corpus
  (:func:`posstats.estimates.halves_edge.halves_edge`, before its 5 % margin): each corpus
  is drawn as two halves of N / 2 tokens (or windows) with their own seeds, and ``top`` is
  read on their sum. ``top_over_halves`` (mean, sd and max over seeds) is what the rank
  test's margin must cover.

Prints one JSON object: per cell the means over seeds and the ratios ``edge / top``,
``gmp / top`` and ``top / gmp`` (above 1 where dependence lifts the bulk past the edge that
independent tokens would have).

With ``--corpus FILE --tokenizer FILE`` it measures real text instead: the file (plain text,
gzip allowed) is tokenized and packed into windows of each n, so every position has the
text's distribution (documents start at offsets unrelated to n), and the same tokens
shuffled over the stream give the independent baseline. ``gmp`` then uses the exact
variances under the pooled distribution, and ``halves`` the even windows against the odd
ones. ``real.top_over_shuffled`` is the lift that the text's dependence gives the noise
bulk.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import scipy.sparse as sp
from scipy.optimize import minimize_scalar
from scipy.sparse.linalg import LinearOperator, eigsh


def gmp_edge(variances: np.ndarray, m: int, /) -> float:
    """Right edge of the nonzero spectrum of ``X^T X`` (equally of ``X X^T``), ``X`` (m, V)
    with independent rows of covariance ``diag(variances)``: ``m`` times the edge of the
    sample covariance's limit law, ``min_s (-1/s + sum_v t_v / (m (1 + t_v s)))`` over
    ``s`` in ``(-1 / max t, 0)`` (Silverstein and Bai 1995; for equal ``t`` it is
    ``t (sqrt(m) + sqrt(V))^2``)."""
    t = np.asarray(variances, dtype=np.float64)
    t = t[t > 0]
    if not t.size or m < 1:
        return math.nan
    top = float(t.max())

    def x(s: float) -> float:
        return -1.0 / s + float(np.sum(t / (1.0 + t * s))) / m

    found = minimize_scalar(x, bounds=(-(1.0 - 1e-9) / top, -1e-12 / top), method="bounded",
                            options={"xatol": 1e-14 / top})
    return m * float(found.fun)


def sqrt_variances(p: np.ndarray, n: int, /) -> np.ndarray:
    """(V,) the exact ``Var sqrt(X / n)`` for ``X ~ Binomial(n, p_v)`` (the binomial sums of
    ``bench_sqrt_estimators.moments``)."""
    from bench_sqrt_estimators import moments, plugin

    return moments(plugin(n), np.asarray(p, dtype=np.float64), n)[1]


def top_eigenvalues(counts: sp.csr_array, k: int = 3, /) -> np.ndarray:
    """(k,) the largest eigenvalues of ``J S S^T J`` (``S`` the rows' square-root
    frequencies, ``J`` the centring), by ARPACK on products with ``S`` (never m x m)."""
    from posstats.geometry.hellinger import sqrt_distributions

    s = sp.csr_array(sqrt_distributions(counts))
    m = s.shape[0]

    def product(x: np.ndarray) -> np.ndarray:
        x = x.ravel() - x.mean()
        y = s @ (s.T @ x)
        return y - y.mean()

    op = LinearOperator((m, m), matvec=product, dtype=np.float64)
    return np.sort(eigsh(op, k=k, which="LA", return_eigenvectors=False))[::-1]


def one_corpus(kind: str, n: int, tokens: int, seed: int, stay: float = 0.5) -> dict:
    """``top``, ``edge`` for one corpus of ``kind``."""
    from posstats.estimates.null_rank import mp_edge_value
    from posstats.estimates.thinning import split_noise_floor
    from posstats.testing import known_corpus, markov_packed_counts

    from posstats.estimates.halves_edge import halves_edge

    def half(which: int) -> sp.csr_array:
        s = 2 * seed + which  # the two halves of corpus `seed`, independent of each other
        if kind == "markov":
            return sp.csr_array(markov_packed_counts(n, windows=tokens // 2, stay=stay, seed=s, sampler="counts").matrix)
        if kind == "stationary":
            return sp.csr_array(known_corpus("stationary", n, tokens=tokens // 2, seed=s, sampler="counts").counts.matrix)
        msg = f"unknown kind {kind!r} (stationary or markov)"
        raise SystemExit(msg)

    a, b = half(0), half(1)
    rows = sp.csr_array(a + b)
    floor = split_noise_floor(rows, parts=4, seed=seed)
    top = top_eigenvalues(rows)
    return {"top": [float(x) for x in top], "edge": mp_edge_value(floor.bias, floor.column_noise, n),
            "halves": halves_edge(a, b, rows).noise_top}


def cell(kind: str, n: int, tokens: int, seeds: int, stay: float = 0.5) -> dict:
    """One (kind, n, N) over ``seeds`` corpora."""
    from posstats.testing import known_corpus

    base = np.asarray(known_corpus("stationary", 2, tokens=1, seed=0, sampler="counts").base, dtype=np.float64)
    t = sqrt_variances(base, tokens)
    gmp = gmp_edge(t, n)
    bound = (math.sqrt(float(t.sum())) + math.sqrt(n * float(t.max()))) ** 2
    runs = [one_corpus(kind, n, tokens, seed, stay) for seed in range(seeds)]
    top = float(np.mean([r["top"][0] for r in runs]))
    edge = float(np.mean([r["edge"] for r in runs]))
    ratio = np.array([r["top"][0] / r["halves"] for r in runs])
    return {"kind": kind, "positions": n, "tokens": tokens, "seeds": seeds, **({"stay": stay} if kind == "markov" else {}),
            "top": round(top, 5), "top_max": round(max(r["top"][0] for r in runs), 5),
            "edge": round(edge, 5), "gmp": round(gmp, 5), "bound_exact": round(bound, 5),
            "edge_over_top": round(edge / top, 3), "gmp_over_top": round(gmp / top, 4),
            "top_over_gmp": round(top / gmp, 4), "bound_exact_over_gmp": round(bound / gmp, 3),
            "halves": round(float(np.mean([r["halves"] for r in runs])), 5),
            "top_over_halves": {"mean": round(float(ratio.mean()), 4),
                                "sd": round(float(ratio.std(ddof=1)), 4) if ratio.size > 1 else None,
                                "max": round(float(ratio.max()), 4)}}


def text_cell(tokens: np.ndarray, vocab: int, n: int, /, *, seed: int = 0) -> dict:
    """Real text packed into windows of ``n`` against the same tokens shuffled: ``top``,
    ``edge`` and the pooled distribution's ``gmp`` for each (module docstring)."""
    from posstats.estimates.halves_edge import halves_edge
    from posstats.estimates.null_rank import mp_edge_value
    from posstats.estimates.thinning import split_noise_floor

    windows = tokens.size // n
    if windows < 2:
        msg = f"{tokens.size:,} tokens make fewer than 2 windows of {n}"
        raise SystemExit(msg)
    out: dict = {"positions": n, "windows": windows}
    for label, stream in (("real", tokens), ("shuffled", np.random.default_rng(seed).permutation(tokens[: windows * n]))):
        packed = stream[: windows * n].reshape(windows, n)
        rows = sp.csr_array((np.ones(windows * n), (np.repeat(np.arange(n), windows), packed.T.ravel())),
                            shape=(n, vocab))
        rows.sum_duplicates()
        floor = split_noise_floor(rows, parts=4, seed=seed)
        half = [sp.csr_array((np.ones((windows - w + 1) // 2 * n), (np.tile(np.arange(n), (windows - w + 1) // 2),
                                                                   packed[w::2].ravel())), shape=(n, vocab))
                for w in (0, 1)]  # the even and the odd windows
        pooled = np.asarray(rows.sum(axis=0)).ravel() / windows / n
        gmp = gmp_edge(sqrt_variances(pooled[pooled > 0], windows), n)
        top = float(top_eigenvalues(rows, 1)[0])
        halves = halves_edge(half[0], half[1], rows).noise_top
        out[label] = {"top": round(top, 5), "edge": round(mp_edge_value(floor.bias, floor.column_noise, n), 5),
                      "gmp": round(gmp, 5), "top_over_gmp": round(top / gmp, 4), "halves": round(halves, 5),
                      "top_over_halves": round(top / halves, 4)}
    out["real"]["top_over_shuffled"] = round(out["real"]["top"] / out["shuffled"]["top"], 4)
    out["real"]["edge_over_top"] = round(out["real"]["edge"] / out["real"]["top"], 3)
    return out


def read_tokens(corpus: str, tokenizer: str, /) -> tuple[np.ndarray, int]:
    """(token ids of the whole file, line by line without special tokens, one stream; the
    tokenizer's vocabulary size)."""
    import gzip

    from tokenizers import Tokenizer

    opener = gzip.open if corpus.endswith(".gz") else open
    with opener(corpus, "rt", encoding="utf-8") as f:
        text = f.read()
    tok = Tokenizer.from_file(tokenizer)
    tok.no_truncation()
    tok.no_padding()
    lines = [line for line in text.splitlines() if line.strip()]
    ids = [e.ids for e in tok.encode_batch(lines, add_special_tokens=False)]
    return np.fromiter((i for row in ids for i in row), dtype=np.int64), int(tok.get_vocab_size())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--positions", default="2048,8192", help="comma-separated n")
    ap.add_argument("--tokens", default="200,2000,20000", help="comma-separated N (tokens, or windows for markov)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--kinds", default="stationary,markov")
    ap.add_argument("--stay", type=float, default=0.5, help="markov: the probability a token repeats the previous one")
    ap.add_argument("--corpus", help="real text (plain or .gz): measure it packed into windows of each n instead")
    ap.add_argument("--tokenizer", help="a tokenizer.json for --corpus")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.corpus:
        if not args.tokenizer:
            raise SystemExit("--corpus needs --tokenizer")
        tokens, vocab = read_tokens(args.corpus, args.tokenizer)
        rows = [text_cell(tokens, vocab, int(n)) for n in args.positions.split(",")]
        print(json.dumps({"benchmark": "mp_edge", "corpus": args.corpus, "tokens": int(tokens.size),
                          "baseline": "the same tokens shuffled", "rows": rows,
                          "seconds": round(time.perf_counter() - t0, 1)}, indent=1))
        return
    rows = [cell(kind, int(n), int(tokens), args.seeds, args.stay) for kind in args.kinds.split(",")
            for n in args.positions.split(",") for tokens in args.tokens.split(",")]
    print(json.dumps({"benchmark": "mp_edge", "baseline": "gmp (independent tokens, exact variances)",
                      "vocab": 5000, "rows": rows, "seconds": round(time.perf_counter() - t0, 1)}, indent=1))


if __name__ == "__main__":
    main()
