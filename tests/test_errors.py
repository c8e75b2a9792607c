"""Issue #18 through the real CLI: limits that are enforced (V, n, memory), failures of the
environment (full disk, read-only or blocked outputs, memory, Ray's OOM) and non-UTF-8
input all end as one line ``posstats: error: ...`` with exit status 2, no traceback, and
the previous outputs byte-identical."""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
from mounts import mounted
from posstats.jobs.guard import run_guarded

import posstats.analysis.config
import posstats.analysis.rows
import posstats.memory
from posstats.cli import main
from posstats.counting.counts import CountSpec, PositionalCounts
from posstats.counting.io import load_counts, save_counts

REPO = Path(__file__).resolve().parents[1]
BERT = str(REPO / "data/tokenizers/bert-base-uncased.tokenizer.json")


# ----------------------------------------------------------------------------- helpers


def one_line_error(capsys, rc: int) -> str:
    """The single ``posstats: error:`` line of a failed command (exit 2, no traceback)."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("posstats: error:")]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def visible_files(root: Path) -> dict[str, bytes]:
    """Every file a reader of ``root`` sees (links followed, hidden entries skipped), with its bytes."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if not name.startswith("."):
                path = Path(dirpath, name)
                out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out


def write_ids(path: Path, rows, *, type_=pa.int64()) -> Path:
    pq.write_table(pa.table({"ids": pa.array(rows, type=pa.list_(type_))}), path)
    return path


@pytest.fixture()
def ids_file(tmp_path) -> Path:
    rng = np.random.default_rng(7)
    return write_ids(tmp_path / "ids.parquet", [rng.integers(0, 10, size=int(rng.integers(3, 12))).tolist() for _ in range(60)])


def count_args(ids_file: Path, out: Path, *extra) -> list[str]:
    return ["count", "--input", str(ids_file), "--column", "ids", "--vocab-size", "10", "--positions", "8",
            "--out", str(out), *map(str, extra)]


def run_args(ids_file: Path, out: Path, *extra) -> list[str]:
    return ["run", "--input", str(ids_file), "--column", "ids", "--vocab-size", "10", "--positions", "8",
            "--dims", "2,4", "--encodings", "mds,sinusoidal", "--out", str(out), *map(str, extra)]


def fill(folder: Path) -> None:
    """Fill the file system of ``folder`` to the last byte."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for chunk in (1 << 16, 1 << 12, 1 << 9, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- 4. limits


@pytest.fixture()
def machine_16g(monkeypatch):
    """16 GiB available, whatever this machine has: refusals do not depend on the host."""
    monkeypatch.setattr("posstats.memory.available_memory", lambda: 16 * 2**30)


def test_require_memory_message_and_unknown_memory(monkeypatch):
    from posstats import memory
    from posstats.errors import PosstatsError

    monkeypatch.setattr(memory, "available_memory", lambda: int(21.2 * 2**30))
    with pytest.raises(PosstatsError) as info:
        memory.require_memory(987_654**2 * 8, what="the 987,654 x 987,654 distance matrix",
                              hint="lower --exact-limit or use --buckets", command="analyze")
    assert str(info.value) == ("analyze needs about 7.1 TiB for the 987,654 x 987,654 distance matrix but 21.2 GiB "
                               "are available; lower --exact-limit or use --buckets")
    memory.require_memory(int(21.2 * 2**30), what="x", hint="y")  # what is available is allowed
    monkeypatch.setattr(memory, "available_memory", lambda: None)  # unknown (not Linux): never refused
    memory.require_memory(2**80, what="x", hint="y")
    assert [memory.format_bytes(x) for x in (12, 1536, 512 * 2**20, 2**40 * 7.3)] == ["12 B", "1.5 KiB", "512 MiB", "7.3 TiB"]


def test_vocab_size_that_int32_cannot_store_is_refused(tmp_path, capsys):
    # id 4,294,967,301 used to be stored as 5 (int32 token column)
    path = write_ids(tmp_path / "big.parquet", [[1, 2, 3, 4_294_967_301], [5, 6]])
    out = tmp_path / "out"
    line = one_line_error(capsys, main(["count", "--input", str(path), "--column", "ids", "--vocab-size", str(2**33),
                                        "--positions", "4", "--out", str(out)]))
    assert "--vocab-size 8,589,934,592" in line and "2,147,483,648" in line, line
    assert not out.exists()


def test_largest_storable_vocabulary_round_trips_exactly(tmp_path, capsys):
    path = write_ids(tmp_path / "edge.parquet", [[2**31 - 1, 0], [5]])
    out = tmp_path / "out"
    assert main(["count", "--input", str(path), "--column", "ids", "--vocab-size", str(2**31),
                 "--positions", "2", "--out", str(out)]) == 0
    coo = load_counts(out).matrix.tocoo()
    assert sorted(zip(coo.row.tolist(), coo.col.tolist(), coo.data.tolist())) == [(0, 5, 1), (0, 2**31 - 1, 1), (1, 0, 1)]


def test_positions_that_int32_cannot_store_are_refused(ids_file, tmp_path, capsys):
    out = tmp_path / "out"
    line = one_line_error(capsys, main(count_args(ids_file, out)[:-4] + ["--positions", str(2**31 + 1), "--out", str(out)]))
    assert "--positions 2,147,483,649" in line and "2,147,483,648" in line, line
    assert not out.exists()


def test_count_memory_is_estimated_before_reading(ids_file, tmp_path, capsys, machine_16g):
    # a dense 2**20 x 2**20 int64 array (8 TiB) would fit the budget, but a small corpus is
    # counted by sorting each position's tokens: it needs no n x V memory and succeeds
    small = tmp_path / "small"
    assert main(run_args(ids_file, small)[:-2] + [
        "--positions", str(2**20), "--vocab-size", str(2**20), "--memory-budget", "100000", "--out", str(small)]) == 0
    assert load_counts(small).is_sparse
    capsys.readouterr()
    # 2**31 positions need 32 GiB of per-position arrays: refused with the figure, nothing written
    out = tmp_path / "out"
    line = one_line_error(capsys, main(run_args(ids_file, out)[:-2] + [
        "--positions", str(2**31), "--vocab-size", "1000", "--out", str(out)]))
    assert line.startswith("posstats: error: count needs about 32 GiB for the per-position arrays of 2,147,483,648 positions"), line
    assert "but 16 GiB are available; lower --positions" in line, line
    assert not out.exists()


@pytest.fixture()
def wide_counts(tmp_path) -> Path:
    """987,654 occupied positions (sparse, V = 2): analysable only by sampling."""
    n = 987_654
    matrix = sp.csr_array((np.ones(n, dtype=np.int64), (np.arange(n), np.arange(n) % 2)), shape=(n, 2))
    save_counts(PositionalCounts(CountSpec(n, 2), matrix, sequences=1, windows=1, tokens=n), tmp_path / "wide")
    return tmp_path / "wide"


def test_analyze_refuses_a_distance_matrix_that_cannot_fit(wide_counts, tmp_path, capsys, machine_16g):
    out = tmp_path / "analysis"
    line = one_line_error(capsys, main(["analyze", "--counts", str(wide_counts), "--exact-limit", "1000000",
                                        "--out", str(out)]))
    assert line.startswith("posstats: error: analyze needs about 14.2 TiB for the 987,654 x 987,654 distance matrix"), line
    assert "but 16 GiB are available; lower --exact-limit" in line and "--buckets" in line, line
    assert not out.exists()


def test_huge_dims_are_refused_before_counting(ids_file, tmp_path, capsys, machine_16g):
    out = tmp_path / "out"
    line = one_line_error(capsys, main(run_args(ids_file, out)[:-6] + ["--dims", "2,10000000000", "--out", str(out)]))
    assert "analyze needs about 298 GiB for encodings of width 10,000,000,000 (--dims)" in line and "lower --dims" in line, line
    assert not out.exists()


def test_memory_error_past_the_estimate_is_one_line(ids_file, tmp_path, capsys, monkeypatch):
    # without the estimate, numpy's own MemoryError: still one line with the flags to change.
    # 2 x 10**16 float64 is more than any address space, so it fails at once whatever the
    # kernel's overcommit policy (nothing is ever touched).
    for module in (posstats.memory, posstats.analysis.config, posstats.analysis.rows):  # and where it is imported by name
        monkeypatch.setattr(module, "require_memory", lambda *a, **k: None)
    out = tmp_path / "out"
    line = one_line_error(capsys, main(run_args(ids_file, out)[:-6] + ["--dims", str(10**16), "--out", str(out)]))
    assert line.startswith("posstats: error: out of memory (Unable to allocate"), line
    assert "available); lower --memory-budget" in line and "--exact-limit" in line, line
    assert not out.exists()


def test_export_refuses_a_table_that_cannot_fit(ids_file, tmp_path, capsys, machine_16g):
    run = tmp_path / "run"
    assert main(run_args(ids_file, run)) == 0
    capsys.readouterr()
    target = tmp_path / "pos.safetensors"
    line = one_line_error(capsys, main(["export", str(run), "--dim", "10000000000", "--out", str(target)]))
    assert "export needs about" in line and "x 10,000,000,000 position table (--dim)" in line and "lower --dim" in line, line
    assert not target.exists()


def test_adjacency_refuses_huge_encoding_width(capsys, machine_16g):
    line = one_line_error(capsys, main(["adjacency", "--encodings", "sinusoidal", "--dim", "10000000000", "--seq-len", "8"]))
    assert "adjacency needs about" in line and "width 10,000,000,000" in line and "--encoding-dim" in line, line


# ----------------------------------------------------------------------------- 10. environment


def test_out_that_is_a_file(ids_file, tmp_path, capsys):
    blocker = tmp_path / "taken"
    blocker.write_text("keep me\n")
    line = one_line_error(capsys, main(count_args(ids_file, blocker)))
    assert str(blocker) in line, line
    expected = f"posstats: error: {blocker}: is a file where a folder is needed; choose another --out or move the file away"
    assert one_line_error(capsys, main(run_args(ids_file, blocker / "sub"))) == expected
    assert main(count_args(ids_file, tmp_path / "counts")) == 0
    capsys.readouterr()
    analyze = ["analyze", "--counts", str(tmp_path / "counts"), "--dims", "2", "--encodings", "mds", "--out", str(blocker / "sub")]
    assert one_line_error(capsys, main(analyze)) == expected
    assert blocker.read_text() == "keep me\n"


def test_negative_counts_file_is_one_line(tmp_path, capsys):
    matrix = np.array([[3, 1, 0], [2, -4, 1], [1, 1, 1]], dtype=np.int64)
    save_counts(PositionalCounts(CountSpec(3, 3), matrix, sequences=3, windows=3, tokens=6), tmp_path / "neg")
    line = one_line_error(capsys, main(["analyze", "--counts", str(tmp_path / "neg"), "--out", str(tmp_path / "a")]))
    assert "negative" in line and str(tmp_path / "neg") in line, line
    assert not (tmp_path / "a").exists()


def test_all_nan_audit_table_is_one_line(ids_file, tmp_path, capsys):
    assert main(count_args(ids_file, tmp_path / "counts")) == 0
    capsys.readouterr()
    np.save(tmp_path / "nan.npy", np.full((8, 4), np.nan))
    line = one_line_error(capsys, main(["audit", str(tmp_path / "nan.npy"), "--counts", str(tmp_path / "counts")]))
    assert line.startswith(f"posstats: error: {tmp_path / 'nan.npy'}: position table 'position_embeddings': all ")
    assert "are NaN or infinite (first: row 0, column 0 = nan)" in line, line


def test_ray_out_of_memory_is_explained_without_importing_ray_in_the_library():
    ray_exceptions = pytest.importorskip("ray.exceptions")
    oom = ray_exceptions.OutOfMemoryError("Task was killed due to the node running low on memory.\nMemory on the node ...")

    def job(args):
        raise RuntimeError("counting failed") from oom

    import io
    import sys

    err = io.StringIO()
    saved, sys.stderr = sys.stderr, err
    try:
        rc = run_guarded(job, argparse.Namespace(command="count"))
    finally:
        sys.stderr = saved
    line = err.getvalue().strip()
    assert rc == 2 and "\n" not in line, line
    assert line.startswith("posstats: error: Ray stopped a task for lack of memory (Task was killed due to the node "
                           "running low on memory.)"), line
    assert "fewer --workers" in line and "memory budget" in line and "smaller shards (--shard-size)" in line


def _previous_then(capsys, args: list[str], out: Path, prepare=None) -> tuple[str, dict, dict]:
    """Publish ``args`` into ``out`` once, run ``prepare``, run ``args`` again (it must fail)."""
    assert main(args) == 0, capsys.readouterr().err
    capsys.readouterr()
    before = visible_files(out)
    assert before
    if prepare is not None:
        prepare()
    line = one_line_error(capsys, main(args))
    return line, before, visible_files(out)


@pytest.mark.parametrize("command", ["count", "run", "analyze"])
def test_disk_full_keeps_previous_outputs(command, ids_file, tmp_path, capsys):
    counts = tmp_path / "counts"
    if command == "analyze":
        assert main(count_args(ids_file, counts)) == 0
    with mounted("tmpfs", tmp_path / "small", size="4m") as small:
        out = small / "out"
        args = {"count": count_args(ids_file, out), "run": run_args(ids_file, out),
                "analyze": ["analyze", "--counts", str(counts), "--dims", "2,4", "--encodings", "mds,sinusoidal",
                            "--out", str(out)]}[command]
        line, before, after = _previous_then(capsys, args, out, prepare=lambda: fill(small))
        assert "no space left on the device" in line and str(out) in line, line
        assert after == before


@pytest.mark.parametrize("command", ["count", "analyze"])
def test_read_only_out_keeps_previous_outputs(command, ids_file, tmp_path, capsys):
    counts = tmp_path / "counts"
    assert main(count_args(ids_file, counts)) == 0
    source = tmp_path / "out"
    if command == "count":
        assert main(count_args(ids_file, source)) == 0
    else:
        assert main(["analyze", "--counts", str(counts), "--dims", "2", "--encodings", "mds", "--out", str(source)]) == 0
    capsys.readouterr()
    before = visible_files(source)
    with mounted("ro", tmp_path / "ro", source=source) as ro:
        args = (count_args(ids_file, ro) if command == "count"
                else ["analyze", "--counts", str(counts), "--dims", "2", "--encodings", "mds", "--out", str(ro)])
        line = one_line_error(capsys, main(args))
        assert "read-only file system" in line and str(ro) in line, line
        assert visible_files(ro) == before
    assert visible_files(source) == before


# ----------------------------------------------------------------------------- 10. Ray


@pytest.mark.ray
def test_ray_read_only_out_and_store_that_is_a_file(ray_session, ids_file, tmp_path, capsys):
    source = tmp_path / "out"
    assert main(count_args(ids_file, source, "--ray", "--workers", 1)) == 0
    capsys.readouterr()
    before = visible_files(source)
    with mounted("ro", tmp_path / "ro", source=source) as ro:
        line = one_line_error(capsys, main(count_args(ids_file, ro, "--ray", "--workers", 1)))
        assert "read-only file system" in line and str(ro) in line, line
    assert visible_files(source) == before

    store = tmp_path / "store"
    assert main(count_args(ids_file, tmp_path / "out1", "--ray", "--workers", 1, "--store", store)) == 0
    capsys.readouterr()
    stored = visible_files(store)
    with mounted("ro", tmp_path / "ro-store", source=store) as ro:
        line = one_line_error(capsys, main(count_args(ids_file, tmp_path / "out3", "--ray", "--workers", 1, "--store", ro)))
        assert "read-only file system" in line and str(ro) in line, line
    assert visible_files(store) == stored and not (tmp_path / "out3" / "count.json").exists()

    blocker = tmp_path / "store-file"
    blocker.write_text("not a store\n")
    line = one_line_error(capsys, main(count_args(ids_file, tmp_path / "out2", "--ray", "--store", blocker)))
    assert str(blocker) in line, line
    assert blocker.read_text() == "not a store\n"


# ----------------------------------------------------------------------------- 11. UTF-8


def _bad_lines(path: Path, good: bytes, bad: bytes, bad_line: int, *, lines: int = 3000, header: bytes | None = None) -> Path:
    rows = [good] * lines
    rows[bad_line - 1 - (header is not None)] = bad
    if header is not None:
        rows = [header, *rows[: lines - 1]]
    path.write_bytes(b"\n".join(rows) + b"\n")
    return path


@pytest.mark.parametrize("line", [1, 21, 2001])
def test_non_utf8_jsonl_names_its_line(line, tmp_path, capsys):
    path = _bad_lines(tmp_path / "c.jsonl", b'{"ids": [1, 2, 3], "t": "ok"}', b'{"ids": [1, 2, 3], "t": "o\xffk"}', line)
    err = one_line_error(capsys, main(count_args(path, tmp_path / "out")))
    assert err.startswith(f"posstats: error: {path}: line {line}: not UTF-8 text (invalid start byte 0xff at byte 27 "), err


@pytest.mark.parametrize("line", [1, 21, 2001])
def test_non_utf8_text_names_its_line(line, tmp_path, capsys):
    path = _bad_lines(tmp_path / "c.txt", b"hello world", b"hel\xfflo", line)
    err = one_line_error(capsys, main(["count", "--input", str(path), "--tokenizer", BERT, "--positions", "4",
                                       "--out", str(tmp_path / "out")]))
    assert err.startswith(f"posstats: error: {path}: line {line}: not UTF-8 text (invalid start byte 0xff at byte 4 "), err


@pytest.mark.parametrize("line", [1, 21, 2001])
def test_non_utf8_csv_names_its_line(line, tmp_path, capsys):
    if line == 1:
        path = _bad_lines(tmp_path / "c.csv", b'"1 2 3",hello', b"i\xffds,text", 1, header=b"i\xffds,text")
        expected = f"{path}: line 1: header: not UTF-8 text"
    else:
        path = _bad_lines(tmp_path / "c.csv", b'"1 2 3",hello', b'"1 2 \xff3",hello', line, header=b"ids,text")
        expected = f"{path}: line {line}: row {line - 2}: column 'ids' is not UTF-8 text (invalid start byte 0xff"
    err = one_line_error(capsys, main(count_args(path, tmp_path / "out")))
    assert err.startswith(f"posstats: error: {expected}"), err


def test_non_utf8_in_compressed_jsonl_names_its_line(tmp_path, capsys):
    import gzip

    raw = _bad_lines(tmp_path / "c.jsonl", b'{"ids": [1, 2]}', b'{"ids": [1, 2], "t": "\xc3"}', 2001)
    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(gzip.compress(raw.read_bytes()))
    err = one_line_error(capsys, main(count_args(path, tmp_path / "out")))
    assert err.startswith(f"posstats: error: {path}: line 2001: not UTF-8 text ("), err


@pytest.mark.ray
def test_non_utf8_in_a_byte_range_shard_names_its_line(ray_session, tmp_path, capsys):
    # 3 byte-range shards of ~20 KB; the bad byte is in the third, which starts mid-file
    path = _bad_lines(tmp_path / "big.jsonl", b'{"ids": [1, 2, 3]}', b'{"ids": [1, 2, 3], "x": "\xff"}', 2500)
    err = one_line_error(capsys, main(count_args(path, tmp_path / "out", "--ray", "--workers", 1,
                                                 "--shard-size", 20000 / 2**20)))
    assert err.startswith(f"posstats: error: {path}: line 2500: not UTF-8 text (invalid start byte 0xff at byte 26 "), err
    assert "[shard: " in err and "(from line 2107) (3/3" in err, err


# ----------------------------------------------------------------------------- hostile flags and files (#27)

DEEP_KEY = ".".join(["a"] * 5000)


@pytest.fixture()
def small_run(ids_file, tmp_path, capsys) -> Path:
    assert main(run_args(ids_file, tmp_path / "run")) == 0
    capsys.readouterr()
    return tmp_path / "run"


@pytest.mark.parametrize(("argv", "expected"), [
    (["analyze", "--seed", "-1"], "the seed must be an integer in [0, 2^63), got -1"),
    (["analyze", "--rank-rtol", "nan"], "rank rtol must be a number in [0, 1), got nan"),
    (["analyze", "--encodings", "rope:vector=random:seed=-1"], "bad seed '-1'"),
    (["analyze", "--encodings", "rope:type=yarn,factor=8,original=16,theta=1"], "rope_theta must be greater than 1"),
    (["analyze", "--encodings", "rope:type=yarn,factor=1e308,original=16"], "not a usable context length"),
    (["analyze", "--encodings", "rope:type=yarn,factor=8,original=16,attention_factor=1e308"],
     "attention_factor must be within"),
    (["analyze", "--encodings", "rope:type=yarn,factor=8,original=16,beta_fast=-5"], "beta_fast must be a positive"),
    (["diff", "--seed", "-1"], "the seed must be an integer in [0, 2^63), got -1"),
    (["export", "--dim", "4", "--rows", "1"], "--rows must be an integer >= 2"),
    (["count", "--storage-option", "client_kwargs=5"], "client_kwargs must be a table of keyword arguments"),
    (["count", "--storage-option", f"{DEEP_KEY}=5"], "a dotted key has 1-8 non-empty parts"),
    (["status", "--store", "s3://bucket/x", "--storage-option", "client_kwargs=5"], "client_kwargs must be a table"),
])
def test_hostile_flags_are_one_line(small_run, ids_file, tmp_path, capsys, argv, expected):
    command, *rest = argv
    where = {"analyze": ["--counts", str(small_run), "--out", str(tmp_path / "a"), "--dims", "2"],
             "diff": [str(ids_file.parent / "counts"), str(ids_file.parent / "counts"), "--out", str(tmp_path / "d")],
             "export": [str(small_run), "--out", str(tmp_path / "e.safetensors")],
             "count": ["--input", str(ids_file), "--column", "ids", "--vocab-size", "10", "--positions", "8",
                       "--out", str(tmp_path / "c")],
             "status": []}[command]
    if command == "diff":
        assert main(count_args(ids_file, ids_file.parent / "counts")) == 0
        capsys.readouterr()
    line = one_line_error(capsys, main([command, *where, *rest]))
    assert expected in line, line


@pytest.mark.parametrize(("item", "expected"), [
    ("store.url=[1,2]", "[store] url must be a non-empty string, got [1, 2]"),
    (f"{DEEP_KEY}=1", "unknown table"),
    (f"store.storage_options.{DEEP_KEY}=1", "unknown key [store]"),
])
def test_hostile_config_overrides_are_one_line(tmp_path, capsys, item, expected):
    (tmp_path / "p.toml").write_text('[store]\nurl = "st"\n[input]\npaths = ["c.jsonl"]\ncolumn = "ids"\n'
                                     '[count]\npositions = 8\nvocab_size = 16\n')
    line = one_line_error(capsys, main(["pipeline", "--config", str(tmp_path / "p.toml"), "--set", item,
                                        "--print-config"]))
    assert expected in line, line


@pytest.mark.parametrize("header", [
    {"w": {"dtype": "F32", "data_offsets": [0, 16]}},
    {"__metadata__": [1], "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}},
    {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [16, 0]}},
    {"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 16]}},
])
def test_forged_safetensors_through_audit_and_learned_are_one_line(small_run, tmp_path, capsys, header):
    import json
    import struct

    text = json.dumps(header).encode()
    forged = tmp_path / "forged.safetensors"
    forged.write_bytes(struct.pack("<Q", len(text)) + text + bytes(16))
    line = one_line_error(capsys, main(["audit", str(forged), "--counts", str(small_run)]))
    assert "forged.safetensors: not a readable safetensors file" in line
    line = one_line_error(capsys, main(["analyze", "--counts", str(small_run), "--dims", "2", "--encodings",
                                        f"learned:{forged}", "--out", str(tmp_path / "a")]))
    assert "forged.safetensors: not a readable safetensors file" in line


def test_analysis_of_more_stored_counts_than_memory_holds_is_refused_with_the_ranges_as_the_way_out(monkeypatch):
    """Sparse counts cost a one-process analysis ANALYSIS_BYTES_PER_STORED_COUNT each: where
    they do not fit, analyze refuses at once (naming the stored counts and the ranges of
    --memory-budget), instead of being killed minutes later (1e9 tokens at n = 131,072
    passed 24 GB); with the memory they need it runs."""
    from posstats import memory
    from posstats.analysis import AnalysisConfig, analyze
    from posstats.errors import OptionError
    from posstats.testing import known_corpus

    counts = known_corpus("stationary", 64, tokens=200, seed=1).counts
    assert counts.is_sparse
    stored = counts.matrix.nnz
    config = AnalysisConfig(dims=(2,), encodings=("mds",), held_out="off")
    need = memory.ANALYSIS_BYTES_PER_STORED_COUNT * stored
    monkeypatch.setattr(memory, "available_memory", lambda: need // 2)
    with pytest.raises(OptionError) as info:
        analyze(counts, config, show_progress=False)
    message = info.value.naming({"memory_budget": "--memory-budget", "ranges": "--ranges"})
    assert f"the {stored:,} stored counts of 64 positions held in one process" in message
    assert "--memory-budget GIB" in message and "--ranges K" in message
    monkeypatch.setattr(memory, "available_memory", lambda: 2 * need + 2**20)
    assert analyze(counts, config, show_progress=False).report()["geometry"]["rows"] == 64


def test_analyze_command_refuses_counts_it_cannot_hold_in_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    """``posstats count`` of the bundled fortunes (BERT WordPiece, sparse counts), then
    ``posstats analyze`` with less memory than their stored counts need: one line naming
    the stored counts (the counts file's own number) and the flags of the ranges, exit 2,
    no output folder; with the memory it runs."""
    import json as _json

    from posstats import memory

    counts_dir, out = tmp_path / "counts", tmp_path / "analysis"
    assert main(["count", "--input", "data/fortunes-sample.jsonl", "--text-column", "text", "--tokenizer",
                 "data/tokenizers/bert-base-uncased.tokenizer.json", "--positions", "64", "--out",
                 str(counts_dir)]) == 0
    counts = load_counts(counts_dir)
    assert counts.is_sparse
    stored = counts.matrix.nnz
    capsys.readouterr()
    monkeypatch.setattr(memory, "available_memory", lambda: memory.ANALYSIS_BYTES_PER_STORED_COUNT * stored // 2)
    line = one_line_error(capsys, main(["analyze", "--counts", str(counts_dir), "--out", str(out)]))
    assert f"for the {stored:,} stored counts of" in line and "--memory-budget GIB" in line and "--ranges K" in line
    assert not out.exists()
    monkeypatch.setattr(memory, "available_memory", lambda: None)
    assert main(["analyze", "--counts", str(counts_dir), "--dims", "2", "--encodings", "mds", "--out", str(out)]) == 0
    assert _json.loads((out / "report.json").read_text())["corpus"]["tokens_counted"] == counts.tokens
