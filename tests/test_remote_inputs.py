"""Inputs at fsspec URLs read in-process (fsspec's ``memory://`` filesystem: the same code
path as ``s3://`` or ``gs://``, without a server; S3 itself is in test_s3.py): every format
streamed gives exactly the batches of its local copy, globs expand, Ray shards split remote
Parquet by row group, and failures are one line naming the URL."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import uuid

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from posstats.corpus.readers import guess_format, read_token_batches, resolve_inputs
from posstats.corpus.remote import absolute, hub_dataset, is_url, local_path
from posstats.corpus.shards import plan_shards
from posstats.corpus.count_step import count_shard
from posstats.corpus.source import (
    CorpusSource,
    estimated_tokens,
    file_fingerprint,
)
from posstats.corpus.count_step import count_corpus
from posstats.counting.counts import CountSpec, PositionalCounts
from posstats.errors import InputError, PosstatsError

V, N = 60, 16


@pytest.fixture()
def corpus(tmp_path):
    """The same documents as local files and under a fresh memory:// folder: (local dir, url dir, docs)."""
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, V, size=int(rng.integers(1, 40))).tolist() for _ in range(400)]
    lines = "".join(json.dumps({"ids": d}) + "\n" for d in docs).encode()
    table = pa.table({"ids": docs})
    parquet = io.BytesIO()
    pq.write_table(table, parquet, row_group_size=100)
    arrow = io.BytesIO()
    feather.write_feather(table, arrow, compression="uncompressed")
    files = {
        "a.parquet": parquet.getvalue(),
        "b.arrow": arrow.getvalue(),
        "c.jsonl.gz": gzip.compress(lines),
        "d.jsonl.bz2": bz2.compress(lines),
        "e.csv": ("ids\n" + "".join('"' + ",".join(map(str, d)) + '"\n' for d in docs)).encode(),
        "f.tsv.gz": gzip.compress(("n\tids\n" + "".join(f"{i}\t{' '.join(map(str, d))}\n" for i, d in enumerate(docs))).encode()),
    }
    root = f"/posstats-test-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        fs.pipe(f"{root}/{name}", data)
    yield tmp_path, f"memory://{root}", docs
    fs.rm(root, recursive=True)


def _rows(batches) -> list[list[int]]:
    out = []
    for b in batches:
        out += [b.values[b.offsets[i]:b.offsets[i + 1]].tolist() for i in range(len(b.offsets) - 1)]
    return out


def test_url_helpers():
    assert is_url("s3://b/k") and is_url("hf://datasets/a/b") and is_url("memory://x")
    assert not is_url("file:///x") and not is_url("/x") and not is_url("rel/x") and not is_url(None)
    assert local_path("file:///data/x") == "/data/x" and local_path("/data/x") == "/data/x"
    assert absolute("s3://b/k") == "s3://b/k" and absolute("file:///a/../b") == "/b"
    assert hub_dataset("hf://datasets/org/name") == "org/name" == hub_dataset("hf://datasets/org/name@v1/")
    assert hub_dataset("hf://datasets/org/name/data/x.parquet") is None and hub_dataset("s3://org/name") is None
    assert guess_format("s3://b/x.jsonl.gz") == "jsonl" and guess_format("s3://b/x.parquet") == "parquet"
    assert guess_format("hf://datasets/org/name") == "hf" and guess_format("s3://b/saved_dataset/") == "hf"


def test_every_format_streams_from_a_url_exactly_as_from_disk(corpus):
    local, url, docs = corpus
    for name in ("a.parquet", "b.arrow", "c.jsonl.gz", "d.jsonl.bz2", "e.csv", "f.tsv.gz"):
        remote = list(read_token_batches(f"{url}/{name}", column="ids", batch_size=64))
        assert _rows(remote) == docs, name
        assert _rows(read_token_batches(str(local / name), column="ids", batch_size=64)) == docs, name
        assert {b.source for b in remote} == {f"{url}/{name}"} and [b.first_row for b in remote][:2] == [0, 64]


def test_globs_on_urls_and_counts_equal_to_local(corpus):
    local, url, _ = corpus
    assert resolve_inputs([f"{url}/*.jsonl.*"]) == [f"memory://{url[len('memory://'):]}/c.jsonl.gz",
                                                    f"memory://{url[len('memory://'):]}/d.jsonl.bz2"]
    spec = CountSpec(N, V, "pack")
    remote = count_corpus(CorpusSource((f"{url}/*",), column="ids"), spec, show_progress=False)
    here = count_corpus(CorpusSource((str(local / "*"),), column="ids"), spec, show_progress=False)
    assert remote.equals(here) and remote.tokens == here.tokens > 0
    assert estimated_tokens(f"{url}/a.parquet", "ids") == estimated_tokens(str(local / "a.parquet"), "ids")


def test_ray_shards_split_remote_parquet_by_row_group_and_sum_exactly(corpus):
    local, url, _ = corpus
    source = CorpusSource((f"{url}/a.parquet", f"{url}/c.jsonl.gz"), column="ids")
    spec = CountSpec(N, V, "truncate")  # pack-mode pieces are stitched by the reduce (test_s3, test_pack_pieces)
    shards = plan_shards(source, spec, shard_bytes=1)  # one shard per row group
    assert [s.kind for s in shards] == ["row_group"] * 4 + ["file"]
    total = PositionalCounts.zeros(spec)
    for shard in shards:
        total = total + count_shard(shard, source, spec)
    whole = count_corpus(CorpusSource((str(local / "a.parquet"), str(local / "c.jsonl.gz")), column="ids"), spec,
                         show_progress=False)
    assert total.equals(whole)


def test_a_changed_object_changes_its_fingerprint_and_stale_shards_fail(corpus):
    _, url, docs = corpus
    before = file_fingerprint(f"{url}/e.csv")
    source = CorpusSource((f"{url}/e.csv",), column="ids")
    (shard,) = plan_shards(source, CountSpec(N, V), shard_bytes=1)
    fsspec.filesystem("memory").pipe(f"{url[len('memory://'):]}/e.csv", b"ids\n1 2 3\n")
    assert file_fingerprint(f"{url}/e.csv") != before
    with pytest.raises(InputError, match="changed since the shards were planned"):
        count_shard(shard, source, CountSpec(N, V))


def test_url_failures_are_one_line_errors_naming_the_url(corpus):
    _, url, _ = corpus
    fs = fsspec.filesystem("memory")
    root = url[len("memory://"):]
    fs.pipe(f"{root}/bad.jsonl", b'{"ids": [1, 2]}\n{"ids": [3, "x"]}\n')
    fs.pipe(f"{root}/bad.parquet", b"PAR1 not really")
    cases = [
        (lambda: resolve_inputs([f"{url}/none/*.parquet"]), InputError, "no input matches"),
        (lambda: list(read_token_batches(f"{url}/missing.parquet", column="ids")), InputError, "missing.parquet"),
        (lambda: list(read_token_batches(f"{url}/bad.jsonl", column="ids")), InputError, "bad.jsonl: line 2"),
        (lambda: list(read_token_batches(f"{url}/bad.parquet", column="ids")), InputError, "not a valid Parquet"),
        (lambda: list(read_token_batches(f"{url}/a.parquet", column="nope")), InputError, "no column 'nope'"),
        (lambda: resolve_inputs(["gs://bucket/x.parquet"]), PosstatsError, "needs an fsspec backend"),
        (lambda: list(read_token_batches("hf://datasets/nobody/nothing", column="ids")), InputError,
         "hf://datasets/nobody/nothing: cannot load as a Hugging Face dataset"),
    ]
    for call, kind, text in cases:
        with pytest.raises(kind, match=text) as info:
            call()
        assert "\n" not in str(info.value), str(info.value)
