"""Security and data integrity (issue #18), each reproduced through the real command:

* a ``--run-id`` that walks out of the run store (``../../victim``) is refused before any
  Ray work by ``count --ray`` and ``refresh``: a folder next to the store survives, nothing
  is written outside it; one validator (:mod:`posstats.ids`) guards every name that
  becomes a path;
* a tokenizer given with existing counts must be the one they were counted with
  (``analyze --tokenizer``, a recorded tokenizer file replaced since, ``refresh``);
* a store partial edited after it was written (one cell + 1000) is caught by its marker's
  totals and SHA-256 and counted again, so the result still equals a single-process count.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from posstats.corpus.shard_store import RunStore
from posstats.corpus.shards import Shard
from posstats.corpus.tokenizer import check_tokenizer, tokenizer_hash
from posstats.counting.counts import (
    CountSpec,
    PositionalCounts,
    count_sequences,
    fingerprint_of,
)
from posstats.counting.io import counts_file, load_counts, save_counts
from posstats.counting.reduce import CorruptPartialError, load_partial, sum_partials
from posstats.errors import InputError, PosstatsError
from posstats.ids import is_valid_id, join_inside, validate_id, validate_run_id
from posstats.storage.jsontext import write_json_atomic
from posstats.storage.publish import file_sha256

REPO = Path(__file__).resolve().parents[1]
TOKENIZERS = REPO / "data" / "tokenizers"
BERT = TOKENIZERS / "bert-base-uncased.tokenizer.json"
GPT2 = TOKENIZERS / "gpt2.tokenizer.json"
FORTUNES = REPO / "data" / "fortunes-sample.jsonl"
RULE = r"use 1-128 characters from A-Z a-z 0-9 \. _ - starting with a letter or digit, without '\.\.' or path separators"
V = 40


def posstats_cli(*argv) -> int:
    from posstats.cli import main

    return main([str(a) for a in argv])


def tree(root: Path, *, skip: tuple[str, ...] = ()) -> dict[str, bytes | None]:
    """Every path under ``root`` (relative) with its bytes (None for folders)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel.split("/")[0] in skip:
            continue
        out[rel] = None if p.is_dir() else p.read_bytes()
    return out


def write_ids(path: Path, seed: int, *, docs: int = 400, row_group_size: int = 200) -> Path:
    """A Parquet file of random token-id documents (two row groups: two shards)."""
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, V, size=rng.integers(1, 20)).tolist() for _ in range(docs)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"input_ids": pa.array(seqs, type=pa.list_(pa.int32()))}), path,
                   row_group_size=row_group_size)
    return path


def id_flags(*inputs) -> list:
    flags = []
    for i in inputs:
        flags += ["--input", i]
    return flags + ["--column", "input_ids", "--vocab-size", V, "--positions", 8, "--mode", "chunk"]


def shard(i: int) -> Shard:
    return Shard(
        shard_id=f"{i:064x}", path=f"f{i}.parquet", format="parquet", kind="row_group", index=0, count=1,
        first_row=0, first_line=0, start=0, stop=1, member="", rows=3, size_hint=100, input_fingerprint="",
    )


def random_counts(seed: int, *, sparse: bool = False) -> PositionalCounts:
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, 20, size=rng.integers(0, 10)).tolist() for _ in range(40)]
    c = count_sequences(seqs, positions=6, vocab_size=20, dense=not sparse)
    return PositionalCounts(c.spec, c.matrix, c.sequences, c.windows, c.tokens, fingerprint_of(f"s{seed}"))


def add_to_cell(folder: Path, delta: int, *, cell: tuple[int, int] = (0, 0), move: bool = False) -> None:
    """Edit a saved counts file in place the way a bit flip or a careless script would:
    the file's metadata (``tokens``) stays, the matrix changes. ``move`` takes ``delta``
    from the next cell as well, so the total stays the same."""
    dense = folder / "counts.safetensors"
    if dense.exists():
        from safetensors import safe_open
        from safetensors.numpy import save_file

        with safe_open(str(dense), framework="numpy") as f:
            meta = f.metadata()
            matrix = f.get_tensor("counts").copy()
        matrix[cell] += delta
        if move:
            matrix[cell[0], cell[1] + 1] -= delta
        save_file({"counts": matrix}, str(dense), metadata=meta)
        return
    sparse = folder / "counts.parquet"
    table = pq.read_table(sparse)
    counts = table.column("count").to_numpy().copy()
    counts[0] += delta
    if move:
        counts[1] -= delta
    table = table.set_column(2, "count", pa.array(counts)).replace_schema_metadata(table.schema.metadata)
    pq.write_table(table, sparse)


# ============================================================================ 1. run ids


@pytest.mark.parametrize("bad", ["", "..", "../x", "../../victim", "a/b", "/abs", "/tmp/pwn", "a\x00b", "x\n",
                                 "A" * 129, ".hidden", "-x", "a..b", "a\\b", "é"])
def test_validate_id_refuses_names_that_leave_their_folder(bad):
    with pytest.raises(PosstatsError, match=f"^invalid run id .*: {RULE}$"):
        validate_run_id(bad)
    with pytest.raises(PosstatsError, match=f"^invalid shard id .*: {RULE}$"):
        validate_id(bad, kind="shard id")
    assert not is_valid_id(bad)


def test_validate_id_messages_are_one_line_and_show_the_value():
    for bad, shown in (("a\x00b", r"'a\x00b'"), ("x\n", r"'x\n'"), ("../x", "'../x'")):
        with pytest.raises(PosstatsError) as info:
            validate_run_id(bad)
        assert "\n" not in str(info.value) and str(info.value).startswith(f"invalid run id {shown}: ")
    with pytest.raises(PosstatsError, match="^run id must be a string, got None$"):
        validate_run_id(None)


@pytest.mark.parametrize("good", ["a", "0", "run-" + "f" * 16, "v1.2_final", "A" * 128, f"{'a' * 64}"])
def test_validate_id_accepts_plain_names(good):
    assert validate_run_id(good) == good and validate_id(good, kind="shard id") == good and is_valid_id(good)


def test_one_validator_for_both_stores():
    import posstats.service.pipeline_store

    assert posstats.service.pipeline_store.validate_run_id is validate_run_id  # re-exported, not a copy


@pytest.mark.parametrize("bad", ["../../victim", "../x", "/abs", "a/b", ""])
def test_run_store_paths_refuse_bad_ids(tmp_path, bad):
    store = RunStore(tmp_path / "store")
    for method in (store.run_path, store.reduce_dir, store.new_result_dir, store.read_run):
        with pytest.raises(PosstatsError, match="^invalid run id "):
            method(bad)
    with pytest.raises(PosstatsError, match="^invalid run id "):
        store.write_run(bad, {"status": "running"})
    for method in (store.partial_dir, store.marker, store.is_done, store.remove_partial):
        with pytest.raises(PosstatsError, match="^invalid shard id "):
            method(bad)


def test_clean_temporary_never_deletes_outside_the_store(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    store = RunStore(tmp_path / "v2_store")
    with pytest.raises(PosstatsError, match="^invalid run id '../../victim': "):
        store.clean_temporary("../../victim")
    assert (victim / "keep.txt").read_text() == "precious"


def test_result_names_stay_valid_and_inside_results(tmp_path):
    store = RunStore(tmp_path)
    path = store.new_result_dir("A" * 128)
    assert path.parent == tmp_path / "results" and is_valid_id(path.name) and len(path.name) <= 128
    write_json_atomic(store.manifest_path, {"result": "results/../../victim"})
    with pytest.raises(PosstatsError, match="is not a folder results/<name> of the store"):
        store.result_file()
    write_json_atomic(store.manifest_path, {"result": "results/.."})
    with pytest.raises(PosstatsError, match="^invalid result name '..'"):
        store.result_file()


def test_job_options_refuse_bad_run_ids(tmp_path):
    from posstats.jobs.count import JobOptions

    with pytest.raises(PosstatsError, match="^invalid run id '../x': "):
        JobOptions(store=str(tmp_path), run_id="../x")
    assert JobOptions(store=str(tmp_path), run_id="ok-1").run_id == "ok-1"


@pytest.mark.ray
@pytest.mark.parametrize("kind", ["sibling", "tmp"])
def test_count_ray_with_a_traversing_run_id_fails_before_any_work(ray_session, tmp_path, capsys, kind):
    data = tmp_path / "data"
    write_ids(data / "a.parquet", 1)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    pwn = f"posstats-pwn-{uuid.uuid4().hex}"
    run_id = "../../victim" if kind == "sibling" else "../" * 24 + f"tmp/{pwn}"
    before = tree(tmp_path)
    try:
        rc = posstats_cli("count", "--ray", "--shard-size", 1e-6, *id_flags(data / "a.parquet"), "--store", tmp_path / "v2_store",
                          "--run-id", run_id, "--out", tmp_path / "out")
        err = capsys.readouterr().err
        assert rc == 2
        assert err.startswith(f"posstats: error: invalid run id {run_id!r}: use 1-128 characters")
        assert len(err.strip().splitlines()) == 1
        assert tree(tmp_path) == before  # victim intact; no store, no output, nothing else
        assert not list(Path("/tmp").glob(f"{pwn}*"))
    finally:
        for p in Path("/tmp").glob(f"{pwn}*"):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()


@pytest.mark.ray
def test_refresh_with_a_traversing_run_id_fails_before_any_work(ray_session, tmp_path, capsys):
    data = tmp_path / "data"
    write_ids(data / "a.parquet", 1)
    store = tmp_path / "v2_store"
    assert posstats_cli("count", "--ray", "--shard-size", 1e-6, *id_flags(data / "*.parquet"), "--store", store, "--run-id", "first",
                        "--out", tmp_path / "out") == 0
    write_ids(data / "b.parquet", 2)  # something to count and reduce
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    before = tree(tmp_path)
    capsys.readouterr()
    assert posstats_cli("refresh", "--store", store, "--run-id", "../../victim") == 2
    err = capsys.readouterr().err
    assert err.startswith("posstats: error: invalid run id '../../victim': use 1-128 characters")
    assert tree(tmp_path) == before  # the victim, the store and the output are untouched


# ============================================================================ 8. tokenizer


def test_check_tokenizer_unit():
    h_bert, h_gpt2 = tokenizer_hash(BERT), tokenizer_hash(GPT2)
    assert h_bert != h_gpt2
    assert check_tokenizer({"tokenizer_hash": h_bert}, BERT) == h_bert
    # counted from token ids: nothing recorded, nothing to compare: accepted
    assert check_tokenizer({}, BERT) is None and check_tokenizer({"tokenizer_hash": None}, GPT2) is None
    with pytest.raises(PosstatsError) as info:
        check_tokenizer({"tokenizer_hash": h_gpt2, "tokenizer": "gpt2.tokenizer.json"}, BERT, counts="the counts c/x")
    msg = str(info.value)
    assert msg == (f"{BERT}: tokenizer hash {h_bert} (bert-base-uncased.tokenizer.json) differs from hash {h_gpt2} "
                   f"(gpt2.tokenizer.json) recorded with the counts c/x; give the tokenizer.json the counts were made with")


def count_gpt2(root: Path) -> tuple[Path, Path]:
    """GPT-2 counts of 300 fortunes in ``root``, counted with a copy of the GPT-2 tokenizer.json."""
    corpus = root / "fortunes.jsonl"
    corpus.write_text("".join(FORTUNES.read_text().splitlines(keepends=True)[:300]))
    tok = root / "tok.json"
    shutil.copyfile(GPT2, tok)
    out = root / "counts"
    assert posstats_cli("count", "--input", corpus, "--text-column", "text", "--tokenizer", tok,
                        "--positions", 16, "--out", out) == 0
    return out, tok


@pytest.fixture(scope="module")
def gpt2_counts(tmp_path_factory):
    return count_gpt2(tmp_path_factory.mktemp("gpt2"))


def test_analyze_refuses_another_tokenizer_than_the_counts(gpt2_counts, tmp_path, capsys):
    counts, _ = gpt2_counts
    capsys.readouterr()
    for extra in (["--noise-floor"], []):
        rc = posstats_cli("analyze", "--counts", counts, "--tokenizer", BERT, *extra, "--dims", 2,
                          "--encodings", "mds", "--out", tmp_path / "a")
        err = capsys.readouterr().err
        assert rc == 2
        assert err == (f"posstats: error: {BERT}: tokenizer hash {tokenizer_hash(BERT)} (bert-base-uncased.tokenizer.json) "
                       f"differs from hash {tokenizer_hash(GPT2)} (tok.json) recorded with the counts "
                       f"{counts / counts_file(counts).name}; give the tokenizer.json the counts were made with\n")
        assert not (tmp_path / "a").exists()
    # the right tokenizer: the noise floor is computed
    assert posstats_cli("analyze", "--counts", counts, "--tokenizer", GPT2, "--noise-floor", "--dims", 2,
                        "--encodings", "mds", "--out", tmp_path / "ok") == 0
    assert json.loads((tmp_path / "ok" / "report.json").read_text())["noise"]


def test_analyze_refuses_a_recorded_tokenizer_file_that_changed(tmp_path, capsys, monkeypatch):
    counts, tok = count_gpt2(tmp_path)
    monkeypatch.chdir(tmp_path)  # config.json records the name tok.json: found here, in the working directory
    shutil.copyfile(BERT, tok)  # ... but it holds another tokenizer now
    capsys.readouterr()
    rc = posstats_cli("analyze", "--counts", counts, "--noise-floor", "--reread", "--dims", 2, "--encodings", "mds",
                      "--out", tmp_path / "a")
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"posstats: error: tok.json: tokenizer hash {tokenizer_hash(BERT)}")
    assert f"differs from hash {tokenizer_hash(GPT2)} (tok.json) recorded with the counts" in err


def test_token_id_counts_accept_a_tokenizer(tmp_path, capsys):
    write_ids(tmp_path / "ids.parquet", 3)
    assert posstats_cli("count", *id_flags(tmp_path / "ids.parquet"), "--out", tmp_path / "c") == 0
    assert "tokenizer_hash" not in load_counts(tmp_path / "c").metadata
    assert posstats_cli("analyze", "--counts", tmp_path / "c", "--tokenizer", BERT, "--dims", 2, "--encodings", "mds",
                        "--out", tmp_path / "a") == 0


def test_refresh_refuses_another_tokenizer(tmp_path, capsys):
    """A store of GPT-2 counts refreshed with the BERT tokenizer fails before any Ray work."""
    store = RunStore(tmp_path / "store")
    spec = CountSpec(16, 50257)
    store.bind({"spec": spec.to_metadata(), "format": "jsonl", "column": None, "text_column": "text",
                "tokenizer_hash": tokenizer_hash(GPT2), "metadata": {"tokenizer": "gpt2.tokenizer.json"}})
    write_json_atomic(store.manifest_path, {"inputs": [str(FORTUNES)], "dense_budget": 2**30})
    rc = posstats_cli("refresh", "--store", store.root, "--tokenizer", BERT)
    err = capsys.readouterr().err
    assert rc == 2
    assert err == (f"posstats: error: {BERT}: tokenizer hash {tokenizer_hash(BERT)} (bert-base-uncased.tokenizer.json) "
                   f"differs from hash {tokenizer_hash(GPT2)} (gpt2.tokenizer.json) recorded with run store {store.root}; "
                   f"give the tokenizer.json the counts were made with\n")


# ============================================================================ 9. partials


@pytest.mark.parametrize("sparse", [False, True])
def test_marker_records_the_checksum_of_the_counts_file(tmp_path, sparse):
    store = RunStore(tmp_path)
    c = random_counts(1, sparse=sparse)
    marker = store.write_partial(shard(1), c)
    file = store.partial_dir(shard(1).shard_id) / marker["counts_file"]
    assert marker["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest() == file_sha256(file)
    assert load_partial(store.partial_dir(shard(1).shard_id)).equals(c)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("old_marker", [False, True])
def test_a_partial_edited_after_writing_is_refused(tmp_path, sparse, old_marker):
    store = RunStore(tmp_path)
    spec = random_counts(0).spec
    good, bad = random_counts(1, sparse=sparse), random_counts(2, sparse=sparse)
    store.write_partial(shard(1), good)
    store.write_partial(shard(2), bad)
    folder = store.partial_dir(shard(2).shard_id)
    if old_marker:  # a store from before checksums: the totals are still checked
        marker = store.marker(shard(2).shard_id)
        del marker["sha256"]
        write_json_atomic(folder / "done.json", marker)
    add_to_cell(folder, 1000)
    items = [(str(store.partial_dir(shard(i).shard_id)), 1) for i in (1, 2)]
    with pytest.raises(CorruptPartialError) as info:
        sum_partials(items, spec, dense=True)
    msg = str(info.value)
    assert msg.startswith(f"{folder}: corrupt partial: its counts sum to {bad.tokens + 1000:,} tokens, "
                          f"its marker records {bad.tokens:,} (")
    assert msg.endswith(f"; delete {folder} and rerun to count that shard again") and "\n" not in msg
    assert ("sha256" in msg) != old_marker
    assert info.value.path == str(folder)
    # collected instead of raised: every corrupt one, the good one summed
    corrupt: list = []
    total = sum_partials(items, spec, dense=True, corrupt=corrupt)
    assert [e.path for e in corrupt] == [str(folder)] and total.tokens == good.tokens


def test_the_checksum_catches_an_edit_that_keeps_the_total(tmp_path):
    store = RunStore(tmp_path)
    c = random_counts(3)
    store.write_partial(shard(1), c)
    folder = store.partial_dir(shard(1).shard_id)
    cell = tuple(int(x) for x in np.argwhere(c.matrix[:, :-1] > 0)[0])
    add_to_cell(folder, 1, cell=(cell[0], cell[1]), move=True)  # one count moved to the next token
    assert int(load_counts(folder).matrix.sum()) == c.tokens
    with pytest.raises(CorruptPartialError, match=r"its counts sum to .* \(sha256 [0-9a-f]{16}\.\.\. of counts.safetensors"):
        load_partial(folder)


def test_unmarked_counts_load_without_checks(tmp_path):
    c = random_counts(4)
    save_counts(c, tmp_path / "plain")  # a reduce intermediate or a result: no done.json
    assert load_partial(tmp_path / "plain").equals(c)


def test_drop_corrupt_deletes_and_recounts_once(tmp_path, capsys):
    from posstats.jobs.count import _drop_corrupt

    store = RunStore(tmp_path)
    for i in (1, 2, 3):
        store.write_partial(shard(i), random_counts(i))
    by_id = {shard(i).shard_id: shard(i) for i in (1, 2)}
    removed = [shard(3).shard_id]
    corrupt = [{"path": str(store.partial_dir(shard(i).shard_id)), "error": f"e{i}; delete", "detail": f"d{i}"}
               for i in (1, 3)]
    assert _drop_corrupt(store, corrupt, by_id, removed, last=False) == [shard(1)]
    assert store.done_ids() == {shard(2).shard_id}
    err = capsys.readouterr().err
    assert "d1: deleted it, counting that shard again" in err and "d3: deleted it (its shard left the corpus)" in err
    with pytest.raises(PosstatsError, match=r"^e1; delete \(and 1 more\)$"):
        _drop_corrupt(store, corrupt, by_id, removed, last=True)  # still corrupt after the recount
    with pytest.raises(PosstatsError, match="^eX$"):
        _drop_corrupt(store, [{"path": str(tmp_path / "reduce" / "r" / "L0-00000"), "error": "eX", "detail": ""}],
                      by_id, removed, last=False)


def marker_of(store: Path, input_name: str) -> Path:
    """The marker of the first shard of an input file."""
    return sorted(m for m in store.glob("partials/*/done.json")
                  if Path(json.loads(m.read_text())["shard"]["path"]).name == input_name)[0]


@pytest.mark.ray
def test_count_ray_recounts_a_corrupt_partial(ray_session, tmp_path, capsys):
    data = tmp_path / "data"
    write_ids(data / "a.parquet", 1)
    write_ids(data / "b.parquet", 2)
    store = tmp_path / "store"
    assert posstats_cli("count", "--ray", "--shard-size", 1e-6, *id_flags(data / "*.parquet"), "--store", store, "--out", tmp_path / "r1") == 0
    marker = marker_of(store, "a.parquet")
    before = json.loads(marker.read_text())
    add_to_cell(marker.parent, 1000)
    write_ids(data / "c.parquet", 3)  # a new input: the next count reduces every partial again
    capsys.readouterr()
    assert posstats_cli("count", "--ray", "--shard-size", 1e-6, *id_flags(data / "*.parquet"), "--store", store, "--out", tmp_path / "r2") == 0
    err = capsys.readouterr().err
    assert (f"{marker.parent}: corrupt partial: its counts sum to {before['tokens'] + 1000:,} tokens, its marker records "
            f"{before['tokens']:,} (") in err
    assert "deleted it, counting that shard again" in err
    assert posstats_cli("count", *id_flags(data / "*.parquet"), "--out", tmp_path / "single") == 0
    got, ref = load_counts(tmp_path / "r2"), load_counts(tmp_path / "single")
    np.testing.assert_array_equal(got.to_dense().matrix, ref.to_dense().matrix)
    assert (got.tokens, got.sequences, got.fingerprint) == (ref.tokens, ref.sequences, ref.fingerprint)
    after = json.loads(marker.read_text())
    assert after["finished"] >= before["finished"] and after["sha256"] == file_sha256(marker.parent / after["counts_file"])
    info = json.loads((tmp_path / "r2" / "count.json").read_text())["ray"]
    assert info["shards_counted"] == 3  # c's two shards and the recounted one


@pytest.mark.ray
def test_refresh_drops_a_corrupt_partial_of_a_removed_input(ray_session, tmp_path, capsys):
    data = tmp_path / "data"
    write_ids(data / "a.parquet", 1)
    write_ids(data / "b.parquet", 2)
    store = tmp_path / "store"
    out = tmp_path / "out"
    assert posstats_cli("count", "--ray", "--shard-size", 1e-6, *id_flags(data / "*.parquet"), "--store", store, "--out", out) == 0
    add_to_cell(marker_of(store, "a.parquet").parent, 1000)
    (data / "a.parquet").unlink()  # the refresh would subtract a's partials from the total
    capsys.readouterr()
    assert posstats_cli("refresh", "--store", store) == 0
    captured = capsys.readouterr()
    assert "deleted it (its shard left the corpus), summing the remaining partials in full" in captured.err
    assert "(full; 0 counted now)" in captured.out.splitlines()[0]
    assert posstats_cli("count", *id_flags(data / "*.parquet"), "--out", tmp_path / "single") == 0
    got, ref = load_counts(out), load_counts(tmp_path / "single")
    np.testing.assert_array_equal(got.to_dense().matrix, ref.to_dense().matrix)
    assert (got.tokens, got.sequences, got.fingerprint) == (ref.tokens, ref.sequences, ref.fingerprint)


@pytest.mark.ray
def test_refresh_refuses_to_build_on_a_corrupt_previous_total(ray_session, tmp_path, capsys):
    """The reduced total an incremental refresh adds to is checked like a partial."""
    data = tmp_path / "data"
    write_ids(data / "a.parquet", 1)
    store = tmp_path / "store"
    assert posstats_cli("count", "--ray", "--shard-size", 1e-6, *id_flags(data / "*.parquet"), "--store", store, "--out", tmp_path / "r1") == 0
    result = store / json.loads((store / "manifest.json").read_text())["result"]
    assert json.loads((result / "done.json").read_text())["sha256"]
    add_to_cell(result, 1000)
    write_ids(data / "b.parquet", 2)  # a new input: the refresh would add to the old total
    capsys.readouterr()
    assert posstats_cli("refresh", "--store", store) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) >= 1 and err[-1].startswith("posstats: error: ") and "corrupt" in err[-1], err


@pytest.mark.parametrize("old_marker", [False, True])
def test_check_partial_trusts_only_a_matching_checksum(tmp_path, old_marker):
    """check_partial (the Ray reduce's check) passes a partial whose checksum matches
    without loading it, and refuses an edited one with load_partial's message."""
    from posstats.counting.reduce import check_partial

    store = RunStore(tmp_path)
    c = random_counts(5)
    store.write_partial(shard(1), c)
    folder = store.partial_dir(shard(1).shard_id)
    if old_marker:
        marker = store.marker(shard(1).shard_id)
        del marker["sha256"]
        write_json_atomic(folder / "done.json", marker)
    check_partial(folder)  # intact: passes
    add_to_cell(folder, 7)
    with pytest.raises(CorruptPartialError, match=f"its counts sum to {c.tokens + 7:,} tokens, its marker records {c.tokens:,}"):
        check_partial(folder)


# ============================================================================ untrusted keys that become paths


@pytest.mark.parametrize("key", ["data/p/../../../../x.pth", "../x", "a/./b", "a//b", "a/\x00/b", "..", "", "a/.."])
def test_join_inside_refuses_keys_that_could_climb_out(tmp_path, key):
    with pytest.raises(PosstatsError, match="is refused: its part") as info:
        join_inside(tmp_path / "base", key)
    assert "\n" not in str(info.value)


def test_join_inside_keeps_good_keys_below_the_base_and_follows_links(tmp_path):
    base = tmp_path / "base"
    assert join_inside(base, "/bucket/data/a.jsonl") == base / "bucket" / "data" / "a.jsonl"
    assert join_inside(base, "bucket/data/*.jsonl") == base / "bucket" / "data" / "*.jsonl"  # a glob pattern too
    (base / "bucket").mkdir(parents=True)
    (base / "bucket" / "out").symlink_to(tmp_path)  # a link planted inside base
    with pytest.raises(PosstatsError, match=r"leads outside .* \(through a symbolic link\)"):
        join_inside(base, "bucket/out/victim.txt")
    with pytest.raises(PosstatsError, match="must be a string"):
        join_inside(base, 5)


# ============================================================================ tampered folders: one line, exit 2


def _tampered_counts(tmp_path: Path, data_dir: Path) -> Path:
    """A real run folder (the bundled sample, 16 positions) to tamper with."""
    from posstats.cli import main

    run = tmp_path / "run"
    assert main(["run", "--input", str(data_dir / "fortunes-sample.jsonl"), "--text-column", "text", "--tokenizer",
                 str(data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json"), "--positions", "16", "--dims", "2",
                 "--encodings", "mds,sinusoidal", "--out", str(run), "-q"]) == 0
    return run


def _rewrite_counts(folder: Path, change) -> None:
    from safetensors import safe_open
    from safetensors.numpy import save_file

    path = folder / "counts.csr.safetensors"
    with safe_open(str(path), "numpy") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    tensors, meta = change(tensors, meta)
    real = path.resolve()
    real.unlink()
    save_file(tensors, str(real), meta)


def _swap_indptr(t, m):
    ip = t["indptr"].copy()
    ip[3], ip[4] = ip[4], ip[3]
    return {**t, "indptr": ip}, m


def _repeat_an_id(t, m):
    ind = t["indices"].copy()
    ind[1] = ind[0]
    return {**t, "indices": ind}, m


TAMPERINGS = [
    (_swap_indptr, "indptr must be a non-decreasing sequence"),
    (_repeat_an_id, "a row repeats a token id"),
    (lambda t, m: (t, {**m, "tokens": str(int(m["tokens"]) + 7)}), "header says .* tokens but its counts add up to"),
    (lambda t, m: (t, {**m, "sequences": "many"}), "header field 'sequences' is 'many'"),
    (lambda t, m: (t, {**m, "positions": "40"}), "damaged (sparse )?counts"),
]


@pytest.mark.parametrize(("change", "why"), TAMPERINGS)
def test_tampered_counts_are_refused_by_every_reader(tmp_path, data_dir, capsys, change, why):
    from posstats.cli import main

    run = _tampered_counts(tmp_path, data_dir)
    _rewrite_counts(run, change)
    capsys.readouterr()
    for argv in (["analyze", "--counts", str(run), "--dims", "2", "--encodings", "mds", "--out", str(tmp_path / "a")],
                 ["diff", str(run), str(run), "--out", str(tmp_path / "d")],
                 ["export", str(run), "--dim", "4", "--out", str(tmp_path / "e.safetensors")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("posstats: error: ") and err.count("\n") == 1, err
        assert re.search(why, err), err


@pytest.mark.parametrize(("report", "why"), [
    ('{"positions": 5}', "section 'positions' must be an object"),
    ('[1, 2]', "expected a JSON object"),
    ('{"encodings": [{"dim": 2}]}', r"encodings\[0\] must be an object with a string name"),
    ('{"positions": {"occupancy": ["a"]}}', "positions.occupancy must be a list of numbers"),
    ('{"spectrum": {"eigenvalues": 3}}', "spectrum.eigenvalues must be a list of numbers"),
    ('{"a":' * 50_000 + "1" + "}" * 50_000, "nested too deeply"),
])
def test_a_damaged_report_is_refused_in_one_line(tmp_path, data_dir, capsys, report, why):
    from posstats.cli import main

    run = _tampered_counts(tmp_path, data_dir)
    target = (run / "report.json").resolve()
    target.unlink()
    target.write_text(report)
    capsys.readouterr()
    for argv in (["report", str(run)], ["export", str(run), "--dim", "4", "--out", str(tmp_path / "e.safetensors")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and re.search(why, err), err


def test_a_damaged_latest_pointer_is_shown_not_a_traceback(tmp_path, capsys):
    from posstats.cli import main

    store = tmp_path / "store"
    (store / "runs" / "r1" / "config").mkdir(parents=True)
    (store / "latest").write_text('{"run_id": "r1"}')  # no finish time
    assert main(["status", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert "latest: DAMAGED" in out and "does not name a run id and its finish time" in out


def test_a_wordpiece_tokenizer_without_its_unknown_token_is_refused_at_load(tmp_path, data_dir):
    from posstats.corpus.tokenizer import load_tokenizer

    tok = json.loads((data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json").read_text())
    tok["model"]["vocab"].pop("[UNK]")
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["content"] != "[UNK]"]
    (tmp_path / "t.json").write_text(json.dumps(tok))
    with pytest.raises(InputError, match=r"t.json: its WordPiece unknown token '\[UNK\]' is not in its vocabulary"):
        load_tokenizer(tmp_path / "t.json")
