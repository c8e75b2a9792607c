"""``scipy.sparse``, imported on first use: ``from posstats.counting.scipy_sparse import sp``;
and :func:`csr_rows_view`, a block of a CSR matrix's rows without a copy.

Importing ``scipy.sparse`` takes about 0.12 s (numpy.f2py included, which scipy's array-API
layer pulls in): a sixth of ``posstats count`` on 20 M tokens at n = 4096, whose sparse
kernel and file writer never touch it (they hold 16-bit blocks, :mod:`posstats.counting.blocks`).
The counting modules use this stand-in instead of the module; the first attribute read
imports ``scipy.sparse`` (under the import system's lock, so threads may race for it)
and keeps the attribute, so later reads cost what a module attribute costs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["csr_rows_view", "sp"]


class _ScipySparse:
    """Stands for the ``scipy.sparse`` module; imports it at the first attribute read."""

    def __getattr__(self, name: str) -> Any:
        import scipy.sparse

        value = getattr(scipy.sparse, name)
        setattr(self, name, value)  # found as a plain attribute from now on
        return value


sp = _ScipySparse()


def csr_rows_view(m: Any, a: int, b: int, /) -> Any:
    """Rows ``a .. b - 1`` of the canonical CSR ``m`` as a CSR array sharing ``m``'s data
    and indices (only the (b - a + 1,) row pointers are new).

    ``m[a:b]`` copies every stored entry of the block through scipy's generic submatrix
    routine (6 s for the two halves of 1.3e8 entries at n = 131,072), and scipy's
    constructor copies an array that is a view of less than half its base, so the arrays
    are set on an empty array instead. Write to the view only where writing to ``m`` is
    meant.

    >>> import numpy as np
    >>> import scipy.sparse
    >>> m = scipy.sparse.csr_array([[1, 0], [0, 2], [3, 4]])
    >>> v = csr_rows_view(m, 1, 3)
    >>> v.toarray().tolist(), np.shares_memory(v.data, m.data)
    ([[0, 2], [3, 4]], True)
    """
    lo, hi = int(m.indptr[a]), int(m.indptr[b])
    out = sp.csr_array((b - a, m.shape[1]), dtype=m.data.dtype)
    out.data, out.indices = m.data[lo:hi], m.indices[lo:hi]
    out.indptr = (m.indptr[a : b + 1] - lo).astype(m.indptr.dtype, copy=False)
    return out
