"""The analysis: counts -> Hellinger geometry -> MDS -> encodings -> report.

:func:`analyze` ties the single-concept modules together and returns an :class:`Analysis`
whose :meth:`Analysis.report` is the ``report.json`` document (schema in docs/report.md).

Modules, in the order they build on one another:

- ``config``: :class:`AnalysisConfig`, the options, and which encodings are scored;
- ``sections``, ``result``: the report's sections and :class:`Analysis`;
- ``rows``: the positions used, their noise floor and the standout test;
- ``null``: the rank test (components above noise);
- ``scoring``, ``exact``, ``sampled``: the geometry and every encoding's stress, on all
  pairs or on sampled ones;
- ``intervals``, ``held_out``: the intervals on the stresses and the held-out scores;
- ``budget``: memory budgets and refusals of the ranged analysis;
- ``pipeline``: :func:`analyze`, :func:`analyze_ranges`, :func:`analyze_in_ranges`.
"""

from posstats.analysis.budget import (
    budgeted_stored_counts,
    halves_reader,
    halves_starter,
    ranges_refusal,
    stored_with_halves,
)
from posstats.analysis.config import (
    DEFAULT_DIMS,
    DEVICES,
    DISTANCE_MATRICES,
    MDS_METHODS,
    NOISE_FLOOR_CHOICES,
    NULL_CHOICES,
    AnalysisConfig,
    encoding_jobs,
    skipped_encodings,
)
from posstats.analysis.intervals import JACKKNIFE_NOISE_LIMIT
from posstats.analysis.null import HALVES_MIN_COVERAGE, halves_unusable
from posstats.analysis.pipeline import analyze, analyze_in_ranges, analyze_ranges
from posstats.analysis.result import SCHEMA_VERSION, Analysis
from posstats.analysis.sampled import mds_device

__all__ = [
    "DEFAULT_DIMS", "DEVICES", "DISTANCE_MATRICES", "HALVES_MIN_COVERAGE", "JACKKNIFE_NOISE_LIMIT", "MDS_METHODS",
    "NOISE_FLOOR_CHOICES", "NULL_CHOICES", "SCHEMA_VERSION", "Analysis", "AnalysisConfig", "analyze",
    "analyze_in_ranges", "analyze_ranges", "budgeted_stored_counts", "encoding_jobs", "halves_reader", "halves_starter",
    "halves_unusable", "mds_device", "ranges_refusal", "skipped_encodings", "stored_with_halves",
]
