# The public API of posstats, declared once (Scientific Python SPEC 1, "lazy loading"): type
# checkers read these imports, and posstats/__init__.py reads this file to import each name on
# first use. Everything else is reached through its subpackage (posstats.geometry.mds, ...).
from posstats import baselines as baselines
from posstats import corpus as corpus
from posstats import counting as counting
from posstats import drift as drift
from posstats import estimates as estimates
from posstats import geometry as geometry
from posstats import reports as reports
from posstats import runs as runs
from posstats import service as service
from posstats import torch as torch
from posstats.analysis import AnalysisConfig as AnalysisConfig
from posstats.analysis import analyze as analyze
from posstats.corpus.any_input import count as count
from posstats.counting.counts import PositionalCounts as PositionalCounts
from posstats.counting.counts import count_sequences as count_sequences
from posstats.counting.io import load_counts as load_counts
from posstats.counting.io import save_counts as save_counts
from posstats.drift.compare import diff as diff
from posstats.errors import InputError as InputError
from posstats.errors import PosstatsError as PosstatsError
from posstats.geometry.encodings import make_encoding as make_encoding
from posstats.geometry.rope_scaling import hf_rope as hf_rope
from posstats.geometry.rope_scaling import rope_inv_freq as rope_inv_freq
from posstats.geometry.stress import stress_report as stress_report
from posstats.reports.analysis_folder import write_analysis as write_analysis
from posstats.audit import audit_checkpoint as audit_checkpoint
from posstats.reports.export import export_run as export_run
from posstats.reports.summary import format_summary as format_summary
from posstats.runs.run_folder import load_run as load_run

__version__: str
__all__: list[str]
