"""Each result is computed once per command: the n x n Hellinger matrix of the corpus' used
positions is formed once by ``posstats run`` (analysis, MDS, stress, HTML report), once by
``posstats analyze`` with its report, once by ``posstats report RUN_DIR`` and once by
``posstats export RUN_DIR --method smacof``; and ``posstats run`` still reports the numbers
it reported before the analysis handed its distances on (EXPECTED, from that code)."""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
import threading
from collections import Counter

import numpy as np
import pytest
import scipy.sparse as sp

import posstats.geometry.hellinger as hellinger_module
from posstats.cli import main
from posstats.counting.io import load_counts
from posstats.geometry.mds import classical_mds

# modules that import a distance entry point, loaded before the spy replaces the name in
# every loaded module that holds it
MODULES = ("posstats.analysis", "posstats.geometry.mds", "posstats.runs.run_folder", "posstats.audit",
           "posstats.estimates.noise", "posstats.estimates.sampled")
ENTRY_POINTS = ("hellinger_sq", "hellinger", "sqrt_distributions")

# report.json of 'posstats run' on the sample, --positions 64, default analysis options with the noise floor off, as
# written before the distances were handed on (12 significant digits)
EXPECTED = {
    # (not the fingerprint: it covers the input file's path, which differs between checkouts)
    "corpus": {"sequences": 3000, "windows": 3000, "tokens_counted": 102833, "vocab_size": 30522},
    "occupancy": [3000, 3000, 2999, 2991, 2980, 2954, 2921, 2890, 2841, 2807, 2766, 2712, 2649, 2582, 2497, 2406, 2341,
                  2280, 2189, 2099, 2026, 1952, 1866, 1794, 1740, 1677, 1621, 1572, 1515, 1467, 1417, 1370, 1330, 1289,
                  1241, 1210, 1175, 1131, 1093, 1071, 1040, 1007, 984, 963, 932, 909, 890, 874, 857, 836, 821, 805, 788,
                  766, 751, 735, 724, 714, 693, 681, 668, 656, 645, 633],
    "hellinger": [0.784442207119, 0.926131682431, 1.09473580502],
    "h1": [0.784442207119, [4, 5]],
    "a3": 0.404903225806,
    "rank": 63,
    "components_for": {"0.9": 54, "0.95": 59, "0.99": 63, "0.999": 63},
    "total_variance": 27.0903860445,
    "eigenvalues": [1.03763481298, 0.765187860081, 0.659557764495, 0.559077662297, 0.548055971783, 0.5387084028,
                    0.535594982346, 0.531666778298, 0.523967998971, 0.520492478677],
    # the rotation null (39 rotated corpora: the sample is counted with its window groups since
    # truncate mode has them): its largest top eigenvalue, on the occupancy-weighted scale since
    # the thirty-fourth session (the sample's occupancy falls along the context; unweighted it was
    # 0.938986254510 with 1 component, and the permutation null's 0.682362452272, 2), centred on
    # the weighted mean since the fifty-sixth session's change landed in the fifty-seventh
    # (1.08201557997 centred on the plain mean, also 2 components)
    "null": [0.880302990376, 2],
    # name, dim, stress, scaled stress, pearson, min separation, monotonicity violation rate
    "encodings": [
        ["mds", 2, 0.655694229029, 0.365870939449, 0.3716312255, 0.00179578292592, 0.193483870968],
        ["sinusoidal", 2, 0.579055320276, 0.180345891573, -0.0147442614674, 0.0177026185808, 0.514370967742],
        ["rope", 2, 0.579055320276, 0.180345891573, -0.0147442614674, 0.0177026185808, 0.514370967742],
        ["alibi", 2, 1.20499437027, 0.308803809651, 0.328197469616, 0.0626219513355, 0.0],
        ["random", 2, 1.55750585672, 0.198446810642, 0.00367919065231, 0.0550341398654, 0.514185483871],
        ["random:0.02", 2, 0.92788816798, 0.198446810642, 0.00367919065231, 0.00110068279731, 0.514185483871],
        ["mds", 16, 0.220979462635, 0.0792175397411, 0.920493390473, 0.110238033606, 0.346153225806],
        ["sinusoidal", 16, 3.37678418545, 0.0417555467778, 0.167654520107, 1.01472533871, 0.280403225806],
        ["rope", 16, 3.37678418545, 0.0417555467778, 0.167654520107, 1.01472533871, 0.280403225806],
        ["alibi", 16, 242.468456384, 0.308803809651, 0.328197469616, 0.57734586434, 0.0],
        ["random", 16, 24.3794035555, 0.0367820721473, -0.156199795754, 2.58978642637, 0.511524193548],
        ["random:0.02", 16, 0.781777967677, 0.0367820721473, -0.156199795754, 0.0517957285274, 0.511524193548],
        ["mds", 64, 4.53074072677e-32, 0.0, 1.0, 0.784442207119, 0.404903225806],
        ["sinusoidal", 64, 18.3704795646, 0.0323054190368, 0.249581174567, 1.47184804812, 0.104612903226],
        ["rope", 64, 18.3704795646, 0.0323054190368, 0.249581174567, 1.47184804812, 0.104612903226],
        ["alibi", 64, 242.468456384, 0.308803809651, 0.328197469616, 0.57734586434, 0.0],
        ["random", 64, 124.80694284, 0.0106682014034, -0.0265087225252, 7.94166683979, 0.509016129032],
        ["random:0.02", 64, 0.575171069188, 0.0106682014034, -0.0265087225252, 0.158833336796, 0.509016129032],
    ],
}


def digest(rows) -> str:
    """The same rows give the same digest, dense or sparse, whatever their dtype."""
    dense = np.ascontiguousarray(rows.toarray() if sp.issparse(rows) else np.asarray(rows), dtype=np.float64)
    return hashlib.sha256(repr(dense.shape).encode() + dense.tobytes()).hexdigest()


class Spy:
    """Counts the outermost calls of the distance entry points, by function and input rows,
    in every thread (null corpora are solved on threads: posstats.estimates.replicates)."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()
        self._local = threading.local()  # each thread's depth of nested entry-point calls
        self._lock = threading.Lock()

    def wrap(self, name: str, fn):
        def spied(counts, /, *args, **kwargs):
            depth = getattr(self._local, "depth", 0)
            if depth == 0:
                key = (name, digest(counts))
                with self._lock:
                    self.calls[key] += 1
            self._local.depth = depth + 1
            try:
                return fn(counts, *args, **kwargs)
            finally:
                self._local.depth = depth

        return spied

    def of(self, rows) -> int:
        """n x n matrices formed of ``rows`` (by ``hellinger_sq`` or ``hellinger``)."""
        d = digest(rows)
        return sum(n for (name, key), n in self.calls.items() if key == d and name != "sqrt_distributions")


@pytest.fixture()
def spy(monkeypatch) -> Spy:
    """Every loaded posstats / jobs module's distance entry points, spied."""
    for module in MODULES:
        importlib.import_module(module)
    s = Spy()
    for name in ENTRY_POINTS:
        original = getattr(hellinger_module, name)
        spied = s.wrap(name, original)
        holders = [mod for key, mod in list(sys.modules.items())
                   if key.split(".")[0] in ("posstats", "jobs") and getattr(mod, name, None) is original]
        for mod in holders:
            monkeypatch.setattr(mod, name, spied)
    return s


def corpus_rows(run_dir):
    counts = load_counts(run_dir)
    return counts.rows(counts.occupied_positions())


def assert_each_once(s: Spy, rows) -> None:
    assert s.of(rows) == 1, s.calls
    assert max(s.calls.values()) == 1, s.calls  # no matrix (a null corpus' either) formed twice


def check_expected(report: dict) -> None:
    close = {"rtol": 1e-9, "atol": 1e-12}
    assert {k: report["corpus"][k] for k in EXPECTED["corpus"]} == EXPECTED["corpus"]
    assert report["positions"]["occupancy"] == EXPECTED["occupancy"]
    np.testing.assert_allclose([report["hellinger"][k] for k in ("min", "mean", "max")], EXPECTED["hellinger"], **close)
    h1 = report["diagnostics"]["h1"]
    np.testing.assert_allclose(h1["min_distance"], EXPECTED["h1"][0], **close)
    assert h1["pair"] == EXPECTED["h1"][1]
    np.testing.assert_allclose(report["diagnostics"]["a3"]["rate"], EXPECTED["a3"], **close)
    spectrum = report["spectrum"]
    assert (spectrum["rank"], spectrum["components_for"]) == (EXPECTED["rank"], EXPECTED["components_for"])
    np.testing.assert_allclose(spectrum["total_variance"], EXPECTED["total_variance"], **close)
    np.testing.assert_allclose(spectrum["eigenvalues"][:10], EXPECTED["eigenvalues"], **close)
    np.testing.assert_allclose(report["null"]["threshold"], EXPECTED["null"][0], **close)
    assert report["null"]["components_above_null"] == EXPECTED["null"][1]
    fixed = [e for e in report["encodings"] if e["name"] != "mds-smacof"]  # SMACOF: an iterative fit, not pinned
    assert [e["dim"] for e in report["encodings"] if e["name"] == "mds-smacof"] == [2, 16, 64]
    got = [[e["name"], e["dim"]] for e in fixed]
    assert got == [e[:2] for e in EXPECTED["encodings"]]
    values = [[e[k] for k in ("stress", "scaled_stress", "pearson", "min_separation", "monotonicity_violation_rate")]
              for e in fixed]
    np.testing.assert_allclose(values, [e[2:] for e in EXPECTED["encodings"]], **close)


def sample_args(data_dir) -> list[str]:
    return ["--input", str(data_dir / "fortunes-sample.jsonl"), "--text-column", "text",
            "--tokenizer", str(data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json"), "--positions", "64"]


def test_run_forms_the_matrix_once_and_reports_the_numbers_it_did(tmp_path, data_dir, spy, capsys):
    out = tmp_path / "run"
    assert main(["run", *sample_args(data_dir), "--noise-floor", "off", "--out", str(out)]) == 0
    assert (out / "report.html").is_file() and (out / "summary.md").is_file()
    assert_each_once(spy, corpus_rows(out))
    report = json.loads((out / "report.json").read_text())
    # the corpus, the 39 rotated null corpora, the 39 shuffled corpora of the noise share
    # (rotated ones keep the structure they move), the 10 jackknife replicates, the two
    # held-out halves and the held-out jackknife's 10 replicates of each; the sample's plug-in
    # distances are mostly noise, so the jackknife only decides ties
    assert report["null"]["distance_noise"]["share"] >= 0.1
    assert all(e["stress_interval"].startswith("none: sampling noise") for e in report["encodings"])
    assert len(spy.calls) == 1 + 39 + 39 + 10 + 2 + 2 * 10
    check_expected(report)
    # held out on real text: every score has the jackknife's range for ties (or says why not),
    # never a 95 % interval, and the held-out best's ties are exactly the overlapping ranges
    held = report["held_out"]["encodings"]
    for e in held:
        assert e["held_out_scaled_stress_ci95"] == [e["held_out_scaled_stress"]] * 2
        assert e["held_out_interval"].startswith(("jackknife range (10 random token groups", "none: the jackknife"))
        assert len(e["held_out_scaled_stress_tie_range"]) == 2
    for row in report["verdict"]["held_out_best"]:
        at = sorted((e for e in held if e["dim"] == row["dim"]), key=lambda e: e["held_out_scaled_stress"])
        reach = at[0]["held_out_scaled_stress_tie_range"][1]
        assert row["best"] == at[0]["name"]
        assert set(row["tied_with"]) == {e["name"] for e in at[1:] if e["held_out_scaled_stress_tie_range"][0] <= reach * (1 + 1e-9)}


def test_analyze_report_and_export_each_form_the_matrix_once(tmp_path, data_dir, spy, capsys):
    light = ["--dims", "2,8", "--encodings", "mds,sinusoidal", "--null", "none"]
    run_dir, analysed = tmp_path / "run", tmp_path / "analysed"
    assert main(["run", *sample_args(data_dir), *light, "--out", str(run_dir)]) == 0
    rows = corpus_rows(run_dir)
    spy.calls.clear()
    assert main(["analyze", "--counts", str(run_dir), *light, "--out", str(analysed)]) == 0
    assert (analysed / "report.html").is_file()
    assert_each_once(spy, rows)
    for command in (["report", str(analysed)],
                    ["export", str(analysed), "--dim", "8", "--rank", "2", "--method", "smacof",
                     "--out", str(tmp_path / "export" / "pos.safetensors")]):
        spy.calls.clear()
        assert main(command) == 0
        assert_each_once(spy, rows)


def test_classical_mds_takes_the_callers_squared_distances():
    rng = np.random.default_rng(3)
    counts = rng.poisson(2.0, size=(12, 30)) + (np.arange(30) == 0)
    d2 = hellinger_module.hellinger_sq(counts)
    given = d2.copy()
    ref = classical_mds(counts, method="dense")
    got = classical_mds(counts, method="dense", squared_distances=given)
    np.testing.assert_array_equal(got.eigenvalues, ref.eigenvalues)
    np.testing.assert_array_equal(got.encoding, ref.encoding)
    np.testing.assert_array_equal(given, d2)  # read, never modified
    with pytest.raises(ValueError, match="needs method='dense'"):
        classical_mds(counts, k=2, method="lanczos", squared_distances=d2)
    with pytest.raises(ValueError, match=r"must be \(n, n\)"):
        classical_mds(counts, method="dense", squared_distances=d2[:5, :5])
