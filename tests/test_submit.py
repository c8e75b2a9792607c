"""posstats submit / status / logs against a real Ray head started by this test
(`ray start --head` listening on 127.0.0.1 only, with token authentication on and a token
of its own), the exit status of `posstats status` for failed and stopped jobs, and that no
credential reaches the job API, the head's files or the run store (issue #18),
not a mock. The head is stopped at the end by killing exactly its own processes (its
process group, then anything whose command line names its private temp folder); `ray stop`
is never used, since it would kill every Ray process on the machine."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from posstats.corpus.source import CorpusSource
from posstats.corpus.count_step import count_corpus
from posstats.counting.counts import CountSpec
from posstats.counting.io import load_counts
from posstats.service.pipeline_store import Store

REPO = Path(__file__).resolve().parents[1]
V, N = 64, 16

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _own_pids(marker: str) -> list[int]:
    """Pids of processes whose command line contains ``marker`` (our head's temp folder)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd and int(entry) != os.getpid():
            pids.append(int(entry))
    return pids


@pytest.fixture(scope="module")
def ray_head():
    """A one-node Ray cluster with a dashboard/job server, token auth on; stopped at the end."""
    if shutil.which("ray") is None:
        pytest.skip("the ray CLI is not installed")
    temp = tempfile.mkdtemp(prefix="psub", dir="/tmp")  # short: Ray's socket paths live in it
    token = secrets.token_hex(32)
    ports = {name: free_port() for name in ("gcs", "dashboard", "client", "agent", "agent_grpc", "metrics",
                                            "runtime_env", "node_manager", "object_manager")}
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: Ray keeps 127.0.0.1 as the node address (else it
    # rewrites it to the machine's external one and listens on every interface; see
    # cluster/loopback_node.py), so this head listens on loopback only
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    cmd = ["ray", "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(ports["gcs"]),
           "--dashboard-host", "127.0.0.1", "--dashboard-port", str(ports["dashboard"]), "--include-dashboard=true",
           "--ray-client-server-port", str(ports["client"]), "--dashboard-agent-listen-port", str(ports["agent"]),
           "--dashboard-agent-grpc-port", str(ports["agent_grpc"]), "--metrics-export-port", str(ports["metrics"]),
           "--runtime-env-agent-port", str(ports["runtime_env"]), "--node-manager-port", str(ports["node_manager"]),
           "--object-manager-port", str(ports["object_manager"]), "--disable-usage-stats", "--num-cpus", "1",
           "--temp-dir", temp]
    log = open(Path(temp) / "head.log", "w")  # noqa: SIM115 - closed below
    head = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{ports['dashboard']}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if head.poll() is not None:
                pytest.fail("ray start --head exited: " + (Path(temp) / "head.log").read_text()[-3000:])
            try:
                req = urllib.request.Request(f"{url}/api/version", headers={"Authorization": f"Bearer {token}"})
                json.loads(urllib.request.urlopen(req, timeout=2).read())
                break
            except (urllib.error.URLError, OSError, ValueError):
                if time.monotonic() > deadline:
                    pytest.fail("the dashboard / job server did not come up in 120 s: "
                                + (Path(temp) / "head.log").read_text()[-3000:])
                time.sleep(0.5)
        token_file = Path(temp) / "token"
        token_file.write_text(token + "\n")
        yield {"url": url, "token": token, "token_file": token_file, "temp": temp}
    finally:
        with_group = True
        try:
            os.killpg(head.pid, signal.SIGTERM)
        except ProcessLookupError:
            with_group = False
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        if with_group:
            try:
                os.killpg(head.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for _ in range(50):  # whatever left the group (Ray daemonises some helpers)
            left = _own_pids(temp)
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        log.close()
        leftovers = _own_pids(temp)
        shutil.rmtree(temp, ignore_errors=True)
        assert leftovers == [], f"processes of the test head survived: {leftovers}"


@pytest.fixture()
def corpus_config(tmp_path):
    rng = np.random.default_rng(7)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for f in range(2):
        seqs = [(rng.zipf(1.6, size=int(rng.integers(N, 2 * N))) % V).astype(np.int32).tolist() for _ in range(100)]
        pq.write_table(pa.table({"ids": pa.array(seqs, type=pa.list_(pa.int32()))}), corpus / f"s{f}.parquet",
                       row_group_size=50)
    config = tmp_path / "pipeline.toml"
    config.write_text(f"""
[store]
url = "store"
[input]
paths = ["corpus/*.parquet"]
column = "ids"
[count]
positions = {N}
vocab_size = {V}
[geometry]
dims = [2, 8]
encodings = ["mds", "sinusoidal"]
[export]
dim = 8
rank = 2  # explicit: a random corpus has no component above noise, and the default exports none
card = false
""")
    return tmp_path, corpus, config


def posstats(*args, token_env: str | None = None, timeout: float = 240,
             extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
    if token_env:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token_env)
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "posstats.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def test_submit_status_logs_against_a_real_head(ray_head, corpus_config):
    tmp_path, corpus, config = corpus_config
    url, token_file = ray_head["url"], ray_head["token_file"]
    t0 = time.monotonic()
    sub = posstats("submit", "--address", url, "--token-file", token_file, "--config", config, "--run-id", "sub-1",
                   "--json")
    assert sub.returncode == 0, sub.stdout + sub.stderr
    info = json.loads(sub.stdout)
    job_id = info["job_id"]
    assert info["run_id"] == "sub-1"
    assert info["entrypoint"] == "python -m posstats.jobs.pipeline --config pipeline.toml --run-id sub-1"
    assert [Path(p).name for p in info["runtime_env"]["py_modules"]] == ["posstats"]  # its jobs inside

    st = posstats("status", job_id, "--address", url, "--token-file", token_file, "--wait", "--timeout", 180)
    assert st.returncode == 0, st.stdout + st.stderr
    assert f"job {job_id}: SUCCEEDED (run sub-1)" in st.stdout
    # Ray's own token mechanism works too (RAY_AUTH_MODE=token + RAY_AUTH_TOKEN)
    logs = posstats("logs", job_id, "--address", url, "--follow", token_env=ray_head["token"])
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert "run sub-1 complete" in logs.stdout and "latest -> sub-1" in logs.stdout
    assert f"job {job_id}: SUCCEEDED" in logs.stderr
    full = posstats("status", job_id, "--address", url, "--token-file", token_file, "--json")
    doc = json.loads(full.stdout)
    assert doc["status"] == "SUCCEEDED" and doc["metadata"]["posstats_run_id"] == "sub-1"

    store = Store(str(tmp_path / "store"))
    assert store.run_marker("sub-1") and store.latest()["run_id"] == "sub-1"
    ref = count_corpus(CorpusSource(inputs=(str(corpus / "*.parquet"),), column="ids"), CountSpec(N, V),
                       show_progress=False)
    got = load_counts(Path(store.root) / "runs/sub-1/reduce")
    np.testing.assert_array_equal(got.to_dense().matrix, ref.to_dense().matrix)
    assert got.fingerprint == ref.fingerprint
    assert time.monotonic() - t0 < 200


def test_failures_are_reported_clearly(ray_head, corpus_config):
    tmp_path, _, config = corpus_config
    url, token_file = ray_head["url"], ray_head["token_file"]
    # no token, a wrong token
    r = posstats("status", "raysubmit_x", "--address", url)
    assert r.returncode == 2 and "requires a token (token authentication)" in r.stderr, r.stderr
    wrong = tmp_path / "wrong"
    wrong.write_text("0" * 64)
    r = posstats("submit", "--address", url, "--token-file", wrong, "--config", config)
    assert r.returncode == 2 and "refused the token" in r.stderr, r.stderr
    # nobody listening: a port we hold bound but never listen on refuses connections, and nothing
    # else (a Ray worker's own server, say) can take it while the command runs
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        r = posstats("status", "raysubmit_x", "--address", f"http://127.0.0.1:{held.getsockname()[1]}")
    assert r.returncode == 2 and "cannot reach the Ray job server" in r.stderr, r.stderr
    # an unknown job
    r = posstats("logs", "raysubmit_nope", "--address", url, "--token-file", token_file)
    assert r.returncode == 2 and "raysubmit_nope" in r.stderr, r.stderr
    # a bad configuration never leaves this machine
    r = posstats("submit", "--address", url, "--token-file", token_file, "--config", config, "--set",
                 "count.mode=stride")
    assert r.returncode == 2 and "[count] mode must be one of" in r.stderr
    # a job that fails on the cluster: FAILED, exit 1, and its log says why
    r = posstats("submit", "--address", url, "--token-file", token_file, "--config", config, "--run-id", "bad-1",
                 "--input", str(tmp_path / "missing" / "*.parquet"))
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.split()[0]
    st = posstats("status", job_id, "--address", url, "--token-file", token_file, "--wait", "--timeout", 120)
    assert st.returncode == 1 and "FAILED" in st.stdout, st.stdout + st.stderr
    # without --wait too (issue #18.13: it used to exit 0 for a failed job), and with --json
    st = posstats("status", job_id, "--address", url, "--token-file", token_file)
    assert st.returncode == 1 and f"job {job_id}: FAILED" in st.stdout, st.stdout + st.stderr
    st = posstats("status", job_id, "--address", url, "--token-file", token_file, "--json")
    assert st.returncode == 1 and json.loads(st.stdout)["status"] == "FAILED"
    logs = posstats("logs", job_id, "--address", url, "--token-file", token_file)
    assert "posstats: error: no input matches" in logs.stdout
    assert Store(str(tmp_path / "store")).read_lock() == (None, False)  # the failed run let go of the store


def test_a_stopped_job_makes_status_exit_nonzero(ray_head, corpus_config):
    """Issue #18.13: `posstats status JOB` exits 0 while the job runs, 1 once it is STOPPED
    (with and without --wait)."""
    from ray.job_submission import JobSubmissionClient

    tmp_path, _, config = corpus_config
    url, token_file = ray_head["url"], ray_head["token_file"]
    t0 = time.monotonic()
    r = posstats("submit", "--address", url, "--token-file", token_file, "--config", config, "--run-id", "stop-1",
                 "--env", "POSSTATS_TEST_SHARD_DELAY=30")
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.split()[0]
    client = JobSubmissionClient(url, headers={"Authorization": f"Bearer {ray_head['token']}"})
    deadline = time.monotonic() + 60
    while str(client.get_job_status(job_id).value) != "RUNNING":
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.5)
    st = posstats("status", job_id, "--address", url, "--token-file", token_file)
    assert st.returncode == 0 and f"job {job_id}: RUNNING" in st.stdout, st.stdout + st.stderr
    st = posstats("status", job_id, "--address", url, "--token-file", token_file, "--wait", "--timeout", 1)
    assert st.returncode == 3, st.stdout + st.stderr  # still running after 1 s
    assert client.stop_job(job_id)
    st = posstats("status", job_id, "--address", url, "--token-file", token_file, "--wait", "--timeout", 60)
    assert st.returncode == 1 and f"job {job_id}: STOPPED" in st.stdout, st.stdout + st.stderr
    st = posstats("status", job_id, "--address", url, "--token-file", token_file, "--json")
    assert st.returncode == 1 and json.loads(st.stdout)["status"] == "STOPPED"
    print(f"\nstopped-job status test: {time.monotonic() - t0:.1f} s")


def _files_holding(root: Path, needles: list[str]) -> list[str]:
    """Regular files under ``root`` whose bytes contain one of ``needles``."""
    found = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            try:
                if not path.is_file() or path.is_symlink():
                    continue
                data = path.read_bytes()
            except OSError:
                continue
            found += [f"{path}: {n}" for n in needles if n.encode() in data]
    return found


def test_no_credential_reaches_the_job_api_or_the_nodes(ray_head, corpus_config):
    """Issue #18.7 against a real head: a credential in --env or in the config's
    storage_options is refused before anything is submitted; a job submitted by a user who
    has credentials in their own environment carries none of them: not in the job API's
    records (list_jobs(): runtime_env, entrypoint, metadata), not in any file of the head's
    temp folder (runtime_env_agent.log, the unpacked working_dir, the job logs), not in the
    run store."""
    from ray.job_submission import JobSubmissionClient

    tmp_path, _, config = corpus_config
    url, token_file = ray_head["url"], ray_head["token_file"]
    t0 = time.monotonic()
    in_flag, in_config, in_client_env = (f"flag-{secrets.token_hex(12)}", f"cfg-{secrets.token_hex(12)}",
                                         f"env-{secrets.token_hex(12)}")
    needles = [in_flag, in_config, in_client_env]
    client = JobSubmissionClient(url, headers={"Authorization": f"Bearer {ray_head['token']}"})
    before = {j.submission_id for j in client.list_jobs()}

    r = posstats("submit", "--address", url, "--token-file", token_file, "--config", config, "--run-id", "cred-0",
                 "--env", f"AWS_SECRET_ACCESS_KEY={in_flag}")
    assert r.returncode == 2 and "--env AWS_SECRET_ACCESS_KEY: refusing to send a credential" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and in_flag not in r.stderr
    secret_config = tmp_path / "secret.toml"
    secret_config.write_text(config.read_text().replace('column = "ids"', 'column = "ids"\nstorage_options = '
                                                        f'{{key = "AKIAABCDEFGHIJKLMNOP", secret = "{in_config}"}}'))
    r = posstats("submit", "--address", url, "--token-file", token_file, "--config", secret_config,
                 "--run-id", "cred-0")
    assert r.returncode == 2 and "[input] storage_options.key (and 1 more) holds a credential" in r.stderr, r.stderr
    assert {j.submission_id for j in client.list_jobs()} == before  # nothing was submitted

    # the documented route: credentials stay with whoever has them (here: the submitter's own
    # environment, which a job never inherits; on a cluster: the nodes' environment / role)
    r = posstats("submit", "--address", url, "--token-file", token_file, "--config", config, "--run-id", "cred-1",
                 "--env", "AWS_DEFAULT_REGION=eu-west-1", "--set", "input.storage_options={anon=false}",
                 extra_env={"AWS_SECRET_ACCESS_KEY": in_client_env, "AWS_ACCESS_KEY_ID": "AKIAABCDEFGHIJKLMNOP"})
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.split()[0]
    st = posstats("status", job_id, "--address", url, "--token-file", token_file, "--wait", "--timeout", 180)
    assert st.returncode == 0, st.stdout + st.stderr

    jobs = [j for j in client.list_jobs() if j.submission_id not in before]
    assert [j.submission_id for j in jobs] == [job_id]
    (job,) = jobs
    assert job.runtime_env["env_vars"]["AWS_DEFAULT_REGION"] == "eu-west-1"
    assert not {"AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID"} & set(job.runtime_env["env_vars"])
    records = json.dumps([j.model_dump() if hasattr(j, "model_dump") else dataclasses.asdict(j) for j in jobs],
                         default=str)
    assert job_id in records and not [n for n in [*needles, "AKIAABCDEFGHIJKLMNOP"] if n in records]
    assert _files_holding(Path(ray_head["temp"]), needles) == []
    assert _files_holding(tmp_path / "store", needles) == []
    shipped = (tmp_path / "store" / "runs" / "cred-1" / "config" / "pipeline.toml").read_text()
    assert "anon = false" in shipped  # the run store's copy of the config is the one that travelled
    print(f"\ncredential test: {time.monotonic() - t0:.1f} s")


@pytest.mark.parametrize("port", [44403, 40100, 8265])
def test_client_errors_are_told_apart_whatever_the_port(port):
    """A port holding "401" or "403" (``:44403``) is not an HTTP status: an unreachable
    server is reported as unreachable, and only the server's own 401 / 403 as a token problem
    (the messages Ray's SDK raises, for this port)."""
    from jobs.submit import _client_error

    url = f"http://127.0.0.1:{port}"
    unreachable = _client_error(url, ConnectionError(f"Failed to connect to Ray at address: {url}."))
    assert unreachable.startswith(f"cannot reach the Ray job server at {url}"), unreachable
    missing = _client_error(url, OSError(f"401 Client Error: Unauthorized for url: {url}/api/version"))
    assert "requires a token" in missing, missing
    wrong = _client_error(url, RuntimeError("Request failed with status code 403: Forbidden: Invalid authentication token."))
    assert "refused the token" in wrong, wrong
    other = _client_error(url, RuntimeError(f"Request failed with status code 500 at {url}/api/jobs/"))
    assert other.startswith(f"Ray job server at {url}: Request failed with status code 500"), other
