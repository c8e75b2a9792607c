"""The one safetensors reader for model tensors: header parsed here, no code run, every
dtype a checkpoint holds returned as numpy (bfloat16 and the 8-bit floats widened to float32).

numpy has no bfloat16 or float8: a bfloat16 is the high half of a float32 (shifted into
place); ``F8_E4M3`` (torch's ``float8_e4m3fn``: bias 7, no infinities, NaN = all ones) and
``F8_E5M2`` (bias 15, IEEE-like with infinities) are decoded through a 256-entry table.
Used by the ``learned:`` encoding and by the audit, so both accept and reject the same files.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from posstats.errors import InputError

__all__ = ["DTYPES", "SafetensorsFile", "float8_table"]

DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}
_MAX_HEADER = 100 * 2**20


def float8_table(kind: str, /) -> np.ndarray:
    """(256,) float32: the value of every byte of an 8-bit float (``F8_E4M3`` or ``F8_E5M2``).

    >>> float(float8_table("F8_E4M3")[0x38]), float(float8_table("F8_E5M2")[0x3C])
    (1.0, 1.0)
    """
    exp_bits, man_bits, bias = {"F8_E4M3": (4, 3, 7), "F8_E5M2": (5, 2, 15)}[kind]
    byte = np.arange(256)
    sign = np.where(byte >> 7, -1.0, 1.0)
    exponent = (byte >> man_bits) & ((1 << exp_bits) - 1)
    mantissa = byte & ((1 << man_bits) - 1)
    scale = float(1 << man_bits)
    value = np.where(exponent == 0, mantissa / scale * 2.0 ** (1 - bias), (1 + mantissa / scale) * 2.0 ** (exponent - bias))
    top = exponent == (1 << exp_bits) - 1
    if kind == "F8_E4M3":
        value = np.where(top & (mantissa == (1 << man_bits) - 1), np.nan, value)  # no infinities
    else:
        value = np.where(top, np.where(mantissa == 0, np.inf, np.nan), value)
    return (sign * value).astype(np.float32)


_ITEM_BYTES = {**{k: np.dtype(v).itemsize for k, v in DTYPES.items()}, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}


def _check_entry(name: str, entry: Any, /, *, data_bytes: int) -> None:
    """A header entry must describe bytes that exist: a known dtype, a shape of
    non-negative integers, and ``0 <= begin <= end <= data_bytes`` offsets spanning exactly
    ``prod(shape) * itemsize`` bytes (a forged header otherwise reads past the file or
    reshapes the wrong number of values).

    Raises:
        ValueError: what is wrong, naming the tensor.
    """
    if not isinstance(entry, dict):
        raise ValueError(f"tensor {name!r}: its header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in _ITEM_BYTES:
        raise ValueError(f"tensor {name!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape):
        raise ValueError(f"tensor {name!r}: shape {shape!r} is not a list of non-negative integers")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in offsets)):
        raise ValueError(f"tensor {name!r}: data_offsets {offsets!r} are not two integers")
    begin, end = offsets
    if not 0 <= begin <= end <= data_bytes:
        raise ValueError(f"tensor {name!r}: data_offsets {offsets!r} lie outside the {data_bytes} data bytes")
    need = _ITEM_BYTES[dtype] * int(np.prod(shape, dtype=object))
    if end - begin != need:
        raise ValueError(f"tensor {name!r}: shape {shape} of {dtype} needs {need} bytes, its offsets span {end - begin}")


class SafetensorsFile:
    """Read-only access to the tensors of one safetensors file.

    Raises (on opening):
        InputError: a missing file, or one whose header does not parse.
    """

    def __init__(self, path: str | os.PathLike[str], /) -> None:
        self.path = Path(path)
        if not self.path.exists():
            msg = f"{self.path}: no such file"
            raise InputError(msg)
        if not self.path.is_file():
            msg = f"{self.path}: not a regular file (a folder, FIFO, device or socket); give a safetensors file"
            raise InputError(msg)
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as fh:
                (length,) = struct.unpack("<Q", fh.read(8))
                if length > min(_MAX_HEADER, size - 8):
                    raise ValueError(f"header length {length} is implausible for a file of {size} bytes")
                header = json.loads(fh.read(length))
            if not isinstance(header, dict):
                raise ValueError("the header is not a JSON object")
            metadata = header.pop("__metadata__", None) or {}
            if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
                raise ValueError("__metadata__ must map names to strings")
            for name, entry in header.items():
                _check_entry(name, entry, data_bytes=size - 8 - length)
        except Exception as exc:  # noqa: BLE001 - struct, json, recursion and OS errors alike mean a bad file
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            msg = f"{self.path}: not a readable safetensors file ({text[:300]})"
            raise InputError(msg) from None
        self.metadata: dict[str, str] = dict(metadata)
        self._header: dict[str, Any] = header
        self._data_start = 8 + length

    def keys(self) -> list[str]:
        """Tensor names, in file order."""
        return list(self._header)

    def shape(self, name: str, /) -> tuple[int, ...]:
        """Shape of tensor ``name``."""
        return tuple(int(x) for x in self._entry(name)["shape"])

    def dtype(self, name: str, /) -> str:
        """The safetensors dtype string of tensor ``name`` (``F32``, ``BF16``, ``F8_E4M3``, ...)."""
        return str(self._entry(name)["dtype"])

    def _entry(self, name: str) -> dict[str, Any]:
        if name not in self._header:
            msg = f"{self.path}: no tensor {name!r}"
            raise InputError(msg)
        return self._header[name]

    def get(self, name: str, /) -> np.ndarray:
        """Tensor ``name`` as a numpy array (bfloat16 and 8-bit floats widened to float32).

        Raises:
            InputError: an unknown tensor, or a dtype numpy cannot hold (named).
        """
        info = self._entry(name)
        start, end = (int(x) for x in info["data_offsets"])
        with open(self.path, "rb") as fh:
            fh.seek(self._data_start + start)
            raw = fh.read(end - start)
        dt, shape = info["dtype"], self.shape(name)
        if dt == "BF16":
            return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
        if dt in ("F8_E4M3", "F8_E5M2"):
            return float8_table(dt)[np.frombuffer(raw, dtype=np.uint8)].reshape(shape)
        if dt not in DTYPES:
            msg = f"{self.path}: tensor {name!r} has dtype {dt}, which posstats cannot read"
            raise InputError(msg)
        return np.frombuffer(raw, dtype=DTYPES[dt]).reshape(shape).copy()
