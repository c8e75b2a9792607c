"""Test hooks: delays that let the tests kill a process in the middle of a step.

posstats itself holds no test code. A test session puts this folder on ``PYTHONPATH``
(``tests/conftest.py``), so that every Python process it starts, the Ray workers and
the drivers of ``posstats`` commands included, runs ``sitecustomize.py`` here, which calls
:func:`install`. Installing patches three functions when (and only when) their module is
imported, each to sleep first:

==================  =============================================  ============================
delay               function                                       so that a test can kill ...
==================  =============================================  ============================
``shard_delay``     ``RunStore.write_partial``                     a shard counted, not saved
``reduce_delay``    ``posstats.jobs.count_workers.sum_row_range``  a reduce range being summed
``geometry_delay``  ``posstats.jobs.pipeline.analyze``             the pipeline's geometry task
==================  =============================================  ============================

A delay is read at each call, from the process' environment
(``POSSTATS_TEST_SHARD_DELAY``, ``..._REDUCE_DELAY``, ``..._GEOMETRY_DELAY``: for processes a
test starts with its own environment) or else from the JSON file named by
``POSSTATS_TEST_HOOKS_FILE`` (for the workers of the session's shared Ray, started before
the test: the ``test_hooks`` fixture writes it). Without either nothing sleeps.
"""

from __future__ import annotations

import functools
import importlib.abc
import json
import os
import sys
import time
from typing import Any

FILE_ENV = "POSSTATS_TEST_HOOKS_FILE"
ENV = {"shard_delay": "POSSTATS_TEST_SHARD_DELAY", "reduce_delay": "POSSTATS_TEST_REDUCE_DELAY",
       "geometry_delay": "POSSTATS_TEST_GEOMETRY_DELAY"}
# module -> (class or None, function, delay); posstats.jobs is also importable as jobs
PATCHES: dict[str, list[tuple[str | None, str, str]]] = {
    "posstats.corpus.shard_store": [("RunStore", "write_partial", "shard_delay")],
    "posstats.jobs.count_workers": [(None, "sum_row_range", "reduce_delay")],
    "jobs.count_workers": [(None, "sum_row_range", "reduce_delay")],
    "posstats.jobs.pipeline": [(None, "analyze", "geometry_delay")],  # in the geometry task, once it started
    "jobs.pipeline": [(None, "analyze", "geometry_delay")],
}


def delay(name: str) -> float:
    """Seconds to sleep for ``name`` now: the environment's value, else the file's, else 0."""
    value = os.environ.get(ENV[name])
    if value:
        return float(value)
    path = os.environ.get(FILE_ENV)
    if not path:
        return 0.0
    try:
        with open(path) as f:
            return float(json.load(f).get(name, 0.0))
    except (OSError, ValueError):
        return 0.0


def _sleeping_first(fn: Any, name: str) -> Any:
    if getattr(fn, "__posstats_test_hook__", False):
        return fn

    @functools.wraps(fn)  # same __module__ and __qualname__: Ray still pickles it by reference
    def hooked(*args: Any, **kwargs: Any) -> Any:
        seconds = delay(name)
        if seconds:
            time.sleep(seconds)
        return fn(*args, **kwargs)

    hooked.__posstats_test_hook__ = True
    return hooked


def _patch(module: Any) -> None:
    for owner_name, attr, name in PATCHES.get(module.__name__, ()):
        owner = getattr(module, owner_name) if owner_name else module
        setattr(owner, attr, _sleeping_first(getattr(owner, attr), name))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of a patched module so that the
    patch follows its execution."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _patch(module)

        loader.exec_module = exec_module
        return spec


def install() -> None:
    """Patch the modules already imported and every later import of the others."""
    if any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _PatchOnImport())
    for name in PATCHES:
        if name in sys.modules:
            _patch(sys.modules[name])
