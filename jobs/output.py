"""What a command prints, the same for every subcommand: ``-q``, ``-v`` and ``--json``,
declared once here, and a parser whose errors say "did you mean".

- ``-q/--quiet``: no progress bars and nothing on stdout; warnings and errors still print
  (stderr).
- ``-v/--verbose``: also the command's seconds and peak memory on stderr (``run`` and
  ``analyze`` add the seconds of every step).
- ``--json`` (commands with a result): stdout holds exactly one JSON document, the
  command's result; everything a person would read moves to stderr.

:func:`routed_stdout` applies them around a command (:func:`posstats.jobs.guard.run_guarded`
does, for every entrypoint); a command hands its result to :func:`print_json`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import resource
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

from posstats.errors import did_you_mean
from posstats.memory import format_bytes
from posstats.progress import set_quiet
from posstats.storage import jsontext

__all__ = ["CONFIG_NAMES", "OPTION_FLAGS", "ArgumentParser", "add_output_args", "peak_rss_bytes", "print_json", "routed_stdout"]

OPTION_FLAGS = "option_flags"  # the parsed namespace's {parameter name: flag} (ArgumentParser)
CONFIG_NAMES = "config_names"  # {parameter name: "[table] key"} of a command configured by a pipeline TOML

# the stdout a --json document goes to while the command's own prints go to stderr
_JSON_STREAM: list[IO[str]] = []


def add_output_args(parser: argparse.ArgumentParser, *, json_result: str | None) -> None:
    """``-q``, ``-v`` and, when the command has a result (``json_result`` names it), ``--json``."""
    g = parser.add_argument_group("output on the terminal")
    if json_result is not None:
        g.add_argument("--json", action="store_true",
                       help=f"print {json_result} on stdout as one JSON document (everything else goes to stderr)")
    g.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bars and nothing on stdout (warnings and errors still print, on stderr)")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="also print the command's seconds and peak memory on stderr")


@contextlib.contextmanager
def routed_stdout(args: argparse.Namespace, /) -> Iterator[None]:
    """Apply ``-q`` / ``--json`` / ``-v`` around a command: with ``--json`` stdout is kept for
    :func:`print_json` and prints go to stderr; with ``-q`` prints are dropped and progress
    bars are off; with ``-v`` the seconds and peak memory are printed at the end."""
    started = time.perf_counter()
    as_json, quiet = bool(getattr(args, "json", False)), bool(getattr(args, "quiet", False))
    with contextlib.ExitStack() as stack:
        if quiet:
            stack.callback(set_quiet, set_quiet(True))
        if as_json:
            _JSON_STREAM.append(sys.stdout)
            stack.callback(_JSON_STREAM.pop)
            stack.enter_context(contextlib.redirect_stdout(sys.stderr))
        elif quiet:
            stack.enter_context(contextlib.redirect_stdout(stack.enter_context(open(os.devnull, "w"))))
        try:
            yield
        finally:
            if getattr(args, "verbose", False):
                print(f"posstats: {getattr(args, 'command', None) or 'command'} took "
                      f"{time.perf_counter() - started:.2f} s, peak memory {format_bytes(peak_rss_bytes())}",
                      file=sys.stderr)


def print_json(args: argparse.Namespace, document: Any, /, *, indent: int | None = None) -> None:
    """Write ``document`` as the command's JSON result when ``--json`` was given (standard
    JSON, never NaN: :mod:`posstats.storage.jsontext`); nothing otherwise."""
    if not getattr(args, "json", False):
        return
    stream = _JSON_STREAM[-1] if _JSON_STREAM else sys.stdout
    stream.write(jsontext.dumps(document, indent=indent))
    stream.write("\n")
    stream.flush()


def peak_rss_bytes() -> int:
    """The process's peak resident memory in bytes (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors name the closest flag, subcommand or choice.

    ``posstats count --positons 8`` -> ``unrecognized arguments: --positons (did you mean
    '--positions'?)``; ``posstats cuont`` -> ``invalid choice: 'cuont' (did you mean
    'count'?) ...``. Subparsers made from it are of this class too."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._given = list(sys.argv[1:] if args is None else args)
        parsed, extras = super().parse_known_args(args, namespace)
        # parameter name -> flag, so that an OptionError names this command's flags
        flags = dict(getattr(parsed, OPTION_FLAGS, None) or {})
        flags.update({a.dest: max(a.option_strings, key=len) for a in self._actions
                      if a.option_strings and a.dest not in ("help", "version")})
        setattr(parsed, OPTION_FLAGS, flags)
        return parsed, extras

    def error(self, message: str) -> Any:  # type: ignore[override]
        super().error(message + self._hint(message))

    def _hint(self, message: str) -> str:
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            return did_you_mean(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
        hints = [(flag, did_you_mean(flag, self._known_flags())) for flag in self._unknown_flags()]
        hints = [(flag, hint) for flag, hint in hints if hint]
        if len(hints) == 1 and message.startswith("unrecognized arguments"):
            return hints[0][1]
        return "".join(f"; {flag}{hint}" for flag, hint in hints)

    def _known_flags(self) -> list[str]:
        """Every option string of this parser and of the subcommand named in its arguments."""
        flags = list(self._option_string_actions)
        given = set(getattr(self, "_given", []))
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    if name in given:
                        flags += list(sub._option_string_actions)
        return flags

    def _unknown_flags(self) -> list[str]:
        known = self._known_flags()
        found = []
        for arg in getattr(self, "_given", []):
            flag = arg.split("=", 1)[0]
            if flag.startswith("--") and len(flag) > 2 and not any(k.startswith(flag) for k in known):
                found.append(flag)
        return found
