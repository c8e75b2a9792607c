"""RoPE scaling frequencies against transformers itself (the oracle for HF conventions)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posstats.errors import InputError, PosstatsError
from posstats.geometry.rope_scaling import (
    ROPE_TYPES,
    hf_rope,
    rope_inv_freq,
    standard_rope_parameters,
)

transformers = pytest.importorskip("transformers", reason="transformers is the oracle for RoPE scaling")
torch = pytest.importorskip("torch")

from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

# transformers computes in float32 (a few roundings, one blend with cancellation in llama3):
# agreement to float32 precision means a relative error of some tens of float32 epsilons.
F32 = 64 * float(np.finfo(np.float32).eps)


def oracle(head_dim: int, params: dict | None, mpe: int, seq_len: int | None, *, legacy: bool = False):
    """transformers' own (inv_freq, attention_factor) for a Llama config with these parameters."""
    kwargs = dict(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim, max_position_embeddings=mpe)
    if legacy:
        params = copy.deepcopy(params)
        kwargs.update(rope_scaling=params.pop("rope_scaling"), **params)
    else:
        kwargs["rope_parameters"] = copy.deepcopy(params)
    config = LlamaConfig(**kwargs)
    kind = config.rope_parameters["rope_type"]
    if kind == "default":
        inv, attention = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        inv, attention = ROPE_INIT_FUNCTIONS[kind](config, "cpu", seq_len=seq_len)
    return inv.double().numpy(), float(attention)


def random_parameters(kind: str, rng: np.random.Generator, head_dim: int) -> tuple[dict, int, int | None]:
    """One random parameter set of ``kind``: (rope_parameters, max_position_embeddings, seq_len)."""
    original = int(rng.choice([512, 2048, 4096, 8192]))
    factor = float(rng.choice([2.0, 4.0, 8.0, 16.0, 32.0])) if rng.random() < 0.8 else float(rng.uniform(1.0, 40.0))
    p: dict = {"rope_type": kind}
    if rng.random() < 0.7:
        p["rope_theta"] = float(rng.choice([10000.0, 500000.0, 1e6])) if rng.random() < 0.7 else float(rng.uniform(100, 1e7))
    if kind != "default" and rng.random() < 0.2:
        p["partial_rotary_factor"] = float(rng.choice([0.25, 0.5]))
    mpe = int(original * factor)
    seq_len = int(rng.integers(1, 4 * mpe)) if rng.random() < 0.7 else None
    if kind in ("linear", "dynamic"):
        p["factor"] = factor
        mpe = original  # dynamic: max_position_embeddings is the trained length
    elif kind == "yarn":
        p["factor"] = factor if rng.random() < 0.85 else None
        if rng.random() < 0.8:
            p["original_max_position_embeddings"] = original
        for key, lo, hi in (("beta_fast", 8, 64), ("beta_slow", 0.5, 4)):
            if rng.random() < 0.4:
                p[key] = float(rng.uniform(lo, hi))
        if rng.random() < 0.3:
            p["mscale"], p["mscale_all_dim"] = float(rng.uniform(0.5, 1.5)), float(rng.uniform(0.5, 1.5))
        if rng.random() < 0.2:
            p["attention_factor"] = float(rng.uniform(0.5, 2.0))
        if rng.random() < 0.3:
            p["truncate"] = bool(rng.random() < 0.5)
    elif kind == "longrope":
        dim = int(head_dim * p.get("partial_rotary_factor", 1.0))
        p["short_factor"] = rng.uniform(1.0, 2.0, dim // 2).tolist()
        p["long_factor"] = rng.uniform(1.0, 40.0, dim // 2).tolist()
        p["original_max_position_embeddings"] = original
        if rng.random() < 0.5:
            p["factor"] = factor
        if rng.random() < 0.2:
            p["attention_factor"] = float(rng.uniform(0.5, 2.0))
    elif kind == "llama3":
        p["factor"] = factor
        p["low_freq_factor"] = float(rng.uniform(0.5, 2.0))
        p["high_freq_factor"] = p["low_freq_factor"] + float(rng.uniform(0.5, 6.0))
        p["original_max_position_embeddings"] = original
        p["rope_theta"] = p.get("rope_theta", 500000.0)  # transformers requires it for llama3
    return p, mpe, seq_len


@pytest.mark.parametrize("kind", ROPE_TYPES)
def test_inv_freq_matches_transformers_for_random_parameters(kind):
    rng = np.random.default_rng(ROPE_TYPES.index(kind))
    for trial in range(40):
        head_dim = int(rng.choice([16, 32, 64, 80, 128, 256]))
        params, mpe, seq_len = random_parameters(kind, rng, head_dim)
        want, want_attention = oracle(head_dim, params, mpe, seq_len)
        got, attention = rope_inv_freq(head_dim, copy.deepcopy(params), max_position_embeddings=mpe, seq_len=seq_len)
        assert got.dtype == np.float64 and got.shape == want.shape, (trial, params)
        np.testing.assert_allclose(got, want, rtol=F32, err_msg=f"{trial}: {params} mpe={mpe} seq_len={seq_len}")
        assert attention == pytest.approx(want_attention, rel=1e-12), (trial, params)


def test_longrope_switches_to_long_factor_past_the_original_length():
    short, long_ = [1.0] * 8, [4.0] * 8
    p = {"rope_type": "longrope", "short_factor": short, "long_factor": long_, "original_max_position_embeddings": 1024}
    at_init, _ = rope_inv_freq(16, p, max_position_embeddings=4096)
    inside, _ = rope_inv_freq(16, p, max_position_embeddings=4096, seq_len=1024)
    beyond, attention = rope_inv_freq(16, p, max_position_embeddings=4096, seq_len=1025)
    np.testing.assert_allclose(at_init, inside)
    np.testing.assert_allclose(beyond, inside / 4.0)
    assert attention == pytest.approx(np.sqrt(1 + np.log(4) / np.log(1024)))


def test_dynamic_is_plain_rope_within_the_trained_length():
    plain, _ = rope_inv_freq(64, {"rope_theta": 10000.0})
    p = {"rope_type": "dynamic", "factor": 4.0}
    within, _ = rope_inv_freq(64, p, max_position_embeddings=2048, seq_len=2000)
    beyond, _ = rope_inv_freq(64, p, max_position_embeddings=2048, seq_len=8192)
    np.testing.assert_allclose(within, plain)
    assert beyond[0] == plain[0] and np.all(beyond[1:] < plain[1:])  # a larger base slows every other pair


@pytest.mark.parametrize(
    "scaling",
    [
        {"type": "linear", "factor": 4.0},
        {"type": "dynamic", "factor": 2.0},
        {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 2048},
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        None,
    ],
)
def test_legacy_rope_scaling_spelling_matches_transformers(scaling):
    params = {"rope_scaling": scaling, "rope_theta": 500000.0}
    want, want_attention = oracle(128, params, 16384, 20000, legacy=True)
    got, attention = rope_inv_freq(128, params, max_position_embeddings=16384, seq_len=20000)
    np.testing.assert_allclose(got, want, rtol=F32)
    assert attention == pytest.approx(want_attention)


@pytest.mark.parametrize(
    ("head_dim", "params", "message"),
    [
        (64, {"rope_type": "ntk-by-parts"}, "rope_type 'ntk-by-parts' is not supported"),
        (64, {"rope_type": "linear"}, "rope_type 'linear' needs 'factor'"),
        (64, {"rope_type": "yarn"}, "rope_type 'yarn' needs 'factor'"),
        (64, {"rope_type": "linear", "factor": 2.0, "rope_theta": -1.0}, "rope_theta must be a positive number, got -1.0"),
        (64, {"rope_type": "linear", "factor": 0}, "factor must be a positive number, got 0"),
        (63, {"rope_type": "linear", "factor": 2.0}, "even rotary dimension >= 2, got head_dim 63"),
        (64, {"rope_type": "linear", "factor": 2.0, "fctor": 3}, "has no parameter 'fctor'"),
        (
            64,
            {"rope_type": "longrope", "short_factor": [1.0] * 31, "long_factor": [1.0] * 32, "original_max_position_embeddings": 4096},
            "short_factor has 31 entries; a rotary dimension of 64 needs 32",
        ),
        (64, {"rope_type": "longrope", "short_factor": "1,2", "long_factor": [1.0] * 32}, "short_factor must be a list of positive numbers"),
        (
            64,
            {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0},
            "high_freq_factor must be greater than low_freq_factor",
        ),
    ],
)
def test_bad_parameters_are_one_line_errors_naming_key_and_value(head_dim, params, message):
    with pytest.raises(InputError, match=None) as info:
        rope_inv_freq(head_dim, params, max_position_embeddings=8192)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_standard_parameters_fill_transformers_defaults():
    p = standard_rope_parameters({"type": "yarn", "factor": 4.0}, max_position_embeddings=4096)
    assert p == {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 4096}


# ----------------------------------------------------------------------------- hf: configs


def _rotary(config):
    return LlamaRotaryEmbedding(config) if config.model_type == "llama" else None


@pytest.mark.parametrize(
    "make",
    [
        lambda: transformers.LlamaConfig(
            hidden_size=512, num_attention_heads=8, max_position_embeddings=131072,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        ),
        lambda: transformers.Qwen2Config(
            hidden_size=256, num_attention_heads=4, max_position_embeddings=32768,
            rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 8192},
        ),
        lambda: transformers.Phi3Config(
            hidden_size=256, num_attention_heads=4, max_position_embeddings=131072, original_max_position_embeddings=4096,
            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                             "short_factor": [1.0 + k / 100 for k in range(32)], "long_factor": [1.0 + k for k in range(32)]},
        ),
    ],
    ids=["llama3", "yarn", "longrope"],
)
def test_hf_config_written_by_transformers_is_read_as_transformers_reads_it(tmp_path, make):
    config = make()
    config.save_pretrained(tmp_path)
    rope = hf_rope(tmp_path)  # the folder; its config.json is read
    assert rope.head_dim == config.hidden_size // config.num_attention_heads
    assert rope.max_position_embeddings == config.max_position_embeddings
    for seq_len in (None, 2048, 65536):
        want, want_attention = ROPE_INIT_FUNCTIONS[config.rope_parameters["rope_type"]](config, "cpu", seq_len=seq_len)
        got, attention = rope.inv_freq(seq_len)
        np.testing.assert_allclose(got, want.double().numpy(), rtol=F32)
        assert attention == pytest.approx(float(want_attention))
    # through the catalog: hf:FOLDER at its head_dim, for a context of 65,536 positions
    enc = make_encoding(f"hf:{tmp_path}", np.arange(5), rope.head_dim, context=65536)
    want, want_attention = ROPE_INIT_FUNCTIONS[config.rope_parameters["rope_type"]](config, "cpu", seq_len=65536)
    assert enc.details["attention_factor"] == pytest.approx(float(want_attention))
    assert enc.details["rotary_dim"] == 2 * want.shape[0] and enc.details["model_type"] == config.model_type
    half = rope.head_dim // 2
    np.testing.assert_allclose(enc.matrix[:, half:], want_attention * np.cos(np.outer(np.arange(5), want.double().numpy())), atol=1e-5)
    with pytest.raises(InputError, match=f"the model's head_dim is {rope.head_dim}"):
        make_encoding(f"hf:{tmp_path}", np.arange(5), rope.head_dim * 2)


def test_hf_config_errors_name_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4, "rope_scaling": {"type": "linear"}}))
    with pytest.raises(InputError, match=r"config\.json: rope_type 'linear' needs 'factor'"):
        hf_rope(path)
    path.write_text(json.dumps({"rope_theta": 10000.0}))
    with pytest.raises(InputError, match="no head_dim"):
        hf_rope(path)
    with pytest.raises(InputError, match="no such file"):
        hf_rope(tmp_path / "missing.json")


# ----------------------------------------------------------------------------- catalog, sweeps, analysis

from posstats.analysis import AnalysisConfig, analyze  # noqa: E402
from posstats.cli import main  # noqa: E402
from posstats.counting.counts import CountSpec, PositionalCounts  # noqa: E402
from posstats.geometry.encodings import (  # noqa: E402
    encoding_sweeps,
    expand_encoding_specs,
    make_encoding,
    parse_encoding_spec,
    rope_table,
    split_encoding_list,
)


def test_rope_spec_spellings_and_canonical_form():
    a = parse_encoding_spec("rope:type=yarn,factor=32,original=4096,theta=10000")
    b = parse_encoding_spec("rope:type=yarn:factor=32:original_max_position_embeddings=4096")
    assert a == b and a.canonical == "rope:type=yarn:factor=32:original=4096"
    assert parse_encoding_spec("rope:500000:rope_type=llama3:factor=8:original=8192:low_freq_factor=1:high_freq_factor=4").canonical == (
        "rope:500000:type=llama3:factor=8:original=8192:low_freq_factor=1:high_freq_factor=4"
    )
    assert parse_encoding_spec("rope:type=longrope:short_factor=1;1.5:long_factor=2;4").params["long_factor"] == (2.0, 4.0)
    assert split_encoding_list("mds,rope:type=yarn,factor=8|16,original=4096, sinusoidal") == (
        "mds", "rope:type=yarn,factor=8|16,original=4096", "sinusoidal",
    )


def test_sweeps_expand_every_combination_and_remember_the_parameter():
    specs = ["mds", "rope:type=yarn,original=4096,factor=8|16|32", "random:0.02|1"]
    assert expand_encoding_specs(specs) == (
        "mds", "rope:type=yarn:factor=8:original=4096", "rope:type=yarn:factor=16:original=4096",
        "rope:type=yarn:factor=32:original=4096", "random:0.02", "random",
    )
    sweeps = encoding_sweeps(specs)
    assert [(s["parameter"], s["values"]) for s in sweeps] == [("factor", [8.0, 16.0, 32.0]), ("sigma", [0.02, 1.0])]
    grid = encoding_sweeps(["rope:type=linear,factor=2|4,theta=1e4|5e5"])[0]
    assert grid["parameter"] == "factor" and len(grid["members"]) == 4
    assert grid["others"] == [{"base": 10000.0}, {"base": 500000.0}, {"base": 10000.0}, {"base": 500000.0}]


def test_rope_variant_table_uses_transformers_frequencies_and_attention_factor():
    pos = np.array([0, 3, 100, 40000])
    enc = make_encoding("rope:type=yarn,factor=16,original=2048,layout=half", pos, 64, context=131072)
    params = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 2048}
    inv, attention = rope_inv_freq(64, params, max_position_embeddings=32768)
    want_inv, want_attention = oracle(64, params, 32768, None)  # transformers: float32 frequencies
    np.testing.assert_allclose(inv, want_inv, rtol=F32)
    assert attention == pytest.approx(want_attention)
    angles = np.outer(pos, inv)
    np.testing.assert_allclose(enc.matrix[:, :32], -attention * np.sin(angles), atol=1e-5)
    np.testing.assert_allclose(enc.matrix[:, 32:], attention * np.cos(angles), atol=1e-5)
    assert enc.details["attention_factor"] == pytest.approx(attention) and enc.details["seq_len"] == 131072
    # partial rotary factor: the unrotated columns carry no distance
    part = make_encoding("rope:type=linear,factor=2,partial=0.5", pos, 16)
    assert np.all(part.matrix[:, 8:] == 0) and part.details["rotary_dim"] == 8
    # the plain spec is unchanged by the redesign: rope == rope_table at the default frequencies
    np.testing.assert_array_equal(make_encoding("rope", pos, 8).matrix, rope_table(pos, 10000.0 ** -(np.arange(0, 8, 2) / 8), 8))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("rope:type=yarn,factor=8", "needs original=L"),
        ("rope:type=warp,factor=8", "bad type 'warp'"),
        ("rope:type=linear", "rope_type 'linear' needs 'factor'"),
        ("rope:type=linear,factor=2,beta_fast=3", "rope_type 'linear' has no parameter 'beta_fast'"),
        ("rope:theta=-5", "rope base must be a positive number, got -5.0"),
        ("rope:type=longrope,original=64,short_factor=1;1,long_factor=1;1", "short_factor has 2 entries; a rotary dimension of 8 needs 4"),
    ],
)
def test_bad_rope_specs_are_one_line_errors(spec, message):
    from posstats.errors import PosstatsError

    with pytest.raises(PosstatsError) as info:
        make_encoding(spec, np.arange(4), 8)
    assert message in str(info.value) and "\n" not in str(info.value)


def _circle_counts(n: int, period_factor: float, total: float = 1e12) -> PositionalCounts:
    """Two tokens with sqrt mu_i = (cos, sin)(i / f): d_H^2(i, j) = 2 - 2 cos((i - j) / f), the
    geometry of a one-pair RoPE whose frequency is 1 / f (linear scaling by f at head_dim 2)."""
    phi = np.arange(n) / period_factor
    assert phi[-1] < np.pi / 2  # both square roots stay non-negative
    counts = np.rint(total * np.stack([np.cos(phi) ** 2, np.sin(phi) ** 2], axis=1)).astype(np.int64)
    return PositionalCounts(CountSpec(positions=n, vocab_size=2), counts, sequences=int(total), windows=int(total), tokens=int(counts.sum()))


def test_sweep_finds_the_planted_scaling_factor():
    counts = _circle_counts(100, 64.0)
    config = AnalysisConfig(dims=(2,), encodings=("mds", "rope:type=linear,factor=16|32|64|128|256"), noise_floor="off", null="none")
    report = analyze(counts, config, show_progress=False).report()
    by_name = {e["name"]: e for e in report["encodings"]}
    assert by_name["rope:type=linear:factor=64"]["scaled_stress"] < 1e-9
    assert all(by_name[f"rope:type=linear:factor={f}"]["scaled_stress"] > 1e-4 for f in (16, 32, 128, 256))
    (sweep,) = report["verdict"]["sweeps"]
    assert sweep["parameter"] == "factor" and sweep["best"] == [
        {"dim": 2, "best": 64.0, "others": {}, "scaled_stress": pytest.approx(0, abs=1e-9), "scaled_stress_ci95": [pytest.approx(0, abs=1e-9)] * 2, "tied_with": []}
    ]


@pytest.mark.slow
def test_hf_config_through_the_cli_with_a_sweep_at_131072_positions(tmp_path):
    """hf: scored at the model's head_dim whatever --dims says, and a YaRN sweep, at
    n = 131,072 (sampled stress); the report has the sweep figure and the verdict's sweep line."""
    transformers.LlamaConfig(
        hidden_size=256, num_attention_heads=4, max_position_embeddings=131072,
        rope_parameters={"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "rope_theta": 10000.0},
    ).save_pretrained(tmp_path / "model")
    from posstats.counting.io import save_counts
    from posstats.testing import synthetic_counts

    syn = synthetic_counts(131072, 500, tokens=40, rank=2, seed=3)
    save_counts(syn.counts, tmp_path / "counts")
    out = tmp_path / "an"
    assert main(["analyze", "--counts", str(tmp_path / "counts"), "--dims", "2,16", "--noise-floor", "off", "--null", "none",
                 "--stress-halfwidth", "0.01", "--encodings", f"mds,rope:type=yarn,original=4096,factor=8|32,hf:{tmp_path / 'model'}",
                 "--out", str(out)]) == 0
    r = json.loads((out / "report.json").read_text())
    entries = {(e["name"], e["dim"]): e for e in r["encodings"]}
    hf_entry = entries[(f"hf:{tmp_path / 'model'}", 64)]
    assert [d for (name, d) in entries if name.startswith("hf:")] == [64]
    assert hf_entry["stress_method"] == "sampled" and hf_entry["rope"]["rope_type"] == "yarn"
    assert hf_entry["rope"]["attention_factor"] == pytest.approx(0.1 * np.log(32) + 1)
    assert {("rope:type=yarn:factor=8:original=4096", 16), ("rope:type=yarn:factor=32:original=4096", 16)} <= set(entries)
    assert r["config"]["sweeps"][0]["values"] == [8.0, 32.0]
    assert [b["dim"] for b in r["verdict"]["sweeps"][0]["best"]] == [2, 16]
    assert (out / "figures" / "sweep_0.png").stat().st_size > 1000
    assert "sweep" in (out / "summary.md").read_text()


HOSTILE_CONFIGS = [
    ('{"a":' * 50_000 + "1" + "}" * 50_000, "nested too deeply"),
    ('{"hidden_size": 64, "num_attention_heads": 4, "rope_theta": NaN}', "NaN is not valid JSON"),
    ('{"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 1}', "rope_theta must be greater than 1"),
    ('{"hidden_size": 64, "num_attention_heads": 4, "rope_parameters": [1, 2]}', "rope_parameters must be an object"),
    ('{"hidden_size": 64, "num_attention_heads": 4, "rope_scaling": "yarn"}', "rope_scaling must be an object"),
    ('{"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 128, "rope_parameters": '
     '{"rope_type": "yarn", "factor": 4, "beta_fast": -5, "original_max_position_embeddings": 32}}', "beta_fast"),
    ('{"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 128, "rope_parameters": '
     '{"rope_type": "yarn", "factor": 1e308, "original_max_position_embeddings": 32}}', "factor must be within"),
    ('{"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 128, "rope_parameters": '
     '{"rope_type": "dynamic", "factor": 0.5}}', "factor >= 1"),
    ('{"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 128, "rope_parameters": '
     '{"rope_type": "longrope", "short_factor": [1, 1, 1, 1, 1, 1, 1, 1], "long_factor": [1, 1, 1, 1, 1, 1, 1, 1], '
     '"factor": 4, "original_max_position_embeddings": 1}}', "original_max_position_embeddings >= 2"),
]


@pytest.mark.parametrize(("text", "why"), HOSTILE_CONFIGS)
def test_hostile_hf_configs_are_refused_in_one_line(tmp_path, text, why):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(PosstatsError, match=why) as info:
        hf_rope(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value) and "\n" not in str(info.value)


def test_a_fifo_named_as_a_config_is_refused_without_waiting(tmp_path):
    import os

    os.mkfifo(tmp_path / "config.json")
    with pytest.raises(PosstatsError, match="not a regular file"):
        hf_rope(tmp_path)


ROPE_KEYS = ["theta", "factor", "original", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor",
             "low_freq_factor", "high_freq_factor", "partial", "seq_len", "seed"]
numbers = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from(["0", "-1", "1e308", "-1e-308", "nan", "inf", "x", ""]))


@given(kind=st.sampled_from(["default", "linear", "dynamic", "yarn", "llama3", "longrope"]),
       values=st.dictionaries(st.sampled_from(ROPE_KEYS), numbers, max_size=4))
@settings(max_examples=400, deadline=None)
def test_fuzzed_rope_specs_build_or_are_refused(kind, values):
    """Any RoPE spec: an encoding of finite values, or a PosstatsError in one line."""
    from posstats.geometry.encodings import make_encoding

    spec = f"rope:type={kind}," + ",".join(f"{k}={v}" for k, v in values.items())
    try:
        enc = make_encoding(spec.rstrip(","), np.arange(8), 8)
    except PosstatsError as exc:
        assert "\n" not in str(exc)
        return
    assert np.all(np.isfinite(enc.matrix))


config_values = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(), st.text(max_size=8),
                          st.lists(st.floats(allow_nan=False), max_size=4),
                          st.dictionaries(st.sampled_from(["rope_type", "factor", "type"]), st.text(max_size=6), max_size=2))
CONFIG_KEYS = ["rope_theta", "hidden_size", "num_attention_heads", "head_dim", "max_position_embeddings",
               "partial_rotary_factor", "original_max_position_embeddings", "rope_parameters", "rope_scaling"]
PARAM_KEYS = ["rope_type", "type", "factor", "beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim",
              "low_freq_factor", "high_freq_factor", "short_factor", "long_factor", "original_max_position_embeddings",
              "rope_theta", "truncate", "full_attention"]


@given(top=st.dictionaries(st.sampled_from(CONFIG_KEYS), config_values, max_size=5),
       params=st.dictionaries(st.sampled_from(PARAM_KEYS), config_values, max_size=5),
       kind=st.sampled_from(list(ROPE_TYPES)))
@settings(max_examples=400, deadline=None)
def test_fuzzed_hf_configs_give_frequencies_or_one_line(tmp_path_factory, top, params, kind):
    """Any config.json: finite positive frequencies, or an InputError naming the file."""
    config = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 256, **top}
    if "rope_parameters" not in top:
        config["rope_parameters"] = {"rope_type": kind, **params}
    folder = tmp_path_factory.mktemp("hf")
    (folder / "config.json").write_text(json.dumps(config))
    try:
        rope = hf_rope(folder)
        inv_freq, attention = rope.inv_freq(512)
    except PosstatsError as exc:
        assert "\n" not in str(exc) and "config.json" in str(exc)
        return
    assert np.all(np.isfinite(inv_freq)) and np.all(inv_freq > 0) and np.isfinite(attention) and attention > 0
