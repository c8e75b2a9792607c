"""The analysis report, typed: what :meth:`posstats.analysis.Analysis.report` returns.

``report.json`` is :meth:`Report.to_dict` written as JSON, and :meth:`Report.from_dict` reads
it back (``Report.from_dict(r.to_dict()) == r``, key order kept). The sections a model team
reads are typed (:class:`~posstats.estimates.verdict.Verdict`, :class:`CorpusSummary`,
:class:`PositionsSummary`, :class:`SpectrumSummary`, :class:`EncodingScore`); the method
sections (``noise``, ``null``, ``homogeneity``, ``geometry``, ``held_out``, ...) stay
JSON objects in :attr:`Report.sections`, each documented in docs/report.md.

A report is also a read-only mapping of its JSON document (``report["verdict"]["structure"]``),
so code written against report.json reads an analysis the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from posstats.estimates.verdict import Verdict
from posstats.geometry.encodings import family_of

__all__ = ["CorpusSummary", "EncodingScore", "PositionsSummary", "Report", "SpectrumSummary"]


def _rest(doc: Mapping[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    """The keys of ``doc`` outside ``known``, in order."""
    return {k: v for k, v in doc.items() if k not in known}


@dataclass(frozen=True)
class CorpusSummary:
    """``report.json``'s ``corpus``: what was counted.

    Attributes:
        sequences, windows, tokens_counted: totals of the count.
        vocab_size: V. mode: ``truncate``, ``pack`` or ``chunk``.
        exclude_ids, separator_id: the counting spec.
        fingerprint: the counts' fingerprint.
        metadata: the counts' metadata (tokenizer, inputs, ...), written after the fields.
    """

    sequences: int
    windows: int
    tokens_counted: int
    vocab_size: int
    mode: str
    exclude_ids: tuple[int, ...]
    separator_id: int | None
    fingerprint: str
    metadata: dict[str, Any] = field(default_factory=dict)

    _KEYS = ("sequences", "windows", "tokens_counted", "vocab_size", "mode", "exclude_ids", "separator_id", "fingerprint")

    def to_dict(self) -> dict[str, Any]:
        return {"sequences": self.sequences, "windows": self.windows, "tokens_counted": self.tokens_counted,
                "vocab_size": self.vocab_size, "mode": self.mode, "exclude_ids": list(self.exclude_ids),
                "separator_id": self.separator_id, "fingerprint": self.fingerprint, **self.metadata}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], /) -> CorpusSummary:
        return cls(int(doc["sequences"]), int(doc["windows"]), int(doc["tokens_counted"]), int(doc["vocab_size"]),
                   str(doc["mode"]), tuple(doc.get("exclude_ids") or ()), doc.get("separator_id"),
                   str(doc.get("fingerprint") or ""), _rest(doc, cls._KEYS))


@dataclass(frozen=True)
class PositionsSummary:
    """``report.json``'s ``positions``: which positions were counted and used.

    Attributes:
        requested: n. occupied: positions holding a token. used: rows of the geometry.
        min_occupancy: the option. occupancy: (n,) tokens at each position.
        left_out: positions below ``min_occupancy``. occupancy_summary: min, median, max.
        extra: further keys, written after the fields.
    """

    requested: int
    occupied: int
    used: int
    min_occupancy: int
    occupancy: tuple[int, ...]
    left_out: tuple[int, ...]
    occupancy_summary: dict[str, float]
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS = ("requested", "occupied", "used", "min_occupancy", "occupancy", "left_out", "occupancy_summary")

    def to_dict(self) -> dict[str, Any]:
        return {"requested": self.requested, "occupied": self.occupied, "used": self.used,
                "min_occupancy": self.min_occupancy, "occupancy": list(self.occupancy), "left_out": list(self.left_out),
                "occupancy_summary": dict(self.occupancy_summary), **self.extra}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], /) -> PositionsSummary:
        return cls(int(doc["requested"]), int(doc["occupied"]), int(doc["used"]), int(doc["min_occupancy"]),
                   tuple(doc.get("occupancy") or ()), tuple(doc.get("left_out") or ()),
                   dict(doc.get("occupancy_summary") or {}), _rest(doc, cls._KEYS))


@dataclass(frozen=True)
class SpectrumSummary:
    """``report.json``'s ``spectrum``: the MDS eigenvalues and what they explain
    (:class:`posstats.geometry.spectrum.Spectrum`).

    Attributes:
        eigenvalues: descending eigenvalues of B (the top k on the long-context path).
        rank: numerical rank at ``rank_rtol``. explained_variance: cumulative shares.
        components_for: components for 90 / 95 / 99 / 99.9 % of the variance.
        negative_mass: share of |eigenvalues| that is negative. total_variance: trace(B).
        denominator: what the explained shares are of.
        solver: the solver's facts (method, solver_tol, max_residual, noise_level, ...)
            and ``components_above_null``, written after the fields.
    """

    eigenvalues: tuple[float, ...]
    rank: int
    rank_rtol: float
    explained_variance: tuple[float, ...]
    components_for: dict[str, int | None]
    negative_mass: float
    total_variance: float
    denominator: str
    solver: dict[str, Any] = field(default_factory=dict)

    _KEYS = ("eigenvalues", "rank", "rank_rtol", "explained_variance", "components_for", "negative_mass",
             "total_variance", "denominator")

    def to_dict(self) -> dict[str, Any]:
        return {"eigenvalues": list(self.eigenvalues), "rank": self.rank, "rank_rtol": self.rank_rtol,
                "explained_variance": list(self.explained_variance), "components_for": dict(self.components_for),
                "negative_mass": self.negative_mass, "total_variance": self.total_variance,
                "denominator": self.denominator, **self.solver}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], /) -> SpectrumSummary:
        return cls(tuple(doc.get("eigenvalues") or ()), int(doc.get("rank") or 0), float(doc.get("rank_rtol") or 0.0),
                   tuple(doc.get("explained_variance") or ()), dict(doc.get("components_for") or {}),
                   float(doc.get("negative_mass") or 0.0), float(doc.get("total_variance") or 0.0),
                   str(doc.get("denominator") or ""), _rest(doc, cls._KEYS))


@dataclass(frozen=True)
class EncodingScore:
    """One entry of ``report.json``'s ``encodings``: an encoding at a width against the
    corpus geometry (THEORY.md section 5).

    Attributes:
        name: the encoding spec (``sinusoidal``, ``rope:base=500000``, ``mds``, ...).
        dim: its width d.
        stress: raw stress. scaled_stress: stress after the optimal scale (comparable
            across encodings and widths).
        details: the rest of the entry (scale, pearson, min separation, monotonicity,
            intervals, the stress method, ...), written after the fields; the intervals
            the verdict compares are also properties.
    """

    name: str
    dim: int
    stress: float
    scaled_stress: float
    details: dict[str, Any] = field(default_factory=dict)

    _KEYS = ("name", "dim", "stress", "scaled_stress")

    @property
    def scaled_stress_ci95(self) -> tuple[float, float] | None:
        """The 95 % interval of the scaled stress, or None where the report gives none."""
        ci = self.details.get("scaled_stress_ci95")
        return None if ci is None else (float(ci[0]), float(ci[1]))

    @property
    def fitted(self) -> bool:
        """Whether the encoding is fitted to the counts (MDS and its variants)."""
        return bool(family_of(self.name).fitted)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dim": self.dim, "stress": self.stress, "scaled_stress": self.scaled_stress,
                **self.details}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], /) -> EncodingScore:
        return cls(str(doc["name"]), int(doc["dim"]), float(doc["stress"]), float(doc["scaled_stress"]),
                   _rest(doc, cls._KEYS))


@dataclass(frozen=True, eq=True)
class Report(Mapping[str, Any]):
    """An analysis' report (module docstring).

    Attributes:
        verdict: the decisions (:class:`~posstats.estimates.verdict.Verdict`).
        schema_version: of report.json. tool: name and version. created: ISO time.
        config: the options (:meth:`posstats.analysis.AnalysisConfig.to_dict`).
        corpus, positions, spectrum: typed sections. hellinger, diagnostics: the distance
            summary and the corpus diagnostics (H1, A3), JSON objects.
        encodings: one score per (width, encoding).
        timings_s: seconds per step.
        sections: the method sections after those, by name, in report order.
    """

    verdict: Verdict
    schema_version: int
    tool: dict[str, str]
    created: str
    config: dict[str, Any]
    corpus: CorpusSummary
    positions: PositionsSummary
    hellinger: dict[str, Any]
    diagnostics: dict[str, Any]
    spectrum: SpectrumSummary
    encodings: tuple[EncodingScore, ...]
    timings_s: dict[str, float]
    sections: dict[str, Any] = field(default_factory=dict)

    _KEYS = ("verdict", "schema_version", "tool", "created", "config", "corpus", "positions", "hellinger",
             "diagnostics", "spectrum", "encodings", "timings_s")

    def to_dict(self) -> dict[str, Any]:
        """The ``report.json`` document: a new dict (nested JSON objects are shared)."""
        return {"verdict": self.verdict.to_dict(), "schema_version": self.schema_version, "tool": self.tool,
                "created": self.created, "config": self.config, "corpus": self.corpus.to_dict(),
                "positions": self.positions.to_dict(), "hellinger": self.hellinger, "diagnostics": self.diagnostics,
                "spectrum": self.spectrum.to_dict(), "encodings": [e.to_dict() for e in self.encodings],
                "timings_s": self.timings_s, **self.sections}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], /) -> Report:
        """A report read back from ``report.json``."""
        return cls(Verdict.from_dict(doc.get("verdict") or {}), int(doc.get("schema_version") or 0),
                   dict(doc.get("tool") or {}), str(doc.get("created") or ""), dict(doc.get("config") or {}),
                   CorpusSummary.from_dict(doc["corpus"]), PositionsSummary.from_dict(doc["positions"]),
                   dict(doc.get("hellinger") or {}), dict(doc.get("diagnostics") or {}),
                   SpectrumSummary.from_dict(doc.get("spectrum") or {}),
                   tuple(EncodingScore.from_dict(e) for e in doc.get("encodings") or ()),
                   dict(doc.get("timings_s") or {}), _rest(doc, cls._KEYS))

    @cached_property
    def _document(self) -> dict[str, Any]:
        return self.to_dict()

    def __getitem__(self, key: str) -> Any:
        return self._document[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._document)

    def __len__(self) -> int:
        return len(self._document)
