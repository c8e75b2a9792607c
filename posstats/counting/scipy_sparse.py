"""``scipy.sparse``, imported on first use: ``from posstats.counting.scipy_sparse import sp``.

Importing ``scipy.sparse`` takes about 0.12 s (numpy.f2py included, which scipy's array-API
layer pulls in): a sixth of ``posstats count`` on 20 M tokens at n = 4096, whose sparse
kernel and file writer never touch it (they hold 16-bit blocks, :mod:`posstats.counting.blocks`).
The counting modules use this stand-in instead of the module; the first attribute read
imports ``scipy.sparse`` (under the import system's lock, so threads may race for it)
and keeps the attribute, so later reads cost what a module attribute costs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["sp"]


class _ScipySparse:
    """Stands for the ``scipy.sparse`` module; imports it at the first attribute read."""

    def __getattr__(self, name: str) -> Any:
        import scipy.sparse

        value = getattr(scipy.sparse, name)
        setattr(self, name, value)  # found as a plain attribute from now on
        return value


sp = _ScipySparse()
