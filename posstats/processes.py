"""Local process facts used by the stale-lock rules of the run stores (Linux /proc)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = ["pid_alive", "process_gone", "process_start_ticks"]


def pid_alive(pid: int, /) -> bool:
    """True when a process ``pid`` exists on this host (it may belong to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def process_start_ticks(pid: int, /) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot (Linux /proc), else None.

    Together with the pid it identifies a process: a reused pid has a later start time.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def process_gone(
    pid: int,
    recorded_ticks: Any,
    /,
    *,
    pid_alive: Callable[[int], bool] = pid_alive,
    start_ticks: Callable[[int], int | None] = process_start_ticks,
) -> str | None:
    """The pid rule for a process recorded on this host: ``"gone"`` when ``pid`` has exited,
    ``"reused"`` when ``pid`` now belongs to a process whose start time differs from
    ``recorded_ticks``, else None (alive, or no start time to compare).

    Args:
        pid: the recorded pid.
        recorded_ticks: the recorded :func:`process_start_ticks` of that process, or None.
        pid_alive, start_ticks: process probes (injectable for tests).
    """
    if not pid_alive(pid):
        return "gone"
    current = start_ticks(pid)
    if recorded_ticks is not None and current is not None and int(recorded_ticks) != int(current):
        return "reused"
    return None
