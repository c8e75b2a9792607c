"""Rotary position embeddings as position tables: RoPE (interleaved or half layout), its
scaled variants (linear, dynamic NTK, YaRN, LongRoPE, Llama 3: :mod:`posstats.geometry.rope_scaling`)
and a Hugging Face model's own RoPE (``hf:PATH/config.json``, at its head dimension)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from posstats.errors import InputError
from posstats.geometry.encodings.catalog import (
    REQUIRED,
    EncodingSpec,
    Family,
    Param,
    as_positions,
    bool_param,
    check_dim,
    check_positive,
    choice,
    float_param,
    floats_param,
    frequencies,
    int_param,
    register,
    seed_param,
    str_param,
)
from posstats.geometry.rope_scaling import ROPE_TYPES, hf_rope, rope_inv_freq

__all__ = ["rope", "rope_rotation", "rope_spec_parameters", "rope_table"]

def _pair_columns(dim: int, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """Column indices of the two members of each rotated pair k, for a RoPE layout."""
    half = dim // 2
    if layout == "interleaved":
        return np.arange(0, dim, 2), np.arange(1, dim, 2)
    if layout == "half":
        return np.arange(half), np.arange(half, dim)
    msg = f"rope layout must be 'interleaved' or 'half', got {layout!r}"
    raise InputError(msg)


def rope_table(
    positions: Any,
    /,
    inv_freq: Any,
    dim: int,
    *,
    attention_factor: float = 1.0,
    layout: str = "interleaved",
    vector: str = "ones",
    seed: int = 0,
) -> np.ndarray:
    """A RoPE variant as a position table ``P[i] = A R(i) u``, float64 (len(positions) x dim).

    The rotation ``R(i)`` turns pair k (k < len(inv_freq)) by the angle ``i inv_freq[k]``; A is
    the attention factor (transformers multiplies cos and sin by it); u is the evaluation vector.
    Pairs are the columns (2k, 2k + 1) for ``layout="interleaved"`` and (k, k + r/2) for
    ``layout="half"`` (transformers' ``rotate_half``), r = 2 len(inv_freq) the rotary width; the
    ``dim - r`` columns a partial rotary factor leaves unrotated are constant in position, so
    they are zero here (no distance).

    ``vector="ones"`` (the default): ``(a, b) = (0, 1)`` in every pair, so
    ``P[i, pair k] = A (-sin, cos)(i inv_freq[k])`` and
    ``|p_i - p_j|^2 = 2 A^2 sum_k (1 - cos((i - j) inv_freq[k]))``: every frequency weighs the
    same and the vector is the same for every variant, so stress differences between RoPE
    variants come from their frequencies (and A) alone; with the plain frequencies it gives
    sinusoidal's distances exactly. ``vector="random"``: a seeded random unit vector of ``dim``
    entries, whose pair entries are the same for both layouts.
    """
    dim = check_dim(dim, "rope", even=True)
    freqs = np.asarray(inv_freq, dtype=np.float64)
    pairs = freqs.shape[0]
    if freqs.ndim != 1 or not 1 <= pairs <= dim // 2:
        msg = f"rope: {freqs.shape} frequencies do not fit dimension {dim} (need 1 .. {dim // 2})"
        raise InputError(msg)
    first, second = _pair_columns(2 * pairs, layout)
    if vector == "ones":
        a = np.zeros(pairs)
        b = np.ones(pairs)
    elif vector == "random":
        g = np.random.default_rng(seed).standard_normal(dim)
        g /= np.linalg.norm(g)
        a, b = g[0::2][:pairs], g[1::2][:pairs]
    else:
        msg = f"rope vector must be 'ones' or 'random', got {vector!r}"
        raise InputError(msg)
    pos = as_positions(positions)
    angles = np.multiply.outer(pos.astype(np.float64), freqs)
    cos, sin = np.cos(angles), np.sin(angles)
    out = np.zeros((pos.shape[0], dim), dtype=np.float64)
    out[:, first] = a * cos - b * sin
    out[:, second] = a * sin + b * cos
    if attention_factor != 1.0:
        out *= check_positive(attention_factor, "rope attention factor")
    return out


def rope(
    positions: Any,
    /,
    dim: int,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    vector: str = "ones",
    seed: int = 0,
) -> np.ndarray:
    """Rotary position embedding as an additive matrix ``P[i] = R(i) u``, float64, dim even.

    ``R(i)`` rotates pair k by the angle ``i theta_k``, ``theta_k = base^(-2k/dim)``; a pair is
    the columns (2k, 2k + 1) for ``layout="interleaved"`` (RoFormer / Meta LLaMA) and
    (k, k + dim/2) for ``layout="half"`` (GPT-NeoX / Hugging Face ``rotate_half``). With
    ``(a, b)`` the pair's entries of u, the pair of ``P[i]`` is
    ``(a cos - b sin, a sin + b cos)`` at angle ``i theta_k``.

    ``vector="ones"``: ``(a, b) = (0, 1)`` in every pair (u = (0,1,0,1,...) interleaved,
    (0,...,0,1,...,1) half), giving ``P[i, pair] = (-sin, cos)``: the sinusoidal encoding up
    to the sign of the sine columns, so its distances equal sinusoidal's exactly.
    ``vector="random"``: a seeded random unit vector; its pair entries are the same for
    both layouts, so the two layouts give the same distances for the same seed.
    Scaled variants (YaRN, NTK, ...): :func:`rope_table` with :func:`rope_inv_freq` frequencies.
    """
    dim = check_dim(dim, "rope", even=True)
    base = check_positive(base, "rope base")
    return rope_table(positions, frequencies(dim, base), dim, layout=layout, vector=vector, seed=seed)


def rope_rotation(dim: int, *, base: float = 10000.0, layout: str = "interleaved") -> np.ndarray:
    """The one-step RoPE rotation ``M = R(1)`` (dim x dim), so that ``rope(...) == M^i u``.

    Block-diagonal in the layout's pairs, with ``[[cos t, -sin t], [sin t, cos t]]`` at
    ``t = theta_k`` for pair k.
    """
    dim = check_dim(dim, "rope", even=True)
    first, second = _pair_columns(dim, layout)
    theta = frequencies(dim, check_positive(base, "rope base"))
    m = np.zeros((dim, dim), dtype=np.float64)
    m[first, first] = np.cos(theta)
    m[first, second] = -np.sin(theta)
    m[second, first] = np.sin(theta)
    m[second, second] = np.cos(theta)
    return m


# spec key -> Hugging Face rope_parameters key, for the scaling parameters of ``rope:type=...``
_HF_ROPE_KEYS = {
    "factor": "factor",
    "beta_fast": "beta_fast",
    "beta_slow": "beta_slow",
    "mscale": "mscale",
    "mscale_all_dim": "mscale_all_dim",
    "attention_factor": "attention_factor",
    "truncate": "truncate",
    "low_freq_factor": "low_freq_factor",
    "high_freq_factor": "high_freq_factor",
    "short_factor": "short_factor",
    "long_factor": "long_factor",
    "partial": "partial_rotary_factor",
}


def rope_spec_parameters(params: Mapping[str, Any]) -> tuple[dict[str, Any], int | None]:
    """The Hugging Face ``rope_parameters`` and ``max_position_embeddings`` of a ``rope`` spec.

    ``original`` is the context length the model was trained at: transformers'
    ``original_max_position_embeddings`` for yarn / longrope / llama3 (whose
    ``max_position_embeddings`` is then ``original * factor``), and its
    ``max_position_embeddings`` for dynamic NTK. Dynamic, yarn, longrope and llama3 need it.
    """
    kind = params["type"]
    hf: dict[str, Any] = {"rope_type": kind, "rope_theta": params["base"]}
    for key, hf_key in _HF_ROPE_KEYS.items():
        if params.get(key) is not None:
            value = params[key]
            hf[hf_key] = list(value) if isinstance(value, tuple) else value
    original = params.get("original")
    if kind in ("dynamic", "yarn", "longrope", "llama3") and original is None:
        msg = f"rope:type={kind} needs original=L, the context length the model was trained at (e.g. original=4096)"
        raise InputError(msg)
    if kind in ("default", "linear", "dynamic"):
        return hf, original
    hf["original_max_position_embeddings"] = original
    factor = params.get("factor")
    if not factor:
        return hf, None
    extended = original * factor
    if not (math.isfinite(extended) and 1 <= extended <= 2**53):
        msg = f"rope:type={kind}: original={original} x factor={factor:g} is not a usable context length"
        raise InputError(msg)
    return hf, int(round(extended))


def _rope_details(kind: str, head_dim: int, inv_freq: np.ndarray, attention: float, seq_len: int) -> dict[str, Any]:
    return {
        "rope_type": kind,
        "head_dim": int(head_dim),
        "rotary_dim": int(2 * inv_freq.shape[0]),
        "attention_factor": float(attention),
        "seq_len": int(seq_len),
        "wavelengths": [float(2 * math.pi / inv_freq.max()), float(2 * math.pi / inv_freq.min())],
    }


def _seq_len(params: Mapping[str, Any], pos: np.ndarray, context: int | None) -> int:
    """The sequence length a RoPE variant is built for: the spec's ``seq_len``, else the
    counted context, else the last position + 1."""
    return int(params["seq_len"] or context or (int(pos.max()) + 1 if pos.size else 1))


def _rope_variant(spec: EncodingSpec, pos: np.ndarray, dim: int, context: int | None) -> tuple[np.ndarray, dict[str, Any]]:
    """``rope:type=...``: a RoPE variant's table at width ``dim`` (the head dimension)."""
    p = spec.params
    dim = check_dim(dim, "rope", even=True)
    if p["type"] == "default" and p["partial"] is None and p["seq_len"] is None:
        return rope(pos, dim, base=p["base"], layout=p["layout"], vector=p["vector"], seed=p["seed"]), {}
    seq_len = _seq_len(p, pos, context)
    try:
        hf, mpe = rope_spec_parameters(p)
        inv_freq, attention = rope_inv_freq(dim, hf, max_position_embeddings=mpe, seq_len=seq_len)
    except InputError as exc:
        msg = f"encoding {spec.canonical!r}: {exc}"
        raise InputError(msg) from None
    matrix = rope_table(pos, inv_freq, dim, attention_factor=attention, layout=p["layout"], vector=p["vector"], seed=p["seed"])
    return matrix, _rope_details(p["type"], dim, inv_freq, attention, seq_len)


def _hf_rope_encoding(spec: EncodingSpec, pos: np.ndarray, dim: int, context: int | None) -> tuple[np.ndarray, dict[str, Any]]:
    """``hf:PATH``: the RoPE of a model config, at the model's own head dimension."""
    p = spec.params
    model = hf_rope(p["path"])
    if dim != model.head_dim:
        msg = f"encoding {spec.canonical!r}: the model's head_dim is {model.head_dim}; it is scored at that width, not {dim}"
        raise InputError(msg)
    seq_len = _seq_len(p, pos, context)
    inv_freq, attention = model.inv_freq(seq_len)
    matrix = rope_table(pos, inv_freq, dim, attention_factor=attention, layout=p["layout"], vector=p["vector"], seed=p["seed"])
    details = _rope_details(str(model.rope_parameters["rope_type"]), dim, inv_freq, attention, seq_len)
    details.update(config=model.path, model_type=model.model_type, max_position_embeddings=model.max_position_embeddings)
    return matrix, details


_ROPE_PARAMS = (
    Param("base", float_param, 10000.0),
    Param("type", choice(*ROPE_TYPES), "default"),
    Param("factor", float_param, None),
    Param("original", int_param, None),
    Param("beta_fast", float_param, None),
    Param("beta_slow", float_param, None),
    Param("mscale", float_param, None),
    Param("mscale_all_dim", float_param, None),
    Param("attention_factor", float_param, None),
    Param("truncate", bool_param, None),
    Param("low_freq_factor", float_param, None),
    Param("high_freq_factor", float_param, None),
    Param("short_factor", floats_param, None),
    Param("long_factor", floats_param, None),
    Param("partial", float_param, None),
    Param("seq_len", int_param, None),
    Param("layout", choice("interleaved", "half"), "interleaved"),
    Param("vector", choice("ones", "random"), "ones"),
    Param("seed", seed_param, 0),
)
register(Family(
    "rope", _ROPE_PARAMS, order=50,
    build=lambda s, pos, dim, inputs: _rope_variant(s, pos, dim, inputs.context),
    aliases={"rope-half": {"layout": "half"}},
    # other spellings of the keys, the Hugging Face names among them
    key_aliases={"theta": "base", "rope_theta": "base", "rope_type": "type",
                 "original_max_position_embeddings": "original", "partial_rotary_factor": "partial"},
))
register(Family(
    "hf",
    (Param("path", str_param, REQUIRED), Param("seq_len", int_param, None),
     Param("layout", choice("interleaved", "half"), "half"), Param("vector", choice("ones", "random"), "ones"),
     Param("seed", seed_param, 0)),
    order=60,
    build=lambda s, pos, dim, inputs: _hf_rope_encoding(s, pos, dim, inputs.context),
    widths=lambda s, _dims: (hf_rope(s.params["path"]).head_dim,),
))
