"""MDSPositionalEmbedding: export -> load round trips, low-rank form, freezing, forward."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from posstats.cli import main
from posstats.counting.counts import CountSpec, PositionalCounts
from posstats.counting.io import save_counts
from posstats.errors import InputError
from posstats.reports.export import export_encoding
from posstats.runs.run_folder import load_run

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'posstats[torch]')")
from posstats.torch import MDSPositionalEmbedding  # noqa: E402


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("torch")
    rng = np.random.default_rng(1)
    n, vocab = 20, 30
    a, b = rng.dirichlet(np.full(vocab, 0.5), size=2)
    t = np.linspace(0, 1, n)[:, None]
    matrix = np.stack([rng.multinomial(2000, p) for p in (1 - t) * a + t * b]).astype(np.int64)
    save_counts(PositionalCounts(CountSpec(n, vocab), matrix, sequences=2000, windows=2000, tokens=int(matrix.sum()),
                                 fingerprint="cd" * 32), tmp / "counts")
    out = tmp / "run"
    assert main(["analyze", "--counts", str(tmp / "counts"), "--dims", "4,8", "--encodings", "mds", "--out", str(out)]) == 0
    return out


def _pdist(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.sqrt(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1))


@pytest.mark.parametrize(("fmt", "layout"), [("safetensors", "bert"), ("npy", "plain"), ("pt", "gpt2")])
def test_round_trip_identical_tensors_and_distances(run_dir, tmp_path, fmt, layout):
    res = export_encoding(run_dir, tmp_path / f"pos.{fmt}", dim=16, layout=layout, card=False)
    module = MDSPositionalEmbedding.from_file(tmp_path / f"pos.{fmt}")
    assert (module.num_positions, module.embedding_dim, module.rank) == (20, 16, None)
    np.testing.assert_array_equal(module.weight.detach().numpy(), res.table)
    run = load_run(run_dir)
    k = int(res.metadata["rank"])  # the components above sampling noise
    assert 1 <= k == min(16, run.report["verdict"]["components_above_noise"])
    np.testing.assert_allclose(_pdist(module.weight.detach().numpy()), _pdist(run.encoding[:, :k]), atol=1e-6)
    if fmt == "safetensors":
        assert module.metadata == res.metadata


@pytest.mark.parametrize("fmt", ["safetensors", "npy", "pt"])
def test_low_rank_round_trip(run_dir, tmp_path, fmt):
    res = export_encoding(run_dir, tmp_path / f"lr.{fmt}", dim=12, rank=3, factors=True, dtype="float64", card=False)
    module = MDSPositionalEmbedding.from_file(tmp_path / f"lr.{fmt}")
    assert module.rank == 3
    a, w = res.factors
    np.testing.assert_array_equal(module.A.detach().numpy(), a)
    np.testing.assert_array_equal(module.W.detach().numpy(), w)
    np.testing.assert_allclose(module.weight.detach().numpy(), res.table, atol=1e-15)
    assert sum(p.numel() for p in module.parameters()) == 3 * (20 + 12)
    full = MDSPositionalEmbedding.from_file(tmp_path / f"lr.{fmt}", low_rank=False)
    np.testing.assert_array_equal(full.weight.detach().numpy(), res.table)


def test_low_rank_requested_but_absent(run_dir, tmp_path):
    export_encoding(run_dir, tmp_path / "p.safetensors", dim=8, card=False)
    with pytest.raises(InputError, match="no low-rank factors"):
        MDSPositionalEmbedding.from_file(tmp_path / "p.safetensors", low_rank=True)


def test_forward_adds_positions_and_freezing():
    table = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    frozen = MDSPositionalEmbedding(table)
    assert not any(p.requires_grad for p in frozen.parameters())
    x = torch.ones(2, 3, 3)
    torch.testing.assert_close(frozen(x), x + table[:3])
    ids = torch.tensor([[3, 0, 1]])
    torch.testing.assert_close(frozen(x, ids), x + table[ids])
    with pytest.raises(IndexError, match=r"\[0, 4\)"):
        frozen(x, torch.tensor([4, 0, 1]))
    with pytest.raises(ValueError, match="last dimension"):
        frozen(torch.ones(2, 3, 5))
    trainable = MDSPositionalEmbedding(factors=(torch.ones(4, 2), torch.eye(3, 2)), freeze=False)
    trainable(torch.zeros(1, 4, 3)).sum().backward()
    assert trainable.A.grad is not None and trainable.W.grad is not None
    assert "rank=2" in repr(trainable) and "frozen=False" in repr(trainable)


def test_bad_files(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        MDSPositionalEmbedding.from_file(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(InputError, match="not a readable safetensors file"):
        MDSPositionalEmbedding.from_file(tmp_path / "junk.safetensors")
    (tmp_path / "x.h5").write_bytes(b"")
    with pytest.raises(InputError, match="unknown suffix"):
        MDSPositionalEmbedding.from_file(tmp_path / "x.h5")


def test_import_posstats_never_imports_torch():
    code = (
        "import sys\n"
        "import posstats, posstats.cli, posstats.reports.export, posstats.audit, posstats.reports.audit, posstats.reports.html, posstats.reports.plots\n"
        "posstats.cli.build_parser()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_state_dict_is_an_embeddings_and_forward_has_no_graph_break():
    import torch

    from posstats.torch import MDSPositionalEmbedding

    table = torch.randn(12, 6)
    module = MDSPositionalEmbedding(table)
    emb = torch.nn.Embedding(12, 6)
    emb.load_state_dict(module.state_dict(), strict=True)  # {"weight": (n, d)} both ways
    torch.testing.assert_close(emb.weight, table)
    again = MDSPositionalEmbedding(torch.zeros(12, 6))
    again.load_state_dict(emb.state_dict(), strict=True)
    torch.testing.assert_close(again.weight, table)
    torch.testing.assert_close(module.to_embedding().weight, table)
    assert not module.to_embedding().weight.requires_grad
    torch.testing.assert_close(MDSPositionalEmbedding.from_embedding(emb).weight, table)
    # fullgraph=True fails on any graph break (a host sync such as int(tensor) is one)
    x = torch.randn(2, 5, 6)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), x + table[:5])
    ids = torch.tensor([[0, 3, 11, 2, 2]])
    torch.testing.assert_close(compiled(x[:1], ids), x[:1] + table[ids])
    with pytest.raises(IndexError, match=r"position ids must be in \[0, 12\); got 0..12"):
        module(x[:1], torch.tensor([[0, 1, 2, 3, 12]]))
    with pytest.raises(IndexError, match="longer than the table's 12"):
        module(torch.randn(1, 13, 6))
