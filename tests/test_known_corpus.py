"""``posstats.testing.known_corpus``: both samplers draw exactly ``Multinomial(N, mu_i)`` per row.

The calibration suite's truth is ``mu``; a sampler that drew another law (a relabelling
the wrong way round, a planted block on the wrong ids, a row short of N) would make every
table in docs/calibration.md measure the wrong thing. Pearson's statistic of a row against
its own ``mu_i`` has the exact multinomial moments (Haldane 1937)

    E X^2 = K - 1,   Var X^2 = 2 (K - 1) + (sum_v 1 / p_v - K^2 - 2 K + 2) / N

over the K ids of the row's support, so the mean over R rows is tested to 4.5 of its
standard deviations (a false failure about 1 in 150,000, by the normal limit of a mean
of hundreds of rows).
"""

from __future__ import annotations

import numpy as np
import pytest

from posstats.testing import known_corpus


def _haldane_var(p: np.ndarray, tokens: int) -> float:
    """Var X^2 of Pearson's statistic for ``Multinomial(tokens, p)`` over the K ids of ``p``."""
    k = p.size
    return 2 * (k - 1) + (float((1 / p).sum()) - k * k - 2 * k + 2) / tokens


def _pearson_z(corpus, rows, tokens: int) -> float:
    """z of the mean Pearson X^2 of ``rows`` against their own ``mu_i``, by the exact moments."""
    counts = corpus.counts.matrix[rows].toarray()
    stat, mean, var = 0.0, 0.0, 0.0
    for r, i in enumerate(rows):
        mu = corpus.mu(int(i))
        on = mu > 0
        assert counts[r, ~on].sum() == 0, f"row {i} has counts where mu is 0"
        p, k = mu[on], int(on.sum())
        e = tokens * p
        stat += float(((counts[r, on] - e) ** 2 / e).sum())
        mean += k - 1
        var += _haldane_var(p, tokens)
    return (stat - mean) / np.sqrt(var)


@pytest.mark.parametrize("sampler", ["tokens", "counts"])
@pytest.mark.parametrize("kind", ["stationary", "planted", "drift"])
def test_every_row_is_a_multinomial_of_its_mu(kind, sampler):
    tokens = 400
    corpus = known_corpus(kind, 600, tokens=tokens, vocab=200, seed=11, sampler=sampler)
    m = corpus.counts.matrix
    assert (np.asarray(m.sum(axis=1)).ravel() == tokens).all() and corpus.counts.tokens == 600 * tokens
    rows = np.arange(600) if kind != "planted" else np.arange(4)
    assert abs(_pearson_z(corpus, rows, tokens)) < 4.5


@pytest.mark.parametrize("sampler", ["tokens", "counts"])
def test_the_drift_relabels_the_way_mu_says(sampler):
    """At the last position the drift is the second component alone: a base draw of id v
    written as ``permutation[v]``. 200,000 draws there against ``mu`` and against the
    inverse relabelling (the law of a sampler that had it the wrong way round)."""
    tokens = 200_000
    corpus = known_corpus("drift", 2, tokens=tokens, vocab=300, seed=4, sampler=sampler)
    freq = corpus.counts.matrix.toarray()[1] / tokens
    inverse = corpus.base[corpus.permutation]
    assert not np.allclose(inverse, corpus.mu(1))
    # plug-in d_H^2 of the frequencies to their law: about (V - 1) / (4 N) = 3.7e-4
    assert ((np.sqrt(freq) - np.sqrt(corpus.mu(1))) ** 2).sum() < 3 * 299 / (4 * tokens)
    assert ((np.sqrt(freq) - np.sqrt(inverse)) ** 2).sum() > 10 * 299 / (4 * tokens)


def test_planted_blocks_land_on_their_own_ids_with_their_weight():
    """Each planted position puts ``Binomial(N, a_k)`` tokens on its own 20 ids and none on
    another's: the block mass is within 4.5 binomial sd of ``N a_k``."""
    tokens = 20_000
    corpus = known_corpus("planted", 8, tokens=tokens, seed=3, sampler="counts")
    rows = corpus.counts.matrix.toarray()
    v = corpus.base.size - 4 * corpus.block
    for k, i in enumerate(corpus.planted):
        a = corpus.mix[i]
        own = rows[i, v + k * corpus.block: v + (k + 1) * corpus.block]
        assert abs(own.sum() - tokens * a) < 4.5 * np.sqrt(tokens * a * (1 - a))
        assert rows[i, v:].sum() == own.sum()
    assert rows[4:, v:].sum() == 0


def test_an_unknown_sampler_is_refused_in_one_line():
    with pytest.raises(ValueError, match="sampler must be one of tokens, counts, got 'fast'"):
        known_corpus("stationary", 4, tokens=10, sampler="fast")
    corpus = known_corpus("stationary", 4, tokens=10)
    with pytest.raises(ValueError, match="sampler must be one of"):
        corpus.sample(10, seed=1, sampler="fast")
    assert (np.asarray(corpus.sample(10, seed=1, sampler="counts").matrix.sum(axis=1)).ravel() == 10).all()


def _spaced_z(values: np.ndarray, expected: float) -> float:
    """z of the mean of ``values`` (one per row, rows 8 apart: nearly independent) against
    ``expected``, by their own standard error."""
    return float((values.mean() - expected) / (values.std(ddof=1) / np.sqrt(values.size)))


@pytest.mark.parametrize("sampler", ["tokens", "counts"])
def test_markov_rows_have_the_chain_law(sampler):
    """``markov_packed_counts``: every row is ``Multinomial(W, p)`` (Pearson's X^2 of rows 8
    apart, by Haldane's exact moments), and rows ``k`` apart share what the chain keeps.

    Per window, ``P(t_i = v, t_{i+k} = u) = p_v (q delta_uv + (1 - q) p_u)`` with ``q =
    stay^k``, and windows are independent, so the cross-Pearson statistic
    ``sum_v (c_i(v) - W p_v)(c_{i+k}(v) - W p_v) / (W p_v)`` has mean ``q (V - 1)``. A stay
    of 0.6 for 0.7, or lag 2 read as lag 1, is 9 or more standard errors away (measured);
    the test allows 4.5."""
    from posstats.testing import _zipf, markov_packed_counts

    vocab, windows, stay, n = 100, 300, 0.7, 1600
    counts = markov_packed_counts(n, windows=windows, stay=stay, vocab=vocab, seed=21, sampler=sampler)
    assert counts.spec.mode == "pack" and counts.tokens == n * windows
    m = counts.matrix.toarray()
    assert (m.sum(axis=1) == windows).all()
    p = _zipf(vocab, 1.1, 1.0)
    rows = np.arange(0, n - 2, 8)
    e = windows * p
    pearson = (((m[rows] - e) ** 2) / e).sum(axis=1)
    assert abs((pearson.mean() - (vocab - 1)) / np.sqrt(_haldane_var(p, windows) / rows.size)) < 4.5
    d = (m - e) / np.sqrt(e)
    for k in (1, 2):
        assert abs(_spaced_z((d[rows] * d[rows + k]).sum(axis=1), stay**k * (vocab - 1))) < 4.5


def test_markov_refuses_an_unknown_sampler_and_a_bad_stay():
    from posstats.testing import markov_packed_counts

    with pytest.raises(ValueError, match="sampler must be one of tokens, counts, got 'fast'"):
        markov_packed_counts(4, windows=3, sampler="fast")
    with pytest.raises(ValueError, match=r"stay must be in \[0, 1\)"):
        markov_packed_counts(4, windows=3, stay=1.0)


def test_window_groups_are_the_same_draws_grouped_by_document():
    """``window_groups=K`` keeps the corpus (the same counts at the same seed) and groups its
    documents (draw t of every position) t mod K, all full: group g holds N // K or one
    more documents at every position, the tail none; groups + tail = the counts."""
    plain = known_corpus("planted", 10, tokens=303, seed=4)
    grouped = known_corpus("planted", 10, tokens=303, seed=4, window_groups=4)
    assert (plain.counts.matrix != grouped.counts.matrix).nnz == 0 and plain.window_groups is None
    wg = grouped.window_groups
    assert (wg.groups, wg.positions, wg.windows) == (4, 10, 303)
    assert (wg.total() != grouped.counts.matrix).nnz == 0
    occupancy = np.asarray(wg.matrix.sum(axis=1)).ravel().reshape(5, 10)
    assert occupancy[:4].tolist() == [[76] * 10, [76] * 10, [76] * 10, [75] * 10] and not occupancy[4].any()
    with pytest.raises(ValueError, match="tokens sampler"):
        known_corpus("stationary", 10, tokens=30, window_groups=4, sampler="counts")


@pytest.mark.parametrize("sampler", ["tokens", "counts"])
def test_falling_occupancy_is_truncate_documents_of_geometric_length(sampler):
    """``occupancy_ratio = r``: D documents, position i reached by those longer than i, with
    ``P(L > i) = r^(i / (n - 1))``: position 0 holds all D, position n - 1 ``Binomial(D, r)``
    (tested to 4.5 sd), occupancy never rises, and each row is still a multinomial of its
    ``mu_i`` over its own N_i (Pearson's mean to 4.5 sd, as above)."""
    n, docs, ratio = 40, 3000, 0.1
    corpus = known_corpus("drift", n, tokens=docs, vocab=200, seed=3, occupancy_ratio=ratio, sampler=sampler)
    occ = corpus.occupancy
    assert occ[0] == docs and (np.diff(occ) <= 0).all() and corpus.lengths.size == docs
    assert abs(occ[-1] - docs * ratio) < 4.5 * np.sqrt(docs * ratio * (1 - ratio))
    assert np.array_equal(occ, [(corpus.lengths > i).sum() for i in range(n)])
    m = corpus.counts.matrix.toarray()
    stat = mean = var = 0.0
    for i in range(n):
        mu = corpus.mu(i)
        on = mu > 0
        assert m[i, ~on].sum() == 0
        e = occ[i] * mu[on]
        stat += float(((m[i, on] - e) ** 2 / e).sum())
        mean += on.sum() - 1
        var += _haldane_var(mu[on], int(occ[i]))
    assert abs(stat - mean) / np.sqrt(var) < 4.5
    again = corpus.sample(docs, seed=9, sampler=sampler)
    assert again.occupancy()[0] == docs and (np.diff(again.occupancy()) <= 0).all()
    assert known_corpus("drift", n, tokens=docs, vocab=200, seed=3).lengths is None
    with pytest.raises(ValueError, match="occupancy_ratio"):
        known_corpus("stationary", n, tokens=10, occupancy_ratio=1.5)


def test_falling_occupancy_groups_documents_as_posstats_count_does():
    """With window groups, the full documents go to the groups in turn and each shorter one
    to its length class (rows ``(K + L) n + i``, i < L), as ``posstats count`` puts a
    truncate-mode corpus (:class:`~posstats.counting.window_groups.WindowGroupCounter`):
    the groups and classes sum to the counts, class L holds at each of its positions
    exactly the documents of length L, and a rotation keeps every occupancy."""
    from posstats.counting.window_groups import WindowGroups

    n, k = 12, 4
    corpus = known_corpus("planted", n, tokens=500, seed=2, occupancy_ratio=0.2, window_groups=k)
    wg: WindowGroups = corpus.window_groups
    assert wg.classes == n - 1 and wg.windows == int((corpus.lengths == n).sum())
    assert (wg.total() != corpus.counts.matrix).nnz == 0
    rows = np.asarray(wg.matrix.sum(axis=1)).ravel()
    full = np.bincount(np.arange(wg.windows) % k, minlength=k)
    assert np.array_equal(rows[:k * n].reshape(k, n), np.repeat(full[:, None], n, axis=1))
    assert not rows[k * n:(k + 1) * n].any()  # no tail: every short document has its class
    for length in range(1, n):
        cls = rows[(k + length) * n:(k + length + 1) * n]
        assert (cls[:length] == (corpus.lengths == length).sum()).all() and not cls[length:].any()
    rotated = wg.rotated(wg.draw_shifts(np.random.default_rng(0)))
    assert np.array_equal(np.asarray(rotated.sum(axis=1)).ravel(), corpus.occupancy)


def test_halves_only_groups_put_every_document_in_group_t_mod_k():
    """``halves_only`` (the groups posstats count keeps above 4,096 positions): document t,
    whatever its length, in group t mod 2; no length classes, no tail; the groups sum to the
    counts, and the halves hold every token."""
    n = 12
    corpus = known_corpus("planted", n, tokens=400, seed=3, occupancy_ratio=0.2, window_groups=2, halves_only=True)
    wg = corpus.window_groups
    assert wg.halves_only and wg.classes == 0 and wg.groups == 2
    assert (wg.total() != corpus.counts.matrix).nnz == 0
    rows = np.asarray(wg.matrix.sum(axis=1)).ravel().reshape(3, n)
    t = np.arange(corpus.lengths.size)
    for g in (0, 1):  # position i of group g: its documents longer than i
        assert np.array_equal(rows[g], [(corpus.lengths[t % 2 == g] > i).sum() for i in range(n)])
    assert not rows[2].any()


def test_proportion_gives_the_exact_clopper_pearson_interval():
    """The benchmarks' rates carry the exact interval: at k = 0 its upper end solves
    (1 - p)^n = 0.025, at k = n its lower end p^n = 0.025, and in between the interval's
    ends put 2.5 % of Binomial(n, p) beyond k on either side."""
    from scipy.stats import binom

    from posstats.testing import proportion

    assert proportion(0, 40) == {"count": 0, "of": 40, "rate": 0.0, "ci95": [0.0, round(1 - 0.025 ** (1 / 40), 4)]}
    assert proportion(40, 40)["ci95"] == [round(0.025 ** (1 / 40), 4), 1.0]
    lo, hi = proportion(2, 81)["ci95"]
    assert proportion(2, 81)["rate"] == 2 / 81
    assert binom.sf(1, 81, lo) == pytest.approx(0.025, abs=2e-4)
    assert binom.cdf(2, 81, hi) == pytest.approx(0.025, abs=2e-4)
    for k, n in ((-1, 10), (11, 10), (0, 0)):
        with pytest.raises(ValueError, match="0 <= k <= n"):
            proportion(k, n)
