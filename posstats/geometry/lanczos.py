"""Block Lanczos for the top eigenpairs of a symmetric operator (full reorthogonalisation, no
restart), converged when every wanted Ritz pair's residual is below ``tol * theta_1`` (inside
the noise bulk, below the noise residual asked for: :func:`wanted_residuals`).
"""

from __future__ import annotations

import math
import types
from typing import Any

import numpy as np
import scipy.linalg

from posstats.geometry.backend import to_numpy

__all__ = ["block_lanczos", "wanted_residuals"]


def _block_tridiagonal(a_blocks: list[np.ndarray], b_blocks: list[np.ndarray], block: int) -> np.ndarray:
    """The dense (m, m) block tridiagonal ``T = Q^T A Q`` of the Lanczos basis, ``m =
    len(a_blocks) * block``: diagonal blocks ``a_blocks``, below them ``b_blocks`` (extra
    ones ignored), symmetric."""
    m = len(a_blocks) * block
    t = np.zeros((m, m))
    for s, a in enumerate(a_blocks):
        t[s * block : (s + 1) * block, s * block : (s + 1) * block] = a
        if s + 1 < len(a_blocks):
            t[(s + 1) * block : (s + 2) * block, s * block : (s + 1) * block] = b_blocks[s]
            t[s * block : (s + 1) * block, (s + 1) * block : (s + 2) * block] = b_blocks[s].T
    return t


def _band_of(a_blocks: list[np.ndarray], b_blocks: list[np.ndarray], block: int) -> np.ndarray:
    """Lower band storage (``block + 1`` rows) of the block tridiagonal ``T``."""
    t = _block_tridiagonal(a_blocks, b_blocks, block)
    m = t.shape[0]
    band = np.zeros((block + 1, m))
    for i in range(block + 1):
        band[i, : m - i] = np.diagonal(t, -i)
    return band


def _whole_space_pairs(matmat: Any, basis: Any, t: np.ndarray, q_next: Any, k: int, xp: types.ModuleType,
                       ) -> tuple[np.ndarray, Any, int]:
    """``(eigenvalues (k,) descending, eigenvectors (dim, k), applications)``: the exact top-k
    eigenpairs of the (dim, dim) operator once the Lanczos basis ``basis`` (dim, m) with
    ``T = basis^T A basis`` (``t``) is one block short of the whole space: the basis is
    completed by ``dim - m`` orthonormal columns (the next block's, orthogonalised once more)
    and the Rayleigh-Ritz of the whole space, ``[basis, c]^T A [basis, c]``, solved densely.

    Why: block Lanczos extends the basis ``block`` columns at a time, so where ``dim`` is not
    a multiple of the block its last full block does not fit, and the Ritz pairs of the
    incomplete basis are not the eigenpairs (n = 30, block 8: 24 columns of 30)."""
    dim, m = int(basis.shape[0]), int(basis.shape[1])
    c = q_next[:, : dim - m]
    c = c - basis @ (basis.T @ c)
    c, _ = xp.linalg.qr(c)
    ac = matmat(c)
    full = np.zeros((dim, dim))
    full[:m, :m] = t
    cross = to_numpy(basis.T @ ac)
    full[:m, m:] = cross
    full[m:, :m] = cross.T
    corner = to_numpy(c.T @ ac)
    full[m:, m:] = 0.5 * (corner + corner.T)
    theta, y = scipy.linalg.eigh(full, subset_by_index=[dim - k, dim - 1], check_finite=False)
    theta, y = theta[::-1], y[:, ::-1]
    x = basis @ xp.asarray(y[:m]) + c @ xp.asarray(y[m:])
    return theta, x, dim - m


def wanted_residuals(theta: np.ndarray, top: float, tol: float, noise_level: float | None,
                     noise_residual: float | None) -> np.ndarray:
    """(k,) residual targets relative to ``top``: ``tol``, or, for Ritz values inside the
    noise bulk (at or below ``noise_level - noise_residual``), ``noise_residual / top``."""
    need = np.full(theta.shape, float(tol))
    if noise_level is not None and noise_residual is not None:
        bulk = theta <= noise_level - noise_residual
        need[bulk] = max(float(tol), noise_residual / top)
    return need


_DGKS = 1 / math.sqrt(2.0)  # a column that keeps this share of its norm is orthogonal after one pass


def block_lanczos(
    matmat: Any, dim: int, k: int, *, block: int, tol: float, seed: int, xp: types.ModuleType, max_dim: int,
    progress: Any = None, noise_level: float | None = None, noise_residual: float | None = None,
) -> tuple[np.ndarray, Any, np.ndarray, int, bool]:

    """Top-k eigenpairs of a symmetric operator by block Lanczos with full reorthogonalisation.

    Returns (eigenvalues (k,) host, eigenvectors (dim, k) on xp, residual estimates (k,)
    relative to the largest eigenvalue, operator applications, converged). Each pair
    converges at ``tol``, or, inside the noise bulk, at ``noise_residual``
    (:func:`wanted_residuals`).
    """
    rng = np.random.default_rng(seed)
    b = max(1, min(int(block), dim))
    q, _ = xp.linalg.qr(xp.asarray(rng.standard_normal((dim, b))))
    cap = min(dim, max_dim)
    basis = xp.empty((dim, cap + b), dtype=xp.float64)
    a_blocks: list[np.ndarray] = []
    b_blocks: list[np.ndarray] = []
    prev, b_prev = None, None
    m = 0
    applied = 0
    while True:
        width = int(q.shape[1])
        basis[:, m : m + width] = q
        m += width
        w = matmat(q)
        applied += width
        if prev is not None:
            w -= prev @ xp.asarray(b_prev).T
        a = q.T @ w
        a = 0.5 * (a + a.T)
        w -= q @ a
        # classical Gram-Schmidt against the whole basis, once more only where a column lost
        # more than 1 - 1/sqrt(2) of its norm (the DGKS criterion, as ARPACK): orthogonal to eps
        before = xp.sqrt(xp.sum(w * w, axis=0))
        for _ in range(2):
            w -= basis[:, :m] @ (basis[:, :m].T @ w)
            after = xp.sqrt(xp.sum(w * w, axis=0))
            if bool(xp.all(after >= _DGKS * before)):
                break
            before = after
        q_next, r = xp.linalg.qr(w)
        a_blocks.append(to_numpy(a))
        r_host = to_numpy(r)
        exhausted = m + b > cap
        breakdown = float(np.abs(r_host).max()) <= 1e-13 * max(1.0, float(np.abs(a_blocks[0]).max()))
        if m >= k + b or exhausted or breakdown:
            kk = min(k, m)
            band = _band_of(a_blocks, b_blocks + [r_host], width)
            theta, y = scipy.linalg.eig_banded(band, lower=True, select="i", select_range=(m - kk, m - 1), check_finite=False)
            theta, y = theta[::-1], y[:, ::-1]
            top = abs(float(theta[0])) or 1.0
            est = np.linalg.norm(r_host @ y[-width:, :], axis=0) / top
            if breakdown:
                est[:] = 0.0
            need = wanted_residuals(theta, top, tol, noise_level, noise_residual)
            if progress is not None:
                progress(applied, float((est / need).max() * tol))
            converged = bool(np.all(est <= need)) and kk == min(k, dim)
            if exhausted and not converged and not breakdown and m < dim == cap:  # one partial block short
                theta, x, more = _whole_space_pairs(matmat, basis[:, :m], _block_tridiagonal(a_blocks, b_blocks, width),
                                                    q_next, min(k, dim), xp)
                if progress is not None:
                    progress(applied + more, 0.0)
                return theta, x, np.zeros(theta.shape), applied + more, True
            if converged or exhausted or breakdown:
                x = basis[:, :m] @ xp.asarray(y)
                return theta, x, est, applied, bool(np.all(est <= need))
        b_blocks.append(r_host)
        prev, b_prev, q = q, r_host, q_next
