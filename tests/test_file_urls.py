"""``file://`` URLs are local paths wherever a command takes a path (inputs, globs,
tokenizers, counts and run folders, checkpoints, stores, outputs): one rule, applied by
:func:`posstats.jobs.guard.local_file_urls` before any command runs."""

from __future__ import annotations

import argparse
import os

import pytest
from posstats.jobs.guard import local_file_urls

from posstats.cli import main
from posstats.counting.io import load_counts


def test_local_file_urls_rewrites_strings_and_lists_only():
    args = argparse.Namespace(out="file:///data/runs/a", input=["file:///x/*.jsonl", "rel/y.txt"],
                              sides=("file:///a", "s3://b/c"), positions=32, store=None)
    assert local_file_urls(args) is args
    assert vars(args) == {"out": "/data/runs/a", "input": ["/x/*.jsonl", "rel/y.txt"], "sides": ("/a", "s3://b/c"),
                          "positions": 32, "store": None}


@pytest.mark.ray
def test_every_command_takes_file_urls(tmp_path, data_dir, ray_session, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a command taking 'file://...' literally would create ./file:

    def url(path) -> str:
        return f"file://{path}"

    corpus = url(data_dir / "fortunes-sample.jsonl")
    tokenizer = url(data_dir / "tokenizers" / "bert-base-uncased.tokenizer.json")
    text = ["--text-column", "text", "--tokenizer", tokenizer, "--positions", "32"]
    t = tmp_path
    commands = [
        ["count", "--input", corpus, *text, "--out", url(t / "c1")],
        ["count", "--input", url(data_dir / "fortunes-*.jsonl"), *text, "--out", url(t / "c2")],
        ["count", "--ray", "--workers", "1", "--input", corpus, *text, "--out", url(t / "c3")],
        ["refresh", "--store", url(t / "c3" / "store")],
        ["run", "--input", corpus, *text, "--dims", "2,4", "-q", "--out", url(t / "r1")],
        ["analyze", "--counts", url(t / "c1"), "--dims", "2,4", "-q", "--out", url(t / "a1")],
        ["report", url(t / "r1")],
        ["export", url(t / "r1"), "--dim", "8", "--out", url(t / "e.safetensors")],
        ["audit", url(t / "e.safetensors"), "--counts", url(t / "r1"), "--out", url(t / "audit.json")],
        ["diff", url(t / "c1"), url(t / "c2"), "-q", "--out", url(t / "d")],
        ["influence", "--depth", "2", "--length", "32", "--counts", url(t / "c1"), "--out", url(t / "inf")],
        ["adjacency", "--input", corpus, "--tokenizer", tokenizer, "--seq-len", "16", "--sequences", "2",
         "--layers", "1", "--dim", "32", "--heads", "2", "--out", url(t / "adj")],
    ]
    for command in commands:
        rc = main(command)
        err = capsys.readouterr().err
        assert rc == 0, (command[0], err)
    assert load_counts(t / "c1").equals(load_counts(t / "c2"))
    assert load_counts(t / "c1").equals(load_counts(t / "c3"))
    for made in ("c1/count.json", "r1/report.json", "a1/report.json", "e.safetensors", "audit.json", "d/diff.json"):
        assert (t / made).is_file(), made
    assert (t / "inf").is_dir() and (t / "adj").is_dir()
    assert not any(name.startswith("file:") for name in os.listdir(tmp_path))
