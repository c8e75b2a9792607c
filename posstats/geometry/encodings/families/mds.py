"""Encodings fitted to the corpus: the classical-MDS coordinates ``P_MDS`` (THEORY section
4), their first R columns, and the stress-optimal SMACOF refinement. Fitted: the analysis
grades them on held-out halves of the corpus."""

from __future__ import annotations

from typing import Any

import numpy as np

from posstats.errors import InputError, PosstatsError
from posstats.geometry.encodings.catalog import (
    REQUIRED,
    EncodingSpec,
    Family,
    Inputs,
    Param,
    as_positions,
    check_dim,
    choice,
    float_param,
    int_param,
    pad_columns,
    register,
)
from posstats.geometry.smacof import ACCELERATIONS, pair_weights, smacof

__all__ = ["mds_encoding", "mds_lowrank", "mds_smacof"]

def mds_encoding(mds_result: Any, /, dim: int) -> np.ndarray:
    """``P_MDS(dim)``: the first ``dim`` classical-MDS coordinates, float64 (n x dim).

    ``mds_result.encoding`` is the (n x k) coordinate matrix of the occupied rows (as in
    ``posstats.geometry.mds.MDSResult``); columns beyond k are zero (distances do not change).
    """
    dim = check_dim(dim, "mds")
    coords = _mds_coordinates(mds_result)
    return pad_columns(coords, dim)


def mds_lowrank(mds_result: Any, /, dim: int, rank: int) -> np.ndarray:
    """``P_MDS(rank)`` zero-padded to ``dim`` columns, float64 (n x dim), 1 <= rank <= dim.

    If the MDS result holds fewer than ``rank`` coordinates, the missing ones are zero (as
    they are when the MDS spectrum has fewer positive eigenvalues than ``rank``).
    """
    dim = check_dim(dim, "mds-lowrank")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 1 <= rank <= dim:
        msg = f"mds-lowrank: rank must be an integer in 1..{dim} (the dimension), got {rank!r}"
        raise InputError(msg)
    coords = _mds_coordinates(mds_result)
    return pad_columns(coords[:, : int(rank)], dim)


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
    acceleration: str = "squarem",
    positions: Any = None,
    occupancy: Any = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Stress-optimal encoding: SMACOF refinement of classical MDS (issue: MDS minimises strain).

    Starts from the first ``r = rank or dim`` classical-MDS coordinates, minimises the
    (weighted) stress ``sum w (e - h)^2 / sum w h^2`` by majorisation
    (:func:`posstats.geometry.smacof.smacof`, its transforms extrapolated by SQUAREM unless
    ``acceleration="none"``; stops when the relative decrease is below ``tol`` or after
    ``max_iter`` transforms), and embeds the rank-r result in width ``dim`` by zero
    padding (distances unchanged). ``weights``: see :func:`posstats.geometry.smacof.pair_weights`
    (``occupancy`` down-weights noisy rare positions, ``local`` favours nearby pairs).

    Returns:
        (matrix (n x dim) float64, details: classical_stress, stress, iterations (Guttman
        transforms), converged, acceleration, seconds, rank, weights).
    """

    dim = check_dim(dim, "mds-smacof")
    r = dim if rank is None else int(rank)
    if not 1 <= r <= dim:
        msg = f"mds-smacof: rank must be an integer in 1..{dim} (the dimension), got {r}"
        raise InputError(msg)
    init = mds_lowrank(mds_result, r, r)
    w = None
    if weights != "uniform":
        pos = as_positions(positions if positions is not None else init.shape[0])
        if "occupancy" in weights and occupancy is None:
            raise PosstatsError("mds-smacof:weights=occupancy needs the occupancy per position")
        w = pair_weights(pos, occupancy=occupancy, kind=weights, scale=scale)
    result = smacof(np.asarray(distances, dtype=np.float64), init, weights=w, max_iter=max_iter, tol=tol,
                    acceleration=acceleration)
    details = {
        "method": "smacof",
        "classical_stress": float(result.initial_stress),
        "stress": float(result.stress),
        "iterations": int(result.iterations),
        "converged": bool(result.converged),
        "acceleration": acceleration,
        "seconds": float(result.seconds),
        "rank": r,
        "weights": weights,
    }
    return pad_columns(np.asarray(result.encoding), dim), details


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


def _check_rank(spec: EncodingSpec, dim: int) -> None:
    """``rank`` in 1..dim (mds-smacof: the full width unless a rank is given)."""
    rank = spec.params.get("rank")
    rank = dim if rank is None else rank
    if not 1 <= rank <= dim:
        msg = f"{spec.name}: rank must be an integer in 1..{dim} (the dimension), got {rank}"
        raise InputError(msg)


def _smacof(s: EncodingSpec, pos: np.ndarray, dim: int, inputs: Inputs) -> tuple[np.ndarray, dict[str, Any]]:
    p = s.params
    return mds_smacof(inputs.mds, inputs.distances, dim, rank=p["rank"], weights=p["weights"], scale=p["scale"],
                      max_iter=p["max_iter"], tol=p["tol"], acceleration=p["acceleration"], positions=pos,
                      occupancy=inputs.occupancy)


_NEEDS_MDS = frozenset({"mds"})
register(Family("mds", (), order=10, fitted=True, needs=_NEEDS_MDS,
                build=lambda s, pos, dim, inputs: mds_encoding(inputs.mds, dim)))
register(Family("mds-lowrank", (Param("rank", int_param, REQUIRED),), order=20, fitted=True, needs=_NEEDS_MDS,
                check=_check_rank, build=lambda s, pos, dim, inputs: mds_lowrank(inputs.mds, dim, s.params["rank"])))
register(Family(
    "mds-smacof",
    (Param("rank", int_param, None),
     Param("weights", choice("uniform", "occupancy", "local", "occupancy-local"), "uniform"),
     Param("scale", float_param, 1.0), Param("max_iter", int_param, 300), Param("tol", float_param, 1e-6),
     Param("acceleration", choice(*ACCELERATIONS), "squarem")),
    order=30, fitted=True, needs=frozenset({"mds", "distances"}), quadratic=True, check=_check_rank, build=_smacof,
))
