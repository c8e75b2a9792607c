"""posstats: information-optimal positional encodings from corpus statistics.

Positional counts -> Hellinger geometry -> classical MDS -> encodings and stress
(THEORY.md). The public names are declared once, in ``__init__.pyi`` (what type checkers
read), and imported here on first use (Scientific Python SPEC 1), so ``import posstats``
stays light and never imports torch, cupy or ray. Everything else is reached through its
subpackage: ``posstats.geometry.mds.classical_mds``, ``posstats.estimates.null_rank.null_rank``.

>>> import posstats
>>> c = posstats.count_sequences([[1, 2], [1, 3]], positions=2, vocab_size=4)
>>> c.occupancy().tolist()
[2, 2]
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any

__version__ = "0.1.0"


def _stub_exports(stub: Path) -> tuple[dict[str, str], frozenset[str]]:
    """(public name -> defining module, subpackages) from the ``from X import y as y`` lines
    of the stub; ``from posstats import sub as sub`` names a subpackage."""
    names: dict[str, str] = {}
    subpackages = set()
    for node in ast.parse(stub.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if node.module == "posstats":
                    subpackages.add(alias.name)
                else:
                    names[alias.asname or alias.name] = node.module
    return names, frozenset(subpackages)


_EXPORTS, _SUBPACKAGES = _stub_exports(Path(__file__).with_name("__init__.pyi"))

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"posstats.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        msg = f"module 'posstats' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, *_SUBPACKAGES])
