"""The encodings catalog against explicit formulas, and the spec parser."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from posstats.analysis import AnalysisConfig
from posstats.errors import InputError, PosstatsError
from posstats.geometry.encodings import (
    DEFAULT_ENCODINGS,
    ENCODING_NAMES,
    Encoding,
    alibi,
    alibi_slopes,
    check_encoding_count,
    count_encoding_specs,
    learned,
    make_encoding,
    matrix_power,
    mds_encoding,
    mds_lowrank,
    parse_encoding_spec,
    random_encoding,
    rope,
    rope_rotation,
    sinusoidal,
)


def dists(p):
    return np.sqrt(((p[:, None, :] - p[None, :, :]) ** 2).sum(axis=2))


def reference_alibi_slopes(n):
    """The ALiBi reference implementation's get_slopes (Press et al.), verbatim in logic."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest_power_of_2) + reference_alibi_slopes(2 * closest_power_of_2)[0::2][
        : n - closest_power_of_2
    ]


# ---------------------------------------------------------------------------------------
# sinusoidal and RoPE


def test_sinusoidal_matches_formula():
    pos = np.array([0, 3, 7, 100])
    d = 8
    got = sinusoidal(pos, d)
    want = np.zeros((4, d))
    for r, i in enumerate(pos):
        for k in range(d // 2):
            w = 10000.0 ** (-2 * k / d)
            want[r, 2 * k] = math.sin(i * w)
            want[r, 2 * k + 1] = math.cos(i * w)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)
    assert got.dtype == np.float64
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), math.sqrt(d / 2), rtol=1e-14)
    np.testing.assert_array_equal(sinusoidal(5, 4), sinusoidal(np.arange(5), 4))


@pytest.mark.parametrize("fn", [sinusoidal, rope])
def test_odd_or_empty_dimension_raises(fn):
    with pytest.raises(ValueError, match=f"{fn.__name__} needs an even dimension, got 5"):
        fn(4, 5)
    with pytest.raises(PosstatsError, match="dimension must be >= 1, got 0"):
        fn(4, 0)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rope_with_ones_vector_reproduces_sinusoidal_distances(layout):
    pos = np.array([0, 1, 2, 5, 50, 511, 4000])
    s = sinusoidal(pos, 16)
    r = rope(pos, 16, layout=layout)
    np.testing.assert_allclose(dists(r), dists(s), rtol=1e-14, atol=1e-14)
    if layout == "interleaved":
        # Exactly the sinusoidal encoding with the sine columns negated.
        np.testing.assert_array_equal(r[:, 0::2], -s[:, 0::2])
        np.testing.assert_array_equal(r[:, 1::2], s[:, 1::2])
        np.testing.assert_array_equal(dists(r), dists(s))
    else:
        np.testing.assert_array_equal(r[:, :8], -s[:, 0::2])
        np.testing.assert_array_equal(r[:, 8:], s[:, 1::2])


def test_rope_random_vector_is_seeded_unit_and_layout_free():
    pos = np.arange(40)
    a = rope(pos, 12, vector="random", seed=3)
    np.testing.assert_array_equal(a, rope(pos, 12, vector="random", seed=3))
    assert not np.allclose(a, rope(pos, 12, vector="random", seed=4))
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, rtol=1e-14)
    b = rope(pos, 12, vector="random", seed=3, layout="half")
    np.testing.assert_allclose(dists(a), dists(b), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("vector", ["ones", "random"])
def test_matrix_power_of_block_rotation_reproduces_rope(layout, vector):
    d = 10
    pos = np.array([7, 0, 3, 1000, 3, 65537])
    want = rope(pos, d, layout=layout, vector=vector, seed=1)
    u = rope([0], d, layout=layout, vector=vector, seed=1)[0]
    got = matrix_power(pos, rope_rotation(d, layout=layout), u)
    np.testing.assert_allclose(got, want, atol=1e-9)


def test_matrix_power_matches_naive_iteration():
    rng = np.random.default_rng(0)
    m = rng.standard_normal((4, 4)) / 2.5
    x = rng.standard_normal(4)
    pos = np.array([5, 0, 2, 9, 2, 1])
    got = matrix_power(pos, m, x)
    want = np.array([np.linalg.matrix_power(m, int(j)) @ x for j in pos])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(matrix_power(0, m, x), np.zeros((0, 4)))
    with pytest.raises(ValueError, match="square"):
        matrix_power(3, np.ones((2, 3)), np.ones(2))
    with pytest.raises(ValueError, match="x must have shape"):
        matrix_power(3, np.eye(2), np.ones(3))


# ---------------------------------------------------------------------------------------
# ALiBi


def test_alibi_slopes_power_of_two():
    np.testing.assert_array_equal(alibi_slopes(8), 2.0 ** -np.arange(1, 9))
    np.testing.assert_allclose(alibi_slopes(16), 2.0 ** (-0.5 * np.arange(1, 17)), rtol=1e-14)
    np.testing.assert_array_equal(alibi_slopes(1), [2.0**-8])


@pytest.mark.parametrize("heads", [3, 5, 6, 12, 20, 24, 40])
def test_alibi_slopes_follow_reference_rule(heads):
    np.testing.assert_allclose(alibi_slopes(heads), reference_alibi_slopes(heads), rtol=1e-15)
    # h = 12: 8 slopes of 2^-k, then every other slope of the 16-head sequence.
    if heads == 12:
        want = [2.0**-k for k in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
        np.testing.assert_allclose(alibi_slopes(12), want, rtol=1e-15)


def test_alibi_is_rank_one_linear_and_padded():
    pos = np.array([0, 2, 9, 30])
    p = alibi(pos, 16, heads=12)
    assert p.shape == (4, 16)
    assert np.linalg.matrix_rank(p) == 1
    np.testing.assert_array_equal(p[:, 12:], 0.0)
    np.testing.assert_allclose(p[:, :12], np.multiply.outer(pos, alibi_slopes(12)), rtol=1e-15)
    m = np.linalg.norm(alibi_slopes(12))
    np.testing.assert_allclose(dists(p), m * np.abs(np.subtract.outer(pos, pos)), rtol=1e-13)
    # Default heads: min(dim, 8).
    np.testing.assert_array_equal(alibi(pos, 16), alibi(pos, 16, heads=8))
    np.testing.assert_array_equal(alibi(pos, 4), alibi(pos, 4, heads=4))
    with pytest.raises(PosstatsError, match="12 heads do not fit in dimension 8"):
        alibi(pos, 8, heads=12)
    with pytest.raises(PosstatsError, match="heads must be a positive integer"):
        alibi(pos, 8, heads=0)


# ---------------------------------------------------------------------------------------
# random


def test_random_is_seeded_and_rows_depend_only_on_position():
    d = 6
    pos = np.array([4097, 3, 4095, 4096, 9000, 3])
    full = np.random.default_rng(5).standard_normal((9001, d))
    got = random_encoding(pos, d, sigma=0.02, seed=5)
    np.testing.assert_allclose(got, 0.02 * full[pos], rtol=1e-15)
    np.testing.assert_array_equal(random_encoding(10, d, seed=5)[[3, 7]], random_encoding([3, 7], d, seed=5))
    np.testing.assert_array_equal(random_encoding(10, d), random_encoding(10, d))
    assert not np.allclose(random_encoding(10, d, seed=0), random_encoding(10, d, seed=1))
    with pytest.raises(PosstatsError, match="sigma must be a positive number"):
        random_encoding(10, d, sigma=0)


# ---------------------------------------------------------------------------------------
# learned


def write_bf16_safetensors(path, key, array):
    """A safetensors file holding one bfloat16 tensor (truncated float32), written by hand."""
    words = (np.asarray(array, dtype=np.float32).view(np.uint32) >> 16).astype("<u2")
    data = words.tobytes()
    header = json.dumps({key: {"dtype": "BF16", "shape": list(array.shape), "data_offsets": [0, len(data)]}}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)


def test_learned_npy_rows_columns_and_padding(tmp_path):
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    f = tmp_path / "pos.npy"
    np.save(f, table)
    got = learned([2, 0, 9], 6, path=f)
    np.testing.assert_array_equal(got[:, :4], table[[2, 0, 9]])
    np.testing.assert_array_equal(got[:, 4:], 0.0)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(learned(3, 2, path=str(f)), table[:3, :2])
    with pytest.raises(InputError, match=r"pos.npy: shape \(10, 4\) has 10 positions, but position 10"):
        learned(11, 4, path=f)
    with pytest.raises(InputError, match="applies only to safetensors"):
        learned(3, 4, path=f, key="wpe.weight")


@pytest.mark.parametrize(
    "key", ["bert.embeddings.position_embeddings.weight", "embeddings.position_embeddings.weight", "wpe.weight", "transformer.wpe.weight"]
)
def test_learned_safetensors_autodetects_key(tmp_path, key):
    rng = np.random.default_rng(0)
    table = rng.standard_normal((12, 5)).astype(np.float32)
    f = tmp_path / "model.safetensors"
    save_file({key: table, "other.weight": np.zeros((3, 3), np.float32)}, str(f))
    np.testing.assert_array_equal(learned(np.arange(12), 5, path=f), table.astype(np.float64))
    np.testing.assert_array_equal(learned([1], 5, path=f, key=key), table[[1]])


def test_learned_safetensors_errors(tmp_path):
    f = tmp_path / "model.safetensors"
    save_file({"a.wpe.weight": np.zeros((4, 2)), "b.wpe.weight": np.zeros((4, 2)), "x": np.zeros(3)}, str(f))
    with pytest.raises(InputError, match="several position-embedding tensors"):
        learned(2, 2, path=f)
    with pytest.raises(InputError, match=r"model.safetensors: no tensor named 'nope'"):
        learned(2, 2, path=f, key="nope")
    with pytest.raises(InputError, match=r"\[x\]: expected a 2-D"):
        learned(2, 2, path=f, key="x")
    with pytest.raises(InputError, match=r"\[a.wpe.weight\]: shape \(4, 2\) has 4 positions, but position 7"):
        learned(8, 2, path=f, key="a.wpe.weight")
    g = tmp_path / "empty.safetensors"
    save_file({"h.0.attn.weight": np.zeros((2, 2))}, str(g))
    with pytest.raises(InputError, match="no position-embedding tensor found"):
        learned(2, 2, path=g)
    with pytest.raises(InputError, match="no such file"):
        learned(2, 2, path=tmp_path / "missing.safetensors")
    bad = tmp_path / "table.txt"
    bad.write_text("1 2")
    with pytest.raises(InputError, match="unsupported file type"):
        learned(2, 2, path=bad)


def test_learned_bfloat16(tmp_path):
    table = np.array([[1.0, -2.5], [0.15625, 3.0], [7.0, 0.0]], dtype=np.float32)
    f = tmp_path / "bf16.safetensors"
    write_bf16_safetensors(f, "wpe.weight", table)
    np.testing.assert_array_equal(learned(3, 2, path=f), table)


# ---------------------------------------------------------------------------------------
# MDS


def test_mds_encodings_pad_and_truncate():
    coords = np.arange(12, dtype=np.float64).reshape(4, 3)
    res = SimpleNamespace(encoding=coords)
    np.testing.assert_array_equal(mds_encoding(res, 5), np.hstack([coords, np.zeros((4, 2))]))
    np.testing.assert_array_equal(mds_encoding(res, 2), coords[:, :2])
    low = mds_lowrank(res, 6, 2)
    np.testing.assert_array_equal(low, np.hstack([coords[:, :2], np.zeros((4, 4))]))
    np.testing.assert_array_equal(mds_lowrank(res, 6, 5), mds_encoding(res, 6))
    with pytest.raises(PosstatsError, match="rank must be an integer in 1..6"):
        mds_lowrank(res, 6, 7)
    with pytest.raises(PosstatsError, match="rank must be an integer in 1..6"):
        mds_lowrank(res, 6, 0)
    with pytest.raises(TypeError, match="'encoding' attribute"):
        mds_encoding(object(), 3)


# ---------------------------------------------------------------------------------------
# spec strings


@pytest.mark.parametrize(
    ("spec", "name", "params", "canonical"),
    [
        ("mds", "mds", {}, "mds"),
        ("mds-lowrank:8", "mds-lowrank", {"rank": 8}, "mds-lowrank:8"),
        ("mds-lowrank:rank=8", "mds-lowrank", {"rank": 8}, "mds-lowrank:8"),
        ("sinusoidal", "sinusoidal", {"base": 10000.0}, "sinusoidal"),
        ("sinusoidal:500", "sinusoidal", {"base": 500.0}, "sinusoidal:500"),
        ("rope", "rope", {"layout": "interleaved", "vector": "ones", "seed": 0}, "rope"),
        ("rope-half", "rope", {"layout": "half"}, "rope:layout=half"),
        ("rope:layout=half:vector=random", "rope", {"layout": "half", "vector": "random"}, "rope:layout=half:vector=random"),
        ("rope-half:vector=random:seed=2", "rope", {"layout": "half", "seed": 2}, "rope:layout=half:vector=random:seed=2"),
        ("alibi", "alibi", {"heads": None}, "alibi"),
        ("alibi:12", "alibi", {"heads": 12}, "alibi:12"),
        ("random", "random", {"sigma": 1.0, "seed": 0}, "random"),
        ("random:1", "random", {"sigma": 1.0}, "random"),
        ("random:0.02", "random", {"sigma": 0.02}, "random:0.02"),
        ("random:sigma=0.02:seed=4", "random", {"sigma": 0.02, "seed": 4}, "random:0.02:seed=4"),
        (" Random:0.02 ", "random", {"sigma": 0.02}, "random:0.02"),
        ("learned:/ck/bert.safetensors", "learned", {"path": "/ck/bert.safetensors", "key": None}, "learned:/ck/bert.safetensors"),
        ("learned:C:\\ck\\m.safetensors:key=wpe.weight", "learned", {"path": "C:\\ck\\m.safetensors", "key": "wpe.weight"}, "learned:C:\\ck\\m.safetensors:key=wpe.weight"),
        ("matrix-power:m.safetensors", "matrix-power", {"path": "m.safetensors"}, "matrix-power:m.safetensors"),
    ],
)
def test_parse_valid_specs(spec, name, params, canonical):
    parsed = parse_encoding_spec(spec)
    assert parsed.name == name
    for k, v in params.items():
        assert parsed.params[k] == v
    assert parsed.canonical == canonical
    assert parse_encoding_spec(canonical) == parsed
    assert json.loads(json.dumps(parsed.to_dict()))["canonical"] == canonical


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("fourier", "unknown encoding 'fourier'.*valid names: mds, mds-lowrank, mds-smacof, sinusoidal, rope"),
        ("", "empty encoding spec"),
        ("mds-lowrank", "needs a rank"),
        ("mds-lowrank:eight", "bad rank 'eight'"),
        ("mds:3", "takes no parameters"),
        ("random:0.02:0.5", "only one bare value"),
        ("random:0.02:sigma=0.5", "sigma given twice"),
        ("random:nan", "bad sigma"),
        ("rope:layout=diagonal", "bad layout 'diagonal'.*interleaved, half"),
        ("rope:heads=3", "rope has no parameter 'heads'"),
        ("learned", "needs a path"),
        ("alibi:2.5", "bad heads"),
    ],
)
def test_parse_errors(spec, match):
    with pytest.raises(PosstatsError, match=match):
        parse_encoding_spec(spec)


spec_values = {
    "mds-lowrank": st.integers(1, 64).map(str),
    "sinusoidal": st.sampled_from(["10000", "500", "1e4", "2.5"]),
    "alibi": st.integers(1, 32).map(str),
    "random": st.sampled_from(["1", "0.02", "1.5", "3e-3"]),
}


@settings(max_examples=50, deadline=None)
@given(name=st.sampled_from(sorted(spec_values)), data=st.data(), seed=st.none() | st.integers(0, 9))
def test_property_canonical_round_trips(name, data, seed):
    spec = f"{name}:{data.draw(spec_values[name])}"
    if seed is not None and name == "random":
        spec += f":seed={seed}"
    parsed = parse_encoding_spec(spec)
    again = parse_encoding_spec(parsed.canonical)
    assert again == parsed
    assert again.canonical == parsed.canonical


# ---------------------------------------------------------------------------------------
# make_encoding


def test_default_encodings_build():
    pos = np.array([0, 1, 2, 4, 7])
    mds = SimpleNamespace(encoding=np.random.default_rng(0).standard_normal((5, 3)))
    distances = np.linalg.norm(mds.encoding[:, None] - mds.encoding[None], axis=-1)  # mds-smacof fits them
    names = []
    for spec in DEFAULT_ENCODINGS:
        enc = make_encoding(spec, pos, 8, mds=mds, distances=distances)
        assert isinstance(enc, Encoding)
        assert enc.matrix.shape == (5, 8)
        assert enc.matrix.dtype == np.float64
        assert enc.to_dict() == {"name": enc.name, "shape": [5, 8]}
        names.append(enc.name)
    assert tuple(names) == DEFAULT_ENCODINGS  # already canonical
    assert set(ENCODING_NAMES) >= {"mds", "mds-lowrank", "sinusoidal", "rope", "rope-half", "alibi", "random", "learned"}


def test_make_encoding_dispatches_to_constructors(tmp_path):
    pos = np.array([0, 3, 5])
    np.testing.assert_array_equal(make_encoding("rope-half:vector=random", pos, 6).matrix, rope(pos, 6, layout="half", vector="random"))
    np.testing.assert_array_equal(make_encoding("random:0.02:seed=3", pos, 4).matrix, random_encoding(pos, 4, sigma=0.02, seed=3))
    np.testing.assert_array_equal(make_encoding("alibi:3", pos, 4).matrix, alibi(pos, 4, heads=3))
    np.testing.assert_array_equal(make_encoding("sinusoidal:100", pos, 4).matrix, sinusoidal(pos, 4, base=100))
    mds = SimpleNamespace(encoding=np.ones((3, 5)))
    np.testing.assert_array_equal(make_encoding("mds-lowrank:2", pos, 4, mds=mds).matrix, mds_lowrank(mds, 4, 2))
    f = tmp_path / "wpe.safetensors"
    save_file({"wpe.weight": np.arange(20.0).reshape(10, 2)}, str(f))
    enc = make_encoding(f"learned:{f}", pos, 3)
    assert enc.name == f"learned:{f}"
    np.testing.assert_array_equal(enc.matrix, learned(pos, 3, path=f))
    g = tmp_path / "mp.safetensors"
    save_file({"M": rope_rotation(4), "x": np.array([0.0, 1.0, 0.0, 1.0])}, str(g))
    np.testing.assert_allclose(make_encoding(f"matrix-power:{g}", pos, 6).matrix[:, :4], rope(pos, 4), atol=1e-12)


@pytest.mark.parametrize(
    ("spec", "dim", "match"),
    [
        ("sinusoidal", 5, "sinusoidal needs an even dimension, got 5"),
        ("rope-half", 7, "rope needs an even dimension, got 7"),
        ("random", 0, "dimension must be >= 1, got 0"),
        ("mds-lowrank:9", 8, r"rank must be an integer in 1..8"),
        ("mds-lowrank:0", 8, r"rank must be an integer in 1..8"),
        ("alibi:16", 8, "16 heads do not fit"),
        ("random:-1", 8, "sigma must be a positive number"),
        ("mds", 8, "needs an MDS result"),
        ("learned:/nonexistent/x.safetensors", 8, "no such file"),
        ("nope", 8, "unknown encoding"),
    ],
)
def test_make_encoding_errors(spec, dim, match):
    with pytest.raises(PosstatsError, match=match):
        make_encoding(spec, np.arange(4), dim)


def test_make_encoding_checks_mds_rows():
    with pytest.raises(PosstatsError, match=r"MDS result has shape \(3, 2\), but there are 4 positions"):
        make_encoding("mds", np.arange(4), 2, mds=SimpleNamespace(encoding=np.zeros((3, 2))))


@pytest.mark.parametrize("bad", [np.array([[0, 1]]), np.array([0.0, 1.0]), np.array([-1, 2])])
def test_bad_positions_raise(bad):
    with pytest.raises(ValueError, match="positions"):
        sinusoidal(bad, 4)


@pytest.mark.parametrize("kind", ["float8_e4m3fn", "float8_e5m2", "bfloat16"])
def test_learned_tables_in_bf16_and_fp8_read_like_torch(tmp_path, kind):
    """One safetensors reader: the learned: encoding (and the audit) widen bf16 and both 8-bit
    float formats exactly as torch does (no crash, no traceback)."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file as save_torch

    from posstats.storage.tensors import SafetensorsFile

    table = torch.randn(12, 6) * 3
    stored = table.to(getattr(torch, kind))
    path = tmp_path / "t.safetensors"
    save_torch({"wpe.weight": stored}, str(path))
    want = stored.to(torch.float32).numpy()
    np.testing.assert_array_equal(SafetensorsFile(path).get("wpe.weight"), want)
    enc = make_encoding(f"learned:{path}", np.arange(12), 6)
    np.testing.assert_array_equal(enc.matrix, want.astype(np.float64))


def test_float8_tables_cover_every_byte_like_torch():
    torch = pytest.importorskip("torch")
    from posstats.storage.tensors import float8_table

    raw = torch.arange(256, dtype=torch.uint8)
    for name, kind in (("F8_E4M3", torch.float8_e4m3fn), ("F8_E5M2", torch.float8_e5m2)):
        np.testing.assert_array_equal(float8_table(name), raw.view(kind).to(torch.float32).numpy())


def test_sweeps_are_counted_before_they_are_expanded_and_bounded():
    huge = "rope:factor=" + "|".join(map(str, range(1, 101))) + ",theta=" + "|".join(map(str, range(2, 102))) + \
           ",vector=" + "|".join(["interleaved", "half"] * 50)
    assert count_encoding_specs(["mds", "rope:factor=1|2|4", huge]) == 1 + 3 + 1_000_000
    with pytest.raises(PosstatsError, match=r"expands to 1,000,001 encodings .* limit of 256 .* raise the limit with max_encodings"):
        check_encoding_count(["mds", huge])
    assert check_encoding_count(["rope:factor=1|2|4"], limit=3) == 3
    with pytest.raises(PosstatsError, match="limit of 2 "):
        AnalysisConfig(encodings=("rope:factor=1|2|4",), max_encodings=2)
    assert len(AnalysisConfig(encodings=("rope:factor=1|2|4",), max_encodings=3).encodings) == 3


def test_a_huge_sweep_is_refused_at_once_by_analyze(tmp_path, capsys):
    from posstats.cli import main

    counts = tmp_path / "counts"
    (tmp_path / "c.jsonl").write_text('{"ids": [1, 2, 3, 4]}\n{"ids": [4, 3, 2, 1]}\n')
    assert main(["count", "--input", str(tmp_path / "c.jsonl"), "--column", "ids", "--vocab-size", "8",
                 "--positions", "4", "--out", str(counts)]) == 0
    axis = "|".join(map(str, range(1, 101)))
    spec = f"rope:factor={axis},theta={axis},original={axis}"
    capsys.readouterr()
    assert main(["analyze", "--counts", str(counts), "--encodings", spec, "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("posstats: error: --encodings expands to 1,000,000 encodings") and err.count("\n") == 1
    assert not (tmp_path / "a").exists()


def test_an_encoding_family_is_one_registered_module(tmp_path):
    """The registry (issue #29): every name comes from a family module; fitted families are
    the ones built from the MDS; a family added at run time is parsed, listed, built and
    classified without touching any other module."""
    from posstats.geometry.encodings import FITTED_ENCODINGS, catalog

    assert set(FITTED_ENCODINGS) == {"mds", "mds-lowrank", "mds-smacof"}
    assert all("mds" in catalog.FAMILIES[n].needs for n in FITTED_ENCODINGS)
    assert [n for n, f in catalog.FAMILIES.items() if f.quadratic] == ["mds-smacof"]
    family = catalog.Family("ramp-test", (catalog.Param("slope", catalog.float_param, 1.0),), order=999,
                            build=lambda s, pos, dim, _: np.outer(pos * s.params["slope"], np.ones(dim)))
    catalog.register(family)
    try:
        enc = catalog.make_encoding("ramp-test:2", 3, 2)
        assert enc.name == "ramp-test:2" and enc.matrix.tolist() == [[0, 0], [2, 2], [4, 4]]
        assert catalog.encoding_names()[-2:] == ("ramp-test", "rope-half")
        assert "ramp-test" not in catalog.fitted_names()
        with pytest.raises(ValueError, match="registered twice"):
            catalog.register(family)
    finally:
        del catalog.FAMILIES["ramp-test"]
