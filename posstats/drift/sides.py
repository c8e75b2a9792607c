"""The two things a diff compares: count folders, run folders, or runs of a pipeline store.

A :class:`Side` names a counts file (read range by range, never whole) and, for a run, the
run's report and MDS encoding. :func:`check_comparable` refuses two sides counted
differently (positions, vocabulary, mode, exclusions, separator, tokenizer): their
positional distributions would not be the same quantity.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posstats.counting.counts import PositionalCounts
from posstats.counting.io import counts_file, load_header
from posstats.errors import InputError, OptionError
from posstats.runs.run_folder import MDS_FILE, REPORT_FILE, RunData, load_run
from posstats.service.pipeline_store import Store, sorted_runs
from posstats.storage.publish import published_dir

__all__ = ["Side", "check_comparable", "load_side", "store_run_side", "store_sides"]


@dataclass(frozen=True)
class Side:
    """One side of a diff.

    Attributes:
        label: how the user named it (a path, or ``store run ID``).
        kind: ``counts`` (a count folder or file) or ``run`` (a run folder / a store run).
        counts_path: the counts file.
        header: spec, totals, fingerprint and metadata of the counts (no counts).
        run: the run's report and MDS encoding, for a run; else None.
    """

    label: str
    kind: str
    counts_path: Path
    header: PositionalCounts
    run: RunData | None = None

    def describe(self) -> dict[str, Any]:
        """The diff.json ``a`` / ``b`` entry: what was compared."""
        h = self.header
        out = {"label": self.label, "kind": self.kind, "counts": str(_published_folder(self.counts_path)), "fingerprint": h.fingerprint,
               "sequences": h.sequences, "tokens_counted": h.tokens, "positions": h.positions, "vocab_size": h.vocab_size,
               "mode": h.spec.mode}
        if self.run is not None:
            out["run_id"] = self.run.run_id
            out["analysed"] = self.run.report.get("created")
        return out


def _published_folder(counts_path: Path) -> Path:
    """The folder a user names for a counts file: the counts file itself, or, for one inside
    a published folder's internal versions (``FOLDER/.posstats/v-.../counts...``), FOLDER."""
    parts = counts_path.parts
    if ".posstats" in parts:
        return Path(*parts[: parts.index(".posstats")])
    return counts_path


def _is_run_folder(path: Path) -> bool:
    if not path.is_dir():
        return False
    files = published_dir(path)
    return (files / REPORT_FILE).is_file() and (files / MDS_FILE).is_file()


def load_side(path: str | os.PathLike, /, *, label: str | None = None, counts: str | os.PathLike | None = None) -> Side:
    """A side from a run folder (``report.json`` + ``mds.safetensors``; its counts are those
    in the folder or the ones its report names, or ``counts``) or from counts (a count folder
    or a counts file).

    Raises:
        InputError: neither a run folder nor counts, or a run whose counts are gone.
    """
    p = Path(path)
    label = label or str(path)
    if not p.exists():
        msg = f"{p}: no such count folder or run folder"
        raise InputError(msg)
    if _is_run_folder(p):
        run = load_run(p)
        file = counts_file(counts) if counts is not None else run.counts_path()
        return Side(label, "run", file, load_header(file), run)
    try:
        file = counts_file(p)
    except InputError as exc:
        msg = f"{p}: not a count folder or a run folder ({exc})"
        raise InputError(msg) from None
    return Side(label, "counts", file, load_header(file))


_COMPARED = (
    ("positions", lambda h: h.spec.positions),
    ("vocabulary size", lambda h: h.spec.vocab_size),
    ("mode", lambda h: h.spec.mode),
    ("excluded ids", lambda h: list(h.spec.exclude_ids)),
    ("separator id", lambda h: h.spec.separator_id),
    ("tokenizer", lambda h: h.metadata.get("tokenizer_hash") or None),
)


def check_comparable(a: Side, b: Side, /) -> None:
    """Refuse two sides counted under different options (one line naming both values).
    A tokenizer hash recorded on one side only is not a mismatch (older counts lack it)."""
    for what, get in _COMPARED:
        x, y = get(a.header), get(b.header)
        if what == "tokenizer" and (x is None or y is None):
            continue
        if x != y:
            msg = (f"{a.label} and {b.label} were counted differently: {what} {x!r} vs {y!r}; a diff needs the same "
                   "positions, vocabulary, mode, exclusions and tokenizer on both sides")
            raise InputError(msg)


def store_run_side(store: Any, run_id: str, cache: str | os.PathLike | None = None) -> Side:
    """A run of a pipeline store (:class:`posstats.service.pipeline_store.Store`) as a side: its
    geometry stage (a run folder) and reduce stage (its counts), each checked against its
    stage marker's checksums first (:meth:`Store.stage_dir`): read in place in a local
    store, downloaded into ``cache`` from a remote one (the caller owns and removes it).

    Raises:
        InputError: the run has no completed geometry and reduce stage.
        PosstatsError: a stage fails its checksums (damaged or tampered with).
    """
    if store.stage_marker(run_id, "geometry") is None or store.stage_marker(run_id, "reduce") is None:
        msg = f"{store.display()}: run {run_id} has no completed geometry stage to compare"
        raise InputError(msg)
    if not store.local and cache is None:
        msg = "a remote store's runs are downloaded: pass a cache folder"
        raise ValueError(msg)
    root = Path(cache) / run_id if cache is not None else None
    geometry, reduce = (store.stage_dir(run_id, s, root / s if root else None) for s in ("geometry", "reduce"))
    return load_side(geometry, label=f"run {run_id}", counts=reduce)


def store_sides(url: str, runs: list[str] | None = None, /, *, storage_options: dict[str, Any] | None = None,
                cache: str | os.PathLike | None = None) -> tuple[Side, Side]:
    """The two store runs to compare: ``runs`` (two run ids), else the complete run that
    finished before ``latest`` and ``latest`` itself. A remote store's runs are downloaded
    into ``cache`` (required then; the caller removes it).

    Raises:
        InputError: unknown run ids, fewer than two complete runs.
    """
    store = Store(url, storage_options=storage_options)
    if runs:
        if len(runs) != 2:
            msg = f"{{runs}} takes two run ids (ID,ID), got {len(runs)}"
            raise OptionError(msg)
        known = set(store.run_ids())
        for rid in runs:
            if rid not in known:
                msg = f"{store.display()}: no run {rid!r} (runs: {', '.join(sorted(known)) or 'none'})"
                raise InputError(msg)
        pair = list(runs)
    else:
        latest = (store.latest() or {}).get("run_id")
        done = [r["run_id"] for r in sorted_runs([store.run_status(r) for r in store.run_ids()]) if r["complete"]]
        if latest is None or latest not in done or done.index(latest) == 0:
            msg = f"{store.display()}: needs two complete runs to compare (latest: {latest or 'none'}); give {{runs}} ID,ID"
            raise OptionError(msg)
        pair = [done[done.index(latest) - 1], latest]
    return store_run_side(store, pair[0], cache), store_run_side(store, pair[1], cache)
