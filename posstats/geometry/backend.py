"""Array backends: one code path for numpy and cupy.

cupy is imported lazily and only here, so ``import posstats`` never needs a GPU.
Kernels call :func:`array_namespace` on their inputs (``xp=None`` means "infer"),
so outputs stay on the input's device.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import numpy as np

__all__ = ["array_namespace", "get_cupy", "get_cupy_sparse", "gpu_available", "to_numpy"]


def _is_cupy_array(x: Any) -> bool:
    # Checked by module name so that cupy is never imported just to ask.
    return type(x).__module__.split(".", 1)[0] == "cupy"


def array_namespace(*arrays: Any) -> types.ModuleType:
    """Return ``cupy`` if any argument is a cupy array, else ``numpy``.

    Non-array arguments (scalars, None, scipy sparse matrices) are ignored.
    """
    if any(_is_cupy_array(a) for a in arrays):
        return get_cupy()
    return np


def get_cupy() -> types.ModuleType:
    """Import and return cupy, or raise ImportError naming the extra to install."""
    try:
        import cupy
    except ImportError as exc:  # the message is the point: say how to fix it
        msg = "cupy is not installed; install the GPU extra: pip install 'posstats[gpu]'"
        raise ImportError(msg) from exc
    return cupy


def get_cupy_sparse() -> types.ModuleType:
    """Import and return ``cupyx.scipy.sparse`` (CSR matrices on the GPU)."""
    get_cupy()  # the same message when cupy is missing
    import cupyx.scipy.sparse

    return cupyx.scipy.sparse


@functools.cache
def gpu_available() -> bool:
    """True when cupy imports and at least one CUDA device answers."""
    try:
        cp = get_cupy()
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - any failure means "no usable GPU"
        return False


def to_numpy(x: Any, /) -> np.ndarray:
    """Return ``x`` as a numpy array (copies from the GPU when ``x`` is a cupy array)."""
    if _is_cupy_array(x):
        return x.get()
    return np.asarray(x)
