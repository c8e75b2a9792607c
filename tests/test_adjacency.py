"""Self-cosine similarity and the adjacency probability score (THEORY section 9)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from posstats.baselines.adjacency import (
    adjacency,
    adjacency_score,
    increasing_pair_counts,
    layer_adjacency,
    plot_similarity_matrices,
    row_adjacency_scores,
    self_cosine_similarity,
)
from posstats.baselines.random_transformer import RandomTransformer, TransformerConfig
from posstats.cli import main
from posstats.corpus.readers import read_token_batches
from posstats.corpus.tokenizer import load_tokenizer, vocab_size
from posstats.geometry.encodings import make_encoding


def brute_counts(cs: np.ndarray) -> np.ndarray:
    """THEORY section 9 literally: pairs 0 <= i < j < k with Cs[k, i] < Cs[k, j]."""
    n = cs.shape[0]
    out = np.zeros(n, dtype=np.int64)
    for k in range(n):
        for i in range(k):
            for j in range(i + 1, k):
                out[k] += cs[k, i] < cs[k, j]
    return out


def brute_score(cs: np.ndarray) -> float:
    n = cs.shape[0]
    rows = [brute_counts(cs)[k] / (k * (k - 1) / 2) for k in range(2, n)]
    return float(np.mean(rows))


def sinusoidal(n: int, d: int) -> np.ndarray:
    """THEORY section 5, written out here so this test needs no other module."""
    w = 10000.0 ** (-2.0 * np.arange(d // 2) / d)
    ang = np.arange(n)[:, None] * w[None, :]
    out = np.empty((n, d))
    out[:, 0::2], out[:, 1::2] = np.sin(ang), np.cos(ang)
    return out


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 8, 9, 16, 17, 31, 40])
def test_counts_match_brute_force_on_random_and_tied_values(n):
    rng = np.random.default_rng(n)
    for cs in (rng.standard_normal((n, n)), rng.integers(0, 3, size=(n, n)).astype(float)):
        np.testing.assert_array_equal(increasing_pair_counts(cs), brute_counts(cs))


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(3, 14), st.just(14)),
              elements=st.sampled_from([-1.0, -0.5, 0.0, 0.25, 0.5, 1.0])))
def test_counts_match_brute_force_property(block):
    cs = block[:, : block.shape[0]]
    np.testing.assert_array_equal(increasing_pair_counts(cs), brute_counts(cs))
    np.testing.assert_allclose(adjacency_score(cs), brute_score(cs), rtol=1e-12)


def test_decaying_similarity_scores_one_and_reversed_zero():
    idx = np.arange(60.0)
    dist = np.abs(idx[:, None] - idx[None, :])
    assert adjacency_score(-dist) == 1.0
    assert adjacency_score(np.exp(-dist / 5)) == 1.0
    assert adjacency_score(dist) == 0.0
    rows = row_adjacency_scores(-dist)
    assert np.isnan(rows[:2]).all()
    np.testing.assert_array_equal(rows[2:], 1.0)


def test_ties_are_not_adjacent():
    assert adjacency_score(np.ones((10, 10))) == 0.0
    cs = np.eye(5)  # row k: only column k is 1; columns < k all 0 -> ties
    assert adjacency_score(cs) == 0.0


def test_random_vectors_score_about_half():
    rng = np.random.default_rng(1)
    scores = [adjacency_score(self_cosine_similarity(rng.standard_normal((200, 32)))) for _ in range(3)]
    assert abs(np.mean(scores) - 0.5) < 0.03


def test_large_matrix_runs_and_is_about_half():
    rng = np.random.default_rng(2)
    cs = self_cosine_similarity(rng.standard_normal((1024, 16)))
    rows = row_adjacency_scores(cs)
    assert rows.shape == (1024,)
    assert abs(np.nanmean(rows) - 0.5) < 0.02


def test_tiny_matrices_have_no_score():
    assert np.isnan(adjacency_score(np.ones((2, 2))))
    assert np.isnan(adjacency(np.ones((1, 4))).score)


def test_self_cosine_similarity_matches_definition():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((7, 5)).astype(np.float32)
    x[4] = 0.0
    cs = self_cosine_similarity(x)
    assert cs.dtype == np.float64
    for i in range(7):
        for j in range(7):
            a, b = x[i].astype(np.float64), x[j].astype(np.float64)
            na, nb = np.linalg.norm(a), np.linalg.norm(b)
            expected = 0.0 if na == 0 or nb == 0 else a @ b / (na * nb)
            np.testing.assert_allclose(cs[i, j], expected, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(np.diagonal(cs)[[0, 1, 2, 3, 5, 6]], 1.0)
    np.testing.assert_array_equal(cs, cs.T)
    with pytest.raises(ValueError, match="2-D"):
        self_cosine_similarity(np.ones(3))
    with pytest.raises(ValueError, match="NaN"):
        self_cosine_similarity(np.array([[1.0, np.nan], [0.0, 1.0]]))


@pytest.mark.parametrize(("n", "d", "low"), [(128, 64, 0.85), (128, 384, 0.98), (512, 384, 0.94)])
def test_sinusoidal_has_high_adjacency(n, d, low):
    # Not 1: cos similarity oscillates with distance, more so when d is small.
    assert adjacency_score(self_cosine_similarity(sinusoidal(n, d))) > low


def test_catalog_encodings():
    sin = make_encoding("sinusoidal", np.arange(128), 64).matrix
    np.testing.assert_allclose(sin, sinusoidal(128, 64), atol=1e-12)
    assert adjacency_score(self_cosine_similarity(make_encoding("rope", np.arange(128), 384).matrix)) > 0.98
    assert abs(adjacency(make_encoding("random", np.arange(128), 64).matrix).score - 0.5) < 0.05


def test_layer_adjacency_and_plot(tmp_path):
    rng = np.random.default_rng(4)
    hs = rng.standard_normal((3, 4, 20, 8))
    hs[:, 1] = np.cumsum(hs[:, 1], axis=1)  # running sums: nearby rows alike
    res = layer_adjacency(hs)
    assert res.names == ("embeddings", "layer 1", "layer 2", "layer 3")
    assert res.scores.shape == (3, 4)
    for s in range(3):
        for layer in range(4):
            np.testing.assert_allclose(res.scores[s, layer], brute_score(self_cosine_similarity(hs[s, layer])))
    np.testing.assert_allclose(res.mean, res.scores.mean(axis=0))
    assert res.mean[1] > 0.8 and abs(res.mean[0] - 0.5) < 0.15
    np.testing.assert_allclose(res.example[2], self_cosine_similarity(hs[0, 2]))
    json.dumps(res.to_dict(), allow_nan=False)
    fig = plot_similarity_matrices(list(res.example), list(res.names), suptitle="t")
    fig.savefig(tmp_path / "h.png")
    assert (tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError):
        plot_similarity_matrices([np.eye(3)], ["a", "b"])


# -- hidden states of a random transformer (papers/004 on our own runs) ----------------


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The models here are small: one intra-op thread avoids oversubscription on busy
    machines; the previous setting is restored afterwards (no-op without torch)."""
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _layer_scores(tokens, **config):
    cfg = TransformerConfig(**{"layers": 2, "dim": 384, "heads": 6, "vocab_size": 2048, **config})
    return layer_adjacency(RandomTransformer(cfg).hidden_states(tokens)).mean


@pytest.fixture(scope="module")
def random_tokens():
    return np.random.default_rng(0).integers(0, 2048, size=(6, 48))


def test_causal_layers_show_adjacency_at_standard_init(random_tokens):
    pytest.importorskip("torch", reason="torch is not installed (pip install 'posstats[torch]')")
    scores = _layer_scores(random_tokens, init_std=0.02)
    assert abs(scores[0] - 0.5) < 0.05  # token embeddings: no positional signal
    assert np.all(scores[1:] > 0.85)  # from the first causal layer on


def test_adjacency_fades_at_large_init(random_tokens):
    pytest.importorskip("torch", reason="torch is not installed (pip install 'posstats[torch]')")
    scores = _layer_scores(random_tokens, init_std=0.2)
    assert np.all(scores[1:] < 0.65)


def test_no_adjacency_with_bidirectional_attention(random_tokens):
    pytest.importorskip("torch", reason="torch is not installed (pip install 'posstats[torch]')")
    scores = _layer_scores(random_tokens, causal=False)
    np.testing.assert_allclose(scores, 0.5, atol=0.05)


@pytest.mark.slow
def test_paper_findings_on_real_text(data_dir):
    pytest.importorskip("torch", reason="torch is not installed (pip install 'posstats[torch]')")
    tok = load_tokenizer(data_dir / "tokenizers" / "gpt2.tokenizer.json")
    batch = next(read_token_batches(data_dir / "fortunes-sample.jsonl", text_column="text", tokenizer=tok))
    assert vocab_size(tok) == 50257
    # Embedding rows are i.i.d., so relabelling the distinct ids 0..u-1 gives the same
    # model distribution without drawing a 50257-row table per model.
    distinct, tokens = np.unique(batch.values[: 8 * 64], return_inverse=True)
    tokens = tokens.reshape(8, 64)
    base = {"layers": 6, "vocab_size": distinct.size}
    std002 = _layer_scores(tokens, **base)
    std02 = _layer_scores(tokens, **base, init_std=0.2)
    bidir = _layer_scores(tokens, **base, causal=False)
    assert abs(std002[0] - 0.5) < 0.05
    assert np.all(std002[1:] > 0.85)
    assert np.all(std02[1:] < 0.65)
    assert np.all(np.abs(bidir - 0.5) < 0.05)


# -- command line -------------------------------------------------------------------


def test_cli_random_tokens_and_encodings(tmp_path, capsys):
    pytest.importorskip("torch", reason="torch is not installed (pip install 'posstats[torch]')")
    out = tmp_path / "adj"
    argv = ["adjacency", "--random-tokens", "--layers", "2", "--dim", "64", "--heads", "4", "--vocab-size", "500",
            "--seq-len", "24", "--sequences", "3", "--encodings", "sinusoidal,mds", "--encoding-dim", "32",
            "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "layer 2" in printed and "sinusoidal" in printed
    doc = json.loads((out / "adjacency.json").read_text())
    assert doc["schema"] == "posstats.adjacency/1"
    assert [layer["name"] for layer in doc["model"]["layers"]] == ["embeddings", "layer 1", "layer 2"]
    assert len(doc["model"]["layers"][1]["per_sequence"]) == 3
    (enc,) = doc["encodings"]
    np.testing.assert_allclose(enc["score"], adjacency_score(self_cosine_similarity(sinusoidal(24, 32))))
    assert any("mds" in note for note in doc["notes"])
    for name in ("adjacency-layers.png", "adjacency-encodings.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"


def test_cli_real_corpus(tmp_path, data_dir):
    pytest.importorskip("torch", reason="torch is not installed (pip install 'posstats[torch]')")
    out = tmp_path / "adj"
    argv = ["adjacency", "--input", str(data_dir / "fortunes-sample.jsonl"),
            "--tokenizer", str(data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json"),
            "--layers", "1", "--dim", "64", "--heads", "4", "--seq-len", "16", "--sequences", "2", "--out", str(out)]
    assert main(argv) == 0
    doc = json.loads((out / "adjacency.json").read_text())
    assert doc["model"]["tokens"]["kind"] == "corpus"
    assert doc["model"]["config"]["vocab_size"] == 30522
    assert 101 in doc["model"]["tokens"]["exclude_ids"]
    assert (out / "adjacency-layers.png").exists()


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--random-tokens", "--seq-len", "2"],
        ["--random-tokens", "--sequences", "0"],
        ["--random-tokens", "--dim", "10", "--heads", "4"],
        ["--input", "nowhere.jsonl"],
        ["--input", "x.jsonl", "--random-tokens"],
        ["--encodings", "nonsense"],
    ],
)
def test_cli_bad_input_exits_2_with_one_line(argv, capsys):
    assert main(["adjacency", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posstats: error:") and "\n" not in err


def test_cli_too_few_tokens(tmp_path, data_dir, capsys):
    (tmp_path / "small.txt").write_text("just a few words here\n")
    argv = ["adjacency", "--input", str(tmp_path / "small.txt"),
            "--tokenizer", str(data_dir / "tokenizers" / "gpt2.tokenizer.json")]
    assert main(argv) == 2
    assert "fewer than" in capsys.readouterr().err
