"""The benchmark commands run and print the JSON the README documents (tiny sizes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def run_bench(name: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, str(BENCH / name), *args], capture_output=True, text=True, check=True, timeout=300)
    return json.loads(out.stdout)


def test_bench_count_small():
    r = run_bench("bench_count.py", "--positions", "64", "--vocab", "1000", "--tokens", "200000", "--repeats", "1")
    assert r["positions"] == 64 and r["vocab"] == 1000
    assert r["tokens_counted_per_run"] > 0
    assert r["kernel_tokens_per_s"] > 0 and r["baseline_np_add_at_2d_tokens_per_s"] > 0
    ratio = r["kernel_tokens_per_s"] / r["baseline_np_add_at_2d_tokens_per_s"]
    assert abs(r["speedup_vs_baseline"] - ratio) <= 1e-9 * ratio
    assert r["identical_counts"] is True

def test_bench_mds_small():
    r = run_bench("bench_mds.py", "--n", "96", "--vocab", "800", "--k", "6", "--docs", "40,80")
    assert [row["docs"] for row in r["corpora"]] == [40, 80]
    for row in r["corpora"]:
        assert row["nnz"] > 0
        assert row["accurate_1e-8"], row
        assert row["speedup"] > 0


def test_bench_analysis_small(tmp_path):
    """bench_analysis.py end to end at a tiny size: three cases, the plug-in baseline, JSON."""
    r = run_bench("bench_analysis.py", "--tokens", "300000", "--files", "2", "--positions", "256", "--dir",
                  str(tmp_path / "corpus"), "--baselines", "plugin", "--cases", "stationary,planted,rope")
    assert r["benchmark"] == "analysis" and r["errors"] == []
    st = r["stationary"]
    assert st["default"]["returncode"] == 0 and st["default"]["noise_floor"] is True
    assert st["default"]["components_above_noise"] == 0 and st["default"]["h1_nonstationary"] is False
    assert st["baselines"]["plugin"]["noise_floor"] is False and st["baselines"]["plugin"]["distances"] == "plugin"
    assert set(st["targets"]) == {"noise_floor_reported", "zero_components_above_null", "h1_not_flagged",
                                  "peak_le_8_gb", "time_le_5_min"}
    pl = r["planted"]
    assert pl["default"]["components_above_noise"] >= 1 and pl["targets"]["names_positions_0_to_3"] is True
    rope = r["rope"]  # at 256 positions the stress is exact, so only that target is not met
    assert {k for k, v in rope["targets"].items() if not v} == {"sampled_stress"}
    assert rope["sweep_verdict"][0]["parameter"] == "factor" and "hf:MODEL@128" in rope["scaled_stress"]
    assert rope["baseline"]["returncode"] == 0


def test_bench_analysis_pipeline_small(tmp_path):
    """The pipeline case at a tiny size with a --geometry-cpus value of its own: every
    stage's time, the export refused for a table of noise counts as completed (its README
    says why). One run: each further value is one more pipeline run (docs/benchmarks.md)."""
    import pytest

    pytest.importorskip("ray")
    r = run_bench("bench_analysis.py", "--cases", "pipeline", "--billion-tokens", "200000", "--billion-files", "2",
                  "--positions", "128", "--geometry-cpus", "1", "--dir", str(tmp_path / "corpus"), "--baselines", "none")
    assert r["errors"] == []
    run = r["pipeline"]
    assert run["geometry_cpus"] == 1.0 and "with_geometry_cpus" not in run
    assert run["targets"]["completed"] and run["export_skipped"].startswith("nothing to export")
    assert all(run["stages_s"][s] is not None for s in ("count", "geometry", "report", "export"))
    assert run["report"]["components_above_noise"] == 0


def test_bench_drift_small(tmp_path):
    """bench_drift.py end to end at a tiny size: nothing changed between two samples, exactly
    positions 4 and 5 between 4 and 6 planted opening tokens."""
    r = run_bench("bench_drift.py", "--tokens", "300000", "--files", "2", "--positions", "256", "--dir",
                  str(tmp_path / "corpus"))
    assert r["benchmark"] == "drift" and r["errors"] == []
    assert r["targets"]["a_b_nothing_changed"] and r["targets"]["a_c_exactly_4_5"]
    assert r["diff_a_c"]["changed"] == [4, 5] and r["diff_a_b"]["returncode"] == 0


def test_bench_calibration_small():
    """bench_calibration.py at a tiny size: both tables, every estimate with its uncertainty."""
    r = run_bench("bench_calibration.py", "--tokens", "2000", "--seeds", "2", "--power-seeds", "1", "--pair-seeds", "2",
                  "--coverage-seeds", "1", "--held-out-seeds", "1", "--positions", "64", "--diff-seeds", "2")
    assert r["benchmark"] == "calibration"
    (diff,) = r["diff"]
    assert set(diff) == {"positions", "tokens_per_position", "level", "seconds", "stationary", "drift", "drift_unequal",
                         "pack_markov", "planted", "weak"}
    assert all(diff[k]["pairs"] == 2 and diff[k]["false_alarm"]["of"] == 2 for k in ("stationary", "drift", "pack_markov"))
    assert [f["position"] for f in diff["planted"]["found"]] == [0, 1, 2, 3] and diff["planted"]["pairs"] == 1
    assert [f["position"] for f in diff["weak"]["found"]] == list(range(8))
    names = {row["pairs"] for row in r["distances"]}
    assert names == {"identical", "planted_vs_base", "drift_1_apart", "drift_4_apart", "drift_16_apart", "drift_ends",
                     "identical_far"}
    for row in r["distances"]:
        for est in ("plugin", "power_law", "unbiased"):
            assert set(row[est]) >= {"mean_error", "se", "rmse"}
        assert row["plugin"]["mean_error"] > 0  # the plug-in is biased upward
    (dec,) = r["decisions"]
    claims = dec["stationary"]
    assert set(claims) == {"components_above_noise", "any_standout", "distinguishable", "non_stationary", "best_named"}
    assert all(c["of"] == 2 and c["ci95"][0] <= c["rate"] <= c["ci95"][1] for c in claims.values())
    assert claims["best_named"]["count"] <= claims["non_stationary"]["count"]  # gatekept: no structure, no winner
    assert set(dec["planted"]) == {"distinguishable", "standouts_exactly_planted", "components_above_noise"}
    assert dec["drift"]["non_stationary"]["of"] == 1
    assert [row["kind"] for row in r["coverage"]] == ["drift", "planted"]
    scored = {f"{name}@{d}" for name in ("sinusoidal", "alibi", "random") for d in (2, 16)}
    for cov in r["coverage"]:
        # N = 2,000 is noise-dominated (share >= 10 %): the intervals are withheld, none is scored
        assert set(cov["interval_withheld"]) == scored and cov["coverage"] == {}
        assert set(cov["tie_range_holds_truth"]) == scored  # the withheld intervals' ranges, scored too
        assert all(r["of"] == 1 for r in cov["tie_range_holds_truth"].values())
        assert all(w["count"] == w["of"] == 1 for w in cov["interval_withheld"].values())
        assert set(cov["estimate_rmse"]) == scored
        assert all(cov["estimate_rmse"][k] >= abs(cov["estimate_bias"][k]) for k in scored)
        assert cov["distance_noise_share"] > 0 and cov["caveat_shown"]["of"] == 1
        assert set(cov["best_encoding"]) == {"d=2", "d=16"}
        for outcome in cov["best_encoding"].values():
            assert outcome["right"]["count"] + outcome["wrong"]["count"] == 1 and outcome["sharp"]["count"] <= 1
    assert [row["kind"] for row in r["held_out"]] == ["drift", "planted"]
    for held in r["held_out"]:  # every held-out score's range scored against its large-sample truth
        assert 1 <= held["all_ranges_hold_truth"]["of"] == len(held["range_holds_truth"]) <= 10  # overshoots: none
        assert set(held["best_encoding"]) == {"d=2", "d=16"} and set(held["estimate_bias"]) >= {"mds@2", "alibi@16"}


def test_bench_calibration_continues_a_cell(capsys):
    """--decision-kinds / --first-seed: only the kinds asked for, seeds from first_seed on
    (a later run continues a long cell with new corpora, never the ones already counted);
    the coverage table's seeds too."""
    sys.path.insert(0, str(BENCH))
    from bench_calibration import coverage_table, decision_table

    (row,) = decision_table([200], 2, 0, [64], ("stationary", "drift"), 5)
    assert set(row) == {"positions", "tokens_per_position", "stationary", "seconds"}  # drift: 0 power seeds
    assert row["stationary"]["non_stationary"]["of"] == 2
    seeds = [line.split("seed ")[1].split(":")[0] for line in capsys.readouterr().err.splitlines() if " seed " in line]
    assert seeds == ["10005", "10006"]
    (cov,) = coverage_table([2000], 1, 64, ("drift",), first_seed=7,  # the coverage rows continue alike
                            encodings=("mds", "alibi"))
    assert cov["kind"] == "drift" and cov["tokens_per_position"] == 2000
    assert set(cov["estimate_bias"]) == {"mds@2", "mds@16", "alibi@2", "alibi@16"}
    seeds = {line.split("seed ")[1].split()[0] for line in capsys.readouterr().err.splitlines() if " seed " in line}
    assert seeds == {"30007"}


def test_diff_table_holds_its_level_and_names_the_planted_changes(capsys):
    """The diff table's CI-sized cell (n = 64, N = 2,000): 40 null pairs of each kind
    (identical mu on both sides: stationary, a drift, a drift against a refresh 4 times
    smaller) and 10 pairs where positions 0-3 changed (true d_H^2 0.10-0.21).

    Tolerances from the binomial: at a family-wise 5 % (4.9 % for 64 independent tests)
    P(X >= 7 of 40) = 0.004, so at most 6 false alarms per kind; the 2,560 positions' p <= 0.01
    count has mean <= 25.6 and sd 5.0: at most 46 (4 sd). The changes are found at every
    pair in the full table (100 of 100 per position); the unchanged 60 positions may still
    give a false alarm: at most 3 of 10 pairs (P(X >= 4 of 10) = 0.001 at 4.9 %), so at
    least 7 of 10 name exactly {0, 1, 2, 3}."""
    sys.path.insert(0, str(BENCH))
    from bench_calibration import diff_table

    (row,) = diff_table([2000], 40, 10, [64], ("stationary", "drift", "drift_unequal", "planted"))
    for kind in ("stationary", "drift", "drift_unequal"):
        cell = row[kind]
        assert cell["false_alarm"]["of"] == 40 and cell["false_alarm"]["count"] <= 6, (kind, cell)
        assert cell["p_at_most_0.01"]["of"] == 2560 and cell["p_at_most_0.01"]["count"] <= 46, (kind, cell)
        assert cell["positions_flagged"] >= cell["false_alarm"]["count"]
    planted = row["planted"]
    assert planted["false_alarm"]["count"] <= 3
    assert planted["exactly_the_changed"]["count"] >= 10 - planted["false_alarm"]["count"]
    assert all(f["count"] == 10 for f in planted["found"])
    truths = [f["true_d2"] for f in planted["found"]]
    assert truths == sorted(truths) and 0.1 < truths[0] and truths[-1] < 0.22  # 2 - 2 sqrt(1 - a), a = 0.1 ... 0.2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "planted seeds" in ln]
    assert lines[0].startswith("  diff n=64 N=2000 planted seeds 120000/120001: changed [0, 1, 2, 3]")


def test_diff_table_at_falling_occupancy_holds_its_level():
    """The same cell with both sides truncate documents of falling occupancy (2,000 tokens at
    position 0 to about 100 at 63, each side its own draw of lengths, so a position's two
    occupancies differ): 40 null pairs of a stationary corpus and of a drift against a
    refresh 4 times smaller, 10 pairs with positions 0-3 changed. The tolerances are the
    equal-occupancy test's (binomial, above): at most 6 false alarms of 40, at most 46
    p-values <= 0.01 among 2,560; the changes found in every pair."""
    sys.path.insert(0, str(BENCH))
    from bench_calibration import _diff_pair, diff_table

    a, b, _, _ = _diff_pair("stationary", 64, 2000, 7, occupancy_ratio=0.05)
    occ_a, occ_b = np.asarray(a.sum(axis=1)).ravel(), np.asarray(b.sum(axis=1)).ravel()
    assert occ_a[0] == occ_b[0] == 2000 and occ_a[-1] < 400 and not np.array_equal(occ_a, occ_b)
    (row,) = diff_table([2000], 40, 10, [64], ("stationary", "drift_unequal", "planted"), occupancy_ratio=0.05)
    assert row["occupancy_ratio"] == 0.05
    for kind in ("stationary", "drift_unequal"):
        cell = row[kind]
        assert cell["false_alarm"]["of"] == 40 and cell["false_alarm"]["count"] <= 6, (kind, cell)
        assert cell["p_at_most_0.01"]["count"] <= 46, (kind, cell)
    planted = row["planted"]
    assert planted["false_alarm"]["count"] <= 3 and all(f["count"] == 10 for f in planted["found"])


def test_coverage_targets_of_fitted_and_fixed_encodings():
    """The coverage table's target: a fixed encoding's scaled stress against the true
    distances; a fitted one's fit made on them. Points on a line: the classical MDS at d = 2
    reproduces their distances (target 0), SMACOF started from it too, and a fixed encoding
    scores as stress_report says."""
    sys.path.insert(0, str(BENCH))
    import numpy as np
    from bench_calibration import _true_scaled_stresses

    from posstats.geometry.encodings import make_encoding
    from posstats.geometry.stress import stress_report

    x = np.cumsum(np.linspace(0.1, 0.3, 12))
    d2 = (x[:, None] - x[None, :]) ** 2
    t = _true_scaled_stresses([("mds", 2), ("mds-smacof", 2), ("sinusoidal", 2)], d2, 1000)
    assert t[("mds", 2)] < 1e-6 and t[("mds-smacof", 2)] < 1e-3
    sin = stress_report(make_encoding("sinusoidal", np.arange(12), 2).matrix, np.sqrt(d2)).scaled_stress
    assert t[("sinusoidal", 2)] == sin > 0.01
    from bench_calibration import _coverage_corpus

    kc = _coverage_corpus("all_planted", 8, 50, 0)  # every position its own block: every pair far apart
    assert kc.planted.tolist() == list(range(8)) and kc.mix.min() == 0.05 and kc.mix.max() == 0.3
    assert kc.true_d2(0, 7)[0] > 0.05 and kc.counts.matrix.shape == (8, 5000 + 20 * 8)


def test_bench_sqrt_estimators_small():
    """bench_sqrt_estimators.py at a tiny size: the falling-factorial terms are unbiased for
    p^k (checked against the exact binomial sum), the plug-in's self-bias dwarfs its
    far-pair remainder, and the JSON has every (N, estimator, pair) row."""
    sys.path.insert(0, str(BENCH))
    import numpy as np
    from bench_sqrt_estimators import moments

    n, p = 50, np.array([0.01, 0.2, 0.7])
    c = np.arange(n + 1)
    np.testing.assert_allclose(moments(c * (c - 1) / (n * (n - 1)), p, n)[0], p**2, rtol=1e-10)
    r = run_bench("bench_sqrt_estimators.py", "--tokens", "200", "--vocab", "300", "--estimators", "4:4")
    assert [(row["N"], row["estimator"]) for row in r["rows"]] == [(200, "plugin"), (200, "polynomial c0=4 K=4")]
    base = r["rows"][0]["drift_16_apart"]
    assert base["bias"] > 10 * abs(base["remainder"]) and base["sd"] > 0
    for row in r["rows"]:  # the split by the rarer side's count adds up to the remainder
        for pair in ("drift_ends", "drift_16_apart", "planted_vs_base"):
            split = row[pair]["remainder_by_rarer_count"]
            assert set(split) == {"0-1", "1-10", "10-inf"}
            assert abs(sum(split.values()) - row[pair]["remainder"]) < 5e-5


def test_bench_sqrt_estimators_jackknife_is_the_delete_one_jackknife():
    """--jackknife: the per-entry J(c) and the two-sample formula equal the jackknife done
    by hand (every token of a small sample deleted in turn, the plug-in distance recomputed);
    J removes the plug-in's 1/N bias of sqrt(p) where tokens are well sampled; the two-sample
    rows give the error on identical positions too."""
    sys.path.insert(0, str(BENCH))
    import numpy as np
    from bench_sqrt_estimators import jackknife_estimator, moments, plugin

    n, x, y = 12, np.array([5, 0, 4, 1, 2]), np.array([1, 6, 0, 3, 2])

    def distance(a, b):
        return float(((np.sqrt(a / a.sum()) - np.sqrt(b / b.sum())) ** 2).sum())

    def deleted(a):  # the n samples with one token of a deleted, as their distinct count vectors
        return [(int(k), a - np.eye(a.size, dtype=int)[v]) for v, k in enumerate(a) if k]

    t = distance(x, y)
    mean_i = sum(k * distance(a, y) for k, a in deleted(x)) / n
    mean_j = sum(k * distance(x, b) for k, b in deleted(y)) / n
    by_hand = t + (n - 1) * (t - mean_i) + (n - 1) * (t - mean_j)
    s, jack = plugin(n), jackknife_estimator(n)
    formula = 2 - 2 * float((jack[x] * s[y] + s[x] * jack[y] - s[x] * s[y]).sum())
    assert abs(by_hand - formula) < 1e-12
    for v, k in enumerate(x):  # per entry: n s(c) - (n - 1) mean of sqrt(c' / (n - 1)) over the deletions
        after = sum(kk * np.sqrt(a[v] / (n - 1)) for kk, a in deleted(x)) / n
        assert abs(jack[k] - (n * np.sqrt(k / n) - (n - 1) * after)) < 1e-12

    big, p = 100_000, np.array([0.01, 0.002])
    err_plugin = moments(plugin(big), p, big)[0] - np.sqrt(p)
    err_jack = moments(jackknife_estimator(big), p, big)[0] - np.sqrt(p)
    assert np.all(np.abs(err_jack) < np.abs(err_plugin) / 50)

    r = run_bench("bench_sqrt_estimators.py", "--tokens", "200", "--vocab", "300", "--estimators", "4:4", "--jackknife")
    assert [row["estimator"] for row in r["rows"]] == ["plugin", "polynomial c0=4 K=4", "jackknife"]
    (row,) = r["two_sample_jackknife"]
    assert set(row) == {"N", "identical", "drift_ends", "drift_16_apart", "planted_vs_base"}
    assert row["identical"]["d2"] == 0 and row["identical"]["bias"] > 0 and row["drift_ends"]["sd"] > 0


def test_bench_smacof_acceleration_table():
    """bench_smacof's acceleration section at a tiny size: both runs on one budget, gaps
    measured from the lower of the long runs, SQUAREM's no farther than plain transforms'
    (every position planted: a geometry where plain transforms crawl)."""
    sys.path.insert(0, str(BENCH))
    import numpy as np
    from bench_smacof import acceleration_table, true_distances

    h = true_distances("all_planted", 12)
    assert h.shape == (12, 12) and np.allclose(h, h.T) and np.all(np.diag(h) == 0) and h[0, 1] > 0.2
    (row,) = acceleration_table((("all_planted", 24, 6),), budget=40, reference_budget=600)
    assert (row["corpus"], row["n"], row["dim"]) == ("all_planted", 24, 6)
    floor = row["lowest_stress_found"]
    for acc in ("none", "squarem"):
        r = row[acc]
        assert r["transforms"] <= 40 and r["stress"] >= floor
        assert abs(r["relative_gap"] - (r["stress"] - floor) / floor) < 1e-12
    assert row["squarem"]["relative_gap"] < row["none"]["relative_gap"]


def test_tally_calibration_adds_runs_as_one(tmp_path):
    """A cell run in two pieces (--first-seed 0 and 1, one corpus each) tallies to the
    counts of one run of both corpora; a piece counted twice, a run of another benchmark
    and an empty file are refused with exit 2 and one line naming the file."""
    sys.path.insert(0, str(BENCH))
    import tally_calibration

    common = ["--skip-distances", "--coverage-seeds", "0", "--held-out-seeds", "0", "--diff-seeds", "0",
              "--positions", "64", "--tokens", "2000", "--power-seeds", "1", "--decision-kinds", "stationary,planted"]
    whole = run_bench("bench_calibration.py", *common, "--seeds", "2", "--power-seeds", "2")
    paths = []
    for first in (0, 1):
        piece = run_bench("bench_calibration.py", *common, "--seeds", "1", "--first-seed", str(first))
        paths.append(tmp_path / f"piece{first}.json")
        paths[-1].write_text(json.dumps(piece))
    rows = tally_calibration.tally([(str(p), json.loads(p.read_text())) for p in paths])
    assert [(r["kind"], r["corpora"], r["seeds"], r["sampler"]) for r in rows] == [
        ("planted", 2, "30000-30001", "tokens"), ("stationary", 2, "10000-10001", "tokens")]
    (row,) = whole["decisions"]
    for r in rows:
        assert {d: p["count"] for d, p in r["decisions"].items()} == {d: p["count"] for d, p in row[r["kind"]].items()}
        assert all(p["of"] == 2 for p in r["decisions"].values())
    assert rows[0]["decisions"]["standouts_exactly_planted"]["count"] == 2  # N = 2,000: a count that adds, not 0 + 0

    assert tally_calibration.main([str(p) for p in paths] + ["--markdown"]) == 0

    def refused(*files) -> str:
        out = subprocess.run([sys.executable, str(BENCH / "tally_calibration.py"), *map(str, files)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and out.stdout == "" and len(out.stderr.strip().splitlines()) == 1, out
        return out.stderr

    assert "corpus seed 10000 (stationary, n = 64, N = 2000, sampler tokens) is already counted" in refused(paths[0], paths[0])
    (tmp_path / "other.json").write_text(json.dumps({"benchmark": "drift"}))
    assert "other.json: not a bench_calibration.py run (benchmark: 'drift')" in refused(paths[0], tmp_path / "other.json")
    (tmp_path / "empty.json").write_text("")
    assert "empty.json: empty" in refused(tmp_path / "empty.json")
    bad = json.loads(paths[1].read_text())
    bad["decisions"][0]["stationary"]["any_standout"]["of"] = 3
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    assert "bad.json: decisions row 0, stationary any_standout: count 0 of 3, but the setup ran 1 corpora" in refused(
        tmp_path / "bad.json")


def test_bench_pack_homogeneity_small():
    """bench_pack_homogeneity.py on the bundled Shakespeare sample: real chunks under the
    permutation and the rotation null and their shuffled baseline, each with a rejection
    count and a z summary; the baseline holds the same tokens (only their positions move);
    the window groups add up to the counts."""
    sys.path.insert(0, str(BENCH))
    import numpy as np
    from bench_pack_homogeneity import BUNDLED, document_lengths, packed_counts, read_text, token_stream, truncated_counts

    r = run_bench("bench_pack_homogeneity.py", "--text", str(BUNDLED), "--positions", "16", "--windows", "200")
    (cell,) = r["cells"]
    assert r["benchmark"] == "pack_homogeneity" and r["level"] == 0.025 and cell["positions"] == 16
    assert cell["chunks"] == r["tokens"] // 3200 >= 10
    for side in ("real", "real_rotation", "baseline_shuffled"):
        assert cell[side]["rejected"]["of"] == cell["chunks"] and cell[side]["z_sd"] > 0

    markov = run_bench("bench_pack_homogeneity.py", "--markov-stay", "0.5", "--streams", "3", "--positions", "32",
                       "--windows", "50")
    assert markov["markov"] == {"stay": 0.5, "vocab": 5000, "streams": 3} and markov["cells"][0]["chunks"] == 3
    assert markov["cells"][0]["real"]["rejected"]["of"] == 3 == markov["cells"][0]["real_rotation"]["rejected"]["of"]

    truncate = run_bench("bench_pack_homogeneity.py", "--text", str(BUNDLED), "--positions", "16", "--windows", "200",
                         "--mode", "truncate", "--document-lengths", "8-32")
    (cell,) = truncate["cells"]
    assert truncate["mode"] == "truncate" and cell["document_lengths"] == [8, 32] and cell["chunks"] >= 10
    assert cell["real_rotation"]["rejected"]["of"] == cell["chunks"] == cell["real"]["rejected"]["of"]
    bad = subprocess.run([sys.executable, str(BENCH / "bench_pack_homogeneity.py"), "--text", str(BUNDLED), "--mode",
                          "truncate", "--document-lengths", "9-3"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith("needs 1 <= LO <= HI, got '9-3'")

    ids, vocab = token_stream(read_text(BUNDLED), BENCH.parent / "data" / "tokenizers" / "gpt2.tokenizer.json")
    lengths = document_lengths(1000, 8, 32, np.random.default_rng(0))
    assert lengths.sum() == 1000 and lengths.min() >= 1 and lengths.max() <= 32
    truncated, truncated_groups = truncated_counts(ids[:1000], lengths, 16, vocab, 64)
    assert (truncated_groups.total() != truncated).nnz == 0 and truncated_groups.windows == int((lengths >= 16).sum())
    assert (truncated[[0]].toarray().ravel() == np.bincount(ids[np.r_[0, np.cumsum(lengths)[:-1]]], minlength=vocab)).all()
    real, groups = packed_counts(ids[:3200], 16, vocab, 64)
    moved, _ = packed_counts(np.random.default_rng(0).permutation(ids[:3200]), 16, vocab)
    assert (groups.total() != real).nnz == 0 and groups.windows == 200
    assert real.shape == (16, vocab) and (real.sum(axis=1) == 200).all()  # pack mode: one token a window a row
    assert (real.sum(axis=0) == moved.sum(axis=0)).all() and (real != moved).nnz > 0
    assert (real[[3]].toarray().ravel() == np.bincount(ids[3:3200:16], minlength=vocab)).all()


def test_bench_pack_homogeneity_whole_corpus_read_as_posstats_count_reads_it(tmp_path):
    """--reader posstats --windows 0 --positions A:B:S: one chunk of every full window at
    each n, counts equal to `posstats count --mode pack` of the same file (the documents
    as the CLI reads them), the rotation test alone with --no-permutation, and the
    rejections summed over the cells; bad values are one-line errors."""
    sys.path.insert(0, str(BENCH))
    import numpy as np
    from bench_pack_homogeneity import BUNDLED, document_stream, packed_counts

    from posstats.cli import main as cli
    from posstats.counting.io import load_counts

    r = run_bench("bench_pack_homogeneity.py", "--text", str(BUNDLED), "--reader", "posstats", "--windows", "0",
                  "--positions", "16:40:8", "--no-permutation")
    assert r["reader"] == "posstats" and [c["positions"] for c in r["cells"]] == [16, 24, 32]
    assert all(c["chunks"] == 1 and "real" not in c and c["real_rotation"]["rejected"]["of"] == 1 for c in r["cells"])
    over = r["over_cells"]
    assert over["real_rotation"]["rejected"]["of"] == 3 and len(over["rejected_at"]) == over["real_rotation"]["rejected"]["count"]

    tokenizer = BENCH.parent / "data" / "tokenizers" / "gpt2.tokenizer.json"
    ids, vocab = document_stream(BUNDLED, tokenizer)
    assert r["tokens"] == ids.size
    full = ids.size // 24 * 24
    counts, _ = packed_counts(ids[:full], 24, vocab, 64)
    assert cli(["count", "--input", str(BUNDLED), "--tokenizer", str(tokenizer), "--positions", "24", "--mode", "pack",
                "--out", str(tmp_path / "c"), "-q"]) == 0
    stored = load_counts(tmp_path / "c").matrix.toarray()
    stored[np.arange(ids.size - full), ids[full:]] -= 1  # the stream's last, short window, which the bench leaves out
    assert (stored == counts.toarray()).all()
    for argv, says in ((["--positions", "9:3:1"], "context lengths of at least 2"),
                       (["--positions", "a:b"], "N,N,... or A:B:S"),
                       (["--windows", "0", "--mode", "truncate"], "--windows must be >= 1"),
                       (["--no-permutation", "--window-groups", "0"], "needs --window-groups > 0")):
        bad = subprocess.run([sys.executable, str(BENCH / "bench_pack_homogeneity.py"), "--text", str(BUNDLED), *argv],
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and says in bad.stderr.strip().splitlines()[-1], bad.stderr


def test_bench_rotation_short_windows_small():
    """bench_rotation_short_windows.py: one row per length range and planted share, each
    with the share of tokens in full windows and both tests' rejection counts; documents
    of exactly n tokens fill only full windows, shorter ones leave some in the tail."""
    r = run_bench("bench_rotation_short_windows.py", "--planted", "0,0.5", "--corpora", "2", "--lengths", "16-16,2-17",
                  "--tokens", "3000")
    assert r["benchmark"] == "rotation_short_windows" and r["level"] == 0.025 and len(r["rows"]) == 4
    share = {(row["lengths"], row["planted"]): row["full_window_share"] for row in r["rows"]}
    assert share[("16-16", 0.0)] == 1.0 and 0.0 < share[("2-17", 0.0)] < 0.5
    for row in r["rows"]:
        assert row["rotation"]["of"] == row["permutation"]["of"] == 2
    # half of positions 0-3 from private ids: found by both tests, a tail or not
    assert all(row["rotation"]["count"] == 2 for row in r["rows"] if row["planted"] == 0.5)


def test_bench_truncate_rank_small():
    """bench_truncate_rank.py on the bundled fortunes at 64 positions: every minimum
    occupancy gets the corpus' top eigenvalue and each null's summary; the positions kept
    shrink as the minimum grows, and the top component's occupancy is one of theirs."""
    r = run_bench("bench_truncate_rank.py", "--positions", "64", "--replicates", "3", "--min-occupancy", "1,2000,10000000")
    assert r["benchmark"] == "truncate_rank" and r["documents"] == 3000 and r["replicates"] == 3
    first, second, empty = r["rows"]
    assert first["rows"] == 64 and 2 <= second["rows"] < 64 and "skipped" in empty
    for row in (first, second):
        assert row["median_occupancy"] <= row["top_component_occupancy"] <= 3000
        for null in ("length_classes", "per_document", "shuffled"):
            assert row[null]["median"] <= row[null]["max"]
            assert row[null]["corpus_above"] == (row["corpus_top"] > row[null]["max"])


def test_bench_document_halves_small():
    """bench_document_halves.py at n = 64 (2 null and 2 planted corpora of 400 documents):
    both nulls analyse every corpus; the halves are the documents' (the edge measured on
    them, the verdict's null ``mp``), and positions 0-3 drawing 30 % of their tokens from
    ten ids give components against both."""
    r = run_bench("bench_document_halves.py", "--positions", "64", "--documents", "400", "--seeds", "2",
                  "--planted-seeds", "2")
    assert r["benchmark"] == "document_halves" and [row["kind"] for row in r["rows"]] == ["null", "planted"]
    for row in r["rows"]:
        for null in ("halves", "rotation"):
            tallies = row[null]
            assert all(t["of"] == 2 for t in tallies.values())
            # a component is claimed only past the gate, and the rank test counted it first
            assert tallies["components"]["count"] <= min(tallies["rank_test_alone"]["count"], tallies["any_claim"]["count"])
    planted = r["rows"][1]
    assert planted["halves"]["components"]["count"] == planted["rotation"]["components"]["count"] == 2


def test_bench_occupancy_bias_small(tmp_path):
    """bench_occupancy_bias.py: the exact expected corrected distance between identical
    distributions grows with the occupancy ratio (0 at equal occupancy), and on a counts
    folder the shrinkage removed lowers the top eigenvalue's tie to log occupancy."""
    import numpy as np
    import scipy.sparse as sp

    from posstats.counting.counts import CountSpec, PositionalCounts
    from posstats.counting.io import save_counts

    rng = np.random.default_rng(0)
    p = np.arange(1, 801.0) ** -1.1
    occ = np.geomspace(8000, 200, 24).astype(int)
    rows = sp.csr_array(np.stack([rng.multinomial(int(n), p / p.sum()) for n in occ]))
    save_counts(PositionalCounts(CountSpec(positions=24, vocab_size=800), rows.astype(np.int64), sequences=8000,
                                 windows=8000, tokens=int(rows.sum())), tmp_path)
    r = run_bench("bench_occupancy_bias.py", "--vocab", "800", "--pairs", "500:500,500:1000,500:5000",
                  "--counts", str(tmp_path))
    same, double, tenfold = (x["expected_corrected_d2"] for x in r["exact"])
    assert same == 0.0 and 0 < double < tenfold
    c = r["counts"]
    assert c["rows"] == 24 and c["occupancy"] == [int(occ.min()), int(occ.max())]
    assert abs(c["shrinkage_removed"]["top_vector_vs_log_occupancy"]) < abs(c["posstats"]["top_vector_vs_log_occupancy"])


def test_bench_weighted_export_small():
    """bench_weighted_export.py at a 4-token tail, 2 seeds: both tables scored against the
    truth on every pair and on the head; the caveat flags the thin components, so the
    export's auto choice is the weighted table (its score is the weighted one's); scaled
    stresses in [0, 1], Clopper-Pearson intervals around the observed share."""
    r = run_bench("bench_weighted_export.py", "--tails", "4", "--seeds", "2")
    assert r["benchmark"] == "weighted_export" and r["baseline"] == "p_mds" and len(r["rows"]) == 1
    row = r["rows"][0]
    assert row["tail_tokens"] == 4 and row["seeds"] == 2 and row["thin_flagged"] == 2 == row["auto_took_weighted"]
    for side in ("all", "head"):
        e = row[side]
        assert 0 <= e["weighted"]["mean"] <= 1 and 0 <= e["p_mds"]["mean"] <= 1
        assert e["auto"] == e["weighted"]
        lo, hi = e["weighted_nearer_ci95"]
        assert lo <= e["weighted_nearer"] / 2 <= hi
    assert row["all"]["weighted"]["mean"] < row["all"]["p_mds"]["mean"]  # 0.42 against 0.67 over 12 seeds


def test_bench_weighted_export_held_out_small():
    """``--held-out``: both tables fitted on half of the tokens, scored on the other half and
    against the truth; ``agrees`` counts the corpora where the two scores rank them alike.
    At a 4-token tail the weighted table is nearer the truth and the held-out score says so
    (12 of 12 seeds in the full run), so both seeds agree."""
    r = run_bench("bench_weighted_export.py", "--tails", "4", "--seeds", "2", "--held-out")
    held = r["rows"][0]["held_out"]
    for key in ("p_mds_held_out", "p_mds_truth", "weighted_held_out", "weighted_truth"):
        assert 0 < held[key]["mean"] < 1
    assert held["weighted_truth"]["mean"] < held["p_mds_truth"]["mean"]  # 0.45 against 0.72 over 12 seeds
    assert held["weighted_nearer_truth"] == 2 == held["weighted_better_held_out"] == held["agrees"]
    lo, hi = held["agrees_ci95"]
    assert lo <= 1.0 <= hi


def test_bench_calibration_decisions_against_the_halves_edge():
    """``--null mp``: every analysis of the decision table counts against the edge measured on
    its window groups' halves (``edges``), and the rank test alone is tallied beside the
    gated claims (stationary and dependent streams; the full cells in docs/calibration.md)."""
    r = run_bench("bench_calibration.py", "--skip-distances", "--coverage-seeds", "0", "--held-out-seeds", "0",
                  "--diff-seeds", "0", "--positions", "64", "--tokens", "2000", "--seeds", "2", "--power-seeds", "1",
                  "--decision-kinds", "stationary,pack_markov,drift", "--null", "mp")
    assert r["setup"]["null"] == "mp"
    (dec,) = r["decisions"]
    for kind in ("stationary", "pack_markov"):
        assert dec[kind]["edges"] == {"halves": 2}
        assert dec[kind]["rank_test_alone"]["of"] == 2
        assert dec[kind]["components_above_noise"]["count"] <= dec[kind]["non_stationary"]["count"]  # gated
    assert dec["drift"]["edges"] == {"halves": 1} and dec["drift"]["components_above_noise"]["count"] == 1


def test_bench_mp_edge_small():
    """bench_mp_edge.py at n = 256, N = 2,000, 2 seeds: on stationary corpora the generalized
    Marchenko-Pastur edge from the exact variances is the noise bulk's top (0.98 here; within
    0.1-1.3 % in the full table, more rows giving a sharper edge), the analytic edge stands
    above both and its own form with the exact variances in between; dependent streams of
    the same marginal lift the top above the independent edge (1.9x here) and, at this
    n, above the analytic edge too; the top measured on two independent halves
    (posstats.estimates.halves_edge) follows the bulk in both."""
    r = run_bench("bench_mp_edge.py", "--positions", "256", "--tokens", "2000", "--seeds", "2")
    assert r["benchmark"] == "mp_edge" and [row["kind"] for row in r["rows"]] == ["stationary", "markov"]
    stationary, markov = r["rows"]
    assert 0.95 <= stationary["top_over_gmp"] <= 1.03
    assert stationary["gmp"] < stationary["bound_exact"] < stationary["edge"]
    assert stationary["edge_over_top"] > 1.3
    assert markov["gmp"] == stationary["gmp"]  # the same marginal, the same independent edge
    assert markov["top_over_gmp"] > 1.5 and markov["edge_over_top"] < 1.0
    # the bulk measured on independent halves follows both (sd of the ratio 0.7-1.6 % in the
    # full table), under the rank test's 10 % margin
    for row in (stationary, markov):
        assert 0.95 <= row["top_over_halves"]["mean"] <= 1.03 and row["top_over_halves"]["max"] < 1.1


def test_bench_mp_edge_on_real_text(data_dir):
    """``--corpus``: the bundled Shakespeare sample packed into windows of 64 (640 windows):
    the real text's noise bulk against the same tokens shuffled (within 1.5 % on the full
    corpora, 1.4 % here) and against the pooled distribution's generalized Marchenko-Pastur
    edge; the analytic edge above both."""
    r = run_bench("bench_mp_edge.py", "--corpus", str(data_dir / "shakespeare-sample.txt"),
                  "--tokenizer", str(data_dir / "tokenizers" / "gpt2.tokenizer.json"), "--positions", "64")
    (row,) = r["rows"]
    assert row["positions"] == 64 and row["windows"] == r["tokens"] // 64
    real, shuffled = row["real"], row["shuffled"]
    assert real["gmp"] == shuffled["gmp"]  # one pooled distribution, one independent edge
    assert 0.9 <= real["top_over_shuffled"] <= 1.1 and 0.9 <= shuffled["top_over_gmp"] <= 1.05
    assert real["edge"] > real["top"] and shuffled["edge"] > shuffled["top"]
