"""CONTRIBUTING.md's module map cannot drift (issue #29): it names every module of posstats
(the CLI's one-module-per-subcommand package aside) and of jobs/, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _modules(*, packages: bool = False) -> set[str]:
    """Every module (``packages``: and every package, which the map may name too)."""
    found = set()
    for root in ("posstats", "jobs"):
        for path in (REPO / root).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[:2] == ("posstats", "cli"):
                continue
            if parts[-1] == "__init__":
                if packages:
                    found.add(".".join(parts[:-1]))
                continue
            found.add(".".join(parts))
    return found | {"posstats"}


def _mapped() -> set[str]:
    text = (REPO / "CONTRIBUTING.md").read_text()
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        for name in re.findall(r"`([a-z_.]+)`", line.split("|")[1]):
            names.add(name if name.startswith(("posstats", "jobs")) else f"posstats.{name}")
    return names


def test_the_module_map_names_every_module_and_no_other():
    modules, mapped = _modules(), _mapped()
    assert sorted(modules - mapped) == [], "add these modules to CONTRIBUTING.md's module map"
    assert sorted(mapped - _modules(packages=True)) == [], "CONTRIBUTING.md's module map names modules that do not exist"
