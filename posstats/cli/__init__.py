"""The ``posstats`` command line.

Each subcommand lives in its own module under ``posstats.cli`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` (``args -> int``).
Every subcommand is registered on every call, so their modules import only what
registering needs at module level: heavy dependencies (torch, ray, matplotlib) are
imported inside the subcommand's ``run``, and ``posstats --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
import types

from posstats import __version__
from posstats.cli import (
    adjacency,
    analyze,
    audit,
    count,
    export,
    influence,
    logs,
    pipeline,
    refresh,
    report,
    run,
    schedule,
    status,
    submit,
)
from posstats.guard import run_guarded

__all__ = ["build_parser", "main"]

# The subcommands in the order `posstats --help` lists them.
SUBCOMMANDS: tuple[types.ModuleType, ...] = (
    run,
    count,
    analyze,
    refresh,
    pipeline,
    submit,
    status,
    logs,
    schedule,
    report,
    export,
    audit,
    influence,
    adjacency,
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered."""
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
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``posstats`` script; returns the process exit status."""
    args = build_parser().parse_args(argv)
    return run_guarded(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
