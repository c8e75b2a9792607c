"""Held-out scores: fitted encodings graded on counts they were not fitted to.

The stress of ``mds`` or ``mds-smacof`` in the main table is measured on the very counts
the encoding was fitted to, so part of its lead over a fixed encoding (sinusoidal, RoPE,
ALiBi, a learned table) can be sampling noise it has learned. Here the corpus is split in
two halves A and B:

* by default every counted token goes to A or B at random (a binomial thinning of each
  count ``C[i, v]``, :func:`posstats.estimates.thinning.thin`): two independent samples
  of every ``mu_i`` with half the tokens each, the split the noise floor uses;
* with the parts the analysis was given (documents or shards, :mod:`posstats.runs.noise_parts`),
  the even parts against the odd ones, which keeps a document's tokens together.

Every encoding is built from A alone (the MDS of A's distances, SMACOF started from it;
a fixed encoding is the same table either way) and scored with the stress of THEORY
section 7 against A's distances (``fit``) and against B's (``held_out``). A fitted
encoding's drop from ``fit`` to ``held_out`` is what it owed to A's noise; the fixed ones
drop only by the halves' difference in noise, so ``held_out`` ranks all of them on equal
terms. Positions that received no token in one half are left out of both (a distribution
of zero tokens is undefined); the entry says how many.

Bias-corrected distances, when the analysis uses them, are corrected with each half's
own noise floor (its tokens split again, :func:`posstats.estimates.thinning.split_noise_floor`):
the bias of ``d_H^2`` depends on the tokens a position has in a way that is not ``1 / N``
in the sparse regime, so the full corpus' ``b_i`` cannot simply be doubled.

Up to the exact limit the stresses are exact (every pair); above it the MDS of A is a
block-Lanczos solve and both stresses are sampled (:class:`posstats.estimates.sampled.SampledGeometry`,
whose pair-sampling range decides ties only), which costs about what the main geometry did again.

**Ranges for ties** (:func:`held_out_intervals`; exact path, up to :data:`JACKKNIFE_ROWS`
rows, which is also the ``auto`` limit, every row of both halves holding at least
:data:`JACKKNIFE_MIN_TOKENS` tokens; where no score has one the held-out best ties every
encoding). The held-out score of an encoding is noisy twice: the fit reads A's noise and the score B's.
The delete-a-group jackknife of :mod:`posstats.estimates.jackknife` takes both into
account: each half's tokens are split into 10 random groups, replicate g leaves out group
g of A *and* of B, refits the fitted encodings on what is left of A and scores them on
what is left of B. ``theta_J -+ t_9 sd_J`` targets the score's large-sample limit (for a
fixed encoding its stress against the true distances, for a fitted one the stress of the
same fit made on the true distances), but measured against that truth it covers less than
95 % (86 % on drift corpora, 55 % for ALiBi's small stress: half the tokens leave pairs
inside their noise, whose bias a 1/N extrapolation does not remove; docs/calibration.md).
So it is no 95 % interval: it is kept as ``held_out_scaled_stress_tie_range``, and the
held-out best calls encodings within it tied, so that no winner is named on a difference
inside the sampling spread. ``held_out_scaled_stress_ci95`` stays the zero-width point;
``held_out_interval`` says how the range was made, or why there is none. SMACOF is
refitted only up to :data:`JACKKNIFE_SMACOF_ROWS` rows (O(m^2) an iteration).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from posstats.estimates.jackknife import JACKKNIFE_GROUPS, jackknife_interval, overshoot_tie_range, without_group
from posstats.estimates.noise import corrected_squared_distances
from posstats.estimates.pair_jackknife import token_groups
from posstats.estimates.sampled import SampledGeometry
from posstats.estimates.occupancy import OccupancyShrinkage, adjusted
from posstats.estimates.sampling_variance import position_sampling_variance
from posstats.estimates.thinning import thin
from posstats.estimates.verdict import NO_STRUCTURE_INTERVAL, best_encodings, held_out_row
from posstats.geometry.encodings import family_of, make_encoding
from posstats.geometry.hellinger import hellinger_sq
from posstats.geometry.mds import classical_mds
from posstats.geometry.sqrt_operator import shifted_operator, sqrt_operator
from posstats.geometry.stress import stress_report

__all__ = [
    "HELD_OUT_AUTO_LIMIT",
    "HELD_OUT_CHOICES",
    "JACKKNIFE_MIN_TOKENS",
    "JACKKNIFE_ROWS",
    "JACKKNIFE_SMACOF_ROWS",
    "held_out_intervals",
    "held_out_scores",
    "parts_halves",
    "token_halves",
]

HELD_OUT_CHOICES = ("auto", "on", "off")
JACKKNIFE_ROWS = 2048  # rows up to which held-out scores get the jackknife's range (10 dense refits)
# geometry rows up to which ``auto`` scores held out: where the scores get their ranges (above
# it, exact scores would have none, and the held-out best would tie every encoding)
HELD_OUT_AUTO_LIMIT = JACKKNIFE_ROWS
DENSE_MDS_ROWS = 2048  # half A's MDS: every eigenpair (dense) up to here, the widths' top ones (Lanczos) above
JACKKNIFE_SMACOF_ROWS = 128  # ... and SMACOF is refitted on every replicate (O(m^2) per iteration)
JACKKNIFE_MIN_TOKENS = 20  # a half's row this full keeps a token in every replicate (P(empty) <= 0.1^20)


def token_halves(rows: Any, /, *, seed: int = 0) -> tuple[Any, Any]:
    """Every counted token of ``rows`` (m, V) sent to half A or B uniformly at random.

    Returns:
        (A, B): arrays of the same kind as ``rows`` (dense, or CSR sharing its index arrays,
        zeros kept) with ``A + B == rows``, in the rows' integer dtype (a half never holds
        more than the whole).
    """
    rng = np.random.default_rng([int(seed), 0x4E1D])  # its own stream: not the noise floor's split
    if sp.issparse(rows):
        csr = sp.csr_array(rows)
        a, b = _split(csr.data, rng)
        return (sp.csr_array((a, csr.indices, csr.indptr), shape=csr.shape),
                sp.csr_array((b, csr.indices, csr.indptr), shape=csr.shape))
    dense = np.asarray(rows)
    a, b = _split(dense.ravel(), rng)
    return a.reshape(dense.shape), b.reshape(dense.shape)


def _split(values: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """:func:`thin` into two parts, in ``values``' integer dtype (int32 counts stay int32)."""
    parts = thin(values, 2, rng)
    dtype = values.dtype if np.issubdtype(values.dtype, np.integer) else np.int64
    a = parts[0].astype(dtype)
    del parts
    return a, (values - a).astype(dtype, copy=False)


def parts_halves(parts: Sequence[Any], /) -> tuple[Any, Any]:
    """(even parts summed, odd parts summed) of 2 or more (m, V) part rows."""
    if len(parts) < 2:
        msg = f"held-out halves need at least 2 parts, got {len(parts)}"
        raise ValueError(msg)
    return _sum(parts[0::2]), _sum(parts[1::2])


def _sum(rows: Sequence[Any]) -> Any:
    total = rows[0]
    for r in rows[1:]:
        total = total + r
    return total


def _row_sums(rows: Any) -> np.ndarray:
    return np.asarray(rows.sum(axis=1)).ravel()


def held_out_scores(
    a: Any,
    b: Any,
    positions: Any,
    jobs: Sequence[tuple[int, str]],
    /,
    *,
    exact: bool,
    split: str,
    bias_of: Callable[[Any], np.ndarray] | None = None,
    context: int | None = None,
    seed: int = 0,
    stress_halfwidth: float = 1e-3,
    stress_max_pairs: int = 20_000_000,
    lanczos_tol: float = 1e-8,
    progress: Callable[[str], None] | None = None,
    ranges: bool = True,
) -> dict[str, Any]:
    """Every (width, encoding) of ``jobs`` built from half ``a`` and scored on ``a`` and ``b``.

    Args:
        a, b: (m, V) counts of the two halves at the geometry's rows (``a + b`` = the rows).
        positions: (m,) the positions the rows stand for.
        jobs: (width, encoding spec) pairs (:func:`posstats.analysis.encoding_jobs`).
        exact: every pair (dense m x m distances) or sampled pairs with intervals.
        split: how the halves were made (``"tokens"`` or a description of the parts), reported.
        bias_of: when the analysis uses bias-corrected distances, the (m,) bias ``b_i`` of
            a half's rows (its noise floor); None: plug-in distances.
        context: the counts' n (RoPE variants that depend on it).
        progress: called with a short label before each step.
        ranges: the exact path's jackknife ranges for ties (:func:`held_out_intervals`);
            False when no test found structure: no ranges, and ``best`` ties every
            encoding, as the verdict does.

    Returns:
        The report's ``held_out`` section: ``split``, ``positions`` (used, left out),
        ``tokens`` [A, B], ``distances``, ``stress_method``, ``encodings`` (one entry per
        job: ``name``, ``dim``, ``fit_stress``, ``fit_scaled_stress``, ``held_out_stress``,
        ``held_out_scaled_stress`` and its ``_ci95``), and ``best`` (per width, on the
        held-out scaled stress, ties by overlapping intervals).
    """
    step = progress or (lambda _label: None)
    positions = np.asarray(positions)
    total = len(positions)
    keep = np.flatnonzero((_row_sums(a) > 0) & (_row_sums(b) > 0))
    if len(keep) < total:  # else no copy
        a, b, positions = a[keep], b[keep], positions[keep]
    m = len(keep)
    section: dict[str, Any] = {
        "split": split,
        "positions": {"used": int(m), "left_out": int(total - m)},
        "tokens": [int(_row_sums(a).sum()), int(_row_sums(b).sum())],
        "distances": "plugin" if bias_of is None else "bias_corrected",  # each half by its own noise floor
        "stress_method": "exact" if exact else "sampled",
    }
    if m < 3:
        section.update(encodings=[], best=[], skipped=f"only {m} position(s) have tokens in both halves")
        return section
    biases = (None, None)
    if bias_of is not None:
        step("held out: noise floors of the halves")
        biases = (np.nan_to_num(bias_of(a), nan=0.0), np.nan_to_num(bias_of(b), nan=0.0))
    score = _exact_scores if exact else _sampled_scores
    entries = score(a, b, positions, jobs, biases=biases, context=context, seed=seed, step=step,
                    stress_halfwidth=stress_halfwidth, stress_max_pairs=stress_max_pairs, lanczos_tol=lanczos_tol)
    if exact and not ranges:
        for e in entries:
            e["held_out_interval"] = NO_STRUCTURE_INTERVAL
    elif exact:
        step("held out: jackknife ranges")
        held_out_intervals(a, b, positions, jobs, entries, corrected=bias_of is not None, context=context, seed=seed)
    else:  # the pairs' intervals leave out the token noise: a range for ties only
        for e in entries:
            e["held_out_scaled_stress_tie_range"] = e["held_out_scaled_stress_ci95"]
            e["held_out_scaled_stress_ci95"] = [e["held_out_scaled_stress"]] * 2
            e["held_out_interval"] = ("none: above the exact limit the held-out stress is sampled and its pairs' "
                                      "range (held_out_scaled_stress_tie_range) leaves out the token noise; it only "
                                      "decides ties")
    section["encodings"] = entries
    # an exact score without a range cannot be told from another by its point: no winner
    unranged = exact and not any(e.get("held_out_scaled_stress_tie_range") for e in entries)
    section["best"] = best_encodings([held_out_row(e) for e in entries], all_tied=not ranges or unranged)
    return section


def _csr(rows: Any) -> sp.csr_array:
    """Canonical int64 CSR counts (a copy: replicates never touch the caller's arrays)."""
    c = sp.csr_array(rows, dtype=np.int64, copy=True)
    c.sum_duplicates()
    return c


def held_out_intervals(
    a: Any,
    b: Any,
    positions: Any,
    jobs: Sequence[tuple[int, str]],
    entries: list[dict[str, Any]],
    /,
    *,
    corrected: bool,
    context: int | None = None,
    seed: int = 0,
    groups: int = JACKKNIFE_GROUPS,
) -> None:
    """Give each entry of the exact held-out scores (one per job, in order) the jackknife's
    range for ties on its held-out scaled stress (module docstring), in place:
    ``held_out_scaled_stress_tie_range`` and ``held_out_interval`` (how, or why none).

    Args:
        a, b: (m, V) counts of the halves (the rows the entries were scored on).
        positions: (m,) the positions the rows stand for.
        jobs: the (width, spec) of ``entries``, in the same order.
        entries: :func:`held_out_scores`' exact entries.
        corrected: distances bias-corrected by each replicate's own ``b_i``
            (:func:`posstats.estimates.sampling_variance.position_sampling_variance`).
        context: the counts' n.
        seed: seeds the token groups.
        groups: K, the jackknife's groups.
    """
    positions = np.asarray(positions)
    m = positions.size
    thin_rows = min(float(np.min(_row_sums(a))), float(np.min(_row_sums(b)))) < JACKKNIFE_MIN_TOKENS
    if m > JACKKNIFE_ROWS or thin_rows:
        why = (f"none: held-out ranges are computed up to {JACKKNIFE_ROWS:,} rows (10 refits of the m x m MDS)"
               if m > JACKKNIFE_ROWS else
               f"none: a row of one half has fewer than {JACKKNIFE_MIN_TOKENS} tokens (a replicate could empty it)")
        why += "; without ranges the held-out best ties every encoding"
        for e in entries:
            e["held_out_interval"] = why
        return
    refit = [m <= JACKKNIFE_SMACOF_ROWS or not family_of(spec).quadratic for _, spec in jobs]
    fitted = any(family_of(spec).fitted for (_, spec), r in zip(jobs, refit, strict=True) if r)
    ca, cb = _csr(a), _csr(b)
    rng_a, rng_b = np.random.default_rng([seed, 0x4A41]), np.random.default_rng([seed, 0x4A42])
    reps: list[list[float]] = [[] for _ in jobs]
    for group_a, group_b in zip(token_groups(ca.data, groups, rng_a), token_groups(cb.data, groups, rng_b), strict=True):
        ka, kb = without_group(ca, group_a), without_group(cb, group_b)
        bias_a = position_sampling_variance(ka) if corrected else None
        d2a, da = _distances(ka, bias_a)
        _, db = _distances(kb, position_sampling_variance(kb) if corrected else None)
        mds = _half_mds(ka, bias_a, d2a, jobs, seed=seed) if fitted else None
        occupancy = _row_sums(ka)
        for k, ((dim, spec), ok) in enumerate(zip(jobs, refit, strict=True)):
            if ok:
                enc = make_encoding(spec, positions, dim, mds=mds, distances=da, occupancy=occupancy, context=context)
                reps[k].append(stress_report(enc.matrix, db).scaled_stress)
    for e, ok, x in zip(entries, refit, reps, strict=True):
        if not ok:
            e["held_out_interval"] = f"none: SMACOF is not refitted above {JACKKNIFE_SMACOF_ROWS} rows"
            continue
        ci = jackknife_interval(e["held_out_scaled_stress"], x, bounds=(0.0, 1.0))
        if ci is None:
            e["held_out_scaled_stress_tie_range"] = overshoot_tie_range(e["held_out_scaled_stress"], x)
            e["held_out_interval"] = ("none: the jackknife's bias-corrected interval lies below 0 (a score within its "
                                      "noise of 0); held_out_scaled_stress_tie_range only decides ties")
            continue
        e["held_out_scaled_stress_tie_range"] = ci
        e["held_out_interval"] = (f"jackknife range ({groups} random token groups of each half, refitted on half A): "
                                  "decides ties only, not a 95 % interval (it covered 86 % of known truths, a small "
                                  "stress such as ALiBi's 55 %: docs/calibration.md)")


def _half_mds(rows: Any, bias: np.ndarray | None, d2: np.ndarray, jobs: Sequence[tuple[int, str]], *, seed: int) -> Any:
    """The classical MDS of a half's rows (m, V) whose ``d_H^2`` is ``d2`` (m, m; with
    ``bias`` the occupancy shrinkage removed, :func:`_distances`): every eigenpair up to
    :data:`DENSE_MDS_ROWS` rows, above it the top ``max width`` (what the fitted encodings
    of ``jobs`` read): by Lanczos on the square roots for plug-in distances, else from
    ``d2``, which holds what the square roots alone do not."""
    m = d2.shape[0]
    if m <= DENSE_MDS_ROWS:
        return classical_mds(rows, k=None, method="dense", seed=seed, diagonal=bias, squared_distances=d2)
    k = min(max(d for d, _ in jobs), m - 1)
    if bias is not None:
        return classical_mds(rows, k=k, method="dense", seed=seed, diagonal=bias, squared_distances=d2)
    return classical_mds(rows, k=k, method="lanczos", seed=seed, diagonal=bias)


def _distances(rows: Any, bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(squared d_H^2, d_H as the analysis uses it) of the rows: plug-in, or with ``bias``
    the square roots' occupancy shrinkage removed (:mod:`posstats.estimates.occupancy`) and
    then corrected by the bias."""
    d2 = hellinger_sq(rows)
    if bias is None:
        return d2, np.sqrt(d2)
    adjusted(d2, rows)
    return d2, np.sqrt(corrected_squared_distances(d2, bias))


def _exact_scores(a: Any, b: Any, positions: np.ndarray, jobs: Sequence[tuple[int, str]], *,
                  biases: tuple[Any, Any], context: int | None, seed: int, step: Callable[[str], None],
                  **_: Any) -> list[dict[str, Any]]:
    step("held out: distances of both halves")
    d2a, da = _distances(a, biases[0])
    _, db = _distances(b, biases[1])
    step("held out: MDS of half A")
    mds = _half_mds(a, biases[0], d2a, jobs, seed=seed)
    occupancy = _row_sums(a)
    entries = []
    for dim, spec in jobs:
        step(f"held out: {spec} at d={dim}")
        enc = make_encoding(spec, positions, dim, mds=mds, distances=da, occupancy=occupancy, context=context)
        fit, held = stress_report(enc.matrix, da), stress_report(enc.matrix, db)
        entries.append(_entry(enc.name, dim, spec, fit.stress, fit.scaled_stress, held.stress, held.scaled_stress,
                              [held.scaled_stress, held.scaled_stress]))
    return entries


def _sampled_scores(a: Any, b: Any, positions: np.ndarray, jobs: Sequence[tuple[int, str]], *,
                    biases: tuple[Any, Any], context: int | None, seed: int, step: Callable[[str], None], stress_halfwidth: float,
                    stress_max_pairs: int, lanczos_tol: float) -> list[dict[str, Any]]:
    step("held out: MDS of half A (Lanczos)")
    # with the bias correction the square roots' occupancy shrinkage is removed too (:func:`_distances`)
    shrink_a, shrink_b = ((OccupancyShrinkage.of(a), OccupancyShrinkage.of(b)) if biases[0] is not None
                          else (None, None))
    op_a = sqrt_operator(a) if sp.issparse(a) else a
    products = op_a if shrink_a is None else shifted_operator(op_a if op_a is not a else sqrt_operator(a),
                                                              shrink_a.weights(_row_sums(a)), shrink_a.shrinkage)
    k = min(max(d for d, _ in jobs), a.shape[0] - 1)
    mds = classical_mds(products, k=k, method="lanczos", tol=lanczos_tol, seed=seed, diagonal=biases[0])
    del products
    occupancy = _row_sums(a)
    built = []
    for dim, spec in jobs:
        if "distances" in family_of(spec).needs:
            continue  # SMACOF needs the m x m distances (the main table says so too)
        built.append((dim, spec, make_encoding(spec, positions, dim, mds=mds, occupancy=occupancy, context=context)))
    matrices = [enc.matrix for _, _, enc in built]
    step("held out: sampled stress on half A")
    fit = SampledGeometry(a, bias=biases[0], seed=seed, sqrt=op_a if op_a is not a else None,
                          shrinkage=shrink_a).stress(matrices, target_halfwidth=stress_halfwidth, max_pairs=stress_max_pairs)
    del op_a  # half A's square roots: not needed for half B
    step("held out: sampled stress on half B")
    held = SampledGeometry(b, bias=biases[1], seed=seed + 1, shrinkage=shrink_b).stress(
        matrices, target_halfwidth=stress_halfwidth, max_pairs=stress_max_pairs)
    return [_entry(enc.name, dim, spec, f.stress, f.scaled_stress, h.stress, h.scaled_stress, list(h.scaled_stress_ci95))
            for (dim, spec, enc), f, h in zip(built, fit, held, strict=True)]


def _entry(name: str, dim: int, spec: str, fit_stress: float, fit_scaled: float, held_stress: float,
           held_scaled: float, held_ci: list[float]) -> dict[str, Any]:
    fitted = family_of(spec).fitted
    return {
        "name": name,
        "dim": int(dim),
        "fitted": fitted,
        "fit_stress": float(fit_stress),
        "fit_scaled_stress": float(fit_scaled),
        "held_out_stress": float(held_stress),
        "held_out_scaled_stress": float(held_scaled),
        "held_out_scaled_stress_ci95": [float(x) for x in held_ci],
    }
