"""What changed between two corpora (or two refreshes), separated from sampling noise.

:func:`diff` builds the ``diff.json`` document (schema in docs/report.md) from two
:class:`~posstats.drift.sides.Side` objects:

- ``positions``: the per-position two-sample test of
  :mod:`posstats.estimates.two_sample` (``d_H(A_i, B_i)``, the distance sampling alone gives,
  p-values, Holm's decisions at the family-wise level), read block by block from both
  counts files (never either corpus whole);
- ``spectrum``: both MDS spectra, ranks and components above the null;
- ``encodings``: the stress of every encoding scored on both sides, its change, and whether
  the change exceeds the stress intervals (sampled stress; exact stress has none);
- ``mds_drift``: how far each position moved in the MDS encoding a model team may have
  exported, after the best rotation (:mod:`posstats.geometry.procrustes`).

A side that is a run folder brings its report and MDS encoding; one that is only counts is
analysed first (:func:`posstats.analysis.analyze` with the given configuration).
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from posstats import __version__
from posstats.analysis import analyze
from posstats.counting.io import load_counts, load_indptr, load_rows
from posstats.drift.sides import Side, check_comparable
from posstats.errors import InputError
from posstats.estimates.two_sample import (
    BLOCK_ENTRIES,
    PositionTest,
    block_bounds,
    compare_positions,
)
from posstats.estimates.verdict import DISTANCE_NOISE_CAVEAT
from posstats.estimates.standout import position_ranges
from posstats.geometry.procrustes import procrustes_drift

__all__ = ["DIFF_SCHEMA_VERSION", "DiffResult", "SideGeometry", "diff", "headline", "side_geometry"]

DIFF_SCHEMA_VERSION = 1
_SPECTRUM_SHOWN = 64  # eigenvalues listed per side
_TOP = 20  # positions listed by size of change / drift


@dataclass(frozen=True)
class SideGeometry:
    """What the global comparison needs from one side: its report, the positions its MDS
    used, their MDS coordinates and the eigenvalues."""

    report: dict[str, Any]
    positions: np.ndarray
    encoding: np.ndarray
    eigenvalues: np.ndarray


@dataclass(frozen=True)
class DiffResult:
    """:func:`diff`'s result: the JSON document and the per-position test behind it."""

    document: dict[str, Any]
    test: PositionTest
    geometry: tuple[SideGeometry, SideGeometry]


def side_geometry(side: Side, config: Any = None, *, show_progress: bool | None = None) -> SideGeometry:
    """The side's report and MDS: read from a run, or from an analysis of its counts
    (``config``: :class:`posstats.analysis.AnalysisConfig`; default options when None)."""
    if side.run is not None:
        r = side.run
        return SideGeometry(r.report, r.positions, r.encoding, r.eigenvalues)
    analysis = analyze(load_counts(side.counts_path, compact=True), config, show_progress=show_progress)
    return SideGeometry(analysis.report().to_dict(), np.asarray(analysis.positions), analysis.mds.encoding, analysis.mds.eigenvalues)


def _rounded(values: np.ndarray, digits: int = 7) -> list[float | None]:
    """JSON list: NaN -> null, others to ``digits`` significant digits."""
    return [None if not math.isfinite(v) else float(f"{v:.{digits}g}") for v in np.asarray(values, dtype=np.float64).tolist()]


def _positions_entry(t: PositionTest) -> dict[str, Any]:
    tested = t.tested
    changed = np.flatnonzero(t.changed)
    order = np.argsort(np.where(tested, t.p_value, np.inf), kind="stable")[: min(_TOP, int(tested.sum()))]
    return {
        "n": int(t.d_h.shape[0]),
        "tested": int(tested.sum()),
        "level": t.level,
        "method": "permutation null of tokens (hypergeometric), gamma tail, Holm family-wise",
        "count_changed": int(changed.size),
        "changed": changed.tolist(),
        "changed_ranges": position_ranges(changed),
        "empty_in_a": t.empty_in_a.tolist(),
        "empty_in_b": t.empty_in_b.tolist(),
        "most_significant": [{"position": int(i), "d_h": float(t.d_h[i]), "expected_d_h": float(t.expected_d_h[i]),
                              "p_value": float(t.p_value[i]), "changed": bool(t.changed[i])} for i in order],
        "occupancy_a": t.occupancy_a.astype(np.int64).tolist(),
        "occupancy_b": t.occupancy_b.astype(np.int64).tolist(),
        "d_h": _rounded(t.d_h),
        "expected_d_h": _rounded(t.expected_d_h),
        "threshold_d_h": _rounded(np.where(tested, t.threshold_d_h(), np.nan)),
        "low_d_h": _rounded(np.where(tested, t.quantile_d_h(0.975), np.nan)),
        "p_value": _rounded(t.p_value, 4),
        "checked_by_simulation": [{"position": int(i), **c} for i, c in sorted(t.checked.items())],
    }


def _spectrum_of(g: SideGeometry) -> dict[str, Any]:
    s = g.report.get("spectrum") or {}
    return {
        "eigenvalues": _rounded(g.eigenvalues[:_SPECTRUM_SHOWN]),
        "rank": s.get("rank"),
        "components_for": s.get("components_for"),
        "components_above_null": s.get("components_above_null"),
        "distances": (g.report.get("geometry") or {}).get("distances", "plugin"),
        "positions_used": int(g.positions.size),
    }


def _interval(e: dict[str, Any]) -> tuple[list[float] | None, str | None]:
    """The scaled-stress 95 % interval of a report entry and its kind (the jackknife's or
    the sampled stress'), else none. A ``bootstrap`` section (reports written before the
    shard bootstrap was withdrawn) is not read: its intervals did not cover the truth
    (docs/calibration.md)."""
    ci = e.get("scaled_stress_ci95")
    if ci and ci[1] > ci[0]:
        how = str(e.get("stress_interval") or "")
        return [float(ci[0]), float(ci[1])], ("jackknife 95 %" if how.startswith("jackknife") else "sampled 95 %")
    return None, None


def _why_none(e: dict[str, Any]) -> str:
    """Why a report entry has no scaled-stress interval: its own reason (``stress_interval``:
    fitted above the jackknife's limit, noise, ...), else the exact stress's."""
    why = str(e.get("stress_interval") or "")
    if why.startswith("none:"):
        return why
    return "none (exact stress over all pairs, without a jackknife interval)"


def _noisy_sides(a: SideGeometry, b: SideGeometry) -> str | None:
    """Why stress intervals cannot be compared: a side whose distances are at least
    ``DISTANCE_NOISE_CAVEAT`` noise (its report's ``null.distance_noise.share``), whose
    stress intervals then cover less than 95 % (docs/calibration.md); None otherwise."""
    noisy = []
    for side, g in (("A", a), ("B", b)):
        share = (((g.report.get("null") or {}).get("distance_noise")) or {}).get("share")
        if share is not None and share >= DISTANCE_NOISE_CAVEAT:
            noisy.append(f"{side} {min(share, 1.0):.0%}")
    if not noisy:
        return None
    return (f"none: sampling noise gives {' and '.join(noisy)} of the summed distances, so the stress intervals "
            "cover less than 95 % and non-overlap would be no evidence of change (docs/calibration.md)")


def _encodings_entry(a: SideGeometry, b: SideGeometry) -> list[dict[str, Any]]:
    """Every (encoding, width) scored on both sides: stress on each, the change, and whether
    the change exceeds the intervals (they do not overlap); None without intervals, or when
    either side's distances are mostly noise (:func:`_noisy_sides`)."""
    on_b = {(e["name"], int(e["dim"])): e for e in b.report.get("encodings") or []}
    noisy = _noisy_sides(a, b)
    out = []
    for ea in a.report.get("encodings") or []:
        eb = on_b.get((ea["name"], int(ea["dim"])))
        if eb is None:
            continue
        (ia, kind_a), (ib, _) = _interval(ea), _interval(eb)
        if noisy:
            exceeds, interval = None, noisy
        elif ia is None or ib is None:
            exceeds, interval = None, _why_none(ea if ia is None else eb)
        else:
            exceeds, interval = bool(ia[1] < ib[0] or ib[1] < ia[0]), kind_a
        out.append({
            "name": ea["name"], "dim": int(ea["dim"]),
            "a": {"stress": ea["stress"], "scaled_stress": ea["scaled_stress"], "scaled_stress_ci95": ia},
            "b": {"stress": eb["stress"], "scaled_stress": eb["scaled_stress"], "scaled_stress_ci95": ib},
            "scaled_stress_change": eb["scaled_stress"] - ea["scaled_stress"],
            "stress_change": eb["stress"] - ea["stress"],
            "exceeds_interval": exceeds,
            "interval": interval,
        })
    return out


def _drift_entry(a: SideGeometry, b: SideGeometry, dim: int) -> dict[str, Any]:
    common, ia, ib = np.intersect1d(a.positions, b.positions, return_indices=True)
    k = min(dim, a.encoding.shape[1], b.encoding.shape[1])
    if common.size < 2 or k < 1:
        return {"dim": k, "positions": common.tolist(), "drift": [], "note": "fewer than two positions on both sides"}
    x, y = a.encoding[ia, :k], b.encoding[ib, :k]
    al = procrustes_drift(x, y)
    rms = float(np.sqrt(np.mean(np.sum((x - x.mean(axis=0)) ** 2, axis=1))))
    top = np.argsort(-al.drift, kind="stable")[:_TOP]
    return {
        "dim": int(k),
        "positions": common.tolist(),
        "drift": _rounded(al.drift),
        "residual": al.residual,
        "rms_norm_a": rms,
        "median": float(np.median(al.drift)),
        "max": float(al.drift.max()),
        "largest": [{"position": int(common[i]), "drift": float(al.drift[i])} for i in top],
    }


def diff(
    a: Side,
    b: Side,
    /,
    *,
    level: float = 0.05,
    config: Any = None,
    drift_dim: int = 16,
    rows_per_block: int = 4096,
    block_entries: int = BLOCK_ENTRIES,
    show_progress: bool | None = None,
    progress: Callable[[int], None] | None = None,
) -> DiffResult:
    """Compare ``a`` (before) with ``b`` (after); see the module docstring.

    Args:
        level: family-wise error level of the per-position decisions.
        config: analysis options for a side given as counts (its report and MDS).
        drift_dim: MDS coordinates aligned for ``mds_drift``.
        rows_per_block, block_entries: a block of positions read from both counts files at a
            time holds at most this many rows and about this many stored counts.
        progress: called with the positions tested so far.

    Raises:
        InputError: the sides were counted differently.
    """
    check_comparable(a, b)
    n = a.header.positions
    bounds = block_bounds(load_indptr(a.counts_path), load_indptr(b.counts_path), n, entries=block_entries,
                          max_rows=rows_per_block)
    rows_a, rows_b = _TotalledRows(a), _TotalledRows(b)
    test = compare_positions(rows_a, rows_b, n=n, level=level, bounds=bounds, progress=progress)
    rows_a.check(n)
    rows_b.check(n)
    ga = side_geometry(a, config, show_progress=show_progress)
    gb = side_geometry(b, config, show_progress=show_progress)
    doc = {
        "schema_version": DIFF_SCHEMA_VERSION,
        "tool": {"name": "posstats", "version": __version__},
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "a": a.describe(),
        "b": b.describe(),
        "positions": _positions_entry(test),
        "spectrum": {"a": _spectrum_of(ga), "b": _spectrum_of(gb)},
        "encodings": _encodings_entry(ga, gb),
        "mds_drift": _drift_entry(ga, gb, drift_dim),
    }
    doc["summary"] = headline(doc)
    return DiffResult(doc, test, (ga, gb))


class _TotalledRows:
    """``load_rows`` of one side that adds up what it reads: once every position has been
    read, the counts must add up to the header's ``tokens`` (a file edited after counting
    is refused, as :func:`posstats.counting.io.load_counts` refuses it)."""

    def __init__(self, side: Side) -> None:
        self.side, self.rows, self.tokens = side, 0, 0

    def __call__(self, lo: int, hi: int) -> Any:
        block = load_rows(self.side.counts_path, lo, hi)
        self.rows += hi - lo
        self.tokens += int(block.sum(dtype=np.int64))
        return block

    def check(self, n: int) -> None:
        if self.rows == n and self.tokens != self.side.header.tokens:
            msg = (f"{self.side.counts_path}: its header says {self.side.header.tokens:,} tokens but its counts add up "
                   f"to {self.tokens:,}; the file was changed after counting: count again")
            raise InputError(msg)


def headline(doc: dict[str, Any], /) -> str:
    """The first line of every summary: how many positions changed."""
    p = doc["positions"]
    text = (f"{p['count_changed']:,} position(s) changed (of {p['tested']:,} tested, family-wise level "
            f"{100 * p['level']:g} %)")
    if p["count_changed"]:
        text += f": {p['changed_ranges'][:200]}" + (" ..." if len(p["changed_ranges"]) > 200 else "")
    empty = [f"{len(p[k]):,} empty in {k[-1].upper()} only" for k in ("empty_in_a", "empty_in_b") if p[k]]
    return text + (f"; {', '.join(empty)}" if empty else "")
