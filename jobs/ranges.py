"""Position ranges of saved counts held by Ray actors, for an eigensolve whose memory per
process is bounded whatever the corpus size (issue #31).

The driver cuts the counts' rows into K ranges of about equal stored counts
(:func:`posstats.geometry.ranged.file_ranges`), K large enough that one range's square
roots fit ``--memory-budget`` (:func:`posstats.geometry.ranged.ranges_for_budget`). Each
:class:`RangeWorker` actor reads only its rows (:func:`posstats.geometry.ranged.load_sqrt_range`)
and answers the products of :class:`posstats.geometry.ranged.RangedSqrt`; the driver runs the
library's block Lanczos on that operator. Per product only (V, b) and (n_r, b) blocks move.
"""

from __future__ import annotations

import functools
import math
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from posstats.analysis import analyze_ranges, halves_reader, halves_starter
from posstats.counting.io import counts_file, load_header
from posstats.errors import OptionError, PosstatsError
from posstats.estimates.noise import NoiseFloor
from posstats.estimates.ranged_halves import RangeHalves
from posstats.estimates.ranged_jackknife import RangeReplicates
from posstats.estimates.thinning import range_noise_floor
from posstats.geometry.ranged import (
    MAX_RANGES,
    PROCESS_BASELINE_BYTES,
    RangedSqrt,
    file_ranges,
    load_sqrt_range,
    ranges_for_budget,
)
from posstats.processes import one_malloc_arena, return_freed_memory
from posstats.progress import progress

from .connect import connect_ray
from .output import peak_rss_bytes

__all__ = ["ActorRanges", "RangeWorker", "actor_replicates", "analyze_over_actors", "budget_ranges", "range_flags_problem",
           "start_range_workers"]

# Arrays at least this large go to the object store once per call, not once per actor.
_PUT_BYTES = 1 << 16


def _noise_floor(counts: Any, positions: np.ndarray, /, *, parts: int, seed: int) -> NoiseFloor:
    """:func:`posstats.estimates.thinning.range_noise_floor`, then its freed temporaries
    handed back (:func:`posstats.processes.return_freed_memory`) before the square roots are
    built: without it a third of the 1 B-token counts peaked at 3.18 GB instead of 2.65 GB."""
    floor = range_noise_floor(counts, positions, parts=parts, seed=seed)
    return_freed_memory()
    return floor


class RangeWorker:
    """An actor holding rows ``[start, stop)`` of saved counts as a
    :class:`posstats.geometry.ranged.SqrtRange` (one product thread)."""

    def __init__(self, cwd: str) -> None:
        if os.path.isdir(cwd):
            os.chdir(cwd)
        one_malloc_arena()  # arenas made from here on: Ray's own threads already have theirs
        self.range: Any = None
        self.replicates: RangeReplicates | None = None
        self.halves: RangeHalves | None = None
        self.bounds = (0, 0)

    def load(self, counts_path: str, start: int, stop: int, min_occupancy: int, noise_parts: int | None = None,
             seed: int = 0) -> dict[str, Any]:
        """Read and hold the range (with its noise floor when ``noise_parts`` is 2 or 4,
        :func:`posstats.estimates.thinning.range_noise_floor`); return what it holds and
        this process' peak memory."""
        noise_of = None if noise_parts is None else functools.partial(_noise_floor, parts=int(noise_parts), seed=int(seed))
        self.range = load_sqrt_range(counts_path, start, stop, min_occupancy=min_occupancy, threads=1, noise_of=noise_of)
        self.bounds = (int(start), int(stop))
        return self.where()

    def where(self) -> dict[str, Any]:
        """The range, its positions and stored counts, bytes held, pid, host, peak RSS."""
        r = self.range
        return {
            "start": self.bounds[0],
            "stop": self.bounds[1],
            "positions": 0 if r is None else int(r.shape[0]),
            "stored": 0 if r is None else int(r.s.nnz),
            "bytes_held": 0 if r is None else r.nbytes,
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "peak_rss_bytes": peak_rss_bytes(),
        }

    def held(self) -> tuple[np.ndarray, np.ndarray]:
        return self.range.held()

    def stats(self) -> tuple[np.ndarray, int]:
        return self.range.stats()

    def read_occupancy(self) -> tuple[np.ndarray, np.ndarray]:
        return self.range.read_occupancy()

    def noise(self) -> NoiseFloor:
        return self.range.noise()

    def count_totals(self, keep: np.ndarray) -> np.ndarray:
        return self.range.count_totals(keep)

    def row_entries(self) -> np.ndarray:
        return self.range.row_entries()

    # The pair steps gather rows into temporaries of tens of MB on Ray's threads, whose
    # freed blocks the heap keeps: handed back after each (without it the 1 B-token
    # stress phase lifted each actor from 2.4 GB to 3.3 GB, over a 3 GiB budget).

    def rows(self, local: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.range.rows(local)

    def count_rows(self, local: np.ndarray) -> Any:
        return self.range.count_rows(local)

    def row_dots(self, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        out = self.range.row_dots(i, j)
        return_freed_memory()
        return out

    def dots_with(self, i: np.ndarray, data: np.ndarray, indices: np.ndarray, indptr: np.ndarray,
                  j: np.ndarray) -> np.ndarray:
        out = self.range.dots_with(i, data, indices, indptr, j)
        return_freed_memory()
        return out

    def distance_to(self, s_pool: np.ndarray) -> np.ndarray:
        return self.range.distance_to(s_pool)

    def centred_frobenius_sq(self, mean: np.ndarray) -> float:
        return self.range.centred_frobenius_sq(mean)

    def times(self, x: np.ndarray) -> np.ndarray:
        return self.range.times(x)

    def t_times(self, y: np.ndarray) -> np.ndarray:
        return self.range.t_times(y)

    def start_replicates(self, groups: int, seed: int) -> None:
        """Split the range's tokens into the pair jackknife's groups
        (:class:`posstats.estimates.ranged_jackknife.RangeReplicates`), replacing an earlier split."""
        self.replicates = None
        self.replicates = RangeReplicates(self.range, groups=int(groups), seed=int(seed))
        return_freed_memory()

    def start_halves(self, path: str, expected: tuple[int, int, int, str], row_bin: np.ndarray, bins: int) -> None:
        """Hold this range's rows of the window groups' halves' noise
        (:class:`posstats.estimates.ranged_halves.RangeHalves`), for the rank test's edge."""
        self.halves = None
        self.halves = RangeHalves(self.range, path, tuple(expected), row_bin, int(bins))
        return_freed_memory()

    def stop_halves(self) -> None:
        """Let the halves' rows go."""
        self.halves = None
        return_freed_memory()

    def on_halves(self, method: str, *args: Any) -> Any:
        """``RangeHalves.method(*args)`` (:class:`ActorRanges` with ``via="on_halves"``)."""
        if self.halves is None:
            msg = "no halves: start_halves first"
            raise ValueError(msg)
        return getattr(self.halves, method)(*args)

    def stop_replicates(self) -> None:
        """Let the split go."""
        self.replicates = None
        return_freed_memory()

    def on_replicates(self, method: str, *args: Any) -> Any:
        """``RangeReplicates.method(*args)`` of the current split (:class:`ActorRanges` with
        ``via="on_replicates"``); the freed temporaries handed back after it."""
        if self.replicates is None:
            msg = "no jackknife split: start_replicates first"
            raise ValueError(msg)
        out = getattr(self.replicates, method)(*args)
        return_freed_memory()
        return out


class ActorRanges:
    """:class:`posstats.geometry.ranged.RangeRunner` over :class:`RangeWorker` actors: every
    call goes to all of them at once; an array shared by several calls is put once. With
    ``via`` (``"on_replicates"``) a call ``method`` runs ``actor.via(method, ...)``: the
    runner of the actors' jackknife splits."""

    def __init__(self, actors: Sequence[Any], /, *, via: str | None = None) -> None:
        self.actors = list(actors)
        self.via = via

    def __len__(self) -> int:
        return len(self.actors)

    def call(self, method: str, args: Sequence[tuple[Any, ...]] | None = None, /) -> list[Any]:
        import ray

        if self.via is not None:
            method, args = self.via, [(method, *call) for call in ([()] * len(self.actors) if args is None else args)]
        if args is None:
            return ray.get([getattr(a, method).remote() for a in self.actors])
        placed: dict[int, Any] = {}

        def ref(x: Any) -> Any:
            if isinstance(x, np.ndarray) and x.nbytes >= _PUT_BYTES:
                if id(x) not in placed:
                    placed[id(x)] = ray.put(x)
                return placed[id(x)]
            return x

        return ray.get([getattr(a, method).remote(*[ref(x) for x in call]) for a, call in zip(self.actors, args, strict=True)])


def actor_replicates(actors: Sequence[Any], /) -> Callable[[int, int], ActorRanges]:
    """``replicates(groups, seed)`` for :func:`posstats.analysis.analyze_ranges`: every
    actor splits its range's tokens into the jackknife's groups
    (:meth:`RangeWorker.start_replicates`); returns the runner over those splits."""

    def replicates(groups: int, seed: int) -> ActorRanges:
        ActorRanges(actors).call("start_replicates", [(int(groups), int(seed))] * len(actors))
        return ActorRanges(actors, via="on_replicates")

    return replicates


class _ActorHalves(ActorRanges):
    """The actors' :class:`posstats.estimates.ranged_halves.RangeHalves` (``via="on_halves"``),
    with ``release`` letting them go."""

    def release(self) -> None:
        ActorRanges(self.actors).call("stop_halves")


def actor_halves(actors: Sequence[Any], path: str, expected: tuple[int, int, int, str], /
                 ) -> Callable[[list[np.ndarray], int], ActorRanges]:
    """``start(row_bins, bins)`` for :func:`posstats.estimates.ranged_halves.ranged_halves_noise`:
    every actor holds its rows of the halves' noise (:meth:`RangeWorker.start_halves`);
    returns the runner over them."""

    def start(row_bins: list[np.ndarray], bins: int) -> ActorRanges:
        ActorRanges(actors).call("start_halves", [(path, tuple(expected), rb, int(bins)) for rb in row_bins])
        return _ActorHalves(actors, via="on_halves")

    return start


def start_range_workers(counts_path: str, bounds: Sequence[tuple[int, int]], *, min_occupancy: int,
                        noise_parts: int | None = None, seed: int = 0,
                        show_progress: bool | None = None) -> tuple[list[Any], list[dict[str, Any]]]:
    """One :class:`RangeWorker` per range, each loading its rows (all at once, each with its
    noise floor when ``noise_parts`` is given; a progress bar of the ranges read, on a
    terminal by default); returns (actors, what each holds). When there are more ranges
    than the cluster's CPUs, each actor asks for a share of a CPU so that all of them can
    be placed."""
    import ray
    import ray.exceptions

    cpus = float(ray.cluster_resources().get("CPU", 1.0))
    share = min(1.0, math.floor(100 * cpus / max(len(bounds), 1)) / 100) or 0.01
    cls = ray.remote(RangeWorker).options(num_cpus=share)
    actors = [cls.remote(os.getcwd()) for _ in bounds]
    try:
        loads = [a.load.remote(counts_path, int(lo), int(hi), int(min_occupancy), noise_parts, int(seed))
                 for a, (lo, hi) in zip(actors, bounds, strict=True)]
        what = "reading ranges" + (" with their noise floors" if noise_parts else "")
        with progress(total=len(loads), desc=what, unit="range", unit_scale=False, enabled=show_progress) as bar:
            waiting = list(loads)
            while waiting:
                done, waiting = ray.wait(waiting, num_returns=1)
                bar.update(len(done))
        held = ray.get(loads)
    except BaseException as exc:
        for a in actors:
            ray.kill(a, no_restart=True)
        cause = getattr(exc, "cause", None)
        if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(cause, PosstatsError):
            raise cause from None  # the actor's one-line reason (a damaged file), not Ray's traceback
        raise
    return actors, held


def analyze_over_actors(counts: str | os.PathLike, config: Any, ranges: int, /, *, address: str | None = None,
                        show_progress: bool | None = None) -> Any:
    """:func:`posstats.analysis.analyze_ranges` of a saved counts file (or its folder) cut
    into ``ranges`` position ranges of about equal stored counts, each held by a
    :class:`RangeWorker` actor (with its noise floor unless ``config.noise_floor`` is
    ``"off"``); the actors are killed once the analysis is done. No process, the caller's
    included, holds every count. Runs on the Ray this process is connected to, else joins
    ``address`` (:func:`jobs.connect.connect_ray`: ``$RAY_ADDRESS``, else an embedded Ray,
    shut down at the end). Returns the :class:`posstats.analysis.Analysis`."""
    import ray

    path = os.path.abspath(counts_file(counts))  # a missing or foreign path fails here, before Ray starts
    started, _ = connect_ray(address)
    try:
        noise_parts = None if config.noise_floor == "off" else config.noise_parts
        actors, _ = start_range_workers(path, file_ranges(path, ranges), min_occupancy=config.min_occupancy,
                                        noise_parts=noise_parts, seed=config.seed, show_progress=show_progress)
        header = load_header(path)
        expected = (header.positions, header.vocab_size, header.tokens, header.fingerprint)
        try:
            return analyze_ranges(header, RangedSqrt(ActorRanges(actors)), config,
                                  show_progress=show_progress, replicates=actor_replicates(actors), counts_source=path,
                                  halves=halves_starter(path, header, None, start=actor_halves(actors, path, expected)),
                                  half_sums=halves_reader(path, header))
        finally:
            for a in actors:
                ray.kill(a, no_restart=True)
    finally:
        if started:
            ray.shutdown()


def range_flags_problem(ranges: int | None, memory_budget: float | None, /) -> str | None:
    """Why ``--ranges K`` / ``--memory-budget GIB`` cannot cut counts into position ranges
    (one Ray actor each: K in 1..MAX_RANGES; a budget above a range process' baseline), or None."""
    if memory_budget is not None and not math.isfinite(memory_budget):
        return f"--memory-budget must be a finite number of GiB, got {memory_budget:g}"
    if memory_budget is not None and not memory_budget * 2**30 > PROCESS_BASELINE_BYTES:
        return (f"--memory-budget {memory_budget:g} GiB leaves nothing for the counts: each range's process needs "
                f"about {PROCESS_BASELINE_BYTES / 2**30:.2g} GiB besides them")
    if ranges is not None and not 1 <= ranges <= MAX_RANGES:
        return f"--ranges must be between 1 and {MAX_RANGES} (one Ray actor each), got {ranges}"
    return None


def budget_ranges(memory_budget: float, stored: int, /, *, at_least: int = 1) -> int:
    """The ranges (at least ``at_least``) that keep each range's process of ``stored``
    counts within ``--memory-budget`` GiB (:func:`posstats.geometry.ranged.ranges_for_budget`).

    Raises:
        OptionError: more than ``MAX_RANGES`` ranges would be needed.
    """
    k = ranges_for_budget(stored, int(memory_budget * 2**30), at_least=at_least)
    if k > MAX_RANGES:
        msg = (f"--memory-budget {memory_budget:g} GiB would cut {stored:,} stored counts into {k:,} ranges, one Ray "
               f"actor each (at most {MAX_RANGES}); give a larger budget")
        raise OptionError(msg)
    return k
