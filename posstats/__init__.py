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
from typing import Any

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

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        msg = f"module 'posstats' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(f"posstats.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
