"""Tests for posstats.geometry.mds: classical MDS = PCA of square-root distributions (THEORY.md section 3).

Dense inputs run on every backend (the ``xp`` fixture); results are host arrays whatever
the input's device. scipy.sparse inputs are host-only.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from posstats.geometry import products as products_module
from posstats.geometry import sqrt_operator as sqrt_module
from posstats.geometry.hellinger import hellinger_sq
from posstats.geometry.lanczos import block_lanczos
from posstats.geometry.mds import MDSResult, classical_mds
from posstats.geometry.spectrum import Spectrum, spectrum_summary


def centred_sqrt(counts: np.ndarray) -> np.ndarray:
    c = np.asarray(counts, dtype=np.float64)
    s = np.sqrt(c / c.sum(axis=1, keepdims=True))
    return s - s.mean(axis=0)


def oracle_b(counts: np.ndarray) -> np.ndarray:
    """B = -1/2 H D H from the brute-force difference-form distances."""
    sc = centred_sqrt(counts)
    return sc @ sc.T


def pairwise_sq(p: np.ndarray) -> np.ndarray:
    diff = p[:, None, :] - p[None, :, :]
    return np.sum(diff * diff, axis=2)


def positional_corpus(n: int, v: int, *, seed: int, topics: int = 12, tokens: int = 3000) -> np.ndarray:
    """Seeded counts: topic distributions whose weights drift with position, sampled.

    A few strong planted directions over a sampling-noise bulk: a spectrum without
    repeated eigenvalues, as in a real corpus.
    """
    rng = np.random.default_rng(seed)
    base = 1.0 / (np.arange(v) + 2.7) ** 1.1
    comps = [base / base.sum()]
    for _ in range(topics):
        p = np.zeros(v)
        support = rng.choice(v, size=v // 5, replace=False)
        p[support] = rng.dirichlet(np.full(support.size, 0.3))
        comps.append(p)
    comps = np.array(comps)
    t = np.arange(n) / n
    centres = rng.uniform(0, 1, topics)
    w = np.exp(-0.5 * ((t[:, None] - centres[None, :]) / 0.15) ** 2) * rng.uniform(0.5, 2.0, topics)
    w = np.concatenate([np.ones((n, 1)), w], axis=1)
    mu = (w / w.sum(axis=1, keepdims=True)) @ comps
    occ = rng.integers(tokens // 2, tokens, size=n)
    counts = np.stack([rng.multinomial(o, p / p.sum()) for o, p in zip(occ, mu, strict=True)])
    return counts


def planted_rank(k: int, *, n: int, width: int, seed: int) -> np.ndarray:
    """Positions draw from k + 1 distributions with disjoint supports (block b(i) = i mod k+1).

    Each row of S is then one of k + 1 orthonormal vectors, so rank(S_c) = rank(B) = k exactly.
    """
    rng = np.random.default_rng(seed)
    blocks = k + 1
    c = np.zeros((n, blocks * width), dtype=np.int64)
    base = rng.integers(1, 20, size=(blocks, width))
    for i in range(n):
        b = i % blocks
        c[i, b * width : (b + 1) * width] = base[b] * (1 + i % 3)  # same distribution, other occupancy
    return c


@st.composite
def count_matrices(draw, max_n: int = 7, max_v: int = 6) -> np.ndarray:
    n = draw(st.integers(2, max_n))
    v = draw(st.integers(1, max_v))
    c = draw(hnp.arrays(np.int64, (n, v), elements=st.integers(0, 25)))
    c[c.sum(axis=1) == 0, draw(st.integers(0, v - 1))] = 1
    return c


@settings(max_examples=50, deadline=None)
@given(c=count_matrices())
def test_eigenvalues_are_squared_singular_values(xp, c):
    r = classical_mds(xp.asarray(c), method="dense")
    assert isinstance(r.eigenvalues, np.ndarray) and isinstance(r.encoding, np.ndarray)  # host results
    n = c.shape[0]
    sv = np.linalg.svd(centred_sqrt(c), compute_uv=False)
    expected = np.zeros(n)
    expected[: sv.size] = sv**2
    np.testing.assert_allclose(r.eigenvalues, np.sort(expected)[::-1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(r.total_variance, np.sum(sv**2), rtol=1e-12, atol=1e-14)
    assert r.eigenvalues.shape == (n,) and r.encoding.shape == (n, n)
    assert np.all(np.diff(r.eigenvalues) <= 0)


@settings(max_examples=50, deadline=None)
@given(c=count_matrices())
def test_full_rank_reproduces_b_and_distances(xp, c):
    r = classical_mds(xp.asarray(c), method="dense")
    # P P^T = B (negative eigenvalues are rounding-sized and clipped) ...
    np.testing.assert_allclose(r.encoding @ r.encoding.T, oracle_b(c), rtol=0, atol=1e-12)
    # ... so the encoding's pairwise distances are the Hellinger distances: zero stress.
    np.testing.assert_allclose(pairwise_sq(r.encoding), hellinger_sq(c), rtol=0, atol=1e-12)
    assert r.negative_mass < 1e-12
    np.testing.assert_allclose(r.residuals, 0.0, rtol=0, atol=1e-12)


def test_full_rank_zero_stress_medium():
    c = positional_corpus(80, 300, seed=1)
    r = classical_mds(sp.csr_array(c), method="dense")
    d = hellinger_sq(c)
    e = pairwise_sq(r.encoding)
    np.testing.assert_allclose(e, d, rtol=0, atol=1e-12)
    iu = np.triu_indices(80, 1)
    stress = np.sum((np.sqrt(e[iu]) - np.sqrt(d[iu])) ** 2) / np.sum(d[iu])
    assert stress < 1e-20


@pytest.fixture(scope="module")
def corpus_300() -> np.ndarray:
    return positional_corpus(300, 2000, seed=7)


@pytest.fixture(scope="module")
def dense_300(corpus_300) -> MDSResult:
    return classical_mds(corpus_300, k=16, method="dense")


def check_iterative_matches_dense(x, corpus_300: np.ndarray, dense_300: MDSResult) -> None:
    it = classical_mds(x, k=16, method="iterative", seed=3)
    assert it.method == "iterative" and dense_300.method == "dense"
    lam = dense_300.eigenvalues
    assert np.min(-np.diff(lam) / lam[1:]) > 1e-4  # non-degenerate top-16
    np.testing.assert_allclose(it.eigenvalues, lam, rtol=1e-8, atol=0)
    # Same sign convention, so the leading (well-separated) directions agree too.
    np.testing.assert_allclose(it.encoding[:, :4], dense_300.encoding[:, :4], rtol=0, atol=1e-7)
    np.testing.assert_allclose(it.total_variance, dense_300.total_variance, rtol=1e-12)
    np.testing.assert_allclose(it.total_variance, np.sum(centred_sqrt(corpus_300) ** 2), rtol=1e-12)
    assert np.all(it.residuals < 1e-9)
    assert it.negative_mass == 0.0


def test_iterative_matches_dense(xp, corpus_300, dense_300):
    check_iterative_matches_dense(xp.asarray(corpus_300), corpus_300, dense_300)


def test_iterative_matches_dense_sparse(corpus_300, dense_300):
    check_iterative_matches_dense(sp.csr_array(corpus_300), corpus_300, dense_300)


@pytest.mark.parametrize("threads", [2, 3, 7])
def test_row_blocks_product_equals_csr(threads, monkeypatch):
    # Row blocks of equal nnz (empty rows included) give the same product, vector or block.
    monkeypatch.setattr(products_module, "_THREADED_NNZ", 1)
    rng = np.random.default_rng(threads)
    m = sp.random_array((40, 30), density=0.2, rng=rng, format="csr")
    m = sp.csr_array(m.toarray() * (rng.random((40, 1)) > 0.3))  # some empty rows
    blocks = products_module._RowBlocks(m, threads=threads)
    assert len(blocks.blocks) == min(threads, m.shape[0])
    assert sum(b.shape[0] for b in blocks.blocks) == 40
    for x in (rng.random(30), rng.random((30, 5))):
        np.testing.assert_array_equal(blocks @ x, m @ x)


@pytest.mark.parametrize("threads", [2, 3])
def test_operator_row_blocks_are_views_and_multiply_like_the_whole(threads, monkeypatch):
    """The square-root operator's row blocks share its arrays (scipy's constructor copied any
    block under half the entries: +2.9 GB at 1 B tokens) and multiply like the whole."""
    monkeypatch.setattr(products_module, "_THREADED_NNZ", 1)
    rng = np.random.default_rng(threads)
    counts = sp.csr_array(rng.poisson(0.4, size=(60, 25)) * (rng.random((60, 1)) > 0.2))
    counts = counts[np.flatnonzero(counts.sum(axis=1) > 0)]
    op = sqrt_module._SplitSqrt(counts, split=False)
    blocks = products_module._row_block_views(op.rest, threads)
    assert len(blocks) == threads and any(blk.nnz < op.rest.nnz / 2 for *_, blk in blocks)
    for a, b, blk in blocks:
        assert np.shares_memory(blk.data, op.rest.data) and np.shares_memory(blk.indices, op.rest.indices)
        np.testing.assert_array_equal(blk.toarray(), op.rest[a:b].toarray())
    x, y = rng.random((25, 4)), rng.random((counts.shape[0], 4))
    op._blocks, op._blocks_t = blocks, products_module._transposed_views(blocks)
    for (a, b, blk), (_, _, t) in zip(blocks, op._blocks_t, strict=True):  # transposes are views too
        assert np.shares_memory(t.data, blk.data) and t.shape == (25, b - a)
    whole = sqrt_module._SplitSqrt(counts, split=False)
    whole._blocks = products_module._row_block_views(whole.rest, 1)
    whole._blocks_t = products_module._transposed_views(whole._blocks)
    assert len(whole._blocks) == 1
    np.testing.assert_allclose(op.apply(x), whole.apply(x), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(op.apply_t(y), whole.apply_t(y), rtol=1e-13, atol=1e-15)
    dense_c = np.sqrt(counts.toarray() / counts.sum(axis=1)[:, None])
    dense_c -= dense_c.mean(axis=0)
    np.testing.assert_allclose(whole.apply(x), dense_c @ x, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(whole.apply_t(y), dense_c.T @ y, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("threads", [1, 2])
def test_wide_products_run_in_column_chunks_with_the_same_result(threads, monkeypatch):
    """A block wider than the cache-sized chunk (:func:`_column_chunk`) is multiplied a chunk
    at a time (at V = 50,257, 16 columns ran 0.12 s a column against 0.33 s at 64), and the
    result is the same as one product."""
    monkeypatch.setattr(products_module, "_THREADED_NNZ", 1)
    monkeypatch.setattr(products_module, "product_threads", lambda: threads)
    monkeypatch.setattr(sqrt_module, "product_threads", lambda: threads)
    rng = np.random.default_rng(5)
    counts = sp.csr_array(rng.poisson(0.5, size=(50, 30)))
    counts = counts[np.flatnonzero(counts.sum(axis=1) > 0)]
    op = sqrt_module._SplitSqrt(counts, split=False)
    x, y = rng.random((30, 7)), rng.random((counts.shape[0], 7))
    one_x, one_y = op.apply(x), op.apply_t(y)  # 7 columns <= 16: one product each
    widths = []
    real, chunk = products_module._in_column_chunks, products_module._column_chunk

    def spy(fn, z, step):
        return real(lambda zc: widths.append(zc.shape[1]) or fn(zc), z, step)

    monkeypatch.setattr(products_module, "_in_column_chunks", spy)
    monkeypatch.setattr(products_module, "_column_chunk", lambda vocab: 3)
    np.testing.assert_allclose(op.apply(x), one_x, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(op.apply_t(y), one_y, rtol=1e-13, atol=1e-15)
    assert widths == [3, 3, 1, 3, 3, 1]
    assert chunk(50_257) == 16 and chunk(128_256) == 8 and chunk(10**9) == 1


def test_iterative_threaded_products_match(corpus_300, dense_300, monkeypatch):
    monkeypatch.setattr(products_module, "_THREADED_NNZ", 64)
    it = classical_mds(sp.csr_array(corpus_300), k=16, method="iterative", seed=3)
    np.testing.assert_allclose(it.eigenvalues, dense_300.eigenvalues, rtol=1e-8, atol=0)


def test_product_threads_honours_omp_num_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert products_module.product_threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "junk")
    assert products_module.product_threads() >= 1


def test_dense_topk_matches_full(xp, corpus_300):
    topk = classical_mds(xp.asarray(corpus_300), k=16, method="dense")
    full = classical_mds(xp.asarray(corpus_300), method="dense")
    np.testing.assert_allclose(topk.eigenvalues, full.eigenvalues[:16], rtol=1e-12)
    np.testing.assert_allclose(topk.encoding, full.encoding[:, :16], rtol=0, atol=1e-9)
    np.testing.assert_allclose(np.sum(full.eigenvalues), full.total_variance, rtol=1e-12)


def test_iterative_more_positions_than_vocab():
    # n > V: the solver works on S_c^T S_c (V x V) and maps back with P = S_c V_k.
    c = positional_corpus(60, 25, seed=2, topics=4, tokens=400)
    d = classical_mds(c, method="dense")
    it = classical_mds(sp.csr_matrix(c), k=10, method="iterative")
    np.testing.assert_allclose(it.eigenvalues, d.eigenvalues[:10], rtol=1e-8)
    np.testing.assert_allclose(it.encoding[:, :3], d.encoding[:, :3], rtol=0, atol=1e-7)
    np.testing.assert_allclose(it.encoding @ it.encoding.T, d.encoding[:, :10] @ d.encoding[:, :10].T, atol=1e-8)


@pytest.mark.parametrize("method", ["dense", "iterative"])
def test_deterministic_and_signs(corpus_300, method):
    x = sp.csr_array(corpus_300)
    a = classical_mds(x, k=8, method=method)
    b = classical_mds(x, k=8, method=method)
    np.testing.assert_array_equal(a.eigenvalues, b.eigenvalues)
    np.testing.assert_array_equal(a.encoding, b.encoding)
    cols = np.arange(a.encoding.shape[1])
    assert np.all(a.encoding[np.argmax(np.abs(a.encoding), axis=0), cols] > 0)


def test_row_permutation_permutes_encoding(xp, corpus_300, dense_300):
    perm = np.random.default_rng(0).permutation(corpus_300.shape[0])
    r = classical_mds(xp.asarray(corpus_300[perm]), k=16, method="dense")
    np.testing.assert_allclose(r.eigenvalues, dense_300.eigenvalues, rtol=1e-12)
    np.testing.assert_allclose(r.encoding[:, :8], dense_300.encoding[perm, :8], rtol=0, atol=1e-9)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_planted_rank_recovered(xp, k):
    c = planted_rank(k, n=40, width=5, seed=k)
    r = classical_mds(xp.asarray(c), method="dense")
    spec = r.spectrum()
    assert spec.rank == k
    assert spec.denominator == "positive_eigenvalues"
    np.testing.assert_allclose(spec.explained_variance[k - 1 :], 1.0, rtol=1e-12)
    assert all(v is not None and v <= k for v in spec.components_for.values())
    np.testing.assert_allclose(r.eigenvalues[k:], 0.0, atol=1e-12)
    # Rank k: the first k coordinates already reproduce every distance.
    np.testing.assert_allclose(pairwise_sq(r.encoding[:, :k]), hellinger_sq(c), atol=1e-12)
    it = classical_mds(xp.asarray(c), k=k, method="iterative")
    np.testing.assert_allclose(it.eigenvalues, r.eigenvalues[:k], rtol=1e-8)
    assert it.spectrum().rank == k


@pytest.mark.parametrize("k", [1, 3, 6])
def test_planted_rank_recovered_iterative_sparse(k):
    c = planted_rank(k, n=40, width=5, seed=k)
    r = classical_mds(c, method="dense")
    it = classical_mds(sp.csr_array(c), k=k, method="iterative")
    np.testing.assert_allclose(it.eigenvalues, r.eigenvalues[:k], rtol=1e-8)
    assert it.spectrum().rank == k


def test_k_clamping_and_auto(xp):
    c = xp.asarray(positional_corpus(30, 12, seed=4, topics=3, tokens=200))
    d = classical_mds(c, k=100, method="dense")
    assert d.eigenvalues.shape == (30,)
    it = classical_mds(c, k=100, method="iterative")
    assert it.eigenvalues.shape == (10,)  # clamped to min(n, V) - 2
    np.testing.assert_allclose(it.eigenvalues, d.eigenvalues[:10], rtol=1e-8)
    assert classical_mds(c, k=5).method == "dense"
    assert classical_mds(c, k=5, dense_limit=10).method == "iterative"
    with pytest.raises(ValueError, match="k=None"):
        classical_mds(c, dense_limit=10)
    with pytest.raises(ValueError, match="needs k"):
        classical_mds(c, method="iterative")
    with pytest.raises(ValueError, match="method"):
        classical_mds(c, method="svd")
    with pytest.raises(ValueError, match="k must"):
        classical_mds(c, k=0)
    with pytest.raises(ValueError, match="min\\(n, V\\) >= 3"):
        classical_mds(c[:2], k=1, method="iterative")


def unoccupied_row() -> np.ndarray:
    c = positional_corpus(10, 8, seed=0, topics=2, tokens=50)
    c[4] = 0
    return c


@pytest.mark.parametrize("method", ["dense", "iterative"])
def test_zero_occupancy_row_raises(xp, method):
    with pytest.raises(ValueError, match="zero occupancy"):
        classical_mds(xp.asarray(unoccupied_row()), k=2, method=method)


@pytest.mark.parametrize("method", ["dense", "iterative"])
def test_zero_occupancy_row_raises_sparse(method):
    with pytest.raises(ValueError, match="zero occupancy"):
        classical_mds(sp.csr_array(unoccupied_row()), k=2, method=method)


def test_spectrum_summary_by_hand(xp):
    lam = xp.asarray([1.0, 4.0, 3.0, 2.0, 0.0, -1e-3])  # unsorted on purpose
    s = spectrum_summary(lam)
    np.testing.assert_array_equal(s.eigenvalues, [4.0, 3.0, 2.0, 1.0, 0.0, -1e-3])
    assert s.rank == 4 and s.rank_rtol == 1e-10
    np.testing.assert_allclose(s.explained_variance, np.array([4, 7, 9, 10, 10, 10]) / 10, rtol=1e-15)  # negatives add 0
    assert s.components_for == {"0.9": 3, "0.95": 4, "0.99": 4, "0.999": 4}
    np.testing.assert_allclose(s.negative_mass, 1e-3 / 10.001, rtol=1e-12)
    assert s.total_variance == 10.0 and s.denominator == "positive_eigenvalues"
    assert spectrum_summary(lam, rtol=0.6).rank == 2


def test_spectrum_summary_truncated_uses_total_variance():
    s = spectrum_summary(np.array([5.0, 3.0]), total_variance=10.0)
    assert s.denominator == "total_variance"
    np.testing.assert_allclose(s.explained_variance, [0.5, 0.8], rtol=1e-15)
    assert s.components_for == {"0.9": None, "0.95": None, "0.99": None, "0.999": None}


def test_spectrum_summary_with_negative_eigenvalues_is_monotone_and_at_most_1():
    """A bias-corrected B has negative eigenvalues: they add nothing to the explained share,
    which never falls; a trace below the positive top-k (negative mass beyond them) is
    replaced by their sum, so the share stays <= 1, and a negative trace gives no flat 0."""
    lam = np.array([5.0, 2.0, 1.0, -0.5, -3.0])
    s = spectrum_summary(lam)
    assert np.all(np.diff(s.explained_variance) >= 0) and s.explained_variance[-1] == pytest.approx(1.0)
    np.testing.assert_allclose(s.explained_variance, [5 / 8, 7 / 8, 1, 1, 1], rtol=1e-15)
    low = spectrum_summary(lam[:3], total_variance=4.5)  # trace 5 + 2 + 1 - 0.5 - 3
    assert low.denominator == "computed_positive_eigenvalues" and low.total_variance == 8.0
    assert np.all(low.explained_variance <= 1.0)
    negative = spectrum_summary(lam[:3], total_variance=-92.8)
    assert negative.explained_variance[-1] == pytest.approx(1.0) and negative.components_for["0.9"] == 3


def test_to_dict_json_ready(corpus_300, dense_300):
    d = dense_300.spectrum().to_dict()
    assert set(d) == {
        "eigenvalues",
        "rank",
        "rank_rtol",
        "explained_variance",
        "components_for",
        "negative_mass",
        "total_variance",
        "denominator",
    }
    assert d["denominator"] == "total_variance"  # top-16 only
    json.dumps(d, allow_nan=False)
    m = dense_300.to_dict()
    assert m["encoding_shape"] == [300, 16] and "encoding" not in m
    json.dumps(m, allow_nan=False)
    full = dense_300.to_dict(include_encoding=True)
    np.testing.assert_array_equal(np.array(full["encoding"]), dense_300.encoding)
    assert isinstance(dense_300.spectrum(), Spectrum)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_threaded_products_work_in_a_forked_child(monkeypatch):
    import os

    monkeypatch.setattr(products_module, "_THREADED_NNZ", 1)
    m = sp.csr_array(np.arange(1.0, 61.0).reshape(6, 10))
    blocks = products_module._RowBlocks(m, threads=2)
    x = np.ones(10)
    np.testing.assert_array_equal(blocks @ x, m @ x)  # the parent's pool exists now
    pid = os.fork()
    if pid == 0:  # child: a fresh pool, same product
        ok = np.array_equal(blocks @ x, m @ x)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_lanczos_matches_accuracy_to_the_noise_level():
    """Eigenpairs inside the noise bulk (below noise_level) need only the absolute residual
    noise_residual (issue #31): the pairs above the level are as exact as with the strict
    tolerance, the bulk's eigenvalues move by less than noise_residual, and fewer operator
    products are spent."""
    import scipy.sparse as sp

    rng = np.random.default_rng(5)
    n, v = 3000, 400
    base = 1.0 / np.arange(1, v + 1) ** 1.1
    base /= base.sum()
    rows = rng.multinomial(400, base, size=n)
    for i in range(6):  # six positions with a private block: a few eigenvalues above the bulk
        p = 0.5 * base
        p[v - 10 * (i + 1): v - 10 * i] += 0.5 / 10
        rows[i] = rng.multinomial(400, p)
    counts = sp.csr_array(rows)

    def solve(**kw):
        used = []
        r = classical_mds(counts, k=40, method="lanczos", tol=1e-10, seed=1,
                          progress=lambda products, _res: used.append(products), **kw)
        return r, max(used)

    strict, strict_products = solve()
    lam = strict.eigenvalues
    level = float(lam[8])  # the separated top ones above it, the bulk below
    residual = 1e-3 * level
    loose, loose_products = solve(noise_level=level, noise_residual=residual)
    above = lam > level
    assert 3 <= above.sum() <= 10
    np.testing.assert_allclose(loose.eigenvalues[above], lam[above], rtol=1e-9)
    assert np.max(np.abs(loose.eigenvalues - lam)) <= residual
    assert loose_products < strict_products
    assert loose.to_dict()["noise_residual"] == residual and "noise_level" not in strict.to_dict()
    with pytest.raises(ValueError, match="noise_level with a positive noise_residual"):
        classical_mds(counts, k=4, method="lanczos", noise_level=1.0)


def test_the_weighted_gram_is_centred_on_the_weighted_mean():
    """``centre_on_weights_in_place`` turns the plain-centred, bias-corrected Gram matrix
    into that of the rows centred on their weighted mean (``H_w (G - diag(b)) H_w^T``,
    ``H_w = I - 1 pi^T``); equal weights change nothing; ``weighted_gram_eigenpairs``
    (Lanczos on the counts, never m x m) gives the top of the whitened matrix."""
    from posstats.geometry.mds import centre_on_weights_in_place, weighted_gram_eigenpairs

    rng = np.random.default_rng(5)
    counts = rng.poisson(2.0, size=(40, 50)) + (np.arange(50)[None, :] == 0)
    s = np.sqrt(counts / counts.sum(axis=1, keepdims=True))
    w, bias = rng.uniform(0.1, 3.0, 40), rng.uniform(0.0, 0.01, 40)
    pi = w / w.sum()
    h, h_w = np.eye(40) - 1.0 / 40, np.eye(40) - np.outer(np.ones(40), pi)
    plain = h @ (s @ s.T - np.diag(bias)) @ h
    centred = s - pi @ s  # each row less the weighted mean row
    want = centred @ centred.T - h_w @ np.diag(bias) @ h_w.T
    np.testing.assert_allclose(centre_on_weights_in_place(plain.copy(), w), want, rtol=0, atol=1e-13)
    np.testing.assert_allclose(centre_on_weights_in_place(plain.copy(), np.full(40, 2.0)), plain, rtol=0, atol=1e-13)
    assert not np.allclose(want, plain, atol=1e-3)  # the weights move the centre here
    lam, vectors = weighted_gram_eigenpairs(sp.csr_array(counts), w, k=4, diagonal=bias, tol=1e-12)
    root = np.sqrt(w)
    dense = np.linalg.eigvalsh(root[:, None] * want * root[None, :])[::-1][:4]
    np.testing.assert_allclose(lam, dense, rtol=1e-9)
    np.testing.assert_allclose(np.abs(vectors[:, 0] @ np.linalg.eigh(root[:, None] * want * root[None, :])[1][:, -1]),
                               1.0, rtol=1e-8)


def test_weighted_coordinates_minimise_the_weighted_strain():
    """X = W^-1/2 U sqrt(lambda) from the top-k eigenpairs of W^1/2 B W^1/2: its weighted
    strain sum w_i w_j (B_ij - x_i.x_j)^2 is the Eckart-Young residual (the squared
    eigenvalues left out), below P_MDS's at the same rank and below any perturbed X; each row
    is the projection x_i = sum_j B_ij w_j x_j / lambda; equal weights give P_MDS."""
    from posstats.geometry.mds import weighted_coordinates

    rng = np.random.default_rng(3)
    rows = rng.dirichlet(np.full(40, 0.5), size=30)
    d2 = hellinger_sq(rows)
    h = np.eye(30) - 1.0 / 30
    b = -0.5 * h @ d2 @ h
    w = rng.uniform(0.05, 3.0, 30)
    root = np.sqrt(w)
    lam, u = np.linalg.eigh(root[:, None] * b * root[None])
    lam, u = lam[::-1], u[:, ::-1]
    k = 3
    x = weighted_coordinates(u[:, :k], lam[:k], w)

    def strain(y: np.ndarray) -> float:
        return float((np.outer(w, w) * (b - y @ y.T) ** 2).sum())

    np.testing.assert_allclose(strain(x), (lam[k:] ** 2).sum(), rtol=1e-9)
    p_mds = classical_mds(rows, k=k, method="dense").encoding
    assert strain(x) < strain(p_mds)
    for _ in range(20):
        assert strain(x + 1e-3 * rng.standard_normal(x.shape)) > strain(x)
    np.testing.assert_allclose(x, b @ (w[:, None] * x) / lam[:k], atol=1e-12)
    assert np.all(x[np.argmax(np.abs(x), axis=0), np.arange(k)] > 0)
    # equal weights: P_MDS itself (same eigenvectors, same sign convention)
    lam1, u1 = np.linalg.eigh(b)
    np.testing.assert_allclose(weighted_coordinates(u1[:, ::-1][:, :k], lam1[::-1][:k], np.ones(30)), p_mds, atol=1e-10)
    with pytest.raises(ValueError, match="disagree"):
        weighted_coordinates(u[:, :k], lam[:2], w)
    with pytest.raises(ValueError, match="positive"):
        weighted_coordinates(u[:, :k], lam[:k], -w)


@pytest.mark.parametrize(("n", "block", "k"), [(30, 8, 5), (31, 8, 10), (17, 4, 3), (9, 8, 9), (8, 8, 3), (100, 7, 6)])
def test_block_lanczos_is_exact_where_the_whole_space_is_not_a_multiple_of_the_block(n, block, k):
    """Where ``n`` is not a multiple of the block the Krylov basis stops one partial block short
    of the whole space (n = 30, block 8: 24 columns); the Ritz pairs of that basis were
    returned as they were (the top eigenvalue 0.88 off at n = 30, 8 of the 9 asked at n = 9).
    The basis is now completed and the whole space solved: every pair to rounding."""
    rng = np.random.default_rng(n)
    a = rng.standard_normal((n, n))
    a += a.T
    exact = np.sort(np.linalg.eigvalsh(a))[::-1][:k]
    theta, x, _, _, converged = block_lanczos(lambda q: a @ q, n, k, block=block, tol=1e-12, seed=1, xp=np,
                                                max_dim=n)
    assert converged and theta.shape == (k,) and x.shape == (n, k)
    np.testing.assert_allclose(theta, exact, atol=1e-10 * np.abs(exact).max())
    np.testing.assert_allclose(a @ x, x * theta, atol=1e-9 * np.abs(exact).max())
    np.testing.assert_allclose(x.T @ x, np.eye(k), atol=1e-12)
