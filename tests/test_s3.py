"""Object storage: the run store and the corpus on S3 through fsspec (s3fs), tested against a
real S3 API served locally by moto in server mode on 127.0.0.1 (dummy credentials, set for
these tests only)."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from posstats.corpus.source import CorpusSource
from posstats.corpus.count_step import count_corpus
from posstats.counting.counts import CountSpec
from posstats.counting.io import load_counts
from posstats.errors import PosstatsError
from posstats.service.pipeline_store import STAGES, Store

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install s3fs)")
moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")

V, N = 64, 16
KEY, SECRET = "AKIAPOSSTATSTEST", "posstats-moto-secret-value"


@pytest.fixture(scope="module")
def s3_endpoint():
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture()
def s3(s3_endpoint, monkeypatch):
    """(endpoint, storage options, an s3fs filesystem); dummy AWS settings for this test only."""
    import s3fs

    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    options = {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": s3_endpoint}}
    fs = s3fs.S3FileSystem(**options, skip_instance_cache=True, use_listings_cache=False)
    return s3_endpoint, options, fs


def fresh_bucket(fs, name: str) -> str:
    bucket = f"{name}-{time.time_ns()}"
    fs.mkdir(bucket)
    return bucket


def shard_bytes(seed: int, docs: int = 100) -> bytes:
    rng = np.random.default_rng(seed)
    seqs = [(rng.zipf(1.6, size=int(rng.integers(N, 2 * N))) % V).astype(np.int32).tolist() for _ in range(docs)]
    buf = io.BytesIO()
    pq.write_table(pa.table({"ids": pa.array(seqs, type=pa.list_(pa.int32()))}), buf, row_group_size=50)
    return buf.getvalue()


def test_store_primitives_lock_and_latest_on_s3(s3, tmp_path):
    _, options, fs = s3
    bucket = fresh_bucket(fs, "prims")
    store = Store(f"s3://{bucket}/posstats", storage_options=options)
    assert not store.local and store.display() == f"s3://{bucket}/posstats"
    assert store.create_exclusive("x", b"1") and not store.create_exclusive("x", b"2")
    assert store.read_bytes("x") == b"1" and store.read_bytes("missing") is None
    for s in STAGES:
        d = tmp_path / s
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "f.bin").write_bytes(s.encode() * 10)
        store.publish_stage("r1", s, d)
    assert store.verify_stage("r1", "report") == []
    assert fs.cat(f"{bucket}/posstats/runs/r1/report/sub/f.bin") == b"report" * 10
    with pytest.raises(PosstatsError, match="not complete"):
        store.move_latest("r1")
    store.finish_run("r1", {})
    assert store.move_latest("r1") and store.latest()["run_id"] == "r1"
    assert not [p for p in fs.ls(f"{bucket}/posstats") if "latest.tmp" in p]  # the temporary object is gone
    assert store.run_ids() == ["r1"] and store.run_status("r1")["complete"]

    # the lock: exclusive create, refusal naming the holder, stale takeover by heartbeat age
    with store.lock(run_id="holder", heartbeat=0.2) as lk:
        assert json.loads(fs.cat(f"{bucket}/posstats/lock"))["run_id"] == "holder"
        with pytest.raises(PosstatsError, match=f"run store s3://{bucket}/posstats is in use by run holder"):
            with store.lock(run_id="second"):
                pass
        lk._stop.set()
        lk._thread.join()
        hung = {**json.loads(fs.cat(f"{bucket}/posstats/lock")), "heartbeat_ts": time.time() - 7200,
                "hostname": "a-host-far-away"}
        fs.pipe(f"{bucket}/posstats/lock", json.dumps(hung).encode())
        logged = []
        with store.lock(run_id="taker", log=logged.append):
            assert "its heartbeat is 7200 s old" in logged[0]
            with pytest.raises(PosstatsError, match="lost the lock"):
                lk.check()
    assert store.read_lock() == (None, False)


def write_config(tmp_path: Path, endpoint: str, corpus_bucket: str, store_bucket: str) -> Path:
    config = tmp_path / "pipeline.toml"
    config.write_text(f"""
[store]
url = "s3://{store_bucket}/posstats"
work_dir = "work"
storage_options = {{key = "{KEY}", secret = "{SECRET}", client_kwargs = {{endpoint_url = "{endpoint}"}}}}
[input]
paths = ["s3://{corpus_bucket}/data/*.parquet"]
column = "ids"
storage_options = {{key = "{KEY}", secret = "{SECRET}", client_kwargs = {{endpoint_url = "{endpoint}"}}}}
[count]
positions = {N}
vocab_size = {V}
shard_size_mib = 1e-6  # one shard per Parquet row group
[geometry]
dims = [2, 8]
encodings = ["mds", "sinusoidal"]
[export]
dim = 8
rank = 2  # explicit: a random corpus has no component above noise, and the default exports none
card = false
""")
    return config


def local_reference(fs, corpus_bucket: str, dest: Path):
    """Download the corpus as it is now and count it in-process."""
    if dest.exists():
        for p in dest.iterdir():
            p.unlink()
    dest.mkdir(parents=True, exist_ok=True)
    for key in fs.glob(f"{corpus_bucket}/data/*.parquet"):
        (dest / key.rsplit("/", 1)[1]).write_bytes(fs.cat(key))
    return count_corpus(CorpusSource(inputs=(str(dest / "*.parquet"),), column="ids"), CountSpec(N, V),
                        show_progress=False)


@pytest.mark.ray
def test_pipeline_reads_an_s3_corpus_and_writes_an_s3_store(s3, tmp_path, ray_session, capsys):
    from posstats.cli import main as cli

    endpoint, options, fs = s3
    corpus_bucket, store_bucket = fresh_bucket(fs, "corpus"), fresh_bucket(fs, "store")
    for f in range(3):
        fs.pipe(f"{corpus_bucket}/data/s{f}.parquet", shard_bytes(f))
    config = write_config(tmp_path, endpoint, corpus_bucket, store_bucket)
    prefix = f"{store_bucket}/posstats"

    def run(run_id: str) -> dict:
        rc = cli(["pipeline", "--config", str(config), "--run-id", run_id])
        captured = capsys.readouterr()
        assert rc == 0, captured.err
        fs.invalidate_cache()
        return json.loads(fs.cat(f"{prefix}/runs/{run_id}/count/summary.json"))

    def stored_counts(run_id: str):
        counts = [k for k in fs.ls(f"{prefix}/runs/{run_id}/reduce") if k.rsplit("/", 1)[1].startswith("counts.")]
        path = tmp_path / run_id / counts[0].rsplit("/", 1)[1]
        path.parent.mkdir(parents=True)
        path.write_bytes(fs.cat(counts[0]))
        return load_counts(path)

    def assert_equal(got, ref):
        np.testing.assert_array_equal(got.to_dense().matrix, ref.to_dense().matrix)
        assert (got.sequences, got.windows, got.tokens) == (ref.sequences, ref.windows, ref.tokens)

    summary = run("s3-1")
    assert summary["shards"] == 6 and summary["shards_counted"] == 6
    assert {f["url"] for f in summary["files"]} == {f"s3://{corpus_bucket}/data/s{i}.parquet" for i in range(3)}
    assert_equal(stored_counts("s3-1"), local_reference(fs, corpus_bucket, tmp_path / "ref"))
    for stage in STAGES:
        assert fs.exists(f"{prefix}/runs/s3-1/{stage}/done.json")
    assert json.loads(fs.cat(f"{prefix}/latest"))["run_id"] == "s3-1"
    assert fs.exists(f"{prefix}/runs/s3-1/export/positions.safetensors")
    assert fs.exists(f"{prefix}/runs/s3-1/report/report.html")
    assert not fs.exists(f"{prefix}/lock")

    # the corpus grows, one object changes, nothing else is downloaded or counted again
    fs.pipe(f"{corpus_bucket}/data/s3.parquet", shard_bytes(3))
    fs.pipe(f"{corpus_bucket}/data/s0.parquet", shard_bytes(10, docs=60))
    summary = run("s3-2")
    assert (summary["shards"], summary["shards_counted"], summary["shards_removed"]) == (8, 4, 2)
    assert_equal(stored_counts("s3-2"), local_reference(fs, corpus_bucket, tmp_path / "ref"))
    # an object disappears: subtracted
    fs.rm(f"{corpus_bucket}/data/s1.parquet")
    summary = run("s3-3")
    assert summary["shards_counted"] == 0 and summary["shards_removed"] == 2
    assert_equal(stored_counts("s3-3"), local_reference(fs, corpus_bucket, tmp_path / "ref"))
    assert json.loads(fs.cat(f"{prefix}/latest"))["run_id"] == "s3-3"
    # rerunning a run id is a no-op
    assert cli(["pipeline", "--config", str(config), "--run-id", "s3-2"]) == 0
    assert "run s3-2 is complete already" in capsys.readouterr().err
    assert json.loads(fs.cat(f"{prefix}/latest"))["run_id"] == "s3-3"

    # credentials never reach the store
    for key in fs.find(prefix):
        assert SECRET.encode() not in fs.cat(key), key
    # the store is readable with posstats status / logs from anywhere
    rc = cli(["status", "--store", f"s3://{prefix}", "--verify", "--storage-option",
              f"client_kwargs.endpoint_url={json.dumps(endpoint)}", "--storage-option", f"key={KEY}",
              "--storage-option", f"secret={SECRET}"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "latest: s3-3" in out and out.count(": complete ") == 3 and "!" not in out


def _ids_table(seed: int) -> list[list[int]]:
    return pq.read_table(io.BytesIO(shard_bytes(seed))).column("ids").to_pylist()


def _download(fs, bucket: str, dest: Path) -> Path:
    """The bucket's data/ objects as local files (the reference corpus)."""
    dest.mkdir(parents=True, exist_ok=True)
    for p in dest.iterdir():
        p.unlink()
    for key in fs.find(f"{bucket}/data"):
        (dest / key.rsplit("/", 1)[1]).write_bytes(fs.cat(key))
    return dest


@pytest.mark.ray
def test_s3_inputs_through_count_run_ray_count_and_refresh(s3, tmp_path, ray_session, capsys):
    """`count`, `run`, `count --ray` and `refresh` read s3:// globs directly (Parquet by range
    requests, gzip JSON Lines and CSV streamed): counts equal to counting local copies."""
    import gzip

    from posstats.cli import main as cli

    endpoint, _, fs = s3
    bucket = fresh_bucket(fs, "inputs")
    for f in range(2):
        fs.pipe(f"{bucket}/data/s{f}.parquet", shard_bytes(f))
    docs = _ids_table(7)
    fs.pipe(f"{bucket}/data/t.jsonl.gz", gzip.compress("".join(json.dumps({"ids": d}) + "\n" for d in docs).encode()))
    fs.pipe(f"{bucket}/data/u.csv", ("ids\n" + "".join(" ".join(map(str, d)) + "\n" for d in _ids_table(8))).encode())
    options = ["--storage-option", f"client_kwargs.endpoint_url={json.dumps(endpoint)}",
               "--storage-option", f"key={KEY}", "--storage-option", f"secret={SECRET}"]
    spec = ["--column", "ids", "--vocab-size", str(V), "--positions", str(N), "--mode", "pack"]
    urls = ["--input", f"s3://{bucket}/data/*.parquet", "--input", f"s3://{bucket}/data/t.jsonl.gz",
            "--input", f"s3://{bucket}/data/u.csv"]
    local = _download(fs, bucket, tmp_path / "local")

    def count(*args: str) -> None:
        rc = cli([*args])
        err = capsys.readouterr().err
        assert rc == 0, err

    count("count", "--input", str(local / "*"), *spec, "--out", str(tmp_path / "ref"))
    ref = load_counts(tmp_path / "ref")
    count("count", *urls, *spec, *options, "--out", str(tmp_path / "a"))
    assert load_counts(tmp_path / "a").equals(ref)
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["inputs"] == [f"s3://{bucket}/data/{n}" for n in ("s0.parquet", "s1.parquet", "t.jsonl.gz", "u.csv")]
    count("count", "--ray", "--workers", "2", *urls, *spec, *options, "--out", str(tmp_path / "b"))
    assert load_counts(tmp_path / "b").equals(ref)
    count("run", *urls, *spec, *options, "--encodings", "sinusoidal", "--dims", "2", "--out", str(tmp_path / "c"))
    assert load_counts(tmp_path / "c").equals(ref) and (tmp_path / "c" / "report.json").exists()

    # the corpus grows on S3; refresh counts the new object only and equals a full recount
    fs.pipe(f"{bucket}/data/s2.parquet", shard_bytes(2))
    count("refresh", "--store", str(tmp_path / "b" / "store"), *options)
    count("count", "--input", str(_download(fs, bucket, tmp_path / "local") / "*"), *spec, "--out", str(tmp_path / "ref"))
    assert load_counts(tmp_path / "b").equals(load_counts(tmp_path / "ref"))

    # credentials given as options are never written anywhere
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path

    # one-line errors naming the URL (and the line of bad content)
    fs.pipe(f"{bucket}/bad/x.jsonl", b'{"ids": [1, 2]}\n{"ids": [1, "x"]}\n')
    for inputs, expected in (([f"s3://{bucket}/nothing/*.parquet"], "no input matches"),
                             ([f"s3://{bucket}/bad/x.jsonl"], f"s3://{bucket}/bad/x.jsonl: line 2")):
        rc = cli(["count", *(a for i in inputs for a in ("--input", i)), *spec, *options, "--out", str(tmp_path / "bad")])
        err = capsys.readouterr().err
        assert rc == 2 and expected in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "bad").exists()


def test_pipeline_refuses_an_object_key_that_climbs_out_of_its_work_folder(s3, tmp_path, capsys):
    """An object ``data/p/../../...`` in an input bucket must never write outside the work
    folder (it would overwrite any file the pipeline's user can write)."""
    from posstats.cli import main as cli

    endpoint, _, fs = s3
    bucket = fresh_bucket(fs, "hostile")
    fs.pipe(f"{bucket}/data/ok.jsonl", b'{"ids": [1, 2, 3]}\n')
    work = tmp_path / "work"
    # work/inputs/s3/<bucket>/data/p + six '..' = tmp_path
    evil = f"{bucket}/data/p/" + "../" * 6 + "victim.jsonl"
    fs.pipe(evil, b'{"ids": [6, 6, 6]}\n')
    assert evil in fs.find(bucket)  # the server keeps the key as it was written
    (tmp_path / "victim.jsonl").write_text("precious\n")
    config = tmp_path / "pipeline.toml"
    config.write_text(f"""
[store]
url = "{tmp_path / 'store'}"
work_dir = "{work}"
[input]
paths = ["s3://{bucket}/data/**/*.jsonl"]
column = "ids"
storage_options = {{key = "{KEY}", secret = "{SECRET}", client_kwargs = {{endpoint_url = "{endpoint}"}}}}
[count]
positions = 4
vocab_size = 8
""")
    rc = cli(["pipeline", "--config", str(config), "--run-id", "r1"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "is refused: its part '..'" in err and "victim.jsonl" in err
    assert (tmp_path / "victim.jsonl").read_text() == "precious\n"
    assert not [p for p in tmp_path.rglob("*.jsonl") if p.read_bytes().startswith(b'{"ids": [6')]


def _stored_runs(store: Store, tmp_path: Path, capsys) -> None:
    """Two runs of ``store`` (geometry and reduce stages, as the pipeline publishes them)
    from two small corpora analysed by ``posstats run``."""
    import shutil

    from posstats.cli import main as cli
    from posstats.storage.publish import published_dir

    for i, rid in enumerate(("r1", "r2")):
        (tmp_path / f"{rid}.jsonl").write_text("".join(json.dumps({"ids": d}) + "\n" for d in _ids_table(20 + i)))
        assert cli(["run", "--input", str(tmp_path / f"{rid}.jsonl"), "--column", "ids", "--vocab-size", str(V),
                    "--positions", str(N), "--dims", "2", "--encodings", "sinusoidal", "--noise-floor", "off",
                    "--out", str(tmp_path / rid)]) == 0
        for stage, names in (("geometry", ("report.json", "mds.safetensors")),
                             ("reduce", ("counts.csr.safetensors", "counts.safetensors", "count.json"))):
            staging = tmp_path / f"{rid}-{stage}"
            staging.mkdir()
            for name in names:
                if (published_dir(tmp_path / rid) / name).exists():
                    shutil.copyfile(published_dir(tmp_path / rid) / name, staging / name)
            store.publish_stage(rid, stage, staging)
    capsys.readouterr()


def test_diff_of_an_s3_store_checks_what_it_downloads_and_leaves_no_copy(s3, tmp_path, capsys, monkeypatch):
    import tempfile

    from posstats.cli import main as cli

    endpoint, options, fs = s3
    bucket = fresh_bucket(fs, "diffstore")
    store = Store(f"s3://{bucket}/posstats", storage_options=options)
    _stored_runs(store, tmp_path, capsys)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    flags = ["--storage-option", f"client_kwargs.endpoint_url={json.dumps(endpoint)}",
             "--storage-option", f"key={KEY}", "--storage-option", f"secret={SECRET}"]

    def diff(out: str) -> tuple[int, str]:
        rc = cli(["diff", "--store", f"s3://{bucket}/posstats", "--runs", "r1,r2", *flags, "--out", str(tmp_path / out)])
        return rc, capsys.readouterr().err

    rc, err = diff("d1")
    assert rc == 0, err
    assert (tmp_path / "d1" / "diff.json").exists() and not list(scratch.iterdir())  # no posstats-diff-* left

    # a byte flipped in the stored counts: refused, not diffed
    key = next(k for k in fs.find(f"{bucket}/posstats/runs/r2/reduce") if "/counts." in k)
    data = bytearray(fs.cat(key))
    data[-1] ^= 1
    fs.pipe(key, bytes(data))
    rc, err = diff("d2")
    assert rc == 2 and "fails its checksums" in err and "content differs" in err, err
    assert not (tmp_path / "d2").exists() and not list(scratch.iterdir())

    # a marker naming a file outside the stage folder, and an object key that climbs out
    fs.pipe(key, bytes(data[:-1]) + bytes([data[-1] ^ 1]))
    marker = json.loads(fs.cat(f"{bucket}/posstats/runs/r1/geometry/done.json"))
    marker["files"]["../../../../../../escaped.json"] = {"bytes": 2, "sha256": "0" * 64}
    fs.pipe(f"{bucket}/posstats/runs/r1/geometry/done.json", json.dumps(marker).encode())
    fs.pipe(f"{bucket}/posstats/runs/r1/geometry/../../../../../../../escaped.json", b"{}")
    rc, err = diff("d3")
    assert rc == 2 and "damaged completion marker" in err and "leaves the stage folder" in err, err
    assert not list(tmp_path.rglob("escaped.json")) and not list(scratch.iterdir())
