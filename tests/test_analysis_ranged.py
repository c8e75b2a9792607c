"""posstats.analysis.analyze_ranges: the analysis with the counts' rows held apart in position
ranges gives analyze's report on the same counts. Everything computed from the counts
themselves is equal (eigenvalues above the noise, stresses, diagnostics, standouts, the
bias b_i, occupancies); what rests on a random split of the tokens (the noise floor's
split-half figures and edge, the jackknife's ranges) is another draw of the same law.
What needs the counts in one process is refused in one line."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp

from posstats.analysis import AnalysisConfig, analyze, analyze_in_ranges
from posstats.cli import main as cli
from posstats.counting.io import load_counts, save_counts
from posstats.counting.window_groups_io import load_window_groups
from posstats.errors import InputError, OptionError
from posstats.reports.analysis_folder import write_analysis
from posstats.runs import run_folder
from posstats.testing import known_corpus, synthetic_counts
from tests.test_integrity import TAMPERINGS, _rewrite_counts

# the sampled path from 200 rows, the analytic null, no held-out scores; pairs and triples
# few enough for a test
CONFIG = AnalysisConfig(exact_limit=200, null="mp", held_out="off", encodings=("mds", "sinusoidal", "rope", "alibi"),
                        stress_halfwidth=0.01, corpus_triples=20_000, dims=(2, 16))


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Rank-3 structure over 600 positions, well above the noise."""
    syn = synthetic_counts(600, 3000, tokens=3000, rank=3, strength=0.4, block_tokens=24, seed=7)
    path = tmp_path_factory.mktemp("planted")
    save_counts(syn.counts, path)
    return path, syn.counts


@pytest.fixture(scope="module")
def both(planted):
    path, counts = planted
    return analyze(counts, CONFIG).report().to_dict(), analyze_in_ranges(path, 3, CONFIG).report().to_dict()



def _same_standouts(ranged: dict, one: dict) -> None:
    """The standout test over ranges decides as in one process. The ranges hold no window
    groups, so only the in-process test may take each row's rotated offset (standout.py,
    "Documents that differ"): its z differ, its decisions must not."""
    keys = ("count", "positions", "ranges", "z_threshold", "family_level")
    assert {k: ranged[k] for k in keys} == {k: one[k] for k in keys}
    assert "rotated_offset" not in ranged

def _close(got, want):
    """Equal entries, numbers to 1e-9 relative."""
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, float):
            assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
        else:
            assert got[key] == value, key


def test_the_report_over_ranges_is_the_one_in_one_process(both):
    one, ranged = both
    assert one["positions"] == ranged["positions"] and one["corpus"] == ranged["corpus"]
    geometry = dict(ranged["geometry"])
    assert geometry.pop("ranges") == 3 and "ranges" not in one["geometry"]
    assert geometry == one["geometry"]
    np.testing.assert_allclose(ranged["noise"]["bias_per_position"], one["noise"]["bias_per_position"], rtol=1e-12)
    a, b = np.asarray(one["spectrum"]["eigenvalues"]), np.asarray(ranged["spectrum"]["eigenvalues"])
    above = a > one["spectrum"]["noise_level"] + one["spectrum"]["noise_residual"]
    assert above.sum() >= 2  # the planted structure: components above the noise
    np.testing.assert_allclose(b[above], a[above], rtol=1e-8)
    np.testing.assert_allclose(b, a, rtol=0, atol=2 * max(one["spectrum"]["noise_residual"],
                                                          ranged["spectrum"]["noise_residual"]))
    assert ranged["verdict"]["components_above_noise"] == one["verdict"]["components_above_noise"]
    _same_standouts(ranged["verdict"]["standout_positions"], one["verdict"]["standout_positions"])
    assert ranged["diagnostics"]["h1"] == one["diagnostics"]["h1"]
    _close(ranged["diagnostics"]["a3"], one["diagnostics"]["a3"])
    _close(ranged["hellinger"], one["hellinger"])
    for x, y in zip(one["encodings"], ranged["encodings"], strict=True):
        assert (x["name"], x["dim"], x["stress_pairs"]) == (y["name"], y["dim"], y["stress_pairs"])
        for key in ("stress", "scaled_stress"):  # the same pairs and distances; P_MDS's bulk to its residual
            assert y[key] == pytest.approx(x[key], rel=1e-6, abs=1e-9), (x["name"], x["dim"], key)
        assert y["stress_interval"].split(",")[0] == x["stress_interval"].split(",")[0]
    # the random split's figures: another draw, the same scale
    assert ranged["noise"]["source"] == one["noise"]["source"] == "token split"
    assert ranged["null"]["threshold"] == pytest.approx(one["null"]["threshold"], rel=0.1)
    assert "held_out" not in ranged and "held_out" not in one  # off


def test_the_noise_share_and_the_jackknife_ran_over_the_ranges(both):
    one, ranged = both
    share_one = one["null"]["distance_noise"]["share"]
    share_ranged = ranged["null"]["distance_noise"]["share"]
    assert share_ranged == pytest.approx(share_one, rel=1e-9)  # the same pairs, the same null draw
    ranges = [(e["name"], e["dim"], e.get("scaled_stress_tie_range") or e["scaled_stress_ci95"]) for e in ranged["encodings"]]
    for (name, dim, (lo, hi)), e in zip(ranges, one["encodings"], strict=True):
        assert lo <= e["scaled_stress"] + 0.05 and hi >= e["scaled_stress"] - 0.05, (name, dim, lo, hi)
        assert 0 <= lo <= hi


def test_left_out_positions_keep_their_occupancy(planted, tmp_path):
    """Positions below the minimum occupancy are not held by any range; the report still
    gives their occupancy (read with the range's rows) and lists them as left out."""
    kc = known_corpus("stationary", 400, tokens=300, seed=2)
    counts = kc.counts
    m = counts.matrix.tolil()
    m[5, :] = 0
    m[5, 7] = 3  # 3 tokens: below the minimum of 10
    m[9, :] = 0  # empty
    counts = dataclasses.replace(counts, matrix=sp.csr_array(m.tocsr()), tokens=int(m.sum()))
    save_counts(counts, tmp_path)
    config = dataclasses.replace(CONFIG, min_occupancy=10, held_out="auto")
    report = analyze_in_ranges(tmp_path, 2, config).report().to_dict()
    assert "held apart" in report["held_out"]["skipped"]  # auto: said why, not scored
    pos = report["positions"]
    assert pos["occupancy"] == counts.occupancy().tolist() and pos["occupancy"][5] == 3
    assert pos["left_out"] == [5, 9] and pos["used"] == 398 and pos["occupied"] == 399


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"buckets": "fixed:8"}, "needs buckets none"),
        ({"device": "gpu"}, "runs on CPUs"),
        ({"exact_limit": 600}, "600 geometry rows"),
        ({"null": "auto"}, "more than 4,096 rows"),
        ({"held_out": "on"}, "held_out on needs the counts"),
        ({"null": "shuffle"}, "null shuffle draws shuffled corpora"),
    ],
)
def test_what_needs_the_counts_in_one_process_is_refused(planted, options, message):
    path, _ = planted
    config = dataclasses.replace(CONFIG, **options)
    with pytest.raises(OptionError, match=message.replace("{", r"\{").replace("}", r"\}")) as err:
        analyze_in_ranges(path, 2, config)
    assert "\n" not in str(err.value)


def test_the_run_of_a_ranged_analysis_reads_only_the_rows_it_needs(planted, both, tmp_path, monkeypatch):
    """write_analysis of an analysis over ranges: the report's distance sample reads its rows
    from the counts file (never the whole counts, and without a second check of every row:
    the ranges checked them and their token total) and equals the in-process run's."""
    path, counts = planted
    ranged = analyze_in_ranges(path, 3, CONFIG)
    one = analyze(counts, CONFIG)

    def whole_counts(*_args, **_kwargs):
        raise AssertionError("the whole counts were loaded")

    def checked_again(*_args, **_kwargs):
        raise AssertionError("every row of the counts was checked a second time")

    monkeypatch.setattr(run_folder, "load_counts", whole_counts)
    monkeypatch.setattr(run_folder, "check_counts_file", checked_again)
    run = write_analysis(tmp_path / "ranged", ranged, inputs={"counts": "elsewhere"}, html=True, max_positions=150)
    assert run.counts is None and run.counts_path() == run_folder.counts_file(path)
    assert (tmp_path / "ranged" / "report.html").stat().st_size > 10_000
    idx, dist = run_folder.run_distances(run, max_positions=150)
    ref = run_folder.run_from_analysis(one, one.report().to_dict(), folder=tmp_path / "one")
    ref_idx, ref_dist = run_folder.run_distances(ref, max_positions=150)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_allclose(dist, ref_dist, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(("change", "why"), TAMPERINGS)
def test_a_tampered_counts_file_is_refused_over_ranges(planted, tmp_path, change, why):
    """Every check of check_counts_file is made by the ranges that read the file: a damaged
    structure, a repeated id, a header whose token total is not the counts' (what lets the
    run's readers skip that second pass) is an InputError naming the file."""
    path, counts = planted
    save_counts(counts, tmp_path)
    _rewrite_counts(tmp_path, change)
    if "positions" in why or "damaged (sparse" in why:  # a header of 40 positions over 600 rows
        why = f"{why}|rows .* are outside the 40 positions"
    with pytest.raises(InputError, match=why) as err:
        analyze_in_ranges(tmp_path, 3, CONFIG)
    assert str(tmp_path) in str(err.value)


def test_the_bundled_real_corpus_over_ranges_is_analysed_as_in_one_process(tmp_path, data_dir):
    """Real text (the bundled fortunes, BERT WordPiece ids, 64 positions, counted by the CLI):
    over 3 ranges, the analysis finds the positions and components the one-process analysis
    finds on the same counts, with the same eigenvalues above the noise and stresses."""
    counts = tmp_path / "counts"
    assert cli(["count", "--input", str(data_dir / "fortunes-sample.jsonl"), "--text-column", "text", "--tokenizer",
                str(data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json"), "--positions", "64",
                "--out", str(counts), "-q"]) == 0
    config = dataclasses.replace(CONFIG, exact_limit=16, dims=(2, 8))
    whole = load_counts(counts)
    one = analyze(whole, config, window_groups=load_window_groups(counts, whole)).report().to_dict()
    ranged = analyze_in_ranges(counts, 3, config).report().to_dict()
    # both measure the edge on the window groups' halves (the short halves hold every document)
    assert one["null"]["edge"]["method"] == ranged["null"]["edge"]["method"] == "halves"
    assert ranged["null"]["edge"]["noise_top"] == pytest.approx(one["null"]["edge"]["noise_top"], rel=1e-6)
    _same_standouts(ranged["verdict"]["standout_positions"], one["verdict"]["standout_positions"])
    assert one["verdict"]["standout_positions"]["count"] >= 1  # the opening positions of real text
    k = one["verdict"]["components_above_noise"]
    assert ranged["verdict"]["components_above_noise"] == k
    np.testing.assert_allclose(ranged["spectrum"]["eigenvalues"][:k], one["spectrum"]["eigenvalues"][:k], rtol=1e-8)
    for x, y in zip(one["encodings"], ranged["encodings"], strict=True):
        assert y["scaled_stress"] == pytest.approx(x["scaled_stress"], rel=1e-6, abs=1e-9), (x["name"], x["dim"])
    assert ranged["positions"] == one["positions"] and ranged["geometry"]["ranges"] == 3


# CONFIG as `posstats analyze` flags
FLAGS = ["--exact-limit", "200", "--null", "mp", "--held-out", "off", "--encodings", "mds,sinusoidal,rope,alibi",
         "--stress-halfwidth", "0.01", "--corpus-triples", "20000", "--dims", "2,16", "-q"]


@pytest.mark.ray
def test_the_command_line_analysis_over_ray_actors_is_the_one_in_one_process(planted, both, tmp_path, ray_session):
    """``posstats analyze --ranges 3``: three RangeWorker actors hold the rows; the folder
    and the report are an in-process run's (the one above), with geometry.ranges = 3."""
    path, _ = planted
    out = tmp_path / "analysis"
    assert cli(["analyze", "--counts", str(path), "--out", str(out), "--ranges", "3", *FLAGS]) == 0
    got = run_folder.load_run(out).report
    one, _ = both
    assert got["geometry"]["ranges"] == 3 and got["positions"] == one["positions"]
    assert got["verdict"]["components_above_noise"] == one["verdict"]["components_above_noise"] >= 2
    _same_standouts(got["verdict"]["standout_positions"], one["verdict"]["standout_positions"])
    for x, y in zip(one["encodings"], got["encodings"], strict=True):
        assert y["scaled_stress"] == pytest.approx(x["scaled_stress"], rel=1e-6, abs=1e-9), (x["name"], x["dim"])
    assert (out / "report.html").stat().st_size > 10_000 and (out / "mds.safetensors").is_file()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ranges", "2", "--buckets", "fixed:8"], "--ranges 2 (2 range(s)): an analysis over position ranges needs"),
        (["--ranges", "2", "--reread"], "--reread splits the corpus in one process"),
        (["--ranges", "0"], "--ranges must be between 1 and 1024"),
        (["--memory-budget", "0.1"], "--memory-budget 0.1 GiB leaves nothing for the counts"),
        (["--memory-budget", "inf"], "--memory-budget must be a finite number of GiB, got inf"),
        (["--address", "127.0.0.1:1"], "--address names the Ray cluster of --ranges / --memory-budget"),
    ],
)
def test_range_flags_that_cannot_run_are_refused_in_one_line(planted, tmp_path, capsys, flags, message):
    path, _ = planted
    out = tmp_path / "analysis"
    assert cli(["analyze", "--counts", str(path), "--out", str(out), *flags, *FLAGS]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not out.exists()


def test_a_memory_budget_that_one_process_fits_analyses_in_this_process(planted, tmp_path, monkeypatch):
    """--memory-budget 64: the rule finds one range enough, so no Ray is started."""
    import posstats.jobs.ranges as ranges_job

    def no_actors(*_args, **_kwargs):
        raise AssertionError("range actors were started")

    monkeypatch.setattr(ranges_job, "analyze_over_actors", no_actors)
    path, _ = planted
    out = tmp_path / "analysis"
    assert cli(["analyze", "--counts", str(path), "--out", str(out), "--memory-budget", "64", *FLAGS]) == 0
    assert "ranges" not in run_folder.load_run(out).report["geometry"]
