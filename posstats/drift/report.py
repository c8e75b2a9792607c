"""The diff's outputs: ``diff.json``, ``diff.html`` (figures embedded), ``figures/*.png`` and
the terminal summary, whose first line says how many positions changed."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from posstats import __version__
from posstats.reports.page import CSS, esc, figure_html, html_table, num, write_figures
from posstats.reports.plots import Plot, new_figure
from posstats.storage.jsontext import write_json_atomic
from posstats.storage.publish import atomic_path

__all__ = ["DIFF_HTML", "DIFF_JSON", "change_figure", "drift_figure", "format_diff_summary", "spectra_figure", "write_diff",
           "write_skipped"]

DIFF_JSON = "diff.json"
DIFF_HTML = "diff.html"
FIGURES_DIR = "figures"


def _array(values: list[Any]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def change_figure(doc: dict[str, Any], /) -> Plot:
    """Per position: d_H(A_i, B_i), the distance sampling alone gives, and the top of the
    noise band (the Bonferroni threshold); changed positions in red."""
    p = doc["positions"]
    d, expected, top, low = (_array(p[k]) for k in ("d_h", "expected_d_h", "threshold_d_h", "low_d_h"))
    x = np.arange(d.size)
    fig = new_figure(9.0, 4.0)
    ax = fig.add_subplot()
    ok = ~np.isnan(d)
    ax.fill_between(x, low, top, color="0.85", step="mid", label="noise band (2.5 % quantile to the family-wise threshold)",
                    rasterized=True)
    ax.plot(x, expected, color="0.35", lw=1.0, label="expected from sampling alone", rasterized=True)
    ax.plot(x[ok], d[ok], ".", ms=2.5, color="C0", label="d_H(A_i, B_i)", rasterized=True)
    changed = np.asarray(p["changed"], dtype=np.int64)
    if changed.size:
        ax.plot(changed, d[changed], "o", ms=4, mfc="none", color="C3", label=f"changed ({changed.size:,})")
    ax.set_xlabel("position")
    ax.set_ylabel("Hellinger distance between A and B")
    ax.legend(fontsize=8, loc="best")
    caption = ("Look for the circled positions. Each position's distance between the two corpora (blue) against what "
               "sampling alone gives at its "
               "occupancies (grey line) and the noise band (shaded, up to the family-wise threshold): positions above "
               "the band, circled, "
               f"changed at the family-wise level {100 * p['level']:g} %.")
    return Plot("change_by_position", "Change per position against its noise band", caption, fig)


_SPECTRUM_DECADES = 1e-6  # eigenvalues below this fraction of the largest are rounding or noise: not drawn


def spectra_figure(doc: dict[str, Any], /) -> Plot:
    """Both MDS spectra (log scale), with each side's components above the null marked."""
    fig = new_figure(9.0, 3.8)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, side, color in zip(axes, ("a", "b"), ("C0", "C1"), strict=True):
        s = doc["spectrum"][side]
        lam = _array(s["eigenvalues"])
        k = np.arange(1, lam.size + 1)
        top = float(lam.max()) if lam.size else 0.0
        pos = lam > top * _SPECTRUM_DECADES if top > 0 else np.zeros(lam.shape, dtype=bool)
        ax.semilogy(k[pos], lam[pos], "o-", ms=5, lw=1.2, color=color)
        hidden = int(lam.size - pos.sum())
        if hidden:
            ax.annotate(f"{hidden} negative or below {_SPECTRUM_DECADES:g} x the largest: not drawn", (0.98, 0.02),
                        xycoords="axes fraction", ha="right", va="bottom", fontsize=7, color="0.4")
        above = s.get("components_above_null")
        if above:
            ax.axvline(above + 0.5, color="0.4", ls="--", lw=1, label=f"{above} above the null")
            ax.legend(fontsize=8)
        ax.set_title(f"{side.upper()}: {doc[side]['label']}"[:60] + f" (rank {s.get('rank')})", fontsize=9)
        ax.set_xlabel("component")
    axes[0].set_ylabel("MDS eigenvalue")
    caption = ("The MDS eigenvalues of A (left) and B (right): look for a component that appears, vanishes or moves "
               "across the dashed line (the null, when computed): a change in the geometry, not only in single positions.")
    return Plot("spectra", "Spectra side by side", caption, fig)


def drift_figure(doc: dict[str, Any], /) -> Plot:
    """How far each position moved in the MDS encoding, after the best rotation."""
    m = doc["mds_drift"]
    fig = new_figure(9.0, 3.5)
    ax = fig.add_subplot()
    if m.get("drift"):
        ax.plot(m["positions"], _array(m["drift"]), ".", ms=3, color="C2", rasterized=True)
        ax.axhline(m["rms_norm_a"], color="0.5", ls=":", lw=1, label="rms norm of A's encoding")
        ax.legend(fontsize=8)
    ax.set_xlabel("position")
    ax.set_ylabel(f"drift (first {m['dim']} MDS coordinates)")
    caption = ("Look for positions far above the dotted line: how far each position moved in the MDS encoding between "
               "A and B after the best rotation "
               "(orthogonal Procrustes), against the typical size of A's encoding (dotted): what a model team "
               "holding A's exported table would see change. Sampling noise moves positions too.")
    return Plot("mds_drift", "MDS encoding drift", caption, fig)


def _encoding_rows(doc: dict[str, Any]) -> list[list[str]]:
    rows = []
    for e in doc["encodings"]:
        verdict = {True: "yes", False: "no", None: "no interval"}[e["exceeds_interval"]]
        if e["exceeds_interval"] is None and str(e.get("interval", "")).startswith("none: sampling noise"):
            verdict = "not comparable (noise)"
        rows.append([e["name"], str(e["dim"]), num(e["a"]["scaled_stress"]), num(e["b"]["scaled_stress"]),
                     f"{e['scaled_stress_change']:+.4g}", verdict])
    return rows


def format_diff_summary(doc: dict[str, Any], /) -> str:
    """Terminal summary; the first line says how many positions changed."""
    p, s, m = doc["positions"], doc["spectrum"], doc["mds_drift"]
    lines = [
        doc["summary"],
        f"A         {doc['a']['label']}: {doc['a']['tokens_counted']:,} tokens",
        f"B         {doc['b']['label']}: {doc['b']['tokens_counted']:,} tokens",
        f"spectrum  rank {s['a']['rank']} -> {s['b']['rank']}; components above the null "
        f"{num(s['a']['components_above_null'])} -> {num(s['b']['components_above_null'])}",
    ]
    if m.get("drift"):
        far = ", ".join(f"{x['position']} ({x['drift']:.3g})" for x in m["largest"][:5])
        lines.append(f"mds drift median {m['median']:.3g}, max {m['max']:.3g} (rms norm {m['rms_norm_a']:.3g}); "
                     f"farthest: {far}")
    if p["most_significant"]:
        top = ", ".join(f"{x['position']} (d_H {x['d_h']:.3g} vs {x['expected_d_h']:.3g}, p {p_value_text(x['p_value'])})"
                        for x in p["most_significant"][:5])
        lines.append(f"positions most significant: {top}")
    if doc["encodings"]:
        lines += ["", f"{'encoding':<28} {'dim':>4} {'scaled A':>9} {'scaled B':>9} {'change':>9}  beyond intervals"]
        lines += [f"{r[0][:28]:<28} {r[1]:>4} {r[2]:>9} {r[3]:>9} {r[4]:>9}  {r[5]}" for r in _encoding_rows(doc)]
        lines += [f"not comparable: {note}" for note in _noise_notes(doc)]
    return "\n".join(lines)


def _noise_notes(doc: dict[str, Any]) -> list[str]:
    """Why some encodings' stresses were not compared (noise-dominated distances), once each."""
    prefix = "none: "
    notes = {e["interval"] for e in doc["encodings"] if str(e.get("interval", "")).startswith(prefix + "sampling noise")}
    return [note[len(prefix):] for note in sorted(notes)]


def p_value_text(p: float) -> str:
    """A p-value for people: two significant digits, and ``< 1e-16`` where float64 rounds
    it to 0 (never a bare "0", which reads as impossible)."""
    return "< 1e-16" if p < 1e-16 else f"{p:.2g}"


def _page(doc: dict[str, Any], plots: list[Plot], images: dict[str, bytes], seconds: float) -> str:
    p = doc["positions"]
    key = [
        ("positions changed", doc["summary"]),
        ("A", f"{doc['a']['label']} ({doc['a']['tokens_counted']:,} tokens)"),
        ("B", f"{doc['b']['label']} ({doc['b']['tokens_counted']:,} tokens)"),
        ("positions tested", f"{p['tested']:,} of {p['n']:,} (occupied on both sides)"),
        ("test", p["method"]),
        ("rank", f"{doc['spectrum']['a']['rank']} -> {doc['spectrum']['b']['rank']}"),
    ]
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>posstats diff</title><style>{CSS}</style></head><body>",
        "<h1>posstats diff</h1>",
        f'<p class="meta">posstats {esc(__version__)}, {esc(doc["created"])}. A is before, B after. d_H is the '
        "Hellinger distance (no 1/2 factor); docs/drift.md explains the test.</p>",
        "<h2>Verdict</h2>", html_table(("question", "answer"), key, cls="kv verdict"),
    ]
    if p["most_significant"]:
        parts += ["<h2>Most significant positions</h2>", html_table(
            ("position", "d_H", "expected from sampling", "p-value", "changed"),
            [[x["position"], num(x["d_h"]), num(x["expected_d_h"]), p_value_text(x["p_value"]), "yes" if x["changed"] else "no"]
             for x in p["most_significant"]])]
    if doc["encodings"]:
        parts += ["<h2>Encodings</h2>", html_table(("encoding", "dim", "scaled stress A", "scaled stress B", "change",
                                                    "beyond the intervals"), _encoding_rows(doc))]
        parts += [f"<p>Not comparable: {esc(note)}.</p>" for note in _noise_notes(doc)]
    parts += ["<h2>Figures</h2>", *(figure_html(pl, images[pl.name]) for pl in plots)]
    parts.append(f'<p class="meta">Written in {seconds:.1f} s. Data: {DIFF_JSON}; PNG files: {FIGURES_DIR}/.</p></body></html>')
    return "\n".join(parts) + "\n"


def write_diff(out: str | os.PathLike, doc: dict[str, Any], /) -> dict[str, Path]:
    """Write ``diff.json`` (last), ``figures/*.png`` and ``diff.html`` into ``out``, each file
    atomically (temp + rename): an interrupted write leaves the previous files whole."""
    t = time.perf_counter()
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    plots = [change_figure(doc), spectra_figure(doc), drift_figure(doc)]
    images = write_figures(plots, target / FIGURES_DIR)
    html_path = target / DIFF_HTML
    with atomic_path(html_path) as tmp:
        tmp.write_text(_page(doc, plots, images, time.perf_counter() - t), encoding="utf-8")
    json_path = write_json_atomic(target / DIFF_JSON, doc)
    return {"json": json_path, "html": html_path, "figures": target / FIGURES_DIR}


def write_skipped(out: str | os.PathLike, /, *, a: str, b: str, reason: str) -> Path:
    """A ``diff.html`` saying why ``a`` and ``b`` were not compared (the pipeline's diff stage
    against a previous run counted differently)."""
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    page = (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>posstats diff</title>"
            f"<style>{CSS}</style></head><body><h1>posstats diff</h1><p>{esc(b)} was not compared with {esc(a)}: "
            f"{esc(reason)}</p></body></html>\n")
    path = target / DIFF_HTML
    with atomic_path(path) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return path
