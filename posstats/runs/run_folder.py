"""A run folder and the run it holds: what the HTML report and the export render from.

``posstats run`` / ``posstats analyze`` / the pipeline's geometry stage write a run folder
(:func:`posstats.reports.analysis_folder.write_analysis`):

- ``mds.safetensors``: tensors ``positions`` (m,) int64 used positions, ``eigenvalues``
  (k,) float64 descending, ``encoding`` (m, k) float64 ``P_MDS`` (optionally
  ``residuals`` (k,), and where occupancies differ and the occupancy-weighted rank test
  counted components, ``weighted_encoding`` (m, r) their coordinates); string metadata
  ``schema`` (``posstats.mds/1``), ``method``,
  ``fingerprint`` (:func:`write_mds`);
- ``report.json`` (the schema in docs/report.md), ``report.md``, ``analysis-config.json``.

:class:`RunData` is such a run in memory: either read back from a folder
(:func:`load_run`), or built from the analysis that has just been computed
(:func:`run_from_analysis`), in which case it also holds the counts and the plug-in
distances, so that rendering a report or an export computes nothing twice.
:func:`run_distances` gives the d_H of (a sample of) the used positions: sliced from the
held matrix, else computed from the counts (those held, else the run's counts file,
checked against the analysed corpus' fingerprint).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from safetensors import safe_open
from safetensors.numpy import save_file

from posstats.analysis import Analysis
from posstats.counting.buckets import bucket_counts, parse_buckets
from posstats.counting.counts import PositionalCounts
from posstats.counting.io import check_counts_file, counts_file, load_counts, load_header, load_selected_rows
from posstats.errors import InputError
from posstats.estimates.noise import corrected_squared_distances
from posstats.estimates.occupancy import OccupancyShrinkage, adjusted
from posstats.geometry.hellinger import hellinger_sq
from posstats.geometry.mds import MDSResult
from posstats.storage.publish import atomic_path, published_dir

__all__ = [
    "even_subsample",
    "MDS_FILE",
    "MDS_SCHEMA",
    "REPORT_FILE",
    "RunData",
    "load_run",
    "report_bias",
    "run_distances",
    "run_from_analysis",
    "sparse_rows",
    "with_distances",
    "write_mds",
]

MDS_FILE = "mds.safetensors"
MDS_SCHEMA = "posstats.mds/1"
REPORT_FILE = "report.json"


@dataclass(frozen=True)
class RunData:
    """A run: its report and MDS coordinates, and what is held in memory besides.

    Attributes:
        directory: the run folder, as given.
        report: ``report.json``.
        positions: (m,) int64 used positions (``mds.safetensors`` ``positions``).
        eigenvalues: (k,) float64 MDS eigenvalues, descending.
        encoding: (m, k) float64 MDS coordinates of the used positions.
        mds_metadata: the string metadata of ``mds.safetensors``.
        files: the folder the files were read from: the run folder's current published
            version (:func:`posstats.storage.publish.published_dir`); None means ``directory``.
        distances: (m, m) float64 plug-in d_H between the used positions when held in
            memory (a run just analysed, or :func:`with_distances`), else None.
        counts: the analysed counts when held in memory, else None (read from the
            run's counts file when needed).
        counts_source: the counts file to read from when ``counts`` is None (an analysis
            over position ranges held no counts: :func:`run_from_analysis`); that analysis
            read and checked every row of it and its token total, so its readers here check
            only its header. None: the run folder's, else ``report.json`` ``inputs.counts``.
        weighted_encoding: (m, r) float64 coordinates of the r components the
            occupancy-weighted rank test counted (``mds.safetensors`` ``weighted_encoding``,
            :attr:`posstats.analysis.Analysis.weighted_encoding`), or None.
    """

    directory: Path
    report: dict[str, Any]
    positions: np.ndarray
    eigenvalues: np.ndarray
    encoding: np.ndarray
    mds_metadata: dict[str, str] = field(default_factory=dict)
    files: Path | None = None
    distances: np.ndarray | None = None
    counts: PositionalCounts | None = None
    counts_source: Path | None = None
    weighted_encoding: np.ndarray | None = None

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
        return hashlib.sha256((self.folder / REPORT_FILE).read_bytes()).hexdigest()[:16]

    def counts_path(self) -> Path:
        """The counts of this run: those in the run folder, else ``report.json`` ``inputs.counts``."""
        if self.counts_source is not None:
            return counts_file(self.counts_source)
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


def even_subsample(m: int, /, limit: int) -> np.ndarray:
    """At most ``limit`` evenly spaced indices of ``range(m)``, first and last included.

    >>> even_subsample(10, 4)
    array([0, 3, 6, 9])
    """
    if limit < 1:
        msg = f"limit must be >= 1; got {limit}"
        raise ValueError(msg)
    if m <= limit:
        return np.arange(m)
    if limit == 1:
        return np.array([0])
    return np.unique(np.round(np.linspace(0, m - 1, limit)).astype(np.int64))


def _mds_metadata(mds: MDSResult, fingerprint: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The string metadata of ``mds.safetensors``."""
    return {"schema": MDS_SCHEMA, "method": mds.method, **(extra or {}), "fingerprint": fingerprint}


def write_mds(
    path: str | os.PathLike,
    positions: np.ndarray,
    mds: MDSResult,
    /,
    *,
    fingerprint: str,
    residuals: bool = False,
    metadata: dict[str, str] | None = None,
    weighted: np.ndarray | None = None,
) -> Path:
    """Write ``mds.safetensors`` atomically: ``positions`` (m,) as int64, the MDS
    ``eigenvalues`` (k,) and ``encoding`` (m, k), with ``residuals`` the solver's
    residuals (k,), with ``weighted`` the (m, r) occupancy-weighted coordinates
    (``weighted_encoding``); metadata ``schema``, ``method``, ``fingerprint`` plus ``metadata``."""
    tensors = {
        "positions": np.asarray(positions).astype("int64"),
        "eigenvalues": np.ascontiguousarray(mds.eigenvalues),
        "encoding": np.ascontiguousarray(mds.encoding),
    }
    if residuals:
        tensors["residuals"] = np.ascontiguousarray(mds.residuals)
    if weighted is not None:
        tensors["weighted_encoding"] = np.ascontiguousarray(weighted, dtype=np.float64)
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=_mds_metadata(mds, fingerprint, metadata))
    return Path(path)


def run_from_analysis(analysis: Analysis, report: dict[str, Any], /, *, folder: str | os.PathLike) -> RunData:
    """The run an analysis makes, in memory: its ``report`` (as written to ``folder``), MDS
    coordinates, counts and distances: the one matrix the analysis used (plug-in or
    bias-corrected, ``geometry.distances``; None above the exact limit). An analysis over
    position ranges holds no counts: the run reads the rows it needs from the counts file
    the ranges were read from (``analysis.counts_source``)."""
    return RunData(
        directory=Path(folder),
        report=report,
        positions=np.asarray(analysis.positions).astype(np.int64),
        eigenvalues=np.asarray(analysis.mds.eigenvalues, dtype=np.float64),
        encoding=np.asarray(analysis.mds.encoding, dtype=np.float64),
        mds_metadata=_mds_metadata(analysis.mds, analysis.counts.fingerprint),
        files=Path(folder),
        distances=analysis.distances,
        counts=analysis.counts if analysis.occupancy is None else None,
        counts_source=None if analysis.counts_source is None else Path(analysis.counts_source),
        weighted_encoding=analysis.weighted_encoding,
    )


# report.json sections and the type each must have (what every reader of a run folder
# relies on); a section may be absent (older reports) but never of another type
_REPORT_SECTIONS: dict[str, type | tuple[type, ...]] = {
    "schema_version": int, "tool": dict, "created": str, "config": dict, "corpus": dict, "positions": dict,
    "hellinger": dict, "diagnostics": dict, "spectrum": dict, "encodings": list, "timings_s": dict, "noise": dict,
    "geometry": dict, "null": dict, "held_out": dict, "inputs": dict, "verdict": dict,
    "bootstrap": dict,  # reports written before the shard bootstrap was withdrawn
    "buckets": dict, "skipped_encodings": list, "run_id": str,
}
_NUMBER_LISTS = (("positions", "occupancy"), ("spectrum", "eigenvalues"), ("noise", "bias_per_position"))


def check_report(report: Any, /) -> str | None:
    """What makes a parsed ``report.json`` unusable, or None: its sections must have their
    types (:data:`_REPORT_SECTIONS`), ``encodings`` must be objects with a string ``name``
    and an integer ``dim``, and the per-position lists the readers index must hold numbers."""
    if not isinstance(report, dict):
        return f"expected a JSON object, got {type(report).__name__}"
    for key, kind in _REPORT_SECTIONS.items():
        if key in report and report[key] is not None and not isinstance(report[key], kind):
            return f"section {key!r} must be {_kind_name(kind)}, got {type(report[key]).__name__}"
    for i, entry in enumerate(report.get("encodings") or []):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not _is_int(entry.get("dim")):
            return f"encodings[{i}] must be an object with a string name and an integer dim"
    for section, key in _NUMBER_LISTS:
        value = (report.get(section) or {}).get(key)
        if value is not None and not (isinstance(value, list) and all(
                v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in value)):
            return f"{section}.{key} must be a list of numbers"
    return None


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {dict: "an object", list: "a list", str: "a string", int: "an integer"}
    return " or ".join(names.get(k, k.__name__) for k in (kind if isinstance(kind, tuple) else (kind,)))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_report(path: Path) -> dict[str, Any]:
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        text = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        msg = f"{path}: not readable JSON ({text[:200]})"
        raise InputError(msg) from None
    problem = check_report(report)
    if problem:
        msg = f"{path}: not a posstats report ({problem}); analyse the counts again"
        raise InputError(msg)
    return report


def _read_mds(path: Path) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """(metadata, {positions, eigenvalues, encoding[, weighted_encoding]}) of an ``mds.safetensors``."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = dict(f.metadata() or {})
            names = ("positions", "eigenvalues", "encoding", *(("weighted_encoding",) if "weighted_encoding" in f.keys() else ()))
            tensors = {k: f.get_tensor(k) for k in names}
    except Exception as exc:  # noqa: BLE001 - safetensors raises several kinds
        msg = f"{path}: not a readable MDS file ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
        raise InputError(msg) from exc
    return meta, tensors


def load_run(run_dir: str | os.PathLike, /) -> RunData:
    """Load ``report.json`` and ``mds.safetensors`` of a run folder.

    Raises:
        InputError: no such folder, or one without a readable report / MDS file.
    """
    d = Path(run_dir)
    if not d.is_dir():
        msg = f"{d}: no such run folder"
        raise InputError(msg)
    files = published_dir(d)
    report_path, mds_path = files / REPORT_FILE, files / MDS_FILE
    for p in (report_path, mds_path):
        if not p.is_file():
            msg = f"{d}: no {p.name} in this folder (run 'posstats run' or 'posstats analyze' first)"
            raise InputError(msg)
    report = _read_report(report_path)
    meta, tensors = _read_mds(mds_path)
    positions = tensors["positions"].astype(np.int64).reshape(-1)
    encoding = tensors["encoding"].astype(np.float64)
    weighted = tensors.get("weighted_encoding")
    for name, x in (("encoding", encoding), ("weighted_encoding", weighted)):
        if x is not None and (x.ndim != 2 or x.shape[0] != positions.shape[0]):
            msg = f"{mds_path}: {name} shape {x.shape} does not match {positions.shape[0]} positions"
            raise InputError(msg)
    return RunData(d, report, positions, tensors["eigenvalues"].astype(np.float64).reshape(-1), encoding, meta, files,
                   weighted_encoding=None if weighted is None else weighted.astype(np.float64))


def _run_counts(run: RunData) -> PositionalCounts:
    """The run's counts: those held, else its counts file, checked to be the analysed corpus."""
    if run.counts is not None:
        return run.counts
    path = run.counts_path()
    counts = load_counts(path)
    _check_counts_are_the_runs(run, counts, path)
    return counts


def _used_rows(run: RunData, positions: np.ndarray, /) -> Any:
    """The counts rows of the used ``positions`` as the analysis saw them: from the counts
    held, else (without buckets) only those rows read from the run's counts file
    (:func:`posstats.counting.io.load_selected_rows`, after the file's checks, a block of rows
    at a time, and checked to be the analysed corpus), else from the whole counts file."""
    if run.counts is not None or ((run.report.get("config") or {}).get("buckets") or "none") != "none":
        return _geometry_rows(_run_counts(run), run.report, positions)
    path = run.counts_path()
    if run.counts_source is not None:  # the analysis over ranges read and checked every row of it
        header = load_header(path)
    else:
        header = check_counts_file(path)  # every check load_counts makes, a block of rows at a time
    _check_counts_are_the_runs(run, header, path)
    return load_selected_rows(path, positions)


def _check_counts_are_the_runs(run: RunData, counts: PositionalCounts, path: Path, /) -> None:
    """InputError when ``counts`` (or their header) are not the corpus ``run`` analysed: another
    fingerprint, or fewer positions than the run used."""
    expected = run.mds_metadata.get("fingerprint") or (run.report.get("corpus") or {}).get("fingerprint")
    if expected and counts.fingerprint and counts.fingerprint != expected:
        msg = (
            f"{path}: counts fingerprint {counts.fingerprint[:16]} is not the analysed corpus' "
            f"{expected[:16]} (the counts changed after the analysis; re-run 'posstats analyze')"
        )
        raise InputError(msg)
    if run.positions.size and int(run.positions.max()) >= counts.positions:
        msg = f"{path}: has {counts.positions} positions but the run used position {int(run.positions.max())}"
        raise InputError(msg)


def _geometry_rows(counts: PositionalCounts, report: dict[str, Any], positions: np.ndarray) -> Any:
    """The counts rows of used ``positions`` as the analysis saw them: with buckets
    (``config.buckets``), the pooled counts of the buckets whose midpoints they are."""
    buckets = parse_buckets((report.get("config") or {}).get("buckets"), counts.positions)
    if buckets is None:
        return counts.rows(positions)
    return bucket_counts(counts, buckets).rows(buckets.bucket_of(positions))


def run_distances(run: RunData, /, *, max_positions: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Hellinger distances d_H between the run's used positions: the matrix its analysis used
    (``geometry.distances`` of the report: plug-in, or bias-corrected).

    Sliced from ``run.distances`` when held, else ``sqrt(hellinger_sq(rows))`` of the
    counts' rows (:func:`posstats.geometry.hellinger.hellinger_sq`), bias-corrected with the
    report's per-position bias (``noise.bias_per_position``) when the analysis was, the
    occupancy shrinkage of every used row removed first when it was
    (``hellinger.occupancy_adjusted``, :mod:`posstats.estimates.occupancy`).

    Args:
        run: from :func:`load_run` or :func:`run_from_analysis`.
        max_positions: above this many used positions, an even subsample of them.

    Returns:
        ``(idx, D)``: indices into ``run.positions`` (all of them, or the subsample) and the
        (len(idx), len(idx)) float64 d_H between those positions.

    Raises:
        InputError: the counts are missing or are not the ones the run analysed.
    """
    m = run.positions.shape[0]
    idx = np.arange(m) if max_positions is None else even_subsample(m, max_positions)
    if run.distances is not None:
        return idx, run.distances if idx.size == m else run.distances[np.ix_(idx, idx)]
    rows = sparse_rows(_used_rows(run, run.positions[idx]))
    d2 = np.asarray(hellinger_sq(rows), dtype=np.float64)
    if (run.report.get("geometry") or {}).get("distances") == "bias_corrected":
        if (run.report.get("hellinger") or {}).get("occupancy_adjusted"):
            every = rows if idx.size == m else sparse_rows(_used_rows(run, run.positions))
            adjusted(d2, rows, shrinkage=OccupancyShrinkage.from_totals(every.sum(axis=1), every.sum(axis=0)))
        d2 = corrected_squared_distances(d2, report_bias(run.report, run.positions[idx]))
    return idx, np.sqrt(d2)


def report_bias(report: dict[str, Any], positions: np.ndarray) -> np.ndarray:
    """(len(positions),) the per-position bias ``b_i`` the report's noise floor recorded.

    Raises:
        InputError: a position the noise floor did not describe."""
    noise = report.get("noise") or {}
    table = dict(zip(noise.get("positions") or [], noise.get("bias_per_position") or []))
    missing = [int(x) for x in positions if int(x) not in table]
    if missing:
        msg = f"the report's noise floor has no bias for position(s) {missing[:5]}; analyse the counts again"
        raise InputError(msg)
    return np.array([np.nan if table[int(x)] is None else float(table[int(x)]) for x in positions])


def with_distances(run: RunData, /) -> RunData:
    """``run`` holding the (m, m) d_H of all its used positions, computed once here (when
    not held already) for every consumer after it."""
    if run.distances is not None:
        return run
    return dataclasses.replace(run, distances=run_distances(run)[1])


def sparse_rows(rows: Any, /) -> Any:
    """``rows`` as a scipy CSR array when dense and under 10 % filled (token counts of a
    position usually are), which makes the Gram product of :func:`hellinger_sq` cost
    O(nnz) instead of O(n V); otherwise ``rows`` unchanged."""
    if sp.issparse(rows) or rows.size == 0 or np.count_nonzero(rows) > 0.1 * rows.size:
        return rows
    return sp.csr_array(rows)
