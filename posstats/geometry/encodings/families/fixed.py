"""Closed-form encodings that do not look at the corpus: sinusoidal (Vaswani et al.), ALiBi
as positions (a linear ramp per head), random Gaussian tables and powers of a matrix."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from posstats.errors import InputError
from posstats.geometry.encodings.catalog import (
    REQUIRED,
    Family,
    Param,
    as_positions,
    check_dim,
    check_positive,
    float_param,
    frequencies,
    int_param,
    pad_columns,
    register,
    seed_param,
    str_param,
)
from posstats.storage.tensors import SafetensorsFile

__all__ = ["alibi", "alibi_slopes", "matrix_power", "random_encoding", "sinusoidal"]

# Rows of the random stream generated at a time; bounds memory for far positions.
_RANDOM_CHUNK_ROWS = 4096


def sinusoidal(positions: Any, /, dim: int, *, base: float = 10000.0) -> np.ndarray:
    """Vaswani et al.'s sinusoidal encoding, float64 (len(positions) x dim), dim even.

    ``P[i, 2k] = sin(i w_k)``, ``P[i, 2k + 1] = cos(i w_k)``, ``w_k = base^(-2k/dim)``.
    Every row has norm ``sqrt(dim / 2)``.

    >>> sinusoidal(2, 2).tolist()
    [[0.0, 1.0], [0.8414709848078965, 0.5403023058681398]]
    """
    dim = check_dim(dim, "sinusoidal", even=True)
    base = check_positive(base, "sinusoidal base")
    pos = as_positions(positions)
    angles = np.multiply.outer(pos.astype(np.float64), frequencies(dim, base))
    out = np.empty((pos.shape[0], dim), dtype=np.float64)
    out[:, 0::2] = np.sin(angles)
    out[:, 1::2] = np.cos(angles)
    return out


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
    pos = as_positions(positions)
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
    dim = check_dim(dim, "alibi")
    heads = min(dim, 8) if heads is None else heads
    slopes = alibi_slopes(heads)
    if slopes.shape[0] > dim:
        msg = f"alibi: {slopes.shape[0]} heads do not fit in dimension {dim}"
        raise InputError(msg)
    pos = as_positions(positions)
    return pad_columns(np.multiply.outer(pos.astype(np.float64), slopes), dim)


def random_encoding(positions: Any, /, dim: int, *, sigma: float = 1.0, seed: int = 0) -> np.ndarray:
    """i.i.d. ``N(0, sigma^2)`` entries, seeded, float64 (len(positions) x dim).

    Row i is row i of the (max(positions) + 1) x dim matrix drawn from
    ``numpy.random.default_rng(seed).standard_normal``, so a position's row depends only on
    (seed, dim, position), not on which other positions are occupied. The stream is drawn a
    chunk of rows at a time (memory O(len(positions) x dim), time O(max(positions) x dim)).
    """
    dim = check_dim(dim, "random")
    sigma = check_positive(sigma, "random: sigma")
    pos = as_positions(positions)
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
    return pad_columns(matrix_power(positions, m, x), dim)


register(Family("sinusoidal", (Param("base", float_param, 10000.0),), order=40,
                build=lambda s, pos, dim, _: sinusoidal(pos, dim, base=s.params["base"])))
register(Family("alibi", (Param("heads", int_param, None),), order=70,
                build=lambda s, pos, dim, _: alibi(pos, dim, heads=s.params["heads"])))
register(Family("random", (Param("sigma", float_param, 1.0), Param("seed", seed_param, 0)), order=80,
                build=lambda s, pos, dim, _: random_encoding(pos, dim, sigma=s.params["sigma"], seed=s.params["seed"])))
register(Family("matrix-power", (Param("path", str_param, REQUIRED),), order=100,
                build=lambda s, pos, dim, _: _matrix_power_from_file(pos, dim, s.params["path"])))
