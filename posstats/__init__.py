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
    "TokenBatch": "tokens",
    # counting
    "CountSpec": "counts",
    "CountAccumulator": "counts",
    "PositionalCounts": "counts",
    "count_sequences": "counts",
    "combine_fingerprints": "counts",
    "save_counts": "storage",
    "load_counts": "storage",
    "read_token_batches": "readers",
    "resolve_inputs": "readers",
    "load_tokenizer": "tokenizer",
    "CorpusSource": "corpus",
    "count_corpus": "corpus",
    # geometry
    "sqrt_distributions": "hellinger",
    "hellinger_sq": "hellinger",
    "hellinger": "hellinger",
    "classical_mds": "mds",
    "MDSResult": "mds",
    "spectrum_summary": "mds",
    # encodings and scores
    "make_encoding": "encodings",
    "parse_encoding_spec": "encodings",
    "DEFAULT_ENCODINGS": "encodings",
    "stress_report": "stress",
    "StressResult": "stress",
    "pairwise_distances": "stress",
    "min_separation": "diagnostics",
    "monotonicity_violation_rate": "diagnostics",
    "monotonicity_of_encoding": "diagnostics",
    "corpus_diagnostics": "diagnostics",
    "smacof": "smacof",
    # pipeline
    "AnalysisConfig": "analysis",
    "analyze": "analysis",
    # long contexts: buckets, noise floor, null rank, bootstrap
    "bucket_counts": "buckets",
    "parse_buckets": "buckets",
    "noise_floor": "noise",
    "null_rank": "noise",
    "corrected_squared_distances": "noise",
    "shard_bootstrap": "bootstrap",
    # reports, export, audit
    "write_html_report": "html_report",
    "export_encoding": "export",
    "audit_checkpoint": "audit",
    # service
    "Store": "store",
    "PipelineConfig": "pipeline_config",
    "load_config": "pipeline_config",
    # architecture baselines
    "cesaro_influence": "influence",
    "influence_profile": "influence",
    "adjacency_score": "adjacency",
    "self_cosine_similarity": "adjacency",
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
