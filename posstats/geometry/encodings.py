"""The catalog of positional encodings compared against the corpus (THEORY.md section 5).

Every constructor returns a float64 numpy array of shape ``(len(positions), dim)``: row r
is the encoding of the 0-based sequence position ``positions[r]``. Geometry works on the
*occupied* positions only, so ``positions`` is usually the list of occupied rows; an int
``n`` means ``arange(n)``.

| spec | constructor | parameters (first one may be given bare) |
|---|---|---|
| ``mds`` | :func:`mds_encoding` | (needs an MDS result) |
| ``mds-lowrank:R`` | :func:`mds_lowrank` | ``rank`` (required) |
| ``mds-smacof`` | :func:`mds_smacof` | ``rank`` = dim, ``weights`` = uniform/occupancy/local, ``scale`` = 1, ``max_iter`` = 300, ``tol`` = 1e-6 (needs an MDS result and the distances) |
| ``sinusoidal`` | :func:`sinusoidal` | ``base`` = 10000 |
| ``rope`` | :func:`rope` | ``base`` = 10000, ``layout`` = interleaved/half, ``vector`` = ones/random, ``seed`` = 0 |
| ``rope-half`` | alias of ``rope:layout=half`` | |
| ``alibi`` | :func:`alibi` | ``heads`` = min(dim, 8) |
| ``random`` | :func:`random_encoding` | ``sigma`` = 1, ``seed`` = 0 |
| ``learned:PATH`` | :func:`learned` | ``path`` (required), ``key`` |
| ``matrix-power:PATH`` | :func:`matrix_power` | ``path`` (required, safetensors with tensors ``M`` and ``x``) |

Spec grammar: ``NAME(:key=value)*``, and one bare value allowed for the first parameter,
e.g. ``mds-lowrank:8``, ``random:0.02``, ``rope:layout=half:vector=random``,
``learned:bert.safetensors:key=embeddings.position_embeddings.weight``.
:func:`make_encoding` builds an :class:`Encoding` from a spec; its ``name`` is the
canonical spec (defaults left out, the first parameter bare), e.g. ``rope-half`` ->
``rope:layout=half``.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from posstats.errors import InputError, PosstatsError, did_you_mean
from posstats.geometry.rope_scaling import ROPE_TYPES, hf_rope, rope_inv_freq
from posstats.geometry.smacof import pair_weights, smacof
from posstats.storage.tensors import SafetensorsFile

__all__ = [
    "DEFAULT_ENCODINGS",
    "DEFAULT_MAX_ENCODINGS",
    "ENCODING_NAMES",
    "LEARNED_KEYS",
    "Encoding",
    "EncodingSpec",
    "alibi",
    "alibi_slopes",
    "encoding_dims",
    "check_encoding_count",
    "count_encoding_specs",
    "encoding_sweeps",
    "expand_encoding_specs",
    "learned",
    "make_encoding",
    "matrix_power",
    "mds_encoding",
    "mds_lowrank",
    "mds_smacof",
    "parse_encoding_spec",
    "random_encoding",
    "rope",
    "rope_rotation",
    "rope_spec_parameters",
    "rope_table",
    "sinusoidal",
    "split_encoding_list",
]

# mds-smacof: scored where affordable (AnalysisConfig.smacof_limit geometry rows)
DEFAULT_ENCODINGS = ("mds", "mds-smacof", "sinusoidal", "rope", "alibi", "random", "random:0.02")

# Position-embedding tensors of common checkpoints (BERT / RoBERTa, GPT-2, generic), tried
# in this order, each as the whole key or as its dotted suffix ("bert." + ..., "transformer." + ...).
LEARNED_KEYS = ("embeddings.position_embeddings.weight", "wpe.weight", "position_embeddings.weight")

# Rows of the random stream generated at a time; bounds memory for far positions.
_RANDOM_CHUNK_ROWS = 4096


# ---------------------------------------------------------------------------------------
# Argument checks


def _positions(positions: Any) -> np.ndarray:
    """``positions`` as a 1-D int64 array of non-negative indices (an int n -> arange(n))."""
    if isinstance(positions, (int, np.integer)) and not isinstance(positions, bool):
        if positions < 0:
            msg = f"the number of positions must be >= 0, got {positions}"
            raise ValueError(msg)
        return np.arange(int(positions), dtype=np.int64)
    pos = np.asarray(positions)
    if pos.ndim != 1:
        msg = f"positions must be 1-D; got shape {pos.shape}"
        raise ValueError(msg)
    if pos.size == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.issubdtype(pos.dtype, np.integer):
        msg = f"positions must be integers (0-based sequence indices); got dtype {pos.dtype}"
        raise ValueError(msg)
    pos = pos.astype(np.int64)
    if pos.min() < 0:
        msg = f"positions must be >= 0; got {int(pos.min())}"
        raise ValueError(msg)
    return pos


def _dim(dim: Any, name: str, *, even: bool = False) -> int:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        msg = f"{name}: dimension must be an integer, got {dim!r}"
        raise InputError(msg)
    if dim < 1:
        msg = f"{name}: dimension must be >= 1, got {dim}"
        raise InputError(msg)
    if even and dim % 2:
        msg = f"{name} needs an even dimension, got {dim}"
        raise InputError(msg)
    return int(dim)


def _positive(value: float, what: str) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        msg = f"{what} must be a positive number, got {value}"
        raise InputError(msg)
    return value


def _pad(matrix: np.ndarray, dim: int) -> np.ndarray:
    """First ``dim`` columns of ``matrix`` as float64, zero-padded on the right to ``dim``."""
    out = np.zeros((matrix.shape[0], dim), dtype=np.float64)
    k = min(dim, matrix.shape[1])
    out[:, :k] = matrix[:, :k]
    return out


# ---------------------------------------------------------------------------------------
# Constructors


def sinusoidal(positions: Any, /, dim: int, *, base: float = 10000.0) -> np.ndarray:
    """Vaswani et al.'s sinusoidal encoding, float64 (len(positions) x dim), dim even.

    ``P[i, 2k] = sin(i w_k)``, ``P[i, 2k + 1] = cos(i w_k)``, ``w_k = base^(-2k/dim)``.
    Every row has norm ``sqrt(dim / 2)``.

    >>> sinusoidal(2, 2).tolist()
    [[0.0, 1.0], [0.8414709848078965, 0.5403023058681398]]
    """
    dim = _dim(dim, "sinusoidal", even=True)
    base = _positive(base, "sinusoidal base")
    pos = _positions(positions)
    angles = np.multiply.outer(pos.astype(np.float64), _frequencies(dim, base))
    out = np.empty((pos.shape[0], dim), dtype=np.float64)
    out[:, 0::2] = np.sin(angles)
    out[:, 1::2] = np.cos(angles)
    return out


def _frequencies(dim: int, base: float) -> np.ndarray:
    return base ** (-2.0 * np.arange(dim // 2, dtype=np.float64) / dim)


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
    dim = _dim(dim, "rope", even=True)
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
    pos = _positions(positions)
    angles = np.multiply.outer(pos.astype(np.float64), freqs)
    cos, sin = np.cos(angles), np.sin(angles)
    out = np.zeros((pos.shape[0], dim), dtype=np.float64)
    out[:, first] = a * cos - b * sin
    out[:, second] = a * sin + b * cos
    if attention_factor != 1.0:
        out *= _positive(attention_factor, "rope attention factor")
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
    dim = _dim(dim, "rope", even=True)
    base = _positive(base, "rope base")
    return rope_table(positions, _frequencies(dim, base), dim, layout=layout, vector=vector, seed=seed)


def rope_rotation(dim: int, *, base: float = 10000.0, layout: str = "interleaved") -> np.ndarray:
    """The one-step RoPE rotation ``M = R(1)`` (dim x dim), so that ``rope(...) == M^i u``.

    Block-diagonal in the layout's pairs, with ``[[cos t, -sin t], [sin t, cos t]]`` at
    ``t = theta_k`` for pair k.
    """
    dim = _dim(dim, "rope", even=True)
    first, second = _pair_columns(dim, layout)
    theta = _frequencies(dim, _positive(base, "rope base"))
    m = np.zeros((dim, dim), dtype=np.float64)
    m[first, first] = np.cos(theta)
    m[first, second] = -np.sin(theta)
    m[second, first] = np.sin(theta)
    m[second, second] = np.cos(theta)
    return m


def matrix_power(positions: Any, M: Any, x: Any, /) -> np.ndarray:
    """The matrix-power construction ``P[j] = M^j x`` (papers/002), float64 (len(positions) x d).

    Args:
        positions: non-negative integer exponents (0-based positions), or an int n.
        M: (d x d) real matrix.
        x: (d,) real vector.

    ``M^j x`` is the product of the binary powers ``M^(2^b)`` (computed by repeated
    squaring) over the set bits b of j, applied to all rows at once: O(log max(j)) matrix
    products, and each row goes through at most log2(j) + 1 of them, so rounding grows with
    log j rather than with j as in step-by-step iteration.
    """
    m = np.asarray(M, dtype=np.float64)
    v = np.asarray(x, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        msg = f"matrix-power: M must be square (d x d); got shape {m.shape}"
        raise InputError(msg)
    if v.shape != (m.shape[0],):
        msg = f"matrix-power: x must have shape ({m.shape[0]},) to match M; got {v.shape}"
        raise InputError(msg)
    pos = _positions(positions)
    out = np.broadcast_to(v, (pos.shape[0], v.shape[0])).copy()
    if pos.size == 0:
        return out
    power = m
    remaining = pos.copy()
    while True:
        odd = (remaining & 1).astype(bool)
        if odd.any():
            out[odd] = out[odd] @ power.T
        remaining >>= 1
        if not remaining.any():
            break
        power = power @ power
    return out


def alibi_slopes(heads: int) -> np.ndarray:
    """ALiBi head slopes (Press et al.), float64 (heads,).

    For a power of two h: the geometric sequence ``2^(-8/h), 2^(-16/h), ..., 2^(-8)``.
    Otherwise the reference implementation's rule: the slopes of the closest lower power of
    two c, followed by every other slope of 2c (``get_slopes(2c)[0::2]``) up to h in all.

    >>> alibi_slopes(4).tolist()
    [0.25, 0.0625, 0.015625, 0.00390625]
    """
    if isinstance(heads, bool) or not isinstance(heads, (int, np.integer)) or heads < 1:
        msg = f"alibi: heads must be a positive integer, got {heads!r}"
        raise InputError(msg)
    heads = int(heads)

    def power_of_two(h: int) -> list[float]:
        start = 2.0 ** (-8.0 / h)
        return [start * start**k for k in range(h)]

    if heads & (heads - 1) == 0:
        return np.array(power_of_two(heads), dtype=np.float64)
    closest = 1 << (heads.bit_length() - 1)
    extra = alibi_slopes(2 * closest)[0::2][: heads - closest]
    return np.concatenate([power_of_two(closest), extra]).astype(np.float64)


def alibi(positions: Any, /, dim: int, *, heads: int | None = None) -> np.ndarray:
    """ALiBi's per-head linear biases as an additive encoding, float64 (len(positions) x dim).

    ``P[i] = i m`` padded with zeros to ``dim``, where ``m = alibi_slopes(heads)``, so that
    ``|p_i - p_j| = |i - j| |m|``: rank 1, exactly monotone. ``heads`` defaults to
    ``min(dim, 8)`` (the ALiBi paper's 8-head slopes); the head count only sets the scale
    ``|m|``, which moves raw stress but not scaled stress, Pearson or monotonicity.
    ``heads`` may not exceed ``dim``.
    """
    dim = _dim(dim, "alibi")
    heads = min(dim, 8) if heads is None else heads
    slopes = alibi_slopes(heads)
    if slopes.shape[0] > dim:
        msg = f"alibi: {slopes.shape[0]} heads do not fit in dimension {dim}"
        raise InputError(msg)
    pos = _positions(positions)
    return _pad(np.multiply.outer(pos.astype(np.float64), slopes), dim)


def random_encoding(positions: Any, /, dim: int, *, sigma: float = 1.0, seed: int = 0) -> np.ndarray:
    """i.i.d. ``N(0, sigma^2)`` entries, seeded, float64 (len(positions) x dim).

    Row i is row i of the (max(positions) + 1) x dim matrix drawn from
    ``numpy.random.default_rng(seed).standard_normal``, so a position's row depends only on
    (seed, dim, position), not on which other positions are occupied. The stream is drawn a
    chunk of rows at a time (memory O(len(positions) x dim), time O(max(positions) x dim)).
    """
    dim = _dim(dim, "random")
    sigma = _positive(sigma, "random: sigma")
    pos = _positions(positions)
    out = np.empty((pos.shape[0], dim), dtype=np.float64)
    if pos.size == 0:
        return out
    rng = np.random.default_rng(seed)
    order = np.argsort(pos, kind="stable")
    sorted_pos = pos[order]
    top = int(sorted_pos[-1]) + 1
    for lo in range(0, top, _RANDOM_CHUNK_ROWS):
        hi = min(top, lo + _RANDOM_CHUNK_ROWS)
        chunk = rng.standard_normal((hi - lo, dim))
        a, b = np.searchsorted(sorted_pos, [lo, hi])
        if a < b:
            out[order[a:b]] = chunk[sorted_pos[a:b] - lo]
    out *= sigma
    return out


def mds_encoding(mds_result: Any, /, dim: int) -> np.ndarray:
    """``P_MDS(dim)``: the first ``dim`` classical-MDS coordinates, float64 (n x dim).

    ``mds_result.encoding`` is the (n x k) coordinate matrix of the occupied rows (as in
    ``posstats.geometry.mds.MDSResult``); columns beyond k are zero (distances do not change).
    """
    dim = _dim(dim, "mds")
    coords = _mds_coordinates(mds_result)
    return _pad(coords, dim)


def mds_lowrank(mds_result: Any, /, dim: int, rank: int) -> np.ndarray:
    """``P_MDS(rank)`` zero-padded to ``dim`` columns, float64 (n x dim), 1 <= rank <= dim.

    If the MDS result holds fewer than ``rank`` coordinates, the missing ones are zero (as
    they are when the MDS spectrum has fewer positive eigenvalues than ``rank``).
    """
    dim = _dim(dim, "mds-lowrank")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 1 <= rank <= dim:
        msg = f"mds-lowrank: rank must be an integer in 1..{dim} (the dimension), got {rank!r}"
        raise InputError(msg)
    coords = _mds_coordinates(mds_result)
    return _pad(coords[:, : int(rank)], dim)


def mds_smacof(
    mds_result: Any,
    distances: Any,
    /,
    dim: int,
    *,
    rank: int | None = None,
    weights: str = "uniform",
    scale: float = 1.0,
    max_iter: int = 300,
    tol: float = 1e-6,
    positions: Any = None,
    occupancy: Any = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Stress-optimal encoding: SMACOF refinement of classical MDS (issue: MDS minimises strain).

    Starts from the first ``r = rank or dim`` classical-MDS coordinates, minimises the
    (weighted) stress ``sum w (e - h)^2 / sum w h^2`` by majorisation
    (:func:`posstats.geometry.smacof.smacof`; stops when the relative decrease is below ``tol`` or
    after ``max_iter`` iterations), and embeds the rank-r result in width ``dim`` by zero
    padding (distances unchanged). ``weights``: see :func:`posstats.geometry.smacof.pair_weights`
    (``occupancy`` down-weights noisy rare positions, ``local`` favours nearby pairs).

    Returns:
        (matrix (n x dim) float64, details: classical_stress, stress, iterations,
        converged, seconds, rank, weights).
    """

    dim = _dim(dim, "mds-smacof")
    r = dim if rank is None else int(rank)
    if not 1 <= r <= dim:
        msg = f"mds-smacof: rank must be an integer in 1..{dim} (the dimension), got {r}"
        raise InputError(msg)
    init = mds_lowrank(mds_result, r, r)
    w = None
    if weights != "uniform":
        pos = _positions(positions if positions is not None else init.shape[0])
        if "occupancy" in weights and occupancy is None:
            raise PosstatsError("mds-smacof:weights=occupancy needs the occupancy per position")
        w = pair_weights(pos, occupancy=occupancy, kind=weights, scale=scale)
    result = smacof(np.asarray(distances, dtype=np.float64), init, weights=w, max_iter=max_iter, tol=tol)
    details = {
        "method": "smacof",
        "classical_stress": float(result.initial_stress),
        "stress": float(result.stress),
        "iterations": int(result.iterations),
        "converged": bool(result.converged),
        "seconds": float(result.seconds),
        "rank": r,
        "weights": weights,
    }
    return _pad(np.asarray(result.encoding), dim), details


def _mds_coordinates(mds_result: Any) -> np.ndarray:
    coords = getattr(mds_result, "encoding", None)
    if coords is None:
        msg = f"mds: expected an MDS result with an 'encoding' attribute, got {type(mds_result).__name__}"
        raise TypeError(msg)
    coords = np.asarray(coords, dtype=np.float64)
    if coords.ndim != 2:
        msg = f"mds: the MDS encoding must be 2-D (n x k); got shape {coords.shape}"
        raise ValueError(msg)
    return coords


# ---------------------------------------------------------------------------------------
# Checkpoint files


def _find_learned_key(path: str, keys: list[str]) -> str:
    for candidate in LEARNED_KEYS:
        if candidate in keys:
            return candidate
        matches = [k for k in keys if k.endswith("." + candidate)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            msg = f"{path}: several position-embedding tensors match {candidate!r}: {', '.join(sorted(matches))}; choose one with :key=NAME"
            raise InputError(msg)
    shown = ", ".join(sorted(keys)[:8]) + (", ..." if len(keys) > 8 else "")
    msg = f"{path}: no position-embedding tensor found (looked for {', '.join(LEARNED_KEYS)}); keys: {shown}; choose one with :key=NAME"
    raise InputError(msg)


def _load_table(path: str, key: str | None) -> tuple[np.ndarray, str]:
    """The matrix stored in ``path`` (.npy or .safetensors) and a label naming it."""
    if not os.path.isfile(path):
        msg = f"{path}: no such file"
        raise InputError(msg)
    lower = path.lower()
    if lower.endswith(".npy"):
        if key is not None:
            msg = f"{path}: a .npy file holds one array; key={key!r} applies only to safetensors"
            raise InputError(msg)
        try:
            table = np.load(path, allow_pickle=False, mmap_mode="r")
        except Exception as exc:  # noqa: BLE001 - any failure here is a bad file
            msg = f"{path}: not a readable .npy array ({exc})"
            raise InputError(msg) from exc
        return table, path
    if lower.endswith(".safetensors"):
        file = SafetensorsFile(path)  # one header parse for the keys and the tensor
        keys = file.keys()
        if key is None:
            key = _find_learned_key(path, keys)
        elif key not in keys:
            shown = ", ".join(sorted(keys)[:8]) + (", ..." if len(keys) > 8 else "")
            msg = f"{path}: no tensor named {key!r}; keys: {shown}"
            raise InputError(msg)
        return file.get(key), f"{path} [{key}]"
    msg = f"{path}: unsupported file type (expected .safetensors or .npy)"
    raise InputError(msg)


def learned(positions: Any, /, dim: int, *, path: str | os.PathLike[str], key: str | None = None) -> np.ndarray:
    """A learned position-embedding table read from a checkpoint, float64 (len(positions) x dim).

    ``path`` is a ``.safetensors`` file (tensor ``key``; when None, the first of
    :data:`LEARNED_KEYS` present, as the whole key or a dotted suffix) or a ``.npy`` file
    (read with ``allow_pickle=False``). Row r is the table's row ``positions[r]`` (no offset
    is applied: tables that reserve leading rows, like BART's, need shifted positions); the
    first ``dim`` columns are kept, or zeros appended when the table is narrower.

    Raises:
        InputError: missing or unreadable file, unknown or ambiguous key, a table that is not
            2-D, or positions beyond the table's rows (the message names file, key, shape).
    """
    dim = _dim(dim, "learned")
    path = os.fspath(path)
    table, label = _load_table(path, key)
    if table.ndim != 2:
        msg = f"{label}: expected a 2-D (positions x dim) table, got shape {tuple(table.shape)}"
        raise InputError(msg)
    pos = _positions(positions)
    if pos.size and int(pos.max()) >= table.shape[0]:
        msg = f"{label}: shape {tuple(table.shape)} has {table.shape[0]} positions, but position {int(pos.max())} was asked for"
        raise InputError(msg)
    if not np.issubdtype(table.dtype, np.number) or np.iscomplexobj(table):
        msg = f"{label}: expected a real numeric table, got dtype {table.dtype}"
        raise InputError(msg)
    return _pad(np.asarray(table[pos], dtype=np.float64), dim)


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
    dim = _dim(dim, "rope", even=True)
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


def encoding_dims(spec: str | EncodingSpec, dims: Any) -> tuple[int, ...]:
    """The widths an encoding is scored at: ``dims``, except ``hf:`` specs, which are scored
    at their model's head dimension only (whatever ``dims`` says)."""
    parsed = spec if isinstance(spec, EncodingSpec) else parse_encoding_spec(spec)
    if parsed.name == "hf":
        return (hf_rope(parsed.params["path"]).head_dim,)
    return tuple(int(d) for d in dims)


def _matrix_power_from_file(positions: Any, dim: int, path: str) -> np.ndarray:
    if not path.lower().endswith(".safetensors") or not os.path.isfile(path):
        msg = f"{path}: matrix-power needs an existing .safetensors file with tensors 'M' and 'x'"
        raise InputError(msg)
    file = SafetensorsFile(path)
    missing = [k for k in ("M", "x") if k not in file.keys()]
    if missing:
        msg = f"{path}: matrix-power needs tensors 'M' and 'x'; missing {', '.join(missing)}"
        raise InputError(msg)
    m, x = file.get("M"), file.get("x")
    if m.ndim != 2 or m.shape[0] > dim:
        msg = f"{path}: matrix-power M has shape {tuple(m.shape)}; it must be square with side <= dimension {dim}"
        raise InputError(msg)
    return _pad(matrix_power(positions, m, x), dim)


# ---------------------------------------------------------------------------------------
# Spec strings


_REQUIRED = object()


@dataclass(frozen=True)
class _Param:
    name: str
    kind: Callable[[str], Any]
    default: Any


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            msg = f"expected one of {', '.join(allowed)}"
            raise ValueError(msg)
        return text

    parse.__name__ = "one of " + "/".join(allowed)
    return parse


def _int(text: str) -> int:
    return int(text)


def _seed(text: str) -> int:
    value = int(text)
    if not 0 <= value < 2**63:
        msg = "expected a seed in [0, 2^63)"
        raise ValueError(msg)
    return value


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        msg = "expected a finite number"
        raise ValueError(msg)
    return value


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("true", "false", "1", "0"):
        msg = "expected true or false"
        raise ValueError(msg)
    return lowered in ("true", "1")


def _floats(text: str) -> tuple[float, ...]:
    """``1.0;1.5;2`` -> (1.0, 1.5, 2.0): a list value (LongRoPE's per-pair factors)."""
    return tuple(_float(x) for x in text.split(";") if x.strip())


def _str(text: str) -> str:
    if not text:
        msg = "expected a non-empty value"
        raise ValueError(msg)
    return text


# Per name: its parameters in canonical order; the first one is the one that may be bare.
_CATALOG: dict[str, tuple[_Param, ...]] = {
    "mds": (),
    "mds-lowrank": (_Param("rank", _int, _REQUIRED),),
    "mds-smacof": (
        _Param("rank", _int, None),
        _Param("weights", _choice("uniform", "occupancy", "local", "occupancy-local"), "uniform"),
        _Param("scale", _float, 1.0),
        _Param("max_iter", _int, 300),
        _Param("tol", _float, 1e-6),
    ),
    "sinusoidal": (_Param("base", _float, 10000.0),),
    "rope": (
        _Param("base", _float, 10000.0),
        _Param("type", _choice(*ROPE_TYPES), "default"),
        _Param("factor", _float, None),
        _Param("original", _int, None),
        _Param("beta_fast", _float, None),
        _Param("beta_slow", _float, None),
        _Param("mscale", _float, None),
        _Param("mscale_all_dim", _float, None),
        _Param("attention_factor", _float, None),
        _Param("truncate", _bool, None),
        _Param("low_freq_factor", _float, None),
        _Param("high_freq_factor", _float, None),
        _Param("short_factor", _floats, None),
        _Param("long_factor", _floats, None),
        _Param("partial", _float, None),
        _Param("seq_len", _int, None),
        _Param("layout", _choice("interleaved", "half"), "interleaved"),
        _Param("vector", _choice("ones", "random"), "ones"),
        _Param("seed", _seed, 0),
    ),
    "hf": (
        _Param("path", _str, _REQUIRED),
        _Param("seq_len", _int, None),
        _Param("layout", _choice("interleaved", "half"), "half"),
        _Param("vector", _choice("ones", "random"), "ones"),
        _Param("seed", _seed, 0),
    ),
    "alibi": (_Param("heads", _int, None),),
    "random": (_Param("sigma", _float, 1.0), _Param("seed", _seed, 0)),
    "learned": (_Param("path", _str, _REQUIRED), _Param("key", _str, None)),
    "matrix-power": (_Param("path", _str, _REQUIRED),),
}
_ALIASES: dict[str, tuple[str, dict[str, Any]]] = {"rope-half": ("rope", {"layout": "half"})}
# Other spellings of parameter keys (the Hugging Face names among them), per encoding name.
_KEY_ALIASES: dict[str, dict[str, str]] = {
    "rope": {
        "theta": "base",
        "rope_theta": "base",
        "rope_type": "type",
        "original_max_position_embeddings": "original",
        "partial_rotary_factor": "partial",
    },
}

ENCODING_NAMES = tuple(_CATALOG) + tuple(_ALIASES)


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    if isinstance(value, tuple):
        return ";".join(_format(v) for v in value)
    return str(value)


_KEY_START = re.compile(r"\s*[A-Za-z_]\w*\s*=")


def _spec_tokens(text: str) -> list[str]:
    """Split a spec's parameters on ``:``, and on ``,`` where a ``key=`` follows (so
    ``rope:type=yarn,factor=32`` reads like ``rope:type=yarn:factor=32`` while a path with a
    comma stays whole)."""
    tokens: list[str] = []
    for piece in text.split(":"):
        parts = piece.split(",")
        tokens.append(parts[0])
        for part in parts[1:]:
            if _KEY_START.match(part):
                tokens.append(part)
            else:
                tokens[-1] += "," + part
    return tokens


@dataclass(frozen=True)
class EncodingSpec:
    """A parsed encoding spec: the catalog name and all its parameters (defaults filled in)."""

    name: str
    params: Mapping[str, Any]

    @property
    def canonical(self) -> str:
        """The spec string: the first parameter bare when set, then other non-default ones."""
        parts = [self.name]
        for i, p in enumerate(_CATALOG[self.name]):
            value = self.params[p.name]
            if p.default is not _REQUIRED and value == p.default:
                continue
            parts.append(_format(value) if i == 0 else f"{p.name}={_format(value)}")
        return ":".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "params": dict(self.params), "canonical": self.canonical}


def parse_encoding_spec(spec: str, /) -> EncodingSpec:
    """Parse ``NAME(:key=value)*`` (one bare value allowed, for the first parameter).

    >>> parse_encoding_spec("mds-lowrank:8").params["rank"]
    8
    >>> parse_encoding_spec("rope-half").canonical
    'rope:layout=half'

    Raises:
        PosstatsError: unknown name (the message lists the valid ones), unknown or repeated
            key, two bare values, a value of the wrong type, a missing required value.
    """
    if not isinstance(spec, str) or not spec.strip():
        msg = f"empty encoding spec {spec!r}; valid names: {', '.join(ENCODING_NAMES)}"
        raise PosstatsError(msg)
    text = spec.strip()
    head, *tokens = _spec_tokens(text)
    name = head.strip().lower()
    preset: dict[str, Any] = {}
    if name in _ALIASES:
        name, preset = _ALIASES[name]
    if name not in _CATALOG:
        msg = (f"unknown encoding {head!r} in {spec!r}{did_you_mean(head, ENCODING_NAMES)}; "
               f"valid names: {', '.join(ENCODING_NAMES)}")
        raise PosstatsError(msg)
    params = _CATALOG[name]
    by_name = {p.name: p for p in params}
    aliases = _KEY_ALIASES.get(name, {})
    raw: dict[str, str] = {}
    bare: list[str] = []
    for token in tokens:
        key, sep, value = token.partition("=")
        key = aliases.get(key.strip(), key) if sep else key
        if sep and key.strip() in by_name:
            key = key.strip()
            if key in raw:
                msg = f"encoding spec {spec!r}: {key} given twice"
                raise PosstatsError(msg)
            raw[key] = value
        elif sep and key.strip().isidentifier():
            allowed = ", ".join(by_name) or "none"
            msg = f"encoding spec {spec!r}: {name} has no parameter {key.strip()!r} (parameters: {allowed})"
            raise PosstatsError(msg)
        else:
            bare.append(token)
    if bare:
        if not params:
            msg = f"encoding spec {spec!r}: {name} takes no parameters"
            raise PosstatsError(msg)
        first = params[0].name
        if len(bare) > 1 and params[0].kind is not _str:
            msg = f"encoding spec {spec!r}: only one bare value is allowed (the {first})"
            raise PosstatsError(msg)
        if first in raw:
            msg = f"encoding spec {spec!r}: {first} given twice"
            raise PosstatsError(msg)
        # A path may itself contain ':' (e.g. a Windows drive): rejoin the bare pieces.
        raw[first] = ":".join(bare)
    values: dict[str, Any] = {}
    for p in params:
        if p.name in raw:
            try:
                values[p.name] = p.kind(raw[p.name].strip())
            except ValueError as exc:
                msg = f"encoding spec {spec!r}: bad {p.name} {raw[p.name]!r} ({exc})"
                raise PosstatsError(msg) from None
        elif p.name in preset:
            values[p.name] = preset[p.name]
        elif p.default is _REQUIRED:
            msg = f"encoding spec {spec!r}: {name} needs a {p.name}, e.g. {name}:{'8' if p.kind is _int else 'VALUE'}"
            raise PosstatsError(msg)
        else:
            values[p.name] = p.default
    return EncodingSpec(name, values)


def split_encoding_list(text: str) -> tuple[str, ...]:
    """A comma-separated list of specs, where a ``key=value`` piece continues the spec
    before it: ``"mds,rope:type=yarn,factor=32,sinusoidal"`` ->
    ``("mds", "rope:type=yarn,factor=32", "sinusoidal")``."""
    specs: list[str] = []
    for piece in text.split(","):
        if specs and _KEY_START.match(piece):
            specs[-1] += "," + piece
        elif piece.strip():
            specs.append(piece.strip())
    return tuple(specs)


def _sweep_axes(spec: str) -> tuple[str, list[list[str]]]:
    """A spec's head and, per parameter token, its alternatives (``factor=8|16`` ->
    ``["factor=8", "factor=16"]``; a bare ``0.02|1`` -> ``["0.02", "1"]``)."""
    head, *tokens = _spec_tokens(spec.strip())
    axes = []
    for token in tokens:
        key, sep, value = token.partition("=")
        options = value.split("|") if sep else token.split("|")
        if any(not o.strip() for o in options):
            msg = f"encoding spec {spec!r}: empty value in the sweep {token!r}"
            raise PosstatsError(msg)
        axes.append([f"{key}={o}" if sep else o for o in options])
    return head, axes


DEFAULT_MAX_ENCODINGS = 256


def count_encoding_specs(specs: Any) -> int:
    """How many specs :func:`expand_encoding_specs` gives at most (before duplicates are
    dropped), computed from the sweeps' sizes without expanding them: a sweep of three
    keys with 100 values each is 1,000,000 specs, counted in microseconds."""
    total = 0
    for spec in specs:
        total += math.prod(len(axis) for axis in _sweep_axes(spec)[1]) if "|" in spec else 1
    return total


def check_encoding_count(specs: Any, /, *, limit: int = DEFAULT_MAX_ENCODINGS) -> int:
    """The number of specs ``specs`` expand to; raise when above ``limit``.

    Raises:
        PosstatsError: ``"--encodings expands to 8,000 encodings, more than the limit of
            256 ..."`` (one line, with how to raise the limit).
    """
    if int(limit) < 1:
        msg = f"the limit on scored encodings must be >= 1, got {limit}"
        raise PosstatsError(msg)
    n = count_encoding_specs(specs)
    if n > limit:
        msg = (f"--encodings expands to {n:,} encodings (sweeps multiply: a|b|c per key), more than the limit of "
               f"{int(limit):,} one run scores; each costs a table and a stress per width. Narrow the sweep, or "
               "raise the limit with --max-encodings N")
        raise PosstatsError(msg)
    return n


def expand_encoding_specs(specs: Any) -> tuple[str, ...]:
    """Specs with sweeps expanded, duplicates dropped, order kept: a parameter written
    ``key=a|b|c`` gives one spec per value (several swept keys: every combination), e.g.
    ``rope:type=yarn,original=4096,factor=8|16|32`` -> three ``rope:type=yarn:...`` specs.
    A spec without a sweep is kept as written; each sweep member is a canonical spec.
    """
    out: dict[str, None] = {}
    for spec in specs:
        if "|" not in spec:
            parse_encoding_spec(spec)
            out.setdefault(spec.strip())
            continue
        head, axes = _sweep_axes(spec)
        for combo in itertools.product(*axes):
            out.setdefault(parse_encoding_spec(":".join((head, *combo))).canonical)
    return tuple(out)


def encoding_sweeps(specs: Any) -> list[dict[str, Any]]:
    """The sweeps among ``specs`` (JSON-ready), for the report's stress-against-parameter figure.

    One entry per spec with a ``|``: ``spec`` (as written), ``name``, ``parameter`` (the first
    swept key, canonical), ``values`` (its value per member), ``members`` (canonical specs, in
    sweep order), and ``others`` (per member, the other swept keys' values, or {}).
    """
    sweeps = []
    for spec in specs:
        if "|" not in spec:
            continue
        head, axes = _sweep_axes(spec)
        swept = [i for i, axis in enumerate(axes) if len(axis) > 1]
        members = [parse_encoding_spec(":".join((head, *combo))) for combo in itertools.product(*axes)]
        if not swept:
            continue
        first = members[0]
        keys = []
        for i in swept:  # which canonical parameter each swept token sets
            key, sep, _ = axes[i][0].partition("=")
            keys.append(_KEY_ALIASES.get(first.name, {}).get(key.strip(), key.strip()) if sep else _CATALOG[first.name][0].name)
        sweeps.append(
            {
                "spec": spec,
                "name": first.name,
                "parameter": keys[0],
                "values": [_json_value(m.params[keys[0]]) for m in members],
                "members": [m.canonical for m in members],
                "others": [{k: _json_value(m.params[k]) for k in keys[1:]} for m in members],
            }
        )
    return sweeps


def _json_value(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True)
class Encoding:
    """An encoding matrix and the canonical spec that built it.

    Attributes:
        name: canonical spec string (see :func:`parse_encoding_spec`).
        matrix: float64 (len(positions) x dim).
        details: how it was fitted, JSON-ready (``mds-smacof``: classical and refined
            stress, iterations, convergence, seconds); empty for closed-form encodings.
    """

    name: str
    matrix: np.ndarray
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Name and shape only (the matrix itself goes to safetensors, not JSON)."""
        return {"name": self.name, "shape": [int(s) for s in self.matrix.shape]}


def make_encoding(
    spec: str | EncodingSpec,
    positions: Any,
    /,
    dim: int,
    *,
    mds: Any = None,
    distances: Any = None,
    occupancy: Any = None,
    context: int | None = None,
) -> Encoding:
    """Build the encoding named by ``spec`` at ``positions`` with ``dim`` columns.

    Args:
        spec: a spec string (see the module docstring) or a parsed :class:`EncodingSpec`.
        positions: 0-based sequence positions of the rows (the occupied ones), or an int n.
        dim: number of columns (the model width).
        mds: an MDS result (``.encoding``, one row per position) for ``mds`` /
            ``mds-lowrank`` / ``mds-smacof``.
        distances: (n, n) Hellinger distances d_H between the positions (``mds-smacof``).
        occupancy: (n,) tokens counted per position (``mds-smacof:weights=occupancy``).
        context: the sequence length the positions come from (the counts' n); RoPE variants
            whose frequencies depend on it (dynamic NTK, LongRoPE) are built for a sequence
            of this length unless the spec gives ``seq_len``. Default: ``max(positions) + 1``.

    Raises:
        PosstatsError: unknown name, bad parameter values (odd dim for sinusoidal/rope,
            dim < 1, rank outside 1..dim, heads > dim, sigma <= 0), a missing MDS result,
            unreadable files.
    """
    parsed = spec if isinstance(spec, EncodingSpec) else parse_encoding_spec(spec)
    p = dict(parsed.params)
    name = parsed.name
    dim = _dim(dim, name)
    pos = _positions(positions)
    details: dict[str, Any] = {}
    if name in ("mds", "mds-lowrank", "mds-smacof"):
        rank = p.get("rank", 1)
        rank = dim if rank is None else rank  # mds-smacof: full width unless a rank is given
        if not 1 <= rank <= dim:
            msg = f"mds-lowrank: rank must be an integer in 1..{dim} (the dimension), got {rank}"
            raise InputError(msg)
        if mds is None:
            msg = f"encoding {parsed.canonical!r} needs an MDS result (pass mds=...)"
            raise PosstatsError(msg)
        rows = np.shape(getattr(mds, "encoding", None))
        if len(rows) != 2 or rows[0] != pos.shape[0]:
            msg = f"encoding {parsed.canonical!r}: the MDS result has shape {rows}, but there are {pos.shape[0]} positions"
            raise PosstatsError(msg)
        if name == "mds":
            matrix = mds_encoding(mds, dim)
        elif name == "mds-lowrank":
            matrix = mds_lowrank(mds, dim, p["rank"])
        else:
            if distances is None:
                msg = f"encoding {parsed.canonical!r} needs the Hellinger distances (pass distances=...)"
                raise PosstatsError(msg)
            matrix, details = mds_smacof(
                mds, distances, dim, rank=p["rank"], weights=p["weights"], scale=p["scale"],
                max_iter=p["max_iter"], tol=p["tol"], positions=pos, occupancy=occupancy,
            )
    elif name == "sinusoidal":
        matrix = sinusoidal(pos, dim, base=p["base"])
    elif name == "rope":
        matrix, details = _rope_variant(parsed, pos, dim, context)
    elif name == "hf":
        matrix, details = _hf_rope_encoding(parsed, pos, dim, context)
    elif name == "alibi":
        matrix = alibi(pos, dim, heads=p["heads"])
    elif name == "random":
        matrix = random_encoding(pos, dim, sigma=p["sigma"], seed=p["seed"])
    elif name == "learned":
        matrix = learned(pos, dim, path=p["path"], key=p["key"])
    elif name == "matrix-power":
        matrix = _matrix_power_from_file(pos, dim, p["path"])
    else:  # unreachable while _CATALOG and this dispatch are kept in step
        msg = f"encoding {name!r} has no constructor"
        raise AssertionError(msg)
    return Encoding(parsed.canonical, matrix, details)
