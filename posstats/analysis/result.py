""":class:`Analysis`, the result of :func:`~posstats.analysis.analyze`, and its
:meth:`Analysis.report`, the ``report.json`` document (schema in docs/report.md).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from posstats import __version__
from posstats.analysis.config import AnalysisConfig
from posstats.analysis.sections import _corpus_entry, _hellinger_entry, _positions_entry, _spectrum_entry
from posstats.counting.counts import PositionalCounts
from posstats.estimates.verdict import Verdict, verdict
from posstats.geometry.mds import MDSResult
from posstats.report import Report

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Analysis:
    """Everything :func:`analyze` computed.

    Attributes:
        counts: the input counts.
        config: the options used.
        positions: (m,) 0-based occupied positions that entered the geometry (with
            buckets: the midpoints of the buckets used).
        distances: (m, m) Hellinger distances d_H between those positions (the matrix the
            encodings used: plug-in or bias-corrected), or None above ``exact_limit``.
        mds: the classical-MDS result for those positions.
        diagnostics: corpus diagnostics (H1, A3) as a JSON-ready dict.
        encodings: one JSON-ready dict per (dimension, encoding).
        timings: seconds per step.
        sections: further report sections (geometry, noise, null, buckets).
        hellinger_summary: the ``hellinger`` report entry when it is not computed from
            ``distances`` (sampled path, bias-corrected distances).
        standout: the positions that stand out from the pooled distribution
            (:func:`posstats.estimates.standout.standout_positions`).
        occupancy: (n,) tokens at every position, when ``counts`` holds only the header
            (:func:`analyze_ranges`); None: ``counts.occupancy()``.
        counts_source: the counts file the ranges were read from (:func:`analyze_ranges`),
            where a run reads the rows it needs later (the report's distance sample).
        weighted_encoding: (m, k) the occupancy-weighted MDS coordinates of the k components
            the occupancy-weighted rank test counted
            (:func:`posstats.geometry.mds.weighted_coordinates`), where occupancies differ
            and it counted any; else None. ``posstats export`` writes them where the
            unweighted MDS's leading components load on thinly occupied positions.
    """

    counts: PositionalCounts
    config: AnalysisConfig
    positions: np.ndarray
    distances: np.ndarray | None
    mds: MDSResult
    diagnostics: dict[str, Any]
    encodings: list[dict[str, Any]]
    timings: dict[str, float] = field(default_factory=dict)
    sections: dict[str, Any] = field(default_factory=dict)
    hellinger_summary: dict[str, Any] | None = None
    standout: dict[str, Any] | None = None
    occupancy: np.ndarray | None = None
    counts_source: str | None = None
    weighted_encoding: np.ndarray | None = None

    def report(self) -> Report:
        """The report (:class:`posstats.report.Report`; ``report.json`` is its
        :meth:`~posstats.report.Report.to_dict`, documented in docs/report.md)."""
        report = {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "posstats", "version": __version__},
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "config": self.config.to_dict(),
            "corpus": _corpus_entry(self.counts),
            "positions": _positions_entry(self.counts.positions,
                                          self.counts.occupancy() if self.occupancy is None else self.occupancy,
                                          used=len(self.positions), min_occupancy=self.config.min_occupancy),
            "hellinger": self.hellinger_summary if self.hellinger_summary is not None else _hellinger_entry(self.distances),
            "diagnostics": self.diagnostics,
            "spectrum": _spectrum_entry(self.mds, rtol=self.config.rank_rtol, null=self.sections.get("null")),
            "encodings": self.encodings,
            "timings_s": {k: round(v, 4) for k, v in self.timings.items()},
        }
        report.update({k: v for k, v in self.sections.items() if k not in report})
        report["diagnostics"]["h1"]["distances"] = report["geometry"]["distances"] if "geometry" in report else "plugin"
        answer = verdict(report, self.standout)
        report["diagnostics"]["h1"].update(nonstationary=answer.non_stationary, test=answer.non_stationary_test)
        return dataclasses.replace(Report.from_dict({"verdict": answer.to_dict(), **report}), verdict=answer)

    def verdict(self) -> Verdict:
        """The report's decisions, typed (:class:`posstats.estimates.verdict.Verdict`):
        ``analysis.verdict().components_above_noise``; ``report()["verdict"]`` is its JSON."""
        return self.report().verdict
