"""Figures: every plot renders to a PNG on the Agg canvas with a one-sentence caption."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posstats.reports import plots
from posstats.runs import run_folder

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _entries():
    rows = []
    for name, base in (("mds", 0.01), ("sinusoidal", 20.0), ("random", 5.0)):
        for d in (2, 16, 64):
            rows.append({
                "name": name, "dim": d, "stress": base / d, "scaled_stress": min(base / 100, 0.9),
                "monotonicity_violation_rate": 0.1 if name == "mds" else 0.45,
                "monotonicity_method": "exact" if d < 64 else "sampled",
                "monotonicity_ci95": [0.1, 0.1] if d < 64 else [0.4, 0.5],
            })
    return rows


def _all_plots():
    rng = np.random.default_rng(0)
    enc = np.cumsum(rng.standard_normal((50, 5)), axis=0)
    pos = np.arange(50)
    dist = np.abs(pos[:, None] - pos[None, :]) / 50.0
    lam = np.sort(rng.random(10))[::-1]
    rows = [{"rank": r, "stress": 1.0 / r, "scaled_stress": 0.5 / r, "parameters": r * 66} for r in (1, 2, 4, 8)]
    return [
        plots.occupancy_figure([100] * 40 + [3] * 5 + [0] * 5, min_occupancy=4),
        plots.distance_heatmap_figure(dist, pos),
        plots.spectrum_figure(lam, np.cumsum(lam) / lam.sum(), rank=9, eigenvalue_ci=np.c_[lam * 0.9, lam * 1.1], noise_floor=0.05),
        plots.encoding_scatter_figure(enc, pos),
        plots.encoding_scatter3d_figure(enc, pos),
        plots.stress_by_dim_figure(_entries()),
        plots.lowrank_figure(rows, n=50, width=16),
        plots.monotonicity_figure(_entries(), corpus_rate=0.2),
        plots.sweep_figure({"spec": "rope:type=linear,factor=2|4", "parameter": "factor", "values": [2.0, 4.0],
                            "members": ["rope:type=linear:factor=2", "rope:type=linear:factor=4"], "others": [{}, {}]},
                           [{"name": f"rope:type=linear:factor={f}", "dim": d, "scaled_stress": 0.1 * f + 0.01 * d,
                             "scaled_stress_ci95": [0.1 * f + 0.01 * d - 0.01, 0.1 * f + 0.01 * d + 0.01]}
                            for f in (2, 4) for d in (2, 16)]),
    ]


def test_every_figure_renders_a_png_with_a_one_sentence_caption(tmp_path):
    made = _all_plots()
    assert len({p.name for p in made}) == len(made)
    for p in made:
        assert p.caption.endswith(".") and p.caption.count(". ") == 0, p.caption
        assert "look for" in p.caption
        if p.name == "monotonicity":  # the sampled entries' error bars say what they cover
            assert "sampling triples alone" in p.caption
        path = plots.save_png(p, tmp_path)
        assert path == tmp_path / f"{p.name}.png"
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC)
        assert len(data) > 5_000, p.name  # something was drawn
    assert sorted(x.name for x in tmp_path.iterdir()) == sorted(f"{p.name}.png" for p in made)  # no temp files left


def test_heatmap_is_downsampled_and_says_so():
    m = 700
    pos = np.arange(m) * 2
    dist = np.abs(pos[:, None] - pos[None, :]).astype(np.float64)
    p = plots.distance_heatmap_figure(dist, pos, max_size=256)
    image = p.figure.axes[0].get_images()[0].get_array()
    assert image.shape == (256, 256)
    idx = run_folder.even_subsample(m, 256)
    np.testing.assert_array_equal(np.asarray(image), dist[np.ix_(idx, idx)])
    assert "downsampled" in p.caption and "256 of the 700" in p.caption
    small = plots.distance_heatmap_figure(dist[:20, :20], pos[:20])
    assert "downsampled" not in small.caption
    np.testing.assert_array_equal(np.asarray(small.figure.axes[0].get_images()[0].get_array()), dist[:20, :20])


def test_left_out_positions_are_drawn_and_counted():
    p = plots.occupancy_figure([50, 40, 3, 0], min_occupancy=5)
    assert "2 position(s)" in p.caption
    offsets = p.figure.axes[0].collections[-1].get_offsets()
    np.testing.assert_array_equal(np.asarray(offsets)[:, 0], [2, 3])


def test_3d_scatter_needs_three_coordinates():
    with pytest.raises(ValueError, match="at least 3"):
        plots.encoding_scatter3d_figure(np.zeros((5, 2)), np.arange(5))


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 5000), limit=st.integers(1, 600))
def test_even_subsample_properties(m, limit):
    idx = run_folder.even_subsample(m, limit)
    assert len(idx) <= limit
    assert len(idx) == min(m, limit) or len(idx) >= min(m, limit) - 1
    assert idx[0] == 0
    if limit > 1:
        assert idx[-1] == m - 1
    assert np.all(np.diff(idx) > 0)


def test_plots_never_touch_pyplot_or_torch():
    code = (
        "import sys, numpy as np\n"
        "from posstats.reports import plots\n"
        "p = plots.encoding_scatter_figure(np.random.default_rng(0).random((10, 3)), np.arange(10))\n"
        "plots.png_bytes(p)\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _lines(fig, label):
    return [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_label() == label]


def test_spectrum_curve_is_monotone_at_most_1_and_the_threshold_is_drawn():
    """Negative eigenvalues (a bias-corrected B) add nothing: the plotted cumulative share
    never falls and never exceeds 1; the noise threshold is a drawn line that counts the
    components above it, and the caption says how many."""
    from posstats.geometry.spectrum import spectrum_summary

    lam = np.array([4.0, 2.0, 1.0, 0.5, 0.2, -0.3, -1.5])
    explained = spectrum_summary(lam).explained_variance
    p = plots.spectrum_figure(lam, explained, rank=5, noise_floor=1.5)
    (curve,) = _lines(p.figure, "cumulative share of the positive variance")
    y = np.asarray(curve.get_ydata(), dtype=float)
    assert np.all(np.diff(y) >= 0) and y.max() <= 1.0 + 1e-12
    (threshold,) = _lines(p.figure, "noise threshold (2 above)")
    assert np.allclose(threshold.get_ydata(), 1.5)
    assert "(2 here)" in p.caption
    assert not any(ax.get_legend() for ax in p.figure.axes)  # the legend sits outside the axes
    assert "no noise threshold" in plots.spectrum_figure(lam, explained).caption
    # occupancy-weighted: the tested eigenvalues are their own series, the count is theirs
    w = plots.spectrum_figure(lam, explained, noise_floor=1.5, tested=[3.0, 1.8, 1.6, 0.4])
    (series,) = _lines(w.figure, "occupancy-weighted eigenvalue (the rank test's)")
    assert np.allclose(series.get_ydata(), [3.0, 1.8, 1.6, 0.4])
    (threshold,) = _lines(w.figure, "noise threshold on the weighted scale (3 above)")
    assert "(3 here)" in w.caption and "W^1/2 B_w W^1/2" in w.caption and "occupancy-weighted mean" in w.caption


@pytest.mark.parametrize(("occupancy", "log"), [([586] * 30 + [585] * 34, False), ([3000] * 10 + [40] * 20, True),
                                                 ([0] * 5 + [7] * 10, False)])
def test_occupancy_axis_is_linear_when_the_range_is_narrow(occupancy, log):
    assert plots.occupancy_log_scale(occupancy) is log
    ax = plots.occupancy_figure(occupancy).figure.axes[0]
    assert ax.get_yscale() == ("log" if log else "linear")
    if not log:
        assert ax.get_ylim()[0] == 0.0  # a 585-586 range is drawn from 0, not as a cliff


def test_heatmap_names_its_distances_and_their_range():
    pos = np.arange(6)
    dist = np.abs(pos[:, None] - pos[None, :]) / 10.0
    dist[0, 1] = dist[1, 0] = 0.0
    p = plots.distance_heatmap_figure(dist, pos, kind="bias-corrected")
    labels = [ax.get_ylabel() for ax in p.figure.axes]
    assert any(lbl.startswith("bias-corrected d_H (0 to 0.5") for lbl in labels), labels
    assert "7% of the pairs shown are exactly 0" in p.caption  # 2 of the 30 off-diagonal cells
    assert "exactly 0" not in plots.distance_heatmap_figure(dist, pos).caption  # plug-in: no clipping to speak of


def test_stress_legend_is_outside_and_no_curve_is_cut_at_the_top():
    p = plots.stress_by_dim_figure(_entries())
    assert not any(ax.get_legend() for ax in p.figure.axes) and p.figure.legends
    scaled = p.figure.axes[1]
    top = max(max(ln.get_ydata()) for ln in scaled.get_lines())
    assert scaled.get_ylim()[1] > top


def test_lowrank_tradeoff_plots_scaled_stress_and_marks_the_informative_rank():
    """Raw stress rises with rank on noise (scale), so the trade-off plots scaled stress; the
    informative components (the export's default rank) are a drawn line the caption names."""
    rows = [{"rank": r, "stress": 0.5 * r, "scaled_stress": 0.4 / r, "parameters": r * 66} for r in (1, 2, 4, 8)]
    p = plots.lowrank_figure(rows, n=50, width=16, informative=2)
    ax = p.figure.axes[0]
    (curve,) = _lines(p.figure, "scaled stress")
    assert list(curve.get_ydata()) == [0.4, 0.2, 0.1, 0.05]
    assert not _lines(p.figure, "stress")  # raw stress is not drawn
    (mark,) = _lines(p.figure, "components above noise: 2")
    assert list(mark.get_xdata()) == [2, 2]
    assert ax.get_ylim()[0] == 0.0 and "2 component(s) above sampling noise" in p.caption
    assert "every rank here fits noise" in plots.lowrank_figure(rows, n=50, width=16, informative=0).caption
    assert "no null" in plots.lowrank_figure(rows, n=50, width=16).caption


def test_explained_curve_says_what_its_shares_are_of():
    """With only the top k computed and a trace below their positive sum, the curve is the
    share of those k components, and its legend says so."""
    from posstats.reports.spectrum_view import explained_label, explained_share

    lam = np.array([5.0, 3.0, 2.0])
    truncated = {"spectrum": {"denominator": "computed_positive_eigenvalues", "total_variance": 4.0}}
    assert explained_label(lam, truncated) == "cumulative share of the top 3 components' variance"
    np.testing.assert_allclose(explained_share(lam, truncated), [0.5, 0.8, 1.0])
    complete = {"spectrum": {"denominator": "total_variance", "total_variance": 20.0}}
    assert explained_label(lam, complete) == "cumulative share of the positive variance"
    np.testing.assert_allclose(explained_share(lam, complete), [0.25, 0.4, 0.5])
    p = plots.spectrum_figure(lam, explained_share(lam, truncated), explained_label=explained_label(lam, truncated))
    assert _lines(p.figure, "cumulative share of the top 3 components' variance")


def test_long_scatters_draw_evenly_spaced_positions_and_say_so():
    from posstats.reports.plots import SCATTER_POINTS, encoding_scatter3d_figure, encoding_scatter_figure

    n = SCATTER_POINTS * 3 + 7
    enc = np.arange(n * 3, dtype=np.float64).reshape(n, 3)
    for make in (encoding_scatter_figure, encoding_scatter3d_figure):
        plot = make(enc, np.arange(n))
        shown = plot.figure.axes[0].collections[0]
        colours = np.asarray(shown.get_array())
        assert colours.size == SCATTER_POINTS and colours[0] == 0 and colours[-1] == n - 1
        assert np.all(np.diff(colours) > 0)
        assert f"{SCATTER_POINTS:,} of the {n:,} positions drawn" in plot.caption
    small = encoding_scatter_figure(enc[:50], np.arange(50))
    assert np.asarray(small.figure.axes[0].collections[0].get_array()).size == 50 and "drawn" not in small.caption


def test_sweep_figure_stars_no_value_without_structure():
    """``star=False`` (the verdict found no structure and ties every value): no starred
    point, and the caption says why; by default each width's lowest value is starred."""
    sweep = {"spec": "rope:type=linear,factor=2|4", "parameter": "factor", "values": [2.0, 4.0],
             "members": ["rope:type=linear:factor=2", "rope:type=linear:factor=4"], "others": [{}, {}]}
    entries = [{"name": f"rope:type=linear:factor={f}", "dim": 2, "scaled_stress": 0.1 * f} for f in (2, 4)]

    def stars(p):
        return [ln for ax in p.figure.axes for ln in ax.get_lines() if ln.get_marker() == "*"]

    starred, plain = plots.sweep_figure(sweep, entries), plots.sweep_figure(sweep, entries, star=False)
    assert len(stars(starred)) == 1 and list(stars(starred)[0].get_xdata()) == [2.0]
    assert stars(plain) == [] and "no star, since no test found positional structure" in plain.caption
    assert plain.caption.endswith(".") and plain.caption.count(". ") == 0
