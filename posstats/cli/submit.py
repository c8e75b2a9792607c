"""``posstats submit``: send one pipeline run to a Ray cluster (Job Submission SDK)."""

from __future__ import annotations

import argparse
import os

from posstats.errors import PosstatsError
from posstats.jobs.output import print_json
from posstats.jobs.pipeline import add_pipeline_args, config_from_args, default_run_id
from posstats.jobs.submit import job_status, submit_job
from posstats.service.config import dumps_toml, refuse_secrets

HELP = "submit a pipeline run to a Ray cluster as a Ray job; prints the job id"
DESCRIPTION = """\
Validate the pipeline configuration here, then submit 'python -m posstats.jobs.pipeline --config
pipeline.toml --run-id RUN_ID' to the Ray cluster at --address (its dashboard / job server
URL) with Ray's Job Submission SDK. The resolved configuration (relative paths made
absolute: inputs, tokenizer and store must be reachable from the cluster at those paths, or
be s3:// URLs) travels in the job's working_dir; with --code ship (default) the local
posstats and jobs packages travel as py_modules, with --code installed the cluster's own
installation is used (the deploy/ image). Prints the job id and the run id; follow the job
with 'posstats status JOB_ID' and 'posstats logs JOB_ID --follow'.

Token authentication (Ray 2.60 default): pass --token-file FILE, or set RAY_AUTH_MODE=token
and RAY_AUTH_TOKEN (or ~/.ray/auth_token) as for 'ray job submit'. A cluster started with
RAY_AUTH_MODE=disabled needs neither.

Credentials are never sent with a job: Ray keeps a job's environment variables and its
working_dir in its job table and on the nodes, returns them from the job API and logs
them. So --env refuses names that look like credentials (AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_ACCESS_KEY_ID, *TOKEN*, *SECRET*, *PASSWORD*, *_KEY..., except
*_FILE / *_PATH names, which point at a mounted secret) and values with a password in a
URL, and a configuration whose storage_options hold key / secret / token / password /
credential values is refused (exit 2, before the cluster is contacted). The job reads
its credentials from the cluster's own environment: an IAM role / IRSA, a mounted
secret, the environment of the RayCluster spec or of the Ray worker processes (see
'Credentials' in docs/service.md).

examples:
  posstats submit --address http://127.0.0.1:8265 --config deploy/pipeline.example.toml
  posstats submit --address http://head:8265 --config p.toml --run-id corpus-v2 --token-file ~/.ray/auth_token --wait
"""


def add_address_args(parser: argparse.ArgumentParser) -> None:
    """``--address`` and ``--token-file`` (shared by submit, status and logs)."""
    parser.add_argument("--address", metavar="URL",
                        help="the Ray job server (dashboard) URL, e.g. http://127.0.0.1:8265 (default: "
                             "$RAY_API_SERVER_ADDRESS, else $RAY_ADDRESS when it is an http URL)")
    parser.add_argument("--token-file", metavar="FILE",
                        help="a file holding the cluster's auth token (sent as 'Authorization: Bearer ...'); default: "
                             "Ray's own (RAY_AUTH_MODE=token with RAY_AUTH_TOKEN or ~/.ray/auth_token)")


def resolve_address(args: argparse.Namespace) -> tuple[str, str | None]:
    """(job server URL, token or None) from the flags and the environment."""
    address = args.address or os.environ.get("RAY_API_SERVER_ADDRESS")
    if not address:
        env = os.environ.get("RAY_ADDRESS", "")
        address = env if env.startswith(("http://", "https://")) else None
    if not address:
        raise PosstatsError("give --address http://HEAD:8265 (the Ray dashboard / job server URL)")
    if "://" not in address:
        address = f"http://{address}"
    token = None
    if args.token_file:
        try:
            with open(os.path.expanduser(args.token_file), encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise PosstatsError(f"{args.token_file}: cannot read the token file ({exc.strerror})") from None
        if not token:
            raise PosstatsError(f"{args.token_file}: the token file is empty")
    return address, token


def _env_pairs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:  # the entry is not echoed: it may be a mistyped credential
            raise PosstatsError("--env expects KEY=VALUE, got an entry without a name or '='")
        out[key] = value
    return out


# what --json prints (posstats.jobs.output); None: no result, no --json
JSON_RESULT: str | None = 'the submission (job id, run id, address)'

def register(sub: argparse._SubParsersAction) -> None:

    p = sub.add_parser("submit", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_address_args(p)
    add_pipeline_args(p, ray_address=False)
    p.add_argument("--code", choices=("ship", "installed"), default="ship",
                   help="ship the local posstats/jobs packages with the job (default), or use the cluster's installation")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment variable of the job (e.g. AWS_ENDPOINT_URL=...; never a credential: those are "
                        "refused, see above); repeatable")
    p.add_argument("--submission-id", metavar="ID", help="the Ray job id to use (default: Ray picks one)")
    p.add_argument("--wait", action="store_true", help="wait for the job to end; exit 0 only if it succeeded")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    env = _env_pairs(args.env)
    refuse_secrets(env=env)  # first: a credential never goes anywhere, whatever else is wrong
    cfg, run_id = config_from_args(args)
    if args.print_config:
        print(dumps_toml(cfg.to_dict()), end="")
        return 0
    refuse_secrets(cfg)
    address, token = resolve_address(args)

    run_id = run_id or default_run_id()
    sub = submit_job(address, cfg, run_id=run_id, code=args.code, env=env, token=token,
                     submission_id=args.submission_id)
    if args.json:
        print_json(args, sub, indent=2)
    else:
        print(sub["job_id"])
        print(f"run {run_id} submitted to {address} (store {cfg.store.url}); follow it with:\n"
              f"  posstats status {sub['job_id']} --address {address}\n"
              f"  posstats logs {sub['job_id']} --address {address} --follow")
    if not args.wait:
        return 0
    st = job_status(address, sub["job_id"], token=token, wait=float("inf"))
    print(f"job {sub['job_id']}: {st['status']}" + (f" ({st['message']})" if st["message"] else ""))
    return 0 if st["status"] == "SUCCEEDED" else 1
