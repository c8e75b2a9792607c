"""jobs/pipeline.py through `posstats pipeline`: the run layout with markers, counts equal to
the single-process count, geometry equal to the in-process analysis, the exported table,
idempotent reruns, incremental refreshes, resuming a lost stage, refusals (another
configuration under a run id, a busy store), and `posstats status/logs --store`."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp
import pytest
from safetensors.numpy import load_file

from posstats.analysis import analyze
from posstats.cli import main as cli
from posstats.corpus.source import CorpusSource
from posstats.corpus.count_step import count_corpus
from posstats.counting.counts import CountSpec
from posstats.counting.io import load_counts
from posstats.counting.window_groups_io import load_window_groups
from posstats.service.config import load_config
from posstats.service.pipeline_store import STAGES, Store

REPO = Path(__file__).resolve().parents[1]
V, N = 64, 16

pytestmark = pytest.mark.ray


def write_shard(path: Path, seed: int, docs: int = 120, row_group_size: int = 60) -> None:
    rng = np.random.default_rng(seed)
    seqs = [(rng.zipf(1.6, size=int(rng.integers(N, 2 * N))) % V).astype(np.int32).tolist() for _ in range(docs)]
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(pa.table({"ids": pa.array(seqs, type=pa.list_(pa.int32()))}), tmp, row_group_size=row_group_size)
    os.replace(tmp, path)


def write_config(tmp_path: Path, **extra: str) -> Path:
    text = f"""
[store]
url = "store"
[input]
paths = ["corpus/*.parquet"]
column = "ids"
[count]
positions = {N}
vocab_size = {V}
mode = "truncate"
exclude_tokens = []
shard_size_mib = 1e-6  # one shard per Parquet row group
[geometry]
dims = [2, 8]
encodings = ["mds", "sinusoidal", "random"]
[export]
dim = 8
rank = 2  # explicit: a random corpus has no component above noise, and the default exports none
card = false
"""
    for table, body in extra.items():
        text += f"\n[{table}]\n{body}\n"
    path = tmp_path / "pipeline.toml"
    path.write_text(text)
    return path


def reference(corpus: Path):
    source = CorpusSource(inputs=(str(corpus / "*.parquet"),), column="ids")
    return count_corpus(source, CountSpec(N, V, "truncate"), show_progress=False)


def assert_counts_equal(got, ref) -> None:
    np.testing.assert_array_equal(got.to_dense().matrix, ref.to_dense().matrix)
    assert (got.sequences, got.windows, got.tokens, got.fingerprint) == (ref.sequences, ref.windows, ref.tokens,
                                                                         ref.fingerprint)


def safetensors_content(path: Path):
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return f.get_tensor("position_embeddings"), dict(f.metadata())


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under the store except the lock machinery and the work folder."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and not rel.startswith("work/") and rel not in ("lock", ".lock.guard"):
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture()
def setup(tmp_path, ray_session):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for f in range(3):
        write_shard(corpus / f"s{f}.parquet", seed=f)
    return tmp_path, corpus, write_config(tmp_path)


def run_cli(capsys, *args) -> tuple[int, str, str]:
    rc = cli([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_end_to_end_layout_counts_geometry_export(setup, capsys):
    tmp_path, corpus, config = setup
    rc, out, err = run_cli(capsys, "pipeline", "--config", config, "--run-id", "first")
    assert rc == 0, err
    assert "run first complete:" in out and "6/6 shard(s) counted now" in out
    store = Store(str(tmp_path / "store"))
    root = Path(store.root)
    for stage in STAGES:
        assert store.stage_marker("first", stage) is not None, stage
        assert store.verify_stage("first", stage) == []
    marker = store.run_marker("first")
    assert store.latest()["run_id"] == "first" and store.latest()["path"] == "runs/first"
    assert store.read_lock() == (None, False)  # released
    # config first: the resolved configuration
    cfg = json.loads((root / "runs/first/config/config.json").read_text())
    assert cfg["run_id"] == "first" and cfg["count"]["positions"] == N
    assert marker["stages"]["config"] < marker["stages"]["count"] < marker["stages"]["export"] < marker["finished"]
    # counts equal the single-process count
    ref = reference(corpus)
    got = load_counts(root / "runs/first/reduce")
    assert_counts_equal(got, ref)
    summary = json.loads((root / "runs/first/count/summary.json").read_text())
    assert summary["shards"] == 6 and summary["shards_counted"] == 6 and len(summary["files"]) == 3
    # geometry equals the in-process analysis
    mds = load_file(str(root / "runs/first/geometry/mds.safetensors"))
    oracle = analyze(ref, load_config(config).analysis_config())
    np.testing.assert_allclose(mds["encoding"], oracle.mds.encoding, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(mds["positions"], np.arange(N))
    report = json.loads((root / "runs/first/geometry/report.json").read_text())
    assert report["run_id"] == "first" and report["inputs"]["counts"] == str(root / "runs/first/reduce")
    # the shards' window groups, summed, give the homogeneity and rank tests their rotated corpora
    groups = load_window_groups(root / "runs/first/reduce", got)
    assert groups.groups == 64 and (groups.total() != sp.csr_array(got.matrix)).nnz == 0
    assert json.loads((root / "runs/first/reduce/count.json").read_text())["window_groups"]["groups"] == 64
    assert report["homogeneity"]["method"] == "rotation" and report["null"]["null_corpora"] == "rotated"
    assert (root / "runs/first/report/report.html").stat().st_size > 1000
    assert list((root / "runs/first/report/figures").glob("*.png"))
    assert not list((root / "runs/first/report").glob("counts.*"))  # the counts live in reduce/ only
    # the exported table is P_MDS(r) padded to the width (r = 2, the config's rank)
    table = load_file(str(root / "runs/first/export/positions.safetensors"))["position_embeddings"]
    assert table.shape == (N, 8) and table.dtype == np.float32
    np.testing.assert_array_equal(table[:, :2], mds["encoding"][:, :2].astype(np.float32))
    np.testing.assert_array_equal(table[:, 2:], 0.0)
    assert marker["export"]["file"] == "positions.safetensors" and store.latest()["export"] == (
        "runs/first/export/positions.safetensors")

    # status and logs of the store
    rc, out, _ = run_cli(capsys, "status", "--store", tmp_path / "store", "--verify")
    assert rc == 0 and "latest: first" in out and "lock: free" in out
    assert "first: complete" in out and "[config count reduce geometry diff report export]" in out
    assert "no earlier run to compare with" in out and not (root / "runs/first/diff/diff.json").exists()
    assert "../diff/diff.html" not in (root / "runs/first/report/report.html").read_text()


def test_no_component_above_noise_exports_a_readme_not_a_table(setup, capsys):
    """Without [export] rank, a corpus whose verdict finds no component above sampling
    noise gets export/README.md saying why, not a table of noise; the run completes."""
    tmp_path, _, config = setup
    config.write_text(config.read_text().replace("rank = 2  # explicit", "# no rank"))
    rc, out, err = run_cli(capsys, "pipeline", "--config", config, "--run-id", "quiet")
    assert rc == 0, err
    root = Path(Store(str(tmp_path / "store")).root)
    report = json.loads((root / "runs/quiet/geometry/report.json").read_text())
    assert report["verdict"]["components_above_noise"] == 0
    assert not (root / "runs/quiet/export/positions.safetensors").exists()
    readme = (root / "runs/quiet/export/README.md").read_text()
    assert "no MDS component stands above sampling noise" in readme
    assert "`[export] rank = R`" in readme and "--force" not in readme  # the pipeline's own key, not a flag


def test_rerun_is_idempotent_and_refreshes_are_incremental(setup, capsys):
    tmp_path, corpus, config = setup
    assert run_cli(capsys, "pipeline", "--config", config, "--run-id", "r1")[0] == 0
    root = tmp_path / "store"
    before = snapshot(root)
    rc, out, err = run_cli(capsys, "pipeline", "--config", config, "--run-id", "r1")
    assert rc == 0 and "run r1 is complete already" in err
    assert snapshot(root) == before

    # a new file: only its shards are counted
    write_shard(corpus / "s3.parquet", seed=3)
    rc, out, err = run_cli(capsys, "pipeline", "--config", config, "--run-id", "r2")
    assert rc == 0, err
    summary = json.loads((root / "runs/r2/count/summary.json").read_text())
    assert (summary["shards"], summary["shards_counted"], summary["shards_added"]) == (8, 2, 2)
    assert_counts_equal(load_counts(root / "runs/r2/reduce"), reference(corpus))
    # a changed file and a deleted one: recounted / subtracted
    write_shard(corpus / "s0.parquet", seed=10, docs=80)
    (corpus / "s1.parquet").unlink()
    rc, out, err = run_cli(capsys, "pipeline", "--config", config, "--run-id", "r3")
    assert rc == 0, err
    summary = json.loads((root / "runs/r3/count/summary.json").read_text())
    assert summary["shards_counted"] == 2 and summary["shards_removed"] == 4 and summary["reduce"] == "incremental"
    assert_counts_equal(load_counts(root / "runs/r3/reduce"), reference(corpus))
    # every refresh wrote its diff against the previous latest; the report links it; status shows it
    for run, before_run in (("r2", "r1"), ("r3", "r2")):
        d = json.loads((root / f"runs/{run}/diff/diff.json").read_text())
        assert d["a"]["label"] == f"run {before_run}" and d["b"]["label"] == f"run {run}"
        assert len(d["positions"]["d_h"]) == N and d["positions"]["tested"] >= 1
        assert (root / f"runs/{run}/diff/diff.html").is_file()
        assert '<a href="../diff/diff.html">' in (root / f"runs/{run}/report/report.html").read_text()
        marker = Store(str(root)).stage_marker(run, "diff")
        assert marker["against"] == before_run and marker["changed"] == d["positions"]["count_changed"]
    rc, out, _ = run_cli(capsys, "status", "--store", root)
    assert rc == 0 and f"changes: {marker['changed']:,} positions changed since run r2" in out
    # posstats diff --store: by default the run before latest against latest
    rc, out, err = run_cli(capsys, "diff", "--store", root, "--out", tmp_path / "d23")
    assert rc == 0, err
    assert json.loads((tmp_path / "d23" / "diff.json").read_text())["positions"]["d_h"] == d["positions"]["d_h"]
    # earlier runs keep their own results
    assert snapshot(root)["runs/r1/reduce/counts.safetensors"] == before["runs/r1/reduce/counts.safetensors"]
    assert Store(str(root)).latest()["run_id"] == "r3"

    # a diff never writes into a store, and never reads a stage its marker does not vouch for
    kept = snapshot(root)
    rc, _, err = run_cli(capsys, "diff", "--store", root, "--out", root / "runs/r3/diff")
    assert rc == 2 and "lies inside the run store" in err and snapshot(root) == kept
    counts = next((root / "runs/r2/reduce").glob("counts.*"))
    data = bytearray(counts.read_bytes())
    data[-1] ^= 1
    counts.write_bytes(bytes(data))
    rc, _, err = run_cli(capsys, "diff", "--store", root, "--runs", "r2,r3", "--out", tmp_path / "d-flipped")
    assert rc == 2 and "fails its checksums" in err and "content differs from its marker" in err, err
    assert not (tmp_path / "d-flipped").exists()
    rc, out, _ = run_cli(capsys, "status", "--store", root, "--verify")
    assert rc != 0 and f"reduce/{counts.name}: content differs from its marker" in out
    (root / "runs/r1/geometry/done.json").write_text("{}")  # a blanked marker
    rc, out, _ = run_cli(capsys, "status", "--store", root, "--verify")
    assert rc != 0 and "geometry: " in out and "damaged completion marker" in out


def test_a_lost_stage_is_redone_alone_and_identically(setup, capsys):
    tmp_path, _, config = setup
    assert run_cli(capsys, "pipeline", "--config", config, "--run-id", "r")[0] == 0
    store = Store(str(tmp_path / "store"))
    root = Path(store.root)
    table = safetensors_content(root / "runs/r/export/positions.safetensors")
    finished = {s: store.stage_marker("r", s)["finished"] for s in STAGES}
    # as if the driver died while publishing the export: files half there, no markers
    (root / "runs/r/done.json").unlink()
    (root / "runs/r/export/done.json").unlink()
    (root / "runs/r/export/positions.safetensors").write_bytes(b"partial")
    rc, _, err = run_cli(capsys, "pipeline", "--config", config, "--run-id", "r")
    assert rc == 0, err
    for s in STAGES[:-1]:
        assert f"{s}: complete already" in err and store.stage_marker("r", s)["finished"] == finished[s]
    assert store.stage_marker("r", "export")["finished"] > finished["export"]
    again = safetensors_content(root / "runs/r/export/positions.safetensors")
    assert again[1] == table[1]  # metadata (the header's key order is not deterministic, its content is)
    np.testing.assert_array_equal(again[0], table[0])
    assert store.verify_stage("r", "export") == []


def test_count_stage_redone_when_the_counting_store_moved_on(setup, capsys):
    tmp_path, corpus, config = setup
    assert run_cli(capsys, "pipeline", "--config", config, "--run-id", "a")[0] == 0
    root = tmp_path / "store"
    # run a died right after its count stage ...
    for stage in ("reduce", "geometry", "report", "export"):
        (root / f"runs/a/{stage}/done.json").unlink()
    (root / "runs/a/done.json").unlink()
    # ... and run b refreshed the counting store on a grown corpus before a was resumed
    write_shard(corpus / "s9.parquet", seed=9)
    assert run_cli(capsys, "pipeline", "--config", config, "--run-id", "b")[0] == 0
    rc, _, err = run_cli(capsys, "pipeline", "--config", config, "--run-id", "a")
    assert rc == 0, err
    assert "counting store moved on" in err
    assert_counts_equal(load_counts(root / "runs/a/reduce"), reference(corpus))
    assert Store(str(root)).latest()["run_id"] == "a"  # it finished last


def test_refusals_other_config_busy_store_bad_run_id(setup, capsys):
    tmp_path, _, config = setup
    assert run_cli(capsys, "pipeline", "--config", config, "--run-id", "r")[0] == 0
    root = tmp_path / "store"
    before = snapshot(root)
    rc, _, err = run_cli(capsys, "pipeline", "--config", config, "--run-id", "r", "--set", "count.positions=8")
    assert rc == 2 and "run r in" in err and "was started with another configuration" in err
    rc, _, err = run_cli(capsys, "pipeline", "--config", config, "--run-id", "../r")
    assert rc == 2 and "invalid run id '../r'" in err
    store = Store(str(root))
    with store.lock(run_id="holder"):
        rc, _, err = run_cli(capsys, "pipeline", "--config", config, "--run-id", "r2")
        assert rc == 2
        assert f"posstats: error: run store {root} is in use by run holder (pipeline, pid {os.getpid()}" in err
        # the scheduler reports a busy store and goes on
        sched = subprocess.run([sys.executable, "-m", "posstats.cli", "schedule", "--config", str(config),
                                "--every", "1s", "--runs", "1"], capture_output=True, text=True, timeout=120)
        assert sched.returncode == 1, sched.stdout + sched.stderr
        assert "store busy, skipped" in sched.stdout and "in use by run holder" in sched.stdout
    after = snapshot(root)
    assert {k: v for k, v in after.items() if k in before} == before
    assert not [k for k in after if k.startswith("runs/r2/")]
    logs = [k for k in after if k.startswith("logs/")]
    assert len(logs) == 1
    rc, out, _ = run_cli(capsys, "logs", "--store", root, "--run-id", logs[0][5:-4])
    assert rc == 0 and "is in use by run holder" in out


def test_schedule_cli_runs_in_order_with_a_log_each(setup, ray_session):
    tmp_path, _, config = setup
    address = ray_session.get_runtime_context().gcs_address
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "posstats.cli", "schedule", "--config", str(config), "--every", "1s",
                           "--runs", "2", "--address", address], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "schedule done: 2 run(s), 2 ok, 0 failed" in proc.stdout
    store = Store(str(tmp_path / "store"))
    runs = [store.run_status(r) for r in store.run_ids()]
    assert len(runs) == 2 and all(r["complete"] for r in runs)
    spans = sorted((store.stage_marker(r["run_id"], "config")["finished"], r["finished"]) for r in runs)
    assert spans[0][1] < spans[1][0]  # no overlap
    assert store.latest()["run_id"] == max(r["run_id"] for r in runs)
    for r in runs:
        log = (Path(store.root) / "logs" / f"{r['run_id']}.log").read_text()
        assert f"run {r['run_id']} complete" in log and "# exit status 0" in log
    assert time.time() - t0 < 280


def test_schedule_refuses_bad_time_zones(tmp_path, capsys):
    config = write_config(tmp_path)
    rc, _, err = run_cli(capsys, "schedule", "--config", config, "--cron", "@daily", "--timezone", "Nowhere/City")
    assert rc == 2 and "unknown time zone 'Nowhere/City'" in err
    rc, _, err = run_cli(capsys, "schedule", "--config", config, "--every", "1h", "--timezone", "Europe/Paris")
    assert rc == 2 and "--timezone applies to --cron schedules only" in err
    assert not (tmp_path / "store").exists()  # refused before touching the store


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_the_geometry_task_multiplies_where_the_config_says(setup, capsys, device, request):
    """[geometry] device: the long-context path (here above exact_limit = 8 rows) runs its
    Lanczos products on the GPU the task asked Ray for, or on the CPUs; report.json says
    where. gpu on a cluster without a GPU is refused before the geometry task."""
    tmp_path, _, _ = setup
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace(
        "[geometry]\n", f'[geometry]\nexact_limit = 8\nheld_out = "off"\ndevice = "{device}"\n'))
    has_gpu = request.getfixturevalue("ray_session").cluster_resources().get("GPU", 0) >= 1
    if device == "gpu" and has_gpu:
        request.getfixturevalue("cupy")
    rc, out, err = run_cli(capsys, "pipeline", "--config", config, "--run-id", f"on-{device}")
    if device == "gpu" and not has_gpu:
        assert rc == 2 and "[geometry] device gpu: the Ray cluster has no GPU" in err
        return
    assert rc == 0, err
    report = json.loads((tmp_path / f"store/runs/on-{device}/geometry/report.json").read_text())
    assert report["spectrum"]["method"] == "lanczos" and report["spectrum"]["device"] == device


def test_a_corpus_with_no_positional_structure_completes_without_a_table(tmp_path, ray_session, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pq.write_table(pa.table({"ids": pa.array([[5] * N] * 50, type=pa.list_(pa.int32()))}), corpus / "s0.parquet")
    config = write_config(tmp_path)
    rc, out, err = run_cli(capsys, "pipeline", "--config", config, "--run-id", "flat")
    assert rc == 0, err
    assert "nothing exported (no positional structure beyond sampling noise)" in out
    store = Store(str(tmp_path / "store"))
    marker = store.stage_marker("flat", "export")
    assert marker["file"] is None and "nothing to export" in marker["skipped"]
    assert "no positional structure" in (tmp_path / "store/runs/flat/export/README.md").read_text()
    assert store.latest()["run_id"] == "flat" and store.latest()["export"] is None


def test_the_geometry_task_analyses_over_range_actors(tmp_path, ray_session, capsys):
    """[ray] geometry_ranges = 3: the analysis runs over three Ray actors holding the counts'
    rows (analyze_ranges), never loading the counts in the task, and gives the in-process
    analysis' answer (eigenvalues above the noise, standouts, stresses); report.html and the
    export are written from it; 0 keeps it in the task; an analysis that needs the counts in
    one process is refused in one line."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = np.random.default_rng(3)
    n, vocab = 300, 4000
    head = rng.integers(0, 8, size=(400, 4))  # 4 planted positions
    seqs = [np.concatenate([head[d], rng.zipf(1.3, size=int(rng.integers(n, 2 * n))) % vocab]).astype(np.int32).tolist()
            for d in range(400)]
    pq.write_table(pa.table({"ids": pa.array(seqs, type=pa.list_(pa.int32()))}), corpus / "s0.parquet")

    def config_with(ranges: int) -> Path:
        cfg = write_config(tmp_path, ray=f"geometry_ranges = {ranges}")
        cfg.write_text(cfg.read_text().replace(f"positions = {N}", f"positions = {n}")
                       .replace(f"vocab_size = {V}", f"vocab_size = {vocab}")
                       .replace("[geometry]\n", '[geometry]\nexact_limit = 100\nnull = "mp"\nheld_out = "off"\n'
                                                'stress_halfwidth = 0.01\n'))
        return cfg

    reports = {}
    for ranges in (3, 0):
        rc, out, err = run_cli(capsys, "pipeline", "--config", config_with(ranges), "--run-id", f"r{ranges}")
        assert rc == 0, err
        run = tmp_path / f"store/runs/r{ranges}"
        reports[ranges] = json.loads((run / "geometry/report.json").read_text())
        assert (run / "report/report.html").stat().st_size > 10_000
        assert Store(str(tmp_path / "store")).stage_marker(f"r{ranges}", "geometry")["ranges"] == ranges
    ranged, one = reports[3], reports[0]
    held, whole = ranged["verdict"]["standout_positions"], one["verdict"]["standout_positions"]
    # in one process the window groups' rotated corpora measure the documents' own variation
    # (standout.py, "Documents that differ"); the ranges hold no window groups
    assert "rotated_offset" in whole and "rotated_offset" not in held
    decided = ("count", "positions", "ranges")
    assert {k: held[k] for k in decided} == {k: whole[k] for k in decided}
    assert set(held["positions"]) >= {0, 1, 2, 3}
    assert ranged["verdict"]["components_above_noise"] == one["verdict"]["components_above_noise"] >= 1
    k = one["verdict"]["components_above_noise"]
    np.testing.assert_allclose(ranged["spectrum"]["eigenvalues"][:k], one["spectrum"]["eigenvalues"][:k], rtol=1e-8)
    for x, y in zip(one["encodings"], ranged["encodings"], strict=True):
        assert y["scaled_stress"] == pytest.approx(x["scaled_stress"], rel=1e-6, abs=1e-9), (x["name"], x["dim"])
    np.testing.assert_allclose(ranged["noise"]["bias_per_position"], one["noise"]["bias_per_position"], rtol=1e-12)
    # held-out scores need the counts in one process: refused in one line, before the task
    cfg = config_with(2)
    cfg.write_text(cfg.read_text().replace('held_out = "off"', 'held_out = "on"'))
    rc, out, err = run_cli(capsys, "pipeline", "--config", cfg, "--run-id", "refused")
    assert rc == 2 and "[ray] geometry_ranges = 2: [geometry] held_out on needs the counts in one process" in err, err
