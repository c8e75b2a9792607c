"""A self-contained HTML report of a run, its PNG figures and a Markdown summary.

:func:`render_html_report` renders a run (:class:`posstats.runs.run_folder.RunData`: just
analysed, or read back from its folder by :func:`write_html_report`) and writes:

- ``figures/<name>.png``: the figures of :mod:`posstats.reports.plots` (occupancy, d_H heatmap,
  eigenspectrum, MDS encoding in 2-D and 3-D, stress against width, low-rank trade-off,
  monotonicity);
- ``report.html``: one file, images embedded as base64 ``data:`` URIs, inline CSS, no
  scripts and no external resources, so it opens offline and can be mailed around;
- ``summary.md``: key numbers, the encoding table and the rank / stress / parameter
  table, with links to ``figures/*.png``, for a pull request or a model card.

The page opens with the verdict (:func:`posstats.reports.summary.verdict_items`): how many
components stand above sampling noise, which positions stand out, which encodings fit
best beyond their intervals, and which distances were used. Every table and figure uses
one distance matrix, the one named in ``geometry.distances`` (plug-in or bias-corrected):
those the analysis computed when the run holds them, else recomputed from the counts
(:func:`posstats.runs.run_folder.run_distances`), on all used positions up to
``max_positions`` (default 2048) and on an even sample of that many above (the page says
so: an m x m matrix of every position would not fit); the heatmap shows at most
``max_heatmap`` x ``max_heatmap`` of them.

Uncertainty, drawn when the report has it: ``spectrum.eigenvalues_ci95``, a list of
``[low, high]`` per eigenvalue; a noise floor ``noise_floor``, a number on the eigenvalue
scale or an object whose ``eigenvalue`` entry is; ``encodings[].stress_ci95`` /
``scaled_stress_ci95``; ``encodings[].monotonicity_ci95`` (always present). Every other
entry of ``noise_floor`` is listed as a table. (The ``bootstrap`` section of reports
written before the shard bootstrap was withdrawn is not drawn: its intervals did not
cover, docs/calibration.md.)
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posstats import __version__
from posstats.estimates.verdict import all_tied
from posstats.geometry.lowrank import default_ranks, lowrank_tradeoff
from posstats.reports.export import informative_rank
from posstats.reports.page import CSS, esc, figure_html, html_table, num, write_figures
from posstats.reports.plots import (
    distance_heatmap_figure,
    encoding_scatter3d_figure,
    encoding_scatter_figure,
    lowrank_figure,
    monotonicity_figure,
    occupancy_figure,
    spectrum_figure,
    stress_by_dim_figure,
    sweep_figure,
)
from posstats.reports.spectrum_view import (
    explained_label,
    explained_share,
    noise_threshold,
    null_stopped,
    rank_test_bound,
    rank_test_eigenvalues,
    weights_ratio,
)
from posstats.reports.summary import (
    GLOSSARY,
    answer_sentences,
    encoding_note_lines,
    glossary_lines,
    variance_of,
    verdict_items,
)
from posstats.runs.run_folder import RunData, load_run, run_distances
from posstats.storage.publish import atomic_path

__all__ = ["FIGURES_DIR", "HTML_FILE", "SUMMARY_FILE", "render_html_report", "write_html_report"]

FIGURES_DIR = "figures"
HTML_FILE = "report.html"
SUMMARY_FILE = "summary.md"

_CSS = CSS
_esc = esc
_num = num


def _lookup(report: dict[str, Any], *paths: str) -> Any:
    """The first present value among dotted ``paths``."""
    for path in paths:
        node: Any = report
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                node = None
                break
            node = node[part]
        if node is not None:
            return node
    return None


def _distances_name(report: dict[str, Any]) -> str:
    """``bias-corrected`` or ``plug-in``: the report's one distance matrix."""
    return "bias-corrected" if (report.get("geometry") or {}).get("distances") == "bias_corrected" else "plug-in"


_html_table = html_table


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    out += ["| " + " | ".join(str(v) for v in r) + " |" for r in rows]
    return out


def lowrank_noise_note(report: dict[str, Any], /) -> str:
    """What the low-rank table's rows are worth: how many of the MDS components stand
    above sampling noise (:func:`posstats.reports.export.informative_rank`), so that a lower
    stress at a larger rank is not read as structure."""
    rank = informative_rank(report)
    if (report.get("verdict") or {}).get("withheld"):
        return "The verdict is withheld, so no rank here is known to stand above sampling noise."
    if rank is None:
        return "No null was computed, so which of these ranks stand above sampling noise is untested."
    if rank == 0:
        return ("No component stands above sampling noise (the verdict): every row fits sampling noise, "
                "whatever its stress.")
    return (f"Only the first {rank} component(s) stand above sampling noise (the verdict): rows beyond r = {rank} "
            "add components that fit sampling noise, so a lower stress there is no reason to keep them.")


def _components_above_noise(report: dict[str, Any]) -> str:
    """The verdict's count (gated by the tests of one distribution, or withheld), with the
    null's own count beside it when they differ; the null's count for a report without a
    verdict."""
    raw = (report.get("spectrum") or {}).get("components_above_null")
    v = report.get("verdict")
    if not v:
        return _num(raw)
    if v.get("withheld"):
        return f"withheld ({_num(raw)} eigenvalue(s) above the null threshold, not claimed)"
    above = v.get("components_above_noise")
    if above is not None and raw is not None and above != raw:
        return f"{_num(above)} ({_num(raw)} eigenvalue(s) above the null threshold; not claimed for a stationary corpus)"
    return _num(above)


def _key_numbers(report: dict[str, Any]) -> list[tuple[str, str]]:
    c, p, s = report.get("corpus", {}), report.get("positions", {}), report.get("spectrum", {})
    h = report.get("hellinger", {})
    cf = s.get("components_for", {})
    rows = [
        ("corpus", f"{_num(c.get('sequences'))} sequences, {_num(c.get('tokens_counted'))} tokens, "
                   f"V = {_num(c.get('vocab_size'))}, mode {c.get('mode', '-')}"),
        ("fingerprint / tokenizer", f"{str(c.get('fingerprint', ''))[:16]} / {c.get('tokenizer', '-')} {str(c.get('tokenizer_hash', ''))[:12]}"),
        ("positions", f"{_num(p.get('occupied'))} of {_num(p.get('requested'))} occupied, {_num(p.get('used'))} used "
                      f"(min occupancy {p.get('min_occupancy', 1)})"),
        ("distances", _distances_name(report)),
        ("d_H min / mean / max", f"{_num(h.get('min'))} / {_num(h.get('mean'))} / {_num(h.get('max'))}"
         + (f" (plug-in); corrected {_num(h.get('corrected_min'))} / {_num(h.get('corrected_mean'))} / "
            f"{_num(h.get('corrected_max'))}" if "corrected_mean" in h else "")),
        ("MDS components above sampling noise", _components_above_noise(report)),
        ("MDS numerical rank", f"{s.get('rank', '-')} at rtol {s.get('rank_rtol', '-')} ({s.get('method', '-')}; "
                               "counts every component, noise included)"),
        (f"components for 90 / 95 / 99 / 99.9 % {variance_of(s)}",
         " / ".join(_num(cf.get(k)) for k in ("0.9", "0.95", "0.99", "0.999"))),
    ]
    h1, a3 = _corpus_h1(report), _corpus_a3(report)
    if h1 or a3:
        pair = h1.get("pair")
        at = f" at positions {pair[0]}, {pair[1]}" if pair else ""
        plugin = _distances_name(report) == "plug-in"
        rows.append(("non-stationary (H1)", f"{h1.get('nonstationary', '-')} ({h1.get('test', 'not tested')})"))
        rows.append(("corpus min d_H", f"{_num(h1.get('min_distance'))}{at} ("
                     + ("plug-in distances, sampling noise included" if plugin else "bias-corrected, clipped at 0")
                     + "; descriptive, not a test)"))
        rows.append(("corpus monotonicity violations (A3)", f"{_num(a3.get('rate'), '.4f')} ({a3.get('method', '-')})"))
    return rows


def _corpus_h1(report: dict[str, Any]) -> dict[str, Any]:
    """H1 entries of ``diagnostics`` (flat, or under ``h1``)."""
    d = report.get("diagnostics") or {}
    return d.get("h1") or {k: d[k] for k in ("min_distance", "pair", "nonstationary") if k in d}


def _corpus_a3(report: dict[str, Any]) -> dict[str, Any]:
    """The corpus' own monotonicity (A3): ``diagnostics.monotonicity`` or ``diagnostics.a3``."""
    d = report.get("diagnostics") or {}
    return d.get("a3") or d.get("monotonicity") or {}


_SAMPLED_MONOTONICITY = ("[lo, hi] after a sampled monotonicity rate: a 95 % Wilson interval for the error of "
                         "sampling triples alone (the rate over all triples of these distances), not for the "
                         "corpus' own sampling noise.")


def _sampled_monotonicity(e: dict[str, Any]) -> bool:
    """Whether an encoding entry's monotonicity rate comes from sampled triples (it then has a Wilson [lo, hi])."""
    return e.get("monotonicity_method") not in (None, "exact")


def _encoding_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    for e in report.get("encodings", []):
        mono = _num(e.get("monotonicity_violation_rate"), ".3f")
        if _sampled_monotonicity(e):
            ci = e.get("monotonicity_ci95") or [None, None]
            mono += f" [{_num(ci[0], '.3f')}, {_num(ci[1], '.3f')}]"
        rows.append([e.get("name"), e.get("dim"), _num(e.get("stress")), _num(e.get("scaled_stress")), _num(e.get("scale")),
                     _num(e.get("pearson"), ".3f"), _num(e.get("min_separation")), mono])
    return rows


def _held_out_rows(report: dict[str, Any]) -> list[list[str]]:
    """One row per (encoding, width) of the ``held_out`` section: scaled stress on the half it
    was built from and on the other, and the change."""
    rows = []
    for e in (report.get("held_out") or {}).get("encodings") or []:
        fit, held = e.get("fit_scaled_stress"), e.get("held_out_scaled_stress")
        change = f"{held - fit:+.3g}" if isinstance(fit, float) and isinstance(held, float) else "-"
        rows.append([e.get("name"), e.get("dim"), "fitted" if e.get("fitted") else "fixed", _num(fit), _num(held), change])
    return rows


def _held_out_intro(report: dict[str, Any]) -> str:
    h = report.get("held_out") or {}
    if h.get("skipped"):
        return f"Not scored: {h['skipped']}."
    tokens = h.get("tokens") or [0, 0]
    distances = ("bias-corrected distances (each half by its own noise floor)" if h.get("distances") == "bias_corrected"
                 else "plug-in distances")
    return (f"Every encoding built from one half of the corpus ({h.get('split')}; {tokens[0]:,} and {tokens[1]:,} "
            f"tokens) and scored against each half's {distances} ({h.get('stress_method')} stress): "
            "a fitted encoding (MDS, SMACOF) that loses more than the fixed ones from the first column to the second "
            "had fitted sampling noise.")


_HELD_HEADER = ("encoding", "dim", "kind", "scaled stress, fit half", "scaled stress, held-out half", "change")
_ENC_HEADER = ("encoding", "dim", "stress", "scaled stress", "scale a*", "pearson", "min separation", "monotonicity violations")


def _saving(share: float, /) -> str:
    """The low-rank table's saving as a percentage, with a second decimal where one would
    round a small loss to "-0.0%" (r(n + d) just above n d).

    >>> _saving(0.984), _saving(-0.000488), _saving(0.0)
    ('98.4%', '-0.05%', '0.0%')
    """
    return f"{share:.2%}" if share and abs(share) < 0.0005 else f"{share:.1%}"


_TRADE_HEADER = ("encoding", "rank r", "stress", "scaled stress", "parameters", "saving vs n*d")


def _tradeoff_rows(trade: list[dict[str, Any]], report: dict[str, Any], *, n: int, width: int) -> list[list[str]]:
    rows = []
    for e in report.get("encodings", []):
        if e.get("name") == "sinusoidal" and e.get("dim") == width:
            rows.append([f"sinusoidal (d={width})", "-", _num(e.get("stress")), _num(e.get("scaled_stress")), "0 (fixed)", "-"])
    for t in trade:
        rows.append([f"P_MDS, r={t['rank']}", t["rank"], _num(t["stress"]), _num(t["scaled_stress"]),
                     f"{t['parameters']:,}", _saving(t['saving'])])
    rows.append(["free n x d table", "<= d", "-", "-", f"{n * width:,}", "0%"])
    return rows


def _uncertainty_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    for top in ("noise_floor",):
        node = report.get(top)
        if node is None:
            continue
        items = node.items() if isinstance(node, dict) else [("", node)]
        for k, v in items:
            text = v if isinstance(v, (int, float, str)) else str(v)
            if isinstance(text, str) and len(text) > 120:
                text = text[:117] + "..."
            rows.append([f"{top}.{k}" if k else top, _num(text) if isinstance(text, float) else str(text)])
    return rows


def _model_width(run: RunData, width: int | None) -> int:
    """d of the low-rank trade-off: ``width``, else the largest analysed width."""
    dims = (run.report.get("config") or {}).get("dims") or [run.encoding.shape[1]]
    return int(width) if width is not None else int(max(dims))


def _tradeoff(run: RunData, idx: np.ndarray, dist: np.ndarray, *, width: int) -> list[dict[str, Any]]:
    """The low-rank trade-off on the distance sample: the default ranks plus the rank and
    the components for 90 / 95 / 99 / 99.9 % of the report."""
    spectrum = run.report.get("spectrum", {})
    cf = spectrum.get("components_for") or {}
    extra = [cf.get(x) for x in ("0.9", "0.95", "0.99", "0.999")] + [spectrum.get("rank")]
    ranks = default_ranks(run.encoding.shape[1], width=width, extra=extra)
    return lowrank_tradeoff(run.encoding[idx], dist, width=width, ranks=ranks, n=run.encoding.shape[0])


def _figures(run: RunData, idx: np.ndarray, dist: np.ndarray, trade: list[dict[str, Any]], *, width: int, max_heatmap: int) -> list[Any]:
    """The report's figures (:mod:`posstats.reports.plots`), in page order."""
    report = run.report
    positions_info = report.get("positions", {})
    m, k = run.encoding.shape
    plots = [occupancy_figure(positions_info.get("occupancy", []), min_occupancy=int(positions_info.get("min_occupancy", 1)))]
    plots.append(distance_heatmap_figure(dist, run.positions[idx], max_size=max_heatmap, total=m, kind=_distances_name(report)))
    plots.append(spectrum_figure(run.eigenvalues, explained_share(run.eigenvalues, report), rank=report.get("spectrum", {}).get("rank"),
                                 eigenvalue_ci=_lookup(report, "spectrum.eigenvalues_ci95"),
                                 noise_floor=noise_threshold(report), tested=rank_test_eigenvalues(report),
                                 tested_bound=rank_test_bound(report), weights_ratio=weights_ratio(report),
                                 stopped=null_stopped(report),
                                 explained_label=explained_label(run.eigenvalues, report)))
    plots.append(encoding_scatter_figure(run.encoding, run.positions))
    if k >= 3:
        plots.append(encoding_scatter3d_figure(run.encoding, run.positions))
    entries = report.get("encodings", [])
    if entries:
        plots.append(stress_by_dim_figure(entries))
        named = not all_tied(report.get("verdict") or {})  # the verdict ties every value otherwise
        for i, sweep in enumerate((report.get("config") or {}).get("sweeps") or []):
            plots.append(sweep_figure(sweep, entries, index=i, star=named))
    plots.append(lowrank_figure(trade, n=m, width=width, stress_positions=len(idx), informative=informative_rank(report)))
    if entries:
        plots.append(monotonicity_figure(entries, corpus_rate=_corpus_a3(report).get("rate")))
    return plots


_write_figures = write_figures


def _html_page(
    run: RunData, plots: Sequence[Any], images: dict[str, bytes], trade_rows: list[list[str]], *,
    title: str, stress_positions: int, width: int, seconds: float, links: Sequence[tuple[str, str]] = (),
) -> str:
    """The self-contained page: key numbers, tables, figures as base64 ``data:`` URIs."""
    report = run.report
    m = run.encoding.shape[0]
    entries = report.get("encodings", [])
    unc = _uncertainty_rows(report)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_esc(title)}</h1>",
        f'<p class="meta">posstats {_esc(report.get("tool", {}).get("version", __version__))}, analysed '
        f'{_esc(report.get("created", "-"))}, run id {_esc(run.run_id)}. Quantities are defined in THEORY.md; '
        "d_H is the Hellinger distance (no 1/2 factor, in [0, sqrt 2]).</p>",
        "<nav>" + "".join(f'<a href="#{p.name}">{_esc(p.title)}</a>' for p in plots) + "</nav>",
    ]
    answer = answer_sentences(report)
    if answer:
        text = re.sub(r"`([^`]+)`", r"<code>\1</code>", " ".join(_esc(x) for x in answer))
        parts.append('<p class="answer">' + text + "</p>")
    verdict = verdict_items(report)
    if verdict:
        parts += ["<h2>Verdict</h2>", _html_table(("question", "answer"), verdict, cls="kv verdict")]
    if links:
        parts.append("<p>" + " &middot; ".join(f'<a href="{_esc(href)}">{_esc(text)}</a>' for text, href in links) + "</p>")
    parts += [
        "<h2>Key numbers</h2>",
        _html_table(("quantity", "value"), _key_numbers(report), cls="kv"),
    ]
    if entries:
        parts += ["<h2>Encodings</h2>", _html_table(_ENC_HEADER, _encoding_rows(report))]
        if any(map(_sampled_monotonicity, entries)):
            parts.append(f"<p>{_esc(_SAMPLED_MONOTONICITY)}</p>")
    if encoding_note_lines(report):
        heading = [] if entries else ["<h2>Encodings</h2>"]
        parts += heading + [f"<p>{_esc(line[0].upper() + line[1:])}</p>" for line in encoding_note_lines(report)]
    if report.get("held_out"):
        parts += ["<h2>Held out</h2>", f"<p>{_esc(_held_out_intro(report))}</p>"]
        if _held_out_rows(report):
            parts.append(_html_table(_HELD_HEADER, _held_out_rows(report)))
    parts += [
        f"<h2>Low-rank MDS encodings (n = {m}, d = {width})</h2>",
        "<p>P = A W<sup>T</sup> with A (n x r) and W (d x r) orthonormal has r(n + d) parameters instead of n d and "
        "the distances, so the stress, of the first r MDS coordinates"
        + (f" (stress over all pairs of an even sample of {stress_positions} of the {m} positions: the {m} x {m} "
           f"distance matrix of every position would take {8 * m * m / 1e9:.3g} GB)" if stress_positions < m else "")
        + f", against the {_distances_name(report)} distances of the whole report. "
        + f"{_esc(lowrank_noise_note(report))}</p>",
        _html_table(_TRADE_HEADER, trade_rows),
    ]
    if unc:
        parts += ["<h2>Uncertainty</h2>", _html_table(("entry", "value"), unc)]
    parts.append("<h2>Figures</h2>")
    parts += [figure_html(p, images[p.name]) for p in plots]
    parts += ['<h2 id="terms">Terms</h2>', _html_table(("term", "meaning", "defined in"), list(GLOSSARY), cls="kv")]
    parts.append(f'<p class="meta">Written in {seconds:.1f} s. PNG files: {FIGURES_DIR}/.</p></body></html>')
    return "\n".join(parts) + "\n"


def render_html_report(
    run: RunData,
    /,
    *,
    width: int | None = None,
    max_positions: int = 2048,
    max_heatmap: int = 512,
    name: str | None = None,
    out: str | os.PathLike | None = None,
    links: Sequence[tuple[str, str]] = (),
) -> Path:
    """Write ``report.html``, ``figures/*.png`` and ``summary.md`` of a run.

    ``links``: (text, href) pairs listed under the verdict (the pipeline links the diff
    against the previous run).

    ``run`` is a run just analysed (:func:`posstats.runs.run_folder.run_from_analysis`:
    its distances are held, nothing is recomputed) or read back
    (:func:`posstats.runs.run_folder.load_run`: the d_H are computed from its counts).
    Options and errors as in :func:`write_html_report`; ``out`` defaults to ``run.folder``.
    """
    t0 = time.perf_counter()
    idx, dist = run_distances(run, max_positions=max_positions)
    d_model = _model_width(run, width)
    trade = _tradeoff(run, idx, dist, width=d_model)
    plots = _figures(run, idx, dist, trade, width=d_model, max_heatmap=max_heatmap)
    target = Path(out) if out is not None else run.folder
    images = _write_figures(plots, target / FIGURES_DIR)
    title = f"posstats report: {name or run.directory.resolve().name}"
    m = run.encoding.shape[0]
    trade_rows = _tradeoff_rows(trade, run.report, n=m, width=d_model)
    page = _html_page(run, plots, images, trade_rows, title=title, stress_positions=len(idx), width=d_model,
                      seconds=time.perf_counter() - t0, links=links)
    md = _summary_markdown(run.report, trade_rows, plots, title=title, run_id=run.run_id, n=m, width=d_model)
    with atomic_path(target / SUMMARY_FILE) as tmp:
        tmp.write_text(md)
    page_path = target / HTML_FILE
    with atomic_path(page_path) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return page_path


def write_html_report(
    run_dir: str | os.PathLike,
    /,
    *,
    width: int | None = None,
    max_positions: int = 2048,
    max_heatmap: int = 512,
    name: str | None = None,
    out: str | os.PathLike | None = None,
) -> Path:
    """Write ``report.html``, ``figures/*.png`` and ``summary.md`` for a run folder:
    :func:`render_html_report` of :func:`posstats.runs.run_folder.load_run`.

    Args:
        run_dir: a folder written by ``posstats run`` or ``posstats analyze``.
        width: model width d of the low-rank trade-off (default: the largest analysed
            width, ``config.dims``).
        max_positions: distances use at most this many used positions (an even sample).
        max_heatmap: the heatmap shows at most this many positions per side.
        name: the run's name in the title (default: the folder's name; a command that
            writes into a staging folder passes the destination's name).
        out: the folder to write into (default: where ``run_dir``'s files are; a
            published run folder is rewritten through :func:`posstats.storage.publish.staged_output`).

    Returns:
        The path of ``report.html``.

    Raises:
        InputError: the folder, its report, MDS file or counts are missing or unreadable.
    """
    return render_html_report(load_run(run_dir), width=width, max_positions=max_positions, max_heatmap=max_heatmap,
                              name=name, out=out)


def _summary_markdown(report: dict[str, Any], trade_rows: list[list[str]], plots: Sequence[Any], *, title: str, run_id: str, n: int, width: int) -> str:
    lines = [f"## {title}", "", f"posstats {report.get('tool', {}).get('version', __version__)}, run id `{run_id}`.", ""]
    answer = answer_sentences(report)
    lines += ([" ".join(answer), ""] if answer else [])
    lines += [f"- **{label}**: {text}" for label, text in verdict_items(report)] + [""]
    lines += _md_table(("quantity", "value"), _key_numbers(report)) + [""]
    if report.get("encodings"):
        lines += _md_table(_ENC_HEADER, _encoding_rows(report)) + [""]
    notes = encoding_note_lines(report)
    lines += [f"{line[0].upper()}{line[1:]}" for line in notes] + ([""] if notes else [])
    if report.get("held_out"):
        lines += [f"Held out: {_held_out_intro(report)}", ""]
        if _held_out_rows(report):
            lines += _md_table(_HELD_HEADER, _held_out_rows(report)) + [""]
    lines += [f"Low-rank MDS encodings, n = {n}, d = {width} (P = A W^T: r(n + d) parameters). "
              f"{lowrank_noise_note(report)}", ""]
    lines += _md_table(_TRADE_HEADER, trade_rows) + [""]
    for p in plots:
        lines += [f"![{p.title}]({FIGURES_DIR}/{p.name}.png)", f"*{p.caption}*", ""]
    lines += ["Terms:", "", *glossary_lines(markdown=True)]
    return "\n".join(lines) + "\n"
