"""The model an export is for, read from its Hugging Face folder: rows, width, key layout and
prefix, and the size of its own position table's rows.

``posstats export --for-model PATH`` fills the export's options from what a transformers
model folder (or its ``config.json``) says, so that the table loads into that model with a
strict key check:

=================  ================================  ==========================================
option             BERT (``model_type`` bert)        GPT-2 (``model_type`` gpt2)
=================  ================================  ==========================================
rows               ``max_position_embeddings``       ``n_positions``
width ``--dim``    ``hidden_size``                   ``n_embd``
layout / key       ``embeddings.position_embeddings  ``wpe.weight``
                   .weight``
prefix             ``bert.`` unless ``architectures``  ``transformer.`` unless ``architectures``
                   is ``BertModel``                  is ``GPT2Model``
=================  ================================  ==========================================

Other model types are refused with a one-line message (RoBERTa-style tables, for example,
offset positions by the padding index, which a plain table cannot express). When the folder
holds the model's weights (``model.safetensors``), :attr:`ModelTarget.row_norm` is the mean
L2 norm of the rows of the model's own position table (``--match-norm`` scales the export's
rows to it: MiniLM's learned rows have norm 0.47 where an unscaled MDS table's are 0.35).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from posstats.errors import InputError

__all__ = ["ModelTarget", "model_target"]

_LAYOUTS = {
    # model_type: (layout, key, rows field, width field, the bare-model architecture, head prefix)
    "bert": ("bert", "embeddings.position_embeddings.weight", "max_position_embeddings", "hidden_size", "BertModel", "bert."),
    "gpt2": ("gpt2", "wpe.weight", "n_positions", "n_embd", "GPT2Model", "transformer."),
}


@dataclass(frozen=True)
class ModelTarget:
    """What the export needs to know about the model it is for.

    Attributes:
        name: the model's name (``_name_or_path``) or folder.
        model_type: ``bert`` or ``gpt2``.
        rows: the positions the model has (its table's rows).
        dim: its width (its table's columns).
        layout: ``bert`` or ``gpt2`` (the key convention of :func:`posstats.reports.export.export_run`).
        prefix: the module the key sits under (``bert.``, ``transformer.`` or empty).
        key: the full key of the position table in the model's state dict.
        row_norm: mean L2 norm of the rows of the model's own table, or None without weights.
    """

    name: str
    model_type: str
    rows: int
    dim: int
    layout: str
    prefix: str
    key: str
    row_norm: float | None


def _read_config(path: Path) -> tuple[dict[str, Any], Path]:
    """(config, folder) of a model folder or a ``config.json``."""
    config_file = path / "config.json" if path.is_dir() else path
    if not config_file.is_file():
        msg = f"{path}: no config.json (give a transformers model folder or its config.json)"
        raise InputError(msg)
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        msg = f"{config_file}: not a readable config.json ({exc})"
        raise InputError(msg) from exc
    if not isinstance(config, dict):
        msg = f"{config_file}: a config.json holds a JSON object, got {type(config).__name__}"
        raise InputError(msg)
    return config, config_file.parent


def _positive_int(config: dict[str, Any], field: str, where: Path) -> int:
    value = config.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"{where}: {field} must be a positive integer, got {value!r}"
        raise InputError(msg)
    return value


def _row_norm(folder: Path, keys: tuple[str, ...]) -> float | None:
    """Mean row norm of the first of ``keys`` found in ``folder/model.safetensors``."""
    weights = folder / "model.safetensors"
    if not weights.is_file():
        return None
    with safe_open(str(weights), framework="numpy") as f:
        names = set(f.keys())
        for key in keys:
            if key in names:
                table = np.asarray(f.get_tensor(key), dtype=np.float64)
                return float(np.linalg.norm(table, axis=1).mean())
    return None


def model_target(path: str | os.PathLike[str], /) -> ModelTarget:
    """Read the model an export is for from a transformers folder or ``config.json``
    (module docstring).

    Raises:
        InputError: no or an unreadable ``config.json``, an unsupported ``model_type``, or
            a rows / width field that is not a positive integer.
    """
    config, folder = _read_config(Path(path))
    model_type = config.get("model_type")
    if model_type not in _LAYOUTS:
        msg = (f"{path}: model_type {model_type!r} is not supported by --for-model (supported: "
               f"{', '.join(sorted(_LAYOUTS))}); give --dim, --rows, --layout and --prefix instead")
        raise InputError(msg)
    layout, key, rows_field, width_field, bare, head_prefix = _LAYOUTS[model_type]
    where = folder / "config.json"
    rows = _positive_int(config, rows_field, where)
    dim = _positive_int(config, width_field, where)
    architectures = config.get("architectures") or []
    prefix = "" if (not architectures or bare in architectures) else head_prefix
    norm = _row_norm(folder, (prefix + key, key, head_prefix + key))
    name = str(config.get("_name_or_path") or folder.name)
    return ModelTarget(name, model_type, rows, dim, layout, prefix, prefix + key, norm)
