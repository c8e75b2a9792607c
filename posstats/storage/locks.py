"""The stale-lock rules of the two stores, side by side, and how a lock holder is named.

Both stores keep one lock per store, a JSON record with the holder's ``pid``,
``hostname``, ``start_ticks`` (:func:`posstats.processes.process_start_ticks`),
``run_id``, ``command`` and ``started`` time. They differ in what keeps a lock alive:

* the counting run store (:class:`posstats.corpus.shard_store.RunStore`) holds an
  exclusive ``flock`` for the whole run; the kernel drops it when the process ends, even
  by SIGKILL. Only where the file system has no ``flock`` does the record decide, by
  :func:`run_store_lock_is_stale`: the *pid rule* alone.
* the pipeline store (:class:`posstats.service.pipeline_store.Store`, local or an object
  store, where no ``flock`` spans hosts) refreshes a ``heartbeat_ts`` in the record;
  :func:`pipeline_lock_is_stale` adds the heartbeat age to the pid rule.

The pid rule (:func:`posstats.processes.process_gone`): a lock taken on this host is
stale when its process is gone, or when its pid now belongs to a process started at
another time than the lock records (pid reuse). A lock from another host is never
presumed dead by it.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from typing import Any

from posstats.processes import pid_alive as _pid_alive
from posstats.processes import process_gone, process_start_ticks

__all__ = [
    "LockInfo",
    "describe_lock_holder",
    "pipeline_lock_is_stale",
    "run_store_lock_is_stale",
]

LockInfo = dict  # {"pid", "hostname", "started", "start_ticks", "run_id", "command", ...}


def run_store_lock_is_stale(info: LockInfo, /, *, hostname: str | None = None) -> bool:
    """The counting run store's rule where ``flock`` is missing: a lock is stale when it was
    taken on this host by a process that is gone (or whose pid now belongs to a process
    started later). A lock from another host is never presumed stale; an empty or
    unreadable lock is stale."""
    if not info or "pid" not in info:
        return True
    if info.get("hostname") != (hostname or socket.gethostname()):
        return False
    return process_gone(int(info["pid"]), info.get("start_ticks")) is not None


def pipeline_lock_is_stale(
    info: Mapping[str, Any] | None,
    /,
    *,
    now: float,
    hostname: str,
    stale_after: float,
    pid_alive: Callable[[int], bool] = _pid_alive,
    start_ticks: Callable[[int], int | None] = process_start_ticks,
) -> tuple[bool, str]:
    """The pipeline store's rule; return (stale, why). A lock is stale when

    1. its heartbeat is older than ``stale_after`` seconds, whatever host holds it, or
    2. it was taken on this host and the pid rule finds its process gone or reused, or
    3. it cannot be parsed (a lock is always written whole, so this means damage).

    Args:
        info: the parsed lock, or None when it could not be parsed.
        now: the current time (seconds since the epoch).
        hostname: this host's name.
        stale_after: seconds without a heartbeat after which any lock is stale.
        pid_alive, start_ticks: process probes (injectable for tests).
    """
    if not isinstance(info, Mapping) or "heartbeat_ts" not in info or "pid" not in info:
        return True, "the lock file is damaged (not a lock record)"
    try:
        age = now - float(info["heartbeat_ts"])
        pid = int(info["pid"])
    except (TypeError, ValueError):
        return True, "the lock file is damaged (bad heartbeat or pid)"
    if age > stale_after:
        return True, f"its heartbeat is {age:.0f} s old (more than {stale_after:.0f} s)"
    if info.get("hostname") == hostname:
        gone = process_gone(pid, info.get("start_ticks"), pid_alive=pid_alive, start_ticks=start_ticks)
        if gone == "gone":
            return True, f"its process {pid} on this host ({hostname}) is gone"
        if gone == "reused":
            return True, f"its pid {pid} now belongs to another process"
    return False, f"heartbeat {max(age, 0):.0f} s ago"


def describe_lock_holder(info: Mapping[str, Any] | None, /) -> str:
    """``"run R (command, pid P on H, started T)"`` for a lock record; ``"another run"``
    when there is no record to name."""
    if not isinstance(info, Mapping):
        return "another run"
    return (
        f"run {info.get('run_id', '?')} ({info.get('command', '?')}, pid {info.get('pid', '?')} on "
        f"{info.get('hostname', '?')}, started {info.get('started', '?')})"
    )
