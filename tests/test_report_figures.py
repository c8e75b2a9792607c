"""Issue #30's 'Done when' on whole reports: the bundled demo, a stationary corpus and a
planted corpus each produce a report whose first lines state the right conclusion, and every
figure of those reports passes its property check (read from the plotted data, not from the
code that drew it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from posstats.cli import main
from posstats.counting.io import save_counts
from posstats.reports import html, plots
from posstats.reports.export import informative_rank
from posstats.reports.spectrum_view import noise_threshold, null_stopped, rank_test_eigenvalues
from posstats.runs.run_folder import load_run, run_distances
from posstats.testing import known_corpus


def _lines(fig, prefix: str) -> list:
    return [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_label().startswith(prefix)]


def check_figures(run_dir: Path) -> dict[str, plots.Plot]:
    """Assert every figure property #30 names on a written run; return the figures by name.

    - spectrum: the cumulative share is monotone and within [0, 1]; the null's threshold is a
      drawn line counting exactly the verdict's components above noise;
    - heatmap: its colour bar names the distances (bias-corrected or plug-in) and a range
      inside [0, sqrt 2];
    - occupancy: linear from 0 over a narrow range, log only over a factor 10 or more;
    - stress by width: legend outside the axes, no curve cut at the top;
    - trade-off: scaled stress drawn (raw stress is not comparable across ranks), the
      informative rank marked when the run has a null;
    - every figure: a one-sentence caption.
    """
    run = load_run(run_dir)
    report = run.report
    idx, dist = run_distances(run, max_positions=2048)
    width = int(max(report["config"]["dims"]))
    figures = html._figures(run, idx, dist, html._tradeoff(run, idx, dist, width=width), width=width, max_heatmap=512)
    by_name = {p.name: p for p in figures}
    for p in figures:
        assert p.caption.strip().endswith(".") and p.caption.count(". ") <= 1, (p.name, p.caption)

    spectrum = by_name["spectrum"].figure
    (curve,) = _lines(spectrum, "cumulative share")
    y = np.asarray(curve.get_ydata(), dtype=float)
    assert np.all(np.diff(y) >= -1e-12) and y.min() >= -1e-12 and y.max() <= 1 + 1e-12
    threshold = noise_threshold(report)
    above = report["verdict"].get("components_above_noise")
    if threshold is not None and threshold > 0:
        (line,) = _lines(spectrum, "noise threshold")
        assert np.allclose(line.get_ydata(), threshold)
        tested = rank_test_eigenvalues(report)  # occupancy-weighted: the test's own eigenvalues, drawn too
        compared = run.eigenvalues if tested is None else np.asarray(tested)
        drawn = int(np.count_nonzero(compared > threshold))
        scale = "" if tested is None else " on the weighted scale"
        least = "" if null_stopped(report) is None else ", at least"  # the rank test stopped once decided
        assert line.get_label() == f"noise threshold{scale}{least} ({drawn} above)"
        if above is not None and report.get("null", {}).get("method") != "mp":
            assert drawn == above, (drawn, above)

    heat = by_name["hellinger_heatmap"].figure
    label = next(ax.get_ylabel() for ax in heat.axes if "d_H" in ax.get_ylabel())
    kind = "bias-corrected" if report["geometry"].get("distances") == "bias_corrected" else "plug-in"
    assert label.startswith(f"{kind} d_H (0 to "), label
    top = float(re.search(r"\(0 to ([0-9.]+)", label).group(1))
    assert 0 < top <= np.sqrt(2) + 1e-9, label
    (image,) = [im for ax in heat.axes for im in ax.get_images()]
    assert np.nanmax(np.asarray(image.get_array(), dtype=float)) <= top + 1e-3  # the range said is the range drawn

    occupancy = report["positions"]["occupancy"]
    ax = by_name["occupancy"].figure.axes[0]
    if plots.occupancy_log_scale(occupancy):
        occ = np.asarray(occupancy, dtype=float)
        assert ax.get_yscale() == "log" and occ[occ > 0].max() >= 10 * occ[occ > 0].min()
    else:
        assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0.0

    stress = by_name["stress_by_dim"].figure
    assert not any(ax.get_legend() for ax in stress.axes) and stress.legends
    for ax in stress.axes:
        drawn_y = [v for ln in ax.get_lines() for v in np.asarray(ln.get_ydata(), dtype=float) if np.isfinite(v)]
        if drawn_y:
            assert ax.get_ylim()[1] >= max(drawn_y)

    trade = by_name["lowrank_tradeoff"].figure
    assert _lines(trade, "scaled stress") and not _lines(trade, "stress")
    informative = informative_rank(report)
    if informative:
        (mark,) = _lines(trade, "components above noise")
        assert list(mark.get_xdata()) == [informative, informative]
    return by_name


def _answer_lines(out: Path) -> list[str]:
    """The answer: summary.md's paragraph after its title and tool line (the sentences the
    terminal prints first), as its lines."""
    lines = (out / "summary.md").read_text().splitlines()[4:]
    return lines[: lines.index("")] if "" in lines else lines


@pytest.fixture(scope="module")
def known_runs(tmp_path_factory) -> dict[str, Path]:
    """``posstats analyze`` with its defaults on a stationary and a planted corpus (n = 64,
    N = 2,000 tokens per position), report.html written."""
    tmp = tmp_path_factory.mktemp("known")
    runs = {}
    for kind in ("stationary", "planted"):
        save_counts(known_corpus(kind, 64, tokens=2000, seed=5).counts, tmp / f"{kind}-counts")
        out = tmp / kind
        assert main(["analyze", "--counts", str(tmp / f"{kind}-counts"), "--out", str(out), "-q"]) == 0
        assert main(["report", str(out), "-q"]) == 0
        runs[kind] = out
    return runs


def test_a_stationary_report_says_so_first_and_its_figures_pass(known_runs):
    out = known_runs["stationary"]
    answer = _answer_lines(out)
    assert answer and answer[0].startswith("No positional structure beyond sampling noise"), answer
    verdict = json.loads((out / "report.json").read_text())["verdict"]
    assert verdict["components_above_noise"] == 0 and not verdict["standout_positions"]["positions"]
    assert '<p class="answer">No positional structure beyond sampling noise' in (out / "report.html").read_text()
    check_figures(out)


def test_a_planted_report_names_the_planted_positions_first_and_its_figures_pass(known_runs):
    out = known_runs["planted"]
    answer = _answer_lines(out)
    assert answer[0].startswith("Positions 0-3 carry token distributions of their own"), answer
    assert "Among encodings used without fitting, " in answer[0], answer
    verdict = json.loads((out / "report.json").read_text())["verdict"]
    assert verdict["standout_positions"]["positions"] == [0, 1, 2, 3]
    check_figures(out)


def test_the_demo_reports_figures_pass(tmp_path, data_dir):
    out = tmp_path / "demo"
    assert main(["run", "--input", str(data_dir / "fortunes-sample.jsonl"), "--text-column", "text",
                 "--tokenizer", str(data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json"),
                 "--positions", "64", "--out", str(out), "-q"]) == 0
    figures = check_figures(out)
    assert {"occupancy", "hellinger_heatmap", "spectrum", "mds_2d", "stress_by_dim", "lowrank_tradeoff"} <= set(figures)
    assert _answer_lines(out)[0].startswith("Positions ")
