"""End-to-end: the CLI on real bundled corpora, checked against brute-force oracles."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from posstats.cli import main
from posstats.counting.io import load_counts

BERT = "data/tokenizers/bert-base-uncased.tokenizer.json"
GPT2 = "data/tokenizers/gpt2.tokenizer.json"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def _texts(n: int) -> list[str]:
    with open("data/fortunes-sample.jsonl") as f:
        return [json.loads(line)["text"] for _, line in zip(range(n), f)]


def _oracle_counts(seqs, n, V):
    C = np.zeros((n, V), dtype=np.int64)
    for s in seqs:
        for i, t in enumerate(s[:n]):
            C[i, t] += 1
    return C


def _oracle_mds_eigenvalues(C):
    """Dense B = -1/2 H D H from explicit per-pair difference sums, then eigvalsh."""
    rows = C[C.sum(axis=1) > 0].astype(float)
    S = np.sqrt(rows / rows.sum(axis=1, keepdims=True))
    m = len(S)
    D = np.array([[np.sum((S[i] - S[j]) ** 2) for j in range(m)] for i in range(m)])
    H = np.eye(m) - 1.0 / m
    return np.sort(np.linalg.eigvalsh(-0.5 * H @ D @ H))[::-1], np.sqrt(D)


def test_run_on_fortunes_with_bert_matches_oracles(tmp_path, capsys):
    out = tmp_path / "run"
    n = 24
    rc = main([
        "run", "--input", "data/fortunes-sample.jsonl", "--text-column", "text", "--tokenizer", BERT,
        "--positions", str(n), "--dims", "2,8,64", "--encodings", "mds,sinusoidal,rope,alibi,random:0.02", "--out", str(out),
        "--noise-floor", "off",  # the plug-in oracles below; the default subtracts a noise floor
    ])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "scaled" in printed and "sinusoidal" in printed
    report = json.loads((out / "report.json").read_text())
    assert (out / "report.md").read_text().startswith("# posstats report")

    tok = Tokenizer.from_file(BERT)
    tok.no_padding()
    tok.no_truncation()
    texts = _texts(10**9)
    seqs = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    specials = {0, 101, 102, 103}  # [UNK] stays: it is real text
    seqs = [[t for t in s if t not in specials] for s in seqs]
    C = _oracle_counts(seqs, n, tok.get_vocab_size())

    counts = load_counts(out)
    np.testing.assert_array_equal(counts.to_dense().matrix, C)
    assert report["corpus"]["sequences"] == len(texts)
    assert report["corpus"]["tokens_counted"] == int(C.sum())
    assert report["positions"]["occupancy"] == C.sum(axis=1).tolist()
    assert report["positions"]["requested"] == n

    lam, h = _oracle_mds_eigenvalues(C)
    got = np.array(report["spectrum"]["eigenvalues"])
    np.testing.assert_allclose(got, lam[: len(got)], rtol=1e-9, atol=1e-12)
    assert report["spectrum"]["rank"] == n - 1  # n distinct distributions: rank n - 1
    assert report["spectrum"]["explained_variance"][-1] == pytest.approx(1.0)

    by = {(e["name"], e["dim"]): e for e in report["encodings"]}
    assert set(by) == {(name, d) for name in ("mds", "sinusoidal", "rope", "alibi", "random:0.02") for d in (2, 8, 64)}
    # full-width MDS reproduces the Hellinger geometry exactly: zero stress
    assert by[("mds", 64)]["stress"] == pytest.approx(0.0, abs=1e-12)
    # MDS at width 2: stress equals the oracle computed from the top-2 eigenvectors
    w, U = np.linalg.eigh(-0.5 * (np.eye(n) - 1 / n) @ h**2 @ (np.eye(n) - 1 / n))
    P = U[:, ::-1][:, :2] * np.sqrt(np.maximum(w[::-1][:2], 0))
    iu = np.triu_indices(n, 1)
    e = np.linalg.norm(P[:, None] - P[None], axis=-1)[iu]
    assert by[("mds", 2)]["stress"] == pytest.approx(np.sum((e - h[iu]) ** 2) / np.sum(h[iu] ** 2), rel=1e-9)
    for entry in report["encodings"]:
        assert 0.0 <= entry["scaled_stress"] <= 1.0
        assert entry["monotonicity_method"] == "exact"


def test_count_then_analyze_equals_run_with_gpt2_pack(tmp_path):
    common = ["--input", "data/shakespeare-sample.txt", "--tokenizer", GPT2, "--positions", "48", "--mode", "pack",
              "--separator", "50256"]
    assert main(["count", *common, "--out", str(tmp_path / "c")]) == 0
    assert main(["analyze", "--counts", str(tmp_path / "c"), "--dims", "4", "--encodings", "mds,sinusoidal",
                 "--out", str(tmp_path / "a")]) == 0
    assert main(["run", *common, "--dims", "4", "--encodings", "mds,sinusoidal", "--out", str(tmp_path / "r")]) == 0
    a = json.loads((tmp_path / "a" / "report.json").read_text())
    r = json.loads((tmp_path / "r" / "report.json").read_text())
    assert a["spectrum"]["eigenvalues"] == r["spectrum"]["eigenvalues"]
    assert a["encodings"] == r["encodings"]
    assert load_counts(tmp_path / "c").equals(load_counts(tmp_path / "r"))
    # pack mode fills every position of every full window
    occ = np.array(r["positions"]["occupancy"])
    assert occ.min() > 0 and occ.max() - occ.min() <= 1


def test_dims_larger_than_occupied_positions_are_valid(tmp_path):
    path = tmp_path / "ids.jsonl"
    path.write_text("\n".join(json.dumps({"ids": [i % 7, (i * 3) % 7, 5]}) for i in range(20)))
    assert main(["run", "--input", str(path), "--column", "ids", "--vocab-size", "7", "--positions", "8",
                 "--dims", "16", "--encodings", "mds,mds-lowrank:1", "--out", str(tmp_path / "o")]) == 0
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["positions"]["occupied"] == 3
    assert all(e["dim"] == 16 for e in report["encodings"])


def _ids_parquet(path, rows):
    pq.write_table(pa.table({"ids": pa.array(rows, type=pa.list_(pa.int64()))}), path)


BAD_CASES = {
    "missing file": (["--input", "nope/*.jsonl", "--column", "ids", "--vocab-size", "9"], "no input matches"),
    "missing column": (["--input", "{good}", "--column", "tokens", "--vocab-size", "9"], "tokens"),
    "id out of range": (["--input", "{big}", "--column", "ids", "--vocab-size", "9"], r"row 1: .*12"),
    "negative id": (["--input", "{neg}", "--column", "ids", "--vocab-size", "9"], r"row 2: .*-3"),
    "empty corpus": (["--input", "{empty}", "--column", "ids", "--vocab-size", "9"], "empty corpus"),
    "nothing occupied": (["--input", "{good}", "--column", "ids", "--vocab-size", "9", "--exclude-tokens",
                          "0,1,2,3,4,5,6,7,8"], "position"),
    "zero dim": (["--input", "{good}", "--column", "ids", "--vocab-size", "9", "--dims", "0"], "dimension"),
    "odd dim": (["--input", "{good}", "--column", "ids", "--vocab-size", "9", "--dims", "3", "--encodings",
                 "sinusoidal"], "even"),
    "unknown encoding": (["--input", "{good}", "--column", "ids", "--vocab-size", "9", "--encodings", "fourier"],
                         "fourier"),
    "corrupt parquet": (["--input", "{corrupt}", "--column", "ids", "--vocab-size", "9"], "corrupt.parquet"),
    "not a tokenizer": (["--input", "{text}", "--tokenizer", "{text}"], "tokenizer"),
    "non-list column": (["--input", "{scalar}", "--column", "ids", "--vocab-size", "9"], "ids"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_input_is_one_line_exit_2_and_nothing_published(case, tmp_path, capsys):
    files = {
        "good": tmp_path / "good.parquet",
        "big": tmp_path / "big.parquet",
        "neg": tmp_path / "neg.parquet",
        "empty": tmp_path / "empty.parquet",
        "corrupt": tmp_path / "corrupt.parquet",
        "text": tmp_path / "plain.txt",
        "scalar": tmp_path / "scalar.parquet",
    }
    _ids_parquet(files["good"], [[1, 2, 3], [4, 5], [6, 7, 8]])
    _ids_parquet(files["big"], [[1, 2], [3, 12]])
    _ids_parquet(files["neg"], [[1], [2], [-3, 4]])
    _ids_parquet(files["empty"], [])
    files["corrupt"].write_bytes(b"PAR1 this is not really parquet PAR1")
    files["text"].write_text("hello world\n")
    pq.write_table(pa.table({"ids": [1, 2, 3]}), files["scalar"])
    argv, pattern = BAD_CASES[case]
    argv = [a.format(**{k: str(v) for k, v in files.items()}) for a in argv]
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text('{"old": true}')
    rc = main(["run", "--positions", "4", "--dims", "2", *argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, err
    line = err.strip()
    assert line.startswith("posstats: error: ") and "\n" not in line
    assert pytest.importorskip("re").search(pattern, line), line
    # the previous results are untouched and no staging folder is left behind
    assert json.loads((out / "report.json").read_text()) == {"old": True}
    assert sorted(p.name for p in out.iterdir()) == ["report.json"]
    assert not [p for p in tmp_path.iterdir() if ".staging-" in p.name]


def test_help_documents_every_command():
    result = subprocess.run([sys.executable, "-m", "posstats.cli", "--help"], capture_output=True, text=True, check=True)
    for cmd in ("run", "count", "analyze"):
        assert cmd in result.stdout
    result = subprocess.run([sys.executable, "-m", "posstats.cli", "run", "--help"], capture_output=True, text=True, check=True)
    for flag in ("--input", "--format", "--column", "--text-column", "--tokenizer", "--positions", "--vocab-size",
                 "--exclude-tokens", "--mode", "--dims", "--encodings", "--out"):
        assert flag in result.stdout


def test_run_on_the_shared_shakespeare_corpus_with_gpt2(shared_dir, tmp_path):
    """The whole gzipped Shakespeare corpus (~1.3 M GPT-2 tokens), packed, as a user runs it."""
    out = tmp_path / "shakespeare"
    rc = main(["run", "--input", str(shared_dir / "corpora/shakespeare.md.gz"), "--format", "text", "--tokenizer", GPT2,
               "--positions", "256", "--mode", "pack", "--dims", "16", "--encodings", "mds,sinusoidal",
               "--out", str(out)])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert report["corpus"]["tokens_counted"] > 1_000_000
    occ = np.array(report["positions"]["occupancy"])
    assert occ.max() - occ.min() <= 1  # packing fills positions evenly
    # counts agree with an independent tokenisation of the same documents: a Markdown file
    # is read one document per paragraph (non-blank lines up to a blank one, joined by "\n")
    import gzip

    tok = Tokenizer.from_file(GPT2)
    with gzip.open(shared_dir / "corpora/shakespeare.md.gz", "rt") as f:
        text = f.read()
    paragraphs = ["\n".join(ln.strip() for ln in block.splitlines() if ln.strip())
                  for block in re.split(r"\n[ \t\r\f\v]*\n", text)]
    paragraphs = [p for p in paragraphs if p]
    ids = [t for e in tok.encode_batch(paragraphs, add_special_tokens=False) for t in e.ids if t != 50256]
    assert report["corpus"]["tokens_counted"] == len(ids)
    assert report["corpus"]["sequences"] == len(paragraphs) == 39_326


def test_json_quiet_and_verbose_output(tmp_path, capsys):
    """--json prints report.json on stdout (nothing else), -q prints nothing, -v adds the
    seconds of every step on stderr."""
    counts = tmp_path / "counts"
    assert main(["count", "--input", "data/fortunes-sample.jsonl", "--text-column", "text", "--tokenizer", GPT2,
                 "--positions", "16", "--out", str(counts)]) == 0
    capsys.readouterr()
    assert main(["analyze", "--counts", str(counts), "--out", str(tmp_path / "a"), "--dims", "2", "--json", "-v"]) == 0
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert report == json.loads((tmp_path / "a" / "report.json").read_text())
    lines = out.err.strip().splitlines()
    assert lines[-2].startswith("seconds: ") and "mds" in lines[-2]
    assert lines[-1].startswith("posstats: analyze took ")
    assert main(["analyze", "--counts", str(counts), "--out", str(tmp_path / "b"), "--dims", "2", "-q"]) == 0
    out = capsys.readouterr()
    assert out.out == "" and (tmp_path / "b" / "report.json").is_file()


def test_count_warns_when_pack_mode_gives_too_few_windows(tmp_path, capsys):
    """A pack-mode count with fewer windows than the analysis needs says so at count time
    (the analysis will withhold its verdict); enough windows, or truncate mode, say nothing."""
    common = ["--input", "data/shakespeare-sample.txt", "--tokenizer", GPT2, "--mode", "pack"]
    assert main(["count", *common, "--positions", "4096", "--out", str(tmp_path / "few")]) == 0
    err = capsys.readouterr().err
    windows = json.loads((tmp_path / "few" / "count.json").read_text())["windows"]
    assert windows < 30 and f"warning: only {windows:,} window(s) in pack mode (fewer than 30)" in err
    assert main(["count", *common, "--positions", "16", "--out", str(tmp_path / "many")]) == 0
    assert "window(s)" not in capsys.readouterr().err
