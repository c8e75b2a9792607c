"""Classical MDS of the Hellinger geometry, and spectrum summaries (THEORY.md section 3).

With ``D`` the squared Hellinger distances of the occupied positions, ``H = I - 11^T/n``:

    B = -1/2 H D H = S_c S_c^T,      S_c = S - 1 mean(S)^T,   S = sqrt(C / occ)

so classical MDS is PCA of the square-root distributions: the eigenvalues of ``B`` are the
squared singular values of ``S_c`` and the encoding is

    P = U_k diag(sqrt(max(lambda, 0))) = S_c V_k            (n x k)

Two methods compute it:

- ``dense``: ``D`` by :func:`posstats.hellinger.hellinger_sq`, ``B`` by double centring,
  then a symmetric eigensolver (``scipy.linalg.eigh``; ``cupy.linalg.eigh`` on the GPU).
  O(n^2) memory, O(n^3) time; gives the whole spectrum.
- ``iterative``: ARPACK Lanczos (``scipy.sparse.linalg.eigsh``) for the top-k eigenpairs
  of the implicit operator ``S_c S_c^T`` (n x n) or ``S_c^T S_c`` (V x V, whichever is
  smaller), applied through products with ``S`` and a rank-one centring correction. It
  never forms an n x n matrix, and never densifies ``S`` or ``S_c`` when the counts are
  sparse. For a cupy input the products run on the GPU and only the Lanczos vectors
  (length n or V) cross to the host.

Cost. Lanczos needs ~6k products for the top k here (ARPACK with ncv = 2k + 1; about
the same unrestarted, because the top-64 of a corpus spectrum sit in its sampling-noise
bulk with relative gaps ~1e-3), each costing two passes over the nnz of ``S``; the dense
method costs the Gram product plus an O(n^3) eigensolver and n^2 memory. On a 2-core
machine, n = 4096, V = 50257, k = 64 (benchmarks/bench_mds.py): 3-4x faster than dense
at 4.7M nnz, 10x at 1.5M nnz; below ~2x without threadpoolctl on a busy machine (see
:func:`_single_blas_thread`). The gap widens with n (n^3 against ~n * nnz per row).

Eigenvector signs are fixed: the largest-magnitude entry of every column of ``U`` (and so
of ``P``) is positive (the first such entry on exact ties). Within a repeated eigenvalue
the basis is whatever the solver returns (deterministic for a given input and method).
"""

from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import scipy.linalg
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from posstats.backend import array_namespace, to_numpy
from posstats.hellinger import hellinger_sq, sqrt_distributions

__all__ = ["MDSResult", "Spectrum", "classical_mds", "spectrum_summary"]

_COVERAGE_LEVELS = (0.9, 0.95, 0.99, 0.999)


@dataclass(frozen=True)
class Spectrum:
    """Summary of an MDS spectrum (see :func:`spectrum_summary`).

    Attributes:
        eigenvalues: (k,) float64, descending.
        rank: number of eigenvalues ``> rank_rtol * eigenvalues[0]`` (among those given;
            a lower bound when the spectrum is truncated and every given one counts).
        rank_rtol: the relative tolerance used for ``rank``.
        explained_variance: (k,) cumulative ``sum_{j<=r} lambda_j / total_variance``.
        components_for: smallest ``r`` whose cumulative explained variance reaches each
            level ``"0.9", "0.95", "0.99", "0.999"``, or None if none of the given
            eigenvalues reaches it.
        negative_mass: ``sum |lambda < 0| / sum |lambda|`` over the given eigenvalues.
        total_variance: the denominator of ``explained_variance``.
        denominator: ``"positive_eigenvalues"`` (the sum of the positive given
            eigenvalues: the spectrum was taken as complete) or ``"total_variance"``
            (``trace(B)`` supplied by the caller, as needed when only the top-k are known).
    """

    eigenvalues: np.ndarray
    rank: int
    rank_rtol: float
    explained_variance: np.ndarray
    components_for: dict[str, int | None]
    negative_mass: float
    total_variance: float
    denominator: Literal["positive_eigenvalues", "total_variance"]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plain Python values."""
        return {
            "eigenvalues": [float(x) for x in self.eigenvalues],
            "rank": int(self.rank),
            "rank_rtol": float(self.rank_rtol),
            "explained_variance": [float(x) for x in self.explained_variance],
            "components_for": {key: (None if r is None else int(r)) for key, r in self.components_for.items()},
            "negative_mass": float(self.negative_mass),
            "total_variance": float(self.total_variance),
            "denominator": self.denominator,
        }


def _negative_mass(eigenvalues: np.ndarray) -> float:
    absolute = float(np.sum(np.abs(eigenvalues)))
    if absolute == 0.0:
        return 0.0
    return float(np.sum(np.abs(eigenvalues[eigenvalues < 0]))) / absolute


def spectrum_summary(eigenvalues: Any, /, *, total_variance: float | None = None, rtol: float = 1e-10) -> Spectrum:
    """Rank, cumulative explained variance and negative mass of MDS eigenvalues.

    Args:
        eigenvalues: (k,) eigenvalues of ``B`` (any order; sorted descending here), numpy
            or cupy.
        total_variance: ``trace(B) = ||S_c||_F^2``. Pass it when ``eigenvalues`` holds only
            the top-k: it is then the denominator of the explained variance. When None the
            eigenvalues are taken as the whole spectrum and the denominator is the sum of
            the positive ones (THEORY.md section 3).
        rtol: relative tolerance of the numerical rank.

    Returns:
        :class:`Spectrum`.

    >>> spectrum_summary(np.array([3.0, 1.0, 0.0])).components_for["0.9"]
    2
    """
    lam = np.sort(np.asarray(to_numpy(eigenvalues), dtype=np.float64).reshape(-1))[::-1].copy()
    if not rtol >= 0:
        msg = f"rtol must be >= 0; got {rtol}"
        raise ValueError(msg)
    top = float(lam[0]) if lam.size else 0.0
    rank = int(np.count_nonzero(lam > rtol * top)) if top > 0 else 0
    if total_variance is None:
        denominator: Literal["positive_eigenvalues", "total_variance"] = "positive_eigenvalues"
        total = float(np.sum(lam[lam > 0]))
    else:
        denominator = "total_variance"
        total = float(total_variance)
    cumulative = np.cumsum(lam) / total if total > 0 else np.zeros_like(lam)
    components_for: dict[str, int | None] = {}
    for level in _COVERAGE_LEVELS:
        reached = np.nonzero(cumulative >= level)[0]
        components_for[str(level)] = int(reached[0]) + 1 if reached.size else None
    return Spectrum(
        eigenvalues=lam,
        rank=rank,
        rank_rtol=float(rtol),
        explained_variance=cumulative,
        components_for=components_for,
        negative_mass=_negative_mass(lam),
        total_variance=total,
        denominator=denominator,
    )


@dataclass(frozen=True)
class MDSResult:
    """Classical MDS of the squared Hellinger distances of the occupied positions.

    All arrays are host numpy arrays (small: k and n x k), whatever the input's device.

    Attributes:
        eigenvalues: (k,) float64, the computed top-k eigenvalues of ``B``, descending.
        encoding: (n, k) float64 ``P = U_k diag(sqrt(max(lambda, 0))) = S_c V_k``; the
            largest-magnitude entry of each column is positive.
        total_variance: ``trace(B) = ||S_c||_F^2``, the sum of *all* eigenvalues (dense:
            the trace of the ``B`` that was decomposed; iterative: a two-pass column
            variance of ``S``, O(nnz) and without an n x n matrix).
        negative_mass: ``sum |lambda < 0| / sum |lambda|`` over the eigenvalues the solver
            computed (dense with k = n: the whole spectrum; otherwise the top-k).
        method: ``"dense"`` or ``"iterative"``.
        tol: the solver's tolerance (ARPACK's relative tolerance on the Ritz values for
            ``iterative``; recorded but unused by the direct dense solver).
        residuals: (k,) ``||A x - lambda x|| / lambda_max`` for each returned unit
            eigenvector ``x`` of the operator ``A`` the solver worked with: ``B`` itself
            (dense, or iterative with n <= V) or ``S_c^T S_c`` (iterative with n > V, same
            nonzero eigenvalues); ``lambda_max`` is the largest eigenvalue (1 if it is 0).
    """

    eigenvalues: np.ndarray
    encoding: np.ndarray
    total_variance: float
    negative_mass: float
    method: Literal["dense", "iterative"]
    tol: float
    residuals: np.ndarray

    def spectrum(self, *, rtol: float = 1e-10) -> Spectrum:
        """:func:`spectrum_summary` of the eigenvalues; ``total_variance`` is the
        denominator unless the whole spectrum was computed (dense with k = n)."""
        complete = self.method == "dense" and self.eigenvalues.shape[0] == self.encoding.shape[0]
        return spectrum_summary(self.eigenvalues, total_variance=None if complete else self.total_variance, rtol=rtol)

    def to_dict(self, *, include_encoding: bool = False) -> dict[str, Any]:
        """JSON-ready plain Python values; the (n, k) encoding only on request (its shape
        is always given), since it belongs in a safetensors file rather than a report."""
        out: dict[str, Any] = {
            "eigenvalues": [float(x) for x in self.eigenvalues],
            "encoding_shape": [int(x) for x in self.encoding.shape],
            "total_variance": float(self.total_variance),
            "negative_mass": float(self.negative_mass),
            "method": self.method,
            "tol": float(self.tol),
            "residuals": [float(x) for x in self.residuals],
        }
        if include_encoding:
            out["encoding"] = self.encoding.tolist()
        return out


def classical_mds(
    counts: Any,
    /,
    *,
    k: int | None = None,
    method: Literal["auto", "dense", "iterative"] = "auto",
    tol: float = 1e-10,
    seed: int = 0,
    dense_limit: int = 2048,
) -> MDSResult:
    """Classical MDS of the squared Hellinger distances between the rows of ``counts``.

    Args:
        counts: (n, V) counts of the *occupied* positions (every row sum > 0): numpy or
            cupy array, or scipy sparse (kept sparse throughout the iterative method).
        k: number of leading eigenpairs. None means all n (dense method only). ``dense``
            clamps k to n. ``iterative`` clamps k to ``min(n, V) - 2`` (ARPACK needs
            k < dim - 1 for a reliable restart); since ``rank(B) <= min(n - 1, V)`` at most
            the one or two smallest nonzero pairs are lost, which need ``dense``.
        method: ``"dense"``, ``"iterative"``, or ``"auto"`` (dense when n <= dense_limit).
        tol: ARPACK's relative tolerance: each returned Ritz pair has
            ``||A x - theta x|| <= tol * theta``, which bounds the eigenvalue error by
            ``tol * theta`` (and by ~``(tol * theta)^2 / gap`` for separated eigenvalues).
        seed: seeds the Lanczos start vector (results are deterministic for a seed).
        dense_limit: the largest n ``auto`` solves densely.

    Returns:
        :class:`MDSResult` (host numpy arrays).

    >>> r = classical_mds(np.array([[4, 0, 0], [0, 4, 0], [2, 2, 0]]))
    >>> r.eigenvalues.round(6)
    array([1.      , 0.057191, 0.      ])
    """
    n = int(counts.shape[0])
    if method not in ("auto", "dense", "iterative"):
        msg = f"method must be 'auto', 'dense' or 'iterative'; got {method!r}"
        raise ValueError(msg)
    if k is not None and (int(k) != k or k < 1):
        msg = f"k must be a positive integer or None; got {k!r}"
        raise ValueError(msg)
    if method == "auto":
        method = "dense" if n <= dense_limit else "iterative"
        if method == "iterative" and k is None:
            msg = (
                f"k=None asks for the whole spectrum, which needs the dense method, but n={n} > "
                f"dense_limit={dense_limit}; pass k (top-k by the iterative method) or method='dense'"
            )
            raise ValueError(msg)
    if method == "dense":
        return _dense_mds(counts, k=k, tol=tol)
    if k is None:
        msg = "the iterative method needs k (the number of leading eigenpairs)"
        raise ValueError(msg)
    return _iterative_mds(counts, k=int(k), tol=tol, seed=seed)


def _fix_signs(u: Any, xp: types.ModuleType) -> Any:
    """Multiply each column by the sign of its largest-magnitude entry (first on ties)."""
    if u.shape[0] == 0 or u.shape[1] == 0:
        return u
    idx = xp.argmax(xp.abs(u), axis=0)
    signs = xp.sign(u[idx, xp.arange(u.shape[1])])
    signs = xp.where(signs == 0, 1.0, signs)
    return u * signs[None, :]


def _dense_mds(counts: Any, *, k: int | None, tol: float) -> MDSResult:
    xp = np if sp.issparse(counts) else array_namespace(counts)
    b = hellinger_sq(counts, xp=None if sp.issparse(counts) else xp)
    n = int(b.shape[0])
    if n == 0:
        msg = "counts has no rows"
        raise ValueError(msg)
    # B = -1/2 H D H in place: D is symmetric, so row and column means coincide.
    means = b.mean(axis=1)
    grand = means.mean()
    b -= means[:, None]
    b -= means[None, :]
    b += grand
    b *= -0.5
    total_variance = float(xp.trace(b))
    kk = n if k is None else min(int(k), n)
    if xp is np:
        # Top-k by MRRR (evr) skips most of the back-transformation; the full spectrum by
        # divide and conquer (evd). Both read only the lower triangle.
        if kk < n:
            w, u = scipy.linalg.eigh(b, subset_by_index=[n - kk, n - 1], driver="evr", check_finite=False)
        else:
            w, u = scipy.linalg.eigh(b, driver="evd", check_finite=False)
    else:
        w, u = xp.linalg.eigh(b)
        w, u = w[n - kk :], u[:, n - kk :]
    w = w[::-1]
    u = _fix_signs(u[:, ::-1], xp)
    top = float(w[0])
    resid = xp.linalg.norm(b @ u - u * w[None, :], axis=0) / (top if top > 0 else 1.0)
    encoding = u * xp.sqrt(xp.maximum(w, 0.0))[None, :]
    w_host = to_numpy(w).astype(np.float64) + 0.0  # no -0.0 in reports
    return MDSResult(
        eigenvalues=w_host,
        encoding=np.ascontiguousarray(to_numpy(encoding), dtype=np.float64),
        total_variance=total_variance,
        negative_mass=_negative_mass(w_host),
        method="dense",
        tol=float(tol),
        residuals=to_numpy(resid).astype(np.float64),
    )


class _CentredSqrt:
    """The implicit ``S_c = S - 1 m^T`` (n x V) with products on S's device.

    Sparse ``S`` stays sparse (the centring is a rank-one correction); a dense ``S`` is
    centred explicitly, which avoids the cancellation of ``S x - 1 (m . x)`` when the rows
    are nearly identical.
    """

    def __init__(self, counts: Any) -> None:
        self.sparse = sp.issparse(counts)
        s = sqrt_distributions(counts)
        self.xp = np if self.sparse else array_namespace(s)
        xp = self.xp
        if self.sparse:
            self.s = s.tocsr()
            self.st = self.s.T.tocsr()  # row-major transpose: fast S^T y
            self.mean = np.asarray(s.mean(axis=0), dtype=np.float64).reshape(-1)
        else:
            self.mean = s.mean(axis=0)
            self.s = s - self.mean[None, :]
            self.st = self.s.T
        self.shape = tuple(int(x) for x in s.shape)

    def total_variance(self) -> float:
        """``||S_c||_F^2`` by a two-pass column variance (no cancellation against |S|^2)."""
        if not self.sparse:
            return float(self.xp.sum(self.s * self.s))
        n = self.shape[0]
        dev = self.s.data - self.mean[self.s.indices]
        stored = np.bincount(self.s.indices, minlength=self.shape[1])
        # Stored entries contribute (s - m)^2, each implicit zero of column v contributes m_v^2.
        return float(np.sum(dev * dev) + np.sum((n - stored) * self.mean**2))

    def apply(self, x: Any) -> Any:
        """``S_c x`` for x of shape (V,) or (V, b)."""
        if self.sparse:
            # An elementwise sum, not a BLAS dot: threaded BLAS on one length-V vector per
            # Lanczos step cost more in wake-ups than the arithmetic (see _single_blas_thread).
            shift = (self.mean * x).sum() if x.ndim == 1 else self.mean @ x
            return self.s @ x - shift
        return self.s @ x

    def apply_t(self, y: Any) -> Any:
        """``S_c^T y`` for y of shape (n,) or (n, b)."""
        if self.sparse:
            ysum = y.sum(axis=0)
            return self.st @ y - (self.mean[:, None] * ysum if y.ndim == 2 else self.mean * ysum)
        return self.st @ y


def _single_blas_thread() -> contextlib.AbstractContextManager[Any]:
    """One BLAS thread while ARPACK runs, when threadpoolctl is installed.

    ARPACK's own BLAS calls are small matrix-vector products (n x ncv); threading them
    costs more in synchronisation than it saves, badly so on a busy or many-core machine
    (measured on a busy 2-core machine: the n = 4096, k = 64 benchmark's Lanczos ran 2-4x
    faster with one thread). The
    sparse products are single-threaded in scipy anyway. Without threadpoolctl this is a
    no-op (set OPENBLAS_NUM_THREADS / OMP_NUM_THREADS instead).
    """
    try:
        from threadpoolctl import threadpool_limits  # noqa: PLC0415 - optional dependency
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def _iterative_mds(counts: Any, *, k: int, tol: float, seed: int) -> MDSResult:
    op = _CentredSqrt(counts)
    xp = op.xp
    n, v = op.shape
    dim = min(n, v)
    kmax = dim - 2
    if kmax < 1:
        msg = f"the iterative method needs min(n, V) >= 3; got n={n}, V={v}: use method='dense'"
        raise ValueError(msg)
    kk = min(k, kmax)
    small_side_n = n <= v

    def gram(x: Any) -> Any:
        # ARPACK hands over host vectors; the products run where S lives.
        xd = xp.asarray(x, dtype=xp.float64)
        if small_side_n:
            out = op.apply(op.apply_t(xd))
        else:
            out = op.apply_t(op.apply(xd))
        return to_numpy(out)

    a = spla.LinearOperator((dim, dim), matvec=gram, matmat=gram, dtype=np.float64)
    v0 = np.random.default_rng(seed).standard_normal(dim)
    ncv = min(dim, max(2 * kk + 1, 20))
    with _single_blas_thread():
        w, x = spla.eigsh(a, k=kk, which="LA", tol=tol, v0=v0, ncv=ncv)
    order = np.argsort(w)[::-1]
    w, x = w[order], np.ascontiguousarray(x[:, order])
    top = float(w[0])
    resid = np.linalg.norm(gram(x) - x * w[None, :], axis=0) / (top if top > 0 else 1.0)
    if small_side_n:
        u = _fix_signs(x, np)
        encoding = u * np.sqrt(np.maximum(w, 0.0))[None, :]
    else:
        encoding = _fix_signs(to_numpy(op.apply(xp.asarray(x))), np)
    return MDSResult(
        eigenvalues=w.astype(np.float64),
        encoding=np.ascontiguousarray(encoding, dtype=np.float64),
        total_variance=op.total_variance(),
        negative_mass=_negative_mass(w),
        method="iterative",
        tol=float(tol),
        residuals=resid.astype(np.float64),
    )
