"""The human-readable summary of a ``report.json`` (terminal table and Markdown)."""

from __future__ import annotations

from typing import Any

from posstats.estimates.verdict import (
    WINDOW_HOMOGENEITY_CAVEAT,
    all_tied,
    fitted_better,
    homogeneity_test_name,
    structure_kind,
    thin_mds_components,
    verdict_rank_remedy,
)
from posstats.reports.spectrum_view import (
    threshold_phrase,
    weighting_phrase,
    weights_ratio,
)

__all__ = ["GLOSSARY", "answer_sentences", "format_markdown", "format_summary", "glossary_lines", "variance_of",
           "verdict_items", "verdict_lines"]


def _fmt(x: Any, spec: str = ".4g") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


def _noise_clause(report: dict[str, Any]) -> str:
    """How the distances were made, in words."""
    noise = report.get("noise") or {}
    if (report.get("geometry") or {}).get("distances") == "bias_corrected":
        shd = (noise.get("split_half_d_h") or {}).get("median")
        shrunk = ("; each position's square-root shrinkage at its occupancy removed"
                  if (report.get("hellinger") or {}).get("occupancy_adjusted") else "")
        return (f"bias-corrected (noise floor from the {noise.get('source', 'parts')}, "
                f"median split-half d_H {_fmt(shd, '.3g')}{shrunk})")
    if noise.get("estimated"):
        return "plug-in: they include sampling noise (noise floor estimated, not subtracted)"
    rule = noise.get("rule")
    if isinstance(rule, dict):
        return (f"plug-in; noise floor off by rule (expected plug-in bias "
                f"{_fmt(rule.get('expected_bias_d_h2'), '.2g')} <= {_fmt(rule.get('threshold'), '.2g')})")
    return "plug-in: they include sampling noise (noise floor off)"


def _p_value(section: dict[str, Any]) -> str:
    """A Monte Carlo p-value as the bound it is: ``p <= 0.025`` at its floor 1 / (R + 1),
    naming the null corpora (rotated with the rotation null, else shuffled), else ``p = 0.05``."""
    p, reps = section.get("p_value"), section.get("replicates")
    if p is None:
        return "p unknown"
    if reps and p <= 1.0 / (int(reps) + 1) + 1e-12:
        corpora = "rotated" if section.get("method") == "rotation" else "shuffled"
        return f"p <= {p:.2g} (no {corpora} corpus of {int(reps)} reached it)"
    return f"p = {p:.2g}"


def _weighting_clause(null: dict[str, Any]) -> str:
    """How the rank test's eigenvalues were weighted, for the verdict line: nothing without
    the occupancy weighting; where the occupancies are equal to
    :data:`~posstats.estimates.null_rank.EQUAL_WEIGHTS` (pack mode: only the last window
    is short) that they are, and where the weighted eigenvalues were bounded from the
    unweighted MDS (``null.tested_bound``) that too; else that thin positions' noise is
    down-weighted (the case the weighting is for): :func:`~posstats.reports.spectrum_view.weighting_phrase`."""
    if null.get("weighting") != "occupancy":
        return ""
    bound = (null.get("tested_bound") or {}).get("weights_ratio")
    if isinstance(bound, (int, float)):  # not solved: the unweighted MDS bounds them (Ostrowski)
        return (f"; eigenvalues weighted by occupancy, weights within {bound - 1.0:.2%}, so bounded by the "
                "unweighted MDS's, all below it")
    return f"; eigenvalues weighted by occupancy, {weighting_phrase(weights_ratio({'null': null}))}"


def _dims(dims: list[int]) -> str:
    return "d = " + ", ".join(str(d) for d in dims)


def _structure_sentence(report: dict[str, Any], v: dict[str, Any]) -> str:
    """What is distinguishable and how many dimensions of structure stand above noise (the
    verdict's ``structure``, in words; a report written before it had one gets it from the
    same verdict rule)."""
    used = int((report.get("positions") or {}).get("used") or 0)
    kind = v.get("structure") or structure_kind(v.get("non_stationary"), v.get("standout_positions"), used,
                                                withheld=v.get("withheld"))
    if kind == "withheld":
        return f"No verdict: {v['withheld']}."
    if kind == "untested":
        return "Positional structure was not tested against sampling noise (no null): read the numbers below as descriptive."
    if kind == "none":
        return ("No positional structure beyond sampling noise: as far as these counts can tell, every position has "
                "the same token distribution, so the corpus gives no reason to prefer one positional encoding over another.")
    so, above = v.get("standout_positions") or {}, v.get("components_above_noise")
    dims = ("no dimension of structure stands above sampling noise beyond them" if not above else
            f"the corpus has {above} dimension(s) of positional structure above sampling noise")
    if not above and verdict_rank_remedy(report):
        dims += " by the rotated corpora's count, which is conservative here (see the caveats)"
    if kind == "widespread":
        return (f"Token distributions change across positions: {so['count']:,} of the {used:,} positions ({so['ranges']}) "
                f"differ from the pooled distribution, and {dims}.")
    if kind == "positions":
        return f"Positions {so['ranges']} carry token distributions of their own, and {dims}."
    if WINDOW_HOMOGENEITY_CAVEAT in (v.get("caveats") or []):
        return (f"Token distributions may change gradually across positions: the homogeneity test rejects and no "
                f"single position stands out, but with its permutation null that test can reject on dependent text alone "
                f"(see the caveat); {dims}.")
    return (f"Token distributions change gradually across positions (no single position stands out, but the "
            f"homogeneity test rejects) and {dims}.")


def _null_name(null: dict[str, Any], /) -> str:
    """How the rank test's null is named in the verdict: ``rotated corpora`` or ``shuffled
    corpora`` (``null.null_corpora``), the noise bulk measured on independent halves
    (``null.edge.method`` ``halves``; sequential where ``null.edge.deflated`` is given),
    else its method (``mp``: the analytic edge)."""
    corpora = null.get("null_corpora")
    if corpora:
        return f"{corpora} corpora"
    edge = null.get("edge") or {}
    if edge.get("method") == "halves":
        margin = edge.get("margin")
        above = f", {margin:.0%} above its top" if isinstance(margin, (int, float)) else ""
        off = (", each later component against the noise off the ones before it" if edge.get("deflated") else "")
        return f"the noise bulk measured on independent halves ({edge.get('source')}){above}{off}"
    return str(null.get("method"))


def _encoding_sentence(v: dict[str, Any]) -> str | None:
    """Which encoding usable without fitting fits best, and what is tied with it."""
    rows = [b for b in v.get("best_encodings") or [] if b.get("fixed")]
    if not rows or not v.get("non_stationary"):
        return None
    names = list(dict.fromkeys(b["fixed"] for b in rows))  # in order of width

    def group(name: str) -> tuple[list[int], str]:
        mine = [b for b in rows if b["fixed"] == name]
        ties = sorted({t for b in mine for t in b.get("fixed_tied_with") or []} - {name})
        return [b["dim"] for b in mine], (f", tied within noise with {', '.join(ties)}" if ties else "")

    tied_sets = {frozenset({b["fixed"], *(b.get("fixed_tied_with") or [])}) for b in rows}
    if len(tied_sets) == 1 and len(tied := next(iter(tied_sets))) > 1:  # the same encodings tie at every width
        listed = sorted(tied)
        return (f"Among encodings used without fitting, {', '.join(listed[:-1])} and {listed[-1]} fit this geometry "
                f"equally well within noise at every width tried ({_dims([b['dim'] for b in rows])}): choose among "
                "them on other grounds.")
    if len(names) == 1:
        dims, tie = group(names[0])
        return (f"Among encodings used without fitting, {names[0]} fits this geometry best at every width tried "
                f"({_dims(dims)}{tie}).")
    parts = []
    for name in names:
        dims, tie = group(name)
        parts.append(f"{name} at {_dims(dims)}{tie}")
    return f"Among encodings used without fitting, the best fit is {'; '.join(parts)}."


def _fitted_sentence(v: dict[str, Any], report: dict[str, Any] | None = None) -> str | None:
    """Whether the corpus' own (fitted) encoding beats every fixed one, beyond noise (the
    verdict's ``fitted_better_at``, in words). Where the MDS's leading components load on
    thinly occupied positions (:func:`~posstats.estimates.verdict.thin_mds_components`), a
    lower stress is the fit to their sampling noise: the sentence says so and names what
    ``posstats export`` writes instead, and defers to the caveat."""
    above = v.get("components_above_noise")
    if not v.get("non_stationary") or not above:
        return None
    thin = thin_mds_components(report) if report is not None else []
    if thin:
        held = int(((report or {}).get("null") or {}).get("weighted_mds_components") or 0)
        export = (f"`posstats export` writes the {above} occupancy-weighted component(s) the rank test counted"
                  if held >= int(above) else
                  "an export at the informative rank would carry that noise (re-analyse with --min-occupancy K)")
        return (f"The corpus' own (unweighted) MDS encoding's leading component(s) {', '.join(str(j + 1) for j in thin)} "
                "fit the sampling noise of thinly occupied positions (see the caveats), so its stress is no evidence of a "
                f"better encoding; {export}.")
    better = set(v["fitted_better_at"] if "fitted_better_at" in v else
                 fitted_better(v.get("best_encodings") or [], non_stationary=v.get("non_stationary"), above=above))
    wins = [b for b in v.get("best_encodings") or [] if int(b["dim"]) in better]
    if not wins:
        return ("The corpus' own MDS encoding does not fit better than the best fixed one beyond noise: "
                "nothing to gain from exporting it.")
    b = wins[-1]
    fixed = b.get("best_fixed") or {}
    versus = f" against {fixed['name']}'s {fixed['scaled_stress']:.3g}" if fixed else ""
    return (f"The corpus' own encoding fits better ({b['best']}: scaled stress {b['scaled_stress']:.3g}{versus} at "
            f"d = {b['dim']}); `posstats export` writes its {above} informative component(s).")


def answer_sentences(report: dict[str, Any], /) -> list[str]:
    """Two or three plain sentences from the verdict, for the top of every summary: what is
    distinguishable and how many dimensions of structure there are, which encoding usable
    without fitting fits best (and what is tied with it), and whether the corpus' own MDS
    encoding is worth exporting; empty for a report without a verdict. The decisions are
    the verdict's (:mod:`posstats.estimates.verdict`); this only words them."""
    v = report.get("verdict")
    if not v:
        return []
    out = [_structure_sentence(report, v)]
    out += [x for x in (_encoding_sentence(v), _fitted_sentence(v, report)) if x]
    return out


# Each term one sentence, with the THEORY.md section that defines it.
GLOSSARY = (
    ("d_H", "Hellinger distance between the token distributions of two positions, in [0, sqrt 2]; "
            "bias-corrected: with the sampling noise of finite counts subtracted", "THEORY.md sections 2 and 7"),
    ("components above noise", "MDS dimensions whose eigenvalue exceeds that of every shuffled (stationary) corpus: "
                               "the dimensions of real positional structure", "THEORY.md section 3; docs/calibration.md"),
    ("standout position", "a position whose distribution differs from the pooled one beyond sampling noise "
                          "(Bonferroni over positions)", "docs/calibration.md"),
    ("stress", "sum (e_ij - h_ij)^2 / sum h_ij^2: how far an encoding's pairwise distances e are from the corpus' d_H; "
               "dominated by the encoding's scale", "THEORY.md section 4"),
    ("scaled stress", "the stress at the best overall scale of the encoding, in [0, 1]: the number to compare "
                      "encodings by (lower is more faithful)", "THEORY.md section 4"),
    ("H1 / non-stationary", "whether positions differ at all (the homogeneity or the standout test rejects)",
     "THEORY.md section 6; docs/calibration.md"),
    ("A3 / monotonicity violations", "the share of position triples i < j < k where the farther position k is "
                                     "closer to i than j is", "THEORY.md section 6"),
    ("min separation", "the smallest distance between two positions' encodings: 0 means two positions collide",
     "THEORY.md section 6"),
    ("negative mass", "the share of the MDS spectrum below 0, which no real encoding can reproduce (from noise or "
                      "the bias correction)", "THEORY.md section 3"),
    ("noise share", "the share of the summed distances that a stationary corpus of the same occupancies reaches: "
                    "how much of the geometry is sampling noise", "docs/calibration.md"),
)


def glossary_lines(*, markdown: bool = False) -> list[str]:
    """The glossary, one line per term."""
    if markdown:
        return [f"- **{term}**: {text} ({where})." for term, text, where in GLOSSARY]
    return [f"{term}: {text} ({where})." for term, text, where in GLOSSARY]


def variance_of(spectrum: dict[str, Any], /) -> str:
    """What the explained shares are shares of: ``"of the variance"``, or of the computed top
    k when negative eigenvalues beyond them put the trace below their sum."""
    if spectrum.get("denominator") == "computed_positive_eigenvalues":
        return f"of the top {len(spectrum.get('eigenvalues') or [])} components' variance"
    return "of the variance"


def _triples_clause(untested: dict[str, Any]) -> str:
    """", monotonicity from C (corpus) and E (each encoding) triples" of ``geometry.untested``
    (reports written before the nineteenth session have neither)."""
    if "corpus_triples" not in untested:
        return ""
    return (f", monotonicity from {untested['corpus_triples']:,} (corpus) and {untested['encoding_triples']:,} "
            "(each encoding) sampled triples")


def verdict_items(report: dict[str, Any], /) -> list[tuple[str, str]]:
    """The verdict as ``(label, sentence)`` pairs (report section ``verdict``): components
    above noise, the positions that stand out, the best-fitting encodings per width, and
    which distances were used; empty for a report without a verdict."""
    v = report.get("verdict")
    if not v:
        return []
    items = [("verdict", _components_sentence(report)), ("positions", _positions_sentence(report))]
    items += _best_fit_items(report)
    items += _held_out_items(report)
    items += _sweep_items(v)
    untested = (report.get("geometry") or {}).get("untested")
    if untested:
        items.append(("accuracy", f"descriptive: {untested['reason']}, so every encoding is tied whatever the "
                                  f"geometry; stresses sampled to +-{untested['stress_halfwidth']:g}, the MDS noise "
                                  f"bulk to {untested['lanczos_noise_share']:g} of the analytic edge"
                                  f"{_triples_clause(untested)} (docs/long-context.md)"))
    items.append(("distances", _noise_clause(report)))
    items += [("caveat", c) for c in v.get("caveats") or []]
    return items


def _components_sentence(report: dict[str, Any], /) -> str:
    """The verdict's first line: how many MDS components stand above sampling noise, and
    against which null (or why none is claimed)."""
    v, null = report["verdict"], report.get("null") or {}
    above = v.get("components_above_noise")
    if v.get("withheld"):
        return f"withheld: {v['withheld']}"
    if above is None:
        return "no null computed: the rank below is not tested against sampling noise"
    if v.get("non_stationary") is False and null.get("components_above_null"):
        return ("0 MDS components stand above sampling noise (the corpus is not shown to be non-stationary, so "
                f"the {null['components_above_null']} eigenvalue(s) above the null threshold are not claimed)")
    return (f"{above} MDS component(s) stand above sampling noise "
            f"(null: {_null_name(null)}, {threshold_phrase(report, _fmt(null.get('threshold'), '.4g'))}"
            f"{_weighting_clause(null)})")


def _positions_sentence(report: dict[str, Any], /) -> str:
    """The verdict's second line: the positions that stand out, or whether the corpus is
    non-stationary without one."""
    v = report["verdict"]
    so = v.get("standout_positions") or {}
    if v.get("withheld"):
        return "not tested (the verdict is withheld)"
    if v.get("non_stationary") is False:
        return ("positions are not distinguishable from one another beyond sampling noise "
                f"({v.get('non_stationary_test')}; family-wise 5 %)")
    if so.get("count"):
        more = so["count"] > len(so.get("positions", [])) and not so["ranges"].endswith("...")
        return f"{so['count']:,} position(s) stand out from the pooled distribution: {so['ranges']}" + (" ..." if more else "")
    if v.get("non_stationary"):
        homogeneity = report.get("homogeneity") or {}
        return (f"the corpus is non-stationary ({homogeneity_test_name(homogeneity)}, "
                f"{_p_value(homogeneity)}), but no single position stands out from the pooled distribution")
    return "no single position stands out from the pooled distribution"


def _best_fit_items(report: dict[str, Any], /) -> list[tuple[str, str]]:
    """The ``best fit`` line: the lowest scaled stress per width, with ties and margins, or
    none named where no test found structure."""
    v = report["verdict"]
    gated = all_tied(v)  # no test found structure: the verdict ties every encoding
    fits = []
    for b in v.get("best_encodings", []):
        tie = f" (tied: {', '.join(b['tied_with'])})" if b["tied_with"] and not gated else ""
        fits.append(f"d={b['dim']}: {b['best']} {_score(b)}{tie}{'' if gated else _margin(b)}")
    if not fits:
        return []
    if gated:
        return [("best fit", "none named: no test found positional structure, so every encoding is tied at every "
                             "width (their stresses measure fits to sampling noise); lowest scaled stress "
                             + "; ".join(fits))]
    noise_only = " (nothing stands above noise: these encodings fit sampling noise)" \
        if v.get("components_above_noise") == 0 else ""
    if not noise_only and any(b["best"].startswith("mds") for b in v.get("best_encodings", [])) \
            and thin_mds_components(report):
        noise_only = " (mds: its leading components fit thinly occupied positions' noise, see the caveats)"
    return [("best fit", "scaled stress " + "; ".join(fits) + noise_only)]


def _held_out_items(report: dict[str, Any], /) -> list[tuple[str, str]]:
    """The ``held out`` line: the best encoding per width fitted on one half of the corpus
    and scored on the other, or why none is named."""
    v = report["verdict"]
    if not v.get("held_out_best"):
        return []
    held = report.get("held_out") or {}
    scored = f"fitted on one half of the corpus ({held.get('split')}), scored on the other"
    if all_tied(v):
        return [("held out", f"none named: every encoding is tied (no structure found); {scored}")]
    if _held_out_unranged(held):
        why = held["encodings"][0]["held_out_interval"].removeprefix("none: ").split(" (")[0].split(";")[0]
        return [("held out", f"none named, every encoding tied: no held-out score has a range for ties ({why}); "
                             f"{scored}")]
    rows = []
    for b in v["held_out_best"]:
        tie = f" (tied: {', '.join(b['tied_with'])})" if b["tied_with"] else ""
        rows.append(f"d={b['dim']}: {b['best']}{tie}{_fit_gap(held, b['dim'], b['best'])}")
    noise_only = " (nothing stands above noise)" if v.get("components_above_noise") == 0 else ""
    return [("held out", "; ".join(rows) + f"; {scored}" + noise_only)]


def _sweep_items(v: dict[str, Any], /) -> list[tuple[str, str]]:
    """One ``sweep`` line per swept encoding: its best value per width, with ties."""
    items = []
    for sw in v.get("sweeps") or []:
        if all_tied(v):
            items.append(("sweep", f"{sw['spec']}: no {sw['parameter']} named: every value is tied (no structure found)"))
            continue
        rows = []
        for b in sw["best"]:
            tie = f" (tied: {', '.join(_fmt_value(t) for t in b['tied_with'])})" if b["tied_with"] else ""
            rows.append(f"d={b['dim']}: {sw['parameter']}={_fmt_value(b['best'])}{tie}")
        items.append(("sweep", f"{sw['spec']}: " + "; ".join(rows)))
    return items


def _score(entry: dict[str, Any]) -> str:
    """``0.373`` (exact), or ``0.373 [0.371, 0.375]`` with its 95 % interval (sampled)."""
    x = entry["scaled_stress"]
    lo, hi = entry.get("scaled_stress_ci95") or [x, x]
    return f"{x:.3g}" if hi - lo <= 1e-12 * max(abs(x), 1.0) else f"{x:.3g} [{lo:.3g}, {hi:.3g}]"


def _margin(best: dict[str, Any]) -> str:
    """``"; next mds 0.076; best fixed alibi 0.293"``: how far ahead the best encoding is."""
    parts = []
    if best.get("next"):
        parts.append(f"next {best['next']['name']} {_score(best['next'])}")
    fixed = best.get("best_fixed")
    if fixed and (not best.get("next") or fixed["name"] != best["next"]["name"]):
        parts.append(f"best fixed {fixed['name']} {_score(fixed)}")
    return f" ({'; '.join(parts)})" if parts else ""


def _held_out_unranged(held: dict[str, Any]) -> bool:
    """Whether no exact held-out score has a range for ties (above the jackknife's rows, or a
    half's row too thin): the held-out best then ties every encoding
    (:func:`posstats.estimates.held_out.held_out_scores`)."""
    entries = held.get("encodings") or []
    return (held.get("stress_method") == "exact" and bool(entries)
            and not any(e.get("held_out_scaled_stress_tie_range") for e in entries)
            and str(entries[0].get("held_out_interval", "")).startswith("none:"))


def _fit_gap(held: dict[str, Any], dim: int, name: str = "mds") -> str:
    """``" (scaled stress 0.029 fitted, 0.124 held out)"``: the held-out best ``name`` at
    ``dim`` on the half it was fitted to and on the other (a fixed encoding has no fit)."""
    for e in held.get("encodings") or []:
        if e["name"] == name and e["dim"] == dim and e.get("fit_scaled_stress") is not None:
            return f" (scaled stress {e['fit_scaled_stress']:.3g} fitted, {e['held_out_scaled_stress']:.3g} held out)"
    return ""


def _fmt_value(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def verdict_lines(report: dict[str, Any], /) -> list[str]:
    """:func:`verdict_items` as aligned terminal lines."""
    return [f"{label:<9} {text}" for label, text in verdict_items(report)]


def format_summary(report: dict[str, Any], /) -> str:
    """A plain-text summary: the verdict, corpus, positions, spectrum and one row per encoding."""
    c, p, s = report["corpus"], report["positions"], report["spectrum"]
    d = report.get("diagnostics", {})
    plugin = (report.get("geometry") or {}).get("distances", "plugin") != "bias_corrected"
    caveat = " of plug-in distances, noise included" if plugin else " of bias-corrected distances"
    answer = answer_sentences(report)
    lines = [*answer, *([""] if answer else []), *verdict_lines(report), *([""] if report.get("verdict") else []),
        f"corpus    {c['sequences']:,} sequences, {c['tokens_counted']:,} tokens counted, "
        f"V={c['vocab_size']:,}, mode={c['mode']}",
        f"positions {p['occupied']:,}/{p['requested']:,} occupied, {p['used']:,} used "
        f"(min occupancy {p['min_occupancy']})",
        f"spectrum  numerical rank {s['rank']} at rtol {s['rank_rtol']:g}{caveat}; components for 90/95/99/99.9 % "
        f"{variance_of(s)}: "
        + "/".join(_fmt(s["components_for"].get(k)) for k in ("0.9", "0.95", "0.99", "0.999"))
        + f"; negative mass {s['negative_mass']:.2g} ({s['method']})",
    ]
    if d:
        h1, a3 = d.get("h1", {}), d.get("a3", {})
        lines.append(
            f"corpus    non-stationary: {h1.get('nonstationary')} ({h1.get('test', 'not tested')}); "
            f"min d_H {_fmt(h1.get('min_distance'))}{' (plug-in: noise included)' if plugin else ''}; "
            f"Hellinger-monotonicity violations {_fmt(a3.get('rate'))} ({a3.get('method', '-')})"
        )
    header = ("encoding", "dim", "stress", "scaled", "scale", "pearson", "min sep", "mono viol")
    rows = [
        (
            e["name"],
            str(e["dim"]),
            _fmt(e["stress"]),
            _fmt(e["scaled_stress"]),
            _fmt(e["scale"]),
            _fmt(e["pearson"], ".3f"),
            _fmt(e["min_separation"]),
            _fmt(e["monotonicity_violation_rate"], ".3f") + ("" if e["monotonicity_method"] == "exact" else "~"),
        )
        for e in report["encodings"]
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    table = [
        "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))),
        "  ".join("-" * w for w in widths),
    ]
    for r in rows:
        table.append("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))))
    sampled = any(e["monotonicity_method"] != "exact" for e in report["encodings"])
    note = "stress = sum (e-h)^2 / sum h^2; scaled = min over a of stress(aP)" + ("; ~ = sampled estimate" if sampled else "")
    if any(str(e.get("stress_interval", "")).startswith("jackknife") for e in report["encodings"]):
        note += ("; [lo, hi] = 95 % jackknife interval around the bias-corrected estimate (it can exclude the "
                 "estimate; docs/calibration.md)")
    return "\n".join([*lines, "", *table, *encoding_note_lines(report), "", note])


def skipped_lines(report: dict[str, Any], /) -> list[str]:
    """One line per reason why encodings asked for were not scored."""
    reasons: dict[str, list[str]] = {}
    for entry in report.get("skipped_encodings") or []:
        reasons.setdefault(entry.get("reason", ""), []).append(entry.get("spec", "?"))
    return [f"not scored: {', '.join(specs)}: {reason}" for reason, specs in reasons.items()]


def unconverged_lines(report: dict[str, Any], /) -> list[str]:
    """One line per fitted encoding whose iterative fit (SMACOF) stopped at its iteration
    cap before its stopping rule held (``fit.converged`` false): its stress is then an
    upper bound of the fit's (local) minimum."""
    widths: dict[tuple[str, int], list[str]] = {}
    for e in report.get("encodings") or []:
        fit = e.get("fit") or {}
        if fit.get("converged") is False:
            widths.setdefault((e["name"], int(fit.get("iterations", 0))), []).append(str(e["dim"]))
    return [f"not converged: {name} at d = {', '.join(dims)} stopped after {its:,} iterations: its stress is an upper "
            "bound of its minimum (a larger max_iter in its spec, e.g. mds-smacof:max_iter=3000, iterates longer)"
            for (name, its), dims in widths.items()]


def encoding_note_lines(report: dict[str, Any], /) -> list[str]:
    """The lines under the encodings table: encodings not scored, fits not converged."""
    return [*skipped_lines(report), *unconverged_lines(report)]


def format_markdown(report: dict[str, Any], /) -> str:
    """A Markdown summary for a pull request or a model card."""
    c, p, s = report["corpus"], report["positions"], report["spectrum"]
    cf = s["components_for"]
    answer = answer_sentences(report)
    lines = [
        "# posstats report",
        "",
        *([" ".join(answer), ""] if answer else []),
        *(f"- **{label}**: {text}" for label, text in verdict_items(report)),
        f"- corpus: {c['sequences']:,} sequences, {c['tokens_counted']:,} tokens, V = {c['vocab_size']:,}, "
        f"mode `{c['mode']}`, fingerprint `{c.get('fingerprint', '')[:16]}`",
        f"- positions: {p['occupied']:,} of {p['requested']:,} occupied, {p['used']:,} used",
        f"- MDS rank {s['rank']} (rtol {s['rank_rtol']:g}); components for 90 / 95 / 99 / 99.9 % {variance_of(s)}: "
        f"{' / '.join(_fmt(cf.get(k)) for k in ('0.9', '0.95', '0.99', '0.999'))}",
        "",
        "| encoding | dim | stress | scaled stress | scale | pearson | min separation | monotonicity violations |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in report["encodings"]:
        mono = _fmt(e["monotonicity_violation_rate"], ".3f") + ("" if e["monotonicity_method"] == "exact" else " (sampled)")
        lines.append(
            f"| {e['name']} | {e['dim']} | {_fmt(e['stress'])} | {_fmt(e['scaled_stress'])} | {_fmt(e['scale'])} | "
            f"{_fmt(e['pearson'], '.3f')} | {_fmt(e['min_separation'])} | {mono} |"
        )
    notes = encoding_note_lines(report)
    lines += ["", *(f"{line[0].upper()}{line[1:]}" for line in notes), *([""] if notes else [])]
    lines += ["Terms:", "", *glossary_lines(markdown=True), ""]
    return "\n".join(lines)
