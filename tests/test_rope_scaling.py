"""RoPE scaling frequencies against transformers itself (the oracle for HF conventions)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from posstats.errors import InputError
from posstats.geometry.rope_scaling import ROPE_TYPES, hf_rope, rope_inv_freq, standard_rope_parameters

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
