"""The rank test's edge measured on two independent halves (posstats.estimates.halves_edge)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.stats import binom

from posstats.analysis import AnalysisConfig, analyze
from posstats.cli import main
from posstats.counting.window_groups import WindowGroups
from posstats.estimates.halves_edge import (
    HALVES_EDGE_MARGIN,
    HALVES_MARGIN_ROWS,
    HalvesNoise,
    PoolShiftedNoise,
    halves_edge,
    halves_margin,
    halves_noise_matrix,
    noise_top,
    occupancy_bins,
)
from posstats.estimates.occupancy import halves_pool_shift, sqrt_shrinkage
from posstats.estimates.sampling_variance import sqrt_count_variance
from posstats.geometry.hellinger import sqrt_distributions
from posstats.reports.summary import verdict_items
from posstats.testing import known_corpus, markov_packed_counts


def _top(counts) -> float:
    """Top eigenvalue of ``J S S^T J`` (what the rank test reads at equal occupancy)."""
    s = np.asarray(sqrt_distributions(sp.csr_array(counts)).todense())
    s -= s.mean(axis=0)
    return float(np.linalg.eigvalsh(s @ s.T)[-1])


def test_noise_matrix_columns_carry_the_unbiased_variance_and_rows_missing_a_half_are_zero():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(9))
    a = rng.multinomial(30, p, size=6)
    b = rng.multinomial(30, p, size=6)
    b[4] = 0  # position 4 has no token in the second half (and half the occupancy: a bin of its own)
    full = a + b
    d, both = halves_noise_matrix(a, b, full)
    assert both.tolist() == [True] * 4 + [False, True]
    dense = d.toarray()
    assert not dense[4].any()
    occ = full.sum(axis=1, keepdims=True)
    want = (sqrt_count_variance(full, total=np.broadcast_to(occ, full.shape)) / occ)[both].sum(axis=0)
    np.testing.assert_allclose((dense**2).sum(axis=0), want, rtol=1e-12)
    with pytest.raises(ValueError, match="one shape"):
        halves_noise_matrix(a, b[:5], full)


def test_structure_cancels_between_the_halves():
    """Positions 0-3 carry a strong private block: the data's top eigenvalue is far above the
    noise, the halves' noise matrix does not see it."""
    n, tokens = 128, 2000
    halves = [known_corpus("planted", n, tokens=tokens // 2, seed=s, strength=0.6, sampler="counts").counts.matrix
              for s in (1, 2)]
    full = sp.csr_array(halves[0] + halves[1])
    found = halves_edge(halves[0], halves[1], full)
    assert found.rows == n and found.coverage == 1.0 and found.source == "halves"
    assert _top(full) > 3 * found.noise_top and _top(full) > 2.5 * found.edge
    stationary = [known_corpus("stationary", n, tokens=tokens // 2, seed=s, sampler="counts").counts.matrix
                  for s in (3, 4)]
    alone = halves_edge(stationary[0], stationary[1], sp.csr_array(stationary[0] + stationary[1]))
    assert found.noise_top == pytest.approx(alone.noise_top, rel=0.05)


@pytest.mark.parametrize("kind", ["stationary", "markov"])
def test_the_noise_top_stays_under_the_edge_on_null_corpora(kind):
    """20 null corpora of 256 positions, 2,000 tokens (windows) each, drawn as two independent
    halves: the data's top noise eigenvalue over the halves' one has mean 1.00 and sd about
    1 % here (``bench_mp_edge.py``), so it passes the margin (12.6 % at 256 rows) in none of
    them. With dependent tokens (a stream repeating the previous token half of
    the time) the bulk is 1.96x that of independent tokens and the halves follow it (the
    analytic edge stands 0.83x under it there: bench_mp_edge.py)."""
    above, ratios = 0, []
    for seed in range(20):
        if kind == "markov":
            a, b = (sp.csr_array(markov_packed_counts(256, windows=1000, seed=2 * seed + k, sampler="counts").matrix)
                    for k in (0, 1))
        else:
            a, b = (sp.csr_array(known_corpus("stationary", 256, tokens=1000, seed=2 * seed + k,
                                              sampler="counts").counts.matrix) for k in (0, 1))
        full = sp.csr_array(a + b)
        found = halves_edge(a, b, full)
        top = _top(full)
        ratios.append(top / found.noise_top)
        above += top > found.edge
    assert above == 0
    assert 0.98 <= np.mean(ratios) <= 1.02
    assert found.margin == halves_margin(256) > HALVES_EDGE_MARGIN


def test_the_margin_grows_below_512_rows_as_the_cube_root():
    """10 % from HALVES_MARGIN_ROWS rows on, (512 / rows)^(1/3) times that below: 20 % at 64."""
    assert halves_margin(HALVES_MARGIN_ROWS) == halves_margin(131_072) == HALVES_EDGE_MARGIN == 0.10
    assert halves_margin(64) == pytest.approx(0.20) and halves_margin(256) == pytest.approx(0.1 * 2 ** (1 / 3))
    assert halves_margin(511) > halves_margin(512) and halves_margin(1) == pytest.approx(0.8)
    a, b = (sp.csr_array(known_corpus("stationary", 64, tokens=500, seed=s, sampler="counts").counts.matrix)
            for s in (1, 2))
    assert halves_edge(a, b, sp.csr_array(a + b)).margin == pytest.approx(0.20)  # the rows decide by default
    assert halves_edge(a, b, sp.csr_array(a + b), margin=0.5).margin == 0.5


def test_the_rank_test_alone_holds_its_level_on_short_dependent_documents_at_64_rows():
    """The harshest null measured (:func:`posstats.testing.successor_documents`: truncate
    mode, documents of n/32 to 1.17 n strongly dependent tokens, V = 200) at n = 64, the
    edge on document halves as ``--null mp --reread`` measures it. A fixed 10 % margin let
    the rank test alone reject 29 of 200 such corpora (14.5 %); the growing margin (20 %
    here) rejected none of 200. 60 corpora: at most 3 rejections (more than 3 happen with
    probability 0.003 at a 1 % rate, 0.03 at 2 %; 3 or fewer with probability 0.02 at 14.5 %),
    and each of 8 planted corpora (positions 0-3, 30 %) is still found."""
    from posstats.testing import successor_documents

    def components(planted: float, seed: int) -> int:
        counts, parts, groups = successor_documents(64, planted=planted, seed=seed)
        cfg = AnalysisConfig(null="mp", held_out="off", encodings=("mds",), dims=(2,), seed=seed)
        null = analyze(counts, cfg, parts=parts, window_groups=groups).report()["null"]
        assert null["edge"]["method"] == "halves" and null["edge"]["margin"] == pytest.approx(0.20)
        return int(null["components_above_null"])

    assert sum(components(0.0, seed) > 0 for seed in range(1000, 1060)) <= 3
    assert all(components(0.3, seed) >= 1 for seed in range(2000, 2008))


def test_a_token_split_would_not_keep_the_dependence():
    """The halves must keep a window's tokens together: the same Markov counts split token by
    token (binomial thinning) put the edge 40 % or more under the bulk."""
    rng = np.random.default_rng(5)
    full = sp.csr_array(markov_packed_counts(256, windows=2000, seed=9, sampler="counts").matrix)
    a = full.copy()
    a.data = binom.rvs(full.data.astype(np.int64), 0.5, random_state=rng)
    b = sp.csr_array(full - a)
    assert halves_edge(a, b, full).edge < 0.75 * _top(full)


def test_window_group_halves_are_the_even_and_odd_groups():
    m = sp.csr_array((np.arange(5 * 3 * 4).reshape(15, 4) % 5).astype(np.int64))
    groups = WindowGroups(groups=4, positions=3, matrix=m, windows=8)
    a, b = groups.halves()
    dense = m.toarray()
    np.testing.assert_array_equal(a.toarray(), dense[0:3] + dense[6:9])
    np.testing.assert_array_equal(b.toarray(), dense[3:6] + dense[9:12])
    a, b = groups.halves([2, 0])
    np.testing.assert_array_equal(a.toarray(), (dense[0:3] + dense[6:9])[[2, 0]])


def _analysed(corpus, **options):
    config = AnalysisConfig(null="mp", encodings=("sinusoidal",), held_out="off", **options)
    return analyze(corpus.counts, config, show_progress=False, window_groups=corpus.window_groups).report()


def test_analysis_counts_against_the_halves_edge_of_its_window_groups():
    """``null = mp`` with window groups: the edge is measured on the even and odd groups (its
    threshold is the reported edge), a drift has its components above it and a stationary
    corpus none; ``mp_edge = analytic`` keeps the analytic bound, 1.5x higher here; the
    verdict has no independence caveat for the halves' count."""
    drift = known_corpus("drift", 256, tokens=2000, seed=3, window_groups=16)
    report = _analysed(drift)
    edge = report["null"]["edge"]
    assert edge["method"] == "halves" and edge["source"] == "window groups" and edge["coverage"] == 1.0
    # sequential: the threshold is the edge the first component that did not count met, of
    # the noise off the counted ones; without an outlying noise direction it is the whole
    # noise' edge to within 1 %
    deflated = edge["deflated"]
    assert [d["components_off"] for d in deflated] == list(range(1, report["null"]["components_above_null"] + 1))
    assert report["null"]["threshold"] == pytest.approx(deflated[-1]["edge"])
    assert all(0.99 * edge["edge"] < d["edge"] <= edge["edge"] for d in deflated)
    # the halves' noise on the tested (bias-corrected) scale, the edge on the plug-in scale
    assert edge["margin"] == halves_margin(256) and edge["rows"] == 256
    assert edge["edge"] == pytest.approx((1 + edge["margin"]) * (edge["noise_top"] + edge["shift"]))
    assert report["null"]["eigenvalue_shift"] == pytest.approx(edge["shift"])
    assert report["null"]["components_above_null"] >= 1
    assert not any("as independent" in c for c in report["verdict"]["caveats"])
    assert any("measured on independent halves (window groups), 13% above its top" in sentence
               for _, sentence in verdict_items(report))
    analytic = _analysed(drift, mp_edge="analytic")
    assert analytic["null"]["edge"] == {"method": "analytic"}
    assert analytic["null"]["threshold"] > 1.4 * report["null"]["threshold"]
    stationary = _analysed(known_corpus("stationary", 256, tokens=2000, seed=4, window_groups=16))
    assert stationary["null"]["edge"]["method"] == "halves" and stationary["null"]["components_above_null"] == 0


def test_analysis_keeps_the_analytic_edge_where_the_groups_miss_most_tokens():
    """Falling occupancy (truncated documents, 30 % reach the last position): the short
    documents are in neither window group, so the halves do not show the rows' noise pattern
    and the analytic edge is used, with the reason in the report."""
    corpus = known_corpus("stationary", 128, tokens=2000, seed=1, window_groups=16, occupancy_ratio=0.3)
    edge = _analysed(corpus)["null"]["edge"]
    assert edge["method"] == "analytic" and "in neither half" in edge["halves_not_used"]


def test_analysis_without_halves_says_how_to_get_them():
    """Counts without window groups, the noise floor from a random token split: no halves
    that keep a document's tokens together, so the analytic edge, and the report names the
    options that give them."""
    corpus = known_corpus("stationary", 128, tokens=2000, seed=2)
    edge = _analysed(corpus)["null"]["edge"]
    assert edge["method"] == "analytic" and "--reread, --store or --parts" in edge["halves_not_used"]


def test_occupancy_bins_split_rows_by_log_occupancy_quantiles():
    assert occupancy_bins([5, 5, 5]).tolist() == [0, 0, 0]
    bins = occupancy_bins(np.geomspace(10, 10_000, 64), bins=4)
    assert bins.tolist() == sorted(bins.tolist()) and np.bincount(bins).tolist() == [16, 16, 16, 16]


@pytest.mark.parametrize(("tokens", "ratio"), [(2000, 0.05), (20000, 0.3)])
def test_falling_occupancy_halves_from_parts_follow_the_tested_bulk(tokens, ratio):
    """Truncated documents of falling occupancy (N at position 0, ``ratio`` N at the last),
    the noise floor's parts two independent halves of the documents: the halves' noise,
    corrected and weighted as the tested eigenvalues are, is their bulk's top (data over
    halves 0.994-1.008 on average over 10 corpora a cell, sd 1.0-1.5 %; one factor per
    column instead of per occupancy bin put it 13 % too high), and no component is counted."""
    ratios = []
    for seed in range(3):
        ka, kb = (known_corpus("stationary", 256, tokens=tokens // 2, seed=50 + 2 * seed + k, sampler="counts",
                               occupancy_ratio=ratio).counts for k in (0, 1))
        full = dataclasses.replace(ka, matrix=sp.csr_array(ka.matrix + kb.matrix), windows=ka.windows + kb.windows,
                                   sequences=ka.sequences + kb.sequences, tokens=ka.tokens + kb.tokens, fingerprint="")
        config = AnalysisConfig(null="mp", encodings=("sinusoidal",), held_out="off")
        null = analyze(full, config, parts=[ka, kb], show_progress=False).report()["null"]
        edge = null["edge"]
        assert edge["method"] == "halves" and edge["source"] == "parts" and null["weighting"] == "occupancy"
        assert null["components_above_null"] == 0
        ratios.append((null["tested_eigenvalues"][0] + null["eigenvalue_shift"]) / (edge["noise_top"] + edge["shift"]))
    assert 0.95 <= np.mean(ratios) <= 1.05


def test_pool_shift_is_the_pools_middle_against_the_lower_half():
    """``weights @ shift`` is ``sign(p_A - p_B) (m(N_i; min(p_A, p_B)) - m(N_i; c))`` row by
    row, ``c = (p_A + p_B) / 2`` and ``m(N; q) = sqrt(q) f(N q)`` token by token, to the
    grid's interpolation error (5 % steps in N); a row without tokens gets none, and there
    is no shift at equal occupancy or with an empty half."""
    rng = np.random.default_rng(2)
    occ = np.geomspace(30, 3000, 50)
    occ[7] = 0.0
    a, b = rng.poisson(5, 300).astype(float), rng.poisson(5, 300).astype(float)
    weights, shift = halves_pool_shift(occ, a, b)
    assert weights.shape == (50, shift.shape[0]) and shift.shape[1] == 300 and weights.nnz <= 2 * 50
    rows = weights @ shift
    used = occ > 0
    p_a, p_b = a / a.sum(), b / b.sum()
    want = np.sign(p_a - p_b) * (_shrinkage(np.minimum(p_a, p_b), occ[used]) - _shrinkage((p_a + p_b) / 2, occ[used]))
    assert np.abs(want).max() > 1e-3  # the halves' pools differ enough to be seen
    np.testing.assert_allclose(rows[used], want, atol=1e-3 * np.abs(want).max())
    assert not rows[7].any()
    assert halves_pool_shift(np.full(5, 10.0), a, b) is None
    assert halves_pool_shift(occ, np.zeros(300), b) is None


def _shrinkage(p, n):
    """(len(n), V) ``m(N; p) = sqrt(p) f(N p)``."""
    return np.sqrt(p)[None, :] * sqrt_shrinkage(np.asarray(n, dtype=float)[:, None] * p[None, :])


def test_pool_shift_agrees_with_the_symmetric_difference_to_first_order():
    """Where the halves' pools differ little (every token common in both), the term is
    ``-g(N) (p_A - p_B) / 2`` as the symmetric ``-(m(p_A) - m(p_B)) / 2`` is: the two agree
    to second order in the difference (here to 1 % of the term)."""
    occ = np.geomspace(30, 3000, 40)
    q = np.full(200, 1.0 / 200)
    delta = np.random.default_rng(3).uniform(-0.01, 0.01, 200)
    a, b = q * (1 + delta), q * (1 - delta)
    weights, shift = halves_pool_shift(occ, a * 1e6, b * 1e6)
    rows = weights @ shift
    p_a, p_b = a / a.sum(), b / b.sum()
    symmetric = -(_shrinkage(p_a, occ) - _shrinkage(p_b, occ)) / 2
    np.testing.assert_allclose(rows, symmetric, atol=1e-2 * np.abs(symmetric).max())


def test_pool_shift_of_a_token_one_document_holds_is_the_datas_term_against_a_truth_near_zero():
    """A token held by one document, in half A: ``p_A = 2 c``, ``p_B = 0``. The data's pool
    holds it at ``c`` where its law is about 0, so the data's rows carry ``-(m(N; c) -
    m(N; 0)) = -m(N; c)``, and so does the analogue; the symmetric form gave ``-m(N; 2 c) /
    2``, smaller where ``N c`` is a few tokens (the shrinkage bends there: by a quarter at
    ``N c = 3``)."""
    occ = np.array([100.0, 1000.0, 3000.0])
    c = 1e-3
    a = np.array([2 * c, 0.5 - c, 0.5 - c])
    b = np.array([0.0, 0.5, 0.5])
    weights, shift = halves_pool_shift(occ, a, b)
    rows = (weights @ shift)[:, 0]
    np.testing.assert_allclose(rows, -_shrinkage(np.array([c]), occ)[:, 0], rtol=2e-3)
    symmetric = -_shrinkage(np.array([2 * c]), occ)[:, 0] / 2
    assert abs(symmetric[2]) < 0.8 * abs(rows[2])


def test_pool_shifted_noise_is_the_noise_plus_its_low_rank_term():
    """``D' + Z L``: its products and its top (weighted, corrected) are the dense matrix',
    over a CSR noise and over rows held apart (any object with ``times`` and ``t_times``,
    whose ``runner`` it passes on); a term of the wrong shape is refused."""
    rng, d, w, b, _ = _random_noise(5)
    k = rng.integers(0, 5, 40)
    t = rng.uniform(0, 1, 40)
    z = sp.csr_array((np.concatenate([1 - t, t]), (np.tile(np.arange(40), 2), np.concatenate([k, k + 1]))),
                     shape=(40, 6))
    shift = rng.standard_normal((6, 70)) * 0.1
    dense = d.toarray() + z.toarray() @ shift
    x, y = rng.standard_normal((70, 3)), rng.standard_normal((40, 3))

    class Held:
        shape, runner = d.shape, "the ranges' runner"

        def times(self, v):
            return d @ v

        def t_times(self, v):
            return d.T @ v

    for inner in (d, Held()):
        shifted = PoolShiftedNoise(inner, z, shift)
        np.testing.assert_allclose(shifted.times(x), dense @ x, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(shifted.t_times(y), dense.T @ y, rtol=1e-12, atol=1e-12)
        gram = _weighted_gram(dense, w, b)
        assert noise_top(shifted, w, b) == pytest.approx(np.linalg.eigvalsh(gram)[-1], rel=1e-6)
    assert PoolShiftedNoise(Held(), z, shift).runner == "the ranges' runner"
    assert not hasattr(PoolShiftedNoise(d, z, shift), "runner")
    with pytest.raises(ValueError, match="does not fit"):
        PoolShiftedNoise(d, z, shift[:, :60])
    noise = HalvesNoise(d, 40, 1.0, "parts").pool_shifted(z, shift)
    assert noise.edge(w, b).pool_shift and noise.edge(w, b).to_dict()["pool_shift"] is True
    assert "pool_shift" not in HalvesNoise(d, 40, 1.0, "parts").edge(w, b).to_dict()


def test_the_analysis_shifts_the_halves_only_where_it_removes_the_shrinkage():
    """Falling occupancy with bias-corrected distances: the edge's noise carries the pool
    shift (``null.edge.pool_shift``); plug-in distances (nothing removed) and equal
    occupancy (no shrinkage) leave it out."""
    falling = known_corpus("stationary", 128, tokens=400, seed=3, occupancy_ratio=0.2, window_groups=64,
                           halves_only=True)
    equal = known_corpus("stationary", 128, tokens=400, seed=3, window_groups=64, halves_only=True)
    config = AnalysisConfig(null="mp", encodings=("mds",), dims=(2,), held_out="off")

    def edge(corpus, **options):
        cfg = dataclasses.replace(config, **options)
        return analyze(corpus.counts, cfg, window_groups=corpus.window_groups, show_progress=False).report()[
            "null"]["edge"]

    assert edge(falling)["method"] == "halves" and edge(falling).get("pool_shift") is True
    assert "pool_shift" not in edge(falling, distances="plugin")
    assert "pool_shift" not in edge(equal)


def _weighted_gram(dense: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``W^1/2 H_w (D D^T - diag(b)) H_w^T W^1/2`` densely, ``H_w = I - 1 pi^T`` (``pi = w /
    sum(w)``): the rows centred on their weighted mean, as the rank test centres them."""
    h = np.eye(w.size) - np.outer(np.ones(w.size), w / w.sum())
    return np.sqrt(w)[:, None] * (h @ (dense @ dense.T - np.diag(b)) @ h.T) * np.sqrt(w)[None, :]


def _random_noise(seed: int):
    """A (40, 70) CSR noise matrix ``d``, weights ``w``, diagonal ``b`` and the dense
    ``W^1/2 H_w (D D^T - diag(b)) H_w^T W^1/2`` that :func:`noise_top` takes the top of."""
    rng = np.random.default_rng(seed)
    d = sp.random_array((40, 70), density=0.2, random_state=rng, format="csr")
    w, b = rng.uniform(0.2, 2.0, 40), rng.uniform(0.0, 0.1, 40)
    return rng, d, w, b, _weighted_gram(d.toarray(), w, b)


def test_noise_top_is_the_top_of_the_weighted_corrected_gram():
    _, d, w, b, gram = _random_noise(3)
    assert noise_top(d, w, b) == pytest.approx(np.linalg.eigvalsh(gram)[-1], rel=1e-6)
    j, dense = np.eye(40) - 1 / 40, d.toarray()
    plain = j @ dense @ dense.T @ j
    assert noise_top(d) == pytest.approx(np.linalg.eigvalsh(plain)[-1], rel=1e-6)


def test_deflated_noise_top_is_the_top_of_the_noise_off_the_given_components():
    """``deflate=U``: the top of ``P N P`` (``P = I - U U^T``), never above the whole top."""
    rng, d, w, b, gram = _random_noise(4)
    u = np.linalg.qr(rng.standard_normal((40, 2)))[0]
    p = np.eye(40) - u @ u.T
    assert noise_top(d, w, b, deflate=u) == pytest.approx(np.linalg.eigvalsh(p @ gram @ p)[-1], rel=1e-6)
    assert noise_top(d, w, b, deflate=u[:, :1]) <= noise_top(d, w, b) * (1 + 1e-9)
    dense = d.toarray()
    tiny = dense[:2]  # the dense path below 3 rows deflates too: P N P keeps N's entry (1, 1)
    centred = (np.eye(2) - 0.5) @ tiny @ tiny.T @ (np.eye(2) - 0.5)
    assert noise_top(sp.csr_array(tiny), deflate=np.array([[1.0], [0.0]])) == pytest.approx(centred[1, 1], rel=1e-9)


def _outlier_noise(rng, m=60, vocab=400, outlier=0.0):
    """(m, V) CSR noise: independent entries plus ``outlier`` times one shared direction
    over rows 0-9 (``u``), the halves' mix of document kinds along the structure."""
    u = np.zeros(m)
    u[:10] = 1 / np.sqrt(10)
    dense = rng.normal(0.0, 0.05, (m, vocab)) + outlier * u[:, None] * rng.normal(0.0, 1.0, vocab)[None, :] / 20
    return sp.csr_array(dense), u


def test_the_sequential_edges_project_off_the_counted_components():
    """A second component between the noise bulk and an outlying noise direction along the
    first (the fortunes at 512 rows: docs/calibration.md, "One split is one draw"): the whole
    noise' top hides it, the noise off the first component does not; the edges never rise,
    keep the first's margin and stop at the first component that does not count. Without an
    outlying direction, projecting one component off barely moves the edge."""
    rng = np.random.default_rng(9)
    d, u = _outlier_noise(rng, outlier=4.0)
    noise = HalvesNoise(d, d.shape[0], 1.0, "test")
    first = noise.edge()
    v = np.zeros(d.shape[0])
    v[10:20] = 1 / np.sqrt(10)
    rest = np.linalg.qr(np.column_stack([u, v, rng.standard_normal((d.shape[0], 3))]))[0][:, 2:]
    vectors = np.column_stack([u, v, rest])
    bulk = noise_top(d, deflate=u[:, None]) * (1 + first.margin)
    assert bulk < 0.5 * first.edge  # the outlying direction dominates the whole top
    second = (bulk + first.edge) / 2
    tested = np.array([10 * first.edge, second, 0.5 * bulk, 0.4 * bulk, 0.3 * bulk])
    edges = noise.deflated_edges(tested, vectors, first=first, steps=16)
    assert [e.deflated for e in edges] == [0, 1, 2] and edges[0] == first
    assert edges[1].edge == pytest.approx(bulk, rel=1e-3) and edges[1].edge < second < first.edge
    assert edges[2].edge <= edges[1].edge and all(e.margin == first.margin for e in edges)
    assert edges[1].to_dict()["deflated"] == 1
    assert len(noise.deflated_edges(tested, vectors, first=first, steps=1)) == 2  # at most ``steps``
    assert noise.deflated_edges(tested[1:], vectors, first=first, steps=16) == [first]  # none counts: no deflation
    plain, _ = _outlier_noise(np.random.default_rng(9), outlier=0.0)
    plain_noise = HalvesNoise(plain, plain.shape[0], 1.0, "test")
    whole = plain_noise.edge()
    off = plain_noise.deflated_edges(np.array([10 * whole.edge, 0.0]), vectors, first=whole, steps=16)[1]
    assert 0.9 * whole.edge < off.edge <= whole.edge


def test_noise_top_default_tolerance_is_within_its_stated_share_of_the_top():
    """The default ARPACK tolerance (NOISE_TOP_TOL, 1e-3) on a flat noise bulk (a sparse
    Gaussian matrix, the halves' kind): the Ritz value never above the dense top and within
    0.1 % of it, a tighter tolerance nearer still."""
    from posstats.estimates.halves_edge import NOISE_TOP_TOL

    rng = np.random.default_rng(11)
    d = sp.random_array((600, 900), density=0.05, random_state=rng, format="csr", data_sampler=rng.standard_normal)
    j = np.eye(600) - 1 / 600
    dense = d.toarray()
    top = np.linalg.eigvalsh(j @ dense @ dense.T @ j)[-1]
    loose, tight = noise_top(d), noise_top(d, tol=1e-10)
    assert NOISE_TOP_TOL == 1e-3
    assert loose <= top * (1 + 1e-12) and loose >= top * (1 - NOISE_TOP_TOL)
    assert tight == pytest.approx(top, rel=1e-9)


def test_nearly_equal_weights_reuse_the_unweighted_top_as_an_upper_bound():
    """Weights within 1 % of each other: the weighted top is the unweighted one (solved once
    for a bias) times the largest weight and the centring's ``||H_w||^2``, never under the
    solved weighted top and at most 1 % over it (Ostrowski); wider weights are solved."""
    from posstats.estimates.halves_edge import EQUAL_WEIGHTS, HalvesNoise
    from posstats.estimates.null_rank import congruence_upper_bound

    rng = np.random.default_rng(4)
    d = sp.random_array((60, 90), density=0.2, random_state=rng, format="csr")
    b = rng.uniform(0.0, 0.05, 60)
    noise = HalvesNoise(d, 60, 1.0, "halves")
    near = 1.3 * (1.0 + rng.uniform(0.0, EQUAL_WEIGHTS * 0.9, 60))
    bound = noise.edge(near, b)
    solved = noise_top(d, near, b)
    assert bound.weights_bound == pytest.approx(near.max() / near.min())
    assert solved <= bound.noise_top <= solved * (1.0 + EQUAL_WEIGHTS)
    assert bound.noise_top == pytest.approx(congruence_upper_bound([noise_top(d, None, b)], near)[0], rel=1e-9)
    assert "weights_bound" in bound.to_dict() and len(noise._unweighted) == 1
    wide = rng.uniform(0.5, 2.0, 60)
    found = noise.edge(wide, b)
    assert found.weights_bound is None and found.noise_top == pytest.approx(noise_top(d, wide, b), rel=1e-9)
    assert noise.edge(None, b).noise_top == pytest.approx(noise_top(d, None, b), rel=1e-9)
    assert len(noise._unweighted) == 1  # the same bias: solved once


# ----------------------------------------------------------------------------- the halves a count keeps


def _write_ids(path, docs):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"input_ids": [list(map(int, d)) for d in docs]}), path)


def test_halves_only_counter_puts_every_window_in_the_group_of_its_order_and_round_trips(tmp_path):
    """Truncate mode with the halves only: document t (short or full) goes to group t mod 2
    whole; the groups add up to the counts; the file keeps ``halves_only``; such groups are
    never rotated (the analysis says why), while their halves still give the rank test's edge;
    summing them with groups that are not halves is refused in one line."""
    from posstats.counting.counts import CountAccumulator, CountSpec
    from posstats.counting.window_groups_io import (
        load_window_groups,
        save_window_groups,
        sum_window_group_files,
    )
    from posstats.errors import InputError

    rng = np.random.default_rng(3)
    n, vocab = 10, 7
    docs = [rng.integers(0, vocab, size=rng.integers(1, 16)) for _ in range(9)]
    acc = CountAccumulator(CountSpec(positions=n, vocab_size=vocab, mode="truncate"), dense=False, window_groups=2,
                           window_halves=True)
    acc.add_sequences(docs)
    groups = acc.window_groups()
    counts = acc.result()
    assert groups.halves_only and groups.classes == 0 and groups.groups == 2
    assert groups.windows == sum(len(d) >= n for d in docs)
    expected = np.zeros((2, n, vocab), dtype=np.int64)
    for t, d in enumerate(docs):
        for i, v in enumerate(d[:n]):
            expected[t % 2, i, v] += 1
    even, odd = groups.halves()
    np.testing.assert_array_equal(even.toarray(), expected[0])
    np.testing.assert_array_equal(odd.toarray(), expected[1])
    assert (groups.total() != sp.csr_array(counts.matrix)).nnz == 0

    save_window_groups(groups, counts, tmp_path / "a")
    loaded = load_window_groups(tmp_path / "a", counts)
    assert loaded.halves_only and (loaded.matrix != groups.matrix).nnz == 0
    rotatable = WindowGroups(2, n, sp.csr_array(groups.matrix), groups.windows)
    save_window_groups(rotatable, counts, tmp_path / "b")
    assert not load_window_groups(tmp_path / "b", counts).halves_only
    with pytest.raises(InputError, match="halves_only"):
        sum_window_group_files([(tmp_path / "a", 1), (tmp_path / "b", 1)], counts, tmp_path / "c")

    # auto: no window can be rotated, so no shuffled corpora (liberal where documents differ):
    # the edge measured on the halves, and no homogeneity test
    report = analyze(counts, AnalysisConfig(dims=(2,), encodings=("mds",), held_out="off"),
                     window_groups=groups).report()
    assert report["null"]["method"] == "mp" and "homogeneity" not in report
    # asked for, shuffled corpora say why the windows could not be rotated
    report = analyze(counts, AnalysisConfig(dims=(2,), encodings=("mds",), held_out="off", null="shuffle"),
                     window_groups=groups).report()
    assert "no rotation may turn" in report["homogeneity"]["window_null"]
    assert report["null"]["null_corpora"] == "shuffled"


@pytest.mark.parametrize("mode", ["pack", "truncate"])
def test_count_above_4096_positions_keeps_the_halves_and_analyze_measures_the_edge_on_them(tmp_path, mode):
    """``posstats run`` at 4,100 positions (over the rotation null's 4,096): count keeps the
    two halves only (count.json says so), they add up to the counts, and the rank test's
    edge is measured on them (``null.edge``: halves, window groups), no caveat; in
    truncate mode documents shorter than n are in the halves too (coverage 1)."""
    import json

    from posstats import load_counts
    from posstats.cli import main
    from posstats.counting.window_groups_io import load_window_groups

    rng = np.random.default_rng(5)
    vocab, n = 200, 4100
    z = 1.0 / np.arange(1, vocab + 1) ** 1.1
    z /= z.sum()
    low = 200 if mode == "pack" else n + 1
    docs = [rng.choice(vocab, size=rng.integers(low, 2 * n), p=z) for _ in range(50)]
    _write_ids(tmp_path / "ids.parquet", docs)
    out = tmp_path / "run"
    assert main(["run", "--input", str(tmp_path / "ids.parquet"), "--column", "input_ids", "--vocab-size", str(vocab),
                 "--positions", str(n), "--mode", mode, "--dims", "2", "--encodings", "mds", "--held-out", "off",
                 "--out", str(out)]) == 0
    kept = json.loads((out / "count.json").read_text())["window_groups"]
    assert kept["groups"] == 2 and "the even and the odd of 64" in kept["kept"]
    counts = load_counts(out)
    groups = load_window_groups(out, counts)
    assert groups.halves_only and (groups.total() != sp.csr_array(counts.matrix)).nnz == 0
    a, b = groups.halves()
    assert abs(float(a.sum()) - float(b.sum())) < 0.3 * counts.tokens
    report = json.loads((out / "report.json").read_text())
    edge = report["null"]["edge"]
    assert report["null"]["method"] == "mp" and edge["method"] == "halves" and edge["source"] == "window groups"
    assert edge["coverage"] > (0.97 if mode == "pack" else 0.999)
    assert report["null"]["components_above_null"] == 0  # independent tokens: nothing above the halves' edge
    assert not any("as independent" in c and "upper estimate" in c for c in report["verdict"]["caveats"])


@pytest.mark.parametrize("mode", ["truncate", "pack"])
def test_count_in_steps_above_4096_positions_keeps_the_halves(tmp_path, mode):
    """Counted in steps (the local executor of --store; Ray runs the same steps), three
    shards: in truncate mode each partial keeps its halves and the reduce sums them; in pack
    mode (streams straddle shards: no window groups) the halves are the shards by rank
    parity, placed in their streams. Either way they add up to the counts, count.json says
    only the halves were kept, and a refresh that removes an input keeps them adding up."""
    import json

    from posstats import load_counts
    from posstats.cli import main
    from posstats.counting.window_groups_io import load_window_groups

    rng = np.random.default_rng(6)
    n = 4100
    for name in ("a", "b", "c"):
        _write_ids(tmp_path / f"{name}.parquet", [rng.integers(0, 50, size=rng.integers(10, 2 * n)) for _ in range(7)])
    out = tmp_path / "out"
    assert main(["count", "--input", str(tmp_path / "*.parquet"), "--column", "input_ids", "--vocab-size", "50",
                 "--positions", str(n), "--mode", mode, "--store", str(tmp_path / "store"),
                 "--out", str(out)]) == 0
    kept = json.loads((out / "count.json").read_text())["window_groups"]
    assert kept["groups"] == 2
    assert ("shards of even and of odd rank" if mode == "pack" else "the even and the odd of 64") in kept["kept"]
    for removed in (False, True):
        counts = load_counts(out)
        groups = load_window_groups(out, counts)
        assert groups.halves_only and groups.classes == 0
        assert (groups.total() != sp.csr_array(counts.matrix)).nnz == 0
        a, b = groups.halves()
        assert a.sum() > 0 and b.sum() > 0
        if not removed:
            (tmp_path / "b.parquet").unlink()
            assert main(["refresh", "--store", str(tmp_path / "store"), "--local", "--out", str(out)]) == 0
    if mode == "pack":  # one shard left: no halves, and count.json says why
        (tmp_path / "c.parquet").unlink()
        assert main(["refresh", "--store", str(tmp_path / "store"), "--local", "--out", str(out)]) == 0
        assert "1 shard(s)" in json.loads((out / "count.json").read_text())["window_groups"]["skipped"]
        assert load_window_groups(out, load_counts(out)) is None


@pytest.fixture(scope="module")
def packed_halves(tmp_path_factory):
    """A pack-mode corpus of 4,100 positions counted with its halves: (counts folder, the
    analysis config of the tests below, the one-process report)."""
    from posstats import load_counts
    from posstats.cli import main
    from posstats.counting.window_groups_io import load_window_groups

    tmp = tmp_path_factory.mktemp("packed_halves")
    rng = np.random.default_rng(7)
    vocab, n = 150, 4100
    z = 1.0 / np.arange(1, vocab + 1) ** 1.1
    docs = [rng.choice(vocab, size=rng.integers(300, 2 * n), p=z / z.sum()) for _ in range(40)]
    _write_ids(tmp / "ids.parquet", docs)
    out = tmp / "counts"
    assert main(["count", "--input", str(tmp / "ids.parquet"), "--column", "input_ids", "--vocab-size",
                 str(vocab), "--positions", str(n), "--mode", "pack", "--out", str(out)]) == 0
    config = AnalysisConfig(dims=(2,), encodings=("mds",), held_out="off", exact_limit=1024)
    counts = load_counts(out)
    whole = analyze(counts, config, show_progress=False, window_groups=load_window_groups(out, counts)).report()
    return out, config, whole


def test_a_range_reads_its_rows_of_the_halves_as_the_whole_file_gives_them(packed_halves, tmp_path):
    """``load_halves_rows``: a range's rows of the even and odd halves, contiguous or with
    rows left out (``--min-occupancy``), equal the rows of the halves of the whole file:
    above 4,096 positions (two groups) and below (64 groups summed by parity)."""
    from posstats import load_counts
    from posstats.cli import main
    from posstats.counting.window_groups_io import load_halves_rows, load_window_groups

    rng = np.random.default_rng(3)
    _write_ids(tmp_path / "ids.parquet", [rng.integers(0, 40, size=int(rng.integers(5, 400))) for _ in range(300)])
    small = tmp_path / "counts"
    assert main(["count", "--input", str(tmp_path / "ids.parquet"), "--column", "input_ids", "--vocab-size", "40",
                 "--positions", "32", "--mode", "pack", "--out", str(small), "-q"]) == 0
    for out, cases in ((packed_halves[0], (np.arange(1000, 2100), np.array([3, 4, 90, 4000, 4099]), np.array([17]))),
                       (small, (np.arange(32), np.array([0, 5, 6, 31]), np.arange(10, 20)))):
        counts = load_counts(out)
        groups = load_window_groups(out, counts)
        expected = (counts.positions, counts.vocab_size, counts.tokens, counts.fingerprint)
        even, odd = groups.halves()
        for rows in cases:
            a, b = load_halves_rows(out, rows, expected)
            assert (a != even[rows]).nnz == 0 and (b != odd[rows]).nnz == 0
            assert a.shape == b.shape == (rows.size, counts.vocab_size)
            assert a.has_canonical_format and b.has_canonical_format
    assert groups.groups == 64 and not groups.halves_only  # the small count kept every group


def test_rows_held_apart_measure_the_same_edge_and_budget_for_it(packed_halves):
    """Over position ranges (the analysis of counts too large for one process; here three
    ranges in this process, the code path the Ray actors run) every range builds its rows of
    the halves' noise and the edge is the one-process edge to rounding; the range budget
    counts the ranges' rows of it, unless the analytic edge is asked for."""
    import json

    from posstats.analysis import analyze_in_ranges, budgeted_stored_counts
    from posstats.counting.io import counts_file, load_indptr

    out, config, whole = packed_halves
    ranged = analyze_in_ranges(out, 3, config, show_progress=False).report()
    assert ranged["geometry"]["ranges"] == 3
    one, apart = whole["null"]["edge"], ranged["null"]["edge"]
    assert one["method"] == apart["method"] == "halves" and apart["source"] == "window groups"
    assert apart["noise_top"] == pytest.approx(one["noise_top"], rel=1e-9)
    assert apart["rows"] == one["rows"] and apart["coverage"] == one["coverage"]
    assert ranged["null"]["threshold"] == pytest.approx(whole["null"]["threshold"], rel=1e-9)
    json.dumps(ranged["null"])  # the report stays plain JSON

    stored = int(load_indptr(counts_file(out))[-1])
    assert budgeted_stored_counts(out, stored, config) == stored + -(-stored * 12 // 16)
    analytic = dataclasses.replace(config, mp_edge="analytic")
    assert budgeted_stored_counts(out, stored, analytic) == stored
    assert analyze_in_ranges(out, 3, analytic, show_progress=False).report()["null"]["edge"]["method"] == "analytic"


@pytest.mark.ray
def test_ray_actors_measure_the_edge_on_their_rows_of_the_halves(packed_halves, tmp_path, ray_session):
    """``posstats analyze --ranges 3``: three Ray actors hold the rows and their rows of the
    halves' noise; the edge is the one-process edge."""
    import json

    from posstats.cli import main

    out, _, whole = packed_halves
    assert main(["analyze", "--counts", str(out), "--ranges", "3", "--exact-limit", "1024", "--dims", "2",
                 "--encodings", "mds", "--held-out", "off", "--out", str(tmp_path / "an"), "-q"]) == 0
    report = json.loads((tmp_path / "an" / "report.json").read_text())
    assert report["geometry"]["ranges"] == 3 and report["null"]["edge"]["method"] == "halves"
    assert report["null"]["edge"]["noise_top"] == pytest.approx(whole["null"]["edge"]["noise_top"], rel=1e-9)


def test_the_eigensolve_jobs_edge_says_why_the_halves_were_not_used():
    """The job's ``noise.edge_method``: the halves' edge where usable, else the analytic one
    with the reason the analysis gives (too little of a row's tokens in the halves, fewer
    than two rows in both, no window groups)."""
    from posstats.estimates.halves_edge import HalvesEdge
    from posstats.jobs.eigensolve import NO_WINDOW_GROUPS, _Edges

    good = HalvesEdge(2.0, 0.1, 40, "window groups", coverage=0.95)
    thin = HalvesEdge(2.0, 0.1, 40, "window groups", coverage=0.5)
    empty = HalvesEdge(math.nan, 0.1, 1, "window groups")
    edges = _Edges({False: good, True: thin})
    assert edges.edge(False) == pytest.approx(2.2) and edges.entry(False)["method"] == "halves"
    assert edges.edge(True) is None
    assert edges.entry(True) == {"method": "analytic", "halves_not_used": (
        "the window groups hold 50% of some position's tokens (below 90%: the rest, short windows or documents, "
        "is in neither half)")}
    assert "fewer than two positions" in _Edges({False: empty}).entry(False)["halves_not_used"]
    assert _Edges({}, NO_WINDOW_GROUPS).entry(True) == {"method": "analytic", "halves_not_used": NO_WINDOW_GROUPS}


@pytest.mark.ray
def test_ranged_eigensolve_job_counts_against_the_halves_edge(packed_halves, tmp_path, ray_session):
    """``python -m posstats.jobs.eigensolve --distances corrected``: the actors build their
    rows of the halves' noise and the job counts components against the edge the analysis
    measures on the same rows (its ``null.threshold``), says so in ``noise.edge_method``,
    and sizes a memory budget's ranges for those rows; ``--mp-edge analytic`` keeps the
    analytic edge."""
    import json
    from types import SimpleNamespace

    from posstats.analysis import analyze_in_ranges
    from posstats.counting.io import counts_file, load_indptr
    from posstats.jobs.eigensolve import _range_count, main

    out, config, _ = packed_halves
    ranged = analyze_in_ranges(out, 3, config, show_progress=False).report()
    job = tmp_path / "job"
    assert main(["--counts", str(out), "--out", str(job), "--k", "4", "--ranges", "3", "--distances", "corrected",
                 "--stress-dims", "none"]) == 0
    noise = json.loads((job / "eigensolve.json").read_text())["noise"]
    assert noise["edge_method"]["method"] == "halves" and noise["edge_method"]["source"] == "window groups"
    assert noise["edge"] == pytest.approx(ranged["null"]["threshold"], rel=1e-9)
    assert noise["edge_method"]["noise_top"] == pytest.approx(ranged["null"]["edge"]["noise_top"], rel=1e-9)
    assert noise["components_above_noise"] == ranged["null"]["components_above_null"] == 0  # a stationary stream
    assert noise.get("tested_bound") == ranged["null"].get("tested_bound")  # 7 or 8 windows a position: solved

    analytic = tmp_path / "analytic"
    assert main(["--counts", str(out), "--out", str(analytic), "--k", "4", "--ranges", "3", "--distances",
                 "corrected", "--stress-dims", "none", "--mp-edge", "analytic"]) == 0
    plain = json.loads((analytic / "eigensolve.json").read_text())["noise"]
    assert plain["edge_method"] == {"method": "analytic", "halves_not_used": "--mp-edge analytic"}
    assert plain["edge"] > noise["edge"]  # the analytic edge is an upper estimate of the bulk's top
    assert plain["noise_level"] > noise["noise_level"]  # the Lanczos solve's bulk starts at the edge used

    stored = int(load_indptr(counts_file(out))[-1])
    asked = SimpleNamespace(ranges=1, memory_budget=(256 * 2**20 + 16 * stored / 2) / 2**30, distances="corrected",
                            mp_edge="auto")
    assert _range_count(asked, stored, 1, out) > _range_count(SimpleNamespace(**{**vars(asked), "mp_edge": "analytic"}),
                                                              stored, 1, out)


@pytest.mark.ray
@pytest.mark.parametrize("kind", ["stationary", "planted", "drift"])
def test_the_eigensolve_jobs_default_answers_as_the_analysis_on_known_corpora(kind, tmp_path, ray_session):
    """Known corpora above 4,096 positions with their halves (N = 2,000): the job's default
    (corrected distances over two ranges, the halves' edge) counts the components and
    names the standouts the analysis does, against the same edge; stationary: nothing;
    planted 0-3: exactly those standouts; drift: components above noise."""
    import json

    from posstats.counting.io import save_counts
    from posstats.counting.window_groups_io import save_window_groups
    from posstats.jobs.eigensolve import main
    from posstats.testing import known_corpus

    corpus = known_corpus(kind, 4100, tokens=2000, seed=1, window_groups=2, halves_only=True)
    out = tmp_path / "counts"
    save_counts(corpus.counts, out)
    save_window_groups(corpus.window_groups, corpus.counts, out)
    assert main(["--counts", str(out), "--out", str(tmp_path / "job"), "--k", "8", "--ranges", "2",
                 "--stress-dims", "none"]) == 0
    job = json.loads((tmp_path / "job" / "eigensolve.json").read_text())
    config = AnalysisConfig(dims=(2,), encodings=("mds",), held_out="off", exact_limit=1024)
    report = analyze(corpus.counts, config, show_progress=False, window_groups=corpus.window_groups).report()
    assert job["distances"] == "bias_corrected" and job["noise"]["edge_method"]["method"] == "halves"
    assert job["noise"]["edge"] == pytest.approx(report["null"]["threshold"], rel=1e-9)
    assert job["noise"]["components_above_noise"] == report["null"]["components_above_null"]
    assert job["standout_positions"]["positions"] == report["verdict"]["standout_positions"]["positions"]
    found = job["standout_positions"]["positions"], job["noise"]["components_above_noise"]
    assert {"stationary": lambda: found == ([], 0), "planted": lambda: found[0] == [0, 1, 2, 3],
            "drift": lambda: found[1] >= 1}[kind]()


def test_real_text_packed_over_4096_positions_is_tested_against_its_halves(tmp_path, data_dir):
    """The bundled fortunes (real text, BERT WordPiece) packed into windows of 4,100
    positions: 36 full windows and the stream's short last one. The halves are the even and
    the odd full windows (one window a block): each holds exactly 18 tokens at every position
    (the oracle: one token per full window per position), the short window is in neither,
    and the rank test's edge is measured on them, counting nothing."""
    import json

    from posstats import load_counts
    from posstats.cli import main
    from posstats.counting.window_groups_io import load_window_groups

    out = tmp_path / "run"
    assert main(["run", "--input", str(data_dir / "fortunes-sample.jsonl"), "--text-column", "text",
                 "--tokenizer", str(data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json"),
                 "--positions", "4100", "--mode", "pack", "--dims", "2", "--encodings", "mds", "--held-out", "off",
                 "--out", str(out)]) == 0
    summary = json.loads((out / "count.json").read_text())
    groups = load_window_groups(out, load_counts(out))
    full = summary["window_groups"]["windows"]
    assert groups.halves_only and summary["windows"] == full + 1
    a, b = groups.halves()
    occupancy_a, occupancy_b = (np.asarray(h.sum(axis=1)).ravel() for h in (a, b))
    assert (occupancy_a == (full + 1) // 2).all() and (occupancy_b == full // 2).all()
    edge = json.loads((out / "report.json").read_text())["null"]["edge"]
    assert edge["method"] == "halves" and edge["coverage"] == pytest.approx(full / (full + 1))
    assert json.loads((out / "report.json").read_text())["null"]["components_above_null"] == 0


def test_window_groups_are_kept_while_16_bytes_a_token_fit_the_budget():
    """In one process the K groups (up to 4,096 positions) and the two halves (above) are
    kept while 16 bytes a token fit the memory budget (the halves' cap is the analysis'
    memory, not the count's); past it none, and the reason says how many GiB."""
    from posstats.corpus.inputs import CountInputs
    from posstats.corpus.source import CorpusSource
    from posstats.counting.counts import CountSpec
    from posstats.runs.counts_folder import window_groups_to_count

    def decide(n: int, tokens: int):
        inputs = CountInputs(CorpusSource(inputs=["x.parquet"]), CountSpec(positions=n, vocab_size=50_257),
                             window_groups=64)
        return window_groups_to_count(inputs, tokens=tokens, budget_bytes=4 * 2**30)

    for n in (4096, 131_072):
        assert decide(n, 2**28) == (64, None)  # exactly 4 GiB
        k, why = decide(n, 2**28 + 1)
        assert k == 0 and "4.0 GiB for the window groups" in why and "budget of 4.0 GiB" in why


def test_the_congruence_bound_holds_every_weighted_eigenvalue_and_decides_only_below_the_level():
    """Ostrowski on a centred symmetric indefinite matrix: every eigenvalue of
    ``W^1/2 H_w A H_w^T W^1/2`` (centred on the weighted mean) is at most the bound of its
    unweighted one (``max(w) ||H_w||^2`` times it above 0), and with weights within 1 % within
    ``max/min`` (and the centring's 1e-4) of it
    (a wrong end of the weights, or an unscaled eigenvalue, fails on the negative or positive
    ones). The rank test is decided from the MDS only where the bound of the top Ritz value
    plus its residual is at or below the level, and never for weights 2 % apart."""
    from posstats.estimates.null_rank import (
        EQUAL_WEIGHTS,
        bounded_rank_test,
        congruence_upper_bound,
    )

    rng = np.random.default_rng(11)
    x = rng.standard_normal((50, 50))
    h = np.eye(50) - 1.0 / 50
    a = h @ ((x + x.T) / 2) @ h  # centred, as the rank test's Gram matrices are
    lam, vec = np.linalg.eigh(a)
    lam, vec = lam[::-1], vec[:, ::-1]
    for spread in (0.3 * EQUAL_WEIGHTS, 0.9 * EQUAL_WEIGHTS, 1.0):
        w = 1.0 + rng.uniform(0.0, spread, 50)
        root, h_w = np.sqrt(w), np.eye(50) - np.outer(np.ones(50), w / w.sum())
        weighted = np.linalg.eigvalsh(root[:, None] * (h_w @ a @ h_w.T) * root[None, :])[::-1]
        bound = congruence_upper_bound(lam, w)
        assert np.all(weighted <= bound + 1e-12)
        centring = w.size * np.sum(np.square(w / w.sum()))  # ||H_w||^2
        assert np.all(bound[lam > 0] == pytest.approx(lam[lam > 0] * w.max() * centring, rel=1e-12))
        if spread > EQUAL_WEIGHTS:
            continue  # the bound holds at any weights; the rank test reads it only within 1 %
        assert 1.0 < centring < 1.0 + 1e-4
        assert np.all(np.abs(bound - weighted) <= (w.max() * centring / w.min() - 1.0) * np.abs(lam) + 1e-12)
        assert np.sum(weighted < 0) > 10 and np.sum(weighted > 0) > 10  # both ends were read
        coords = vec * np.sqrt(np.maximum(lam, 0.0))[None, :]
        resid = np.full(lam.size, 1e-3)  # relative to |theta_1|
        reach = (lam[0] + 1e-3 * abs(lam[0])) * w.max() * centring
        values, units, ratio = bounded_rank_test(lam, resid, coords, w, reach * (1 + 1e-9))
        assert ratio == pytest.approx(w.max() / w.min())
        assert values.shape == (16,) and np.allclose(values, bound[:16])
        assert np.allclose(np.abs(units[:, 0]), np.abs(vec[:, 0])) and np.allclose(np.linalg.norm(units, axis=0)[:3], 1)
        assert bounded_rank_test(lam, resid, coords, w, reach * (1 - 1e-6)) is None
    wide = 1.0 + np.linspace(0.0, 0.02, 50)
    assert bounded_rank_test(lam, np.zeros(50), vec, wide, 1e9) is None


def test_pack_like_occupancy_decides_the_rank_test_from_the_mds_as_the_solve_does(monkeypatch):
    """Occupancies within 0.6 % (as in pack mode) on the sampled path with the halves' edge:
    the weighted rank test is bounded from the unweighted MDS (no solve; the report says
    so), above the eigenvalues the weighted solve gives, with the same count (0) and verdict
    on a stationary and a planted corpus; wider occupancies are solved as before."""
    import posstats.analysis.sampled as sampled

    base = dict(dims=(2, 8), encodings=("mds",), held_out="off", exact_limit=300, null="mp",
                monotonicity_exact_limit=300)
    keys = ("components_above_noise", "positions_distinguishable", "non_stationary", "standout_positions")
    for kind in ("stationary", "planted"):
        c = known_corpus(kind, 400, tokens=2000, seed=3, window_groups=2, halves_only=True, occupancy_ratio=0.995)
        bounded = analyze(c.counts, AnalysisConfig(**base), window_groups=c.window_groups).report()
        with monkeypatch.context() as m:
            m.setattr(sampled, "bounded_rank_test", lambda *a, **k: None)
            solved = analyze(c.counts, AnalysisConfig(**base), window_groups=c.window_groups).report()
        nb, ns = bounded["null"], solved["null"]
        assert nb["edge"]["method"] == "halves" and nb["weighting"] == "occupancy"
        assert nb["tested_bound"]["method"] == "ostrowski" and "tested_bound" not in ns
        assert 1.0 < nb["tested_bound"]["weights_ratio"] <= 1.01
        assert nb["threshold"] == ns["threshold"]
        assert nb["tested_eigenvalues"][0] >= ns["tested_eigenvalues"][0]
        assert nb["tested_eigenvalues"][0] + nb["eigenvalue_shift"] <= nb["threshold"]
        assert nb["components_above_null"] == ns["components_above_null"] == 0
        assert {k: bounded["verdict"][k] for k in keys} == {k: solved["verdict"][k] for k in keys}
        said = dict(verdict_items(bounded))["verdict"]
        assert "bounded by the unweighted MDS's, all below it" in said
        assert "bounded" not in dict(verdict_items(solved))["verdict"]
    wide = known_corpus("stationary", 400, tokens=2000, seed=3, window_groups=2, halves_only=True,
                        occupancy_ratio=0.9)
    report = analyze(wide.counts, AnalysisConfig(**base), window_groups=wide.window_groups).report()
    assert report["null"]["weighting"] == "occupancy" and "tested_bound" not in report["null"]
    # equal weights but structure above the edge: the bound cannot decide, the matrix is solved
    drift = known_corpus("drift", 400, tokens=2000, seed=3, window_groups=2, halves_only=True, occupancy_ratio=0.995)
    found = analyze(drift.counts, AnalysisConfig(**base), window_groups=drift.window_groups).report()
    assert "tested_bound" not in found["null"] and found["null"]["components_above_null"] >= 1
    assert found["null"]["tested_eigenvalues"][0] + found["null"]["eigenvalue_shift"] > found["null"]["threshold"]


@pytest.mark.ray
def test_the_eigensolve_job_bounds_the_weighted_test_as_the_analysis_does(tmp_path, ray_session):
    """Occupancies within 0.6 % (as in pack mode), above 4,096 positions with the halves:
    the job, like the analysis, decides the occupancy-weighted rank test from the unweighted
    MDS's bound (``noise.tested_bound``), against the same edge, with the same count."""
    import json

    from posstats.counting.io import save_counts
    from posstats.counting.window_groups_io import save_window_groups
    from posstats.jobs.eigensolve import main

    corpus = known_corpus("stationary", 4100, tokens=2000, seed=2, window_groups=2, halves_only=True,
                          occupancy_ratio=0.995)
    out = tmp_path / "counts"
    save_counts(corpus.counts, out)
    save_window_groups(corpus.window_groups, corpus.counts, out)
    assert main(["--counts", str(out), "--out", str(tmp_path / "job"), "--k", "8", "--ranges", "2",
                 "--stress-dims", "none"]) == 0
    noise = json.loads((tmp_path / "job" / "eigensolve.json").read_text())["noise"]
    config = AnalysisConfig(dims=(2,), encodings=("mds",), held_out="off", exact_limit=1024)
    report = analyze(corpus.counts, config, show_progress=False, window_groups=corpus.window_groups).report()
    assert noise["weighting"] == report["null"]["weighting"] == "occupancy"
    assert noise["tested_bound"]["method"] == report["null"]["tested_bound"]["method"] == "ostrowski"
    assert noise["tested_bound"]["weights_ratio"] == pytest.approx(report["null"]["tested_bound"]["weights_ratio"])
    assert noise["edge"] == pytest.approx(report["null"]["threshold"], rel=1e-9)
    assert noise["components_above_noise"] == report["null"]["components_above_null"] == 0


def test_real_packed_text_bounds_the_weighted_rank_test_through_the_cli(shared_dir, tmp_path, monkeypatch):
    """The shared Shakespeare (about 1.3 M GPT-2 tokens, real text) packed into windows of
    4,100 positions, counted and analysed by the commands a user runs, on the sampled path
    (``--exact-limit 4096``): about 317 windows fill every position but the last window's, so
    the occupancy weights are equal to 1 % and the weighted rank test is bounded from the
    MDS. The oracle is the weighted matrix solved on the same counts: its top is under the
    bound, and the threshold, count (real text packed is stationary: 0) and verdict agree."""
    import json

    import posstats.analysis.sampled as sampled
    from posstats import load_counts
    from posstats.cli import main
    from posstats.counting.window_groups_io import load_window_groups

    counts = tmp_path / "counts"
    assert main(["count", "--input", str(shared_dir / "corpora/shakespeare.md.gz"), "--format", "text", "--tokenizer",
                 "data/tokenizers/gpt2.tokenizer.json", "--positions", "4100", "--mode", "pack",
                 "--out", str(counts)]) == 0
    flags = ["--dims", "2", "--encodings", "mds", "--held-out", "off", "--exact-limit", "4096"]
    assert main(["analyze", "--counts", str(counts), "--out", str(tmp_path / "a"), *flags]) == 0
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    null = report["null"]
    assert null["edge"]["method"] == "halves" and null["weighting"] == "occupancy"
    assert null["tested_bound"]["method"] == "ostrowski" and null["tested_bound"]["weights_ratio"] <= 1.01

    with monkeypatch.context() as m:
        m.setattr(sampled, "bounded_rank_test", lambda *a, **k: None)
        assert main(["analyze", "--counts", str(counts), "--out", str(tmp_path / "b"), *flags]) == 0
    solved = json.loads((tmp_path / "b" / "report.json").read_text())
    assert "tested_bound" not in solved["null"]
    assert solved["null"]["tested_eigenvalues"][0] <= null["tested_eigenvalues"][0]
    assert solved["null"]["threshold"] == null["threshold"]
    assert solved["null"]["components_above_null"] == null["components_above_null"] == 0
    for key in ("components_above_noise", "positions_distinguishable", "non_stationary", "standout_positions"):
        assert solved["verdict"][key] == report["verdict"][key], key
    assert load_window_groups(counts, load_counts(counts)).halves_only


def test_the_cli_counts_the_fortunes_against_the_grown_margin_at_64_positions(tmp_path, data_dir):
    """The bundled fortunes (real text, BERT WordPiece) at n = 64 through ``posstats count``
    and ``analyze --null mp --reread``: the edge stands 20 % above the document halves' top
    (:func:`halves_margin` of 64 rows), the threshold is that edge, and the count is the
    number of tested eigenvalues (shifted to the plug-in scale) above it, recounted here."""
    tokenizer = str(data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json")
    assert main(["count", "--input", str(data_dir / "fortunes-sample.jsonl"), "--text-column", "text",
                 "--tokenizer", tokenizer, "--positions", "64", "--out", str(tmp_path / "c"), "-q"]) == 0
    assert main(["analyze", "--counts", str(tmp_path / "c"), "--dims", "2", "--encodings", "mds", "--held-out", "off",
                 "--null", "mp", "--reread", "--tokenizer", tokenizer, "--out", str(tmp_path / "a"), "-q"]) == 0
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    null, edge = report["null"], report["null"]["edge"]
    assert edge["method"] == "halves" and edge["source"] == "parts" and edge["rows"] == 64
    assert edge["margin"] == pytest.approx(halves_margin(64)) == pytest.approx(0.20)
    assert edge["edge"] == pytest.approx(1.20 * (edge["noise_top"] + edge["shift"]), rel=1e-12)
    # sequential: the j-th component against the edge of the noise off the j - 1 before it
    edges = [edge["edge"]] + [d["edge"] for d in edge.get("deflated", [])]
    assert all(d["edge"] == pytest.approx(1.20 * (d["noise_top"] + edge["shift"]), rel=1e-12)
               for d in edge.get("deflated", []))
    above = 0
    while above < len(null["tested_eigenvalues"]) and (
            null["tested_eigenvalues"][above] + edge["shift"] > edges[min(above, len(edges) - 1)]):
        above += 1
    assert null["threshold"] == pytest.approx(edges[min(above, len(edges) - 1)], rel=1e-12)
    assert null["components_above_null"] == above >= 1
    assert any("20% above its top" in sentence for _, sentence in verdict_items(report))


def test_the_cli_edge_on_real_text_carries_the_pool_shift_a_dense_oracle_gives(tmp_path, data_dir):
    """``posstats count`` + ``analyze --null mp`` on the bundled fortunes at n = 64 (the
    window groups' halves, falling occupancy, corrected distances): the report's
    ``noise_top`` is the top of the dense weighted, corrected Gram matrix of the halves'
    noise (centred on the occupancy-weighted mean) plus the pools' analogue
    ``sign(p_A - p_B) (m(N_i; min(p_A, p_B)) - m(N_i; (p_A + p_B) / 2))``, the shrinkage
    ``m(N; q) = sqrt(q) f(N q)`` computed exactly at every row's occupancy (no grid), the
    bias each row's unbiased sampling variance. Without the term the top is 0.3 % lower,
    100 times the tolerance."""
    tokenizer = str(data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json")
    assert main(["count", "--input", str(data_dir / "fortunes-sample.jsonl"), "--text-column", "text",
                 "--tokenizer", tokenizer, "--positions", "64", "--out", str(tmp_path / "c"), "-q"]) == 0
    assert main(["analyze", "--counts", str(tmp_path / "c"), "--dims", "2", "--encodings", "mds", "--held-out", "off",
                 "--null", "mp", "--out", str(tmp_path / "a"), "-q"]) == 0
    edge = json.loads((tmp_path / "a" / "report.json").read_text())["null"]["edge"]
    assert edge["method"] == "halves" and edge["source"] == "window groups" and edge["pool_shift"] is True

    from posstats import load_counts
    from posstats.counting.window_groups_io import load_window_groups

    counts = load_counts(tmp_path / "c")
    c = sp.csr_array(counts.matrix)
    a, b = (sp.csr_array(h) for h in load_window_groups(tmp_path / "c", counts).halves())
    occ = np.asarray(c.sum(axis=1), dtype=np.float64).ravel()
    noise = halves_noise_matrix(a, b, c)[0].toarray()

    def pool(half):
        return np.asarray(half.sum(axis=0), dtype=np.float64).ravel() / half.sum()

    p_a, p_b = pool(a), pool(b)
    shifted = noise + np.sign(p_a - p_b) * (_shrinkage(np.minimum(p_a, p_b), occ) - _shrinkage((p_a + p_b) / 2, occ))
    bias = np.array([np.sum(sqrt_count_variance(c[[i]].data.astype(np.int64), total=np.full(c[[i]].nnz, occ[i])))
                     / occ[i] for i in range(c.shape[0])])
    w = occ / occ.mean()

    def top(x):
        return float(np.linalg.eigvalsh(_weighted_gram(x, w, bias))[-1])

    assert edge["noise_top"] == pytest.approx(top(shifted), rel=2e-5)
    assert abs(top(noise) / top(shifted) - 1) > 100 * 2e-5
