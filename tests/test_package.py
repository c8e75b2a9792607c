"""Package hygiene: exports resolve, layering holds (the library never imports ray/torch/cupy)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import posstats

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", posstats.__all__)
def test_every_export_resolves(name):
    assert getattr(posstats, name) is not None


def test_python_dash_m_runs_the_command_line():
    """``python -m posstats.cli`` is the ``posstats`` command (docs/cli.md): the same version
    line, and a bad command exits non-zero with argparse's message."""
    ok = subprocess.run([sys.executable, "-m", "posstats.cli", "--version"], capture_output=True, text=True,
                        check=False)
    assert ok.returncode == 0 and ok.stdout.strip() == f"posstats {posstats.__version__}"
    bad = subprocess.run([sys.executable, "-m", "posstats.cli", "no-such-command"], capture_output=True, text=True,
                         check=False)
    assert bad.returncode != 0 and "invalid choice" in bad.stderr


def test_import_is_light():
    code = "import sys, posstats, posstats.analysis, posstats.cli; print(sorted(m for m in ('ray', 'torch', 'cupy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_library_never_imports_ray_or_jobs():
    """The CLI (posstats/cli) may launch Ray jobs from ``jobs/`` lazily; nothing imports ray itself."""
    offenders = []
    for path in (REPO / "posstats").rglob("*.py"):
        banned = ("ray",) if "cli" in path.relative_to(REPO / "posstats").parts else ("ray", "jobs")
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            names = [n.removeprefix("posstats.") if n.startswith("posstats.jobs") else n for n in names]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in banned]
    assert offenders == []


def test_module_level_imports_are_declared_dependencies():
    """Every third-party package imported at module level by the library is a declared
    dependency; optional ones (datasets, torch, cupy, ray, transformers) are imported inside
    functions only."""
    import re
    import sys
    import tomllib
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    deps = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {re.split(r"[<>=\[ ]", d)[0].lower().replace("-", "_") for d in deps}
    local = {"posstats", "jobs"}
    found = {}
    for path in (repo / "posstats").rglob("*.py"):
        for line in path.read_text().splitlines():
            m = re.match(r"(?:import|from) ([A-Za-z_][A-Za-z0-9_]*)", line)  # column 0: module level
            if m and m.group(1) not in local and m.group(1) not in sys.stdlib_module_names and m.group(1) != "__future__":
                found.setdefault(m.group(1), path.relative_to(repo).as_posix())
    undeclared = {mod: where for mod, where in found.items() if mod.lower() not in declared}
    assert undeclared == {}, undeclared
    assert "datasets" not in declared and "torch" not in declared  # extras, imported lazily


def test_the_wheel_ships_the_jobs_under_posstats_and_no_top_level_jobs(tmp_path):
    """``jobs/`` installs as ``posstats.jobs`` (through the link ``posstats/jobs``): a generic top-level
    ``jobs`` package would clash in users' environments. Every library subpackage ships."""
    import zipfile

    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path), str(REPO)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("posstats-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"posstats"}
    assert {"posstats/jobs/__init__.py", "posstats/jobs/count.py", "posstats/jobs/pipeline.py",
            "posstats/py.typed"} <= set(names)
    packages = {p.parent.relative_to(REPO).as_posix() for p in (REPO / "posstats").rglob("__init__.py")}
    assert {f"{p}/__init__.py" for p in packages} <= set(names)  # a new subpackage is not forgotten


def test_public_api_is_small_and_declared_once():
    """About a dozen names users need (issue #29), declared in __init__.pyi only: the
    runtime table is read from the stub, so the two cannot drift apart."""
    stub = ast.parse((REPO / "posstats" / "__init__.pyi").read_text())
    declared = {a.asname for node in stub.body if isinstance(node, ast.ImportFrom) and node.module != "posstats"
                for a in node.names}
    assert set(posstats.__all__) == declared | {"__version__"}
    assert len(posstats.__all__) <= 20
    init = ast.parse((REPO / "posstats" / "__init__.py").read_text())
    assert not any(isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("posstats.")
                   for n in ast.walk(init)), "public names are declared in __init__.pyi, not imported here"
    for sub in ("geometry", "estimates", "torch", "drift"):
        assert sub in dir(posstats)
