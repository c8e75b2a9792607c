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
  without ``rank``, r = min(d, coordinates available)) and ``W`` (d x r) with orthonormal
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

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from posstats import __version__
from posstats.errors import InputError, PosstatsError
from posstats.runs.publish import published_dir

__all__ = [
    "EXPORT_SCHEMA",
    "FACTOR_KEYS",
    "LAYOUT_KEYS",
    "ExportResult",
    "RunData",
    "default_ranks",
    "export_encoding",
    "load_run",
    "lowrank_tradeoff",
    "orthonormal_basis",
    "run_distances",
    "sparse_rows",
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


@dataclass(frozen=True)
class RunData:
    """What a run folder holds, loaded.

    Attributes:
        directory: the run folder, as given.
        report: ``report.json``.
        positions: (m,) int64 used positions (``mds.safetensors`` ``positions``).
        eigenvalues: (k,) float64 MDS eigenvalues, descending.
        encoding: (m, k) float64 MDS coordinates of the used positions.
        mds_metadata: the string metadata of ``mds.safetensors``.
        files: the folder the files were read from: the run folder's current published
            version (:func:`posstats.runs.publish.published_dir`); None means ``directory``.
    """

    directory: Path
    report: dict[str, Any]
    positions: np.ndarray
    eigenvalues: np.ndarray
    encoding: np.ndarray
    mds_metadata: dict[str, str] = field(default_factory=dict)
    files: Path | None = None

    @property
    def folder(self) -> Path:
        """Where the run's files are (``files``, else ``directory``)."""
        return self.files if self.files is not None else self.directory

    @property
    def run_id(self) -> str:
        """``report.json``'s ``run_id``, else the first 16 hex digits of its sha256."""
        rid = self.report.get("run_id")
        if rid:
            return str(rid)
        return hashlib.sha256((self.folder / "report.json").read_bytes()).hexdigest()[:16]

    def counts_path(self) -> Path:
        """The counts of this run: those in the run folder, else ``report.json`` ``inputs.counts``."""
        from posstats.counting.io import counts_file

        recorded = (self.report.get("inputs") or {}).get("counts")
        # The folder itself first: while a run is being staged, inputs.counts already names
        # the final folder, which may still hold an older run's counts.
        candidates = [self.folder] + ([Path(recorded)] if recorded else [])
        for c in candidates:
            try:
                return counts_file(c)
            except InputError:
                continue
        where = f" (report.json inputs.counts = {recorded!r})" if recorded else ""
        msg = f"{self.directory}: cannot find the run's counts{where}; the distances need them"
        raise InputError(msg)


def load_run(run_dir: str | os.PathLike, /) -> RunData:
    """Load ``report.json`` and ``mds.safetensors`` of a run folder.

    Raises:
        InputError: no such folder, or one without a readable report / MDS file.
    """
    from safetensors import safe_open

    d = Path(run_dir)
    if not d.is_dir():
        msg = f"{d}: no such run folder"
        raise InputError(msg)
    files = published_dir(d)
    report_path, mds_path = files / "report.json", files / "mds.safetensors"
    for p in (report_path, mds_path):
        if not p.is_file():
            msg = f"{d}: no {p.name} in this folder (run 'posstats run' or 'posstats analyze' first)"
            raise InputError(msg)
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError) as exc:
        msg = f"{report_path}: not readable JSON ({exc})"
        raise InputError(msg) from exc
    try:
        with safe_open(str(mds_path), framework="numpy") as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in ("positions", "eigenvalues", "encoding")}
    except Exception as exc:  # noqa: BLE001 - safetensors raises several kinds
        msg = f"{mds_path}: not a readable MDS file ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
        raise InputError(msg) from exc
    positions = tensors["positions"].astype(np.int64).reshape(-1)
    encoding = tensors["encoding"].astype(np.float64)
    if encoding.ndim != 2 or encoding.shape[0] != positions.shape[0]:
        msg = f"{mds_path}: encoding shape {encoding.shape} does not match {positions.shape[0]} positions"
        raise InputError(msg)
    return RunData(d, report, positions, tensors["eigenvalues"].astype(np.float64).reshape(-1), encoding, meta, files)


def run_distances(run: RunData, /, *, max_positions: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Hellinger distances d_H between the run's used positions, recomputed from its counts.

    Args:
        run: from :func:`load_run`.
        max_positions: above this many used positions, an even subsample of them.

    Returns:
        ``(idx, D)``: indices into ``run.positions`` (all of them, or the subsample) and the
        (len(idx), len(idx)) float64 d_H between those positions.

    Raises:
        InputError: the counts are missing or are not the ones the run analysed.
    """
    from posstats.geometry.hellinger import hellinger_sq
    from posstats.reports.plots import even_subsample
    from posstats.counting.io import load_counts

    counts = load_counts(run.counts_path())
    expected = run.mds_metadata.get("fingerprint") or (run.report.get("corpus") or {}).get("fingerprint")
    if expected and counts.fingerprint and counts.fingerprint != expected:
        msg = (
            f"{run.counts_path()}: counts fingerprint {counts.fingerprint[:16]} is not the analysed corpus' "
            f"{expected[:16]} (the counts changed after the analysis; re-run 'posstats analyze')"
        )
        raise InputError(msg)
    if run.positions.size and int(run.positions.max()) >= counts.positions:
        msg = f"{run.counts_path()}: has {counts.positions} positions but the run used position {int(run.positions.max())}"
        raise InputError(msg)
    m = run.positions.shape[0]
    idx = np.arange(m) if max_positions is None else even_subsample(m, max_positions)
    d2 = hellinger_sq(sparse_rows(counts.rows(run.positions[idx])))
    return idx, np.sqrt(np.asarray(d2, dtype=np.float64))


def sparse_rows(rows: Any, /) -> Any:
    """``rows`` as a scipy CSR array when dense and under 10 % filled (token counts of a
    position usually are), which makes the Gram product of :func:`hellinger_sq` cost
    O(nnz) instead of O(n V); otherwise ``rows`` unchanged."""
    import scipy.sparse as sp

    if sp.issparse(rows) or rows.size == 0 or np.count_nonzero(rows) > 0.1 * rows.size:
        return rows
    return sp.csr_array(rows)


def default_ranks(k: int, /, *, width: int | None = None, extra: Sequence[int] = ()) -> list[int]:
    """Ranks for the low-rank trade-off: 1..8, then powers of two, plus ``extra``, up to
    ``min(k, width)``.

    >>> default_ranks(20, width=16, extra=(11,))
    [1, 2, 3, 4, 5, 6, 7, 8, 11, 16]
    """
    top = k if width is None else min(k, width)
    ranks = set(range(1, min(8, top) + 1))
    p = 16
    while p <= top:
        ranks.add(p)
        p *= 2
    ranks.update(int(r) for r in extra if r is not None and 1 <= int(r) <= top)
    if top >= 1:
        ranks.add(top)
    return sorted(ranks)


def lowrank_tradeoff(
    encoding: np.ndarray, distances: np.ndarray, /, *, width: int, ranks: Sequence[int] | None = None, n: int | None = None
) -> list[dict[str, Any]]:
    """Stress and parameter count of the rank-r MDS encodings (the paper's Table 2).

    ``P_MDS(r)`` = the first r columns of ``encoding``; embedded in width ``width`` with an
    orthonormal map its distances, and so its stress, do not change. It costs ``r(n + d)``
    parameters (``P = A W^T``) instead of ``n d``.

    Args:
        encoding: (m, k) MDS coordinates of the positions ``distances`` is about.
        distances: (m, m) d_H.
        width: model width d.
        ranks: ranks to evaluate (default :func:`default_ranks`); each must be <= k.
        n: positions for the parameter count (default m; pass the full count when
            ``encoding`` and ``distances`` are a subsample).

    Returns:
        One dict per rank: ``rank``, ``stress``, ``scaled_stress``, ``parameters``
        (``r(n + d)``), ``free_parameters`` (``n d``), ``saving`` (``1 - r(n+d)/(n d)``).
    """
    from posstats.geometry.stress import stress_report

    enc = np.asarray(encoding, dtype=np.float64)
    m, k = enc.shape
    n = m if n is None else int(n)
    ranks = default_ranks(k, width=width) if ranks is None else [int(r) for r in ranks]
    rows = []
    for r in ranks:
        if not 1 <= r <= k:
            msg = f"rank {r} is outside 1..{k} (the MDS coordinates available)"
            raise ValueError(msg)
        s = stress_report(enc[:, :r], distances)
        params = r * (n + width)
        rows.append({
            "rank": r,
            "stress": float(s.stress),
            "scaled_stress": float(s.scaled_stress),
            "parameters": params,
            "free_parameters": n * width,
            "saving": 1.0 - params / (n * width),
        })
    return rows


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
    """

    path: Path
    files: tuple[Path, ...]
    key: str
    table: np.ndarray
    factors: tuple[np.ndarray, np.ndarray] | None
    metadata: dict[str, str]
    tradeoff: list[dict[str, Any]]


def _guess_format(out: Path, fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in FORMATS:
            msg = f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}"
            raise InputError(msg)
        return fmt
    suffix = out.suffix.lower().lstrip(".")
    if suffix in FORMATS:
        return suffix
    msg = f"{out}: cannot tell the format from the suffix {out.suffix!r}; pass --format {'|'.join(FORMATS)}"
    raise InputError(msg)


def _check_contiguous(run: RunData) -> int:
    pos = run.positions
    m = pos.shape[0]
    if m and np.array_equal(pos, np.arange(m)):
        return m
    gap = int(np.flatnonzero(pos != np.arange(m))[0]) if m else 0
    mo = (run.report.get("config") or {}).get("min_occupancy", 1)
    msg = (
        f"{run.directory}: the MDS encoding covers positions {int(pos[0]) if m else '-'}..{int(pos[-1]) if m else '-'} "
        f"with gaps (position {gap} is unoccupied or below --min-occupancy {mo}); a model needs a row for "
        f"every position 0..n-1: re-run the analysis with --positions {gap} or a lower --min-occupancy"
    )
    raise InputError(msg)


def _fmt(x: float) -> str:
    return format(float(x), ".6g")


SMACOF_POSITION_LIMIT = 16_384


def export_encoding(
    run_dir: str | os.PathLike,
    out: str | os.PathLike,
    /,
    *,
    dim: int,
    rank: int | None = None,
    layout: str = "plain",
    format: str | None = None,  # noqa: A002 - mirrors the --format flag
    factors: bool = False,
    basis: str = "pad",
    seed: int = 0,
    dtype: str = "float32",
    card: bool = True,
    force: bool = False,
    method: str = "classical",
    smacof_max_iter: int = 300,
    smacof_tol: float = 1e-6,
) -> ExportResult:
    """Export a run's MDS encoding as an (n, dim) position table (see the module docstring).

    Args:
        run_dir: a folder written by ``posstats run`` / ``posstats analyze``.
        out: the file to write (``.safetensors``, ``.npy`` or ``.pt``).
        dim: model width d.
        rank: low-rank r <= dim (default: min(dim, coordinates in the run)).
        layout: ``bert`` | ``gpt2`` | ``plain`` (the key name).
        format: ``safetensors`` | ``npy`` | ``pt`` (default: from the suffix).
        factors: also write ``A`` (n x r) and ``W`` (d x r); needs ``rank``.
        basis: ``pad`` | ``random`` (the orthonormal ``W``); seed: for ``random``.
        dtype: ``float32`` (default) or ``float64``.
        card: write ``README.md`` and two figures next to ``out``.
        force: replace existing files.
        method: ``classical`` (the run's classical-MDS coordinates) or ``smacof`` (those
            refined at rank r by stress majorisation, :func:`posstats.geometry.encodings.mds_smacof`:
            lower stress at the same width; needs every used position's distances, so
            n <= 16,384).
        smacof_max_iter, smacof_tol: the SMACOF stopping rule.

    Raises:
        InputError / PosstatsError: a missing or non-contiguous run, rank > dim or above the
        coordinates available, an existing file without ``force``, an unknown option.
    """
    out = Path(out)
    fmt = _guess_format(out, format)
    if layout not in LAYOUT_KEYS:
        msg = f"unknown layout {layout!r}; use one of {', '.join(LAYOUT_KEYS)}"
        raise PosstatsError(msg)
    if basis not in BASES:
        msg = f"unknown basis {basis!r}; use one of {', '.join(BASES)}"
        raise PosstatsError(msg)
    if dtype not in ("float32", "float64"):
        msg = f"dtype must be float32 or float64; got {dtype!r}"
        raise PosstatsError(msg)
    if int(dim) != dim or dim < 1:
        msg = f"--dim must be a positive integer; got {dim}"
        raise PosstatsError(msg)
    if rank is not None and (int(rank) != rank or rank < 1):
        msg = f"--rank must be a positive integer; got {rank}"
        raise PosstatsError(msg)
    if rank is not None and rank > dim:
        msg = f"--rank {rank} exceeds --dim {dim}: a rank-r table needs width d >= r"
        raise PosstatsError(msg)
    if factors and rank is None:
        raise PosstatsError("the low-rank factors need --rank")
    if method not in ("classical", "smacof"):
        msg = f"unknown method {method!r}; use classical or smacof"
        raise PosstatsError(msg)

    run = load_run(run_dir)
    n = _check_contiguous(run)
    k = run.encoding.shape[1]
    if rank is not None and rank > k:
        msg = f"--rank {rank} exceeds the {k} MDS coordinates stored in {run.directory}/mds.safetensors (re-analyse with larger --dims)"
        raise PosstatsError(msg)
    r = int(rank) if rank is not None else min(int(dim), k)

    key = LAYOUT_KEYS[layout]
    stem = out.name[: -len(out.suffix)] if out.suffix else out.name
    targets = [out]
    if factors and fmt == "npy":
        targets += [out.with_name(f"{stem}.A.npy"), out.with_name(f"{stem}.W.npy")]
    card_files = [out.with_name("README.md"), out.with_name(f"{stem}.spectrum.png"), out.with_name(f"{stem}.lowrank.png")] if card else []
    existing = [p for p in targets + card_files if p.exists()]
    if existing and not force:
        msg = f"{existing[0]}: exists; pass --force to overwrite"
        raise PosstatsError(msg)
    for p in targets + card_files:
        if p.is_dir():
            msg = f"{p}: is a folder"
            raise PosstatsError(msg)

    a = np.ascontiguousarray(run.encoding[:, :r])
    fit: dict[str, str] = {"method": method}
    if method == "smacof":
        from posstats.geometry.encodings import mds_smacof

        if n > SMACOF_POSITION_LIMIT:
            msg = f"--method smacof needs all {n} x {n} distances; it is limited to n <= {SMACOF_POSITION_LIMIT}"
            raise PosstatsError(msg)
        _, full = run_distances(run)
        a, details = mds_smacof(run, full, r, max_iter=smacof_max_iter, tol=smacof_tol)
        fit.update({f"smacof_{k}": _fmt(v) if isinstance(v, float) else str(v) for k, v in details.items() if k not in ("method", "rank")})
    w = orthonormal_basis(int(dim), r, basis=basis, seed=seed)
    np_dtype = np.dtype(dtype)
    table = np.ascontiguousarray((a @ w.T).astype(np_dtype))

    idx, dist = run_distances(run, max_positions=STRESS_POSITION_LIMIT)
    from posstats.geometry.stress import stress_report

    s = stress_report(table[idx].astype(np.float64), dist)
    spectrum = run.report.get("spectrum") or {}
    explained = spectrum.get("explained_variance") or []
    corpus = run.report.get("corpus") or {}
    metadata = {
        "schema": EXPORT_SCHEMA,
        "layout": layout,
        "key": key,
        "n": str(n),
        "d": str(int(dim)),
        "rank": str(r),
        "basis": basis if basis == "pad" else f"random:seed={seed}",
        "dtype": dtype,
        "stress": _fmt(s.stress),
        "scaled_stress": _fmt(s.scaled_stress),
        "stress_positions": str(len(idx)),
        "explained_variance": _fmt(explained[r - 1]) if len(explained) >= r else "",
        "corpus_fingerprint": str(corpus.get("fingerprint", "")),
        "tokenizer": str(corpus.get("tokenizer", "")),
        "tokenizer_hash": str(corpus.get("tokenizer_hash", "")),
        "tool": "posstats",
        "tool_version": __version__,
        "run_id": run.run_id,
        "positions": f"0..{n - 1}",
        **fit,
    }

    tensors = {key: table}
    if factors:
        tensors[FACTOR_KEYS[0]] = np.ascontiguousarray(a.astype(np_dtype))
        tensors[FACTOR_KEYS[1]] = np.ascontiguousarray(w.astype(np_dtype))

    tradeoff: list[dict[str, Any]] = []
    written: list[Path] = []
    if card:
        from posstats.reports.plots import lowrank_figure, spectrum_figure

        tradeoff = lowrank_tradeoff(run.encoding[idx], dist, width=int(dim), ranks=default_ranks(k, width=int(dim), extra=(r,)), n=n)
        fig = spectrum_figure(run.eigenvalues, _explained(run), rank=spectrum.get("rank"))
        written.append(_save_named(fig, card_files[1]))
        written.append(_save_named(lowrank_figure(tradeoff, n=n, width=int(dim)), card_files[2]))

    written += _write_tensors(fmt, out, tensors, metadata, key=key, factor_paths=targets[1:])
    if card:
        from posstats.counting.io import atomic_path

        text = model_card(metadata, tradeoff, file_name=out.name, fmt=fmt, report=run.report,
                          figures=(card_files[1].name, card_files[2].name), factors=factors)
        with atomic_path(card_files[0]) as tmp:
            tmp.write_text(text)
        written.append(card_files[0])
    return ExportResult(out, tuple(written), key, table, (a, w) if factors else None, metadata, tradeoff)


def _explained(run: RunData) -> np.ndarray:
    """Cumulative explained variance of the run's eigenvalues (report.json's, else recomputed)."""
    ev = (run.report.get("spectrum") or {}).get("explained_variance")
    if ev and len(ev) >= len(run.eigenvalues):
        return np.asarray(ev[: len(run.eigenvalues)], dtype=np.float64)
    lam = run.eigenvalues
    total = float(lam[lam > 0].sum())
    return np.cumsum(lam) / total if total > 0 else np.zeros_like(lam)


def _save_named(plot, path: Path) -> Path:
    from posstats.reports.plots import png_bytes
    from posstats.counting.io import atomic_path

    data = png_bytes(plot)
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return path


def _write_tensors(fmt: str, out: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str], *, key: str, factor_paths: list[Path]) -> list[Path]:
    from posstats.counting.io import atomic_path

    if fmt == "safetensors":
        from safetensors.numpy import save_file

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
        raise PosstatsError("--format pt needs torch (pip install torch)") from exc
    with atomic_path(out) as tmp:
        torch.save({k: torch.from_numpy(v.copy()) for k, v in tensors.items()}, tmp)
    return [out]


def _yaml_value(v: Any) -> str:
    # JSON strings and numbers are valid YAML scalars, and need no YAML library.
    return json.dumps(v)


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
) -> str:
    """The ``README.md`` model card of an export: YAML front matter + Markdown."""
    n, d, r = int(metadata["n"]), int(metadata["d"]), int(metadata["rank"])
    key = metadata["key"]
    front = ["---", "library_name: posstats", "tags:", "  - positional-encoding", "  - mds", "  - hellinger",
             f"file: {_yaml_value(file_name)}", f"format: {_yaml_value(fmt)}", "posstats:"]
    front += [f"  {k}: {_yaml_value(v)}" for k, v in metadata.items()]
    front.append("---")
    corpus = report.get("corpus") or {}
    spectrum = report.get("spectrum") or {}
    cf = spectrum.get("components_for") or {}
    lines = [
        "",
        f"# Information-optimal positional encoding ({n} positions, width {d}, rank {r})",
        "",
        f"`{file_name}` holds the classical-MDS positional encoding of a corpus (THEORY.md section 3 of "
        "posstats): the position table whose pairwise distances best reproduce the Hellinger distances "
        "between the token distributions at each position. Add it to the token embeddings as a learned "
        "absolute position table (frozen or as an initialisation).",
        "",
        "## Key numbers",
        "",
        "| quantity | value |",
        "|---|---|",
        f"| positions n | {n} (rows 0..{n - 1}) |",
        f"| width d / rank r | {d} / {r} |",
        f"| tensor | `{key}` ({metadata['dtype']}, {n} x {d}) |",
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
    excluded = corpus.get("exclude_ids") or []
    if excluded:
        lines += [
            f"Row i is corpus position i with token ids {', '.join(map(str, excluded[:10]))}"
            f"{' ...' if len(excluded) > 10 else ''} removed before positions were counted. A model that puts a "
            "special token first (BERT's [CLS] at row 0) sees its first text token at row 1: count with "
            "`--exclude-tokens ''` for a table indexed by the model's own positions.",
            "",
        ]
    if tradeoff:
        lines += [
            "## Rank / stress / parameters",
            "",
            "| rank r | stress | scaled stress | parameters r(n+d) | saving vs n*d |",
            "|---:|---:|---:|---:|---:|",
        ]
        for row in tradeoff:
            lines.append(f"| {row['rank']} | {row['stress']:.4g} | {row['scaled_stress']:.4g} | {row['parameters']:,} | {row['saving']:.1%} |")
        lines.append("")
    if figures:
        lines += ["## Figures", "", f"![MDS eigenspectrum]({figures[0]})", "",
                  f"![rank / stress / parameter trade-off]({figures[1]})", ""]
    load = {
        "safetensors": f'from safetensors.torch import load_file\ntable = load_file("{file_name}")["{key}"]',
        "npy": f'import numpy as np\ntable = np.load("{file_name}", allow_pickle=False)',
        "pt": f'import torch\ntable = torch.load("{file_name}", weights_only=True)["{key}"]',
    }[fmt]
    lines += [
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
        "Stress = sum (e - h)^2 / sum h^2 over position pairs (h = Hellinger distance between positions, e = "
        "distance between table rows); scaled stress is the stress at the optimal scale.",
        "",
    ]
    return "\n".join(front + lines)
