"""Progress bars for long steps (tqdm on stderr; silent when stderr is not a terminal)."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import (
    tqdm,  # the terminal bar: tqdm.auto would import asyncio (15 ms of every start-up) for notebooks
)

__all__ = ["bars_shown", "progress"]


_QUIET = [False]


def bars_shown() -> bool:
    """Whether a bar left to its default (``enabled=None``) shows: not ``-q`` and stderr a
    terminal. Libraries with bars of their own (Hugging Face ``datasets`` building its Arrow
    cache) follow it."""
    return not _QUIET[0] and sys.stderr.isatty()


def set_quiet(quiet: bool, /) -> bool:
    """Turn progress bars off (``posstats ... -q``) unless a caller enables one explicitly;
    return the previous setting (to restore it)."""
    previous = _QUIET[0]
    _QUIET[0] = bool(quiet)
    return previous


def progress(
    *, total: int | None = None, desc: str = "", unit: str = "it", enabled: bool | None = None, unit_scale: bool = True
) -> Any:
    """A tqdm bar on stderr; ``enabled=None`` shows it only on a terminal.

    ``unit_scale`` abbreviates large counts (1.2M tok); turn it off for small whole units.
    """

    if enabled is None and _QUIET[0]:
        enabled = False
    disable = None if enabled is None else not enabled
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, disable=disable, leave=False, dynamic_ncols=True)
