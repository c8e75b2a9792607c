"""The documents' excess in the standout test where no window can be rotated
(:mod:`posstats.estimates.document_excess`): its pieces against brute force and simulation,
the model against rotated corpora, and the verdict above 4,096 positions on documents that
differ (docs/calibration.md, "Documents that differ")."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import poisson

from posstats.analysis import AnalysisConfig
from posstats.analysis.pipeline import analyze
from posstats.analysis.rows import ModelledExcess, half_sums_of_groups
from posstats.estimates.document_excess import (
    document_excess,
    document_variance,
    length_moments,
    sqrt_poisson_slopes,
)
from posstats.estimates.rotation import rotated_distances_to_pool
from posstats.estimates.saddlepoint import JointCgf, calibrated_z, lower_tail_z, solved_near
from posstats.estimates.standout import (
    THIN_SOLVED,
    _distance_to,
    _row_totals,
    null_distance_to_pool,
    standout_positions,
    standout_threshold,
)
from posstats.testing import resampled_documents

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_document_heterogeneity.py"


def _fortunes():
    spec = importlib.util.spec_from_file_location("bench_document_heterogeneity", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fortune_documents()


def _occupancy(lengths, n):
    """(n,) windows reaching each position: documents of ``lengths`` counted at n."""
    ell = np.minimum(np.asarray(lengths), n)
    return np.array([(ell > j).sum() for j in range(n)], dtype=np.float64)


def test_length_moments_match_the_documents():
    rng = np.random.default_rng(0)
    n = 40
    lengths = rng.integers(1, 60, 300)
    ell = np.minimum(lengths, n)
    total, w, s = length_moments(_occupancy(lengths, n))
    assert total == ell.sum()
    assert w == pytest.approx(((ell**2).sum() - ell.sum()) / ell.sum() ** 2)
    np.testing.assert_allclose(s, [ell[ell > i].sum() for i in range(n)])


@pytest.mark.parametrize("lam", [0.01, 0.5, 3.0, 30.0, 49.9, 50.1, 80.0, 400.0])
def test_sqrt_poisson_slopes_are_the_derivatives_of_the_series(lam):
    """``h(lam) = E sqrt(X)`` by its exact series; its first and second derivatives by central
    differences (step 0.01: the truncation error is far below the tolerance)."""
    k = np.arange(int(lam + 40 * math.sqrt(lam) + 60))
    h = lambda x: float(poisson.pmf(k, x) @ np.sqrt(k))  # noqa: E731
    e = min(1e-2, lam / 4)
    d1 = (h(lam + e) - h(lam - e)) / (2 * e)
    d2 = (h(lam + e) - 2 * h(lam) + h(lam - e)) / e**2
    got1, got_a = sqrt_poisson_slopes(np.array([lam]))
    assert got1[0] == pytest.approx(d1, rel=2e-3)
    assert got_a[0] == pytest.approx(d1 + lam * d2, rel=2e-3, abs=1e-6)


def _two_kind_halves(rng, *, differ: bool, documents=400, n=30):
    """Token totals and occupancies of the even and odd documents of a corpus whose
    documents take law ``u1`` or ``u2`` (probability 1/2 each; the same law when not
    ``differ``), lengths uniform on 1-45, counted at n positions."""
    u1 = np.array([0.7, 0.1, 0.1, 0.1])
    u2 = np.array([0.1, 0.1, 0.1, 0.7]) if differ else u1
    lengths = np.minimum(rng.integers(1, 46, documents), n)
    kinds = rng.random(documents) < 0.5
    totals = np.array([rng.multinomial(ell, u1 if k else u2) for ell, k in zip(lengths, kinds)], dtype=np.float64)
    halves = []
    for parity in (0, 1):
        pick = slice(parity, None, 2)
        halves.append((totals[pick].sum(axis=0), _occupancy(lengths[pick], n)))
    return halves, (u1 - u2) ** 2 / 4  # Var_d(u_dv) of a fair two-point mixture


@pytest.mark.parametrize("differ", [False, True])
def test_document_variance_is_unbiased(differ):
    """Over 400 corpora the mean of ``tau_hat`` is within 4.5 standard errors of the
    documents' variance, token by token (0 when every document has one law): a test that
    fails by chance with probability below 1e-4 for the 4 tokens together."""
    rng = np.random.default_rng(11 if differ else 12)
    draws, truth = [], None
    for _ in range(400):
        ((a, occ_a), (b, occ_b)), truth = _two_kind_halves(rng, differ=differ)
        draws.append(document_variance(a, b, occ_a, occ_b))
    draws = np.array(draws)
    se = draws.std(axis=0, ddof=1) / math.sqrt(len(draws))
    assert np.all(np.abs(draws.mean(axis=0) - truth) < 4.5 * se), (draws.mean(axis=0), truth, se)
    if differ:
        assert np.all(truth[[0, 3]] > 5 * se[[0, 3]])  # the test can tell a variance from none


def test_document_excess_has_the_well_sampled_limit():
    """Where every ``N p_v`` is large the excess is ``sum_v tau_v / (4 p_v) [W - 2 (S_i /
    N_i - 1) / T]``: positive at the shallow rows, negative deep down."""
    rng = np.random.default_rng(2)
    p = rng.dirichlet(np.full(20, 20.0))
    tau = rng.random(20) * p**2
    occupancy = np.array([1e6] + [1e5] * 11)  # 900,000 documents of 1 token, 100,000 of 12; N p_v >= 1,000
    total, w, s = length_moments(occupancy)
    expected = float((tau / (4 * p)).sum()) * (w - 2 * (s / occupancy - 1) / total)
    got = document_excess(tau, p, occupancy, grid=64)
    np.testing.assert_allclose(got, expected, rtol=2e-3)
    assert got[0] > 0 > got[-1]


def test_modelled_excess_agrees_with_the_rotated_corpora():
    """Resampled fortunes at n = 512 (below 4,096 positions, so window groups rotate): the
    model fitted to the two halves gives the shallow rows (0-15) an excess within 0.65-1.4
    times the rotated corpora's mean excess (39 of them), and the deep rows (256 on) a
    negative or negligible one, as the rotations do."""
    sources, vocab = _fortunes()
    counts, _, groups = resampled_documents(sources, 512, vocab=vocab, seed=3)
    c, occ = _row_totals(counts.matrix)
    keep = np.flatnonzero(occ > 0)
    rows, occ = c[keep], occ[keep]
    pooled = np.asarray(rows.sum(axis=0)).ravel().astype(np.float64)
    s_pool = np.sqrt(pooled / pooled.sum())
    mean, sd = null_distance_to_pool(s_pool**2, occ)
    rotated = rotated_distances_to_pool(groups, s_pool, rows=keep, replicates=39, seed=3).mean(axis=0) - mean
    modelled = ModelledExcess(lambda: half_sums_of_groups(groups, keep))(s_pool)
    shallow = keep < 16
    ratio = modelled[shallow].mean() / rotated[shallow].mean()
    assert (rotated[shallow] / sd[shallow]).mean() > 1.5  # the excess is there to be measured
    assert 0.65 < ratio < 1.4, ratio
    deep = keep >= 256
    assert (modelled[deep] / sd[deep]).mean() < 0.2 and (rotated[deep] / sd[deep]).mean() < 0.2


def _analysed(counts, groups, seed):
    config = AnalysisConfig(held_out="off", encodings=("mds",), dims=(2,), seed=seed)
    return analyze(counts, config, window_groups=groups).report()


def test_documents_that_differ_above_4096_positions_make_no_claim():
    """Resampled fortunes eight times as long, 4,200 positions (the counter keeps the two
    halves only): the multinomial null names standouts (the shallow rows: the pool is the
    long documents'); the analysis, with the modelled excess and the halves' edge instead of
    shuffled corpora, claims nothing. Before the model the verdict named hundreds of
    standouts on such corpora (n = 8,192: 583-660 in 3 of 3)."""
    sources, vocab = _fortunes()
    counts, _, groups = resampled_documents(sources, 4200, vocab=vocab, documents=1000, seed=0, length_scale=8)
    assert groups.halves_only
    reached = np.flatnonzero(np.asarray(counts.matrix.sum(axis=1)).ravel() > 0)
    plain = standout_positions(counts.matrix[reached], reached)
    assert plain["count"] >= 1 and "modelled_offset" not in plain
    report = _analysed(counts, groups, 0)
    verdict = report["verdict"]
    assert verdict["standout_positions"]["count"] == 0
    assert not verdict["non_stationary"] and not verdict["components_above_noise"]
    modelled = verdict["standout_positions"]["modelled_offset"]
    assert modelled["rows_offset"] > 100 and modelled["largest_in_sd"] > 1.5
    assert "modelled" in verdict["standout_positions"]["rule"]
    assert report["null"]["method"] == "mp" and "homogeneity" not in report


def test_dependent_document_tokens_above_4096_positions_make_no_claim_and_keep_the_openings():
    """The same corpus with each token repeating its predecessor with probability 0.9 (no
    longer exchangeable within a document; still no positional structure): no claim; with
    positions 0-3 planted afterwards, exactly 0-3 stand out. The benchmark measures 10 null
    and 5 planted corpora at n = 8,192 (docs/calibration.md, "Dependent tokens in a document")."""
    sources, vocab = _fortunes()
    counts, _, groups = resampled_documents(sources, 4200, vocab=vocab, documents=1000, seed=1, length_scale=8,
                                            stay=0.9)
    verdict = _analysed(counts, groups, 1)["verdict"]
    assert verdict["standout_positions"]["count"] == 0
    assert not verdict["non_stationary"] and not verdict["components_above_noise"]
    counts, _, groups = resampled_documents(sources, 4200, vocab=vocab, documents=1000, seed=1, length_scale=8,
                                            stay=0.9, planted=0.3)
    assert _analysed(counts, groups, 1)["verdict"]["standout_positions"]["positions"] == [0, 1, 2, 3]


def test_planted_openings_stand_out_above_4096_positions():
    """The same corpus with positions 0-3 planted (30 % of their tokens from ids 1-10):
    exactly 0-3 stand out with the modelled excess subtracted."""
    sources, vocab = _fortunes()
    counts, _, groups = resampled_documents(sources, 4200, vocab=vocab, documents=1000, seed=0, length_scale=8,
                                            planted=0.3)
    standout = _analysed(counts, groups, 0)["verdict"]["standout_positions"]
    assert standout["positions"] == [0, 1, 2, 3] and standout["max_z"] > 8


def test_thin_rows_are_solved_however_far_above_the_threshold():
    """Resampled fortunes sixteen times as long at n = 8,192 (seed 0): at normal z about 2,
    rows of 6-11 tokens were read at calibrated z 5.1-7.2 by the correction interpolated
    between the grid's points (on a few tokens d nears its maximum 2 within a few sd, and
    the correction jumps between two points), and named standouts. Their own saddlepoint
    solves read about 2.4 (a Monte Carlo of 4e6 six-token rows: P = 0.0080, z = 2.41), and
    rows of at most 64 tokens near or above the threshold are now solved."""
    sources, vocab = _fortunes()
    counts, _, _ = resampled_documents(sources, 8192, vocab=vocab, documents=3000, seed=0, length_scale=16)
    c, occ = _row_totals(counts.matrix)
    keep = occ > 0
    c, occ = c[keep], occ[keep]
    pooled = np.asarray(c.sum(axis=0)).ravel().astype(np.float64)
    p = pooled / pooled.sum()
    mean, sd = null_distance_to_pool(p, occ)
    z = (_distance_to(c, occ, np.sqrt(p)) - mean) / sd
    threshold = standout_threshold(occ.size)
    interpolated = calibrated_z(z, occ, p, mean, sd)
    misread = np.flatnonzero((interpolated > threshold) & (occ <= THIN_SOLVED))
    assert misread.size >= 1 and z[misread].max() < 3.0  # the interpolation's error, as measured
    solved, count = solved_near(interpolated, z, occ, p, mean, sd, threshold=threshold, thin=THIN_SOLVED)
    assert count >= misread.size
    for i in misread:
        own = lower_tail_z(JointCgf(p, float(occ[i])), math.sqrt(occ[i]) * (1 - (mean[i] + z[i] * sd[i]) / 2))
        assert own is not None and solved[i] == pytest.approx(own[0]) and solved[i] < threshold


@pytest.mark.parametrize(("options", "message"), [({"length_scale": 0}, "length_scale"), ({"planted": 1.5}, "planted"),
                                                  ({"planted": 0.5}, "11 ids"), ({"stay": 1.0}, "stay"),
                                                  ({"stay": -0.1}, "stay"), ({"topics": 0}, "topics")])
def test_bad_resampling_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        resampled_documents([np.array([1, 2, 3])], 4, vocab=5, **options)


def test_distance_to_a_pool_with_empty_rows_at_the_end():
    """Rows with no token at the end of the matrix (a count whose deepest positions no
    document reached): occupancies are 0 there, the others as counted."""
    import scipy.sparse as sp

    m = sp.csr_array(np.array([[2, 0, 1], [0, 1, 0], [0, 0, 0], [0, 0, 0]]))
    _, occ = _row_totals(m)
    assert occ.tolist() == [3.0, 1.0, 0.0, 0.0]
    assert _distance_to(m[:2], occ[:2], np.sqrt(np.array([0.5, 0.25, 0.25]))).shape == (2,)


def test_rows_held_apart_model_the_same_excess(tmp_path, monkeypatch):
    """The counts and their halves saved (n = 8,192, documents of sixteen times the fortunes'
    lengths) and analysed in three position ranges: the halves' sums are read from the file
    beside the counts (:func:`posstats.counting.window_groups_io.halves_sums`) once, for the
    standout test and the halves' pool shift both; the standout test decides as in one
    process, with the same modelled offsets, and the rank test's edge is the same."""
    import posstats.analysis.budget as budget
    from posstats.analysis.pipeline import analyze_in_ranges
    from posstats.counting.io import save_counts
    from posstats.counting.window_groups_io import save_window_groups

    reads = []

    def counted(*args):
        reads.append(args[1])
        return halves_sums(*args)

    halves_sums = budget.halves_sums
    monkeypatch.setattr(budget, "halves_sums", counted)

    sources, vocab = _fortunes()
    counts, _, groups = resampled_documents(sources, 8192, vocab=vocab, documents=1500, seed=0, length_scale=16)
    save_counts(counts, tmp_path)
    save_window_groups(groups, counts, tmp_path)
    config = AnalysisConfig(held_out="off", encodings=("mds",), dims=(2,), seed=0, exact_limit=4096)
    whole = analyze(counts, config, window_groups=groups).report()
    ranged = analyze_in_ranges(tmp_path, 3, config).report()
    assert len(reads) == 1
    edges = whole["null"]["edge"], ranged["null"]["edge"]
    assert edges[0]["pool_shift"] is True and edges[1]["pool_shift"] is True
    assert edges[1]["noise_top"] == pytest.approx(edges[0]["noise_top"], rel=1e-6)
    here, apart = whole["verdict"]["standout_positions"], ranged["verdict"]["standout_positions"]
    assert here["modelled_offset"]["rows_offset"] > 100
    assert apart["modelled_offset"] == pytest.approx(here["modelled_offset"], rel=1e-9)
    assert apart["count"] == here["count"] == 0 and apart["max_z"] == pytest.approx(here["max_z"], rel=1e-6)


def test_the_cli_above_4096_positions_models_the_documents_excess(tmp_path, data_dir):
    """``posstats count`` + ``posstats analyze`` on the bundled fortunes at 8,192 positions (the
    counter keeps the two halves only): the openings of real text, 0-6, still stand out; the
    null is the halves' edge (no shuffled corpora); and the report's modelled offsets are
    those recomputed from the saved files by dense sums over the halves."""
    import json

    from posstats.cli import main as cli
    from posstats.counting.io import load_counts
    from posstats.counting.window_groups_io import load_window_groups

    counts_dir, out = tmp_path / "counts", tmp_path / "analysis"
    assert cli(["count", "--input", str(data_dir / "fortunes-sample.jsonl"), "--text-column", "text", "--tokenizer",
                str(data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json"), "--positions", "8192",
                "--out", str(counts_dir), "-q"]) == 0
    assert cli(["analyze", "--counts", str(counts_dir), "--out", str(out), "--held-out", "off", "-q"]) == 0
    report = json.loads((out / "report.json").read_text())
    standout = report["verdict"]["standout_positions"]
    assert standout["ranges"] == "0-6" and standout["max_z"] > 50
    assert report["null"]["method"] == "mp" and report["null"]["edge"]["method"] == "halves"
    assert "homogeneity" not in report

    counts = load_counts(counts_dir)
    groups = load_window_groups(counts_dir, counts)
    assert groups.halves_only
    dense = counts.matrix.toarray().astype(np.float64)
    used = np.flatnonzero(dense.sum(axis=1) > 0)
    a, b = (h.toarray()[used].astype(np.float64) for h in groups.halves())
    tau = document_variance(a.sum(axis=0), b.sum(axis=0), a.sum(axis=1), b.sum(axis=1))
    pool = dense[used].sum(axis=0)
    excess = document_excess(tau, pool / pool.sum(), dense[used].sum(axis=1))
    _, sd = null_distance_to_pool(pool / pool.sum(), dense[used].sum(axis=1))
    positive = np.maximum(excess, 0.0)
    assert standout["modelled_offset"]["rows_offset"] == np.count_nonzero(positive)
    assert standout["modelled_offset"]["largest_in_sd"] == pytest.approx((positive / sd).max(), rel=1e-9)
