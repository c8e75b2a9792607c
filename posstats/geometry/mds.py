"""Classical MDS of the Hellinger geometry, and spectrum summaries (THEORY.md section 3).

With ``D`` the squared Hellinger distances of the occupied positions, ``H = I - 11^T/n``:

    B = -1/2 H D H = S_c S_c^T,      S_c = S - 1 mean(S)^T,   S = sqrt(C / occ)

so classical MDS is PCA of the square-root distributions: the eigenvalues of ``B`` are the
squared singular values of ``S_c`` and the encoding is

    P = U_k diag(sqrt(max(lambda, 0))) = S_c V_k            (n x k)

Two methods compute it:

- ``dense``: ``D`` by :func:`posstats.geometry.hellinger.hellinger_sq` (or the caller's, passed as
  ``squared_distances`` so that it is computed once), ``B`` by double centring,
  then a symmetric eigensolver (``scipy.linalg.eigh``; ``cupy.linalg.eigh`` on the GPU).
  O(n^2) memory, O(n^3) time; gives the whole spectrum.
- ``iterative``: ARPACK Lanczos (``scipy.sparse.linalg.eigsh``) for the top-k eigenpairs
  of the implicit operator ``S_c S_c^T`` (n x n) or ``S_c^T S_c`` (V x V, whichever is
  smaller), applied through products with ``S`` and a rank-one centring correction. It
  never forms an n x n matrix, and never densifies ``S`` or ``S_c`` when the counts are
  sparse. For a cupy input the products run on the GPU and only the Lanczos vectors
  (length n or V) cross to the host.

- ``lanczos``: block Lanczos (blocks of ``block`` vectors, full reorthogonalisation, no
  restart) on the same implicit operator, for very long contexts. The sparse ``S`` is
  split by column: its densest columns (the Zipf head, present at most positions) go to
  a dense block multiplied by BLAS, the rest stays CSR; block products amortise the
  index traffic of the sparse part (about 3x cheaper per vector than one at a time).
  Converged when every wanted Ritz pair has ``||A x - theta x|| <= tol * theta_1``
  (the residual is read off the block tridiagonal matrix and checked with one more
  product at the end). It can also decompose the bias-corrected ``B - H diag(b) H``
  (``diagonal=b``, :mod:`posstats.estimates.noise`), and run its products on a GPU (``xp=cupy``:
  the dense block as a cupy array, the rest as a ``cupyx.scipy.sparse`` CSR matrix).

Cost. Lanczos needs ~7k products for the top k here (ARPACK with ncv = 2k + 1; about
the same unrestarted, because the top-64 of a corpus spectrum sit in its sampling-noise
bulk with relative gaps ~1e-3), each costing two passes over the nnz of ``S`` (run in row
blocks on ``product_threads()`` threads); the dense method costs the Gram product plus an
O(n^3) eigensolver and n^2 memory, nearly independent of nnz. On an idle 2-core machine,
n = 4096, V = 50257, k = 64 (benchmarks/bench_mds.py): 7.0x faster than dense at 0.9M
nnz, 4.5x at 1.5M, 2.7x at 2.8M, 1.9x at 4.7M. The gap widens with n (n^3 against
~n * nnz per row), and only the iterative methods fit n x n out of memory.

Eigenvector signs are fixed: the largest-magnitude entry of every column of ``U`` (and so
of ``P``) is positive (the first such entry on exact ties). Within a repeated eigenvalue
the basis is whatever the solver returns (deterministic for a given input and method).
"""

from __future__ import annotations

import contextlib
import math
import os
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import scipy.linalg
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from threadpoolctl import threadpool_limits

from posstats.geometry.backend import array_namespace, get_cupy_sparse, to_numpy
from posstats.geometry.hellinger import hellinger_sq, sqrt_distributions

__all__ = ["MDSResult", "ShiftedSqrt", "Spectrum", "classical_mds", "gram_in_place", "shifted_operator", "spectrum_summary",
           "wanted_residuals", "weighted_coordinates", "weighted_gram_eigenpairs"]

_COVERAGE_LEVELS = (0.9, 0.95, 0.99, 0.999)


@dataclass(frozen=True)
class Spectrum:
    """Summary of an MDS spectrum (see :func:`spectrum_summary`).

    Attributes:
        eigenvalues: (k,) float64, descending.
        rank: number of eigenvalues ``> rank_rtol * eigenvalues[0]`` (among those given;
            a lower bound when the spectrum is truncated and every given one counts).
        rank_rtol: the relative tolerance used for ``rank``.
        explained_variance: (k,) cumulative ``sum_{j<=r} max(lambda_j, 0) / total_variance``:
            the share of the positive variance, monotone and at most 1 (negative eigenvalues
            of a bias-corrected ``B`` explain nothing; their share is ``negative_mass``).
        components_for: smallest ``r`` whose cumulative explained variance reaches each
            level ``"0.9", "0.95", "0.99", "0.999"``, or None if none of the given
            eigenvalues reaches it.
        negative_mass: ``sum |lambda < 0| / sum |lambda|`` over the given eigenvalues.
        total_variance: the denominator of ``explained_variance``.
        denominator: ``"positive_eigenvalues"`` (the sum of the positive given
            eigenvalues: the spectrum was taken as complete), ``"total_variance"``
            (``trace(B)`` supplied by the caller, as needed when only the top-k are known)
            or ``"computed_positive_eigenvalues"`` (the supplied trace was below the sum of
            the positive top-k, as negative eigenvalues beyond them make it: the top-k's
            positive sum, so the shares are of the computed components only).
    """

    eigenvalues: np.ndarray
    rank: int
    rank_rtol: float
    explained_variance: np.ndarray
    components_for: dict[str, int | None]
    negative_mass: float
    total_variance: float
    denominator: Literal["positive_eigenvalues", "total_variance", "computed_positive_eigenvalues"]

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
            the top-k: it is then the denominator of the explained variance (or the sum of
            the positive top-k, when that is larger: see :class:`Spectrum`). When None the
            eigenvalues are taken as the whole spectrum and the denominator is the sum of
            the positive ones (THEORY.md section 3). Only positive eigenvalues count in the
            numerator, so the cumulative share is monotone and at most 1.
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
    positive = np.maximum(lam, 0.0)
    positive_sum = float(np.sum(positive))
    denominator: Literal["positive_eigenvalues", "total_variance", "computed_positive_eigenvalues"]
    if total_variance is None:
        denominator, total = "positive_eigenvalues", positive_sum
    elif float(total_variance) >= positive_sum:
        denominator, total = "total_variance", float(total_variance)
    else:
        denominator, total = "computed_positive_eigenvalues", positive_sum
    cumulative = np.cumsum(positive) / total if total > 0 else np.zeros_like(lam)
    np.minimum(cumulative, 1.0, out=cumulative)  # rounding of the cumulative sum
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
        method: ``"dense"``, ``"iterative"`` or ``"lanczos"``.
        tol: the solver's tolerance (ARPACK's relative tolerance on the Ritz values for
            ``iterative``; relative to the largest eigenvalue for ``lanczos``; recorded
            but unused by the direct dense solver).
        residuals: (k,) ``||A x - lambda x|| / lambda_max`` for each returned unit
            eigenvector ``x`` of the operator ``A`` the solver worked with: ``B`` itself
            (dense, or iterative with n <= V) or ``S_c^T S_c`` (iterative with n > V, same
            nonzero eigenvalues); ``lambda_max`` is the largest eigenvalue (1 if it is 0).
            ``lanczos`` gives the recurrence's residual norms ``||R_m y_last||`` (equal to
            the explicit ones up to rounding: full reorthogonalisation), at no product.
        noise_level, noise_residual: ``lanczos`` with a noise level: eigenvalues below
            ``noise_level - noise_residual`` (inside the sampling-noise bulk) were computed
            to the absolute residual ``noise_residual`` only, the others to ``tol``.
        device: ``"gpu"`` when the solver's products ran on cupy arrays, else ``"cpu"``.
    """

    eigenvalues: np.ndarray
    encoding: np.ndarray
    total_variance: float
    negative_mass: float
    method: Literal["dense", "iterative", "lanczos"]
    tol: float
    residuals: np.ndarray
    noise_level: float | None = None
    noise_residual: float | None = None
    device: Literal["cpu", "gpu"] = "cpu"

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
            "device": self.device,
        }
        if self.noise_level is not None:
            out["noise_level"] = float(self.noise_level)
            out["noise_residual"] = float(self.noise_residual or 0.0)
        if include_encoding:
            out["encoding"] = self.encoding.tolist()
        return out


def classical_mds(
    counts: Any,
    /,
    *,
    k: int | None = None,
    method: Literal["auto", "dense", "iterative", "lanczos"] = "auto",
    tol: float = 1e-10,
    seed: int = 0,
    dense_limit: int = 2048,
    block: int = 8,
    diagonal: Any = None,
    squared_distances: Any = None,
    xp: types.ModuleType | None = None,
    progress: Any = None,
    noise_level: float | None = None,
    noise_residual: float | None = None,
) -> MDSResult:
    """Classical MDS of the squared Hellinger distances between the rows of ``counts``.

    Args:
        counts: (n, V) counts of the *occupied* positions (every row sum > 0): numpy or
            cupy array, or scipy sparse (kept sparse throughout the iterative method);
            ``lanczos`` also takes a prebuilt operator (:func:`sqrt_operator`, or
            :class:`posstats.geometry.ranged.RangedSqrt` whose position ranges are held
            apart, by threads here or by Ray actors).
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
        block: ``lanczos`` only: vectors per block.
        diagonal: ``dense`` and ``lanczos`` only: (n,) ``b``; decompose the bias-corrected
            ``B - H diag(b) H`` (the MDS of ``D - b_i - b_j`` off the diagonal) instead of
            ``B``; it can have negative eigenvalues.
        squared_distances: ``dense`` only: (n, n) float64 ``D = hellinger_sq(counts)`` when the
            caller has it already (it is copied, never modified); default: computed here.
        xp: ``lanczos`` only: run the products with this namespace (``cupy`` puts a scipy
            sparse input on the GPU); default: where ``counts`` lives.
        progress: ``lanczos`` only: called as ``progress(products, residual)`` at each
            convergence check (operator products so far, largest residual estimate).
        noise_level, noise_residual: ``lanczos`` only: accuracy matched to sampling noise.
            Ritz values at or below ``noise_level - noise_residual`` lie in the noise bulk
            (the null's threshold, on the scale of the decomposed matrix): they converge at
            the absolute residual ``noise_residual`` instead of ``tol * theta_1``. A Ritz
            pair with residual r is exact for a matrix within r of the one decomposed
            (backward error), so a residual far below the noise's own operator norm changes
            nothing the sampling noise has not already changed; the pairs above the level
            (and within ``noise_residual`` of it: Ritz values only grow as they converge)
            keep ``tol``. Default: every pair to ``tol``.

    ``lanczos`` interprets ``tol`` relative to the largest eigenvalue:
    ``||A x - theta x|| <= tol * theta_1`` for every returned pair (``theta_1`` the largest),
    so the eigenvalue errors are at most ``tol * theta_1`` and, for separated eigenvalues,
    ~``(tol * theta_1)^2 / gap``. ``residuals`` says what was reached (at most
    ``max(4 k, 2**27 / dim)`` Krylov vectors are used).

    Returns:
        :class:`MDSResult` (host numpy arrays).

    >>> r = classical_mds(np.array([[4, 0, 0], [0, 4, 0], [2, 2, 0]]))
    >>> r.eigenvalues.round(6)
    array([1.      , 0.057191, 0.      ])
    """
    n = int(counts.shape[0])
    if method not in ("auto", "dense", "iterative", "lanczos"):
        msg = f"method must be 'auto', 'dense', 'iterative' or 'lanczos'; got {method!r}"
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
    if diagonal is not None and method == "iterative":
        msg = "diagonal= (the bias-corrected B) needs method='dense' or 'lanczos'"
        raise ValueError(msg)
    if squared_distances is not None and method != "dense":
        msg = f"squared_distances= (a precomputed D) needs method='dense'; got {method!r}"
        raise ValueError(msg)
    if method == "dense":
        return _dense_mds(counts, k=k, tol=tol, diagonal=diagonal, squared_distances=squared_distances)
    if k is None:
        msg = f"the {method} method needs k (the number of leading eigenpairs)"
        raise ValueError(msg)
    if _is_operator(counts) and method != "lanczos":
        msg = f"a prebuilt sqrt_operator needs method='lanczos'; got {method!r}"
        raise ValueError(msg)
    if (noise_level is None) != (noise_residual is None) or (noise_residual is not None and not noise_residual > 0):
        msg = f"give noise_level with a positive noise_residual, or neither; got {noise_level!r}, {noise_residual!r}"
        raise ValueError(msg)
    if method == "lanczos":
        return _lanczos_mds(counts, k=int(k), tol=tol, seed=seed, block=int(block), diagonal=diagonal, xp=xp,
                            progress=progress, noise_level=noise_level, noise_residual=noise_residual)
    return _iterative_mds(counts, k=int(k), tol=tol, seed=seed)


def _fix_signs(u: Any, xp: types.ModuleType) -> Any:
    """Multiply each column by the sign of its largest-magnitude entry (first on ties)."""
    if u.shape[0] == 0 or u.shape[1] == 0:
        return u
    idx = xp.argmax(xp.abs(u), axis=0)
    signs = xp.sign(u[idx, xp.arange(u.shape[1])])
    signs = xp.where(signs == 0, 1.0, signs)
    return u * signs[None, :]


def _squared_distances(counts: Any, given: Any, xp: types.ModuleType) -> Any:
    """A writable (n, n) float64 ``D`` of ``counts``' rows: a copy of ``given``, else
    :func:`hellinger_sq`."""
    if given is None:
        return hellinger_sq(counts, xp=None if sp.issparse(counts) else xp)
    n = int(counts.shape[0])
    if tuple(given.shape) != (n, n):
        msg = f"squared_distances must be (n, n) = ({n}, {n}); got shape {tuple(given.shape)}"
        raise ValueError(msg)
    return xp.asarray(given, dtype=xp.float64).copy()


def _dense_mds(counts: Any, *, k: int | None, tol: float, diagonal: Any = None, squared_distances: Any = None) -> MDSResult:
    xp = np if sp.issparse(counts) else array_namespace(counts)
    b = _squared_distances(counts, squared_distances, xp)
    n = int(b.shape[0])
    if n == 0:
        msg = "counts has no rows"
        raise ValueError(msg)
    gram_in_place(b, diagonal, xp=xp)
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
        device="cpu" if xp is np else "gpu",
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
        self.shape = tuple(int(x) for x in s.shape)
        if self.sparse:
            csr = s.tocsr()
            self.mean = np.asarray(csr.mean(axis=0), dtype=np.float64).reshape(-1)
            self._total = self._sparse_total_variance(csr)
            self.s = _RowBlocks(csr)
            self.st = _RowBlocks(csr.T.tocsr())  # row-major transpose: fast S^T y
        else:
            self.mean = s.mean(axis=0)
            self.s = s - self.mean[None, :]
            self.st = self.s.T
            self._total = float(self.xp.sum(self.s * self.s))

    def _sparse_total_variance(self, csr: sp.csr_array) -> float:
        """``||S_c||_F^2`` by a two-pass column variance (no cancellation against |S|^2)."""
        n = self.shape[0]
        dev = csr.data - self.mean[csr.indices]
        stored = np.bincount(csr.indices, minlength=self.shape[1])
        # Stored entries contribute (s - m)^2, each implicit zero of column v contributes m_v^2.
        return float(np.sum(dev * dev) + np.sum((n - stored) * self.mean**2))

    def total_variance(self) -> float:
        """``trace(B) = ||S_c||_F^2``."""
        return self._total

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


# Sparse products with at least this many stored entries run in row blocks on threads.
_THREADED_NNZ = 1 << 18
_POOL: ThreadPoolExecutor | None = None


def product_threads() -> int:
    """Threads for the sparse products: ``OMP_NUM_THREADS`` when set (Ray sets it to the
    CPUs of a worker), else the CPUs this process may run on."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _pool() -> ThreadPoolExecutor:
    global _POOL  # noqa: PLW0603 - one pool per process, made on first use
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=product_threads(), thread_name_prefix="posstats-spmv")
    return _POOL


def thread_pool() -> ThreadPoolExecutor:
    """The products' thread pool (one thread per core the process may use), for work that
    overlaps a sequential step (:func:`posstats.estimates.thinning.split_noise_floor`)."""
    return _pool()


def thread_map(fn: Any, items: Any, /) -> list[Any]:
    """``[fn(x) for x in items]`` on the products' thread pool (one thread per core the
    process may use; numpy and scipy's sparse kernels release the GIL), in order."""
    items = list(items)
    if len(items) <= 1 or product_threads() <= 1:
        return [fn(x) for x in items]
    return list(_pool().map(fn, items))


def _forget_pool() -> None:
    global _POOL  # noqa: PLW0603 - a forked child has the pool object but not its threads
    _POOL = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


# The host's sparse kernels gather (S X) or scatter (S^T Y) random rows of a (V, b) block,
# which must stay in cache: at 200 M tokens, n = 131,072, V = 50,257, one thread,
# S_c (S_c^T X) took 0.12 s a column at b = 16 (6.4 MB), 0.21 s at b = 32 and 0.33 s at
# b = 64. Wider products therefore run in column chunks whose (V, b) block fits this.
_CACHE_BYTES = 8 << 20
_MAX_CHUNK_COLUMNS = 16


def _column_chunk(vocab: int, /) -> int:
    """Columns of one sparse product on the host: the most (1 to 16) whose float64
    (``vocab``, b) block fits :data:`_CACHE_BYTES`.

    >>> _column_chunk(30_522), _column_chunk(50_257), _column_chunk(128_256), _column_chunk(10**7)
    (16, 16, 8, 1)
    """
    return int(max(1, min(_MAX_CHUNK_COLUMNS, _CACHE_BYTES // (8 * max(int(vocab), 1)))))


def _in_column_chunks(fn: Any, x: np.ndarray, step: int, /) -> np.ndarray:
    """``fn(x)`` computed ``step`` columns at a time (``fn`` maps columns independently)."""
    if x.shape[1] <= step:
        return fn(x)
    return np.hstack([fn(np.ascontiguousarray(x[:, a : a + step])) for a in range(0, x.shape[1], step)])


def _row_block_views(m: sp.csr_array, threads: int) -> list[tuple[int, int, sp.csr_array]]:
    """``(a, b, m[a:b])`` for ``threads`` row blocks of about equal nnz, the blocks sharing
    ``m``'s data and indices (no copy; only their row pointers are new)."""
    parts = max(1, min(int(threads), m.nnz // _THREADED_NNZ, m.shape[0]))
    cuts = np.searchsorted(m.indptr, np.linspace(0, m.nnz, parts + 1)[1:-1])
    edges = [0, *sorted({int(c) for c in cuts} - {0, m.shape[0]}), m.shape[0]]
    out = []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        lo, hi = int(m.indptr[a]), int(m.indptr[b])
        ptr = (m.indptr[a : b + 1] - lo).astype(m.indptr.dtype, copy=False)
        out.append((a, b, _csr_view(m.data[lo:hi], m.indices[lo:hi], ptr, (b - a, m.shape[1]))))
    return out


def _csr_view(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, shape: tuple[int, int], /,
              *, fmt: str = "csr") -> Any:
    """A CSR (or, ``fmt="csc"``, CSC) array over these canonical arrays, never a copy of
    them. scipy's constructor, which ``.T`` also calls, copies an array that is a view of
    less than half its base (``_prune_array``, even with ``copy=False``): the second row
    block of a 2-thread operator was a copy of half the counts' entries (+2.9 GB at 1 B
    tokens, n = 131,072), and its transpose would be copied at every product."""
    out = (sp.csc_array if fmt == "csc" else sp.csr_array)(shape, dtype=data.dtype)
    out.data, out.indices, out.indptr = data, indices, indptr
    return out


def _transposed_views(blocks: list[tuple[int, int, sp.csr_array]], /) -> list[tuple[int, int, Any]]:
    """``(a, b, m[a:b]^T)`` as CSC views over each block's arrays (:func:`_csr_view`)."""
    return [(a, b, _csr_view(m.data, m.indices, m.indptr, (m.shape[1], m.shape[0]), fmt="csc")) for a, b, m in blocks]


class _RowBlocks:
    """A CSR matrix whose product ``m @ x`` multiplies row blocks of equal nnz on threads.

    scipy's sparse kernels release the GIL, so the blocks run in parallel: on the 2-core
    machine of ``benchmarks/bench_mds.py`` (4.7M nnz) one ``S S^T x`` product takes
    9.0 ms instead of 11.5 ms. Small matrices (or one thread) use one block.
    """

    def __init__(self, m: sp.csr_array, /, *, threads: int | None = None) -> None:
        threads = product_threads() if threads is None else int(threads)
        # views over m's arrays (slicing m[a:b] would copy a block under half its entries)
        self.blocks = [blk for _, _, blk in _row_block_views(m, threads)]
        self.shape = m.shape

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        if len(self.blocks) == 1:
            return self.blocks[0] @ x
        return np.concatenate(list(_pool().map(lambda b: b @ x, self.blocks)))


def blocks_times(blocks: list[tuple[int, int, Any]], x: np.ndarray, vocab: int, /) -> np.ndarray:
    """``m @ x`` (rows, b) for a CSR ``m`` given as its row blocks ``(a, b, m[a:b])``
    (:func:`_row_block_views`): the blocks on threads (scipy releases the GIL), in column
    chunks whose (``vocab``, b) block stays in cache (:func:`_column_chunk`)."""

    def chunk(xc: np.ndarray) -> np.ndarray:
        if len(blocks) == 1:
            return blocks[0][2] @ xc
        return np.concatenate(list(_pool().map(lambda blk: blk[2] @ xc, blocks)))

    return _in_column_chunks(chunk, x, _column_chunk(vocab))


def blocks_t_times(blocks_t: list[tuple[int, int, Any]], y: np.ndarray, vocab: int, /) -> np.ndarray:
    """``m^T @ y`` (vocab, b) from the transposed row blocks ``(a, b, m[a:b]^T)``
    (:func:`_transposed_views`): ``m[a:b]^T y[a:b]`` per block on threads, summed, in
    column chunks (:func:`_column_chunk`)."""

    def chunk(yc: np.ndarray) -> np.ndarray:
        if len(blocks_t) == 1:
            return blocks_t[0][2] @ yc
        partial = list(_pool().map(lambda blk: blk[2] @ yc[blk[0] : blk[1]], blocks_t))
        out = partial[0]
        for part in partial[1:]:
            out += part
        return out

    return _in_column_chunks(chunk, y, _column_chunk(vocab))


def _single_blas_thread() -> contextlib.AbstractContextManager[Any]:
    """One BLAS thread while ARPACK runs, when threadpoolctl is installed.

    ARPACK's own BLAS calls are small matrix-vector products (n x ncv); threading them
    costs more in synchronisation than it saves, badly so on a busy or many-core machine
    (measured on a busy 2-core machine: the n = 4096, k = 64 benchmark's Lanczos ran 2-4x
    faster with one thread). The
    sparse products are single-threaded in scipy anyway.
    """
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


# ---------------------------------------------------------------------------------------
# Block Lanczos for very long contexts


def gram_in_place(d2: Any, diagonal: Any = None, /, *, xp: types.ModuleType = np) -> Any:
    """Turn the symmetric (n, n) squared distances ``d2`` into classical MDS's Gram matrix in
    place and return it: ``B = -1/2 H D H``, and with ``diagonal`` (n,) ``b`` the
    bias-corrected ``B - H diag(b) H``. D is symmetric, so row and column means coincide."""
    means = d2.mean(axis=1)
    grand = means.mean()
    d2 -= means[:, None]
    d2 -= means[None, :]
    d2 += grand
    d2 *= -0.5
    if diagonal is not None:
        _subtract_centred_diagonal(d2, xp.asarray(diagonal, dtype=xp.float64), xp)
    return d2


def _subtract_centred_diagonal(b: Any, d: Any, xp: types.ModuleType) -> None:
    """``b -= H diag(d) H`` in place: ``d_i [i == j] - (d_i + d_j) / n + sum(d) / n^2``."""
    n = int(b.shape[0])
    if d.shape != (n,) or not bool(xp.all(xp.isfinite(d))):
        msg = f"diagonal must be a finite (n,) = ({n},) vector; got shape {tuple(d.shape)}"
        raise ValueError(msg)
    idx = xp.arange(n)
    b[idx, idx] -= d
    b += (d[:, None] + d[None, :]) / n
    b -= float(d.sum()) / (n * n)


# Columns of S at least this dense go to the dense block (see hellinger._DENSE_COLUMN_DENSITY);
# the block is capped at _SPLIT_DENSE_BYTES (2 GiB of float64).
_SPLIT_DENSITY = 0.05
_SPLIT_DENSE_BYTES = 1 << 31
_SPLIT_CHUNK_NNZ = 1 << 23  # stored entries handled at a time while splitting


def _canonical_counts(counts: Any) -> Any:
    """Sparse counts (n x V) as CSR in canonical format (sorted, no duplicate entries)."""
    c = counts if isinstance(counts, (sp.csr_array, sp.csr_matrix)) else sp.csr_array(counts)
    if not c.has_canonical_format:
        c = sp.csr_array(c, copy=True)
        c.sum_duplicates()
    return c


def _check_count_values(c: Any) -> None:
    """Refuse a non-numeric dtype (``TypeError``) or a negative / non-finite entry
    (``ValueError``) among the stored entries of the CSR counts ``c``."""
    if c.dtype.kind not in "buif":
        msg = f"counts must be a real numeric array; got dtype {c.dtype}"
        raise TypeError(msg)
    data = c.data
    if data.size and (data.min() < 0 or not np.all(np.isfinite(data))):
        msg = "counts must be finite and non-negative"
        raise ValueError(msg)


def _heavy_columns(per_col: np.ndarray, n: int) -> np.ndarray:
    """Sorted indices of the columns that go to the dense block: those stored in at least
    ``_SPLIT_DENSITY * n`` rows, densest first, at most ``_SPLIT_DENSE_BYTES / (8 n)``.

    ``per_col``: (V,) int, stored entries per column. Returns (h,) int64, ascending.

    >>> _heavy_columns(np.array([5, 0, 1, 5]), 10).tolist()
    [0, 2, 3]
    """
    order = np.argsort(per_col, kind="stable")[::-1]
    cap = max(0, _SPLIT_DENSE_BYTES // (8 * max(n, 1)))
    return np.sort(order[: min(cap, int(np.count_nonzero(per_col >= _SPLIT_DENSITY * n)))])


@dataclass(frozen=True)
class _SplitParts:
    """``S = sqrt(C / occ)`` (n x V) split by column, as host arrays.

    Attributes:
        dense: (n, h) float64, S's heavy columns (in ascending column order).
        light_data, light_indices, light_indptr: CSR parts of the rest of S, (nnz_l,)
            float64, (nnz_l,) int32 (int64 when V >= 2^31), (n + 1,) int64; the heavy
            columns' entries are left out.
        col_sum: (V,) float64, ``sum_i S_iv``.
        occupancy: (n,) float64, ``occ_i = sum_v C_iv`` (exact for integer counts).
    """

    dense: np.ndarray
    light_data: np.ndarray
    light_indices: np.ndarray
    light_indptr: np.ndarray
    col_sum: np.ndarray
    occupancy: np.ndarray


def _chunk_occupancy(vals: np.ndarray, indptr: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Row sums ``occ_i = sum_v C_iv`` (hi - lo,) float64 of rows lo..hi-1, whose stored
    values are ``vals`` (from ``indptr[lo]``); exact integer sums for integer counts.
    Raises ``ValueError`` for an empty row."""
    a = int(indptr[lo])
    csum = np.concatenate([[0], np.cumsum(vals, dtype=np.int64 if vals.dtype.kind in "biu" else np.float64)])
    occ_chunk = (csum[indptr[lo + 1 : hi + 1] - a] - csum[indptr[lo:hi] - a]).astype(np.float64)
    if np.any(occ_chunk == 0):
        empty = np.flatnonzero(occ_chunk == 0)[:5] + lo
        msg = f"row(s) with zero occupancy (first: {empty.tolist()}); remove unoccupied positions before computing distances"
        raise ValueError(msg)
    return occ_chunk


def _split_rows(c: Any, heavy: np.ndarray, per_col: np.ndarray) -> _SplitParts:
    """``S_iv = sqrt(C_iv / occ_i)`` of the CSR counts ``c`` (n x V), split into the
    ``heavy`` columns (dense) and the rest (CSR), in row chunks of about
    ``_SPLIT_CHUNK_NNZ`` stored entries (S is never held whole). Without heavy columns the
    CSR shares the counts' index arrays (only S's values are new)."""
    n, v = (int(x) for x in c.shape)
    data, indices, indptr = c.data, c.indices, c.indptr
    if not heavy.size and indices.dtype == np.int32:
        return _sqrt_sharing_pattern(c)
    lengths = np.diff(indptr)
    col_map = np.full(v, -1, dtype=np.int64)
    col_map[heavy] = np.arange(heavy.size)
    dense = np.zeros((n, heavy.size), dtype=np.float64)
    light_per_row = np.zeros(n, dtype=np.int64)
    nnz_light = int(data.size - per_col[heavy].sum())
    ldata = np.empty(nnz_light, dtype=np.float64)
    lind = np.empty(nnz_light, dtype=np.int32 if v < 2**31 else np.int64)
    col_sum = np.zeros(v, dtype=np.float64)
    occ = np.zeros(n, dtype=np.float64)
    pos = 0
    rows_per_chunk = max(1, int(_SPLIT_CHUNK_NNZ // max(1, data.size // max(n, 1))))
    for lo in range(0, n, rows_per_chunk):
        hi = min(n, lo + rows_per_chunk)
        a, b = int(indptr[lo]), int(indptr[hi])
        rows = np.repeat(np.arange(lo, hi), lengths[lo:hi])
        vals = data[a:b]
        occ_chunk = _chunk_occupancy(vals, indptr, lo, hi)
        occ[lo:hi] = occ_chunk
        s = np.sqrt(vals.astype(np.float64) / occ_chunk[rows - lo])
        cols = indices[a:b]
        hm = col_map[cols]
        is_h = hm >= 0
        dense[rows[is_h], hm[is_h]] = s[is_h]
        keep = ~is_h
        cnt = int(np.count_nonzero(keep))
        ldata[pos : pos + cnt] = s[keep]
        lind[pos : pos + cnt] = cols[keep]
        pos += cnt
        light_per_row[lo:hi] = np.bincount(rows[keep] - lo, minlength=hi - lo)
        col_sum += np.bincount(cols, weights=s, minlength=v)
    lptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(light_per_row, out=lptr[1:])
    return _SplitParts(dense, ldata, lind, lptr, col_sum, occ)


def _sqrt_sharing_pattern(c: Any) -> _SplitParts:
    """:func:`_split_rows` without heavy columns: S's values in the counts' own pattern
    (``light_indices`` / ``light_indptr`` are the counts' arrays, not copies)."""
    n, v = (int(x) for x in c.shape)
    data, indices, indptr = c.data, c.indices, c.indptr
    sdata = np.empty(data.size, dtype=np.float64)
    col_sum = np.zeros(v, dtype=np.float64)
    occ = np.zeros(n, dtype=np.float64)
    rows_per_chunk = max(1, int(_SPLIT_CHUNK_NNZ // max(1, data.size // max(n, 1))))
    for lo in range(0, n, rows_per_chunk):
        hi = min(n, lo + rows_per_chunk)
        a, b = int(indptr[lo]), int(indptr[hi])
        occ[lo:hi] = _chunk_occupancy(data[a:b], indptr, lo, hi)
        sdata[a:b] = np.sqrt(data[a:b] / np.repeat(occ[lo:hi], np.diff(indptr[lo : hi + 1])))
        col_sum += np.bincount(indices[a:b], weights=sdata[a:b], minlength=v)
    return _SplitParts(np.zeros((n, 0)), sdata, indices, indptr, col_sum, occ)


def _centred_frobenius_sq(parts: _SplitParts, mean: np.ndarray, heavy: np.ndarray, per_col: np.ndarray) -> float:
    """``||S_c||_F^2 = sum_iv (S_iv - m_v)^2`` by the two-pass column variance: the stored
    entries' ``(s - m_v)^2`` plus ``m_v^2`` per implicit zero of a light column
    (``n - per_col[v]`` of them), with no cancellation against ``|S|_F^2 = n``."""
    n = int(parts.dense.shape[0])
    ldata, lind = parts.light_data, parts.light_indices
    dev_sq = float(np.sum((parts.dense - mean[heavy][None, :]) ** 2)) if heavy.size else 0.0
    for a in range(0, int(ldata.size), _SPLIT_CHUNK_NNZ):
        dv = ldata[a : a + _SPLIT_CHUNK_NNZ] - mean[lind[a : a + _SPLIT_CHUNK_NNZ]]
        dev_sq += float(np.dot(dv, dv))
    light_cols = np.ones(mean.shape[0], dtype=bool)
    light_cols[heavy] = False
    dev_sq += float(np.sum(((n - per_col) * mean**2)[light_cols]))
    return dev_sq


class _SplitSqrt:
    """The implicit ``S_c = S - 1 m^T`` (n x V) as a dense block of S's densest columns plus
    a CSR matrix of the rest (``split``; else one CSR in the counts' own pattern, see
    :func:`sqrt_operator`), with blocked products ``S_c X`` and ``S_c^T Y``.

    Built from the counts in row chunks: ``S`` itself is never held whole (peak memory:
    the counts, the dense block and the sparse rest). A dense input is centred explicitly
    (no cancellation). ``xp=cupy`` moves both parts to the GPU.
    """

    def __init__(self, counts: Any, *, xp: types.ModuleType | None = None, split: bool | None = None) -> None:
        if not sp.issparse(counts):
            self._init_dense(counts, xp)
            return
        if split is None:  # measured on the host: one sparse part is faster and smaller there
            split = xp is not None and xp is not np
        self.xp = np if xp is None else xp
        c = _canonical_counts(counts)
        n, v = (int(x) for x in c.shape)
        self.shape = (n, v)
        _check_count_values(c)
        per_col = np.bincount(c.indices, minlength=v)
        heavy = _heavy_columns(per_col, n) if split else np.zeros(0, dtype=np.int64)
        parts = _split_rows(c, heavy, per_col)
        mean = parts.col_sum / n
        self._total = _centred_frobenius_sq(parts, mean, heavy, per_col)
        self.occupancy = parts.occupancy
        self._place(parts, mean, heavy)
        self.heavy_columns = int(heavy.size)
        self.light_nnz = int(parts.light_data.size)

    def _init_dense(self, counts: Any, xp: types.ModuleType | None) -> None:
        """A dense input: ``S_c`` held whole, centred explicitly (no cancellation)."""
        s = sqrt_distributions(counts)
        self.xp = array_namespace(s) if xp is None else xp
        s = self.xp.asarray(s)
        self.shape = tuple(int(x) for x in s.shape)
        mean = s.mean(axis=0)
        self.dense = s - mean[None, :]
        self.heavy = None
        self.rest = None
        self._total = float(self.xp.sum(self.dense * self.dense))
        self.mean = self.xp.zeros_like(mean)  # already centred

    def _place(self, parts: _SplitParts, mean: np.ndarray, heavy: np.ndarray) -> None:
        """The dense block, the CSR rest (n x V), the column means and the heavy column
        indices, on the host (numpy) or the GPU (cupy, with int32 CSR indices)."""
        n, v = self.shape
        ldata, lind, lptr = parts.light_data, parts.light_indices, parts.light_indptr
        if ldata.size < 2**31 and lind.dtype == np.int32:
            lptr = lptr.astype(np.int32)  # scipy would otherwise upcast the indices (a copy)
        xp_ = self.xp
        if xp_ is np:
            self.dense, self.mean, self.heavy = parts.dense, mean, heavy
            self.rest = sp.csr_array((ldata, lind, lptr), shape=(n, v))
            self._blocks = _row_block_views(self.rest, product_threads())
            self._blocks_t = _transposed_views(self._blocks)
            return
        self._to_gpu(parts.dense, (ldata, lind, lptr), mean, heavy)

    def _to_gpu(self, dense: np.ndarray, csr: tuple[np.ndarray, np.ndarray, np.ndarray], mean: np.ndarray,
                heavy: np.ndarray) -> None:
        """Place the parts on the GPU (``self.xp`` is cupy): the CSR rest with int32 indices
        and, built there (cuSPARSE csr2csc), its transpose, so that ``S_c^T Y`` is a plain
        CSR product instead of a transposed one."""
        xp_, csp = self.xp, get_cupy_sparse()
        data, indices, indptr = csr
        self.dense = xp_.asarray(dense)
        self.rest = csp.csr_matrix(
            (xp_.asarray(data), xp_.asarray(indices.astype(np.int32, copy=False)),
             xp_.asarray(indptr.astype(np.int32, copy=False))), shape=self.shape)
        self._rest_t = self.rest.T.tocsr()
        self.mean = xp_.asarray(mean)
        self.heavy = xp_.asarray(heavy)

    def to_device(self, xp: types.ModuleType, /) -> _SplitSqrt:
        """This host operator's copy on the GPU (``xp`` cupy), for the eigensolver's products:
        the arrays are copied as they are (about 12 bytes a non-zero and the transpose's
        as many again on the device), nothing is recomputed. The host operator stays
        usable (:meth:`row_dots` needs it)."""
        if self.xp is not np or self.rest is None:
            msg = "to_device copies a sparse operator that lives on the host"
            raise TypeError(msg)
        out = object.__new__(_SplitSqrt)
        out.xp, out.shape, out._total = xp, self.shape, self._total
        out.occupancy, out.heavy_columns, out.light_nnz = self.occupancy, self.heavy_columns, self.light_nnz
        rest = self.rest
        out._to_gpu(self.dense, (rest.data, rest.indices, rest.indptr), self.mean, self.heavy)
        return out

    def total_variance(self) -> float:
        """``trace(B) = ||S_c||_F^2``."""
        return self._total

    def row_dots(self, i: np.ndarray, j: np.ndarray, /) -> np.ndarray:
        """(p,) ``<s_i, s_j>`` of the uncentred square-root rows (host, sparse input only)."""
        if self.rest is None or self.xp is not np:
            msg = "row_dots needs a sparse input on the host"
            raise TypeError(msg)
        out = np.asarray(self.rest[i].multiply(self.rest[j]).sum(axis=1), dtype=np.float64).ravel()
        if self.heavy.size:
            out += np.einsum("ij,ij->i", self.dense[i], self.dense[j])
        return out

    def _rest_times(self, x: Any) -> Any:
        """``rest @ x``: on the host, row blocks on threads (:func:`blocks_times`)."""
        if self.xp is not np:
            return self.rest @ x
        return blocks_times(self._blocks, x, self.shape[1])

    def _rest_t_times(self, y: Any) -> Any:
        """``rest^T @ y``: on the host, row blocks on threads (:func:`blocks_t_times`)."""
        if self.xp is not np:
            return self._rest_t @ y
        return blocks_t_times(self._blocks_t, y, self.shape[1])

    def apply(self, x: Any) -> Any:
        """``S_c x`` for x of shape (V, b)."""
        if self.rest is None:
            return self.dense @ x
        out = self._rest_times(x)
        if self.heavy.size:
            out += self.dense @ x[self.heavy]
        out -= (self.mean @ x)[None, :]
        return out

    def apply_t(self, y: Any) -> Any:
        """``S_c^T y`` for y of shape (n, b)."""
        if self.rest is None:
            return self.dense.T @ y
        out = self._rest_t_times(y)
        if self.heavy.size:
            out[self.heavy] += self.dense.T @ y
        out -= self.mean[:, None] * y.sum(axis=0)[None, :]
        return out


def _band_of(a_blocks: list[np.ndarray], b_blocks: list[np.ndarray], block: int) -> np.ndarray:
    """Lower band storage (``block + 1`` rows) of the block tridiagonal ``T``."""
    m = len(a_blocks) * block
    t = np.zeros((m, m))
    for s, a in enumerate(a_blocks):
        t[s * block : (s + 1) * block, s * block : (s + 1) * block] = a
        if s + 1 < len(a_blocks):
            t[(s + 1) * block : (s + 2) * block, s * block : (s + 1) * block] = b_blocks[s]
    band = np.zeros((block + 1, m))
    for i in range(block + 1):
        band[i, : m - i] = np.diagonal(t, -i)
    return band


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


def _block_lanczos(
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
            if np.all(est <= need) or exhausted or breakdown:
                x = basis[:, :m] @ xp.asarray(y)
                return theta, x, est, applied, bool(np.all(est <= need))
        b_blocks.append(r_host)
        prev, b_prev, q = q, r_host, q_next


def sqrt_operator(counts: Any, /, *, xp: types.ModuleType | None = None, split: bool | None = None) -> _SplitSqrt:
    """The implicit centred square-root operator ``S_c`` of (n, V) occupied counts, built
    once to be shared: :func:`classical_mds` (``method="lanczos"``) accepts it in place of
    the counts, and :class:`posstats.estimates.sampled.SampledGeometry` computes pair
    distances from it (:meth:`_SplitSqrt.row_dots`), so the square roots are held once.

    ``split=False`` keeps every column in the sparse part, which then shares the counts'
    index arrays: one float64 array of nnz values more than the counts, instead of that plus
    a copy of the indices and a dense block of the densest columns (up to 2 GiB).
    ``None`` (default): split only on a GPU (``xp`` cupy). On the host one sparse part is
    both smaller and faster with the threaded products: the top 64 of the bias-corrected
    operator of the 200 M-token benchmark counts (1.26e8 non-zeros) took 65 s and 5.1 GB
    unsplit against 84 s and 6.1 GB split."""
    return _SplitSqrt(counts, xp=xp, split=split)


class ShiftedSqrt:
    """The centred square-root operator of the rows ``s_i - l_i R`` (:func:`shifted_operator`):
    ``X_c = S_c - (L R)_c`` from a prebuilt ``S_c`` and an (n, K) by (K, V) low-rank shift,
    with the same products (:meth:`apply`, :meth:`apply_t`, :meth:`total_variance`, on the
    host); ``row_dots`` and the rest stay the unshifted operator's (``base``)."""

    def __init__(self, base: Any, left: np.ndarray, right: np.ndarray) -> None:
        if base.xp is not np:
            msg = "a shifted square-root operator lives on the host"
            raise TypeError(msg)
        n, v = base.shape
        if left.shape[0] != n or right.shape[1] != v or left.shape[1] != right.shape[0]:
            msg = f"shift {left.shape} x {right.shape} does not fit the operator's {base.shape}"
            raise ValueError(msg)
        self.base, self.xp, self.shape = base, np, base.shape
        self.left = left - left.mean(axis=0)[None, :]  # (L R)_c = (L - 1 mean(L)) R
        self.right = np.ascontiguousarray(right, dtype=np.float64)
        # ||S_c - L_c R||^2 = ||S_c||^2 - 2 tr(L_c^T S_c R^T) + tr(L_c (R R^T) L_c^T)
        cross = float(np.einsum("ik,ik->", self.left, base.apply(self.right.T)))
        shift = float(np.einsum("ik,kl,il->", self.left, self.right @ self.right.T, self.left))
        self._total = base.total_variance() - 2.0 * cross + shift

    def __getattr__(self, name: str) -> Any:
        if name == "base":  # not set yet (copies, pickling): no recursion
            raise AttributeError(name)
        return getattr(self.base, name)  # row_dots, occupancy, ...: the unshifted rows'

    def total_variance(self) -> float:
        """``||X_c||_F^2``."""
        return self._total

    def apply(self, x: Any) -> Any:
        """``X_c x`` for x of shape (V, b)."""
        return self.base.apply(x) - self.left @ (self.right @ x)

    def apply_t(self, y: Any) -> Any:
        """``X_c^T y`` for y of shape (n, b)."""
        return self.base.apply_t(y) - self.right.T @ (self.left.T @ y)


def shifted_operator(base: Any, left: Any, right: Any, /) -> ShiftedSqrt:
    """The centred square-root operator ``base`` (:func:`sqrt_operator`) of rows shifted by
    ``-left @ right`` ((n, K) and (K, V): the rows ``s_i - l_i R``), for
    :func:`classical_mds` (``method="lanczos"``): e.g. the square roots with their
    occupancy shrinkage removed (:mod:`posstats.estimates.occupancy`). Products cost K (n + V)
    more per vector."""
    return ShiftedSqrt(base, np.asarray(left, dtype=np.float64), np.asarray(right, dtype=np.float64))


def _is_operator(x: Any, /) -> bool:
    """True for a prebuilt centred square-root operator (:func:`sqrt_operator`, or
    :class:`posstats.geometry.ranged.RangedSqrt` over ranges held apart): an object with
    ``shape``, ``xp``, ``apply``, ``apply_t`` and ``total_variance``."""
    return all(hasattr(x, name) for name in ("xp", "apply", "apply_t", "total_variance"))


def _gram_product(op: Any, diag: Any, x: Any, /) -> Any:
    """``(S_c S_c^T - H diag(b) H) x`` for (n, b) ``x`` (without ``diag``: ``S_c S_c^T x``),
    the Gram matrix ``B`` (or ``B_c``) of the centred square-root operator ``op``."""
    out = op.apply(op.apply_t(x))
    if diag is not None:
        hx = x - x.mean(axis=0)[None, :]
        t = diag[:, None] * hx
        out -= t - t.mean(axis=0)[None, :]
    return out


def weighted_gram_eigenpairs(
    counts: Any, weights: Any, /, *, k: int, diagonal: Any = None, tol: float = 1e-10, seed: int = 0, block: int = 8,
    noise_level: float | None = None, noise_residual: float | None = None, progress: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(eigenvalues, vectors)``: the (k,) top eigenvalues, descending, of the row-weighted
    Gram matrix ``W^1/2 B W^1/2`` (``W = diag(weights)``; with ``diagonal`` b, of
    ``W^1/2 (B - H diag(b) H) W^1/2``), and their (n, k) unit eigenvectors, by the
    block Lanczos of :func:`classical_mds` on ``counts`` or a prebuilt operator
    (:func:`sqrt_operator`, :func:`shifted_operator`, a ranged one), never forming an n x n
    matrix. ``weights``: (n,) positive. The occupancy-weighted rank test of the long-context
    path reads these (:mod:`posstats.estimates.permutation`, "Occupancy weighting").
    ``tol``, ``noise_level``, ``noise_residual``, ``progress``: as :func:`classical_mds`
    (``noise_level`` on this matrix' scale)."""
    op = counts if _is_operator(counts) else _SplitSqrt(counts, xp=None)
    xp = op.xp
    n = int(op.shape[0])
    root = np.sqrt(np.asarray(weights, dtype=np.float64).ravel())
    if root.shape != (n,) or not np.all(np.isfinite(root)) or not np.all(root > 0):
        msg = f"weights must be a positive finite (n,) = ({n},) vector"
        raise ValueError(msg)
    root_x = xp.asarray(root)[:, None]
    diag = None if diagonal is None else xp.asarray(diagonal, dtype=xp.float64)
    kk = max(1, min(int(k), n - 1))
    max_dim = min(n, max(4 * kk + 2 * block, (1 << 27) // max(n, 1)))
    theta, x, _, _, _ = _block_lanczos(lambda v: root_x * _gram_product(op, diag, root_x * v), n, kk, block=block,
                                       tol=tol, seed=seed, xp=xp, max_dim=max_dim, progress=progress,
                                       noise_level=noise_level, noise_residual=noise_residual)
    vectors = np.asarray(to_numpy(x), dtype=np.float64)
    return np.asarray(theta, dtype=np.float64), vectors / np.maximum(np.linalg.norm(vectors, axis=0), 1e-300)



def weighted_coordinates(vectors: Any, eigenvalues: Any, weights: Any, /) -> np.ndarray:
    """The occupancy-weighted MDS coordinates ``X = W^-1/2 U diag(sqrt(max(lambda, 0)))``
    (n, k) from the (n, k) unit eigenvectors ``U`` and (k,) eigenvalues ``lambda`` of the
    weighted Gram matrix ``W^1/2 B W^1/2`` (``W = diag(weights)``, positive): the rank-k
    ``X`` that minimises the weighted strain ``sum_ij w_i w_j (B_ij - x_i . x_j)^2``.

    Why: with ``Y = W^1/2 X`` that strain is ``||W^1/2 B W^1/2 - Y Y^T||_F^2``, minimised
    by the top-k eigenpairs (Eckart-Young), so the rows of ``X`` are fitted in proportion to
    their weights. With ``weights`` the occupancies over their mean, a position of a few
    tokens, whose distances are mostly sampling noise, barely moves the fit (the unweighted
    P_MDS fits every position alike); its coordinate is then the projection of its row of
    ``B`` on the fitted components (``x_i = sum_j B_ij w_j x_j / lambda``). These are the
    components the occupancy-weighted rank test counts
    (:func:`weighted_gram_eigenpairs`; :mod:`posstats.estimates.permutation`, "Occupancy
    weighting"). Each column's largest-magnitude entry is made positive, as in
    :class:`MDSResult`. Equal weights give P_MDS (up to those signs)."""
    u = np.asarray(vectors, dtype=np.float64)
    lam = np.asarray(eigenvalues, dtype=np.float64).ravel()
    w = np.asarray(weights, dtype=np.float64).ravel()
    if u.ndim != 2 or u.shape[1] != lam.size or u.shape[0] != w.size:
        msg = f"vectors (n, k), eigenvalues (k,) and weights (n,) disagree: {u.shape}, {lam.shape}, {w.shape}"
        raise ValueError(msg)
    if not np.all(np.isfinite(w)) or not np.all(w > 0):
        raise ValueError("weights must be positive and finite")
    x = u * np.sqrt(np.maximum(lam, 0.0))[None, :] / np.sqrt(w)[:, None]
    return np.ascontiguousarray(_fix_signs(x, np))

def _lanczos_mds(counts: Any, *, k: int, tol: float, seed: int, block: int, diagonal: Any, xp: types.ModuleType | None,
                 progress: Any = None, noise_level: float | None = None, noise_residual: float | None = None) -> MDSResult:
    op = counts if _is_operator(counts) else _SplitSqrt(counts, xp=xp)
    xp = op.xp
    n, v = op.shape
    n_side = diagonal is not None or n <= v
    dim = n if n_side else v
    kk = min(k, max(1, min(n, v) - 1), dim)
    if diagonal is not None:
        diag = xp.asarray(diagonal, dtype=xp.float64)
        if diag.shape != (n,) or not bool(xp.all(xp.isfinite(diag))):
            msg = f"diagonal must be a finite (n,) = ({n},) vector; got shape {tuple(diag.shape)}"
            raise ValueError(msg)

    def matmat(x: Any) -> Any:
        if not n_side:
            return op.apply_t(op.apply(x))
        return _gram_product(op, diag if diagonal is not None else None, x)

    max_dim = min(dim, max(4 * kk + 2 * block, (1 << 27) // max(dim, 1)))
    # The residuals are the recurrence's (||R_m y_last|| / theta_1, exact up to rounding with
    # full reorthogonalisation), not one more application of the operator to all k vectors:
    # that would be k more columns of products (64 of 280 at 202 M tokens, n = 131,072).
    theta, x, resid, applied, converged = _block_lanczos(matmat, dim, kk, block=block, tol=tol, seed=seed, xp=xp,
                                                         max_dim=max_dim, progress=progress, noise_level=noise_level,
                                                         noise_residual=noise_residual)
    if n_side:
        u = _fix_signs(x, xp)
        encoding = u * xp.sqrt(xp.maximum(xp.asarray(theta), 0.0))[None, :]
    else:
        encoding = _fix_signs(op.apply(x), xp)
    total = op.total_variance()
    if diagonal is not None:
        total -= float(diag.sum()) * (1.0 - 1.0 / n)
    w = np.asarray(theta, dtype=np.float64) + 0.0
    return MDSResult(
        eigenvalues=w,
        encoding=np.ascontiguousarray(to_numpy(encoding), dtype=np.float64),
        total_variance=float(total),
        negative_mass=_negative_mass(w),
        method="lanczos",
        tol=float(tol),
        residuals=np.asarray(resid, dtype=np.float64),
        noise_level=None if noise_level is None else float(noise_level),
        noise_residual=None if noise_residual is None else float(noise_residual),
        device="cpu" if xp is np else "gpu",
    )
