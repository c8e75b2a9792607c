"""Corpus drift (posstats diff): the per-position two-sample test, its calibration and power,
the global comparison, and the command end to end."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.stats import hypergeom

from posstats.cli import main
from posstats.counting.counts import CountSpec, PositionalCounts
from posstats.counting.io import save_counts
from posstats.errors import InputError
from posstats.estimates.two_sample import (
    EXACT_LIMIT,
    compare_positions,
    holm,
    null_moments,
)
from posstats.geometry.procrustes import procrustes_drift


def _sample(rng, p: np.ndarray, occupancy: np.ndarray) -> np.ndarray:
    """(n, V) multinomial counts: row i has occupancy[i] tokens drawn from p[i]."""
    return np.stack([rng.multinomial(int(k), row) for k, row in zip(occupancy, p, strict=True)])


def _distributions(n: int, vocab: int, seed: int) -> np.ndarray:
    """Zipf-like rows, each a little different (a realistic sparse regime)."""
    rng = np.random.default_rng(seed)
    base = 1.0 / (np.arange(vocab) + 2.7) ** 1.07
    p = base * rng.gamma(2.0, 1.0, size=(n, vocab))
    return p / p.sum(axis=1, keepdims=True)


# ----------------------------------------------------------------------------- null moments


@pytest.mark.parametrize(("c", "na", "nb"), [(1, 10, 30), (3, 5, 5), (17, 200, 90), (64, 1000, 1000), (40, 41, 3)])
def test_null_moments_are_exact_for_small_pooled_counts(c, na, nb):
    k = np.arange(c + 1)
    pmf = hypergeom.pmf(k, na + nb, c, na)
    t = (np.sqrt(k / na) - np.sqrt((c - k) / nb)) ** 2
    mean, var, third = null_moments(np.array([c]), np.array([na]), np.array([nb]))
    m = (pmf * t).sum()
    assert mean[0] == pytest.approx(m, rel=1e-9)
    assert var[0] == pytest.approx((pmf * (t - m) ** 2).sum(), rel=1e-7, abs=1e-18)
    assert third[0] == pytest.approx((pmf * (t - m) ** 3).sum(), rel=1e-6, abs=1e-24)


def test_null_moments_expansion_continues_the_exact_values():
    """Just above the enumeration limit, the delta-method moments are within a few % of the exact ones."""
    c, na, nb = EXACT_LIMIT + 1, 3000, 5000
    k = np.arange(c + 1)
    pmf = hypergeom.pmf(k, na + nb, c, na)
    t = (np.sqrt(k / na) - np.sqrt((c - k) / nb)) ** 2
    mean, var, _ = null_moments(np.array([c]), np.array([na]), np.array([nb]))
    assert mean[0] == pytest.approx((pmf * t).sum(), rel=0.03)
    assert var[0] == pytest.approx((pmf * t * t).sum() - (pmf * t).sum() ** 2, rel=0.15)


def test_a_known_corpus_resampled_keeps_its_truth():
    """``KnownCorpus.sample``: another corpus from the same mu_i (the diff table's null), the
    drift's permutation included: the last position's most frequent token is the one the
    permutation moves the base's top token to, in both samples, and it is ``mu``'s largest
    entry there (the truth and the sampler agree); the two samples differ."""
    from posstats.testing import known_corpus

    corpus = known_corpus("drift", 16, tokens=4000, vocab=300, seed=4)
    again = corpus.sample(4000, seed=5)
    assert again.matrix.shape == corpus.counts.matrix.shape and again.spec == corpus.counts.spec
    assert (np.asarray(again.matrix.sum(axis=1)).ravel() == 4000).all() and again.tokens == 16 * 4000
    top = int(corpus.permutation[0])  # a base draw of id 0 is written as permutation[0]
    assert top != 0 and corpus.mu(15).argmax() == top and corpus.mu(0).argmax() == 0
    for m in (corpus.counts.matrix, again.matrix):
        rows = m.toarray()
        assert rows[0].argmax() == 0 and rows[-1].argmax() == top
    assert (again.matrix != corpus.counts.matrix).nnz > 0
    quarter = corpus.sample(1000, seed=6)
    assert (np.asarray(quarter.matrix.sum(axis=1)).ravel() == 1000).all()
    # halfway (mix 1/2) 400,000 draws follow mu: the plug-in d_H^2 of their frequencies to mu
    # is about (V - 1) / (4 N) = 1.9e-4 (a chi-square / 4N), while the inverse relabelling
    # (the law a sampler that disagreed with mu would draw) is far further away
    mid = known_corpus("drift", 3, tokens=400_000, vocab=300, seed=4)
    freq = mid.counts.matrix.toarray()[1] / 400_000
    mu = mid.mu(1)
    other = 0.5 * mid.base + 0.5 * mid.base[mid.permutation]
    assert ((np.sqrt(freq) - np.sqrt(mu)) ** 2).sum() < 3 * 299 / (4 * 400_000)
    assert ((np.sqrt(freq) - np.sqrt(other)) ** 2).sum() > 10 * 299 / (4 * 400_000)


def test_holm_steps_down():
    p = np.array([0.001, 0.011, 0.03, 0.9, np.nan])
    assert holm(p, 0.05).tolist() == [True, True, False, False, False]  # 0.03 > 0.05 / 2 stops the steps
    assert holm(np.array([0.01, 0.011]), 0.05).tolist() == [True, True]
    assert not holm(np.array([np.nan, np.nan]), 0.05).any()


# ----------------------------------------------------------------------------- calibration and power


def test_same_distribution_false_alarms_at_most_the_level_and_uniform_p_values():
    """Two samples from one distribution, 300 seeds of 64 positions: the family-wise false-alarm
    rate is at most 5 % (plus Monte-Carlo slack) and the p-values are uniform in the tail."""
    p = _distributions(64, 3000, seed=1)
    alarms, pv = 0, []
    for seed in range(300):
        rng = np.random.default_rng(seed)
        a = _sample(rng, p, rng.integers(3, 4000, 64))
        b = _sample(rng, p, rng.integers(3, 4000, 64))
        t = compare_positions(a, b)
        alarms += bool(t.changed.any())
        pv.append(t.p_value)
    pv = np.concatenate(pv)
    assert alarms / 300 <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / 300)
    for level in (0.1, 0.01, 0.001):
        assert (pv <= level).mean() <= 1.3 * level + 3 * np.sqrt(level / pv.size)


def test_permutation_exceedances_match_the_enumerated_split_law():
    """The simulated permutation null of one position equals the exact law of a random split
    of its pooled tokens (every subset of N_a tokens equally likely), within 4 binomial sd."""
    from itertools import combinations

    from posstats.estimates.two_sample import permutation_exceedances

    a, b = np.array([[3, 1, 0, 1]]), np.array([[0, 2, 2, 1]])
    pooled = (a + b).ravel()
    tokens = np.repeat(np.arange(pooled.size), pooled)
    n_a, n = int(a.sum()), int(pooled.sum())

    def d2(counts_a):
        return 2.0 - 2.0 * np.sqrt(counts_a * (pooled - counts_a)).sum() / np.sqrt(n_a * (n - n_a))

    observed = d2(a.ravel())
    splits = [d2(np.bincount(tokens[list(s)], minlength=pooled.size)) for s in combinations(range(n), n_a)]
    exact = float(np.mean(np.asarray(splits) >= observed - 1e-12))
    hits, done = permutation_exceedances(sp.csr_array(a), sp.csr_array(b), observed, draws=20_000, seed=3)
    assert done == 20_000 and 0.05 < exact < 0.95
    assert abs(hits / done - exact) <= 4 * np.sqrt(exact * (1 - exact) / done)


def _planted(effect: float, seed: int, changed: tuple[int, ...] = (5, 17, 40)) -> tuple[np.ndarray, np.ndarray]:
    """A and B from one distribution except at ``changed``, where B's row mixes in ``effect``
    of a distribution concentrated on a few tokens."""
    p = _distributions(64, 3000, seed=2)
    q = p.copy()
    bump = np.zeros(3000)
    bump[100:110] = 0.1
    for i in changed:
        q[i] = (1 - effect) * p[i] + effect * bump
    rng = np.random.default_rng(seed)
    return _sample(rng, p, np.full(64, 2000)), _sample(rng, q, np.full(64, 2000))


def test_a_planted_change_is_found_at_exactly_those_positions():
    a, b = _planted(0.2, seed=0)
    t = compare_positions(a, b)
    assert np.flatnonzero(t.changed).tolist() == [5, 17, 40]
    assert np.all(t.d_h[[5, 17, 40]] > t.threshold_d_h()[[5, 17, 40]])


def test_detection_power_grows_with_the_effect():
    """Power (fraction of the 3 planted positions found, 20 seeds) at 2,000 tokens per position
    on each side when B moves a share of each planted position's mass onto 10 tokens. Measured
    over 40 seeds (docs/drift.md): 0.0 at 2 %, 0.28 at 5 %, 0.86 at 8 %, 0.98 at 10 %, 1.0 from 15 %."""
    power, false_positives = {}, 0
    for effect in (0.02, 0.05, 0.08, 0.15):
        found = []
        for seed in range(20):
            a, b = _planted(effect, seed=seed)
            t = compare_positions(a, b)
            found.append(t.changed[[5, 17, 40]].mean())
            false_positives += int(np.delete(t.changed, [5, 17, 40]).sum())
        power[effect] = float(np.mean(found))
    assert power[0.02] <= 0.1 and 0.15 <= power[0.05] <= 0.5 and power[0.08] >= 0.7 and power[0.15] == 1.0
    assert false_positives <= 2  # of 80 x 61 unchanged positions, at a 5 % family-wise level per run


def test_block_by_block_reading_equals_whole_matrices():
    a, b = _planted(0.1, seed=3)
    whole = compare_positions(sp.csr_array(a), sp.csr_array(b))
    blocks = compare_positions(lambda lo, hi: a[lo:hi], lambda lo, hi: b[lo:hi], n=64, rows_per_block=7)
    np.testing.assert_allclose(blocks.p_value, whole.p_value)
    np.testing.assert_array_equal(blocks.changed, whole.changed)


def test_positions_empty_on_one_side_are_reported_apart():
    a = np.array([[3, 1], [0, 0], [2, 2], [0, 0]])
    b = np.array([[1, 3], [4, 0], [0, 0], [0, 0]])
    t = compare_positions(a, b)
    assert t.empty_in_a.tolist() == [1] and t.empty_in_b.tolist() == [2]
    assert t.tested.tolist() == [True, False, False, False] and np.isnan(t.p_value[1:]).all()


def test_procrustes_drift_ignores_rotation_and_finds_the_moved_position():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 4))
    q, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    y = x @ q
    y[7] += 3.0 * q[0]  # position 7 moves by 3 in the rotated frame
    al = procrustes_drift(x, y)
    assert int(np.argmax(al.drift)) == 7 and al.drift[7] > 2.5
    assert np.median(al.drift) < 0.2


# ----------------------------------------------------------------------------- the command


def _counts(matrix: np.ndarray, *, positions: int | None = None, mode: str = "truncate") -> PositionalCounts:
    n, v = matrix.shape
    return PositionalCounts(CountSpec(positions=positions or n, vocab_size=v, mode=mode), sp.csr_array(matrix),
                            sequences=int(matrix.sum(axis=1).max()), windows=int(matrix.sum(axis=1).max()),
                            tokens=int(matrix.sum()))


def _planted_count_folders(tmp_path) -> tuple[str, str]:
    """Count folders A and B of the planted change at positions 5, 17 and 40 (seed 4)."""
    a, b = _planted(0.2, seed=4)
    save_counts(_counts(a), tmp_path / "a")
    save_counts(_counts(b), tmp_path / "b")
    return str(tmp_path / "a"), str(tmp_path / "b")


def test_diff_cli_finds_the_planted_positions_and_fails_on_change(tmp_path):
    out = tmp_path / "diff"
    args = ["diff", *_planted_count_folders(tmp_path), "--out", str(out), "--dims", "2,8", "--encodings", "mds,sinusoidal"]
    assert main(args) == 0
    d = json.loads((out / "diff.json").read_text())
    assert d["schema_version"] == 1 and d["positions"]["changed"] == [5, 17, 40]
    assert d["a"]["kind"] == "counts" and len(d["positions"]["d_h"]) == 64 and len(d["positions"]["p_value"]) == 64
    assert d["summary"].startswith("3 position(s) changed (of 64 tested")
    assert {e["name"] for e in d["encodings"]} == {"mds", "sinusoidal"} and d["spectrum"]["a"]["rank"] >= 1
    assert len(d["mds_drift"]["drift"]) == 64
    html = (out / "diff.html").read_text()
    assert "3 position(s) changed" in html and "change_by_position" in html
    assert (out / "figures" / "spectra.png").stat().st_size > 1000
    assert main([*args, "--fail-on-change"]) == 3


def test_diff_of_real_text_split_by_document_parity_finds_nothing(tmp_path, data_dir, capsys):
    lines = (data_dir / "fortunes-sample.jsonl").read_text().splitlines()
    for name, part in (("even", lines[0::2]), ("odd", lines[1::2])):
        (tmp_path / f"{name}.jsonl").write_text("\n".join(part) + "\n")
        assert main(["run", "--input", str(tmp_path / f"{name}.jsonl"), "--text-column", "text", "--tokenizer",
                     str(data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json"), "--positions", "64",
                     "--dims", "2,16", "--out", str(tmp_path / name)]) == 0
    capsys.readouterr()
    assert main(["diff", str(tmp_path / "even"), str(tmp_path / "odd"), "--out", str(tmp_path / "diff"),
                 "--fail-on-change"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == "0 position(s) changed (of 64 tested, family-wise level 5 %)"
    d = json.loads((tmp_path / "diff" / "diff.json").read_text())
    assert d["a"]["kind"] == "run" and d["a"]["run_id"] and d["encodings"]
    # Two halves of one corpus: no encoding's stress "changed beyond the intervals" either;
    # with most of each side's distances noise the intervals are not compared at all.
    assert not any(e["exceeds_interval"] for e in d["encodings"])
    assert d["a"]["counts"] == str(tmp_path / "even") and d["b"]["counts"] == str(tmp_path / "odd")  # the folders named
    with_intervals = [e for e in d["encodings"] if not e["interval"].startswith("none (exact")]
    assert with_intervals and all(e["interval"].startswith("none: sampling noise gives A ") for e in with_intervals)


def _documents(path) -> list[str]:
    """The documents posstats reads from a file: JSON Lines rows' ``text``; a Markdown file's
    paragraphs (non-blank lines up to a blank one, joined by newlines); any other text file's
    non-blank lines (docs/inputs.md)."""
    import gzip
    import re

    name = str(path)
    text = (gzip.open(path, "rt", encoding="utf-8") if name.endswith(".gz") else open(path, encoding="utf-8")).read()
    if ".jsonl" in name:
        return [json.loads(line)["text"] for line in text.splitlines() if line.strip()]
    if ".md" in name:
        docs = ["\n".join(ln.strip() for ln in block.splitlines() if ln.strip())
                for block in re.split(r"\n[ \t\r\f\v]*\n", text)]
    else:
        docs = [ln.strip() for ln in text.splitlines()]
    return [d for d in docs if d]


def _diff_of_halves(tmp_path, docs: list[str], side: np.ndarray, tokenizer) -> dict:
    """``posstats count`` of each half (BERT WordPiece, 64 positions, truncate), then
    ``posstats diff`` of the two count folders; diff.json."""
    for h in (0, 1):
        path = tmp_path / f"half{h}.jsonl"
        path.write_text("".join(json.dumps({"text": d}) + "\n" for d, s in zip(docs, side, strict=True) if s == h))
        assert main(["count", "--input", str(path), "--text-column", "text", "--tokenizer", str(tokenizer),
                     "--positions", "64", "--out", str(tmp_path / f"half{h}"), "-q"]) == 0
    assert main(["diff", str(tmp_path / "half0"), str(tmp_path / "half1"), "--out", str(tmp_path / "diff"),
                 "--dims", "2", "--encodings", "mds,sinusoidal", "-q"]) == 0
    return json.loads((tmp_path / "diff" / "diff.json").read_text())


@pytest.mark.parametrize("corpus", ["data/fortunes-sample.jsonl", "data/shakespeare-sample.txt",
                                    "shared/corpora/fortunes.txt.gz", "shared/corpora/shakespeare.md.gz"])
def test_diff_of_random_halves_of_every_real_corpus_runs_and_finds_nothing(tmp_path, data_dir, request, corpus):
    """Issue #28's target: ``posstats diff`` runs on two halves of every real corpus (the
    bundled samples and ../shared/corpora). Documents assigned to halves at random are
    exchangeable, the test's null: no position changed (at a family-wise 5 %, per corpus;
    the level itself is measured by ``bench_calibration.py``'s diff table)."""
    root = data_dir.parent if corpus.startswith("data/") else request.getfixturevalue("shared_dir").parent
    docs = _documents(root / corpus)
    side = np.random.default_rng(0).permutation(len(docs)) % 2
    d = _diff_of_halves(tmp_path, docs, side, data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json")
    p = d["positions"]
    assert p["tested"] == 64 and p["changed"] == [] and not p["empty_in_a"] and not p["empty_in_b"]
    assert d["summary"] == "0 position(s) changed (of 64 tested, family-wise level 5 %)"


def test_diff_of_alternate_paragraphs_of_shakespeare_finds_the_alternating_speakers(tmp_path, data_dir, shared_dir):
    """Even against odd paragraphs of the plays is *not* a null: a paragraph is a speaker's
    name and speech, and two speakers alternate in a dialogue, so one half holds more of
    one name. ``diff`` finds the name's word pieces (positions 2 and 3, after the two ``*``)
    and at most a few other positions: power on real text, where the change is known by
    construction."""
    docs = _documents(shared_dir / "corpora" / "shakespeare.md.gz")
    assert docs[0] and all(d for d in docs)
    d = _diff_of_halves(tmp_path, docs, np.arange(len(docs)) % 2, data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json")
    changed = d["positions"]["changed"]
    assert {2, 3} <= set(changed) and len(changed) <= 6, changed


def test_stress_intervals_compared_only_when_both_sides_are_mostly_signal():
    from posstats.drift.compare import SideGeometry, _encodings_entry

    def side(share, lo, hi):
        report = {"null": {"distance_noise": {"share": share}},
                  "encodings": [{"name": "alibi", "dim": 2, "stress": 1.0, "scaled_stress": (lo + hi) / 2,
                                 "scaled_stress_ci95": [lo, hi], "stress_interval": "jackknife, 10 random token groups"}]}
        return SideGeometry(report, np.arange(3), np.zeros((3, 1)), np.ones(1))

    (clean,) = _encodings_entry(side(0.05, 0.10, 0.11), side(0.07, 0.20, 0.21))
    assert clean["exceeds_interval"] is True and clean["interval"] == "jackknife 95 %"
    (noisy,) = _encodings_entry(side(0.05, 0.10, 0.11), side(0.4, 0.20, 0.21))
    assert noisy["exceeds_interval"] is None and "B 40%" in noisy["interval"]


def test_p_values_are_never_printed_as_zero():
    from posstats.drift.report import p_value_text

    assert p_value_text(0.0) == "< 1e-16" and p_value_text(3e-300) == "< 1e-16"
    assert p_value_text(0.0123) == "0.012"


def test_pearson3_tail_of_a_point_mass_warns_nothing():
    """sd = 0 (every pooled token identical) gives shape inf and scale 0: no RuntimeWarning."""
    import warnings

    from posstats.estimates.two_sample import _quantile, _tail

    mean, sd, third = np.array([1.0, 2.0]), np.array([0.0, 0.5]), np.array([0.0, 0.1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tail = _tail(np.array([1.5, 2.5]), mean, sd, third)
        q = _quantile(mean, sd, third, 0.05)
    assert tail[0] == 0.0 and 0 < tail[1] < 1 and q[0] == 1.0


def test_diff_refuses_counts_made_differently(tmp_path, capsys):
    m = np.ones((8, 5), dtype=np.int64)
    save_counts(_counts(m), tmp_path / "a")
    save_counts(_counts(m, mode="pack"), tmp_path / "b")
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "counted differently: mode 'truncate' vs 'pack'" in err
    assert not (tmp_path / "d").exists()
    with pytest.raises(InputError, match="no such count folder"):
        from posstats.drift import load_side

        load_side(tmp_path / "missing")


@pytest.mark.slow
def test_diff_at_131072_positions_reads_block_by_block(tmp_path, monkeypatch):
    """n = 131,072: two count folders of one generated distribution, except that B's first 3
    positions carry a planted change; the CLI analyses both and the per-position test reads
    the counts a block at a time (never a whole corpus)."""
    from posstats.counting import io
    from posstats.testing import synthetic_counts

    a = synthetic_counts(131072, 400, tokens=60, rank=0, seed=1).counts
    b = synthetic_counts(131072, 400, tokens=60, rank=0, seed=2).counts
    mb = sp.lil_array(b.matrix)
    for i in range(3):
        mb[i, :] = 0
        mb[i, 390] = 60  # every token of the position is one id
    b = PositionalCounts(b.spec, sp.csr_array(mb), sequences=b.sequences, windows=b.windows, tokens=int(mb.sum()))
    save_counts(a, tmp_path / "a")
    save_counts(b, tmp_path / "b")
    widest = []
    real = io.load_rows

    def spy(path, start, stop, **kw):
        widest.append(stop - start)
        return real(path, start, stop, **kw)

    monkeypatch.setattr("posstats.drift.compare.load_rows", spy)
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "d"), "--dims", "2",
                 "--encodings", "mds", "--noise-floor", "off", "--null", "none", "--stress-halfwidth", "0.02"]) == 0
    d = json.loads((tmp_path / "d" / "diff.json").read_text())
    assert d["positions"]["changed"] == [0, 1, 2] and d["positions"]["tested"] == 131072
    assert max(widest) <= 4096 and len(widest) >= 2 * 32
    # no 95 % interval on P_MDS' stress: A shows no structure of its own (the verdict ties every
    # encoding), and a fitted encoding above 2,048 rows would have none either (token noise unmeasured)
    assert d["encodings"][0]["interval"].startswith(("none: no test found", "none: a fitted encoding"))
    assert d["encodings"][0]["exceeds_interval"] is None
    assert len(d["mds_drift"]["drift"]) == 131072


def test_blocks_follow_the_stored_counts_and_a_block_with_nothing_to_test_is_fine():
    from posstats.estimates.two_sample import block_bounds

    ia, ib = np.array([0, 10, 20, 21, 21, 30]), np.array([0, 5, 5, 6, 9, 9])
    assert block_bounds(ia, ib, 5, entries=16, max_rows=4) == [0, 1, 4, 5]  # the heavy first row alone
    assert block_bounds(None, None, 10, max_rows=4) == [0, 4, 8, 10]
    a = np.array([[3, 1], [2, 2], [0, 0], [0, 0]])
    b = np.array([[1, 3], [2, 2], [4, 0], [0, 0]])
    t = compare_positions(lambda lo, hi: a[lo:hi], lambda lo, hi: b[lo:hi], n=4, bounds=[0, 2, 4])
    assert t.tested.tolist() == [True, True, False, False] and t.empty_in_a.tolist() == [2]


def test_an_interrupted_diff_leaves_the_previous_outputs_whole(tmp_path, monkeypatch, capsys):
    """Disk full (or a kill) before diff.json: the previous diff.json, diff.html and figures
    stay published together, none of the new figures appear beside them."""
    import errno
    import hashlib

    import posstats.drift.report as report

    out = tmp_path / "diff"
    args = ["diff", *_planted_count_folders(tmp_path), "--out", str(out), "--dims", "2", "--encodings", "mds"]
    assert main(args) == 0

    def state() -> dict[str, str]:
        return {f"{name}/{f}" if f else name: hashlib.sha256((out / name / f).read_bytes()).hexdigest()
                for name in os.listdir(out) if name != ".posstats"
                for f in (sorted(os.listdir(out / name)) if (out / name).is_dir() else [""])}

    before = state()
    assert {"diff.json", "diff.html"} <= set(before) and any(k.startswith("figures/") for k in before)

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(report, "write_json_atomic", full)
    save_counts(_counts(_planted(0.4, seed=5)[1]), tmp_path / "b")  # another result, other figures
    capsys.readouterr()
    assert main(args) != 0
    err = capsys.readouterr().err
    assert "space" in err.lower() and len(err.strip().splitlines()) == 1, err
    assert state() == before


def test_a_corpus_with_no_positional_structure_is_a_finding_not_an_error(tmp_path, capsys):
    """Every position has the same distribution (all corpus distances 0): run, report and
    diff succeed and say so; export refuses an all-zero table in one line."""
    (tmp_path / "flat.jsonl").write_text("".join('{"ids": [3, 3, 3, 3, 3, 3, 3, 3]}\n' for _ in range(200)))
    flags = ["--column", "ids", "--vocab-size", "16", "--positions", "8"]
    assert main(["run", "--input", str(tmp_path / "flat.jsonl"), *flags, "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "not distinguishable" in out and "not scored: " in out and "every corpus distance is 0" in out
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["encodings"] == [] and report["spectrum"]["rank"] == 0
    assert {e["spec"] for e in report["skipped_encodings"]} == set(report["config"]["encodings"])
    assert main(["report", str(tmp_path / "run")]) == 0
    assert main(["count", "--input", str(tmp_path / "flat.jsonl"), *flags, "--out", str(tmp_path / "counts")]) == 0
    for a, b in ((tmp_path / "counts", tmp_path / "counts"), (tmp_path / "run", tmp_path / "run")):
        assert main(["diff", str(a), str(b), "--out", str(tmp_path / "diff")]) == 0
        d = json.loads((tmp_path / "diff" / "diff.json").read_text())
        assert d["positions"]["count_changed"] == 0 and d["encodings"] == []
    capsys.readouterr()
    assert main(["export", str(tmp_path / "run"), "--dim", "8", "--out", str(tmp_path / "t.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "nothing to export" in err and err.count("\n") == 1


def test_the_report_pages_say_why_no_encoding_was_scored(tmp_path):
    (tmp_path / "flat.jsonl").write_text("".join('{"ids": [3, 3, 3, 3]}\n' for _ in range(50)))
    assert main(["run", "--input", str(tmp_path / "flat.jsonl"), "--column", "ids", "--vocab-size", "8",
                 "--positions", "4", "--out", str(tmp_path / "run"), "-q"]) == 0
    for name in ("report.html", "summary.md"):
        text = (tmp_path / "run" / name).read_text()
        assert "Not scored: mds, mds-smacof" in text and "every corpus distance is 0" in text, name


def test_spectra_figure_draws_the_useful_range_only():
    """Eigenvalues below 1e-6 of the largest (rounding, negative ones of a corrected B) are not
    drawn, so the axis does not stretch to 1e-15, and the figure says how many were left out."""
    from posstats.drift.report import spectra_figure

    side = {"eigenvalues": [1.0, 0.5, 0.1, 1e-15, -0.2], "rank": 3, "components_above_null": 1}
    doc = {"spectrum": {"a": side, "b": side}, "a": {"label": "A"}, "b": {"label": "B"}}
    p = spectra_figure(doc)
    ax = p.figure.axes[0]
    (line,) = [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 2]
    assert list(line.get_ydata()) == [1.0, 0.5, 0.1] and line.get_markersize() >= 5
    assert ax.get_ylim()[0] > 1e-3
    assert any("2 negative or below" in t.get_text() for t in ax.texts)
