"""``posstats schedule``: refresh a run store on a schedule, on this machine."""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from posstats.errors import PosstatsError
from posstats.flags import add_pipeline_args, config_from_args
from posstats.service.pipeline_store import Store, validate_run_id
from posstats.service.schedule import parse_schedule, run_schedule, tick_run_id

HELP = "run the pipeline on a schedule (cron expression or interval), one run at a time, a log per run"
DESCRIPTION = """\
A foreground loop for a single machine: at every tick of --every INTERVAL (first tick at
once; 30s, 15m, 6h, 1d, 1h30m) or --cron "MIN HOUR DOM MON DOW" (@hourly, @daily...; read
in UTC, or in --timezone's wall-clock time, daylight-saving changes included) it runs the
pipeline ('python -m jobs.pipeline', same config and overrides) as run
'sched-<tick time, UTC>', writing its output to STORE/logs/RUN_ID.log, and waits for it.
Runs never overlap: the next tick is looked for only after a run ended (ticks that came
meanwhile are skipped and reported), and a run that finds the store locked by another
process (a submitted job, a second scheduler) refuses and is reported as 'store busy'.
Defaults for --every / --cron / --timezone may come from the config's [schedule] table.

Stops after --runs N runs (exit 0 if all succeeded, 1 otherwise), or on Ctrl-C / SIGTERM
(the running pipeline is stopped and unwinds: its lock is released, rerunning its run id
resumes it). On Kubernetes use the CronJob in deploy/ instead.

examples:
  posstats schedule --config deploy/pipeline.example.toml --every 6h
  posstats schedule --config pipeline.toml --cron "0 */6 * * *" --address 127.0.0.1:6379
  posstats schedule --config pipeline.toml --every 10s --runs 3
  posstats schedule --config pipeline.toml --cron "30 2 * * mon-fri" --timezone Europe/Paris
"""


def register(sub: argparse._SubParsersAction) -> None:

    p = sub.add_parser("schedule", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    when = p.add_mutually_exclusive_group()
    when.add_argument("--every", metavar="INTERVAL", help="run every INTERVAL (e.g. 6h, 30m, 1h30m; >= 1 s)")
    when.add_argument("--cron", metavar="EXPR", help='cron expression, 5 fields (e.g. "0 */6 * * *")')
    p.add_argument("--timezone", metavar="TZ",
                   help="IANA time zone --cron is read in (e.g. Europe/Paris; default: the config's, else UTC)")
    p.add_argument("--runs", type=int, metavar="N", help="stop after N runs (default: run until stopped)")
    p.add_argument("--run-prefix", default="sched", metavar="PREFIX",
                   help="run ids are PREFIX-YYYYMMDDTHHMMSSZ (default sched)")
    add_pipeline_args(p)
    p.set_defaults(func=run)


def _passthrough(args: argparse.Namespace) -> list[str]:
    out = ["--config", os.path.abspath(args.config)]
    for flag, value in (("--store", args.store), ("--address", args.ray_address), ("--workers", args.workers)):
        if value is not None:
            out += [flag, str(value)]
    for p in args.input or []:
        out += ["--input", os.path.abspath(p) if "://" not in p else p]
    for item in args.set:
        out += ["--set", item]
    return out


class _Stop(Exception):
    pass


def _stop(signum: int, _frame) -> None:
    raise _Stop(signum)


def run(args: argparse.Namespace) -> int:

    if args.run_id:
        raise PosstatsError("--run-id does not apply to a schedule (each tick gets sched-<time>; see --run-prefix)")
    if args.runs is not None and args.runs < 1:
        raise PosstatsError(f"--runs must be >= 1, got {args.runs}")
    validate_run_id(f"{args.run_prefix}-x")
    cfg, _ = config_from_args(args)  # a bad config fails here, before the first tick
    every, cron = args.every, args.cron
    if not every and not cron:
        every, cron = cfg.values["schedule"]["every"], cfg.values["schedule"]["cron"]
    tz = args.timezone or cfg.values["schedule"]["timezone"]
    if args.timezone and not cron:
        raise PosstatsError("--timezone applies to --cron schedules only (an interval counts elapsed time)")
    schedule = parse_schedule(every=every, cron=cron, tz=tz)
    store = Store(cfg.store.url, storage_options=cfg.store.storage_options)
    base_cmd = [sys.executable, "-m", "jobs.pipeline", *_passthrough(args)]
    state: dict = {"child": None}

    def say(message: str) -> None:
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        print(f"[{stamp}] {message}", flush=True)

    def run_once(tick: _dt.datetime) -> bool:
        run_id = tick_run_id(tick, prefix=args.run_prefix)
        rel = store.log_rel(run_id)
        if store.local:
            log_path = Path(store.path(rel))
        else:
            log_path = Path(cfg.work_dir()) / "logs" / f"{run_id}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        say(f"run {run_id}: started (log {store.display(rel)})")
        t = time.monotonic()
        with open(log_path, "ab") as log:
            log.write(f"# posstats schedule: run {run_id}, tick {tick.isoformat()}\n".encode())
            log.flush()
            child = subprocess.Popen([*base_cmd, "--run-id", run_id], stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
            state["child"] = child
            rc = child.wait()
            state["child"] = None
            log.write(f"# exit status {rc}\n".encode())
        if not store.local:
            try:
                store.put_file(log_path, rel)
            except Exception as exc:  # noqa: BLE001 - a lost log must not stop the schedule
                say(f"run {run_id}: could not upload its log ({exc})")
        seconds = time.monotonic() - t
        if rc == 0:
            say(f"run {run_id}: ok in {seconds:.1f} s")
            return True
        lines = log_path.read_text(errors="replace").splitlines()
        error = next((ln for ln in reversed(lines) if ln.startswith("posstats: error:")), lines[-2] if len(lines) > 1 else "")
        kind = "store busy, skipped" if "is in use by" in error else f"FAILED (exit {rc})"
        say(f"run {run_id}: {kind} after {seconds:.1f} s: {error.removeprefix('posstats: error: ')}")
        return False

    old = signal.signal(signal.SIGTERM, _stop)
    try:
        stats = run_schedule(schedule, run_once, runs=args.runs, log=say)
    except (_Stop, KeyboardInterrupt):
        child = state["child"]
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
        say("schedule stopped")
        return 130
    finally:
        signal.signal(signal.SIGTERM, old)
    say(f"schedule done: {stats.runs} run(s), {stats.succeeded} ok, {stats.failed} failed, "
        f"{stats.skipped_ticks} tick(s) skipped while a run was running")
    return 0 if stats.failed == 0 else 1
