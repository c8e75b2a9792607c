"""Output folders publish all-or-nothing (issue #18, defects 3, 5, 6 and 12).

Real processes: a count killed by SIGKILL at every rename of its publish (injected with
strace, as the hostile probe did), a count into a tmpfs mount point, file modes under two
umasks; and the stale-file cases through the CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mounts import mounted

from posstats.cli import main
from posstats.counting.io import counts_file, load_counts
from posstats.storage.publish import (
    METADATA_DIR,
    link_or_copy,
    published_dir,
    staged_output,
)

REPO = Path(__file__).resolve().parents[1]
RENAMES = "rename,renameat,renameat2"


def _corpus(path: Path, *, seed: int, docs: int = 40, V: int = 50) -> Path:
    rng = np.random.default_rng(seed)
    rows = [rng.integers(0, V, size=int(rng.integers(3, 12))).tolist() for _ in range(docs)]
    pq.write_table(pa.table({"ids": rows}), path)
    return path


def _count_argv(corpus: Path, out: Path, *extra: str) -> list[str]:
    return ["count", "--input", str(corpus), "--column", "ids", "--vocab-size", "50", "--positions", "8",
            "--out", str(out), *extra]


def _cli(argv: list[str], *, strace: list[str] | None = None, umask: int | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "posstats.cli", *argv]
    if strace:
        cmd = ["strace", "-f", "-qq", "-o", os.devnull, *strace, *cmd]
    preexec = (lambda: os.umask(umask)) if umask is not None else None
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, preexec_fn=preexec, timeout=300)


def _state(out: Path) -> tuple[int, str]:
    """(tokens, fingerprint) of a counts folder, after checking that its marker and its
    counts file agree (a torn folder fails here)."""
    marker = json.loads((published_dir(out) / "count.json").read_text())
    counts = load_counts(out)
    assert counts_file(out).name == marker["counts_file"]
    assert counts.tokens == marker["tokens_counted"] == int(counts.matrix.sum())
    assert counts.fingerprint == marker["fingerprint"]
    return counts.tokens, counts.fingerprint


def test_a_kill_at_any_rename_of_the_publish_leaves_one_complete_set(tmp_path):
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (apt-get install strace)")
    a, b = _corpus(tmp_path / "a.parquet", seed=1), _corpus(tmp_path / "b.parquet", seed=2, docs=70)
    out = tmp_path / "out"
    assert _cli(_count_argv(a, out)).returncode == 0
    old = _state(out)
    probe = tmp_path / "probe"
    shutil.copytree(out, probe, symlinks=True)
    sparse = ("--positions", "400")  # sparse counts, a new file name: links are renamed after the switch
    r = _cli(_count_argv(b, probe, *sparse), strace=["-e", f"trace={RENAMES}", "-o", str(tmp_path / "trace")])
    assert r.returncode == 0, r.stderr
    new = _state(probe)
    lines = (tmp_path / "trace").read_text().splitlines()
    # "PID call(...)" lines; "PID --- SIG... ---" and "PID +++ exited ... +++" are signals and exits
    calls = [line.split()[1].split("(")[0] for line in lines if line.split()[1] not in ("---", "+++")]
    assert calls.count("rename") >= 4  # temp files of config / counts / marker, then the pointer
    seen = set()
    for syscall in sorted(set(calls)):  # strace counts each syscall separately
        for k in range(1, calls.count(syscall) + 1):
            r = _cli(_count_argv(b, out, *sparse), strace=["-e", f"inject={syscall}:signal=SIGKILL:when={k}"])
            assert r.returncode == -9, (syscall, k, r.returncode, r.stderr[-500:])
            state = _state(out)
            assert state in (old, new), (syscall, k)
            seen.add(state == old)
    assert seen == {True, False}  # kills up to the pointer switch keep the old set, later ones show the new
    # the next run publishes and clears every unfinished version of the killed runs
    assert _cli(_count_argv(a, out)).returncode == 0
    assert _state(out) == old
    versions = [p for p in (out / METADATA_DIR).iterdir() if p.name.startswith("v-")]
    assert len(versions) <= 2 and not any((v / ".owner.json").exists() for v in versions)
    assert not [p for p in tmp_path.iterdir() if ".staging-" in p.name]


def test_counting_dense_then_sparse_leaves_only_the_new_counts(tmp_path, capsys):
    corpus_a, corpus_b = _corpus(tmp_path / "a.parquet", seed=3, docs=400), _corpus(tmp_path / "b.parquet", seed=4, docs=15)
    out = tmp_path / "out"
    assert main(_count_argv(corpus_a, out)) == 0
    assert (out / "counts.safetensors").is_file()
    assert main(_count_argv(corpus_b, out, "--positions", "400")) == 0  # 20,000 cells: sparse is smaller
    assert (out / "counts.csr.safetensors").is_file()
    assert not (out / "counts.safetensors").exists()
    assert sorted(p.name for p in published_dir(out).iterdir() if not p.name.startswith(".")) == \
        ["config.json", "count.json", "counts.csr.safetensors", "window-groups.safetensors"]
    tokens, _ = _state(out)
    assert main(["analyze", "--counts", str(out), "--out", str(tmp_path / "an"), "--dims", "2"]) == 0
    report = json.loads((tmp_path / "an" / "report.json").read_text())
    assert report["corpus"]["tokens_counted"] == tokens
    capsys.readouterr()


@pytest.mark.ray
def test_ray_count_dense_then_sparse_leaves_only_the_new_counts(tmp_path, ray_session, capsys):
    corpus_a, corpus_b = _corpus(tmp_path / "a.parquet", seed=5), _corpus(tmp_path / "b.parquet", seed=6, docs=9)
    out = tmp_path / "out"
    assert main(_count_argv(corpus_a, out, "--ray", "--workers", "1")) == 0
    # another spec needs another run store (a store is bound to one counting configuration)
    store = tmp_path / "store400"
    assert main(_count_argv(corpus_b, out, "--ray", "--workers", "1", "--positions", "400", "--store", str(store))) == 0
    names = sorted(p.name for p in published_dir(out).iterdir() if not p.name.startswith("."))
    assert names == ["config.json", "count.json", "counts.csr.safetensors", "window-groups.safetensors"]
    assert not (out / "counts.safetensors").exists()
    result = store / json.loads((store / "manifest.json").read_text())["result"]
    assert load_counts(out).tokens == load_counts(result).tokens
    # the published files are the store's result files, linked (no copy of the counts)
    assert os.path.samefile(counts_file(out), counts_file(result))
    assert os.path.samefile(out / "window-groups.safetensors", result / "window-groups.safetensors")
    capsys.readouterr()


def test_link_or_copy_links_and_copies_where_links_fail(tmp_path, monkeypatch):
    src = tmp_path / "src.bin"
    src.write_bytes(b"counts")
    link_or_copy(src, tmp_path / "linked.bin")
    assert os.path.samefile(src, tmp_path / "linked.bin")

    def no_links(*_):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    link_or_copy(src, tmp_path / "copied.bin")
    assert (tmp_path / "copied.bin").read_bytes() == b"counts"
    assert not os.path.samefile(src, tmp_path / "copied.bin")


def test_a_folder_with_both_kinds_reads_what_its_marker_names(tmp_path):
    """A folder from before versioned publishing, holding a stale file of the other kind."""
    corpus_a, corpus_b = _corpus(tmp_path / "a.parquet", seed=7, docs=400), _corpus(tmp_path / "b.parquet", seed=8, docs=11)
    assert main(_count_argv(corpus_a, tmp_path / "dense")) == 0
    assert main(_count_argv(corpus_b, tmp_path / "sparse", "--positions", "400")) == 0
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    shutil.copy(tmp_path / "dense" / "counts.safetensors", legacy)
    for name in ("counts.csr.safetensors", "count.json"):
        shutil.copy(tmp_path / "sparse" / name, legacy)
    assert load_counts(legacy).tokens == load_counts(tmp_path / "sparse").tokens
    (legacy / "count.json").unlink()
    with pytest.raises(Exception, match="holds both counts.safetensors and counts.csr.safetensors"):
        counts_file(legacy)
    # the next count into it migrates the folder and drops the stale kind
    assert main(_count_argv(corpus_a, legacy)) == 0
    assert not (legacy / "counts.csr.safetensors").exists()
    assert _state(legacy)[0] == load_counts(tmp_path / "dense").tokens


def test_out_that_is_a_mount_point_is_published_inside_it(tmp_path):
    corpus = _corpus(tmp_path / "a.parquet", seed=9)
    with mounted("tmpfs", tmp_path / "mnt", size="16m") as mnt:
        for _ in range(2):  # the first publish and a replacing one
            r = _cli(_count_argv(corpus, mnt))
            assert r.returncode == 0, r.stderr
        assert _state(mnt)[0] == load_counts(mnt).tokens
        assert not [p for p in tmp_path.iterdir() if ".staging-" in p.name]


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_output_files_follow_the_umask(tmp_path, umask):
    corpus = _corpus(tmp_path / "a.parquet", seed=10)
    out = tmp_path / "out"
    r = _cli(["run", "--input", str(corpus), "--column", "ids", "--vocab-size", "50", "--positions", "8",
              "--dims", "2", "--out", str(out)], umask=umask)
    assert r.returncode == 0, r.stderr
    version = published_dir(out)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [version, *version.rglob("*")]}
    expected_file, expected_dir = 0o666 & ~umask, 0o777 & ~umask
    for name, mode in modes.items():
        want = expected_dir if (version / name).is_dir() or name == version.name else expected_file
        assert mode == want, (name, oct(mode), oct(want))
    assert {"mds.safetensors", "report.html", "count.json"} <= set(modes)
    assert {"counts.safetensors", "counts.csr.safetensors"} & set(modes)


def test_report_and_analyze_republish_without_dropping_the_counts(tmp_path, capsys):
    corpus = _corpus(tmp_path / "a.parquet", seed=11, docs=400)
    out = tmp_path / "out"
    assert main(_count_argv(corpus, out)) == 0
    assert main(["analyze", "--counts", str(out), "--out", str(out), "--dims", "2"]) == 0
    assert main(["report", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"counts.safetensors", "count.json", "report.json", "mds.safetensors", "report.html", "figures"} <= names
    assert _state(out)[0] > 0
    capsys.readouterr()


def test_a_failed_command_leaves_the_folder_untouched(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    with pytest.raises(RuntimeError), staged_output(out, last=("x.json",)) as stage:
        (stage / "x.json").write_text("{}")
        raise RuntimeError("boom")
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_pipeline_store_files_follow_the_umask(tmp_path, umask):
    from posstats.service.pipeline_store import Store

    previous = os.umask(umask)
    try:
        store = Store(str(tmp_path / "store"))
        store.write_json("runs/r1/config/config.json", {"a": 1})
        local = tmp_path / "local.json"
        local.write_text("{}")
        store.put_file(local, "runs/r1/count/done.json")
    finally:
        os.umask(previous)
    for rel in ("runs/r1/config/config.json", "runs/r1/count/done.json"):
        assert stat.S_IMODE((tmp_path / "store" / rel).stat().st_mode) == 0o666 & ~umask, rel
