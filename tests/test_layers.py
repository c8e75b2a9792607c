"""The architecture as the imports say it (issue #12): one-way layers, no cycles.

Reads every module of ``posstats`` and ``jobs`` with :mod:`ast`, function-local imports
included, so a dependency cannot hide inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Imported inside functions on purpose: optional extras (torch, cupy, s3fs), heavy and only
# for some commands (matplotlib; datasets, whose import alone takes 0.7 s, for HF inputs),
# or a cluster runtime the library must not need (ray).
# Imported where used (start-up of every command): the optional or heavy packages, and the
# ones only some inputs need (URLs: fsspec; text: tokenizers; id strings: pyarrow.compute),
# and scipy.sparse in the counting modules, through posstats.counting.scipy_sparse (0.12 s
# that `posstats count` of sparse counts does without).
LAZY_ONLY = ("ray", "torch", "cupy", "cupyx", "matplotlib", "datasets", "s3fs", "fsspec", "tokenizers",
             "pyarrow.compute", "scipy.sparse")


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted([*(REPO / "posstats").rglob("*.py"), *(REPO / "jobs").rglob("*.py")]):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


MODULES = _modules()


def _resolve(target: str) -> str | None:
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def _optional_guards(tree: ast.Module) -> set[int]:
    """Ids of the import statements inside ``try: ... except ImportError`` (or
    ModuleNotFoundError): guards of optional dependencies, which may stay in functions; and
    inside ``if TYPE_CHECKING:`` (names for type checkers, never imported at run time)."""
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError") for h in node.handlers
        ):
            guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return guarded


def _imports(path: Path, *, skip_guarded: bool = False) -> list[tuple[str, bool]]:
    """(imported module, at module level?) for each import of ``path``."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    guarded = _optional_guards(tree) if skip_guarded else set()
    found = []
    for node in ast.walk(tree):
        if id(node) in guarded:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
            module = _absolute(path, node.module or "", node.level)
            names = [module] + [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        found += [(_repo_name(n), id(node) in top) for n in names]
    return found


def _absolute(path: Path, module: str, level: int) -> str:
    """The absolute name of ``from <level dots><module> import`` in ``path``."""
    if level == 0:
        return module
    package = path.relative_to(REPO).parent.parts
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _repo_name(name: str) -> str:
    """The repository's name for an imported module: the Ray entrypoints live in ``jobs/``
    and import as ``posstats.jobs`` (``posstats/jobs`` is a link to ``jobs/``)."""
    return "jobs" + name[len("posstats.jobs"):] if name == "posstats.jobs" or name.startswith("posstats.jobs.") else name


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        for name, _ in _imports(path):
            target = _resolve(name) if name.split(".")[0] in ("posstats", "jobs") else None
            if target and target != module and not module.startswith(target + "."):
                graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_among_posstats_and_jobs():
    assert _cycles(_graph()) == []


def test_imports_point_one_way():
    graph = _graph()
    wrong = [(m, t) for m, ts in graph.items() for t in ts
             if (m.startswith("jobs") and t.startswith("posstats.cli"))
             or (m.startswith("posstats") and not m.startswith("posstats.cli")
                 and (t.startswith("jobs") or t.startswith("posstats.cli")))]
    assert wrong == []


# The rank table (issue #29), lowest first: a module imports its own package and the ranks
# below it, never a package of its own rank or above. `posstats` itself (the lazy facade,
# importing nothing at run time) is outside the table.
RANKS: tuple[tuple[str, ...], ...] = (
    ("errors", "options"),                                   # the ground floor: errors, option declarations,
    ("progress", "processes", "ids"),                        # progress bars, processes, names,
    ("storage",),                                            # files, publishing, locks, JSON, safetensors
    ("counting",),                                           # count tensors, their files, the reduce
    ("corpus", "geometry"),                                  # reading inputs; distances, MDS, encodings
    ("memory", "baselines"),                                 # memory planning; architecture baselines
    ("estimates",),                                          # noise, nulls, intervals, the verdict
    ("report",),                                             # the analysis report, typed
    ("analysis", "testing"),                                 # counts -> analysis; simulated corpora
    ("runs",),                                               # run folders read back; counting to a folder
    ("audit",),                                              # a checkpoint's positions scored against a run
    ("reports",),                                            # rendering: summary, HTML, figures, export, audit text
    ("service", "torch"),                                    # pipeline store and config, schedules; torch module
    ("drift",),                                              # comparing runs and refreshes
    ("jobs",),                                               # executors and entrypoints (argparse allowed)
    ("cli",),                                                # the posstats command
)


def _rank_unit(module: str) -> str:
    """The table's name for a module: the subpackage or root module of posstats, or jobs."""
    parts = module.split(".")
    return "jobs" if parts[0] == "jobs" else parts[1] if len(parts) > 1 else "posstats"


RANK = {unit: i for i, units in enumerate(RANKS) for unit in units}


def test_every_package_has_a_rank():
    units = {_rank_unit(m) for m in MODULES} - {"posstats"}
    assert units - set(RANK) == set(), "add the new package or module to RANKS"
    assert set(RANK) - units == set(), "RANKS names a package that no longer exists"


def test_no_import_points_up_the_rank_table():
    wrong = []
    for module, targets in _graph().items():
        unit = _rank_unit(module)
        if unit == "posstats":
            continue
        for target in targets:
            other = _rank_unit(target)
            if other != unit and other != "posstats" and RANK[other] >= RANK[unit]:
                wrong.append(f"{module} -> {target}")
    assert wrong == [], "imports against the rank table (tests/test_layers.py RANKS):\n" + "\n".join(sorted(wrong))


def test_estimates_take_arrays_not_stores_or_files():
    """The estimates read no corpus, store or file: their inputs are counts and arrays
    (where parts come from is posstats.runs.noise_parts)."""
    users = sorted(f"{m} -> {t}" for m, ts in _graph().items() if _rank_unit(m) == "estimates"
                   for t in ts if _rank_unit(t) in ("corpus", "storage", "runs"))
    assert users == []


def test_argparse_only_in_the_cli_and_the_job_entrypoints():
    users = [m for m, p in MODULES.items() if _rank_unit(m) not in ("cli", "jobs")
             and any(n.split(".")[0] == "argparse" for n, _ in _imports(p))]
    assert users == []


def test_the_library_never_imports_ray_at_module_level_or_at_all():
    ray_users = [m for m, p in MODULES.items()
                 if m.startswith("posstats") and any(n.split(".")[0] == "ray" for n, _ in _imports(p))]
    assert ray_users == []


def test_cupy_only_through_the_backend():
    users = [m for m, p in MODULES.items() if m != "posstats.geometry.backend"
             and any(n.split(".")[0] in ("cupy", "cupyx") for n, _ in _imports(p))]
    assert users == []


def test_at_most_twelve_modules_directly_in_posstats():
    top = [p.name for p in (REPO / "posstats").glob("*.py")]
    assert len(top) <= 12, sorted(top)


def test_scipy_sparse_is_deferred_only_in_its_stand_in():
    """Function-local ``import scipy.sparse`` only in the stand-in module; the counting
    modules that use it go through the stand-in (``from ... import sp``), never both."""
    local = [m for m, p in MODULES.items()
             if any(n == "scipy.sparse" and not at_top for n, at_top in _imports(p, skip_guarded=True))]
    assert local == ["posstats.counting.scipy_sparse"]
    both = [m for m, p in MODULES.items()
            if "posstats.counting.scipy_sparse" in {n for n, _ in _imports(p)}
            and any(n.split(".")[0] == "scipy" for n, _ in _imports(p))]
    assert both == []


def test_a_sparse_count_never_imports_scipy(tmp_path):
    """``posstats count`` writes sparse counts from its blocks: no scipy at all (0.12 s of
    start-up), checked in a fresh interpreter."""
    import subprocess
    import sys

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 5000, size=int(rng.integers(1, 300))).tolist() for _ in range(50)]
    pq.write_table(pa.table({"ids": pa.array(docs, type=pa.list_(pa.int32()))}), tmp_path / "a.parquet")
    code = ("import sys; from posstats.cli import main; "
            f"rc = main(['count', '--input', {str(tmp_path / 'a.parquet')!r}, '--column', 'ids', '--vocab-size', "
            f"'5000', '--positions', '512', '--mode', 'pack', '--out', {str(tmp_path / 'out')!r}]); "
            "print(rc, sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.stdout.splitlines()[-1] == "0 []", run.stderr
    assert (tmp_path / "out" / "counts.csr.safetensors").exists()


def test_no_command_starts_by_importing_scipy_stats():
    """scipy.stats costs 0.8 s of every command's start: the CLI, the analysis and the
    estimates take their few distributions from scipy.special (checked in a fresh
    interpreter)."""
    import subprocess
    import sys

    code = ("import sys; import posstats.cli, posstats.analysis, posstats.drift.compare, posstats.cli.influence; "
            "print(sorted(m for m in sys.modules if m.startswith('scipy.stats')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.stdout.splitlines()[-1] == "[]", run.stderr


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_are_at_module_level(module):
    """Except the lazy-only packages, optional-dependency guards and a module importing
    itself (a Ray task referenced by name, also when the module runs as ``__main__``)."""
    local = sorted({n for n, at_top in _imports(MODULES[module], skip_guarded=True)
                    if not at_top and n.split(".")[0] not in LAZY_ONLY and n not in LAZY_ONLY and _resolve(n) != module})
    assert local == [], f"{module}: function-local imports {local}"
