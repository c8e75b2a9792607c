"""RoPE frequencies of the scaling methods long-context models use (Hugging Face conventions).

:func:`rope_inv_freq` turns a Hugging Face ``rope_parameters`` dict into the inverse
frequencies ``inv_freq`` (one per rotated pair k = 0 .. rotary_dim/2 - 1) and the attention
factor A that multiplies cos and sin. Rotation angle of pair k at position i: ``i inv_freq[k]``.
With ``e_k = 2k / rotary_dim`` and ``rotary_dim = int(head_dim * partial_rotary_factor)``:

| ``rope_type`` | ``inv_freq[k]`` | A |
|---|---|---|
| ``default`` | ``theta^(-e_k)`` | 1 |
| ``linear`` (position interpolation) | ``theta^(-e_k) / factor`` | 1 |
| ``dynamic`` (dynamic NTK) | ``theta'^(-e_k)``, ``theta' = theta (factor L / L0 - factor + 1)^(d / (d - 2))``, ``L = max(seq_len, L0)`` | 1 |
| ``yarn`` | ramp between ``theta^(-e_k)`` (fast pairs) and ``/ factor`` (slow pairs); ramp ends from ``beta_fast``, ``beta_slow`` rotations over ``original_max_position_embeddings`` | ``0.1 ln(factor) + 1`` (or the ``mscale`` ratio) |
| ``longrope`` | ``theta^(-e_k) / f_k``, ``f = long_factor`` when ``seq_len > original``, else ``short_factor`` | ``sqrt(1 + ln(factor) / ln(original))`` |
| ``llama3`` | unchanged for wavelengths < ``original / high_freq_factor``, ``/ factor`` above ``original / low_freq_factor``, smoothly blended between | 1 |

(``L0`` is ``max_position_embeddings``; ``original`` is ``original_max_position_embeddings``.)
The defaults are the ones transformers fills in: ``rope_theta`` 10000,
``original_max_position_embeddings`` = ``max_position_embeddings`` (yarn, longrope, llama3),
yarn's ``factor`` = ``max_position_embeddings / original`` when None, ``beta_fast`` 32,
``beta_slow`` 1, ``truncate`` True, and the attention factors above when not given. The
legacy spelling (``{"rope_scaling": {"type": ...}, "rope_theta": ...}``, as in older
``config.json`` files) is accepted too. Computed in float64; transformers computes in float32,
and the two agree to float32 precision (tests/test_rope_scaling.py uses transformers itself
as the oracle).

:func:`hf_rope` reads a model's ``config.json`` (rope parameters, head_dim or
``hidden_size / num_attention_heads``, ``max_position_embeddings``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from posstats.errors import InputError
from posstats.storage.jsontext import read_json_file

__all__ = ["ROPE_TYPES", "HFRope", "hf_rope", "rope_inv_freq", "standard_rope_parameters"]

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")

# Keys each type reads (besides rope_type, rope_theta and partial_rotary_factor); the first
# tuple is required, the second optional.
_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "dynamic": (("factor",), ()),
    "yarn": (
        ("factor",),
        ("original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
    ),
    "longrope": (("short_factor", "long_factor"), ("factor", "original_max_position_embeddings", "attention_factor")),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor"), ("original_max_position_embeddings",)),
}
_COMMON = ("rope_type", "rope_theta", "partial_rotary_factor")
_DEFAULT_THETA = 10000.0
# bounds of every scale-like parameter (factor, attention factor, mscale, betas...): wide
# enough for any real model (factors of 2-64, betas of 1-32), narrow enough that no float
# overflows on the way to a frequency
_MIN_SCALE, _MAX_SCALE = 1e-6, 1e6


def standard_rope_parameters(rope_parameters: Mapping[str, Any] | None, *, max_position_embeddings: int | None = None) -> dict[str, Any]:
    """The rope parameters with transformers' defaults filled in and every value checked.

    Accepts the current ``rope_parameters`` dict, its legacy key ``type`` for ``rope_type``,
    and a config-like mapping with ``rope_scaling`` (dict or None) beside ``rope_theta``,
    ``partial_rotary_factor`` and ``original_max_position_embeddings`` (the top-level one wins, as in
    transformers' Phi-3 handling). Fills ``rope_type`` = default, ``rope_theta`` = 10000 and, for
    yarn / longrope / llama3, ``original_max_position_embeddings`` = ``max_position_embeddings``.

    Raises:
        InputError: one line naming the key and value: unknown type or key, a missing
            required key, a non-positive theta or factor, a non-list short/long factor.
    """
    if rope_parameters is None:
        rope_parameters = {}
    if not isinstance(rope_parameters, Mapping):
        msg = f"rope parameters must be a dict, got {type(rope_parameters).__name__}"
        raise InputError(msg)
    raw = dict(rope_parameters)
    if "rope_scaling" in raw:  # legacy config spelling: rope_scaling + top-level rope_theta
        scaling = raw.pop("rope_scaling") or {}
        if not isinstance(scaling, Mapping):
            msg = f"rope_scaling must be a dict or null, got {scaling!r}"
            raise InputError(msg)
        top = raw
        raw = dict(scaling)
        for key in ("rope_theta", "partial_rotary_factor"):
            if top.get(key) is not None:
                raw.setdefault(key, top[key])
        if top.get("original_max_position_embeddings") is not None:
            raw["original_max_position_embeddings"] = top["original_max_position_embeddings"]
    if "type" in raw:
        legacy = raw.pop("type")
        raw.setdefault("rope_type", legacy)
    rope_type = raw.get("rope_type") or "default"
    if rope_type not in ROPE_TYPES:
        msg = f"rope_type {rope_type!r} is not supported; choose one of {', '.join(ROPE_TYPES)}"
        raise InputError(msg)
    raw["rope_type"] = rope_type
    required, optional = _KEYS[rope_type]
    unknown = sorted(set(raw) - set(_COMMON) - set(required) - set(optional))
    if unknown:
        msg = f"rope_type {rope_type!r} has no parameter {unknown[0]!r} (parameters: {', '.join((*_COMMON[1:], *required, *optional))})"
        raise InputError(msg)
    for key in required:
        # yarn's factor may be null (DeepSeek-V3): then it is max_position_embeddings / original
        if key not in raw or (raw[key] is None and (rope_type, key) != ("yarn", "factor")):
            msg = f"rope_type {rope_type!r} needs {key!r}"
            raise InputError(msg)
    theta = raw.get("rope_theta")
    raw["rope_theta"] = _DEFAULT_THETA if theta is None else _positive(theta, "rope_theta")
    if raw["rope_theta"] <= 1:
        msg = f"rope_theta must be greater than 1 (frequencies are theta^(-2k/d)), got {theta!r}"
        raise InputError(msg)
    partial = raw.get("partial_rotary_factor")
    if partial is not None and not (_number(partial, "partial_rotary_factor") > 0 and partial <= 1):
        msg = f"partial_rotary_factor must be in (0, 1], got {partial!r}"
        raise InputError(msg)
    for key in ("factor", "attention_factor", "mscale", "mscale_all_dim", "low_freq_factor", "high_freq_factor",
                "beta_fast", "beta_slow"):
        if raw.get(key) is not None and not _MIN_SCALE <= _positive(raw[key], key) <= _MAX_SCALE:
            msg = f"{key} must be within [{_MIN_SCALE:g}, {_MAX_SCALE:g}], got {raw[key]!r}"
            raise InputError(msg)
    if rope_type == "dynamic" and raw["factor"] < 1:
        msg = f"rope_type 'dynamic' needs factor >= 1 (it stretches the trained context), got {raw['factor']!r}"
        raise InputError(msg)
    if rope_type in ("yarn", "longrope", "llama3") and raw.get("original_max_position_embeddings") is None:
        if max_position_embeddings is None:
            msg = f"rope_type {rope_type!r} needs 'original_max_position_embeddings' (or max_position_embeddings)"
            raise InputError(msg)
        raw["original_max_position_embeddings"] = max_position_embeddings
    if raw.get("original_max_position_embeddings") is not None:
        original = _positive_int(raw["original_max_position_embeddings"], "original_max_position_embeddings")
        if rope_type == "longrope" and original < 2:  # its attention factor divides by ln(original)
            msg = f"rope_type 'longrope' needs original_max_position_embeddings >= 2, got {original!r}"
            raise InputError(msg)
    if rope_type == "llama3" and raw["high_freq_factor"] <= raw["low_freq_factor"]:
        msg = f"high_freq_factor must be greater than low_freq_factor, got {raw['high_freq_factor']!r} <= {raw['low_freq_factor']!r}"
        raise InputError(msg)
    for key in ("short_factor", "long_factor"):
        if key in raw:
            value = raw[key]
            if not isinstance(value, (list, tuple)) or not value or not all(_is_number(x) and x > 0 for x in value):
                msg = f"{key} must be a list of positive numbers, got {value!r}"
                raise InputError(msg)
    return raw


def rope_inv_freq(
    head_dim: int,
    rope_parameters: Mapping[str, Any] | None,
    *,
    max_position_embeddings: int | None = None,
    seq_len: int | None = None,
) -> tuple[np.ndarray, float]:
    """Inverse frequencies and attention factor of a RoPE variant (module table).

    Args:
        head_dim: size of one attention head (even, or with ``partial_rotary_factor`` giving
            an even rotary dimension).
        rope_parameters: the Hugging Face dict (``rope_type``, ``rope_theta``, ``factor``, ...),
            or the legacy ``rope_scaling`` + ``rope_theta`` spelling; None means plain RoPE.
        max_position_embeddings: the config's ``max_position_embeddings`` (dynamic: the trained
            length ``L0``; yarn / longrope: the extended length, giving ``factor`` when None).
        seq_len: length of the sequence being encoded (dynamic NTK and LongRoPE depend on it;
            None: the model's initial state, as transformers builds it).

    Returns:
        ``(inv_freq, attention_factor)``: float64 array of length ``rotary_dim / 2`` and a float.

    >>> f, a = rope_inv_freq(4, {"rope_type": "linear", "factor": 2.0})
    >>> f.tolist(), a
    ([0.5, 0.005], 1.0)
    """
    p = standard_rope_parameters(rope_parameters, max_position_embeddings=max_position_embeddings)
    head_dim = _positive_int(head_dim, "head_dim")
    dim = int(head_dim * float(p.get("partial_rotary_factor") or 1.0))
    if dim < 2 or dim % 2:
        msg = f"RoPE needs an even rotary dimension >= 2, got head_dim {head_dim} (rotary dimension {dim})"
        raise InputError(msg)
    inv_freq, attention = _frequencies(p, dim, max_position_embeddings, seq_len)
    if not (np.all(np.isfinite(inv_freq)) and np.all(inv_freq > 0) and math.isfinite(attention) and attention > 0):
        msg = (f"rope_type {p['rope_type']!r} with these parameters gives frequencies or an attention factor that "
               f"are not finite and positive (attention factor {attention!r}); check theta, factor and beta values")
        raise InputError(msg)
    return inv_freq, attention


def _frequencies(p: Mapping[str, Any], dim: int, mpe: int | None, seq_len: int | None) -> tuple[np.ndarray, float]:
    kind = p["rope_type"]
    base = float(p["rope_theta"])
    exponents = np.arange(0, dim, 2, dtype=np.float64) / dim
    with np.errstate(all="ignore"):  # overflow and the like are refused by the caller's check
        if kind in ("default", "linear"):
            inv_freq = base**-exponents
            return (inv_freq / float(p["factor"]) if kind == "linear" else inv_freq), 1.0
        if kind == "dynamic":
            return _dynamic(base, exponents, dim, float(p["factor"]), mpe, seq_len), 1.0
        if kind == "yarn":
            return _yarn(base, exponents, dim, p, mpe)
        if kind == "longrope":
            return _longrope(base, exponents, dim, p, mpe, seq_len)
        return _llama3(base**-exponents, p), 1.0


def _dynamic(base: float, exponents: np.ndarray, dim: int, factor: float, trained: int | None, seq_len: int | None) -> np.ndarray:
    if trained is None:
        msg = "rope_type 'dynamic' needs max_position_embeddings (the trained context length)"
        raise InputError(msg)
    if dim <= 2:
        msg = f"rope_type 'dynamic' needs a rotary dimension > 2, got {dim}"
        raise InputError(msg)
    length = trained if seq_len is None else max(int(seq_len), trained)
    scaled = base * ((factor * length / trained) - (factor - 1)) ** (dim / (dim - 2))
    return scaled**-exponents


def _yarn_factor(p: Mapping[str, Any], max_position_embeddings: int | None) -> float:
    if p.get("factor") is not None:
        return float(p["factor"])
    if max_position_embeddings is None:
        msg = "rope_type 'yarn' with factor null needs max_position_embeddings (factor = max_position_embeddings / original)"
        raise InputError(msg)
    return max_position_embeddings / p["original_max_position_embeddings"]


def _yarn(base: float, exponents: np.ndarray, dim: int, p: Mapping[str, Any], mpe: int | None) -> tuple[np.ndarray, float]:
    """YaRN (Peng et al. 2023) as transformers' ``_compute_yarn_parameters``."""
    factor = _yarn_factor(p, mpe)
    original = p["original_max_position_embeddings"]

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = p.get("attention_factor")
    if attention is None:
        m, m_all = p.get("mscale"), p.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if (m and m_all) else mscale(factor)
    beta_fast = p.get("beta_fast") or 32
    beta_slow = p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        """The pair index whose wavelength fits ``rotations`` turns in the original context."""
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolation = 1.0 - ramp  # 1: keep the pair's frequency, 0: interpolate it by factor
    pos_freqs = base**exponents
    inv_freq = (1.0 / (factor * pos_freqs)) * (1.0 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention)


def _longrope(
    base: float, exponents: np.ndarray, dim: int, p: Mapping[str, Any], mpe: int | None, seq_len: int | None
) -> tuple[np.ndarray, float]:
    """LongRoPE (Ding et al. 2024; Phi-3) as transformers' ``_compute_longrope_parameters``."""
    original = p["original_max_position_embeddings"]
    for key in ("short_factor", "long_factor"):
        if len(p[key]) != dim // 2:
            msg = f"{key} has {len(p[key])} entries; a rotary dimension of {dim} needs {dim // 2}"
            raise InputError(msg)
    factor = p.get("factor")
    if factor is None:
        if mpe is None:
            msg = "rope_type 'longrope' without factor needs max_position_embeddings (factor = max_position_embeddings / original)"
            raise InputError(msg)
        factor = mpe / original
    attention = p.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = np.asarray(p["long_factor"] if (seq_len and seq_len > original) else p["short_factor"], dtype=np.float64)
    return 1.0 / (ext * base**exponents), float(attention)


def _llama3(inv_freq: np.ndarray, p: Mapping[str, Any]) -> np.ndarray:
    """Llama 3.1's frequency-dependent scaling (transformers' ``_compute_llama3_parameters``)."""
    factor, low, high = float(p["factor"]), float(p["low_freq_factor"]), float(p["high_freq_factor"])
    original = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    out = np.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < original / high) & ~(wavelen > original / low)
    return np.where(medium, blended, out)


# ----------------------------------------------------------------------------- model configs


@dataclass(frozen=True)
class HFRope:
    """The RoPE of a Hugging Face model config.

    Attributes:
        path: the config.json read.
        model_type: the config's ``model_type`` (or ``"unknown"``).
        head_dim: size of one attention head.
        rope_parameters: standardized parameters (see :func:`standard_rope_parameters`).
        max_position_embeddings: the config's context length (None when absent).
    """

    path: str
    model_type: str
    head_dim: int
    rope_parameters: Mapping[str, Any]
    max_position_embeddings: int | None

    def inv_freq(self, seq_len: int | None = None) -> tuple[np.ndarray, float]:
        """:func:`rope_inv_freq` of this model at sequence length ``seq_len``."""
        return rope_inv_freq(self.head_dim, self.rope_parameters, max_position_embeddings=self.max_position_embeddings, seq_len=seq_len)


def hf_rope(path: str | os.PathLike[str]) -> HFRope:
    """Read the RoPE of a model from its ``config.json`` (or a folder holding one).

    Reads ``rope_parameters`` (or legacy ``rope_scaling`` with ``rope_theta``),
    ``partial_rotary_factor``, ``head_dim`` (else ``hidden_size // num_attention_heads``) and
    ``max_position_embeddings``; a config whose rope parameters are nested per layer type uses
    its ``full_attention`` entry.

    Raises:
        InputError: missing or unreadable file, no head size, bad rope parameters (one line
            naming the file, key and value).
    """
    path = os.fspath(path)
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    config = read_json_file(file, what="JSON config")
    if config is None:
        msg = f"{file}: no such file (hf: needs a model's config.json or its folder)"
        raise InputError(msg)
    if not isinstance(config, dict):
        msg = f"{file}: expected a JSON object, got {type(config).__name__}"
        raise InputError(msg)
    if isinstance(config.get("text_config"), dict) and not any(k in config for k in ("rope_parameters", "rope_scaling", "rope_theta")):
        config = config["text_config"]  # multimodal configs keep the language model's settings there
    head_dim = config.get("head_dim")
    if head_dim is None:
        hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
        if not (_is_int(hidden) and _is_int(heads) and heads > 0):
            msg = f"{file}: no head_dim, and no hidden_size / num_attention_heads to derive it (got {hidden!r} / {heads!r})"
            raise InputError(msg)
        head_dim = hidden // heads
    mpe = config.get("max_position_embeddings")
    if mpe is not None and not (_is_int(mpe) and mpe > 0):
        msg = f"{file}: max_position_embeddings must be a positive integer, got {mpe!r}"
        raise InputError(msg)
    params: dict[str, Any] = {}
    for key in ("rope_parameters", "rope_scaling"):
        if config.get(key) is not None and not isinstance(config[key], Mapping):
            msg = f"{file}: {key} must be an object, got {type(config[key]).__name__} {config[key]!r:.80}"
            raise InputError(msg)
    if isinstance(config.get("rope_parameters"), Mapping):
        params = dict(config["rope_parameters"])
        if "full_attention" in params and isinstance(params["full_attention"], Mapping):
            params = dict(params["full_attention"])
        for key in ("rope_theta", "partial_rotary_factor"):
            if config.get(key) is not None:
                params.setdefault(key, config[key])
        if config.get("original_max_position_embeddings") is not None:
            params["original_max_position_embeddings"] = config["original_max_position_embeddings"]
    else:
        params = {k: config.get(k) for k in ("rope_scaling", "rope_theta", "partial_rotary_factor", "original_max_position_embeddings")}
    try:
        params = standard_rope_parameters(params, max_position_embeddings=mpe)
        rope_inv_freq(head_dim, params, max_position_embeddings=mpe)
    except InputError as exc:
        msg = f"{file}: {exc}"
        raise InputError(msg) from None
    return HFRope(file, str(config.get("model_type", "unknown")), int(head_dim), params, mpe)


# ----------------------------------------------------------------------------- checks


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any, key: str) -> float:
    if not _is_number(value):
        msg = f"{key} must be a finite number, got {value!r}"
        raise InputError(msg)
    return float(value)


def _positive(value: Any, key: str) -> float:
    if not (_is_number(value) and value > 0):
        msg = f"{key} must be a positive number, got {value!r}"
        raise InputError(msg)
    return float(value)


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, (np.integer,)):
        value = int(value)
    if not (_is_int(value) and value > 0):
        msg = f"{key} must be a positive integer, got {value!r}"
        raise InputError(msg)
    return value
