"""Helpers for tests and benchmarks: generated corpora with a known truth, and token splits.

Nothing in the library or the jobs uses these; they build inputs whose answer is known
in advance (THEORY.md section 7), so that tests and benchmarks can check estimates
against it:

- :func:`synthetic_counts`: positional counts with a planted structure of known rank and
  known eigenvalues (a :class:`SyntheticCorpus`).
- :func:`known_corpus`: counts drawn from chosen distributions ``mu_i`` (stationary,
  planted positions, a smooth drift) with the truth computed from them (a
  :class:`KnownCorpus`): the calibration suite's corpora (docs/calibration.md).
- :func:`markov_packed_counts`: a stationary stream with dependent tokens, packed into
  windows (the null hypothesis with the dependence of real packed text); ``sampler=
  "counts"`` draws a row of counts at a time, with independent windows.
- :func:`successor_stream`: a stationary stream whose nearby tokens are strongly dependent
  without repeating (the hard case of a homogeneity null that ignores windows);
  :func:`successor_documents` a truncate-mode corpus of such documents, mostly shorter than n.
- :func:`resampled_documents`: a truncate-mode corpus with no positional structure whose
  documents differ as real ones do (real documents' laws, lengths drawn independently).
- :func:`proportion`: a tally of ``k`` events in ``n`` runs with its exact 95 % interval,
  the form in which the calibration benchmarks report every rate.
- :func:`split_counts`: every counted token split independently into parts, i.e.
  independent samples of each position when the tokens are independent (as in a
  generated corpus). The analysis splits counted tokens the same way, streamed
  (:mod:`posstats.estimates.thinning`), or by document or shard on request
  (:func:`posstats.runs.noise_parts.count_parts`, :func:`posstats.runs.noise_parts.parts_from_store`).

>>> syn = synthetic_counts(50, 400, tokens=500, rank=2, block_tokens=8, seed=1)
>>> syn.counts.positions, syn.rank, syn.true_eigenvalues.shape
(50, 2, (2,))
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.stats import binomtest

from posstats.counting.counts import CountAccumulator, CountSpec, PositionalCounts
from posstats.counting.window_groups import WindowGroups
from posstats.corpus.count_step import WINDOW_GROUP_POSITIONS, kept_window_groups

__all__ = ["KnownCorpus", "SyntheticCorpus", "counted_documents", "known_corpus", "markov_packed_counts",
           "markov_stream", "proportion", "resampled_documents", "split_counts", "sticky_draws",
           "successor_documents", "successor_stream", "synthetic_counts", "topic_pieces"]


def proportion(k: int, n: int, /) -> dict[str, Any]:
    """``k`` events in ``n`` runs: ``{"count": k, "of": n, "rate": k / n, "ci95": [lo, hi]}``
    with the exact (Clopper-Pearson) two-sided 95 % interval of the rate, so every rate a
    benchmark prints carries its own binomial uncertainty.

    >>> proportion(0, 40)["ci95"]
    [0.0, 0.0881]
    """
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"proportion: need 0 <= k <= n and n >= 1, got k = {k}, n = {n}")
    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=0.95, method="exact")
    return {"count": int(k), "of": int(n), "rate": k / n, "ci95": [round(float(ci.low), 4), round(float(ci.high), 4)]}


def split_counts(counts: PositionalCounts, /, *, parts: int = 2, seed: int = 0) -> tuple[PositionalCounts, ...]:
    """Split every counted token independently and uniformly into ``parts`` parts.

    ``C = sum_k C_k`` exactly, and each ``C_k[i]`` is a multinomial thinning of ``C[i]``
    (part k takes ``Binomial(left, 1 / (parts - k))`` of what the earlier parts left):
    for independently sampled tokens (the generated corpora of :func:`synthetic_counts`)
    the parts are independent samples of each position. Parts keep the layout (dense or
    sparse) of ``counts``, and their metadata says ``part: "k/parts"``.
    """
    parts = int(parts)
    if parts < 2:
        msg = f"parts must be >= 2, got {parts}"
        raise ValueError(msg)
    rng = np.random.default_rng(seed)
    base = counts.to_sparse().matrix.copy()
    base.sum_duplicates()
    left = base.data.astype(np.int64)
    out = []
    for k in range(parts):
        take = left if k == parts - 1 else rng.binomial(left, 1.0 / (parts - k))
        left = left - take
        m = sp.csr_array((take.copy(), base.indices.copy(), base.indptr.copy()), shape=base.shape)
        m.eliminate_zeros()
        matrix: Any = m if counts.is_sparse else m.toarray()
        metadata = {**counts.metadata, "part": f"{k}/{parts}"}
        out.append(PositionalCounts(counts.spec, matrix, 0, 0, int(take.sum()), counts.fingerprint, metadata))
    return tuple(out)


@dataclass(frozen=True)
class SyntheticCorpus:
    """A generated corpus with a known positional structure (see :func:`synthetic_counts`).

    Attributes:
        counts: sparse int64 counts (n x V).
        rank: the true rank of ``B`` (the number of signal blocks; 0 = one distribution).
        true_eigenvalues: (rank,) eigenvalues of the true ``B = S_c S_c^T``, descending.
        coefficients: (n, rank + 1) ``sqrt`` block masses: ``s_i = sum_k a[i, k] u_k`` with
            orthonormal ``u_k`` (disjoint supports), so ``B_true = A_c A_c^T``.
        occupancy: (n,) expected tokens per position.
    """

    counts: PositionalCounts
    rank: int
    true_eigenvalues: np.ndarray
    coefficients: np.ndarray
    occupancy: np.ndarray = field(repr=False)


def _zipf(size: int, exponent: float, offset: float) -> np.ndarray:
    """(size,) probabilities ``p_v ~ (v + offset)^-exponent``."""
    p = 1.0 / (np.arange(size) + offset) ** exponent
    return p / p.sum()


def _check_structure(vocab: int, rank: int, block_tokens: int, strength: float) -> None:
    if rank < 0 or rank == 1:
        msg = f"rank must be 0 or >= 2 (rank 1 is impossible on the square-root sphere), got {rank}"
        raise ValueError(msg)
    if vocab <= rank * block_tokens + 1:
        msg = f"vocab={vocab} too small for {rank} signal blocks of {block_tokens} tokens"
        raise ValueError(msg)
    if not 0.0 <= strength < 1.0:
        msg = f"strength must be in [0, 1), got {strength}"
        raise ValueError(msg)


def _signal_weights(n: int, rank: int, rng: np.random.Generator) -> np.ndarray:
    """(n, rank) smooth seeded curve ``w(i)`` on the positive part of the unit sphere.

    ``w(i) = u(t) / |u(t)|`` with ``u_k(t) = 0.2 + 0.5 (1 + sin(2 pi f_k t + phi_k))``,
    ``t = (i + 1/2) / n``, ``f_k ~ U(0.5, 3)``, ``phi_k ~ U(0, 2 pi)``; (n, 0) for rank 0.
    """
    if not rank:
        return np.zeros((n, 0))
    t = (np.arange(n) + 0.5) / n
    phases = rng.uniform(0.0, 2.0 * np.pi, rank)
    freqs = rng.uniform(0.5, 3.0, rank)
    u = 0.2 + 0.5 * (1.0 + np.sin(2.0 * np.pi * freqs[None, :] * t[:, None] + phases[None, :]))
    return u / np.linalg.norm(u, axis=1, keepdims=True)


def _true_eigenvalues(w: np.ndarray, strength: float) -> np.ndarray:
    """(rank,) ``strength * eig(W_c^T W_c)`` descending: the spectrum of the true ``B``."""
    if not w.shape[1]:
        return np.zeros(0)
    wc = w - w.mean(axis=0)
    return strength * np.sort(np.linalg.eigvalsh(wc.T @ wc))[::-1]


def synthetic_counts(
    n: int,
    vocab: int,
    /,
    *,
    tokens: Any = 10_000,
    rank: int = 0,
    strength: float = 0.3,
    block_tokens: int = 64,
    exponent: float = 1.07,
    head: int = 1024,
    seed: int = 0,
) -> SyntheticCorpus:
    """Generated positional counts with a planted structure of known rank.

    Token ids ``0 .. rank * block_tokens - 1`` form ``rank`` signal blocks with fixed
    within-block distributions ``q_k`` (Zipf over the block); the other ids carry a Zipf
    base distribution ``z`` (``p_v ~ (v + 2.7)^-exponent``, realistic for BPE text). Position
    i has the distribution

        mu_i = (1 - strength) z + strength * sum_k w_k(i)^2 q_k,   |w(i)| = 1, w >= 0

    with ``w(i)`` a smooth, seeded curve on the positive part of the unit sphere of
    R^rank. Since the blocks have disjoint supports, ``sqrt(mu_i)`` is a combination of
    ``rank + 1`` orthonormal vectors with a constant base coefficient, and the true
    ``B = S_c S_c^T`` has rank exactly ``rank`` (for rank >= 2) with known eigenvalues
    ``strength * eig(W_c^T W_c)``. ``rank = 0`` is the one-distribution corpus; rank 1 is
    impossible on the square-root sphere (a one-parameter family of distributions is a
    curve, never a line) and refused.

    Counts are Poisson, ``C[i, v] ~ Poisson(tokens_i mu_i[v])``, built as CSR directly
    (the ``head`` most frequent base tokens and the signal blocks densely per row block,
    the rest as tokens placed by an alias table): 10^9 tokens at n = 131,072 take about a
    minute and never an n x V array.

    Args:
        n, vocab: positions and vocabulary size (vocab > rank * block_tokens).
        tokens: expected tokens per position (a number, or (n,) array for an occupancy
            profile such as truncate mode's decay).
        rank, strength, block_tokens, exponent: the structure (see above).
        head: base tokens drawn densely.
        seed: seeds everything.
    """
    rank, block_tokens = int(rank), int(block_tokens)
    _check_structure(vocab, rank, block_tokens, strength)
    rng = np.random.default_rng(seed)
    occ = np.broadcast_to(np.asarray(tokens, dtype=np.float64), (n,)).copy()
    w = _signal_weights(n, rank, rng)
    base_mass = 1.0 - strength if rank else 1.0
    sig_cols = rank * block_tokens
    base = _zipf(vocab - sig_cols, exponent, 2.7)
    q = _zipf(block_tokens, 1.0, 1.0)
    h = min(int(head), base.size)
    tail = base[h:]
    tail_mass = float(tail.sum())

    def rates(lo: int, hi: int) -> np.ndarray:
        o = occ[lo:hi, None]
        sig = (o * strength * w[lo:hi] ** 2)[:, :, None] * q[None, None, :]
        return np.concatenate([sig.reshape(hi - lo, -1), o * base_mass * base[None, :h]], axis=1)

    matrix = poisson_rows(
        n,
        vocab,
        dense_cols=np.arange(sig_cols + h, dtype=np.int64),
        dense_rates=rates,
        tail_cols=np.arange(sig_cols + h, vocab, dtype=np.int64),
        tail_p=tail / tail_mass if tail.size else np.zeros(0),
        tail_rate=occ * base_mass * tail_mass,
        rng=rng,
    )
    coeff = np.concatenate([np.full((n, 1), math.sqrt(base_mass)), math.sqrt(strength) * w if rank else w], axis=1)
    spec = CountSpec(positions=n, vocab_size=vocab)
    counts = PositionalCounts(spec, matrix, 0, 0, int(matrix.sum()), "", {"synthetic": f"rank={rank} seed={seed}"})
    return SyntheticCorpus(counts, rank, _true_eigenvalues(w, strength), coeff, occ)


# ----------------------------------------------------------------------------- known mu_i


KNOWN_KINDS = ("stationary", "planted", "drift")


@dataclass(frozen=True)
class KnownCorpus:
    """Counts sampled from chosen distributions ``mu_i``, with the truth computed from them.

    Every position holds exactly ``tokens`` tokens drawn independently from ``mu_i`` (a
    truncate-mode corpus of independent documents: ``C[i] ~ Multinomial(N, mu_i)``), or
    with ``lengths``, the tokens of the documents that reach it (``C[i] ~
    Multinomial(N_i, mu_i)``, ``N_i`` the documents longer than i: a truncate-mode corpus
    of documents of several lengths, whose occupancy falls along the context).

    Attributes:
        counts: sparse int64 (n x V) counts.
        kind: ``stationary`` (every mu_i the base), ``planted`` (positions ``planted``
            mix a private block into the base), ``drift`` (mu_i moves linearly from the
            base to a permuted base).
        base: (V,) the base distribution (Zipf; 0 on the planted blocks' ids).
        planted: the planted positions (empty for other kinds).
        mix: (n,) the weight of the second component at each position (block or permuted
            base); 0 where mu_i is the base.
        permutation: (V,) the drift's relabelling (identity else): its second component gives
            id ``permutation[v]`` the base probability of id ``v``, the law of a base draw
            ``v`` written as ``permutation[v]`` (how the corpus is sampled).
        window_groups: the counts by window group
            (:class:`~posstats.counting.window_groups.WindowGroups`) when asked for: document
            t (the t-th token of every position) in group ``t mod K``, as ``posstats count``
            groups a truncate-mode corpus; else None.
        lengths: (D,) the documents' lengths (each 1..n, longest first) when occupancy
            falls (``occupancy_ratio`` < 1 in :func:`known_corpus`); None when every
            document reaches every position.
        occupancy_ratio: the expected occupancy of the last position over the first's
            (1: every position ``tokens`` tokens).
    """

    counts: PositionalCounts
    kind: str
    base: np.ndarray
    planted: np.ndarray
    mix: np.ndarray
    permutation: np.ndarray
    block: int = 20
    window_groups: Any = None
    lengths: Any = None
    occupancy_ratio: float = 1.0

    def mu(self, i: int, /) -> np.ndarray:
        """(V,) the true distribution of position ``i``."""
        a = float(self.mix[i])
        if self.kind == "drift":
            second = np.empty_like(self.base)
            second[self.permutation] = self.base  # P(permutation[v]) = base[v]: the sampler's law
            return (1.0 - a) * self.base + a * second
        out = (1.0 - a) * self.base
        if a and self.kind == "planted":
            lo = self.block_start(i)
            out = out.copy()
            out[lo:lo + self.block] += a / self.block
        return out

    def block_start(self, i: int, /) -> int:
        """The first of planted position ``i``'s ``block`` private ids (they follow the base's
        V ids, one block per planted position in the order of ``planted``)."""
        k = int(np.flatnonzero(self.planted == i)[0])
        return self.base.size - self.block * self.planted.size + k * self.block

    def true_d2(self, i: Any, j: Any, /) -> np.ndarray:
        """``d_H^2(mu_i, mu_j) = sum_v (sqrt mu_i - sqrt mu_j)^2`` for paired index arrays."""
        i, j = np.atleast_1d(np.asarray(i)), np.atleast_1d(np.asarray(j))
        cache: dict[int, np.ndarray] = {}

        def root(k: int) -> np.ndarray:
            if k not in cache:
                cache[k] = np.sqrt(self.mu(k))
            return cache[k]

        return np.array([float(((root(int(a)) - root(int(b))) ** 2).sum()) for a, b in zip(i, j, strict=True)])

    def sample(self, tokens: int, /, *, seed: int, sampler: str = "tokens") -> PositionalCounts:
        """Another corpus from the same ``mu_i`` (the same drift permutation too):
        ``Multinomial(tokens, mu_i)`` per position, drawn by ``sampler`` (as in
        :func:`known_corpus`; with falling occupancy, ``tokens`` documents of lengths drawn
        afresh from the same law). Two samples are the null of ``posstats diff``: nothing
        changed, only the sampling."""
        n = self.mix.size
        rng = np.random.default_rng(seed)
        lengths = document_lengths(n, int(tokens), self.occupancy_ratio, rng) if self.occupancy_ratio < 1 else None
        counts = _SAMPLERS[_sampler(sampler)](self, n, int(tokens), rng, lengths=lengths)
        total = int(counts.sum())
        return PositionalCounts(CountSpec(positions=n, vocab_size=self.base.size), counts, int(tokens), int(tokens),
                                total, "", {"known": f"{self.kind} N={tokens} seed={seed} (resampled)"})

    @property
    def occupancy(self) -> np.ndarray:
        """(n,) int64 ``N_i``: the tokens at each position."""
        return self.counts.occupancy()


def document_lengths(n: int, documents: int, ratio: float, rng: np.random.Generator, /) -> np.ndarray:
    """(D,) int64 lengths of ``documents`` truncate-mode documents cut at ``n`` tokens, longest
    first, whose occupancy falls geometrically: ``P(L > i) = ratio^(i / (n - 1))`` for
    ``i < n``, so position 0 holds every document and position n - 1 about ``ratio D``
    (``L = min(n, 1 + floor(E))``, ``E`` exponential of mean ``(n - 1) / -log(ratio)``).

    >>> lengths = document_lengths(64, 10_000, 0.1, np.random.default_rng(0))
    >>> int(lengths.max()), int(lengths.min()), round(float((lengths == 64).mean()), 2)
    (64, 1, 0.1)
    """
    if not 0.0 < ratio <= 1.0:
        msg = f"occupancy_ratio must be in (0, 1], got {ratio}"
        raise ValueError(msg)
    if ratio == 1.0 or n == 1:
        return np.full(int(documents), int(n), dtype=np.int64)
    scale = (n - 1) / -math.log(ratio)
    lengths = np.minimum(n, 1 + np.floor(rng.exponential(scale, int(documents)))).astype(np.int64)
    return np.sort(lengths)[::-1].copy()


def known_corpus(
    kind: str,
    n: int,
    /,
    *,
    tokens: int,
    vocab: int = 5000,
    exponent: float = 1.1,
    planted: Any = (0, 1, 2, 3),
    strength: Any = (0.1, 0.2),
    block: int = 20,
    seed: int = 0,
    sampler: str = "tokens",
    window_groups: int = 0,
    occupancy_ratio: float = 1.0,
    halves_only: bool = False,
) -> KnownCorpus:
    """A corpus sampled from known ``mu_i`` (:class:`KnownCorpus`), the calibration suite's truth.

    Args:
        kind: ``stationary``, ``planted`` or ``drift`` (see :class:`KnownCorpus`).
        n: positions.
        tokens: N, tokens at every position.
        vocab: V of the base Zipf(``exponent``) distribution; ``planted`` adds ``block``
            private ids per planted position after it.
        planted: the planted positions.
        strength: the planted mixing weights, spread evenly over ``[lo, hi]`` (or one value).
        seed: seeds the sampling (and the drift's permutation).
        sampler: how each row's ``Multinomial(tokens, mu_i)`` is drawn; both are exact, and
            the same seed gives different corpora under each. ``tokens`` draws every token
            (inverse CDF; the suite's figures up to 2026-11-28 used it, and the tests do);
            ``counts`` draws a row's counts at once by conditional binomials
            (``numpy.random.Generator.multinomial``): about 5x faster at N = 20,000
            (62-125 s instead of 6.5 min for 131,072 positions), for the long cells.
        window_groups: K > 0 also gives the counts by window group of the same draws
            (``KnownCorpus.window_groups``: the corpus is N documents of n tokens, document t
            made of the t-th draw of every position, in group ``t mod K`` as ``posstats
            count`` groups truncate-mode documents), so that the analysis tests homogeneity
            with the rotation null as it does for a counted corpus; ``tokens`` sampler only
            (``counts`` keeps no documents). With falling occupancy the documents shorter
            than n go to their length classes, as ``posstats count`` puts them.
        halves_only: the window groups as ``posstats count`` keeps them above 4,096
            positions (:func:`posstats.corpus.count_step.kept_window_groups`): every
            document, short ones too, in group ``t mod K``, no length classes, flagged never
            to be rotated (the halves of the rank test's edge).
        occupancy_ratio: r in (0, 1]. Below 1 the corpus is ``tokens`` documents of
            lengths drawn by :func:`document_lengths` (position 0 holds ``tokens`` tokens,
            position n - 1 about ``r tokens``, falling geometrically between): the unequal
            occupancy of every truncate-mode corpus, which the calibration grid's equal
            occupancies never show (docs/calibration.md, "Unequal occupancy").
    """
    _sampler(sampler)
    if window_groups and sampler != "tokens":
        msg = f"window groups need the tokens sampler (the counts sampler keeps no documents), got {sampler!r}"
        raise ValueError(msg)
    if kind not in KNOWN_KINDS:
        msg = f"kind must be one of {', '.join(KNOWN_KINDS)}, got {kind!r}"
        raise ValueError(msg)
    rng = np.random.default_rng(seed)
    planted = np.asarray(planted if kind == "planted" else (), dtype=np.int64)
    extra = block * planted.size
    base = np.zeros(vocab + extra)
    base[:vocab] = _zipf(vocab, exponent, 1.0)
    mix = np.zeros(n)
    perm = np.arange(base.size)
    if kind == "planted":
        lo, hi = (float(strength), float(strength)) if np.ndim(strength) == 0 else map(float, strength)
        mix[planted] = np.linspace(lo, hi, planted.size) if planted.size > 1 else lo
    elif kind == "drift":
        mix[:] = np.arange(n) / max(n - 1, 1)
        perm[:vocab] = rng.permutation(vocab)
    ratio = float(occupancy_ratio)
    lengths = document_lengths(n, int(tokens), ratio, rng) if ratio != 1.0 else None
    corpus = KnownCorpus(PositionalCounts(CountSpec(n, base.size), sp.csr_array((n, base.size), dtype=np.int64), 0, 0,
                                          0, "", {}), kind, base, planted, mix, perm, block, None, lengths, ratio)
    groups = None
    if window_groups:
        counts, groups = _multinomial_rows(corpus, n, int(tokens), rng, groups=int(window_groups), lengths=lengths,
                                           halves_only=halves_only)
    else:
        counts = _SAMPLERS[sampler](corpus, n, int(tokens), rng, lengths=lengths)
    spec = CountSpec(positions=n, vocab_size=base.size)
    total = int(counts.sum())
    described = f"{kind} N={tokens} seed={seed}" + (f" occupancy_ratio={ratio:g}" if lengths is not None else "")
    pc = PositionalCounts(spec, counts, int(tokens), int(tokens), total, "", {"known": described})
    return KnownCorpus(pc, kind, base, planted, mix, perm, block, groups, lengths, ratio)


def _multinomial_rows(corpus: KnownCorpus, n: int, tokens: int, rng: np.random.Generator, *, groups: int = 0,
                      lengths: Any = None, halves_only: bool = False) -> Any:
    """(n, V) CSR: ``Multinomial(tokens, mu_i)`` per row, by inverse-CDF draws of the base
    (and of the second component where ``mix > 0``), never an n x V array. With ``groups =
    K > 0``: ``(counts, WindowGroups)``, draw t of every row being document t, in group
    ``t mod K`` (the same draws: the counts do not change). With ``lengths`` ((tokens,)
    document lengths, longest first): row i counts the draws of the documents longer than i
    alone, and a document shorter than n goes to its length class (rows ``(K + L) n + i``);
    with ``halves_only`` to its group ``t mod K`` as the full ones (no classes)."""
    cdf = np.cumsum(corpus.base)
    cdf /= cdf[-1]
    blocks, group_blocks = [], []
    classes = 0 if lengths is None or halves_only else n - 1
    if groups:
        if lengths is None or halves_only:
            doc_rows = np.arange(tokens, dtype=np.int64) % groups * n  # document t's first row
        else:  # full documents in turn over the groups; a short one in its length class
            full = lengths == n
            doc_rows = np.where(full, (np.cumsum(full) - 1) % groups, groups + lengths) * n
    step = max(1, (1 << 24) // max(tokens, 1))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        draws = np.searchsorted(cdf, rng.random((hi - lo, tokens)), side="right")
        second = rng.random((hi - lo, tokens)) < corpus.mix[lo:hi, None]
        if corpus.kind == "drift":
            draws = np.where(second, corpus.permutation[draws], draws)
        elif corpus.kind == "planted" and np.any(second):
            for r in np.flatnonzero(second.any(axis=1)):
                first = corpus.block_start(lo + r)
                draws[r, second[r]] = first + rng.integers(0, corpus.block, int(second[r].sum()))
        keep = None if lengths is None else lengths[None, :] > np.arange(lo, hi)[:, None]  # document reaches row
        r = np.repeat(np.arange(hi - lo), tokens)
        v = draws.reshape(-1)
        if keep is not None:
            r, v = r[keep.reshape(-1)], v[keep.reshape(-1)]
        block = sp.csr_array((np.ones(r.size, dtype=np.int64), (r, v)), shape=(hi - lo, corpus.base.size))
        block.sum_duplicates()  # a block at a time: memory of the counts, not of the draws
        blocks.append(block)
        if groups:  # row g n + i: position i of group g's documents (or of class L's)
            g_rows = (doc_rows[None, :] + np.arange(lo, hi)[:, None]).reshape(-1)
            if keep is not None:
                g_rows = g_rows[keep.reshape(-1)]
            g_block = sp.coo_array((np.ones(g_rows.size, dtype=np.int64), (g_rows, v)),
                                   shape=((groups + 1 + classes) * n, corpus.base.size)).tocsr()
            g_block.sum_duplicates()
            group_blocks.append(g_block)
    m = sp.csr_array(sp.vstack(blocks, format="csr"))
    m.sum_duplicates()
    if not groups:
        return m
    grouped = sp.csr_array(functools.reduce(lambda a, b: a + b, group_blocks))
    grouped.sum_duplicates()
    windows = tokens if lengths is None else int(np.count_nonzero(lengths == n))
    return m, WindowGroups(groups, n, grouped, windows, classes, halves_only)


def _binomial_rows(corpus: KnownCorpus, n: int, tokens: int, rng: np.random.Generator, *,
                   lengths: Any = None) -> sp.csr_array:
    """(n, V) CSR: ``Multinomial(tokens, mu_i)`` per row, each row's counts drawn at once
    (with ``lengths``, ``Multinomial(N_i, mu_i)``, ``N_i`` the documents longer than i).

    ``mu_i = (1 - a_i) base + a_i second_i`` is a mixture, so a row is ``K ~ Binomial(N,
    a_i)`` tokens from the second component and ``N - K`` from the base, each a multinomial
    by conditional binomials (numpy's ``Generator.multinomial``, O(V) a row whatever N);
    the drift's second component is a base draw relabelled by ``permutation``, a planted
    one uniform over the position's block. Dense one block of rows at a time (at most
    2^24 cells), kept as CSR.
    """
    vocab = corpus.base.size
    support = np.flatnonzero(corpus.base)  # numpy gives the last category what rounding leaves: keep it in the support
    p = corpus.base[support] / corpus.base[support].sum()
    step = max(1, (1 << 24) // vocab)
    occupancy = None if lengths is None else _reaching(lengths, n)
    blocks = []
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        row_tokens = tokens if occupancy is None else occupancy[lo:hi]
        second = rng.binomial(row_tokens, corpus.mix[lo:hi])
        rows = np.zeros((hi - lo, vocab), dtype=np.int64)
        rows[:, support] = rng.multinomial(row_tokens - second, p)
        if corpus.kind == "drift":
            rows[:, corpus.permutation[support]] += rng.multinomial(second, p)  # base draw v counted as permutation[v]
        elif corpus.kind == "planted":
            for r in np.flatnonzero(second):
                first = corpus.block_start(lo + r)
                rows[r, first:first + corpus.block] += rng.multinomial(int(second[r]), np.full(corpus.block, 1.0 / corpus.block))
        blocks.append(sp.csr_array(rows))
    return sp.csr_array(sp.vstack(blocks, format="csr"))


def _reaching(lengths: np.ndarray, n: int) -> np.ndarray:
    """(n,) int64: how many of the documents (``lengths``, longest first) are longer than i."""
    return np.searchsorted(-lengths, -np.arange(n, dtype=np.int64), side="left").astype(np.int64)


_SAMPLERS = {"tokens": _multinomial_rows, "counts": _binomial_rows}


def _sampler(name: str, choices: dict = _SAMPLERS) -> str:
    """``name`` if it is one of ``choices``, else a one-line ``ValueError``."""
    if name not in choices:
        msg = f"sampler must be one of {', '.join(choices)}, got {name!r}"
        raise ValueError(msg)
    return name


def _markov_stream_blocks(total: int, stay: float, p: np.ndarray, rng: np.random.Generator):
    """The tokens of one Markov stream of ``total`` tokens (each repeats the previous one
    with probability ``stay``, else a fresh draw from ``p``), yielded in blocks of 2^24."""
    cdf = np.cumsum(p)
    cdf /= cdf[-1]
    step = 1 << 24  # tokens at a time: the same draws as one call, in the memory of a block
    fresh = np.concatenate([np.searchsorted(cdf, rng.random(min(step, total - a)), side="right").astype(np.int32)
                            for a in range(0, total, step)])
    last = -1  # the previous block's last token
    for a in range(0, total, step):
        b = min(total, a + step)
        repeat = rng.random(b - a) < stay
        if a == 0:
            repeat[0] = False
        # the last fresh draw at or before t (index -1: the token that ended the previous block)
        source = np.maximum.accumulate(np.where(repeat, -1, np.arange(b - a)))
        tokens = np.where(source >= 0, fresh[a:b][np.maximum(source, 0)], last)
        last = int(tokens[-1])
        yield tokens


def _markov_stream_rows(n: int, windows: int, stay: float, p: np.ndarray, rng: np.random.Generator) -> sp.csr_array:
    """(n, V) CSR: one stream of ``n * windows`` tokens, token by token, cut into windows."""
    vocab = p.size
    matrix = sp.csr_array((int(n), vocab), dtype=np.int64)
    a = 0
    for tokens in _markov_stream_blocks(int(n) * int(windows), stay, p, rng):
        position = np.arange(a, a + tokens.size) % int(n)
        a += tokens.size
        block = sp.csr_array((np.ones(tokens.size, dtype=np.int64), (position, tokens)), shape=(int(n), vocab))
        block.sum_duplicates()
        matrix = matrix + block
    matrix = sp.csr_array(matrix)
    matrix.sum_duplicates()
    return matrix


def markov_stream(n: int, /, *, windows: int, stay: float = 0.5, vocab: int = 5000, exponent: float = 1.1,
                  seed: int = 0) -> np.ndarray:
    """(n * windows,) int32 token ids: the stream :func:`markov_packed_counts` with
    ``sampler="tokens"`` counts at the same seed (its pack-mode counts are those), for
    callers that need the windows themselves (the rotation null's window groups)."""
    if not 0.0 <= stay < 1.0:
        msg = f"stay must be in [0, 1), got {stay}"
        raise ValueError(msg)
    rng = np.random.default_rng(seed)
    return np.concatenate(list(_markov_stream_blocks(int(n) * int(windows), stay, _zipf(vocab, exponent, 1.0), rng)))


def successor_stream(total: int, /, *, stay: float, vocab: int, rng: np.random.Generator) -> np.ndarray:
    """(total,) int64 token ids in [0, ``vocab``): a stationary stream whose next token is
    the previous one + 1 (mod V) with probability ``stay``, else a uniform draw. Every
    position of its windows has the uniform law, and nearby tokens are strongly dependent
    without repeating: the mean of the homogeneity statistic does not drop while its spread
    widens, the case that makes a null treating a window's tokens as independent liberal
    (docs/calibration.md, "The homogeneity test under dependent tokens").

    >>> successor_stream(6, stay=1.0, vocab=4, rng=np.random.default_rng(0)).tolist()
    [3, 0, 1, 2, 3, 0]
    """
    if not 0.0 <= stay <= 1.0:
        msg = f"stay must be in [0, 1], got {stay}"
        raise ValueError(msg)
    fresh = rng.integers(0, vocab, total)
    step = rng.random(total) < stay
    if total:
        step[0] = False
    reset = np.maximum.accumulate(np.where(step, 0, np.arange(total)))  # the last fresh draw at or before t
    return (fresh[reset] + np.arange(total) - reset) % vocab


def counted_documents(docs: list[np.ndarray], n: int, vocab: int,
                      /) -> tuple[PositionalCounts, list[PositionalCounts], WindowGroups]:
    """``(counts, parts, groups)`` of the documents ``docs`` in truncate mode at ``n``
    positions, counted by posstats' own counter: the corpus with its window groups as
    ``posstats count`` keeps them (64 with their length classes up to 4,096 positions, the
    two halves only above), and the counts of its even and of its odd documents (what
    ``--reread`` gives)."""
    spec = CountSpec(positions=n, vocab_size=vocab, mode="truncate")
    parts = []
    for parity in (0, 1):
        acc = CountAccumulator(spec, dense=False)
        acc.add_sequences(docs[parity::2])
        parts.append(acc.result())
    total = CountAccumulator(spec, dense=False, window_groups=kept_window_groups(n, 64), window_block=1,
                             window_halves=n > WINDOW_GROUP_POSITIONS)
    total.add_sequences(docs)
    return total.result(), parts, total.window_groups()


def successor_documents(
    n: int, /, *, documents: int = 3000, stay: float = 0.9, vocab: int = 200, planted: float = 0.0, seed: int = 0,
) -> tuple[PositionalCounts, list[PositionalCounts], WindowGroups]:
    """A truncate-mode corpus of ``documents`` independent documents, each a
    :func:`successor_stream` of length uniform on ``[n / 32, 1.17 n]`` (most shorter than
    n), counted at ``n`` positions by posstats' own counter with its 64 window groups: the
    harshest null measured for the rank test's edge on document halves (strongly dependent
    tokens, falling occupancy; ``benchmarks/bench_document_halves.py``). With ``planted``
    > 0, positions 0-3 of every document draw that share of their tokens from ids 0-9
    (one dimension of structure).

    Returns:
        ``(counts, parts, groups)``: the corpus' counts, the counts of its even and of its
        odd documents (what ``--reread`` gives), and its window groups.
    """
    rng = np.random.default_rng([5150, n, seed])
    lengths = rng.integers(max(1, n // 32), int(1.17 * n) + 1, documents)
    docs = [successor_stream(int(m), stay=stay, vocab=vocab, rng=rng) for m in lengths]
    if planted:
        for d in docs:
            head = d[: min(4, d.size)]
            hit = rng.random(head.size) < planted
            head[hit] = rng.integers(0, 10, int(hit.sum()))
    return counted_documents(docs, n, vocab)


def sticky_draws(draws: np.ndarray, stay: float, rng: np.random.Generator, /) -> np.ndarray:
    """(L,) the chain that repeats its previous token with probability ``stay`` and else
    takes the next of the independent ``draws`` (L,): token t is ``draws[r_t]``, ``r_t``
    the last fresh step at or before t (step 0 is always fresh). Where ``draws`` are
    i.i.d. from a law u, every token of the chain has the law u, and two tokens k apart
    are the same draw with probability ``stay^k``.

    >>> sticky_draws(np.array([5, 6, 7, 8]), 0.0, np.random.default_rng(0)).tolist()
    [5, 6, 7, 8]
    >>> sticky_draws(np.array([5, 6, 7, 8]), 1.0, np.random.default_rng(0)).tolist()
    [5, 5, 5, 5]
    """
    draws = np.asarray(draws)
    fresh = rng.random(draws.size) >= stay
    if draws.size:
        fresh[0] = True
    return draws[np.maximum.accumulate(np.where(fresh, np.arange(draws.size), 0))]


def topic_pieces(sources: list[np.ndarray], length: int, topics: int, rng: np.random.Generator, /) -> np.ndarray:
    """(length,) token ids of one document whose law changes along it: cut at ``topics - 1``
    points drawn uniformly in ``1 .. length - 1`` (pieces may be empty where points meet),
    each piece drawn with replacement from the tokens of a source picked at random. Every
    position's law is the sources' mean law, whatever the cuts.

    >>> doc = topic_pieces([np.array([0]), np.array([1])], 6, 3, np.random.default_rng(0))
    >>> doc.size, set(doc.tolist()) <= {0, 1}
    (6, True)
    """
    cuts = np.sort(rng.integers(1, max(length, 2), topics - 1)) if length > 1 else np.zeros(topics - 1, dtype=np.int64)
    bounds = np.concatenate([[0], np.minimum(cuts, length), [length]])
    picks = rng.integers(0, len(sources), topics)
    return np.concatenate([sources[k][rng.integers(0, sources[k].size, int(b - a))]
                           for k, a, b in zip(picks, bounds[:-1], bounds[1:])]).astype(np.int64, copy=False)


def resampled_documents(
    sources: list[np.ndarray], n: int, /, *, vocab: int, documents: int | None = None, seed: int = 0,
    length_scale: int = 1, planted: float = 0.0, stay: float = 0.0, topics: int = 1,
) -> tuple[PositionalCounts, list[PositionalCounts], WindowGroups]:
    """A truncate-mode corpus with **no positional structure** whose documents differ from
    each other as real ones do: the null of real text's document heterogeneity.

    Each of ``documents`` (None: as many as ``sources``) documents takes the law of one
    source document drawn at random (its tokens are drawn from that source's tokens with
    replacement: its unigram law ``u_d``) and the length of *another*, independent draw.
    Length and content are independent, so every position has the same law
    ``m = mean_d u_d`` (the truth: no position differs), while a document's tokens follow
    its own ``u_d`` at every depth it reaches: a document effect shared by the positions
    one document covers, and a token pool dominated by the longest documents. Counted at
    ``n`` positions by posstats' own counter with its 64 window groups
    (``benchmarks/bench_document_heterogeneity.py``, docs/calibration.md, "Documents that
    differ").

    Args:
        sources: the source documents, each a 1-D array of token ids in ``[0, vocab)``
            (for example the bundled fortunes, tokenized); at least one non-empty.
        n: positions counted.
        length_scale: every drawn length is multiplied by it (long documents of the same
            laws, for contexts above 4,096 positions).
        planted: > 0 plants one dimension of structure: positions 0-3 of every document
            draw that share of their tokens uniformly from ids 1-10 (no longer a null).
        stay: > 0 makes a document's tokens dependent, not exchangeable: each token repeats
            the previous one with probability ``stay``, else is a fresh draw from ``u_d``
            (:func:`sticky_draws`). Every position still has the law ``u_d`` within a
            document (the chain starts from it and keeps it), so the corpus stays a null,
            while nearby tokens are correlated (``stay^k`` at distance k) and a document's
            openings have neighbours on one side only.
        topics: > 1 makes a document's law drift along its length: it is cut at
            ``topics - 1`` points drawn uniformly over its length, and each piece draws its
            tokens from a source of its own (:func:`topic_pieces`). Every piece's law is an
            independent draw, so every position still has the law ``m``: a null whose
            documents change topic, which the model of the documents' excess (one law a
            document) does not describe.

    Returns:
        ``(counts, parts, groups)``: the corpus' counts, the counts of its even and of its
        odd documents (what ``--reread`` gives), and its window groups.

    >>> counts, parts, groups = resampled_documents([np.array([1, 2, 3]), np.array([4])], 2, vocab=5, seed=0)
    >>> counts.spec.mode, int(counts.matrix.sum()) == sum(int(p.matrix.sum()) for p in parts)
    ('truncate', True)
    """
    pool = [np.asarray(s, dtype=np.int64).ravel() for s in sources]
    pool = [s for s in pool if s.size]
    if not pool:
        msg = "resampled_documents needs at least one non-empty source document"
        raise ValueError(msg)
    if any(int(s.min()) < 0 or int(s.max()) >= vocab for s in pool):
        msg = f"source token ids must lie in [0, {vocab})"
        raise ValueError(msg)
    if (int(length_scale) < 1 or not 0.0 <= float(planted) <= 1.0 or not 0.0 <= float(stay) < 1.0
            or int(topics) < 1):
        msg = (f"length_scale must be >= 1, planted in [0, 1], stay in [0, 1) and topics >= 1, got {length_scale}, "
               f"{planted}, {stay} and {topics}")
        raise ValueError(msg)
    lengths = np.array([s.size for s in pool])
    count = len(pool) if documents is None else int(documents)
    rng = np.random.default_rng([8088, n, seed])
    source = rng.integers(0, len(pool), count)
    length = int(length_scale) * lengths[rng.integers(0, len(pool), count)]  # another's length: independent of content
    if int(topics) > 1:
        docs = [topic_pieces(pool, int(m), int(topics), rng) for m in length]
    else:
        docs = [pool[d][rng.integers(0, pool[d].size, m)] for d, m in zip(source, length)]
    if stay:
        docs = [sticky_draws(d, float(stay), rng) for d in docs]
    if planted:
        if vocab < 11:
            msg = f"planted structure draws ids 1-10: the vocabulary needs 11 ids or more, got {vocab}"
            raise ValueError(msg)
        for d in docs:
            head = d[: min(4, d.size)]
            hit = rng.random(head.size) < planted
            head[hit] = rng.integers(1, 11, int(hit.sum()))
    return counted_documents(docs, n, vocab)


def _markov_window_rows(n: int, windows: int, stay: float, p: np.ndarray, rng: np.random.Generator) -> sp.csr_array:
    """(n, V) CSR: ``windows`` independent windows, each a stationary chain, drawn a row of
    counts at a time.

    Row 0 is ``Multinomial(windows, p)`` (each window starts from the stationary law). Each
    window keeps its previous token with probability ``stay``, independently, so of the
    ``c_v`` windows holding token ``v`` at position ``i - 1``, ``Binomial(c_v, stay)`` hold it
    at ``i``; the other ``K`` windows draw afresh, ``Multinomial(K, p)``. Given the row
    before, that is the exact law of the next row (windows are exchangeable), O(V) a row
    whatever ``windows``. Dense one block of rows at a time (at most 2^24 cells), kept as CSR.
    """
    vocab = p.size
    step = max(1, (1 << 24) // vocab)
    row = rng.multinomial(int(windows), p)
    blocks = []
    for lo in range(0, int(n), step):
        hi = min(int(n), lo + step)
        rows = np.empty((hi - lo, vocab), dtype=np.int64)
        for r in range(hi - lo):
            if lo + r:
                kept = rng.binomial(row, stay)
                row = kept + rng.multinomial(int(windows) - int(kept.sum()), p)
            rows[r] = row
        blocks.append(sp.csr_array(rows))
    return sp.csr_array(sp.vstack(blocks, format="csr"))


_MARKOV_SAMPLERS = {"tokens": _markov_stream_rows, "counts": _markov_window_rows}


def markov_packed_counts(n: int, /, *, windows: int, stay: float = 0.5, vocab: int = 5000, exponent: float = 1.1,
                         seed: int = 0, sampler: str = "tokens") -> PositionalCounts:
    """Pack-mode counts of a *stationary* stream with dependent tokens: each token repeats
    the previous one with probability ``stay`` and is otherwise a fresh Zipf(``exponent``)
    draw over ``vocab`` ids (a Markov chain whose stationary distribution, and every
    position's marginal, is the Zipf base). The stream is cut into ``windows`` consecutive
    windows of ``n`` tokens (``pack`` mode), so tokens at nearby positions of one window are
    dependent while every position has the same distribution: the null hypothesis of
    the verdict's tests, with the dependence of real packed text.

    ``sampler``:

    - ``tokens`` (default, every figure up to 2026-11-29): one stream of ``n * windows``
      tokens drawn token by token; a window's first token continues the window before.
    - ``counts``: the windows are independent chains (a Markov chain per document), each
      starting from the stationary law, and each row of counts is drawn at once from the
      row before (``Binomial(c_v, stay)`` windows keep token ``v``, the rest draw afresh).
      Within a window the law is the same; only the link from one window's last token to
      the next window's first is gone. About 80 s at n = 131,072 whatever ``windows``,
      where ``tokens`` grows with ``n * windows``. The same seed is another corpus under each.

    Returns:
        (n, vocab) sparse int64 counts, spec mode ``pack``, ``windows`` windows.
    """
    if not 0.0 <= stay < 1.0:
        msg = f"stay must be in [0, 1), got {stay}"
        raise ValueError(msg)
    rng = np.random.default_rng(seed)
    matrix = _MARKOV_SAMPLERS[_sampler(sampler, _MARKOV_SAMPLERS)](int(n), int(windows), stay, _zipf(vocab, exponent, 1.0), rng)
    spec = CountSpec(positions=int(n), vocab_size=vocab, mode="pack")
    return PositionalCounts(spec, matrix, int(windows), int(windows), int(n) * int(windows), "",
                            {"known": f"markov stay={stay} windows={windows} seed={seed} sampler={sampler}"})


# Poisson rows: the sampler of the generated corpora

_CHUNK_ELEMENTS = 1 << 22  # rows x columns per temporary in the sampler (32 MiB of int64)


def _alias_table(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker's alias table of a probability vector: O(1) per draw."""
    k = p.size
    prob = p * (k / p.sum())
    alias = np.arange(k, dtype=np.int64)
    small = list(np.flatnonzero(prob < 1.0))
    large = list(np.flatnonzero(prob >= 1.0))
    while small and large:
        s, g = small.pop(), large[-1]
        alias[s] = g
        prob[g] -= 1.0 - prob[s]
        if prob[g] < 1.0:
            large.pop()
            small.append(g)
    prob[small + large] = 1.0
    return prob, alias


def poisson_rows(
    n: int,
    vocab: int,
    *,
    dense_cols: np.ndarray,
    dense_rates: Any,
    tail_cols: np.ndarray,
    tail_p: np.ndarray,
    tail_rate: np.ndarray,
    rng: np.random.Generator,
) -> sp.csr_array:
    """(n, vocab) sparse int64 Poisson counts, drawn in row blocks (never an n x vocab array).

    ``C[i, dense_cols] ~ Poisson(dense_rates(lo, hi)[i - lo])`` for the columns drawn
    densely, and ``C[i, tail_cols] ~ Poisson(tail_rate[i] * tail_p)`` for the tail, drawn
    as ``Poisson(tail_rate[i])`` tokens per row placed by an alias table of ``tail_p``
    (O(tokens)). The sampler of the generated corpora here.

    Args:
        n, vocab: shape of the result.
        dense_cols: (h,) columns drawn densely.
        dense_rates: ``(lo, hi) -> (hi - lo, h)`` Poisson means of rows ``lo .. hi - 1``.
        tail_cols: (t,) the other columns with mass.
        tail_p: (t,) distribution over ``tail_cols`` (empty when t = 0).
        tail_rate: (n,) expected tail tokens per row.
        rng: consumed in row-block order (seeded draws are reproducible).
    """
    chunk = max(1, min(n, _CHUNK_ELEMENTS // max(1, dense_cols.size + 1)))
    prob, alias = _alias_table(tail_p) if tail_cols.size else (None, None)
    pieces = []
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        b = hi - lo
        rates = dense_rates(lo, hi)
        front = rng.poisson(rates) if dense_cols.size else np.zeros((b, 0), dtype=np.int64)
        fr, fc = np.nonzero(front)
        rows_parts = [fr.astype(np.int64)]
        cols_parts = [dense_cols[fc].astype(np.int64)]
        vals_parts = [front[fr, fc].astype(np.int64)]
        if tail_cols.size:
            ntail = rng.poisson(tail_rate[lo:hi])
            m = int(ntail.sum())
            j = rng.integers(0, tail_cols.size, m)
            j = np.where(rng.random(m) < prob[j], j, alias[j])
            keys = np.repeat(np.arange(b, dtype=np.int64) * tail_cols.size, ntail) + j
            keys, cnt = np.unique(keys, return_counts=True)
            r, c = np.divmod(keys, tail_cols.size)
            rows_parts.append(r)
            cols_parts.append(tail_cols[c].astype(np.int64))
            vals_parts.append(cnt.astype(np.int64))
        piece = sp.csr_array(
            (np.concatenate(vals_parts), (np.concatenate(rows_parts), np.concatenate(cols_parts))),
            shape=(b, vocab),
            dtype=np.int64,
        )
        piece.sum_duplicates()
        pieces.append(piece)
    return _concatenate_rows(pieces, n, vocab)


def _concatenate_rows(pieces: list[sp.csr_array], n: int, vocab: int) -> sp.csr_array:
    """Stack CSR row blocks (n rows in all) into one (n, vocab) CSR, emptying ``pieces``.

    By hand rather than ``sp.vstack``: one copy of the data, and int32 indices / indptr
    when they fit (scipy upcasts both if either is int64): a third less memory.
    """
    nnz = sum(int(p.nnz) for p in pieces)
    index_dtype = np.int32 if nnz < 2**31 and vocab < 2**31 else np.int64
    data = np.empty(nnz, dtype=np.int64)
    indices = np.empty(nnz, dtype=index_dtype)
    indptr = np.zeros(n + 1, dtype=index_dtype)
    pos, row = 0, 0
    while pieces:
        p = pieces.pop(0)
        data[pos : pos + p.nnz] = p.data
        indices[pos : pos + p.nnz] = p.indices
        indptr[row + 1 : row + 1 + p.shape[0]] = p.indptr[1:] + pos
        pos += int(p.nnz)
        row += int(p.shape[0])
    return sp.csr_array((data, indices, indptr), shape=(n, vocab))
