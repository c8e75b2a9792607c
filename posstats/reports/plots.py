"""Figures of a posstats run: matplotlib on the Agg canvas, never pyplot.

Each ``*_figure`` function takes plain arrays / report entries and returns a
:class:`Plot`: a matplotlib :class:`~matplotlib.figure.Figure` (created without pyplot,
so no GUI backend and no global figure registry are ever touched), a file stem and a
one-sentence caption saying what to look for. :func:`save_png` writes one atomically.

The figures (THEORY.md section in brackets):

- :func:`occupancy_figure`: tokens counted per position, the minimum-occupancy line and
  the left-out positions (1, 7).
- :func:`distance_heatmap_figure`: d_H between used positions, downsampled by an even
  stride to at most ``max_size`` x ``max_size`` (2).
- :func:`spectrum_figure`: MDS eigenvalues (log scale) with the cumulative explained
  variance and the 90 / 95 / 99 / 99.9 % levels; eigenvalue confidence intervals and a
  noise floor when the report has them (3, 7).
- :func:`encoding_scatter_figure` / :func:`encoding_scatter3d_figure`: the first two /
  three MDS coordinates coloured by position (3).
- :func:`stress_by_dim_figure`: raw and scaled stress against width for each encoding (4).
- :func:`sweep_figure`: scaled stress against a swept encoding parameter (a RoPE scaling
  factor, say), one line per width, the best value starred (4).
- :func:`lowrank_figure`: the rank / stress / parameter-count trade-off of low-rank MDS
  encodings (3, the paper's Table 2 for this corpus).
- :func:`monotonicity_figure`: monotonicity violation rates with their 95 % intervals,
  the corpus' own rate (A3) and the random level 0.5 (6).
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from posstats.reports.spectrum_view import weighting_phrase
from posstats.runs.run_folder import even_subsample
from posstats.storage.publish import atomic_path

__all__ = [
    "Plot",
    "distance_heatmap_figure",
    "encoding_scatter3d_figure",
    "encoding_scatter_figure",
    "lowrank_figure",
    "monotonicity_figure",
    "new_figure",
    "occupancy_figure",
    "png_bytes",
    "save_png",
    "spectrum_figure",
    "stress_by_dim_figure",
    "sweep_figure",
]

_DPI = 100
_CMAP = "viridis"


@dataclass(frozen=True)
class Plot:
    """One figure of a report.

    Attributes:
        name: file stem (``<name>.png``), also the HTML anchor.
        title: short heading.
        caption: one sentence saying what to look for.
        figure: the matplotlib figure (Agg canvas).
    """

    name: str
    title: str
    caption: str
    figure: Any


def _new_figure(width: float = 7.0, height: float = 4.0):
    """A Figure on the Agg canvas (no pyplot: no GUI backend, no global state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


new_figure = _new_figure  # for the other reports' figures (the diff's)


def png_bytes(plot: Plot, /) -> bytes:
    """The figure rendered as PNG bytes."""
    buf = io.BytesIO()
    plot.figure.savefig(buf, format="png", dpi=_DPI)
    return buf.getvalue()


def save_png(plot: Plot, directory: str | os.PathLike, /) -> Path:
    """Write ``<directory>/<plot.name>.png`` atomically; return its path."""

    path = Path(directory) / f"{plot.name}.png"
    data = png_bytes(plot)
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return path


def occupancy_log_scale(occupancy: Any, /) -> bool:
    """Whether the occupancy axis is logarithmic: when the occupied positions' counts span
    at least a factor 10 (a linear axis would flatten the deep positions); else linear, so
    that a 585-586 token range is not drawn as a cliff."""
    occ = np.asarray(occupancy, dtype=np.float64)
    occ = occ[occ > 0]
    return bool(occ.size and occ.max() >= 10 * occ.min())


def occupancy_figure(occupancy: Sequence[int], /, *, min_occupancy: int = 1) -> Plot:
    """Tokens counted at each requested position (log scale when they span a factor 10 or
    more, :func:`occupancy_log_scale`), left-out positions marked.

    Args:
        occupancy: (n,) tokens counted per position (``report.json`` positions.occupancy).
        min_occupancy: the analysis threshold; positions below it are drawn in red.
    """
    occ = np.asarray(occupancy, dtype=np.float64)
    n = occ.shape[0]
    x = np.arange(n)
    fig = _new_figure(7.0, 3.2)
    ax = fig.add_subplot()
    kept = occ >= max(min_occupancy, 1)
    ax.fill_between(x, np.where(occ > 0, occ, np.nan), step="mid", alpha=0.35, color="C0")
    ax.step(x, np.where(occ > 0, occ, np.nan), where="mid", color="C0", lw=1, label="tokens counted")
    if (~kept).any():
        ax.scatter(x[~kept], np.maximum(occ[~kept], 0.8), color="C3", s=10, zorder=3, label="left out")
    if min_occupancy > 1:
        ax.axhline(min_occupancy, color="C3", ls="--", lw=1, label=f"min occupancy {min_occupancy}")
    if occupancy_log_scale(occ):
        ax.set_yscale("log")
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_xlabel("position i (0-based)")
    ax.set_ylabel("occ[i] (tokens)")
    if not occupancy_log_scale(occ):
        ax.set_ylim(bottom=0)
    ax.legend(loc="best", fontsize=8)
    left = int((~kept).sum())
    caption = (
        "Tokens counted at each position: look for where occupancy falls off (deep positions are "
        "estimated from fewer tokens, so their distances are noisier)"
        + (f"; {left} position(s) below the minimum occupancy are left out (red)." if left else ".")
    )
    return Plot("occupancy", "Occupancy per position", caption, fig)


def distance_heatmap_figure(distances: np.ndarray, positions: np.ndarray, /, *, max_size: int = 512, total: int | None = None,
                            kind: str = "plug-in") -> Plot:
    """Heatmap of d_H between used positions, downsampled to at most ``max_size`` per side.

    Args:
        distances: (m, m) d_H between the used positions.
        positions: (m,) their 0-based indices.
        max_size: rows/columns drawn; above it an even stride of positions is shown.
        total: used positions in the run when ``distances`` is already a subsample of them.
        kind: which distances they are (``plug-in`` or ``bias-corrected``), for the colour
            bar, which also gives their drawn range, and the caption, which counts the pairs
            clipped to exactly 0 by the correction.
    """
    distances = np.asarray(distances)
    positions = np.asarray(positions)
    m = distances.shape[0]
    idx = even_subsample(m, max_size)
    sub = distances[np.ix_(idx, idx)]
    pos = positions[idx]
    fig = _new_figure(6.0, 5.0)
    ax = fig.add_subplot()
    lo, hi = float(pos[0]), float(pos[-1])
    top = float(np.max(sub)) if sub.size else 0.0
    im = ax.imshow(sub, cmap="magma", origin="upper", interpolation="nearest", extent=(lo - 0.5, hi + 0.5, hi + 0.5, lo - 0.5),
                   vmin=0.0, vmax=top if top > 0 else None)
    fig.colorbar(im, ax=ax, label=f"{kind} d_H (0 to {top:.3g}; at most sqrt 2)")
    ax.set_xlabel("position j")
    ax.set_ylabel("position i")
    total = m if total is None else int(total)
    shown = len(idx)
    note = f" (downsampled: an even stride of {shown} of the {total} used positions, {shown} x {shown} pairs)" if shown < total else ""
    off = ~np.eye(sub.shape[0], dtype=bool)
    zeros = int(np.count_nonzero(sub[off] == 0.0))
    clipped = (f" ({zeros / max(int(off.sum()), 1):.0%} of the pairs shown are exactly 0, where the bias-corrected squared "
               "distance fell below 0: they cannot be told apart from identical distributions)" if zeros and kind == "bias-corrected" else "")
    caption = (
        f"Hellinger distance ({kind}) between the token distributions of every pair of used positions"
        f"{note}: look for a dark band along the diagonal (nearby positions look alike) and for "
        f"blocks marking regimes such as the first few positions{clipped}."
    )
    return Plot("hellinger_heatmap", "Hellinger distances d_H(i, j)", caption, fig)


def spectrum_figure(
    eigenvalues: Sequence[float],
    explained: Sequence[float],
    /,
    *,
    rank: int | None = None,
    eigenvalue_ci: Sequence[Sequence[float]] | None = None,
    noise_floor: float | None = None,
    explained_label: str = "cumulative share of the positive variance",
    tested: Sequence[float] | None = None,
    tested_bound: float | None = None,
    weights_ratio: float | None = None,
    stopped: tuple[int, int] | None = None,
) -> Plot:
    """MDS eigenvalues (log scale) and cumulative explained variance.

    Args:
        eigenvalues: (k,) descending eigenvalues of B.
        explained: (k,) cumulative explained variance.
        rank: the numerical rank (vertical line).
        eigenvalue_ci: optional (k, 2) 95 % intervals of the eigenvalues.
        noise_floor: optional eigenvalue level below which components are noise.
        explained_label: the legend of the cumulative curve (what its shares are of).
        tested: optional descending eigenvalues the rank test compared with ``noise_floor``
            when they are not ``eigenvalues`` (the occupancy-weighted ones): drawn as their
            own series, and the components above noise counted on them.
        tested_bound: ``max(w) / min(w)`` where ``tested`` are upper bounds, the
            eigenvalues times the largest weight, not solved (``null.tested_bound``).
        weights_ratio: ``max(w) / min(w)`` of the weights behind ``tested``
            (``null.weights_ratio``): the caption says how unequal they were
            (:func:`~posstats.reports.spectrum_view.weighting_phrase`).
        stopped: ``(solved, replicates)`` where the rank test stopped solving null corpora
            once decided (:func:`~posstats.reports.spectrum_view.null_stopped`): the line is
            then a lower bound of the threshold, and the caption says so.
    """
    lam = np.asarray(eigenvalues, dtype=np.float64)
    cum = np.asarray(explained, dtype=np.float64)
    k = np.arange(1, lam.shape[0] + 1)
    fig = _new_figure(7.0, 4.6)
    ax = fig.add_subplot()
    # Eigenvalues below 1e-12 of the largest are rounding noise of a rank-deficient B;
    # drawing them would stretch the log axis over 15 decades of nothing.
    top = float(lam.max()) if lam.size else 0.0
    pos = lam > top * 1e-12 if top > 0 else np.zeros(lam.shape, dtype=bool)
    ax.semilogy(k[pos], lam[pos], ".-", color="C0", ms=3, lw=1, label="eigenvalue lambda_k")
    if eigenvalue_ci is not None:
        ci = np.asarray(eigenvalue_ci, dtype=np.float64).reshape(-1, 2)[: lam.shape[0]]
        kk = k[: ci.shape[0]]
        ok = (ci[:, 0] > 0) & (ci[:, 1] > 0)
        ax.fill_between(kk[ok], ci[ok, 0], ci[ok, 1], color="C0", alpha=0.25, label="95% CI")
    above = None
    compared = lam
    if tested is not None:
        compared = np.asarray(tested, dtype=np.float64)
        kt = np.arange(1, compared.size + 1)
        ok = compared > top * 1e-12 if top > 0 else compared > 0
        ax.semilogy(kt[ok], compared[ok], "x-", color="C2", ms=4, lw=0.8,
                    label=("occupancy-weighted, upper bound (the rank test's)" if tested_bound
                           else "occupancy-weighted eigenvalue (the rank test's)"))
    if noise_floor is not None and noise_floor > 0:
        above = int(np.count_nonzero(compared > noise_floor))
        scale = " on the weighted scale" if tested is not None else ""
        least = ", at least" if stopped is not None else ""
        ax.axhline(noise_floor, color="C3", ls=":", lw=1.2, label=f"noise threshold{scale}{least} ({above} above)")
        if above:
            kk = np.arange(1, above + 1)
            ax.semilogy(kk, compared[:above], "o", color="C3", ms=4, mfc="none", label="components above noise")
    if rank is not None and 0 < rank <= lam.shape[0]:
        ax.axvline(rank, color="gray", ls="--", lw=0.8, label=f"numerical rank {rank}")
    ax.set_xlabel("component k")
    ax.set_ylabel("lambda_k")
    ax2 = ax.twinx()
    ax2.plot(k, cum, color="C1", lw=1.5, label=explained_label)
    marks = []
    for level in (0.9, 0.99):
        hit = np.nonzero(cum >= level)[0]
        if hit.size:
            r = int(hit[0]) + 1
            ax2.plot([r], [cum[hit[0]]], "o", color="C1", ms=4)
            marks.append((r, float(cum[hit[0]]), f"{level:.0%} at r = {r}"))
    if marks:  # one label for both marks: two labels a component apart would overlap
        r, y, _ = marks[0]
        right = r > 0.6 * k[-1]  # near the right edge: the label goes left of its mark
        ax2.annotate(", ".join(text for *_, text in marks), (r, y), fontsize=8, color="C1",
                     xytext=(-6 if right else 6, -14), textcoords="offset points", ha="right" if right else "left")
    ax2.set_ylim(0, 1.02)
    ax2.set_ylabel("cumulative share (see legend)", color="C1")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    fig.legend(h1 + h2, l1 + l2, loc="outside lower center", ncols=2, fontsize=8, frameon=False)  # never over the curves
    lower = ("" if stopped is None else f"; the line is a lower bound, as null corpus {stopped[0]} of {stopped[1]} "
             "already reached the corpus' top eigenvalue and the others were not solved")
    look = (f"look for the components above the dotted noise threshold ({above} here{lower}): only they stand above "
            "sampling noise, however much variance the others add" if above is not None else
            "look for how fast the curve reaches 90-99 % (this report has no noise threshold to tell structure from noise)")
    caption = (
        "Eigenvalues of the MDS matrix B with the cumulative share of the positive variance they explain "
        f"(negative eigenvalues of a bias-corrected B explain nothing): {look}."
    )
    if tested is not None:
        caption += (" Positions' occupancies differ, so the rank test compared the eigenvalues of W^1/2 B_w W^1/2 "
                    "(W = diag(N_i / mean N), B_w the Gram matrix centred on the occupancy-weighted mean), which "
                    f"weighs each position by its occupancy ({weighting_phrase(weights_ratio)}), with the threshold "
                    "on that scale (crosses).")
        if tested_bound:
            caption += (f" The weights are equal to within {tested_bound - 1.0:.2%}, so the crosses are the "
                        "eigenvalues times the largest weight (and the weighted centring's factor, 1e-4 at most): "
                        "upper bounds (Ostrowski's theorem), all below the threshold, so the weighted matrix was not "
                        "decomposed again.")
    return Plot("spectrum", "MDS eigenspectrum", caption, fig)


SCATTER_POINTS = 16_384  # positions drawn in an encoding scatter at most (evenly spaced, ends kept)


def _scatter_rows(n: int, /) -> np.ndarray:
    """Rows an encoding scatter draws: all up to :data:`SCATTER_POINTS`, else that many
    evenly spaced ones, the first and the last included (more points than pixels only cost
    time: 131,072 took about 1.3 s per figure)."""
    if n <= SCATTER_POINTS:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, SCATTER_POINTS).round().astype(np.int64))


def _shown(rows: np.ndarray, n: int, /) -> str:
    """The caption's note when a scatter shows a subset of the rows, else ``""``."""
    return "" if rows.size == n else f" ({rows.size:,} of the {n:,} positions drawn, evenly spaced.)"


def encoding_scatter_figure(encoding: np.ndarray, positions: np.ndarray, /) -> Plot:
    """First two MDS coordinates of every used position (evenly spaced ones above
    :data:`SCATTER_POINTS`), coloured by position."""
    n = int(np.shape(encoding)[0])
    rows = _scatter_rows(n)
    enc = np.asarray(encoding, dtype=np.float64)[rows]
    positions = np.asarray(positions)[rows]
    fig = _new_figure(6.0, 5.0)
    ax = fig.add_subplot()
    y = enc[:, 1] if enc.shape[1] > 1 else np.zeros(enc.shape[0])
    ax.plot(enc[:, 0], y, color="0.8", lw=0.5, zorder=1)
    sc = ax.scatter(enc[:, 0], y, c=positions, cmap=_CMAP, s=12, zorder=2)
    fig.colorbar(sc, ax=ax, label="position i", shrink=0.8)
    for i in (0, len(positions) - 1):
        ax.annotate(str(int(positions[i])), (enc[i, 0], y[i]), fontsize=8, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("MDS coordinate 1")
    ax.set_ylabel("MDS coordinate 2")
    ax.set_aspect("equal", adjustable="datalim")
    caption = (
        "The information-optimal encoding in its first two dimensions, coloured by position and joined in "
        "order: look for a smooth curve (positions change gradually) and for where early positions "
        "separate from the rest."
    ) + _shown(rows, n)
    return Plot("mds_2d", "MDS encoding, first two dimensions", caption, fig)


def encoding_scatter3d_figure(encoding: np.ndarray, positions: np.ndarray, /) -> Plot:
    """First three MDS coordinates, coloured by position (needs at least 3 columns; evenly
    spaced positions above :data:`SCATTER_POINTS`)."""
    n = int(np.shape(encoding)[0])
    rows = _scatter_rows(n)
    enc = np.asarray(encoding, dtype=np.float64)[rows]
    positions = np.asarray(positions)[rows]
    if enc.shape[1] < 3:
        msg = f"a 3-D scatter needs at least 3 coordinates; got {enc.shape[1]}"
        raise ValueError(msg)
    fig = _new_figure(6.0, 5.0)
    ax = fig.add_subplot(projection="3d")
    ax.plot(enc[:, 0], enc[:, 1], enc[:, 2], color="0.8", lw=0.5)
    sc = ax.scatter(enc[:, 0], enc[:, 1], enc[:, 2], c=positions, cmap=_CMAP, s=10, depthshade=False)
    fig.colorbar(sc, ax=ax, label="position i", shrink=0.8)
    ax.set_xlabel("coord 1")
    ax.set_ylabel("coord 2")
    ax.set_zlabel("coord 3")
    ax.view_init(elev=25, azim=-60)
    caption = (
        "The first three MDS dimensions, coloured by position: look for whether the third dimension "
        "untangles structure that overlaps in the 2-D view."
    ) + _shown(rows, n)
    return Plot("mds_3d", "MDS encoding, first three dimensions", caption, fig)


def _coinciding(by_name: dict[str, list[dict[str, Any]]], field: str) -> dict[str, str]:
    """Encodings whose ``field`` (stress or scaled stress) equals an earlier one's at every
    width (relative 1e-9): name -> the earlier name (e.g. rope -> sinusoidal)."""
    def key(rows: list[dict[str, Any]]) -> list[tuple[int, float, float]]:
        return sorted((int(r["dim"]), float(r.get(field) or 0.0), 0.0) for r in rows)

    same: dict[str, str] = {}
    names = list(by_name)
    for i, name in enumerate(names):
        mine = key(by_name[name])
        for earlier in names[:i]:
            if earlier in same:
                continue
            theirs = key(by_name[earlier])
            if len(mine) == len(theirs) and all(
                a[0] == b[0] and np.isclose(a[1], b[1], rtol=1e-9, atol=0) and np.isclose(a[2], b[2], rtol=1e-9, atol=0)
                for a, b in zip(mine, theirs, strict=True)
            ):
                same[name] = earlier
                break
    return same


def stress_by_dim_figure(entries: Sequence[dict[str, Any]], /) -> Plot:
    """Raw and scaled stress against width, one line per encoding; an encoding whose curves
    coincide with an earlier one's is drawn dashed with open markers and labelled so.

    Args:
        entries: ``report.json`` ``encodings[]`` objects (``name``, ``dim``, ``stress``,
            ``scaled_stress``, optionally ``stress_ci95`` / ``scaled_stress_ci95``).
    """
    by_name: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_name.setdefault(str(e["name"]), []).append(e)
    fig = _new_figure(10.5, 3.8)
    notes = []
    axes = fig.subplots(1, 2)
    for j, (key, label) in enumerate((("stress", "raw stress"), ("scaled_stress", "scaled stress"))):
        ax = axes[j]
        positive = False
        same = _coinciding(by_name, key)
        notes += [f"{a} = {b} ({label})" for a, b in same.items()]
        for i, (name, rows) in enumerate(by_name.items()):
            rows = sorted(rows, key=lambda r: r["dim"])
            d = np.array([r["dim"] for r in rows], dtype=np.float64)
            v = np.array([np.nan if r.get(key) is None else r[key] for r in rows], dtype=np.float64)
            positive |= bool(np.any(v > 0))
            twin = same.get(name)
            style = {"ls": "--", "mfc": "none", "ms": 7, "lw": 1.4} if twin else {"ls": "-", "ms": 4, "lw": 1.2}
            ax.plot(d, v, marker="o", color=f"C{i % 10}", label=f"{name} (= {twin})" if twin else name, **style)
            ci = [r.get(f"{key}_ci95") for r in rows]
            if all(c is not None for c in ci):
                c = np.asarray(ci, dtype=np.float64)
                ax.fill_between(d, c[:, 0], c[:, 1], color=f"C{i % 10}", alpha=0.2)
        if positive and key == "stress":  # raw stress spans decades; scaled stress lies in [0, 1]
            ax.set_yscale("symlog", linthresh=1e-3)
        elif key == "scaled_stress":
            ax.set_ylim(bottom=0.0)
            ax.margins(y=0.08)  # headroom: a curve at the top of the range is not cut by the frame
            ax.set_ylim(bottom=0.0)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("width d")
        ax.set_ylabel(label)
        ax.set_title(label, fontsize=10)
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="outside right upper", frameon=False)  # outside the data
    caption = (
        "Stress of each encoding against the corpus geometry at each width (left raw, right at the optimal "
        "scale): look for the lowest curve, the most faithful geometry; classical MDS minimises strain (inner "
        "products), not stress, so it is not a lower bound here (mds-smacof, stress majorisation started from it, "
        "usually scores lower), and raw stress is dominated by an encoding's overall scale while scaled stress is not"
    )
    if notes:
        caption += "; coinciding curves (dashed, open markers, drawn over the first): " + ", ".join(notes)
    caption += "."
    return Plot("stress_by_dim", "Stress against width", caption, fig)


def sweep_figure(sweep: dict[str, Any], entries: Sequence[dict[str, Any]], /, *, index: int = 0,
                 star: bool = True) -> Plot:
    """Scaled stress against a swept parameter (``--encodings 'rope:type=yarn,factor=8|16|32'``),
    one line per width (and per value of any other swept key), with 95 % intervals.

    Args:
        sweep: one ``config.sweeps[]`` entry of ``report.json`` (``spec``, ``parameter``,
            ``values``, ``members``, ``others``).
        entries: ``report.json`` ``encodings[]`` objects.
        index: the sweep's number (the file stem is ``sweep_<index>``).
        star: star each line's lowest value; False when no test found positional structure
            (the verdict then ties every value, and the caption says so).
    """
    by_name = {str(e["name"]): e for e in entries}
    lines: dict[tuple[int, str], list[tuple[float, dict[str, Any]]]] = {}
    for name, value, others in zip(sweep["members"], sweep["values"], sweep["others"], strict=True):
        label = ", ".join(f"{k}={v}" for k, v in others.items())
        for e in entries:
            if e["name"] == name:
                lines.setdefault((int(e["dim"]), label), []).append((float(value), e))
    fig = _new_figure(7.0, 4.0)
    ax = fig.add_subplot()
    xs: list[float] = []
    for i, ((dim, label), points) in enumerate(sorted(lines.items())):
        points.sort(key=lambda p: p[0])
        x = np.array([p[0] for p in points])
        y = np.array([p[1]["scaled_stress"] for p in points], dtype=np.float64)
        ci = np.array([p[1].get("scaled_stress_ci95") or [p[1]["scaled_stress"]] * 2 for p in points], dtype=np.float64)
        color = f"C{i % 10}"
        flat = float(y.max() - y.min()) <= 1e-9 * max(float(np.abs(y).max()), 1e-300)
        # the interval is drawn from its bounds: a jackknife interval is centred on the
        # bias-corrected estimate and need not contain the point (docs/calibration.md)
        ax.plot(x, y, "o-", ms=4, lw=1.2, color=color,
                label=f"d={dim}" + (f" ({label})" if label else "") + (": all equal" if flat else ""))
        ax.vlines(x, ci[:, 0], ci[:, 1], color=color, lw=1.0,
                  label="95 % interval (jackknife: around the bias-corrected estimate)" if i == 0 and np.any(ci[:, 1] > ci[:, 0]) else None)
        if star and not flat:
            best = int(np.argmin(y))
            ax.plot([x[best]], [y[best]], marker="*", ms=13, color=color, markeredgecolor="black", zorder=5)
        xs.extend(x.tolist())
    if xs and min(xs) > 0 and max(xs) / min(xs) >= 8:
        from matplotlib.ticker import NullFormatter, ScalarFormatter

        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
    if xs:
        ax.set_xticks(sorted(set(xs)))
    ax.set_xlabel(sweep["parameter"])
    ax.set_ylabel("scaled stress")
    ax.legend(fontsize=8, loc="best")
    missing = [m for m in sweep["members"] if m not in by_name]
    if star:
        guide = (f"look for the star, which marks the {sweep['parameter']} whose encoding best reproduces the corpus "
                 "geometry at that width (none where every value gives the same stress, such as a width whose pairs the "
                 "scaling leaves unchanged); values whose intervals overlap the star's cannot be told apart by this corpus")
    else:
        guide = (f"look for no winner: there is no star, since no test found positional structure and no "
                 f"{sweep['parameter']} fits better than another (the differences are fits to sampling noise)")
    caption = (
        f"Scaled stress of {sweep['spec']} against {sweep['parameter']}, one line per width, with 95 % intervals: "
        + guide + (f" ({len(missing)} member(s) not in this report)" if missing else "") + "."
    )
    return Plot(f"sweep_{index}", f"Stress against {sweep['parameter']}", caption, fig)


def lowrank_figure(rows: Sequence[dict[str, Any]], /, *, n: int, width: int, stress_positions: int | None = None,
                   informative: int | None = None) -> Plot:
    """Scaled stress and parameter count of rank-r MDS encodings (the paper's Table 2).

    Scaled stress is what compares across ranks: raw stress also grows with the encoding's
    scale, which each added noise coordinate inflates, so on noise it *rises* with rank and
    would advise r = 1.

    Args:
        rows: dicts with ``rank``, ``stress``, ``scaled_stress``, ``parameters``
            (see :func:`posstats.geometry.lowrank.lowrank_tradeoff`).
        n: positions; width: model width d (for the free n x d reference).
        stress_positions: when the stresses were computed on an even sample of the
            positions, its size (said in the caption).
        informative: the components above sampling noise (the verdict's; the export's
            default rank), drawn as a vertical line; None when unknown.
    """
    r = np.array([row["rank"] for row in rows], dtype=np.float64)
    ss = np.array([row["scaled_stress"] for row in rows], dtype=np.float64)
    p = np.array([row["parameters"] for row in rows], dtype=np.float64)
    fig = _new_figure(7.0, 4.3)
    ax = fig.add_subplot()
    ax.plot(r, ss, "s-", color="C2", ms=4, label="scaled stress")
    if informative:
        ax.axvline(informative, color="C3", ls="--", lw=1, label=f"components above noise: {informative}")
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0.0)
    ax.margins(y=0.08)
    ax.set_ylim(bottom=0.0)
    ax.set_xlabel("rank r")
    ax.set_ylabel("scaled stress of P_MDS(r)")
    ax2 = ax.twinx()
    ax2.plot(r, p, "^-", color="C1", ms=4, label="parameters r(n + d)")
    ax2.axhline(n * width, color="C1", ls=":", lw=1, label=f"free n x d = {n * width:,}")
    ax2.set_ylabel("parameters", color="C1")
    ax2.set_ylim(bottom=0)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    fig.legend(h1 + h2, l1 + l2, fontsize=8, loc="outside lower center", ncols=4, frameon=False)
    sample = f" (stress over an even sample of {stress_positions} positions)" if stress_positions and stress_positions < n else ""
    if informative:
        look = (f"look for the dashed line: ranks beyond the {informative} component(s) above sampling noise lower the "
                "stress only by fitting noise, so the export's default rank stops there")
    elif informative == 0:
        look = ("look no further than the verdict: no component stands above sampling noise, so every rank here fits "
                "noise (the export refuses without --rank)")
    else:
        look = ("look for the smallest rank whose scaled stress is already low while it still costs far fewer "
                "parameters than a free n x d table (dotted line); this run has no null, so noise is not marked")
    caption = (
        f"Scaled stress of the rank-r MDS encoding and its parameter count r(n + d) with n = {n}, d = {width}{sample}: "
        f"{look}."
    )
    return Plot("lowrank_tradeoff", "Rank / stress / parameter trade-off", caption, fig)


def monotonicity_figure(entries: Sequence[dict[str, Any]], /, *, corpus_rate: float | None = None) -> Plot:
    """Monotonicity violation rate of each (encoding, width), with 95 % intervals.

    Args:
        entries: ``report.json`` ``encodings[]`` objects.
        corpus_rate: the corpus' own rate with d_H (hypothesis A3), drawn as a line.
    """
    labels = [f"{e['name']} d={e['dim']}" for e in entries]
    rate = np.array([np.nan if e.get("monotonicity_violation_rate") is None else e["monotonicity_violation_rate"] for e in entries], dtype=np.float64)
    lo = np.zeros_like(rate)
    hi = np.zeros_like(rate)
    for i, e in enumerate(entries):
        ci = e.get("monotonicity_ci95")
        if ci and ci[0] is not None and ci[1] is not None and np.isfinite(rate[i]):
            lo[i] = max(rate[i] - ci[0], 0.0)
            hi[i] = max(ci[1] - rate[i], 0.0)
    height = max(3.0, 0.22 * len(entries) + 1.2)
    fig = _new_figure(7.0, height)
    ax = fig.add_subplot()
    y = np.arange(len(entries))
    names = [str(e["name"]) for e in entries]
    uniq = list(dict.fromkeys(names))
    colours = [f"C{uniq.index(nm) % 10}" for nm in names]
    bars = ax.barh(y, np.nan_to_num(rate), xerr=np.vstack([lo, hi]), color=colours, alpha=0.85, capsize=2)
    # Values on the bars: a rate of exactly 0 (ALiBi is monotone by construction) has no bar.
    ax.bar_label(bars, labels=["-" if not np.isfinite(r) else f"{r:.3f}" for r in rate], fontsize=6, padding=3)
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.axvline(0.5, color="gray", ls="--", lw=1, label="random (0.5)")
    if corpus_rate is not None:
        ax.axvline(corpus_rate, color="C3", ls=":", lw=1.5, label=f"corpus d_H ({corpus_rate:.3f})")
    ax.set_xlim(0, max(0.6, float(np.nanmax(rate + hi)) + 0.05) if np.isfinite(rate).any() else 1)
    ax.set_xlabel("monotonicity violation rate")
    fig.legend(fontsize=8, loc="outside lower center", ncols=2, frameon=False)
    bars_note = ("; error bars on sampled rates are 95 % Wilson intervals for the error of sampling triples alone, "
                 "not for the corpus' own sampling noise" if np.any(lo + hi > 0) else "")
    caption = (
        "Fraction of ordered triples where a farther position is closer in the encoding than a nearer one "
        "(0 = perfectly monotone, 0.5 = random): look for encodings near the corpus' own rate (red dotted), "
        f"which is what the corpus geometry itself does{bars_note}."
    )
    return Plot("monotonicity", "Monotonicity violation rates", caption, fig)
