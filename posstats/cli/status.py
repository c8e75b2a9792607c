"""``posstats status``: a submitted job's status, or a run store's runs and lock."""

from __future__ import annotations

import argparse
import socket
import time

from posstats.cli.submit import add_address_args, resolve_address
from posstats.errors import PosstatsError
from posstats.jobs.flags import storage_options
from posstats.jobs.output import print_json
from posstats.jobs.submit import job_status
from posstats.service.pipeline_store import (
    DEFAULT_STALE_AFTER_S,
    STAGES,
    DamagedMarker,
    Store,
    sorted_runs,
)
from posstats.storage.locks import pipeline_lock_is_stale

HELP = "status of a submitted pipeline job (JOB_ID), or of a run store (--store)"
DESCRIPTION = """\
With JOB_ID: the Ray job's status (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED), its
message, run id and times, from the job server at --address. --wait polls until the job
ends.

exit status with JOB_ID (also with --json):
  0  the job SUCCEEDED, or (without --wait) is still PENDING or RUNNING
  1  the job ended FAILED or STOPPED
  2  an error: bad arguments, the job server unreachable or refusing the token, no such job
  3  --wait --timeout S: the job had not ended after S seconds

With --store: the run store's latest pointer, its lock (holder, heartbeat age, stale or
not) and every run with the stages it completed (no Ray needed). --verify also checks
every completed stage's files against the sizes and sha256 in their markers; exit status
0, or 1 when --verify found a problem (2 on an error).

examples:
  posstats status raysubmit_XyZ --address http://127.0.0.1:8265 --wait
  posstats status --store s3://bucket/posstats --verify
"""


# what --json prints (posstats.jobs.output); None: no result, no --json
JSON_RESULT: str | None = "the job's status (or, with --store, the store's runs)"

def register(sub: argparse._SubParsersAction) -> None:

    p = sub.add_parser("status", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job_id", nargs="?", metavar="JOB_ID", help="the job id printed by 'posstats submit'")
    add_address_args(p)
    p.add_argument("--wait", action="store_true", help="wait until the job ends (exit status: see above)")
    p.add_argument("--timeout", type=float, metavar="S", help="with --wait: give up after S seconds (exit 3)")
    p.add_argument("--store", metavar="PATH_OR_URL", help="show a run store instead of a job")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="fsspec option of --store (VALUE in TOML syntax; dotted keys nest); repeatable")
    p.add_argument("--verify", action="store_true", help="with --store: check every completed stage's files")
    p.set_defaults(func=run)


def store_status(url: str, *, options: dict | None = None, verify: bool = False) -> dict:
    """{store, latest, lock, runs: [...]} of a run store (pure posstats, no Ray)."""


    store = Store(url, storage_options=options)
    lock, exists = store.read_lock()
    lock_view = None
    if exists:
        stale_after = float((lock or {}).get("stale_after_s", DEFAULT_STALE_AFTER_S))
        stale, why = pipeline_lock_is_stale(lock, now=time.time(), hostname=socket.gethostname(), stale_after=stale_after)
        lock_view = {k: (lock or {}).get(k) for k in ("run_id", "command", "pid", "hostname", "started", "heartbeat")}
        lock_view.update(stale=stale, why=why)
    runs = []
    for rid in store.run_ids():
        st = store.run_status(rid)
        marker = store.stage_marker(rid, "diff") if st["stages"].get("diff") else None
        if marker is not None:
            st["diff"] = {k: marker.get(k) for k in ("against", "changed", "tested", "level", "skipped", "summary")}
        if verify:
            checked = [s for s in STAGES if st["stages"][s] or s in st["damaged"]]
            st["problems"] = [p for s in checked for p in store.verify_stage(rid, s)]
            if "run" in st["damaged"]:
                st["problems"].append(f"done.json: damaged completion marker of run {rid}")
        runs.append(st)
    try:
        latest = store.latest()
    except DamagedMarker as exc:
        latest = {"damaged": str(exc)}
    return {"store": store.display(), "latest": latest, "lock": lock_view, "runs": sorted_runs(runs)}


def _diff_line(d: dict) -> str:
    """``N positions changed since run X`` from a run's diff stage marker."""
    if d.get("against") is None:
        return "no earlier run to compare with"
    if d.get("skipped"):
        return f"not compared with run {d['against']} (counted differently)"
    return f"{d['changed']:,} positions changed since run {d['against']} (of {d['tested']:,} tested)"


def _print_store(doc: dict) -> int:

    latest = doc["latest"]
    print(f"store {doc['store']}")
    if latest and "damaged" in latest:
        print(f"latest: DAMAGED ({latest['damaged']}); the next complete pipeline run replaces it")
        latest = None
    print(f"latest: {latest['run_id']} (finished {latest['finished']})" if latest else "latest: (none)")
    last = next((r for r in doc["runs"] if latest and r["run_id"] == latest["run_id"]), None)
    if last is not None and last.get("diff"):
        print(f"changes: {_diff_line(last['diff'])}")
    lock = doc["lock"]
    if lock:
        state = "STALE" if lock["stale"] else "held"
        print(f"lock: {state} by run {lock['run_id']} (pid {lock['pid']} on {lock['hostname']}, started "
              f"{lock['started']}; {lock['why']})")
    else:
        print("lock: free")
    bad = 0
    for r in doc["runs"]:
        stages = " ".join(s if r["stages"][s] else f"-{s}" for s in STAGES)
        state = f"complete {r['finished']}" if r["complete"] else "INCOMPLETE"
        print(f"  {r['run_id']}: {state}  [{stages}]" + (f"  {_diff_line(r['diff'])}" if r.get("diff") else ""))
        for p in r.get("problems", []):
            bad += 1
            print(f"    ! {p}")
    return 1 if bad else 0


def run(args: argparse.Namespace) -> int:
    if args.store:
        if args.job_id:
            raise PosstatsError("give either JOB_ID or --store, not both")
        doc = store_status(args.store, options=storage_options(args.storage_option), verify=args.verify)
        if args.json:
            print_json(args, doc, indent=2)
            return 1 if any(r.get("problems") for r in doc["runs"]) else 0
        return _print_store(doc)
    if not args.job_id:
        raise PosstatsError("give a JOB_ID (printed by 'posstats submit') or --store PATH_OR_URL")

    address, token = resolve_address(args)

    wait = (args.timeout if args.timeout is not None else float("inf")) if args.wait else None
    st = job_status(address, args.job_id, token=token, wait=wait)
    if args.json:
        print_json(args, st, indent=2)
    else:
        run_id = st["metadata"].get("posstats_run_id", "?")
        print(f"job {st['job_id']}: {st['status']} (run {run_id})" + (f": {st['message']}" if st["message"] else ""))
    return job_exit_status(st, waited=args.wait)


def job_exit_status(st: dict, *, waited: bool) -> int:
    """0 succeeded or (not waiting) not ended yet, 1 failed or stopped, 3 waited and not ended."""
    if st["status"] in ("FAILED", "STOPPED"):
        return 1
    if waited and not st["terminal"]:
        return 3
    return 0
