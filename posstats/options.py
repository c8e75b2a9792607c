"""Options declared once: a dataclass field with its help, choices, bounds and unit, from
which the command line, the pipeline's TOML schema and ``to_dict`` are generated.

An options dataclass (:class:`posstats.analysis.AnalysisConfig`,
:class:`posstats.reports.export.ExportOptions`, :class:`posstats.corpus.inputs.InputOptions`,
:class:`posstats.corpus.inputs.CountOptions`) writes each option as::

    null_replicates: int = option(39, help="shuffled null corpora ...", metavar="R", minimum=1)

- the command line (:func:`posstats.jobs.flags.add_options`) gets ``--null-replicates R``
  (``int``, default 39, the help with its default);
- the pipeline's ``[geometry]`` table (:data:`posstats.service.config.SCHEMA`) gets
  ``null_replicates`` (kind ``int``, the same default, bound and help);
- :func:`option_values` gives the dict written to ``analysis-config.json``.

The kind of an option follows its annotation: ``int``, ``float``, ``str`` (a ``Literal``
of strings: the choices), ``bool`` (a switch: ``--name`` turns on what is off by default,
``--no-name`` turns off what is on), ``tuple[int, ...]`` (``int_list``), ``tuple[str, ...]``
(``str_list``); ``X | None`` is nullable. Pure: no argparse, no TOML here.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["SAME", "Declared", "Option", "declared_options", "first_problem", "option", "option_values"]

SAME = "same"  # Option.config_default: the TOML default is the dataclass's


@dataclass(frozen=True)
class Option:
    """What one option says about itself (the metadata of its dataclass field).

    Attributes:
        help: one sentence; the default is appended where it is shown.
        group: the heading it is listed under on ``--help``.
        metavar: the value's name on ``--help`` (default: the kind's).
        minimum: the smallest value allowed (``strict``: values must exceed it).
        maximum: the largest value allowed (a config value that sets a loop count is bounded).
        unit: what the number counts (``positions``, ``GiB``), shown in the help.
        const: the value of the bare flag (``--noise-floor`` alone means ``on``).
        parse: the command line's parser of the text (default: the kind's).
        cli, pipeline: on the command line / in the pipeline's TOML; ``why_not`` says why
            an option is left out of one.
        config_default: the TOML default when it differs from the dataclass's (None: "the
            library's default", for a long list).
        flag: the command line's name when it is not ``--name-with-dashes`` (``--dataset``).
        repeat: the flag is given once per value of a list (``--dataset a --dataset b``).
        key: the config's name when it is not the field's (``memory_budget_gib``).
        config_kind: the config's kind when it says more than the annotation (``url``: a
            path read relative to the config file, or a URL).
        limit: refuses work, or decides where it runs, but never changes a result: left out
            of the result's record (``to_dict``) and of the pipeline's result key.
    """

    help: str
    group: str = "analysis"
    metavar: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    strict: bool = False
    unit: str | None = None
    const: Any = None
    parse: Callable[[str], Any] | None = None
    cli: bool = True
    pipeline: bool = True
    why_not: str = ""
    config_default: Any = SAME
    limit: bool = False
    flag: str | None = None
    repeat: bool = False
    key: str | None = None
    config_kind: str | None = None


@dataclass(frozen=True)
class Declared:
    """One declared option of a dataclass: its field name, kind, choices, default, metadata."""

    name: str
    kind: str
    choices: tuple[Any, ...] | None
    nullable: bool
    default: Any
    option: Option

    @property
    def flag(self) -> str:
        """The command line's flag: ``--name-with-dashes``, ``--no-name`` for a switch that is
        on by default, or the declared one."""
        if self.option.flag:
            return self.option.flag
        return ("--no-" if self.kind == "bool" and self.default else "--") + self.name.replace("_", "-")

    def check(self, value: Any) -> str | None:
        """An error text for a value of the right kind that the option refuses, else None."""
        if value is None:
            return None if self.nullable else "must be given"
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(map(str, self.choices))}"
        hi = self.option.maximum
        if hi is not None and not self.kind.endswith("_list") and value > hi:
            return f"must be <= {hi:g}"
        lo = self.option.minimum
        if lo is None:
            return None
        rule = f"{'>' if self.option.strict else '>='} {lo:g}"
        if not self.kind.endswith("_list"):
            return f"must be {rule}" if ((value <= lo) if self.option.strict else (value < lo)) else None
        if not value:
            return "must not be empty"
        bad = [v for v in value if ((v <= lo) if self.option.strict else (v < lo))]
        return f"must all be {rule} (got {bad[0]})" if bad else None


def option(default: Any, /, *, help: str, **metadata: Any) -> Any:
    """A dataclass field declaring an option (see :class:`Option` for the keywords)."""
    return dataclasses.field(default=default, metadata={"option": Option(help=help, **metadata)})


def _kind(annotation: Any) -> tuple[str, tuple[Any, ...] | None, bool]:
    """(kind, choices, nullable) of a field annotation."""
    nullable = False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(annotation))
        annotation = args[0]
    if typing.get_origin(annotation) is typing.Literal:
        choices = typing.get_args(annotation)
        return {int: "int", str: "str"}[type(choices[0])], tuple(choices), nullable
    if typing.get_origin(annotation) is tuple:
        item = typing.get_args(annotation)[0]
        return {int: "int_list", str: "str_list"}[item], None, nullable
    return {int: "int", float: "float", str: "str", bool: "bool"}[annotation], None, nullable


def declared_options(cls: type) -> list[Declared]:
    """The options ``cls`` declares with :func:`option`, in field order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        opt = f.metadata.get("option")
        if opt is None:
            continue
        kind, choices, nullable = _kind(hints[f.name])
        out.append(Declared(f.name, kind, choices, nullable, f.default, opt))
    return out


def option_values(obj: Any, /, *, limits: bool = True) -> dict[str, Any]:
    """The declared options of a dataclass instance as JSON-ready values (lists, not tuples);
    ``limits=False`` leaves out the options that only refuse work."""
    return {d.name: (list(v) if isinstance(v := getattr(obj, d.name), tuple) else v)
            for d in declared_options(type(obj)) if limits or not d.option.limit}


def first_problem(obj: Any, /) -> str | None:
    """The first declared option of a dataclass instance that breaks its rule (kind of a
    switch, choices, bounds), as an :class:`~posstats.errors.OptionError` template
    (``"{dim} must be >= 1; got 0"``), else None."""
    for d in declared_options(type(obj)):
        value = getattr(obj, d.name)
        wrong = d.check(value) if d.kind != "bool" else (None if isinstance(value, bool) else "must be true or false")
        if wrong:
            return f"{{{d.name}}} {wrong}; got {value!r}"
    return None
