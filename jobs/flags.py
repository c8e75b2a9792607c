"""Command-line flags shared by the ``posstats`` commands and the ``python -m posstats.jobs.*``
entrypoints, and their conversion into the library's keyword options.

argparse only: defining the flags here (not in :mod:`posstats.cli`) lets the job
entrypoints parse the same flags while imports keep pointing one way (cli -> jobs ->
library).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from posstats.corpus.inputs import CountInputs, CountOptions, InputOptions, count_inputs
from posstats.corpus.readers import document_note
from posstats.corpus.remote import MAX_OPTION_DEPTH, check_storage_options, parse_value
from posstats.errors import PosstatsError
from posstats.options import declared_options

__all__ = [
    "add_input_args",
    "add_options",
    "options_from_args",
    "shown_default",
    "add_ray_args",
    "count_inputs_from_args",
    "int_list",
    "storage_options",
    "str_list",
]


def int_list(text: str) -> tuple[int, ...]:
    """Parse ``"1,2,3"`` into a tuple of ints (argparse type)."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        msg = f"expected comma-separated integers, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None


def str_list(text: str) -> tuple[str, ...]:
    """Parse ``"a,b"`` into a tuple of non-empty strings (argparse type)."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


_PARSERS: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str, "int_list": int_list,
                                             "str_list": str_list}


def shown_default(value: Any, /) -> str:
    """A default as a user types it: ``(2, 16, 64)`` -> ``2,16,64``."""
    return ",".join(map(str, value)) if isinstance(value, tuple | list) else f"{value:g}" if isinstance(
        value, float) else str(value)


def add_options(parser: argparse.ArgumentParser, cls: type, /) -> None:
    """One flag per option ``cls`` declares for the command line (:mod:`posstats.options`):
    ``--name-with-dashes``, typed by the option's kind, its choices, default and help
    (the default and unit appended), listed under the option's group."""
    groups = {g.title: g for g in parser._action_groups}
    for d in declared_options(cls):
        opt = d.option
        if not opt.cli:
            continue
        group = groups.get(opt.group) or groups.setdefault(opt.group, parser.add_argument_group(opt.group))
        if d.kind == "bool":  # a switch: the flag flips the default
            group.add_argument(d.flag, dest=d.name, action="store_false" if d.default else "store_true",
                               default=d.default, help=opt.help.replace("%", "%%")
                               if not d.default else f"do not {opt.help}".replace("%", "%%"))
            continue
        if opt.repeat:
            group.add_argument(d.flag, dest=d.name, action="append", default=[], metavar=opt.metavar,
                               help=opt.help.replace("%", "%%"))
            continue
        default = "" if d.default is None else f" (default {shown_default(d.default)}{f' {opt.unit}' if opt.unit else ''})"
        kwargs: dict[str, Any] = {"type": opt.parse or _PARSERS[d.kind], "default": d.default,
                                  "help": (opt.help + default).replace("%", "%%")}
        if d.choices is not None:
            kwargs["choices"] = d.choices
        if opt.metavar is not None:
            kwargs["metavar"] = opt.metavar
        if opt.const is not None:
            kwargs.update(nargs="?", const=opt.const)
        group.add_argument(d.flag, dest=d.name, **kwargs)


def options_from_args(cls: type, args: argparse.Namespace, /, **given: Any) -> Any:
    """``cls(...)`` from the parsed flags of :func:`add_options` (and ``given`` values for the
    options the command line sets otherwise)."""
    values = {d.name: tuple(v) if isinstance(v := getattr(args, d.name), list) else v
              for d in declared_options(cls) if d.option.cli}
    return cls(**{**values, **given})


def storage_options(items: list[str], /) -> dict:
    """``--storage-option a.b=VALUE`` pairs into a nested dict of fsspec options (VALUE in
    TOML syntax, a bare word a string): ``["client_kwargs.endpoint_url=http://h:9000",
    "anon=true"]`` -> ``{"client_kwargs": {"endpoint_url": "http://h:9000"}, "anon": True}``.

    Raises:
        PosstatsError: an item without ``=`` or with an empty key.
    """
    out: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise PosstatsError(f"--storage-option expects KEY=VALUE, got {item[:200]!r}")
        parts = key.split(".")
        if len(parts) > MAX_OPTION_DEPTH or not all(parts):
            raise PosstatsError(f"--storage-option {key[:80]!r}: a dotted key has 1-{MAX_OPTION_DEPTH} non-empty parts")
        node = out
        for i, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                where = ".".join(parts[: i + 1])
                raise PosstatsError(f"--storage-option {key}: {where} was given a value, not a table, before")
        node[parts[-1]] = parse_value(value)
    return check_storage_options(out)


def add_input_args(parser: argparse.ArgumentParser) -> None:
    """The corpus-selection and counting flags of ``count`` / ``run``."""
    g = parser.add_argument_group("input corpus")
    g.add_argument("--input", action="append", required=True, metavar="PATH_OR_GLOB",
                   help="input file, folder (HF dataset) or glob; repeatable. Local, file://, or any fsspec URL "
                        "(s3://bucket/shards/*.parquet, gs://..., hf://datasets/ORG/NAME/data/*.parquet), "
                        "streamed (docs/inputs.md)")
    g.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="fsspec option of URL inputs (VALUE in TOML syntax; dotted keys nest), e.g. "
                        "client_kwargs.endpoint_url=http://127.0.0.1:9000; repeatable. fsspec's own "
                        "FSSPEC_<PROTOCOL>_<OPTION> variables and the cloud credential chains apply too")
    add_options(parser, InputOptions)  # declared once in posstats.corpus.inputs
    add_options(parser, CountOptions)


def print_document_note(args: argparse.Namespace, /) -> None:
    """Say on stderr how text inputs were cut into documents (:func:`document_note`), after
    a count: what a document is decides every count, and the default depends on the suffix."""
    note = document_note(tuple(args.input), format=args.format, document_per=getattr(args, "document_per", None))
    if note:
        print(f"posstats: {note}", file=sys.stderr)


def count_inputs_from_args(args: argparse.Namespace, /) -> CountInputs:
    """:func:`posstats.corpus.inputs.count_inputs` of the flags of :func:`add_input_args`."""
    return count_inputs(tuple(args.input), options_from_args(InputOptions, args), options_from_args(CountOptions, args),
                        storage_options=storage_options(getattr(args, "storage_option", None) or []))


def add_ray_args(parser: argparse.ArgumentParser, *, switch: bool = True) -> None:
    """The ``--ray`` flags (argparse only: nothing here imports ray or jobs)."""
    g = parser.add_argument_group("distributed counting (Ray)")
    if switch:
        g.add_argument("--ray", action="store_true",
                       help="count as a Ray job: shards counted by a pool of actors, partials kept in a "
                            "resumable run store; same output files and counts")
    g.add_argument("--address", metavar="ADDR",
                   help="Ray cluster to join (e.g. 127.0.0.1:6379); default: $RAY_ADDRESS, else an "
                        "embedded local Ray started for this run")
    g.add_argument("--workers", type=int, metavar="K",
                   help="counting actors (default: one per CPU of the Ray cluster)")
    g.add_argument("--store", metavar="DIR",
                   help="run store: per-shard partial counts, markers, manifest, lock (default OUT/store); "
                        "must be on a file system every Ray node sees")
    g.add_argument("--run-id", metavar="ID",
                   help="name of the run; rerunning with the same id resumes it (default: a hash of the "
                        "inputs and the counting options)")
    g.add_argument("--skip-bad-shards", action="store_true",
                   help="record unreadable shards in the run manifest and finish without them "
                        "(default: fail, keeping the finished partials for a rerun)")
    g.add_argument("--dashboard", action="store_true",
                   help="start Ray's dashboard with an embedded Ray and print its URL (about 2 s more start-up "
                        "on a small machine; a cluster joined with --address has its own)")
    g.add_argument("--shard-size", type=float, default=None, metavar="MiB",
                   help="target shard size: uncompressed JSONL / text files larger than this are cut into line "
                        "ranges, consecutive Parquet row groups (uncompressed) joined up to it; HF datasets are "
                        "cut by Arrow file (default: the size the run store recorded at its first run, else two "
                        "to four shards per worker, within 16-256 MiB); smaller shards cost time but give a "
                        "store's noise floor more parts")

