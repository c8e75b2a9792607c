"""Submitting the pipeline to a Ray cluster as a Ray job, through the cluster's job server
(``posstats submit``, ``posstats status``, ``posstats logs``): the ``posstats`` package
staged as the job's code, token authentication, and one-line errors that tell an
unreachable server from a missing or refused token.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import posstats
from posstats.errors import PosstatsError
from posstats.service.config import PipelineConfig, dumps_toml, refuse_secrets
from posstats.service.pipeline_store import validate_run_id

__all__ = ["job_logs", "job_status", "submit_job"]


def _client(address: str, *, token: str | None = None) -> Any:
    from ray.job_submission import JobSubmissionClient

    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        return JobSubmissionClient(address, headers=headers)
    except Exception as exc:  # noqa: BLE001 - the SDK raises several kinds
        raise PosstatsError(_client_error(address, exc)) from None


def _client_error(address: str, exc: BaseException) -> str:
    text = str(exc)
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    if isinstance(exc, ConnectionError) or "Failed to connect" in text or "Connection refused" in text:
        return (f"cannot reach the Ray job server at {address} ({first}); is the head running with its dashboard "
                f"(ray start --head --dashboard-host ...), and is the address its dashboard URL (http://HOST:8265)?")
    status = _http_status(text.replace(address, ""))  # the address' port may hold "401" or "403"
    if status == 401 or "Authentication required" in text or "Unauthorized" in text:
        return (f"the Ray job server at {address} requires a token (token authentication): pass --token-file FILE, "
                f"or set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or ~/.ray/auth_token)")
    if status == 403 or "Forbidden" in text or "Invalid authentication token" in text:
        return f"the Ray job server at {address} refused the token (wrong token for this cluster)"
    return f"Ray job server at {address}: {first}"


def _http_status(text: str, /) -> int | None:
    """The HTTP status 401 or 403 an error text reports as a number of its own (not inside a
    longer number such as a port: ``:44403``), or None."""
    found = re.search(r"(?<![\d:.])(401|403)(?![\d.])", text)
    return int(found.group(1)) if found else None


def _call(address: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except PosstatsError:
        raise
    except Exception as exc:  # noqa: BLE001 - the SDK raises several kinds
        text = str(exc)
        if "does not exist" in text or "404" in text.split("\n", 1)[0]:
            raise PosstatsError(f"{address}: {text.splitlines()[0]}") from None
        raise PosstatsError(_client_error(address, exc)) from None


def _staged_package(into: Path, /) -> Path:
    """The ``posstats`` package as it imports here, with its jobs at ``posstats/jobs`` (an
    installed wheel has them there already; a source checkout links ``posstats/jobs`` to
    ``jobs/``, and the copy follows the link): one folder Ray can ship as a ``py_modules`` entry."""
    package = Path(posstats.__file__).parent
    jobs = Path(__file__).parent
    staged = into / "posstats"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(package, staged, ignore=ignore)
    if not (staged / "jobs").exists():
        shutil.copytree(jobs, staged / "jobs", ignore=ignore)
    return staged


def submit_job(address: str, cfg: PipelineConfig, /, *, run_id: str, code: str = "ship",
               env: Mapping[str, str] | None = None, token: str | None = None, submission_id: str | None = None,
               entrypoint_num_cpus: float | None = None) -> dict[str, Any]:
    """Submit one pipeline run to a Ray cluster with the Job Submission SDK.

    The resolved configuration travels as ``pipeline.toml`` in the job's ``working_dir`` (a
    temporary folder), the entrypoint is ``python -m posstats.jobs.pipeline --config pipeline.toml
    --run-id RUN_ID``. With ``code="ship"`` the local ``posstats`` package goes along, its
    jobs included, as one ``py_modules`` entry (:func:`_staged_package`; the cluster then
    needs only posstats' dependencies); with ``code="installed"`` the cluster's own
    installation is used (the deploy/ image).
    Credentials are refused (:func:`posstats.service.config.refuse_secrets`): in ``env``
    and in the configuration's ``storage_options``; the job uses the cluster's own.

    Returns:
        {"job_id", "run_id", "entrypoint", "runtime_env"}.
    """

    validate_run_id(run_id)
    if code not in ("ship", "installed"):
        msg = f"--code must be ship or installed, got {code!r}"
        raise PosstatsError(msg)
    # nothing secret travels: Ray keeps env_vars, the working_dir and the metadata in its job
    # table, returns them from the job API and writes them on the nodes (docs/service.md)
    refuse_secrets(cfg, env=env)
    client = _client(address, token=token)
    with tempfile.TemporaryDirectory(prefix="posstats-submit-") as workdir:
        config = cfg.to_dict()  # redacted; refuse_secrets left nothing to redact
        config["run_id"] = run_id
        Path(workdir, "pipeline.toml").write_text(dumps_toml(config))
        runtime_env: dict[str, Any] = {
            "working_dir": workdir,
            "env_vars": {"RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1", **dict(env or {})},
        }
        if code == "ship":
            runtime_env["py_modules"] = [str(_staged_package(Path(workdir) / "modules"))]
            runtime_env["excludes"] = ["__pycache__", "*.pyc"]
        entrypoint = f"python -m posstats.jobs.pipeline --config pipeline.toml --run-id {run_id}"
        job_id = _call(address, lambda: client.submit_job(
            entrypoint=entrypoint, runtime_env=runtime_env, submission_id=submission_id,
            entrypoint_num_cpus=entrypoint_num_cpus,
            metadata={"posstats_run_id": run_id, "posstats_store": str(cfg.store.url)},
        ))
    shown_env = {k: v for k, v in runtime_env.items() if k != "working_dir"}
    shown_env["env_vars"] = {k: ("***" if k not in ("RAY_USAGE_STATS_ENABLED", "PYTHONUNBUFFERED") else v)
                             for k, v in runtime_env["env_vars"].items()}
    return {"job_id": job_id, "run_id": run_id, "entrypoint": entrypoint, "runtime_env": shown_env}


def job_status(address: str, job_id: str, /, *, token: str | None = None, wait: float | None = None,
               poll: float = 1.0) -> dict[str, Any]:
    """The job's status (``status``, ``message``, times, entrypoint, metadata); with
    ``wait`` seconds, poll until the job ends or the time is up."""
    client = _client(address, token=token)
    deadline = None if wait is None else time.monotonic() + wait
    while True:
        info = _call(address, lambda: client.get_job_info(job_id))
        status = str(getattr(info.status, "value", info.status))
        terminal = status in ("SUCCEEDED", "FAILED", "STOPPED")
        if deadline is None or terminal or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    return {
        "job_id": job_id,
        "status": status,
        "terminal": terminal,
        "message": info.message,
        "entrypoint": info.entrypoint,
        "metadata": dict(info.metadata or {}),
        "start_time": info.start_time,
        "end_time": info.end_time,
        "driver_exit_code": getattr(info, "driver_exit_code", None),
    }


def job_logs(address: str, job_id: str, /, *, token: str | None = None, follow: bool = False,
             write: Callable[[str], None] | None = None) -> str:
    """Write the job's logs (all of them; with ``follow``, as they come until the job ends);
    return the job's final (or current) status."""

    write = write or (lambda text: (sys.stdout.write(text), sys.stdout.flush()))
    client = _client(address, token=token)
    if not follow:
        write(_call(address, lambda: client.get_job_logs(job_id)))
        status = _call(address, lambda: client.get_job_status(job_id))
        return str(getattr(status, "value", status))

    async def tail() -> None:
        async for chunk in client.tail_job_logs(job_id):
            write(chunk)

    _call(address, lambda: client.get_job_info(job_id))  # a clear error for an unknown job id
    _call(address, lambda: asyncio.run(tail()))
    status = _call(address, lambda: client.get_job_status(job_id))
    return str(getattr(status, "value", status))

