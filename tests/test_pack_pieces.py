"""Pack streams counted in pieces (row groups on several workers) and stitched by the
reduce (posstats.counting.pack) equal the whole-input count, exactly."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from posstats.corpus.shards import plan_shards
from posstats.corpus.count_step import count_shard
from posstats.corpus.source import CorpusSource
from posstats.corpus.count_step import count_corpus
from posstats.counting.counts import CountSpec
from posstats.counting.io import load_counts, save_counts
from posstats.counting.pack import stitch
from posstats.counting.ranges import assemble_ranges, row_ranges, sum_row_range
from posstats.errors import InputError

V = 20


def _write(path, docs, row_group_size):
    pq.write_table(pa.table({"ids": pa.array(docs, type=pa.list_(pa.int32()))}), path, row_group_size=row_group_size)


def _docs(rng, count, *, empty_head=0):
    """Documents of 0..9 tokens; the first ``empty_head`` are empty (or only excluded ids)."""
    docs = [[] if i % 2 else [5] * int(rng.integers(1, 3)) for i in range(empty_head)]
    docs += [rng.integers(0, V - 1, size=int(rng.integers(0, 10))).tolist() for _ in range(count)]
    return docs


def _stitched(tmp_path, source, spec, shards, items_sign=1):
    items = []
    for s in shards:
        save_counts(count_shard(s, source, spec), tmp_path / "parts" / s.shard_id)
        items.append((str(tmp_path / "parts" / s.shard_id), items_sign))
    placements, windows, tokens = stitch(items, spec)
    parts = [sum_row_range(placements, spec, a, b, tmp_path / f"r{a}.safetensors") for a, b in row_ranges(spec.positions, 3)]
    assemble_ranges(parts, placements, spec, tmp_path / "total", adjust=(windows, tokens))
    return load_counts(tmp_path / "total")


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("n", [1, 3, 7, 64])
@pytest.mark.parametrize("separator", [None, V - 1])
def test_pieces_stitched_equal_the_whole_stream(tmp_path, seed, n, separator):
    rng = np.random.default_rng(seed)
    # every other seed starts with row groups holding no kept token: their pieces have no
    # document, so the first real document's assumed separator must be dropped
    docs_a = _docs(rng, 30, empty_head=6 if seed % 2 else 0)
    docs_b = _docs(rng, 9)
    _write(tmp_path / "a.parquet", docs_a, row_group_size=int(rng.integers(1, 6)))
    _write(tmp_path / "b.parquet", docs_b, row_group_size=4)
    source = CorpusSource(inputs=(str(tmp_path / "*.parquet"),), column="ids")
    spec = CountSpec(n, V, "pack", exclude_ids=(5,), separator_id=separator)
    shards = plan_shards(source, spec, shard_bytes=1)  # one shard per row group
    assert len(shards) > 2  # the inputs really are cut into pieces
    rng.shuffle(shards)  # any order of pieces
    got = _stitched(tmp_path, source, spec, shards)
    expected = count_corpus(source, spec, show_progress=False)
    assert got.equals(expected), (got.windows, expected.windows, got.tokens, expected.tokens)
    assert got.fingerprint == expected.fingerprint


def test_a_missing_piece_is_refused_with_the_input_named(tmp_path):
    rng = np.random.default_rng(0)
    _write(tmp_path / "a.parquet", _docs(rng, 20), row_group_size=5)
    source = CorpusSource(inputs=(str(tmp_path / "a.parquet"),), column="ids")
    spec = CountSpec(4, V, "pack", separator_id=V - 1)
    shards = plan_shards(source, spec, shard_bytes=1)
    items = []
    for s in shards[:-1]:
        save_counts(count_shard(s, source, spec), tmp_path / s.shard_id)
        items.append((str(tmp_path / s.shard_id), 1))
    with pytest.raises(InputError, match=r"a.parquet: pack mode needs every piece of an input .* have pieces \[0, 1, 2\] of 4"):
        stitch(items, spec)
