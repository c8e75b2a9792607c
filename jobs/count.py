"""Ray job: exact, resumable, incremental positional counting of a sharded corpus.

    python -m jobs.count --input 'shards/*.parquet' --column input_ids --vocab-size 50257 \\
        --positions 1024 --out runs/counts [--address 127.0.0.1:6379] [--workers 8]
    ray job submit --address http://127.0.0.1:8265 -- python -m jobs.count ...   (see docs/ray.md)
    posstats count --ray ...        posstats refresh --store runs/counts/store

What runs where:

* the driver (this module) resolves the inputs, plans shards from metadata only
  (:func:`posstats.corpus.shards.plan_shards`), holds the run store's lock and schedules shards
  biggest first on a pool of counting actors, one task in flight per actor;
* each :class:`CountWorker` actor reads its shards itself, counts them with the core
  kernel (:func:`posstats.corpus.shards.count_shard`) and persists each partial plus its
  completion marker to the run store (:class:`posstats.service.shard_store.RunStore`); it returns a
  small summary, never an array;
* a tree reduce on the same actors sums partials (``fan_in`` at a time, in sorted shard-id
  order) into intermediate files and finally the result in ``STORE/results/``; the driver
  copies that file into the output folder.

Failures: actors run with ``max_restarts`` / ``max_task_retries``, so a counting actor
killed mid-shard is restarted and the shard recounted; a shard whose marker exists is
never counted again and a killed actor never leaves a marker, so nothing is counted twice.
If an actor is lost for good, the driver starts a replacement and hands the shard to it.
A driver killed mid-run leaves its markers behind: rerunning the same command (same
``--run-id``) skips every marked shard.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import shutil
import socket
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jobs.connect import connect_ray
from posstats.corpus.source import CorpusSource
from posstats.counting.counts import DEFAULT_DENSE_BUDGET, CountSpec
from posstats.errors import InputError, PosstatsError
from posstats.ids import validate_run_id
from posstats.service.shard_store import RunStore, config_key
from posstats.counting.io import write_json_atomic
from posstats.corpus.inputs import CountInputs
from posstats.flags import add_input_args, add_ray_args, count_inputs_from_args
from posstats.guard import run_guarded
from posstats.runs.counts_folder import count_line, publish_counts
from posstats.corpus.shards import DEFAULT_SHARD_BYTES, Shard, plan_shards

__all__ = [
    "CountWorker",
    "JobOptions",
    "build_parser",
    "count_job",
    "count_to",
    "main",
    "refresh_job",
    "store_config",
]

SHARD_DELAY_ENV = "POSSTATS_TEST_SHARD_DELAY"  # test hook: seconds each shard sleeps mid-count
MAX_SHARD_ATTEMPTS = 3  # actor losses tolerated per shard (after Ray's own retries)
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
        shard_bytes: JSONL / text files above this many bytes are cut into line ranges.
        dense_budget: bytes of a dense ``n x V`` int64 array allowed per process (driver
            and each actor); sparse partials and sums above it. The final counts are dense
            exactly when the single-process ``posstats count`` would store them dense.
        fan_in: partials summed per reduce task.
        show_progress: progress bar on stderr (None: only on a terminal).
        out: output folder recorded in the manifest (``posstats refresh`` writes there).
        shard_delay: test hook: seconds each shard sleeps after counting, before saving.
        shuffle_seed: test hook: dispatch shards in a seeded random order.
    """

    store: str
    run_id: str | None = None
    address: str | None = None
    workers: int | None = None
    skip_bad_shards: bool = False
    shard_bytes: int = DEFAULT_SHARD_BYTES
    dense_budget: int = DEFAULT_DENSE_BUDGET
    fan_in: int = 16
    show_progress: bool | None = None
    out: str | None = None
    shard_delay: float = 0.0
    shuffle_seed: int | None = None

    def __post_init__(self) -> None:
        if self.run_id is not None:
            validate_run_id(self.run_id)  # it names files and folders in the store


def _log(message: str) -> None:
    print(f"posstats: {message}", file=sys.stderr, flush=True)


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
        shard_delay: float = 0.0,
    ) -> None:
        from posstats.corpus.tokenizer import load_tokenizer

        if os.path.isdir(cwd):
            os.chdir(cwd)  # relative input paths mean what they mean to the driver
        self.store = RunStore(store)
        self.source = CorpusSource(**{**source, "inputs": tuple(source["inputs"])})
        self.spec = CountSpec.from_metadata(spec)
        self.metadata = dict(metadata)
        self.dense_budget = int(dense_budget)
        self.shard_delay = float(shard_delay)
        use_tokenizer = self.source.column is None and self.source.tokenizer
        self.tokenizer = load_tokenizer(self.source.tokenizer) if use_tokenizer else None
        self._buffer = None  # one n x V int64 array for all dense shards of this actor

    def _dense_buffer(self, shard: Shard) -> Any:
        """The reusable dense accumulator, made on the first dense shard; None for sparse."""
        from posstats.corpus.shards import partial_is_dense

        if not partial_is_dense(self.spec, shard, dense_budget=self.dense_budget):
            return None
        if self._buffer is None:
            self._buffer = np.zeros((self.spec.positions, self.spec.vocab_size), dtype=np.int64)
        return self._buffer

    def where(self) -> dict[str, Any]:
        """pid, hostname and Ray node id of this actor."""
        import ray

        return {"pid": os.getpid(), "hostname": socket.gethostname(), "node_id": ray.get_runtime_context().get_node_id()}

    def count(self, shard: dict[str, Any]) -> dict[str, Any]:
        """Count one shard unless its marker exists; return a summary (status counted,
        cached or bad)."""
        from posstats.corpus.shards import count_shard

        s = Shard.from_dict(shard)
        marker = self.store.marker(s.shard_id)
        if marker is not None:
            return {"status": "cached", "shard_id": s.shard_id, "tokens": marker["tokens"], "seconds": 0.0}
        who = self.where()
        self.store.mark_started(s.shard_id, **who)
        t = time.perf_counter()
        try:
            # The partial shares the buffer: it is saved below, before the next shard.
            counts = count_shard(s, self.source, self.spec, tokenizer=self.tokenizer,
                                 dense_budget=self.dense_budget, metadata=self.metadata,
                                 out=self._dense_buffer(s))
        except PosstatsError as exc:
            return {"status": "bad", "shard_id": s.shard_id, "error": str(exc), **who}
        if self.shard_delay:
            time.sleep(self.shard_delay)
        seconds = time.perf_counter() - t
        t = time.perf_counter()
        self.store.write_partial(s, counts, seconds=round(seconds, 6), **who)
        save_s = time.perf_counter() - t
        return {"status": "counted", "shard_id": s.shard_id, "tokens": counts.tokens, "seconds": seconds,
                "save_seconds": save_s, **who}

    def reduce(self, items: list[tuple[str, int]], out: str, final: bool, final_dense: bool) -> dict[str, Any]:
        """Signed sum of saved counts into ``out``; intermediate sums are stored compactly,
        the final one dense exactly when ``final_dense``. When partials do not match their
        markers nothing is saved and ``{"corrupt": [{"path", "error"}, ...]}`` is returned."""
        from posstats.service.shard_store import compact_counts, sum_partials
        from posstats.counting.io import save_counts

        n, V = self.spec.positions, self.spec.vocab_size
        dense = self.spec.fits_dense(self.dense_budget)
        t = time.perf_counter()
        corrupt: list = []
        total = sum_partials([(p, int(sign)) for p, sign in items], self.spec, dense=dense, metadata=self.metadata,
                             corrupt=corrupt)
        if corrupt:
            return {"corrupt": [{"path": exc.path, "error": str(exc), "detail": exc.detail} for exc in corrupt]}
        if final:
            total = total.to_dense() if final_dense else total.to_sparse()
        else:
            total = compact_counts(total)
        path = save_counts(total, out, narrow=not final)  # the final file keeps int64
        summary = {
            "path": str(out),
            "counts_file": path.name,
            "sequences": total.sequences,
            "windows": total.windows,
            "tokens": total.tokens,
            "fingerprint": total.fingerprint,
            "storage": "sparse" if total.is_sparse else "dense",
            "seconds": round(time.perf_counter() - t, 3),
        }
        if final:
            summary["positions_occupied"] = int((total.occupancy() > 0).sum())
        return summary


# ----------------------------------------------------------------------------- engine


class _Engine:
    """The Ray side of a run: connection, actor pool, scheduling, tree reduce."""

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
        import ray

        t = time.perf_counter()
        started, context = connect_ray(self.opts.address, num_cpus=max(os.cpu_count() or 1, self.opts.workers or 1),
                                       dashboard=None)
        self.started_ray = started
        url = getattr(context, "dashboard_url", None) if started else None
        if url:
            _log(f"Ray dashboard: http://{url}")
        self.startup_s = time.perf_counter() - t
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = self.opts.workers or cpus
        if self.workers > cpus:
            _log(f"only {cpus} CPU(s) in the Ray cluster: using {cpus} workers, not {self.workers}")
            self.workers = cpus
        t = time.perf_counter()
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
        self.actors_s = time.perf_counter() - t
        return self

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
        """Count ``todo`` on the pool; return (results by shard id, bad shards).

        Stops handing out shards at the first bad one (unless skipping), lets the shards in
        flight finish so their partials are kept, then raises.
        """
        import ray
        from ray.exceptions import RayActorError

        unavailable: tuple[type, ...] = (RayActorError,)
        try:
            from ray.exceptions import ActorUnavailableError

            unavailable += (ActorUnavailableError,)
        except ImportError:  # older Ray
            pass

        queue = deque(todo)
        inflight: dict[Any, tuple[int, Shard]] = {}
        busy = [False] * len(self.actors)
        attempts: dict[str, int] = {}
        results: dict[str, dict] = {}
        bad: list[dict] = []
        stop = False
        tokens = 0
        t0 = time.perf_counter()
        while queue or inflight:
            if not stop:
                for i in range(len(self.actors)):
                    if not busy[i] and queue:
                        shard = queue.popleft()
                        inflight[self.actors[i].count.remote(shard.to_dict())] = (i, shard)
                        busy[i] = True
            if not inflight:
                break
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=0.5)
            for ref in ready:
                i, shard = inflight.pop(ref)
                busy[i] = False
                try:
                    res = ray.get(ref)
                except unavailable as exc:
                    attempts[shard.shard_id] = attempts.get(shard.shard_id, 0) + 1
                    if attempts[shard.shard_id] >= MAX_SHARD_ATTEMPTS:
                        msg = f"{shard.label()}: lost {attempts[shard.shard_id]} counting actors ({type(exc).__name__})"
                        raise PosstatsError(msg) from exc
                    _log(f"a counting actor was lost on {shard.label()}; starting a new one and recounting")
                    self._replace(i)
                    queue.appendleft(shard)
                    continue
                if res["status"] == "bad":
                    bad.append({"shard_id": shard.shard_id, "path": shard.path, "label": shard.label(), "error": res["error"]})
                    if not self.opts.skip_bad_shards:
                        stop = True
                    continue
                results[shard.shard_id] = res
                if res["status"] == "counted":
                    tokens += res["tokens"]
                bar.update(1)
            rate = tokens / max(time.perf_counter() - t0, 1e-9)
            bar.set_postfix_str(f"{tokens:,} tok counted, {rate:,.0f} tok/s", refresh=False)
            bar.refresh()
        return results, bad

    # -- reducing ------------------------------------------------------------------

    def reduce(self, items: list[tuple[str, int]], *, scratch: Path, final_dir: Path, final_dense: bool) -> dict:
        """Tree reduce: sums of ``fan_in`` items at a time, level by level, on the actors.

        Returns the final sum's summary, or ``{"corrupt": [...]}`` (every corrupt partial
        found on the first level that found one; see :meth:`CountWorker.reduce`)."""
        import ray

        fan_in = max(2, int(self.opts.fan_in))
        level = 0
        while len(items) > fan_in:
            groups = [items[i : i + fan_in] for i in range(0, len(items), fan_in)]
            refs = [
                self.actors[j % len(self.actors)].reduce.remote(g, str(scratch / f"L{level}-{j:05d}"), False, False)
                for j, g in enumerate(groups)
            ]
            outs = ray.get(refs)
            corrupt = [c for out in outs for c in out.get("corrupt", ())]
            if corrupt:
                return {"corrupt": corrupt}
            items = [(out["path"], 1) for out in outs]
            level += 1
        summary = ray.get(self.actors[0].reduce.remote(items, str(final_dir), True, final_dense))
        summary["levels"] = level + 1
        return summary


# ----------------------------------------------------------------------------- driver


def store_config(source: CorpusSource, spec: CountSpec, metadata: dict[str, str]) -> dict[str, Any]:
    """What a store's partials depend on (bound in ``store.json``): spec and reader options.

    Input paths are not part of it (shard ids cover them); the tokenizer enters by hash.
    """
    return {
        "spec": spec.to_metadata(),
        "format": source.format,
        "column": source.column,
        "text_column": source.text_column,
        "tokenizer_hash": metadata.get("tokenizer_hash") if source.column is None else None,
        "metadata": dict(sorted(metadata.items())),
    }


def default_run_id(files: Sequence[str], config: dict[str, Any]) -> str:
    """``run-`` + 16 hex digits of sha256(absolute input paths + counting configuration)."""
    text = json.dumps([sorted(os.path.abspath(f) for f in files), config], sort_keys=True)
    return "run-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _source_dict(source: CorpusSource) -> dict[str, Any]:
    d = dataclasses.asdict(source)
    d["inputs"] = list(source.inputs)
    if d["tokenizer"]:
        d["tokenizer"] = os.path.abspath(d["tokenizer"])
    return d


def _check_no_dense_overflow(spec: CountSpec) -> None:
    if spec.positions * spec.vocab_size >= 2**62:
        msg = f"positions x vocabulary = {spec.positions} x {spec.vocab_size} is too large to key"
        raise PosstatsError(msg)


def _progress(total: int, enabled: bool | None) -> Any:
    from posstats.progress import progress

    return progress(total=total, desc="counting shards", unit="shard", enabled=enabled, unit_scale=False)


def _run(
    source: CorpusSource,
    spec: CountSpec,
    metadata: dict[str, str],
    opts: JobOptions,
    *,
    command: str,
    inputs: Sequence[str],
    incremental: bool,
) -> dict[str, Any]:
    """The body of a count or refresh run; returns the run summary (see :func:`count_job`)."""
    tokenizer_path = os.path.abspath(source.tokenizer) if source.column is None and source.tokenizer else None
    t_start = time.perf_counter()
    _check_no_dense_overflow(spec)
    store = RunStore(os.path.abspath(opts.store))
    config = store_config(source, spec, metadata)
    files = source.files()
    run_id = opts.run_id or (default_run_id(files, config) if command == "count" else "refresh-" + default_run_id(files, config)[4:])
    validate_run_id(run_id)
    with store.lock(run_id=run_id, command=command):
        bound = store.bind(config)
        if tokenizer_path and bound.get("tokenizer_path") != tokenizer_path:
            # remembered so that `posstats refresh` can find it
            write_json_atomic(store.config_path, {**bound, "tokenizer_path": tokenizer_path})
        previous = store.manifest()
        if incremental and previous is None:
            msg = f"run store {store.root} has no finished count to refresh; run 'posstats count --ray' first"
            raise PosstatsError(msg)
        shards = plan_shards(source, spec, shard_bytes=opts.shard_bytes)
        by_id = {s.shard_id: s for s in shards}
        planned = sorted(by_id)
        record = store.read_run(run_id)
        resumed = record is not None and record.get("status") != "complete"
        done_ids = {sid for sid in planned if store.is_done(sid)}
        todo = [by_id[sid] for sid in planned if sid not in done_ids]
        if opts.shuffle_seed is not None:
            random.Random(opts.shuffle_seed).shuffle(todo)
        else:
            todo.sort(key=lambda s: (-s.size_hint, s.shard_id))  # biggest first: balanced finish
        old_ids = set(previous.get("shard_ids", [])) if previous else set()
        added = sorted(set(planned) - old_ids)
        removed = sorted(old_ids - set(planned))
        changes = _changes(previous, shards, added, removed)
        record = {
            "run_id": run_id,
            "command": command,
            "status": "running",
            "started": record.get("started") if resumed and record else time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "attempt": (record.get("attempt", 1) + 1) if record else 1,
            "inputs": list(inputs),
            "files": len(files),
            "shards": len(shards),
            "already_done": len(done_ids),
            "bad_shards": [],
        }
        store.write_run(run_id, record)
        if resumed:
            _log(f"resuming run {run_id}: {len(done_ids)}/{len(shards)} shard(s) already counted")
        final_dense = spec.fits_dense(opts.dense_budget)
        up_to_date = (
            previous is not None
            and previous.get("storage") == ("dense" if final_dense else "sparse")
            and not todo
            and previous.get("shard_ids") == planned
            and not previous.get("bad_shards")
            and store.result_file(previous) is not None
        )
        if up_to_date:
            _log(f"run store {store.root} is up to date ({len(shards)} shard(s)); nothing to count")
            result_file = store.result_file(previous)
            summary = _summary(previous, result_file, files, shards, counted=0, cached=len(done_ids), bad=[],
                               engine=None, seconds=time.perf_counter() - t_start, run_id=run_id, store=store,
                               added=added, removed=removed, changes=changes, mode="up to date")
            store.write_run(run_id, {**record, "status": "complete", "finished": _stamp(), "counted": 0})
            return summary

        worker_args = {
            "store": str(store.root),
            "source": _source_dict(source),
            "spec": spec.to_metadata(),
            "metadata": metadata,
            "dense_budget": opts.dense_budget,
            "cwd": os.getcwd(),
            "shard_delay": opts.shard_delay,
        }
        try:
            with _Engine(opts, worker_args) as engine:
                _log(
                    f"{command} {run_id}: {len(shards)} shard(s) in {len(files)} input(s), {len(todo)} to count, "
                    f"{engine.workers} worker(s), store {store.root}"
                )
                t_count = time.perf_counter()
                with _progress(len(shards), opts.show_progress) as bar:
                    bar.update(len(done_ids))
                    results, bad = engine.count(todo, bar=bar)
                count_s = time.perf_counter() - t_count
                record["bad_shards"] = bad
                if bad and not opts.skip_bad_shards:
                    more = f" (and {len(bad) - 1} more bad shard(s), see {store.run_path(run_id)})" if len(bad) > 1 else ""
                    msg = (
                        f"{bad[0]['error']}{more}; the {len(done_ids) + len(results)} finished shard(s) are kept in "
                        f"{store.root}: fix the input and rerun to continue, or pass --skip-bad-shards"
                    )
                    raise InputError(msg)
                bad_ids = {b["shard_id"] for b in bad}
                good = [sid for sid in planned if sid not in bad_ids]
                result_dir = store.new_result_dir(run_id)
                old_result = store.result_file(previous) if previous else None
                good_added = [sid for sid in added if sid not in bad_ids]
                t_reduce = time.perf_counter()
                for attempt in range(2):
                    removable = all(store.is_done(sid) for sid in removed)
                    if incremental and old_result is not None and removable:
                        items = [(str(old_result.parent), 1)]
                        items += [(str(store.partial_dir(sid)), 1) for sid in good_added]
                        items += [(str(store.partial_dir(sid)), -1) for sid in removed]
                        mode = "incremental"
                    else:
                        items = [(str(store.partial_dir(sid)), 1) for sid in good]
                        mode = "full"
                    reduced = engine.reduce(items, scratch=store.reduce_dir(run_id), final_dir=result_dir,
                                            final_dense=final_dense)
                    if "corrupt" not in reduced:
                        break
                    recount = _drop_corrupt(store, reduced["corrupt"], by_id, removed, last=attempt == 1)
                    if recount:
                        with _progress(len(recount), opts.show_progress) as bar:
                            more, more_bad = engine.count(recount, bar=bar)
                        results.update(more)
                        if more_bad:
                            record["bad_shards"] = bad = bad + more_bad
                            if not opts.skip_bad_shards:
                                raise InputError(more_bad[0]["error"])
                            bad_ids |= {b["shard_id"] for b in more_bad}
                            good = [sid for sid in good if sid not in bad_ids]
                            good_added = [sid for sid in good_added if sid not in bad_ids]
                reduce_s = time.perf_counter() - t_reduce
                workers, startup_s, actors_s = engine.workers, engine.startup_s, engine.actors_s
        except BaseException as exc:
            record.update(status="failed", finished=_stamp(), error=str(exc) or type(exc).__name__)
            store.write_run(run_id, record)
            raise
        if reduced["sequences"] == 0:
            shutil.rmtree(result_dir, ignore_errors=True)
            msg = f"empty corpus: no sequences in {', '.join(files)}"
            store.write_run(run_id, {**record, "status": "failed", "finished": _stamp(), "error": msg})
            raise InputError(msg)
        manifest = {
            "schema": "posstats.manifest/1",
            "run_id": run_id,
            "command": command,
            "finished": _stamp(),
            "config_key": config_key(config),
            "inputs": list(inputs),
            "files": [os.path.abspath(f) for f in files],
            "out": opts.out if opts.out is not None else (previous or {}).get("out"),
            "shard_ids": sorted(good),
            "shards": [by_id[sid].to_dict() for sid in sorted(good)],
            "bad_shards": bad,
            "result": os.path.relpath(result_dir, store.root),
            "counts_file": reduced["counts_file"],
            "sequences": reduced["sequences"],
            "windows": reduced["windows"],
            "tokens": reduced["tokens"],
            "fingerprint": reduced["fingerprint"],
            "positions_occupied": reduced["positions_occupied"],
            "storage": reduced["storage"],
            "dense_budget": opts.dense_budget,
        }
        store.publish(manifest)
        if mode == "incremental":
            for sid in removed:
                store.remove_partial(sid)
        store.clean_temporary(run_id)
        counted = sum(1 for r in results.values() if r["status"] == "counted")
        record.update(status="complete", finished=_stamp(), counted=counted, reduce=mode)
        store.write_run(run_id, record)
        tokens_counted_now = sum(r["tokens"] for r in results.values() if r["status"] == "counted")
        engine_info = {
            "workers": workers,
            "ray_startup_s": startup_s,
            "actors_start_s": actors_s,
            "count_s": count_s,
            "reduce_s": reduce_s,
            "reduce_levels": reduced["levels"],
            "tokens_counted_now": tokens_counted_now,
        }
        return _summary(
            manifest, store.result_file(manifest), files, shards, counted=counted, cached=len(done_ids), bad=bad,
            engine=engine_info, seconds=time.perf_counter() - t_start, run_id=run_id, store=store, added=added,
            removed=removed, changes=changes, mode=mode,
        )


def _drop_corrupt(store: RunStore, corrupt: list[dict], by_id: dict[str, Shard], removed: list[str], *,
                  last: bool) -> list[Shard]:
    """Delete partials that failed their integrity check (see :mod:`posstats.service.shard_store`) and
    return the shards to count again; a corrupt partial of a removed shard is only deleted
    (the reduce then sums the remaining partials in full).

    Raises:
        PosstatsError: on the last attempt, or for corrupt counts that are no shard's
            partial (a reduce intermediate or the previous result).
    """
    shard_of = {str(store.partial_dir(sid)): sid for sid in [*by_id, *removed]}
    unknown = [c for c in corrupt if c["path"] not in shard_of]
    if last or unknown:
        more = f" (and {len(corrupt) - 1} more)" if len(corrupt) > 1 else ""
        raise PosstatsError(f"{(unknown or corrupt)[0]['error']}{more}")
    recount = []
    for c in corrupt:
        sid = shard_of[c["path"]]
        store.remove_partial(sid)
        if sid in by_id:
            recount.append(by_id[sid])
            _log(f"{c['detail']}: deleted it, counting that shard again")
        else:
            _log(f"{c['detail']}: deleted it (its shard left the corpus), summing the remaining partials in full")
    return recount


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _changes(previous: dict[str, Any] | None, shards: list[Shard], added: list[str], removed: list[str]) -> list[dict]:
    """Per input path: new / changed / gone, with the shards added and removed."""
    old = {s["shard_id"]: s for s in (previous or {}).get("shards", [])}
    old_paths = {os.path.abspath(s["path"]) for s in old.values()}
    new_paths = {os.path.abspath(s.path) for s in shards}
    by_id = {s.shard_id: s for s in shards}
    per: dict[str, list[int]] = {}
    for sid in added:
        per.setdefault(os.path.abspath(by_id[sid].path), [0, 0])[0] += 1
    for sid in removed:
        path = os.path.abspath(old[sid]["path"]) if sid in old else "(unknown input)"
        per.setdefault(path, [0, 0])[1] += 1
    out = []
    for path, (n_add, n_rm) in sorted(per.items()):
        status = "changed" if path in old_paths and path in new_paths else ("new" if path in new_paths else "gone")
        out.append({"path": path, "status": status, "shards_added": n_add, "shards_removed": n_rm})
    return out


def _summary(manifest, result_file, files, shards, *, counted, cached, bad, engine, seconds, run_id, store,
             added, removed, changes, mode) -> dict[str, Any]:
    return {
        "files": len(files),
        "sequences": manifest["sequences"],
        "windows": manifest["windows"],
        "tokens_counted": manifest["tokens"],
        "positions_occupied": manifest["positions_occupied"],
        "storage": manifest["storage"],
        "counts_file": manifest["counts_file"],
        "seconds": round(seconds, 3),
        "tokens_per_s": round(manifest["tokens"] / seconds, 1) if seconds > 0 else None,
        "fingerprint": manifest["fingerprint"],
        "counts_path": str(result_file),
        "ray": {
            "run_id": run_id,
            "store": str(store.root),
            "shards": len(shards),
            "shards_counted": counted,
            "shards_cached": cached,
            "shards_kept": len(shards) - len(added),
            "shards_added": len(added),
            "shards_removed": len(removed),
            "changes": changes,
            "bad_shards": bad,
            "reduce": mode,
            **({k: (round(v, 3) if isinstance(v, float) else v) for k, v in engine.items()} if engine else {}),
        },
    }


def count_job(source: CorpusSource, spec: CountSpec, metadata: dict[str, str], opts: JobOptions) -> dict[str, Any]:
    """Count a corpus as a Ray job into the run store ``opts.store``.

    Returns the summary of ``count.json`` (files, sequences, windows, tokens_counted,
    positions_occupied, storage, counts_file, seconds, tokens_per_s, fingerprint),
    ``counts_path`` (the result's counts file in the store) and ``ray`` (run id, shard
    numbers, bad shards, timings). The counts equal :func:`posstats.corpus.source.count_corpus`
    exactly (with ``dense_budget`` = its memory budget, even the storage kind).

    Raises:
        PosstatsError: bad options, a locked store, a store of another configuration.
        InputError: a bad shard (unless ``skip_bad_shards``), an empty corpus.
    """
    inputs = [os.path.abspath(p) for p in source.inputs]
    return _run(source, spec, metadata, opts, command="count", inputs=inputs, incremental=False)


def refresh_job(store: str, opts: JobOptions, *, inputs: Sequence[str] | None = None,
                tokenizer: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Bring a run store up to date with its inputs (or new ``inputs`` patterns).

    Counts only shards that are new or changed, subtracts those that disappeared from the
    stored total (``total - removed + added``), and returns (summary, store config). The
    result equals a full recount of the inputs.
    """
    rs = RunStore(os.path.abspath(store))
    stored = rs.config()
    manifest = rs.manifest()
    if stored is None or manifest is None:
        msg = f"{store}: not a run store with a finished count (run 'posstats count --ray --store {store}' first)"
        raise PosstatsError(msg)
    cfg = stored["config"]
    spec = CountSpec.from_metadata(cfg["spec"])
    metadata = dict(cfg.get("metadata", {}))
    tok_path = tokenizer or stored.get("tokenizer_path")
    if cfg.get("column") is None and not tok_path:
        msg = f"{store}: counts text; pass --tokenizer (the tokenizer.json it was counted with)"
        raise PosstatsError(msg)
    if tok_path:
        from posstats.corpus.tokenizer import check_tokenizer

        recorded = {"tokenizer_hash": cfg.get("tokenizer_hash"), "tokenizer": metadata.get("tokenizer")}
        check_tokenizer(recorded, tok_path, counts=f"run store {store}")
    patterns = [os.path.abspath(p) for p in (inputs or manifest["inputs"])]
    source = CorpusSource(
        inputs=tuple(patterns),
        format=cfg.get("format"),
        column=cfg.get("column"),
        text_column=cfg.get("text_column"),
        tokenizer=tok_path if cfg.get("column") is None else None,
    )
    summary = _run(source, spec, metadata, opts, command="refresh", inputs=patterns, incremental=True)
    return summary, {"source": source, "spec": spec, "metadata": metadata}


# ----------------------------------------------------------------------------- CLI glue


def options_from_args(args: argparse.Namespace, *, default_store: str | None) -> JobOptions:
    """JobOptions from the ``--ray`` flags (see :func:`posstats.flags.add_ray_args`)."""
    if args.run_id is not None:
        validate_run_id(args.run_id)
    store = args.store or default_store
    if store is None:
        raise PosstatsError("give --store DIR")
    if args.workers is not None and args.workers < 1:
        raise PosstatsError(f"--workers must be >= 1, got {args.workers}")
    if args.shard_size <= 0:
        raise PosstatsError(f"--shard-size must be > 0 MiB, got {args.shard_size}")
    return JobOptions(
        store=store,
        run_id=args.run_id,
        address=args.address,
        workers=args.workers,
        skip_bad_shards=args.skip_bad_shards,
        shard_bytes=int(args.shard_size * 2**20),
        dense_budget=int(args.memory_budget * 2**30),
        out=os.path.abspath(args.out) if getattr(args, "out", None) else None,
        shard_delay=float(os.environ.get(SHARD_DELAY_ENV, "0") or 0),
    )


def count_to(args: argparse.Namespace, stage: Path, /) -> dict[str, Any]:
    """Count the corpus of ``args`` as a Ray job into ``stage`` (the files of a counts
    folder but ``count.json``: config.json, counts.*); return the ``count.json`` record.
    The counts stay on disk, never in the driver's memory."""
    opts = options_from_args(args, default_store=os.path.join(args.out, "store"))  # checks --run-id first
    inputs = count_inputs_from_args(args)
    files = inputs.source.files()
    ray_config = {"store": os.path.abspath(opts.store), "run_id": opts.run_id, "address": opts.address,
                  "workers": opts.workers, "skip_bad_shards": opts.skip_bad_shards, "shard_bytes": opts.shard_bytes}
    write_json_atomic(stage / "config.json", inputs.record(command="count", files=files, ray=ray_config))
    summary = count_job(inputs.source, inputs.spec, inputs.metadata, opts)
    shutil.copyfile(summary.pop("counts_path"), stage / summary["counts_file"])
    return summary


def run(args: argparse.Namespace, /) -> int:
    """``posstats count --ray`` / ``python -m jobs.count``: count into ``--out``, print one line."""
    summary = publish_counts(args.out, lambda stage: count_to(args, stage))
    print(count_line(summary, positions=args.positions, out=args.out))
    return 0


def refresh_to(args: argparse.Namespace) -> dict[str, Any]:
    """``posstats refresh``: update the store, print what changed, write OUT if known."""
    if args.run_id is not None:
        validate_run_id(args.run_id)  # before reading the store
    if args.memory_budget is None:
        manifest = RunStore(os.path.abspath(args.store)).manifest() or {}
        args.memory_budget = manifest.get("dense_budget", 4 * 2**30) / 2**30
    opts = options_from_args(args, default_store=None)
    summary, ctx = refresh_job(args.store, opts, inputs=args.input, tokenizer=args.tokenizer)
    ray_info = summary["ray"]
    rs = RunStore(os.path.abspath(args.store))
    manifest = rs.manifest() or {}
    out = args.out or manifest.get("out")
    source, spec, metadata = ctx["source"], ctx["spec"], ctx["metadata"]
    print(
        f"refresh {args.store}: reused {ray_info['shards_kept']} shard(s), added {ray_info['shards_added']}, "
        f"removed {ray_info['shards_removed']} ({ray_info['reduce']}; {ray_info['shards_counted']} counted now)"
    )
    marks = {"new": "+", "changed": "~", "gone": "-"}
    for c in ray_info["changes"]:
        print(f"  {marks[c['status']]} {c['status']:<7} {c['path']} (+{c['shards_added']} / -{c['shards_removed']} shards)")
    for b in ray_info["bad_shards"]:
        print(f"  ! skipped {b['label']}: {b['error']}")
    print(f"total: {summary['tokens_counted']:,} tokens from {summary['sequences']:,} sequences in "
          f"{summary['files']} file(s), fingerprint {summary['fingerprint'][:16]}")
    if out and (ray_info["reduce"] != "up to date" or not os.path.exists(os.path.join(out, "count.json"))):
        config = CountInputs(source, spec, metadata, source.tokenizer).record(
            command="refresh", files=source.files(), ray={"store": ray_info["store"], "run_id": ray_info["run_id"]})
        def copy_result(stage: Path) -> dict[str, Any]:
            write_json_atomic(stage / "config.json", config)
            shutil.copyfile(summary["counts_path"], stage / summary["counts_file"])
            return {k: v for k, v in summary.items() if k != "counts_path"}

        publish_counts(out, copy_result)
        print(f"-> {out}")
    return summary


def build_parser() -> argparse.ArgumentParser:
    """``python -m jobs.count``: the input/counting flags of ``posstats count`` plus the Ray flags."""
    p = argparse.ArgumentParser(
        prog="python -m jobs.count",
        description="Count positional tokens of a corpus as a Ray job (the same as 'posstats count --ray').",
    )
    add_input_args(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (config.json, counts.*, count.json)")
    add_ray_args(p, switch=False)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m jobs.count`` / ``ray job submit -- python -m jobs.count``."""
    args = build_parser().parse_args(argv)
    args.ray = True
    return run_guarded(run, args)


if __name__ == "__main__":
    sys.exit(main())
