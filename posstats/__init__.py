"""posstats: information-optimal positional encodings from corpus statistics.

See THEORY.md for the mathematics. Public names are re-exported here.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
