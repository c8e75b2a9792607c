"""The Python API: posstats.count of files, datasets, arrays and tensors; analyze; writing a
run folder, a report and an export from the returned objects; real types through the
top-level names (mypy)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import posstats
from posstats.errors import InputError

GPT2 = "data/tokenizers/gpt2.tokenizer.json"


def test_count_takes_files_datasets_arrays_tensors_and_sequences():
    datasets = pytest.importorskip("datasets")
    torch = pytest.importorskip("torch")
    rows = [[1, 2, 3], [1, 5], [4, 4, 4]]
    want = posstats.count_sequences(rows, positions=3, vocab_size=8)
    ds = datasets.Dataset.from_dict({"ids": rows, "text": ["hello world", "a b", "x"]})
    for data, kw in (
        (ds, {"column": "ids"}),
        (datasets.DatasetDict({"train": ds}), {"column": "ids"}),
        (rows, {}),
        ((np.array(r) for r in rows), {}),
        (torch.tensor([[1, 2, 3], [1, 5, 0], [4, 4, 4]])[:, :3], {"exclude_tokens": [0]}),
    ):
        got = posstats.count(data, positions=3, vocab_size=8, **kw)
        assert (got.to_sparse().matrix != want.to_sparse().matrix).nnz == 0 and got.tokens == want.tokens, type(data)
    text = posstats.count(ds, text_column="text", tokenizer=GPT2, positions=4)
    assert text.vocab_size == 50257 and text.tokens == sum(len(x) for x in _gpt2(["hello world", "a b", "x"]))
    files = posstats.count("data/shakespeare-sample.txt", tokenizer=GPT2, positions=16)
    assert files.sequences == 1203 and files.metadata["tokenizer"] == "gpt2.tokenizer.json"


def _gpt2(texts):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(GPT2)
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def test_count_errors_are_one_line():
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"ids": [[1]]}),
                               "test": datasets.Dataset.from_dict({"ids": [[2]]})})
    cases = [
        (lambda: posstats.count(dd, column="ids", positions=2, vocab_size=4), "holds the splits train, test"),
        (lambda: posstats.count(dd["train"], column="nope", positions=2, vocab_size=4), "no column 'nope'"),
        (lambda: posstats.count([[1, 9]], positions=2, vocab_size=4), "outside [0, 4)"),
        (lambda: posstats.count([[1, 2]], positions=2), "give vocab_size="),
        (lambda: posstats.count(np.zeros((2, 2, 2), dtype=int), positions=2, vocab_size=4), "2-D"),
    ]
    for call, message in cases:
        with pytest.raises(InputError) as info:
            call()
        assert message in str(info.value) and "\n" not in str(info.value)


def test_analysis_to_run_folder_report_and_export(tmp_path):
    counts = posstats.count("data/fortunes-sample.jsonl", text_column="text", tokenizer=GPT2, positions=24)
    analysis = posstats.analyze(counts, posstats.AnalysisConfig(dims=(2, 8), encodings=("mds", "sinusoidal")))
    run = posstats.write_analysis(tmp_path / "run", analysis)  # report.json, mds.safetensors, report.html
    assert (tmp_path / "run" / "report.html").is_file() and run.report["verdict"]
    assert "verdict" in posstats.format_summary(run.report)
    again = posstats.load_run(tmp_path / "run")
    np.testing.assert_array_equal(again.encoding, run.encoding)
    res = posstats.export_run(run, tmp_path / "pos.safetensors", dim=8, layout="gpt2")
    assert res.table.shape == (24, 8) and (tmp_path / "README.md").is_file()


@pytest.mark.slow
def test_public_api_has_real_types_under_mypy(tmp_path):
    """mypy run outside the checkout (as a user's project would), with no MYPYPATH, sees the
    package and its real types after the README's install (``pip install -e .``: a plain
    path entry, since posstats/jobs links to jobs/ and the layout is simple) or a regular one."""
    if shutil.which("mypy") is None and subprocess.run([sys.executable, "-m", "mypy", "--version"],
                                                        capture_output=True).returncode != 0:
        pytest.skip("mypy is not installed")
    from importlib import metadata

    try:
        metadata.distribution("posstats")
    except metadata.PackageNotFoundError:
        pytest.skip("posstats is not installed (the README's pip install -e .)")
    hooked = [f for f in sys.meta_path if type(f).__module__.startswith("__editable___posstats")]
    assert not hooked, "an import-hook editable install: type checkers cannot follow it (see pyproject's package-dir)"
    env = {k: v for k, v in os.environ.items() if k != "MYPYPATH"}
    usage = tmp_path / "usage.py"
    usage.write_text(
        "import numpy as np\nimport posstats\n\n"
        "c = posstats.count(np.array([[1, 2]]), positions=2, vocab_size=4)\n"
        "reveal_type(c)\n"
        "reveal_type(posstats.analyze(c))\n"
        "reveal_type(posstats.rope_inv_freq)\n"
        "cfg = posstats.AnalysisConfig(mds_method='dnese')\n"
        "n: int = posstats.count  # a function is not an int: mypy must say so\n"
    )
    out = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), str(usage)],
                         capture_output=True, text=True, cwd=tmp_path, env=env)
    text = out.stdout
    assert "import-not-found" not in text, text
    assert 'Revealed type is "posstats.counting.counts.PositionalCounts"' in text, text
    assert 'Revealed type is "posstats.analysis.result.Analysis"' in text, text
    assert "def (head_dim: builtins.int" in text or "def (head_dim: int" in text, text
    assert "Incompatible types in assignment" in text, text  # not Any: the wrong use is caught
    assert "Literal['dnese']" in text and '"mds_method"' in text, text  # a Literal option's typo is caught
    errors = [ln for ln in text.splitlines() if ": error:" in ln]
    assert len(errors) == 2, text  # exactly the two planted mistakes


def test_string_options_are_literal_types_checked_at_run_time_too():
    """A typo in an option is caught by a type checker (Literal annotations) and, at run
    time, by a one-line error naming the choices (mds_method had no check before)."""
    from typing import get_args, get_type_hints

    from posstats.analysis import MDS_METHODS, AnalysisConfig
    from posstats.errors import PosstatsError

    hints = get_type_hints(AnalysisConfig)
    assert get_args(hints["mds_method"]) == MDS_METHODS == ("auto", "dense", "iterative", "lanczos")
    for name in ("distances", "noise_floor", "null", "held_out"):
        assert get_args(hints[name]), name
    with pytest.raises(PosstatsError, match="unknown MDS method 'dnese'; choose one of auto, dense, iterative, lanczos"):
        AnalysisConfig(mds_method="dnese")  # type: ignore[arg-type]
