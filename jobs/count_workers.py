"""Where the counting job's shards run: :class:`CountWorker`, the Ray actor that counts shards
and sums ranges of their partials, and the two engines that drive a pool of them, on Ray
(``_Engine``: one task in flight per actor, lost actors replaced, shards retried up to
``MAX_SHARD_ATTEMPTS``) or one at a time in this process (``_LocalEngine``, the same steps
without Ray), with :class:`JobOptions`, how a counting job runs (store, cluster, workers,
executor). What to count and in which order is :mod:`posstats.jobs.count`'s.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from posstats.corpus.count_step import accumulate_shard
from posstats.corpus.shard_store import RunStore
from posstats.corpus.shards import Shard, partial_is_dense
from posstats.corpus.source import CorpusSource
from posstats.corpus.tokenizer import load_tokenizer
from posstats.counting.counts import DEFAULT_DENSE_BUDGET, CountSpec
from posstats.counting.io import counts_file, load_header
from posstats.counting.pack import Placement, stitch
from posstats.counting.ranges import assemble_ranges, row_ranges, sum_row_range
from posstats.counting.reduce import PARTIAL_MARKER, CorruptPartialError, check_partial, mark_result
from posstats.counting.window_groups_io import (
    WINDOW_GROUPS_FILE,
    save_halves_from_ranges,
    sum_window_group_files,
    window_groups_file,
)
from posstats.errors import InputError, PosstatsError
from posstats.ids import validate_run_id
from posstats.storage.jsontext import read_json_file, write_json_atomic
from posstats.storage.publish import file_sha256

from .connect import connect_ray

__all__ = ["ACTOR_START_TIMEOUT_S", "MAX_SHARD_ATTEMPTS", "RANGES_PER_WORKER", "RANGE_BYTES", "CountWorker",
           "JobOptions"]


MAX_SHARD_ATTEMPTS = 3  # actor losses tolerated per shard or reduce task (after Ray's own retries)
RANGE_BYTES = 64 * 2**20  # partial bytes read per reduce range (bounds an actor's memory)
RANGES_PER_WORKER = 8  # small ranges keep a range's sums in cache: 16 ranges reduce 202 M tokens 1.9x faster than 4
ACTOR_START_TIMEOUT_S = 600



@dataclass(frozen=True)
class JobOptions:
    """How to run a counting job (what to count is a CorpusSource + CountSpec).

    Attributes:
        store: run-store folder (shared by every node).
        run_id: run name; None derives it from the inputs and the counting configuration.
        address: Ray cluster to join; None joins ``$RAY_ADDRESS`` if set, else starts an
            embedded local Ray (and shuts it down at the end).
        workers: counting actors; None = one per CPU of the cluster.
        skip_bad_shards: record unreadable shards and finish without them.
        shard_bytes: target shard size in bytes (JSONL / text files above it are cut into
            line ranges, consecutive Parquet row groups joined up to it); None: the size
            the store recorded at its first run, else :func:`posstats.corpus.shards.auto_shard_bytes` of the
            corpus for ``workers`` (when None: the CPUs of the cluster joined, or of this
            machine for an embedded Ray).
        dense_budget: bytes of a dense ``n x V`` int64 array allowed per counting actor
            (used for shards big enough to pay for it; sparse otherwise). The storage of
            partials and result is chosen by size (:func:`posstats.counting.io.choose_storage`),
            as in the single-process ``posstats count``.
        ranges: position ranges of the reduce; None: ``RANGES_PER_WORKER`` per worker,
            more when the partials exceed ``RANGE_BYTES`` per range.
        show_progress: progress bar on stderr (None: only on a terminal).
        out: output folder recorded in the manifest (``posstats refresh`` writes there).
        dashboard: start the dashboard with an embedded Ray (about 2 s of start-up).
        executor: ``ray`` (a pool of actors) or ``local`` (the same steps, one at a time,
            in this process: no Ray, same store, markers, resume and refresh).
        window_groups: K of the window groups each shard keeps and the reduce sums
            (:func:`posstats.corpus.count_step.shard_window_groups`: truncate and chunk mode,
            up to 4,096 positions); 0: none.
    """

    store: str
    run_id: str | None = None
    address: str | None = None
    workers: int | None = None
    skip_bad_shards: bool = False
    shard_bytes: int | None = None
    dense_budget: int = DEFAULT_DENSE_BUDGET
    ranges: int | None = None
    show_progress: bool | None = None
    out: str | None = None
    dashboard: bool = False
    executor: Literal["ray", "local"] = "ray"
    window_groups: int = 0

    def __post_init__(self) -> None:
        if self.run_id is not None:
            validate_run_id(self.run_id)  # it names files and folders in the store
        if self.executor not in ("ray", "local"):
            raise PosstatsError(f"executor must be ray or local, got {self.executor!r}")


def _log(message: str) -> None:
    print(f"posstats: {message}", file=sys.stderr, flush=True)


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# ----------------------------------------------------------------------------- actor


class CountWorker:
    """A counting actor: reads and counts shards, persists partials, sums partials.

    State that outlives one call: the run store handle, the reader options and the loaded
    tokenizer. Everything it returns is a small dict.
    """

    def __init__(
        self,
        store: str,
        source: dict[str, Any],
        spec: dict[str, str],
        metadata: dict[str, str],
        dense_budget: int,
        cwd: str,
        window_groups: int = 0,
    ) -> None:
        if os.path.isdir(cwd):
            os.chdir(cwd)  # relative input paths mean what they mean to the driver
        self.store = RunStore(store)
        self.source = CorpusSource.from_dict(source)
        self.spec = CountSpec.from_metadata(spec)
        self.metadata = dict(metadata)
        self.dense_budget = int(dense_budget)
        self.window_groups = int(window_groups)
        use_tokenizer = self.source.column is None and self.source.tokenizer
        self.tokenizer = load_tokenizer(self.source.tokenizer) if use_tokenizer else None
        self._buffer = None  # one n x V int64 array for all dense shards of this actor

    def _dense_buffer(self, shard: Shard) -> Any:
        """The reusable dense accumulator, made on the first dense shard; None for sparse."""
        if not partial_is_dense(self.spec, shard, dense_budget=self.dense_budget):
            return None
        if self._buffer is None:
            self._buffer = np.zeros((self.spec.positions, self.spec.vocab_size), dtype=np.int64)
        return self._buffer

    def where(self) -> dict[str, Any]:
        """pid, hostname and Ray node id of this actor (``local`` in the local executor)."""
        ray = sys.modules.get("ray")  # never imported by the local executor
        node = ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else "local"
        return {"pid": os.getpid(), "hostname": socket.gethostname(), "node_id": node}

    def count(self, shard: dict[str, Any]) -> dict[str, Any]:
        """Count one shard unless its marker exists; return a summary (status counted,
        cached or bad)."""
        s = Shard.from_dict(shard)
        marker = self.store.marker(s.shard_id)
        if marker is not None:
            return {"status": "cached", "shard_id": s.shard_id, "tokens": marker["tokens"], "seconds": 0.0}
        who = self.where()
        self.store.mark_started(s.shard_id, **who)
        t = time.perf_counter()
        try:
            # A dense partial shares the buffer: it is saved below, before the next shard.
            acc = accumulate_shard(s, self.source, self.spec, tokenizer=self.tokenizer,
                                   dense_budget=self.dense_budget, metadata=self.metadata,
                                   out=self._dense_buffer(s), window_groups=self.window_groups)
        except PosstatsError as exc:
            return {"status": "bad", "shard_id": s.shard_id, "error": str(exc), **who}
        seconds = time.perf_counter() - t
        t = time.perf_counter()
        marker = self.store.write_partial(s, acc, seconds=round(seconds, 6), **who)
        save_s = time.perf_counter() - t
        return {"status": "counted", "shard_id": s.shard_id, "tokens": marker["tokens"], "seconds": seconds,
                "save_seconds": save_s, **who}

    def check(self, path: str) -> dict[str, Any] | None:
        """None when the saved counts at ``path`` match their marker, else the corrupt
        partial's ``{"path", "error", "detail"}`` (:func:`posstats.counting.reduce.check_partial`)."""
        try:
            check_partial(path)
        except CorruptPartialError as exc:
            return {"path": exc.path, "error": str(exc), "detail": exc.detail}
        return None

    def sum_range(self, items: list[Placement], start: int, stop: int, out: str) -> dict[str, Any]:
        """Rows ``[start, stop)`` of the signed sum into the range file ``out``; a note
        ``<out>.started.json`` says which process took it (diagnostics)."""
        write_json_atomic(f"{out}.started.json", {"started": _stamp(), "start": start, "stop": stop, **self.where()})
        # the engine checked every item (check) before handing out ranges
        return sum_row_range(items, self.spec, start, stop, out, verified=True)

    def write_halves(self, halves: list[list[dict[str, Any]]], out: str) -> dict[str, Any]:
        """The two halves' range files (:meth:`sum_range` of each half's placed partials)
        streamed into the window-groups file beside the assembled counts in ``out``
        (:func:`posstats.counting.window_groups_io.save_halves_from_ranges`):
        ``{"file", "sha256", "groups", "windows"}``, or ``{"skipped": why}`` when they do
        not add up (the counts stand)."""
        try:
            target, info = save_halves_from_ranges(halves, load_header(out), out)
        except InputError as exc:
            return {"skipped": str(exc)}
        return {"file": target.name, "sha256": file_sha256(target), **info}

    def sum_window_groups(self, items: list[tuple[str, int]], out: str) -> dict[str, Any]:
        """The signed sum of the items' window groups beside the assembled counts in ``out``
        (:func:`posstats.counting.window_groups_io.sum_window_group_files`), each partial's
        file checked against its marker's SHA-256 first: ``{"file", "groups", "windows"}`` (and
        ``short_halves`` where every item kept them),
        or ``{"skipped": why}`` when a file is missing, damaged or does not add up (the
        counts stand; analyze then uses the permutation null and says why)."""
        try:
            for path, _ in items:
                marker = read_json_file(Path(path) / PARTIAL_MARKER, what="run-store file") or {}
                target = window_groups_file(path)
                if target is None or file_sha256(target) != (marker.get("window_groups") or {}).get("sha256"):
                    msg = (f"{Path(path) / WINDOW_GROUPS_FILE}: missing or does not match the SHA-256 its marker "
                           f"{PARTIAL_MARKER} records (delete the partial to count it again)")
                    raise InputError(msg)
            target, info = sum_window_group_files(items, load_header(out), out)
        except InputError as exc:
            return {"skipped": str(exc)}
        entry = {"file": target.name, "sha256": file_sha256(target), **info}
        marker = read_json_file(Path(out) / PARTIAL_MARKER, what="run-store file") or {}
        write_json_atomic(Path(out) / PARTIAL_MARKER, {**marker, "window_groups": entry})  # a refresh sums it again
        return entry

    def assemble(self, parts: list[dict[str, Any]], items: list[Placement], out: str,
                 adjust: tuple[int, int]) -> dict[str, Any]:
        """Stream the range files into the result folder ``out`` and mark it complete;
        ``adjust``: the (windows, tokens) of pack stitching."""
        summary = assemble_ranges(parts, items, self.spec, out, metadata=self.metadata, adjust=tuple(adjust))
        mark_result(out, summary)
        return summary


# ----------------------------------------------------------------------------- engine


def _actor_lost_errors() -> tuple[type, ...]:
    """The Ray exceptions that mean a counting actor is gone (its shard must be redone)."""
    from ray.exceptions import RayActorError

    try:
        from ray.exceptions import ActorUnavailableError
    except ImportError:  # older Ray
        return (RayActorError,)
    return (RayActorError, ActorUnavailableError)


@dataclass
class _Tally:
    """What the actors have reported so far: results by shard id, bad shards, actor losses
    per shard, tokens counted, and whether dispatching stopped (at a bad shard)."""

    results: dict[str, dict] = field(default_factory=dict)
    bad: list[dict] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    stop: bool = False


class _Reduce:
    """The range reduce, the same on every executor: its steps (check a partial, sum a
    position range, assemble the ranges) run through the executor's ``run_tasks``."""

    opts: JobOptions
    worker_args: dict[str, Any]
    workers: int

    def run_tasks(self, tasks: list[tuple[str, tuple]], *, what: str) -> list[Any]:
        raise NotImplementedError

    def reduce(self, items: list[tuple[str, int]], *, scratch: Path, final_dir: Path,
               window_groups: tuple[list[tuple[str, int]] | None, str | None] = (None, None),
               halves: list[tuple[str, int]] | None = None) -> dict:
        """Range reduce (module docstring): check every item, sum each position range on
        an actor, assemble the ranges into ``final_dir``; then, with ``window_groups =
        (items, None)``, sum those items' window groups beside it on an actor
        (:meth:`CountWorker.sum_window_groups`; ``(None, why not)``: none), or with
        ``halves`` (every partial of the corpus, in shard-id order) write the corpus'
        two halves as its window groups (:meth:`_halves`).

        Returns the final summary (with ``ranges`` and, where asked for, ``window_groups``:
        what was written or why not), or ``{"corrupt": [...]}`` (every corrupt partial;
        nothing summed)."""
        t = time.perf_counter()
        checks = self.run_tasks([("check", (str(p),)) for p, _ in items], what="partial check")
        corrupt = [c for c in checks if c]
        if corrupt:
            return {"corrupt": corrupt}
        check_s, t = time.perf_counter() - t, time.perf_counter()
        scratch.mkdir(parents=True, exist_ok=True)
        spec = CountSpec.from_metadata(self.worker_args["spec"])
        placed, windows, tokens = stitch(items, spec)  # pack-stream pieces rotated into place (headers only)
        item_bytes = sum(counts_file(p).stat().st_size for p, _ in items)
        parts = self.opts.ranges or max(RANGES_PER_WORKER * self.workers, -(-item_bytes // RANGE_BYTES))
        ranges = row_ranges(spec.positions, parts)
        tasks = [("sum_range", (placed, a, b, str(scratch / f"range-{j:05d}.safetensors")))
                 for j, (a, b) in enumerate(ranges)]
        summaries = self.run_tasks(tasks, what="range reduce")
        ranges_s, t = time.perf_counter() - t, time.perf_counter()
        summary = self.run_tasks([("assemble", (summaries, placed, str(final_dir), (windows, tokens)))],
                                 what="reduce")[0]
        summary.update(ranges=len(ranges), check_s=check_s, ranges_s=ranges_s, assemble_s=time.perf_counter() - t)
        group_items, why_not = window_groups
        if halves is not None:
            t = time.perf_counter()
            summary["window_groups"] = self._halves(halves, [i for i, _ in items], spec, scratch, final_dir, ranges)
            summary["window_groups_s"] = time.perf_counter() - t
        elif group_items is not None:
            t = time.perf_counter()
            summary["window_groups"] = self.run_tasks([("sum_window_groups", (group_items, str(final_dir)))],
                                                      what="window groups")[0]
            summary["window_groups_s"] = time.perf_counter() - t
        elif why_not is not None:
            summary["window_groups"] = {"skipped": why_not}
        return summary


    def _halves(self, partials: list[tuple[str, int]], checked: list[str], spec: CountSpec, scratch: Path,
                final_dir: Path, ranges: list[tuple[int, int]]) -> dict[str, Any]:
        """A pack-mode count in steps above 4,096 positions: its streams straddle shards,
        so no window groups can be kept, but the corpus' halves can, for the rank test's
        edge (:func:`posstats.corpus.count_step.kept_window_groups`): the shards of even
        and of odd rank (each a stretch of a stream, so dependent tokens stay together but
        for the windows cut at a shard's end), each half's partials placed where they sit
        in the stream (:func:`posstats.counting.pack.stitch`) and range-summed on the
        actors, then streamed into the window-groups file. The partials the reduce did not
        read (an incremental refresh's) are checked first. Returns the summary entry."""
        done = set(checked)
        unchecked = [p for p, _ in partials if p not in done]
        corrupt = [c for c in self.run_tasks([("check", (p,)) for p in unchecked], what="partial check") if c]
        if corrupt:
            return {"skipped": f"{len(corrupt)} partial(s) fail their check, so the halves are not kept: {corrupt[0]}"}
        placed, _, _ = stitch(partials, spec)
        tasks = [("sum_range", (placed[h::2], a, b, str(scratch / f"half-{h}-range-{j:05d}.safetensors")))
                 for h in (0, 1) for j, (a, b) in enumerate(ranges)]
        summaries = self.run_tasks(tasks, what="halves")
        halves = [summaries[: len(ranges)], summaries[len(ranges):]]
        return self.run_tasks([("write_halves", (halves, str(final_dir)))], what="halves")[0]


class _LocalEngine(_Reduce):
    """The local executor: the steps of a Ray run (count a shard into a partial and its
    marker; check, range-sum, assemble), one at a time in this process by one
    :class:`CountWorker`; the same store, markers, resume and refresh, no Ray."""

    def __init__(self, opts: JobOptions, worker_args: dict[str, Any]) -> None:
        self.opts = opts
        self.worker_args = worker_args
        self.worker: CountWorker | None = None
        self.started_ray = False
        self.startup_s = 0.0
        self.actors_s = 0.0
        self.workers = 1

    def __enter__(self) -> _LocalEngine:
        t = time.perf_counter()
        self.worker = CountWorker(**self.worker_args)
        self.actors_s = time.perf_counter() - t
        return self

    def __exit__(self, *exc: Any) -> None:
        self.worker = None

    def count(self, todo: list[Shard], *, bar: Any) -> tuple[dict[str, dict], list[dict]]:
        """Count ``todo`` in order; stop at the first bad shard unless skipping. Returns
        (results by shard id, bad shards), as :meth:`_Engine.count`."""
        assert self.worker is not None
        tally = _Tally()
        t0 = time.perf_counter()
        for shard in todo:
            res = self.worker.count(shard.to_dict())
            if res["status"] == "bad":
                tally.bad.append({"shard_id": shard.shard_id, "path": shard.path, "label": shard.label(),
                                  "error": res["error"]})
                if not self.opts.skip_bad_shards:
                    break
                continue
            tally.results[shard.shard_id] = res
            tally.tokens += res["tokens"] if res["status"] == "counted" else 0
            bar.update(1)
            bar.set_postfix_str(f"{tally.tokens:,} tok counted, {tally.tokens / max(time.perf_counter() - t0, 1e-9):,.0f} "
                                "tok/s", refresh=False)
        return tally.results, tally.bad

    def run_tasks(self, tasks: list[tuple[str, tuple]], *, what: str) -> list[Any]:
        """Run the worker's method calls ``(name, args)`` in order; return their results."""
        assert self.worker is not None
        return [getattr(self.worker, name)(*args) for name, args in tasks]


class _Engine(_Reduce):
    """The Ray executor: connection, actor pool, scheduling; the range reduce on the actors."""

    def __init__(self, opts: JobOptions, worker_args: dict[str, Any]) -> None:
        self.opts = opts
        self.worker_args = worker_args
        self.actors: list[Any] = []
        self.started_ray = False
        self.startup_s = 0.0
        self.actors_s = 0.0
        self.workers = 0

    # -- lifecycle -----------------------------------------------------------------

    def __enter__(self) -> _Engine:
        t = time.perf_counter()
        self._connect()
        self.startup_s = time.perf_counter() - t
        t = time.perf_counter()
        self._start_actors()
        self.actors_s = time.perf_counter() - t
        return self

    def _connect(self) -> None:
        """Join (or start) Ray; size the pool to ``--workers``, at most the cluster's CPUs."""
        import ray

        started, context = connect_ray(self.opts.address, num_cpus=max(os.cpu_count() or 1, self.opts.workers or 1),
                                       dashboard=self.opts.dashboard)
        self.started_ray = started
        url = getattr(context, "dashboard_url", None) if started else None
        if url:
            _log(f"Ray dashboard: http://{url}")
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = self.opts.workers or cpus
        if self.workers > cpus:
            _log(f"only {cpus} CPU(s) in the Ray cluster: using {cpus} workers, not {self.workers}")
            self.workers = cpus

    def _start_actors(self) -> None:
        """Start the pool and wait until every actor answers (or give up, stopping them)."""
        import ray

        self.actors = [self._new_actor() for _ in range(self.workers)]
        try:
            self.where = ray.get([a.where.remote() for a in self.actors], timeout=ACTOR_START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            self.__exit__()
            msg = (
                f"{self.workers} counting actor(s) did not start within {ACTOR_START_TIMEOUT_S} s: are the "
                f"cluster's CPUs taken by other jobs? (try fewer --workers)"
            )
            raise PosstatsError(msg) from None

    def __exit__(self, *exc: Any) -> None:
        import ray

        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001, S110 - already dead is fine
                pass
        self.actors = []
        if self.started_ray:
            ray.shutdown()

    def _new_actor(self) -> Any:
        import ray

        remote = ray.remote(CountWorker).options(
            num_cpus=1,
            max_restarts=3,
            max_task_retries=3,
            scheduling_strategy="SPREAD",
        )
        return remote.remote(**self.worker_args)

    def _replace(self, i: int) -> None:
        import ray

        try:
            ray.kill(self.actors[i], no_restart=True)
        except Exception:  # noqa: BLE001, S110 - it is gone already
            pass
        self.actors[i] = self._new_actor()

    # -- counting ------------------------------------------------------------------

    def count(self, todo: list[Shard], *, bar: Any) -> tuple[dict[str, dict], list[dict]]:
        """Count ``todo`` on the pool, one shard in flight per actor; return (results by
        shard id, bad shards).

        Stops handing out shards at the first bad one (unless skipping), lets the shards in
        flight finish so their partials are kept, then returns.
        """
        import ray

        lost = _actor_lost_errors()
        tally = _Tally()
        queue = deque(todo)
        inflight: dict[Any, tuple[int, Shard]] = {}
        t0 = time.perf_counter()
        while queue or inflight:
            if not tally.stop:
                self._dispatch(queue, inflight)
            if not inflight:
                break
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=0.5)
            for ref in ready:
                i, shard = inflight.pop(ref)
                self._collect(ref, i, shard, tally, queue, bar, lost)
            rate = tally.tokens / max(time.perf_counter() - t0, 1e-9)
            bar.set_postfix_str(f"{tally.tokens:,} tok counted, {rate:,.0f} tok/s", refresh=False)
            bar.refresh()
        return tally.results, tally.bad

    def _dispatch(self, queue: deque[Shard], inflight: dict[Any, tuple[int, Shard]]) -> None:
        """Hand the next queued shards to the idle actors."""
        busy = {i for i, _ in inflight.values()}
        for i in range(len(self.actors)):
            if i not in busy and queue:
                shard = queue.popleft()
                inflight[self.actors[i].count.remote(shard.to_dict())] = (i, shard)

    def _collect(self, ref: Any, i: int, shard: Shard, tally: _Tally, queue: deque[Shard], bar: Any,
                 lost: tuple[type, ...]) -> None:
        """Record one finished count; a lost actor is replaced and its shard queued again
        (at most ``MAX_SHARD_ATTEMPTS`` times per shard)."""
        import ray

        try:
            res = ray.get(ref)
        except lost as exc:
            attempts = tally.attempts.get(shard.shard_id, 0) + 1
            tally.attempts[shard.shard_id] = attempts
            if attempts >= MAX_SHARD_ATTEMPTS:
                msg = f"{shard.label()}: lost {attempts} counting actors ({type(exc).__name__})"
                raise PosstatsError(msg) from exc
            _log(f"a counting actor was lost on {shard.label()}; starting a new one and recounting")
            self._replace(i)
            queue.appendleft(shard)
            return
        if res["status"] == "bad":
            tally.bad.append({"shard_id": shard.shard_id, "path": shard.path, "label": shard.label(), "error": res["error"]})
            tally.stop = tally.stop or not self.opts.skip_bad_shards
            return
        tally.results[shard.shard_id] = res
        if res["status"] == "counted":
            tally.tokens += res["tokens"]
        bar.update(1)

    # -- reducing ------------------------------------------------------------------

    def run_tasks(self, tasks: list[tuple[str, tuple]], *, what: str) -> list[Any]:
        """Run actor method calls ``(name, args)``, one in flight per actor; return their
        results in order. A lost actor is replaced and its task run again (at most
        ``MAX_SHARD_ATTEMPTS`` times per task)."""
        import ray

        lost = _actor_lost_errors()
        results: list[Any] = [None] * len(tasks)
        attempts = [0] * len(tasks)
        queue, inflight = deque(range(len(tasks))), {}
        while queue or inflight:
            busy = {i for i, _ in inflight.values()}
            for i in range(len(self.actors)):
                if i not in busy and queue:
                    k = queue.popleft()
                    name, args = tasks[k]
                    inflight[getattr(self.actors[i], name).remote(*args)] = (i, k)
            ready, _ = ray.wait(list(inflight), num_returns=1)
            i, k = inflight.pop(ready[0])
            try:
                results[k] = ray.get(ready[0])
            except lost as exc:
                attempts[k] += 1
                if attempts[k] >= MAX_SHARD_ATTEMPTS:
                    msg = f"{what}: lost {attempts[k]} actors on one task ({type(exc).__name__}); rerun to resume"
                    raise PosstatsError(msg) from exc
                _log(f"an actor was lost during the {what}; starting a new one and running its task again")
                self._replace(i)
                queue.appendleft(k)
        return results


_Executor = _Engine | _LocalEngine  # the two executors of the counting steps
