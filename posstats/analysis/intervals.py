"""Intervals on the stresses the verdict compares: the delete-a-group jackknife on the exact
path, the pair-sample jackknife on sampled pairs, and the reasons an interval is withheld
(docs/calibration.md, "Stress intervals").
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.sparse as sp

from posstats.analysis.config import AnalysisConfig, encoding_jobs
from posstats.analysis.rows import _Geometry, _Rows
from posstats.estimates.jackknife import (
    JACKKNIFE_GROUPS,
    delete_group_replicates,
    jackknife_correction,
    jackknife_interval,
    jackknife_sd,
    overshoot_tie_range,
)
from posstats.estimates.noise import corrected_squared_distances
from posstats.estimates.occupancy import adjusted
from posstats.estimates.pair_jackknife import (
    MAX_CORRECTION_SDS,
    correction_trusted,
    draw_jackknife_pairs,
    pair_jackknife_interval,
    pair_noise_share,
    pair_replicates,
)
from posstats.estimates.ranged_jackknife import ranged_pair_replicates
from posstats.estimates.sampled import _encoding_pair_distances, stress_from_pairs
from posstats.estimates.sampling_variance import position_sampling_variance
from posstats.estimates.verdict import DISTANCE_NOISE_CAVEAT, NO_STRUCTURE_INTERVAL, NOISE_WITHHELD
from posstats.geometry.encodings import family_of, make_encoding
from posstats.geometry.hellinger import hellinger_sq
from posstats.geometry.mds import classical_mds
from posstats.geometry.stress import stress_report
from posstats.progress import progress

_JACKKNIFE_LIMIT = 2048  # geometry rows up to which exact stresses get jackknife intervals
# Noise share from which the jackknife over all pairs (up to _JACKKNIFE_LIMIT rows) gives no
# 95 % interval: its coverage falls as the share rises (its sd misses the clipped near-zero
# pairs' spread; docs/calibration.md): 94-98 % at shares 0.021-0.033 (drift and all_planted,
# n = 64 and 512, N = 100,000), 89.8 % at 0.045 and 87.5 % at 0.050 (all_planted, N =
# 20,000, n = 64 and 512), 87.5 % at 0.07 (drift, n = 64, N = 20,000). The pair-sample
# jackknife above it, whose width adds the pairs' sampling error, covered 54 of 54 below
# DISTANCE_NOISE_CAVEAT.
JACKKNIFE_NOISE_LIMIT = 0.04
_JACKKNIFE_SMACOF_LIMIT = 128  # ... and SMACOF is refitted on every replicate (O(m^2) per iteration)
_SMACOF_NOT_REFITTED = f"none: SMACOF is not refitted above {_JACKKNIFE_SMACOF_LIMIT} rows"
_JACKKNIFE_MIN_OCCUPANCY = 20  # a row this full keeps a token in every replicate (P(empty) <= 0.1^20)
_THIN_ROWS = f"none: a geometry row has fewer than {_JACKKNIFE_MIN_OCCUPANCY} tokens (--min-occupancy raises the floor)"


def _stress_intervals(geometry: _Geometry, g: _Rows, *, corrected: bool, config: AnalysisConfig,
                      noise_share: float | None, show_progress: bool | None, compared: bool = True) -> float | None:
    """Jackknife intervals on the stresses (none when not ``compared``: no test found
    structure, the verdict ties every encoding and a stress against a geometry of
    identical positions has no truth to cover; :func:`_uncompared`): up to
    ``_JACKKNIFE_LIMIT`` rows the delete-a-group jackknife with refits (:func:`_jackknife_intervals`), above it the pair-sample jackknife
    of the fixed encodings (:func:`_pair_intervals`), given as 95 % intervals only while
    sampling noise alone stays below ``JACKKNIFE_NOISE_LIMIT`` (the former) or
    ``DISTANCE_NOISE_CAVEAT`` (the latter) of the summed distances
    (``null.distance_noise.share``, or the pairs' own share where no shuffle null gave it).
    Above it the stresses lean toward the noise and the intervals cover less than 95 %
    (docs/calibration.md: 87.5 % on drifts at a share of 0.07, 28-58 % on planted corpora),
    so the entry's ``*_ci95`` stay
    zero-width and the jackknife's range moves to ``scaled_stress_tie_range``: the verdict
    still calls encodings within it tied (no winner named inside the sampling spread),
    nothing prints it as an interval. Returns the noise share the intervals were judged by."""
    results = geometry.encodings
    if not compared:
        return _uncompared(geometry, g, corrected=corrected, config=config, noise_share=noise_share)
    if geometry.jackknife_pairs is None and len(g.positions) <= _JACKKNIFE_LIMIT:
        _jackknife_intervals(results, g, corrected=corrected, config=config, show_progress=show_progress)
        limit = JACKKNIFE_NOISE_LIMIT
    else:
        noise_share = _pair_intervals(geometry, g, corrected=corrected, config=config, noise_share=noise_share,
                                      show_progress=show_progress)
        limit = DISTANCE_NOISE_CAVEAT
    if noise_share is None or noise_share < limit:
        return noise_share
    why = (f"{NOISE_WITHHELD} {_share_text(noise_share)} of the summed distances "
           f"(>= {limit:.0%}): a 95 % interval would cover below 95 % (docs/calibration.md); "
           "the jackknife's range (scaled_stress_tie_range) only decides ties")
    for e in results:
        reason = str(e.get("stress_interval", ""))
        if reason.startswith("jackknife"):
            e["scaled_stress_tie_range"] = e["scaled_stress_ci95"]
            e["stress_ci95"], e["scaled_stress_ci95"] = [e["stress"]] * 2, [e["scaled_stress"]] * 2
            e["stress_interval"] = why
        elif reason.startswith((_BELOW_ZERO, _LARGE_CORRECTION, _FITTED_IN_SAMPLE)):
            # a stress within its noise of 0 (a fit to rounding, such as SMACOF at full width),
            # or one whose correction is not trusted: its tie range stays; the reason that
            # withholds every interval is the noise's
            e["stress_interval"] = why
    return noise_share


_BELOW_ZERO = "none: the jackknife's bias-corrected interval lies below 0"  # a stress_interval reason
_LARGE_CORRECTION = "none: the jackknife's bias correction"  # ... and how the next one starts
# a fitted encoding's in-sample stress: covered 57 of 82 (all_planted, n = 64, N = 20,000;
# 0 of 18 at d = 16), docs/calibration.md "Fitted encodings in-sample"
_FITTED_IN_SAMPLE = ("none: a fitted encoding's in-sample stress depends on the sampling noise through its fit "
                     "(the directions MDS keeps among near-equal eigenvalues, SMACOF's iterations) in a way the "
                     "jackknife does not remove (docs/calibration.md); scaled_stress_tie_range only decides ties, "
                     "and its held-out score compares it on other tokens")


def _large_correction_reason(correction: float, sd: float) -> str:
    """Why no interval is given where the jackknife's correction of the scaled stress
    exceeds ``MAX_CORRECTION_SDS`` of its sd (the range is kept for ties)."""
    return (f"{_LARGE_CORRECTION} of the scaled stress ({correction:+.2g}) is {abs(correction) / sd:.1f} of its "
            f"standard deviations (> {MAX_CORRECTION_SDS:g}): pairs inside their noise leave a bias it does not "
            "remove (docs/calibration.md); the range only decides ties")


def _share_text(share: float) -> str:
    """A noise share as a percentage for a message, to the precision that tells it from the
    limits it is compared with (0.07 is "7.0 %", not "7%" beside ">= 5%")."""
    return f"{min(share, 1.0):.1%}"


def _jackknife_intervals(results: list[dict[str, Any]], g: _Rows, *, corrected: bool, config: AnalysisConfig,
                         show_progress: bool | None) -> None:
    """Replace the exact path's zero-width stress intervals by delete-a-group jackknife
    intervals (:mod:`posstats.estimates.jackknife`): every replicate recomputes the
    distances (with their own bias correction), refits the fitted encodings and rescores
    every encoding. Entries say how (``stress_interval``); none is given above
    ``_JACKKNIFE_LIMIT`` rows or with rows of fewer than ``_JACKKNIFE_MIN_OCCUPANCY``
    tokens, nor for SMACOF above ``_JACKKNIFE_SMACOF_LIMIT`` rows, nor where the correction
    of the scaled stress exceeds ``MAX_CORRECTION_SDS`` of its sd (as on the pair-sample
    path), nor for a fitted encoding (its in-sample stress depends on the noise through its
    fit, beyond what the jackknife removes: ``_FITTED_IN_SAMPLE``); the interval is then kept
    as ``scaled_stress_tie_range``, for ties only."""
    m = len(g.positions)
    if float(np.min(g.occupancy)) < _JACKKNIFE_MIN_OCCUPANCY:
        for e in results:
            e["stress_interval"] = _THIN_ROWS
        return
    jobs = [(dim, spec) for dim, spec in encoding_jobs(config, m)
            if m <= _JACKKNIFE_SMACOF_LIMIT or not family_of(spec).quadratic]
    if not jobs:  # only SMACOF asked for, above its refit limit
        for e in results:
            e["stress_interval"] = _SMACOF_NOT_REFITTED
        return
    fitted = any(family_of(spec).fitted for _, spec in jobs)
    top = min(m, max(dim for dim, _ in jobs))  # the coordinates the fitted encodings read

    def statistic(rows: sp.csr_array) -> dict[tuple[int, str, str], float]:
        d2 = hellinger_sq(rows)
        if corrected:  # the data's estimator: the occupancy shrinkage removed (the replicate's own)
            adjusted(d2, rows)
        b = position_sampling_variance(rows) if corrected else None
        mds = classical_mds(rows, k=top, method="dense", diagonal=b, squared_distances=d2) if fitted else None
        dist = np.sqrt(corrected_squared_distances(d2, b)) if corrected else np.sqrt(d2)
        occ = np.asarray(rows.sum(axis=1), dtype=np.float64).ravel()
        out = {}
        for dim, spec in jobs:
            enc = make_encoding(spec, g.positions, dim, mds=mds, distances=dist, occupancy=occ, context=g.context)
            rep = stress_report(enc.matrix, dist)
            out[(dim, enc.name, "stress")], out[(dim, enc.name, "scaled_stress")] = rep.stress, rep.scaled_stress
        return out

    with progress(total=JACKKNIFE_GROUPS, desc="stress intervals", unit="replicate", enabled=show_progress) as bar:
        reps = delete_group_replicates(g.rows, statistic, groups=JACKKNIFE_GROUPS, seed=config.seed, progress=bar.update)
    for (_, spec), e in zip(encoding_jobs(config, m), results, strict=True):
        key = (int(e["dim"]), e["name"])
        if (*key, "stress") not in reps:
            e["stress_interval"] = _SMACOF_NOT_REFITTED
            continue
        raw = jackknife_interval(e["stress"], reps[(*key, "stress")], bounds=(0.0, math.inf))
        scaled = jackknife_interval(e["scaled_stress"], reps[(*key, "scaled_stress")], bounds=(0.0, 1.0))
        if raw is None or scaled is None:
            e["scaled_stress_tie_range"] = overshoot_tie_range(e["scaled_stress"], reps[(*key, "scaled_stress")])
            e["stress_interval"] = (f"{_BELOW_ZERO} (its 1/N extrapolation overshoots a stress within its noise of 0); "
                                    "scaled_stress_tie_range only decides ties")
            continue
        if family_of(spec).fitted:
            e["scaled_stress_tie_range"] = scaled
            e["stress_interval"] = _FITTED_IN_SAMPLE
            continue
        # judged on the scaled stress, the quantity the verdict compares: a correction of many
        # sds is a bias the 1/N extrapolation does not model (an encoding that fits the
        # distances almost exactly, ALiBi on a drift: covered 12 of 26 at n = 512, N = 1e5)
        correction = jackknife_correction(e["scaled_stress"], reps[(*key, "scaled_stress")])
        sd = jackknife_sd(reps[(*key, "scaled_stress")])
        if not correction_trusted(correction, sd):
            e["scaled_stress_tie_range"] = scaled
            e["stress_interval"] = _large_correction_reason(correction, sd)
            continue
        e["stress_ci95"], e["scaled_stress_ci95"] = raw, scaled
        e["stress_interval"] = f"jackknife, {JACKKNIFE_GROUPS} random token groups, cut to the quantity's range"


def _pair_intervals(geometry: _Geometry, g: _Rows, *, corrected: bool, config: AnalysisConfig,
                    noise_share: float | None, show_progress: bool | None) -> float | None:
    """Above ``_JACKKNIFE_LIMIT`` rows: token-noise intervals on the stresses of the fixed
    encodings from the pair-sample jackknife (:mod:`posstats.estimates.pair_jackknife`), on
    the exact path around the exact stress, on the sampled path around the sampled one
    with its pair-sampling error added. Fitted encodings (the replicates would have to
    refit them) get none: their pair-sampling interval, if any, moves to
    ``scaled_stress_tie_range``. Where the noise share reaches ``DISTANCE_NOISE_CAVEAT`` no
    interval will be given (:func:`_stress_intervals`), and the range for ties is computed
    on the first m/8 pairs only (their rows are fewer: at 202 M tokens, n = 131,072, about
    a third of the time). Returns the noise share the intervals are judged by: the null's,
    else the pairs' own (:func:`posstats.estimates.pair_jackknife.pair_noise_share`)."""
    m = len(g.positions)
    sampled = geometry.jackknife_pairs is not None
    jobs = list(zip(encoding_jobs(config, m), geometry.encodings, strict=True))
    fixed = [(dim, spec, e) for (dim, spec), e in jobs if not family_of(spec).fitted]
    thin = float(np.min(g.occupancy)) < _JACKKNIFE_MIN_OCCUPANCY
    for (_, spec), e in jobs:
        if family_of(spec).fitted or thin:
            _no_pair_interval(e, fitted=family_of(spec).fitted, sampled=sampled)
    rows, i, j, h = _jackknife_pair_sample(geometry, g, config)
    if noise_share is None:
        noise_share = _pairs_noise_share(g, rows, i, j, h, corrected=corrected, seed=config.seed,
                                         occupancy_adjusted=geometry.occupancy_adjusted)
    if thin or not fixed:
        return noise_share
    noisy = noise_share is not None and noise_share >= DISTANCE_NOISE_CAVEAT
    if noisy:
        # no 95 % interval will be given, only a range for ties: on the first m/8 pairs (a
        # uniform sample too), whose rows are fewer; a range wider than on 4 m pairs, which
        # only calls more encodings tied
        count = min(i.size, max(m // 8, 1024))
        i, j, h = i[:count], j[:count], h[:count]
    e_of = {(dim, e["name"]): _encoding_pair_distances_of(spec, dim, g, i, j) for dim, spec, e in fixed}
    full = {key: stress_from_pairs(x, h) for key, x in e_of.items()}
    reps = _pair_stress_replicates(geometry, g, rows, i, j, e_of, corrected=corrected, config=config,
                                   show_progress=show_progress)
    how = (f"jackknife, {JACKKNIFE_GROUPS} random token groups, on {i.size:,} sampled pairs"
           + (" plus the stress's own pair sampling" if sampled else "") + ", cut to the quantity's range")
    for dim, _, e in fixed:
        key = (dim, e["name"])
        _set_pair_interval(e, full[key], reps[(*key, "stress")], reps[(*key, "scaled_stress")],
                           sampled=sampled, noisy=noisy, how=how)
    return noise_share


def _no_pair_interval(e: dict[str, Any], /, *, fitted: bool, sampled: bool) -> None:
    """Mark the report entry ``e`` of an encoding that gets no pair-sample interval (a fitted
    one, or any where a row is thin): on the sampled path its pair-sampling interval, which
    leaves out the token noise, becomes a range for ties only."""
    if sampled:
        e["scaled_stress_tie_range"] = e["scaled_stress_ci95"]
        e["stress_ci95"], e["scaled_stress_ci95"] = [e["stress"]] * 2, [e["scaled_stress"]] * 2
    e["stress_interval"] = (f"none: a fitted encoding is refitted by the jackknife only on the exact path up to "
                            f"{_JACKKNIFE_LIMIT:,} geometry rows (its interval would leave out its own fit to the noise)"
                            if fitted else _THIN_ROWS)


def _pair_stress_replicates(geometry: _Geometry, g: _Rows, rows: sp.csr_array | None, i: np.ndarray, j: np.ndarray,
                            e_of: dict[tuple[int, str], np.ndarray], *, corrected: bool, config: AnalysisConfig,
                            show_progress: bool | None) -> dict[tuple[int, str, str], np.ndarray]:
    """(JACKKNIFE_GROUPS,) replicates of each fixed encoding's ``stress`` and
    ``scaled_stress`` on the pairs ``(i, j)``, keyed ``(dim, name, quantity)``; ``e_of``
    holds each encoding's distances on those pairs, keyed ``(dim, name)``."""

    def statistic(h_r: np.ndarray) -> dict[tuple[int, str, str], float]:
        out = {}
        for key, x in e_of.items():
            rep = stress_from_pairs(x, h_r)
            out[(*key, "stress")], out[(*key, "scaled_stress")] = rep.stress, rep.scaled_stress
        return out

    with progress(total=JACKKNIFE_GROUPS, desc="stress intervals", unit="replicate", enabled=show_progress) as bar:
        if g.ranged:
            return ranged_pair_replicates(g.replicates(JACKKNIFE_GROUPS, config.seed), i, j, statistic,
                                          corrected=corrected, vocab=g.rows.shape[1], progress=bar.update,
                                          occupancy=geometry.occupancy_adjusted)
        return pair_replicates(rows, i, j, statistic, corrected=corrected, seed=config.seed, progress=bar.update,
                               occupancy=geometry.occupancy_adjusted)


def _set_pair_interval(e: dict[str, Any], full: Any, stress_reps: np.ndarray, scaled_reps: np.ndarray, /, *,
                       sampled: bool, noisy: bool, how: str) -> None:
    """Write one fixed encoding's pair-sample jackknife interval into its report entry
    ``e`` (``full``: its stress on every sampled pair; the replicates as from
    :func:`_pair_stress_replicates`), or the range for ties and the reason where none holds:
    a stress within its noise of 0, or (unless ``noisy`` withholds every interval anyway) a
    bias correction too large for the scaled stress. On the sampled path the entry's own
    pair-sampling sd is added."""
    sd = {q: (e[f"{q}_ci95"][1] - e[f"{q}_ci95"][0]) / (2 * _Z95) if sampled else 0.0
          for q in ("stress", "scaled_stress")}
    raw = pair_jackknife_interval(e["stress"], full.stress, stress_reps, pair_sd=sd["stress"], bounds=(0.0, math.inf))
    scaled = pair_jackknife_interval(e["scaled_stress"], full.scaled_stress, scaled_reps,
                                     pair_sd=sd["scaled_stress"], bounds=(0.0, 1.0))
    if raw.interval is None or scaled.interval is None:
        e["scaled_stress_tie_range"] = overshoot_tie_range(e["scaled_stress"], scaled_reps, extra_sd=sd["scaled_stress"])
        e["stress_interval"] = f"{_BELOW_ZERO} (a stress within its noise of 0); scaled_stress_tie_range only decides ties"
        return
    # judged on the scaled stress, the quantity the verdict compares; where noise withholds
    # every interval (_stress_intervals) that is the reason given
    if not scaled.trusted and not noisy:
        e["scaled_stress_tie_range"] = scaled.interval
        e["stress_ci95"], e["scaled_stress_ci95"] = [e["stress"]] * 2, [e["scaled_stress"]] * 2
        e["stress_interval"] = _large_correction_reason(scaled.correction, scaled.sd)
        return
    e["stress_ci95"], e["scaled_stress_ci95"] = raw.interval, scaled.interval
    e["stress_interval"] = how


_Z95 = 1.959963984540054


def _pairs_noise_share(g: _Rows, rows: sp.csr_array | None, i: np.ndarray, j: np.ndarray, h: np.ndarray, *,
                       corrected: bool, seed: int, occupancy_adjusted: bool = False) -> float | None:
    """:func:`posstats.estimates.pair_jackknife.pair_noise_share` of the pairs: from the rows,
    or (held apart) from their occupancies and pooled counts; ``occupancy_adjusted`` as the
    pairs' distances ``h`` were (the exact path)."""
    if rows is None:
        return pair_noise_share(None, i, j, h, corrected=corrected, seed=seed, occupancy=g.occupancy,
                                pooled=g.column_totals(), occupancy_adjusted=occupancy_adjusted)
    return pair_noise_share(rows, i, j, h, corrected=corrected, seed=seed, occupancy_adjusted=occupancy_adjusted)


def _jackknife_pair_sample(geometry: _Geometry, g: _Rows,
                           config: AnalysisConfig) -> tuple[sp.csr_array | None, np.ndarray, np.ndarray, np.ndarray]:
    """The canonical int64 CSR rows (None when held apart) and the pair-sample jackknife's
    pairs ``i, j`` with their corpus distances ``h``: the sampled geometry's own, else drawn
    (:func:`draw_jackknife_pairs`) and read from the exact distances."""
    if g.ranged:
        i, j, h = geometry.jackknife_pairs
        return None, i, j, h
    rows = sp.csr_array(g.rows, dtype=np.int64) if not sp.issparse(g.rows) else sp.csr_array(g.rows)
    rows.sum_duplicates()  # a no-op on canonical counts (no copy)
    if geometry.jackknife_pairs is not None:
        i, j, h = geometry.jackknife_pairs
    else:
        i, j = draw_jackknife_pairs(len(g.positions), entries_per_row=rows.nnz / len(g.positions), seed=config.seed)
        h = geometry.distances[i, j]
    return rows, i, j, h


def _uncompared(geometry: _Geometry, g: _Rows, *, corrected: bool, config: AnalysisConfig,
                noise_share: float | None) -> float | None:
    """Stress entries when no test found structure: no interval (``stress_interval`` says
    why); on the sampled path the pairs' interval, which leaves out the token noise, stays
    as the range for ties. Above ``_JACKKNIFE_LIMIT`` rows the noise share (for the report's
    caveat) still comes from the pairs when no null gave it. Returns the noise share."""
    for e in geometry.encodings:
        if geometry.jackknife_pairs is not None:
            e["scaled_stress_tie_range"] = e["scaled_stress_ci95"]
            e["stress_ci95"], e["scaled_stress_ci95"] = [e["stress"]] * 2, [e["scaled_stress"]] * 2
        e["stress_interval"] = NO_STRUCTURE_INTERVAL
    if noise_share is None and (geometry.jackknife_pairs is not None or len(g.positions) > _JACKKNIFE_LIMIT):
        rows, i, j, h = _jackknife_pair_sample(geometry, g, config)
        noise_share = _pairs_noise_share(g, rows, i, j, h, corrected=corrected, seed=config.seed,
                                         occupancy_adjusted=geometry.occupancy_adjusted)
    return noise_share


def _encoding_pair_distances_of(spec: str, dim: int, g: _Rows, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """``|p_i - p_j|`` of a fixed encoding over the pairs."""
    p = np.asarray(make_encoding(spec, g.positions, dim, occupancy=g.occupancy, context=g.context).matrix,
                   dtype=np.float64)
    return _encoding_pair_distances(p, i, j)
