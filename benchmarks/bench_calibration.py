"""Calibration against known truth (issue "answers a statistician would sign").

    python benchmarks/bench_calibration.py [--seeds 40] [--power-seeds 20] [--tokens 200,2000,20000]
        [--positions 64,512] [--pair-seeds 10] [--coverage-seeds 30] [--diff-seeds 40] [--skip-distances]
        [--occupancy-ratio 1] [--quick]

Prints one JSON object with five tables, each row with its uncertainty:

1. ``distances``: corpora sampled from known ``mu_i`` (:func:`posstats.testing.known_corpus`:
   V = 5,000, Zipf 1.1, exactly N tokens per position). For each N and pair type (identical
   positions; planted position against the base, true ``d_H^2`` 0.10-0.21; drift pairs 1,
   4 and 16 apart; the drift's two ends) it gives the mean error against the true ``d_H^2``
   (from ``mu``) with its standard error, and the RMSE, of three estimates:
   - ``plugin``: the plug-in ``d_H^2``;
   - ``power_law``: minus the bias of the split power law posstats used before (``fitted_bias``);
   - ``unbiased``: minus the counts' unbiased sampling variance (the noise floor's ``b_i`` now).

   Errors are unclipped (clipping at 0 is a separate, visible step of the analysis).
2. ``decisions``: ``posstats.analyze`` with its default options (held-out scores off: no
   decision reads them) at each n of ``--positions`` and each N:
   With the ``tokens`` sampler every corpus comes with the window groups ``posstats count``
   writes (truncate mode since 2026-12-01: document t in group t mod 64), so up to 4,096
   positions homogeneity and rank are tested against rotated corpora, as for a counted
   corpus, and above it (since 2026-12-05, where count keeps the two halves: document t in
   group t mod 2) the rank test's edge is measured on the halves; the ``counts`` sampler
   keeps no documents (shuffled corpora, the analytic edge).
   - ``stationary`` corpora (every position the base distribution, ``--seeds`` of them):
     the fraction in which the report claims structure (components above noise, any
     standout, "positions distinguishable", "non-stationary", an encoding named better
     than another at some width: ``best_named``), target <= 5 %;
   - ``planted`` corpora (positions 0-3 mixed with a private block, ``--power-seeds``):
     "distinguishable", standouts exactly {0, 1, 2, 3}, components above noise;
   - ``drift`` corpora: "non-stationary", components above noise;
   - ``pack_markov``: a stationary stream whose tokens repeat the previous one half of the
     time, packed into N windows of n (``posstats.testing.markov_packed_counts``; with the
     ``tokens`` sampler up to 4,096 positions counted with its window groups as
     ``posstats count`` does, so homogeneity is tested by rotation since 2026-11-30): the
     same false claims as ``stationary``, with dependent tokens.
   Each fraction comes with its Clopper-Pearson 95 % interval.

3. ``coverage``: drift and planted corpora at n = ``--coverage-positions`` (default the
   first ``--positions``), N >= 2,000: how often the report's 95 % interval on the scaled
   stress of sinusoidal, ALiBi and a random encoding (d = 2, 16; ``--coverage-encodings``
   adds others) covers their scaled stress against the true distances (a fitted encoding's
   target: the fit made on the true distances), with the bias and RMSE of the reported estimate, the mean
   noise share of the summed distances (``null.distance_noise``) and how often the
   report's caveat about it is shown. Above 2,048 positions the intervals are the
   pair-sample jackknife's; ``--coverage-exact-limit`` puts the stress on the sampled path.
   One line per corpus and encoding goes to stderr (a long run is not lost whole).

4. ``held_out``: drift and planted corpora at n = ``--coverage-positions``, N = the largest
   of ``--tokens``, ``--held-out-seeds`` of each: the held-out scores' jackknife range
   (:func:`posstats.estimates.held_out.held_out_intervals`) against the score's
   large-sample limit (a fixed encoding's scaled stress against the true distances; a
   fitted one's fit made on the true distances: the classical MDS, SMACOF from it), for
   mds, mds-smacof, sinusoidal, ALiBi and random at d = 2, 16. It reports how often the
   range holds that truth (it is used for ties only: it is no 95 % interval) and how often
   the held-out best, with the encodings tied with it, names an encoding whose truth is
   the lowest (``sharp``: only such encodings; ``wrong``: none of them; truths within 1e-6
   count as equal).

5. ``diff``: ``posstats diff``'s per-position decisions (Holm at 5 %) on pairs of corpora at
   each n of ``--diff-positions`` (default 64, whatever ``--positions`` says: a long cell of
   the decision table does not sample pairs of its size) and each N: null pairs (``--diff-seeds`` each: two samples of a stationary corpus, of a
   drift, of a drift with B 4 times smaller, two dependent ``pack_markov`` streams) give the
   family-wise false-alarm rate and the per-position rates of p <= 0.01 and 0.001; changed
   pairs (``--power-seeds`` each: B plants a block into positions 0-3, true ``d_H^2``
   0.10-0.21, or weakly into 0-7, 0.005-0.04) give how often exactly the changed positions
   are named and each one's detection rate with its true ``d_H^2``.

``--occupancy-ratio r`` (below 1) makes the known corpora of tables 1-4 truncate-mode
documents of geometric length (:func:`posstats.testing.known_corpus`): N tokens at position
0, about ``r N`` at the last, the shorter documents in length classes of the window groups
as ``posstats count`` writes them; table 1 then has the pair ``identical_far`` (positions 2
and 60, the most unequal occupancies) and every table the column ``adjusted`` (the square
roots' occupancy shrinkage removed, the analysis' estimator; equal to ``unbiased`` at equal
occupancy). The diff table's two sides are then such corpora too, each with its own draw of
document lengths, so a position's occupancies differ between them as between refreshes.

N = 1e5 runs with ``--tokens 100000`` (docs/calibration.md has its row). Not here yet
(issue #28): intervals on eigenvalues and the mean ``d_H`` (none is reported: the shard
bootstrap that gave them is withdrawn, docs/calibration.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from posstats.analysis import AnalysisConfig, analyze  # noqa: E402
from posstats.estimates.noise import (  # noqa: E402
    _paired_d2,
    _rows_csr,
    _union,
    fitted_bias,
    split_half,
)
from posstats.estimates.sampling_variance import position_sampling_variance  # noqa: E402
from posstats.estimates.two_sample import compare_positions  # noqa: E402
from posstats.estimates.verdict import DISTANCE_NOISE_CAVEAT  # noqa: E402
from posstats.geometry.hellinger import hellinger_sq  # noqa: E402
from posstats.corpus.count_step import WINDOW_GROUP_POSITIONS, kept_window_groups, window_block  # noqa: E402
from posstats.counting.counts import CountAccumulator, CountSpec  # noqa: E402
from posstats.counting.window_groups import DEFAULT_WINDOW_GROUPS  # noqa: E402
from posstats.testing import (  # noqa: E402
    known_corpus,
    markov_packed_counts,
    markov_stream,
    proportion,
    split_counts,
)


def _power_law_bias(counts, seed: int) -> np.ndarray:
    parts = split_counts(counts, parts=4, seed=seed)
    rows = np.arange(counts.positions)
    mats = [_rows_csr(p, rows) for p in parts]
    sizes = np.stack([np.asarray(m.sum(axis=1)).ravel().astype(np.float64) for m in mats])
    total = mats[0] + mats[1] + mats[2] + mats[3]
    split = split_half(lambda a, b: _paired_d2(_union(mats, a), _union(mats, b)), sizes)
    return fitted_bias(split, sizes.sum(axis=0), np.diff(total.indptr).astype(np.float64))[0]


PAIRS = {
    "identical": ("stationary", [(10, 11), (20, 40), (30, 50)]),
    "planted_vs_base": ("planted", [(0, 10), (3, 20)]),
    "drift_1_apart": ("drift", [(20, 21)]),
    "drift_4_apart": ("drift", [(20, 24)]),
    "drift_16_apart": ("drift", [(20, 36)]),
    "drift_ends": ("drift", [(0, 63)]),
    # the most unequal occupancies with --occupancy-ratio below 1 (equal ones else)
    "identical_far": ("stationary", [(2, 60)]),
}


def distance_table(tokens: list[int], seeds: int, n: int, occupancy_ratio: float = 1.0) -> list[dict]:
    """Mean error (with its standard error) and RMSE of the estimates per (N, pair type);
    ``adjusted`` is ``unbiased`` with the square roots' occupancy shrinkage removed (the
    analysis' estimator: :mod:`posstats.estimates.occupancy`), equal to it at equal
    occupancy; ``occupancy_ratio`` < 1 samples truncate documents of falling occupancy
    (:func:`posstats.testing.known_corpus`; N is then position 0's)."""
    from posstats.estimates.occupancy import OccupancyShrinkage

    rows = []
    for N in tokens:
        for name, (kind, pairs) in PAIRS.items():
            errs: dict[str, list[float]] = {"plugin": [], "power_law": [], "unbiased": [], "adjusted": []}
            truth = []
            for seed in range(seeds):
                kc = known_corpus(kind, n, tokens=N, seed=seed, occupancy_ratio=occupancy_ratio)
                c = kc.counts.matrix
                d2 = hellinger_sq(c)
                b_new = position_sampling_variance(c)
                b_old = _power_law_bias(kc.counts, seed)
                shrink = OccupancyShrinkage.of(c)
                for i, j in pairs:
                    t = float(kc.true_d2(i, j)[0])
                    truth.append(t)
                    errs["plugin"].append(d2[i, j] - t)
                    errs["power_law"].append(d2[i, j] - b_old[i] - b_old[j] - t)
                    errs["unbiased"].append(d2[i, j] - b_new[i] - b_new[j] - t)
                    adjust = 0.0 if shrink is None else float(shrink.pair_adjustment(c, [i], [j])[0])
                    errs["adjusted"].append(d2[i, j] + adjust - b_new[i] - b_new[j] - t)
            row = {"tokens_per_position": N, "pairs": name, "samples": len(truth), "true_d2_mean": float(np.mean(truth))}
            if occupancy_ratio != 1.0:
                row["occupancy_ratio"] = occupancy_ratio
            for est, values in errs.items():
                v = np.asarray(values)
                row[est] = {"mean_error": float(v.mean()), "se": float(v.std(ddof=1) / math.sqrt(v.size)),
                            "rmse": float(np.sqrt((v**2).mean()))}
            plugin_bias = row["plugin"]["mean_error"]
            row["unbiased"]["mean_error_over_plugin_bias"] = row["unbiased"]["mean_error"] / plugin_bias
            row["power_law"]["mean_error_over_plugin_bias"] = row["power_law"]["mean_error"] / plugin_bias
            row["adjusted"]["mean_error_over_plugin_bias"] = row["adjusted"]["mean_error"] / plugin_bias
            rows.append(row)
            print(f"distances N={N} {name}: adjusted {row['adjusted']['mean_error']:+.5f} "
                  f"(se {row['adjusted']['se']:.5f}), unbiased {row['unbiased']['mean_error']:+.5f} "
                  f"(se {row['unbiased']['se']:.5f}), power law {row['power_law']['mean_error']:+.5f}, "
                  f"plug-in {plugin_bias:+.5f}", file=sys.stderr)
    return rows


def _claims(report: dict) -> dict[str, bool]:
    v = report["verdict"]
    standouts = (v.get("standout_positions") or {}).get("positions") or []
    return {
        "components_above_noise": (v.get("components_above_noise") or 0) > 0,
        "any_standout": bool(standouts),
        "distinguishable": bool(v.get("positions_distinguishable")),
        "non_stationary": bool(v.get("non_stationary")),
        "standouts_exactly_planted": sorted(standouts) == [0, 1, 2, 3],
        # the rank test on its own, before the gate (a test of H0 must reject to claim it)
        "rank_test_alone": ((report.get("null") or {}).get("components_above_null") or 0) > 0,
        # an encoding named better than another at some width (in-sample or held out):
        # a claim of structure, false on a stationary corpus
        "best_named": any(len(row["tied_with"]) + 1 < _row_width(report, row["dim"])
                          for row in [*(v.get("best_encodings") or []), *(v.get("held_out_best") or [])]),
    }


def _row_width(report: dict, dim: int) -> int:
    """How many encodings the report scored at width ``dim``."""
    return sum(int(e["dim"]) == dim for e in report.get("encodings") or [])


_TALLIED = {
    "stationary": ("components_above_noise", "any_standout", "distinguishable", "non_stationary", "best_named"),
    "pack_markov": ("components_above_noise", "any_standout", "distinguishable", "non_stationary", "best_named"),
    "planted": ("distinguishable", "standouts_exactly_planted", "components_above_noise"),
    "drift": ("non_stationary", "components_above_noise"),
}


def _compact(counts):
    """The counts as ``posstats analyze`` holds them after loading (``load_counts(compact=True)``):
    int32 CSR data where every count fits. At n = 131,072, N = 20,000 a drift's int64 counts
    (3.8e8 stored) and its analysis did not fit 24 GB in one process."""
    import dataclasses

    import scipy.sparse as sp

    m = counts.matrix
    if not sp.issparse(m) or m.dtype == np.int32 or (m.nnz and int(m.data.max()) >= 2**31):
        return counts
    m = sp.csr_array(m)
    return dataclasses.replace(counts, matrix=sp.csr_array((m.data.astype(np.int32), m.indices, m.indptr), shape=m.shape))


def _packed_with_groups(n: int, windows: int, seed: int):
    """``(counts, window groups)`` of the ``pack_markov`` stream of ``seed`` (the counts of
    :func:`posstats.testing.markov_packed_counts` with the ``tokens`` sampler), counted as
    ``posstats count`` counts a pack-mode corpus in one process: with
    :data:`~posstats.counting.window_groups.DEFAULT_WINDOW_GROUPS` groups of consecutive
    windows, so that the analysis tests homogeneity with the rotation null (above 4,096
    positions their even and odd halves only, for the rank test's edge)."""
    k = DEFAULT_WINDOW_GROUPS
    acc = CountAccumulator(CountSpec(positions=n, vocab_size=5000, mode="pack"), dense=False,
                           window_groups=kept_window_groups(n, k), window_block=window_block(n * windows, n, k),
                           window_halves=n > WINDOW_GROUP_POSITIONS)
    acc.add_sequences([markov_stream(n, windows=windows, stay=0.5, seed=seed)])
    groups = acc.window_groups()
    return _compact(acc.result()), groups


def decision_table(tokens: list[int], seeds: int, power_seeds: int, positions: list[int],
                   kinds: tuple[str, ...] = tuple(_TALLIED), first_seed: int = 0, sampler: str = "tokens",
                   occupancy_ratio: float = 1.0, null: str = "auto") -> list[dict]:
    """How often the default analysis claims structure in stationary corpora (the
    family-wise false-positive rate, target <= 5 %), and how often it finds it in planted
    and drifting ones (power, target >= 90 % at N >= 2,000), with Clopper-Pearson 95 %
    intervals.

    Corpus ``i`` of kind ``k`` has seed ``10,000 (1 + index of k in _TALLIED) + first_seed + i``,
    so a long cell (n = 131,072) can be continued by a later run with ``first_seed`` set to
    the corpora already done, and the two runs' counts added. ``sampler`` draws the known
    corpora (:func:`posstats.testing.known_corpus` and
    :func:`posstats.testing.markov_packed_counts`: ``counts`` is about 5x faster at
    N = 20,000, and its dependent streams are independent windows; the same seed is
    another corpus under each). ``occupancy_ratio`` < 1: the known kinds are truncate
    documents of falling occupancy (their shorter documents in length classes of the window
    groups, as ``posstats count`` counts them); ``pack_markov`` is unchanged (pack mode
    fills every position). ``null = "mp"`` runs every analysis against the ``mp`` edge
    (measured on the window groups' halves where the corpus has them, at every n with the
    ``tokens`` sampler: :mod:`posstats.estimates.halves_edge`), and tallies the rank test alone too
    (``rank_test_alone``, stationary and pack_markov) and which edge each analysis used
    (``edges``)."""
    cfg = AnalysisConfig(dims=(2, 16), encodings=("mds", "sinusoidal"), held_out="off", null=null)
    rows = []
    for n in positions:
        for N in tokens:
            t = time.perf_counter()
            row: dict = {"positions": n, "tokens_per_position": N,
                         **({"occupancy_ratio": occupancy_ratio} if occupancy_ratio != 1.0 else {})}
            for kind in kinds:
                keys = _TALLIED[kind]
                if null == "mp" and kind in ("stationary", "pack_markov"):
                    keys = (*keys, "rank_test_alone")
                edges: dict[str, int] = {}
                runs = seeds if kind in ("stationary", "pack_markov") else power_seeds
                if runs == 0:
                    continue
                tally = dict.fromkeys(keys, 0)
                for seed in range(first_seed, first_seed + runs):
                    seed_k = 10_000 * (1 + list(_TALLIED).index(kind)) + seed
                    t_sample = time.perf_counter()
                    groups = None
                    # window groups as posstats count keeps them: all 64 up to 4,096 positions (the rotation
                    # null's), above it their even and odd halves (the rank test's edge; the 64 groups hold them)
                    grouped = sampler == "tokens"
                    if kind == "pack_markov" and grouped:
                        counts, groups = _packed_with_groups(n, N, seed_k)
                    elif kind == "pack_markov":
                        counts = _compact(markov_packed_counts(n, windows=N, stay=0.5, seed=seed_k, sampler=sampler))
                    else:  # with the tokens sampler up to 4,096 positions: the window groups posstats count writes
                        k = kept_window_groups(n, DEFAULT_WINDOW_GROUPS) if grouped else 0
                        corpus = known_corpus(kind, n, tokens=N, seed=seed_k, sampler=sampler, window_groups=k,
                                              occupancy_ratio=occupancy_ratio,
                                              halves_only=grouped and n > WINDOW_GROUP_POSITIONS)
                        counts, groups = _compact(corpus.counts), corpus.window_groups
                    t_corpus = time.perf_counter()
                    report = analyze(counts, cfg, window_groups=groups).report()
                    claims = _claims(report)
                    for k in keys:
                        tally[k] += int(claims[k])
                    if null == "mp":
                        edge = ((report.get("null") or {}).get("edge") or {}).get("method", "none")
                        edges[edge] = edges.get(edge, 0) + 1
                    # one line per corpus as it finishes: a long cell (n = 131,072) is not lost whole
                    max_z = (report["verdict"].get("standout_positions") or {}).get("max_z")
                    print(f"  n={n} N={N} {kind} seed {seed_k}: {json.dumps({k: claims[k] for k in keys})} "
                          f"max z* {max_z if max_z is None else round(max_z, 2)}, "
                          f"sampling {t_corpus - t_sample:.0f} s, analysis {time.perf_counter() - t_corpus:.0f} s",
                          file=sys.stderr, flush=True)
                row[kind] = {k: proportion(c, runs) for k, c in tally.items()}
                if edges:
                    row[kind]["edges"] = edges
            row["seconds"] = round(time.perf_counter() - t, 1)
            rows.append(row)
            print(f"decisions n={n} N={N}: {json.dumps({k: {kk: vv['count'] for kk, vv in row[k].items() if kk != 'edges'} for k in kinds if k in row})}",
                  file=sys.stderr)
    return rows


def _noise_share(report: dict) -> float:
    """The share of the summed distances that noise alone reaches (``null.distance_noise``:
    the shuffled corpora's, or the pairs' with the analytic edge); 0 when absent."""
    return float(((report.get("null") or {}).get("distance_noise") or {}).get("share") or 0.0)


def _true_scaled_stresses(names_dims: list[tuple[str, int]], true_d2: np.ndarray, occupancy: Any) -> dict[tuple[str, int], float]:
    """The target of each encoding's estimate: its scaled stress against the true distances
    ``sqrt(true_d2)`` (n x n), a fitted encoding fitted on those distances (the classical
    MDS of ``true_d2``, SMACOF started from it), the large-sample limit of its in-sample and
    held-out fits."""
    from posstats.geometry.encodings import family_of, make_encoding
    from posstats.geometry.mds import classical_mds
    from posstats.geometry.stress import stress_report

    n = true_d2.shape[0]
    true_d = np.sqrt(true_d2)
    fitted = any(family_of(name).fitted for name, _ in names_dims)
    true_mds = classical_mds(np.ones((n, 1)), k=None, method="dense", squared_distances=true_d2) if fitted else None
    out = {}
    for name, dim in names_dims:
        enc = make_encoding(name, np.arange(n), dim, mds=true_mds, distances=true_d,
                            occupancy=np.broadcast_to(np.asarray(occupancy, dtype=np.float64), (n,)))
        out[(name, dim)] = stress_report(enc.matrix, true_d).scaled_stress
    return out


def _true_d2_matrix(corpus, n: int) -> np.ndarray:
    """(n, n) the true ``d_H^2`` between every two positions of a known corpus (0 on the diagonal)."""
    i, j = np.triu_indices(n, 1)
    d2 = np.zeros((n, n))
    d2[i, j] = corpus.true_d2(i, j)
    return d2 + d2.T


COVERAGE_ENCODINGS = ("sinusoidal", "alibi", "random")


def _coverage_corpus(kind: str, n: int, tokens: int, seed: int, occupancy_ratio: float = 1.0):
    """A known corpus of the coverage and held-out tables: ``drift`` and ``planted`` as in
    :func:`posstats.testing.known_corpus`, and ``all_planted``: every position mixes its own
    private block into the base at a weight spread over [0.05, 0.3], a geometry of n
    dimensions whose every pair is far above its noise, where a fitted encoding at a small
    width keeps a large stress (on a drift its target is about 0)."""
    if kind == "all_planted":
        return known_corpus("planted", n, tokens=tokens, seed=seed, planted=np.arange(n), strength=(0.05, 0.3),
                            occupancy_ratio=occupancy_ratio)
    return known_corpus(kind, n, tokens=tokens, seed=seed, occupancy_ratio=occupancy_ratio)


def coverage_table(tokens: list[int], seeds: int, n: int, kinds: tuple[str, ...] = ("drift", "planted"),
                   exact_limit: int | None = None, first_seed: int = 0,
                   encodings: tuple[str, ...] = COVERAGE_ENCODINGS, occupancy_ratio: float = 1.0) -> list[dict]:
    """How often the report's 95 % interval on an encoding's exact scaled stress (the
    jackknife of :mod:`posstats.estimates.jackknife`) covers its target (target 90-99 %,
    over the intervals the report gives: none is given when noise is >= 5 % of the summed
    distances, nor where the jackknife's correction exceeds 2 sd), with the estimate's bias
    and RMSE, on drift corpora (most pairs well above their noise) and planted ones (60 of
    64 positions identical: most pairs below their noise). The target is the scaled stress
    against the true distances; for a fitted encoding (``mds``, ``mds-smacof``) that of the
    fit made on the true distances (:func:`_true_scaled_stresses`), which is what the
    in-sample estimate converges to. ``best_encoding``: per width, how often the verdict's
    best (with the encodings tied with it) holds an encoding whose target is the lowest
    (targets within 1e-6 count as equal; ``right``), names only others (``wrong``), and
    names only such encodings (``sharp``). ``tie_range_holds_truth``: where no interval is
    given, how often the range kept for ties (``scaled_stress_tie_range``) holds the target
    (it is no 95 % interval; it decides ties).

    Above 2,048 positions the intervals are the pair-sample jackknife's
    (:mod:`posstats.estimates.pair_jackknife`) and the null is the analytic edge (the pairs
    then give the noise share); ``exact_limit`` below n puts the stress on the sampled path
    (the truth is still the stress over all pairs). Corpus ``i`` has seed
    ``30,000 + first_seed + i``: a later run with ``first_seed`` continues a row."""
    extra = {} if exact_limit is None else {"exact_limit": exact_limit}
    cfg = (AnalysisConfig(dims=(2, 16), encodings=encodings, held_out="off", null="shuffle",
                          null_replicates=19, **extra) if n <= 2048 else
           AnalysisConfig(dims=(2, 16), encodings=encodings, held_out="off", null="mp", **extra))
    rows = []
    for kind in kinds:
        for N in tokens:
            hits: dict[str, list[int]] = {}
            range_hits: dict[str, list[int]] = {}
            withheld: dict[str, list[int]] = {}
            errors: dict[str, list[float]] = {}
            shares: list[float] = []
            best: dict[str, list[str]] = {}
            for seed in range(first_seed, first_seed + seeds):
                kc = _coverage_corpus(kind, n, N, 30_000 + seed, occupancy_ratio)
                true_d2 = _true_d2_matrix(kc, n)
                report = analyze(kc.counts, cfg).report()
                shares.append(_noise_share(report))
                truths = _true_scaled_stresses([(e["name"], int(e["dim"])) for e in report["encodings"]], true_d2,
                                               kc.occupancy)
                for e in report["encodings"]:
                    truth = truths[(e["name"], int(e["dim"]))]
                    key = f"{e['name']}@{e['dim']}"
                    given = str(e.get("stress_interval", "")).startswith("jackknife")
                    print(f"    {kind} N={N} seed {30_000 + seed} {key}: {e['scaled_stress']:.5f} "
                          f"{e['scaled_stress_ci95'] if given else e.get('scaled_stress_tie_range')} truth {truth:.5f} "
                          f"({'interval' if given else 'no interval: ' + str(e.get('stress_interval'))[:60]})",
                          file=sys.stderr, flush=True)
                    withheld.setdefault(key, []).append(int(not given))
                    if given:
                        lo, hi = e["scaled_stress_ci95"]
                        hits.setdefault(key, []).append(int(lo <= truth <= hi))
                    elif e.get("scaled_stress_tie_range"):
                        lo, hi = e["scaled_stress_tie_range"]
                        range_hits.setdefault(key, []).append(int(lo <= truth <= hi))
                    errors.setdefault(key, []).append(e["scaled_stress"] - truth)
                for row in report["verdict"]["best_encodings"]:
                    at = {name: t for (name, dim), t in truths.items() if dim == int(row["dim"])}
                    lowest = {name for name, t in at.items() if t <= min(at.values()) + 1e-6}
                    named = {row["best"], *row["tied_with"]}
                    outcome = "sharp" if named <= lowest else "right" if named & lowest else "wrong"
                    best.setdefault(f"d={row['dim']}", []).append(outcome)
            rows.append({"tokens_per_position": N, "positions": n, "kind": kind,
                         **({"occupancy_ratio": occupancy_ratio} if occupancy_ratio != 1.0 else {}),
                         "coverage": {k: proportion(sum(v), len(v)) for k, v in hits.items()},
                         "interval_withheld": {k: proportion(sum(v), len(v)) for k, v in withheld.items()},
                         "tie_range_holds_truth": {k: proportion(sum(v), len(v)) for k, v in range_hits.items()},
                         "best_encoding": {k: {"right": proportion(sum(x != "wrong" for x in v), len(v)),
                                               "sharp": proportion(v.count("sharp"), len(v)),
                                               "wrong": proportion(v.count("wrong"), len(v))} for k, v in best.items()},
                         "estimate_bias": {k: round(float(np.mean(v)), 5) for k, v in errors.items()},
                         "estimate_rmse": {k: round(float(np.sqrt(np.mean(np.square(v)))), 5) for k, v in errors.items()},
                         "distance_noise_share": round(float(np.mean(shares)), 3),
                         "caveat_shown": proportion(sum(x >= DISTANCE_NOISE_CAVEAT for x in shares), len(shares))})
            print(f"coverage {kind} N={N}: covered {json.dumps({k: f'{sum(v)}/{len(v)}' for k, v in hits.items()})}, "
                  f"withheld {json.dumps({k: sum(v) for k, v in withheld.items()})}, best wrong "
                  f"{json.dumps({k: v.count('wrong') for k, v in best.items()})} of {seeds}", file=sys.stderr)
    return rows


def held_out_table(N: int, seeds: int, n: int, kinds: tuple[str, ...] = ("drift", "planted"),
                   first_seed: int = 0, occupancy_ratio: float = 1.0) -> list[dict]:
    """Section 4 of the module docstring: the held-out jackknife ranges against the truth
    (corpus ``i`` has seed ``70,000 + first_seed + i``)."""
    from posstats.estimates.verdict import best_encodings, held_out_row

    cfg = AnalysisConfig(dims=(2, 16), encodings=("mds", "mds-smacof", "sinusoidal", "alibi", "random"),
                         held_out="on", null="shuffle", null_replicates=19)
    rows = []
    for kind in kinds:
        hits: dict[str, list[int]] = {}
        errors: dict[str, list[float]] = {}
        best: dict[str, list[str]] = {}
        for seed in range(first_seed, first_seed + seeds):
            kc = _coverage_corpus(kind, n, N, 70_000 + seed, occupancy_ratio)
            d2 = _true_d2_matrix(kc, n)
            entries = analyze(kc.counts, cfg).report()["held_out"]["encodings"]
            truth = _true_scaled_stresses([(e["name"], int(e["dim"])) for e in entries], d2, kc.occupancy)
            for e in entries:
                t = truth[(e["name"], int(e["dim"]))]
                key = f"{e['name']}@{e['dim']}"
                errors.setdefault(key, []).append(e["held_out_scaled_stress"] - t)
                if e.get("held_out_scaled_stress_tie_range") and str(e.get("held_out_interval")).startswith("jackknife"):
                    lo, hi = e["held_out_scaled_stress_tie_range"]
                    hits.setdefault(key, []).append(int(lo <= t <= hi))
            named_rows = best_encodings([held_out_row(e) for e in entries])
            for row in named_rows:
                at = {name: t for (name, dim), t in truth.items() if dim == row["dim"]}
                lowest = {name for name, t in at.items() if t <= min(at.values()) + 1e-6}
                named = {row["best"], *row["tied_with"]}
                outcome = "sharp" if named <= lowest else "right" if named & lowest else "wrong"
                best.setdefault(f"d={row['dim']}", []).append(outcome)
            print(f"    held out {kind} N={N} seed {70_000 + seed}: {json.dumps({k: v[-1] for k, v in hits.items()})}",
                  file=sys.stderr, flush=True)
        rows.append({"tokens_per_position": N, "positions": n, "kind": kind,
                     "range_holds_truth": {k: proportion(sum(v), len(v)) for k, v in hits.items()},
                     "all_ranges_hold_truth": proportion(sum(map(sum, hits.values())), sum(map(len, hits.values()))),
                     "best_encoding": {k: {"wrong": proportion(v.count("wrong"), len(v)),
                                           "sharp": proportion(v.count("sharp"), len(v))} for k, v in best.items()},
                     "estimate_bias": {k: round(float(np.mean(v)), 5) for k, v in errors.items()}})
    return rows


# ----------------------------------------------------------------------------- posstats diff

DIFF_NULLS = ("stationary", "drift", "drift_unequal", "pack_markov")
DIFF_CHANGES = {  # kind -> (changed positions, their mixing weights in B): B moves a share of mass onto new ids
    "planted": ((0, 1, 2, 3), (0.1, 0.2)),
    "weak": (tuple(range(8)), (0.005, 0.04)),
}
DIFF_KINDS = (*DIFF_NULLS, *DIFF_CHANGES)


def _diff_pair(kind: str, n: int, N: int, seed: int, occupancy_ratio: float = 1.0) -> tuple[Any, Any, np.ndarray, np.ndarray]:
    """Corpora A and B for ``posstats diff``, the positions whose distribution truly changed
    and their true ``d_H^2(mu^A_i, mu^B_i)``. ``occupancy_ratio`` < 1: both sides are
    truncate documents of falling occupancy (:func:`posstats.testing.known_corpus`), each
    with its own draw of lengths, so a position's two occupancies differ too (not for
    ``pack_markov``).

    - ``stationary`` / ``drift``: two samples of the same ``mu_i`` (N tokens each);
      ``drift_unequal``: B holds N/4 tokens (a smaller refresh). Nothing changed.
    - ``pack_markov``: two streams of the same Markov chain, packed into N windows.
    - ``planted`` / ``weak``: A the base at every position, B mixing a private 20-id block
      into the changed positions (weights spread evenly over the kind's range)."""
    none = np.zeros(0, dtype=np.int64)
    if kind == "pack_markov":
        return (markov_packed_counts(n, windows=N, stay=0.5, seed=seed).matrix,
                markov_packed_counts(n, windows=N, stay=0.5, seed=seed + 1).matrix, none, none.astype(float))
    ratio = {"occupancy_ratio": occupancy_ratio} if occupancy_ratio != 1.0 else {}
    if kind in DIFF_NULLS:
        corpus = known_corpus(kind.split("_")[0], n, tokens=N, seed=seed, **ratio)
        b = corpus.sample(max(N // 4, 1) if kind == "drift_unequal" else N, seed=seed + 1)
        return corpus.counts.matrix, b.matrix, none, none.astype(float)
    changed, strength = DIFF_CHANGES[kind]
    a = known_corpus("planted", n, tokens=N, planted=changed, strength=0.0, seed=seed, **ratio)  # same ids, no block mass
    b = known_corpus("planted", n, tokens=N, planted=changed, strength=strength, seed=seed + 1, **ratio)
    truth = np.array([float(((np.sqrt(a.mu(i)) - np.sqrt(b.mu(i))) ** 2).sum()) for i in changed])
    return a.counts.matrix, b.counts.matrix, np.asarray(changed, dtype=np.int64), truth


def diff_table(tokens: list[int], seeds: int, power_seeds: int, positions: list[int],
               kinds: tuple[str, ...] = DIFF_KINDS, first_seed: int = 0, level: float = 0.05,
               occupancy_ratio: float = 1.0) -> list[dict]:
    """``posstats diff``'s per-position decisions (:func:`posstats.estimates.two_sample.compare_positions`,
    the call ``diff`` makes, Holm at ``level``) against known truth, with Clopper-Pearson 95 %
    intervals:

    - null pairs (``DIFF_NULLS``, ``seeds`` each): the family-wise false-alarm rate (any
      position called changed; target <= ``level``), and the per-position rates of
      p <= 0.01 and p <= 0.001 over every tested position (targets 1 % and 0.1 %);
    - changed pairs (``DIFF_CHANGES``, ``power_seeds`` each): how often exactly the changed
      positions are named, how often an unchanged one is (a false change), and each changed
      position's detection rate with its true ``d_H^2``.

    Pair ``i`` of kind ``k`` has seeds ``80,000 + 10,000 k + 2 (first_seed + i)`` (A) and one
    more (B). ``occupancy_ratio`` < 1: both sides of falling occupancy (:func:`_diff_pair`)."""
    rows = []
    for n in positions:
        for N in tokens:
            t = time.perf_counter()
            row: dict = {"positions": n, "tokens_per_position": N, "level": level,
                         **({"occupancy_ratio": occupancy_ratio} if occupancy_ratio != 1.0 else {})}
            for kind in kinds:
                runs = seeds if kind in DIFF_NULLS else power_seeds
                if runs == 0:
                    continue
                alarms = flagged = exact = tested = p01 = p001 = 0
                found: np.ndarray | None = None
                truth = np.zeros(0)
                for i in range(first_seed, first_seed + runs):
                    seed = 80_000 + 10_000 * DIFF_KINDS.index(kind) + 2 * i
                    a, b, changed, truth = _diff_pair(kind, n, N, seed, occupancy_ratio)
                    test = compare_positions(a, b, level=level)
                    named = np.flatnonzero(test.changed)
                    unchanged = np.setdiff1d(np.flatnonzero(test.tested), changed)
                    alarms += int(np.isin(named, unchanged).any())
                    flagged += int(named.size)
                    p = test.p_value[unchanged]
                    tested += int(p.size)
                    p01 += int((p <= 0.01).sum())
                    p001 += int((p <= 0.001).sum())
                    if changed.size:
                        exact += int(np.array_equal(named, changed))
                        hit = np.isin(changed, named).astype(int)
                        found = hit if found is None else found + hit
                    print(f"  diff n={n} N={N} {kind} seeds {seed}/{seed + 1}: changed {named[:12].tolist()}"
                          f"{' ...' if named.size > 12 else ''}", file=sys.stderr, flush=True)
                cell: dict = {"pairs": runs, "false_alarm": proportion(alarms, runs),
                              "p_at_most_0.01": proportion(p01, tested), "p_at_most_0.001": proportion(p001, tested)}
                if kind in DIFF_NULLS:
                    cell["positions_flagged"] = flagged
                else:
                    cell["exactly_the_changed"] = proportion(exact, runs)
                    cell["found"] = [{"position": int(pos), "true_d2": round(float(d2), 5), **proportion(int(k), runs)}
                                     for pos, d2, k in zip(DIFF_CHANGES[kind][0], truth, found, strict=True)]
                row[kind] = cell
            row["seconds"] = round(time.perf_counter() - t, 1)
            rows.append(row)
            print(f"diff n={n} N={N}: " + json.dumps({k: v["false_alarm"]["count"] for k, v in row.items()
                                                     if isinstance(v, dict)}), file=sys.stderr)
    return rows


def _kinds(text: str, parser: argparse.ArgumentParser, known=tuple(_TALLIED), flag: str = "--decision-kinds") -> tuple[str, ...]:
    """The comma-separated kinds of ``flag``, each checked against ``known`` (a one-line
    parser error naming the first unknown one)."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in known]
    if unknown or not kinds:
        parser.error(f"{flag}: unknown kind {unknown[0] if unknown else repr(text)}; choose from {', '.join(known)}")
    return kinds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=40, help="stationary corpora per cell of the decision table (default 40)")
    p.add_argument("--power-seeds", type=int, default=20, help="planted and drift corpora per cell (default 20)")
    p.add_argument("--pair-seeds", type=int, default=10, help="corpora per cell of the distance table (default 10)")
    p.add_argument("--tokens", default="200,2000,20000", help="tokens per position (default 200,2000,20000)")
    p.add_argument("--positions", default="64", help="positions n of the decision table, comma-separated (default 64; "
                                                  "the distance table uses the first)")
    p.add_argument("--skip-distances", action="store_true", help="leave out the distance table")
    p.add_argument("--coverage-seeds", type=int, default=30, help="drift and planted corpora per row of the coverage table (default 30; 0 leaves it out)")
    p.add_argument("--coverage-positions", type=int, default=None,
                   help="n of the coverage table (default: the first --positions); above 2,048 the pair-sample jackknife")
    p.add_argument("--coverage-exact-limit", type=int, default=None,
                   help="geometry rows above which the coverage table's stress is sampled (default: the analysis')")
    p.add_argument("--coverage-kinds", default="drift,planted",
                   help="corpora of the coverage and held-out tables (default drift,planted; all_planted: every "
                        "position its own block)")
    p.add_argument("--coverage-encodings", default=",".join(COVERAGE_ENCODINGS),
                   help=f"encodings of the coverage table (default {','.join(COVERAGE_ENCODINGS)}; add mds,mds-smacof "
                        "for the fitted ones' in-sample intervals, whose target is the fit made on the true distances)")
    p.add_argument("--skip-decisions", action="store_true", help="leave out the decision table")
    p.add_argument("--decision-kinds", default=",".join(_TALLIED),
                   help=f"corpora of the decision table (default {','.join(_TALLIED)})")
    p.add_argument("--first-seed", type=int, default=0,
                   help="start each kind's seeds this far in, in the decision, coverage and held-out "
                        "tables (default 0): continues a long cell that an earlier run stopped, so the "
                        "two runs' counts add up")
    p.add_argument("--held-out-seeds", type=int, default=20,
                   help="drift and planted corpora of the held-out table (default 20; 0 leaves it out)")
    p.add_argument("--diff-positions", default="64",
                   help="positions n of the diff table, comma-separated (default 64)")
    p.add_argument("--diff-seeds", type=int, default=40,
                   help="null pairs per cell of the diff table (default 40; 0 leaves it out); changed pairs: --power-seeds")
    p.add_argument("--diff-kinds", default=",".join(DIFF_KINDS),
                   help=f"pairs of the diff table (default {','.join(DIFF_KINDS)})")
    p.add_argument("--sampler", choices=("tokens", "counts"), default="tokens",
                   help="how the decision table's known corpora are drawn (default tokens, as every figure up to "
                        "2026-11-28; counts: each row's multinomial at once, about 5x faster at N = 20,000, and "
                        "pack_markov's windows independent chains drawn a row at a time; the same seed is "
                        "another corpus under each)")
    p.add_argument("--occupancy-ratio", type=float, default=1.0,
                   help="below 1, the known corpora of the distance, decision, coverage and held-out tables are "
                        "truncate documents of falling occupancy: N at position 0, about this share of N at the "
                        "last (default 1: N at every position); the diff table's two sides too (each its own "
                        "draw of lengths; pack_markov unchanged)")
    p.add_argument("--null", choices=("auto", "mp"), default="auto",
                   help="the decision table's null: auto (the analysis' default: rotated corpora up to 4,096 rows) "
                        "or mp (the noise edge, measured on the window groups' halves where the corpora have them; "
                        "also tallies the rank test alone)")
    p.add_argument("--quick", action="store_true", help="4 seeds, N = 200 and 2,000 (a smoke run)")
    args = p.parse_args()
    tokens = [int(float(x)) for x in args.tokens.split(",")]
    positions = [int(x) for x in args.positions.split(",")]
    seeds, power_seeds, pair_seeds = args.seeds, args.power_seeds, args.pair_seeds
    ratio = args.occupancy_ratio
    if not 0.0 < ratio <= 1.0:
        p.error(f"--occupancy-ratio must be in (0, 1], got {ratio}")
    if args.quick:
        tokens, seeds, power_seeds, pair_seeds = [200, 2000], 4, 2, 4
        args.coverage_seeds = args.held_out_seeds = 2
        args.diff_seeds = 4
    t = time.perf_counter()
    out = {
        "benchmark": "calibration",
        "setup": {"vocab": 5000, "zipf": 1.1, "positions": positions, "tokens_per_position": tokens,
                  "seeds_stationary": seeds, "seeds_power": power_seeds, "seeds_distances": pair_seeds,
                  "decision_kinds": args.decision_kinds.split(","), "first_seed": args.first_seed,
                  "sampler": args.sampler, "occupancy_ratio": ratio, "null": args.null},
        "distances": [] if args.skip_distances else distance_table(tokens, pair_seeds, positions[0], ratio),
        "decisions": [] if args.skip_decisions else decision_table(
            tokens, seeds, power_seeds, positions, _kinds(args.decision_kinds, p), args.first_seed, args.sampler,
            ratio, args.null),
        "coverage": coverage_table([N for N in tokens if N >= 2000], args.coverage_seeds,
                                   args.coverage_positions or positions[0], tuple(args.coverage_kinds.split(",")),
                                   exact_limit=args.coverage_exact_limit, first_seed=args.first_seed,
                                   encodings=tuple(x.strip() for x in args.coverage_encodings.split(",") if x.strip()),
                                   occupancy_ratio=ratio)
        if args.coverage_seeds else [],
        "held_out": held_out_table(max(tokens), args.held_out_seeds, args.coverage_positions or positions[0],
                                   tuple(args.coverage_kinds.split(",")), first_seed=args.first_seed,
                                   occupancy_ratio=ratio)
        if args.held_out_seeds else [],
        "diff": diff_table(tokens, args.diff_seeds, power_seeds, [int(x) for x in args.diff_positions.split(",")],
                           _kinds(args.diff_kinds, p, DIFF_KINDS, "--diff-kinds"),
                           args.first_seed, occupancy_ratio=ratio) if args.diff_seeds else [],
    }
    out["seconds"] = round(time.perf_counter() - t, 1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
