"""Running a command so that every failure a user must act on is one line.

:func:`run_guarded` is the wrapper of every entrypoint (``posstats COMMAND`` and the
``python -m posstats.jobs.*`` job entrypoints): user errors (:class:`~posstats.errors.PosstatsError`)
and failures of the environment (a full disk, a read-only or forbidden output, a file
where a folder is needed, running out of memory, Ray's ``OutOfMemoryError``) print
``posstats: error: <one line>`` and return exit status 2. Anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

from posstats.corpus.remote import local_path
from posstats.errors import (
    OptionError,
    PosstatsError,
    PosstatsWarning,
    describe_os_error,
    error_chain,
    os_error_kind,
)
from posstats.memory import available_memory, format_bytes, memory_hint
from posstats.processes import describe_stop, exit_status, one_malloc_arena, terminable

from .output import CONFIG_NAMES, OPTION_FLAGS, routed_stdout

__all__ = ["error_text", "explain_failure", "run_guarded"]


def run_guarded(func: Callable[[Any], int | None], args: argparse.Namespace, /) -> int:
    """Run ``func(args)``; user errors become one line on stderr and exit status 2.

    So do failures of the environment, with what to change: a full disk, a read-only or
    forbidden output, a file where a folder is needed (any ``OSError``, named by its path
    and the flag it came from), running out of memory (``MemoryError``, the CPU allocator
    errors of torch) and Ray's ``OutOfMemoryError`` (recognised by class name, so the
    library never imports ray). Anything else is a bug and keeps its traceback.

    Shared by ``posstats`` and the ``python -m posstats.jobs.*`` entrypoints. A ``file://``
    URL is a local path wherever a command takes one (:func:`local_file_urls`); ``-q``,
    ``-v`` and ``--json`` apply around the command (:func:`posstats.jobs.output.routed_stdout`). SIGTERM
    and SIGHUP unwind like Ctrl-C (:mod:`posstats.processes`): exit status 128 + signal.
    The process keeps one malloc arena (:func:`posstats.processes.one_malloc_arena`).
    """
    one_malloc_arena()
    try:
        with warnings.catch_warnings(), terminable(), routed_stdout(args):
            warnings.showwarning = _show_warning
            return int(func(local_file_urls(args)) or 0)
    except PosstatsError as exc:
        print(f"posstats: error: {error_text(exc, args)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM / SIGHUP (Terminated)
        print(f"posstats: {describe_stop(exc)}", file=sys.stderr)
        return exit_status(exc)
    except Exception as exc:
        text = explain_failure(exc, args)
        if text is None:
            raise
        print(f"posstats: error: {text}", file=sys.stderr)
        return 2


def error_text(exc: PosstatsError, args: argparse.Namespace, /) -> str:
    """The one line of a user error: an :class:`~posstats.errors.OptionError` names the
    command's flags (``--dims``) where the library names parameters (``dims``)."""
    if isinstance(exc, OptionError):
        names = {**(getattr(args, CONFIG_NAMES, None) or {}), **(getattr(args, OPTION_FLAGS, None) or {})}
        return exc.naming(_Flags(names))
    return str(exc)


class _Flags(dict):
    """{parameter: flag}; any other parameter reads as ``--its-name`` (the flag of the command
    that sets it: ``dims`` of an export's error names the analysis' ``--dims``)."""

    def get(self, key: Any, default: Any = None) -> Any:
        return super().get(key, "--" + str(key).replace("_", "-"))


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """Warnings of posstats as one ``posstats: warning: ...`` line; others as Python prints them."""
    if issubclass(category, PosstatsWarning):
        print(f"posstats: warning: {message}", file=sys.stderr if file is None else file)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def local_file_urls(args: argparse.Namespace, /) -> argparse.Namespace:
    """``args`` with every ``file://`` URL value (alone or in a list) replaced by its local
    path, in place: ``file:///data/runs/a`` -> ``/data/runs/a``; returns ``args``."""
    def local(value: Any) -> Any:
        if isinstance(value, str):
            return local_path(value)
        if isinstance(value, list):
            return [local(v) for v in value]
        if isinstance(value, tuple):
            return tuple(local(v) for v in value)
        return value

    for name, value in vars(args).items():
        setattr(args, name, local(value))
    return args


# Flags whose values are paths a command writes (first: the likeliest place of a failure).
_OUTPUT_FLAGS = (("out", "--out"), ("store", "--store"), ("work", "--work"))
_INPUT_FLAGS = (("counts", "--counts"), ("input", "--input"), ("config", "--config"), ("run_dir", "RUN_DIR"),
                ("checkpoint", "CHECKPOINT"))


def _one_line(exc: BaseException, limit: int = 200) -> str:
    lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _class_names(exc: BaseException) -> set[tuple[str, str]]:
    return {(k.__module__ or "", k.__name__) for k in type(exc).__mro__}


def _flag_of(path: str | None, args: argparse.Namespace) -> tuple[str, str] | None:
    """(flag, value) of the argument ``path`` lies in, or None."""
    if not path:
        return None
    target = os.path.abspath(path)
    for attr, flag in _OUTPUT_FLAGS + _INPUT_FLAGS:
        values = getattr(args, attr, None)
        for value in values if isinstance(values, (list, tuple)) else [values]:
            if not isinstance(value, (str, os.PathLike)) or not str(value):
                continue
            base = os.path.abspath(os.fspath(value))
            if target == base or target.startswith(base.rstrip(os.sep) + os.sep):
                return flag, os.fspath(value)
    return None


def _shown_path(path: str, flag: tuple[str, str] | None) -> str:
    """``path``, or ``"--out OUT"`` when it is a hidden working file inside that folder
    (a staging version, a temporary file): the user named OUT, not its internals."""
    if flag is None:
        return path
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(flag[1]))
    if any(part.startswith(".") and part not in (".", "..") for part in rel.split(os.sep)):
        return f"{flag[0]} {flag[1]}"
    return path


def _output_flag(args: argparse.Namespace) -> tuple[str, str] | None:
    for attr, flag in _OUTPUT_FLAGS:
        value = getattr(args, attr, None)
        if isinstance(value, str) and value:
            return flag, value
    return None


def explain_failure(exc: BaseException, args: argparse.Namespace, /) -> str | None:
    """One line for an environment failure (disk, permissions, memory), or None for a bug."""
    command = getattr(args, "command", None)
    chain = list(error_chain(exc))
    for e in chain:
        names = _class_names(e)
        if any(name == "OutOfMemoryError" and module.startswith("ray") for module, name in names):
            return (f"Ray stopped a task for lack of memory ({_one_line(e)}); use fewer --workers, a larger memory "
                    "budget per worker (more memory per node) or smaller shards (--shard-size)")
        if any(name == "OutOfMemoryError" for _, name in names):  # torch / cupy: GPU memory
            return f"out of GPU memory ({_one_line(e)}); {memory_hint(command)}"
    for e in chain:
        cpu_alloc = isinstance(e, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(e)
        if isinstance(e, MemoryError) or cpu_alloc:
            free = available_memory()
            have = f"; {format_bytes(free)} available" if free is not None else ""
            return f"out of memory ({_one_line(e)}{have}); {memory_hint(command)}"
    found = os_error_kind(exc)
    if found is not None:
        kind, path = found
        flag = _flag_of(path, args) if path else _output_flag(args)
        name = flag[0] if flag else "location"
        reading = flag is not None and flag[0] not in dict(_OUTPUT_FLAGS).values()
        advice = {
            "space": "free space and run again (the previous outputs are kept)",
            "read-only": f"use a {name} on a writable file system",
            "permission": (f"this user cannot read it; fix its permissions or choose another {name}" if reading
                           else f"use a {name} this user can write to"),
            "not-a-folder": f"choose another {name} or move the file away",
            "exists": f"choose another {name} or move the file away",
            "file-in-the-way": f"choose another {name} or move the file away",
            "is-a-folder": f"give a file for {name}, not a folder",
        }
        where = f"{flag[0]} {flag[1]}" if flag and not path else None
        return describe_os_error(exc, advice=advice, where=where, show=lambda p: _shown_path(p, flag))
    for e in chain:
        if isinstance(e, OSError) and e.errno is not None and not isinstance(e, BrokenPipeError):
            where = getattr(e, "filename", None)
            return f"{where}: {e.strerror or _one_line(e)}" if where else _one_line(e)
    return None


