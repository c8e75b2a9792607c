"""Memory estimates checked before big allocations, so that an impossible run is refused
at once with a figure and the flag to change, instead of a traceback or the OOM killer
minutes later.

Every estimate here is a *lower bound* of what the step allocates at its peak (the arrays
that are certainly alive together, measured on the current code), never a guess with a
safety factor: a run that fits today is never refused. Allocations the estimate leaves
out (small temporaries, the reader's buffers, the sparse accumulator, which grows with
the corpus) can still fail; ``posstats`` then reports the ``MemoryError`` in one line.

What is "available": ``MemAvailable`` of ``/proc/meminfo``, lowered to the free part of
a cgroup (v2 ``memory.max``, v1 ``memory.limit_in_bytes``) when the process runs under a
limit. Where neither can be read (not Linux), nothing is refused.
"""

from __future__ import annotations

from pathlib import Path

from posstats.counting.counts import CountSpec
from posstats.errors import OptionError
from posstats.geometry.backend import get_cupy

__all__ = [
    "ANALYSIS_BYTES_PER_STORED_COUNT",
    "MEMORY_HINTS",
    "analysis_bytes",
    "available_memory",
    "count_bytes",
    "encoding_probe_bytes",
    "format_bytes",
    "memory_hint",
    "require_count_memory",
    "require_memory",
    "table_bytes",
    "transformer_bytes",
]

_UNLIMITED = 1 << 60  # cgroup "no limit" values are near 2**63

# What to change, per command, when memory runs out where no estimate was made.
MEMORY_HINTS = {
    "count": "lower --memory-budget (sparse counts) or --positions",
    "run": "lower --memory-budget (sparse counts), --positions or --exact-limit, or use --buckets",
    "analyze": "lower --exact-limit (sampled pairs above it) or --dims, or use --buckets",
    "refresh": "lower --exact-limit or --dims in the configuration, or use buckets",
    "pipeline": "lower count.memory_budget, geometry.exact_limit or the dims in the configuration",
    "export": "lower --dim (or --rank)",
    "audit": "audit fewer positions (--min-occupancy) or a smaller table",
    "influence": "lower --length or --dim",
    "adjacency": "lower --dim, --layers, --sequences or --seq-len",
}


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value < _UNLIMITED else None


def _inactive_file(stat: Path, key: str) -> int:
    """Reclaimable page cache of a cgroup (counted in its usage, but freed on demand)."""
    try:
        for line in stat.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _cgroup_free() -> int | None:
    """Bytes left under this process's cgroup memory limit, or None without a limit."""
    root = Path("/sys/fs/cgroup")
    limit = _read_int(root / "memory.max")  # cgroup v2
    if limit is not None:
        used = _read_int(root / "memory.current") or 0
        return max(limit - used + _inactive_file(root / "memory.stat", "inactive_file"), 0)
    v1 = root / "memory"
    limit = _read_int(v1 / "memory.limit_in_bytes")
    if limit is not None:
        used = _read_int(v1 / "memory.usage_in_bytes") or 0
        return max(limit - used + _inactive_file(v1 / "memory.stat", "total_inactive_file"), 0)
    return None


def available_memory() -> int | None:
    """Bytes this process can still allocate without swapping, or None when unknown.

    ``MemAvailable`` from ``/proc/meminfo``, or the free part of the cgroup limit when
    that is smaller.
    """
    found = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        found = None
    free = _cgroup_free()
    if free is not None:
        found = free if found is None else min(found, free)
    return found


def format_bytes(nbytes: float, /) -> str:
    """``7.3 TiB``, ``21.2 GiB``, ``512 MiB``, ``12 B`` (binary units, 3 significant digits)."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            break
        value /= 1024
    if unit == "B":
        return f"{int(value)} B"
    return f"{value:.3g} {unit}" if value < 1000 else f"{value:,.0f} {unit}"


def require_memory(nbytes: int, /, *, what: str, hint: str, command: str = "posstats") -> None:
    """Refuse (:class:`~posstats.errors.OptionError`) when ``nbytes`` exceed the memory available now.

    Args:
        nbytes: the estimate (a lower bound of the step's peak, see the module docstring).
        what: what the memory is for, e.g. ``"the 987,654 x 987,654 distance matrix"``.
        hint: the option(s) to change, named ``{name}`` (:class:`~posstats.errors.OptionError`:
            the command line prints its flags), e.g. ``"lower {exact_limit} or use {buckets}"``.
        command: the step that needs it, the message's subject (``"analyze"``).

    The message: ``"analyze needs about 7.3 TiB for the 987,654 x 987,654 distance matrix
    but 21.2 GiB are available; lower --exact-limit or use --buckets"``.
    """
    available = available_memory()
    if available is None or nbytes <= available:
        return
    msg = f"{command} needs about {format_bytes(nbytes)} for {what} but {format_bytes(available)} are available; {hint}"
    raise OptionError(msg)


# --------------------------------------------------------------------------- estimates
# Each returns (bytes, what, hint) for require_memory.


def count_bytes(positions: int, vocab_size: int, /, *, dense: bool) -> tuple[int, str, str]:
    """Counting in one process: dense, the ``n x V`` int64 accumulator and the copy its
    result is (``CountAccumulator.result``); sparse, the per-position arrays of the result
    (CSR row pointers and the occupancy, ``n + 1`` and ``n`` int64)."""
    n, v = int(positions), int(vocab_size)
    if dense:
        return (2 * 8 * n * v, f"the dense {n:,} x {v:,} int64 counts (the accumulator and its result)",
                "lower {memory_budget} (counts above it are kept sparse) or {positions}")
    return (16 * n + 8, f"the per-position arrays of {n:,} positions (sparse counts)", "lower {positions}")


def require_count_memory(spec: CountSpec, /, *, budget_bytes: float, tokens: int | None = None) -> None:
    """Refuse a one-process count that cannot fit, by the kernel rule
    (:meth:`CountSpec.prefers_dense` of ``budget_bytes``, i.e. ``--memory-budget``, and the
    expected ``tokens``; None assumes a corpus big enough for the dense kernel)."""
    dense = spec.fits_dense(budget_bytes) if tokens is None else spec.prefers_dense(budget_bytes, tokens)
    need, what, hint = count_bytes(spec.positions, spec.vocab_size, dense=dense)
    require_memory(need, what=what, hint=hint, command="count")


def encoding_probe_bytes(dims, /) -> tuple[int, str, str]:
    """Checking the encodings at the widest ``--dims`` on two positions (done before any
    counting): a 2 x D probe table and a 2 x D encoding, float64."""
    d = max(int(x) for x in dims)
    return 2 * 2 * 8 * d, f"encodings of width {d:,} ({{dims}})", "lower {dims}"


# Bytes a stored (sparse) count of the geometry rows costs an analysis in one process beyond
# the loaded counts: the square roots ``S`` and the row-major ``S^T`` of the MDS operator
# (float64 and an int32 index each: 24), the halves' noise where it is measured (12 a
# stored entry) and the sampled geometry's gathers. Measured with the defaults at
# n = 131,072 on 2.02e8 generated tokens (1.26e8 stored, pack, with the halves): 7.7-8.2 GB
# peak, 58-62 bytes a stored count with the counts (8) and the interpreter (0.3 GB), so
# 50-54 beyond the counts; 40 stays below that measured peak (the certain part, S and S^T,
# is 24), so a run that fits is not refused. On 1.0e9 tokens (5.25e8
# stored) the one-process analysis passed 24 GB and was killed (226 s in, without the
# halves); the refusal now comes after loading the counts, with the ranges as the way out.
ANALYSIS_BYTES_PER_STORED_COUNT = 40


def analysis_bytes(
    rows: int,
    vocab_size: int,
    /,
    *,
    dims,
    encodings: int,
    exact: bool,
    dense_counts: bool,
    stored: int = 0,
) -> tuple[int, str, str]:
    """The peak of :func:`posstats.analysis.analyze` on ``rows`` geometry rows.

    Exact path (rows <= exact limit): the ``m x m`` float64 distance matrix and one more
    ``m x m`` matrix alive with it (the centred MDS matrix, then each encoding's own
    distances in the stress), plus one ``m x D`` encoding; dense counts also make the
    float64 square-root rows (``m x V``) and one temporary of that size. Sampled path: no
    ``m x m`` matrix, but every (encoding, width) is held at once (``m x D`` each). Sparse
    rows: :data:`ANALYSIS_BYTES_PER_STORED_COUNT` for each of their ``stored`` counts.

    >>> need, what, hint = analysis_bytes(131_072, 50_257, dims=[2, 16, 64], encodings=6, exact=False,
    ...                                   dense_counts=False, stored=525_000_000)
    >>> round(need / 2**30, 1), what.split(" (")[0], "{memory_budget}" in hint
    (20.0, 'the 525,000,000 stored counts of 131,072 positions held in one process', True)
    """
    m, v = int(rows), int(vocab_size)
    widths = [int(d) for d in dims]
    encodings = max(int(encodings), 1)
    sqrt_rows = 2 * 8 * m * v if dense_counts else 3 * 8 * v
    stored_part = 0 if dense_counts else ANALYSIS_BYTES_PER_STORED_COUNT * int(stored)
    if exact:
        parts = {
            "matrix": 2 * 8 * m * m,
            "encodings": 8 * m * max(widths),
            "rows": sqrt_rows,
            "stored": stored_part,
        }
    else:
        parts = {"encodings": 8 * m * sum(widths) * encodings, "rows": 8 * v if not dense_counts else sqrt_rows,
                 "stored": stored_part}
    total = sum(parts.values())
    top = max(parts, key=parts.get)
    if top == "stored":
        what = (f"the {int(stored):,} stored counts of {m:,} positions held in one process (their square roots, "
                "the MDS operator's transpose, the halves' noise)")
        hint = ("analyse over position ranges held by Ray actors: {memory_budget} GIB (each range within it) or "
                "{ranges} K, or use {buckets}")
        return total, what, hint
    if top == "matrix":
        what = f"the {m:,} x {m:,} distance matrix and its working copy"
        hint = "lower {exact_limit} (pairs are sampled above it) or use {buckets}"
    elif top == "encodings":
        what = f"the encodings of {m:,} positions at widths up to {max(widths):,} ({{dims}})"
        hint = "lower {dims}, or use {buckets}"
    else:
        what = f"the square-root distributions of {m:,} positions x {v:,} tokens"
        hint = "count with a lower {memory_budget} (sparse counts) or use {buckets}"
    return total, what, hint


def table_bytes(positions: int, dim: int, rank: int, /, *, itemsize: int) -> tuple[int, str, str]:
    """``posstats export``: the ``n x D`` table in float64 (the product ``A W^T``) and in the
    stored dtype, and the ``D x r`` basis."""
    n, d, r = int(positions), int(dim), int(rank)
    return (8 * n * d + int(itemsize) * n * d + 8 * d * r, f"the {n:,} x {d:,} position table ({{dim}})",
            "lower {dim}")


def transformer_bytes(*, layers: int, dim: int, vocab_size: int, mlp_ratio: int, tokens: int,
                      itemsize: int = 4) -> tuple[int, str, str]:
    """A randomly initialised transformer (``posstats adjacency`` / ``influence --measure``):
    its weights (the ``V x D`` token table, ``(4 + 2 r) D^2`` per block) and the hidden
    states of every layer (``(layers + 1) x tokens x D`` float64)."""
    d = int(dim)
    weights = int(itemsize) * (int(vocab_size) * d + int(layers) * (4 + 2 * int(mlp_ratio)) * d * d)
    states = 8 * (int(layers) + 1) * int(tokens) * d
    return weights + states, f"a {layers}-layer model of width {d:,} ({{dim}})", "lower {dim} or {layers}"


def memory_hint(command: str | None, /) -> str:
    """The flags to change when ``command`` runs out of memory."""
    return MEMORY_HINTS.get(command or "", "use a smaller problem or a machine with more memory")



def gpu_fits(nbytes: int, /, *, share: float) -> bool:
    """Whether ``nbytes`` fit within ``share`` (0..1) of the GPU's free memory now.

    For a Hellinger job on the device: counts and square roots (``n x V``) plus the
    result and one block temporary (``n x n``), all float64: ``8 (2 n V + 2 n^2)`` bytes.
    """
    free, _ = get_cupy().cuda.runtime.memGetInfo()
    return nbytes < share * free
