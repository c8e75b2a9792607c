"""Why the rank test can miss what the homogeneity test finds in truncate mode.

    python benchmarks/bench_truncate_rank.py [--input data/fortunes-sample.jsonl] [--positions 512]
        [--min-occupancy 1,100,300] [--replicates 39]

A truncate-mode corpus of real text (default: the bundled fortunes, BERT WordPiece, 512
positions: nearly every document shorter than the context) is counted with its window
groups as ``posstats count`` counts them. For each ``--min-occupancy`` the positions with at
least that many tokens are kept and the corpus' top eigenvalue of the bias-corrected MDS
Gram matrix (:func:`posstats.estimates.permutation.null_geometry`) is compared with that of
three kinds of null corpora, ``--replicates`` each:

- ``length_classes``: the rotation null posstats uses (:mod:`posstats.estimates.rotation`:
  64 groups of full windows, one offset a length class of shorter ones);
- ``per_document`` (the baseline this measures the length classes against): every
  document's window turned on itself by its own uniform offset, the most a rotation can
  spread a document's opening;
- ``shuffled``: tokens shuffled across positions (the permutation null: no dependence).

Also printed: where the corpus' top component loads (the occupancy median under its
squared loadings, as the report's ``null.top_component_occupancy``) against the median
occupancy. Prints one JSON object: per minimum occupancy, the rows kept, the corpus' top
eigenvalue, and for each null its max, median and whether the corpus' top exceeds its max
(a component above noise at level 1/(R + 1)).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

REPO = Path(__file__).resolve().parent.parent


def documents(path: Path, tokenizer: Path, positions: int, column: str) -> tuple[list[np.ndarray], int]:
    """``(windows, vocab)``: each document's first ``positions`` token ids as ``posstats
    count --tokenizer`` reads them (:func:`posstats.corpus.readers.read_token_batches`, the
    tokenizer's special tokens left out), and the vocabulary size."""
    from posstats.corpus.readers import read_token_batches
    from posstats.corpus.tokenizer import load_tokenizer, special_token_ids, vocab_size

    tok = load_tokenizer(tokenizer)
    special = np.asarray(special_token_ids(tok), dtype=np.int64)
    windows = []
    for batch in read_token_batches([path], text_column=column, tokenizer=tok):
        for k in range(batch.rows):
            ids = np.asarray(batch.values[batch.offsets[k]:batch.offsets[k + 1]], dtype=np.int64)
            windows.append(ids[~np.isin(ids, special)][:positions])
    return windows, vocab_size(tok)


def truncate_counts(windows: list[np.ndarray], positions: int, vocab: int) -> tuple[sp.csr_array, object]:
    """``(counts, window groups)`` of the windows in truncate mode, by posstats' own counter."""
    from posstats.counting.counts import CountAccumulator, CountSpec

    acc = CountAccumulator(CountSpec(positions=positions, vocab_size=vocab, mode="truncate"), dense=False,
                           window_groups=64)
    acc.add_sequences(windows)
    groups = acc.window_groups()
    return sp.csr_array(acc.result().matrix), groups


def per_document(windows: list[np.ndarray], positions: int, vocab: int, rng: np.random.Generator) -> sp.csr_array:
    """The counts of the windows, each turned on itself by its own offset in ``[0, length)``."""
    turned = [np.roll(w, int(rng.integers(0, w.size))) for w in windows if w.size]
    return truncate_counts(turned, positions, vocab)[0]


def loaded_occupancy(rows: sp.csr_array) -> float:
    """The occupancy median under the squared loadings of the top MDS component."""
    from posstats.analysis.null import _loaded_occupancy
    from posstats.estimates.sampling_variance import position_sampling_variance
    from posstats.geometry.hellinger import hellinger_sq
    from posstats.geometry.mds import gram_in_place

    b = gram_in_place(hellinger_sq(rows), position_sampling_variance(rows))
    _, vectors = np.linalg.eigh(b)
    return _loaded_occupancy(vectors[:, -1], np.asarray(rows.sum(axis=1)).ravel())


def summary(values: list[float], top: float) -> dict:
    """Max and median of a null's top eigenvalues, and whether the corpus' exceeds them all."""
    return {"max": round(max(values), 4), "median": round(float(np.median(values)), 4), "corpus_above": top > max(values)}


def main() -> None:
    from posstats.estimates.permutation import null_geometry, shuffled_rows

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", default=str(REPO / "data" / "fortunes-sample.jsonl"))
    ap.add_argument("--text-column", default="text")
    ap.add_argument("--tokenizer", default=str(REPO / "data" / "tokenizers" / "bert-base-uncased.tokenizer.json"))
    ap.add_argument("--positions", type=int, default=512)
    ap.add_argument("--min-occupancy", default="1,100,300", help="comma-separated minimum occupancies")
    ap.add_argument("--replicates", type=int, default=39)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t = time.perf_counter()
    n = args.positions
    windows, vocab = documents(Path(args.input), Path(args.tokenizer), n, args.text_column)
    counts, groups = truncate_counts(windows, n, vocab)
    occ = np.asarray(counts.sum(axis=1)).ravel()
    rng = np.random.default_rng(args.seed)
    nulls = {"length_classes": [groups.rotated(groups.draw_shifts(np.random.default_rng([args.seed, r])))
                                for r in range(args.replicates)],
             "per_document": [per_document(windows, n, vocab, rng) for _ in range(args.replicates)]}
    rows_out = []
    for minimum in (int(x) for x in args.min_occupancy.split(",")):
        keep = np.flatnonzero(occ >= minimum)
        if keep.size < 2:
            rows_out.append({"min_occupancy": minimum, "rows": int(keep.size), "skipped": "fewer than 2 rows"})
            continue
        data = counts[keep]
        top = null_geometry(data, corrected=True)[0]
        row = {"min_occupancy": minimum, "rows": int(keep.size), "corpus_top": round(top, 4),
               "top_component_occupancy": loaded_occupancy(data), "median_occupancy": float(np.median(occ[keep]))}
        for name, corpora in nulls.items():
            row[name] = summary([null_geometry(c[keep], corrected=True)[0] for c in corpora], top)
        row["shuffled"] = summary([null_geometry(shuffled_rows(data, rng), corrected=True)[0]
                                   for _ in range(args.replicates)], top)
        rows_out.append(row)
    print(json.dumps({"benchmark": "truncate_rank", "input": args.input, "positions": n, "documents": len(windows),
                      "replicates": args.replicates, "median_document_tokens": float(np.median([w.size for w in windows])),
                      "rows": rows_out, "seconds": round(time.perf_counter() - t, 1)}, indent=1))


if __name__ == "__main__":
    main()
