"""Shared fixtures: offline Hugging Face settings, paths to bundled data, one Ray session,
the array backends (``xp``: numpy always, cupy where a CUDA device answers) and the test
hooks (``test_hooks``: delays inside posstats' steps, :mod:`tests._hooks.posstats_test_hooks`)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import pytest

from posstats.geometry.backend import get_cupy, gpu_available

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
SHARED = REPO.parent / "shared"  # present in CI and on the team's machines, not in users' clones
HOOKS = REPO / "tests" / "_hooks"

# Every process this session starts (posstats commands, Ray workers) runs the test hooks
# (tests/_hooks/sitecustomize.py); set before the shared Ray starts its workers. One hooks
# file per pytest process, always assigned, never inherited: pytest-xdist workers inherit the
# controller's environment, and a file shared between workers let one worker's test clear
# the delay another worker's test was waiting on (CI, stop 60).
os.environ["PYTHONPATH"] = os.pathsep.join([str(HOOKS), *filter(None, [os.environ.get("PYTHONPATH")])])
_worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
os.environ["POSSTATS_TEST_HOOKS_FILE"] = os.path.join(
    tempfile.mkdtemp(prefix=f"posstats-test-hooks-{_worker}-"), "hooks.json")
sys.path.insert(0, str(HOOKS))
import posstats_test_hooks  # noqa: E402

posstats_test_hooks.install()


class HookDelays:
    """Delays inside posstats' steps for the processes of this session, the shared Ray's
    workers included (they read the hooks file at each call)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def set(self, **delays: float) -> None:
        """``shard_delay``, ``reduce_delay`` and ``geometry_delay`` in seconds."""
        unknown = set(delays) - set(posstats_test_hooks.ENV)
        if unknown:
            raise ValueError(f"unknown test hooks {sorted(unknown)}")
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(delays, f)
        os.replace(tmp, self.path)

    def clear(self) -> None:
        if os.path.exists(self.path):
            os.remove(self.path)


@pytest.fixture()
def test_hooks():
    """:class:`HookDelays` of this session; cleared after the test."""
    hooks = HookDelays(os.environ[posstats_test_hooks.FILE_ENV])
    hooks.clear()
    yield hooks
    hooks.clear()


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
    """One local Ray session shared by every test marked ``ray`` (ray.init is slow); one per
    pytest-xdist worker. ``address="local"`` always starts this process' own instance: with no
    address Ray would attach to any cluster found running on the machine (another test's)."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'posstats[ray]')")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
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
