"""Writing an analysis into a run folder: the one writer used by ``posstats analyze``,
``posstats run`` (:func:`analyze_to`) and the pipeline's geometry and report stages.

:func:`write_analysis` writes, into a staging folder (published by the caller, e.g.
:func:`posstats.storage.publish.staged_output`):

- ``analysis-config.json``: the :class:`posstats.analysis.AnalysisConfig` used;
- ``mds.safetensors``: :func:`posstats.runs.run_folder.write_mds`;
- ``report.md`` and ``report.json`` (:meth:`posstats.analysis.Analysis.report` plus
  ``run_id`` and ``inputs`` when given);
- with ``html``: ``report.html``, ``figures/*.png`` and ``summary.md``
  (:func:`posstats.reports.html.render_html_report`), rendered from the analysis in
  memory: its distances are not computed again.

It returns the run in memory (:class:`posstats.runs.run_folder.RunData`, holding the
counts and the distances), from which an export renders without computing them again.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posstats.analysis import Analysis, AnalysisConfig, analyze
from posstats.counting.counts import PositionalCounts
from posstats.counting.window_groups_io import load_window_groups, window_groups_file
from posstats.reports.html import render_html_report
from posstats.reports.summary import format_markdown
from posstats.runs.noise_parts import corpus_parts
from posstats.runs.run_folder import (
    MDS_FILE,
    REPORT_FILE,
    RunData,
    run_from_analysis,
    write_mds,
)
from posstats.storage.jsontext import write_json_atomic
from posstats.storage.publish import atomic_path

__all__ = ["ANALYSIS_FILES", "CONFIG_FILE", "MARKDOWN_FILE", "analyze_to", "write_analysis"]

CONFIG_FILE = "analysis-config.json"
MARKDOWN_FILE = "report.md"
# what write_analysis writes besides the HTML report
ANALYSIS_FILES = (REPORT_FILE, MDS_FILE, MARKDOWN_FILE, CONFIG_FILE)


def write_analysis(
    stage: str | os.PathLike,
    analysis: Analysis,
    /,
    *,
    inputs: dict[str, Any] | None = None,
    run_id: str | None = None,
    html: bool = True,
    name: str | None = None,
    width: int | None = None,
    max_positions: int = 2048,
) -> RunData:
    """Write ``analysis`` into the folder ``stage`` (files in the module docstring).

    Args:
        stage: the folder to write into.
        analysis: from :func:`posstats.analysis.analyze`.
        inputs: ``report.json``'s ``inputs`` entry (e.g. ``{"counts": PATH}``; default empty).
        run_id: ``report.json``'s ``run_id`` (the pipeline's run), if any.
        html: also write ``report.html``, ``figures/`` and ``summary.md``.
        name, width, max_positions: of the HTML report
            (:func:`posstats.reports.html.write_html_report`).

    Returns:
        The run in memory, ``report`` as written.
    """
    stage = Path(stage)
    report = analysis.report().to_dict()
    if run_id is not None:
        report["run_id"] = run_id
    report["inputs"] = dict(inputs or {})
    stage.mkdir(parents=True, exist_ok=True)
    write_json_atomic(stage / CONFIG_FILE, analysis.config.to_dict())
    write_mds(stage / MDS_FILE, analysis.positions, analysis.mds, fingerprint=analysis.counts.fingerprint,
              weighted=analysis.weighted_encoding)
    with atomic_path(stage / MARKDOWN_FILE) as tmp:
        tmp.write_text(format_markdown(report))
    write_json_atomic(stage / REPORT_FILE, report)
    run = run_from_analysis(analysis, report, folder=stage)
    if html:
        render_html_report(run, width=width, max_positions=max_positions, name=name)
    return run


def analyze_to(
    counts: PositionalCounts,
    config: AnalysisConfig,
    stage: str | os.PathLike,
    /,
    *,
    counts_path: str | os.PathLike | None = None,
    name: str | None = None,
    store: str | os.PathLike | None = None,
    parts_dirs: Sequence[str | os.PathLike] | None = None,
    reread: bool = False,
) -> RunData:
    """Analyse ``counts`` (:func:`posstats.analysis.analyze`) and write the analysis folder,
    HTML report included, into ``stage`` (:func:`write_analysis`); return the run in memory.

    The noise floor splits the counted tokens at random, unless its parts are asked for:
    from ``store`` / ``parts_dirs``, or (``reread``) the corpus named in the config.json of
    ``stage`` (``posstats run``) or ``counts_path`` re-read by document parity
    (:func:`posstats.runs.noise_parts.corpus_parts`). ``report.json`` records
    ``inputs.counts`` = ``counts_path`` resolved; ``name`` titles the HTML report. A
    counts folder with its window groups
    (:func:`~posstats.counting.window_groups_io.load_window_groups`) gives the homogeneity
    test its null that respects windows.
    """
    parts = None
    if config.noise_floor != "off" and bool(store or parts_dirs or reread):
        parts = corpus_parts(counts, noise_floor=True, noise_parts=config.noise_parts, tokenizer=config.tokenizer,
                             store=store, parts_dirs=parts_dirs, reread=reread, places=(stage, counts_path))
    # posstats run counts into stage itself; analyze reads a counts folder
    place = stage if window_groups_file(stage) is not None else counts_path
    groups = load_window_groups(place, counts) if place else None
    result = analyze(counts, config, parts=parts, window_groups=groups)
    inputs = {"counts": str(Path(counts_path).resolve()) if counts_path else None}
    return write_analysis(stage, result, inputs=inputs, name=name)
