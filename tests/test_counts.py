"""Counting kernel against a brute-force oracle, exactness, merging, storage."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from posstats.counting.counts import (
    CountAccumulator,
    CountSpec,
    PositionalCounts,
    combine_fingerprints,
    count_sequences,
)
from posstats.counting.io import load_counts, save_counts
from posstats.counting.tokens import TokenBatch
from posstats.errors import InputError


def oracle(seqs, n, V, mode="truncate", exclude=(), sep=None):
    """Python-loop reference of THEORY section 1."""
    C = np.zeros((n, V), dtype=np.int64)
    stream = []
    for s in seqs:
        kept = [t for t in s if t not in set(exclude)]
        if mode == "truncate":
            for i, t in enumerate(kept[:n]):
                C[i, t] += 1
        elif mode == "chunk":
            for i, t in enumerate(kept):
                C[i % n, t] += 1
        else:
            if not kept:
                continue
            if stream and sep is not None:
                stream.append(sep)
            stream.extend(kept)
    for i, t in enumerate(stream):
        C[i % n, t] += 1
    return C


sequences = st.lists(st.lists(st.integers(0, 11), max_size=15), max_size=12)


@pytest.mark.parametrize("mode", ["truncate", "chunk", "pack"])
@pytest.mark.parametrize("dense", [True, False])
@settings(max_examples=40, deadline=None)
@given(seqs=sequences, n=st.integers(1, 6), exclude=st.sets(st.integers(0, 11), max_size=3))
def test_counts_match_oracle(mode, dense, seqs, n, exclude):
    sep = 11 if mode == "pack" else None
    got = count_sequences(seqs, positions=n, vocab_size=12, mode=mode, exclude_ids=exclude, separator_id=sep, dense=dense)
    expected = oracle(seqs, n, 12, mode, exclude, sep)
    np.testing.assert_array_equal(got.to_dense().matrix, expected)
    assert got.tokens == expected.sum()
    assert got.sequences == len(seqs)
    np.testing.assert_array_equal(got.occupancy(), expected.sum(axis=1))


@settings(max_examples=40, deadline=None)
@given(seqs=sequences, n=st.integers(1, 6), cut=st.integers(0, 12))
def test_pack_state_carries_across_batches_of_one_source(seqs, n, cut):
    spec = CountSpec(n, 12, "pack", separator_id=0)
    acc = CountAccumulator(spec)
    acc.add(TokenBatch.from_sequences(seqs[:cut], source="f"))
    acc.add(TokenBatch.from_sequences(seqs[cut:], source="f"))
    np.testing.assert_array_equal(acc.result().matrix, oracle(seqs, n, 12, "pack", sep=0))


@pytest.mark.parametrize("mode", ["truncate", "chunk", "pack"])
@settings(max_examples=40, deadline=None)
@given(seqs=sequences, n=st.integers(1, 9), block=st.integers(1, 4), cuts=st.lists(st.integers(0, 12), max_size=3))
def test_position_blocks_and_batch_cuts_never_change_counts(mode, seqs, n, block, cuts):
    spec = CountSpec(n, 12, mode, separator_id=11 if mode == "pack" else None)
    acc = CountAccumulator(spec, block_positions=block)
    bounds = [0, *sorted(cuts), len(seqs)]
    for a, b in zip(bounds[:-1], bounds[1:]):
        acc.add(TokenBatch.from_sequences(seqs[a:b], source="one-file"))
    np.testing.assert_array_equal(acc.result().matrix, oracle(seqs, n, 12, mode, sep=spec.separator_id))


def test_out_buffer_is_zeroed_and_shared():
    spec = CountSpec(3, 10)
    buf = np.full((3, 10), 7, dtype=np.int64)
    acc = CountAccumulator(spec, out=buf)
    acc.add(TokenBatch.from_sequences([[1, 2, 3, 4], [5]]))
    got = acc.result(copy=False)
    assert got.matrix is buf
    np.testing.assert_array_equal(buf, oracle([[1, 2, 3, 4], [5]], 3, 10, "truncate"))
    for bad in (np.zeros((3, 9), np.int64), np.zeros((3, 10), np.int32), np.zeros((10, 3), np.int64).T):
        with pytest.raises(ValueError, match="out must be"):
            CountAccumulator(spec, out=bad)


def test_pack_restarts_at_a_new_source():
    spec = CountSpec(4, 10, "pack")
    acc = CountAccumulator(spec)
    acc.add(TokenBatch.from_sequences([[1, 2, 3]], source="a"))
    acc.add(TokenBatch.from_sequences([[4, 5]], source="b"))
    got = acc.result()
    assert got.matrix[0, 1] == 1 and got.matrix[0, 4] == 1  # both streams start at 0
    assert got.windows == 2


def test_windows_per_mode():
    seqs = [[1] * 5, [2] * 3, []]
    assert count_sequences(seqs, positions=2, vocab_size=3).windows == 2
    assert count_sequences(seqs, positions=2, vocab_size=3, mode="chunk").windows == 3 + 2
    assert count_sequences(seqs, positions=2, vocab_size=3, mode="pack").windows == 4


@settings(max_examples=30, deadline=None)
@given(seqs=sequences, k=st.integers(1, 5), seed=st.integers(0, 100))
def test_sharded_counts_add_up_exactly_in_any_order(seqs, k, seed):
    whole = count_sequences(seqs, positions=4, vocab_size=12, exclude_ids=[3])
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, size=len(seqs))
    parts = [
        count_sequences([s for s, lab in zip(seqs, labels) if lab == j], positions=4, vocab_size=12, exclude_ids=[3], dense=bool(j % 2))
        for j in range(k)
    ]
    rng.shuffle(parts)
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    assert total.equals(whole)
    assert total.matrix.dtype == np.int64


def test_subtraction_removes_a_shard():
    a = count_sequences([[1, 2]], positions=3, vocab_size=5)
    b = count_sequences([[2, 2, 4]], positions=3, vocab_size=5)
    assert ((a + b) - b).equals(a)


def test_fingerprints_combine_order_free():
    f = ["0a", "ff", "31"]
    assert combine_fingerprints(combine_fingerprints(f[0], f[1]), f[2]) == combine_fingerprints(f[2], combine_fingerprints(f[1], f[0]))
    assert combine_fingerprints("", "ab") == "ab"


@pytest.mark.parametrize("bad, value", [([[1, 2], [3, 12]], 12), ([[0], [-1]], -1)])
def test_out_of_range_ids_name_file_row_value(bad, value):
    acc = CountAccumulator(CountSpec(4, 12))
    with pytest.raises(InputError, match=rf"corpus\.jsonl: row 8: .*{value}"):
        acc.add(TokenBatch.from_sequences(bad, source="corpus.jsonl", first_row=7))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"positions": 0, "vocab_size": 4}, "positions"),
        ({"positions": 2, "vocab_size": 4, "mode": "stride"}, "unknown position mode"),
        ({"positions": 2, "vocab_size": 4, "exclude_ids": (9,)}, "excluded token id 9"),
        ({"positions": 2, "vocab_size": 4, "separator_id": 1}, "only used in pack"),
        ({"positions": 2**31 + 1, "vocab_size": 4}, r"positions 2,147,483,649 is too large: .* at most 2,147,483,648"),
        ({"positions": 2, "vocab_size": 2**33}, r"vocab_size 8,589,934,592 is too large: .* at most 2,147,483,648"),
    ],
)
def test_bad_specs(kwargs, match):
    with pytest.raises(InputError, match=match):
        CountSpec(**kwargs)


def test_largest_storable_spec_is_exact(tmp_path):
    """V = n = 2**31 are allowed: the largest id and position (2**31 - 1) fit the int32
    columns of sparse counts files, and the kernel's int64 keys stay exact."""
    spec = CountSpec(2**31, 2**31)
    acc = CountAccumulator(CountSpec(3, 2**31), dense=False)
    acc.add(TokenBatch.from_sequences([[2**31 - 1, 0, 2**31 - 2]]))
    back = load_counts(save_counts(acc.result(), tmp_path / "edge"))
    coo = back.matrix.tocoo()
    assert sorted(zip(coo.row.tolist(), coo.col.tolist())) == [(0, 2**31 - 1), (1, 0), (2, 2**31 - 2)]
    assert spec.positions == spec.vocab_size == 2**31


def test_long_documents_truncate_exactly():
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 50, size=L) for L in rng.integers(0, 300, size=40)]
    got = count_sequences(seqs, positions=64, vocab_size=50)
    np.testing.assert_array_equal(got.matrix, oracle([s.tolist() for s in seqs], 64, 50))


def _stored_dtypes(path):
    import json
    import struct

    raw = path.read_bytes()
    header = json.loads(raw[8 : 8 + struct.unpack("<Q", raw[:8])[0]])
    return {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}


@pytest.mark.parametrize(("n", "seqs", "stored"), [
    (3, [[1, 2, 3], [3, 3], [4, 5, 1]], "counts.safetensors"),  # 7 of 18 cells: dense is smaller
    (40, [[1, 2, 3], [3, 3]], "counts.csr.safetensors"),  # 5 of 240 cells: sparse is smaller
])
@pytest.mark.parametrize("in_memory_sparse", [False, True])
def test_storage_is_chosen_by_size_not_by_layout(tmp_path, n, seqs, stored, in_memory_sparse):
    c = count_sequences(seqs, positions=n, vocab_size=6, mode="chunk", exclude_ids=[0])
    c = c.to_sparse() if in_memory_sparse else c.to_dense()
    c = PositionalCounts(c.spec, c.matrix, c.sequences, c.windows, c.tokens, "beef", {"tokenizer_hash": "abc"})
    path = save_counts(c, tmp_path / "run")
    assert path.name == stored
    assert set(_stored_dtypes(path).values()) <= {"U16", "I32", "I64"} and ({"I32", "U16"} & set(_stored_dtypes(path).values()))
    back = load_counts(tmp_path / "run")
    assert back.equals(c) and (back.matrix.dtype == np.int64)
    assert back.fingerprint == "beef" and back.metadata == {"tokenizer_hash": "abc"}
    assert back.spec == c.spec
    # a folder holding another kind of counts file keeps exactly the new one
    (tmp_path / "run" / "counts.parquet").write_bytes(b"stale")
    other = "counts.csr.safetensors" if stored == "counts.safetensors" else "counts.safetensors"
    (tmp_path / "run" / other).write_bytes(b"stale")
    save_counts(c, tmp_path / "run")
    assert [p.name for p in (tmp_path / "run").glob("counts.*")] == [stored]
    assert not list((tmp_path / "run").glob(".*tmp"))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 9), st.integers(1, 7), st.integers(1, 40), st.booleans(), st.integers(0, 2**40))
def test_csr_from_dense_is_the_dense_matrix_block_by_block(n, vocab, block, compact, seed):
    """Any shape (empty rows, an all-zero matrix, blocks of one row or of all), compact or
    not: the same counts as ``scipy.sparse.csr_array``, in canonical order, int32 ids, and
    int32 counts only when compact and every count fits."""
    from posstats.counting.io import csr_from_dense

    rng = np.random.default_rng(seed)
    dense = rng.integers(0, 4, size=(n, vocab)) * (rng.random((n, vocab)) < 0.4)
    if n and seed % 3 == 0:
        dense[rng.integers(0, n)] = 0
    got = csr_from_dense(dense, compact=compact, block_entries=block)
    want = sp.csr_array(dense)
    assert got.shape == (n, vocab) and got.has_canonical_format
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.data, want.data)
    assert got.data.dtype == (np.int32 if compact else np.int64)
    assert got.indices.dtype == np.int32 or got.nnz == 0  # scipy keeps int64 ids on an empty array
    big = np.array([[0, 2**31], [1, 0]])
    assert csr_from_dense(big, compact=True).data.dtype == np.int64  # 2**31 does not fit int32: kept exact


def test_a_large_dense_counts_file_is_loaded_compact_as_csr(tmp_path, monkeypatch):
    """``load_counts(compact=True)`` holds a dense file of ``DENSE_AS_SPARSE_ENTRIES`` cells
    or more as int32 CSR (the analysis' loader: a dense int64 matrix of 131,072 x 5,000 is
    5.2 GB, and every step made CSR of it again); smaller files and ``compact=False`` keep
    the dense int64 matrix. The counts are the same either way."""
    import posstats.counting.io as io

    c = count_sequences([[1, 2, 3], [3, 3], [4, 5, 1]], positions=3, vocab_size=6, mode="chunk", exclude_ids=[0])
    path = save_counts(c, tmp_path / "run")
    assert path.name == "counts.safetensors"  # dense on disk
    assert not load_counts(tmp_path / "run", compact=True).is_sparse  # 18 cells: below the limit
    monkeypatch.setattr(io, "DENSE_AS_SPARSE_ENTRIES", 18)
    back = load_counts(tmp_path / "run", compact=True)
    assert back.is_sparse and back.matrix.dtype == np.int32 and back.equals(c)
    plain = load_counts(tmp_path / "run")
    assert not plain.is_sparse and plain.matrix.dtype == np.int64 and plain.equals(c)


def test_analysis_of_large_dense_counts_runs_on_csr_rows_with_the_same_answer(monkeypatch):
    """Dense counts of ``DENSE_AS_SPARSE_ENTRIES`` cells or more are analysed as int32 CSR
    rows: the same report as the same counts given sparse (the limit lowered here; at its
    value a dense 131,072 x 5,000 drift went through COO in each step and passed 24 GB)."""
    import posstats.analysis.pipeline as pipeline
    import posstats.analysis.rows as rows
    from posstats.analysis import AnalysisConfig, analyze
    from posstats.testing import known_corpus

    sparse = known_corpus("drift", 40, tokens=300, vocab=200, seed=3).counts
    dense = sparse.to_dense()
    cfg = AnalysisConfig(dims=(2,), encodings=("mds", "sinusoidal"), held_out="off")
    seen = []
    real = pipeline._analysis

    def spy(counts, config, g, **kw):
        seen.append((sp.issparse(g.rows), getattr(g.rows, "dtype", None)))
        return real(counts, config, g, **kw)

    monkeypatch.setattr(pipeline, "_analysis", spy)
    monkeypatch.setattr(rows, "DENSE_AS_SPARSE_ENTRIES", 40 * 200)
    want = analyze(sparse, cfg).report().to_dict()
    got = analyze(dense, cfg).report().to_dict()
    assert seen[1] == (True, np.int32)
    for key in ("spectrum", "verdict", "encodings", "hellinger"):
        assert got[key] == want[key], key
    monkeypatch.setattr(rows, "DENSE_AS_SPARSE_ENTRIES", 40 * 200 + 1)
    analyze(dense, cfg)
    assert seen[2] == (False, np.int64)  # below the limit dense rows stay dense


@pytest.mark.parametrize("n", [3, 40])
def test_rows_read_as_slices_of_either_storage(tmp_path, n):
    from posstats.counting.io import load_header, load_rows, load_selected_rows

    rng = np.random.default_rng(n)
    seqs = [list(rng.integers(0, 6, size=rng.integers(0, 2 * n))) for _ in range(9)]
    c = count_sequences(seqs, positions=n, vocab_size=6, mode="chunk")
    save_counts(c, tmp_path / "r")
    dense = c.to_dense().matrix
    for a, b in [(0, n), (0, 1), (1, n), (n - 1, n), (2, 2)]:
        rows = load_rows(tmp_path / "r", a, b)
        assert rows.shape == (b - a, 6) and rows.dtype == np.int64
        np.testing.assert_array_equal(rows.toarray(), dense[a:b])
    head = load_header(tmp_path / "r")
    assert (head.spec, head.tokens, head.windows, head.sequences) == (c.spec, c.tokens, c.windows, c.sequences)
    with pytest.raises(ValueError, match="outside"):
        load_rows(tmp_path / "r", 0, n + 1)
    # any rows, in any order, repeated: only those read
    for picked in ([n - 1, 0, 1, 0], [1], []):
        rows = load_selected_rows(tmp_path / "r", picked)
        assert rows.shape == (len(picked), 6) and rows.dtype == np.int64
        np.testing.assert_array_equal(rows.toarray(), dense[picked])
    with pytest.raises(ValueError, match="outside"):
        load_selected_rows(tmp_path / "r", [0, n])


@pytest.mark.parametrize(("big", "stored"), [(2**16 - 1, "U16"), (2**16, "I32"), (-1, "I32"), (2**31 - 1, "I32"), (-(2**31), "I32"), (2**31, "I64"), (-(2**31) - 1, "I64")])
@pytest.mark.parametrize("n", [3, 40])
def test_counts_are_stored_as_int32_only_when_every_count_fits(tmp_path, big, stored, n):
    c = count_sequences([[1, 2, 3], [3, 3]], positions=n, vocab_size=6).to_dense()
    m = c.matrix.copy()
    m[2, 5] = big
    c = PositionalCounts(c.spec, m, c.sequences, c.windows, max(int(m.sum()), 0), "beef", {})  # tokens = C.sum()
    path = save_counts(c, tmp_path / "n")
    assert _stored_dtypes(path).get("counts", _stored_dtypes(path).get("data")) == stored
    if big < 0:  # stored exactly, but a counts file with a negative count is refused when loaded
        with pytest.raises(InputError, match=r"1 negative count\(s\), first C\[2, 5\]"):
            load_counts(path)
    else:
        back = load_counts(path)
        assert back.matrix.dtype == np.int64 and back.equals(c)
        # compact: int32 exactly where the stored type allows it (sparse files), else int64
        compact = load_counts(path, compact=True)
        sparse_narrow = path.name == "counts.csr.safetensors" and stored in ("U16", "I32")
        assert compact.matrix.dtype == (np.int32 if sparse_narrow else np.int64)
        np.testing.assert_array_equal(compact.to_dense().matrix, c.matrix)
        np.testing.assert_array_equal(compact.occupancy(), c.occupancy())


def test_legacy_parquet_counts_still_load(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    c = count_sequences([[1, 2, 3], [3, 3]], positions=3, vocab_size=6)
    coo = c.to_sparse().matrix.tocoo()
    meta = {"schema": "posstats.counts/1", **c.spec.to_metadata(), "sequences": "2", "windows": "2",
            "tokens": str(c.tokens), "fingerprint": ""}
    table = pa.table({"position": coo.row.astype(np.int32), "token": coo.col.astype(np.int32),
                      "count": coo.data.astype(np.int64)}).replace_schema_metadata(meta)
    pq.write_table(table, tmp_path / "counts.parquet")
    assert load_counts(tmp_path).equals(c)


def test_load_rejects_garbage(tmp_path):
    (tmp_path / "counts.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(InputError, match="counts.safetensors: not a readable"):
        load_counts(tmp_path)
    with pytest.raises(InputError, match="no counts.safetensors or counts.csr.safetensors"):
        load_counts(tmp_path / "..")


@pytest.mark.parametrize("mode", ["truncate", "chunk", "pack"])
@settings(max_examples=60, deadline=None)
@given(seqs=sequences, n=st.integers(1, 9), block=st.integers(1, 4), buffer=st.integers(1, 20),
       cuts=st.lists(st.integers(0, 12), max_size=3), exclude=st.sets(st.integers(0, 11), max_size=2))
def test_sorting_kernel_matches_oracle_across_blocks_and_compactions(mode, seqs, n, block, buffer, cuts, exclude):
    """The sparse kernel with several position blocks and a buffer small enough that every
    batch compacts and merges into earlier counts gives the oracle's integers."""
    spec = CountSpec(n, 12, mode, exclude_ids=tuple(exclude - {11}), separator_id=11 if mode == "pack" else None)
    acc = CountAccumulator(spec, dense=False, block_positions=block, buffer_keys=buffer)
    bounds = [0, *sorted(cuts), len(seqs)]
    for a, b in zip(bounds[:-1], bounds[1:]):
        acc.add(TokenBatch.from_sequences(seqs[a:b], source="one-file"))
    got = acc.result()
    assert got.is_sparse and got.matrix.has_canonical_format
    assert got.matrix.indices.dtype == np.int32 or got.matrix.indices.dtype == np.int64
    expected = oracle(seqs, n, 12, mode, tuple(exclude - {11}), spec.separator_id)
    np.testing.assert_array_equal(got.matrix.toarray(), expected)
    assert got.tokens == expected.sum()


@settings(max_examples=80, deadline=None)
@given(a=st.dictionaries(st.integers(0, 2**32 - 1), st.integers(1, 2**40), max_size=30),
       b=st.dictionaries(st.integers(0, 2**32 - 1), st.integers(1, 2**40), max_size=30))
def test_merge_sorted_sums_two_sorted_key_sets(a, b):
    from posstats.counting.sorted_keys import merge_sorted

    def arrays(d):
        keys = np.array(sorted(d), dtype=np.uint32)
        return keys, np.array([d[int(k)] for k in keys], dtype=np.int64)

    keys, counts = merge_sorted(*arrays(a), *arrays(b))
    expected = {k: a.get(k, 0) + b.get(k, 0) for k in a.keys() | b.keys()}
    assert keys.tolist() == sorted(expected) and counts.tolist() == [expected[k] for k in sorted(expected)]
    assert keys.dtype == np.uint32 and counts.dtype == np.int64


def test_a_full_buffer_compacts_the_largest_blocks_and_leaves_small_ones_buffered():
    """When the buffer fills, the blocks holding the most buffered tokens are compacted,
    largest first, until at most half the buffer is left; the small blocks wait (sorted
    once, at the end), a block compacted twice is merged, and the counts stay exact."""
    from posstats.counting.sorted_keys import SortedKeyCounter

    rng = np.random.default_rng(3)
    pad = np.iinfo(np.uint16).max
    c = SortedKeyCounter(positions=40, vocab_size=9, buffer_keys=100, block=4, threads=1)
    expected = np.zeros((40, 9), dtype=np.int64)

    def add(block, windows):
        rows = rng.integers(0, 9, (windows, 4)).astype(np.uint16)
        rows[rng.random(rows.shape) < 0.2] = pad  # some positions without a token
        c.add_rows(block, rows)
        for j in range(4):
            np.add.at(expected[block * 4 + j], rows[:, j][rows[:, j] != pad], 1)

    for small in range(1, 9):
        add(small, 1)  # 4 tokens each: 32 buffered
    add(0, 17)  # 68 more: 100, the buffer is full; block 0 alone leaves 32 <= 50
    assert sorted(c._done) == [0] and c._buffered == 32 and sorted(c._rows) == list(range(1, 9))
    add(0, 17)  # full again: block 0 again, merged into its first part
    assert sorted(c._done) == [0] and c._buffered == 32
    add(9, 13)  # 52 of block 9 with the 32: 84, not full
    assert sorted(c._done) == [0]
    add(5, 5)  # 20 more: 104; block 9 (52) leaves 52 > 50, then block 5 (24): 28
    assert sorted(c._done) == [0, 5, 9] and c._buffered == 28
    np.testing.assert_array_equal(c.to_csr().toarray(), expected)


def test_window_groups_are_the_same_whatever_the_buffer():
    """Truncate-mode window groups with length classes and short halves (many small
    blocks): a buffer small enough to compact the largest blocks at every batch gives the
    same counts, entry for entry, as one compaction at the end."""
    from posstats.counting.window_groups import WindowGroupCounter

    rng = np.random.default_rng(8)
    n, V = 37, 300
    lengths = rng.integers(1, 60, 400)
    values = rng.integers(0, V, lengths.sum())
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    windows = np.minimum(lengths, n)

    def count(buffer_keys):
        c = WindowGroupCounter(n, V, groups=4, classes=True, short_halves=True, buffer_keys=buffer_keys)
        for lo in range(0, lengths.size, 25):
            c.add_complete_windows(values, starts[lo:lo + 25], windows[lo:lo + 25])
        return c.result()

    once, often = count(10**9), count(600)
    assert once.short_halves and once.classes == n - 1
    assert (once.matrix != often.matrix).nnz == 0 and once.windows == often.windows
    assert once.matrix.sum() == windows.sum() + windows[windows < n][1::2].sum()  # odd short windows twice


def test_sorting_kernel_keys_fit_uint32_at_long_context():
    """n V = 131072 x 50257 > 2**32: local keys of each block stay below 2**32, so the
    last position and the last token id are counted where they belong."""
    from posstats.counting.sorted_keys import block_positions

    n, V = 131072, 50257
    assert block_positions(n, V) * V <= 2**32 < n * V
    spec = CountSpec(n, V, "pack")
    acc = CountAccumulator(spec, dense=False)
    stream = np.arange(2 * n + 5, dtype=np.int64) % V
    stream[n - 1] = V - 1  # last position, last id
    acc.add(TokenBatch(stream, np.array([0, stream.size]), "f"))
    m = acc.result().matrix
    assert m[n - 1, V - 1] == 1 and m[n - 1, (2 * n - 1) % V] == 1
    assert m[0, 0] == 1 and m[0, n % V] == 1 and m[0, (2 * n) % V] == 1
    assert int(m.sum()) == stream.size


@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("mode", ["truncate", "chunk", "pack"])
def test_int32_batches_count_like_int64_and_are_not_modified(dense, mode):
    rng = np.random.default_rng(7)
    seqs = [rng.integers(0, 30, size=rng.integers(0, 20)) for _ in range(25)]
    b64 = TokenBatch.from_sequences(seqs, source="f")
    b32 = TokenBatch(b64.values.astype(np.int32), b64.offsets, "f")
    before = b32.values.copy()
    spec = CountSpec(7, 30, mode, exclude_ids=(3,), separator_id=29 if mode == "pack" else None)
    got = [CountAccumulator(spec, dense=dense) for _ in range(2)]
    got[0].add(b64)
    got[1].add(b32)
    assert got[0].result().equals(got[1].result())
    np.testing.assert_array_equal(b32.values, before)


@settings(max_examples=60, deadline=None)
@given(dense=st.lists(st.lists(st.integers(0, 2**31 - 1), min_size=5, max_size=5), max_size=12),
       chunk=st.integers(1, 9), dtype=st.sampled_from([np.int32, np.int64]))
def test_csr_row_sums_are_exact_int64_for_any_chunk(dense, chunk, dtype):
    """Row sums in int64 whatever the chunk (one row larger than a chunk, empty rows
    between filled ones, int32 data whose row sums overflow int32)."""
    from posstats.counting.counts import csr_row_sums

    matrix = np.array(dense, dtype=dtype).reshape(-1, 5)
    got = csr_row_sums(sp.csr_array(matrix), chunk=chunk)
    assert got.dtype == np.int64
    assert got.tolist() == [sum(int(x) for x in row) for row in matrix]


@pytest.mark.parametrize("vocab", [40, 2**16 - 1, 2**16, 70_000])
def test_padded_rows_count_like_the_oracle_for_narrow_and_wide_ids(vocab):
    """Windows ending inside a block are padded with the dtype's largest value (uint16
    below V = 2**16, uint32 from there); the padding is never counted, the id V - 1 is."""
    rng = np.random.default_rng(3)
    seqs = [rng.integers(0, vocab, size=rng.integers(0, 40)) for _ in range(60)]
    seqs[0][:3] = vocab - 1  # the largest id at the first positions
    for mode in ("truncate", "chunk", "pack"):
        spec = CountSpec(16, vocab, mode)
        acc = CountAccumulator(spec, dense=False, block_positions=4)
        for a in range(0, len(seqs), 7):
            acc.add(TokenBatch.from_sequences(seqs[a : a + 7], source="f"))
        got = acc.result()
        expected = oracle(seqs, 16, vocab, mode, (), None)
        assert (got.matrix != sp.csr_array(expected)).nnz == 0, mode
        compact = CountAccumulator(spec, dense=False, block_positions=4)
        compact.add(TokenBatch.from_sequences(seqs, source="f"))
        assert compact.result(compact=True).matrix.dtype == np.int32


@pytest.mark.parametrize("positions, vocab, name", [(256, 5000, "counts.csr.safetensors"), (4, 3, "counts.safetensors"),
                                                    (40, 70_000, "counts.csr.safetensors")])
def test_counts_written_from_blocks_are_the_bytes_save_counts_writes(tmp_path, positions, vocab, name):
    """save_accumulated (blocks streamed, no CSR array) and save_counts of the same counts
    write byte-identical files, sparse (256 x 5000; 40 x 70,000: 32-bit ids) or dense (4 x
    3: the dense file is smaller); the header's totals are the counts'."""
    from posstats.counting.io import save_accumulated

    rng = np.random.default_rng(positions)
    seqs = [rng.integers(0, vocab, size=rng.integers(1, 2 * positions)) for _ in range(30)]
    spec = CountSpec(positions, vocab, "pack", separator_id=vocab - 1)
    streamed, assembled = (CountAccumulator(spec, dense=False) for _ in range(2))
    for acc in (streamed, assembled):
        for a in range(0, len(seqs), 8):
            acc.add(TokenBatch.from_sequences(seqs[a : a + 8], source="f"))
    counts = assembled.result()
    path, header, occupancy = save_accumulated(streamed, tmp_path / "streamed")
    other = save_counts(counts, tmp_path / "assembled")
    assert path.name == other.name == name
    assert path.read_bytes() == other.read_bytes()
    assert (header.tokens, header.windows, header.sequences) == (counts.tokens, counts.windows, counts.sequences)
    np.testing.assert_array_equal(occupancy, counts.occupancy())
