"""posstats.corpus.shards: planning (kinds, row numbering, content-derived ids), reading one shard
exactly as the single-process reader reads that part of the file, and exactness: the
partial counts of any shard order add up to count_corpus, counts and fingerprint."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posstats.corpus.readers import read_token_batches
from posstats.corpus.shards import (
    DEFAULT_SHARD_BYTES,
    MIN_AUTO_SHARD_BYTES,
    Shard,
    auto_shard_bytes,
    plan_shards,
    read_shard,
)
from posstats.corpus.count_step import count_shard
from posstats.corpus.source import CorpusSource, file_fingerprint
from posstats.corpus.count_step import count_corpus
from posstats.corpus.tokenizer import encode_texts, load_tokenizer, special_token_ids
from posstats.counting.counts import CountSpec, combine_fingerprints
from posstats.counting.io import load_counts, save_counts
from posstats.counting.pack import stitch
from posstats.counting.ranges import assemble_ranges, row_ranges, sum_row_range
from posstats.errors import InputError

DATA = Path(__file__).resolve().parent.parent / "data"
BERT = DATA / "tokenizers" / "bert-base-uncased.tokenizer.json"
FORTUNES = DATA / "fortunes-sample.jsonl"
HAMLET = DATA / "shakespeare-sample.txt"
V = 30522


@pytest.fixture(scope="module")
def bert():
    return load_tokenizer(BERT)


@pytest.fixture(scope="module")
def fortune_ids(bert):
    """Token ids of the 3000 bundled fortunes (BERT, no special tokens), a list of arrays."""
    texts = [json.loads(line)["text"] for line in FORTUNES.read_text(encoding="utf-8").splitlines() if line.strip()]
    b = encode_texts(bert, texts)
    return [b.values[b.offsets[i] : b.offsets[i + 1]] for i in range(b.rows)]


def write_parquet(path: Path, seqs, *, row_group_size: int) -> Path:
    arr = pa.array([np.asarray(s).tolist() for s in seqs], type=pa.list_(pa.int32()))
    pq.write_table(pa.table({"ids": arr, "n": pa.array([len(s) for s in seqs])}), path, row_group_size=row_group_size)
    return path


def write_jsonl(path: Path, seqs, *, crlf: bool = False) -> Path:
    end = "\r\n" if crlf else "\n"
    with open(path, "w", encoding="utf-8", newline="") as f:
        for i, s in enumerate(seqs):
            if i % 97 == 0:
                f.write("   " + end)  # blank lines are not rows
            f.write(json.dumps({"ids": np.asarray(s).tolist(), "k": i}) + end)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, fortune_ids):
    """Three Parquet files (row groups of 250 rows) and three JSONL files of the fortunes."""
    root = tmp_path_factory.mktemp("shards")
    for f in range(3):
        part = fortune_ids[f * 1000 : (f + 1) * 1000]
        write_parquet(root / f"p{f}.parquet", part, row_group_size=250)
        write_jsonl(root / f"j{f}.jsonl", part, crlf=f == 1)
    return root


def spec_for(mode: str) -> CountSpec:
    return CountSpec(48, V, mode, (0, 100, 101, 102, 103), 102 if mode == "pack" else None)


def summed(shards, source, spec, *, seed: int | None = None, dense=None):
    """The shards' counts summed in a shuffled order; pack-stream pieces are saved and
    stitched into place as the Ray reduce does (posstats.counting.pack)."""
    order = list(shards)
    if seed is not None:
        random.Random(seed).shuffle(order)
    parts = [count_shard(s, source, spec, dense=dense) for s in order]
    if spec.mode == "pack" and any(not s.is_whole_input for s in order):
        return stitched(parts, spec)
    return functools.reduce(lambda a, b: a + b, parts)


def stitched(parts, spec):
    """The range reduce of saved parts with pack pieces placed (one range per 7 positions)."""
    with tempfile.TemporaryDirectory() as tmp:
        items = []
        for i, part in enumerate(parts):
            save_counts(part, Path(tmp) / f"p{i}")
            items.append((str(Path(tmp) / f"p{i}"), 1))
        placed, windows, tokens = stitch(items, spec)
        ranges = [sum_row_range(placed, spec, a, b, Path(tmp) / f"r{a}.safetensors")
                  for a, b in row_ranges(spec.positions, -(-spec.positions // 7))]
        assemble_ranges(ranges, placed, spec, Path(tmp) / "total", adjust=(windows, tokens))
        return load_counts(Path(tmp) / "total")


def assert_same(got, ref):
    assert got.equals(ref)
    np.testing.assert_array_equal(got.to_dense().matrix, ref.to_dense().matrix)
    assert (got.sequences, got.windows, got.tokens) == (ref.sequences, ref.windows, ref.tokens)
    assert got.fingerprint == ref.fingerprint


# ----------------------------------------------------------------------------- planning

ONE_ROW_GROUP = 1  # shard_bytes that joins no row groups: one shard per Parquet row group


def test_parquet_row_groups_are_shards(corpus):
    source = CorpusSource(inputs=(str(corpus / "p*.parquet"),), column="ids")
    shards = plan_shards(source, spec_for("truncate"), shard_bytes=ONE_ROW_GROUP)
    assert [s.kind for s in shards] == ["row_group"] * 12
    assert [(s.path, s.start, s.first_row, s.rows) for s in shards[:4]] == [
        (str(corpus / "p0.parquet"), g, 250 * g, 250) for g in range(4)
    ]
    assert len({s.shard_id for s in shards}) == 12
    assert [s.index for s in shards] == list(range(4)) * 3
    assert all(s.input_fingerprint == file_fingerprint(s.path) for s in shards)
    # exactly one shard per input carries the input's fingerprint
    assert functools.reduce(combine_fingerprints, [s.fingerprint for s in shards]) == functools.reduce(
        combine_fingerprints, [file_fingerprint(str(corpus / f"p{f}.parquet")) for f in range(3)]
    )
    assert Shard.from_dict(json.loads(json.dumps(shards[5].to_dict()))) == shards[5]


def test_row_groups_join_up_to_shard_bytes_and_count_as_one(tmp_path, fortune_ids):
    path = write_parquet(tmp_path / "a.parquet", fortune_ids[:1000], row_group_size=200)  # 5 row groups
    sizes = [pq.ParquetFile(path).metadata.row_group(g).total_byte_size for g in range(5)]
    source = CorpusSource(inputs=(str(path),), column="ids")
    for mode in ("chunk", "pack"):  # pack: joined pieces are stitched like single row groups
        spec = spec_for(mode)
        ref = count_corpus(source, spec, show_progress=False)
        (whole,) = plan_shards(source, spec, shard_bytes=sum(sizes))
        assert (whole.kind, whole.start, whole.stop, whole.rows, whole.first_row) == ("row_group", 0, 5, 1000, 0)
        assert whole.is_whole_input and "row groups 0-4 (1/1" in whole.label()
        assert_same(count_shard(whole, source, spec), ref)
        cut = plan_shards(source, spec, shard_bytes=sum(sizes[:3]))
        assert (cut[0].start, cut[0].stop, cut[0].rows, cut[0].size_hint) == (0, 3, 600, sum(sizes[:3]))
        assert [(a.stop, a.first_row + a.rows) for a in cut[:-1]] == [(b.start, b.first_row) for b in cut[1:]]
        assert cut[-1].stop == 5 and len({s.shard_id for s in cut}) == len(cut)
        assert_same(summed(cut, source, spec, seed=1), ref)
    # a bad row group inside a joined shard is named, with the shard
    corrupt_row_group(path, 3)
    (whole,) = plan_shards(source, spec_for("chunk"), shard_bytes=sum(sizes))
    with pytest.raises(InputError) as info:
        count_shard(whole, source, spec_for("chunk"))
    assert str(info.value).startswith(f"{path}: row group 3: not a valid Parquet file (")
    assert f"[shard: {path} row groups 0-4 (1/1, shard {whole.shard_id[:12]})]" in str(info.value)


def test_auto_shard_bytes_gives_each_worker_two_to_four_shards():
    mib = 2**20
    for total, workers in ((800 * mib, 2), (2**30, 16), (3 * 2**30, 7)):
        target = auto_shard_bytes(total, workers)
        assert target & (target - 1) == 0  # a power of two: stable while the corpus grows a little
        assert 2 * workers <= total / target < 4 * workers
    assert auto_shard_bytes(10 * mib, 2) == MIN_AUTO_SHARD_BYTES  # never tiny shards
    assert auto_shard_bytes(10**12, 2) == DEFAULT_SHARD_BYTES


def test_ids_are_stable_and_change_with_the_file(tmp_path, fortune_ids):
    for f in range(2):
        write_parquet(tmp_path / f"p{f}.parquet", fortune_ids[:600], row_group_size=200)
    source = CorpusSource(inputs=(str(tmp_path / "*.parquet"),), column="ids")
    spec = spec_for("truncate")
    before = [s.shard_id for s in plan_shards(source, spec, shard_bytes=ONE_ROW_GROUP)]
    assert [s.shard_id for s in plan_shards(source, spec, shard_bytes=ONE_ROW_GROUP)] == before
    st = os.stat(tmp_path / "p1.parquet")
    os.utime(tmp_path / "p1.parquet", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    after = [s.shard_id for s in plan_shards(source, spec, shard_bytes=ONE_ROW_GROUP)]
    assert after[:3] == before[:3]  # p0 untouched
    assert not set(after[3:]) & set(before)  # every shard of p1 has a new id
    # the same bytes and mtime under another name are other shards
    os.rename(tmp_path / "p0.parquet", tmp_path / "q0.parquet")
    renamed = [s.shard_id for s in plan_shards(source, spec, shard_bytes=ONE_ROW_GROUP)]
    assert not set(renamed) & set(before[:3])


def test_pack_mode_cuts_inputs_into_pieces_that_carry_their_stream(corpus):
    source = CorpusSource(inputs=(str(corpus / "p*.parquet"), str(corpus / "j*.jsonl")), column="ids")
    pack = plan_shards(source, spec_for("pack"), shard_bytes=10_000)
    assert [s.shard_id for s in pack] != [] and {s.kind for s in pack} >= {"row_group"}
    assert [(s.path, s.kind, s.start, s.stop) for s in pack] == \
        [(s.path, s.kind, s.start, s.stop) for s in plan_shards(source, spec_for("chunk"), shard_bytes=10_000)]
    parquet = next(s.path for s in pack if s.kind == "row_group")
    first, second = (s for s in pack if s.path == parquet and s.index in (0, 1))
    a, b = count_shard(first, source, spec_for("pack")), count_shard(second, source, spec_for("pack"))
    assert (a.metadata["pack_index"], b.metadata["pack_index"]) == ("0", "1")
    assert a.metadata["pack_leading_separator"] == "0" and b.metadata["pack_leading_separator"] == "1"
    assert a.windows == b.windows == 0  # a stream's windows are the stitching's
    assert int(b.matrix[0, 102]) >= 1  # the assumed separator before its first document


def test_line_ranges_cut_at_lines_and_number_rows_like_the_reader(corpus):
    """Byte ranges of a CRLF JSONL file with blank lines: each range's rows and row numbers
    are exactly the reader's, in order."""
    path = corpus / "j1.jsonl"
    source = CorpusSource(inputs=(str(path),), column="ids", batch_size=64)
    shards = plan_shards(source, spec_for("chunk"), shard_bytes=7_000)
    assert len(shards) > 10 and all(s.kind == "byte_range" for s in shards)
    assert shards[0].start == 0 and shards[-1].stop == path.stat().st_size
    assert all(a.stop == b.start for a, b in zip(shards, shards[1:]))
    raw = path.read_bytes()
    assert all(raw[s.start - 1 : s.start] == b"\n" for s in shards[1:])

    def rows(batches):
        out = {}
        for b in batches:
            for r in range(b.rows):
                out[b.first_row + r] = b.values[b.offsets[r] : b.offsets[r + 1]].tolist()
        return out

    expected = rows(read_token_batches([str(path)], column="ids", batch_size=64))
    got = {}
    for s in shards:
        part = rows(read_shard(s, source))
        assert min(part) == s.first_row
        assert all(b.source == str(path) for b in read_shard(s, source))
        got.update(part)
    assert got == expected


def test_text_line_ranges(tmp_path, bert):
    """A text file with blank and whitespace-only lines (also Unicode whitespace) and a lone CR."""
    lines = HAMLET.read_text(encoding="utf-8").splitlines()
    body = []
    for i, line in enumerate(lines):
        body.append(line)
        if i % 50 == 0:
            body.append("\u00a0 \t")  # blank for str.strip(): not a row
        if i % 120 == 0:
            body.append("\u3000")
    text = "\n".join(body[:600]) + "\rafter a lone CR\n" + "\n".join(body[600:])
    path = tmp_path / "hamlet.txt"
    path.write_bytes(text.encode("utf-8"))
    source = CorpusSource(inputs=(str(path),), tokenizer=str(BERT))
    spec = CountSpec(32, V, "chunk", tuple(special_token_ids(bert)))
    shards = plan_shards(source, spec, shard_bytes=9_000)
    assert len(shards) > 5
    ref = count_corpus(source, spec, show_progress=False)
    assert_same(summed(shards, source, spec, seed=3), ref)
    firsts = [s.first_row for s in shards]
    starts = [next(iter(read_shard(s, source))).first_row for s in shards]
    assert firsts == starts


@pytest.mark.parametrize("mode", ["truncate", "chunk", "pack"])
@pytest.mark.parametrize("kind", ["parquet", "jsonl", "mixed"])
def test_shards_add_up_to_count_corpus(corpus, mode, kind):
    patterns = {
        "parquet": [str(corpus / "p*.parquet")],
        "jsonl": [str(corpus / "j*.jsonl")],
        "mixed": [str(corpus / "p1.parquet"), str(corpus / "j*.jsonl")],
    }[kind]
    source = CorpusSource(inputs=tuple(patterns), column="ids")
    spec = spec_for(mode)
    ref = count_corpus(source, spec, show_progress=False)
    shards = plan_shards(source, spec, shard_bytes=20_000)
    assert len(shards) > len(source.files())  # every mode cuts the inputs (pack: into stream pieces)
    assert_same(summed(shards, source, spec, seed=1), ref)
    assert_same(summed(shards, source, spec, seed=2, dense=False), ref)
    # One reused dense buffer (as a counting actor does): each partial saved before the next.
    buf = np.full((spec.positions, spec.vocab_size), -5, dtype=np.int64)
    parts = []
    for s in shards:
        part = count_shard(s, source, spec, dense=True, out=buf)
        assert part.matrix is buf
        parts.append(dataclasses.replace(part, matrix=part.to_sparse().matrix))
    total = stitched(parts, spec) if mode == "pack" else functools.reduce(lambda a, b: a + b, parts)
    assert_same(total, ref)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """Hamlet's speeches as a `save_to_disk` dataset in 3 Arrow files, plus a DatasetDict."""
    import datasets

    root = tmp_path_factory.mktemp("hf")
    lines = [x for x in HAMLET.read_text(encoding="utf-8").splitlines() if x.strip()]
    ds = datasets.Dataset.from_dict({"text": lines, "i": list(range(len(lines)))})
    ds.save_to_disk(str(root / "saved"), num_shards=3)
    datasets.DatasetDict({"train": ds}).save_to_disk(str(root / "dict"), num_shards={"train": 2})
    return root


@pytest.mark.parametrize("name, files", [("saved", 3), ("dict", 2)])
def test_hf_saved_dataset_shards_per_arrow_file(hf_folder, bert, name, files):
    source = CorpusSource(inputs=(str(hf_folder / name),), text_column="text", tokenizer=str(BERT))
    spec = CountSpec(40, V, "chunk", tuple(special_token_ids(bert)))
    shards = plan_shards(source, spec)
    assert [s.kind for s in shards] == ["hf_file"] * files
    assert shards[0].first_row == 0 and shards[1].first_row == shards[0].rows
    ref = count_corpus(source, spec, show_progress=False)
    assert_same(summed(shards, source, spec, seed=0), ref)
    pack = CountSpec(40, V, "pack", tuple(special_token_ids(bert)), 102)
    pieces = plan_shards(source, pack)
    assert [s.kind for s in pieces] == ["hf_file"] * files
    assert_same(summed(pieces, source, pack, seed=3), count_corpus(source, pack, show_progress=False))


def test_empty_inputs_still_carry_their_fingerprint(tmp_path, fortune_ids):
    write_parquet(tmp_path / "a.parquet", fortune_ids[:300], row_group_size=100)
    pq.write_table(pa.table({"ids": pa.array([], type=pa.list_(pa.int32()))}), tmp_path / "b.parquet")
    (tmp_path / "c.jsonl").write_text("")
    source = CorpusSource(inputs=(str(tmp_path / "*.parquet"), str(tmp_path / "c.jsonl")), column="ids")
    spec = spec_for("chunk")
    shards = plan_shards(source, spec)
    assert {s.path for s in shards} == {str(tmp_path / n) for n in ("a.parquet", "b.parquet", "c.jsonl")}
    assert_same(summed(shards, source, spec), count_corpus(source, spec, show_progress=False))


@settings(max_examples=25, deadline=None)
@given(order=st.permutations(list(range(12))), split=st.integers(1, 11))
def test_partials_are_order_and_grouping_free(corpus_partials, order, split):
    parts, ref = corpus_partials
    shuffled = [parts[i] for i in order]
    left = functools.reduce(lambda a, b: a + b, shuffled[:split])
    right = functools.reduce(lambda a, b: a + b, shuffled[split:])
    assert_same(left + right, ref)
    back = (left + right) - right
    assert back.equals(left)
    # XOR cancels to zeros, and "" is the empty XOR: the same value
    assert int(back.fingerprint or "0", 16) == int(left.fingerprint or "0", 16)


@pytest.fixture(scope="module")
def corpus_partials(corpus):
    source = CorpusSource(inputs=(str(corpus / "p*.parquet"),), column="ids")
    spec = spec_for("chunk")
    parts = [count_shard(s, source, spec) for s in plan_shards(source, spec, shard_bytes=ONE_ROW_GROUP)]
    return parts, count_corpus(source, spec, show_progress=False)


# ----------------------------------------------------------------------------- bad input


def corrupt_row_group(path: Path, group: int) -> None:
    col = pq.ParquetFile(path).metadata.row_group(group).column(0)
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(b"\xff" * 64)


def test_corrupt_row_group_names_file_and_row_group(tmp_path, fortune_ids):
    path = write_parquet(tmp_path / "a.parquet", fortune_ids[:800], row_group_size=200)
    corrupt_row_group(path, 2)
    source = CorpusSource(inputs=(str(path),), column="ids")
    shards = plan_shards(source, spec_for("chunk"), shard_bytes=ONE_ROW_GROUP)
    for s in shards[:2] + shards[3:]:
        count_shard(s, source, spec_for("chunk"))
    with pytest.raises(InputError) as info:
        count_shard(shards[2], source, spec_for("chunk"))
    assert str(info.value).startswith(f"{path}: row group 2: not a valid Parquet file (")
    assert f"[shard: {path} row group 2 (3/4, shard {shards[2].shard_id[:12]})]" in str(info.value)


def test_truncated_parquet_is_one_shard_naming_the_file(tmp_path, fortune_ids):
    path = write_parquet(tmp_path / "a.parquet", fortune_ids[:800], row_group_size=200)
    path.write_bytes(path.read_bytes()[:5000])
    source = CorpusSource(inputs=(str(path),), column="ids")
    (shard,) = plan_shards(source, spec_for("chunk"))
    assert shard.kind == "file"
    with pytest.raises(InputError, match=rf"^{path}: not a valid Parquet file \("):
        count_shard(shard, source, spec_for("chunk"))


def test_token_id_out_of_range_names_shard_and_row(tmp_path, fortune_ids):
    seqs = [s.copy() for s in fortune_ids[:600]]
    seqs[437][3] = V + 7
    path = write_parquet(tmp_path / "a.parquet", seqs, row_group_size=200)
    source = CorpusSource(inputs=(str(path),), column="ids")
    spec = spec_for("chunk")
    with pytest.raises(InputError) as single:
        count_corpus(source, spec, show_progress=False)
    shards = plan_shards(source, spec, shard_bytes=ONE_ROW_GROUP)
    with pytest.raises(InputError) as sharded:
        count_shard(shards[2], source, spec)
    assert str(single.value).startswith(f"{path}: row 437: ")
    assert str(sharded.value) == f"{single.value} [shard: {shards[2].label()}]"


def test_bad_jsonl_line_in_a_late_range_has_the_readers_line_number(tmp_path, fortune_ids):
    path = write_jsonl(tmp_path / "a.jsonl", fortune_ids[:900])
    lines = path.read_text().splitlines(keepends=True)
    lines[801] = '{"ids": [1, 2, oops]}\n'
    path.write_text("".join(lines))
    source = CorpusSource(inputs=(str(path),), column="ids")
    spec = spec_for("chunk")
    with pytest.raises(InputError) as single:
        count_corpus(source, spec, show_progress=False)
    assert "line 802: not valid JSON" in str(single.value)
    shards = plan_shards(source, spec, shard_bytes=5_000)
    errors = []
    for s in shards:
        try:
            count_shard(s, source, spec)
        except InputError as exc:
            errors.append((s, str(exc)))
    assert len(errors) == 1
    shard, message = errors[0]
    assert shard.index > 0 and message == f"{single.value} [shard: {shard.label()}]"


def test_an_input_changed_after_planning_is_refused(tmp_path, fortune_ids):
    path = write_parquet(tmp_path / "a.parquet", fortune_ids[:400], row_group_size=200)
    source = CorpusSource(inputs=(str(path),), column="ids")
    shards = plan_shards(source, spec_for("chunk"), shard_bytes=ONE_ROW_GROUP)
    write_parquet(path, fortune_ids[400:800], row_group_size=200)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(InputError, match=rf"^{path}: changed since the shards were planned"):
        count_shard(shards[1], source, spec_for("chunk"))
    path.unlink()
    with pytest.raises(InputError, match=rf"^{path}: cannot read"):
        count_shard(shards[0], source, spec_for("chunk"))


# ----------------------------------------------------------------------------- documents of text files


def _markdown(path: Path, paragraphs: int) -> Path:
    rng = random.Random(3)
    words = "the of and a to in is you that it he was for on are as with his they".split()
    text = "\n\n".join("\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 9)))
                                for _ in range(rng.randint(1, 4))) for _ in range(paragraphs))
    path.write_text(text + "\n")
    return path


def test_document_units_by_suffix_and_by_flag():
    from posstats.corpus.readers import document_note, document_unit
    from posstats.corpus.readers.text import _documents

    assert document_unit("a.md") == "paragraph" and document_unit("a.md.gz") == "paragraph"
    assert document_unit("a.txt") == "line" and document_unit("a.txt", "file") == "file"
    with pytest.raises(InputError, match="document_per must be one of line, paragraph, file"):
        document_unit("a.txt", "page")
    lines = list(enumerate(["a", "b", "", "", "c", "  ", "d", "e"], 1))
    assert list(_documents(lines, "line")) == ["a", "b", "c", "d", "e"]
    assert list(_documents(lines, "paragraph")) == ["a\nb", "c", "d\ne"]
    assert list(_documents(lines, "file")) == ["a\nb\nc\nd\ne"]
    assert document_note(["x/*.parquet"]) is None
    assert "one document per paragraph (by suffix" in document_note(["notes/*.md"])
    assert "one document per file (--document-per" in document_note(["a.txt"], document_per="file")


def test_paragraph_documents_are_never_cut_by_a_shard(tmp_path):
    """A Markdown file larger than the shard size: read one document per paragraph it is one
    shard (a paragraph may span any cut), counted exactly as the whole-file reader counts
    it; per line it is cut into line ranges, whose identities differ from the paragraph
    shard's (a store never reuses a partial counted under another unit)."""
    path = _markdown(tmp_path / "notes.md", 400)
    tok = load_tokenizer(DATA / "tokenizers" / "gpt2.tokenizer.json")
    spec = CountSpec(32, 50257, "truncate", (), None)
    by_paragraph = CorpusSource(inputs=(str(path),), tokenizer=str(DATA / "tokenizers" / "gpt2.tokenizer.json"))
    shards = plan_shards(by_paragraph, spec, shard_bytes=2_000)
    assert len(shards) == 1 and shards[0].kind == "file"
    whole = count_corpus(by_paragraph, spec, show_progress=False)
    assert whole.sequences == 400
    sharded = count_shard(shards[0], by_paragraph, spec, tokenizer=tok)
    assert (sharded.to_sparse().matrix != whole.to_sparse().matrix).nnz == 0
    by_line = dataclasses.replace(by_paragraph, document_per="line")
    line_shards = plan_shards(by_line, spec, shard_bytes=2_000)
    assert len(line_shards) > 1 and all(s.kind == "byte_range" for s in line_shards)
    assert not {s.shard_id for s in line_shards} & {shards[0].shard_id}
    assert count_corpus(by_line, spec, show_progress=False).sequences > 400


def test_one_rule_sizes_shards():
    """shard_bytes_for (issue #29: one shard planner): the requested size wins, else the
    store's recorded one, else the automatic size for the workers, asked only then."""
    from posstats.corpus.shards import auto_shard_bytes, corpus_bytes, shard_bytes_for
    from posstats.corpus.source import CorpusSource

    source = CorpusSource(inputs=("data/fortunes-sample.jsonl",), column=None, text_column="text",
                          tokenizer="data/tokenizers/gpt2.tokenizer.json")
    asked = []

    def workers() -> int:
        asked.append(1)
        return 4

    assert shard_bytes_for(source, requested=5 * 2**20, recorded=2**20, workers=workers) == 5 * 2**20
    assert shard_bytes_for(source, requested=None, recorded=2**20, workers=workers) == 2**20
    assert asked == []
    assert shard_bytes_for(source, requested=None, recorded=None, workers=workers) == auto_shard_bytes(
        corpus_bytes(source), 4)
    assert asked == [1]
