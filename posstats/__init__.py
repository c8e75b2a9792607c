"""posstats: information-optimal positional encodings from corpus statistics.

Positional counts -> Hellinger geometry -> classical MDS -> encodings and stress
(THEORY.md). Public names are re-exported here and imported on first use, so
``import posstats`` stays light and never imports torch, cupy or ray.

>>> import posstats
>>> c = posstats.count_sequences([[1, 2], [1, 3]], positions=2, vocab_size=4)
>>> c.occupancy().tolist()
[2, 2]
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> defining module (one concept per module; see CONTRIBUTING.md)
_EXPORTS: dict[str, str] = {
    # errors and batches
    "PosstatsError": "errors",
    "InputError": "errors",
    "TokenBatch": "corpus.tokens",
    # counting
    "CountSpec": "counting.counts",
    "CountAccumulator": "counting.counts",
    "PositionalCounts": "counting.counts",
    "count": "corpus.any_input",
    "count_sequences": "counting.counts",
    "combine_fingerprints": "counting.counts",
    "save_counts": "counting.io",
    "load_counts": "counting.io",
    "read_token_batches": "corpus.readers",
    "resolve_inputs": "corpus.readers",
    "load_tokenizer": "corpus.tokenizer",
    "CorpusSource": "corpus.source",
    "count_corpus": "corpus.source",
    # geometry
    "sqrt_distributions": "geometry.hellinger",
    "hellinger_sq": "geometry.hellinger",
    "hellinger": "geometry.hellinger",
    "classical_mds": "geometry.mds",
    "MDSResult": "geometry.mds",
    "spectrum_summary": "geometry.mds",
    # encodings and scores
    "make_encoding": "geometry.encodings",
    "parse_encoding_spec": "geometry.encodings",
    "expand_encoding_specs": "geometry.encodings",
    "rope_table": "geometry.encodings",
    "rope_inv_freq": "geometry.rope_scaling",
    "hf_rope": "geometry.rope_scaling",
    "DEFAULT_ENCODINGS": "geometry.encodings",
    "stress_report": "geometry.stress",
    "StressResult": "geometry.stress",
    "pairwise_distances": "geometry.stress",
    "min_separation": "geometry.diagnostics",
    "monotonicity_violation_rate": "geometry.diagnostics",
    "monotonicity_of_encoding": "geometry.diagnostics",
    "corpus_diagnostics": "geometry.diagnostics",
    "smacof": "geometry.smacof",
    # pipeline
    "AnalysisConfig": "analysis",
    "analyze": "analysis",
    # long contexts: buckets, noise floor, null rank, bootstrap
    "bucket_counts": "counting.buckets",
    "parse_buckets": "counting.buckets",
    "noise_floor": "estimates.noise",
    "null_rank": "estimates.noise",
    "corrected_squared_distances": "estimates.noise",
    "shard_bootstrap": "estimates.bootstrap",
    # reports, export, audit
    "write_html_report": "reports.html",
    "export_encoding": "reports.export",
    "export_run": "reports.export",
    "write_analysis": "runs.analysis_folder",
    "load_run": "runs.run_folder",
    "format_summary": "reports.summary",
    "audit_checkpoint": "reports.audit",
    # service
    "Store": "service.pipeline_store",
    "PipelineConfig": "service.config",
    "load_config": "service.config",
    # architecture baselines
    "cesaro_influence": "baselines.influence",
    "influence_profile": "baselines.influence",
    "adjacency_score": "baselines.adjacency",
    "self_cosine_similarity": "baselines.adjacency",
}

if TYPE_CHECKING:  # the real names for type checkers (x as x: a re-export); at run time each is imported on first use
    from posstats.analysis import (
        AnalysisConfig as AnalysisConfig,
    )
    from posstats.analysis import (
        analyze as analyze,
    )
    from posstats.baselines.adjacency import (
        adjacency_score as adjacency_score,
    )
    from posstats.baselines.adjacency import (
        self_cosine_similarity as self_cosine_similarity,
    )
    from posstats.baselines.influence import (
        cesaro_influence as cesaro_influence,
    )
    from posstats.baselines.influence import (
        influence_profile as influence_profile,
    )
    from posstats.corpus.any_input import (
        count as count,
    )
    from posstats.corpus.readers import (
        read_token_batches as read_token_batches,
    )
    from posstats.corpus.readers import (
        resolve_inputs as resolve_inputs,
    )
    from posstats.corpus.source import (
        CorpusSource as CorpusSource,
    )
    from posstats.corpus.source import (
        count_corpus as count_corpus,
    )
    from posstats.corpus.tokenizer import (
        load_tokenizer as load_tokenizer,
    )
    from posstats.corpus.tokens import (
        TokenBatch as TokenBatch,
    )
    from posstats.counting.buckets import (
        bucket_counts as bucket_counts,
    )
    from posstats.counting.buckets import (
        parse_buckets as parse_buckets,
    )
    from posstats.counting.counts import (
        CountAccumulator as CountAccumulator,
    )
    from posstats.counting.counts import (
        CountSpec as CountSpec,
    )
    from posstats.counting.counts import (
        PositionalCounts as PositionalCounts,
    )
    from posstats.counting.counts import (
        combine_fingerprints as combine_fingerprints,
    )
    from posstats.counting.counts import (
        count_sequences as count_sequences,
    )
    from posstats.counting.io import (
        load_counts as load_counts,
    )
    from posstats.counting.io import (
        save_counts as save_counts,
    )
    from posstats.errors import (
        InputError as InputError,
    )
    from posstats.errors import (
        PosstatsError as PosstatsError,
    )
    from posstats.estimates.bootstrap import (
        shard_bootstrap as shard_bootstrap,
    )
    from posstats.estimates.noise import (
        corrected_squared_distances as corrected_squared_distances,
    )
    from posstats.estimates.noise import (
        noise_floor as noise_floor,
    )
    from posstats.estimates.noise import (
        null_rank as null_rank,
    )
    from posstats.geometry.diagnostics import (
        corpus_diagnostics as corpus_diagnostics,
    )
    from posstats.geometry.diagnostics import (
        min_separation as min_separation,
    )
    from posstats.geometry.diagnostics import (
        monotonicity_of_encoding as monotonicity_of_encoding,
    )
    from posstats.geometry.diagnostics import (
        monotonicity_violation_rate as monotonicity_violation_rate,
    )
    from posstats.geometry.encodings import (
        DEFAULT_ENCODINGS as DEFAULT_ENCODINGS,
    )
    from posstats.geometry.encodings import (
        expand_encoding_specs as expand_encoding_specs,
    )
    from posstats.geometry.encodings import (
        make_encoding as make_encoding,
    )
    from posstats.geometry.encodings import (
        parse_encoding_spec as parse_encoding_spec,
    )
    from posstats.geometry.encodings import (
        rope_table as rope_table,
    )
    from posstats.geometry.hellinger import (
        hellinger as hellinger,
    )
    from posstats.geometry.hellinger import (
        hellinger_sq as hellinger_sq,
    )
    from posstats.geometry.hellinger import (
        sqrt_distributions as sqrt_distributions,
    )
    from posstats.geometry.mds import (
        MDSResult as MDSResult,
    )
    from posstats.geometry.mds import (
        classical_mds as classical_mds,
    )
    from posstats.geometry.mds import (
        spectrum_summary as spectrum_summary,
    )
    from posstats.geometry.rope_scaling import (
        hf_rope as hf_rope,
    )
    from posstats.geometry.rope_scaling import (
        rope_inv_freq as rope_inv_freq,
    )
    from posstats.geometry.smacof import (
        smacof as smacof,
    )
    from posstats.geometry.stress import (
        StressResult as StressResult,
    )
    from posstats.geometry.stress import (
        pairwise_distances as pairwise_distances,
    )
    from posstats.geometry.stress import (
        stress_report as stress_report,
    )
    from posstats.reports.audit import (
        audit_checkpoint as audit_checkpoint,
    )
    from posstats.reports.export import (
        export_encoding as export_encoding,
    )
    from posstats.reports.export import (
        export_run as export_run,
    )
    from posstats.reports.html import (
        write_html_report as write_html_report,
    )
    from posstats.reports.summary import (
        format_summary as format_summary,
    )
    from posstats.runs.analysis_folder import (
        write_analysis as write_analysis,
    )
    from posstats.runs.run_folder import (
        load_run as load_run,
    )
    from posstats.service.config import (
        PipelineConfig as PipelineConfig,
    )
    from posstats.service.config import (
        load_config as load_config,
    )
    from posstats.service.pipeline_store import (
        Store as Store,
    )

__all__ = ["__version__", *_EXPORTS]


# subpackages reachable as attributes after ``import posstats`` (``posstats.drift.diff``),
# imported at first use like the names above
_SUBPACKAGES = frozenset({"baselines", "corpus", "counting", "drift", "estimates", "geometry", "reports", "runs",
                          "service"})


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"posstats.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        msg = f"module 'posstats' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(f"posstats.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
