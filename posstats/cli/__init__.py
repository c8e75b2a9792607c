"""The ``posstats`` command line.

Each subcommand lives in its own module under ``posstats.cli`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` (``args -> int``), and
``JSON_RESULT``: what its ``--json`` prints (None: no result, no ``--json``). ``-q``, ``-v``
and ``--json`` are added here, the same for every subcommand
(:mod:`posstats.jobs.output`); a mistyped flag, subcommand or choice gets a "did you mean".
Only the subcommand named on the command line is imported and registered (all of them
for ``posstats --help``), so ``posstats count`` does not pay for the analysis modules;
heavy optional dependencies (torch, ray, matplotlib) are imported inside a subcommand's
``run``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from posstats import __version__
from posstats.jobs.guard import run_guarded
from posstats.jobs.output import ArgumentParser, add_output_args

__all__ = ["SUBCOMMANDS", "build_parser", "main"]

# The subcommands (modules of posstats.cli) in the order `posstats --help` lists them.
SUBCOMMANDS: tuple[str, ...] = (
    "run",
    "count",
    "analyze",
    "refresh",
    "diff",
    "pipeline",
    "submit",
    "status",
    "logs",
    "schedule",
    "report",
    "export",
    "audit",
    "influence",
    "adjacency",
)


def _needed(argv: list[str] | None) -> tuple[str, ...]:
    """The subcommands to register: the one named on the command line, else all of them
    (``posstats --help``, a typo). Importing one subcommand instead of fourteen saves most
    of a second of start-up (scipy.stats, the analysis modules) for ``posstats count``."""
    args = sys.argv[1:] if argv is None else [str(a) for a in argv]
    first = next((a for a in args if not a.startswith("-")), None)
    return (first,) if first in SUBCOMMANDS else SUBCOMMANDS


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The top-level parser with the subcommands ``argv`` needs registered (all of them
    when ``argv`` names none; None reads ``sys.argv``)."""
    parser = ArgumentParser(
        prog="posstats",
        description=(
            "Measure the positional structure of a corpus: positional token counts, "
            "Hellinger geometry, information-optimal (MDS) positional encodings, and the "
            "stress of any encoding against the corpus. See THEORY.md for every quantity."
        ),
    )
    parser.add_argument("--version", action="version", version=f"posstats {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _needed(argv):
        module = importlib.import_module(f"posstats.cli.{name}")
        module.register(sub)
        add_output_args(sub.choices[name], json_result=module.JSON_RESULT)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``posstats`` script; returns the process exit status."""
    args = build_parser(argv).parse_args(argv)
    return run_guarded(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
