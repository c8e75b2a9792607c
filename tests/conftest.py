"""Shared fixtures: offline Hugging Face settings, paths to bundled data, one Ray session,
and the array backends (``xp``: numpy always, cupy where a CUDA device answers)."""

from __future__ import annotations

import os
import types
from pathlib import Path

import numpy as np
import pytest

from posstats.geometry.backend import get_cupy, gpu_available

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


def _cupy_or_skip() -> types.ModuleType:
    """cupy, or skip the calling test saying what is missing (the package or a device)."""
    try:
        cupy = get_cupy()
    except ImportError as exc:
        pytest.skip(str(exc))
    if not gpu_available():
        pytest.skip("cupy is installed but no CUDA device answers")
    return cupy


@pytest.fixture(scope="module", params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def xp(request) -> types.ModuleType:
    """The array namespace a kernel test runs on: every such test runs once per backend.

    Build inputs with ``xp.asarray``, compare on the host (``to_numpy``) against the same
    oracles on both backends, and check that array outputs stay on the input's device.
    Module scope: hypothesis tests may use it (no per-example function fixture).
    """
    return np if request.param == "numpy" else _cupy_or_skip()


@pytest.fixture(scope="session")
def cupy() -> types.ModuleType:
    """cupy for a test that only makes sense on a GPU (mark it ``gpu`` too); skips otherwise."""
    return _cupy_or_skip()
