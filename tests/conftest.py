"""Shared fixtures: offline Hugging Face settings, paths to bundled data, one Ray session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
SHARED = REPO.parent / "shared"  # present in CI and on the team's machines, not in users' clones


@pytest.fixture(autouse=True)
def _offline_hf(monkeypatch, tmp_path_factory):
    """Nothing may be downloaded at test time: HF libraries offline, cache in a temp folder."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.getbasetemp() / "hf_home"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The repo's bundled sample corpora and tokenizers."""
    return DATA


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The team's shared folder (real corpora, tokenizers); skips when absent."""
    if not (SHARED / "corpora").is_dir():
        pytest.skip("../shared is not present in this checkout")
    return SHARED


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray session shared by every test marked ``ray`` (ray.init is slow)."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'posstats[ray]')")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
