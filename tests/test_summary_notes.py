"""The notes under the encodings table: encodings not scored, iterative fits not converged."""

from __future__ import annotations

import numpy as np

from posstats.analysis import AnalysisConfig, analyze
from posstats.reports.summary import encoding_note_lines, format_markdown, format_summary, unconverged_lines
from posstats.testing import known_corpus


def test_unconverged_fits_are_named_once_per_encoding_with_their_widths():
    report = {"encodings": [
        {"name": "mds-smacof", "dim": 2, "fit": {"converged": False, "iterations": 300}},
        {"name": "mds-smacof", "dim": 16, "fit": {"converged": False, "iterations": 300}},
        {"name": "mds-smacof:max_iter=5000", "dim": 16, "fit": {"converged": True, "iterations": 2400}},
        {"name": "mds", "dim": 2, "fit": {"method": "classical"}},  # no iterations: never "not converged"
        {"name": "sinusoidal", "dim": 2},
    ], "skipped_encodings": [{"spec": "mds-smacof", "reason": "above the SMACOF limit"}]}
    assert unconverged_lines(report) == [
        "not converged: mds-smacof at d = 2, 16 stopped after 300 iterations: its stress is an upper bound of "
        "its minimum (a larger max_iter in its spec, e.g. mds-smacof:max_iter=3000, iterates longer)"]
    assert encoding_note_lines(report) == ["not scored: mds-smacof: above the SMACOF limit", *unconverged_lines(report)]
    assert unconverged_lines({"encodings": report["encodings"][2:]}) == []


def test_a_capped_smacof_is_reported_in_the_text_and_markdown_summaries():
    kc = known_corpus("planted", 16, tokens=2_000, seed=1, planted=np.arange(16), strength=(0.05, 0.3))
    cfg = AnalysisConfig(dims=(2,), encodings=("mds-smacof:max_iter=2", "sinusoidal"), held_out="off", null="none")
    report = analyze(kc.counts, cfg).report()
    (entry,) = [e for e in report["encodings"] if e["name"].startswith("mds-smacof")]
    assert entry["fit"]["converged"] is False and entry["fit"]["iterations"] == 2
    line = "not converged: mds-smacof:max_iter=2 at d = 2 stopped after 2 iterations"
    assert line in format_summary(report)
    assert line[0].upper() + line[1:] in format_markdown(report)


def test_cli_run_on_the_bundled_sample_names_an_unconverged_smacof(tmp_path, data_dir, capsys):
    """End to end on real text: `posstats run` with SMACOF capped at 5 iterations prints the
    note, and summary.md and report.html carry it, for exactly the widths whose fit in
    report.json says it stopped unconverged after 5 iterations."""
    import html
    import json

    from posstats.cli import main

    out = tmp_path / "demo"
    assert main(["run", "--input", str(data_dir / "fortunes-sample.jsonl"), "--text-column", "text",
                 "--tokenizer", str(data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json"),
                 "--positions", "48", "--dims", "2,16", "--encodings", "mds-smacof:max_iter=5,sinusoidal",
                 "--held-out", "off", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    capped = [e for e in report["encodings"] if e["name"].startswith("mds-smacof")]
    assert [(e["dim"], e["fit"]["iterations"], e["fit"]["converged"]) for e in capped] == [(2, 5, False), (16, 5, False)]
    line = "not converged: mds-smacof:max_iter=5 at d = 2, 16 stopped after 5 iterations"
    assert line in printed
    assert line[0].upper() + line[1:] in (out / "summary.md").read_text()
    assert line[0].upper() + line[1:] in html.unescape((out / "report.html").read_text())
