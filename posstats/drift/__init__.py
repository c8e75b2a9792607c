"""Corpus drift: what changed between two corpora or two refreshes, separated from sampling
noise (``posstats diff``; docs/drift.md)."""

from posstats.drift.compare import DIFF_SCHEMA_VERSION, DiffResult, diff, headline
from posstats.drift.report import format_diff_summary, write_diff, write_skipped
from posstats.drift.sides import (
    Side,
    check_comparable,
    load_side,
    store_run_side,
    store_sides,
)

__all__ = [
    "DIFF_SCHEMA_VERSION",
    "DiffResult",
    "Side",
    "check_comparable",
    "diff",
    "format_diff_summary",
    "headline",
    "load_side",
    "store_run_side",
    "store_sides",
    "write_diff",
    "write_skipped",
]
