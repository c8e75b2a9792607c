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
from posstats.jobs.pipeline import add_pipeline_args, config_from_args
from posstats.service.config import PipelineConfig
from posstats.service.pipeline_store import Store, validate_run_id
from posstats.service.schedule import (
    Cron,
    Interval,
    parse_schedule,
    run_schedule,
    tick_run_id,
)

HELP = "run the pipeline on a schedule (cron expression or interval), one run at a time, a log per run"
DESCRIPTION = """\
A foreground loop for a single machine: at every tick of --every INTERVAL (first tick at
once; 30s, 15m, 6h, 1d, 1h30m) or --cron "MIN HOUR DOM MON DOW" (@hourly, @daily...; read
in UTC, or in --timezone's wall-clock time, daylight-saving changes included) it runs the
pipeline ('python -m posstats.jobs.pipeline', same config and overrides) as run
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


# what --json prints (posstats.jobs.output); None: no result, no --json
JSON_RESULT: str | None = None

def register(sub: argparse._SubParsersAction) -> None:
    """Add ``posstats schedule`` and its flags (those of ``posstats pipeline`` included)."""
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
    """The pipeline flags to pass on to every run (paths made absolute, URLs kept)."""
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
    """SIGTERM arrived: stop the schedule."""


def _stop(signum: int, _frame) -> None:
    """SIGTERM handler: raise :class:`_Stop`."""
    raise _Stop(signum)


def _say(message: str) -> None:
    """Print ``[YYYY-mm-dd HH:MM:SS] message`` (UTC) on stdout."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp}] {message}", flush=True)


def _check_args(args: argparse.Namespace) -> None:
    """Refuse flags that do not apply to a schedule: --run-id, --runs < 1, a --run-prefix
    that makes no valid run id."""
    if args.run_id:
        raise PosstatsError("--run-id does not apply to a schedule (each tick gets sched-<time>; see --run-prefix)")
    if args.runs is not None and args.runs < 1:
        raise PosstatsError(f"--runs must be >= 1, got {args.runs}")
    validate_run_id(f"{args.run_prefix}-x")


def _schedule_from(args: argparse.Namespace, cfg: PipelineConfig) -> Interval | Cron:
    """The schedule of --every / --cron / --timezone, else of the config's ``[schedule]``.

    Raises:
        PosstatsError: --timezone without a cron schedule; a bad interval, cron expression
            or time zone.
    """
    every, cron = args.every, args.cron
    if not every and not cron:
        every, cron = cfg.values["schedule"]["every"], cfg.values["schedule"]["cron"]
    tz = args.timezone or cfg.values["schedule"]["timezone"]
    if args.timezone and not cron:
        raise PosstatsError("--timezone applies to --cron schedules only (an interval counts elapsed time)")
    return parse_schedule(every=every, cron=cron, tz=tz)


def _log_error(log_path: Path) -> str:
    """The run's error from its log: the last ``posstats: error:`` line, else the line
    before the exit status (empty for a log of fewer than two lines)."""
    lines = log_path.read_text(errors="replace").splitlines()
    return next((ln for ln in reversed(lines) if ln.startswith("posstats: error:")), lines[-2] if len(lines) > 1 else "")


class _Runner:
    """Runs the pipeline once per tick as a child process (``base_cmd --run-id RUN_ID``),
    its output in the run's log; remembers the running child so that a stop can end it."""

    def __init__(self, store: Store, work_dir: str, base_cmd: list[str], prefix: str) -> None:
        self.store, self.work_dir, self.base_cmd, self.prefix = store, work_dir, base_cmd, prefix
        self.child: subprocess.Popen | None = None

    def log_path(self, run_id: str) -> Path:
        """Where the run's log is written: STORE/logs/RUN_ID.log for a local store, else
        WORK/logs/RUN_ID.log (uploaded after the run)."""
        if self.store.local:
            return Path(self.store.path(self.store.log_rel(run_id)))
        return Path(self.work_dir) / "logs" / f"{run_id}.log"

    def run_child(self, run_id: str, tick: _dt.datetime, log_path: Path) -> int:
        """Run the pipeline as ``run_id``, appending its output to ``log_path`` between a
        header and an exit-status line; its exit status."""
        with open(log_path, "ab") as log:
            log.write(f"# posstats schedule: run {run_id}, tick {tick.isoformat()}\n".encode())
            log.flush()
            self.child = subprocess.Popen([*self.base_cmd, "--run-id", run_id], stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)
            rc = self.child.wait()
            self.child = None
            log.write(f"# exit status {rc}\n".encode())
        return rc

    def upload_log(self, run_id: str, log_path: Path) -> None:
        """Copy the log into a remote store (a failure is reported, never raised)."""
        if self.store.local:
            return
        try:
            self.store.put_file(log_path, self.store.log_rel(run_id))
        except Exception as exc:  # noqa: BLE001 - a lost log must not stop the schedule
            _say(f"run {run_id}: could not upload its log ({exc})")

    def __call__(self, tick: _dt.datetime) -> bool:
        """One tick's run, reported when it starts and ends; True when it succeeded."""
        run_id = tick_run_id(tick, prefix=self.prefix)
        log_path = self.log_path(run_id)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        _say(f"run {run_id}: started (log {self.store.display(self.store.log_rel(run_id))})")
        t = time.monotonic()
        rc = self.run_child(run_id, tick, log_path)
        self.upload_log(run_id, log_path)
        seconds = time.monotonic() - t
        if rc == 0:
            _say(f"run {run_id}: ok in {seconds:.1f} s")
            return True
        error = _log_error(log_path)
        kind = "store busy, skipped" if "is in use by" in error else f"FAILED (exit {rc})"
        _say(f"run {run_id}: {kind} after {seconds:.1f} s: {error.removeprefix('posstats: error: ')}")
        return False

    def stop_child(self) -> None:
        """Stop a running child with SIGTERM (it unwinds and releases the store's lock);
        kill it if it has not ended within 60 s."""
        child = self.child
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()


def run(args: argparse.Namespace) -> int:
    """``posstats schedule``: run the pipeline at every tick until --runs runs or a stop;
    0 when every run succeeded, 1 otherwise, 130 when stopped."""
    _check_args(args)
    cfg, _ = config_from_args(args)  # a bad config fails here, before the first tick
    schedule = _schedule_from(args, cfg)
    store = Store(cfg.store.url, storage_options=cfg.store.storage_options)
    runner = _Runner(store, cfg.work_dir(), [sys.executable, "-m", "posstats.jobs.pipeline", *_passthrough(args)],
                     args.run_prefix)
    old = signal.signal(signal.SIGTERM, _stop)
    try:
        stats = run_schedule(schedule, runner, runs=args.runs, log=_say)
    except (_Stop, KeyboardInterrupt):
        runner.stop_child()
        _say("schedule stopped")
        return 130
    finally:
        signal.signal(signal.SIGTERM, old)
    _say(f"schedule done: {stats.runs} run(s), {stats.succeeded} ok, {stats.failed} failed, "
         f"{stats.skipped_ticks} tick(s) skipped while a run was running")
    return 0 if stats.failed == 0 else 1
