"""Exceptions with one-line, user-facing messages.

Every error a user can cause by their input is a :class:`PosstatsError`; the CLI prints
``posstats: error: <message>`` and exits with status 2, with no traceback. Messages name
the file, the row and the offending value whenever they are known.
"""

from __future__ import annotations

__all__ = ["InputError", "PosstatsError"]


class PosstatsError(Exception):
    """Base class for errors caused by the user's input or configuration."""


class InputError(PosstatsError, ValueError):
    """Bad input data: a missing file or column, a corrupt file, an out-of-range token id."""
