"""cluster/: the two-node local cluster script starts a head and a worker node (each with its
own Ray temp folder), every socket its processes listen on is on loopback (and nothing
answers on the machine's external address), the count job submitted to it with `ray job
submit` and a whole pipeline run submitted with `posstats submit` run their actors on both
nodes and equal the single-process count, and `stop` ends the cluster's processes (and only
those). One cluster serves the module (about 7 s to start, 6 s to stop)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from posstats.corpus.source import CorpusSource
from posstats.corpus.count_step import count_corpus
from posstats.corpus.tokenizer import encode_texts, load_tokenizer
from posstats.counting.counts import CountSpec
from posstats.counting.io import load_counts
from posstats.service.pipeline_store import Store

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "cluster" / "local_cluster.sh"
BERT = REPO / "data" / "tokenizers" / "bert-base-uncased.tokenizer.json"
FORTUNES = REPO / "data" / "fortunes-sample.jsonl"


def pinned_ray_version() -> str:
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["ray"]
    (spec,) = [d for d in deps if d.startswith("ray")]
    return spec.split("==")[1]


def test_manifests_pin_the_projects_ray_version():
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (it comes with ray[default])")
    version = pinned_ray_version()
    kuberay = list(yaml.safe_load_all((REPO / "cluster" / "kuberay-raycluster.yaml").read_text()))
    (cluster,) = [d for d in kuberay if d["kind"] == "RayCluster"]
    assert cluster["spec"]["rayVersion"] == version
    groups = [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]
    images = [c["image"] for g in groups for c in g["template"]["spec"]["containers"]]
    assert images and all(f":{version}" in image for image in images)
    autoscaler = yaml.safe_load((REPO / "cluster" / "autoscaler.yaml").read_text())
    assert f":{version}" in autoscaler["docker"]["image"]
    commands = " ".join(autoscaler["setup_commands"])
    assert f"ray[default]=={version}" in commands


def free_port_block(size: int = 300) -> int:
    """A base port whose block of the ports the script uses is free right now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1] // 1000 * 1000 + 100
        if not 20000 <= base <= 60000:
            continue
        ok = True
        for p in list(range(base, base + 20)) + [base + 100, base + 200]:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    pytest.skip("no free block of ports for a local cluster")


def _session(pid: int) -> int | None:
    """The session id of a process (field 6 of /proc/PID/stat), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[3])


def session_pids(sessions: set[int]) -> list[int]:
    """Pids of every process in these sessions. Each node's `ray start --block` runs in a
    session of its own (setsid); Ray's workers leave its process group for their own, but
    stay in its session, so the sessions hold exactly this cluster's processes."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _session(int(entry)) in sessions:
            out.append(int(entry))
    return out


def pids_naming(marker: str) -> list[int]:
    """Pids of processes whose command line contains ``marker`` (the cluster's state folder)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            out.append(int(entry))
    return out


@contextlib.contextmanager
def running_cluster(**settings: str):
    """The two-node cluster of cluster/local_cluster.sh (``settings``: extra environment),
    stopped whatever happens; asserts that `stop` leaves none of its processes behind."""
    port = free_port_block()
    state = tempfile.mkdtemp(prefix="prc", dir="/tmp")  # short: Ray's socket paths live in it
    env = {**os.environ, "RAY_LOCAL_PORT": str(port), "RAY_LOCAL_DIR": state, "RAY_AUTH_MODE": "disabled", **settings}
    env = {k: v for k, v in env.items() if k not in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")}
    sessions: set[int] = set()
    try:
        t0 = time.monotonic()
        started = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=240)
        assert started.returncode == 0, started.stdout + started.stderr
        sessions = {int((Path(state) / f"{n}.pid").read_text()) for n in ("head", "worker")}
        print(f"\nlocal cluster up in {time.monotonic() - t0:.1f} s")
        yield {"port": port, "env": env, "state": state, "sessions": sessions, "address": f"127.0.0.1:{port}",
               "dashboard": f"http://127.0.0.1:{port + 2}"}
    finally:
        t0 = time.monotonic()
        subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=120)
        pid_files = [p for p in (Path(state) / name for name in ("head.pid", "worker.pid")) if p.exists()]
        left = session_pids(sessions) + pids_naming(state)
        for pid in left:  # never leave them running, even when the assertion below fails
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(state, ignore_errors=True)
        print(f"\nlocal cluster stopped in {time.monotonic() - t0:.1f} s")
        assert not pid_files, "stop left pid files behind"
        assert not left, f"stop left processes of the cluster running: {left}"


@pytest.fixture(scope="module")
def local_cluster():
    """One cluster (authentication off, the script's default) for this module's tests."""
    with running_cluster() as cluster:
        yield cluster


@pytest.mark.ray
@pytest.mark.slow
def test_count_job_submitted_to_the_two_node_cluster(local_cluster, tmp_path):
    texts = [json.loads(line)["text"] for line in FORTUNES.read_text(encoding="utf-8").splitlines() if line.strip()]
    b = encode_texts(load_tokenizer(BERT), texts)
    seqs = [b.values[b.offsets[i] : b.offsets[i + 1]].tolist() for i in range(b.rows)]
    for f in range(2):
        table = pa.table({"ids": pa.array(seqs[f * 1500 : (f + 1) * 1500], type=pa.list_(pa.int32()))})
        pq.write_table(table, tmp_path / f"f{f}.parquet", row_group_size=300)
    out = tmp_path / "out"
    entrypoint = [sys.executable, "-m", "posstats.jobs.count", "--input", f"{tmp_path}/*.parquet", "--column", "ids",
                  "--vocab-size", "30522", "--positions", "64", "--mode", "chunk", "--out", str(out), "--workers", "2",
                  "--shard-size", "1e-6"]  # one shard per row group
    ray_cli = shutil.which("ray") or "ray"
    submitted = subprocess.run(
        [ray_cli, "job", "submit", "--address", local_cluster["dashboard"], "--", *entrypoint],
        env={**local_cluster["env"], "RAY_AUTH_MODE": "disabled"},
        capture_output=True, text=True, timeout=300,
    )
    assert submitted.returncode == 0, submitted.stdout[-3000:] + submitted.stderr[-3000:]
    assert "succeeded" in submitted.stdout + submitted.stderr

    source = CorpusSource(inputs=(str(tmp_path / "*.parquet"),), column="ids")
    ref = count_corpus(source, CountSpec(64, 30522, "chunk"), show_progress=False)
    got = load_counts(out)
    assert got.equals(ref) and got.fingerprint == ref.fingerprint
    nodes = {json.loads(m.read_text())["node_id"] for m in (out / "store").glob("partials/*/done.json")}
    assert len(nodes) == 2  # actors on the head and on the worker node both counted
    assert json.loads((out / "count.json").read_text())["ray"]["shards"] == 10


# ----------------------------------------------------------------------------- listeners


def _decode_address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address of /proc/net/tcp (8 hex digits) or tcp6 (32): 32-bit words in host byte order."""
    raw = bytes.fromhex(hex_addr)
    words = [raw[i : i + 4][::-1] for i in range(0, len(raw), 4)] if sys.byteorder == "little" else [raw]
    return ipaddress.ip_address(b"".join(words))


def listening_sockets(pids: list[int]) -> list[dict]:
    """Every TCP socket in LISTEN state owned by one of ``pids``: {ip, port, pid, name}
    (from /proc/net/tcp{,6}, matched to the processes by the sockets' inodes)."""
    owner: dict[str, int] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        owner[target[8:-1]] = pid
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in owner:  # 0A: TCP_LISTEN
                continue
            hex_ip, hex_port = local.split(":")
            pid, name = owner[inode], "?"
            with contextlib.suppress(OSError):
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            out.append({"ip": _decode_address(hex_ip), "port": int(hex_port, 16), "pid": pid, "name": name})
    return out


def is_loopback(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """127.0.0.0/8, ::1, or ::ffff:127.x.y.z (an IPv6 socket bound to an IPv4 loopback address)."""
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def external_address() -> str | None:
    """The address Ray picks for this machine when it does not stay on loopback (the one the
    old script's listeners were reachable on), or None when the machine has only loopback."""
    from ray._raylet import node_ip_address_from_perspective

    ip = node_ip_address_from_perspective(None)
    return None if not ip or ipaddress.ip_address(ip).is_loopback else ip


DRIVER = """
import json, sys, ray
ray.init(sys.argv[1], log_to_driver=False)

@ray.remote
class Probe:
    def node(self):
        return ray.get_runtime_context().get_node_id()

cpus, n = float(sys.argv[2]), int(sys.argv[3])       # 1 CPU each, 2 of them: one actor per node
probes = [Probe.options(num_cpus=cpus).remote() for _ in range(n)]
print(json.dumps(sorted(set(ray.get([p.node.remote() for p in probes])))), flush=True)
sys.stdin.read()                                     # hold the actors until the test is done
"""


@pytest.mark.ray
@pytest.mark.slow
def test_every_listener_of_the_cluster_is_on_loopback(local_cluster):
    """Issue #18.2: the GCS, raylets, object managers, agents, dashboard, metrics endpoints,
    the Ray Client server and its per-client server, and the core workers (a driver's actors
    on both nodes) all listen on 127.0.0.1 / ::1 only, and no port of the cluster answers on
    the machine's external address. Authentication stays off by default, so this is what
    keeps the cluster to this machine."""
    t0 = time.monotonic()
    port = local_cluster["port"]
    shown = subprocess.run([str(SCRIPT), "env"], env=local_cluster["env"], capture_output=True, text=True, timeout=30)
    client_env = dict(line.removeprefix("export ").split("=", 1) for line in shown.stdout.splitlines())
    assert client_env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0" and client_env["RAY_ADDRESS"] == f"127.0.0.1:{port}"
    env = {**local_cluster["env"], **client_env}
    drivers, nodes = [], []
    try:
        # two one-CPU actors through the GCS (one on each node), one more through the Ray Client
        # server (PORT + 1, which starts a per-client server)
        for address, cpus, n in ((f"127.0.0.1:{port}", 1, 2), (f"ray://127.0.0.1:{port + 1}", 0, 1)):
            # Ray's client proxy now and then loses the per-client server it just forked (a
            # psutil ZombieProcess inside Ray, or "Starting Ray client server failed", both
            # seen on a loaded 2-core machine): try again
            for _attempt in range(3):
                d = subprocess.Popen([sys.executable, "-c", DRIVER, address, str(cpus), str(n)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                drivers.append(d)
                line = d.stdout.readline()
                err = "" if line else d.stderr.read()
                if line or not any(flake in err for flake in ("ZombieProcess", "Starting Ray client server failed")):
                    break
            assert line, err[-3000:]
            nodes.append(json.loads(line))
        pids = session_pids(local_cluster["sessions"])
        sockets = listening_sockets(pids)
    finally:
        for d in drivers:
            with contextlib.suppress(OSError):
                d.stdin.close()
            try:
                d.wait(timeout=30)
            except subprocess.TimeoutExpired:
                d.kill()
                d.wait()
    assert len(nodes[0]) == 2, nodes  # the first driver's actors run on both nodes
    shown = sorted(f"{s['ip']}:{s['port']} {s['name']}" for s in sockets)
    ports = {s["port"] for s in sockets}
    # the listing sees the whole cluster: GCS, client server, dashboard, both raylets, both
    # nodes' agents, and core workers in each node's worker port range
    expected = {port, port + 1, port + 2, port + 3, port + 6, port + 7, port + 13, port + 16, port + 17}
    assert expected <= ports, (sorted(expected - ports), shown)
    assert any(port + 100 <= p <= port + 199 for p in ports), shown  # a worker process on the head
    assert any(port + 200 <= p <= port + 299 for p in ports), shown  # an actor on the worker node
    exposed = [f"{s['ip']}:{s['port']} {s['name']} (pid {s['pid']})" for s in sockets if not is_loopback(s["ip"])]
    assert not exposed, f"listening beyond loopback: {exposed}"
    ext = external_address()
    if ext is not None:
        answered = []
        for p in sorted(ports):
            with contextlib.suppress(OSError), socket.create_connection((ext, p), timeout=1):
                answered.append(p)
        assert not answered, f"ports answering on {ext}: {answered}"
    print(f"\n{len(sockets)} listening sockets of {len(pids)} processes, all on loopback "
          f"({time.monotonic() - t0:.1f} s)")


# ----------------------------------------------------------------------------- posstats submit


def posstats(*args: object, timeout: float = 300) -> subprocess.CompletedProcess:
    """The posstats CLI as a user runs it against the job server: no Ray settings inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return subprocess.run([sys.executable, "-m", "posstats.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


@pytest.mark.ray
@pytest.mark.slow
def test_posstats_submit_to_the_two_node_cluster(local_cluster, tmp_path):
    """Issue #18.13: a pipeline run submitted with `posstats submit --wait` succeeds on the
    two-node cluster, with counting actors on both nodes (each node unpacks the job's
    working_dir into its own temp folder; with one shared temp folder the worker node's
    actors lost their working folder mid-run: FileNotFoundError from os.getcwd())."""
    t0 = time.monotonic()
    rng = np.random.default_rng(11)
    v, n = 64, 16
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for f in range(4):
        seqs = [(rng.zipf(1.6, size=int(rng.integers(n, 2 * n))) % v).astype(np.int32).tolist() for _ in range(100)]
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
positions = {n}
vocab_size = {v}
[ray]
workers = 2
[geometry]
dims = [2, 8]
encodings = ["mds", "sinusoidal"]
[export]
dim = 8
rank = 2  # explicit: a random corpus has no component above noise, and the default exports none
card = false
""")
    url = local_cluster["dashboard"]
    sub = posstats("submit", "--address", url, "--config", config, "--run-id", "two-node-1", "--wait")
    assert sub.returncode == 0, sub.stdout[-3000:] + sub.stderr[-3000:]
    job_id = sub.stdout.split()[0]
    assert f"job {job_id}: SUCCEEDED" in sub.stdout, sub.stdout
    st = posstats("status", job_id, "--address", url)
    assert st.returncode == 0 and f"job {job_id}: SUCCEEDED (run two-node-1)" in st.stdout, st.stdout + st.stderr

    store = Store(str(tmp_path / "store"))
    assert store.run_marker("two-node-1") and store.latest()["run_id"] == "two-node-1"
    run = Path(store.root) / "runs" / "two-node-1"
    assert (run / "export" / "positions.safetensors").is_file() and (run / "report" / "report.html").is_file()
    assert store.verify_stage("two-node-1", "export") == []
    ref = count_corpus(CorpusSource(inputs=(str(corpus / "*.parquet"),), column="ids"), CountSpec(n, v),
                       show_progress=False)
    got = load_counts(run / "reduce")
    np.testing.assert_array_equal(got.to_dense().matrix, ref.to_dense().matrix)
    markers = list((tmp_path / "store" / "work" / "count-store").glob("*/partials/*/done.json"))
    nodes = {json.loads(m.read_text())["node_id"] for m in markers}
    assert len(nodes) == 2, nodes  # actors on the head and on the worker node both counted
    print(f"\nposstats submit --wait on the two-node cluster: {time.monotonic() - t0:.1f} s")


@pytest.mark.ray
@pytest.mark.slow
def test_token_mode_cluster_keeps_its_token_private():
    """RAY_AUTH_MODE=token (advised on shared machines): the script generates a 0600 token in
    its 0700 state folder, records the mode for `env`, and the job API refuses a client
    without the token and serves one with it."""
    with running_cluster(RAY_AUTH_MODE="token") as cluster:
        state = Path(cluster["state"])
        token = state / "auth_token"
        assert (state.stat().st_mode & 0o777, token.stat().st_mode & 0o777) == (0o700, 0o600)
        no_auth = {k: v for k, v in cluster["env"].items() if not k.startswith("RAY_AUTH")}
        shown = subprocess.run([str(SCRIPT), "env"], env=no_auth, capture_output=True, text=True, timeout=30).stdout
        assert "export RAY_AUTH_MODE=token" in shown and f"export RAY_AUTH_TOKEN_PATH={token}" in shown
        assert token.read_text().strip() not in shown + (state / "auth.env").read_text()
        url = cluster["dashboard"]
        r = posstats("status", "raysubmit_none", "--address", url)
        assert r.returncode == 2 and "requires a token (token authentication)" in r.stderr, r.stderr
        r = posstats("status", "raysubmit_none", "--address", url, "--token-file", token)
        assert r.returncode == 2 and "raysubmit_none" in r.stderr and "token" not in r.stderr, r.stderr
        listeners = listening_sockets(session_pids(cluster["sessions"]))
        assert listeners and all(is_loopback(s["ip"]) for s in listeners), listeners


# ----------------------------------------------------------------------------- a Ray posstats starts itself


def _own_session(cmd: list[str], *, env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    """``cmd`` in a new session (its pid is the session and group id), output to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def _wait_for(predicate, timeout: float, what: str, log: Path, detail=lambda: "") -> None:
    """Poll ``predicate`` until it holds; else fail with the log's tail and ``detail()``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}; {detail()}log:\n{log.read_text()[-3000:]}")


def describe_processes(pids: list[int]) -> str:
    """One line per process: pid, parent, state, command line (for a failure message)."""
    lines = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        lines.append(f"  pid {pid} parent {ppid} state {state}: {cmd[:160]}\n")
    return "still running:\n" + "".join(lines) if lines else ""


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def _small_corpus(folder: Path, files: int = 4) -> None:
    folder.mkdir()
    rng = np.random.default_rng(0)
    for f in range(files):
        seqs = [(rng.zipf(1.6, size=24) % 64).astype(np.int32).tolist() for _ in range(40)]
        pq.write_table(pa.table({"ids": pa.array(seqs, type=pa.list_(pa.int32()))}), folder / f"s{f}.parquet")


@pytest.mark.ray
@pytest.mark.slow
def test_the_ray_posstats_starts_itself_listens_on_loopback_only(tmp_path):
    """`posstats count --ray` without an address starts Ray: its GCS, raylet, driver, workers
    and agents must listen on loopback only (a shared host or a cafe network sees none)."""
    _small_corpus(tmp_path / "corpus")
    env = {**_clean_env(), "POSSTATS_TEST_SHARD_DELAY": "4"}
    log = tmp_path / "count.log"
    proc = _own_session([sys.executable, "-m", "posstats.cli", "count", "--ray", "--workers", "2", "--input",
                         str(tmp_path / "corpus" / "*.parquet"), "--column", "ids", "--vocab-size", "64",
                         "--positions", "16", "--shard-size", "1e-6", "--out", str(tmp_path / "out")],
                        env=env, cwd=tmp_path, log=log)
    try:
        seen: list[dict] = []

        def record(now: list[dict]) -> None:
            seen.extend(s for s in now if (s["ip"], s["port"]) not in {(x["ip"], x["port"]) for x in seen})

        def ray_is_up() -> bool:
            now = listening_sockets(session_pids({proc.pid}))
            names = {s["name"] for s in now}
            if "raylet" in names and "gcs_server" in names:
                record(now)  # a later snapshot of a loaded machine can miss a process mid-scan
                return True
            return False

        _wait_for(ray_is_up, 60, "Ray's listeners", log)
        # the workers and agents of the shards being counted: every listener seen while the
        # job runs (a loaded machine starts them later than an idle one)
        deadline = time.monotonic() + 15
        while proc.poll() is None and time.monotonic() < deadline:
            record(listening_sockets(session_pids({proc.pid})))
            if len(seen) >= 6:
                break
            time.sleep(0.25)
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    exposed = sorted(f"{s['ip']}:{s['port']} {s['name']}" for s in seen if not is_loopback(s["ip"]))
    assert len(seen) >= 4 and not exposed, f"listening beyond loopback: {exposed}"
    assert {"raylet", "gcs_server"} <= {s["name"] for s in seen}


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_the_pipelines_group_releases_the_lock_and_leaves_no_process(tmp_path, signum):
    """SIGTERM (systemd, Kubernetes, `timeout`) or SIGHUP (a closed terminal) sent to the
    whole process group mid-run: the store's lock is released, the exit status is 128 +
    signal, and no process of the run's session (Ray's GCS, raylet, workers) outlives it."""
    _small_corpus(tmp_path / "corpus")
    (tmp_path / "pipeline.toml").write_text("""
[store]
url = "store"
[input]
paths = ["corpus/*.parquet"]
column = "ids"
[count]
positions = 16
vocab_size = 64
[geometry]
dims = [2]
encodings = ["sinusoidal"]
""")
    env = {**_clean_env(), "POSSTATS_TEST_GEOMETRY_DELAY": "120"}
    log = tmp_path / "pipeline.log"
    proc = _own_session([sys.executable, "-m", "posstats.cli", "pipeline", "--config", "pipeline.toml", "--run-id", "r1"],
                        env=env, cwd=tmp_path, log=log)
    lock = tmp_path / "store" / "lock"
    try:
        _wait_for(lambda: lock.exists() and "geometry: running" in log.read_text(), 120, "the geometry stage", log)
        time.sleep(1.0)
        os.killpg(proc.pid, signum)
        rc = proc.wait(timeout=60)
        # Ray's own timeouts (a worker reconnecting to a GCS that is gone) reach 60 s
        _wait_for(lambda: not session_pids({proc.pid}), 75, "the run's processes to end", log,
                  detail=lambda: describe_processes(session_pids({proc.pid})))
    finally:
        if proc.poll() is None or session_pids({proc.pid}):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            for pid in session_pids({proc.pid}):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    text = log.read_text()
    assert rc == 128 + signum, text[-3000:]
    assert not lock.exists(), text[-3000:]
    assert f"posstats: stopped by {signal.Signals(signum).name}" in text
    # the next run resumes from the stages that completed
    assert Store(str(tmp_path / "store")).stage_marker("r1", "reduce") is not None
