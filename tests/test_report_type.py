"""The analysis report is typed (issue #29): ``Analysis.report()`` is a :class:`posstats.report.Report`
whose ``to_dict`` is report.json, read back by ``from_dict`` to an equal report."""

from __future__ import annotations

import json

import pytest

from posstats.analysis import AnalysisConfig, analyze
from posstats.estimates.verdict import Verdict
from posstats.report import CorpusSummary, EncodingScore, PositionsSummary, Report, SpectrumSummary
from posstats.reports.analysis_folder import write_analysis
from posstats.testing import known_corpus


@pytest.fixture(scope="module")
def planted():
    counts = known_corpus("planted", 48, tokens=1500, seed=2).counts
    return analyze(counts, AnalysisConfig(dims=(2, 8), encodings=("mds", "sinusoidal", "alibi"), held_out="off"))


def test_the_report_is_typed(planted):
    report = planted.report()
    assert isinstance(report, Report) and isinstance(report.verdict, Verdict)
    assert isinstance(report.corpus, CorpusSummary) and report.corpus.tokens_counted == 48 * 1500
    assert isinstance(report.positions, PositionsSummary) and report.positions.used == 48
    assert len(report.positions.occupancy) == 48 and set(report.positions.occupancy) == {1500}
    assert isinstance(report.spectrum, SpectrumSummary) and list(report.spectrum.eigenvalues) == sorted(
        report.spectrum.eigenvalues, reverse=True)
    assert all(isinstance(e, EncodingScore) for e in report.encodings)
    assert {(e.name, e.dim) for e in report.encodings} >= {("mds", 2), ("sinusoidal", 8), ("alibi", 2)}
    mds = next(e for e in report.encodings if e.name == "mds" and e.dim == 8)
    assert mds.fitted and not next(e for e in report.encodings if e.name == "sinusoidal").fitted
    assert report.verdict.standout_positions["positions"] == [0, 1, 2, 3]
    assert planted.verdict() == report.verdict
    assert {"noise", "null", "geometry", "homogeneity"} <= set(report.sections)


def test_report_json_is_its_serialisation_and_reads_back_equal(planted, tmp_path):
    report = planted.report()
    doc = report.to_dict()
    assert list(doc)[:4] == ["verdict", "schema_version", "tool", "created"]
    assert Report.from_dict(doc) == report
    assert Report.from_dict(json.loads(json.dumps(doc))).to_dict() == json.loads(json.dumps(doc))
    run = write_analysis(tmp_path / "run", planted)
    written = json.loads((tmp_path / "run" / "report.json").read_text())
    back = Report.from_dict(written)
    assert back.verdict == report.verdict and back.encodings == report.encodings
    assert written["inputs"] == back.sections["inputs"] and run.report["verdict"] == written["verdict"]


def test_a_report_reads_as_its_json_document(planted):
    """Code written against report.json reads an analysis the same way (a read-only mapping)."""
    report = planted.report()
    assert report["verdict"]["structure"] == report.verdict.structure
    assert report["positions"]["used"] == 48 and report.get("no such key") is None
    assert list(report) == list(report.to_dict())
    with pytest.raises(TypeError):
        report["verdict"] = {}  # type: ignore[index]


def test_sections_keep_unknown_keys_in_order():
    score = EncodingScore.from_dict({"name": "rope", "dim": 4, "stress": 1.0, "scaled_stress": 0.5,
                                     "scaled_stress_ci95": [0.4, 0.6], "new_key": 3})
    assert score.scaled_stress_ci95 == (0.4, 0.6) and score.details == {"scaled_stress_ci95": [0.4, 0.6], "new_key": 3}
    assert list(score.to_dict()) == ["name", "dim", "stress", "scaled_stress", "scaled_stress_ci95", "new_key"]
    assert EncodingScore.from_dict({"name": "x", "dim": 1, "stress": 0.0, "scaled_stress": 0.0}).scaled_stress_ci95 is None
