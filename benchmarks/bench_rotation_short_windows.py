"""The rotation test of homogeneity when many windows are cut short (chunk mode).

    python benchmarks/bench_rotation_short_windows.py [--planted 0,0.05,0.2] [--corpora 40]
        [--lengths 16-16,17-40,8-24,4-18,2-17] [--positions 16] [--tokens 16000]

In chunk mode a document's last window is usually shorter than n (in truncate mode, a
document shorter than n is such a window). The rotation null
(:mod:`posstats.estimates.rotation`) turns the full windows (counted in 64 groups, as
``posstats count`` counts them) by offsets modulo n and, since 2026-12-01, each class of
short windows of L tokens by its own offset modulo L (before, they stayed in place, the
*tail*), so that every position keeps its occupancy. The shorter the documents, the more
of the corpus is in length classes: this measures what that does to the test's level and
power (``full_window_share``: the share of the tokens in full windows).

Each corpus: independent documents of lengths uniform on ``LO-HI`` tokens until
``--tokens`` tokens, each a stationary successor stream (:func:`posstats.testing.successor_stream`:
the next token is the previous + 1 mod 200 with probability 0.9, else uniform; strongly
dependent nearby tokens, the hard case for a null that ignores windows), cut into windows
of n = ``--positions`` (chunk mode). With ``--planted a`` > 0, positions 0-3 of every
window draw a share ``a`` of their tokens from 20 private ids (an effect the test should
find); ``a = 0`` is the null (every position has the uniform law). Corpus k of a row has
seed 5,000 + k, so every row of a ``--planted`` value sees the same draws.

The baseline, measured in the same run on the same corpora: the same statistic against
the permutation null (tokens shuffled across positions,
:func:`posstats.estimates.permutation.shuffled_rows`), which treats a window's tokens as
independent. Both at R = 39 (level 2.5 %).

Prints one JSON object: per length range and planted share, the share of tokens in full
windows (what the rotations move) and how many corpora each test rejects, with
Clopper-Pearson 95 % intervals.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from posstats.testing import proportion  # noqa: E402

from posstats.corpus.count_step import window_block  # noqa: E402
from posstats.counting.counts import CountAccumulator, CountSpec  # noqa: E402
from posstats.counting.window_groups import DEFAULT_WINDOW_GROUPS  # noqa: E402
from posstats.estimates.permutation import homogeneity_statistic, monte_carlo_p_value, shuffled_rows  # noqa: E402
from posstats.estimates.rotation import rotation_null  # noqa: E402
from posstats.testing import successor_stream  # noqa: E402

BASE_VOCAB, PRIVATE = 200, 20  # the streams' ids, and the planted block's after them
PLANTED_POSITIONS = 4
REPLICATES = 39


def documents(lengths: tuple[int, int], tokens: int, n: int, planted: float, rng: np.random.Generator) -> list[np.ndarray]:
    """Independent successor-stream documents of lengths uniform on ``lengths`` (inclusive)
    until ``tokens`` tokens; positions 0-3 of every window of n draw ``planted`` of their
    tokens from the private ids."""
    docs, total = [], 0
    while total < tokens:
        m = int(rng.integers(lengths[0], lengths[1] + 1))
        x = successor_stream(m, stay=0.9, vocab=BASE_VOCAB, rng=rng)
        hit = (np.arange(m) % n < PLANTED_POSITIONS) & (rng.random(m) < planted)
        x[hit] = BASE_VOCAB + rng.integers(0, PRIVATE, int(hit.sum()))
        docs.append(x)
        total += m
    return docs


def chunk_counts(docs: list[np.ndarray], n: int):
    """``(counts rows (n, V) CSR, window groups, share of tokens in full windows)``, counted
    as ``posstats count --mode chunk`` counts them in one process."""
    total = sum(len(d) for d in docs)
    k = DEFAULT_WINDOW_GROUPS
    acc = CountAccumulator(CountSpec(positions=n, vocab_size=BASE_VOCAB + PRIVATE, mode="chunk"), dense=False,
                           window_groups=k, window_block=window_block(total, n, k))
    acc.add_sequences(docs)
    groups = acc.window_groups()
    return sp.csr_array(acc.result().matrix), groups, groups.windows * n / total


def cell(lengths: tuple[int, int], planted: float, *, corpora: int, n: int, tokens: int) -> dict:
    """One row: ``corpora`` corpora of one length range and planted share."""
    level = 1.0 / (REPLICATES + 1)
    rotation = permutation = 0
    shares = []
    for k in range(corpora):
        rng = np.random.default_rng(5_000 + k)
        rows, groups, share = chunk_counts(documents(lengths, tokens, n, planted, rng), n)
        shares.append(share)
        s = homogeneity_statistic(rows)
        rotation += monte_carlo_p_value(s, rotation_null(groups, replicates=REPLICATES, seed=k)) <= level
        null = [homogeneity_statistic(shuffled_rows(rows, np.random.default_rng([k, r]))) for r in range(REPLICATES)]
        permutation += monte_carlo_p_value(s, null) <= level
    return {"lengths": f"{lengths[0]}-{lengths[1]}", "planted": planted, "full_window_share": round(float(np.mean(shares)), 3),
            "rotation": proportion(rotation, corpora), "permutation": proportion(permutation, corpora)}


def _lengths(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        lo, _, hi = item.partition("-")
        a, b = int(lo), int(hi or lo)
        if not 1 <= a <= b:
            raise SystemExit(f"--lengths: {item!r} is not LO-HI with 1 <= LO <= HI")
        out.append((a, b))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--planted", default="0,0.05,0.2", help="shares of positions 0-3 drawn from private ids (0: the null)")
    p.add_argument("--corpora", type=int, default=40, help="corpora per row (default 40)")
    p.add_argument("--lengths", default="16-16,17-40,8-24,4-18,2-17", help="document length ranges LO-HI, comma-separated")
    p.add_argument("--positions", type=int, default=16, help="window length n (default 16)")
    p.add_argument("--tokens", type=int, default=16_000, help="tokens per corpus (default 16,000)")
    args = p.parse_args(argv)
    t = time.perf_counter()
    rows = []
    for planted in (float(a) for a in args.planted.split(",")):
        for lengths in _lengths(args.lengths):
            row = cell(lengths, planted, corpora=args.corpora, n=args.positions, tokens=args.tokens)
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    print(json.dumps({"benchmark": "rotation_short_windows", "positions": args.positions, "tokens": args.tokens,
                      "corpora": args.corpora, "replicates": REPLICATES, "level": 1.0 / (REPLICATES + 1),
                      "rows": rows, "seconds": round(time.perf_counter() - t, 1)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
