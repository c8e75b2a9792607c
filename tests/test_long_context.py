"""Long contexts end to end: block-Lanczos MDS against dense eigh (its products on every
backend, the ``xp`` fixture), the analysis path above the exact limit (no n x n matrix,
sampled stress with intervals), buckets, the noise floor and bias-corrected geometry in
the pipeline and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from posstats.analysis import AnalysisConfig, analyze
from posstats.cli import main
from posstats.corpus.shard_store import RunStore
from posstats.corpus.shards import plan_shards
from posstats.corpus.count_step import count_shard
from posstats.corpus.source import CorpusSource
from posstats.corpus.count_step import count_corpus
from posstats.corpus.tokenizer import load_tokenizer
from posstats.counting.counts import CountSpec
from posstats.counting.io import save_counts
from posstats.errors import PosstatsError
from posstats.estimates.occupancy import OccupancyShrinkage
from posstats.estimates.noise import corrected_squared_distances, noise_floor
from posstats.geometry.backend import array_namespace, to_numpy
from posstats.geometry.encodings import make_encoding
from posstats.geometry.hellinger import hellinger, hellinger_sq
from posstats.geometry.sqrt_operator import _SplitSqrt, sqrt_operator
from posstats.geometry.mds import classical_mds
from posstats.geometry.stress import stress_report
from posstats.reports.summary import verdict_items
from posstats.testing import known_corpus, split_counts, synthetic_counts

REPO = Path(__file__).resolve().parents[1]
GPT2 = str(REPO / "data/tokenizers/gpt2.tokenizer.json")


@pytest.fixture(scope="module")
def planted():
    return synthetic_counts(700, 2500, tokens=4000, rank=4, strength=0.4, block_tokens=24, seed=21)


# ----------------------------------------------------------------------------- Lanczos


@pytest.mark.parametrize(("shape", "corrected"), [("n<V", False), ("n<V", True), ("n>V", True)])
def test_lanczos_residuals_are_the_explicit_ones(shape, corrected):
    """The residuals Lanczos reports come from its recurrence (no product): they must equal
    ``||B u - theta u|| / theta_1`` computed from the explicit matrix, here at a loose
    tolerance where they are far from 0, with and without the bias-corrected diagonal.
    (Plug-in with n > V the solver works on the V side, whose Ritz vectors the result does
    not keep; the recurrence is the same one.)"""
    if shape == "n<V":
        c = synthetic_counts(300, 2000, tokens=1500, rank=3, strength=0.3, block_tokens=16, seed=5).counts.matrix
    else:
        c = synthetic_counts(900, 300, tokens=1500, rank=3, strength=0.3, block_tokens=16, seed=6).counts.matrix
    n = c.shape[0]
    bias = np.asarray(c.sum(axis=1)).ravel() ** -1.0 * 0.5 if corrected else None
    lz = classical_mds(c, k=12, method="lanczos", tol=1e-3, block=4, diagonal=bias)
    h = np.eye(n) - 1.0 / n
    b = -0.5 * h @ hellinger_sq(c) @ h
    if corrected:
        b -= h @ np.diag(bias) @ h
    theta = lz.eigenvalues
    u = lz.encoding / np.sqrt(theta)[None, :]
    explicit = np.linalg.norm(b @ u - u * theta[None, :], axis=0) / theta[0]
    assert explicit.max() > 1e-8  # a loose solve: the comparison is not of zeros
    np.testing.assert_allclose(lz.residuals, explicit, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("shape", ["n<V", "n>V"])
def test_lanczos_matches_dense_eigh(xp, shape):
    if shape == "n<V":
        syn = synthetic_counts(600, 3000, tokens=3000, rank=4, strength=0.3, block_tokens=24, seed=1)
    else:
        syn = synthetic_counts(1500, 400, tokens=2000, rank=3, strength=0.3, block_tokens=16, seed=2)
    c = syn.counts.matrix
    dense = classical_mds(c, k=32, method="dense")
    lz = classical_mds(c, k=32, method="lanczos", tol=1e-10, block=8, xp=xp)
    assert lz.method == "lanczos" and lz.residuals.max() <= 1e-10
    np.testing.assert_allclose(lz.eigenvalues, dense.eigenvalues, rtol=0, atol=1e-11 * dense.eigenvalues[0])
    np.testing.assert_allclose(lz.total_variance, dense.total_variance, rtol=1e-12)
    # Leading (separated) components: the same coordinates, signs fixed the same way.
    np.testing.assert_allclose(lz.encoding[:, :3], dense.encoding[:, :3], rtol=0, atol=1e-8)


def test_lanczos_splits_dense_columns_and_keeps_sparse_input_sparse(xp):
    syn = synthetic_counts(300, 20_000, tokens=3000, rank=2, block_tokens=16, seed=4)
    op = _SplitSqrt(syn.counts.matrix, xp=xp, split=True)
    assert 0 < op.heavy_columns < 10_000 and 0 < op.light_nnz < syn.counts.matrix.nnz
    s = np.sqrt(syn.counts.to_dense().matrix / syn.counts.occupancy()[:, None])
    sc = s - s.mean(axis=0)
    x = np.random.default_rng(0).normal(size=(20_000, 5))
    y = np.random.default_rng(1).normal(size=(300, 5))
    sx, sty = op.apply(xp.asarray(x)), op.apply_t(xp.asarray(y))
    assert array_namespace(sx, sty) is xp  # the products run (and stay) on the backend
    np.testing.assert_allclose(to_numpy(sx), sc @ x, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(to_numpy(sty), sc.T @ y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(op.total_variance(), np.sum(sc * sc), rtol=1e-12)


def test_unsplit_operator_shares_the_counts_indices_and_gives_the_same_products(planted):
    """sqrt_operator(split=False): one sparse part in the counts' own pattern (its index
    arrays shared, not copied), the same products, row dots and eigenvalues as the split."""
    c = sp.csr_array(planted.counts.matrix, dtype=np.int32)
    c.indptr = c.indptr.astype(np.int32)
    split, whole = sqrt_operator(c, split=True), sqrt_operator(c)
    assert sqrt_operator(c, split=False).heavy_columns == 0  # the host's default
    assert whole.heavy_columns == 0 and whole.light_nnz == c.nnz and split.heavy_columns > 0
    assert np.shares_memory(whole.rest.indices, c.indices)
    x = np.random.default_rng(0).normal(size=(c.shape[1], 3))
    y = np.random.default_rng(1).normal(size=(c.shape[0], 3))
    np.testing.assert_allclose(whole.apply(x), split.apply(x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(whole.apply_t(y), split.apply_t(y), rtol=1e-12, atol=1e-12)
    i, j = np.arange(0, 100), np.arange(100, 200)
    np.testing.assert_allclose(whole.row_dots(i, j), split.row_dots(i, j), rtol=1e-13)
    a = classical_mds(whole, k=8, method="lanczos", tol=1e-10).eigenvalues
    np.testing.assert_allclose(a, classical_mds(split, k=8, method="lanczos", tol=1e-10).eigenvalues, rtol=1e-9)


def test_lanczos_bias_corrected_operator_matches_dense(xp, planted):
    c = planted.counts.matrix
    b = noise_floor(split_counts(planted.counts, parts=4, seed=0)).bias
    dense = classical_mds(c, k=12, method="dense", diagonal=b)
    lz = classical_mds(c, k=12, method="lanczos", diagonal=b, tol=1e-10, xp=xp)
    np.testing.assert_allclose(lz.eigenvalues, dense.eigenvalues, rtol=0, atol=1e-10 * dense.eigenvalues[0])
    # B_c is the double-centred, unclipped D - b_i - b_j with a zero diagonal
    d2 = hellinger_sq(c) - b[:, None] - b[None, :]
    np.fill_diagonal(d2, 0.0)
    m = d2.shape[0]
    h = np.eye(m) - 1.0 / m
    lam = np.sort(np.linalg.eigvalsh(-0.5 * h @ d2 @ h))[::-1]
    np.testing.assert_allclose(dense.eigenvalues, lam[:12], rtol=0, atol=1e-10 * lam[0])


@pytest.mark.gpu
def test_host_operator_copied_to_the_gpu_gives_the_same_products(cupy, planted):
    """to_device copies the host operator (one sparse part and, built on the device, its
    transpose): the same products and total variance, on the GPU, the host copy intact."""
    c = planted.counts.matrix
    host = sqrt_operator(c)
    gpu = host.to_device(cupy)
    x = np.random.default_rng(0).normal(size=(c.shape[1], 9))
    y = np.random.default_rng(1).normal(size=(c.shape[0], 9))
    sx, sty = gpu.apply(cupy.asarray(x)), gpu.apply_t(cupy.asarray(y))
    assert array_namespace(sx, sty) is cupy
    np.testing.assert_allclose(to_numpy(sx), host.apply(x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(to_numpy(sty), host.apply_t(y), rtol=1e-12, atol=1e-12)
    assert gpu.total_variance() == host.total_variance() and gpu.shape == host.shape
    assert host.row_dots(np.array([0]), np.array([1])).shape == (1,)  # the host operator still works
    with pytest.raises(TypeError, match="host"):
        gpu.to_device(cupy)


def test_lanczos_on_a_dense_input_matches_sparse(xp, planted):
    sparse = classical_mds(planted.counts.matrix, k=16, method="lanczos", tol=1e-10)
    dense = classical_mds(xp.asarray(planted.counts.to_dense().matrix), k=16, method="lanczos", tol=1e-10)
    np.testing.assert_allclose(dense.eigenvalues, sparse.eigenvalues, rtol=1e-12)


def test_hellinger_blocks_of_a_long_context(xp, planted):
    dense = planted.counts.to_dense().matrix
    d = to_numpy(hellinger_sq(xp.asarray(dense), block=256))
    np.testing.assert_allclose(d, hellinger_sq(dense), rtol=0, atol=1e-12)
    assert np.all(np.diag(d) == 0.0)


def test_lanczos_argument_errors(planted):
    with pytest.raises(ValueError, match="needs k"):
        classical_mds(planted.counts.matrix, method="lanczos")
    with pytest.raises(ValueError, match="diagonal"):
        classical_mds(planted.counts.matrix, k=3, method="iterative", diagonal=np.zeros(700))
    with pytest.raises(ValueError, match="zero occupancy"):
        classical_mds(sp.csr_array(np.array([[1, 0, 2], [0, 0, 0], [3, 1, 0], [1, 1, 1]])), k=1, method="lanczos")


# ----------------------------------------------------------------------------- pipeline


@pytest.mark.parametrize(("noise", "distances"), [("off", "plugin"), ("auto", "bias_corrected")])
def test_sampled_path_agrees_with_the_exact_path(planted, noise, distances):
    """Above the exact limit nothing n x n is formed: the sampled stress intervals contain the
    exact values computed below the limit, MDS agrees, and the report says what was done;
    with plug-in distances, and with the default (a noise floor, bias-corrected distances)."""
    base = dict(dims=(2, 8), encodings=("mds", "sinusoidal", "random"), stress_halfwidth=4e-3, corpus_triples=20_000,
                null="none", noise_floor=noise, held_out="off")
    exact = analyze(planted.counts, AnalysisConfig(**base))
    sampled = analyze(planted.counts, AnalysisConfig(exact_limit=300, **base))
    assert sampled.distances is None and sampled.mds.method == "lanczos"
    np.testing.assert_allclose(sampled.mds.eigenvalues[:8], exact.mds.eigenvalues[:8], rtol=1e-8)
    r = sampled.report()
    json.dumps(r.to_dict())  # every value JSON-ready
    assert r["geometry"]["stress_method"] == "sampled" and r["geometry"]["distances"] == distances
    assert r["hellinger"]["method"] == "sampled" and r["diagnostics"]["h1"]["method"] == "sampled_upper_bound"
    assert r["diagnostics"]["a3"]["method"] == "sampled"
    for e_exact, e_s in zip(exact.report()["encodings"], r["encodings"], strict=True):
        assert e_s["stress_method"] == "sampled" and e_exact["stress_method"] == "exact"
        # the pair-sampling intervals (the stress intervals add the corpus' token noise)
        lo, hi = e_s["scaled_stress_pairs_ci95"]
        assert hi - lo <= 2 * 4e-3 + 1e-12
        # 95 % intervals: allow a little slack so 12 intervals do not flake together
        slack = 0.5 * (hi - lo)
        assert lo - slack <= e_exact["scaled_stress"] <= hi + slack
        lo, hi = e_s["stress_pairs_ci95"]
        assert lo - (hi - lo) <= e_exact["stress"] <= hi + (hi - lo)
        if e_s["name"] == "mds":  # fitted: no 95 % interval, the pairs' range decides ties
            assert e_s["scaled_stress_ci95"] == [e_s["scaled_stress"]] * 2
            assert e_s["scaled_stress_tie_range"] == e_s["scaled_stress_pairs_ci95"]
        if e_s["dim"] <= 8:
            assert e_s["min_separation_method"] == "exact"
            np.testing.assert_allclose(e_s["min_separation"], e_exact["min_separation"], rtol=1e-6)
    assert r["diagnostics"]["h1"]["min_distance"] >= exact.report()["diagnostics"]["h1"]["min_distance"]


def test_untested_geometry_is_descriptive_and_the_tested_one_is_not():
    """Sampled path with the analytic null (no homogeneity test): when the standout test
    finds no position, no test can find structure and the verdict ties every encoding
    whatever the geometry, so the stresses are drawn to ``untested_stress_halfwidth`` and
    the noise bulk to ``untested_lanczos_noise_share`` (the report says so and why); a
    corpus with standouts gets the full accuracy; the verdict is the one the full accuracy
    gives."""
    base = dict(dims=(2, 8), encodings=("mds", "sinusoidal"), held_out="off", exact_limit=300, null="mp",
                monotonicity_exact_limit=300)
    stationary = known_corpus("stationary", 400, tokens=2000, seed=3).counts
    fast = analyze(stationary, AnalysisConfig(**base)).report()
    untested = fast["geometry"]["untested"]
    assert untested["reason"].startswith("no standout position") and untested["stress_halfwidth"] == 5e-3
    edge = fast["null"]["threshold"]
    assert fast["spectrum"]["noise_residual"] == pytest.approx(0.03 * edge, rel=1e-12)
    for e in fast["encodings"]:
        lo, hi = e["scaled_stress_pairs_ci95"]
        assert hi - lo <= 2 * 5e-3 and e["stress_pairs"] < 400_000  # the initial 200,000 pairs suffice
    full = analyze(stationary, AnalysisConfig(untested_stress_halfwidth=1e-3, untested_lanczos_noise_share=1e-3,
                                              untested_triples=200_000, **base)).report()
    assert full["spectrum"]["noise_residual"] == pytest.approx(1e-3 * edge, rel=1e-12)
    assert full["encodings"][0]["stress_pairs"] > 2 * fast["encodings"][0]["stress_pairs"]
    for key in ("components_above_noise", "positions_distinguishable", "non_stationary", "standout_positions"):
        assert fast["verdict"][key] == full["verdict"][key], key
    assert all(row["tied_with"] for row in fast["verdict"]["best_encodings"])  # every encoding tied
    said = dict(verdict_items(fast))["accuracy"]  # the summary, markdown and HTML say why and how far
    assert said.startswith("descriptive: no standout position") and "+-0.005" in said and "0.03 of the analytic edge" in said
    assert (untested["corpus_triples"], untested["encoding_triples"]) == (40_000, 40_000)
    assert "from 40,000 (corpus) and 40,000 (each encoding) sampled triples" in said
    a3, full_a3 = fast["diagnostics"]["a3"], full["diagnostics"]["a3"]
    assert (a3["method"], a3["triples"], full_a3["triples"]) == ("sampled", 40_000, 200_000)
    assert a3["ci_high"] - a3["ci_low"] <= 2 * 5e-3  # descriptive, as the stresses
    assert abs(a3["rate"] - full_a3["rate"]) <= a3["ci_high"] - a3["ci_low"]
    for a, b in zip(fast["encodings"], full["encodings"], strict=True):  # each encoding's, sampled above 300 rows
        (lo, hi), (full_lo, full_hi) = a["monotonicity_ci95"], b["monotonicity_ci95"]
        assert 2 * 2.2e-3 < hi - lo <= 2 * 5e-3 and full_hi - full_lo <= 2 * 2.2e-3, a["name"]
    for a, b in zip(fast["encodings"], full["encodings"], strict=True):  # the same stresses within both ranges
        assert abs(a["scaled_stress"] - b["scaled_stress"]) <= 5e-3 + 1e-3

    for key in ("lanczos_noise_share", "untested_lanczos_noise_share"):  # refused when the config is made
        with pytest.raises(PosstatsError, match=f"{key.replace('_', ' ')} must be a number in \\[0, 1\\), got -1"):
            AnalysisConfig(**{key: -1.0})
    planted = known_corpus("planted", 400, tokens=2000, seed=3).counts
    tested = analyze(planted, AnalysisConfig(**base)).report()
    assert "untested" not in tested["geometry"] and tested["verdict"]["standout_positions"]["count"] == 4
    assert "accuracy" not in dict(verdict_items(tested))
    assert tested["spectrum"]["noise_residual"] == pytest.approx(1e-3 * tested["null"]["threshold"], rel=1e-12)
    lo, hi = tested["encodings"][0]["scaled_stress_pairs_ci95"]
    assert hi - lo <= 2 * 1e-3


def test_the_bulk_residual_is_a_share_of_the_analytic_edge_whichever_edge_is_read():
    """The MDS noise bulk's residual is the share of the analytic edge (the scale the
    shares were measured on) also where the rank test reads the lower edge measured on the
    corpus' halves; the level it decides against is the halves' edge. The same corpus
    read against its analytic edge gives the same residual and that edge as its threshold."""
    base = dict(dims=(2, 8), encodings=("mds",), held_out="off", exact_limit=300, null="mp",
                monotonicity_exact_limit=300)
    corpus = known_corpus("stationary", 400, tokens=2000, seed=3, window_groups=2, halves_only=True)
    halves = analyze(corpus.counts, AnalysisConfig(**base), window_groups=corpus.window_groups).report()
    analytic = analyze(corpus.counts, AnalysisConfig(mp_edge="analytic", **base),
                       window_groups=corpus.window_groups).report()
    assert halves["null"]["edge"]["method"] == "halves" and "untested" in halves["geometry"]
    assert halves["null"]["threshold"] < 0.9 * analytic["null"]["threshold"]  # the halves' edge is the lower
    share = AnalysisConfig().untested_lanczos_noise_share
    assert analytic["spectrum"]["noise_residual"] == pytest.approx(share * analytic["null"]["threshold"], rel=1e-12)
    assert halves["spectrum"]["noise_residual"] == pytest.approx(analytic["spectrum"]["noise_residual"], rel=1e-12)
    shift = halves["null"]["eigenvalue_shift"]
    assert halves["spectrum"]["noise_level"] == pytest.approx(halves["null"]["threshold"] - shift, rel=1e-9)


def test_device_option_is_checked_before_any_work(monkeypatch, planted):
    """device: auto falls back to the host without a GPU; gpu without one is refused as the
    analysis starts (not after the noise floor; a config naming gpu may be made on a
    pipeline driver without one); unknown names when the config is made."""
    import posstats.analysis.pipeline as pipeline
    import posstats.analysis.sampled as sampled

    monkeypatch.setattr(sampled, "gpu_available", lambda: False)
    assert sampled.mds_device("auto") is None and sampled.mds_device("cpu") is None
    config = AnalysisConfig(device="gpu")
    monkeypatch.setattr(pipeline, "_geometry_rows", lambda *a: pytest.fail("work started"))
    with pytest.raises(PosstatsError, match="device gpu: .*(no CUDA device|not installed)"):
        analyze(planted.counts, config)
    with pytest.raises(PosstatsError, match="unknown device 'tpu'"):
        AnalysisConfig(device="tpu")
    assert "device" not in config.to_dict()  # where the products ran is not part of the result


@pytest.mark.gpu
def test_sampled_path_on_the_gpu_equals_the_host(cupy, planted):
    """device=gpu moves only the Lanczos products: the same eigenvalues (to rounding), the
    same encodings and verdict; the report says where the MDS ran."""
    base = dict(dims=(2, 8), encodings=("mds", "sinusoidal"), stress_halfwidth=4e-3, corpus_triples=20_000,
                exact_limit=300, held_out="off")
    host = analyze(planted.counts, AnalysisConfig(device="cpu", **base))
    gpu = analyze(planted.counts, AnalysisConfig(device="gpu", **base))
    assert host.mds.device == "cpu" and gpu.mds.device == "gpu"
    np.testing.assert_allclose(gpu.mds.eigenvalues, host.mds.eigenvalues, rtol=1e-9)
    np.testing.assert_allclose(np.abs(gpu.mds.encoding[:, :4]), np.abs(host.mds.encoding[:, :4]), atol=1e-7)
    rh, rg = host.report(), gpu.report()
    assert rg["spectrum"]["device"] == "gpu" and rh["spectrum"]["device"] == "cpu"
    vh, vg = rh["verdict"], rg["verdict"]
    for key in ("components_above_noise", "positions_distinguishable", "non_stationary", "standout_positions"):
        assert vg[key] == vh[key], key
    assert [b["best"] for b in vg["best_encodings"]] == [b["best"] for b in vh["best_encodings"]]


def test_bias_corrected_pipeline_uses_the_corrected_matrix(planted):
    parts = split_counts(planted.counts, parts=4, seed=5)
    # the null and the held-out scores are beside the point here (they cost a minute at 700 rows)
    cfg = AnalysisConfig(dims=(2,), encodings=("mds", "sinusoidal"), noise_floor=True, distances="corrected",
                         null="none", held_out="off")
    a = analyze(planted.counts, cfg, parts=parts)
    nf = noise_floor(parts)
    # the square roots' occupancy shrinkage removed first (posstats.estimates.occupancy)
    d2 = hellinger_sq(planted.counts.matrix) + OccupancyShrinkage.of(planted.counts.matrix).adjustment(planted.counts.matrix)
    expected = np.sqrt(corrected_squared_distances(d2, nf.bias))
    np.testing.assert_allclose(a.distances, expected, rtol=1e-12, atol=1e-15)
    r = a.report()
    assert r["geometry"]["distances"] == "bias_corrected"
    assert r["hellinger"]["corrected_mean"] < r["hellinger"]["mean"]
    sin = next(e for e in r["encodings"] if e["name"] == "sinusoidal")
    exact = stress_report(make_encoding("sinusoidal", np.arange(700), 2).matrix, expected)
    np.testing.assert_allclose(sin["scaled_stress"], exact.scaled_stress, rtol=1e-12)
    assert r["noise"]["method"] == "unbiased-variance" and len(r["noise"]["split_half_d_h_per_position"]) == 700
    assert r["noise"]["source"] == "parts"
    with pytest.raises(PosstatsError, match="noise floor"):
        AnalysisConfig(distances="corrected", noise_floor="off")
    # without parts: the counted tokens are split at random
    r = analyze(planted.counts, AnalysisConfig(dims=(2,), encodings=("mds",), noise_floor=True, null="none",
                                               held_out="off")).report()
    assert r["noise"]["source"] == "token split" and r["geometry"]["distances"] == "bias_corrected"


def test_buckets_in_the_pipeline(planted):
    a = analyze(planted.counts, AnalysisConfig(dims=(2,), encodings=("mds", "sinusoidal"), buckets="fixed:10", null="none",
                                               noise_floor="off"))
    r = a.report()
    assert r["buckets"]["buckets"] == 70 and r["positions"]["used"] == 70
    np.testing.assert_array_equal(a.positions, np.arange(70) * 10 + 4)
    assert len(r["positions"]["occupancy"]) == 700  # occupancy stays per position
    pooled = planted.counts.to_dense().matrix.reshape(70, 10, -1).sum(axis=1)
    np.testing.assert_allclose(a.distances, hellinger(pooled), rtol=1e-12, atol=1e-15)


def test_null_rank_in_the_report(planted):
    r = analyze(planted.counts, AnalysisConfig(dims=(2,), encodings=("mds",), held_out="off")).report()
    assert r["null"]["method"] == "shuffle" and r["null"]["replicates"] == 39 and r["null"]["level"] == 0.025
    assert r["spectrum"]["components_above_null"] == 4


def test_cli_noise_floor_buckets_and_sampled_stress(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    counts = tmp_path / "counts"
    assert main(["count", "--input", "data/fortunes-sample.jsonl", "--text-column", "text", "--tokenizer", GPT2,
                 "--positions", "48", "--out", str(counts)]) == 0
    out = tmp_path / "an"
    rc = main(["analyze", "--counts", str(counts), "--dims", "2,4", "--encodings", "mds,sinusoidal",
               "--noise-floor", "--distances", "corrected", "--buckets", "fixed:2", "--exact-limit", "16",
               "--stress-halfwidth", "0.01", "--null", "mp", "--out", str(out)])
    assert rc == 0
    r = json.loads((out / "report.json").read_text())
    assert r["geometry"] == {**r["geometry"], "distances": "bias_corrected", "stress_method": "sampled", "rows": 24}
    assert r["config"]["buckets"] == "fixed:2" and r["null"]["method"] == "mp"
    assert all(e["stress_method"] == "sampled" and len(e["scaled_stress_ci95"]) == 2 for e in r["encodings"])
    assert r["noise"]["parts"] == 4 and len(r["noise"]["positions"]) == 24
    assert r["positions"]["occupancy_summary"]["max"] == 3000
    # stress intervals on the sampled path of a real corpus: none for the fitted encoding (its
    # pairs' range decides ties), the token-noise jackknife or a stated reason for the fixed one,
    # judged by the pairs' noise share, which the report carries
    share = r["null"]["distance_noise"]["share"]
    assert r["null"]["distance_noise"]["method"].startswith("pairs") and share > 0
    for e in r["encodings"]:
        how = e["stress_interval"]
        assert e["scaled_stress_pairs_ci95"][0] < e["scaled_stress_pairs_ci95"][1]
        if e["name"] == "mds":
            assert how.startswith("none: a fitted encoding") and e["scaled_stress_ci95"] == [e["scaled_stress"]] * 2
        elif share >= 0.1:
            assert how.startswith("none: sampling noise alone gives") and "scaled_stress_tie_range" in e
        else:
            assert how.startswith(("jackknife, 10 random token groups, on", "none: the jackknife's bias")), how


def test_cli_store_gives_parts_and_refuses_the_withdrawn_bootstrap(tmp_path, monkeypatch, capsys):
    """posstats analyze --store: the run store's shards are the noise-floor parts (by rank
    parity); --bootstrap (withdrawn: its intervals did not cover) is refused in one line
    that says why, before anything is written."""
    monkeypatch.chdir(REPO)
    source = CorpusSource(inputs=(str(REPO / "data/fortunes-sample.jsonl"),), text_column="text", tokenizer=GPT2)
    spec = CountSpec(24, 50257, "truncate", (50256,))
    shards = plan_shards(source, spec, shard_bytes=60_000)
    store = RunStore(tmp_path / "store")
    store.bind({"spec": spec.to_metadata()})
    tok = load_tokenizer(GPT2)
    for s in shards:
        store.write_partial(s, count_shard(s, source, spec, tokenizer=tok))
    store.publish({"shard_ids": sorted(s.shard_id for s in shards), "fingerprint": ""})
    save_counts(count_corpus(source, spec), tmp_path / "counts")
    out = tmp_path / "an"
    args = ["analyze", "--counts", str(tmp_path / "counts"), "--store", str(store.root), "--dims", "2",
            "--encodings", "mds,sinusoidal", "--noise-floor", "--out", str(out)]
    assert main([*args, "--bootstrap", "8"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--bootstrap 8: the shard bootstrap was withdrawn" in err[0] and "0 of 1,020" in err[0]
    assert not out.exists()
    assert main(args) == 0
    r = json.loads((out / "report.json").read_text())
    assert r["noise"]["parts"] == 4 and len(shards) >= 8 and "bootstrap" not in r
    with pytest.raises(PosstatsError, match="shard bootstrap was withdrawn"):  # the API refuses it too
        AnalysisConfig(bootstrap=8)


def test_cli_bad_long_context_options(tmp_path, capsys):
    rc = main(["analyze", "--counts", str(tmp_path), "--distances", "corrected", "--noise-floor", "off",
               "--out", str(tmp_path / "o")])
    assert rc == 2 and "noise floor" in capsys.readouterr().err
    rc = main(["analyze", "--counts", str(tmp_path), "--buckets", "cubic:2", "--out", str(tmp_path / "o")])
    assert rc == 2 and "bucketing" in capsys.readouterr().err
