"""Real mounts for fault tests: a size-limited tmpfs (disk full, mount-point outputs) and a
read-only bind mount. Skips the calling test with a reason when mounting is impossible
(not root, no mount rights)."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest

__all__ = ["mounted"]


@contextlib.contextmanager
def mounted(kind: str, target: Path, *, size: str = "", source: Path | None = None):
    """A size-limited tmpfs, or a read-only bind mount of ``source``; skips when mounting is impossible."""
    target.mkdir(parents=True, exist_ok=True)
    if kind == "tmpfs":
        cmds = [["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)]]
    else:
        cmds = [["mount", "--bind", str(source), str(target)], ["mount", "-o", "remount,bind,ro", str(target)]]
    done = 0
    try:
        for cmd in cmds:
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                pytest.skip(f"cannot {' '.join(cmd[:3])} here (needs root and mount rights): {r.stderr.strip()}")
            done += 1
        yield target
    finally:
        if done:
            r = subprocess.run(["umount", str(target)], capture_output=True, text=True)
            if r.returncode != 0:
                subprocess.run(["umount", "-l", str(target)], capture_output=True)
