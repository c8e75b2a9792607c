"""The Cesaro influence baseline (THEORY section 8) against exact and brute-force oracles."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posstats.baselines.influence import (
    cesaro_influence,
    cesaro_influence_exact,
    cesaro_matrix,
    compare_with_theory,
    dead_zone_mask,
    fit_residual,
    influence_density,
    influence_profile,
    influence_weighted_distinctiveness,
    mean_distance_to_others,
    plot_influence,
)
from posstats.errors import PosstatsError


def exact_recurrence(length: int, depth: int, a: Fraction) -> list[Fraction]:
    """e_L^T N^H by H exact matrix-vector products (the definition, no closed form)."""
    v = [Fraction(0)] * length
    v[-1] = Fraction(1)
    for _ in range(depth):
        # (N^T v)_j = (1 - a) v_j + a sum_{i >= j} v_i / i   (1-based i)
        new = []
        for j in range(length):
            suffix = sum((v[i] / (i + 1) for i in range(j, length)), Fraction(0))
            new.append((1 - a) * v[j] + a * suffix)
        v = new
    return v


CASES = [(1, 3, 0.5), (2, 2, 0.25), (7, 3, 0.5), (12, 4, 0.3), (20, 5, 1.0), (9, 3, 0.0), (15, 0, 0.7), (30, 6, 0.875)]


@pytest.mark.parametrize(("length", "depth", "a"), CASES)
def test_closed_form_equals_exact_recurrence(length, depth, a):
    closed = cesaro_influence_exact(length, depth, residual=Fraction(a))
    assert closed == exact_recurrence(length, depth, Fraction(a))
    assert sum(closed) == 1


@pytest.mark.parametrize(("length", "depth", "a"), CASES)
def test_float_recurrence_matches_exact_rationals(length, depth, a):
    exact = np.array([float(x) for x in cesaro_influence_exact(length, depth, residual=a)])
    np.testing.assert_allclose(cesaro_influence(length, depth, residual=a), exact, rtol=1e-13, atol=1e-300)


@pytest.mark.parametrize("depth", [0, 1, 2, 5, 12])
@pytest.mark.parametrize("a", [0.0, 0.2, 0.5, 1.0])
def test_recurrence_equals_matrix_power(depth, a):
    length = 50
    power = np.linalg.matrix_power(cesaro_matrix(length, residual=a), depth)
    np.testing.assert_allclose(cesaro_influence(length, depth, residual=a), power[-1], rtol=1e-12, atol=1e-15)


def test_cesaro_matrix_definition():
    m = cesaro_matrix(4)
    expected = np.array([[1, 0, 0, 0], [1 / 2, 1 / 2, 0, 0], [1 / 3, 1 / 3, 1 / 3, 0], [1 / 4] * 4])
    np.testing.assert_array_equal(m, expected)
    np.testing.assert_allclose(cesaro_matrix(4, residual=0.25), 0.75 * np.eye(4) + 0.25 * expected)


def test_closed_form_in_floating_point_loses_precision():
    # Why THEORY asks for the suffix-sum recurrence: the alternating binomial sum cancels.
    length, depth = 80, 3
    naive = np.array([
        math.comb(length - 1, j - 1)
        * sum((-1) ** (m - j) * math.comb(length - j, m - j) / m**depth for m in range(j, length + 1))
        for j in range(1, length + 1)
    ])
    exact = np.array([float(x) for x in cesaro_influence_exact(length, depth, residual=1)])
    assert np.max(np.abs(naive - exact) / exact) > 1e-3
    np.testing.assert_allclose(cesaro_influence(length, depth, residual=1.0), exact, rtol=1e-13)


@settings(max_examples=60, deadline=None)
@given(
    length=st.integers(1, 300),
    depth=st.integers(0, 10),
    a=st.floats(0.0, 1.0, allow_nan=False),
)
def test_profile_is_a_distribution_non_increasing_before_the_last(length, depth, a):
    w = cesaro_influence(length, depth, residual=a)
    assert w.shape == (length,)
    assert np.all(w >= 0)
    np.testing.assert_allclose(w.sum(), 1.0, rtol=1e-12)
    if length > 2:
        # N^T keeps vectors non-increasing on 1..L-1, so the trough is at j = L-1.
        assert np.all(np.diff(w[:-1]) <= 1e-15 * w[0])


def test_million_positions_sums_to_one():
    w = cesaro_influence(1_000_000, 4, residual=0.5)
    assert w.dtype == np.float64
    np.testing.assert_allclose(w.sum(), 1.0, rtol=1e-12)
    assert np.all(w > 0)
    np.testing.assert_allclose(w[-1], 0.5**4 + 4 * 0.5**4 / 1_000_000, rtol=1e-4)


def test_trivial_cases():
    np.testing.assert_array_equal(cesaro_influence(5, 0, residual=0.3), [0, 0, 0, 0, 1])
    np.testing.assert_array_equal(cesaro_influence(5, 3, residual=0.0), [0, 0, 0, 0, 1])
    np.testing.assert_allclose(cesaro_influence(5, 1, residual=1.0), np.full(5, 0.2))
    np.testing.assert_array_equal(cesaro_influence(1, 7, residual=0.4), [1.0])


@pytest.mark.parametrize(("depth", "a"), [(1, 1.0), (2, 1.0), (4, 0.5), (6, 0.3), (3, 0.9)])
def test_continuous_density_approximates_discrete_profile(depth, a):
    length = 200_000
    w = cesaro_influence(length, depth, residual=a)
    j = np.unique(np.geomspace(0.005 * length, 0.95 * length, 200).astype(int))
    np.testing.assert_allclose(length * w[j - 1], influence_density(j / length, depth, residual=a), rtol=2e-3)


def test_density_mass_and_delta():
    # The smooth part integrates to 1 - (1-a)^H; the rest is the recency delta.
    x = np.linspace(1e-9, 1.0, 2_000_001)
    for depth, a in [(1, 0.5), (3, 0.5), (5, 0.8)]:
        rho = influence_density(x, depth, residual=a)
        mass = np.sum((rho[1:] + rho[:-1]) / 2 * np.diff(x))
        np.testing.assert_allclose(mass, 1 - (1 - a) ** depth, rtol=2e-3)
    np.testing.assert_allclose(influence_density([0.5, 1.0], 4, residual=1.0), [math.log(2) ** 3 / 6, 0.0])
    np.testing.assert_allclose(influence_density([1.0], 4, residual=0.5), [4 * 0.5**4])


def test_summary_quantities():
    length, depth, a = 1000, 4, 0.5
    r = influence_profile(length, depth, residual=a, tail_fraction=0.1, dead_zone_fraction=0.5)
    w = cesaro_influence(length, depth, residual=a)
    np.testing.assert_array_equal(r.profile, w)
    np.testing.assert_allclose(r.primacy_mass, w[:100].sum())
    np.testing.assert_allclose(r.primacy_ratio, length * w[0])
    assert r.recency_weight == w[-1]
    np.testing.assert_allclose(r.recency_delta, 0.5**4)
    assert r.dead_zone_position == length - 1
    assert r.dead_zone_min == w[1:-1].min()
    np.testing.assert_allclose(r.peak_to_trough, w.max() / w[1:-1].min())
    assert r.dead_zone_size == int(np.sum(w < 0.5 / length))
    d = r.to_dict(max_points=50)
    assert d["positions"][0] == 1 and d["positions"][-2:] == [length - 1, length]
    assert len(d["positions"]) <= 52
    np.testing.assert_allclose(d["influence"], w[np.asarray(d["positions"]) - 1])
    json.dumps(d, allow_nan=False)


def test_summary_edge_cases():
    flat = influence_profile(10, 1, residual=1.0)  # uniform: ties everywhere
    assert flat.dead_zone_position == 9  # the largest j on ties
    np.testing.assert_allclose(flat.peak_to_trough, 1.0)
    empty = influence_profile(10, 3, residual=0.0)  # interior receives nothing
    assert empty.peak_to_trough == math.inf
    assert empty.summary()["peak_to_trough"] is None
    tiny = influence_profile(2, 3, residual=0.5)
    assert tiny.dead_zone_min is None and tiny.dead_zone_position is None and tiny.peak_to_trough is None
    json.dumps(tiny.to_dict(), allow_nan=False)


@pytest.mark.parametrize(
    ("length", "depth", "a"),
    [(0, 2, 0.5), (-3, 2, 0.5), (10, -1, 0.5), (10, 2, 1.5), (10, 2, -0.1), (10, 2, float("nan")), (2.5, 2, 0.5)],
)
def test_bad_input_is_a_posstats_error(length, depth, a):
    with pytest.raises(PosstatsError) as info:
        cesaro_influence(length, depth, residual=a)
    assert "\n" not in str(info.value)
    with pytest.raises(PosstatsError):
        influence_profile(length, depth, residual=a)


def test_fit_residual_recovers_a_and_ignores_scale():
    for a in (0.05, 0.3, 0.62, 1.0):
        measured = 7.5 * cesaro_influence(80, 5, residual=a)
        assert abs(fit_residual(measured, 5) - a) < 1e-4
    cmp = compare_with_theory(3.0 * cesaro_influence(64, 4, residual=0.4), 4, residual=0.4)
    np.testing.assert_allclose([cmp.spearman, cmp.spearman_fitted], [1.0, 1.0])
    assert cmp.log10_rms < 1e-4
    assert abs(cmp.fitted_residual - 0.4) < 1e-4


def test_dead_zone_mask():
    np.testing.assert_array_equal(dead_zone_mask([0.7, 0.05, 0.1, 0.15]), [False, True, True, False])
    np.testing.assert_array_equal(dead_zone_mask([0.7, 0.05, 0.1, 0.15], fraction=1.0), [False, True, True, True])


def test_influence_weighted_distinctiveness_by_hand():
    w = np.array([0.6, 0.05, 0.05, 0.3])  # dead zone (< 0.5/4 = 0.125): positions 1, 2
    d = np.array([1.0, 2.0, 3.0, 4.0])
    r = influence_weighted_distinctiveness(w, d)
    assert r.dead_zone_positions == 2
    np.testing.assert_allclose(r.structure_in_dead_zone, 5.0 / 10.0)
    wd = w * d
    np.testing.assert_allclose(r.weighted_mass_in_dead_zone, wd[1:3].sum() / wd.sum())
    np.testing.assert_allclose(r.influence_weighted_mean, wd.sum())
    np.testing.assert_allclose(r.uniform_mean, 2.5)
    np.testing.assert_allclose(r.effective_ratio, wd.sum() / 2.5)
    json.dumps(r.to_dict(), allow_nan=False)


def test_influence_weighted_distinctiveness_missing_and_constant():
    w = cesaro_influence(100, 4, residual=0.5)
    const = influence_weighted_distinctiveness(w, np.ones(100))
    np.testing.assert_allclose(const.effective_ratio, 1.0)
    np.testing.assert_allclose(const.structure_in_dead_zone, np.mean(w < 0.5 / 100))
    d = np.ones(100)
    d[[3, 50]] = np.nan
    r = influence_weighted_distinctiveness(w, d)
    assert r.positions == 98
    with pytest.raises(ValueError, match="equal length"):
        influence_weighted_distinctiveness(w, np.ones(99))
    with pytest.raises(ValueError, match="non-negative"):
        influence_weighted_distinctiveness(w, -np.ones(100))


def test_mean_distance_to_others():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 3))
    dmat = np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))
    expected = [np.mean([dmat[i, j] for j in range(6) if j != i]) for i in range(6)]
    np.testing.assert_allclose(mean_distance_to_others(dmat), expected)
    np.testing.assert_array_equal(mean_distance_to_others(np.zeros((1, 1))), [0.0])


def test_plot_influence_renders_png(tmp_path):
    r = influence_profile(5000, 6, residual=0.4)
    fig = plot_influence(r, measured={"fake": r.profile * 2})
    path = tmp_path / "p.png"
    fig.savefig(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="length"):
        plot_influence(r, measured={"bad": np.ones(3)})


# -- command line -------------------------------------------------------------------


def test_cli_writes_json_and_png(tmp_path, capsys):
    from posstats.cli import main

    out = tmp_path / "inf"
    assert main(["influence", "--length", "2048", "--depth", "24", "--residual", "0.5", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "primacy tail" in printed and "dead-zone min" in printed and "peak-to-trough" in printed
    doc = json.loads((out / "influence.json").read_text())
    assert doc["schema"] == "posstats.influence/1"
    w = cesaro_influence(2048, 24, residual=0.5)
    np.testing.assert_allclose(doc["summary"]["recency_weight"], w[-1])
    assert doc["summary"]["dead_zone_position"] == 2047
    np.testing.assert_allclose(doc["profile"]["influence"], w)
    assert len(doc["profile"]["continuous"]["density"]) == 2048
    assert (out / "influence.png").read_bytes()[:4] == b"\x89PNG"
    assert not list(tmp_path.glob(".inf.staging-*"))


def test_cli_thins_long_profiles_and_prints_without_out(tmp_path, capsys):
    from posstats.cli import main

    assert main(["influence", "--length", "1000000", "--depth", "4", "--residual", "0.3"]) == 0
    assert "L=1000000" in capsys.readouterr().out
    out = tmp_path / "o"
    assert main(["influence", "--length", "100000", "--depth", "4", "--max-points", "500", "--out", str(out)]) == 0
    doc = json.loads((out / "influence.json").read_text())
    assert doc["profile"]["thinned"] is True
    assert len(doc["profile"]["positions"]) <= 502


@pytest.mark.parametrize(
    "argv",
    [
        ["--length", "0", "--depth", "3"],
        ["--length", "10", "--depth", "-1"],
        ["--length", "10", "--depth", "3", "--residual", "1.5"],
        ["--depth", "3"],
        ["--length", "10", "--depth", "3", "--tail-fraction", "0"],
    ],
)
def test_cli_bad_input_exits_2_with_one_line(argv, capsys):
    from posstats.cli import main

    assert main(["influence", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posstats: error:") and "\n" not in err


def test_cli_with_distinctiveness_file(tmp_path, capsys):
    from posstats.cli import main

    d = np.linspace(1.0, 0.2, 64)
    d[10] = np.nan
    np.save(tmp_path / "d.npy", d)
    out = tmp_path / "o"
    argv = ["influence", "--length", "64", "--depth", "6", "--residual", "0.5",
            "--distinctiveness", str(tmp_path / "d.npy"), "--out", str(out)]
    assert main(argv) == 0
    doc = json.loads((out / "influence.json").read_text())
    ref = influence_weighted_distinctiveness(cesaro_influence(64, 6, residual=0.5), d).to_dict()
    assert doc["corpus"]["positions"] == 63
    np.testing.assert_allclose(doc["corpus"]["structure_in_dead_zone"], ref["structure_in_dead_zone"])
    (tmp_path / "bad.txt").write_text("1\n2\n-3\n")
    bad = ["influence", "--length", "3", "--depth", "2", "--distinctiveness", str(tmp_path / "bad.txt")]
    assert main(bad) == 2
    assert "position 2" in capsys.readouterr().err
    assert main(["influence", "--length", "5", "--depth", "2", "--distinctiveness", str(tmp_path / "d.npy")]) == 2


def test_cli_with_counts_folder(tmp_path, capsys):
    pytest.importorskip("posstats.geometry.hellinger", reason="posstats.geometry.hellinger is not in this checkout")
    from posstats.cli import main
    from posstats.counting.counts import count_sequences
    from posstats.counting.io import save_counts

    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 20, size=rng.integers(5, 40)).tolist() for _ in range(300)]
    save_counts(count_sequences(docs, positions=32, vocab_size=20), tmp_path / "counts")
    out = tmp_path / "o"
    assert main(["influence", "--counts", str(tmp_path / "counts"), "--depth", "4", "--out", str(out)]) == 0
    doc = json.loads((out / "influence.json").read_text())
    assert doc["config"]["length"] == 32
    assert 0.0 <= doc["corpus"]["structure_in_dead_zone"] <= 1.0
    assert "corpus" in capsys.readouterr().out


def test_spearman_is_scipys_with_ties_and_nan_when_constant():
    """The rank correlation of the influence comparisons (numpy: scipy.stats costs 0.8 s of
    every command's start) equals scipy.stats.spearmanr, ties (mean ranks) included."""
    from scipy.stats import spearmanr

    from posstats.baselines.influence import spearman

    rng = np.random.default_rng(0)
    for _ in range(100):
        n = int(rng.integers(3, 60))
        a, b = rng.integers(0, 6, n).astype(float), np.round(rng.normal(size=n), 1)
        assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)
    assert spearman([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    assert np.isnan(spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
