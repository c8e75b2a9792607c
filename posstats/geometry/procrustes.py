"""How far each position moved between two MDS encodings, after the best rigid alignment.

Two classical-MDS encodings of the same positions (say, of a corpus before and after a
refresh) are each defined only up to an orthogonal transformation (eigenvector signs, and
rotations within repeated eigenvalues). Orthogonal Procrustes finds the rotation/reflection
``R`` (k x k) minimising ``||Y R - X||_F``: with ``Y^T X = U S W^T`` (SVD), ``R = U W^T``.
The drift of position i is ``|y_i R - x_i|``, in the encodings' own units (d_H: both are MDS
of Hellinger distances, so no scaling is fitted). Both encodings are centred first (MDS
coordinates are centred over their own positions, which may differ).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Alignment", "procrustes_drift"]


@dataclass(frozen=True)
class Alignment:
    """Result of :func:`procrustes_drift`.

    Attributes:
        rotation: (k, k) orthogonal R applied to the second encoding.
        drift: (m,) ``|y_i R - x_i|`` per position.
        residual: ``||Y R - X||_F / ||X||_F`` (0: identical up to rotation).
    """

    rotation: np.ndarray
    drift: np.ndarray
    residual: float


def procrustes_drift(x: Any, y: Any, /) -> Alignment:
    """Align ``y`` (m, k) to ``x`` (m, k) by an orthogonal map and return per-row drift.

    >>> x = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    >>> r = np.array([[0.0, -1.0], [1.0, 0.0]])  # a quarter turn
    >>> bool(np.allclose(procrustes_drift(x, x @ r).drift, 0))
    True
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 2:
        msg = f"procrustes: both encodings must have one shape (m, k); got {x.shape} and {y.shape}"
        raise ValueError(msg)
    x = x - x.mean(axis=0)
    y = y - y.mean(axis=0)
    u, _, wt = np.linalg.svd(y.T @ x)
    rotation = u @ wt
    diff = y @ rotation - x
    drift = np.sqrt(np.einsum("ij,ij->i", diff, diff))
    norm = float(np.linalg.norm(x))
    return Alignment(rotation, drift, float(np.linalg.norm(diff)) / norm if norm > 0 else 0.0)
