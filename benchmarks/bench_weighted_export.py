"""Which table ``posstats export`` should write where occupancy falls steeply: P_MDS or the
occupancy-weighted MDS, measured against the true geometry.

    python benchmarks/bench_weighted_export.py [--tails 4,10,100,300] [--seeds 12] [--rank 2]

Each corpus is :func:`posstats.testing.synthetic_counts`: rank-``--rank`` structure (strength
0.3) over 200 positions, the first 60 of 3,000 expected tokens and the other 140 of
``tail`` (a truncate-mode corpus whose documents mostly end early), V = 2,000, seeds
10, 11, .... Each is analysed with the defaults (``posstats analyze``: bias-corrected
distances, the occupancy-weighted rank test against shuffled corpora), and at
the informative rank r (the verdict's components above noise; 1 where it counts none) two
tables are scored against the truth (the d_H of the known distributions) by scaled stress:

- ``p_mds``: the unweighted classical MDS, P_MDS(r) (the baseline: what the export wrote
  before the occupancy-weighted MDS);
- ``weighted``: the occupancy-weighted MDS of the components the rank test counted
  (:func:`posstats.geometry.mds.weighted_coordinates`).

Both on every pair (``all``) and on the 60 well-occupied positions (``head``). Also per
cell: how often the verdict's caveat names thin MDS components
(:func:`posstats.estimates.verdict.thin_mds_components`), the rule under which the
export's ``--weighting auto`` takes the weighted components, and the scaled stress of the
table auto exports. Prints one JSON object; means with their standard errors, and the
count of seeds where the weighted table is nearer the truth, with its Clopper-Pearson 95 %
interval.

With ``--held-out`` each corpus is also split into two halves of its tokens (as the report's
held-out table splits it, :func:`posstats.estimates.held_out.token_halves`); both tables are
fitted on half A at the same rank and scored twice: by their held-out scaled stress against
half B's bias-corrected ``d_H`` (what the report's held-out table would show) and against the
truth. ``held_out.agrees`` counts the corpora where the held-out score ranks the two tables
as the truth does: whether a held-out row could grade the weighted table.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

HEAD = 60
POSITIONS = 200


def truth_stress(x: np.ndarray, truth: np.ndarray) -> float:
    """Scaled stress of the rows ``x`` (m, r) against the true d_H ``truth`` (m, m): the
    stress at the best scale, ``min_a sum (a e_ij - t_ij)^2 / sum t_ij^2`` over pairs i < j."""
    iu = np.triu_indices(len(x), 1)
    e = np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))[iu]
    t = truth[iu]
    scale = float(e @ t) / max(float(e @ e), 1e-300)
    return float(((scale * e - t) ** 2).sum() / (t @ t))


def _corrected(rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(squared distances with the occupancy adjustment, the unbiased bias ``b_i``, the
    bias-corrected ``d_H``) of the count rows (m, V): the analysis' estimators."""
    from posstats.estimates.noise import corrected_squared_distances
    from posstats.estimates.occupancy import adjusted
    from posstats.estimates.sampling_variance import position_sampling_variance
    from posstats.geometry.hellinger import hellinger_sq

    bias = position_sampling_variance(rows)
    d2 = adjusted(hellinger_sq(rows), rows)
    return d2, bias, np.sqrt(corrected_squared_distances(d2, bias))


def _half_tables(rows, r: int) -> tuple[np.ndarray, np.ndarray]:
    """(P_MDS(r), the occupancy-weighted MDS(r)) of the count rows (m, V), fitted as the
    corpus is: the dense classical MDS of the adjusted distances with the bias on its
    diagonal, and the top eigenpairs of the same Gram ``B - H diag(b) H`` whitened by the
    occupancy weights."""
    from posstats.geometry.mds import classical_mds, gram_in_place, weighted_coordinates

    d2, bias, _ = _corrected(rows)
    p_mds = classical_mds(rows, k=r, method="dense", diagonal=bias, squared_distances=d2.copy()).encoding[:, :r]
    gram = gram_in_place(d2, bias)
    occupancy = np.asarray(rows.sum(axis=1), dtype=np.float64).ravel()
    w = occupancy / occupancy.mean()
    root = np.sqrt(w)
    lam, u = np.linalg.eigh(root[:, None] * gram * root[None, :])
    return p_mds, weighted_coordinates(u[:, ::-1][:, :r], lam[::-1][:r], w)


def held_out(corpus, positions: np.ndarray, truth: np.ndarray, r: int, seed: int) -> dict:
    """Both tables fitted on half A of the corpus' tokens at rank ``r``: their scaled stress
    against half B's corrected ``d_H`` (held out) and against the truth."""
    import scipy.sparse as sp

    from posstats.estimates.held_out import token_halves
    from posstats.geometry.stress import stress_report

    rows = sp.csr_array(corpus.counts.matrix)[positions]
    a, b = token_halves(rows, seed=seed)
    keep = np.flatnonzero((np.asarray(a.sum(axis=1)).ravel() > 0) & (np.asarray(b.sum(axis=1)).ravel() > 0))
    a, b, truth = a[keep], b[keep], truth[np.ix_(keep, keep)]
    p_mds, weighted = _half_tables(a, r)
    d_b = _corrected(b)[2]
    out = {name: {"held_out": stress_report(x, d_b).scaled_stress, "truth": truth_stress(x, truth)}
           for name, x in (("p_mds", p_mds), ("weighted", weighted))}
    out["agrees"] = ((out["weighted"]["held_out"] < out["p_mds"]["held_out"])
                     == (out["weighted"]["truth"] < out["p_mds"]["truth"]))
    return out


def one_corpus(tail: float, seed: int, rank: int, with_held_out: bool = False) -> dict:
    """The verdict's count, the thin flag and the two tables' scaled stresses for one corpus."""
    from posstats.analysis import AnalysisConfig, analyze
    from posstats.estimates.verdict import thin_mds_components
    from posstats.testing import synthetic_counts

    tokens = np.concatenate([np.full(HEAD, 3000.0), np.full(POSITIONS - HEAD, tail)])
    corpus = synthetic_counts(POSITIONS, 2000, tokens=tokens, rank=rank, strength=0.3, seed=seed)
    analysis = analyze(corpus.counts, AnalysisConfig(held_out="off", encodings=("mds",), dims=(2,)),
                       show_progress=False)
    report = analysis.report().to_dict()
    above = int(report["verdict"]["components_above_noise"] or 0)
    r = max(above, 1)
    c = corpus.coefficients[analysis.positions]
    truth = np.sqrt(((c[:, None] - c[None]) ** 2).sum(-1))
    head = np.flatnonzero(analysis.positions < HEAD)
    p_mds = analysis.mds.encoding[:, :r]
    weighted = analysis.weighted_encoding
    thin = thin_mds_components(report)
    out = {"components": above, "thin": bool(thin),
           "p_mds": {"all": truth_stress(p_mds, truth), "head": truth_stress(p_mds[head], truth[np.ix_(head, head)])}}
    if weighted is not None and weighted.shape[1] >= r:
        w = weighted[:, :r]
        out["weighted"] = {"all": truth_stress(w, truth), "head": truth_stress(w[head], truth[np.ix_(head, head)])}
    # what `posstats export --weighting auto` writes at the informative rank
    out["auto"] = "weighted" if (thin and above and "weighted" in out) else "p_mds"
    if with_held_out:
        out["held_out"] = held_out(corpus, analysis.positions, truth, r, seed)
    return out


def clopper_pearson(k: int, n: int) -> list[float]:
    """Two-sided 95 % Clopper-Pearson interval of k successes in n."""
    from posstats.testing import proportion

    return proportion(k, n)["ci95"]


def mean_se(values: list[float]) -> dict:
    a = np.asarray(values, dtype=np.float64)
    return {"mean": round(float(a.mean()), 4),
            "se": round(float(a.std(ddof=1) / np.sqrt(a.size)), 4) if a.size > 1 else None}


def cell(tail: float, seeds: int, rank: int, with_held_out: bool = False) -> dict:
    """One tail occupancy over ``seeds`` corpora."""
    runs = [one_corpus(tail, 10 + s, rank, with_held_out) for s in range(seeds)]
    both = [x for x in runs if "weighted" in x]
    row = {"tail_tokens": tail, "seeds": seeds, "thin_flagged": sum(x["thin"] for x in runs),
           "components": mean_se([x["components"] for x in runs]), "with_weighted": len(both)}
    for side in ("all", "head"):
        entry = {"p_mds": mean_se([x["p_mds"][side] for x in both])} if both else {}
        if both:
            entry["weighted"] = mean_se([x["weighted"][side] for x in both])
            nearer = sum(x["weighted"][side] < x["p_mds"][side] for x in both)
            entry["weighted_nearer"] = nearer
            entry["weighted_nearer_ci95"] = clopper_pearson(nearer, len(both))
        entry["auto"] = mean_se([x[x["auto"]][side] for x in runs])
        row[side] = entry
    row["auto_took_weighted"] = sum(x["auto"] == "weighted" for x in runs)
    if with_held_out:
        held = [x["held_out"] for x in runs]
        row["held_out"] = {
            **{f"{name}_{score}": mean_se([h[name][score] for h in held])
               for name in ("p_mds", "weighted") for score in ("held_out", "truth")},
            "weighted_better_held_out": sum(h["weighted"]["held_out"] < h["p_mds"]["held_out"] for h in held),
            "weighted_nearer_truth": sum(h["weighted"]["truth"] < h["p_mds"]["truth"] for h in held),
            "agrees": sum(h["agrees"] for h in held),
            "agrees_ci95": clopper_pearson(sum(h["agrees"] for h in held), len(held)),
        }
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tails", default="4,10,100,300", help="comma-separated expected tokens of the 140 tail positions")
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--rank", type=int, default=2, help="true rank of the structure (>= 2)")
    ap.add_argument("--held-out", action="store_true",
                    help="also fit both tables on half of the tokens and score them on the other half")
    args = ap.parse_args()
    t = time.perf_counter()
    rows = [cell(float(x), args.seeds, args.rank, args.held_out) for x in args.tails.split(",")]
    print(json.dumps({"benchmark": "weighted_export", "positions": POSITIONS, "head": HEAD, "head_tokens": 3000,
                      "rank": args.rank, "baseline": "p_mds", "rows": rows,
                      "seconds": round(time.perf_counter() - t, 1)}, indent=1))


if __name__ == "__main__":
    main()
