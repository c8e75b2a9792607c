"""The analysis flags shared by ``posstats analyze`` and ``posstats run`` (the input and
counting flags, shared with the job entrypoints too, are in :mod:`posstats.jobs.flags`)."""

from __future__ import annotations

import argparse
import sys

from posstats.analysis import AnalysisConfig
from posstats.jobs.flags import add_options, options_from_args
from posstats.jobs.output import print_json
from posstats.reports.summary import format_summary

__all__ = ["add_analysis_args", "analysis_config", "print_report"]


def add_analysis_args(parser: argparse.ArgumentParser) -> None:
    """The analysis flags of ``analyze`` / ``run`` / ``diff``: one per option of
    :class:`AnalysisConfig` (declared there once, with help, choices and defaults)."""
    add_options(parser, AnalysisConfig)


def analysis_config(args: argparse.Namespace) -> AnalysisConfig:
    """An :class:`AnalysisConfig` from parsed analysis flags (the tokenizer only where a
    corpus is re-read: ``--reread``)."""
    tokenizer = getattr(args, "tokenizer", None) if getattr(args, "reread", False) else None
    return options_from_args(AnalysisConfig, args, tokenizer=tokenizer)


def print_report(report: dict, args: argparse.Namespace, *, out: str) -> None:
    """What ``run`` / ``analyze`` print: the summary, or report.json (``--json``); with ``-v``
    the seconds of every step on stderr (``-q`` drops the summary: :mod:`posstats.jobs.output`)."""
    if args.json:
        print_json(args, report)
    else:
        print(format_summary(report))
        print(f"\nreport: {out}/report.html (summary.md, report.json)")
    if args.verbose:
        steps = report.get("timings_s") or {}
        print("seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in steps.items()), file=sys.stderr)
