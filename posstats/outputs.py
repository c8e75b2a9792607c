"""Output folders that never look complete when they are not.

A command stages its files in a hidden sibling folder and publishes them into the
destination only once everything succeeded: the destination either keeps its old files
or gets the complete new set, with the completion marker (e.g. ``report.json``) moved
last. A failure leaves the destination exactly as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

__all__ = ["staged_output"]


@contextlib.contextmanager
def staged_output(destination: str | os.PathLike, /, *, last: tuple[str, ...] = ()) -> Iterator[Path]:
    """Yield a staging folder; on success move its files into ``destination``.

    Args:
        destination: the output folder (created if needed).
        last: file names moved after all others (completion markers), in this order.
    """
    destination = Path(destination)
    parent = destination.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    if destination.exists() and not destination.is_dir():
        from posstats.errors import PosstatsError

        msg = f"{destination}: exists and is not a folder"
        raise PosstatsError(msg)
    stage = Path(tempfile.mkdtemp(prefix=f".{destination.name}.staging-", dir=parent))
    try:
        yield stage
        destination.mkdir(parents=True, exist_ok=True)
        names = sorted(p.name for p in stage.iterdir())
        ordered = [n for n in names if n not in last] + [n for n in last if n in names]
        for name in ordered:
            target = destination / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(stage / name, target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
