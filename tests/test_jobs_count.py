"""jobs.count, end to end on the shared Ray session: `posstats count --ray` equals the
single-process count bit for bit (Parquet and HF datasets from the shared corpora), whatever
the workers, shard order and storage; a counting actor SIGKILLed mid-shard and a driver
SIGKILLed mid-run (real process kills) end with the same counts; bad shards fail with the
file and row group (or are skipped and recorded); a second run on a locked store refuses;
`posstats refresh` recounts only what changed and equals a full recount."""

from __future__ import annotations

import functools
import gzip
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from posstats.corpus.shard_store import RunStore
from posstats.corpus.shards import (
    MIN_AUTO_SHARD_BYTES,
    auto_shard_bytes,
    corpus_bytes,
    plan_shards,
)
from posstats.corpus.count_step import count_shard
from posstats.corpus.source import CorpusSource
from posstats.corpus.count_step import count_corpus
from posstats.corpus.tokenizer import encode_texts, load_tokenizer
from posstats.counting.counts import CountSpec
from posstats.counting.io import counts_file, load_counts, save_counts
from posstats.counting.window_groups_io import WINDOW_GROUPS_FILE, load_window_groups
from posstats.corpus.count_step import shard_window_groups

REPO = Path(__file__).resolve().parents[1]
BERT = REPO / "data" / "tokenizers" / "bert-base-uncased.tokenizer.json"
V = 30522
ROW_GROUP_SHARDS = ("--shard-size", 1e-6)  # 1 byte: one shard per Parquet row group
SPECIAL = "0,100,101,102,103"


def posstats_cli(*argv) -> int:
    from posstats.cli import main

    return main([str(a) for a in argv])


# ----------------------------------------------------------------------------- corpora


def fortunes(shared: Path, n: int) -> list[str]:
    text = gzip.decompress((shared / "corpora" / "fortunes.txt.gz").read_bytes()).decode("utf-8")
    return [r.strip() for r in re.split(r"(?m)^%\n", text) if r.strip()][:n]


def tokenize(texts: list[str]) -> list[list[int]]:
    b = encode_texts(load_tokenizer(BERT), texts)
    return [b.values[b.offsets[i] : b.offsets[i + 1]].tolist() for i in range(b.rows)]


def write_parquet(path: Path, seqs, *, row_group_size: int) -> Path:
    pq.write_table(pa.table({"input_ids": pa.array(seqs, type=pa.list_(pa.int32()))}), path, row_group_size=row_group_size)
    return path


@pytest.fixture(scope="module")
def fortune_ids(shared_dir):
    """BERT ids of the first 4800 fortunes of the shared corpus."""
    return tokenize(fortunes(shared_dir, 4800))


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory, fortune_ids):
    """4 Parquet files x 4 row groups (16 shards) of the fortunes."""
    root = tmp_path_factory.mktemp("parquet")
    for f in range(4):
        write_parquet(root / f"part-{f}.parquet", fortune_ids[f * 1200 : (f + 1) * 1200], row_group_size=300)
    return root


def count_flags(*inputs, positions=48, mode="chunk"):
    flags = []
    for i in inputs:
        flags += ["--input", i]
    return flags + ["--column", "input_ids", "--vocab-size", V, "--exclude-tokens", SPECIAL,
                    "--positions", positions, "--mode", mode]


def safetensors_parts(path: Path):
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def assert_same_output(ref: Path, got: Path) -> None:
    """The Ray output folder has the single-process files, with bit-identical counts. The
    window groups, where asked for, are there too in truncate and chunk mode (summed from
    the shards': grouped by shard, so not the same file, but the same K and full windows,
    adding up to the same counts); in pack mode the count in steps says why not."""
    names_a, names_b = {p.name for p in ref.iterdir()}, {p.name for p in got.iterdir()} - {"store"}
    a, b = load_counts(ref), load_counts(got)
    assert a.equals(b) and a.is_sparse == b.is_sparse
    assert (a.fingerprint, a.metadata, a.spec) == (b.fingerprint, b.metadata, b.spec)
    file_a, file_b = counts_file(ref), counts_file(got)
    assert file_a.name == file_b.name  # the same storage rule picked the same file
    # bit-identical: header (tensor layout and metadata) and every byte of the counts
    head_a, data_a = safetensors_parts(file_a)
    head_b, data_b = safetensors_parts(file_b)
    assert head_a == head_b and data_a == data_b
    sa, sb = json.loads((ref / "count.json").read_text()), json.loads((got / "count.json").read_text())
    for key in sa.keys() - {"seconds", "tokens_per_s", "window_groups"}:
        assert sa[key] == sb[key], key
    if "window_groups" in sa and a.spec.mode == "pack":  # written here, not in steps
        assert sb["window_groups"] == {"skipped": shard_window_groups(a.spec, sa["window_groups"]["groups"])[1]}
        assert names_a - {WINDOW_GROUPS_FILE} == names_b and WINDOW_GROUPS_FILE not in names_b
    elif "window_groups" in sa:
        assert sb["window_groups"] == sa["window_groups"] and names_a == names_b
        wg = load_window_groups(got, b)
        assert (wg.groups, wg.windows) == (sa["window_groups"]["groups"], sa["window_groups"]["windows"])
        assert (wg.total() != sp.csr_array(b.matrix)).nnz == 0
    else:
        assert "window_groups" not in sb and names_a == names_b
    ca, cb = json.loads((ref / "config.json").read_text()), json.loads((got / "config.json").read_text())
    assert {k: v for k, v in cb.items() if k != "ray"} == ca


def assert_counts_equal(got, ref) -> None:
    assert got.equals(ref)
    np.testing.assert_array_equal(got.to_dense().matrix, ref.to_dense().matrix)
    assert (got.sequences, got.windows, got.tokens, got.fingerprint) == (ref.sequences, ref.windows, ref.tokens, ref.fingerprint)


def wait_for(predicate, *, timeout: float, what: str, driver: subprocess.Popen | None = None, log: Path | None = None):
    """Poll ``predicate`` until it is truthy; fail after ``timeout`` seconds, or as soon as
    ``driver`` (a job started to be killed mid-step) has exited, quoting its ``log``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if driver is not None and driver.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
            pytest.fail(f"the driver exited ({driver.returncode}) before {what} was seen; its output:\n{tail}")
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def start_driver(address: str, args: list, log: Path) -> subprocess.Popen:
    """The count job as its own process (to be killed), stdout and stderr to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(job_cmd(address, *args), cwd=REPO, env=job_env(), stdout=out, stderr=subprocess.STDOUT)


def markers(store: Path) -> list[Path]:
    return sorted(store.glob("partials/*/done.json"))


def count_job_in_thread(source, spec, opts):
    """Start ``count_job`` in a thread; return (thread, outcome: its summary or error)."""
    from posstats.jobs.count import count_job

    outcome: dict = {}

    def run():
        try:
            outcome["summary"] = count_job(source, spec, {}, opts)
        except BaseException as exc:  # noqa: BLE001 - reported by finished()
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def finished(thread, outcome) -> dict:
    """Wait for a :func:`count_job_in_thread` run; its summary (it must have succeeded)."""
    thread.join(timeout=180)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    return outcome["summary"]


def job_cmd(address: str, *args) -> list[str]:
    return [sys.executable, "-m", "posstats.jobs.count", "--address", address, *map(str, args)]


def job_env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("POSSTATS_TEST_SHARD_DELAY", "POSSTATS_TEST_REDUCE_DELAY")}
    env.update(RAY_USAGE_STATS_ENABLED="0", **extra)
    return env


@pytest.fixture(scope="module")
def ray_address(ray_session):
    return ray_session.get_runtime_context().gcs_address


# ----------------------------------------------------------------------------- CLI, no Ray


def test_ray_flags_need_ray(tmp_path, capsys):
    rc = posstats_cli("count", *count_flags(str(REPO / "data" / "fortunes-sample.jsonl")), "--workers", 2, "--out", tmp_path)
    assert rc == 2
    assert capsys.readouterr().err.strip().startswith("posstats: error: --workers only apply with --ray")


def test_the_local_executor_runs_the_same_steps_without_ray(tmp_path, fortune_ids, capsys):
    """posstats count --store without --ray: the counting steps (shard -> partial + marker,
    range reduce) in this process: the same files and bit-identical counts as the one-pass
    count, markers in the store, a rerun that counts nothing, a refresh (--local) that
    recounts only what changed and equals a full recount; Ray is never imported."""
    import sys

    data = tmp_path / "data"
    data.mkdir()
    for name, lo in (("a", 0), ("b", 600), ("c", 1200)):
        write_parquet(data / f"{name}.parquet", fortune_ids[lo : lo + 600], row_group_size=200)
    flags = count_flags(str(data / "*.parquet"))
    assert posstats_cli("count", *flags, "--out", tmp_path / "single") == 0
    had_ray = "ray" in sys.modules
    out, store = tmp_path / "out", tmp_path / "store"
    assert posstats_cli("count", *ROW_GROUP_SHARDS, *flags, "--store", store, "--out", out) == 0
    assert had_ray or "ray" not in sys.modules  # the local executor never imports ray
    assert_same_output(tmp_path / "single", out)
    record = json.loads((out / "count.json").read_text())["ray"]
    assert (record["shards"], record["shards_counted"], record["workers"], record["ray_startup_s"]) == (9, 9, 1, 0.0)
    assert json.loads((out / "config.json").read_text())["ray"]["executor"] == "local"
    assert len(RunStore(store).done_ids()) == 9  # a partial and its marker per shard
    capsys.readouterr()
    assert posstats_cli("count", *ROW_GROUP_SHARDS, *flags, "--store", store, "--out", out) == 0  # resumed: all cached
    record = json.loads((out / "count.json").read_text())["ray"]
    assert (record["shards_counted"], record["shards_cached"]) == (0, 9)

    (data / "a.parquet").unlink()
    write_parquet(data / "d.parquet", fortune_ids[2000:2600], row_group_size=300)
    assert posstats_cli("refresh", "--store", store, "--local", "--out", out) == 0
    assert "reused 6 shard(s), added 2, removed 3" in capsys.readouterr().out
    full = count_corpus(CorpusSource(inputs=(str(data / "*.parquet"),), column="input_ids"),
                        CountSpec(48, V, "chunk", (0, 100, 101, 102, 103)), show_progress=False)
    assert_counts_equal(load_counts(out), full)
    assert had_ray or "ray" not in sys.modules


def test_counts_in_steps_keep_window_groups_that_refresh_and_analyse(tmp_path, fortune_ids, capsys):
    """Truncate mode in steps (the local executor; the Ray pool runs the same steps): every
    shard's partial keeps its window groups (file and SHA-256 in its marker), the reduce sums
    them beside the counts (adding up to them exactly) and analyze rotates them; a refresh
    subtracts a removed input's groups and gives exactly what a new store gives the same
    files (shards are content-derived, so their partials' groups are the same). Refused in
    count.json's window_groups.skipped, the counts unharmed: a groups file that no longer
    matches its marker, partials counted without groups (--window-groups 0), pack mode."""
    data = tmp_path / "data"
    data.mkdir()
    for name, lo in (("a", 0), ("b", 600), ("c", 1200)):
        write_parquet(data / f"{name}.parquet", fortune_ids[lo : lo + 600], row_group_size=200)
    flags = count_flags(str(data / "*.parquet"), mode="truncate")
    out, store = tmp_path / "out", tmp_path / "store"
    assert posstats_cli("count", *ROW_GROUP_SHARDS, *flags, "--store", store, "--out", out) == 0
    counts = load_counts(out)
    groups = load_window_groups(out, counts)
    assert json.loads((out / "count.json").read_text())["window_groups"] == {
        "file": WINDOW_GROUPS_FILE, "groups": 64, "windows": groups.windows, "short_halves": True}
    assert groups.classes == 47 and (groups.total() != sp.csr_array(counts.matrix)).nnz == 0
    even, odd = groups.halves()  # the shards' short halves summed: every document whole in one half
    assert ((even + odd) != sp.csr_array(counts.matrix)).nnz == 0 and 0.3 < even.sum() / odd.sum() < 3
    assert groups.windows == sum(len(ids) >= 48 for ids in fortune_ids[:1800] if ids)  # documents of 48 tokens or more
    for sid in RunStore(store).done_ids():
        entry = RunStore(store).marker(sid)["window_groups"]
        assert entry["file"] == WINDOW_GROUPS_FILE and entry["groups"] == 64 and len(entry["sha256"]) == 64
    assert posstats_cli("analyze", "--counts", out, "--dims", "2", "--encodings", "mds", "--held-out", "off",
                        "--out", tmp_path / "an") == 0
    report = json.loads((tmp_path / "an" / "report.json").read_text())
    assert report["homogeneity"]["method"] == "rotation" and report["null"]["null_corpora"] == "rotated"

    (data / "a.parquet").unlink()
    assert posstats_cli("refresh", "--store", store, "--local", "--out", out) == 0
    fresh = tmp_path / "fresh"
    assert posstats_cli("count", *ROW_GROUP_SHARDS, *flags, "--store", fresh / "store", "--out", fresh) == 0
    refreshed, again = load_counts(out), load_counts(fresh)
    assert_counts_equal(refreshed, again)
    assert (load_window_groups(out, refreshed).matrix != load_window_groups(fresh, again).matrix).nnz == 0
    capsys.readouterr()

    # a damaged groups file: the counts stand, the groups are skipped and say which file
    kept = RunStore(fresh / "store")
    victim = next(sid for sid in sorted(kept.done_ids()) if kept.marker(sid)["shard"]["path"].endswith("b.parquet"))
    (kept.partial_dir(victim) / WINDOW_GROUPS_FILE).write_bytes(b"damaged")
    (data / "b.parquet").unlink()  # the refresh subtracts b's partials, the damaged one among them
    assert posstats_cli("refresh", "--store", fresh / "store", "--local", "--out", fresh) == 0
    skipped = json.loads((fresh / "count.json").read_text())["window_groups"]["skipped"]
    assert victim in skipped and "does not match the SHA-256" in skipped
    assert not (fresh / WINDOW_GROUPS_FILE).exists() and load_counts(fresh).tokens > 0

    # partials without groups stay without: the count says how many
    off = tmp_path / "off"
    assert posstats_cli("count", *ROW_GROUP_SHARDS, *flags, "--window-groups", "0", "--store", off / "store",
                        "--out", off) == 0
    assert "window_groups" not in json.loads((off / "count.json").read_text())
    assert posstats_cli("count", *ROW_GROUP_SHARDS, *flags, "--store", off / "store", "--out", off) == 0
    assert "3 of 3 partial(s) have no window groups" in json.loads((off / "count.json").read_text())["window_groups"][
        "skipped"]
    pack = tmp_path / "pack"
    assert posstats_cli("count", *count_flags(str(data / "*.parquet"), mode="pack"), "--store", pack / "store",
                        "--out", pack) == 0
    assert json.loads((pack / "count.json").read_text())["window_groups"]["skipped"].startswith("pack mode counted in steps")
    capsys.readouterr()


# ----------------------------------------------------------------------------- exactness


@pytest.mark.ray
def test_cli_ray_parquet_equals_single_process(ray_session, parquet_dir, tmp_path, capsys):
    flags = count_flags(str(parquet_dir / "*.parquet"))
    assert posstats_cli("count", *flags, "--out", tmp_path / "single") == 0
    assert posstats_cli("count", "--ray", "--workers", 2, *flags, "--out", tmp_path / "ray") == 0
    out = [re.sub(r" \[[\d.]+ s counting, [\d.]+ M tokens/s\]$", "", line) for line in capsys.readouterr().out.splitlines()]
    assert out[0].replace("single", "ray") == out[1]
    assert_same_output(tmp_path / "single", tmp_path / "ray")
    info = json.loads((tmp_path / "ray" / "count.json").read_text())["ray"]
    # a tiny corpus: the smallest automatic shard size, which joins each file's 4 row groups
    assert (info["shards"], info["shards_counted"], info["workers"], info["bad_shards"]) == (4, 4, 2, [])
    assert info["shard_bytes"] == MIN_AUTO_SHARD_BYTES
    # every shard was counted by an actor, none by the driver
    store = tmp_path / "ray" / "store"
    assert {json.loads(m.read_text())["pid"] for m in markers(store)} - {os.getpid()}
    assert os.getpid() not in {json.loads(m.read_text())["pid"] for m in markers(store)}
    assert len(markers(store)) == 4
    assert json.loads((store / "store.json").read_text())["shard_bytes"] == MIN_AUTO_SHARD_BYTES  # for later runs
    # the same command again: nothing to count, the same output
    assert posstats_cli("count", "--ray", *flags, "--out", tmp_path / "ray") == 0
    assert_same_output(tmp_path / "single", tmp_path / "ray")
    # one shard per row group (a shard size below any row group's): 16 shards, the same counts
    assert posstats_cli("count", "--ray", "--workers", 2, *flags, *ROW_GROUP_SHARDS, "--out", tmp_path / "rg") == 0
    info = json.loads((tmp_path / "rg" / "count.json").read_text())["ray"]
    assert (info["shards"], info["shard_bytes"]) == (16, 1)
    assert_same_output(tmp_path / "single", tmp_path / "rg")


def test_the_shard_size_is_the_flag_else_the_stores_else_automatic(parquet_dir, capsys):
    from posstats.jobs.count import JobOptions, _shard_bytes

    source = CorpusSource(inputs=(str(parquet_dir / "*.parquet"),), column="input_ids")
    auto = auto_shard_bytes(corpus_bytes(source), 64)
    assert _shard_bytes(JobOptions(store="s", workers=64), None, source) == auto
    # a store keeps the size of its first run, whatever the workers: unchanged inputs keep their shards
    assert _shard_bytes(JobOptions(store="s", workers=64), 2**20, source) == 2**20
    assert capsys.readouterr().err == ""
    assert _shard_bytes(JobOptions(store="s", shard_bytes=5), 2**20, source) == 5
    assert "shard size 5 B, not the store's 1 MiB: inputs cut differently are counted again" in capsys.readouterr().err


@pytest.mark.ray
def test_a_first_run_without_workers_sizes_shards_for_the_cluster_it_joins(ray_address, monkeypatch):
    from posstats.jobs.count import JobOptions, _planned_workers

    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # this machine's CPUs: not the cluster's
    cluster_cpus = int(__import__("ray").cluster_resources()["CPU"])
    assert _planned_workers(JobOptions(store="s", address=ray_address)) == cluster_cpus != 64
    assert _planned_workers(JobOptions(store="s", address=ray_address, workers=5)) == 5
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert _planned_workers(JobOptions(store="s")) == cluster_cpus  # inside a Ray session: its CPUs


@pytest.fixture(scope="module")
def hf_dataset(tmp_path_factory, shared_dir):
    """Hamlet and Macbeth lines from the shared Shakespeare, `save_to_disk` in 4 Arrow files."""
    import datasets

    text = gzip.decompress((shared_dir / "corpora" / "shakespeare.md.gz").read_bytes()).decode("utf-8")
    lines = [x.strip() for x in text.splitlines() if x.strip() and not x.startswith("#")][:6000]
    folder = tmp_path_factory.mktemp("hf") / "plays"
    datasets.Dataset.from_dict({"text": lines}).save_to_disk(str(folder), num_shards=4)
    return folder


@pytest.mark.ray
@pytest.mark.parametrize("mode", ["chunk", "pack"])
def test_cli_ray_hf_dataset_equals_single_process(ray_session, hf_dataset, tmp_path, mode, capsys):
    flags = ["--input", hf_dataset, "--text-column", "text", "--tokenizer", BERT, "--positions", 40, "--mode", mode]
    assert posstats_cli("count", *flags, "--out", tmp_path / "single") == 0
    assert posstats_cli("count", "--ray", *flags, "--out", tmp_path / "ray") == 0
    assert_same_output(tmp_path / "single", tmp_path / "ray")
    info = json.loads((tmp_path / "ray" / "count.json").read_text())["ray"]
    assert info["shards"] == 4  # one per Arrow file (pack mode: stream pieces, stitched by the reduce)
    # the store remembers the tokenizer: a refresh needs no flags, and nothing changed
    assert posstats_cli("refresh", "--store", tmp_path / "ray" / "store") == 0
    assert "(up to date; 0 counted now)" in capsys.readouterr().out
    assert_same_output(tmp_path / "single", tmp_path / "ray")


@pytest.mark.ray
@pytest.mark.parametrize(
    "workers, seed, mode, budget",
    [(1, None, "truncate", 4 * 2**30), (2, 7, "chunk", 1024), (2, 3, "pack", 4 * 2**30)],
)
def test_counts_do_not_depend_on_workers_order_or_budget(ray_session, parquet_dir, tmp_path, workers, seed, mode, budget,
                                                         monkeypatch):
    """Parquet row groups and JSONL line ranges together; a tiny budget forces sparse
    partials, sums and result (as it does single-process)."""
    import posstats.jobs.count as count_module
    from posstats.jobs.count import JobOptions, count_job

    planned = count_module._plan

    def shuffled(*args, **kwargs):  # dispatch the shards in a seeded random order
        plan = planned(*args, **kwargs)
        random.Random(seed).shuffle(plan.todo)
        return plan

    monkeypatch.setattr(count_module, "_plan", shuffled)

    jsonl = tmp_path / "extra.jsonl"
    table = pq.read_table(parquet_dir / "part-3.parquet")
    with open(jsonl, "w") as f:
        for ids in table.column("input_ids").to_pylist()[:700]:
            f.write(json.dumps({"input_ids": ids}) + "\n")
    source = CorpusSource(inputs=(str(parquet_dir / "part-[12].parquet"), str(jsonl)), column="input_ids")
    spec = CountSpec(48, V, mode, (0, 100, 101, 102, 103), 102 if mode == "pack" else None)
    dense = spec.positions * V * 8 <= budget
    ref = count_corpus(source, spec, dense=dense, show_progress=False)
    opts = JobOptions(store=str(tmp_path / "store"), workers=workers, dense_budget=budget,
                      shard_bytes=30_000, ranges=5, show_progress=False)
    summary = count_job(source, spec, {}, opts)
    got = load_counts(summary["counts_path"])
    assert_counts_equal(got, ref)
    assert Path(summary["counts_path"]).name == save_counts(ref, tmp_path / "direct").name  # storage by size
    # every mode cuts the inputs the same way (pack: into stream pieces, stitched by the reduce)
    expected_shards = 8 + len(plan_shards(CorpusSource(inputs=(str(jsonl),), column="input_ids"), spec, shard_bytes=30_000))
    assert summary["ray"]["shards"] == expected_shards
    assert summary["ray"]["reduce_ranges"] == 5


# ----------------------------------------------------------------------------- failures


@pytest.fixture()
def small_parquet(tmp_path, fortune_ids):
    """2 files x 4 row groups; and the single-process reference."""
    root = tmp_path / "in"
    root.mkdir()
    for f in range(2):
        write_parquet(root / f"s{f}.parquet", fortune_ids[f * 800 : (f + 1) * 800], row_group_size=200)
    source = CorpusSource(inputs=(str(root / "*.parquet"),), column="input_ids")
    spec = CountSpec(48, V, "chunk", (0, 100, 101, 102, 103))
    return root, source, spec, count_corpus(source, spec, show_progress=False)


@pytest.mark.ray
def test_actor_killed_mid_shard_is_recounted_once(ray_session, small_parquet, tmp_path, test_hooks):
    from posstats.jobs.count import JobOptions

    _, source, spec, ref = small_parquet
    store = tmp_path / "store"
    test_hooks.set(shard_delay=1.0)
    opts = JobOptions(store=str(store), shard_bytes=1, workers=2, show_progress=False)
    thread, outcome = count_job_in_thread(source, spec, opts)

    def counting_now():
        for note in store.glob("partials/*/started.json"):
            if not (note.parent / "done.json").exists():
                return note.parent.name, json.loads(note.read_text())["pid"]
        return None

    shard_id, pid = wait_for(counting_now, timeout=120, what="a shard being counted")
    os.kill(pid, signal.SIGKILL)
    summary = finished(thread, outcome)
    assert_counts_equal(load_counts(summary["counts_path"]), ref)
    marker = RunStore(store).marker(shard_id)
    assert marker["pid"] != pid  # recounted by a live (restarted) actor
    assert summary["ray"]["shards_counted"] == summary["ray"]["shards"] == 8
    assert len(markers(store)) == 8


@pytest.mark.ray
def test_driver_killed_mid_run_resumes_with_the_same_run_id(ray_address, small_parquet, tmp_path, test_hooks):
    root, _, _, ref = small_parquet
    out = tmp_path / "out"
    args = [*count_flags(str(root / "*.parquet")), *ROW_GROUP_SHARDS, "--out", out, "--run-id", "resume-me", "--workers", 2]
    test_hooks.set(shard_delay=0.7)  # the shared Ray's workers sleep
    driver = start_driver(ray_address, args, log := tmp_path / "driver.log")
    try:
        wait_for(lambda: len(markers(out / "store")) >= 2, timeout=150, what="two finished shards", driver=driver, log=log)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        driver.kill()
    done_at_kill = len(markers(out / "store"))
    assert done_at_kill < 8 and not (out / "count.json").exists()
    record = json.loads((out / "store" / "runs" / "resume-me.json").read_text())
    assert record["status"] == "running"  # the driver never got to say otherwise

    test_hooks.clear()
    rerun = subprocess.run(job_cmd(ray_address, *args), cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert re.search(r"resuming run resume-me: (\d+)/8 shard\(s\) already counted", rerun.stderr)
    info = json.loads((out / "count.json").read_text())["ray"]
    assert info["shards_cached"] >= done_at_kill
    assert info["shards_counted"] == 8 - info["shards_cached"]
    assert_counts_equal(load_counts(out), ref)
    assert json.loads((out / "store" / "runs" / "resume-me.json").read_text())["attempt"] == 2


def corrupt_row_group(path: Path, group: int) -> None:
    col = pq.ParquetFile(path).metadata.row_group(group).column(0)
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(b"\xff" * 64)


@pytest.mark.ray
def test_bad_row_group_fails_keeps_partials_skips_on_request_and_resumes_after_fix(
    ray_session, small_parquet, tmp_path, capsys
):
    root, source, spec, ref = small_parquet
    bad = root / "s1.parquet"
    good_bytes = bad.read_bytes()
    corrupt_row_group(bad, 2)
    flags = [*count_flags(str(root / "*.parquet")), "--out", tmp_path / "out", "--workers", 2]
    store = tmp_path / "out" / "store"

    assert posstats_cli("count", "--ray", *ROW_GROUP_SHARDS, *flags) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"posstats: error: {bad}: row group 2: not a valid Parquet file (")
    assert err.endswith("fix the input and rerun to continue, or pass --skip-bad-shards")
    bad_id = plan_shards(source, spec, shard_bytes=1)[6].shard_id
    assert markers(store) and not RunStore(store).is_done(bad_id)
    assert not (tmp_path / "out" / "count.json").exists()

    assert posstats_cli("count", "--ray", *ROW_GROUP_SHARDS, "--skip-bad-shards", *flags) == 0
    manifest = json.loads((store / "manifest.json").read_text())
    assert [b["shard_id"] for b in manifest["bad_shards"]] == [bad_id]
    assert f"{bad}: row group 2: not a valid Parquet file" in manifest["bad_shards"][0]["error"]
    expected = functools.reduce(
        lambda a, b: a + b, [count_shard(s, source, spec) for s in plan_shards(source, spec, shard_bytes=1) if s.shard_id != bad_id]
    )
    assert_counts_equal(load_counts(tmp_path / "out"), expected)

    bad.write_bytes(good_bytes)  # fixed: a new mtime, so new shard ids for s1 only
    capsys.readouterr()
    assert posstats_cli("count", "--ray", *ROW_GROUP_SHARDS, *flags) == 0
    info = json.loads((tmp_path / "out" / "count.json").read_text())["ray"]
    assert (info["shards_cached"], info["shards_counted"], info["bad_shards"]) == (4, 4, [])
    assert_counts_equal(load_counts(tmp_path / "out"), count_corpus(source, spec, show_progress=False))


@pytest.mark.ray
def test_token_id_out_of_range_fails_with_shard_and_row(ray_session, tmp_path, fortune_ids, capsys):
    seqs = [list(s) for s in fortune_ids[:800]]
    seqs[437][2] = V + 5
    path = write_parquet(tmp_path / "ids.parquet", seqs, row_group_size=200)
    assert posstats_cli("count", "--ray", *ROW_GROUP_SHARDS, *count_flags(str(path)), "--out", tmp_path / "out") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"posstats: error: {path}: row 437: token id outside [0, {V}): {V + 5} [shard: {path} row group 2 (3/4, shard ")


@pytest.mark.ray
def test_second_run_on_a_locked_store_refuses(ray_address, small_parquet, tmp_path, test_hooks):
    root, _, _, ref = small_parquet
    out = tmp_path / "out"
    args = [*count_flags(str(root / "*.parquet")), *ROW_GROUP_SHARDS, "--out", out, "--workers", 2]
    test_hooks.set(shard_delay=1.5)  # the shared Ray's workers sleep
    first = subprocess.Popen(job_cmd(ray_address, *args), cwd=REPO, env=job_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        lock = out / "store" / "lock"
        wait_for(lambda: lock.exists() and lock.read_text().strip() and json.loads(lock.read_text())["pid"] == first.pid,
                 timeout=60, what="the first run's lock")
        second = subprocess.run(job_cmd(ray_address, *args), cwd=REPO, env=job_env(), capture_output=True, text=True,
                                timeout=120)
        assert first.poll() is None  # the refusal happened while the first run was counting
        _, first_err = first.communicate(timeout=300)
    finally:
        first.kill()
    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    assert re.fullmatch(
        rf"posstats: error: run store {re.escape(str(out / 'store'))} is in use by run run-[0-9a-f]{{16}} "
        rf"\(count, pid {first.pid} on .+, started .+\); wait for it to finish, or use another --store",
        lines[-1],
    )
    assert first.returncode == 0, first_err
    assert_counts_equal(load_counts(out), ref)
    workers = {json.loads(m.read_text())["pid"] for m in markers(out / "store")}
    assert len(markers(out / "store")) == 8 and len(workers) <= 2  # only the first run's two actors


# ----------------------------------------------------------------------------- refresh


@pytest.mark.ray
def test_refresh_recounts_only_what_changed(ray_session, tmp_path, fortune_ids, capsys):
    data = tmp_path / "data"
    data.mkdir()
    for name, lo in (("a", 0), ("b", 600), ("c", 1200)):
        write_parquet(data / f"{name}.parquet", fortune_ids[lo : lo + 600], row_group_size=200)
    out = tmp_path / "out"
    assert posstats_cli("count", "--ray", *ROW_GROUP_SHARDS, *count_flags(str(data / "*.parquet")), "--out", out) == 0
    old_a = [s.shard_id for s in plan_shards(CorpusSource(inputs=(str(data / "a.parquet"),), column="input_ids"),
                                               CountSpec(48, V, "chunk"))]
    capsys.readouterr()

    (data / "a.parquet").unlink()  # gone
    write_parquet(data / "b.parquet", fortune_ids[600:1000], row_group_size=200)  # changed: 2 row groups now
    write_parquet(data / "d.parquet", fortune_ids[2000:2600], row_group_size=300)  # new
    assert posstats_cli("refresh", "--store", out / "store") == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"refresh {out / 'store'}: reused 3 shard(s), added 4, removed 6 (incremental; 4 counted now)"
    assert printed[1:4] == [
        f"  - gone    {data / 'a.parquet'} (+0 / -3 shards)",
        f"  ~ changed {data / 'b.parquet'} (+2 / -3 shards)",
        f"  + new     {data / 'd.parquet'} (+2 / -0 shards)",
    ]
    assert printed[-1] == f"-> {out}"
    source = CorpusSource(inputs=(str(data / "*.parquet"),), column="input_ids")
    full = count_corpus(source, CountSpec(48, V, "chunk", (0, 100, 101, 102, 103)), show_progress=False)
    assert_counts_equal(load_counts(out), full)
    assert json.loads((out / "count.json").read_text())["ray"]["reduce"] == "incremental"
    assert not any(RunStore(out / "store").is_done(sid) for sid in old_a)  # subtracted partials are dropped

    assert posstats_cli("count", *count_flags(str(data / "*.parquet")), "--out", tmp_path / "single") == 0
    single = load_counts(tmp_path / "single")
    assert_counts_equal(load_counts(out), single)
    capsys.readouterr()

    assert posstats_cli("refresh", "--store", out / "store") == 0  # nothing changed since
    assert capsys.readouterr().out.splitlines()[0].endswith("reused 7 shard(s), added 0, removed 0 (up to date; 0 counted now)")


@pytest.mark.ray
def test_refresh_needs_a_finished_store(ray_session, tmp_path, capsys):
    assert posstats_cli("refresh", "--store", tmp_path / "nothing") == 2
    assert "not a run store with a finished count" in capsys.readouterr().err


def test_a_worker_killed_for_memory_is_one_line_that_says_what_to_change(tmp_path, small_parquet):
    """Ray's memory monitor really kills the workers (its threshold set below what the node
    uses): the command ends with exit 2 and one line naming the flags to change, no traceback."""
    root, *_ = small_parquet
    env = {**job_env(), "RAY_memory_usage_threshold": "0.01", "RAY_memory_monitor_refresh_ms": "50"}
    env.pop("RAY_ADDRESS", None)
    r = subprocess.run([sys.executable, "-m", "posstats.cli", "count", "--ray", "--workers", "2",
                        *map(str, count_flags(str(root / "*.parquet"))), "--out", str(tmp_path / "out")],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    errors = [line for line in r.stderr.splitlines() if line.startswith("posstats: error:")]
    assert r.returncode == 2 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "lack of memory" in errors[0] and "--workers" in errors[0] and "--shard-size" in errors[0]
    assert not (tmp_path / "out" / "count.json").exists()


def _reducing_now(store: Path):
    """(range note, pid) of a reduce range being summed (its range file not written yet)."""
    for note in store.glob("reduce/*/range-*.started.json"):
        if not Path(str(note).removesuffix(".started.json")).exists():
            return note, json.loads(note.read_text())["pid"]
    return None


@pytest.mark.ray
def test_actor_killed_during_the_range_reduce_is_survived(ray_session, small_parquet, tmp_path, test_hooks):
    """A real SIGKILL of the actor summing a position range: Ray restarts it, the range is
    summed again, and the total is the single-process count; no shard is recounted."""
    from posstats.jobs.count import JobOptions

    _, source, spec, ref = small_parquet
    store = tmp_path / "store"
    test_hooks.set(reduce_delay=1.5)
    opts = JobOptions(store=str(store), shard_bytes=1, workers=2, ranges=4, show_progress=False)
    thread, outcome = count_job_in_thread(source, spec, opts)
    note, pid = wait_for(lambda: _reducing_now(store), timeout=120, what="a range being reduced")
    os.kill(pid, signal.SIGKILL)
    summary = finished(thread, outcome)
    assert_counts_equal(load_counts(summary["counts_path"]), ref)
    assert summary["ray"]["shards_counted"] == 8 and summary["ray"]["reduce_ranges"] == 4
    assert not (store / "reduce").exists() or not list((store / "reduce").rglob("range-*"))  # scratch cleaned


@pytest.mark.ray
def test_driver_killed_during_the_reduce_resumes_without_recounting(ray_address, small_parquet, tmp_path, test_hooks):
    root, _, _, ref = small_parquet
    out = tmp_path / "out"
    args = [*count_flags(str(root / "*.parquet")), *ROW_GROUP_SHARDS, "--out", out, "--run-id", "reduce-me", "--workers", 2]
    test_hooks.set(reduce_delay=1.5)  # the shared Ray's workers sleep
    driver = start_driver(ray_address, args, log := tmp_path / "driver.log")
    try:
        wait_for(lambda: _reducing_now(out / "store"), timeout=150, what="a range being reduced", driver=driver, log=log)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        driver.kill()
    assert len(markers(out / "store")) == 8 and not (out / "count.json").exists()

    test_hooks.clear()
    rerun = subprocess.run(job_cmd(ray_address, *args), cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    info = json.loads((out / "count.json").read_text())["ray"]
    assert (info["shards_cached"], info["shards_counted"]) == (8, 0)  # every shard reused, none recounted
    assert_counts_equal(load_counts(out), ref)


@pytest.mark.ray
def test_pack_mode_row_groups_on_workers_refresh_and_bad_pieces(ray_session, tmp_path, fortune_ids, capsys):
    """Pack mode cuts each Parquet file into row-group pieces counted on the actors and
    stitched into place by the reduce: the total equals the single-process count of whole
    streams, after an incremental refresh too; a bad piece leaves its whole input out."""
    data = tmp_path / "data"
    data.mkdir()
    for name, lo in (("a", 0), ("b", 600), ("c", 1200)):
        write_parquet(data / f"{name}.parquet", fortune_ids[lo : lo + 600], row_group_size=150)
    pack = ["--mode", "pack", "--separator", "102", "--positions", "37"]
    flags = [*count_flags(str(data / "*.parquet")), *pack]
    out = tmp_path / "out"
    assert posstats_cli("count", "--ray", *ROW_GROUP_SHARDS, "--workers", 2, *flags, "--out", out) == 0
    assert json.loads((out / "count.json").read_text())["ray"]["shards"] == 12  # 3 files x 4 row groups
    assert posstats_cli("count", *flags, "--out", tmp_path / "single") == 0
    assert_same_output(tmp_path / "single", out)

    write_parquet(data / "b.parquet", fortune_ids[600:1000], row_group_size=100)  # changed: 4 new pieces
    assert posstats_cli("refresh", "--store", out / "store") == 0
    assert json.loads((out / "count.json").read_text())["ray"]["reduce"] == "incremental"
    assert posstats_cli("count", *flags, "--out", tmp_path / "single2") == 0
    assert_counts_equal(load_counts(out), load_counts(tmp_path / "single2"))
    capsys.readouterr()

    corrupt_row_group(data / "c.parquet", 2)
    skip = tmp_path / "skip"
    assert posstats_cli("count", "--ray", *ROW_GROUP_SHARDS, "--workers", 2, *flags, "--skip-bad-shards", "--out", skip) == 0
    info = json.loads((skip / "count.json").read_text())["ray"]
    assert sorted(b["label"].split(" ")[0] for b in info["bad_shards"]) == [str(data / "c.parquet")] * 4
    without_c = CorpusSource(inputs=(str(data / "a.parquet"), str(data / "b.parquet")), column="input_ids")
    spec = CountSpec(37, V, "pack", (0, 100, 101, 102, 103), 102)
    assert_counts_equal(load_counts(skip), count_corpus(without_c, spec, show_progress=False))


def test_ray_counts_markdown_paragraphs_like_the_single_process(ray_session, tmp_path, capsys):
    """A Markdown file counted one document per paragraph (its suffix's default, printed) on
    Ray equals the in-process count; --document-per line counts other documents."""
    rng = np.random.default_rng(5)
    words = np.array("the of and a to in is you that it he was for on are as with his they".split())
    paragraphs = ["\n".join(" ".join(rng.choice(words, rng.integers(3, 9))) for _ in range(rng.integers(1, 4)))
                  for _ in range(300)]
    md = tmp_path / "notes.md"
    md.write_text("\n\n".join(paragraphs) + "\n")
    flags = ["--input", md, "--tokenizer", REPO / "data" / "tokenizers" / "gpt2.tokenizer.json", "--positions", 16]
    assert posstats_cli("count", *flags, "--out", tmp_path / "single") == 0
    assert "one document per paragraph (by suffix" in capsys.readouterr().err
    assert posstats_cli("count", "--ray", "--workers", 2, "--shard-size", 0.001, *flags, "--out", tmp_path / "ray") == 0
    assert_same_output(tmp_path / "single", tmp_path / "ray")
    assert json.loads((tmp_path / "single" / "count.json").read_text())["sequences"] == 300
    assert posstats_cli("count", *flags, "--document-per", "line", "--out", tmp_path / "lines") == 0
    assert json.loads((tmp_path / "lines" / "count.json").read_text())["sequences"] > 300


@pytest.mark.ray
def test_the_test_hooks_reach_the_shared_workers(ray_session, test_hooks):
    """The delays the kill tests rely on (tests/_hooks): a worker of the shared Ray runs
    the hooks (its PYTHONPATH) and reads the session's hooks file at each call."""

    @ray_session.remote
    def probe() -> tuple[bool, float]:
        import posstats_test_hooks

        from posstats.corpus.shard_store import RunStore

        return bool(getattr(RunStore.write_partial, "__posstats_test_hook__", False)), posstats_test_hooks.delay("shard_delay")

    test_hooks.set(shard_delay=0.5)
    assert ray_session.get(probe.remote()) == (True, 0.5)
    test_hooks.clear()
    assert ray_session.get(probe.remote()) == (True, 0.0)
