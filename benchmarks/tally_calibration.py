"""Add up the decision tables of several ``bench_calibration.py`` runs.

    python benchmarks/tally_calibration.py RUN.json [RUN.json ...] [--markdown]

A long cell (n = 131,072, N = 20,000: minutes a corpus) is run in pieces, one corpus or a
few a run, each continuing the seeds with ``--first-seed``. This adds the pieces' counts
per cell and decision and gives each sum its Clopper-Pearson 95 % interval, so a figure in
docs/calibration.md can be rebuilt from the runs' JSON.

- A cell is (positions n, tokens per position N, kind, sampler). Runs of both samplers
  are tallied apart: the same seed is another corpus under each.
- Each run's corpora are known from its setup: corpus ``i`` of kind ``k`` has seed
  ``10,000 (1 + index of k) + first_seed + i`` (``bench_calibration.decision_table``). A
  corpus counted twice (the same seed in two runs of one cell) is refused, naming both
  files and the seed: a repeated run would otherwise count one corpus as two.
- On the null kinds (``stationary``, ``pack_markov``) ``distinguishable`` counts the
  corpora with any claim: the verdict gates every other claim (components, standouts,
  a best encoding) on it, so it is the family-wise false-positive count.
- Runs without ``first_seed`` or ``sampler`` in their setup (before those options) read
  as 0 and ``tokens``.

Prints one JSON object (``cells``: one row per cell with the corpora's seeds as ranges and
each decision's count, total and interval); ``--markdown`` prints a table instead.
Bad input (not a calibration run, a row whose totals disagree with its setup) exits 2 with
one line naming the file and the value.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_calibration import _TALLIED  # noqa: E402

from posstats.estimates.standout import position_ranges  # noqa: E402
from posstats.testing import proportion  # noqa: E402


class TallyError(ValueError):
    """A run that cannot be added: the message names the file and the value."""


def corpus_seeds(kind: str, first_seed: int, runs: int) -> range:
    """The seeds of a run's ``runs`` corpora of ``kind`` (as ``decision_table`` draws them)."""
    base = 10_000 * (1 + list(_TALLIED).index(kind)) + first_seed
    return range(base, base + runs)


def run_cells(run: dict, name: str) -> list[tuple[tuple, range, dict[str, int]]]:
    """The cells of one run's decision table: ``(cell, seeds, counts)`` per kind and row,
    where ``cell = (n, N, kind, sampler)`` and ``counts`` maps each decision to its count.

    Raises :class:`TallyError` for a run that is not ``bench_calibration.py``'s output or
    whose totals disagree with its setup."""
    if not isinstance(run, dict) or run.get("benchmark") != "calibration":
        raise TallyError(f"{name}: not a bench_calibration.py run (benchmark: {run.get('benchmark') if isinstance(run, dict) else type(run).__name__!r})")
    setup = run.get("setup") or {}
    first = int(setup.get("first_seed", 0))
    sampler = setup.get("sampler", "tokens")
    out = []
    for r, row in enumerate(run.get("decisions") or []):
        for kind in _TALLIED:
            if kind not in row:
                continue
            field = "seeds_stationary" if kind in ("stationary", "pack_markov") else "seeds_power"
            if not isinstance(setup.get(field), int):
                raise TallyError(f"{name}: setup {field}: {setup.get(field)!r}, not a count of corpora")
            runs = setup[field]
            counts = {}
            for decision, cell in row[kind].items():
                if decision == "edges":  # which edge each analysis used (--null mp): not a decision
                    continue
                if cell.get("of") != runs or not 0 <= cell.get("count", -1) <= runs:
                    raise TallyError(f"{name}: decisions row {r}, {kind} {decision}: count {cell.get('count')} "
                                     f"of {cell.get('of')}, but the setup ran {runs} corpora")
                counts[decision] = int(cell["count"])
            key = (int(row["positions"]), int(row["tokens_per_position"]), kind, sampler)
            out.append((key, corpus_seeds(kind, first, runs), counts))
    return out


def tally(runs: list[tuple[str, dict]]) -> list[dict]:
    """Add the runs' counts per cell (``(name, run)`` pairs as read from their files).

    Every corpus is counted once: a seed that two runs of one cell share raises
    :class:`TallyError` naming both runs."""
    cells: dict[tuple, dict] = {}
    for name, run in runs:
        for key, seeds, counts in run_cells(run, name):
            cell = cells.setdefault(key, {"seeds": {}, "counts": {}})
            for s in seeds:
                if s in cell["seeds"]:
                    n, N, kind, sampler = key
                    raise TallyError(f"{name}: corpus seed {s} ({kind}, n = {n}, N = {N}, sampler {sampler}) "
                                     f"is already counted from {cell['seeds'][s]}")
                cell["seeds"][s] = name
            for decision, c in counts.items():
                cell["counts"][decision] = cell["counts"].get(decision, 0) + c
    rows = []
    for (n, N, kind, sampler), cell in sorted(cells.items()):
        total = len(cell["seeds"])
        rows.append({"positions": n, "tokens_per_position": N, "kind": kind, "sampler": sampler,
                     "corpora": total, "seeds": position_ranges(list(cell["seeds"])),
                     "decisions": {d: proportion(c, total) for d, c in cell["counts"].items()}})
    return rows


def markdown(rows: list[dict]) -> str:
    """The tally as a Markdown table: one line per cell and decision."""
    lines = ["| n | N | kind | sampler | decision | count | Clopper-Pearson 95 % | seeds |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        for decision, p in row["decisions"].items():
            lo, hi = p["ci95"]
            lines.append(f"| {row['positions']:,} | {row['tokens_per_position']:,} | {row['kind']} | {row['sampler']} | "
                         f"{decision} | {p['count']}/{p['of']} | [{100 * lo:.1f}, {100 * hi:.1f}] % | {row['seeds']} |")
    return "\n".join(lines)


def read_run(path: Path) -> dict:
    try:
        text = path.read_text()
        if not text.strip():
            raise TallyError(f"{path}: empty (a run still going, or one that stopped before printing its JSON)")
        return json.loads(text)
    except OSError as e:
        raise TallyError(f"{path}: cannot read it ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise TallyError(f"{path}: not JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Each corpus is counted once; runs of the two samplers are tallied apart.")
    p.add_argument("runs", nargs="+", type=Path, help="JSON printed by bench_calibration.py, one file per run")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table instead of JSON")
    args = p.parse_args(argv)
    try:
        rows = tally([(str(path), read_run(path)) for path in args.runs])
    except TallyError as e:
        print(f"tally_calibration: {e}", file=sys.stderr)
        return 2
    print(markdown(rows) if args.markdown else json.dumps({"benchmark": "calibration_tally", "runs": len(args.runs),
                                                          "cells": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
