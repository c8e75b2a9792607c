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

import types
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import scipy.linalg
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from posstats.geometry.backend import array_namespace, to_numpy
from posstats.geometry.hellinger import hellinger_sq
from posstats.geometry.lanczos import block_lanczos
from posstats.geometry.products import _single_blas_thread
from posstats.geometry.spectrum import Spectrum, _negative_mass, spectrum_summary
from posstats.geometry.sqrt_operator import _CentredSqrt, _gram_product, _is_operator, _SplitSqrt

__all__ = ["MDSResult", "centre_on_weights_in_place", "centred_on_weights", "centring_weights", "classical_mds",
           "gram_in_place", "weighted_coordinates", "weighted_gram_eigenpairs"]


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


def centring_weights(weights: Any, /, *, xp: types.ModuleType = np) -> Any:
    """(n,) ``pi = w / sum(w)``: the weighted mean's coefficients of positive ``weights``."""
    w = xp.asarray(weights, dtype=xp.float64).ravel()
    return w / w.sum()


def centre_on_weights_in_place(b: Any, weights: Any, /, *, xp: types.ModuleType = np) -> Any:
    """``B <- H_w B H_w^T`` in place and returned, for a symmetric (n, n) Gram matrix ``b`` of
    rows centred on their plain mean (``B = H G H``), ``H_w = I - 1 pi^T``,
    ``pi = weights / sum(weights)``: the Gram matrix of the same rows centred on their
    weighted mean instead. ``H_w H = H_w``, so entry by entry
    ``B_ij - (B pi)_i - (B pi)_j + pi^T B pi``; with a bias-corrected ``B - H diag(b) H``
    it gives ``H_w (G - diag(b)) H_w^T`` alike. Equal weights leave ``B`` as it is.

    Why (the occupancy-weighted rank test, :mod:`posstats.estimates.permutation`,
    "Occupancy weighting"): the plain mean gives every position one share of the centre,
    so where a few long documents fill hundreds of thin positions their shared deviation
    moves the centre, and with it every well-occupied row the weights then make count."""
    pi = centring_weights(weights, xp=xp)
    bp = b @ pi
    grand = float(pi @ bp)
    b -= bp[:, None]
    b -= bp[None, :]
    b += grand
    return b


def centred_on_weights(product: Any, pi: Any, x: Any, /) -> Any:
    """``H_w A H_w^T x`` for (n, b) ``x``, ``product(t) = A t`` of a symmetric ``A``
    (centred on the plain mean or not: ``H_w H = H_w``), ``H_w = I - 1 pi^T``
    (:func:`centring_weights`): the product of :func:`centre_on_weights_in_place`'s matrix
    without forming it."""
    t = x - pi[:, None] * x.sum(axis=0)[None, :]
    z = product(t)
    return z - (pi @ z)[None, :]


def weighted_gram_eigenpairs(
    counts: Any, weights: Any, /, *, k: int, diagonal: Any = None, tol: float = 1e-10, seed: int = 0, block: int = 8,
    noise_level: float | None = None, noise_residual: float | None = None, progress: Any = None,
) -> tuple[np.ndarray, np.ndarray]:

    """``(eigenvalues, vectors)``: the (k,) top eigenvalues, descending, of the row-weighted
    Gram matrix ``W^1/2 H_w G H_w^T W^1/2`` (``W = diag(weights)``, ``H_w`` the centring on
    the weighted mean, :func:`centre_on_weights_in_place`; with ``diagonal`` b, ``G -
    diag(b)`` for ``G``), and their (n, k) unit eigenvectors, by the
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
    pi = centring_weights(root * root, xp=xp)
    diag = None if diagonal is None else xp.asarray(diagonal, dtype=xp.float64)
    kk = max(1, min(int(k), n - 1))
    max_dim = min(n, max(4 * kk + 2 * block, (1 << 27) // max(n, 1)))

    def product(v: Any) -> Any:
        return root_x * centred_on_weights(lambda t: _gram_product(op, diag, t), pi, root_x * v)

    theta, x, _, _, _ = block_lanczos(product, n, kk, block=block,
                                       tol=tol, seed=seed, xp=xp, max_dim=max_dim, progress=progress,
                                       noise_level=noise_level, noise_residual=noise_residual)
    vectors = np.asarray(to_numpy(x), dtype=np.float64)
    return np.asarray(theta, dtype=np.float64), vectors / np.maximum(np.linalg.norm(vectors, axis=0), 1e-300)


def weighted_coordinates(vectors: Any, eigenvalues: Any, weights: Any, /) -> np.ndarray:
    """The occupancy-weighted MDS coordinates ``X = W^-1/2 U diag(sqrt(max(lambda, 0)))``
    (n, k) from the (n, k) unit eigenvectors ``U`` and (k,) eigenvalues ``lambda`` of the
    weighted Gram matrix ``W^1/2 B_w W^1/2`` (``W = diag(weights)``, positive; ``B_w`` the
    Gram matrix centred on the weighted mean, :func:`centre_on_weights_in_place`): the
    rank-k ``X`` that minimises the weighted strain ``sum_ij w_i w_j (B_w,ij - x_i . x_j)^2``,
    its rows centred on their weighted mean.

    Why: with ``Y = W^1/2 X`` that strain is ``||W^1/2 B_w W^1/2 - Y Y^T||_F^2``, minimised
    by the top-k eigenpairs (Eckart-Young), so the rows of ``X`` are fitted in proportion to
    their weights. With ``weights`` the occupancies over their mean, a position of a few
    tokens, whose distances are mostly sampling noise, barely moves the fit (the unweighted
    P_MDS fits every position alike); its coordinate is then the projection of its row of
    ``B_w`` on the fitted components (``x_i = sum_j B_w,ij w_j x_j / lambda``). These are the
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
    theta, x, resid, applied, converged = block_lanczos(matmat, dim, kk, block=block, tol=tol, seed=seed, xp=xp,
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
