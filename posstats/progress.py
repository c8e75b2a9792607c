"""Progress bars for long steps (tqdm on stderr; silent when stderr is not a terminal)."""

from __future__ import annotations

from typing import Any

__all__ = ["progress"]


def progress(*, total: int | None = None, desc: str = "", unit: str = "it", enabled: bool | None = None) -> Any:
    """A tqdm bar on stderr; ``enabled=None`` shows it only on a terminal."""
    from tqdm.auto import tqdm

    disable = None if enabled is None else not enabled
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, disable=disable, leave=False, dynamic_ncols=True)
