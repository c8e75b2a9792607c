"""The ``posstats`` command line.

Each subcommand lives in its own module under ``posstats.cli`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` (``args -> int``).
Modules are imported only when listed here, so a heavy dependency of one subcommand
(torch, ray) never slows down another.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from posstats import __version__
from posstats.guard import run_guarded

__all__ = ["build_parser", "main"]

# (module, one-line help) in the order `posstats --help` lists them.
SUBCOMMANDS: tuple[str, ...] = (
    "run",
    "count",
    "analyze",
    "refresh",
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


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every available subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="posstats",
        description=(
            "Measure the positional structure of a corpus: positional token counts, "
            "Hellinger geometry, information-optimal (MDS) positional encodings, and the "
            "stress of any encoding against the corpus. See THEORY.md for every quantity."
        ),
    )
    parser.add_argument("--version", action="version", version=f"posstats {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"posstats.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"posstats.cli.{name}":
                continue  # subcommand not built yet in this checkout
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``posstats`` script; returns the process exit status."""
    args = build_parser().parse_args(argv)
    return run_guarded(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
