"""Exceptions with one-line, user-facing messages.

Every error a user can cause by their input is a :class:`PosstatsError`; the CLI prints
``posstats: error: <message>`` and exits with status 2, with no traceback. Messages name
the file, the row and the offending value whenever they are known.

Failures of the environment (a full disk, a read-only or forbidden folder, a file where a
folder is needed) are explained by :func:`describe_os_error`, which the CLI uses for any
``OSError`` (or an error wrapping one) that reaches it.
"""

from __future__ import annotations

import difflib
import errno
import os
import re
from collections.abc import Callable, Iterable, Mapping

__all__ = [
    "InputError",
    "OptionError",
    "PosstatsError",
    "PosstatsWarning",
    "describe_os_error",
    "did_you_mean",
    "error_chain",
    "os_error_kind",
]


class PosstatsError(Exception):
    """Base class for errors caused by the user's input or configuration."""


class InputError(PosstatsError, ValueError):
    """Bad input data: a missing file or column, a corrupt file, an out-of-range token id."""


class OptionError(InputError):
    """A bad option value (an :class:`InputError`), in a message that names options by parameter name, written
    ``{name}``: ``OptionError("give at least one width ({dims})")``.

    ``str()`` names the parameters as the Python API spells them (``dims``); :meth:`naming`
    names them as the caller's interface does: the command line its flags (``--dims``,
    :func:`posstats.jobs.guard.run_guarded`), the pipeline its keys (``[geometry] dims``).
    So the library never names a flag, and every interface names its own.
    """

    def __init__(self, template: str, /) -> None:
        self.template = template
        super().__init__(self.naming({}))

    def naming(self, names: Mapping[str, str], /) -> str:
        """The message with each ``{name}`` replaced by ``names[name]`` (else ``name``)."""
        return _OPTION_NAME.sub(lambda m: names.get(m.group(1), m.group(1)), self.template)


_OPTION_NAME = re.compile(r"\{([a-z][a-z0-9_]*)\}")


def did_you_mean(name: str, options: Iterable[str], /) -> str:
    """`` (did you mean 'x'?)`` for the option closest to a mistyped ``name``, else ``""``:
    the one hint every "unknown ..." message (flag, subcommand, encoding, config key) appends.

    >>> did_you_mean("sinusodial", ["mds", "sinusoidal", "rope"])
    " (did you mean 'sinusoidal'?)"
    """
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class PosstatsWarning(UserWarning):
    """Something a user should know that does not stop the command (duplicate inputs
    dropped, a value replaced); the CLI prints ``posstats: warning: <message>``."""


# kind -> what happened, in words. The kinds are what callers attach advice to.
_KIND_TEXT = {
    "space": "no space left on the device (file system full or quota exceeded)",
    "read-only": "read-only file system",
    "permission": "permission denied",
    "not-a-folder": "not a folder (a file is in the way where a folder is needed)",
    "is-a-folder": "is a folder, not a file",
    "exists": "already exists",
    "file-in-the-way": "is a file where a folder is needed",
}
_ERRNO_KIND = {
    errno.ENOSPC: "space",
    errno.EDQUOT: "space",
    errno.EROFS: "read-only",
    errno.EACCES: "permission",
    errno.EPERM: "permission",
    errno.ENOTDIR: "not-a-folder",
    errno.EISDIR: "is-a-folder",
    errno.EEXIST: "exists",
}
# Libraries that wrap an OS error in their own exception (safetensors, pyarrow, Ray task
# errors) keep the C library's text; recognised when no errno is attached.
_TEXT_KIND = (
    ("No space left on device", "space"),
    ("Disk quota exceeded", "space"),
    ("Read-only file system", "read-only"),
    ("Permission denied", "permission"),
    ("Not a directory", "not-a-folder"),
    ("Is a directory", "is-a-folder"),
)


def error_chain(exc: BaseException):
    """``exc`` and the errors it wraps (``cause`` of Ray task errors, ``__cause__``, ``__context__``)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        nxt = getattr(e, "cause", None)
        e = nxt if isinstance(nxt, BaseException) else (e.__cause__ or e.__context__)


def os_error_kind(exc: BaseException, /) -> tuple[str, str | None] | None:
    """``(kind, path or None)`` of the first storage failure in ``exc``'s chain, or None.

    Kinds: ``space`` (ENOSPC, EDQUOT), ``read-only`` (EROFS), ``permission`` (EACCES,
    EPERM), ``not-a-folder`` (ENOTDIR), ``is-a-folder`` (EISDIR), ``exists`` (EEXIST).
    """
    for e in error_chain(exc):
        code = getattr(e, "errno", None)
        kind = _ERRNO_KIND.get(code) if isinstance(code, int) else None
        if kind is None and isinstance(e, PermissionError):
            kind = "permission"
        if kind is None:
            text = str(e)
            kind = next((k for needle, k in _TEXT_KIND if needle in text), None)
        if kind is not None:
            where = getattr(e, "filename", None)
            return kind, (str(where) if where else None)
    return None


def _file_in_the_way(path: str) -> str | None:
    """The nearest of ``path`` and its parents that exists and is not a folder, or None."""
    current = os.path.abspath(path)
    while True:
        if os.path.lexists(current) and not os.path.isdir(current):
            return current if os.path.isabs(path) else os.path.relpath(current)
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def describe_os_error(exc: BaseException, /, *, advice: Mapping[str, str] | None = None,
                      where: str | None = None, show: Callable[[str], str] | None = None) -> str | None:
    """A one-line explanation of a storage failure users must act on, or None for other errors.

    Looks through wrapped causes. The line is ``"<path>: <what happened>; <advice>"``: the
    path is the failing file when the error names one, else ``where``; ``advice`` maps a
    kind (see :func:`os_error_kind`) to what to do about it. For ENOTDIR / EEXIST the path
    named is the file in the way (``OUT`` itself, or a parent of it that is a file).
    ``show`` rewrites the path for the message (e.g. an output's staging file as the
    output folder the user named).

    >>> describe_os_error(OSError(30, "Read-only file system", "/s/lock"))
    '/s/lock: read-only file system'
    """
    found = os_error_kind(exc)
    if found is None:
        return None
    kind, path = found
    if kind in ("not-a-folder", "exists") and path:
        blocker = _file_in_the_way(path)
        if blocker is not None:
            path, kind = blocker, "file-in-the-way"
    if path and show is not None:
        path = show(path)
    path = path or where
    text = f"{path}: {_KIND_TEXT[kind]}" if path else _KIND_TEXT[kind]
    extra = (advice or {}).get(kind)
    return f"{text}; {extra}" if extra else text
