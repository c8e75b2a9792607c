"""Local process facts used by the stale-lock rules of the run stores (Linux /proc)."""

from __future__ import annotations

import os

__all__ = ["pid_alive", "process_start_ticks"]


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
