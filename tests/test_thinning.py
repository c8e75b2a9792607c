"""The noise floor from a random split of the counted tokens (posstats.estimates.thinning)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from posstats.corpus.source import CorpusSource
from posstats.corpus.count_step import count_corpus
from posstats.counting.counts import CountSpec, PositionalCounts
from posstats.counting.rows import row_blocks
from posstats.estimates.null_rank import mp_edge
from posstats.estimates.noise import noise_floor
from posstats.estimates.thinning import _row_sums, split_noise_floor, thin
from posstats.runs.noise_parts import count_parts
from posstats.testing import synthetic_counts

REPO = Path(__file__).resolve().parents[1]
BERT = str(REPO / "data/tokenizers/bert-base-uncased.tokenizer.json")
FORTUNES = str(REPO / "data/fortunes-sample.jsonl")


def test_thin_is_an_exact_partition_with_equal_shares():
    values = np.array([1] * 40_000 + [7] * 20_000 + [1000] * 50)
    x = thin(values, 4, np.random.default_rng(1))
    assert x.shape == (4, values.size) and x.min() >= 0
    np.testing.assert_array_equal(x.sum(axis=0), values)
    shares = x.sum(axis=1) / values.sum()
    np.testing.assert_allclose(shares, 0.25, atol=0.005)
    # a count of 1 goes whole to one part; larger counts are spread
    assert set(np.unique(x[:, :40_000].sum(axis=0))) == {1}
    assert np.all(x[:, -50:] > 150)
    np.testing.assert_array_equal(x, thin(values, 4, np.random.default_rng(1)))  # seeded


def test_row_blocks_cover_every_row_once():
    indptr = np.array([0, 5, 5, 30, 31, 40, 100])
    blocks = row_blocks(indptr, 10)
    assert blocks[0][0] == 0 and blocks[-1][1] == 6
    assert all(a < b for a, b in blocks)
    assert all(b1 == a2 for (_, b1), (a2, _) in zip(blocks, blocks[1:]))


def _parts_by_same_split(c: sp.csr_array, parts: int, seed: int, block: int) -> list[PositionalCounts]:
    """The parts split_noise_floor draws, materialised: same blocks, same random stream."""
    rng = np.random.default_rng(seed)
    pieces = [[] for _ in range(parts)]
    for lo, hi in row_blocks(c.indptr, block):
        a, b = int(c.indptr[lo]), int(c.indptr[hi])
        x = thin(c.data[a:b], parts, rng)
        for k in range(parts):
            pieces[k].append(x[k])
    spec = CountSpec(c.shape[0], c.shape[1])
    out = []
    for k in range(parts):
        m = sp.csr_array((np.concatenate(pieces[k]), c.indices.copy(), c.indptr.copy()), shape=c.shape)
        m.eliminate_zeros()
        out.append(PositionalCounts(spec, m, 0, 0, int(m.sum())))
    return out


@pytest.mark.parametrize(("parts", "block"), [(4, 1 << 22), (4, 3000), (2, 5000)])
def test_split_floor_equals_the_parts_floor_of_the_same_split(parts, block):
    """Streaming by blocks computes exactly what noise_floor / mp_edge compute on the
    materialised parts of the same split (h, q, gamma, bias, and the analytic edge)."""
    syn = synthetic_counts(300, 2000, tokens=np.linspace(4000, 200, 300), rank=2, seed=3)
    c = syn.counts.matrix
    got = split_noise_floor(c, parts=parts, seed=9, block=block, quarters=True)
    ref_parts = _parts_by_same_split(c, parts, 9, block)
    ref = noise_floor(ref_parts, quarters=True)
    np.testing.assert_allclose(got.split_half, ref.split_half, rtol=1e-10)
    np.testing.assert_allclose(got.gamma, ref.gamma, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.bias, ref.bias, rtol=1e-9)
    np.testing.assert_array_equal(got.occupancy, syn.counts.occupancy())
    if parts == 4:
        np.testing.assert_allclose(got.split_quarter, ref.split_quarter, rtol=1e-10)
    assert got.method == ref.method and got.source == "token split" and ref.source == "parts"
    np.testing.assert_allclose(mp_edge([], got), mp_edge(ref_parts, ref), rtol=1e-9)
    # the occupancy-weighted edge: the streamed weighted column noise against the parts' rows
    np.testing.assert_allclose(mp_edge([], got, weighted=True), mp_edge(ref_parts, ref, weighted=True), rtol=1e-9)


def test_quarters_are_computed_only_on_request_and_change_nothing_else():
    """The analysis' noise floor skips the quarter distances and gamma (report-only
    diagnostics of the old power-law fit): h, the bias, the column noise and the analytic
    edge are the same as with them; gamma is NaN (null in the report) and q None."""
    syn = synthetic_counts(200, 1500, tokens=np.linspace(3000, 300, 200), rank=2, seed=4)
    c = syn.counts.matrix
    full = split_noise_floor(c, parts=4, seed=2, quarters=True)
    lean = split_noise_floor(c, parts=4, seed=2)
    np.testing.assert_array_equal(lean.split_half, full.split_half)
    np.testing.assert_array_equal(lean.bias, full.bias)
    np.testing.assert_array_equal(lean.column_noise, full.column_noise)
    assert mp_edge([], lean) == mp_edge([], full)
    assert lean.split_quarter is None and np.isnan(lean.gamma).all() and np.isfinite(full.gamma).any()
    assert lean.to_dict()["gamma"] == {"min": None, "median": None, "mean": None, "max": None}


def test_split_floor_matches_the_true_bias_of_one_distribution():
    """All positions from one distribution: E d_H^2(i, j) = b_i + b_j (as for split_counts)."""
    syn = synthetic_counts(160, 5000, tokens=1000, rank=0, seed=5)
    nf = split_noise_floor(syn.counts.matrix, seed=1)
    from posstats.geometry.hellinger import hellinger_sq

    d2 = hellinger_sq(syn.counts.matrix)
    off = ~np.eye(160, dtype=bool)
    np.testing.assert_allclose(d2[off].mean(), (nf.bias[:, None] + nf.bias[None, :])[off].mean(), rtol=0.12)


def test_token_split_agrees_with_a_document_split_in_truncate_mode():
    """Real text, truncate mode: at a position every document gives one token, so a random
    split of the tokens and a split of the documents by parity estimate the same noise."""
    source = CorpusSource(inputs=(FORTUNES,), text_column="text", tokenizer=BERT)
    spec = CountSpec(24, 30522, "truncate")
    counts = count_corpus(source, spec, dense=False)
    by_documents = noise_floor(count_parts(source, spec, parts=4, dense=False))
    by_tokens = split_noise_floor(counts.matrix, seed=0)
    ratio = by_tokens.bias / by_documents.bias
    assert 0.85 < np.median(ratio) < 1.15
    np.testing.assert_allclose(np.mean(by_tokens.bias), np.mean(by_documents.bias), rtol=0.1)


def test_split_floor_rejects_other_part_counts():
    with pytest.raises(ValueError, match="2 or 4 parts"):
        split_noise_floor(np.ones((3, 4), dtype=np.int64), parts=3)


def test_row_sums_equal_bincount_with_and_without_empty_rows():
    rng = np.random.default_rng(9)
    x = rng.integers(0, 50, size=(4, 30))
    for row_of, rows in ((np.repeat(np.arange(6), 5), 6), (np.repeat(np.array([0, 2, 3, 7]), [10, 5, 5, 10]), 9)):
        expected = np.stack([np.bincount(row_of, weights=xk, minlength=rows) for xk in x])
        got = _row_sums(x, row_of, rows)
        assert got.dtype == np.float64 and np.array_equal(got, expected)
    assert _row_sums(np.zeros((4, 0), dtype=np.int64), np.zeros(0, dtype=np.int64), 3).shape == (4, 3)


def test_positions_of_a_few_tokens_leave_the_analytic_edge_finite():
    """Truncate-mode counts at long context hold positions of one to three tokens. With four
    parts h averages both pairings into halves, so it is finite at some of them while the
    (0 + 2) union the column noise reads is empty: those rows gave NaN, and the edge of the
    202 M-token planted benchmark at n = 131,072 (1 to 183,952 tokens a position) was NaN,
    so no component was ever counted there. Such rows now add nothing to the column noise;
    the streamed and the parts' edges agree and are finite, plain and weighted."""
    tokens = np.concatenate([np.full(40, 3000.0), np.tile([1.0, 2.0, 3.0], 20)])
    c = sp.csr_array(synthetic_counts(100, 600, tokens=tokens, rank=2, seed=1).counts.matrix)
    c = c[np.flatnonzero(np.asarray(c.sum(axis=1)).ravel() > 0)]
    ref_parts = _parts_by_same_split(c, 4, 5, 1 << 22)
    ref = noise_floor(ref_parts)
    sizes = np.stack([np.asarray(p.matrix.sum(axis=1)).ravel() for p in ref_parts])
    # the case: h finite (one pairing has both halves) where the (0 + 2) or (1 + 3) union is empty
    assert np.any(np.isfinite(ref.split_half) & ((sizes[0] + sizes[2] == 0) | (sizes[1] + sizes[3] == 0)))
    got = split_noise_floor(c, parts=4, seed=5)
    assert np.all(np.isfinite(got.column_noise)) and np.all(np.isfinite(got.occupancy_column_noise))
    for weighted in (False, True):
        edge = mp_edge([], got, weighted=weighted)
        assert np.isfinite(edge) and edge > 0, weighted
        np.testing.assert_allclose(edge, mp_edge(ref_parts, ref, weighted=weighted), rtol=1e-9)
