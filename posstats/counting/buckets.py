"""Position bucketing for long contexts (THEORY.md section 7).

Deep positions of a 32k-128k context are each seen by few windows, so their estimated
distributions are noisy (section 7). Pooling consecutive positions into a *bucket* trades
positional resolution for occupancy: a bucket's distribution is the pooled counts

    C_b[v] = sum_{i in bucket b} C[i, v],        occ_b = sum_{i in b} occ[i]

so its square-root distribution and every distance to it follow THEORY sections 2-3
unchanged (a bucket is a position whose counts are the sum of its members'). Pooling is
exact integer addition, so bucketing commutes with shard sums.

Two schemes, both partitions of ``0..n-1`` into consecutive half-open ranges
``[edges[b], edges[b+1])``:

- ``fixed:W``: buckets of W positions (the last one may be shorter).
- ``log:P``: logarithmic bins with P buckets per doubling of the position: the edges are
  ``0`` and the distinct values ``round(2**(k / P))`` (k = 0, 1, ...) below n, then n.
  The first positions keep a bucket each (their edges are 1 apart), deep ones are pooled
  ever more coarsely, matching the roughly ``1/position`` decay of occupancy in
  ``truncate`` mode.

A bucket is represented in the geometry (sequence distances for monotonicity, the
argument of sinusoidal/RoPE/ALiBi encodings) by its integer midpoint
``(edges[b] + edges[b+1] - 1) // 2``; the midpoints are distinct and increasing.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from posstats.counting.counts import PositionalCounts
from posstats.errors import PosstatsError

__all__ = ["BUCKET_SCHEMES", "Buckets", "bucket_counts", "fixed_buckets", "log_buckets", "parse_buckets"]

BUCKET_SCHEMES = ("fixed", "log")


@dataclass(frozen=True)
class Buckets:
    """A partition of positions ``0..n-1`` into consecutive buckets.

    Attributes:
        edges: (m + 1,) int64, strictly increasing, ``edges[0] = 0``, ``edges[-1] = n``;
            bucket b holds positions ``edges[b] <= i < edges[b + 1]``.
        scheme: ``"fixed"`` or ``"log"``.
        param: the scheme's parameter (width W, or buckets per doubling P).
    """

    edges: np.ndarray
    scheme: str
    param: int

    def __post_init__(self) -> None:
        e = np.asarray(self.edges, dtype=np.int64)
        if e.ndim != 1 or e.size < 2 or e[0] != 0 or np.any(np.diff(e) <= 0):
            msg = f"bucket edges must start at 0 and increase strictly; got {e[:8].tolist()}..."
            raise ValueError(msg)
        object.__setattr__(self, "edges", e)

    @property
    def positions(self) -> int:
        """n, the number of positions partitioned."""
        return int(self.edges[-1])

    def __len__(self) -> int:
        return int(self.edges.size - 1)

    @property
    def sizes(self) -> np.ndarray:
        """(m,) int64 positions per bucket."""
        return np.diff(self.edges)

    @property
    def midpoints(self) -> np.ndarray:
        """(m,) int64 representative positions ``(start + stop - 1) // 2``, increasing."""
        return (self.edges[:-1] + self.edges[1:] - 1) // 2

    def bucket_of(self, positions: Any, /) -> np.ndarray:
        """Bucket index of each 0-based position, int64."""
        pos = np.asarray(positions, dtype=np.int64)
        return np.searchsorted(self.edges, pos, side="right") - 1

    def spec_string(self) -> str:
        """``fixed:W`` or ``log:P``."""
        return f"{self.scheme}:{self.param}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: scheme, parameter, count, edges and midpoints."""
        return {
            "scheme": self.scheme,
            "param": int(self.param),
            "buckets": len(self),
            "edges": self.edges.tolist(),
            "midpoints": self.midpoints.tolist(),
        }


def fixed_buckets(n: int, width: int, /) -> Buckets:
    """Buckets of ``width`` consecutive positions over ``0..n-1`` (the last may be shorter).

    >>> fixed_buckets(10, 4).edges.tolist()
    [0, 4, 8, 10]
    """
    n, width = int(n), int(width)
    if n < 1 or width < 1:
        msg = f"fixed buckets need n >= 1 and width >= 1; got n={n}, width={width}"
        raise PosstatsError(msg)
    edges = np.append(np.arange(0, n, width, dtype=np.int64), n)
    return Buckets(edges, "fixed", width)


def log_buckets(n: int, per_doubling: int, /) -> Buckets:
    """Logarithmic buckets: ``per_doubling`` buckets per doubling of the position.

    Edges are 0, the distinct ``round(2**(k / P))`` below n, and n, so the first positions
    get a bucket each and deep positions are pooled geometrically.

    >>> log_buckets(20, 1).edges.tolist()
    [0, 1, 2, 4, 8, 16, 20]
    """
    n, per = int(n), int(per_doubling)
    if n < 1 or per < 1:
        msg = f"log buckets need n >= 1 and per_doubling >= 1; got n={n}, per_doubling={per}"
        raise PosstatsError(msg)
    top = int(math.ceil(per * math.log2(max(n, 2)))) + 1
    raw = np.round(2.0 ** (np.arange(top + 1) / per)).astype(np.int64)
    inner = np.unique(raw[(raw > 0) & (raw < n)])
    edges = np.concatenate([[0], inner, [n]]).astype(np.int64)
    return Buckets(np.unique(edges), "log", per)


def parse_buckets(text: str | None, n: int, /) -> Buckets | None:
    """Parse ``none`` / ``fixed:W`` / ``log:P`` for ``n`` positions (None for ``none``).

    Raises:
        PosstatsError: an unknown scheme or a parameter that is not a positive integer.
    """
    if text is None or text.strip().lower() in ("", "none", "off"):
        return None
    scheme, _, param = text.strip().partition(":")
    if scheme not in BUCKET_SCHEMES:
        msg = f"unknown bucketing {text!r}; use none, fixed:WIDTH or log:PER_DOUBLING"
        raise PosstatsError(msg)
    try:
        value = int(param)
    except ValueError:
        msg = f"bucketing {text!r}: {scheme} needs a positive integer parameter, e.g. {scheme}:{64 if scheme == 'fixed' else 8}"
        raise PosstatsError(msg) from None
    return fixed_buckets(n, value) if scheme == "fixed" else log_buckets(n, value)


def bucket_counts(counts: PositionalCounts, buckets: Buckets, /) -> PositionalCounts:
    """Pooled counts of each bucket: row b is ``sum_{i in bucket b} C[i]`` (exact int64).

    The result has ``len(buckets)`` positions (same vocabulary, mode and totals) and
    records the bucketing in ``metadata["buckets"]``. Dense counts stay dense, sparse stay
    sparse (CSR, never densified).

    Raises:
        ValueError: the buckets do not partition ``counts.positions`` positions.
    """
    n = counts.positions
    if buckets.positions != n:
        msg = f"buckets cover {buckets.positions} positions, counts have {n}"
        raise ValueError(msg)
    m = len(buckets)
    if counts.is_sparse:
        member = sp.csr_array(
            (np.ones(n, dtype=np.int64), (buckets.bucket_of(np.arange(n)), np.arange(n))), shape=(m, n)
        )
        matrix: np.ndarray | sp.csr_array = sp.csr_array(member @ counts.matrix, dtype=np.int64)
        matrix.sum_duplicates()
    else:
        matrix = np.add.reduceat(np.asarray(counts.matrix, dtype=np.int64), buckets.edges[:-1], axis=0)
    spec = dataclasses.replace(counts.spec, positions=m)
    meta = {**counts.metadata, "buckets": buckets.spec_string()}
    return PositionalCounts(spec, matrix, counts.sequences, counts.windows, counts.tokens, counts.fingerprint, meta)
