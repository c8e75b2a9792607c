"""Audit a model checkpoint's learned position table against a corpus (THEORY.md 4-6).

The scores are computed here; :mod:`posstats.reports.audit` words them.

:func:`audit_checkpoint` reads a safetensors checkpoint (or a ``.npy`` table) without
executing anything from it (the safetensors header is JSON; ``.npy`` is read with
``allow_pickle=False``; pickled ``.bin`` / ``.pt`` checkpoints are refused), finds the
learned position table, and reports against the corpus geometry of a counts / run folder:

- stress, scaled stress, optimal scale and Pearson correlation of the table's rows
  (positions ``i`` of the corpus -> row ``i``), minimum separation and the monotonicity
  violation rate;
- for reference, the same for the MDS encoding and the sinusoidal encoding at the table's
  width (when the folder is an analysed run);
- the layer-wise *projected stress*: the stress of the rows of ``P M_l`` against d_H, for
  every attention layer found, per head and averaged over heads.

Position table: the unique tensor whose name ends in ``embeddings.position_embeddings.weight``
(BERT, any prefix such as ``bert.``) or is ``wpe.weight`` / ends in ``.wpe.weight``
(GPT-2), or ``key``. Positions of the corpus beyond the table's rows are left out (and
counted in ``notes``).

Projected-stress convention. Attention layers are found by name: BERT
``<prefix>encoder.layer.{l}.attention.self.{query,key}.weight`` (``nn.Linear`` weights,
shape (out, in), so ``q = x W_Q^T``) and GPT-2 ``<prefix>h.{l}.attn.c_attn.weight``
(``Conv1D``, shape (in, 3 out), ``q = x W[:, :d]``). With ``W_Q``, ``W_K`` in the
``nn.Linear`` (out, in) form, the position-position part of the attention logits is
``p_i W_Q^T W_K p_j^T``, so

    M_l = W_Q^T W_K          (in x in; THEORY's ``W_Q W_K^T`` with W as x -> x W)
    M_{l,h} = W_Q[h]^T W_K[h],   W[h] = rows h*dh .. (h+1)*dh of W,   sum_h M_{l,h} = M_l

and the projected encoding is ``P M`` (n x in); its row i dotted with p_j is the logit
position i gives position j. Biases and the ``1/sqrt(dh)`` factor are left out (they do
not change scaled stress; raw stress scales with them). The number of heads comes from
``heads``, else ``num_attention_heads`` / ``n_head`` in a ``config.json`` next to the
checkpoint; without it only whole layers are reported.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from posstats.counting.counts import PositionalCounts
from posstats.counting.io import load_counts
from posstats.errors import InputError, OptionError
from posstats.estimates.noise import corrected_squared_distances
from posstats.estimates.occupancy import OccupancyShrinkage, adjusted
from posstats.geometry.diagnostics import min_separation, monotonicity_of_encoding
from posstats.geometry.encodings import sinusoidal
from posstats.geometry.hellinger import hellinger_sq
from posstats.geometry.stress import projected_stress, stress_report
from posstats.runs.run_folder import RunData, load_run, report_bias, sparse_rows
from posstats.storage.tensors import SafetensorsFile

__all__ = [
    "AuditResult",
    "Checkpoint",
    "audit_checkpoint",
    "find_attention_layers",
    "find_position_key",
]

_BERT_QUERY = re.compile(r"^(?P<prefix>.*?)encoder\.layer\.(?P<layer>\d+)\.attention\.self\.query\.weight$")
_GPT2_CATTN = re.compile(r"^(?P<prefix>(?:.*\.)?)h\.(?P<layer>\d+)\.attn\.c_attn\.weight$")
_POSITION_PATTERNS = (
    re.compile(r"^(?:.*\.)?embeddings\.position_embeddings\.weight$"),  # BERT family
    re.compile(r"^(?:.*\.)?wpe\.weight$"),  # GPT-2
)
_PICKLED = {".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle"}
# safetensors dtype names -> numpy dtypes; BF16 is widened to float32 by hand.


class Checkpoint:
    """Read-only access to the tensors of a safetensors file or a single ``.npy`` array.

    Safetensors through :class:`posstats.storage.tensors.SafetensorsFile` (the library's one reader:
    no code from the file runs; bfloat16 and 8-bit floats widened to float32).
    """

    def __init__(self, path: str | os.PathLike, /) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            msg = f"{self.path}: no such checkpoint file"
            raise InputError(msg)
        suffix = self.path.suffix.lower()
        if suffix in _PICKLED:
            msg = f"{self.path}: pickled checkpoints can execute code and are not read; convert it to safetensors"
            raise InputError(msg)
        self._npy = suffix == ".npy"
        self.metadata: dict[str, str] = {}
        if self._npy:
            try:
                arr = np.load(self.path, mmap_mode="r", allow_pickle=False)
            except Exception as exc:  # noqa: BLE001 - numpy raises several kinds
                msg = f"{self.path}: not a readable .npy array ({_first_line(exc)})"
                raise InputError(msg) from exc
            self._header = {"position_embeddings": {"shape": list(arr.shape), "dtype": arr.dtype.str}}
            return
        self._file = SafetensorsFile(self.path)
        self.metadata = self._file.metadata
        self._header = {k: {"shape": list(self._file.shape(k))} for k in self._file.keys()}

    def keys(self) -> list[str]:
        """Tensor names, in file order."""
        return list(self._header)

    def shape(self, name: str, /) -> tuple[int, ...]:
        """Shape of tensor ``name``."""
        return tuple(int(x) for x in self._header[name]["shape"])

    def get(self, name: str, /) -> np.ndarray:
        """Tensor ``name`` as a numpy array (bfloat16 and 8-bit floats widened to float32)."""
        if name not in self._header:
            msg = f"{self.path}: no tensor {name!r}"
            raise InputError(msg)
        if self._npy:
            return np.load(self.path, allow_pickle=False)
        return self._file.get(name)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def find_position_key(ckpt: Checkpoint, /, *, key: str | None = None) -> str:
    """The name of the learned position table (BERT / GPT-2 names, or ``key``).

    Raises:
        InputError: ``key`` absent or not 2-D; none or several auto-detected candidates.
    """
    if key is not None:
        if key not in ckpt.keys():
            msg = f"{ckpt.path}: no tensor {key!r} ({{key}})"
            raise OptionError(msg)
        if len(ckpt.shape(key)) != 2:
            msg = f"{ckpt.path}: tensor {key!r} has shape {ckpt.shape(key)}, not (positions, width)"
            raise InputError(msg)
        return key
    if len(ckpt.keys()) == 1 and len(ckpt.shape(ckpt.keys()[0])) == 2:
        return ckpt.keys()[0]
    found = [k for k in ckpt.keys() if any(p.match(k) for p in _POSITION_PATTERNS) and len(ckpt.shape(k)) == 2]
    if len(found) == 1:
        return found[0]
    if found:
        msg = f"{ckpt.path}: several position tables ({', '.join(found)}); choose one with {{key}}"
        raise OptionError(msg)
    two_d = [k for k in ckpt.keys() if len(ckpt.shape(k)) == 2][:5]
    msg = (
        f"{ckpt.path}: no position table found (looked for *embeddings.position_embeddings.weight and "
        f"*wpe.weight); pass {{key}} NAME (2-D tensors include: {', '.join(two_d) or 'none'})"
    )
    raise OptionError(msg)


@dataclass(frozen=True)
class AttentionLayer:
    """Where one layer's query / key weights are, and how they are laid out."""

    layer: int
    kind: str  # "bert" (nn.Linear q, k) or "gpt2" (Conv1D c_attn)
    query: str
    key: str  # same as query for gpt2


def find_attention_layers(ckpt: Checkpoint, /) -> list[AttentionLayer]:
    """Attention layers by BERT or GPT-2 naming, ordered by layer index."""
    layers = []
    names = set(ckpt.keys())
    for k in ckpt.keys():
        m = _BERT_QUERY.match(k)
        if m:
            kk = f"{m['prefix']}encoder.layer.{m['layer']}.attention.self.key.weight"
            if kk in names:
                layers.append(AttentionLayer(int(m["layer"]), "bert", k, kk))
            continue
        m = _GPT2_CATTN.match(k)
        if m:
            layers.append(AttentionLayer(int(m["layer"]), "gpt2", k, k))
    return sorted(layers, key=lambda a: a.layer)


def _check_finite(values: np.ndarray, where: str, *, first_row: np.ndarray | None = None) -> None:
    """Raise InputError naming the first NaN / infinite entry of a 2-D tensor (row, column, value)."""
    bad = ~np.isfinite(values)
    if not bad.any():
        return
    r, c = (int(x) for x in np.argwhere(bad)[0])
    row = int(first_row[r]) if first_row is not None else r
    count, total = int(bad.sum()), int(values.size)
    share = f"all {total:,} values" if count == total else f"{count:,} of {total:,} values"
    if first_row is not None:
        share += f" of the {values.shape[0]:,} rows audited"
    msg = (f"{where}: {share} are NaN or infinite (first: row {row}, column {c} = {values[r, c]}); "
           "a damaged or diverged checkpoint cannot be audited")
    raise InputError(msg)


def _qk(ckpt: Checkpoint, layer: AttentionLayer) -> tuple[np.ndarray, np.ndarray]:
    """W_Q, W_K in nn.Linear (out, in) form, float64; non-finite weights are refused."""
    if layer.kind == "bert":
        wq, wk = ckpt.get(layer.query).astype(np.float64), ckpt.get(layer.key).astype(np.float64)
        for name, w in ((layer.query, wq), (layer.key, wk)):
            if w.ndim == 2:
                _check_finite(w, f"{ckpt.path}: {name}")
        return wq, wk
    w = ckpt.get(layer.query).astype(np.float64)  # Conv1D: (in, 3 * out), x @ w
    if w.ndim == 2:
        _check_finite(w, f"{ckpt.path}: {layer.query}")
    if w.ndim != 2 or w.shape[1] % 3:
        msg = f"{ckpt.path}: {layer.query} has shape {w.shape}, expected (in, 3 * out)"
        raise InputError(msg)
    out = w.shape[1] // 3
    return w[:, :out].T, w[:, out : 2 * out].T


def _scores(matrix: np.ndarray, distances: np.ndarray, positions: np.ndarray, *, seed: int, exact_limit: int) -> dict[str, Any]:
    s = stress_report(matrix, distances)
    sep = min_separation(matrix)
    mono = monotonicity_of_encoding(matrix, positions=positions, exact_limit=exact_limit, seed=seed)
    return {
        "stress": float(s.stress),
        "scaled_stress": float(s.scaled_stress),
        "scale": float(s.scale),
        "pearson": float(s.pearson),
        "min_separation": float(sep.value),
        "min_separation_pair": [int(positions[sep.pair[0]]), int(positions[sep.pair[1]])],
        "monotonicity_violation_rate": float(mono.rate),
        "monotonicity_method": mono.method,
        "monotonicity_ci95": [mono.ci_low, mono.ci_high],
    }


def _model_config(ckpt_path: Path) -> dict[str, Any]:
    """The ``config.json`` beside a checkpoint ({} when absent or unreadable)."""
    cfg = ckpt_path.parent / "config.json"
    try:
        data = json.loads(cfg.read_text()) if cfg.is_file() else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def resolve_checkpoint(path: str | os.PathLike, /) -> Path:
    """A checkpoint file, or the weights of a model folder (``model.safetensors``, else its
    one ``*.safetensors`` file).

    Raises:
        InputError: a folder without safetensors weights, or with several and no model.safetensors.
    """
    p = Path(path)
    if not p.is_dir():
        return p
    if (p / "model.safetensors").is_file():
        return p / "model.safetensors"
    found = sorted(p.glob("*.safetensors"))
    if len(found) == 1:
        return found[0]
    if not found:
        msg = f"{p}: a model folder without safetensors weights (pickled .bin files are not read)"
    else:
        msg = f"{p}: several safetensors files ({', '.join(f.name for f in found[:4])}) and no model.safetensors; name one"
    raise InputError(msg)


# model types whose position ids start after the padding index (fairseq convention)
_PADDING_OFFSET_MODELS = ("roberta", "xlm-roberta", "camembert", "longformer", "bart", "mbart")


def auto_offset(key: str, excluded: Sequence[int], config: dict[str, Any], /) -> tuple[int, str]:
    """Which table row corpus position 0 is, and why: a BERT-style model puts [CLS] at row 0,
    so counts without the special tokens start at row 1; RoBERTa-style models number
    positions from ``pad_token_id + 1``; GPT-2 puts the first token at row 0."""
    model_type = str(config.get("model_type", ""))
    skipped = 1 if excluded else 0
    why = (f"the counts excluded the special tokens ({', '.join(map(str, list(excluded)[:6]))}{' ...' if len(excluded) > 6 else ''}) "
           "that the model puts first" if excluded else "the counts kept the special tokens at their positions")
    if model_type in _PADDING_OFFSET_MODELS and isinstance(config.get("pad_token_id"), int):
        first = int(config["pad_token_id"]) + 1
        return first + skipped, f"{model_type} numbers positions from pad_token_id + 1 = {first}, and {why}"
    if key.endswith("embeddings.position_embeddings.weight") or model_type in ("bert", "distilbert", "electra"):
        return skipped, f"a BERT-style model puts [CLS] at row 0, and {why}"
    return 0, "the first token is at row 0 (GPT-2 style)"


def _heads_from_config(ckpt_path: Path) -> int | None:
    data = _model_config(ckpt_path)
    for name in ("num_attention_heads", "n_head", "num_heads"):
        if isinstance(data.get(name), int) and data[name] > 0:
            return int(data[name])
    return None


@dataclass(frozen=True)
class _Corpus:
    """The corpus side of an audit: its counts, the positions to audit and, for an analysed
    run folder, the run (its MDS encoding is a reference)."""

    counts: PositionalCounts
    positions: np.ndarray
    run: RunData | None
    path: str


def _load_corpus(counts: str | os.PathLike, /, *, min_occupancy: int | None) -> tuple[_Corpus, list[str]]:
    """The corpus of a run folder (its used positions) or of a counts folder / file (positions
    with ``occ >= min_occupancy``, default 1), and the notes that go with it.

    Raises:
        InputError: ``counts`` does not exist.
    """
    cdir = Path(counts)
    if cdir.is_dir() and (cdir / "report.json").is_file() and (cdir / "mds.safetensors").is_file():
        run = load_run(cdir)
        notes = ["--min-occupancy ignored: the run folder's used positions are audited"] if min_occupancy is not None else []
        return _Corpus(load_counts(run.counts_path()), run.positions, run, str(run.counts_path())), notes
    if not cdir.exists():
        msg = f"{cdir}: no such counts or run folder"
        raise InputError(msg)
    counts_obj = load_counts(cdir)
    notes = ["plug-in distances, sampling noise included: a counts folder has no noise floor "
             "(audit the analysed run folder for its bias-corrected distances)"]
    return _Corpus(counts_obj, counts_obj.occupied_positions(min_occupancy=min_occupancy or 1), None, str(cdir)), notes


def _positions_in_table(positions: np.ndarray, n_rows: int, offset: int, checkpoint: str | os.PathLike,
                        ) -> tuple[np.ndarray, list[str]]:
    """The (m,) corpus positions ``i`` whose table row ``i + offset`` exists, and a note on
    those left out.

    Raises:
        InputError: a negative ``offset``; fewer than two positions left.
    """
    if offset < 0:
        msg = f"{{offset}} must be >= 0; got {offset}"
        raise OptionError(msg)
    inside = positions + offset < n_rows
    notes = [] if inside.all() else [
        f"{int((~inside).sum())} corpus position(s) beyond the table's {n_rows} rows (offset {offset}) left out"]
    positions = positions[inside]
    if positions.size < 2:
        msg = f"{checkpoint}: fewer than two corpus positions fall within the table's {n_rows} rows (offset {offset})"
        raise InputError(msg)
    return positions, notes


def _corpus_distances(counts: PositionalCounts, positions: np.ndarray, run: RunData | None, /) -> np.ndarray:
    """(m, m) float64 Hellinger distances d_H = sqrt(hellinger_sq) between the count rows
    of ``positions``: bias-corrected with the run's noise floor when the run's report used
    bias-corrected distances (the report's one matrix; the occupancy shrinkage of the run's
    used rows removed first when it was, :mod:`posstats.estimates.occupancy`), else plug-in."""
    rows = sparse_rows(counts.rows(positions))
    d2 = np.asarray(hellinger_sq(rows), dtype=np.float64)
    if run is not None and (run.report.get("geometry") or {}).get("distances") == "bias_corrected":
        if (run.report.get("hellinger") or {}).get("occupancy_adjusted"):
            every = sparse_rows(counts.rows(run.positions))  # the analysis' pool and occupancies
            adjusted(d2, rows, shrinkage=OccupancyShrinkage.from_totals(every.sum(axis=1), every.sum(axis=0)))
        d2 = corrected_squared_distances(d2, report_bias(run.report, positions))
    return np.sqrt(d2)


def _reference_scores(run: RunData, positions: np.ndarray, distances: np.ndarray, *, width: int, seed: int,
                      exact_limit: int) -> list[dict[str, Any]]:
    """Scores of the run's MDS encoding (its first ``width`` coordinates, zero-padded to
    ``width``) and, for an even ``width``, of the sinusoidal encoding, on ``positions``."""
    keep = np.isin(run.positions, positions)
    mds_rows = run.encoding[keep]
    k = min(width, mds_rows.shape[1])
    mds_matrix = np.zeros((mds_rows.shape[0], width))
    mds_matrix[:, :k] = mds_rows[:, :k]
    references = [{"name": "mds", "dim": width,
                   **_scores(mds_matrix, distances, positions, seed=seed, exact_limit=exact_limit)}]
    if width % 2 == 0:
        sin = sinusoidal(positions, width)
        references.append({"name": "sinusoidal", "dim": width,
                           **_scores(sin, distances, positions, seed=seed, exact_limit=exact_limit)})
    return references


def _layer_scores(ckpt: Checkpoint, rows: np.ndarray, distances: np.ndarray, *,
                  heads: int | None) -> tuple[list[dict[str, Any]], list[str]]:
    """The projected stress (:func:`projected_stress`) of every attention layer found,
    with ``layer``, ``query`` and ``key`` names, and notes on what could not be done."""
    found = find_attention_layers(ckpt)
    notes = [] if found else ["no attention layers found (BERT or GPT-2 naming): no projected stress"]
    layer_rows = []
    for lay in found:
        wq, wk = _qk(ckpt, lay)
        layer_rows.append({"layer": lay.layer, "query": lay.query, "key": lay.key,
                           **projected_stress(rows, wq, wk, distances, heads=heads)})
    if found and heads is None:
        notes.append("number of heads unknown (no config.json, no --heads): whole layers only")
    return layer_rows, notes


@dataclass(frozen=True)
class AuditResult:
    """Everything :func:`audit_checkpoint` measured (``to_dict()`` is JSON-ready).

    Attributes:
        checkpoint: the file audited; key: the position table's name;
        table_shape: its shape; positions: (m,) corpus positions audited (rows of the table);
        encoding: stress / scaled stress / scale / pearson / min separation / monotonicity
            of the table's rows;
        references: the same for ``mds`` and ``sinusoidal`` at the table's width (may be empty);
        layers: one dict per attention layer (see :func:`projected_stress`) with ``layer``;
        heads: heads per layer used (None: layers only); notes: caveats in words;
        offset: corpus position i was compared with table row i + offset.
    """

    checkpoint: str
    key: str
    table_shape: tuple[int, int]
    positions: np.ndarray
    encoding: dict[str, Any]
    references: list[dict[str, Any]]
    layers: list[dict[str, Any]]
    heads: int | None
    corpus: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    offset: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plain values."""
        p = self.positions
        return {
            "checkpoint": self.checkpoint,
            "key": self.key,
            "table_shape": list(self.table_shape),
            "positions": {"count": int(p.size), "first": int(p[0]), "last": int(p[-1]), "row_offset": self.offset},
            "corpus": self.corpus,
            "encoding": self.encoding,
            "references": self.references,
            "projection": "P M_l with M_l = W_Q^T W_K (nn.Linear (out, in) weights), per head M_lh = W_Q[h]^T W_K[h]",
            "heads": self.heads,
            "layers": self.layers,
            "notes": self.notes,
        }


def audit_checkpoint(
    checkpoint: str | os.PathLike,
    counts: str | os.PathLike,
    /,
    *,
    key: str | None = None,
    heads: int | None = None,
    min_occupancy: int | None = None,
    offset: int | str = "auto",
    layers: bool = True,
    seed: int = 0,
    exact_limit: int = 4096,
) -> AuditResult:
    """Audit the learned position table of ``checkpoint`` against the corpus of ``counts``.

    Args:
        checkpoint: ``.safetensors`` checkpoint, ``.npy`` (n, d) table, or a model folder
            (its ``model.safetensors`` and ``config.json``).
        counts: a run folder (``posstats run`` / ``analyze``: its used positions and counts)
            or a counts folder / file (``posstats count``: positions with
            ``occ >= min_occupancy``).
        key: the position table's name (default: auto-detected).
        heads: heads per attention layer (default: from ``config.json`` beside the
            checkpoint; None there: whole layers only).
        min_occupancy: for a counts folder (default 1); a run folder's own threshold wins.
        offset: corpus position i is compared with table row ``i + offset``; ``"auto"``
            (default) decides from the model and the counts' exclusions (:func:`auto_offset`:
            1 for a BERT checkpoint against counts without [CLS], which the model puts at
            row 0) and the result's notes say which and why.
        layers: compute the layer-wise projected stress.
        seed, exact_limit: monotonicity sampling (see posstats.geometry.diagnostics).

    Raises:
        InputError: unreadable / pickled checkpoint, no position table, no counts, fewer
            than two corpus positions within the table.
    """
    ckpt = Checkpoint(resolve_checkpoint(checkpoint))
    name = find_position_key(ckpt, key=key)
    table = ckpt.get(name).astype(np.float64)
    n_rows, width = table.shape
    corpus, notes = _load_corpus(counts, min_occupancy=min_occupancy)
    if offset == "auto":
        offset, why = auto_offset(name, corpus.counts.spec.exclude_ids, _model_config(ckpt.path))
        notes = [*notes, f"offset {offset} (auto): corpus position i is table row i + {offset}: {why}"]
    elif isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
        msg = f"offset must be 'auto' or an integer >= 0; got {offset!r}"
        raise InputError(msg)
    positions, left_out = _positions_in_table(corpus.positions, n_rows, offset, checkpoint)
    distances = _corpus_distances(corpus.counts, positions, corpus.run)
    rows = table[positions + offset]
    _check_finite(rows, f"{checkpoint}: position table {name!r}", first_row=positions + offset)
    result_encoding = _scores(rows, distances, positions, seed=seed, exact_limit=exact_limit)
    references = [] if corpus.run is None else _reference_scores(corpus.run, positions, distances, width=width,
                                                                 seed=seed, exact_limit=exact_limit)
    if heads is None:
        heads = _heads_from_config(ckpt.path)
    layer_rows, layer_notes = _layer_scores(ckpt, rows, distances, heads=heads) if layers else ([], [])
    corpus_info = {
        "counts": corpus.path,
        "fingerprint": corpus.counts.fingerprint,
        "positions_used": int(positions.size),
        "tokenizer_hash": corpus.counts.metadata.get("tokenizer_hash", ""),
    }
    return AuditResult(str(checkpoint), name, (int(n_rows), int(width)), positions, result_encoding, references,
                       layer_rows, heads, corpus_info, notes + left_out + layer_notes, offset)
