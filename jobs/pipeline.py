"""Ray job: the whole refresh pipeline, count -> reduce -> geometry -> report -> export.

    python -m posstats.jobs.pipeline --config deploy/pipeline.example.toml [--run-id ID] [--set TABLE.KEY=VALUE ...]
    posstats pipeline --config FILE ...            (the same, in this process)
    posstats submit --address http://HEAD:8265 --config FILE    (the same, as a Ray job)

One run writes ``STORE/runs/<run_id>/`` (layout and rules: :mod:`posstats.service.pipeline_store`):

* **config**: the resolved configuration, first. A run id rerun with a configuration
  that would change its results is refused.
* **count**: the corpus is counted incrementally by the counting job (:mod:`posstats.jobs.count`)
  in a counting store of per-shard partials kept in the work folder, keyed by the counting
  configuration: only shards that are new or changed since the last run are counted, and
  shards of files that disappeared are subtracted. Remote inputs (``s3://...``) are
  mirrored into the work folder first (downloaded only when the object changed).
  ``count/summary.json`` lists the files counted (with their sizes and times), the shards
  counted now and reused, and the totals.
* **reduce**: the tree-reduced total (computed by the counting job's actors) is copied out
  of the shared counting store into the run, and checked against the count summary:
  ``reduce/counts.safetensors`` (or ``.parquet``), ``count.json``, ``config.json`` (a
  counts folder, as ``posstats count`` writes one).
* **geometry**: Hellinger geometry, classical MDS and encoding stress
  (:func:`posstats.analysis.analyze`, honest defaults: noise floor, bias-corrected
  distances, verdict) in a Ray task (retried by Ray if its worker dies), which reads the
  reduce stage's counts itself (the driver and the object store never hold them):
  ``mds.safetensors``, ``report.json``, ``report.md``, ``analysis-config.json``
  (:func:`posstats.reports.analysis_folder.write_analysis`).
* **report**: ``report.html`` with ``figures/`` and ``summary.md``
  (:func:`posstats.reports.html.render_html_report`), next to copies of the geometry files.
* **export**: the MDS encoding as a position table a model loads
  (:func:`posstats.reports.export.export_run`), with its model card.

The distances are computed once: the geometry task renders the report and the export
from its analysis in memory, into work folders that their stages then publish. A run
resumed after the geometry stage reads that stage back (and the reduce stage's counts)
once for both.

Each stage is built in a staging folder and published with its marker last; a rerun of the
run id skips completed stages. After the last stage the run's ``done.json`` is written, and
then ``latest`` is moved to the run. The whole run holds the store's lock.

This module also holds the client side of Ray's Job Submission SDK used by
``posstats submit / status / logs`` (:func:`submit_job`, :func:`job_status`,
:func:`job_logs`), so that ``posstats.cli`` never imports Ray itself.

"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import fnmatch
import glob as _glob
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from posstats.analysis import analyze, budgeted_stored_counts, ranges_refusal
from posstats.corpus.inputs import CountInputs, count_inputs
from posstats.corpus.remote import is_url, list_objects, object_version_ns
from posstats.corpus.shard_store import RunStore, config_key, store_config
from posstats.counting.io import counts_file, load_counts, load_header, load_indptr
from posstats.counting.window_groups_io import WINDOW_GROUPS_FILE, load_window_groups
from posstats.drift import check_comparable, diff, load_side, store_run_side, write_diff, write_skipped
from posstats.errors import InputError, OptionError, PosstatsError
from posstats.geometry.ranged import ranges_for_budget
from posstats.ids import join_inside
from posstats.options import declared_options
from posstats.processes import one_malloc_arena
from posstats.reports.analysis_folder import ANALYSIS_FILES, write_analysis
from posstats.reports.export import STRESS_POSITION_LIMIT, ExportOptions, export_run, nothing_to_export
from posstats.reports.html import render_html_report
from posstats.runs.run_folder import RunData, load_run, with_distances
from posstats.service.config import PipelineConfig, apply_overrides, config_names, dumps_toml, load_config
from posstats.service.pipeline_store import STAGES, DamagedMarker, Store, describe_os_error, utc_now, validate_run_id
from posstats.storage import jsontext
from posstats.storage.jsontext import write_json_atomic
from posstats.storage.publish import link_or_copy

from .connect import connect_ray
from .count import JobOptions, count_job, refresh_job
from .guard import run_guarded
from .output import CONFIG_NAMES, ArgumentParser, add_output_args, print_json
from .ranges import analyze_over_actors


def _log(message: str) -> None:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%H:%M:%S")
    print(f"posstats: [{stamp}] {message}", file=sys.stderr, flush=True)


def default_run_id() -> str:
    """``run-YYYYMMDDTHHMMSSZ`` (UTC now)."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("run-%Y%m%dT%H%M%SZ")


class _Recount(Exception):
    """The counting store moved on since this run's count stage: count again."""


__all__ = ["add_pipeline_args", "build_parser", "config_from_args", "default_run_id", "main", "run_pipeline"]

# ----------------------------------------------------------------------------- context


@dataclass
class _Handoff:
    """What the stages of one driver hand each other in memory; empty after a resume.

    The counts are not handed on in memory: the geometry task reads the reduce stage's
    file itself, so that the driver (and Ray's object store) never hold them.

    Attributes:
        rendered: stage -> (folder, marker info) of the report / export the geometry task
            rendered from its analysis, waiting for their stage to publish them.
        run_data: the completed geometry stage's run read back (a resumed run), shared by
            the report and the export.
    """

    rendered: dict[str, tuple[Path, dict[str, Any]]] = field(default_factory=dict)
    run_data: RunData | None = None


class _Run:
    """One pipeline run: configuration, store, lock, work folders, Ray connection."""

    def __init__(self, cfg: PipelineConfig, store: Store, lock: Any, run_id: str, log: Callable[[str], None]) -> None:
        self.cfg, self.store, self.lock, self.run_id, self.log = cfg, store, lock, run_id, log
        self.work = Path(cfg.work_dir()).absolute()
        self.staging_root = self.work / "staging" / run_id
        self.cache = self.work / "cache" / run_id
        self.attempt = f"{socket.gethostname()}-{os.getpid()}-{int(time.time())}"
        self._ray_started = False
        self._ray_ready = False
        self.handoff = _Handoff()
        self.previous: str | None = None  # the run latest named when this driver started: the diff's A
        self._verified: dict[str, Path] = {}  # stage -> its local folder, checked against its marker

    # -- Ray ---------------------------------------------------------------------------

    def ray(self) -> Any:
        import ray

        if not self._ray_ready:
            started, context = connect_ray(self.cfg.ray.address,
                                           num_cpus=max(os.cpu_count() or 1, self.cfg.ray.workers or 1))
            self._ray_started = started or context is not None  # joined here: disconnect in close()
            self._ray_ready = True
        return ray

    def close(self) -> None:
        if self._ray_started:
            import ray

            ray.shutdown()
            self._ray_started = False

    # -- local views of stages -------------------------------------------------------------

    def stage_local(self, stage: str) -> Path:
        """A local folder with the files of a completed stage, checked against its marker
        (the store folder itself for a local store, a downloaded copy for a remote one)."""
        if stage not in self._verified:  # checked against its marker once per driver
            dest = self.cache / stage
            shutil.rmtree(dest, ignore_errors=True)
            self._verified[stage] = self.store.stage_dir(self.run_id, stage, None if self.store.local else dest)
        return self._verified[stage]

    def stage_json(self, stage: str, name: str) -> dict[str, Any]:
        data = self.store.read_json(f"{self.store.stage_rel(self.run_id, stage)}/{name}")
        if data is None:
            msg = f"{self.store.display(self.store.stage_rel(self.run_id, stage))}: {name} is missing"
            raise PosstatsError(msg)
        return data

    # -- stage runner ------------------------------------------------------------------------

    def stage(self, name: str, build: Callable[[Path], Mapping[str, Any]]) -> dict[str, Any]:
        """Run one stage unless its marker exists; publish its files, marker last."""
        marker = self.store.stage_marker(self.run_id, name)
        if marker is not None:
            self.log(f"{name}: complete already ({marker['finished']}), skipped")
            return marker
        self.store.clear_stage(self.run_id, name)  # what a killed attempt left, if anything
        # one staging folder per driver: a killed driver's stragglers never write into ours
        staging = self.staging_root / f"{name}-{self.attempt}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        t = time.perf_counter()
        self.log(f"{name}: running")
        info = dict(build(staging))
        info["seconds"] = round(time.perf_counter() - t, 3)
        self.lock.check()
        marker = self.store.publish_stage(self.run_id, name, staging, info=info)
        shutil.rmtree(staging, ignore_errors=True)
        self.log(f"{name}: done in {info['seconds']:.1f} s")
        return marker


# ----------------------------------------------------------------------------- stages


def _stage_config(run: _Run, staging: Path) -> dict[str, Any]:
    """The resolved configuration (secrets redacted) as config.json and pipeline.toml."""
    cfg = run.cfg
    resolved = cfg.to_dict()  # secrets redacted
    resolved["run_id"] = run.run_id
    (staging / "config.json").write_text(jsontext.dumps(resolved, indent=2, sort_keys=True) + "\n")
    (staging / "pipeline.toml").write_text(
        f"# resolved configuration of run {run.run_id} (storage secrets redacted)\n" + dumps_toml(resolved))
    return {"result_key": cfg.result_key(), "source": cfg.source, "host": socket.gethostname(), "pid": os.getpid()}


def _fetch_if_changed(fs: Any, key: str, info: Mapping[str, Any], dest: Path) -> bool:
    """Download object ``key`` to ``dest`` (temp file + rename, its mirror mtime set) unless
    ``dest`` already has its mirror mtime and size; True when it downloaded."""
    mtime_ns = object_version_ns(fs, info, key)
    size = info.get("size")
    try:
        st = dest.stat()
        if st.st_mtime_ns == mtime_ns and (size is None or st.st_size == size):
            return False
    except FileNotFoundError:
        pass
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.download-{os.getpid()}"
    try:
        fs.get_file(key, str(tmp))
        os.utime(tmp, ns=(mtime_ns, mtime_ns))
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return True


def _drop_stale_mirrors(local_pattern: str, keep: set[str]) -> None:
    """Delete the mirror files matching ``local_pattern`` that are not in ``keep`` (their
    objects are gone)."""
    for stale in _glob.glob(local_pattern):
        if stale not in keep and os.path.isfile(stale) and fnmatch.fnmatch(stale, local_pattern):
            os.unlink(stale)


def _mirror(run: _Run, url: str, *, storage_options: Mapping[str, Any], must_match: bool = True) -> list[tuple[str, str]]:
    """Download the objects a remote path or glob names into the work folder (only those
    that changed); return [(local path, URL)]."""
    fs, found = list_objects(url, storage_options, must_match=must_match)
    objects = [(key, info) for key, info in found if info.get("type") == "file"]  # a folder URL is not mirrored
    if found and not objects and must_match:
        msg = f"{url}: is a folder; name its files (a glob such as {url.rstrip('/')}/*.parquet)"
        raise InputError(msg)
    proto = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
    path = fs._strip_protocol(url)
    out = []
    base = run.work / "inputs" / proto
    # every key is checked before anything is written: a key with '..' never writes outside
    dests = [join_inside(base, key, what=f"object key of {url}") for key, _ in objects]
    for (key, info), dest in zip(objects, dests):
        if _fetch_if_changed(fs, key, info, dest):
            run.log(f"mirrored {proto}://{key} ({info.get('size', '?')} bytes)")
        out.append((str(dest), f"{proto}://{key}"))
    _drop_stale_mirrors(str(join_inside(base, path, what="input URL path")), {p for p, _ in out})
    return out


def _local_inputs(run: _Run) -> tuple[list[str], dict[str, str]]:
    """``[input] paths`` as local paths, remote ones (``s3://...``) mirrored into the work
    folder first; returns (local paths, {mirrored local path: its URL})."""
    i = run.cfg.values["input"]
    urls: dict[str, str] = {}
    inputs: list[str] = []
    for p in i["paths"]:
        if is_url(p):
            for local, url in _mirror(run, p, storage_options=i["storage_options"]):
                inputs.append(local)
                urls[local] = url
        else:
            inputs.append(p)
    return inputs, urls


def _local_tokenizer(run: _Run) -> str | None:
    """``[input] tokenizer`` as a local path (a remote one mirrored), or as configured."""
    i = run.cfg.values["input"]
    tokenizer = i["tokenizer"]
    if tokenizer and is_url(tokenizer):
        ((tokenizer, _),) = _mirror(run, tokenizer, storage_options=i["storage_options"])
    return tokenizer


def _resolve_count_inputs(cfg: PipelineConfig, inputs: list[str], tokenizer: str | None) -> CountInputs:
    """What to count: ``[input]`` reader options and ``[count]`` spec on local ``inputs``
    (:func:`posstats.corpus.inputs.count_inputs`)."""
    reading, counting = cfg.input_options(), cfg.count_options()
    return count_inputs(inputs, dataclasses.replace(reading, tokenizer=tokenizer), counting)


def _count_job_options(run: _Run, counts_store: str) -> JobOptions:
    """The counting job's options from ``[count]`` / ``[ray]`` (MiB / GiB to bytes, the
    window groups the shards keep), its store ``counts_store``."""
    c = run.cfg.values["count"]
    return JobOptions(
        store=counts_store,
        run_id=run.run_id,
        workers=run.cfg.ray.workers,
        skip_bad_shards=c["skip_bad_shards"],
        shard_bytes=None if c["shard_size_mib"] is None else max(1, int(c["shard_size_mib"] * 2**20)),
        dense_budget=run.cfg.count_options().budget_bytes,
        show_progress=False,
        window_groups=run.cfg.count_options().window_groups,
    )


def _count_into_store(counted: CountInputs, files: list[str], tokenizer: str | None,
                      opts: JobOptions) -> dict[str, Any]:
    """Bring the counting store ``opts.store`` up to date with ``files``: a refresh (only
    new or changed shards) when it holds a result already, else a first full count; the
    counting job's summary."""
    if RunStore(opts.store).manifest() is not None:
        summary, _ = refresh_job(opts.store, opts, inputs=files, tokenizer=tokenizer)
        return summary
    return count_job(counted.source, counted.spec, counted.metadata, opts)


def _listed_files(paths: list[str], urls: Mapping[str, str]) -> list[dict[str, Any]]:
    """The files counted as ``{"path", "url", "bytes", "mtime_ns"}`` (``url``: the remote
    object a mirrored file came from, else the path)."""
    listed = []
    for f in paths:
        st = os.stat(f)
        listed.append({"path": f, "url": urls.get(f, f), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns})
    return listed


def _count_summary(run: _Run, summary: Mapping[str, Any], manifest: Mapping[str, Any], *, counts_store: str,
                   key: str, listed: list[dict[str, Any]], count_config: dict[str, Any]) -> dict[str, Any]:
    """``count/summary.json`` (schema ``posstats.pipeline-count/1``) from the counting job's
    ``summary`` and the store's ``manifest``: where the total is, the files listed, shard
    numbers (``shards_reused = shards - shards_counted``), totals and the count config record."""
    info = summary["ray"]
    return {
        "schema": "posstats.pipeline-count/1",
        "run_id": run.run_id,
        "counts_store": counts_store,
        "counts_store_key": key,
        "result": manifest.get("result"),
        "counts_path": summary["counts_path"],
        "counts_file": summary["counts_file"],
        **{k: summary[k] for k in ("window_groups", "window_groups_path") if k in summary},
        "files": listed,
        "shards": info["shards"],
        "shards_counted": info["shards_counted"],
        "shards_reused": info["shards"] - info["shards_counted"],
        "shards_added": info["shards_added"],
        "shards_removed": info["shards_removed"],
        "changes": info["changes"],
        "bad_shards": info["bad_shards"],
        "reduce": info["reduce"],
        **{k: summary[k] for k in ("sequences", "windows", "tokens_counted", "positions_occupied", "storage",
                                   "fingerprint")},
        "count_config": count_config,
    }


def _count_config(counted: CountInputs, files: list[str], urls: Mapping[str, str],
                  tokenizer: str | None) -> dict[str, Any]:
    """The count configuration record (:meth:`posstats.corpus.inputs.CountInputs.record`)
    of the files counted, by URL where mirrored, with the configured ``tokenizer``; without
    ``command``, which the reduce stage adds to its ``config.json``."""
    record = dataclasses.replace(counted, tokenizer=tokenizer).record(command="pipeline",
                                                                      files=[urls.get(f, f) for f in files])
    del record["command"]
    return record


def _stage_count(run: _Run, staging: Path) -> dict[str, Any]:
    """Count the corpus incrementally into the counting store of its counting configuration
    (remote inputs mirrored first); write ``summary.json``."""
    inputs, urls = _local_inputs(run)
    tokenizer = _local_tokenizer(run)
    counted = _resolve_count_inputs(run.cfg, inputs, tokenizer)
    files = counted.source.files()  # InputError when a pattern matches nothing
    key = config_key(store_config(counted.source, counted.spec, counted.metadata))
    opts = _count_job_options(run, str(run.work / "count-store" / key))
    run.ray()
    summary = _count_into_store(counted, files, tokenizer, opts)
    manifest = RunStore(opts.store).manifest() or {}
    doc = _count_summary(run, summary, manifest, counts_store=opts.store, key=key,
                         listed=_listed_files(manifest.get("files", files), urls),
                         count_config=_count_config(counted, files, urls, run.cfg.values["input"]["tokenizer"]))
    (staging / "summary.json").write_text(jsontext.dumps(doc, indent=2, sort_keys=True) + "\n")
    run.log(f"count: {doc['shards']} shard(s) in {len(doc['files'])} file(s): {doc['shards_counted']} counted now, "
            f"{doc['shards_reused']} reused, {doc['shards_removed']} removed ({doc['reduce']}); "
            f"{doc['tokens_counted']:,} tokens")
    return {"shards": doc["shards"], "shards_counted": doc["shards_counted"], "input_files": len(doc["files"]),
            "tokens_counted": doc["tokens_counted"], "fingerprint": doc["fingerprint"]}


def _stage_reduce(run: _Run, staging: Path) -> dict[str, Any]:
    """Copy the counting store's total into the run as a counts folder, checked against the
    count summary (:class:`_Recount` when the store moved on since the count stage)."""
    doc = run.stage_json("count", "summary.json")
    manifest = RunStore(doc["counts_store"]).manifest() or {}
    if manifest.get("result") != doc["result"] or manifest.get("fingerprint") != doc["fingerprint"]:
        raise _Recount
    src = Path(doc["counts_path"])
    if not src.is_file():
        raise _Recount
    target = staging / doc["counts_file"]
    link_or_copy(src, target)  # a store's results are never rewritten in place
    if doc.get("window_groups_path"):
        if not Path(doc["window_groups_path"]).is_file():
            raise _Recount
        link_or_copy(doc["window_groups_path"], staging / WINDOW_GROUPS_FILE)
    counts = load_header(target)  # the totals only: the driver never holds the counts
    got = (counts.sequences, counts.tokens, counts.fingerprint)
    want = (doc["sequences"], doc["tokens_counted"], doc["fingerprint"])
    if got != want:
        msg = f"{src}: the counting store's total {got} does not match the count summary {want}"
        raise PosstatsError(msg)
    summary = {k: doc[k] for k in ("sequences", "windows", "tokens_counted", "positions_occupied", "storage",
                                   "counts_file", "fingerprint", "window_groups") if k in doc}
    summary["files"] = len(doc["files"])
    summary["run_id"] = run.run_id
    (staging / "count.json").write_text(jsontext.dumps(summary, indent=2, sort_keys=True) + "\n")
    (staging / "config.json").write_text(jsontext.dumps({"command": "pipeline", **doc["count_config"]}, indent=2) + "\n")
    return {"counts_file": doc["counts_file"], "tokens_counted": counts.tokens, "fingerprint": counts.fingerprint}


def _fresh_folder(path: Path) -> Path:
    """``path`` as an empty folder (what a killed or retried attempt left is removed)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _report_options(cfg: PipelineConfig, previous: str | None = None) -> dict[str, Any]:
    """Keywords of :func:`posstats.reports.html.render_html_report` from ``[report]``; with a
    previous run, a link to the diff stage's page."""
    r = cfg.values["report"]
    links = [(f"What changed since run {previous} (diff)", "../diff/diff.html")] if previous else []
    return {"width": r["width"], "max_positions": r["max_positions"], "links": links}


def _previous_run(store: Store, run_id: str) -> str | None:
    """The run ``latest`` names, when it is another complete run: what this run is compared with."""
    try:
        latest = (store.latest() or {}).get("run_id")
    except DamagedMarker:
        return None  # nothing to compare with; this run's success replaces the pointer
    if latest and latest != run_id and store.run_marker(latest) is not None:
        return str(latest)
    return None


def _stage_diff(run: _Run, staging: Path) -> dict[str, Any]:
    """The diff against the previous ``latest`` run (:mod:`posstats.drift`): which positions
    changed beyond sampling noise, spectra, stress and MDS drift, into ``diff/``. The counts
    are read a block of positions at a time; nothing when there is no previous run, a page
    saying why when it was counted differently."""
    previous = run.previous
    if previous is None:
        return {"against": None, "note": "no earlier complete run to compare with"}
    before = store_run_side(run.store, previous, run.cache / "previous")
    now = load_side(run.stage_local("geometry"), label=f"run {run.run_id}", counts=run.stage_local("reduce"))
    try:
        check_comparable(before, now)
    except InputError as exc:
        write_skipped(staging, a=before.label, b=now.label, reason=str(exc))
        run.log(f"diff: not compared with run {previous}: {exc}")
        return {"against": previous, "skipped": str(exc)}
    d = run.cfg.values["diff"]
    result = diff(before, now, level=d["level"], drift_dim=d["drift_dim"])
    write_diff(staging, result.document)
    p = result.document["positions"]
    run.log(f"diff: {result.document['summary']}")
    return {"against": previous, "changed": p["count_changed"], "tested": p["tested"], "level": p["level"],
            "summary": result.document["summary"]}


def _export_options(cfg: PipelineConfig) -> ExportOptions:
    """:class:`~posstats.reports.export.ExportOptions` from ``[export]`` (generated from
    them), with ``dim`` from :meth:`PipelineConfig.export_dim` and the seed of ``[geometry]``."""
    e = cfg.values["export"]
    taken = {d.name: e[d.name] for d in declared_options(ExportOptions) if d.option.pipeline}
    return ExportOptions(**{**taken, "dim": cfg.export_dim(), "seed": cfg.values["geometry"]["seed"],
                            "datasets": tuple(e["datasets"] or ())})


def _export_file(cfg: PipelineConfig) -> str:
    """The exported table's file name in export/: ``[export] name`` + ``.format``."""
    e = cfg.values["export"]
    return f"{e['name']}.{e['format']}"


def _write_report(run_data: RunData, geometry: Path, out: Path, *, name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The report stage's files in ``out``: the geometry stage's (copied) and the HTML
    report of ``run_data`` (report.html, figures/, summary.md); its marker info."""
    for file in ANALYSIS_FILES:
        shutil.copyfile(geometry / file, out / file)
    path = render_html_report(run_data, name=name, out=out, **options)
    return {"html": path.name}


def _write_export(run_data: RunData, out: Path, *, file: str, options: ExportOptions) -> dict[str, Any]:
    """The export stage's files in ``out`` (the table ``file`` and its card); its marker info.
    A run with nothing to export (no positive eigenvalue, or no component above sampling
    noise without ``[export] rank``) gets a README saying why instead."""
    refusal = nothing_to_export(run_data, rank=options.rank)
    if refusal:
        out.mkdir(parents=True, exist_ok=True)
        advice = "; set `[export] rank = R` in the pipeline config to export R components anyway" if refusal.overridable else ""
        reason = refusal.reason
        (out / "README.md").write_text(f"# No position table\n\n{reason[0].upper()}{reason[1:]}{advice}.\n")
        return {"file": None, "skipped": reason}
    res = export_run(run_data, out / file, options, force=True)
    m = res.metadata
    return {"file": file, "key": res.key, "n": m["n"], "d": m["d"], "rank": m["rank"], "stress": m["stress"],
            "scaled_stress": m["scaled_stress"]}


def geometry_task(counts: str, out_dirs: Mapping[str, str], config: Any, options: Mapping[str, Any],
                  run_id: str, counts_ref: str, ranges: int = 0) -> dict[str, Any]:
    """The geometry stage's body (runs as a Ray task): analyse ``counts`` (the reduce stage's,
    or its folder) once and, from that analysis in memory, write the geometry folder
    (mds.safetensors, report.json, report.md, analysis-config.json) and those of the later
    stages named in ``out_dirs`` (``report``, ``export``; ``options`` holds their keywords
    and the export's file name). Every folder is emptied first (a retried task starts
    clean). With ``ranges`` > 0 the counts' rows are held by that many Ray actors
    (:func:`jobs.ranges.analyze_over_actors`), else the task loads them. Returns each stage's marker info."""
    one_malloc_arena()  # the products' threads would each keep a heap of freed blocks
    outs = {stage: _fresh_folder(Path(d)) for stage, d in out_dirs.items()}
    write_json_atomic(outs["geometry"] / "started.json", {"pid": os.getpid(), "hostname": socket.gethostname(), "started": utc_now()})
    if ranges:
        analysis = analyze_over_actors(counts, config, ranges)
    else:
        loaded = load_counts(counts, compact=True)
        analysis = analyze(loaded, config, window_groups=load_window_groups(counts, loaded))
    run_data = write_analysis(outs["geometry"], analysis, inputs={"counts": counts_ref}, run_id=run_id, html=False)
    info = {"geometry": {"positions_used": int(len(analysis.positions)), "rank": run_data.report["spectrum"].get("rank"),
                         "pid": os.getpid(), "ranges": int(ranges)}}
    if "report" in outs:
        info["report"] = _write_report(run_data, outs["geometry"], outs["report"], name=run_id, options=options["report"])
    if "export" in outs:
        info["export"] = _write_export(run_data, outs["export"], file=options["export_file"], options=options["export"])
    return info


def geometry_ranges(counts: str, config: Any, *, chosen: int | None, budget_gib: float, gpus: float) -> int:
    """How many position ranges the geometry task's analysis holds in Ray actors (0: none,
    the analysis in the task's own process). ``chosen`` (``[ray] geometry_ranges``) when
    given; by default as many as keep each range's process within ``budget_gib``
    (:func:`posstats.geometry.ranged.ranges_for_budget`), 0 when one process fits it, when
    a GPU analyses, when the counts are dense, or when the analysis needs the counts in one
    process (buckets, the exact path, the shuffle null, held-out scores; an explicit
    ``chosen`` is then refused in one line)."""
    if chosen == 0:
        return 0
    indptr = load_indptr(counts_file(counts))
    rows = int(np.count_nonzero(np.diff(indptr))) if indptr is not None else 0
    problem = ranges_refusal(config, rows) if indptr is not None else "the counts are stored dense"
    if chosen is not None:
        if problem:
            raise OptionError(f"[ray] geometry_ranges = {chosen}: {problem}")
        return int(chosen)
    if problem or gpus > 0:
        return 0
    k = ranges_for_budget(budgeted_stored_counts(counts, int(indptr[-1]), config), int(budget_gib * 2**30))
    return k if k > 1 else 0


def _unwrap_task_error(exc: BaseException) -> BaseException:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, PosstatsError):
        return type(cause)(str(cause))
    return exc


def _stage_geometry(run: _Run, staging: Path) -> dict[str, Any]:
    """Run :func:`geometry_task` in a Ray task (retried if its worker dies) on the reduce
    stage's counts folder (read there, not by the driver); the report and export it
    rendered wait in the work folder for their stages."""
    ray = run.ray()
    from ray.exceptions import RayTaskError, WorkerCrashedError

    from .pipeline import (
        geometry_task as task_body,  # by reference, also when run as __main__
    )

    later = [s for s in ("report", "export") if run.store.stage_marker(run.run_id, s) is None]
    out_dirs = {"geometry": str(staging), **{s: str(run.staging_root / f"{s}-rendered-{run.attempt}") for s in later}}
    options = {"report": _report_options(run.cfg, run.previous), "export": _export_options(run.cfg),
               "export_file": _export_file(run.cfg)}
    counts = str(run.stage_local("reduce"))  # read by the task: the driver never holds the counts
    rc = run.cfg.values["ray"]
    config = run.cfg.analysis_config()
    gpus = _geometry_gpus(ray, config.device)
    ranges = geometry_ranges(counts, config, chosen=rc["geometry_ranges"], gpus=gpus,
                             budget_gib=run.cfg.values["count"]["memory_budget_gib"])
    if ranges:  # the range actors do the products: the task itself reserves no CPU they need
        cpus = 0.0
    else:
        cpus = rc["geometry_cpus"] if rc["geometry_cpus"] is not None else _largest_node_cpus(ray, with_gpu=gpus > 0)
    task = ray.remote(task_body).options(num_cpus=cpus, num_gpus=gpus, max_retries=rc["geometry_retries"],
                                         retry_exceptions=False)
    counts_ref = run.store.display(run.store.stage_rel(run.run_id, "reduce"))
    ref = task.remote(counts, out_dirs, config, options, run.run_id, counts_ref, ranges)
    try:
        out = ray.get(ref)
    except RayTaskError as exc:
        raise _unwrap_task_error(exc) from exc
    except WorkerCrashedError as exc:
        msg = (f"the geometry task's worker died {rc['geometry_retries'] + 1} time(s); rerun with --run-id "
               f"{run.run_id} to resume from the geometry stage")
        raise PosstatsError(msg) from exc
    run.handoff.rendered = {s: (Path(out_dirs[s]), out[s]) for s in later}
    return {"positions_used": out["geometry"]["positions_used"], "rank": out["geometry"]["rank"],
            "ranges": out["geometry"]["ranges"]}


def _geometry_gpus(ray: Any, device: str) -> float:
    """The GPUs the geometry task asks for: 1 when ``[geometry] device`` lets it use one
    (``auto`` or ``gpu``) and the cluster has one, else 0 (Ray hides the GPUs from a task
    that asks for none). ``gpu`` on a cluster without a GPU is refused before the task."""
    if device == "cpu":
        return 0.0
    has_gpu = float(ray.cluster_resources().get("GPU", 0.0)) >= 1.0
    if device == "gpu" and not has_gpu:
        raise OptionError("{device} gpu: the Ray cluster has no GPU (auto or cpu analyse on its CPUs)")
    return 1.0 if has_gpu else 0.0


def _largest_node_cpus(ray: Any, *, with_gpu: bool = False) -> float:
    """What the geometry task reserves by default: the CPUs of the largest alive node (with
    a GPU, when the task asks for one: it must fit on such a node), but no more than the
    cluster has free now (the counting actors are gone by then; whatever else holds CPUs
    is never waited on), at least 1. Ray sets the worker's OMP_NUM_THREADS to them, and the
    sparse products run on that many threads (:func:`posstats.geometry.products.product_threads`)."""
    cpus = [float(node.get("Resources", {}).get("CPU", 0)) for node in ray.nodes() if node.get("Alive")
            and (not with_gpu or float(node.get("Resources", {}).get("GPU", 0)) >= 1)]
    largest = max([c for c in cpus if c > 0], default=1.0)
    free = float(ray.available_resources().get("CPU", 0.0))
    return float(max(1.0, min(largest, int(free))))


def _take_rendered(run: _Run, stage: str, staging: Path) -> dict[str, Any] | None:
    """Move what the geometry task rendered for ``stage`` into its staging folder and return
    its marker info; None when nothing was (the geometry stage completed in an earlier attempt)."""
    rendered = run.handoff.rendered.pop(stage, None)
    if rendered is None:
        return None
    folder, info = rendered
    for entry in folder.iterdir():
        os.replace(entry, staging / entry.name)
    folder.rmdir()
    return info


def _resumed_run(run: _Run) -> RunData:
    """The run of the completed geometry stage, read back once per driver (a resumed run):
    its folder, the reduce stage's counts and, for up to STRESS_POSITION_LIMIT positions,
    all their distances (what the report and the export then share)."""
    if run.handoff.run_data is None:
        # the rows the report and the export need are read from the reduce stage's counts
        # file (never the whole counts: run_folder.run_distances)
        counts = counts_file(run.stage_local("reduce"))
        run_data = dataclasses.replace(load_run(run.stage_local("geometry")), counts_source=counts)
        if run_data.positions.size <= STRESS_POSITION_LIMIT:
            run_data = with_distances(run_data)
        run.handoff.run_data = run_data
    return run.handoff.run_data


def _stage_report(run: _Run, staging: Path) -> dict[str, Any]:
    """report.html, figures/ and summary.md next to copies of the geometry stage's files."""
    info = _take_rendered(run, "report", staging)
    if info is not None:
        return info
    return _write_report(_resumed_run(run), run.stage_local("geometry"), staging, name=run.run_id,
                         options=_report_options(run.cfg, run.previous))


def _stage_export(run: _Run, staging: Path) -> dict[str, Any]:
    """The MDS encoding as a position table with its model card."""
    info = _take_rendered(run, "export", staging)
    if info is not None:
        return info
    return _write_export(_resumed_run(run), staging, file=_export_file(run.cfg), options=_export_options(run.cfg))


# ----------------------------------------------------------------------------- driver


def _check_config_stage(run: _Run) -> None:
    marker = run.store.stage_marker(run.run_id, "config")
    if marker is not None and marker.get("result_key") != run.cfg.result_key():
        msg = (
            f"run {run.run_id} in {run.store.display()} was started with another configuration (result key "
            f"{marker.get('result_key')}, now {run.cfg.result_key()}): rerun it with the configuration in "
            f"{run.store.display(run.store.stage_rel(run.run_id, 'config'))}/config.json, or use a new --run-id"
        )
        raise PosstatsError(msg)


def _move_latest(run: _Run, marker: Mapping[str, Any]) -> bool:
    run.lock.check()  # never move latest for a run that lost the store
    export = marker.get("export") or {}
    extra = {"fingerprint": marker.get("fingerprint"),
             "export": f"{run.store.stage_rel(run.run_id, 'export')}/{export['file']}" if export.get("file") else None}
    moved = run.store.move_latest(run.run_id, extra=extra)
    if moved:
        run.log(f"latest -> {run.run_id}")
    else:
        run.log(f"latest stays where it is (it names a run that finished after {run.run_id})")
    return moved


def _count_and_reduce(run: _Run) -> None:
    """The count and reduce stages; when the counting store moved on in between (another
    run refreshed it), the count stage is cleared and run again, up to three times."""
    for attempt in range(3):
        run.stage("count", lambda st: _stage_count(run, st))
        try:
            run.stage("reduce", lambda st: _stage_reduce(run, st))
            return
        except _Recount:
            if attempt == 2:
                raise PosstatsError(f"run {run.run_id}: the counting store keeps changing under this run") from None
            run.log("reduce: the counting store moved on since this run's count stage (another run refreshed "
                    "it); counting again")
            run.store.clear_stage(run.run_id, "count")


def _run_info(run: _Run, export: Mapping[str, Any]) -> dict[str, Any]:
    """The run's ``done.json`` info: result key, count and geometry numbers from their stage
    markers, the ``export`` stage marker's table facts, each stage's finish time."""
    store, run_id = run.store, run.run_id
    count = store.stage_marker(run_id, "count") or {}
    geometry = store.stage_marker(run_id, "geometry") or {}
    return {
        "result_key": run.cfg.result_key(),
        "fingerprint": count.get("fingerprint"),
        "tokens_counted": count.get("tokens_counted"),
        "shards": count.get("shards"),
        "shards_counted": count.get("shards_counted"),
        "positions_used": geometry.get("positions_used"),
        "rank": geometry.get("rank"),
        "export": {k: export.get(k) for k in ("file", "key", "n", "d", "rank", "stress", "scaled_stress")},
        "stages": {st: (store.stage_marker(run_id, st) or {}).get("finished") for st in STAGES},
    }


def run_pipeline(cfg: PipelineConfig, /, *, run_id: str | None = None,
                 log: Callable[[str], None] = _log) -> dict[str, Any]:
    """Run (or resume, or confirm) one pipeline run; return the run's completion marker.

    Raises:
        PosstatsError / InputError: bad input or configuration, a busy store, a run id
        rerun with another configuration; storage failures (full disk, read-only store)
        as one-line messages.
    """
    try:
        return _run_pipeline(cfg, run_id=run_id, log=log)
    except PosstatsError:
        raise
    except Exception as exc:
        text = describe_os_error(exc)
        if text:
            where = str(cfg.store.url)
            raise PosstatsError(text if where in text else f"run store {where}: {text}") from exc
        cause = _unwrap_task_error(exc)
        if isinstance(cause, PosstatsError):
            raise cause from exc
        raise


def _run_pipeline(cfg: PipelineConfig, *, run_id: str | None, log: Callable[[str], None]) -> dict[str, Any]:
    """:func:`run_pipeline` under the store's lock: confirm a complete run, else run the
    stages not yet complete, write ``done.json`` and move ``latest``."""
    run_id = validate_run_id(run_id or cfg.run_id or default_run_id())
    s = cfg.values["store"]
    store = Store(s["url"], storage_options=s["storage_options"])
    runs: list[_Run] = []
    try:
        with store.lock(run_id=run_id, command="pipeline", stale_after=s["lock_stale_after_s"],
                        heartbeat=s["heartbeat_s"], log=log) as lock:
            run = _Run(cfg, store, lock, run_id, log)
            runs.append(run)
            return _run_locked(run, log)
    finally:
        # Ray is shut down after the lock is released: a shutdown can take seconds (or end
        # the process) when SIGTERM reached Ray's own processes too
        for run in runs:
            run.close()


def _run_locked(run: _Run, log: Callable[[str], None]) -> dict[str, Any]:
    """The body of :func:`_run_pipeline` while the store's lock is held."""
    store, run_id, lock = run.store, run.run_id, run.lock
    run.previous = _previous_run(store, run_id)
    log(f"run {run_id}: store {store.display()}, work folder {run.work}")
    done = store.run_marker(run_id)
    if done is not None:
        _check_config_stage(run)
        log(f"run {run_id} is complete already ({done['finished']}); nothing to do")
        _move_latest(run, done)
        return done
    _check_config_stage(run)
    run.stage("config", lambda st: _stage_config(run, st))
    _count_and_reduce(run)
    run.stage("geometry", lambda st: _stage_geometry(run, st))
    run.stage("diff", lambda st: _stage_diff(run, st))
    run.stage("report", lambda st: _stage_report(run, st))
    export = run.stage("export", lambda st: _stage_export(run, st))
    run.close()
    info = _run_info(run, export)
    lock.check()
    marker = store.finish_run(run_id, info)
    shutil.rmtree(run.staging_root, ignore_errors=True)
    shutil.rmtree(run.cache, ignore_errors=True)
    _move_latest(run, marker)
    log(f"run {run_id}: complete")
    return marker


# ----------------------------------------------------------------------------- CLI


def add_pipeline_args(parser: argparse.ArgumentParser, *, ray_address: bool = True) -> None:
    """``--config`` and the override flags (argparse only; shared with jobs.pipeline).

    ``ray_address=False`` leaves out ``--address`` (``posstats submit`` uses that flag for
    the job server; a submitted job joins the cluster it runs on)."""
    parser.add_argument("--config", required=True, metavar="FILE", help="the pipeline's TOML configuration")
    parser.set_defaults(**{CONFIG_NAMES: config_names()})  # errors name the file's keys ([geometry] dims)
    g = parser.add_argument_group("overrides (win over the file)")
    g.add_argument("--run-id", metavar="ID",
                   help="name of the run (letters, digits, . _ -); rerun an id to resume it (default: the file's "
                        "run_id, else run-<UTC time>)")
    g.add_argument("--store", metavar="PATH_OR_URL", help="run store ([store] url)")
    g.add_argument("--input", action="append", metavar="PATH_OR_GLOB", help="inputs ([input] paths); repeatable")
    if ray_address:
        g.add_argument("--address", dest="ray_address", metavar="ADDR", help="Ray cluster to join ([ray] address)")
    g.add_argument("--workers", type=int, metavar="K", help="counting actors ([ray] workers)")
    g.add_argument("--set", action="append", default=[], metavar="TABLE.KEY=VALUE",
                   help="set any key, VALUE in TOML syntax (e.g. count.positions=1024, geometry.dims=[2,16]); repeatable")
    g.add_argument("--print-config", action="store_true", help="print the resolved configuration and exit")


def config_from_args(args: argparse.Namespace, /) -> tuple[PipelineConfig, str | None]:
    """(PipelineConfig, run id or None) from ``--config`` and the overrides."""

    cfg = load_config(args.config)
    cfg = apply_overrides(cfg, sets=args.set, run_id=args.run_id, store=args.store, inputs=args.input,
                          address=getattr(args, "ray_address", None), workers=args.workers)
    run_id = cfg.run_id
    if run_id is not None:
        validate_run_id(run_id)
    return cfg, run_id


def build_parser() -> argparse.ArgumentParser:
    """``python -m posstats.jobs.pipeline``: the flags of ``posstats pipeline``."""
    p = ArgumentParser(prog="python -m posstats.jobs.pipeline",
                                description="Run the posstats refresh pipeline (count -> reduce -> geometry -> report "
                                            "-> export) as one Ray job, configured by a TOML file.")
    add_pipeline_args(p)
    add_output_args(p, json_result="the run's completion marker")
    return p


def run_from_args(args: argparse.Namespace) -> int:
    """Load the config and flags, run, print a one-line result (shared with the CLI)."""
    cfg, run_id = config_from_args(args)
    if getattr(args, "print_config", False):
        if getattr(args, "json", False):
            print_json(args, cfg.to_dict())
        else:
            print(dumps_toml(cfg.to_dict()), end="")
        return 0
    marker = run_pipeline(cfg, run_id=run_id)
    export = marker.get("export") or {}
    store = Store(cfg.store.url, storage_options=cfg.store.storage_options)
    table = (f"export {export.get('file')} ({export.get('n')} x {export.get('d')})" if export.get("file") else
             "nothing exported (no positional structure beyond sampling noise)")
    print(f"run {marker['run_id']} complete: {marker.get('tokens_counted') or 0:,} tokens, "
          f"{marker.get('shards_counted')}/{marker.get('shards')} shard(s) counted now, MDS rank {marker.get('rank')}, "
          f"{table} -> {store.display(store.run_rel(marker['run_id']))}")
    print_json(args, marker)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m posstats.jobs.pipeline`` (what a RayJob or ``posstats submit`` runs)."""
    args = build_parser().parse_args(argv)
    # a Ray job stopped (or a pod deleted) gets SIGTERM: run_guarded unwinds, the lock is released
    return run_guarded(run_from_args, args)


if __name__ == "__main__":
    sys.exit(main())
