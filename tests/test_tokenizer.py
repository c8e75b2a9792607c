"""posstats.corpus.tokenizer on the two tokenizers shipped in data/tokenizers (BERT WordPiece, GPT-2 BPE)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from posstats.corpus.tokenizer import (
    encode_texts,
    load_tokenizer,
    special_token_ids,
    tokenizer_hash,
    vocab_size,
)
from posstats.counting.tokens import TokenBatch
from posstats.errors import InputError

DATA = Path(__file__).resolve().parent.parent / "data"
BERT = DATA / "tokenizers" / "bert-base-uncased.tokenizer.json"
GPT2 = DATA / "tokenizers" / "gpt2.tokenizer.json"


@pytest.fixture(scope="module")
def bert():
    return load_tokenizer(BERT)


@pytest.fixture(scope="module")
def gpt2():
    return load_tokenizer(GPT2)


@pytest.fixture(scope="module")
def hamlet() -> list[str]:
    return (DATA / "shakespeare-sample.txt").read_text(encoding="utf-8").splitlines()


def _sequences(batch: TokenBatch) -> list[list[int]]:
    return [batch.values[a:b].tolist() for a, b in zip(batch.offsets[:-1], batch.offsets[1:])]


def test_padding_and_truncation_are_off(bert, gpt2):
    assert bert.padding is None and bert.truncation is None
    assert gpt2.padding is None and gpt2.truncation is None


def test_known_ids(bert, gpt2):
    np.testing.assert_array_equal(encode_texts(gpt2, ["Hello world"]).values, [15496, 995])
    np.testing.assert_array_equal(encode_texts(bert, ["Hello world"]).values, [7592, 2088])
    with_specials = encode_texts(bert, ["Hello world"], add_special_tokens=True)
    np.testing.assert_array_equal(with_specials.values, [101, 7592, 2088, 102])
    np.testing.assert_array_equal(encode_texts(gpt2, ["Hello world"], add_special_tokens=True).values, [15496, 995])


def test_long_text_is_not_truncated_or_padded(bert):
    # The BERT file has padding and truncation to 128 built in.
    text = " ".join(["word"] * 300)
    batch = encode_texts(bert, [text, "a"])
    np.testing.assert_array_equal(batch.offsets, [0, 300, 301])
    assert 0 not in batch.values


def test_vocab_sizes(bert, gpt2):
    assert vocab_size(bert) == 30522
    assert vocab_size(gpt2) == 50257


def test_special_token_ids(bert, gpt2):
    assert special_token_ids(bert) == [0, 101, 102, 103]
    assert special_token_ids(bert, include_unk=True) == [0, 100, 101, 102, 103]
    assert special_token_ids(gpt2) == [50256]
    assert special_token_ids(gpt2, include_unk=True) == [50256]


def test_tokenizer_hash():
    h = tokenizer_hash(BERT)
    assert h == hashlib.sha256(BERT.read_bytes()).hexdigest()[:16]
    assert len(h) == 16 and int(h, 16) >= 0
    assert tokenizer_hash(str(BERT)) == h
    assert tokenizer_hash(GPT2) != h


def test_tokenizer_hash_missing_file(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(InputError, match=r"nope\.json: not a tokenizer\.json"):
        tokenizer_hash(missing)


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("missing.json", None, "no such file"),
        ("config.json", json.dumps({"hidden_size": 384}), ""),
        ("garbage.json", b"\x00\x01\x02 not json", ""),
        ("empty.json", b"", ""),
    ],
)
def test_load_tokenizer_errors(tmp_path, name, content, reason):
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content)
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(InputError) as info:
        load_tokenizer(path)
    message = str(info.value)
    assert message.startswith(f"{path}: not a tokenizer.json (")
    assert reason in message
    assert "\n" not in message


def test_load_tokenizer_directory(tmp_path):
    with pytest.raises(InputError, match="not a tokenizer.json .is a directory"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("which", ["bert", "gpt2"])
def test_encode_texts_matches_one_at_a_time(request, which, hamlet):
    tok = request.getfixturevalue(which)
    texts = [*hamlet[:200], "", "   "]
    batch = encode_texts(tok, texts, source="hamlet.txt", first_row=7)
    assert batch.source == "hamlet.txt" and batch.first_row == 7 and batch.rows == len(texts)
    assert batch.values.dtype == np.int64 and batch.offsets.dtype == np.int64
    expected = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    assert _sequences(batch) == expected
    assert not set(special_token_ids(tok)) & set(batch.values.tolist())


def test_encode_texts_with_special_tokens_bert(bert, hamlet):
    batch = encode_texts(bert, hamlet[:50], add_special_tokens=True)
    np.testing.assert_array_equal(batch.values[batch.offsets[:-1]], np.full(50, 101))
    np.testing.assert_array_equal(batch.values[batch.offsets[1:] - 1], np.full(50, 102))


def test_encode_texts_empty_and_generator(gpt2):
    empty = encode_texts(gpt2, [])
    assert empty.rows == 0 and empty.values.size == 0
    np.testing.assert_array_equal(empty.offsets, [0])
    from_generator = encode_texts(gpt2, (t for t in ["Hello world", "Hello"]))
    np.testing.assert_array_equal(from_generator.offsets, [0, 2, 3])


def test_encode_texts_rejects_non_strings(gpt2):
    with pytest.raises(InputError, match=r"^corpus\.jsonl: row 12: expected a text string, got None$"):
        encode_texts(gpt2, ["a", "b", None], source="corpus.jsonl", first_row=10)


def test_tokenizer_from_a_model_folder_a_cached_name_or_a_file_url(tmp_path, monkeypatch):
    import shutil

    from posstats.corpus.tokenizer import (
        load_tokenizer,
        resolve_tokenizer,
        tokenizer_hash,
    )
    from posstats.errors import InputError

    src = Path(__file__).resolve().parents[1] / "data" / "tokenizers" / "gpt2.tokenizer.json"
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(src, folder / "tokenizer.json")
    snap = tmp_path / "hf" / "hub" / "models--openai-community--gpt2" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    shutil.copy(src, snap / "tokenizer.json")
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    for name in (str(folder), "openai-community/gpt2", f"file://{src}"):
        assert load_tokenizer(name).get_vocab_size() == 50257, name
        assert tokenizer_hash(name) == tokenizer_hash(src)
    assert resolve_tokenizer("openai-community/gpt2") == str(snap / "tokenizer.json")
    with pytest.raises(InputError, match="no such tokenizer.json, model folder, or model in the local Hugging Face cache"):
        load_tokenizer("nobody/nothing")


def test_count_accepts_a_transformers_autotokenizer(tmp_path, data_dir):
    """posstats.count with transformers' AutoTokenizer (a fast tokenizer: its backend, copied
    with padding and truncation off) gives the counts of the tokenizer.json it was loaded
    from, for a dataset and for files (whose tokenizer file is found from the folder it was
    loaded from and recorded by its hash); the caller's tokenizer is left as it was."""
    import shutil

    import datasets
    from transformers import AutoTokenizer

    import posstats

    folder = tmp_path / "bert"
    folder.mkdir()
    shutil.copy(data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json", folder / "tokenizer.json")
    auto = AutoTokenizer.from_pretrained(str(folder))
    padding_before = auto.backend_tokenizer.padding
    path = str(data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json")
    texts = datasets.Dataset.from_dict({"text": ["A fortune, " * 30, "short one"] * 5})
    by_auto = posstats.count(texts, tokenizer=auto, text_column="text", positions=64)
    by_path = posstats.count(texts, tokenizer=path, text_column="text", positions=64)
    assert by_auto.tokens == by_path.tokens > 64  # the long text is not truncated
    assert (by_auto.to_sparse().matrix != by_path.to_sparse().matrix).nnz == 0
    assert auto.backend_tokenizer.padding == padding_before
    sample = str(data_dir / "fortunes-sample.jsonl")
    files_auto = posstats.count(sample, tokenizer=auto, text_column="text", positions=16)
    files_path = posstats.count(sample, tokenizer=path, text_column="text", positions=16)
    assert files_auto.tokens == files_path.tokens
    assert files_auto.metadata["tokenizer_hash"] == files_path.metadata["tokenizer_hash"]


def test_as_tokenizer_refuses_what_it_cannot_use():
    from posstats.corpus.tokenizer import as_tokenizer

    class Slow:  # a slow transformers tokenizer has no backend_tokenizer
        def convert_tokens_to_ids(self, tokens):
            return []

    with pytest.raises(InputError, match="use_fast=True"):
        as_tokenizer(Slow())
    with pytest.raises(InputError, match="got dict"):
        as_tokenizer({})
