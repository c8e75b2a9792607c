"""The held-out section: encodings fitted on one half of the tokens, scored on the other.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from posstats.analysis.config import AnalysisConfig, encoding_jobs
from posstats.analysis.rows import _Rows
from posstats.estimates.held_out import HELD_OUT_AUTO_LIMIT, held_out_scores, parts_halves, token_halves
from posstats.estimates.thinning import split_noise_floor
from posstats.progress import progress


def _held_out_section(g: _Rows, geo_parts: Any, bias: np.ndarray | None, config: AnalysisConfig,
                      timings: dict[str, float], show_progress: bool | None, *, compared: bool = True) -> dict[str, Any] | None:
    """The ``held_out`` section (:mod:`posstats.estimates.held_out`): halves from the
    parts the noise floor used, else from a random split of the counted tokens; None when
    ``config.held_out`` leaves it out (``auto`` above its row limit: the section says so).
    Without ``compared`` (no structure found) the scores get no jackknife ranges."""
    m = len(g.index)
    if config.held_out == "off":
        return None
    if config.held_out == "auto" and m > HELD_OUT_AUTO_LIMIT:
        return {"skipped": f"{m:,} geometry rows > {HELD_OUT_AUTO_LIMIT:,}, the rows up to which held-out scores get "
                           "their ranges for ties (--held-out on scores it: a second MDS and stress pass)"}
    if g.ranged:  # analyze_ranges refuses "on"
        return {"skipped": "the rows are held apart in position ranges; held-out scores need the counts in one process"}
    t = time.perf_counter()
    if geo_parts is not None and len(geo_parts) >= 2:
        a, b = parts_halves([p.rows(g.index) for p in geo_parts])
        split = f"the noise floor's {len(geo_parts)} parts, even against odd"
    else:
        a, b = token_halves(g.rows, seed=config.seed)
        split = "tokens at random"
    jobs = encoding_jobs(config, m)
    exact = m <= config.exact_limit
    with progress(total=(len(jobs) + 2 + compared if exact else 3) + (bias is not None), desc="held out", unit="step", enabled=show_progress) as bar:

        def step(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

        bias_of = None
        if bias is not None:
            def bias_of(rows: Any) -> np.ndarray:
                return split_noise_floor(rows, parts=config.noise_parts, seed=config.seed, show_progress=False).bias

        section = held_out_scores(a, b, g.positions, jobs, exact=exact, split=split, bias_of=bias_of,
                                  context=g.context, seed=config.seed, stress_halfwidth=config.stress_halfwidth,
                                  stress_max_pairs=config.stress_max_pairs, lanczos_tol=config.lanczos_tol,
                                  progress=step, ranges=compared)
    timings["held_out"] = time.perf_counter() - t
    return section
