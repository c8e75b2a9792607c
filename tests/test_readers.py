"""posstats.corpus.readers: every format on small generated files with known ids, the shipped real
corpora with both tokenizers, and every bad-input message (file + row/line + value)."""

from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posstats.corpus.readers import (
    FORMATS,
    guess_format,
    read_token_batches,
    resolve_inputs,
    validate_ids,
)
from posstats.corpus.tokenizer import (
    encode_texts,
    load_tokenizer,
    special_token_ids,
    vocab_size,
)
from posstats.counting.tokens import TokenBatch
from posstats.errors import InputError, PosstatsError, PosstatsWarning

DATA = Path(__file__).resolve().parent.parent / "data"
BERT = DATA / "tokenizers" / "bert-base-uncased.tokenizer.json"
GPT2 = DATA / "tokenizers" / "gpt2.tokenizer.json"
FORTUNES = DATA / "fortunes-sample.jsonl"
HAMLET = DATA / "shakespeare-sample.txt"

SEQS = [[5, 6, 7], [], [1], [2, 3, 4, 5], [0], [9, 9], [], [30521, 1, 2], [42]]
TEXTS = ["Hello world", "", "The quick brown fox.", "Hello", "jumps over\nthe lazy dog"]


@pytest.fixture(autouse=True)
def _hf_offline(tmp_path, monkeypatch):
    """Keep `datasets` off the network and its caches in tmp_path, also if it was imported earlier."""
    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(home / "datasets"))
    if "datasets" in sys.modules:
        config = sys.modules["datasets"].config
        monkeypatch.setattr(config, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(config, "HF_DATASETS_OFFLINE", True)
        monkeypatch.setattr(config, "HF_DATASETS_CACHE", home / "datasets")
        monkeypatch.setattr(config, "HF_MODULES_CACHE", home / "modules")


@pytest.fixture(scope="module")
def gpt2():
    return load_tokenizer(GPT2)


@pytest.fixture(scope="module")
def bert():
    return load_tokenizer(BERT)


def collect(batches, *, source=None) -> list[list[int]]:
    """Sequences of a batch stream; checks dtypes, CSR invariants and contiguous row numbers."""
    out: list[list[int]] = []
    for batch in batches:
        assert isinstance(batch, TokenBatch)
        assert batch.rows > 0
        assert batch.values.dtype in (np.int32, np.int64) and batch.offsets.dtype == np.int64
        assert batch.offsets[0] == 0 and batch.offsets[-1] == batch.values.size
        assert np.all(np.diff(batch.offsets) >= 0)
        if source is not None:
            assert batch.source == str(source)
            assert batch.first_row == len(out)
        out.extend(batch.values[a:b].tolist() for a, b in zip(batch.offsets[:-1], batch.offsets[1:]))
    return out


def write_parquet(path, seqs, *, type_=pa.list_(pa.int64()), row_group_size=None, **extra):
    table = pa.table({"ids": pa.array(seqs, type=type_), **extra})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def write_jsonl(path, seqs, key="ids"):
    path.write_text("".join(json.dumps({key: s, "n": i}) + "\n" for i, s in enumerate(seqs)))
    return path


def write_csv(path, seqs, sep=" ", delimiter=","):
    lines = ["doc" + delimiter + "ids"] + [f'd{i}{delimiter}"{sep.join(map(str, s))}"' for i, s in enumerate(seqs)]
    path.write_text("\n".join(lines) + "\n")
    return path


def message(excinfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text
    return text


# ---------------------------------------------------------------------------------------
# resolve_inputs / guess_format


def test_resolve_inputs_sorts_dedups_and_keeps_dirs(tmp_path):
    for name in ["b.parquet", "a.parquet", "c.jsonl"]:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "saved").mkdir()
    got = resolve_inputs([str(tmp_path / "*.parquet"), str(tmp_path / "a.parquet"), str(tmp_path / "saved")])
    assert got == [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet"), str(tmp_path / "saved")]
    assert resolve_inputs(str(tmp_path / "*.jsonl")) == [str(tmp_path / "c.jsonl")]


def test_resolve_inputs_no_match(tmp_path):
    pattern = str(tmp_path / "x" / "*.parquet")
    with pytest.raises(InputError) as info:
        resolve_inputs([pattern])
    assert message(info) == f"no input matches {pattern!r}"
    with pytest.raises(InputError, match="no input matches"):
        resolve_inputs([str(tmp_path / "missing.txt")])


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("a.parquet", "parquet"),
        ("a.arrow", "parquet"),
        ("a.jsonl", "jsonl"),
        ("a.json", "jsonl"),
        ("a.JSONL.gz", "jsonl"),
        ("a.txt", "text"),
        ("a.md", "text"),
        ("a.txt.bz2", "text"),
        ("a.csv", "csv"),
        ("a.tsv", "csv"),
    ],
)
def test_guess_format(name, fmt):
    assert guess_format(name) == fmt
    assert fmt in FORMATS


def test_guess_format_directory_and_unknown(tmp_path):
    assert guess_format(tmp_path) == "hf"
    with pytest.raises(InputError, match=r"a\.docx: cannot tell the format from the suffix '\.docx'"):
        guess_format("a.docx")


# ---------------------------------------------------------------------------------------
# options


def test_option_errors(tmp_path, gpt2):
    path = write_parquet(tmp_path / "a.parquet", SEQS)
    with pytest.raises(PosstatsError, match="not both"):
        read_token_batches(path, column="ids", text_column="t", tokenizer=gpt2)
    # A tokenizer next to column= is allowed and unused.
    assert collect(read_token_batches(path, column="ids", tokenizer=gpt2)) == SEQS
    with pytest.raises(PosstatsError, match="give column="):
        read_token_batches(path)
    with pytest.raises(PosstatsError, match="needs text_column="):
        read_token_batches(path, tokenizer=gpt2)
    with pytest.raises(PosstatsError, match="unknown input format 'xml'"):
        read_token_batches(path, column="ids", format="xml")
    with pytest.raises(PosstatsError, match="batch_size"):
        read_token_batches(path, column="ids", batch_size=0)
    with pytest.raises(PosstatsError, match="text file has no token-id column"):
        read_token_batches(tmp_path / "a.txt", column="ids", format="text")


def test_missing_file_fails_on_call(tmp_path):
    missing = tmp_path / "gone.parquet"
    with pytest.raises(InputError) as info:
        read_token_batches([missing], column="ids")
    assert message(info) == f"{missing}: no such file"
    with pytest.raises(InputError, match="is a directory"):
        read_token_batches([tmp_path], column="ids", format="parquet")


# ---------------------------------------------------------------------------------------
# Parquet and Arrow IPC


@pytest.mark.parametrize(
    "type_",
    [pa.list_(pa.int64()), pa.list_(pa.int32()), pa.large_list(pa.int64()), pa.list_(pa.uint16())],
    ids=str,
)
@pytest.mark.parametrize("batch_size", [1, 2, 4096])
def test_parquet_ids(tmp_path, type_, batch_size):
    path = write_parquet(tmp_path / "a.parquet", SEQS, type_=type_, row_group_size=3)
    assert collect(read_token_batches([path], column="ids", batch_size=batch_size), source=path) == SEQS


def test_parquet_fixed_size_list(tmp_path):
    seqs = [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]]
    path = write_parquet(tmp_path / "f.parquet", seqs, type_=pa.list_(pa.int32(), 2))
    assert collect(read_token_batches([path], column="ids", batch_size=2), source=path) == seqs


def test_arrow_ipc_file_and_stream_sliced(tmp_path):
    # One 9-row record batch read 2 rows at a time: every batch is a slice with a nonzero offset.
    table = pa.table({"ids": pa.array(SEQS, type=pa.list_(pa.int32()))})
    file_path, stream_path = tmp_path / "a.arrow", tmp_path / "b.arrow"
    with pa.ipc.new_file(file_path, table.schema) as writer:
        writer.write_table(table)
    with pa.ipc.new_stream(stream_path, table.schema) as writer:
        writer.write_table(table.slice(0, 4))
        writer.write_table(table.slice(4))
    assert collect(read_token_batches([file_path], column="ids", batch_size=2), source=file_path) == SEQS
    assert collect(read_token_batches([stream_path], column="ids", batch_size=3), source=stream_path) == SEQS


def test_parquet_values_are_zero_copy_for_int64(tmp_path):
    path = write_parquet(tmp_path / "a.parquet", SEQS)
    batch = next(iter(read_token_batches([path], column="ids")))
    assert not batch.values.flags.owndata


def test_parquet_text_column(tmp_path, gpt2):
    path = write_parquet(tmp_path / "t.parquet", [[0]] * len(TEXTS), text=pa.array(TEXTS))
    got = collect(read_token_batches([path], text_column="text", tokenizer=gpt2, batch_size=2), source=path)
    assert got == [gpt2.encode(t, add_special_tokens=False).ids for t in TEXTS]
    assert got[0] == [15496, 995]


def test_parquet_text_column_tokenizer_path(tmp_path):
    path = write_parquet(tmp_path / "t.parquet", [[0]], text=pa.array(["Hello world"]))
    assert collect(read_token_batches([path], text_column="text", tokenizer=GPT2)) == [[15496, 995]]


def test_parquet_empty_file_yields_nothing(tmp_path):
    path = write_parquet(tmp_path / "e.parquet", [])
    assert list(read_token_batches([path], column="ids")) == []


def test_parquet_missing_column_lists_available(tmp_path):
    path = write_parquet(tmp_path / "a.parquet", SEQS, text=pa.array(["x"] * len(SEQS)))
    with pytest.raises(InputError) as info:
        list(read_token_batches([path], column="tokens"))
    assert message(info) == f"{path}: no column 'tokens' (available: ids, text)"


def test_parquet_wrong_column_types(tmp_path, gpt2):
    path = write_parquet(
        tmp_path / "a.parquet",
        SEQS,
        text=pa.array(["x"] * len(SEQS)),
        floats=pa.array([[1.5]] * len(SEQS)),
    )
    with pytest.raises(InputError) as info:
        list(read_token_batches([path], column="text"))
    assert message(info).startswith(f"{path}: column 'text' has type string; expected a list of integer")
    with pytest.raises(InputError, match=r"column 'floats' has type list<element: double>"):
        list(read_token_batches([path], column="floats"))
    with pytest.raises(InputError, match=r"a\.parquet: column 'ids' has type list<element: int64>; expected text"):
        list(read_token_batches([path], text_column="ids", tokenizer=gpt2))


def test_parquet_null_row_and_null_id(tmp_path, gpt2):
    path = write_parquet(tmp_path / "n.parquet", [[1], [2], [3], None, [4]])
    with pytest.raises(InputError) as info:
        list(read_token_batches([path], column="ids", batch_size=2))
    assert message(info) == f"{path}: row 3: column 'ids' is null instead of a list of token ids"
    path = write_parquet(tmp_path / "m.parquet", [[1], [2, 3], [4, None, 5]])
    with pytest.raises(InputError) as info:
        list(read_token_batches([path], column="ids", batch_size=2))
    assert message(info) == f"{path}: row 2: column 'ids' holds a null token id"
    path = write_parquet(tmp_path / "t.parquet", [[1], [2]], text=pa.array(["a", None]))
    with pytest.raises(InputError) as info:
        list(read_token_batches([path], text_column="text", tokenizer=gpt2))
    assert message(info) == f"{path}: row 1: text column 'text' is null"


def test_parquet_uint64_overflow(tmp_path):
    path = write_parquet(tmp_path / "u.parquet", [[1], [2**63 + 5]], type_=pa.list_(pa.uint64()))
    with pytest.raises(InputError) as info:
        list(read_token_batches([path], column="ids"))
    assert message(info) == f"{path}: row 1: token id {2**63 + 5} does not fit in int64"


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_parquet(tmp_path, damage):
    path = tmp_path / "bad.parquet"
    good = write_parquet(tmp_path / "good.parquet", SEQS).read_bytes()
    path.write_bytes({"garbage": b"hello, not parquet at all", "truncated": good[: len(good) // 2], "empty": b""}[damage])
    with pytest.raises(InputError) as info:
        list(read_token_batches([path], column="ids"))
    assert message(info).startswith(f"{path}: not a valid Parquet file (")


# ---------------------------------------------------------------------------------------
# JSON Lines


@pytest.mark.parametrize("batch_size", [1, 3, 4096])
def test_jsonl_ids(tmp_path, batch_size):
    path = write_jsonl(tmp_path / "a.jsonl", SEQS)
    assert collect(read_token_batches([path], column="ids", batch_size=batch_size), source=path) == SEQS


def test_jsonl_blank_lines_and_gzip(tmp_path):
    body = "\n".join(json.dumps({"ids": s}) for s in SEQS[:3]) + "\n\n  \n" + json.dumps({"ids": SEQS[3]}) + "\n"
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(gzip.compress(body.encode()))
    assert collect(read_token_batches([path], column="ids", batch_size=2), source=path) == SEQS[:4]


def test_jsonl_text(tmp_path, bert):
    path = write_jsonl(tmp_path / "t.jsonl", TEXTS, key="text")
    got = collect(read_token_batches([path], text_column="text", tokenizer=bert, batch_size=2), source=path)
    assert got == [bert.encode(t, add_special_tokens=False).ids for t in TEXTS]
    assert got[0] == [7592, 2088]
    with_specials = collect(read_token_batches([path], text_column="text", tokenizer=bert, add_special_tokens=True))
    assert with_specials[0] == [101, 7592, 2088, 102]


def test_jsonl_empty_file(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_text("\n\n")
    assert list(read_token_batches([path], column="ids")) == []


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        ('{"ids": [1, true, 3]}', "line 3: row 2: token id true is not an integer"),
        ('{"ids": [1, 2.5]}', "line 3: row 2: token id 2.5 is not an integer"),
        ('{"ids": [1, 2.0]}', "line 3: row 2: token id 2.0 is not an integer"),
        ('{"ids": ["7"]}', 'line 3: row 2: token id "7" is not an integer'),
        ('{"ids": [[1]]}', "line 3: row 2: token id [1] is not an integer"),
        ('{"ids": [1, null]}', "line 3: row 2: token id null is not an integer"),
        ('{"ids": "1 2 3"}', "line 3: row 2: 'ids' is \"1 2 3\", expected a list of integer token ids"),
        ('{"ids": null}', "line 3: row 2: 'ids' is null, expected a list of integer token ids"),
        ('{"ids": [99999999999999999999]}', "line 3: row 2: token id 99999999999999999999 does not fit in int64"),
        ('{"tokens": [1]}', "line 3: no key 'ids' (keys: tokens)"),
        ("[1, 2, 3]", "line 3: expected a JSON object, got [1, 2, 3]"),
        ('{"ids": [1, 2', "line 3: not valid JSON ("),
    ],
)
def test_jsonl_bad_ids(tmp_path, bad_line, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"ids": [1]}\n\n{"ids": [2]}\n'.replace("\n\n", "\n") + bad_line + "\n" + '{"ids": [4]}\n')
    with pytest.raises(InputError) as info:
        list(read_token_batches([path], column="ids", batch_size=2))
    assert message(info).startswith(f"{path}: {expected}")


def test_jsonl_bad_text(tmp_path, gpt2):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n{"text": 42}\n')
    with pytest.raises(InputError) as info:
        list(read_token_batches([path], text_column="text", tokenizer=gpt2))
    assert message(info) == f"{path}: line 2: row 1: 'text' is 42, expected a string"


def test_jsonl_not_utf8(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"ids": [1]}\n{"ids": [2], "s": "caf\xe9"}\n')
    with pytest.raises(InputError, match=r"latin1\.jsonl: line \d+: not UTF-8 text"):
        list(read_token_batches([path], column="ids"))


@pytest.mark.parametrize("fmt", ["jsonl", "text"])
@pytest.mark.parametrize("bad_line", [1, 2, 21, 2001, 2999])
def test_not_utf8_names_the_line_past_decoder_chunks_and_batches(tmp_path, fmt, bad_line):
    # strict decoding failed on a whole 8 KiB chunk: line 21 was reported as 1, 2001 as ~1990
    good, bad = (b'{"ids": [1, 2]}', b'{"ids": [1, 2], "s": "\xe9t\xe9"}') if fmt == "jsonl" else (b"hello", b"caf\xe9")
    lines = [good] * 3000
    lines[bad_line - 1] = bad
    path = tmp_path / ("c.jsonl" if fmt == "jsonl" else "c.txt")
    path.write_bytes(b"\r\n".join(lines) + b"\r\n")
    kwargs = {"column": "ids"} if fmt == "jsonl" else {"tokenizer": BERT}
    with pytest.raises(InputError) as info:
        list(read_token_batches([path], batch_size=7, **kwargs))
    byte = 23 if fmt == "jsonl" else 4
    assert message(info) == f"{path}: line {bad_line}: not UTF-8 text (invalid continuation byte 0xe9 at byte {byte} of the line)"


def test_valid_utf8_and_lone_carriage_returns_read_as_before(tmp_path):
    path = tmp_path / "ok.txt"
    path.write_bytes("h\u00e9llo\rw\u00f6rld \U0001f600\n\nend".encode())
    tok = load_tokenizer(BERT)
    got = [b.values.tolist() for b in read_token_batches([path], tokenizer=tok)]
    want = encode_texts(tok, ["h\u00e9llo", "w\u00f6rld \U0001f600", "end"], add_special_tokens=False)
    assert got == [want.values.tolist()]


# ---------------------------------------------------------------------------------------
# plain text


def test_text_lines(tmp_path, gpt2):
    path = tmp_path / "a.txt"
    path.write_text("Hello world\n\n   \n  Hello  \nThe quick brown fox.\r\n")
    got = collect(read_token_batches([path], tokenizer=gpt2, batch_size=2), source=path)
    assert got == [[15496, 995], gpt2.encode("Hello").ids, gpt2.encode("The quick brown fox.").ids]


def test_text_empty(tmp_path, gpt2):
    path = tmp_path / "e.txt"
    path.write_text("")
    assert list(read_token_batches([path], tokenizer=gpt2)) == []


# ---------------------------------------------------------------------------------------
# CSV / TSV


@pytest.mark.parametrize(("sep", "delimiter", "suffix"), [(" ", ",", "csv"), (",", ",", "csv"), (", ", "\t", "tsv")])
@pytest.mark.parametrize("batch_size", [2, 4096])
def test_csv_ids(tmp_path, sep, delimiter, suffix, batch_size):
    path = write_csv(tmp_path / f"a.{suffix}", SEQS, sep=sep, delimiter=delimiter)
    assert collect(read_token_batches([path], column="ids", batch_size=batch_size), source=path) == SEQS


def test_csv_text_with_quoted_newlines(tmp_path, gpt2):
    path = tmp_path / "t.csv"
    rows = ["id,text"] + [f'{i},"{t}"' for i, t in enumerate(TEXTS)]
    path.write_text("\n".join(rows) + "\n")
    got = collect(read_token_batches([path], text_column="text", tokenizer=gpt2, batch_size=2), source=path)
    assert got == [gpt2.encode(t, add_special_tokens=False).ids for t in TEXTS]


def test_csv_empty_and_header_only(tmp_path):
    empty, header = tmp_path / "e.csv", tmp_path / "h.csv"
    empty.write_text("")
    header.write_text("doc,ids\n")
    assert list(read_token_batches([empty, header], column="ids")) == []


def test_csv_missing_column(tmp_path):
    path = write_csv(tmp_path / "a.csv", SEQS)
    with pytest.raises(InputError) as info:
        list(read_token_batches([path], column="tokens"))
    assert message(info) == f"{path}: no column 'tokens' (available: doc, ids)"


@pytest.mark.parametrize("bad", ["1.5", "seven", "1 true", "99999999999999999999"])
def test_csv_bad_ids(tmp_path, bad):
    path = tmp_path / "bad.csv"
    path.write_text(f'doc,ids\na,"1 2"\nb,"3"\nc,"4 {bad}"\n')
    with pytest.raises(InputError) as info:
        list(read_token_batches([path], column="ids", batch_size=2))
    text = message(info)
    assert text.startswith(f"{path}: row 2: column 'ids': ")
    assert bad.split()[-1] in text


def test_csv_ragged_row(tmp_path):
    path = tmp_path / "ragged.csv"
    path.write_text('doc,ids\na,"1 2"\nb\n')
    with pytest.raises(InputError, match=r"ragged\.csv: not a valid CSV file"):
        list(read_token_batches([path], column="ids"))


# ---------------------------------------------------------------------------------------
# Hugging Face datasets (offline)


def _dataset(seqs=SEQS):
    import datasets

    return datasets.Dataset.from_dict({"ids": seqs, "text": [f"doc {i}" for i in range(len(seqs))]})


@pytest.mark.parametrize("streaming", [False, True])
def test_hf_save_to_disk(tmp_path, streaming):
    folder = tmp_path / "saved"
    _dataset().save_to_disk(str(folder))
    assert guess_format(folder) == "hf"
    got = read_token_batches([folder], column="ids", batch_size=4, hf_streaming=streaming)
    assert collect(got, source=folder) == SEQS


def test_hf_dataset_dict_splits(tmp_path, gpt2):
    import datasets

    folder = tmp_path / "dd"
    datasets.DatasetDict({"train": _dataset(SEQS[:4]), "test": _dataset(SEQS[4:])}).save_to_disk(str(folder))
    with pytest.raises(InputError) as info:  # two splits and none chosen: never a silent pick
        list(read_token_batches([folder], column="ids"))
    assert message(info) == f"{folder}: holds the splits train, test; choose one with split (hf_split=)"
    assert collect(read_token_batches([folder], column="ids", hf_split="train")) == SEQS[:4]
    assert collect(read_token_batches([folder], column="ids", hf_split="test")) == SEQS[4:]
    with pytest.raises(InputError) as info:
        list(read_token_batches([folder], column="ids", hf_split="validation"))
    assert message(info).startswith(f"{folder}: no split 'validation' (available: ")
    texts = collect(read_token_batches([folder], text_column="text", tokenizer=gpt2, hf_split="test"))
    assert texts == [gpt2.encode(f"doc {i}").ids for i in range(len(SEQS) - 4)]


@pytest.mark.parametrize("streaming", [False, True])
def test_hf_parquet_via_load_dataset(tmp_path, streaming):
    path = write_parquet(tmp_path / "a.parquet", SEQS, type_=pa.list_(pa.int32()))
    got = read_token_batches([path], format="hf", column="ids", batch_size=4, hf_streaming=streaming)
    assert collect(got, source=path) == SEQS


@pytest.mark.parametrize("streaming", [False, True])
def test_hf_jsonl_and_text_builders(tmp_path, gpt2, streaming):
    path = write_jsonl(tmp_path / "a.jsonl", SEQS)
    assert collect(read_token_batches([path], format="hf", column="ids", hf_streaming=streaming)) == SEQS
    text = tmp_path / "a.txt"
    text.write_text("Hello world\nHello\n")
    got = collect(read_token_batches([text], format="hf", tokenizer=gpt2, hf_streaming=streaming))
    assert got == [[15496, 995], [15496]]


def test_hf_folder_of_data_files(tmp_path):
    folder = tmp_path / "repo"
    folder.mkdir()
    write_parquet(folder / "part-0.parquet", SEQS[:5])
    write_parquet(folder / "part-1.parquet", SEQS[5:])
    assert sorted(collect(read_token_batches([folder], column="ids", hf_streaming=True))) == sorted(SEQS)


@pytest.mark.parametrize("quiet", [True, False])
def test_hf_cache_building_shows_no_bar_where_posstats_shows_none(tmp_path, capfd, quiet):
    """`datasets` building its Arrow cache of a folder drew "Generating train split" bars
    through `posstats count -q` and into logs: its bars follow posstats' own (none with -q,
    none when stderr is not a terminal), and its setting is put back after."""
    import datasets

    from posstats.cli import main
    from posstats.progress import bars_shown, set_quiet

    folder = tmp_path / "repo"
    folder.mkdir()
    write_parquet(folder / "part-0.parquet", SEQS[:5])
    write_parquet(folder / "part-1.parquet", SEQS[5:])
    logging = datasets.utils.logging
    before = logging.is_progress_bar_enabled()
    previous = set_quiet(False)
    try:
        argv = ["count", "--input", str(folder), "--column", "ids", "--positions", "4", "--vocab-size", "30522",
                "--out", str(tmp_path / "c"), *(["-q"] if quiet else [])]
        assert main(argv) == 0
        assert not bars_shown()  # stderr is captured, not a terminal
    finally:
        set_quiet(previous)
    err = capfd.readouterr().err
    assert "Generating" not in err and "examples/s" not in err, err
    assert logging.is_progress_bar_enabled() == before
    assert collect(read_token_batches([folder], column="ids")) == SEQS  # the cache it built reads back


def test_hf_errors(tmp_path):
    folder = tmp_path / "saved"
    _dataset().save_to_disk(str(folder))
    with pytest.raises(InputError) as info:
        list(read_token_batches([folder], column="tokens"))
    assert message(info) == f"{folder}: no column 'tokens' (available: ids, text)"
    with pytest.raises(InputError, match=r"saved: column 'text' has type string; expected a list"):
        list(read_token_batches([folder], column="text", hf_streaming=True))
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(InputError) as info:
        list(read_token_batches([bad], format="hf", column="ids"))
    assert message(info).startswith(f"{bad}: cannot ")
    with pytest.raises(InputError, match="no such file or folder"):
        list(read_token_batches([tmp_path / "nothing"], format="hf", column="ids"))


# ---------------------------------------------------------------------------------------
# all formats agree


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seqs=st.lists(st.lists(st.integers(0, 2**40), max_size=6), max_size=12),
    batch_size=st.integers(1, 5),
)
def test_formats_agree(seqs, batch_size):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        paths = [
            write_parquet(tmp / "a.parquet", seqs),
            write_jsonl(tmp / "a.jsonl", seqs),
            write_csv(tmp / "a.csv", seqs),
            write_csv(tmp / "b.csv", seqs, sep=","),
        ]
        for path in paths:
            assert collect(read_token_batches([path], column="ids", batch_size=batch_size), source=path) == seqs


def test_several_files_in_order(tmp_path):
    a = write_parquet(tmp_path / "a.parquet", SEQS[:3])
    b = write_jsonl(tmp_path / "b.jsonl", SEQS[3:])
    batches = list(read_token_batches(resolve_inputs([str(tmp_path / "*")]), column="ids"))
    assert [(x.source, x.first_row) for x in batches] == [(str(a), 0), (str(b), 0)]
    assert collect(batches) == SEQS


# ---------------------------------------------------------------------------------------
# validate_ids


def test_validate_ids_accepts_in_range():
    batch = TokenBatch.from_sequences([[0, 5], [], [9]], source="a.parquet")
    validate_ids(batch, 10)
    validate_ids(TokenBatch.from_sequences([[]]), 1)


@pytest.mark.parametrize(("bad", "row"), [(-1, 12), (10, 12), (10**12, 12)])
def test_validate_ids_names_source_row_and_value(bad, row):
    batch = TokenBatch.from_sequences([[1, 2], [], [3, bad, 11], [12]], source="a.parquet", first_row=10)
    with pytest.raises(InputError) as info:
        validate_ids(batch, 10)
    assert message(info) == f"a.parquet: row {row}: token id {bad} is out of range [0, 10)"


def test_validate_ids_reports_first_offender():
    batch = TokenBatch.from_sequences([[1], [7, 8], [-3]], source="x.jsonl", first_row=100)
    with pytest.raises(InputError, match=r"^x\.jsonl: row 101: token id 7 is out of range \[0, 7\)$"):
        validate_ids(batch, 7)


# ---------------------------------------------------------------------------------------
# the shipped real corpora


@pytest.mark.parametrize("which", ["bert", "gpt2"])
def test_fortunes_sample(request, which):
    tok = request.getfixturevalue(which)
    batches = list(read_token_batches([FORTUNES], text_column="text", tokenizer=tok, batch_size=1000))
    seqs = collect(batches, source=FORTUNES)
    assert len(seqs) == 3000
    records = [json.loads(line)["text"] for line in FORTUNES.read_text(encoding="utf-8").splitlines()[:40]]
    assert seqs[:40] == [tok.encode(t, add_special_tokens=False).ids for t in records]
    for batch in batches:
        validate_ids(batch, vocab_size(tok))
    ids = np.concatenate([b.values for b in batches])
    assert ids.size > 100_000
    if which == "bert":
        # Fortunes mention no "[CLS]"/"[SEP]" literally, so without special tokens none appear.
        assert not np.isin(ids, special_token_ids(tok)).any()


def test_shakespeare_sample_both_tokenizers(bert, gpt2, tmp_path):
    lines = [x.strip() for x in HAMLET.read_text(encoding="utf-8").splitlines() if x.strip()]
    assert len(lines) > 1000
    for tok in (bert, gpt2):
        seqs = collect(read_token_batches([HAMLET], tokenizer=tok, batch_size=500), source=HAMLET)
        assert len(seqs) == len(lines)
        assert seqs == collect([encode_texts(tok, lines)])
    # Round trip: tokenised text written as a token-id Parquet file reads back unchanged.
    seqs = collect(read_token_batches([HAMLET], tokenizer=gpt2))
    path = write_parquet(tmp_path / "hamlet.parquet", seqs, type_=pa.list_(pa.int32()), row_group_size=100)
    assert collect(read_token_batches([path], column="ids", batch_size=333), source=path) == seqs


def test_sample_data_is_small():
    sizes = {p.name: p.stat().st_size for p in DATA.iterdir() if p.is_file()}
    assert sum(sizes.values()) < 2 * 1024 * 1024
    assert os.path.getsize(BERT) < 1024 * 1024 and os.path.getsize(GPT2) < 4 * 1024 * 1024


def test_validate_ids_on_either_backend(xp):
    host = TokenBatch.from_sequences([[1, 2], [], [3, 12]], source="g.parquet", first_row=5)
    batch = TokenBatch(xp.asarray(host.values), xp.asarray(host.offsets), host.source, host.first_row)
    validate_ids(batch, 13)
    with pytest.raises(InputError, match=r"^g\.parquet: row 7: token id 12 is out of range \[0, 12\)$"):
        validate_ids(batch, 12)


def test_split_flag_counts_the_chosen_split(tmp_path, capsys):
    """posstats count --split: the chosen split of a DatasetDict folder; without it, a one-line
    error naming the splits (exit 2)."""
    import datasets

    from posstats.cli import main
    from posstats.counting.io import load_counts

    folder = tmp_path / "dd"
    datasets.DatasetDict({"train": _dataset(SEQS[:4]), "test": _dataset(SEQS[4:])}).save_to_disk(str(folder))
    common = ["count", "--input", str(folder), "--column", "ids", "--vocab-size", "50257", "--positions", "8"]
    assert main([*common, "--out", str(tmp_path / "none")]) == 2
    assert "holds the splits train, test; choose one with --split" in capsys.readouterr().err
    assert main([*common, "--split", "test", "--out", str(tmp_path / "test")]) == 0
    counted = load_counts(tmp_path / "test")
    assert counted.sequences == len(SEQS) - 4


def test_a_symlink_loop_counts_each_file_once_and_says_so(tmp_path, capsys):
    """``**`` through a link to a parent folder names one file dozens of times: it is
    counted once, and a warning says how many paths were dropped."""
    from posstats.cli import main

    loop = tmp_path / "inp" / "dirloop"
    loop.mkdir(parents=True)
    (loop / "a.jsonl").write_text('{"ids": [1, 2, 3]}\n')
    (loop / "b.jsonl").write_text('{"ids": [4, 5]}\n')
    (loop / "up").symlink_to("..")
    (tmp_path / "inp" / "alias.jsonl").symlink_to(loop / "b.jsonl")
    with pytest.warns(PosstatsWarning, match=r"input path\(s\) name a file already counted"):
        files = resolve_inputs([str(tmp_path / "inp" / "**" / "*.jsonl")])
    assert sorted(os.path.realpath(f) for f in files) == [str(loop / "a.jsonl"), str(loop / "b.jsonl")]
    rc = main(["count", "--input", str(tmp_path / "inp" / "**" / "*.jsonl"), "--column", "ids", "--vocab-size", "8",
               "--positions", "4", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 0 and err.count("posstats: warning: ") == 1 and "each file is counted once" in err, err
    assert json.loads((tmp_path / "out" / "count.json").read_text())["tokens_counted"] == 5
