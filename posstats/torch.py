"""``MDSPositionalEmbedding``: an exported MDS position table as a torch module.

This module imports torch; nothing else in ``posstats`` imports this module, so
``import posstats`` never imports torch.

    from posstats.torch import MDSPositionalEmbedding
    pos = MDSPositionalEmbedding.from_file("mds-pos.safetensors")   # frozen by default
    h = pos(token_embeddings)                                         # x + P[:seq]

Additive absolute positions: ``forward(x)`` with ``x`` of shape ``(..., seq, d)`` returns
``x + P[position_ids]`` (``position_ids`` default ``0..seq-1``; no host sync in ``forward``,
so it compiles without graph breaks). The table is either a full ``(n, d)`` parameter
``weight`` (the state dict is an ``nn.Embedding``'s: ``load_state_dict`` works both ways,
and :meth:`MDSPositionalEmbedding.to_embedding` / ``from_embedding`` convert) or, in the low-rank form, ``P = A W^T`` with ``A`` (n x r)
and ``W`` (d x r) parameters (``r(n + d)`` numbers instead of ``n d``). ``freeze=True``
(default) sets ``requires_grad=False`` on them, so an optimiser leaves them alone.

Files (written by :func:`posstats.reports.export.export_encoding`) are read without executing
code: safetensors, ``.npy`` with ``allow_pickle=False``, ``.pt`` with
``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

try:
    import torch
    from torch import nn
except ImportError as exc:  # torch is an optional extra
    msg = "posstats.torch needs PyTorch (pip install torch)"
    raise ImportError(msg) from exc

from safetensors import safe_open

from posstats.errors import InputError, OptionError
from posstats.reports.export import FACTOR_KEYS, LAYOUT_KEYS

__all__ = ["MDSPositionalEmbedding", "read_export"]


def read_export(path: str | os.PathLike, /) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and string metadata of an export file (``.safetensors``, ``.npy``, ``.pt``).

    For ``.npy`` the table is returned under ``position_embeddings`` and the factor files
    ``<stem>.A.npy`` / ``<stem>.W.npy``, when present, under :data:`FACTOR_KEYS`.

    Raises:
        InputError: a missing file, an unknown suffix, or a file that does not parse.
    """
    path = Path(path)
    if not path.is_file():
        msg = f"{path}: no such file"
        raise InputError(msg)
    suffix = path.suffix.lower()
    try:
        if suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as f:
                return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
        if suffix == ".npy":
            stem = path.name[: -len(path.suffix)]
            tensors = {LAYOUT_KEYS["plain"]: torch.from_numpy(np.load(path, allow_pickle=False))}
            for name, part in zip(FACTOR_KEYS, ("A", "W")):
                side = path.with_name(f"{stem}.{part}.npy")
                if side.is_file():
                    tensors[name] = torch.from_numpy(np.load(side, allow_pickle=False))
            return tensors, {}
        if suffix == ".pt":
            obj = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
                msg = f"{path}: expected a dict of tensors"
                raise InputError(msg)
            return {str(k): v for k, v in obj.items()}, {}
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - each reader raises its own kinds
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        msg = f"{path}: not a readable {suffix[1:]} file ({first})"
        raise InputError(msg) from exc
    msg = f"{path}: unknown suffix {path.suffix!r} (expected .safetensors, .npy or .pt)"
    raise InputError(msg)


def _table_key(tensors: dict[str, torch.Tensor], path: Path, key: str | None) -> str:
    if key is not None:
        if key not in tensors:
            msg = f"{path}: no tensor {key!r} (has {', '.join(sorted(tensors)) or 'none'})"
            raise InputError(msg)
        return key
    known = [k for k in LAYOUT_KEYS.values() if k in tensors]
    if len(known) == 1:
        return known[0]
    tables = [k for k, v in tensors.items() if v.ndim == 2 and k not in FACTOR_KEYS]
    if len(tables) == 1:
        return tables[0]
    msg = f"{path}: cannot tell which tensor is the position table ({', '.join(sorted(tables)) or 'none'}); pass key="
    raise InputError(msg)


class MDSPositionalEmbedding(nn.Module):
    """Additive absolute position embeddings from a fixed table or low-rank factors.

    Args:
        weight: (n, d) table; or None with ``factors``.
        factors: ``(A, W)`` with A (n, r), W (d, r); the table is ``A @ W.T``.
        freeze: parameters get ``requires_grad=False`` (default True).
        metadata: string metadata of the file it came from (kept as ``.metadata``).

    Attributes:
        num_positions, embedding_dim, rank (None for a full table), metadata.
    """

    def __init__(
        self,
        weight: torch.Tensor | np.ndarray | None = None,
        *,
        factors: tuple[Any, Any] | None = None,
        freeze: bool = True,
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        if (weight is None) == (factors is None):
            msg = "give exactly one of weight (n, d) or factors (A, W)"
            raise ValueError(msg)
        self.metadata = dict(metadata or {})
        if weight is not None:
            w = torch.as_tensor(weight)
            if w.ndim != 2:
                msg = f"weight must be 2-D (positions, width); got shape {tuple(w.shape)}"
                raise ValueError(msg)
            # registered as "weight": the state dict is an nn.Embedding's ({"weight": (n, d)})
            self.weight = nn.Parameter(w.detach().clone(), requires_grad=not freeze)
            self.A = self.W = None
            self.num_positions, self.embedding_dim = (int(x) for x in w.shape)
            self.rank: int | None = None
        else:
            a, w = (torch.as_tensor(t) for t in factors)  # type: ignore[union-attr]
            if a.ndim != 2 or w.ndim != 2 or a.shape[1] != w.shape[1]:
                msg = f"factors must be A (n, r) and W (d, r); got {tuple(a.shape)} and {tuple(w.shape)}"
                raise ValueError(msg)
            self.A = nn.Parameter(a.detach().clone(), requires_grad=not freeze)
            self.W = nn.Parameter(w.detach().clone(), requires_grad=not freeze)
            self.num_positions, self.embedding_dim = int(a.shape[0]), int(w.shape[0])
            self.rank = int(a.shape[1])

    def __getattr__(self, name: str) -> Any:
        # the low-rank form has no "weight" parameter: its table is A @ W.T, computed on use
        if name == "weight" and "A" in self._parameters and "weight" not in self._parameters:
            return self.A @ self.W.T
        return super().__getattr__(name)

    def embed(self, position_ids: torch.Tensor, /) -> torch.Tensor:
        """Rows of the table for integer ``position_ids`` (any shape) -> (*shape, d).

        Ids on the CPU are range-checked (an ``IndexError`` naming the range); ids on an
        accelerator are not, so that no value is copied back to the host (a sync, and a graph
        break under ``torch.compile``): out-of-range ids fail in the indexing kernel instead."""
        position_ids = torch.as_tensor(position_ids)
        if position_ids.device.type == "cpu" and position_ids.numel() and not torch.compiler.is_compiling():
            low, high = int(position_ids.min()), int(position_ids.max())
            if low < 0 or high >= self.num_positions:
                msg = f"position ids must be in [0, {self.num_positions}); got {low}..{high}"
                raise IndexError(msg)
        if self.rank is None:
            return self.weight[position_ids]
        return self.A[position_ids] @ self.W.T

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """``x + P[position_ids]`` for ``x`` of shape (..., seq, d); ids default 0..seq-1
        (checked against the table's length from the shape alone: no host sync)."""
        if x.shape[-1] != self.embedding_dim:
            msg = f"last dimension of x must be {self.embedding_dim}; got {tuple(x.shape)}"
            raise ValueError(msg)
        if position_ids is None:
            if x.shape[-2] > self.num_positions:
                msg = f"a sequence of {x.shape[-2]} positions is longer than the table's {self.num_positions}"
                raise IndexError(msg)
            position_ids = torch.arange(x.shape[-2], device=x.device)
        return x + self.embed(position_ids).to(dtype=x.dtype, device=x.device)

    def to_embedding(self) -> nn.Embedding:
        """The table as an ``nn.Embedding`` (n, d), with the same ``requires_grad``."""
        table = self.weight.detach().clone()
        emb = nn.Embedding(self.num_positions, self.embedding_dim, _weight=table, _freeze=not self._trainable())
        return emb

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding, /, *, freeze: bool = True) -> MDSPositionalEmbedding:
        """A full-table module from an ``nn.Embedding`` (its state dict loads either way)."""
        return cls(embedding.weight.detach(), freeze=freeze)

    def _trainable(self) -> bool:
        return any(p.requires_grad for p in self.parameters())

    def extra_repr(self) -> str:
        frozen = not self._trainable()
        low = f", rank={self.rank}" if self.rank is not None else ""
        return f"num_positions={self.num_positions}, embedding_dim={self.embedding_dim}{low}, frozen={frozen}"

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike,
        /,
        *,
        key: str | None = None,
        low_rank: bool | None = None,
        freeze: bool = True,
        dtype: torch.dtype | None = None,
    ) -> MDSPositionalEmbedding:
        """Build the module from a file written by ``posstats export``.

        Args:
            path: ``.safetensors``, ``.npy`` or ``.pt``.
            key: the table's tensor name (default: the BERT / GPT-2 / plain name present).
            low_rank: use the factors ``A``, ``W`` (True), the table (False) or the factors
                when the file has them (None).
            freeze: ``requires_grad=False`` on the parameters.
            dtype: cast to this dtype (default: as stored).

        Raises:
            InputError: unreadable file, no table / factors where asked.
        """
        path = Path(path)
        tensors, metadata = read_export(path)
        has_factors = all(k in tensors for k in FACTOR_KEYS)
        if low_rank and not has_factors:
            msg = f"{path}: no low-rank factors ({', '.join(FACTOR_KEYS)}); export with a {{rank}} and {{factors}}"
            raise OptionError(msg)
        cast = (lambda t: t.to(dtype)) if dtype is not None else (lambda t: t)
        if has_factors and low_rank is not False:
            a, w = (cast(tensors[k]) for k in FACTOR_KEYS)
            return cls(factors=(a, w), freeze=freeze, metadata=metadata)
        return cls(cast(tensors[_table_key(tensors, path, key)]), freeze=freeze, metadata=metadata)
