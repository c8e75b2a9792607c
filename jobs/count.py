"""Ray job: exact, resumable, incremental positional counting of a sharded corpus.

    python -m posstats.jobs.count --input 'shards/*.parquet' --column input_ids --vocab-size 50257 \\
        --positions 1024 --out runs/counts [--address 127.0.0.1:6379] [--workers 8]
    ray job submit --address http://127.0.0.1:8265 -- python -m posstats.jobs.count ...   (see docs/ray.md)
    posstats count --ray ...        posstats refresh --store runs/counts/store

What runs where:

* the driver (this module) resolves the inputs, plans shards from metadata only
  (:func:`posstats.corpus.shards.plan_shards`; the target shard size is ``--shard-size``,
  else the one the store recorded at its first run, else two to four shards per worker,
  :func:`posstats.corpus.shards.auto_shard_bytes`), holds the run store's lock and schedules shards
  biggest first on a pool of counting actors, one task in flight per actor;
* each :class:`CountWorker` actor reads its shards itself, counts them with the core
  kernel (:func:`posstats.corpus.count_step.accumulate_shard`) and persists each partial plus its
  completion marker to the run store (:class:`posstats.corpus.shard_store.RunStore`); it returns a
  small summary, never an array;
* a range reduce on the same actors sums the partials: every partial is first checked
  against its marker (:func:`posstats.counting.reduce.load_partial`, in parallel), then
  the positions are cut into ranges and each actor sums one range across all partials at
  a time (:func:`posstats.counting.ranges.sum_row_range`, reading only those rows), and
  one actor streams the range files into the result in ``STORE/results/``
  (:func:`posstats.counting.ranges.assemble_ranges`), holding one range at a time. The
  driver links that file into the output folder and never holds counts. Which partials,
  with which signs (a refresh: ``total - removed + added``), and the manifest it
  publishes are the store's rules (:mod:`posstats.corpus.shard_store`).

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
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from posstats.corpus.count_step import (
    HALVES_GROUPS,
    WINDOW_GROUP_POSITIONS,
    halves_only_note,
    kept_window_groups,
    shard_window_groups,
)
from posstats.corpus.inputs import CountInputs
from posstats.corpus.remote import absolute
from posstats.corpus.shard_store import RunStore, derive_run_id, manifest_changes, refresh_source, store_config
from posstats.corpus.shards import Shard, plan_shards, shard_bytes_for
from posstats.corpus.source import CorpusSource
from posstats.counting.counts import CountSpec, PositionalCounts
from posstats.counting.reduce import check_summable
from posstats.counting.window_groups import DEFAULT_WINDOW_GROUPS
from posstats.counting.window_groups_io import WINDOW_GROUPS_FILE, window_groups_file
from posstats.errors import InputError, PosstatsError
from posstats.ids import validate_run_id
from posstats.memory import format_bytes
from posstats.progress import progress
from posstats.runs.counts_folder import count_in_process, count_line, few_windows_warning, publish_counts
from posstats.storage.jsontext import write_json_atomic
from posstats.storage.publish import link_or_copy

from .connect import connect_ray
from .count_workers import JobOptions, _Engine, _Executor, _LocalEngine, _log, _stamp
from .flags import add_input_args, add_ray_args, count_inputs_from_args, print_document_note, storage_options
from .guard import run_guarded
from .output import ArgumentParser, add_output_args, print_json

__all__ = ["JobOptions", "build_parser", "count_job", "count_to", "main", "refresh_job"]


# ----------------------------------------------------------------------------- driver


@dataclass(frozen=True)
class _Plan:
    """What a run will do, decided under the store's lock before any actor starts.

    ``planned``: every shard id, sorted; ``done_ids``: those with a marker (reused);
    ``todo``: the others, in dispatch order; ``added`` / ``removed``: shard ids new to /
    gone from the previous manifest; ``changes``: the same per input path;
    ``shard_bytes``: the target shard size the shards were cut with.
    """

    shards: list[Shard]
    by_id: dict[str, Shard]
    planned: list[str]
    done_ids: set[str]
    todo: list[Shard]
    added: list[str]
    removed: list[str]
    changes: list[dict]
    shard_bytes: int


@dataclass
class _Run:
    """A count or refresh run in progress: its store, options, plan and run record."""

    store: RunStore
    run_id: str
    command: str
    opts: JobOptions
    incremental: bool
    inputs: list[str]
    files: list[str]
    config: dict[str, Any]
    previous: dict[str, Any] | None
    plan: _Plan
    record: dict[str, Any]
    t_start: float
    spec: CountSpec

    def write_record(self, **changes: Any) -> None:
        """Update the run record (``runs/<run_id>.json``) and write it."""
        self.record.update(changes)
        self.store.write_run(self.run_id, self.record)


@dataclass
class _Counted:
    """Shards counted in this run (results by shard id) and the bad ones skipped."""

    results: dict[str, dict]
    bad: list[dict]

    def good(self, ids: Sequence[str]) -> list[str]:
        """``ids`` without the bad shards."""
        bad_ids = {b["shard_id"] for b in self.bad}
        return [sid for sid in ids if sid not in bad_ids]

    def counted_now(self) -> list[dict]:
        """Results of the shards counted now (not reused from their markers)."""
        return [r for r in self.results.values() if r["status"] == "counted"]


def _worker_args(store: RunStore, source: CorpusSource, spec: CountSpec, metadata: dict[str, str],
                 opts: JobOptions) -> dict[str, Any]:
    """The constructor arguments of every :class:`CountWorker` (plain values for Ray)."""
    tokenizer = os.path.abspath(source.tokenizer) if source.tokenizer else source.tokenizer
    return {
        "store": str(store.root),
        "source": {**source.to_dict(), "tokenizer": tokenizer},
        "spec": spec.to_metadata(),
        "metadata": metadata,
        "dense_budget": opts.dense_budget,
        "cwd": os.getcwd(),
        "window_groups": opts.window_groups,
    }


def _progress(total: int, enabled: bool | None) -> Any:
    return progress(total=total, desc="counting shards", unit="shard", enabled=enabled, unit_scale=False)


def _bind(store: RunStore, config: dict[str, Any], source: CorpusSource, opts: JobOptions) -> int:
    """Bind the store to ``config``; remember a text corpus' tokenizer path for ``posstats
    refresh`` and the shard size (:func:`_shard_bytes`, returned) for every later run."""
    bound = store.bind(config)
    remember = {}
    tokenizer_path = os.path.abspath(source.tokenizer) if source.column is None and source.tokenizer else None
    if tokenizer_path and bound.get("tokenizer_path") != tokenizer_path:
        remember["tokenizer_path"] = tokenizer_path
    shard_bytes = _shard_bytes(opts, bound.get("shard_bytes"), source)
    if bound.get("shard_bytes") != shard_bytes:
        remember["shard_bytes"] = shard_bytes
        if "shard_bytes" not in bound and store.manifest() is not None:
            _log(f"run store {store.root} predates recorded shard sizes: its inputs are cut into shards of up to "
                 f"{format_bytes(shard_bytes)} from now on, so this run counts them again")
    if remember:
        write_json_atomic(store.config_path, {**bound, **remember})
    return shard_bytes


def _shard_bytes(opts: JobOptions, recorded: int | None, source: CorpusSource) -> int:
    """The target shard size (:func:`posstats.corpus.shards.shard_bytes_for`) for the
    workers this run plans (:func:`_planned_workers`, asked only when the size is auto)."""
    if opts.shard_bytes is not None and recorded is not None and recorded != opts.shard_bytes:
        _log(f"shard size {format_bytes(opts.shard_bytes)}, not the store's {format_bytes(recorded)}: "
             f"inputs cut differently are counted again")
    return shard_bytes_for(source, requested=opts.shard_bytes, recorded=recorded,
                           workers=lambda: _planned_workers(opts))


def _planned_workers(opts: JobOptions) -> int:
    """The workers a first run sizes its shards for: ``--workers``; else, joining a cluster
    (or inside a Ray session already), its CPUs: the cluster is joined now, and the engine
    then finds Ray connected; else the CPUs of this machine, as an embedded Ray gets them."""
    if opts.workers:
        return int(opts.workers)
    import ray

    if opts.address or os.environ.get("RAY_ADDRESS") or ray.is_initialized():
        connect_ray(opts.address)
        return max(1, int(ray.cluster_resources().get("CPU", 1)))
    return os.cpu_count() or 1


def _previous_manifest(store: RunStore, *, incremental: bool) -> dict[str, Any] | None:
    """The manifest of the last finished run (None: none yet; a refresh needs one)."""
    previous = store.manifest()
    if incremental and previous is None:
        msg = f"run store {store.root} has no finished count to refresh; run 'posstats count --ray' first"
        raise PosstatsError(msg)
    return previous


def _plan(store: RunStore, source: CorpusSource, spec: CountSpec, opts: JobOptions,
          previous: dict[str, Any] | None, shard_bytes: int) -> _Plan:
    """Plan the shards; split them into reused (marked) and to count; diff with ``previous``."""
    shards = plan_shards(source, spec, shard_bytes=shard_bytes)
    by_id = {s.shard_id: s for s in shards}
    planned = sorted(by_id)
    done_ids = {sid for sid in planned if store.is_done(sid)}
    todo = [by_id[sid] for sid in planned if sid not in done_ids]
    todo.sort(key=lambda s: (-s.size_hint, s.shard_id))  # biggest first: balanced finish
    old_ids = set(previous.get("shard_ids", [])) if previous else set()
    added = sorted(set(planned) - old_ids)
    removed = sorted(old_ids - set(planned))
    return _Plan(shards, by_id, planned, done_ids, todo, added, removed,
                 manifest_changes(previous, shards, added, removed), shard_bytes)


def _start_record(store: RunStore, run_id: str, command: str, inputs: Sequence[str], files: Sequence[str],
                  plan: _Plan) -> dict[str, Any]:
    """Write the run record with status ``running`` (an attempt more when resuming); return it."""
    old = store.read_run(run_id)
    resumed = old is not None and old.get("status") != "complete"
    record = {
        "run_id": run_id,
        "command": command,
        "status": "running",
        "started": old.get("started") if resumed and old else _stamp(),
        "attempt": (old.get("attempt", 1) + 1) if old else 1,
        "inputs": list(inputs),
        "files": len(files),
        "shards": len(plan.shards),
        "already_done": len(plan.done_ids),
        "bad_shards": [],
    }
    store.write_run(run_id, record)
    if resumed:
        _log(f"resuming run {run_id}: {len(plan.done_ids)}/{len(plan.shards)} shard(s) already counted")
    return record


def _count_todo(run: _Run, engine: _Executor) -> _Counted:
    """Count the shards to count; raise at a bad shard unless skipping them."""
    with _progress(len(run.plan.shards), run.opts.show_progress) as bar:
        bar.update(len(run.plan.done_ids))
        results, bad = engine.count(run.plan.todo, bar=bar)
    if bad and run.spec.mode == "pack":
        bad = bad + _pack_siblings(bad, run.plan.shards)
    run.record["bad_shards"] = bad
    if bad and not run.opts.skip_bad_shards:
        more = f" (and {len(bad) - 1} more bad shard(s), see {run.store.run_path(run.run_id)})" if len(bad) > 1 else ""
        msg = (
            f"{bad[0]['error']}{more}; the {len(run.plan.done_ids) + len(results)} finished shard(s) are kept in "
            f"{run.store.root}: fix the input and rerun to continue, or pass --skip-bad-shards"
        )
        raise InputError(msg)
    return _Counted(results, bad)


def _pack_siblings(bad: list[dict], shards: Sequence[Shard]) -> list[dict]:
    """In pack mode, the other pieces of an input with a bad piece: without it the stream
    cannot be placed (:mod:`posstats.counting.pack`), so the whole input is left out."""
    bad_ids = {b["shard_id"] for b in bad}
    broken = {b["path"]: b["label"] for b in bad}
    return [
        {"shard_id": s.shard_id, "path": s.path, "label": s.label(),
         "error": f"{s.label()}: left out with {broken[s.path]} (pack mode needs every piece of an input)"}
        for s in shards if s.path in broken and s.shard_id not in bad_ids and not s.is_whole_input
    ]


def _drop_corrupt(store: RunStore, corrupt: list[dict], by_id: dict[str, Shard], removed: list[str], *,
                  last: bool) -> list[Shard]:
    """Delete partials that failed their integrity check (see :mod:`posstats.counting.reduce`) and
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


def _recount_corrupt(run: _Run, engine: _Executor, counted: _Counted, corrupt: list[dict], *, last: bool) -> None:
    """Delete the corrupt partials and count their shards again (raises on the last attempt)."""
    recount = _drop_corrupt(run.store, corrupt, run.plan.by_id, run.plan.removed, last=last)
    if not recount:
        return
    with _progress(len(recount), run.opts.show_progress) as bar:
        more, more_bad = engine.count(recount, bar=bar)
    counted.results.update(more)
    if more_bad:
        counted.bad = counted.bad + more_bad
        run.record["bad_shards"] = counted.bad
        if not run.opts.skip_bad_shards:
            raise InputError(more_bad[0]["error"])


def _window_group_items(run: _Run, items: list[tuple[str, int]],
                        full: list[tuple[str, int]]) -> tuple[list[tuple[str, int]] | None, str | None]:
    """``(items, None)``: the saved window groups whose signed sum goes beside the reduced
    counts (those of the counts' own ``items``, else, when a refresh's previous result has
    none, every good partial's ``full``); ``(None, why not)`` otherwise (``(None, None)``
    when none were asked for)."""
    k, why = shard_window_groups(run.spec, run.opts.window_groups)
    if not k:
        return None, why
    for candidate in (items, full):
        if all(window_groups_file(path) is not None for path, _ in candidate):
            return candidate, None
    missing = sum(window_groups_file(path) is None for path, _ in full)
    return None, (f"{missing} of {len(full)} partial(s) have no window groups (counted before they were kept, or "
                  "with --window-groups 0; a new store counts them all); analyze tests homogeneity with the "
                  "permutation null")


def _pack_halves_asked(run: _Run) -> bool:
    """A pack-mode count in steps with window groups asked for above 4,096 positions: it
    keeps the corpus' halves (:func:`_pack_halves_items`)."""
    return (run.spec.mode == "pack" and run.spec.positions > WINDOW_GROUP_POSITIONS
            and kept_window_groups(run.spec.positions, run.opts.window_groups) == HALVES_GROUPS)


def _pack_halves_items(run: _Run, full: list[tuple[str, int]]) -> list[tuple[str, int]] | None:
    """The partials whose shards make the corpus' two halves (by shard-id rank parity)
    where :func:`_pack_halves_asked` and the corpus has two shards or more
    (:meth:`_Reduce._halves`); None otherwise."""
    return sorted(full) if _pack_halves_asked(run) and len(full) >= 2 else None


def _reduce(run: _Run, engine: _Executor, counted: _Counted, result_dir: Path) -> tuple[dict[str, Any], str]:
    """Reduce into ``result_dir``: incrementally or in full (:meth:`RunStore.reduce_items`);
    once more after recounting corrupt partials. Returns (final summary, mode)."""
    plan, store = run.plan, run.store
    old_result = store.result_file(run.previous) if run.previous else None  # checks the manifest's result
    for last in (False, True):
        good = counted.good(plan.planned)
        items, mode = store.reduce_items(good, added=counted.good(plan.added),
                                         removed=plan.removed, old_result=old_result if run.incremental else None)
        full = [(str(store.partial_dir(sid)), 1) for sid in good]
        groups = _window_group_items(run, items, full)
        halves = _pack_halves_items(run, full)
        if halves is None and _pack_halves_asked(run):
            groups = (None, f"pack mode counted in steps keeps the corpus' halves as its shards of even and odd rank, "
                            f"but the corpus has {len(full)} shard(s) (count with a smaller --shard-size); the rank "
                            "test's edge is the analytic one")
        reduced = engine.reduce(items, scratch=store.reduce_dir(run.run_id), final_dir=result_dir,
                                window_groups=groups, halves=halves)
        if "corrupt" not in reduced:
            break
        _recount_corrupt(run, engine, counted, reduced["corrupt"], last=last)
    return reduced, mode


def _count_and_reduce(run: _Run, worker_args: dict[str, Any]) -> tuple[_Counted, dict[str, Any], str, Path, dict]:
    """Count on the actor pool, then tree-reduce; a failure is recorded in the run record.

    Returns (counted, final reduce summary, mode, result folder, engine timings).
    """
    try:
        executor = _LocalEngine if run.opts.executor == "local" else _Engine
        with executor(run.opts, worker_args) as engine:
            _log(
                f"{run.command} {run.run_id}: {len(run.plan.shards)} shard(s) in {len(run.files)} input(s) "
                f"(shard size {format_bytes(run.plan.shard_bytes)}), "
                f"{len(run.plan.todo)} to count, {engine.workers} worker(s), store {run.store.root}"
            )
            t = time.perf_counter()
            counted = _count_todo(run, engine)
            count_s = time.perf_counter() - t
            result_dir = run.store.new_result_dir(run.run_id)
            t = time.perf_counter()
            reduced, mode = _reduce(run, engine, counted, result_dir)
            reduce_s = time.perf_counter() - t
            timings = {"workers": engine.workers, "ray_startup_s": engine.startup_s, "actors_start_s": engine.actors_s,
                       "count_s": count_s, "reduce_s": reduce_s}
    except BaseException as exc:
        run.write_record(status="failed", finished=_stamp(), error=str(exc) or type(exc).__name__)
        raise
    return counted, reduced, mode, result_dir, timings


def _publish(run: _Run, counted: _Counted, reduced: dict[str, Any], mode: str, result_dir: Path,
             timings: dict[str, Any]) -> dict[str, Any]:
    """Publish the manifest of a reduced total (refusing an empty corpus), drop what it
    replaced, mark the run complete; return the run summary."""
    store, plan = run.store, run.plan
    if reduced["sequences"] == 0:
        shutil.rmtree(result_dir, ignore_errors=True)
        msg = f"empty corpus: no sequences in {', '.join(run.files)}"
        store.write_run(run.run_id, {**run.record, "status": "failed", "finished": _stamp(), "error": msg})
        raise InputError(msg)
    out = run.opts.out if run.opts.out is not None else (run.previous or {}).get("out")
    manifest = store.new_manifest(
        reduced, run_id=run.run_id, command=run.command, finished=_stamp(), config=run.config, inputs=run.inputs,
        files=run.files, out=out, shards=[plan.by_id[sid] for sid in counted.good(plan.planned)], bad=counted.bad,
        result_dir=result_dir, dense_budget=run.opts.dense_budget,
    )
    manifest["window_groups_asked"] = run.opts.window_groups  # what a refresh keeps (_refresh_window_groups)
    store.publish(manifest)
    if mode == "incremental":
        for sid in plan.removed:
            store.remove_partial(sid)
    store.clean_temporary(run.run_id)
    n_counted = len(counted.counted_now())
    run.write_record(status="complete", finished=_stamp(), counted=n_counted, reduce=mode)
    engine = {**timings, "reduce_ranges": reduced["ranges"],
              **{f"reduce_{k}": reduced[k] for k in ("check_s", "ranges_s", "assemble_s")},
              "tokens_counted_now": sum(r["tokens"] for r in counted.counted_now())}
    return _summary(run, manifest, counted=n_counted, bad=counted.bad, engine=engine, mode=mode)


def _up_to_date(run: _Run) -> dict[str, Any]:
    """Nothing to count or reduce: the previous result stands; return its run summary."""
    _log(f"run store {run.store.root} is up to date ({len(run.plan.shards)} shard(s)); nothing to count")
    summary = _summary(run, run.previous, counted=0, bad=[], engine=None, mode="up to date")
    run.store.write_run(run.run_id, {**run.record, "status": "complete", "finished": _stamp(), "counted": 0})
    return summary


def _window_groups_summary(store: RunStore, manifest: dict[str, Any], *, note: str | None = None) -> dict[str, Any]:
    """The summary's ``window_groups`` (``{"file", "groups", "windows"}`` and ``short_halves`` as a count in one
    process writes it, with ``kept``: ``note`` where given, or ``{"skipped": why}``) and ``window_groups_path`` (the file in the
    store's result, to link beside the counts), from the manifest; {} when none were asked for."""
    entry = manifest.get("window_groups")
    if not entry:
        return {}
    if "file" not in entry:
        return {"window_groups": dict(entry)}
    counts = store.result_file(manifest)  # checks the manifest's result names a folder of the store
    if counts is None:
        return {"window_groups": {"skipped": "the store's result has no counts file"}}
    path = counts.parent / WINDOW_GROUPS_FILE
    kept = {k: entry[k] for k in ("file", "groups", "windows", "short_halves") if k in entry}
    return {"window_groups": {**kept, **({"kept": note} if note else {})}, "window_groups_path": str(path)}


def _summary(run: _Run, manifest: dict[str, Any], *, counted: int, bad: list[dict], engine: dict | None,
             mode: str) -> dict[str, Any]:
    """The run summary (``count.json`` fields, ``counts_path`` and ``ray``; see :func:`count_job`)."""
    # the counting rate excludes start-up (Ray and the actors): counting and reducing only
    startup = (engine["ray_startup_s"] + engine["actors_start_s"]) if engine else 0.0
    seconds = time.perf_counter() - run.t_start - startup
    plan = run.plan
    return {
        "files": len(run.files),
        "sequences": manifest["sequences"],
        "windows": manifest["windows"],
        "tokens_counted": manifest["tokens"],
        "positions_occupied": manifest["positions_occupied"],
        "storage": manifest["storage"],
        "counts_file": manifest["counts_file"],
        "seconds": round(seconds, 3),
        "tokens_per_s": round(manifest["tokens"] / seconds, 1) if seconds > 0 else None,
        "fingerprint": manifest["fingerprint"],
        "counts_path": str(run.store.result_file(manifest)),
        **_window_groups_summary(run.store, manifest, note=halves_only_note(run.spec.positions, run.opts.window_groups,
                                                                     shards=run.spec.mode == "pack")),
        "ray": {
            "run_id": run.run_id,
            "store": str(run.store.root),
            "shards": len(plan.shards),
            "shard_bytes": plan.shard_bytes,
            "shards_counted": counted,
            "shards_cached": len(plan.done_ids),
            "shards_kept": len(plan.shards) - len(plan.added),
            "shards_added": len(plan.added),
            "shards_removed": len(plan.removed),
            "changes": plan.changes,
            "bad_shards": bad,
            "reduce": mode,
            **({k: (round(v, 3) if isinstance(v, float) else v) for k, v in engine.items()} if engine else {}),
        },
    }


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
    """The body of a count or refresh run; returns the run summary (see :func:`count_job`).

    Under the store's lock: bind the store, plan the shards, write the run record; then,
    unless the stored result is already up to date, count, reduce and publish.
    """
    t_start = time.perf_counter()
    check_summable(spec)
    store = RunStore(os.path.abspath(opts.store))
    config = store_config(source, spec, metadata)
    files = source.files()
    run_id = validate_run_id(opts.run_id or derive_run_id(files, config, command=command))
    with store.lock(run_id=run_id, command=command):
        shard_bytes = _bind(store, config, source, opts)
        previous = _previous_manifest(store, incremental=incremental)
        plan = _plan(store, source, spec, opts, previous, shard_bytes)
        record = _start_record(store, run_id, command, inputs, files, plan)
        run = _Run(store, run_id, command, opts, incremental, list(inputs), files, config, previous, plan, record,
                   t_start=t_start, spec=spec)
        # a result reduced with other window groups than asked is reduced again (the partials stay)
        if (store.is_up_to_date(previous, plan.planned, todo=len(plan.todo))
                and (previous or {}).get("window_groups_asked") == opts.window_groups):
            return _up_to_date(run)
        counted, reduced, mode, result_dir, timings = _count_and_reduce(
            run, _worker_args(store, source, spec, metadata, opts))
        return _publish(run, counted, reduced, mode, result_dir, timings)


def count_job(source: CorpusSource, spec: CountSpec, metadata: dict[str, str], opts: JobOptions) -> dict[str, Any]:
    """Count a corpus as a Ray job into the run store ``opts.store``.

    Returns the summary of ``count.json`` (files, sequences, windows, tokens_counted,
    positions_occupied, storage, counts_file, seconds, tokens_per_s, fingerprint),
    ``counts_path`` (the result's counts file in the store) and ``ray`` (run id, shard
    numbers, bad shards, timings). The counts equal :func:`posstats.corpus.count_step.count_corpus`
    exactly (with ``dense_budget`` = its memory budget, even the storage kind).

    Raises:
        PosstatsError: bad options, a locked store, a store of another configuration.
        InputError: a bad shard (unless ``skip_bad_shards``), an empty corpus.
    """
    inputs = [absolute(p) for p in source.inputs]
    return _run(source, spec, metadata, opts, command="count", inputs=inputs, incremental=False)


def _refresh_window_groups(manifest: dict[str, Any] | None, /) -> int:
    """K of the window groups a refresh keeps: what the last run asked for (its manifest's
    ``window_groups_asked``; 0 keeps them off), else the default (a store counted before
    steps kept them: the new shards get them, and the reduce says why the total has none
    while old partials lack them)."""
    manifest = manifest or {}
    if "window_groups_asked" in manifest:
        return int(manifest["window_groups_asked"])
    return DEFAULT_WINDOW_GROUPS


def refresh_job(store: str, opts: JobOptions, *, inputs: Sequence[str] | None = None,
                tokenizer: str | None = None,
                storage_options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Bring a run store up to date with its inputs (or new ``inputs`` patterns).

    Counts only shards that are new or changed, subtracts those that disappeared from the
    stored total (``total - removed + added``), and returns (summary, store config). The
    result equals a full recount of the inputs. The window groups are kept as the last
    result kept them (:func:`_refresh_window_groups`).
    """
    source, spec, metadata = refresh_source(store, inputs=inputs, tokenizer=tokenizer, storage_options=storage_options)
    opts = dataclasses.replace(opts, window_groups=_refresh_window_groups(RunStore(store).manifest()))
    summary = _run(source, spec, metadata, opts, command="refresh", inputs=list(source.inputs), incremental=True)
    return summary, {"source": source, "spec": spec, "metadata": metadata}


# ----------------------------------------------------------------------------- CLI glue


def options_from_args(args: argparse.Namespace, *, default_store: str | None,
                      executor: Literal["ray", "local"] = "ray") -> JobOptions:
    """JobOptions from the ``--ray`` flags (see :func:`posstats.jobs.flags.add_ray_args`)."""
    if args.run_id is not None:
        validate_run_id(args.run_id)
    store = args.store or default_store
    if store is None:
        raise PosstatsError("give --store DIR")
    if args.workers is not None and args.workers < 1:
        raise PosstatsError(f"--workers must be >= 1, got {args.workers}")
    if args.shard_size is not None and args.shard_size <= 0:
        raise PosstatsError(f"--shard-size must be > 0 MiB, got {args.shard_size}")
    return JobOptions(
        store=store,
        run_id=args.run_id,
        address=args.address,
        workers=args.workers,
        skip_bad_shards=args.skip_bad_shards,
        dashboard=bool(getattr(args, "dashboard", False)),
        shard_bytes=None if args.shard_size is None else max(1, int(args.shard_size * 2**20)),
        dense_budget=int(args.memory_budget * 2**30),
        out=os.path.abspath(args.out) if getattr(args, "out", None) else None,
        executor=executor,
    )


def uses_store(args: argparse.Namespace, /) -> bool:
    """Whether a count without ``--ray`` asks for the counting steps and their store (then
    run by the local executor): ``--store``, ``--run-id``, ``--skip-bad-shards`` or
    ``--shard-size`` given."""
    return bool(getattr(args, "store", None) or getattr(args, "run_id", None) or getattr(args, "skip_bad_shards", False)
                or getattr(args, "shard_size", None) is not None)


def count_to(inputs: CountInputs, stage: Path, /, *, budget_bytes: float, keep: bool = True,
             steps: JobOptions | None = None) -> tuple[PositionalCounts | None, dict[str, Any]]:
    """Count ``inputs`` into ``stage`` (the files of a counts folder but ``count.json``:
    ``config.json`` and the counts file); return the counts (None unless ``keep`` and in
    this process) and their ``count.json`` record. The one entry of every count:

    - ``steps`` None: one pass over whole files in this process
      (:func:`posstats.runs.counts_folder.count_in_process`, the fastest on one machine);
    - ``steps``: the counting steps over shards, each a partial and its completion marker
      in the run store ``steps.store`` (resumable, refreshable), then the range reduce
      (:func:`count_job`), run by ``steps.executor``: a pool of Ray actors or, ``local``,
      one at a time in this process. The counts stay on disk, never in the driver's memory.

    Every way gives bit-identical counts, and the counts by window group beside them where
    ``inputs.window_groups`` asks (a count in steps keeps them in truncate and chunk mode,
    summed from its shards', :func:`posstats.corpus.count_step.shard_window_groups`;
    ``count.json``'s ``window_groups`` says what was written or why not)."""
    if steps is None:
        return count_in_process(inputs, stage, budget_bytes=budget_bytes, keep=keep)
    files = inputs.source.files()
    ray_config = {"store": os.path.abspath(steps.store), "run_id": steps.run_id, "address": steps.address,
                  "workers": steps.workers, "skip_bad_shards": steps.skip_bad_shards, "shard_bytes": steps.shard_bytes,
                  "executor": steps.executor}
    write_json_atomic(stage / "config.json", inputs.record(command="count", files=files, ray=ray_config))
    summary = count_job(inputs.source, inputs.spec, inputs.metadata,
                        dataclasses.replace(steps, window_groups=inputs.window_groups))
    return None, _link_result(summary, stage)


def _link_result(summary: dict[str, Any], stage: Path, /) -> dict[str, Any]:
    """Link the store's result (its counts file and, where kept, its window groups) into
    the counts folder ``stage``; return ``summary`` without the paths (``count.json``).
    The store's results are never rewritten in place, so a link is safe."""
    link_or_copy(summary.pop("counts_path"), stage / summary["counts_file"])
    groups = summary.pop("window_groups_path", None)
    if groups is not None:
        link_or_copy(groups, stage / WINDOW_GROUPS_FILE)
    return summary


def run(args: argparse.Namespace, /) -> int:
    """``posstats count`` (``--ray`` or not) and ``python -m posstats.jobs.count`` (always on
    Ray): count into ``--out`` through :func:`count_to`, print one line (or ``--json``)."""
    on_ray = getattr(args, "ray", True)  # the job entrypoint has no --ray switch: it is the Ray job
    steps = None
    if on_ray or uses_store(args):  # checks --run-id first
        steps = options_from_args(args, default_store=os.path.join(args.out, "store"),
                                  executor="ray" if on_ray else "local")
    inputs = count_inputs_from_args(args)
    budget = args.memory_budget * 2**30
    summary = publish_counts(args.out, lambda stage: count_to(inputs, stage, budget_bytes=budget, keep=False,
                                                              steps=steps)[1])
    print(count_line(summary, positions=args.positions, out=args.out))
    print_json(args, summary)
    print_document_note(args)
    warning = few_windows_warning(summary, mode=args.mode)
    if warning:
        print(f"posstats: warning: {warning}", file=sys.stderr)
    return 0


def _print_refresh(store: str, summary: dict[str, Any]) -> None:
    """What a refresh reused, added and removed, per input, and the new total."""
    ray_info = summary["ray"]
    print(
        f"refresh {store}: reused {ray_info['shards_kept']} shard(s), added {ray_info['shards_added']}, "
        f"removed {ray_info['shards_removed']} ({ray_info['reduce']}; {ray_info['shards_counted']} counted now)"
    )
    marks = {"new": "+", "changed": "~", "gone": "-"}
    for c in ray_info["changes"]:
        print(f"  {marks[c['status']]} {c['status']:<7} {c['path']} (+{c['shards_added']} / -{c['shards_removed']} shards)")
    for b in ray_info["bad_shards"]:
        print(f"  ! skipped {b['label']}: {b['error']}")
    print(f"total: {summary['tokens_counted']:,} tokens from {summary['sequences']:,} sequences in "
          f"{summary['files']} file(s), fingerprint {summary['fingerprint'][:16]}")


def _publish_refresh(out: str, summary: dict[str, Any], ctx: dict[str, Any]) -> None:
    """Publish the refreshed total as the counts folder ``out`` (config.json, counts.*, count.json)."""
    source, ray_info = ctx["source"], summary["ray"]
    config = CountInputs(source, ctx["spec"], ctx["metadata"], source.tokenizer).record(
        command="refresh", files=source.files(), ray={"store": ray_info["store"], "run_id": ray_info["run_id"]})

    def copy_result(stage: Path) -> dict[str, Any]:
        write_json_atomic(stage / "config.json", config)
        return _link_result(dict(summary), stage)

    publish_counts(out, copy_result)


def refresh_to(args: argparse.Namespace) -> dict[str, Any]:
    """``posstats refresh``: update the store, print what changed, write OUT if known."""
    if args.run_id is not None:
        validate_run_id(args.run_id)  # before reading the store
    if args.memory_budget is None:
        manifest = RunStore(os.path.abspath(args.store)).manifest() or {}
        args.memory_budget = manifest.get("dense_budget", 4 * 2**30) / 2**30
    opts = options_from_args(args, default_store=None, executor="local" if getattr(args, "local", False) else "ray")
    summary, ctx = refresh_job(args.store, opts, inputs=args.input, tokenizer=args.tokenizer,
                               storage_options=storage_options(getattr(args, "storage_option", None) or []))
    _print_refresh(args.store, summary)
    out = args.out or (RunStore(os.path.abspath(args.store)).manifest() or {}).get("out")
    if out and (summary["ray"]["reduce"] != "up to date" or not os.path.exists(os.path.join(out, "count.json"))):
        _publish_refresh(out, summary, ctx)
        print(f"-> {out}")
    return summary


def build_parser() -> argparse.ArgumentParser:
    """``python -m posstats.jobs.count``: the input/counting flags of ``posstats count`` plus the Ray flags."""
    p = ArgumentParser(
        prog="python -m posstats.jobs.count",
        description="Count positional tokens of a corpus as a Ray job (the same as 'posstats count --ray').",
    )
    add_input_args(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (config.json, counts.*, count.json)")
    add_ray_args(p, switch=False)
    add_output_args(p, json_result="count.json's record")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m posstats.jobs.count`` / ``ray job submit -- python -m posstats.jobs.count``."""
    args = build_parser().parse_args(argv)
    args.ray = True
    return run_guarded(run, args)


if __name__ == "__main__":
    sys.exit(main())
