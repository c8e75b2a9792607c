"""``posstats influence``: the causal-residual (Cesaro) influence baseline (THEORY section 8)."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from posstats.baselines.influence import (
    compare_with_theory,
    influence_density,
    influence_profile,
    influence_weighted_distinctiveness,
    mean_distance_to_others,
    plot_influence,
    spearman,
)
from posstats.counting.io import load_counts
from posstats.errors import InputError, PosstatsError
from posstats.geometry.hellinger import hellinger_sq
from posstats.jobs.output import print_json
from posstats.memory import require_memory, transformer_bytes
from posstats.storage.jsontext import write_json_atomic
from posstats.storage.publish import staged_output

HELP = "influence of each input position on the last one at initialisation (Cesaro baseline)"
DESCRIPTION = """\
What the architecture alone does to positions, before any encoding or training
(THEORY.md section 8; Chowdhury, "Lost in the Middle at Birth", arXiv:2603.10123). With causal attention uniform at initialisation a layer
mixes by the Cesaro matrix M[i, j] = 1/i (j <= i, 1-based), a residual layer by
N = (1 - a) I + a M, and the influence of input position j on the last position L after
H layers is w[j] = (N^H)[L, j] (it sums to 1; uniform would be 1/L each). It is computed
exactly in float64 by H suffix sums, O(L H): L in the millions takes well under a second.

quantities printed and written:
  primacy tail     primacy_mass: influence summed over the first ceil(tail_fraction L)
                   positions (uniform: tail_fraction); primacy_ratio: L w[1]
  recency weight   w[L], the last position on itself; recency_delta = (1 - a)^H is the
                   residual delta of the continuous limit
  dead-zone min    min of w over the interior 1 < j < L and where (w is non-increasing on
                   1..L-1, so the trough sits at j = L - 1, just before the recency spike)
  peak-to-trough   max w / dead-zone min
  dead zone        positions with w < dead_zone_fraction / L (default: half the uniform share)
  continuous       rho_H(x) = sum_r C(H,r) (1-a)^(H-r) a^r (ln 1/x)^(r-1)/(r-1)!, x = j/L,
                   plotted against L w[j]

with a corpus (--counts or --distinctiveness): each position's distinctiveness (mean
Hellinger distance to all other positions) weighted by its influence, and the share of
the corpus' positional structure that sits in the dead zone.

with --measure (needs torch): the input-output Jacobian norm ||d h_L / d x_j||_F of small
randomly initialised causal transformers (pre-LN, residual on), without and with RoPE,
averaged over seeds, and its Spearman correlation with w (that paper reports 0.99).

OUT/influence.png (log scale) and OUT/influence.json (written last) with --out.

examples:
  posstats influence --length 2048 --depth 24 --residual 0.5 --out runs/influence
  posstats influence --length 1000000 --depth 4 --residual 0.3
  posstats influence --counts runs/demo --depth 12 --residual 0.5 --out runs/influence
  posstats influence --length 64 --depth 4 --residual 0.3 --measure --out runs/influence
"""

SCHEMA = "posstats.influence/1"
MAX_MEASURE_LENGTH = 1024


# what --json prints (posstats.jobs.output); None: no result, no --json
JSON_RESULT: str | None = "influence.json's document"

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("influence", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("architecture")
    g.add_argument("--length", type=int, metavar="L",
                   help="number of positions L >= 1 (context length); default with --counts: its positions")
    g.add_argument("--depth", type=int, required=True, metavar="H", help="number of layers H >= 0")
    g.add_argument("--residual", type=float, default=0.5, metavar="A",
                   help="residual mixing weight a in [0, 1]: N = (1-a) I + a M; 1 = no residual "
                        "connection, 0 = attention does nothing (default 0.5)")
    s = p.add_argument_group("summary")
    s.add_argument("--tail-fraction", type=float, default=0.1, metavar="F",
                   help="the primacy tail is the first ceil(F L) positions (default 0.1)")
    s.add_argument("--dead-zone-fraction", type=float, default=0.5, metavar="F",
                   help="the dead zone is where influence < F / L (default 0.5)")
    s.add_argument("--max-points", type=int, default=10000, metavar="N",
                   help="profile values written to the JSON: all when L <= N, else N log-spaced "
                        "positions (always with 1, L-1, L); default 10000")
    c = p.add_argument_group("corpus (optional; one of)")
    c.add_argument("--counts", metavar="DIR",
                   help="counts folder of `posstats count`: distinctiveness = mean Hellinger distance "
                        "of each occupied position to the others")
    c.add_argument("--distinctiveness", metavar="FILE",
                   help="per-position distinctiveness, L numbers (position 0 first; NaN = no data): "
                        ".npy, .json (a list) or text (one number per line)")
    m = p.add_argument_group("measurement (optional, needs torch)")
    m.add_argument("--measure", action="store_true",
                   help=f"measure the Jacobian-norm profile of random causal transformers with H layers "
                        f"and L positions (L <= {MAX_MEASURE_LENGTH}), without and with RoPE")
    m.add_argument("--dim", type=int, default=128, metavar="D", help="model width (default 128)")
    m.add_argument("--heads", type=int, default=8, metavar="K", help="attention heads (default 8)")
    m.add_argument("--init-std", type=float, default=0.02, metavar="S", help="initialisation std (default 0.02)")
    m.add_argument("--seeds", type=int, default=16, metavar="K",
                   help="random models (and token sequences) averaged (default 16)")
    m.add_argument("--probes", type=int, default=4, metavar="K",
                   help="random probes per model estimating the Frobenius norm; 0 = exact (default 4)")
    m.add_argument("--threads", type=int, default=1, metavar="T",
                   help="torch intra-op threads (default 1: the models are small and more threads mostly contend)")
    p.add_argument("--out", metavar="DIR",
                   help="write influence.json and influence.png here (old results replaced only on success)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    distinct, corpus_note = None, None
    if args.counts and args.distinctiveness:
        raise PosstatsError("give either --counts or --distinctiveness, not both")
    length = args.length
    if args.counts:
        distinct, corpus_note = _distinctiveness_from_counts(args.counts)
        if length is None:
            length = distinct.size
    elif args.distinctiveness:
        distinct = _read_numbers(args.distinctiveness)
        corpus_note = f"distinctiveness read from {args.distinctiveness}"
    if length is None:
        raise PosstatsError("--length is required (or give --counts to take it from the corpus)")
    if distinct is not None and distinct.size != length:
        msg = f"the corpus has {distinct.size} positions but --length is {length}"
        raise PosstatsError(msg)
    if args.max_points < 4:
        msg = f"--max-points must be >= 4; got {args.max_points}"
        raise PosstatsError(msg)

    result = influence_profile(length, args.depth, residual=args.residual,
                               tail_fraction=args.tail_fraction, dead_zone_fraction=args.dead_zone_fraction)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "config": {"length": length, "depth": args.depth, "residual": args.residual,
                   "tail_fraction": args.tail_fraction, "dead_zone_fraction": args.dead_zone_fraction},
        "summary": result.summary(),
        "profile": _profile_section(result, args.max_points),
    }
    if distinct is not None:
        weighting = influence_weighted_distinctiveness(result.profile, distinct,
                                                       dead_zone_fraction=args.dead_zone_fraction)
        doc["corpus"] = {"source": corpus_note, **weighting.to_dict()}

    measured: dict[str, np.ndarray] = {}
    if args.measure:
        measured, doc["measurement"] = _measure(args, length, compare_with_theory)

    _print_summary(result, doc)
    if args.out:
        with staged_output(args.out, last=("influence.json",)) as stage:
            fig = plot_influence(result, measured=measured or None)
            fig.savefig(stage / "influence.png", dpi=120)
            write_json_atomic(stage / "influence.json", doc)
        print(f"wrote {Path(args.out) / 'influence.json'} and {Path(args.out) / 'influence.png'}")
    print_json(args, doc)
    return 0


def _profile_section(result: Any, max_points: int) -> dict[str, Any]:

    d = result.to_dict(max_points=max_points)
    positions = np.asarray(d["positions"])
    section: dict[str, Any] = {
        "positions": d["positions"],
        "influence": d["influence"],
        "thinned": len(d["positions"]) < result.length,
    }
    x = positions / result.length
    section["continuous"] = {
        "x": x.tolist(),
        "density": influence_density(x, result.depth, residual=result.residual).tolist(),
        "recency_delta": result.recency_delta,
        "note": "smooth part of rho_H(x); compare with L * influence",
    }
    return section


def _measure(args: argparse.Namespace, length: int, compare: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    if length > MAX_MEASURE_LENGTH:
        msg = f"--measure supports --length up to {MAX_MEASURE_LENGTH}; got {length}"
        raise PosstatsError(msg)
    if args.depth < 1:
        raise PosstatsError("--measure needs --depth >= 1")
    if args.seeds < 1 or args.probes < 0 or args.threads < 1:
        msg = f"--seeds and --threads must be >= 1 and --probes >= 0; got {args.seeds}, {args.threads}, {args.probes}"
        raise PosstatsError(msg)
    try:
        from posstats.baselines.random_transformer import (
            TransformerConfig,
            jacobian_profile,
            set_torch_threads,
        )

        set_torch_threads(args.threads)
        cfg = TransformerConfig(layers=args.depth, dim=args.dim, heads=args.heads, vocab_size=4096,
                                init_std=args.init_std)
    except ImportError as exc:
        raise PosstatsError(str(exc)) from None
    except ValueError as exc:
        raise PosstatsError(f"bad model config: {exc}") from None

    need, what, hint = transformer_bytes(layers=cfg.layers, dim=cfg.dim, vocab_size=cfg.vocab_size,
                                         mlp_ratio=cfg.mlp_ratio, tokens=length, itemsize=8)
    require_memory(need, what=what, hint="lower --dim or --depth", command="influence --measure")
    probes = None if args.probes == 0 else args.probes
    seeds = range(args.seeds)
    section: dict[str, Any] = {"model": {k: v for k, v in cfg.to_dict().items() if k not in ("seed", "rope")},
                               "seeds": args.seeds, "probes": probes,
                               "quantity": "mean over seeds of ||d h_L / d x_j||_F normalised to sum 1"}
    profiles: dict[str, np.ndarray] = {}
    for label, rope in (("no RoPE", False), ("RoPE", True)):
        try:
            prof = jacobian_profile(TransformerConfig(**{**cfg.to_dict(), "rope": rope}), length,
                                    seeds=seeds, probes=probes)
        except ImportError as exc:
            raise PosstatsError(str(exc)) from None
        profiles[label] = prof
        key = "rope" if rope else "no_rope"
        section[key] = {
            "theory_at_given_residual": compare(prof, args.depth, residual=args.residual).to_dict(),
            "theory_at_fitted_residual": compare(prof, args.depth).to_dict(),
            "profile": prof.tolist(),
        }

    section["spearman_rope_vs_no_rope"] = spearman(profiles["no RoPE"], profiles["RoPE"])
    return profiles, section


def _distinctiveness_from_counts(path: str) -> tuple[np.ndarray, str]:

    counts = load_counts(path)
    occupied = counts.occupied_positions()
    if occupied.size < 2:
        msg = f"{path}: fewer than two occupied positions"
        raise InputError(msg)
    dist = np.sqrt(np.clip(np.asarray(hellinger_sq(counts.rows(occupied)), dtype=np.float64), 0.0, None))
    out = np.full(counts.positions, np.nan)
    out[occupied] = mean_distance_to_others(dist)
    note = f"mean Hellinger distance to the other occupied positions, from {path}"
    return out, note


def _read_numbers(path: str) -> np.ndarray:

    p = Path(path)
    if not p.is_file():
        msg = f"{path}: no such file"
        raise InputError(msg)
    try:
        if p.suffix == ".npy":
            values = np.load(p, allow_pickle=False)
        elif p.suffix == ".json":
            values = np.asarray(json.loads(p.read_text()), dtype=np.float64)
        else:
            values = np.loadtxt(p, dtype=np.float64, ndmin=1)
        values = np.asarray(values, dtype=np.float64)
    except (ValueError, TypeError, OSError) as exc:
        msg = f"{path}: not a list of numbers ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
        raise InputError(msg) from None
    if values.ndim != 1:
        msg = f"{path}: expected one number per position, got an array of shape {values.shape}"
        raise InputError(msg)
    bad = np.flatnonzero(~np.isnan(values) & ~(np.isfinite(values) & (values >= 0)))
    if bad.size:
        msg = f"{path}: position {int(bad[0])}: distinctiveness must be >= 0 and finite, got {values[bad[0]]}"
        raise InputError(msg)
    return values


def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:.4g}"
    return str(v)


def _print_summary(result: Any, doc: dict[str, Any]) -> None:
    s = result.summary()
    big_l = result.length
    print(f"Cesaro influence on the last position: L={big_l}, H={result.depth}, a={result.residual:g}")
    print(f"  primacy tail     {_fmt(s['primacy_mass'])} of the influence on the first "
          f"{math.ceil(result.tail_fraction * big_l)} positions ({result.tail_fraction:g} of L); "
          f"first position {_fmt(s['primacy_ratio'])} x uniform")
    print(f"  recency weight   {_fmt(s['recency_weight'])} (residual delta (1-a)^H = {_fmt(s['recency_delta'])})")
    if s["dead_zone_min"] is not None:
        print(f"  dead-zone min    {_fmt(s['dead_zone_min'])} at j={s['dead_zone_position']} "
              f"(x={_fmt(s['dead_zone_x'])}; {_fmt(big_l * s['dead_zone_min'])} x uniform)")
        ratio = result.peak_to_trough
        print(f"  peak-to-trough   {_fmt(ratio)}"
              + (f" (10^{math.log10(ratio):.1f})" if ratio and math.isfinite(ratio) and ratio > 0 else ""))
    print(f"  dead zone        {s['dead_zone_size']} of {big_l} positions "
          f"({_fmt(s['dead_zone_share'])}) below {result.dead_zone_fraction:g}/L")
    corpus = doc.get("corpus")
    if corpus:
        print(f"  corpus           {_fmt(corpus['structure_in_dead_zone'])} of the positional distinctiveness "
              f"sits in the dead zone; {_fmt(corpus['weighted_mass_in_dead_zone'])} of the influence-weighted; "
              f"effective/uniform {_fmt(corpus['effective_ratio'])}")
    meas = doc.get("measurement")
    if meas:
        for key, label in (("no_rope", "no RoPE"), ("rope", "RoPE")):
            fit = meas[key]["theory_at_fitted_residual"]
            given = meas[key]["theory_at_given_residual"]
            print(f"  measured {label:8s} Spearman {_fmt(given['spearman'])} vs theory at a={result.residual:g}, "
                  f"{_fmt(fit['spearman'])} at the fitted a={_fmt(fit['fitted_residual'])} "
                  f"(log10 rms {_fmt(fit['log10_rms'])})")
        print(f"  RoPE vs no RoPE  Spearman {_fmt(meas['spearman_rope_vs_no_rope'])}")
