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
95 % intervals), which costs about what the main geometry did again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from posstats.estimates.noise import corrected_squared_distances
from posstats.estimates.sampled import SampledGeometry
from posstats.estimates.thinning import thin
from posstats.estimates.verdict import best_encodings
from posstats.geometry.encodings import family_of, make_encoding
from posstats.geometry.hellinger import hellinger_sq
from posstats.geometry.mds import classical_mds, sqrt_operator
from posstats.geometry.stress import stress_report

__all__ = ["HELD_OUT_AUTO_LIMIT", "HELD_OUT_CHOICES", "held_out_scores", "parts_halves", "token_halves"]

HELD_OUT_CHOICES = ("auto", "on", "off")
HELD_OUT_AUTO_LIMIT = 4096  # geometry rows up to which ``auto`` scores held out (exact, two m x m matrices)


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
    section["encodings"] = entries
    section["best"] = best_encodings([{"name": e["name"], "dim": e["dim"], "scaled_stress": e["held_out_scaled_stress"],
                                       "scaled_stress_ci95": e["held_out_scaled_stress_ci95"]} for e in entries])
    return section


def _distances(rows: Any, bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(squared plug-in d_H^2, d_H as the analysis uses it) of the rows."""
    d2 = hellinger_sq(rows)
    corrected = d2 if bias is None else corrected_squared_distances(d2, bias)
    return d2, np.sqrt(corrected)


def _exact_scores(a: Any, b: Any, positions: np.ndarray, jobs: Sequence[tuple[int, str]], *,
                  biases: tuple[Any, Any], context: int | None, seed: int, step: Callable[[str], None],
                  **_: Any) -> list[dict[str, Any]]:
    step("held out: distances of both halves")
    d2a, da = _distances(a, biases[0])
    _, db = _distances(b, biases[1])
    step("held out: MDS of half A")
    m = da.shape[0]
    if m <= 2048:
        mds = classical_mds(a, k=None, method="dense", seed=seed, diagonal=biases[0], squared_distances=d2a)
    else:
        k = min(max(d for d, _ in jobs), m - 1)
        mds = classical_mds(a, k=k, method="lanczos", seed=seed, diagonal=biases[0])
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
    op_a = sqrt_operator(a) if sp.issparse(a) else a
    k = min(max(d for d, _ in jobs), a.shape[0] - 1)
    mds = classical_mds(op_a, k=k, method="lanczos", tol=lanczos_tol, seed=seed, diagonal=biases[0])
    occupancy = _row_sums(a)
    built = []
    for dim, spec in jobs:
        if "distances" in family_of(spec).needs:
            continue  # SMACOF needs the m x m distances (the main table says so too)
        built.append((dim, spec, make_encoding(spec, positions, dim, mds=mds, occupancy=occupancy, context=context)))
    matrices = [enc.matrix for _, _, enc in built]
    step("held out: sampled stress on half A")
    fit = SampledGeometry(a, bias=biases[0], seed=seed, sqrt=op_a if op_a is not a else None).stress(
        matrices, target_halfwidth=stress_halfwidth, max_pairs=stress_max_pairs)
    del op_a  # half A's square roots: not needed for half B
    step("held out: sampled stress on half B")
    held = SampledGeometry(b, bias=biases[1], seed=seed + 1).stress(
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
