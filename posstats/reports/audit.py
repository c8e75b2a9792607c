"""The audit of a checkpoint (:func:`posstats.audit.audit_checkpoint`) as plain text."""

from __future__ import annotations

from posstats.audit import AuditResult

__all__ = ["format_audit"]


def format_audit(result: AuditResult, /) -> str:
    """A plain-text summary of an audit."""
    e = result.encoding
    n, d = result.table_shape
    lines = [
        f"checkpoint {result.checkpoint}",
        f"table      {result.key} ({n} x {d}); {result.positions.size} corpus positions "
        f"({int(result.positions[0])}..{int(result.positions[-1])}) against rows "
        f"{int(result.positions[0]) + result.offset}..{int(result.positions[-1]) + result.offset}",
        "",
    ]
    header = ("encoding", "stress", "scaled", "scale", "pearson", "min sep", "mono viol")
    rows = [("learned", e)] + [(f"{r['name']} (ref)", r) for r in result.references]
    table = [header] + [
        (nm, f"{r['stress']:.4g}", f"{r['scaled_stress']:.4g}", f"{r['scale']:.4g}", f"{r['pearson']:.3f}",
         f"{r['min_separation']:.4g}", f"{r['monotonicity_violation_rate']:.3f}" + ("" if r["monotonicity_method"] == "exact" else "~"))
        for nm, r in rows
    ]
    lines += _columns(table)
    if result.layers:
        lines += ["", "projected stress of P M_l, M_l = W_Q^T W_K (rows of P M_l against d_H)"]
        head = ("layer", "stress", "scaled", "head mean stress", "head mean scaled")
        body = [head] + [
            (str(lr["layer"]), f"{lr['stress']:.4g}", f"{lr['scaled_stress']:.4g}",
             "-" if lr["head_mean_stress"] is None else f"{lr['head_mean_stress']:.4g}",
             "-" if lr["head_mean_scaled_stress"] is None else f"{lr['head_mean_scaled_stress']:.4g}")
            for lr in result.layers
        ]
        lines += _columns(body)
    lines += [f"note: {x}" for x in result.notes]
    return "\n".join(lines)


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for j, r in enumerate(rows):
        out.append("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))))
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return out
