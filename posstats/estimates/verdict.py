"""The verdict a user needs first: is there positional structure above sampling noise?

Every decision is a test whose family-wise error rate on a stationary corpus (all
positions one distribution) is at most 5 %, split between two tests of that one null:

- **Positions that stand out** (:func:`~posstats.estimates.standout.standout_positions`,
  family-wise 2.5 %): each position's distance to the pooled distribution against what
  sampling alone gives (:mod:`posstats.estimates.standout`). Reported whatever the rank test
  says.
- **Homogeneity** (the report's ``homogeneity`` section, level 2.5 %): the Monte Carlo test
  of :mod:`posstats.estimates.permutation` on ``sum_i N_i d_i``, powerful where many
  positions move a little (a drift), where no single one stands out. Computed with the
  shuffle null (up to 4,096 rows by default); above, the standouts alone decide. Its null
  corpora shuffle tokens across positions (``method: permutation``) or, for a pack- or
  chunk-mode corpus counted with its window groups, rotate groups of windows (``method: rotation``,
  :mod:`posstats.estimates.rotation`), which keeps the dependence inside windows.
- **Non-stationary** (H1 of THEORY.md section 6) and **positions distinguishable**: either
  test rejects. Level <= 2.5 % + 2.5 % = 5 %.
- **Components above noise**: the MDS eigenvalues above the null
  (:func:`posstats.estimates.null_rank.null_rank`), counted only when the corpus is
  non-stationary (a gatekeeping order: under the stationary null every claim needs the
  first test to reject, so the family-wise level stays 5 %).
- **Withheld** (:func:`withheld_reason`): in pack or chunk mode with fewer than 30
  windows, no decision is taken (every one is None) and the verdict says why.
- **Best encodings** (:func:`best_encodings`): per width, the encoding with the lowest scaled
  stress and those whose 95 % interval overlaps its interval (a tie: their difference is
  not larger than the intervals); and the same on held-out counts, when the analysis
  scored them (:mod:`posstats.estimates.held_out`: fitted encodings graded on the half of
  the corpus they were not fitted to). Gatekept like the components: when neither test
  rejects (or the verdict is withheld), every encoding of a width is tied with its best,
  in-sample, held out and in sweeps; a fitted encoding's lower stress then only measures
  its fit to the noise (docs/calibration.md, "Why best encodings are gatekept too").

:func:`verdict` assembles the report's ``verdict`` section from these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from posstats.counting.counts import MIN_WINDOWS, too_few_windows
from posstats.estimates.standout import FAMILY_LEVEL
from posstats.geometry.encodings import FITTED_ENCODINGS

__all__ = [
    "DISTANCE_NOISE_CAVEAT",
    "MIN_WINDOWS",
    "NOISE_WITHHELD",
    "NO_STRUCTURE_INTERVAL",
    "ROTATED_SHARE_CAVEAT",
    "Verdict",
    "WINDOW_HOMOGENEITY_CAVEAT",
    "all_tied",
    "best_encodings",
    "caveats",
    "held_out_row",
    "homogeneity_alone_in_windows",
    "homogeneity_test_name",
    "independent_rank_null_caveat",
    "non_stationarity",
    "thin_mds_components",
    "verdict",
    "withheld_reason",
]

# Exact scaled stresses that agree to this relative tolerance are equal (the same distances
# computed in another order, e.g. RoPE variants that differ only in pairs a width leaves out).
_TIE_RTOL = 1e-9


def _interval(e: dict[str, Any]) -> list[float]:
    """The range within which another encoding counts as tied: the 95 % interval, or where
    noise withheld it the jackknife's range (``scaled_stress_tie_range``), else the estimate."""
    return list(e.get("scaled_stress_tie_range") or e.get("scaled_stress_ci95") or [e["scaled_stress"]] * 2)


def _ci95(e: dict[str, Any]) -> list[float]:
    """The entry's 95 % interval as the report gives it (zero-width where it has none)."""
    return list(e.get("scaled_stress_ci95") or [e["scaled_stress"]] * 2)


def _runner(e: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if e is None else {"name": e["name"], "scaled_stress": e["scaled_stress"], "scaled_stress_ci95": _ci95(e)}


def best_encodings(encodings: list[dict[str, Any]], /, *, all_tied: bool = False) -> list[dict[str, Any]]:
    """Per width: the encoding with the lowest scaled stress and the ones tied with it (their
    95 % scaled-stress intervals overlap, or the jackknife ranges that stand in for
    intervals noise withheld; exact stress without either is a point); how far
    ahead it is: the runner-up (``next``, the best encoding not tied with it) and the best
    fixed encoding (``best_fixed``: not fitted to the counts, unlike MDS and SMACOF), each
    with its scaled stress and interval, or None; ``fixed`` names the best fixed encoding
    (also when it is the best overall) and ``fixed_tied_with`` the fixed ones tied with it.

    ``all_tied``: every encoding of a width is tied with its best (``next`` is None), as the
    verdict has it when no test found positional structure (:func:`verdict`): the stresses
    then differ by how each encoding fits sampling noise, and naming a winner would be a
    claim of structure that the gatekeeping order does not allow."""
    out = []
    for dim in sorted({int(e["dim"]) for e in encodings}):
        entries = sorted((e for e in encodings if int(e["dim"]) == dim), key=lambda e: e["scaled_stress"])
        best = entries[0]
        lo, hi = _interval(best)
        reach = math.inf if all_tied else hi + _TIE_RTOL * max(abs(hi), 1e-300)  # equal up to rounding counts as tied
        tied = {e["name"] for e in entries[1:] if _interval(e)[0] <= reach} - {best["name"]}
        after = next((e for e in entries[1:] if e["name"] not in tied and e["name"] != best["name"]), None)
        fixed_entries = [e for e in entries if e["name"].split(":")[0] not in FITTED_ENCODINGS]
        fixed = fixed_entries[0] if fixed_entries else None
        fixed_tied: set[str] = set()
        if fixed is not None:
            fixed_reach = math.inf if all_tied else _interval(fixed)[1] * (1 + _TIE_RTOL) + _TIE_RTOL * 1e-300
            fixed_tied = {e["name"] for e in fixed_entries[1:] if _interval(e)[0] <= fixed_reach} - {fixed["name"]}
        out.append({"dim": dim, "best": best["name"], "scaled_stress": best["scaled_stress"], "scaled_stress_ci95": _ci95(best),
                    "tied_with": sorted(tied), "next": _runner(after),
                    "best_fixed": None if fixed is best else _runner(fixed),
                    "fixed": None if fixed is None else fixed["name"], "fixed_tied_with": sorted(fixed_tied)})
    return out


def held_out_row(e: dict[str, Any], /) -> dict[str, Any]:
    """A held-out entry (``held_out.encodings``) as :func:`best_encodings` reads one: its
    held-out scaled stress, interval and range for ties."""
    return {"name": e["name"], "dim": e["dim"], "scaled_stress": e["held_out_scaled_stress"],
            "scaled_stress_ci95": e["held_out_scaled_stress_ci95"],
            "scaled_stress_tie_range": e.get("held_out_scaled_stress_tie_range")}


def all_tied(verdict_doc: dict[str, Any], /) -> bool:
    """Whether a verdict (``report.json``'s ``verdict``) ties every encoding: no test found
    structure, or the verdict is withheld (:func:`best_encodings`' ``all_tied``)."""
    return bool(verdict_doc.get("withheld")) or verdict_doc.get("non_stationary") is False


NO_STRUCTURE_INTERVAL = ("none: no test found positional structure (verdict.non_stationary is false, or the verdict "
                         "is withheld), so the verdict ties every encoding; against positions of one distribution a "
                         "stress has no true value to cover")


def best_sweep_values(sweep: dict[str, Any], encodings: list[dict[str, Any]], /, *,
                      all_tied: bool = False) -> list[dict[str, Any]]:
    """Per width, the swept value whose member has the lowest scaled stress, and the values
    tied with it (overlapping 95 % intervals; every value with ``all_tied``, as in
    :func:`best_encodings`), among the members of one sweep
    (:func:`posstats.geometry.encodings.encoding_sweeps`)."""
    value_of = {name: (v, tuple(sorted(o.items()))) for name, v, o in zip(sweep["members"], sweep["values"], sweep["others"], strict=True)}
    members = [e for e in encodings if e["name"] in value_of]
    out = []
    for row in best_encodings(members, all_tied=all_tied):
        value, others = value_of[row["best"]]
        tied = [value_of[name][0] for name in row["tied_with"]]
        out.append({"dim": row["dim"], "best": value, "others": dict(others), "scaled_stress": row["scaled_stress"],
                    "scaled_stress_ci95": row["scaled_stress_ci95"], "tied_with": sorted(tied, key=_value_order)})
    return out


def _value_order(value: Any) -> tuple[int, Any]:
    """Numbers first, in numeric order, then anything else by its text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, str(value))


def non_stationarity(homogeneity: dict[str, Any] | None, standout: dict[str, Any] | None, /) -> tuple[bool | None, str]:
    """``(non-stationary, which test said so)``: True when the homogeneity test or the
    standout test rejects (module docstring); None when neither was computed."""
    standouts = None if standout is None else int(standout.get("count") or 0) > 0
    homogeneous = None if not homogeneity else bool(homogeneity.get("rejected"))
    if standouts is None and homogeneous is None:
        return None, "not tested"
    tests = []
    if homogeneity:
        tests.append(f"{homogeneity_test_name(homogeneity)} (level {100 * float(homogeneity['level']):.1f} %)")
    if standouts is not None:
        tests.append(f"standout positions (family-wise {100 * FAMILY_LEVEL:.1f} %)")
    return bool(standouts or homogeneous), "either rejects: " + " or ".join(tests)


def homogeneity_test_name(homogeneity: dict[str, Any], /) -> str:
    """``"permutation test of homogeneity"`` or, with the null that rotates windows,
    ``"rotation test of homogeneity (windows kept whole)"``."""
    if homogeneity.get("method") == "rotation":
        return "rotation test of homogeneity (windows kept whole)"
    return "permutation test of homogeneity"


WINDOW_HOMOGENEITY_CAVEAT = (
    "non-stationarity rests on the permutation test of homogeneity alone (no position stands out), and that test "
    "treats the tokens of one window (in truncate mode a document's first n tokens) as independent: on real text "
    "packed into windows, where every position has the same distribution, it rejected 8 % of null corpora at its "
    "2.5 % level (docs/calibration.md); read a gradual structure found without window groups as tentative")


HALVES_FALLING_RATIO = 2.0  # occupancy falling at least this many times: the halves' edge caveat of documents that differ


def independent_rank_null_caveat(null: dict[str, Any], components: int | None, /, mode: str | None = None
                                 ) -> str | None:
    """The caveat for a count of components above noise whose null treats the tokens of one
    window as independent, or None: the analytic edge (``null.method`` ``mp``, above 4,096
    rows, unless its edge was measured on independent halves: ``null.edge.method``
    ``halves``, :mod:`posstats.estimates.halves_edge`) and shuffled null corpora (``null.null_corpora`` ``shuffled``: no window groups).
    Tokens that repeat within a window correlate nearby rows' noise and lift the noise
    eigenvalues (``benchmarks/bench_mp_edge.py``): streams repeating the previous token half
    of the time lifted the bulk's top 3-63 % above the edge independent tokens give (to
    0.98-1.24 times the analytic edge with 20,000 windows at n = 8,192 and 2,048), 80 % of
    the time to 1.9 times it at n = 8,192; against shuffled corpora the rank test counted a
    component in 20 of 20 such streams. Real prose does not: Shakespeare (GPT-2) and the
    fortunes (BERT) packed at n = 64-1,024 had the bulk of the same tokens shuffled, to
    within 1.5 %. Only where components are claimed: the gate (a test of H0 must reject
    first) keeps the verdict's level, and the standout test compares each row with the pool.

    The edge measured on halves keeps a window's tokens together and gets no such caveat,
    except in ``truncate`` and ``chunk`` mode (``mode``; None, a report that does not say,
    counts as such) where occupancy falls at least :data:`HALVES_FALLING_RATIO`-fold
    (``null.weights_ratio``): there, where documents differ from each other as real ones
    do, it counted a component in most null corpora of resampled fortunes from 128 rows and
    in every one at 8,192 positions (docs/calibration.md, "Documents that differ")."""
    if not components:
        return None
    if null.get("method") == "mp":
        if (null.get("edge") or {}).get("method") == "halves":
            ratio = float(null.get("weights_ratio") or 1.0)
            if mode == "pack" or ratio < HALVES_FALLING_RATIO:
                return None  # measured on halves that keep a window's (a document's) tokens together
            return (f"the {int(components)} component(s) above noise were counted against the noise measured on "
                    "independent halves, an edge calibrated on documents of one kind: where documents differ from each "
                    f"other and most are shorter than the context (occupancy here falls {ratio:,.0f}-fold), it counted a "
                    "component in most null corpora of resampled fortunes from 128 positions and in every one at 8,192 "
                    "(docs/calibration.md, \"Documents that differ\"); read the count as an upper estimate (which "
                    "positions stand out is not affected)")
        against = "the analytic noise edge, which treats"
    elif null.get("null_corpora") == "shuffled":
        against = "shuffled null corpora (the counts have no window groups), which treat"
    else:
        return None
    return (f"the {int(components)} component(s) above noise were counted against {against} the tokens of one window "
            "(a document's first n in truncate mode) as independent; where tokens repeat strongly within a window (runs of "
            "one token) the noise eigenvalues rise past such a null (a stream repeating the "
            "previous token 80 % of the time lifted them to 1.9 times the analytic edge at n = 8,192), though on real prose "
            "packed into windows they matched the same tokens shuffled to within 1.5 % (docs/calibration.md); with such "
            "text read the count as an upper estimate (which positions stand out is not affected)")


def homogeneity_alone_in_windows(report: dict[str, Any], standout: dict[str, Any] | None, /) -> bool:
    """Whether the homogeneity test alone made the corpus non-stationary with the permutation
    null (it rejected, and the :func:`standout_positions` result names no position). Tokens
    of one window (a document's first n in truncate mode) are dependent in real text; the
    permutation null treats them as independent, which widens the statistic's spread
    (measured on real packed text: ``benchmarks/bench_pack_homogeneity.py``; on truncated
    documents: ``tests/test_rotation.py``). The rotation null
    (:mod:`posstats.estimates.rotation`) keeps windows whole, so its rejection needs no caveat."""
    homogeneity = report.get("homogeneity") or {}
    if homogeneity.get("method") == "rotation":
        return False
    return bool(homogeneity.get("rejected")) and not int((standout or {}).get("count") or 0)


def withheld_reason(report: dict[str, Any], /) -> str | None:
    """Why the report's decisions would not be honest, or None: in ``pack`` or ``chunk``
    mode every position gets one token per window, and the tokens of one window are
    consecutive text (dependent); with fewer than :data:`MIN_WINDOWS` windows the few
    stretches of text that fill each position decide everything."""
    corpus = report.get("corpus") or {}
    return too_few_windows(corpus.get("mode"), int(corpus.get("windows") or 0))


DISTANCE_NOISE_CAVEAT = 0.10  # noise share of the summed distances above which stresses get a caveat
ROTATED_SHARE_CAVEAT = 0.5  # share of the tokens a rotation moves below which the rotation null gets a caveat
# How an encoding's ``stress_interval`` starts where the noise share withheld its interval
# (the analysis' rule: posstats.analysis.JACKKNIFE_NOISE_LIMIT up to 2,048 rows, else
# DISTANCE_NOISE_CAVEAT)
NOISE_WITHHELD = "none: sampling noise alone gives"


def caveats(report: dict[str, Any], /) -> list[str]:
    """Assumptions of the decisions that the report's own data cannot check, and estimates
    the data shows to be noise-dominated: when sampling noise alone reaches at least
    ``DISTANCE_NOISE_CAVEAT`` of the summed distances (``null.distance_noise.share``), the
    stresses lean toward that noise and the analysis gives them no interval
    (docs/calibration.md: jackknife intervals covered 72-90 % of drift corpora at a share of
    0.14, 28-58 % of planted ones at 0.3-0.5). Below that share, where the analysis still
    withheld the intervals for noise (the jackknife over all pairs from 5 %: it covered
    87.5 % of drifts at 7 %), a milder caveat says so. When the rotation null moves less
    than :data:`ROTATED_SHARE_CAVEAT` of the tokens (``homogeneity.rotated_share``: most
    sit in windows shorter than n) its tests' loss of power is said; when the rotated corpora's
    top eigenvalue exceeds the corpus' own after a rejection, that no eigenvalue shows that structure
    (:func:`_unseen_structure_caveat`)."""
    out = []
    share = ((report.get("null") or {}).get("distance_noise") or {}).get("share")
    entries = report.get("encodings") or []
    if share is not None and share >= DISTANCE_NOISE_CAVEAT:
        out.append(f"sampling noise alone gives {min(share, 1.0):.0%} of the summed distances (a stationary corpus of "
                   "these occupancies, null.distance_noise): every stress is computed from distances of which that "
                   "share is noise, so stresses are biased toward it and no stress interval is given (one would cover far "
                   "less than 95 %); compare encodings only where their stresses differ widely")
    elif share is not None and any(str(e.get("stress_interval") or "").startswith(NOISE_WITHHELD) for e in entries):
        out.append(f"no stress interval is given: with {min(share, 1.0):.1%} of the summed distances from sampling noise "
                   "(null.distance_noise) the jackknife's 95 % intervals cover too rarely (87.5 % of known drifts at "
                   "7 %, docs/calibration.md); encodings within the jackknife's range of each other are called tied")
    if no_stress_ranges(entries):
        reasons = [str(e.get("stress_interval") or "") for e in entries]
        reason = next((r for r in reasons if r.startswith("none:") and "fitted encoding" not in r), reasons[0])
        out.append(f"no stress has an interval or a range for ties: {reason.removeprefix('none: ')}; so no encoding "
                   "is named better than another (in-sample, a fitted encoding's lead would be its fit to the "
                   "sampling noise)")
    homogeneity = report.get("homogeneity") or {}
    rotated = homogeneity.get("rotated_share")
    if homogeneity.get("method") == "rotation" and rotated is not None and rotated < ROTATED_SHARE_CAVEAT:
        out.append(f"the rotation null moves only {rotated:.0%} of the tokens (windows that fill all positions; "
                   "documents or windows shorter than that stay in place, homogeneity.rotated_share), so the "
                   "homogeneity and rank tests see less of the structure: a weak planted effect was found in 7 of 40 "
                   "corpora with a fifth of the tokens moved, in 14 of 40 with all (docs/calibration.md)")
    null = report.get("null") or {}
    if structure_unseen_by_rotation(report):
        out.append(_unseen_structure_caveat(null, _tested_top(report), (report.get("corpus") or {}).get("mode"),
                                            remedy=rank_remedy(report)))
    thin = thin_mds_components(report)
    if thin:
        out.append(_thin_mds_caveat(null, thin))
    if report.get("buckets") and (report.get("noise") or {}).get("source") == "token split":
        out.append("bucketed rows pool consecutive tokens of one document or window, which are not independent; the "
                   "noise floor and the tests treat them as independent, so structure at the scale of a document may "
                   "read as positional")
    return out


# The top component loads on thin positions when the occupancy under its loadings is at
# most this share of the median occupancy of the used positions
THIN_COMPONENT_SHARE = 0.5
# An MDS component counted above noise is read as thin positions' noise when it loads on
# positions of at most this share of the occupancy under the tested (weighted) top component
TESTED_COMPONENT_SHARE = 0.1


def thin_mds_components(report: dict[str, Any], /) -> list[int]:
    """The 0-based MDS components, among as many as the verdict counts above noise, that load
    on thinly occupied positions (``null.mds_component_occupancy``, the occupancy median
    under each one's squared loadings, at most :data:`THIN_COMPONENT_SHARE` of
    ``null.median_occupancy`` or :data:`TESTED_COMPONENT_SHARE` of where the tested, weighted,
    top component loads, ``null.top_component_occupancy``). The count comes from the occupancy-weighted rank test; the
    MDS is unweighted, and where occupancy falls steeply its leading eigenvalues can be the
    sampling noise of positions with a few tokens: the 202 M-token planted benchmark at
    n = 131,072 (1 to 183,952 tokens a position) counts 2 components from weighted
    eigenvalues 331 and 27 loading on position 0, while its MDS's top two load on
    positions of 5 and 6 tokens (docs/calibration.md)."""
    null = report.get("null") or {}
    loaded, median = null.get("mds_component_occupancy"), null.get("median_occupancy")
    above = (report.get("verdict") or {}).get("components_above_noise")
    if above is None:
        above = null.get("components_above_null") or 0
    if not loaded or median is None:
        return []
    tested = null.get("top_component_occupancy")
    limit = max(THIN_COMPONENT_SHARE * float(median), TESTED_COMPONENT_SHARE * float(tested or 0.0))
    return [j for j, x in enumerate(loaded[: int(above)]) if float(x) <= limit]


def _thin_mds_caveat(null: dict[str, Any], thin: list[int]) -> str:
    """The caveat for leading MDS components on thin positions (:func:`thin_mds_components`)."""
    loaded = [float(null["mds_component_occupancy"][j]) for j in thin]
    which = ", ".join(str(j + 1) for j in thin)
    about = f"{min(loaded):,.0f}" if min(loaded) == max(loaded) else f"{min(loaded):,.0f}-{max(loaded):,.0f}"
    head = (f"MDS component(s) {which} load on positions of about {about} counted tokens "
            f"(median under their loadings; {float(null['median_occupancy']):,.0f} over all used positions), whose "
            "distances carry the most sampling noise: they fit those positions rather than the structure the "
            "occupancy-weighted rank test counted, so P_MDS carries their noise")
    held = int(null.get("weighted_mds_components") or 0)
    if held and held >= int(null.get("components_above_null") or 0):
        return (f"{head}; `posstats export` writes the occupancy-weighted MDS components the test counted instead "
                "(null.weighted_mds_components), and --min-occupancy K leaves thinly occupied positions out "
                "(docs/calibration.md)")
    return (f"{head}, and so does an export at the informative rank; --min-occupancy K leaves thinly occupied "
            "positions out (docs/calibration.md)")


# Geometry rows from which the caveat of a conservative rank count names the edge measured on
# document halves: the fewest rows where its rank test was calibrated on the harshest null
# measured (short, strongly dependent truncate documents: 0 of 200 corpora at 64 rows with
# the margin posstats.estimates.halves_edge.halves_margin gives there, 20 %; with a fixed
# 10 % it rejected 14.5 %; docs/calibration.md, benchmarks/bench_document_halves.py).
HALVES_REMEDY_ROWS = 64
HALVES_REMEDY = "`posstats analyze --null mp --reread`"  # the remedy's command, as the caveat words it


def _tested_top(report: dict[str, Any], /) -> float | None:
    """The largest eigenvalue the rank test compared with its threshold (the
    occupancy-weighted one where occupancies differ), or None."""
    null = report.get("null") or {}
    top = (null.get("tested_eigenvalues") or (report.get("spectrum") or {}).get("eigenvalues") or [None])[0]
    return None if top is None else float(top)


def structure_unseen_by_rotation(report: dict[str, Any], /) -> bool:
    """Whether the homogeneity test rejected against rotated corpora whose largest top
    eigenvalue (``null.threshold``) exceeds the corpus' own: structure that no eigenvalue
    shows (:func:`_unseen_structure_caveat` says why)."""
    null, homogeneity, top = report.get("null") or {}, report.get("homogeneity") or {}, _tested_top(report)
    return bool(null.get("null_corpora") == "rotated" and homogeneity.get("rejected") and top is not None
                and null.get("threshold") is not None and float(null["threshold"]) > top)


def _thin_top_component(null: dict[str, Any], /) -> bool:
    """Whether the corpus' top component loads on thinly occupied positions (median
    occupancy under its loadings at most :data:`THIN_COMPONENT_SHARE` of the overall median)."""
    loaded, median = null.get("top_component_occupancy"), null.get("median_occupancy")
    return loaded is not None and median is not None and float(loaded) <= THIN_COMPONENT_SHARE * float(median)


def rank_remedy(report: dict[str, Any], /) -> str | None:
    """:data:`HALVES_REMEDY` where the count of components above noise is conservative and
    the edge measured on document halves is calibrated to count them instead, else None.

    That is: structure the rotated corpora do not show (:func:`structure_unseen_by_rotation`),
    not on thinly occupied positions, with the verdict not withheld, in ``truncate`` or
    ``chunk`` mode (a report that does not say its mode counts as such), with at least
    :data:`HALVES_REMEDY_ROWS` geometry rows (``positions.used``). The verdict's
    ``rank_remedy``; its caveat words the same command.
    """
    if (not structure_unseen_by_rotation(report) or _thin_top_component(report.get("null") or {})
            or withheld_reason(report)):
        return None
    rows = (report.get("positions") or {}).get("used")
    if (report.get("corpus") or {}).get("mode") == "pack" or rows is None or int(rows) < HALVES_REMEDY_ROWS:
        return None
    return HALVES_REMEDY


def verdict_rank_remedy(report: dict[str, Any], /) -> str | None:
    """The verdict's ``rank_remedy``; for a report written before the verdict had one, the
    same rule (:func:`rank_remedy`) applied to the report's own sections."""
    v = report.get("verdict") or {}
    return v["rank_remedy"] if "rank_remedy" in v else rank_remedy(report)


def _unseen_structure_caveat(null: dict[str, Any], top: float, mode: str | None = None, *,
                             remedy: str | None = None) -> str:
    """The caveat for structure the homogeneity test found that no eigenvalue shows: the
    rotated corpora's largest top eigenvalue exceeds the corpus' own. Two causes, told
    apart by where the corpus' top component loads (``null.top_component_occupancy``
    against ``null.median_occupancy``), both measured on the bundled fortunes at n = 512
    (docs/calibration.md):

    - on thinly occupied positions (at most :data:`THIN_COMPONENT_SHARE` of the median):
      there a few documents fill a run of positions, whose sampling noise, shared along
      that run, outweighs the structure; any rotation reproduces that noise (one offset a
      length class or one a document alike), so ``--min-occupancy`` is the remedy;
    - elsewhere: the rotations moved the structure rather than removed it, and the count of
      components above noise is conservative. In ``truncate`` and ``chunk`` mode (``mode``,
      the corpus' counting mode; None for a report that does not say) a turned document's
      opening lands on another of its positions, and with most documents shorter than the
      context the openings pile up where they reach. Where :func:`rank_remedy` gives one
      (``remedy``: from :data:`HALVES_REMEDY_ROWS` geometry rows) the caveat names the
      remedy there: the ``mp`` null against the edge measured on two halves of the
      documents (``--reread`` or ``--parts``), whose difference cancels the openings and
      keeps each document's dependence (on the fortunes at n = 512: 3 components where the
      rotated corpora allowed none). Below, that edge's calibration was not measured, so no
      remedy is named. The caveat adds that the edge is calibrated on documents of one kind:
      on corpora with no positional structure whose documents differ as the fortunes do
      (:func:`posstats.testing.resampled_documents`) it counted a component in most corpora
      from 128 rows (``benchmarks/bench_document_heterogeneity.py``). In ``pack`` mode no window starts a
      document, so the caveat says what holds there: each rotated corpus keeps a share of
      a change tied to the window grid, turned to other offsets, and a change spread thinly
      over many positions raises the homogeneity statistic (a sum over every position)
      before it lifts any one eigenvalue.
    """
    weighted = " occupancy-weighted" if null.get("weighting") == "occupancy" else ""
    head = (f"the homogeneity test found structure, but the corpus' largest{weighted} eigenvalue ({top:.4g}) is within "
            f"what the rotated null corpora reach ({float(null['threshold']):.4g})")
    if _thin_top_component(null):
        loaded, median = null["top_component_occupancy"], null["median_occupancy"]
        return (f"{head}: its top component loads on positions of about {float(loaded):,.0f} counted tokens (median "
                f"under its loadings; {float(median):,.0f} over all used positions), where the few documents that "
                "reach a position share its sampling noise along the positions they fill, which outweighs the structure "
                "in this geometry; --min-occupancy K leaves thinly occupied positions out (docs/calibration.md)")
    if mode == "pack":
        return (f"{head}: rotations move that structure rather than remove it (each rotated corpus keeps a share of a "
                "change tied to the window grid, turned to other offsets), and a change spread thinly over many "
                "positions raises the homogeneity statistic, a sum over every position, before it lifts any one "
                "eigenvalue; so the count of components above noise is conservative here (docs/calibration.md)")
    moved = (f"{head}: rotations move that structure rather than remove it (a turned document's opening lands on "
             "another of its positions, and where most documents are shorter than the context the openings pile up "
             "where they reach), so the count of components above noise is conservative here")
    if remedy is None:
        return f"{moved} (docs/calibration.md)"
    return (f"{moved}; {remedy} (or two halves of the documents as --parts) counts them "
            "against the noise edge measured on halves of the documents instead, whose difference cancels the "
            "openings and keeps each document whole, but that edge is calibrated on documents of one kind: where "
            "documents differ in kind, as real ones do, it can count one component too many "
            "(docs/calibration.md, \"Documents that differ\")")


# More standout positions than this share of the used ones: the distributions change across
# the context rather than at a few positions ("widespread" structure).
WIDESPREAD_SHARE = 0.25


def structure_kind(non_stationary: bool | None, standout: dict[str, Any] | None, used: int, /, *,
                   withheld: str | None = None) -> str:
    """What kind of positional structure the verdict found, the one its first sentence words:
    ``withheld``; ``untested`` (no null); ``none`` (homogeneity not rejected); ``widespread``
    (more than :data:`WIDESPREAD_SHARE` of the used positions stand out); ``positions`` (a
    few stand out); ``gradual`` (homogeneity rejected, no single position stands out)."""
    if withheld:
        return "withheld"
    if non_stationary is None:
        return "untested"
    if non_stationary is False:
        return "none"
    count = int((standout or {}).get("count") or 0)
    if count and used and count > WIDESPREAD_SHARE * used:
        return "widespread"
    return "positions" if count else "gradual"


def no_stress_ranges(encodings: list[dict[str, Any]], /) -> bool:
    """Whether no scored encoding has a stress interval of positive width or a range for
    ties (``scaled_stress_tie_range``), and at least one says why (``stress_interval``
    starting ``none:``): the rows were too thin for the jackknife. Comparing such points
    would name the fitted encodings on their fit to the noise. False where the intervals
    were left out because no test found structure (:data:`NO_STRUCTURE_INTERVAL`: the
    verdict ties every encoding for that reason already)."""
    def ranged(e: dict[str, Any]) -> bool:
        lo, hi = e.get("scaled_stress_ci95") or (0.0, 0.0)
        return bool(e.get("scaled_stress_tie_range")) or hi > lo
    why = [str(e.get("stress_interval") or "") for e in encodings]
    return (bool(encodings) and not any(ranged(e) for e in encodings) and NO_STRUCTURE_INTERVAL not in why
            and any(w.startswith("none:") for w in why))


def fitted_better(best: list[dict[str, Any]], /, *, non_stationary: bool | None, above: int | None) -> list[int]:
    """The widths at which the corpus' own (fitted) encoding beats every fixed one beyond
    noise (the best is fitted and the best fixed one is not tied with it); empty unless
    there is structure (non-stationary, components above noise) to fit."""
    if not non_stationary or not above:
        return []
    return [int(b["dim"]) for b in best
            if b["best"].split(":")[0] in FITTED_ENCODINGS and b.get("fixed") not in b["tied_with"]]


@dataclass(frozen=True)
class Verdict:
    """The report's decisions, typed; ``report.json``'s ``verdict`` is :meth:`to_dict`.

    Attributes:
        withheld: why no decision is made (too few windows), else None.
        caveats: what the decisions assume that the data cannot check, one sentence each.
        non_stationary: the positions' distributions differ (either test rejects); None
            when withheld. ``positions_distinguishable`` is the same answer.
        non_stationary_test: the test that decided, in words.
        components_above_noise: MDS components above the null (0 unless non-stationary);
            None without a null or when withheld.
        null_method, noise_floor, distances: how (the null, a noise floor estimated, the
            distances: ``bias_corrected`` or ``plugin``).
        standout_positions: :func:`standout_positions`' entry, or None.
        structure: ``none``, ``positions`` or ``widespread`` (:func:`structure_kind`).
        best_encodings: per width, the best encoding and the ones tied with it
            (:func:`best_encodings`; all of them when no test found structure).
        fitted_better_at: widths where an encoding fitted to the counts beats every fixed one.
        sweeps: per swept encoding parameter, the best value per width.
        held_out_best: the held-out scores' best per width, or None.
        rank_remedy: the command that counts components where ``components_above_noise``
            is conservative (rotated corpora moved the structure; :func:`rank_remedy`),
            else None.
    """

    withheld: str | None
    caveats: tuple[str, ...]
    non_stationary: bool | None
    non_stationary_test: str
    components_above_noise: int | None
    null_method: str | None
    noise_floor: bool
    distances: str
    standout_positions: dict[str, Any] | None
    structure: str
    best_encodings: tuple[dict[str, Any], ...]
    fitted_better_at: tuple[int, ...]
    sweeps: tuple[dict[str, Any], ...]
    held_out_best: Any = None
    rank_remedy: str | None = None

    @property
    def positions_distinguishable(self) -> bool | None:
        """Whether positions carry distinguishable distributions: the non-stationarity answer."""
        return self.non_stationary

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (``report.json``'s ``verdict``), keys in the report's order."""
        return {
            "withheld": self.withheld,
            "caveats": list(self.caveats),
            "non_stationary": self.non_stationary,
            "non_stationary_test": self.non_stationary_test,
            "positions_distinguishable": self.positions_distinguishable,
            "components_above_noise": self.components_above_noise,
            "null_method": self.null_method,
            "noise_floor": self.noise_floor,
            "distances": self.distances,
            "standout_positions": self.standout_positions,
            "structure": self.structure,
            "best_encodings": list(self.best_encodings),
            "fitted_better_at": list(self.fitted_better_at),
            "sweeps": list(self.sweeps),
            "held_out_best": self.held_out_best,
            "rank_remedy": self.rank_remedy,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any], /) -> Verdict:
        """A verdict read back from ``report.json`` (keys a report of this version writes)."""
        return cls(doc.get("withheld"), tuple(doc.get("caveats") or ()), doc.get("non_stationary"),
                   str(doc.get("non_stationary_test") or ""), doc.get("components_above_noise"), doc.get("null_method"),
                   bool(doc.get("noise_floor")), str(doc.get("distances") or "plugin"), doc.get("standout_positions"),
                   str(doc.get("structure") or ""), tuple(doc.get("best_encodings") or ()),
                   tuple(doc.get("fitted_better_at") or ()), tuple(doc.get("sweeps") or ()), doc.get("held_out_best"),
                   doc.get("rank_remedy"))


def verdict(report: dict[str, Any], standout: dict[str, Any] | None, /) -> Verdict:
    """The report's decisions from its ``null``, ``homogeneity``, ``noise``, ``geometry``,
    ``corpus`` and ``encodings`` entries and the :func:`standout_positions` result
    (decisions withheld, None, when :func:`withheld_reason` says so)."""
    null = report.get("null") or {}
    noise = report.get("noise") or {}
    withheld = withheld_reason(report)
    if withheld:
        standout = None
    non_stationary, test = non_stationarity(report.get("homogeneity"), standout)
    above = null.get("components_above_null")
    if withheld:
        non_stationary, test, above = None, f"withheld: {withheld}", None
    if above is not None and non_stationary is False:
        above = 0  # gatekeeping: components are claimed only once homogeneity is rejected
    corrected = (report.get("geometry") or {}).get("distances") == "bias_corrected"
    held_out = report.get("held_out") or {}
    # gatekeeping again: no encoding is named best over another unless a test found structure
    no_structure = all_tied({"withheld": withheld, "non_stationary": non_stationary})
    # and none on points alone: where no stress has an interval or a range for ties (rows
    # too thin for the jackknife), a fitted encoding's lead is its fit to the noise
    tie_all = no_structure or no_stress_ranges(report.get("encodings") or [])
    best = best_encodings(report.get("encodings") or [], all_tied=tie_all)
    held_out_best = held_out.get("best")
    if held_out_best and no_structure:
        held_out_best = best_encodings([held_out_row(e) for e in held_out.get("encodings") or []], all_tied=True)
    used = int((report.get("positions") or {}).get("used") or 0)
    window_caveat = (WINDOW_HOMOGENEITY_CAVEAT,) if not withheld and homogeneity_alone_in_windows(report, standout) else ()
    dependence = independent_rank_null_caveat(null, above, (report.get("corpus") or {}).get("mode"))
    return Verdict(
        withheld=withheld,
        caveats=tuple(caveats(report)) + window_caveat + ((dependence,) if dependence else ()),
        non_stationary=non_stationary,
        non_stationary_test=test,
        components_above_noise=above,
        null_method=null.get("method"),
        noise_floor=bool(noise.get("estimated")),
        distances="bias_corrected" if corrected else "plugin",
        standout_positions=standout,
        structure=structure_kind(non_stationary, standout, used, withheld=withheld),
        best_encodings=tuple(best),
        fitted_better_at=tuple(fitted_better(best, non_stationary=non_stationary, above=above)),
        sweeps=tuple(
            {"spec": sw["spec"], "parameter": sw["parameter"],
             "best": best_sweep_values(sw, report.get("encodings") or [], all_tied=tie_all)}
            for sw in (report.get("config") or {}).get("sweeps") or []
        ),
        held_out_best=held_out_best,
        rank_remedy=rank_remedy(report),
    )
