"""This process and others: facts for the stale-lock rules of the run stores (Linux /proc), and
how SIGTERM and SIGHUP end a command.

SIGTERM and SIGHUP end a command the way Ctrl-C does: by unwinding.

A closed terminal (SIGHUP), ``timeout``, systemd and Kubernetes (SIGTERM, often to the
whole process group) stop a command. Python's default is to die at once, so ``finally``
blocks never run: a pipeline's store lock stays held until it goes stale, and processes it
started are left behind. Inside :func:`terminable` (every entrypoint runs in it, through
:func:`posstats.jobs.guard.run_guarded`) both signals raise :class:`Terminated`, a
``KeyboardInterrupt``: context managers release what they hold (the store lock) and the
Ray session a command started is shut down, as after Ctrl-C. Ray checks for signals while
it waits (``ray.get``), so the exception is raised there too.

``ray.init`` installs a SIGTERM handler of its own (``sys.exit``); :func:`reinstall` puts
ours back (:func:`posstats.jobs.connect.connect_ray` calls it after joining or starting Ray).

:func:`one_malloc_arena` keeps glibc from giving each thread a heap of its own: the
analysis' product threads otherwise leave freed blocks in their own arenas, which the
process keeps (the 200 M-token analysis at 131,072 positions peaked at 4.29 GB on 2 threads
against 3.49 GB on one; with one arena 3.95 GB, and no slower).
:func:`return_freed_memory` hands freed heap memory back to the system between two steps
whose temporaries would otherwise stack up in the process' peak (a range's noise floor,
then its square roots: 3.18 GB -> 2.65 GB for a third of the 1 B-token counts).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "SIGNALS",
    "Terminated",
    "describe_stop",
    "exit_status",
    "one_malloc_arena",
    "pid_alive",
    "process_gone",
    "process_start_ticks",
    "reinstall",
    "return_freed_memory",
    "stopped_by",
    "terminable",
]


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


# ----------------------------------------------------------------------------- termination by signal

SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_ACTIVE = [0]  # nesting depth of terminable() on the main thread
_RECEIVED: list[int] = []  # the signals received inside terminable(), first first


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when the process receives SIGTERM or SIGHUP.

    Attributes:
        signum: the signal's number.
    """

    def __init__(self, signum: int, /) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = int(signum)


def _raise(signum: int, _frame: Any) -> None:
    _RECEIVED.append(int(signum))
    raise Terminated(signum)


def stopped_by(exc: BaseException, /) -> int | None:
    """The signal that stopped the command with ``exc``, or None (Ctrl-C). Ray turns the
    exception raised inside its ``get`` into a plain ``KeyboardInterrupt``, so the signal
    is also remembered when the handler runs."""
    if isinstance(exc, Terminated):
        return exc.signum
    return _RECEIVED[0] if _RECEIVED else None


def exit_status(exc: BaseException, /) -> int:
    """The conventional exit status of an interrupted command: 128 + the signal (130 for
    Ctrl-C, 143 for SIGTERM, 129 for SIGHUP)."""
    return 128 + (stopped_by(exc) or int(signal.SIGINT))


def describe_stop(exc: BaseException, /) -> str:
    """``stopped by SIGTERM`` / ``interrupted`` (Ctrl-C), for the one line a command prints."""
    signum = stopped_by(exc)
    return f"stopped by {signal.Signals(signum).name}" if signum else "interrupted"


@contextlib.contextmanager
def terminable() -> Iterator[None]:
    """Within: SIGTERM and SIGHUP raise :class:`Terminated` in the main thread; the previous
    handlers come back on exit. Outside the main thread (where Python cannot install signal
    handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise) for s in SIGNALS}
    if not _ACTIVE[0]:
        _RECEIVED.clear()
    _ACTIVE[0] += 1
    try:
        yield
    finally:
        _ACTIVE[0] -= 1
        for s, handler in previous.items():
            signal.signal(s, handler)


def reinstall() -> None:
    """Put :class:`Terminated` back on SIGTERM and SIGHUP after a library replaced the
    handlers (``ray.init`` does), when inside :func:`terminable` on the main thread."""
    if _ACTIVE[0] and threading.current_thread() is threading.main_thread():
        for s in SIGNALS:
            signal.signal(s, _raise)


_M_ARENA_MAX = -8  # glibc's mallopt parameter


def one_malloc_arena() -> bool:
    """Limit glibc's malloc to one arena in this process, as ``MALLOC_ARENA_MAX=1`` would
    (module docstring); call it before the threads start (the entrypoints do). Returns
    whether it took effect (False off glibc, or where ``MALLOC_ARENA_MAX`` is already set:
    the user's choice stands)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, 1))


def return_freed_memory() -> bool:
    """Give the memory glibc's heap holds for freed blocks back to the system
    (``malloc_trim(0)``). Temporaries of about 32 MB (a block of ``2**22`` float64 values)
    land on the heap once glibc has raised its mmap threshold, and stay resident after they
    are freed; the next step's large arrays (mmapped) then add to them. Returns whether it
    ran (False off glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True
