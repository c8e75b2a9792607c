"""The HTML report: self-contained, every image loads in headless Chromium, PNGs and summary."""

from __future__ import annotations

import base64
import html
import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from posstats.cli import main
from posstats.counting.counts import CountSpec, PositionalCounts
from posstats.counting.io import save_counts
from posstats.errors import InputError
from posstats.reports.html import write_html_report

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = {"occupancy", "hellinger_heatmap", "spectrum", "mds_2d", "mds_3d", "stress_by_dim", "lowrank_tradeoff", "monotonicity"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """An analyze-only folder: its counts live elsewhere (report.json inputs.counts)."""
    tmp = tmp_path_factory.mktemp("html")
    rng = np.random.default_rng(4)
    n, vocab = 30, 50
    a, b = rng.dirichlet(np.full(vocab, 0.5), size=2)
    t = np.linspace(0, 1, n)[:, None] ** 0.5
    matrix = np.stack([rng.multinomial(int(3000 * (1 - 0.8 * i / n)), p) for i, p in enumerate((1 - t) * a + t * b)])
    counts = PositionalCounts(CountSpec(n, vocab), matrix.astype(np.int64), sequences=3000, windows=3000,
                              tokens=int(matrix.sum()), fingerprint="12" * 32)
    save_counts(counts, tmp / "counts")
    out = tmp / "run"
    assert main(["analyze", "--counts", str(tmp / "counts"), "--dims", "2,8,16", "--encodings", "mds,sinusoidal,random",
                 "--out", str(out)]) == 0
    write_html_report(out)
    return out


def _images(page: str) -> dict[str, bytes]:
    found = re.findall(r'<figure id="([^"]+)"><img src="data:image/png;base64,([^"]+)"', page)
    return {name: base64.b64decode(data) for name, data in found}


def test_report_is_self_contained_with_every_figure(run_dir):
    page = (run_dir / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    images = _images(page)
    assert set(images) == FIGURES
    for name, data in images.items():
        assert data.startswith(PNG_MAGIC)
        assert data == (run_dir / "figures" / f"{name}.png").read_bytes()
    # Nothing is fetched: every src is a data URI, every link an anchor, no scripts.
    assert all(s.startswith("data:image/png;base64,") for s in re.findall(r'src="([^"]*)"', page))
    assert all(h.startswith("#") for h in re.findall(r'href="([^"]*)"', page))
    assert "<script" not in page and "http://" not in page and "https://" not in page
    captions = re.findall(r"<figcaption><b>[^<]*</b> ([^<]*)</figcaption>", page)
    assert len(captions) == len(FIGURES)
    assert all(html.unescape(c).endswith(".") and "look for" in c for c in captions)
    assert "Low-rank MDS encodings (n = 30, d = 16)" in page
    # the low-rank table says how many of its ranks stand above sampling noise (the verdict's count)
    from posstats.reports.html import lowrank_noise_note

    report = json.loads((run_dir / "report.json").read_text())
    note = lowrank_noise_note(report)
    assert html.escape(note) in page and note in (run_dir / "summary.md").read_text()
    rank = report["verdict"]["components_above_noise"]
    assert (f"Only the first {rank} component(s)" in note) if rank else note.startswith("No component stands above")


def test_summary_markdown_links_existing_figures(run_dir):
    md = (run_dir / "summary.md").read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert {f"figures/{n}.png" for n in FIGURES} == set(links)
    assert all((run_dir / link).is_file() for link in links)
    assert "| P_MDS, r=1 | 1 |" in md and "| encoding | dim | stress |" in md


def test_uncertainty_is_drawn_when_present(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    report = json.loads((copy / "report.json").read_text())
    lam = np.asarray(report["spectrum"]["eigenvalues"])
    report["spectrum"]["eigenvalues_ci95"] = np.c_[lam * 0.8, lam * 1.2].tolist()
    report["noise_floor"] = {"eigenvalue": float(lam[3]), "d_H": 0.01}
    (copy / "report.json").write_text(json.dumps(report))
    page = write_html_report(copy, max_heatmap=10).read_text()
    assert "<h2>Uncertainty</h2>" in page and "noise_floor.d_H" in page
    assert "downsampled: an even stride of 10 of the 30 used positions" in page
    assert _images(page)["spectrum"] != (run_dir / "figures" / "spectrum.png").read_bytes()
    assert "sampling triples alone" not in page  # every monotonicity rate here is exact


def test_sampled_monotonicity_intervals_say_what_they_cover(run_dir, tmp_path):
    """Above 8,192 positions monotonicity rates are sampled: their [lo, hi] (table) and error
    bars (figure) cover the error of sampling triples alone, and the page says so."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    report = json.loads((copy / "report.json").read_text())
    e = report["encodings"][0]
    e["monotonicity_method"], e["monotonicity_ci95"] = "sampled", [e["monotonicity_violation_rate"] - 0.01,
                                                                    e["monotonicity_violation_rate"] + 0.01]
    (copy / "report.json").write_text(json.dumps(report))
    page = html.unescape(write_html_report(copy, max_heatmap=10).read_text())
    assert "a 95 % Wilson interval for the error of sampling triples alone" in page
    assert "error bars on sampled rates are 95 % Wilson intervals for the error of sampling triples alone" in page


def test_missing_inputs(tmp_path, capsys):
    with pytest.raises(InputError, match="no such run folder"):
        write_html_report(tmp_path / "nope")
    assert main(["report", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posstats: error: ") and "\n" not in err
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "report.json").write_text("{}")
    with pytest.raises(InputError, match="no mds.safetensors"):
        write_html_report(tmp_path / "half")


def test_counts_that_changed_since_the_analysis_are_refused(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    report = json.loads((copy / "report.json").read_text())
    other = tmp_path / "other-counts"
    save_counts(PositionalCounts(CountSpec(30, 50), np.ones((30, 50), np.int64), tokens=1500, fingerprint="99" * 32), other)
    report["inputs"]["counts"] = str(other)
    (copy / "report.json").write_text(json.dumps(report))
    with pytest.raises(InputError, match="is not the analysed corpus"):
        write_html_report(copy)


def test_cli_run_then_report(tmp_path, data_dir, capsys):
    out = tmp_path / "demo"
    assert main(["run", "--input", str(data_dir / "fortunes-sample.jsonl"), "--text-column", "text",
                 "--tokenizer", str(data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json"),
                 "--positions", "48", "--dims", "2,16", "--encodings", "mds,sinusoidal", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["report", str(out), "--width", "32"]) == 0
    assert "report.html" in capsys.readouterr().out
    page = (out / "report.html").read_text()
    assert set(_images(page)) == FIGURES
    assert "Low-rank MDS encodings (n = 48, d = 32)" in page


_CHECK_SCRIPT = """<script>
window.addEventListener("load", () => {
  const imgs = Array.from(document.images);
  const out = document.createElement("pre");
  out.id = "posstats-check";
  out.textContent = JSON.stringify({
    images: imgs.length,
    loaded: imgs.filter((i) => i.complete && i.naturalWidth > 0).length,
    sizes: imgs.map((i) => [i.naturalWidth, i.naturalHeight]),
  });
  document.body.appendChild(out);
});
</script>"""


def _chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("headless Chromium is not installed (apt-get install -y chromium)")
    return exe


def test_every_image_loads_in_headless_chromium(run_dir, tmp_path):
    exe = _chromium()
    # A copy with a probe script: the report itself has no scripts.
    page = (run_dir / "report.html").read_text().replace("</body>", _CHECK_SCRIPT + "</body>")
    probe = tmp_path / "probe.html"
    probe.write_text(page)
    flags = [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([exe, *flags, "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    found = re.search(r'<pre id="posstats-check">(.*?)</pre>', dom, re.S)
    assert found, "the probe did not run"
    check = json.loads(html.unescape(found.group(1)))
    assert check["images"] == len(FIGURES)
    assert check["loaded"] == check["images"]
    assert all(w > 300 and h > 200 for w, h in check["sizes"])
    # And the page renders to a screenshot (looked at by hand when the report changes).
    shot = tmp_path / "shot.png"
    subprocess.run([exe, *flags, f"--screenshot={shot}", "--window-size=1280,4000", (run_dir / "report.html").as_uri()],
                   capture_output=True, timeout=120, check=True)
    assert shot.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize(("null", "expected"), [
    ({"method": "shuffle", "threshold": 0.29, "eigenvalue_scale": "bias_corrected"}, 0.29),
    ({"method": "mp", "threshold": 0.9, "eigenvalue_scale": "corrected + mean bias", "eigenvalue_shift": 0.6}, 0.9 - 0.6),
    ({"method": "mp", "threshold": 0.9, "eigenvalue_scale": "corrected + mean bias"}, None),  # no shift: not drawn
    ({}, None),
])
def test_spectrum_threshold_is_the_nulls_on_the_eigenvalues_scale(null, expected):
    """The spectrum's noise line is the null's threshold (real runs have no noise_floor key);
    the mp edge, compared on the plug-in scale, is moved back onto the corrected one."""
    from posstats.reports.spectrum_view import noise_threshold

    got = noise_threshold({"null": null})
    assert got == (None if expected is None else pytest.approx(expected))


def test_real_run_draws_the_noise_threshold(tmp_path, data_dir):
    """End to end: the bundled demo's spectrum caption counts the components above the
    null's threshold, the same count as the verdict's."""
    out = tmp_path / "run"
    assert main(["run", "--input", str(data_dir / "fortunes-sample.jsonl"), "--text-column", "text",
                 "--tokenizer", str(data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json"),
                 "--positions", "32", "--out", str(out), "-q"]) == 0
    report = json.loads((out / "report.json").read_text())
    page = (out / "report.html").read_text()
    above = report["null"]["components_above_null"]
    assert f"dotted noise threshold ({above} here)" in page


def test_key_numbers_say_what_the_component_counts_are_shares_of():
    from posstats.reports.summary import variance_of

    assert variance_of({"denominator": "positive_eigenvalues"}) == "of the variance"
    assert variance_of({"denominator": "computed_positive_eigenvalues", "eigenvalues": [3.0, 2.0]}) == \
        "of the top 2 components' variance"


@pytest.mark.slow
def test_the_figures_of_a_long_context_run_pass_their_checks(tmp_path):
    """A run on the long-context path (sampled stress, Lanczos MDS, the analytic null: more
    rows than the exact limit) draws figures that cannot mislead (issue #30): the spectrum's
    cumulative share is monotone and <= 1 with the null's threshold drawn, the heatmap says
    it is a sample and names its distances, the occupancy axis is linear over a narrow range,
    legends sit outside the data, the trade-off plots scaled stress."""
    import numpy as np

    from posstats.analysis import AnalysisConfig, analyze
    from posstats.reports import html
    from posstats.reports.analysis_folder import write_analysis
    from posstats.runs.run_folder import run_distances
    from posstats.testing import known_corpus

    counts = known_corpus("planted", 2500, tokens=800, vocab=2000, strength=0.5, seed=3).counts
    config = AnalysisConfig(dims=(2, 16), encodings=("mds", "sinusoidal", "alibi"), exact_limit=1024,
                            noise_floor="on", null="mp", held_out="off")
    run = write_analysis(tmp_path / "run", analyze(counts, config))
    assert run.report["geometry"]["stress_method"] == "sampled" and run.report["null"]["method"] == "mp"
    idx, dist = run_distances(run, max_positions=600)
    plots = {p.name: p for p in html._figures(run, idx, dist, html._tradeoff(run, idx, dist, width=16), width=16,
                                               max_heatmap=256)}
    spectrum = plots["spectrum"]
    curve = next(ln for ax in spectrum.figure.axes for ln in ax.get_lines() if ln.get_label().startswith("cumulative"))
    y = np.asarray(curve.get_ydata(), dtype=float)
    assert np.all(np.diff(y) >= -1e-12) and y.max() <= 1 + 1e-12
    if run.report["spectrum"]["denominator"] == "computed_positive_eigenvalues":  # as the key numbers say
        assert curve.get_label() == "cumulative share of the top 16 components' variance"
    assert any(ln.get_label().startswith("noise threshold") for ax in spectrum.figure.axes for ln in ax.get_lines())
    heat = plots["hellinger_heatmap"]
    assert "of 2,500" in heat.caption or "2500" in heat.caption.replace(",", ""), heat.caption
    assert any("d_H" in ax.get_ylabel() for ax in heat.figure.axes)
    occupancy = plots["occupancy"].figure.axes[0]
    assert occupancy.get_yscale() == "linear" and occupancy.get_ylim()[0] == 0.0  # every position holds 800 tokens
    stress = plots["stress_by_dim"]
    assert not any(ax.get_legend() for ax in stress.figure.axes) and stress.figure.legends
    assert any(ln.get_label() == "scaled stress" for ln in plots["lowrank_tradeoff"].figure.axes[0].get_lines())
    assert (tmp_path / "run" / "report.html").is_file()
