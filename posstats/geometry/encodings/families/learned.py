"""Learned position tables read from a checkpoint (``learned:PATH[:key=NAME]``): BERT's,
GPT-2's, or any 2-D table in a .safetensors or .npy file."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from posstats.errors import InputError
from posstats.geometry.encodings.catalog import (
    REQUIRED,
    Family,
    Param,
    as_positions,
    check_dim,
    pad_columns,
    register,
    str_param,
)
from posstats.storage.tensors import SafetensorsFile

__all__ = ["LEARNED_KEYS", "learned"]

# Position-embedding tensors of common checkpoints (BERT / RoBERTa, GPT-2, generic), tried
# in this order, each as the whole key or as its dotted suffix ("bert." + ..., "transformer." + ...).
LEARNED_KEYS = ("embeddings.position_embeddings.weight", "wpe.weight", "position_embeddings.weight")


def _find_learned_key(path: str, keys: list[str]) -> str:
    for candidate in LEARNED_KEYS:
        if candidate in keys:
            return candidate
        matches = [k for k in keys if k.endswith("." + candidate)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            msg = f"{path}: several position-embedding tensors match {candidate!r}: {', '.join(sorted(matches))}; choose one with :key=NAME"
            raise InputError(msg)
    shown = ", ".join(sorted(keys)[:8]) + (", ..." if len(keys) > 8 else "")
    msg = f"{path}: no position-embedding tensor found (looked for {', '.join(LEARNED_KEYS)}); keys: {shown}; choose one with :key=NAME"
    raise InputError(msg)


def _load_table(path: str, key: str | None) -> tuple[np.ndarray, str]:
    """The matrix stored in ``path`` (.npy or .safetensors) and a label naming it."""
    if not os.path.isfile(path):
        msg = f"{path}: no such file"
        raise InputError(msg)
    lower = path.lower()
    if lower.endswith(".npy"):
        if key is not None:
            msg = f"{path}: a .npy file holds one array; key={key!r} applies only to safetensors"
            raise InputError(msg)
        try:
            table = np.load(path, allow_pickle=False, mmap_mode="r")
        except Exception as exc:  # noqa: BLE001 - any failure here is a bad file
            msg = f"{path}: not a readable .npy array ({exc})"
            raise InputError(msg) from exc
        return table, path
    if lower.endswith(".safetensors"):
        file = SafetensorsFile(path)  # one header parse for the keys and the tensor
        keys = file.keys()
        if key is None:
            key = _find_learned_key(path, keys)
        elif key not in keys:
            shown = ", ".join(sorted(keys)[:8]) + (", ..." if len(keys) > 8 else "")
            msg = f"{path}: no tensor named {key!r}; keys: {shown}"
            raise InputError(msg)
        return file.get(key), f"{path} [{key}]"
    msg = f"{path}: unsupported file type (expected .safetensors or .npy)"
    raise InputError(msg)


def learned(positions: Any, /, dim: int, *, path: str | os.PathLike[str], key: str | None = None) -> np.ndarray:
    """A learned position-embedding table read from a checkpoint, float64 (len(positions) x dim).

    ``path`` is a ``.safetensors`` file (tensor ``key``; when None, the first of
    :data:`LEARNED_KEYS` present, as the whole key or a dotted suffix) or a ``.npy`` file
    (read with ``allow_pickle=False``). Row r is the table's row ``positions[r]`` (no offset
    is applied: tables that reserve leading rows, like BART's, need shifted positions); the
    first ``dim`` columns are kept, or zeros appended when the table is narrower.

    Raises:
        InputError: missing or unreadable file, unknown or ambiguous key, a table that is not
            2-D, or positions beyond the table's rows (the message names file, key, shape).
    """
    dim = check_dim(dim, "learned")
    path = os.fspath(path)
    table, label = _load_table(path, key)
    if table.ndim != 2:
        msg = f"{label}: expected a 2-D (positions x dim) table, got shape {tuple(table.shape)}"
        raise InputError(msg)
    pos = as_positions(positions)
    if pos.size and int(pos.max()) >= table.shape[0]:
        msg = f"{label}: shape {tuple(table.shape)} has {table.shape[0]} positions, but position {int(pos.max())} was asked for"
        raise InputError(msg)
    if not np.issubdtype(table.dtype, np.number) or np.iscomplexobj(table):
        msg = f"{label}: expected a real numeric table, got dtype {table.dtype}"
        raise InputError(msg)
    return pad_columns(np.asarray(table[pos], dtype=np.float64), dim)


register(Family("learned", (Param("path", str_param, REQUIRED), Param("key", str_param, None)), order=90,
                build=lambda s, pos, dim, _: learned(pos, dim, path=s.params["path"], key=s.params["key"])))
