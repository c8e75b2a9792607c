"""Export a run's MDS encoding as a position table a model can load (THEORY.md section 3).

A run folder (``posstats run`` / ``posstats analyze``) holds ``mds.safetensors`` with the
MDS coordinates ``P_MDS`` of the *used* positions (tensor ``positions``). A model needs a
row for every position ``0..n-1``, so :func:`export_encoding` exports only when the used
positions are exactly ``0..m-1`` (contiguous from 0). Anything else (an unoccupied
position, or one left out by ``--min-occupancy``) is refused with an error naming the
first gap: filling it with zeros would make it collide with the centroid of the geometry
(zero separation from whatever lies there), and copying a neighbour would make two
positions indistinguishable. Re-run the analysis with ``--positions G`` (G = the first
gap: a shorter context) or a lower ``--min-occupancy``.

What is written (``n`` = used positions, ``d`` = ``dim``, ``r`` = rank):

- the table ``P = A W^T`` (n x d): ``A = P_MDS(r)`` (n x r, the first r MDS coordinates;
  without ``rank``, r = the components above sampling noise of the run's verdict, at most
  d and the coordinates available: columns beyond them would fit noise; a run with none
  is refused, :func:`nothing_to_export`; a run without a null keeps min(d, coordinates),
  with a warning) and ``W`` (d x r) with orthonormal
  columns, so every pairwise distance of ``P`` equals that of ``P_MDS(r)`` (``W^T W = I``).
  ``basis="pad"`` (default): ``W`` = the first r columns of the identity (zero padding);
  ``basis="random"``: a seeded random orthonormal ``W`` (spreads the signal over all d
  coordinates, for optimisers that treat coordinates alike).
- under the key the model uses: ``embeddings.position_embeddings.weight`` (layout
  ``bert``), ``wpe.weight`` (``gpt2``) or ``position_embeddings`` (``plain``);
- with ``factors=True`` also ``posstats.lowrank.A`` (n x r) and ``posstats.lowrank.W``
  (d x r);
- formats: ``safetensors`` (tensors + string-to-string metadata, below), ``npy`` (the
  table; factors go to ``<stem>.A.npy`` / ``<stem>.W.npy``; no metadata inside), ``pt``
  (``torch.save`` of a plain dict of tensors, to be read with
  ``torch.load(path, weights_only=True)``; no metadata inside);
- a model card ``README.md`` next to the file (YAML front matter with the metadata, key
  numbers, the rank / stress / parameter table, usage) and two figures
  ``<stem>.spectrum.png`` / ``<stem>.lowrank.png``.

Metadata (safetensors header and card front matter), all strings: ``schema``
(``posstats.export/1``), ``layout``, ``key``, ``n``, ``d``, ``rank``, ``basis``,
``dtype``, ``stress``, ``scaled_stress`` (of the exported table against d_H of the corpus,
all used pairs, or an even sample of ``stress_positions`` of them for large n),
``explained_variance`` (share of the MDS variance in the first r coordinates),
``corpus_fingerprint``, ``tokenizer``, ``tokenizer_hash``, ``tool``, ``tool_version``,
``run_id`` (``report.json``'s ``run_id`` if it has one, else the first 16 hex digits of
its sha256), ``positions`` (``"0..n-1"``).

Row i of the table is corpus position i *as counted*: token ids excluded from the counts
(by default the tokenizer's special tokens) were removed before positions were assigned.
A model that puts a special token first (BERT's [CLS] at row 0) therefore sees its first
text token at row 1; to export a table whose rows are the model's own positions, count
with ``--exclude-tokens ''`` (the special tokens then occupy their positions in the
counts). The model card says which ids were excluded.

Every file is written atomically, and none that exists is replaced unless ``force``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from safetensors.numpy import save_file

from posstats import __version__
from posstats.errors import InputError, OptionError, PosstatsError
from posstats.estimates.verdict import (
    thin_mds_components,
    verdict_rank_remedy,
)
from posstats.geometry.encodings import mds_smacof
from posstats.geometry.lowrank import default_ranks, lowrank_tradeoff
from posstats.geometry.stress import stress_report
from posstats.options import declared_options, first_problem, option
from posstats.reports.plots import lowrank_figure, png_bytes, spectrum_figure
from posstats.reports.spectrum_view import (
    explained_label,
    explained_share,
    noise_threshold,
    null_stopped,
    rank_test_bound,
    rank_test_eigenvalues,
    weights_ratio,
)
from posstats.runs.run_folder import RunData, load_run, run_distances, with_distances
from posstats.storage.publish import atomic_path

__all__ = [
    "EXPORT_SCHEMA",
    "FACTOR_KEYS",
    "LAYOUT_KEYS",
    "ExportOptions",
    "ExportResult",
    "export_encoding",
    "export_run",
    "orthonormal_basis",
]

EXPORT_SCHEMA = "posstats.export/1"
LAYOUT_KEYS = {
    "bert": "embeddings.position_embeddings.weight",
    "gpt2": "wpe.weight",
    "plain": "position_embeddings",
}
FACTOR_KEYS = ("posstats.lowrank.A", "posstats.lowrank.W")
FORMATS = ("safetensors", "npy", "pt")
BASES = ("pad", "random")
# Above this many used positions, stress is computed on an even sample of positions
# (all pairs of 4096 positions: two 128 MiB float64 matrices).
STRESS_POSITION_LIMIT = 4096
SMACOF_POSITION_LIMIT = 16_384


_MODEL = "for a real model"
_CARD_TEXT_LIMIT = 256  # a model card field (license, dataset, base model): printable, bounded
_CARD_DATASETS_LIMIT = 64


@dataclass(frozen=True)
class ExportOptions:
    """How a run's MDS encoding becomes a position table, each option declared once
    (:mod:`posstats.options`): ``posstats export``'s flags and the pipeline's ``[export]``
    table are generated from these fields. ``None`` means: ``layout`` plain, ``prefix``
    none, ``format`` from the file's suffix, ``rank`` the components above noise, ``rows``
    every counted position (``dim`` must be given, or filled from a model folder)."""

    dim: int | None = option(None, help="model width D (columns of the table); required unless --for-model gives it",
                             metavar="D", minimum=1, group="options", config_default=None)
    rank: int | None = option(
        None, metavar="R", minimum=1, group="options",
        help="rank r <= D of the encoding (default: the MDS components above sampling noise in the run's verdict, at "
             "most D; a run with none exports nothing unless R is given; without a null: min(D, MDS coordinates in "
             "the run))")
    layout: Literal["bert", "gpt2", "plain"] | None = option(
        None, group="options", config_default="plain",
        help="tensor name convention: bert (embeddings.position_embeddings.weight), gpt2 (wpe.weight) or plain "
             "(position_embeddings); default plain, or --for-model's")
    format: Literal["safetensors", "npy", "pt"] | None = option(
        None, group="options", config_default="safetensors", help="file format (default: from the file's suffix)")
    factors: bool = option(False, group="options",
                           help="also write the low-rank factors A (n x r) and W (D x r); needs the rank given")
    require_full_rank: bool = option(
        False, group="options",
        help="refuse a table whose rank r (the components above sampling noise, or the rank given) is below its "
             "width D; by default the r components are embedded in the D-wide table")
    basis: Literal["pad", "random"] = option(
        "pad", group="options", help="the orthonormal map W: zero padding or a seeded random orthonormal basis")
    seed: int = option(0, group="options", minimum=0, help="seed of the random basis", pipeline=False,
                       why_not="the pipeline's export uses [geometry] seed")
    dtype: Literal["float32", "float64"] = option("float32", group="options", help="stored dtype")
    card: bool = option(True, group="options", help="write the model card README.md and its figures next to the table")
    weighting: Literal["auto", "occupancy", "none"] = option(
        "auto", group="options",
        help="which classical coordinates: occupancy (the occupancy-weighted MDS, W^-1/2 U sqrt(lambda) of "
             "W^1/2 B_w W^1/2 (B_w centred on the occupancy-weighted mean), whose components the rank test counted; fits well-occupied positions first), none "
             "(P_MDS, every position alike), or auto: occupancy at the informative rank when the unweighted MDS's "
             "leading components load on thinly occupied positions (the verdict's caveat), else none")
    method: Literal["classical", "smacof"] = option(
        "classical", group="options",
        help="classical MDS coordinates, or their SMACOF refinement at rank r: lower stress at the same width "
             "(classical MDS minimises strain, not stress)")
    smacof_max_iter: int = option(300, group="options", metavar="K", minimum=1, maximum=100_000,
                                  help="SMACOF's cap on Guttman transforms (SQUAREM-accelerated)")
    smacof_tol: float = option(1e-6, group="options", metavar="TOL", minimum=0.0, strict=True,
                               help="SMACOF stops when the relative stress decrease is below TOL")
    rows: int | None = option(
        None, group=_MODEL, metavar="N", minimum=1,
        help="a table for a model with N positions: the first N rows (default: every counted position; more than "
             "were counted is refused)")
    prefix: str | None = option(
        None, group=_MODEL, metavar="PREFIX", config_default="",
        help="put before the key: 'bert.' for BertForMaskedLM, 'transformer.' for GPT2LMHeadModel (default none: "
             "BertModel / GPT2Model)")
    min_tokens: int = option(10, group=_MODEL, metavar="K", minimum=0,
                             help="warn about rows counted from fewer than K tokens: they are mostly noise")
    strict: bool = option(False, group=_MODEL, help="refuse the export when a row has fewer tokens than that minimum")
    license: str | None = option(None, group=_MODEL, metavar="ID",
                                 help="the model card's license (e.g. apache-2.0; default unknown)")
    datasets: tuple[str, ...] = option((), group=_MODEL, metavar="NAME", flag="--dataset", repeat=True,
                                       help="a dataset the corpus came from, for the model card; repeatable")
    base_model: str | None = option(None, group=_MODEL, metavar="NAME",
                                    help="the model the table is for, for the model card and its snippet")

    def __post_init__(self) -> None:
        problem = first_problem(self)
        if problem:
            raise OptionError(problem)
        if self.rank is not None and self.dim is not None and self.rank > self.dim:
            msg = f"{{rank}} {self.rank} exceeds {{dim}} {self.dim}: a rank-r table needs width d >= r"
            raise OptionError(msg)
        if self.factors and self.rank is None:
            raise OptionError("the low-rank factors ({factors}) need {rank}")
        for name, text in (("license", self.license), ("base_model", self.base_model),
                           *(("datasets", d) for d in self.datasets)):
            if text is not None and (len(text) > _CARD_TEXT_LIMIT or not text.isprintable()):
                raise OptionError(f"{{{name}}} must be printable text of at most {_CARD_TEXT_LIMIT} characters; "
                                  f"got {text[:40]!r}")
        if len(self.datasets) > _CARD_DATASETS_LIMIT:
            raise OptionError(f"{{datasets}} names at most {_CARD_DATASETS_LIMIT} datasets; got {len(self.datasets)}")
        _check_prefix(self.prefix or "")


def orthonormal_basis(dim: int, rank: int, /, *, basis: str = "pad", seed: int = 0) -> np.ndarray:
    """A (dim, rank) float64 matrix with orthonormal columns.

    ``pad``: the first ``rank`` columns of the identity. ``random``: Q of the QR
    factorisation of a seeded Gaussian matrix, each column's sign fixed so its
    largest-magnitude entry is positive.
    """
    if not 1 <= rank <= dim:
        msg = f"need 1 <= rank <= dim; got rank {rank}, dim {dim}"
        raise ValueError(msg)
    if basis == "pad":
        return np.eye(dim, rank)
    if basis == "random":
        q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((dim, rank)))
        idx = np.argmax(np.abs(q), axis=0)
        return q * np.sign(q[idx, np.arange(rank)])
    msg = f"basis must be one of {BASES}; got {basis!r}"
    raise ValueError(msg)


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_encoding` wrote.

    Attributes:
        path: the encoding file.
        files: every file written (encoding, factor files, card, figures).
        key: the tensor name of the table.
        table: (n, d) the exported table, in the exported dtype.
        factors: ``(A, W)`` as exported (float64 before the dtype cast) or None.
        metadata: the string metadata.
        tradeoff: the low-rank trade-off rows of the card.
        warnings: one line each (rows with too few counted tokens), also in the card.
    """

    path: Path
    files: tuple[Path, ...]
    key: str
    table: np.ndarray
    factors: tuple[np.ndarray, np.ndarray] | None
    metadata: dict[str, str]
    tradeoff: list[dict[str, Any]]
    warnings: tuple[str, ...] = ()


def _guess_format(out: Path, fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in FORMATS:
            msg = f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}"
            raise InputError(msg)
        return fmt
    suffix = out.suffix.lower().lstrip(".")
    if suffix in FORMATS:
        return suffix
    msg = f"{out}: cannot tell the format from the suffix {out.suffix!r}; pass {{format}} {'|'.join(FORMATS)}"
    raise OptionError(msg)


def _check_contiguous(run: RunData) -> None:
    """Refuse used positions other than exactly 0..n-1, naming the first gap."""
    pos = run.positions
    m = pos.shape[0]
    if m and np.array_equal(pos, np.arange(m)):
        return
    config = run.report.get("config") or {}
    buckets = config.get("buckets", "none")
    if buckets not in (None, "none"):
        msg = (f"{run.directory}: the run is bucketed ({{buckets}} {buckets}): its {m:,} rows are ranges of positions, "
               f"not positions, and a model needs one row per position 0..n-1: re-run the analysis without {{buckets}} "
               f"(with {{positions}} P for the first P positions only)")
        raise OptionError(msg)
    gap = int(np.flatnonzero(pos != np.arange(m))[0]) if m else 0
    mo = config.get("min_occupancy", 1)
    # A shorter context (--positions gap) helps only when the positions before the gap can be exported: at least 2.
    shorter = f"{{positions}} {gap} or " if gap >= 2 else ""
    msg = (
        f"{run.directory}: the MDS encoding covers positions {int(pos[0]) if m else '-'}..{int(pos[-1]) if m else '-'} "
        f"with gaps (position {gap} is unoccupied or below {{min_occupancy}} {mo}); a model needs a row for "
        f"every position 0..n-1: re-run the analysis with {shorter}a lower {{min_occupancy}}"
    )
    raise OptionError(msg)


def _check_prefix(prefix: str) -> None:
    """A key prefix is empty or a dotted module path ending in '.' (``bert.``, ``transformer.``)."""
    if prefix and not re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*\.)+", prefix):
        msg = f"{{prefix}} must be empty or a dotted module path ending in '.', e.g. 'bert.' or 'transformer.'; got {prefix!r}"
        raise OptionError(msg)


def _rows(run: RunData, rows: int | None) -> RunData:
    """The run cut to its first ``rows`` positions (a model with fewer positions than were
    counted); more rows than the corpus has is refused (a row cannot be invented)."""
    m = int(run.positions.shape[0])
    if rows is None or rows == m:
        return run
    if int(rows) != rows or rows < 2:
        msg = f"{{rows}} must be an integer >= 2 (a position table's stress compares pairs of rows); got {rows}"
        raise OptionError(msg)
    if rows > m:
        msg = (f"{{rows}} {rows}: {run.directory} has positions 0..{m - 1} only; a model with {rows} positions needs "
               f"counts of {rows} positions (count with {{positions}} {rows})")
        raise OptionError(msg)
    held = run.distances[:rows, :rows] if run.distances is not None else None
    weighted = run.weighted_encoding[:rows] if run.weighted_encoding is not None else None
    return dataclasses.replace(run, positions=run.positions[:rows], encoding=run.encoding[:rows], distances=held,
                               weighted_encoding=weighted)


def _thin_rows(run: RunData, *, min_tokens: int) -> tuple[dict[str, str], list[str]]:
    """Metadata entries and warnings about rows counted from fewer than ``min_tokens`` tokens
    (their rows are mostly sampling noise)."""
    occupancy = (run.report.get("positions") or {}).get("occupancy")
    if not occupancy:
        return {}, []
    occ = np.asarray(occupancy, dtype=np.int64)[run.positions]
    thin = np.flatnonzero(occ < min_tokens)
    meta = {"min_tokens": str(min_tokens), "rows_below_min_tokens": str(int(thin.size)), "min_row_tokens": str(int(occ.min()))}
    if not thin.size:
        return meta, []
    warning = (f"{thin.size} of {occ.size} rows were counted from fewer than {min_tokens} tokens (the fewest: "
               f"{int(occ.min())} at position {int(run.positions[int(np.argmin(occ))])}; first thin row "
               f"{int(run.positions[thin[0]])}): those rows are mostly sampling noise; count more text or export "
               "fewer --rows")
    return meta, [warning]


def _short_rows(run: RunData, *, rows: int | None) -> list[str]:
    """A warning when the table has fewer rows than the positions the run was counted at
    (trailing positions with no token, or below --min-occupancy) and no ``rows`` was asked
    for: a model with that many positions would fail to load it (a size mismatch)."""
    requested = (run.report.get("positions") or {}).get("requested")
    m = int(run.positions.shape[0])
    if rows is not None or not isinstance(requested, int) or m >= requested:
        return []
    return [f"the table has {m:,} rows but the run was counted at {requested:,} positions (positions {m:,}.."
            f"{requested - 1:,} have no token or fewer than --min-occupancy): a model with {requested:,} positions "
            f"cannot load it; export for a model with at most {m:,} positions (--rows, --for-model), or count "
            "longer documents"]


def informative_rank(report: dict[str, Any], /) -> int | None:
    """The components above sampling noise that the run's verdict claims (None when the
    analysis computed no null: the rank is then untested)."""
    above = (report.get("verdict") or {}).get("components_above_noise")
    return None if above is None else int(above)


def _export_rank(run: RunData, *, dim: int, rank: int | None, force: bool = False) -> tuple[int, str, list[str]]:
    """``(r, why, warnings)``: ``rank`` when given, else the components above sampling noise
    (:func:`informative_rank`), capped by ``dim`` and the k MDS coordinates stored; without
    a null, or with none above noise and ``force``, ``min(dim, k)`` with a warning. Warns
    when ``rank`` goes beyond the components above noise."""
    k = run.encoding.shape[1]
    if rank is not None and rank > k:
        msg = (f"{{rank}} {rank} exceeds the {k} MDS coordinates stored in {run.directory}/mds.safetensors "
               "(re-analyse with larger {dims})")
        raise OptionError(msg)
    informative = informative_rank(run.report)
    if rank is not None:
        warn = []
        if informative is not None and rank > informative:
            warn.append(f"--rank {rank} goes beyond the {informative} MDS component(s) above sampling noise: the last "
                        f"{rank - informative} fit noise")
        return int(rank), "--rank", warn
    if informative is None:
        withheld = (run.report.get("verdict") or {}).get("withheld")
        why = (f"the verdict is withheld ({withheld})" if withheld else
               "the analysis computed no null (--null none)")
        return min(int(dim), k), "width (rank not tested)", [
            f"{why}, so the rank is not tested against sampling noise: the table keeps min(--dim, {k}) MDS coordinates"]
    if informative == 0 and force:
        return min(int(dim), k), "width (--force; none above noise)", [
            f"no MDS component stands above sampling noise: exported anyway (--force), every one of the "
            f"min(--dim, {k}) columns fits noise"]
    return min(int(dim), k, informative), INFORMATIVE_RULE, []


INFORMATIVE_RULE = "components above sampling noise"


def _export_coordinates(run: RunData, r: int, *, rule: str, weighting: str, method: str) -> tuple[np.ndarray, str, list[str]]:
    """``(A, which, warnings)``: the (n, r) classical coordinates the table holds and which
    MDS they come from: ``occupancy``, the occupancy-weighted MDS of the components the rank
    test counted (``run.weighted_encoding``,
    :func:`posstats.geometry.mds.weighted_coordinates`), or ``none``, P_MDS(r).
    ``weighting`` ``auto`` takes the weighted ones at the informative rank (``rule``) when
    the run holds at least r of them and the unweighted MDS's leading components load on
    thinly occupied positions (:func:`posstats.estimates.verdict.thin_mds_components`):
    on corpora whose occupancy falls to 4-10 tokens a position they were nearer the true
    geometry in 48 of 48 (scaled stress against the truth 0.42 and 0.27 where P_MDS's were
    0.67 and 0.39; docs/calibration.md, "The occupancy-weighted MDS"). Warns when the
    exported P_MDS components are such thin-position components."""
    held = run.weighted_encoding
    has = held is not None and held.shape[1] >= r
    thin = [j for j in thin_mds_components(run.report) if j < r]
    if weighting == "occupancy":
        if not has:
            got = 0 if held is None else held.shape[1]
            msg = (f"{{weighting}} occupancy: {run.directory} holds the occupancy-weighted coordinates of {got} "
                   f"component(s) (those the occupancy-weighted rank test counted, where occupancies differ), not {r}")
            raise OptionError(msg)
        if method != "classical":
            raise OptionError("{weighting} occupancy takes the classical coordinates; {method} smacof refines P_MDS")
        return np.ascontiguousarray(held[:, :r]), "occupancy", []
    if weighting == "auto" and has and thin and rule == INFORMATIVE_RULE and method == "classical":
        return np.ascontiguousarray(held[:, :r]), "occupancy", []
    if not thin:
        return np.ascontiguousarray(run.encoding[:, :r]), "none", []
    remedy = ("--weighting occupancy exports the occupancy-weighted components the test counted, or re-analyse with "
              "--min-occupancy K" if has else "re-analyse with --min-occupancy K")
    return np.ascontiguousarray(run.encoding[:, :r]), "none", [
        f"MDS component(s) {', '.join(str(j + 1) for j in thin)} of the {r} exported load on thinly occupied "
        "positions (null.mds_component_occupancy): they fit those positions' sampling noise rather than the structure "
        f"the rank test counted; {remedy}"]


@dataclass(frozen=True)
class _Files:
    """The files an export writes: ``tensors`` (the table, then the .npy factor files) and
    ``card`` (README.md, the spectrum and the trade-off figure; empty without a card)."""

    tensors: list[Path]
    card: list[Path]


def _is_card_of(path: Path, file_name: str) -> bool:
    """Whether ``path`` is the posstats model card of the export ``file_name``."""
    try:
        head = path.read_text(encoding="utf-8", errors="replace")[:2000]
    except OSError:
        return False
    return "library_name: posstats" in head and f"file: {_yaml_value(file_name)}" in head


def card_path(out: Path, /) -> Path:
    """The model card of the export ``out``: ``README.md`` beside it (what the Hugging Face
    Hub shows), unless that folder's ``README.md`` is someone else's (another export's card,
    or any other file): then ``<stem>.README.md``, so that several exports share a folder."""
    readme = out.with_name("README.md")
    if not readme.exists() or _is_card_of(readme, out.name):
        return readme
    stem = out.name[: -len(out.suffix)] if out.suffix else out.name
    return out.with_name(f"{stem}.README.md")


def _output_files(out: Path, fmt: str, *, factors: bool, card: bool, force: bool) -> _Files:
    """The files to write next to ``out``; refuses existing ones (without ``force``) and folders."""
    stem = out.name[: -len(out.suffix)] if out.suffix else out.name
    tensors = [out]
    if factors and fmt == "npy":
        tensors += [out.with_name(f"{stem}.A.npy"), out.with_name(f"{stem}.W.npy")]
    card_files = [card_path(out), out.with_name(f"{stem}.spectrum.png"), out.with_name(f"{stem}.lowrank.png")] if card else []
    existing = [p for p in tensors + card_files if p.exists()]
    if existing and not force:
        msg = f"{existing[0]}: exists; pass {{force}} to overwrite"
        raise OptionError(msg)
    for p in tensors + card_files:
        if p.is_dir():
            msg = f"{p}: is a folder"
            raise PosstatsError(msg)
    return _Files(tensors, card_files)


def _fmt(x: float) -> str:
    return format(float(x), ".6g")


def _smacof_coordinates(run: RunData, rank: int, *, max_iter: int, tol: float) -> tuple[np.ndarray, dict[str, str], RunData]:
    """``A`` (n, rank): the classical coordinates refined by SMACOF against all n x n d_H
    (:func:`posstats.geometry.encodings.mds_smacof`), the fit's metadata entries, and the
    run holding those distances (computed here at most once)."""
    n = run.positions.shape[0]
    if n > SMACOF_POSITION_LIMIT:
        msg = f"{{method}} smacof needs all {n} x {n} distances; it is limited to n <= {SMACOF_POSITION_LIMIT}"
        raise OptionError(msg)
    run = with_distances(run)
    a, details = mds_smacof(run, run.distances, rank, max_iter=max_iter, tol=tol)
    fit = {f"smacof_{k}": _fmt(v) if isinstance(v, float) else str(v) for k, v in details.items() if k not in ("method", "rank")}
    return a, fit, run


def _export_metadata(
    run: RunData, stress: Any, *, layout: str, dim: int, rank: int, basis: str, seed: int, dtype: str, stress_positions: int
) -> dict[str, str]:
    """The string metadata of the export (module docstring), ``method`` entries excluded."""
    n = run.positions.shape[0]
    explained = (run.report.get("spectrum") or {}).get("explained_variance") or []
    corpus = run.report.get("corpus") or {}
    return {
        "schema": EXPORT_SCHEMA,
        "layout": layout,
        "key": LAYOUT_KEYS[layout],
        "n": str(n),
        "d": str(int(dim)),
        "rank": str(rank),
        "basis": basis if basis == "pad" else f"random:seed={seed}",
        "dtype": dtype,
        "stress": _fmt(stress.stress),
        "scaled_stress": _fmt(stress.scaled_stress),
        "stress_positions": str(stress_positions),
        "explained_variance": _fmt(explained[rank - 1]) if len(explained) >= rank else "",
        "corpus_fingerprint": str(corpus.get("fingerprint", "")),
        "tokenizer": str(corpus.get("tokenizer", "")),
        "tokenizer_hash": str(corpus.get("tokenizer_hash", "")),
        "tool": "posstats",
        "tool_version": __version__,
        "run_id": run.run_id,
        "positions": f"0..{n - 1}",
    }


def _card_figures(run: RunData, idx: np.ndarray, dist: np.ndarray, files: _Files, *, dim: int, rank: int) -> tuple[list[dict[str, Any]], list[Path]]:
    """The low-rank trade-off rows (on the stress sample ``idx``, d_H ``dist``) and the
    card's two figures, written: (rows, [spectrum png, trade-off png])."""
    n, k = run.encoding.shape
    tradeoff = lowrank_tradeoff(run.encoding[idx], dist, width=dim, ranks=default_ranks(k, width=dim, extra=(rank,)), n=n)
    spectrum = run.report.get("spectrum") or {}
    fig = spectrum_figure(run.eigenvalues, explained_share(run.eigenvalues, run.report), rank=spectrum.get("rank"),
                          noise_floor=noise_threshold(run.report), tested=rank_test_eigenvalues(run.report),
                          tested_bound=rank_test_bound(run.report), weights_ratio=weights_ratio(run.report),
                          stopped=null_stopped(run.report),
                          explained_label=explained_label(run.eigenvalues, run.report))
    written = [_save_named(fig, files.card[1]),
               _save_named(lowrank_figure(tradeoff, n=n, width=dim, informative=informative_rank(run.report)), files.card[2])]
    return tradeoff, written


@dataclass(frozen=True)
class ExportRefusal:
    """Why a run has no table to export.

    Attributes:
        reason: one clause, lower case ("nothing to export: ...").
        overridable: True when the table would only fit noise (no component above sampling
            noise): an explicit rank or ``force`` exports it anyway. False when there is no
            positive eigenvalue (the table would be all zeros whatever is asked).
    """

    reason: str
    overridable: bool


def nothing_to_export(run: RunData, /, *, rank: int | None = None, force: bool = False) -> ExportRefusal | None:
    """Why the run has no table to export, or None: its MDS spectrum has no positive
    eigenvalue (every corpus distance is 0), or, without an explicit ``rank`` or ``force``,
    its verdict finds no component above sampling noise (a table of noise)."""
    if not np.any(np.asarray(run.eigenvalues) > 0):
        return ExportRefusal("nothing to export: the MDS spectrum has no positive eigenvalue (every corpus distance is "
                             "0, no positional structure beyond sampling noise), so the table would be all zeros",
                             overridable=False)
    if rank is None and not force and informative_rank(run.report) == 0:
        remedy = verdict_rank_remedy(run.report)
        conservative = (f"; the verdict's count is conservative here (rotated corpora moved the structure), and "
                        f"{remedy} counts the components against document halves instead" if remedy else "")
        return ExportRefusal("nothing to export: no MDS component stands above sampling noise (the verdict), so every "
                             f"column would fit noise{conservative}", overridable=True)
    return None


def export_run(
    run: RunData | str | os.PathLike,
    out: str | os.PathLike,
    options: ExportOptions | None = None,
    /,
    *,
    force: bool = False,
    row_norm: float | None = None,
    **overrides: Any,
) -> ExportResult:
    """Export a run's MDS encoding as an (n, dim) position table (see the module docstring).

    Args:
        run: a run just analysed (:func:`posstats.runs.run_folder.run_from_analysis`,
            distances held: nothing is recomputed), read back (:func:`load_run`: the d_H
            are computed from its counts, once), or a run folder's path.
        out: the file to write (``.safetensors``, ``.npy`` or ``.pt``).
        options: :class:`ExportOptions` (width, rank, layout, basis, method, the model
            card's fields ...); ``overrides`` replace single ones
            (``export_run(run, out, dim=768, layout="bert")``).
        force: replace existing files, and export a table of noise (no component above
            sampling noise) anyway, with a warning.
        row_norm: scale the table so that its rows' mean L2 norm is this (the model's own
            table's, :attr:`posstats.reports.model_target.ModelTarget.row_norm`); every
            distance is scaled by the same factor, so scaled stress is unchanged and raw
            stress is that of the scaled table.

    Raises:
        OptionError: an option out of its range, rank > dim, factors without a rank, no dim.
        InputError / PosstatsError: a missing or non-contiguous run, a rank above the
        coordinates available, an existing file without ``force``.
        TypeError: an unknown option.
    """
    if isinstance(run, (str, os.PathLike)):
        run = load_run(run)  # a run folder's path: read it (its distances come from its counts)
    if not isinstance(run, RunData):
        msg = f"export_run() takes a run folder's path or a RunData (posstats.load_run), got {type(run).__name__}"
        raise TypeError(msg)
    opts = _options(options, overrides)
    dim, rank, factors, basis, seed, dtype = opts.dim, opts.rank, opts.factors, opts.basis, opts.seed, opts.dtype
    layout, prefix, rows, card, method = opts.layout or "plain", opts.prefix or "", opts.rows, opts.card, opts.method
    out = Path(out)
    fmt = _guess_format(out, opts.format)
    _check_contiguous(run)
    short = _short_rows(run, rows=rows)
    run = _rows(run, rows)
    refusal = nothing_to_export(run, rank=rank, force=force)
    if refusal and refusal.overridable:
        raise OptionError(f"{run.directory}: {refusal.reason}; pass {{force}} to export it anyway (or {{rank}} R for R "
                          "components)")
    if refusal:
        raise InputError(f"{run.directory}: {refusal.reason}")
    thin_meta, warnings = _thin_rows(run, min_tokens=opts.min_tokens)
    warnings = [*short, *warnings]
    if warnings and opts.strict:
        raise InputError(f"{run.directory}: {warnings[0]}")
    r, rank_rule, rank_warnings = _export_rank(run, dim=dim, rank=rank, force=force)
    if r < int(dim) and opts.require_full_rank:
        raise OptionError(f"{run.directory}: the table would hold {r} component(s) ({rank_rule}) in width {{dim}} "
                          f"{dim}, and {{require_full_rank}} refuses that (give {{dim}} {r}, or leave "
                          "{require_full_rank} off to embed them)")
    a, weighting, coordinate_warnings = _export_coordinates(run, r, rule=rank_rule, weighting=opts.weighting,
                                                           method=method)
    warnings = [*warnings, *rank_warnings, *coordinate_warnings]
    files = _output_files(out, fmt, factors=factors, card=card, force=force)
    fit: dict[str, str] = {}
    if method == "smacof":
        a, fit, run = _smacof_coordinates(run, r, max_iter=opts.smacof_max_iter, tol=opts.smacof_tol)
    scale = None
    if row_norm is not None:
        own = float(np.linalg.norm(a, axis=1).mean())
        if not (math.isfinite(row_norm) and row_norm > 0) or own <= 0:
            msg = f"cannot scale rows to a mean norm of {row_norm!r} (the encoding's rows have mean norm {own:.3g})"
            raise InputError(msg)
        scale = row_norm / own
        a = a * scale
    w = orthonormal_basis(int(dim), r, basis=basis, seed=seed)
    np_dtype = np.dtype(dtype)
    table = np.ascontiguousarray((a @ w.T).astype(np_dtype))
    idx, dist = run_distances(run, max_positions=STRESS_POSITION_LIMIT)
    s = stress_report(table[idx].astype(np.float64), dist)
    metadata = {**_export_metadata(run, s, layout=layout, dim=dim, rank=r, basis=basis, seed=seed, dtype=dtype,
                                   stress_positions=len(idx)), "method": method, "rank_rule": rank_rule,
                "mds_weighting": weighting, **fit, **thin_meta}
    if weighting == "occupancy":  # P_MDS's explained share is not these components'
        metadata["explained_variance"] = ""
    metadata["key"] = key = prefix + metadata["key"]
    if scale is not None:
        metadata["row_norm"], metadata["row_scale"] = f"{row_norm:.6g}", f"{scale:.6g}"
    tensors = {key: table}
    if factors:
        tensors[FACTOR_KEYS[0]] = np.ascontiguousarray(a.astype(np_dtype))
        tensors[FACTOR_KEYS[1]] = np.ascontiguousarray(w.astype(np_dtype))
    tradeoff, written = _card_figures(run, idx, dist, files, dim=int(dim), rank=r) if card else ([], [])
    written += _write_tensors(fmt, out, tensors, metadata, key=key, factor_paths=files.tensors[1:])
    if card:
        text = model_card(metadata, tradeoff, file_name=out.name, fmt=fmt, report=run.report,
                          figures=(files.card[1].name, files.card[2].name), factors=factors, warnings=warnings,
                          license=opts.license, datasets=opts.datasets, base_model=opts.base_model)
        with atomic_path(files.card[0]) as tmp:
            tmp.write_text(text)
        written.append(files.card[0])
    return ExportResult(out, tuple(written), key, table, (a, w) if factors else None, metadata, tradeoff, tuple(warnings))


def export_encoding(
    run_dir: str | os.PathLike,
    out: str | os.PathLike,
    options: ExportOptions | None = None,
    /,
    *,
    force: bool = False,
    row_norm: float | None = None,
    **overrides: Any,
) -> ExportResult:
    """Export the MDS encoding of a run folder (written by ``posstats run`` / ``posstats
    analyze``) as an (n, dim) position table: :func:`export_run` of :func:`load_run`, with
    the same options."""
    return export_run(load_run(run_dir), out, options, force=force, row_norm=row_norm, **overrides)


def _options(options: ExportOptions | None, overrides: dict[str, Any]) -> ExportOptions:
    """``options`` (default :class:`ExportOptions`) with ``overrides`` replacing fields; a
    width is required."""
    names = {d.name for d in declared_options(ExportOptions)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        msg = f"export_run() got an unknown option {unknown[0]!r}; options are {', '.join(sorted(names))}"
        raise TypeError(msg)
    if "datasets" in overrides:
        overrides = {**overrides, "datasets": tuple(overrides["datasets"])}
    opts = dataclasses.replace(options or ExportOptions(), **overrides)
    if opts.dim is None:
        raise OptionError("give the model width {dim}")
    return opts


def _save_named(plot: Any, path: Path) -> Path:
    """Write ``plot`` as a PNG to ``path`` atomically."""
    data = png_bytes(plot)
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return path


def _write_tensors(fmt: str, out: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str], *, key: str, factor_paths: list[Path]) -> list[Path]:
    """Write the table (and factors) in ``fmt``: safetensors with ``metadata``, .npy files,
    or a ``torch.save`` dict of tensors; return the paths written."""
    if fmt == "safetensors":
        with atomic_path(out) as tmp:
            save_file(tensors, str(tmp), metadata=metadata)
        return [out]
    if fmt == "npy":
        written = []
        for path, name in [(out, key), *zip(factor_paths, FACTOR_KEYS)]:
            with atomic_path(path) as tmp, open(tmp, "wb") as fh:
                np.save(fh, tensors[name], allow_pickle=False)
            written.append(path)
        return written
    try:
        import torch
    except ImportError as exc:
        raise OptionError("{format} pt needs torch (pip install torch)") from exc
    with atomic_path(out) as tmp:
        torch.save({k: torch.from_numpy(v.copy()) for k, v in tensors.items()}, tmp)
    return [out]


def _yaml_value(v: Any) -> str:
    # JSON strings and numbers are valid YAML scalars, and need no YAML library.
    return json.dumps(v)


# metadata entries written as YAML numbers in the card (they are strings in safetensors)
_NUMERIC = ("n", "d", "rank", "stress", "scaled_stress", "stress_positions", "explained_variance", "min_tokens",
            "rows_below_min_tokens", "min_row_tokens")


def _card_value(key: str, value: str) -> Any:
    if key in _NUMERIC and value != "":
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if number.is_integer() and "." not in value and "e" not in value.lower() else number
    return value


def _front_matter(metadata: dict[str, str], *, file_name: str, fmt: str, license: str | None = None,  # noqa: A002
                  datasets: Sequence[str] = (), base_model: str | None = None) -> list[str]:
    """The card's YAML front matter: the Hugging Face fields (library, license, datasets,
    base model, tags), file, format and the metadata (numbers as numbers)."""
    front = ["---", "library_name: posstats", f"license: {_yaml_value(license or 'unknown')}"]
    if datasets:
        front += ["datasets:", *(f"  - {_yaml_value(d)}" for d in datasets)]
    if base_model:
        front.append(f"base_model: {_yaml_value(base_model)}")
    front += ["tags:", "  - positional-encoding", "  - mds", "  - hellinger",
              f"file: {_yaml_value(file_name)}", f"format: {_yaml_value(fmt)}", "posstats:"]
    front += [f"  {k}: {_yaml_value(_card_value(k, v))}" for k, v in metadata.items()]
    front.append("---")
    return front


def _caveats(metadata: dict[str, str], report: dict[str, Any], warnings: Sequence[str]) -> list[str]:
    """What the numbers do not say: thin rows, and whether the geometry stands above noise."""
    lines = []
    verdict = report.get("verdict") or {}
    above = verdict.get("components_above_noise")
    distances = (report.get("geometry") or {}).get("distances", "plugin")
    if above is not None:
        lines.append(f"- {above} MDS component(s) stand above sampling noise"
                     + ("; the rest of the table fits noise" if above < int(metadata["rank"]) else "") + ".")
    if metadata.get("mds_weighting") == "occupancy":
        lines.append("- The table holds the occupancy-weighted MDS components (the ones the occupancy-weighted rank "
                     "test counted), fitted to positions in proportion to their token counts: the unweighted MDS's "
                     "leading components load on thinly occupied positions, whose distances are mostly sampling noise. "
                     "Its stress against every d_H is therefore above P_MDS's, which fits that noise.")
    lines.append("- Distances: " + ("bias-corrected for sampling noise (the split-half noise floor)."
                                    if distances == "bias_corrected" else
                                    "plug-in (sampling noise included: rare positions look farther apart than they are)."))
    if metadata.get("rows_below_min_tokens") not in (None, "", "0"):
        lines += [f"- {w}." for w in warnings] or [
            f"- {metadata['rows_below_min_tokens']} rows were counted from fewer than {metadata['min_tokens']} tokens."]
    elif metadata.get("min_row_tokens"):
        lines.append(f"- Every row was counted from at least {metadata['min_row_tokens']} tokens.")
    lines += [f"- {c[0].upper()}{c[1:]}." for c in verdict.get("caveats") or []]  # the run's own (noise share, buckets)
    return ["## Caveats", "", *lines, ""]


def _key_numbers(metadata: dict[str, str], report: dict[str, Any], *, file_name: str) -> list[str]:
    """The card's title, introduction and key-numbers table."""
    n, d, r = int(metadata["n"]), int(metadata["d"]), int(metadata["rank"])
    corpus = report.get("corpus") or {}
    spectrum = report.get("spectrum") or {}
    cf = spectrum.get("components_for") or {}
    return [
        "",
        f"# Information-optimal positional encoding ({n} positions, width {d}, rank {r})",
        "",
        f"`{file_name}` holds the classical-MDS positional encoding of a corpus (THEORY.md section 3 of "
        "posstats): the position table whose pairwise distances best reproduce the Hellinger distances "
        "between the token distributions at each position"
        + (", each position weighted by its token count" if metadata.get("mds_weighting") == "occupancy" else "")
        + ". Add it to the token embeddings as a learned absolute position table (frozen or as an initialisation).",
        "",
        "## Key numbers",
        "",
        "| quantity | value |",
        "|---|---|",
        f"| positions n | {n} (rows 0..{n - 1}) |",
        f"| width d / rank r | {d} / {r} |",
        f"| tensor | `{metadata['key']}` ({metadata['dtype']}, {n} x {d}) |",
        f"| stress / scaled stress against d_H | {metadata['stress']} / {metadata['scaled_stress']} |",
        f"| explained MDS variance at rank r | {metadata['explained_variance'] or '-'} |",
        f"| MDS rank; components for 90 / 95 / 99 % | {spectrum.get('rank', '-')}; "
        f"{cf.get('0.9', '-')} / {cf.get('0.95', '-')} / {cf.get('0.99', '-')} |",
        f"| corpus | {corpus.get('sequences', '-')} sequences, {corpus.get('tokens_counted', '-')} tokens, "
        f"mode {corpus.get('mode', '-')}, fingerprint `{metadata['corpus_fingerprint'][:16]}` |",
        f"| tokenizer | {metadata['tokenizer'] or '-'} (hash `{metadata['tokenizer_hash'][:16]}`) |",
        f"| parameters | {r * (n + d):,} as A W^T vs {n * d:,} as a free table |",
        "",
    ]


def _excluded_note(report: dict[str, Any]) -> list[str]:
    """Which token ids the counts left out, and what that means for row 0 (if any were)."""
    excluded = (report.get("corpus") or {}).get("exclude_ids") or []
    if not excluded:
        return []
    return [
        f"Row i is corpus position i with token ids {', '.join(map(str, excluded[:10]))}"
        f"{' ...' if len(excluded) > 10 else ''} removed before positions were counted. A model that puts a "
        "special token first (BERT's [CLS] at row 0) sees its first text token at row 1: count with "
        "`--exclude-tokens ''` for a table indexed by the model's own positions.",
        "",
    ]


def _tradeoff_table(tradeoff: Sequence[dict[str, Any]], *, weighted: bool = False) -> list[str]:
    """The rank / stress / parameters table of P_MDS (nothing without rows); ``weighted``:
    the table exported is the occupancy-weighted MDS, and the text says these rows are not its."""
    if not tradeoff:
        return []
    lines = [
        "## Rank / stress / parameters",
        "",
        *(["These rows are P_MDS's (the unweighted MDS) at each rank; the exported table holds the occupancy-weighted "
           "components instead (see the caveats).", ""] if weighted else []),
        "| rank r | stress | scaled stress | parameters r(n+d) | saving vs n*d |",
        "|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {row['rank']} | {row['stress']:.4g} | {row['scaled_stress']:.4g} | {row['parameters']:,} | {row['saving']:.1%} |"
              for row in tradeoff]
    return [*lines, ""]


_MODEL_CLASSES = {  # layout -> (bare model, its head model class and that class' prefix)
    "bert": ("BertModel", "BertForMaskedLM", "bert."),
    "gpt2": ("GPT2Model", "GPT2LMHeadModel", "transformer."),
}


def _transformers_usage(*, file_name: str, key: str, layout: str, base_model: str | None) -> list[str]:
    """Loading the table into a transformers model, checking that its key matched."""
    if layout not in _MODEL_CLASSES or not file_name.endswith(".safetensors"):
        return []
    bare, head, head_prefix = _MODEL_CLASSES[layout]
    cls = head if key.startswith(head_prefix) else bare
    source = base_model or "PATH_OR_NAME"
    return [
        "With transformers (the table replaces the model's own position embeddings; the key check makes a "
        f"mismatch loud instead of silently ignored; for `{head}` export with `--prefix {head_prefix}`):",
        "",
        "```python",
        "from safetensors.torch import load_file",
        f"from transformers import {cls}",
        f"model = {cls}.from_pretrained({json.dumps(source)})",  # a quoted literal, whatever the name holds
        f"result = model.load_state_dict(load_file({json.dumps(file_name)}), strict=False)",
        'assert not result.unexpected_keys, result.unexpected_keys  # the key matched a parameter of the model',
        "```",
        "",
    ]


def _usage(*, file_name: str, key: str, fmt: str, factors: bool, layout: str = "plain",
           base_model: str | None = None) -> list[str]:
    """How to load the table, with posstats and without it, and what stress means."""
    load = {
        "safetensors": f'from safetensors.torch import load_file\ntable = load_file("{file_name}")["{key}"]',
        "npy": f'import numpy as np\ntable = np.load("{file_name}", allow_pickle=False)',
        "pt": f'import torch\ntable = torch.load("{file_name}", weights_only=True)["{key}"]',
    }[fmt]
    return [
        "## Usage",
        "",
        "```python",
        "from posstats.torch import MDSPositionalEmbedding",
        f'pos = MDSPositionalEmbedding.from_file("{file_name}"{", low_rank=True" if factors else ""})  # x -> x + P[:seq]',
        "```",
        "",
        "or, without posstats:",
        "",
        "```python",
        load,
        "```",
        "",
        *_transformers_usage(file_name=file_name, key=key, layout=layout, base_model=base_model),
        "Stress = sum (e - h)^2 / sum h^2 over position pairs (h = Hellinger distance between positions, e = "
        "distance between table rows); scaled stress is the stress at the optimal scale.",
        "",
    ]


def model_card(
    metadata: dict[str, str],
    tradeoff: Sequence[dict[str, Any]],
    /,
    *,
    file_name: str,
    fmt: str,
    report: dict[str, Any],
    figures: tuple[str, str] | None = None,
    factors: bool = False,
    warnings: Sequence[str] = (),
    license: str | None = None,  # noqa: A002 - the card's field
    datasets: Sequence[str] = (),
    base_model: str | None = None,
) -> str:
    """The model card of an export: YAML front matter (Hugging Face fields, the metadata
    with numbers as numbers) + Markdown (key numbers, caveats, trade-off, figures, usage)."""
    lines = _front_matter(metadata, file_name=file_name, fmt=fmt, license=license, datasets=datasets, base_model=base_model)
    lines += _key_numbers(metadata, report, file_name=file_name) + _caveats(metadata, report, warnings)
    lines += _excluded_note(report) + _tradeoff_table(tradeoff, weighted=metadata.get("mds_weighting") == "occupancy")
    if figures:
        lines += ["## Figures", "", f"![MDS eigenspectrum]({figures[0]})", "",
                  f"![rank / stress / parameter trade-off]({figures[1]})", ""]
    lines += _usage(file_name=file_name, key=metadata["key"], fmt=fmt, factors=factors, layout=metadata.get("layout", "plain"),
                    base_model=base_model)
    return "\n".join(lines)
