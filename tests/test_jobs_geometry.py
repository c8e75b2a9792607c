"""Ray jobs jobs.hellinger and jobs.eigensolve: a CPU actor here (a GPU actor where the
cluster has a GPU), results equal to the library's to 1e-12, files written as documented."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from posstats.counting.io import save_counts
from posstats.estimates.null_rank import bias_shift, mp_edge
from posstats.estimates.noise import merge_noise_floors
from posstats.estimates.permutation import occupancy_weights, top_eigenpairs, weighted_gram
from posstats.estimates.occupancy import OccupancyShrinkage, adjusted
from posstats.estimates.pair_jackknife import pair_noise_share
from posstats.estimates.sampling_variance import position_sampling_variance
from posstats.estimates.sampled import SampledGeometry
from posstats.estimates.thinning import range_noise_floor
from posstats.estimates.standout import standout_positions
from posstats.geometry.hellinger import hellinger_sq
from posstats.geometry.mds import classical_mds
from posstats.geometry.ranged import local_ranges
from posstats.testing import synthetic_counts

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def counts_dir(tmp_path_factory):
    syn = synthetic_counts(400, 3000, tokens=3000, rank=3, strength=0.4, block_tokens=24, seed=7)
    path = tmp_path_factory.mktemp("counts")
    save_counts(syn.counts, path)
    return path, syn.counts


def test_hellinger_job_matches_the_library(ray_session, counts_dir, tmp_path):
    from posstats.jobs.hellinger import main

    path, counts = counts_dir
    out = tmp_path / "h"
    assert main(["--counts", str(path), "--out", str(out), "--block", "128"]) == 0
    summary = json.loads((out / "hellinger.json").read_text())
    expected_device = "gpu" if ray_session.cluster_resources().get("GPU", 0) >= 1 else "cpu"
    assert summary["actor"]["device"] == expected_device and summary["positions_used"] == 400
    t = load_file(str(out / "hellinger.safetensors"))
    np.testing.assert_allclose(t["d2"], hellinger_sq(counts.matrix), rtol=0, atol=1e-12)
    assert np.all(np.diag(t["d2"]) == 0.0)
    np.testing.assert_array_equal(t["positions"], np.arange(400))
    np.testing.assert_array_equal(t["occupancy"], counts.occupancy())


def test_eigensolve_job_matches_dense_eigh(ray_session, counts_dir, tmp_path):
    from posstats.jobs.eigensolve import main

    path, counts = counts_dir
    out = tmp_path / "e"
    assert main(["--counts", str(path), "--out", str(out), "--k", "16", "--tol", "1e-10", "--buckets", "none",
                 "--distances", "plugin"]) == 0
    summary = json.loads((out / "eigensolve.json").read_text())
    assert summary["converged"] and summary["max_residual"] <= 1e-10 and summary["k"] == 16
    assert summary["peak_rss_bytes"] > 2**20  # the largest process' peak, in bytes
    # on CPUs the default is one range per CPU of the cluster (no core left idle)
    cpus = int(ray_session.cluster_resources()["CPU"])
    if ray_session.cluster_resources().get("GPU", 0) < 1:
        assert len(summary["ranges"]) == min(cpus, 64)
    dense = classical_mds(counts.matrix, k=16, method="dense")
    # --buckets (here one position per bucket) keeps the one actor holding the counts whole
    one = tmp_path / "one"
    assert main(["--counts", str(path), "--out", str(one), "--k", "16", "--tol", "1e-10", "--buckets", "fixed:1"]) == 0
    one_actor = json.loads((one / "eigensolve.json").read_text())
    assert "ranges" not in one_actor  # and --distances auto is plug-in there, saying no rank test ran
    assert one_actor["distances"] == "plugin" and one_actor["noise"]["tested"] is False
    for folder in (out, one):
        t = load_file(str(folder / "mds.safetensors"))
        np.testing.assert_allclose(t["eigenvalues"], dense.eigenvalues, rtol=0, atol=1e-12 * dense.eigenvalues[0])
        np.testing.assert_allclose(t["encoding"][:, :3], dense.encoding[:, :3], rtol=0, atol=1e-8)


def test_ranged_eigensolve_job_holds_ranges_apart_and_matches_dense_eigh(ray_session, counts_dir, tmp_path):
    from posstats.jobs.eigensolve import main

    path, counts = counts_dir
    stored = int(counts.matrix.nnz)
    out = tmp_path / "r"
    assert main(["--counts", str(path), "--out", str(out), "--k", "16", "--tol", "1e-10",
                 "--memory-budget", "0.5", "--ranges", "3", "--distances", "plugin"]) == 0
    summary = json.loads((out / "eigensolve.json").read_text())
    ranges = summary["ranges"]
    assert len(ranges) == 3 and len({r["pid"] for r in ranges}) == 3  # three processes
    assert [r["start"] for r in ranges] == [0, ranges[0]["stop"], ranges[1]["stop"]] and ranges[-1]["stop"] == 400
    assert sum(r["stored"] for r in ranges) == stored and sum(r["positions"] for r in ranges) == 400
    assert all(r["bytes_held"] <= summary["memory_budget_bytes"] for r in ranges)
    assert summary["converged"] and summary["max_residual"] <= 1e-10 and summary["k"] == 16
    t = load_file(str(out / "mds.safetensors"))
    dense = classical_mds(counts.matrix, k=16, method="dense")
    np.testing.assert_allclose(t["eigenvalues"], dense.eigenvalues, rtol=0, atol=1e-12 * dense.eigenvalues[0])
    np.testing.assert_allclose(t["encoding"][:, :3], dense.encoding[:, :3], rtol=0, atol=1e-8)
    np.testing.assert_array_equal(t["positions"], np.arange(400))


def test_corrected_eigensolve_over_ranges_is_the_analysis_geometry(ray_session, counts_dir, tmp_path):
    """--distances corrected: each actor keeps its rows' noise floor; the driver decomposes
    B - H diag(b) H with b the unbiased per-position bias (equal to dense eigh of it), the
    bulk to the noise-matched residual, and counts the components above the analytic edge:
    the edge and the count are those of the same floor computed in this process."""
    from posstats.jobs.eigensolve import main

    path, counts = counts_dir
    out = tmp_path / "c"
    assert main(["--counts", str(path), "--out", str(out), "--k", "8", "--tol", "1e-10", "--ranges", "3",
                 "--distances", "corrected", "--seed", "2"]) == 0
    summary = json.loads((out / "eigensolve.json").read_text())
    noise = summary["noise"]
    assert summary["distances"] == "bias_corrected" and len(summary["ranges"]) == 3
    assert noise["occupancy_adjusted"] is True  # rows of 2,836-3,168 tokens: their shrinkage removed
    assert noise["source"] == "token split" and noise["parts"] == 4 and noise["edge"] > 0
    assert noise["edge_method"]["method"] == "analytic" and "no window groups" in noise["edge_method"]["halves_not_used"]
    bias = position_sampling_variance(counts.matrix)
    shrinkage = OccupancyShrinkage.of(counts.matrix)
    dense = classical_mds(counts.matrix, k=8, method="dense", diagonal=bias,
                          squared_distances=adjusted(hellinger_sq(counts.matrix), counts.matrix))
    t = load_file(str(out / "mds.safetensors"))
    above = np.asarray(summary["eigenvalues"]) > noise["noise_level"] + noise["noise_residual"]
    # above the edge to --tol; inside the bulk to the residual share x edge (an eigenvalue error below it)
    np.testing.assert_allclose(t["eigenvalues"][above], dense.eigenvalues[above], rtol=0, atol=1e-9 * dense.eigenvalues[0])
    np.testing.assert_allclose(t["eigenvalues"], dense.eigenvalues, rtol=0, atol=noise["noise_residual"])
    assert summary["converged"]  # each pair within its own target (the bulk's is the noise residual)
    # the same floor in this process (same cuts, same seed): the same edge, and the count
    # of the dense eigenvalues above it on the plug-in scale; occupancies differ, so both
    # are occupancy-weighted (W^1/2 B_c W^1/2 against the weighted edge), as in the analysis
    floor = merge_noise_floors(local_ranges(path, 3, noise_of=functools.partial(range_noise_floor, parts=4, seed=2))
                               .call("noise"))
    weights = occupancy_weights(counts.occupancy())
    assert noise["weighting"] == "occupancy" and weights is not None
    edge = mp_edge([], floor, weighted=True)
    np.testing.assert_allclose(noise["edge"], edge, rtol=1e-12)
    d2 = adjusted(hellinger_sq(counts.matrix), counts.matrix)
    tested, vectors = top_eigenpairs(weighted_gram(d2, bias, weights), k=8)
    np.testing.assert_allclose(noise["tested_eigenvalues"], tested, rtol=0, atol=0.1 * edge)
    decided = tested > edge - bias_shift(bias, weights)  # above the edge: to --tol
    np.testing.assert_allclose(np.asarray(noise["tested_eigenvalues"])[decided], tested[decided], rtol=1e-8)
    expected = int(np.sum(tested + bias_shift(bias, weights) > edge))
    assert noise["components_above_noise"] == expected and 2 <= expected <= 3  # rank 3 planted, the third weak
    # the counted components' occupancy-weighted coordinates (what export --weighting occupancy writes)
    assert noise["weighted_mds_components"] == expected
    from posstats.geometry.mds import weighted_coordinates

    np.testing.assert_allclose(t["weighted_encoding"], weighted_coordinates(vectors[:, :expected], tested[:expected], weights),
                               rtol=0, atol=1e-6 * np.abs(t["weighted_encoding"]).max())
    np.testing.assert_allclose(noise["bias_d_h2"]["mean"], bias.mean(), rtol=1e-12)
    # the sampled stress of P_MDS over the ranges: the library's SampledGeometry on the
    # counts, same seed, same pairs, same distances (bias-corrected)
    assert [e["dim"] for e in summary["stress"]] == [2]  # the default widths up to --k 8
    sampled = SampledGeometry(counts.matrix, bias=bias, seed=2, shrinkage=shrinkage)
    ref_stress = sampled.stress([t["encoding"][:, :2]], target_halfwidth=1e-3)[0]
    assert summary["stress"][0]["pairs"] == ref_stress.pairs
    np.testing.assert_allclose(summary["stress"][0]["scaled_stress"], ref_stress.scaled_stress, rtol=1e-9)
    # the noise share of those pairs: the in-process one on the counts (same pairs, same seed)
    share = pair_noise_share(counts.matrix, sampled.i, sampled.j, sampled.h, corrected=True, seed=2,
                             occupancy_adjusted=True)
    assert summary["distance_noise"]["share"] == pytest.approx(share, rel=1e-9)
    assert 0 < share < 0.5  # a planted rank-3 corpus: most of the distance is structure
    # the standout test over the ranges: the analysis' own decision on the same counts
    ref = standout_positions(counts.matrix, np.arange(400))
    got = summary["standout_positions"]
    assert got["count"] == ref["count"] and got["positions"] == ref["positions"]
    np.testing.assert_allclose(got["max_z"], ref["max_z"], rtol=1e-9)


def test_ranged_eigensolve_refuses_what_ranges_cannot_do(ray_session, counts_dir, tmp_path, capsys):
    from posstats.jobs.eigensolve import main

    path, _ = counts_dir
    base = ["--counts", str(path), "--out", str(tmp_path / "o"), "--k", "4"]
    for extra, said in ((["--ranges", "2", "--buckets", "log:8"], "--buckets none"),
                        (["--ranges", "2", "--device", "gpu"], "CPUs"),
                        (["--distances", "corrected", "--buckets", "log:8"], "--distances corrected holds position ranges"),
                        (["--distances", "corrected", "--device", "gpu"], "--distances corrected runs on position ranges"),
                        (["--distances", "corrected", "--lanczos-noise-share", "1"], "in [0, 1)"),
                        (["--ranges", "2", "--stress-dims", "2,8"], "at most --k 4"),
                        (["--ranges", "2", "--stress-dims", "two"], "widths like 2,16,64"),
                        (["--ranges", "2", "--stress-halfwidth", "0"], "in (0, 1)"),
                        (["--memory-budget", "0.1"], "leaves nothing for the counts"),
                        (["--ranges", "0"], "between 1 and 1024")):
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1
    assert main(base + ["--ranges", "5000"]) == 2
    assert "between 1 and 1024" in capsys.readouterr().err
    # a budget a hair above the per-process baseline would need thousands of actors
    assert main(base + ["--memory-budget", "0.2500001"]) == 2
    err = capsys.readouterr().err
    assert "ranges, one Ray actor each (at most 1024)" in err and err.count("\n") == 1
    # no position holds that many tokens: every range is empty
    assert main(base + ["--ranges", "2", "--min-occupancy", "10000000"]) == 2
    err = capsys.readouterr().err
    assert "no occupied position" in err and "--min-occupancy 10000000" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_jobs_report_bad_input(ray_session, tmp_path, capsys):
    from posstats.jobs.eigensolve import main

    assert main(["--counts", str(tmp_path / "missing"), "--out", str(tmp_path / "o"), "--k", "4"]) != 0
    assert main(["--counts", str(tmp_path), "--out", str(tmp_path / "o"), "--k", "0"]) == 2


@pytest.mark.gpu
@pytest.mark.usefixtures("cupy")  # skips with the reason when cupy or a CUDA device is missing
def test_gpu_actor_equals_cpu(ray_session, counts_dir, tmp_path):
    from posstats.jobs.hellinger import main

    path, counts = counts_dir
    if ray_session.cluster_resources().get("GPU", 0) < 1:
        pytest.skip("the Ray session has no GPU resource")
    assert main(["--counts", str(path), "--out", str(tmp_path / "g"), "--device", "gpu"]) == 0
    assert main(["--counts", str(path), "--out", str(tmp_path / "c"), "--device", "cpu"]) == 0
    g = load_file(str(tmp_path / "g" / "hellinger.safetensors"))["d2"]
    c = load_file(str(tmp_path / "c" / "hellinger.safetensors"))["d2"]
    np.testing.assert_allclose(g, c, rtol=0, atol=1e-12)


def test_a_damaged_range_is_refused_in_one_line_naming_the_file(ray_session, counts_dir, tmp_path, capsys):
    from posstats.counting.io import counts_file
    from posstats.jobs.eigensolve import main

    path, _ = counts_dir
    src = counts_file(path)
    with safe_open(str(src), framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = dict(f.metadata())
    tensors["data"] = tensors["data"].astype(np.int32)
    tensors["data"][-1] = -3  # in the last range only
    bad = tmp_path / "bad"
    bad.mkdir()
    save_file(tensors, str(bad / src.name), metadata=meta)
    assert main(["--counts", str(bad), "--out", str(tmp_path / "o"), "--k", "4", "--ranges", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad) in err and "negative" in err.lower(), err
    assert not (tmp_path / "o").exists()


def test_ranged_eigensolve_of_the_bundled_real_corpus_equals_dense_eigh(ray_session, tmp_path):
    """Real text: the bundled fortunes, BERT WordPiece ids, 64 positions, counted by the CLI;
    the ranged job's top 8 against the dense eigendecomposition of the same counts, plug-in
    and bias-corrected, with the standouts the analysis finds and the stress of P_MDS."""
    from pathlib import Path

    from posstats.cli import main as cli
    from posstats.counting.io import load_counts
    from posstats.jobs.eigensolve import main

    data = Path(__file__).resolve().parents[1] / "data"
    counts = tmp_path / "counts"
    assert cli(["count", "--input", str(data / "fortunes-sample.jsonl"), "--text-column", "text", "--tokenizer",
                str(data / "tokenizers" / "bert-base-uncased.tokenizer.json"), "--positions", "64",
                "--out", str(counts), "-q"]) == 0
    out = tmp_path / "mds"
    assert main(["--counts", str(counts), "--out", str(out), "--k", "8", "--tol", "1e-10", "--ranges", "3",
                 "--distances", "plugin"]) == 0
    summary = json.loads((out / "eigensolve.json").read_text())
    assert len(summary["ranges"]) == 3 and summary["converged"]
    c = load_counts(counts)
    used = c.occupied_positions()
    dense = classical_mds(c.rows(used), k=8, method="dense")
    t = load_file(str(out / "mds.safetensors"))
    np.testing.assert_array_equal(t["positions"], used)
    np.testing.assert_allclose(t["eigenvalues"], dense.eigenvalues, rtol=0, atol=1e-11 * dense.eigenvalues[0])
    np.testing.assert_allclose(t["encoding"][:, :2], dense.encoding[:, :2], rtol=0, atol=1e-7)
    # bias-corrected over the same ranges (the default on ranges): B - H diag(b) H against
    # dense eigh, and the standout test the analysis runs on the same rows (the bundled
    # demo finds standouts)
    corrected = tmp_path / "corrected"
    assert main(["--counts", str(counts), "--out", str(corrected), "--k", "8", "--tol", "1e-10", "--ranges", "3",
                 "--lanczos-noise-share", "0", "--stress-dims", "2,8"]) == 0
    summary = json.loads((corrected / "eigensolve.json").read_text())
    assert summary["distances"] == "bias_corrected"
    # most fortunes are shorter than 64 tokens: the count keeps their halves (the short
    # halves), so the edge is measured on the window groups' halves, which hold every token
    edge = summary["noise"]["edge_method"]
    assert edge["method"] == "halves" and edge["source"] == "window groups" and edge["coverage"] == 1.0
    assert summary["noise"]["edge"] == pytest.approx(edge["edge"], rel=1e-12)
    rows = c.rows(used)
    bias = position_sampling_variance(rows)
    # the fortunes' occupancy falls along the context: the square roots' shrinkage is removed
    # as in the analysis (the dense matrix of the adjusted distances as reference)
    from posstats.estimates.occupancy import adjusted

    assert summary["noise"]["occupancy_adjusted"] is True
    ref = classical_mds(rows, k=8, method="dense", diagonal=bias, squared_distances=adjusted(hellinger_sq(rows), rows))
    got = load_file(str(corrected / "mds.safetensors"))
    np.testing.assert_allclose(got["eigenvalues"], ref.eigenvalues, rtol=0, atol=1e-11 * ref.eigenvalues[0])
    plain = classical_mds(rows, k=8, method="dense", diagonal=bias)
    assert abs(plain.eigenvalues[0] - ref.eigenvalues[0]) > 1e-3 * ref.eigenvalues[0]  # the adjustment is not nothing
    standouts = standout_positions(c.rows(used), used)
    assert summary["standout_positions"]["positions"] == standouts["positions"] and standouts["count"] > 0
    assert [e["dim"] for e in summary["stress"]] == [2, 8] and all(0 < e["scaled_stress"] < 1 for e in summary["stress"])


def test_the_pair_jackknife_over_range_actors_is_the_local_one(ray_session, counts_dir):
    """The actors' jackknife splits (RangeWorker.start_replicates, ActorRanges via
    on_replicates) give the replicates of the same ranges held in this process."""
    import ray

    from posstats.counting.io import counts_file
    from posstats.estimates.ranged_jackknife import local_replicates, ranged_pair_replicates
    from posstats.estimates.sampled import sample_pairs
    from posstats.geometry.ranged import file_ranges
    from posstats.jobs.ranges import ActorRanges, start_range_workers

    path, counts = counts_dir
    src = str(counts_file(path))
    bounds = file_ranges(src, 3)
    actors, _ = start_range_workers(src, bounds, min_occupancy=1)
    try:
        runner = ActorRanges(actors, via="on_replicates")
        with pytest.raises(ray.exceptions.RayTaskError, match="start_replicates first"):
            runner.call("next_group")
        ActorRanges(actors).call("start_replicates", [(4, 21)] * len(actors))
        i, j = sample_pairs(counts.positions, 900, rng=np.random.default_rng(4))

        def stats(h):
            return {"mean": float(h.mean()), "max": float(h.max())}

        got = ranged_pair_replicates(runner, i, j, stats, corrected=True, vocab=counts.vocab_size)
    finally:
        for a in actors:
            ray.kill(a, no_restart=True)
    want = ranged_pair_replicates(local_replicates(local_ranges(src, 3), groups=4, seed=21), i, j, stats,
                                  corrected=True, vocab=counts.vocab_size)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12)
    assert got["mean"].shape == (4,) and np.unique(got["mean"]).size == 4
