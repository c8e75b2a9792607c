"""cluster/: the two-node local cluster script starts a head and a worker node, the count job
submitted to it with `ray job submit` runs its actors on both nodes and equals the
single-process count, and `stop` ends the cluster's processes (and only those)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from posstats.corpus import CorpusSource, count_corpus
from posstats.counts import CountSpec
from posstats.storage import load_counts
from posstats.tokenizer import encode_texts, load_tokenizer

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "cluster" / "local_cluster.sh"
BERT = REPO / "data" / "tokenizers" / "bert-base-uncased.tokenizer.json"
FORTUNES = REPO / "data" / "fortunes-sample.jsonl"


def pinned_ray_version() -> str:
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["ray"]
    (spec,) = [d for d in deps if d.startswith("ray")]
    return spec.split("==")[1]


def test_manifests_pin_the_projects_ray_version():
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (it comes with ray[default])")
    version = pinned_ray_version()
    kuberay = list(yaml.safe_load_all((REPO / "cluster" / "kuberay-raycluster.yaml").read_text()))
    (cluster,) = [d for d in kuberay if d["kind"] == "RayCluster"]
    assert cluster["spec"]["rayVersion"] == version
    groups = [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]
    images = [c["image"] for g in groups for c in g["template"]["spec"]["containers"]]
    assert images and all(f":{version}" in image for image in images)
    autoscaler = yaml.safe_load((REPO / "cluster" / "autoscaler.yaml").read_text())
    assert f":{version}" in autoscaler["docker"]["image"]
    commands = " ".join(autoscaler["setup_commands"])
    assert f"ray[default]=={version}" in commands


def free_port_block(size: int = 300) -> int:
    """A base port whose block of the ports the script uses is free right now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1] // 1000 * 1000 + 100
        if not 20000 <= base <= 60000:
            continue
        ok = True
        for p in list(range(base, base + 20)) + [base + 100, base + 200]:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    pytest.skip("no free block of ports for a local cluster")


@pytest.fixture()
def local_cluster():
    """The two-node cluster of cluster/local_cluster.sh, stopped whatever happens."""
    port = free_port_block()
    state = tempfile.mkdtemp(prefix="prc", dir="/tmp")  # short: Ray's socket paths live in it
    env = {**os.environ, "RAY_LOCAL_PORT": str(port), "RAY_LOCAL_DIR": state, "RAY_AUTH_MODE": "disabled"}
    try:
        started = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=240)
        assert started.returncode == 0, started.stdout + started.stderr
        yield {"port": port, "env": env, "address": f"127.0.0.1:{port}", "dashboard": f"http://127.0.0.1:{port + 2}"}
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=120)
        pids = [p for p in (Path(state) / name for name in ("head.pid", "worker.pid")) if p.exists()]
        shutil.rmtree(state, ignore_errors=True)
        assert not pids, "stop left pid files behind"


@pytest.mark.ray
@pytest.mark.slow
def test_count_job_submitted_to_the_two_node_cluster(local_cluster, tmp_path):
    texts = [json.loads(line)["text"] for line in FORTUNES.read_text(encoding="utf-8").splitlines() if line.strip()]
    b = encode_texts(load_tokenizer(BERT), texts)
    seqs = [b.values[b.offsets[i] : b.offsets[i + 1]].tolist() for i in range(b.rows)]
    for f in range(2):
        table = pa.table({"ids": pa.array(seqs[f * 1500 : (f + 1) * 1500], type=pa.list_(pa.int32()))})
        pq.write_table(table, tmp_path / f"f{f}.parquet", row_group_size=300)
    out = tmp_path / "out"
    entrypoint = [sys.executable, "-m", "jobs.count", "--input", f"{tmp_path}/*.parquet", "--column", "ids",
                  "--vocab-size", "30522", "--positions", "64", "--mode", "chunk", "--out", str(out), "--workers", "2"]
    ray_cli = shutil.which("ray") or "ray"
    submitted = subprocess.run(
        [ray_cli, "job", "submit", "--address", local_cluster["dashboard"], "--", *entrypoint],
        env={**local_cluster["env"], "RAY_AUTH_MODE": "disabled"},
        capture_output=True, text=True, timeout=300,
    )
    assert submitted.returncode == 0, submitted.stdout[-3000:] + submitted.stderr[-3000:]
    assert "succeeded" in submitted.stdout + submitted.stderr

    source = CorpusSource(inputs=(str(tmp_path / "*.parquet"),), column="ids")
    ref = count_corpus(source, CountSpec(64, 30522, "chunk"), show_progress=False)
    got = load_counts(out)
    assert got.equals(ref) and got.fingerprint == ref.fingerprint
    nodes = {json.loads(m.read_text())["node_id"] for m in (out / "store").glob("partials/*/done.json")}
    assert len(nodes) == 2  # actors on the head and on the worker node both counted
    assert json.loads((out / "count.json").read_text())["ray"]["shards"] == 10
