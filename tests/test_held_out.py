"""Held-out scores (posstats.estimates.held_out): halves that add up to the corpus, fitted
encodings that lose their in-sample lead on pure noise and keep it on planted structure,
mds-smacof in the defaults where affordable, and the report / summary / CLI wiring."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

import posstats.analysis.held_out as held_out_module
from posstats.analysis import AnalysisConfig, analyze
from posstats.cli import main
from posstats.counting.counts import CountSpec, PositionalCounts
from posstats.counting.io import save_counts
from posstats.errors import PosstatsError
from posstats.estimates.held_out import held_out_scores, parts_halves, token_halves
from posstats.reports.summary import format_summary


def _counts(matrix: np.ndarray) -> PositionalCounts:
    n, v = matrix.shape
    most = int(matrix.sum(axis=1).max())
    return PositionalCounts(CountSpec(n, v), matrix.astype(np.int64), sequences=most, windows=most, tokens=int(matrix.sum()))


def _noise(n=40, v=300, tokens=400, seed=0) -> np.ndarray:
    """Every position drawn from one distribution: no positional structure at all."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(v))
    return np.stack([rng.multinomial(tokens, p) for _ in range(n)])


def _planted(n=40, v=300, tokens=20_000, seed=0) -> np.ndarray:
    """mu_i moves along a line between two distributions: a 1-D geometry, well sampled."""
    rng = np.random.default_rng(seed)
    q1, q2 = rng.dirichlet(np.ones(v)), rng.dirichlet(np.ones(v))
    return np.stack([rng.multinomial(tokens, (1 - t) * q1 + t * q2) for t in np.linspace(0, 1, n)])


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_token_halves_add_up_to_the_rows_and_split_evenly(kind):
    rows = _noise(n=30, v=50, tokens=2000)
    given = sp.csr_array(rows) if kind == "sparse" else rows
    a, b = token_halves(given, seed=3)
    total = (a + b).toarray() if kind == "sparse" else a + b
    np.testing.assert_array_equal(total, rows)
    share = np.asarray(a.sum(axis=1)).ravel() / rows.sum(axis=1)
    assert np.all(np.abs(share - 0.5) < 0.05)  # 2000 tokens per row: sd of the share ~0.011
    again, _ = token_halves(given, seed=3)
    other, _ = token_halves(given, seed=4)
    dense = (lambda x: x.toarray()) if kind == "sparse" else np.asarray
    assert np.array_equal(dense(again), dense(a)) and not np.array_equal(dense(other), dense(a))


def test_parts_halves_are_even_against_odd_parts():
    parts = [np.full((2, 3), k) for k in range(4)]
    a, b = parts_halves(parts)
    np.testing.assert_array_equal(a, np.full((2, 3), 0 + 2))
    np.testing.assert_array_equal(b, np.full((2, 3), 1 + 3))
    with pytest.raises(ValueError, match="at least 2 parts"):
        parts_halves(parts[:1])


def _held(report: dict) -> dict[tuple[str, int], dict]:
    return {(e["name"], e["dim"]): e for e in report["held_out"]["encodings"]}


def test_on_pure_noise_fitted_encodings_lose_their_lead_held_out():
    report = analyze(_counts(_noise()), AnalysisConfig(dims=(2, 16)), show_progress=False).report()
    held = _held(report)
    assert report["held_out"]["split"] == "tokens at random" and report["held_out"]["stress_method"] == "exact"
    for dim in (2, 16):
        smacof, mds, sinusoidal = held[("mds-smacof", dim)], held[("mds", dim)], held[("sinusoidal", dim)]
        smacof_loss = smacof["held_out_scaled_stress"] - smacof["fit_scaled_stress"]
        assert smacof_loss > 0.1  # it had fitted half A's noise
        assert mds["held_out_scaled_stress"] > mds["fit_scaled_stress"]
        assert sinusoidal["held_out_scaled_stress"] - sinusoidal["fit_scaled_stress"] < smacof_loss / 2
    assert report["verdict"]["components_above_noise"] == 0
    summary = format_summary(report)
    if report["verdict"]["non_stationary"] is False:  # no structure found: every encoding tied, none named
        assert "held out  none named: every encoding is tied" in summary
        widths = [e["dim"] for e in report["held_out"]["encodings"]]
        assert all(len(row["tied_with"]) + 1 == widths.count(row["dim"]) for row in report["verdict"]["held_out_best"])
    else:
        assert "held out" in summary and "(nothing stands above noise)" in summary


def test_on_planted_structure_the_fit_holds_out_and_mds_wins():
    report = analyze(_counts(_planted()), AnalysisConfig(dims=(2, 16)), show_progress=False).report()
    held = _held(report)
    for dim in (2, 16):
        for name in ("mds", "mds-smacof"):
            e = held[(name, dim)]
            assert e["fitted"] and abs(e["held_out_scaled_stress"] - e["fit_scaled_stress"]) < 0.01
            assert e["held_out_scaled_stress"] < held[("sinusoidal", dim)]["held_out_scaled_stress"] / 20
        assert not held[("sinusoidal", dim)]["fitted"]
    best = {b["dim"]: b["best"] for b in report["verdict"]["held_out_best"]}
    assert set(best.values()) <= {"mds", "mds-smacof"}


def test_halves_come_from_the_noise_floors_parts_when_given():
    rows = _planted(n=20, tokens=4000)
    rng = np.random.default_rng(1)
    quarters = [np.zeros_like(rows) for _ in range(4)]
    for i, j in zip(*np.nonzero(rows)):
        for k, c in enumerate(rng.multinomial(rows[i, j], [0.25] * 4)):
            quarters[k][i, j] = c
    report = analyze(_counts(rows), AnalysisConfig(dims=(2,), noise_floor="on"), parts=[_counts(q) for q in quarters],
                     show_progress=False).report()
    h = report["held_out"]
    assert h["split"] == "the noise floor's 4 parts, even against odd"
    assert h["tokens"] == [int(quarters[0].sum() + quarters[2].sum()), int(quarters[1].sum() + quarters[3].sum())]


def test_above_the_exact_limit_held_out_stress_is_sampled_and_its_pairs_range_decides_ties():
    config = AnalysisConfig(dims=(2, 8), exact_limit=20, held_out="on", encodings=("mds", "sinusoidal"),
                            stress_halfwidth=0.02)
    h = analyze(_counts(_planted(n=40, tokens=4000)), config, show_progress=False).report()["held_out"]
    assert h["stress_method"] == "sampled" and len(h["encodings"]) == 4
    for e in h["encodings"]:
        lo, hi = e["held_out_scaled_stress_tie_range"]  # the pairs' range: it leaves out the token noise
        assert lo < e["held_out_scaled_stress"] < hi and hi - lo < 0.1
        assert e["held_out_scaled_stress_ci95"] == [e["held_out_scaled_stress"]] * 2
        assert e["held_out_interval"].startswith("none: above the exact limit the held-out stress is sampled")


def test_exact_held_out_scores_get_the_jackknife_range_for_ties():
    """Each exact held-out score gets the joint jackknife's range (both halves' tokens, the
    fitted encodings refitted): its spread matches the scores' spread over independent
    corpora, and encodings within it are called tied in the held-out best."""
    config = AnalysisConfig(dims=(2,), encodings=("mds", "mds-smacof", "sinusoidal"), held_out="on", null="none")
    scores, widths = [], []
    for seed in range(12):
        h = analyze(_counts(_planted(n=24, v=200, tokens=4000, seed=seed)), config, show_progress=False).report()["held_out"]
        e = {x["name"]: x for x in h["encodings"]}
        sin = e["sinusoidal"]
        assert sin["held_out_interval"].startswith("jackknife range (10 random token groups of each half")
        assert sin["held_out_scaled_stress_ci95"] == [sin["held_out_scaled_stress"]] * 2
        lo, hi = sin["held_out_scaled_stress_tie_range"]
        scores.append(sin["held_out_scaled_stress"])
        widths.append(hi - lo)
        best = h["best"][0]  # mds and SMACOF fit a 1-D line equally well: within each other's range
        assert {best["best"], *best["tied_with"]} >= {"mds", "mds-smacof"}, best
    # width = 2 t_9 sd: the jackknife's sd against the scores' own spread (12 corpora: the
    # sample sd is within a factor 1.6 of the truth with probability > 0.99)
    ratio = np.median(widths) / (2 * 2.262) / np.std(scores, ddof=1)
    assert 1 / 2.5 < ratio < 2.5, ratio


def test_held_out_ranges_are_not_given_for_thin_rows_nor_smacof_above_its_limit(monkeypatch):
    import posstats.estimates.held_out as held_out_module

    thin = held_out_scores(_noise(n=10, v=30, tokens=15), _noise(n=10, v=30, tokens=15, seed=1), np.arange(10),
                           [(2, "sinusoidal"), (2, "random")], exact=True, split="test")
    assert thin["encodings"][0]["held_out_interval"].startswith("none: a row of one half has fewer than 20 tokens")
    # no score has a range, so no point estimate decides: every encoding tied with the best
    (best,) = thin["best"]
    assert {best["best"], *best["tied_with"]} == {"sinusoidal", "random"}
    # rows above the ranges' limit (exact scores, --held-out on): the same, with the reason
    monkeypatch.setattr(held_out_module, "JACKKNIFE_ROWS", 8)
    a, b = token_halves(_planted(n=12, v=100, tokens=2000), seed=0)
    above = held_out_scores(a, b, np.arange(12), [(2, "mds"), (2, "random")], exact=True, split="test")
    assert all(e["held_out_interval"] == "none: held-out ranges are computed up to 8 rows (10 refits of the m x m "
               "MDS); without ranges the held-out best ties every encoding" for e in above["encodings"])
    (best,) = above["best"]
    assert {best["best"], *best["tied_with"]} == {"mds", "random"}
    monkeypatch.setattr(held_out_module, "JACKKNIFE_ROWS", 2048)
    named = held_out_scores(a, b, np.arange(12), [(2, "mds"), (2, "random")], exact=True, split="test")["best"][0]
    assert (named["best"], named["tied_with"]) == ("mds", [])  # a planted line: told apart within its ranges
    monkeypatch.setattr(held_out_module, "JACKKNIFE_SMACOF_ROWS", 8)
    rows = _planted(n=12, v=100, tokens=2000)
    a, b = token_halves(rows, seed=0)
    got = held_out_scores(a, b, np.arange(12), [(2, "mds-smacof"), (2, "sinusoidal")], exact=True, split="test")
    why = {e["name"]: e["held_out_interval"] for e in got["encodings"]}
    assert why["mds-smacof"] == "none: SMACOF is not refitted above 8 rows" and why["sinusoidal"].startswith("jackknife")


def test_held_out_auto_off_and_a_position_empty_in_one_half(monkeypatch):
    counts = _counts(_noise(n=12, tokens=200))
    assert "held_out" not in analyze(counts, AnalysisConfig(dims=(2,), held_out="off"), show_progress=False).report()
    monkeypatch.setattr(held_out_module, "HELD_OUT_AUTO_LIMIT", 8)
    skipped = analyze(counts, AnalysisConfig(dims=(2,)), show_progress=False).report()["held_out"]
    assert "12 geometry rows > 8" in skipped["skipped"] and "--held-out on" in skipped["skipped"]
    a = np.array([[3, 0], [0, 4], [2, 2], [1, 1]])
    b = np.array([[1, 1], [0, 0], [2, 1], [0, 3]])  # position 1 has no token in half B
    section = held_out_scores(a, b, np.arange(4), [(2, "sinusoidal")], exact=True, split="test")
    assert section["positions"] == {"used": 3, "left_out": 1}
    with pytest.raises(PosstatsError, match="held-out setting"):
        AnalysisConfig(held_out="sometimes")


def test_mds_smacof_is_a_default_up_to_its_limit():
    assert "mds-smacof" in AnalysisConfig().encodings
    counts = _counts(_planted(n=30, tokens=2000))
    report = analyze(counts, AnalysisConfig(dims=(2,)), show_progress=False).report()
    assert "mds-smacof" in {e["name"] for e in report["encodings"]} and "skipped_encodings" not in report
    report = analyze(counts, AnalysisConfig(dims=(2,), smacof_limit=20), show_progress=False).report()
    assert "mds-smacof" not in {e["name"] for e in report["encodings"] + report["held_out"]["encodings"]}
    (skip,) = report["skipped_encodings"]
    assert skip["spec"] == "mds-smacof" and "30 geometry rows > --smacof-limit 20" in skip["reason"]
    # above --exact-limit no m x m distances exist: skipped with that reason, not an error after the MDS
    report = analyze(counts, AnalysisConfig(dims=(2,), exact_limit=20, null="mp", held_out="off"),
                     show_progress=False).report()
    (skip,) = report["skipped_encodings"]
    assert skip["spec"] == "mds-smacof" and "above --exact-limit 20 (30 geometry rows" in skip["reason"]
    assert "mds" in {e["name"] for e in report["encodings"]}


def test_cli_flags_and_report_files(tmp_path, capsys):
    save_counts(_counts(_planted(n=24, tokens=3000)), tmp_path / "counts")
    assert main(["analyze", "--counts", str(tmp_path / "counts"), "--dims", "2", "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "held out  d=2:" in out and "fitted on one half of the corpus (tokens at random)" in out
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert report["config"]["held_out"] == "auto" and report["held_out"]["encodings"]
    html = (tmp_path / "a" / "report.html").read_text()
    assert "<h2>Held out</h2>" in html and "scaled stress, held-out half" in html
    assert "Held out:" in (tmp_path / "a" / "summary.md").read_text()
    assert main(["analyze", "--counts", str(tmp_path / "counts"), "--dims", "2", "--held-out", "off",
                 "--smacof-limit", "0", "-q", "--out", str(tmp_path / "b")]) == 0
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert "held_out" not in report and report["skipped_encodings"][0]["spec"] == "mds-smacof"


def test_the_summary_says_why_no_held_out_encoding_is_named():
    """A non-stationary corpus whose halves hold rows under 20 tokens: its held-out scores
    get no ranges, and the summary's held-out line names no encoding and says why."""
    from posstats.testing import known_corpus

    counts = known_corpus("drift", 32, tokens=30, seed=3, vocab=200).counts
    report = analyze(counts, AnalysisConfig(dims=(2,), encodings=("mds", "sinusoidal", "alibi"), held_out="on"),
                     show_progress=False).report()
    assert report["verdict"]["non_stationary"]  # else the line says "no structure found" instead
    (best,) = report["verdict"]["held_out_best"]
    assert {best["best"], *best["tied_with"]} == {"mds", "sinusoidal", "alibi"}
    text = format_summary(report)
    assert "homogeneity, p <= 0.025 (no shuffled corpus of 39 reached it)" in text  # the bound, not "p = <="
    line = next(line for line in text.splitlines() if "held out" in line)
    assert "none named, every encoding tied: no held-out score has a range for ties (a row of one half has fewer " \
           "than 20 tokens)" in line
