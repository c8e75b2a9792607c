"""Sparse products on threads: a CSR matrix in row blocks of equal stored entries, one
shared thread pool (fork-safe), wide blocks multiplied in cache-sized column chunks.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

__all__ = ["blocks_t_times", "blocks_times", "product_threads", "thread_map", "thread_pool"]


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
