"""posstats.service.pipeline_store: run-id validation, stage publishing with markers last, the atomic
``latest`` pointer, and the lock rule (heartbeat timeout, dead pid on this host, pid reuse,
damage), with real processes taking, holding and crashing with the lock."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posstats.errors import PosstatsError
from posstats.service.pipeline_store import (
    STAGES,
    DamagedMarker,
    Store,
    describe_os_error,
    enclosing_store,
    is_url,
    validate_run_id,
)
from posstats.storage.locks import pipeline_lock_is_stale as lock_is_stale

REPO = Path(__file__).resolve().parents[1]
HOST = socket.gethostname()


# ----------------------------------------------------------------------------- run ids


@pytest.mark.parametrize("run_id", ["a", "run-2024-06-01", "sched-20240601T060000Z", "v1.2_final", "A" * 128, "0"])
def test_good_run_ids(run_id):
    assert validate_run_id(run_id) == run_id


@pytest.mark.parametrize("run_id", ["", "..", "../x", "a/../b", "a/b", "a\\b", ".hidden", "a..b", "-x", "a b",
                                    "A" * 129, "x\n", "runs/../../etc", "/abs", "é"])
def test_bad_run_ids_are_refused_with_the_rule(run_id):
    with pytest.raises(PosstatsError, match="invalid run id .*without '..' or path separators"):
        validate_run_id(run_id)


@pytest.mark.parametrize("value", [None, 3, ["a"]])
def test_run_id_must_be_a_string(value):
    with pytest.raises(PosstatsError, match="run id must be a string"):
        validate_run_id(value)


@given(st.text(min_size=1, max_size=40))
@settings(max_examples=300, deadline=None)
def test_an_accepted_run_id_stays_inside_runs(text):
    try:
        validate_run_id(text)
    except PosstatsError:
        return
    base = os.path.abspath("/store/runs")
    assert os.path.dirname(os.path.normpath(os.path.join(base, text))) == base
    assert "/" not in text and "\\" not in text and ".." not in text and not text.startswith(".")


def test_store_paths_refuse_bad_run_ids(tmp_path):
    store = Store(str(tmp_path))
    for bad in ("../x", "a/b"):
        with pytest.raises(PosstatsError):
            store.run_marker(bad)
        with pytest.raises(PosstatsError):
            store.log_rel(bad)


def test_urls_and_local_paths():
    assert is_url("s3://bucket/prefix") and is_url("memory://x") and is_url("gs://b")
    assert not is_url("/data/store") and not is_url("relative/store") and not is_url("file:///data")
    assert Store("file:///tmp/x").local and Store("file:///tmp/x").root == "/tmp/x"


# ----------------------------------------------------------------------------- stages and latest


def _stage_dir(tmp_path: Path, name: str, files: dict[str, bytes]) -> Path:
    d = tmp_path / "staging" / name
    d.mkdir(parents=True)
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    return d


def _complete_run(store: Store, tmp_path: Path, run_id: str) -> dict:
    for s in STAGES:
        store.publish_stage(run_id, s, _stage_dir(tmp_path / run_id, s, {f"{s}.txt": s.encode()}))
    return store.finish_run(run_id, {"note": run_id})


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path):
    if request.param == "local":
        return Store(str(tmp_path / "store"))
    return Store(f"memory://posstats-test-{uuid.uuid4().hex}")


def test_publish_writes_the_files_then_a_marker_with_sizes_and_hashes(store, tmp_path):
    d = _stage_dir(tmp_path, "geometry", {"a.json": b"{}", "figures/x.png": b"png" * 100})
    marker = store.publish_stage("r1", "geometry", d, info={"rank": 3, "files": "ignored"})
    assert store.stage_marker("r1", "geometry") == marker
    assert marker["rank"] == 3 and marker["stage"] == "geometry" and marker["run_id"] == "r1"
    assert set(marker["files"]) == {"a.json", "figures/x.png"}
    assert marker["files"]["figures/x.png"]["bytes"] == 300
    assert store.read_bytes("runs/r1/geometry/figures/x.png") == b"png" * 100
    assert store.verify_stage("r1", "geometry") == []
    store.write_bytes("runs/r1/geometry/a.json", b"{ }")
    assert store.verify_stage("r1", "geometry") == ["geometry/a.json: content differs from its marker"]
    store.remove("runs/r1/geometry/figures/x.png")
    assert "geometry/figures/x.png: missing" in store.verify_stage("r1", "geometry")


@pytest.mark.parametrize("marker", [b"", b"{}", b'{"stage": "geometry", "run_id": "r1", "finished": "x"}',
                                    b'{"stage": "geometry", "run_id": "r1", "finished": "x", "files": []}',
                                    b'{"stage": "count", "run_id": "r1", "finished": "x", "files": {}}',
                                    b'{"stage": "geometry", "run_id": "r1", "finished": "x", '
                                    b'"files": {"../../../x": {"bytes": 1, "sha256": "' + b"0" * 64 + b'"}}}',
                                    b'{"stage": "geometry", "run_id": "r1", "finished": "x", '
                                    b'"files": {"a.json": {"bytes": -1, "sha256": "' + b"0" * 64 + b'"}}}',
                                    b'{"stage": "geometry", "run_id": "r1", "finished": "x", '
                                    b'"files": {"a.json": {"bytes": 2, "sha256": "nope"}}}'])
def test_a_blanked_or_forged_marker_vouches_for_nothing(store, tmp_path, marker):
    store.publish_stage("r1", "geometry", _stage_dir(tmp_path, "geometry", {"a.json": b"{}"}))
    store.write_bytes("runs/r1/geometry/done.json", marker)
    with pytest.raises(DamagedMarker, match="damaged completion marker|not readable JSON"):
        store.stage_marker("r1", "geometry")
    with pytest.raises(PosstatsError):
        store.stage_dir("r1", "geometry", tmp_path / "copy")
    (problem,) = store.verify_stage("r1", "geometry")
    assert problem.startswith("geometry: ")
    assert store.run_status("r1")["stages"]["geometry"] is None  # not complete, and not used


def test_stage_dir_checks_every_file_and_refuses_unlisted_ones(store, tmp_path):
    store.publish_stage("r1", "reduce", _stage_dir(tmp_path, "reduce", {"counts.bin": b"1234", "sub/c.json": b"{}"}))
    got = store.stage_dir("r1", "reduce", tmp_path / "copy")
    assert (got / "counts.bin").read_bytes() == b"1234" and (got / "sub" / "c.json").read_bytes() == b"{}"
    store.write_bytes("runs/r1/reduce/counts.bin", b"1235")  # one byte flipped
    with pytest.raises(PosstatsError, match=r"reduce stage fails its checksums \(reduce/counts.bin: content differs"):
        store.stage_dir("r1", "reduce", tmp_path / "copy2")
    store.write_bytes("runs/r1/reduce/counts.bin", b"1234")
    store.write_bytes("runs/r1/reduce/counts.other", b"planted")
    assert store.verify_stage("r1", "reduce") == ["reduce/counts.other: not listed in its marker"]
    if store.local:
        with pytest.raises(PosstatsError, match="not listed in its marker"):
            store.stage_dir("r1", "reduce")
    else:  # a download takes only what the marker lists
        assert not (store.stage_dir("r1", "reduce", tmp_path / "copy3") / "counts.other").exists()
    with pytest.raises(PosstatsError, match="the geometry stage of run r1 is not complete"):
        store.stage_dir("r1", "geometry", tmp_path / "copy4")


def test_enclosing_store_finds_a_store_around_a_path(tmp_path):
    store = Store(str(tmp_path / "store"))
    _complete_run(store, tmp_path, "r1")
    store.move_latest("r1")
    assert enclosing_store(tmp_path / "store" / "runs" / "r1" / "diff") == tmp_path / "store"
    assert enclosing_store(tmp_path / "store") == tmp_path / "store"
    assert enclosing_store(tmp_path / "elsewhere" / "out") is None


def test_marker_is_written_last(tmp_path, monkeypatch):
    store = Store(str(tmp_path / "store"))
    order = []
    real_write = Store.write_json

    def spy(self, rel, obj):
        order.append(rel)
        return real_write(self, rel, obj)

    monkeypatch.setattr(Store, "write_json", spy)
    real_put = Store.put_file
    monkeypatch.setattr(Store, "put_file", lambda self, local, rel: (order.append(rel), real_put(self, local, rel)))
    d = _stage_dir(tmp_path, "report", {"report.html": b"<html>", "summary.md": b"#"})
    store.publish_stage("r1", "report", d)
    assert order[-1] == "runs/r1/report/done.json"
    assert all(Path(store.path("runs/r1/report")).joinpath(n).exists() for n in ("report.html", "summary.md"))


def test_a_crash_while_publishing_leaves_no_marker(tmp_path, monkeypatch):
    store = Store(str(tmp_path / "store"))
    d = _stage_dir(tmp_path, "export", {"a.bin": b"1", "b.bin": b"2"})
    calls = {"n": 0}
    real = os.replace

    def failing(src, dst):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError):
        store.publish_stage("r1", "export", d)
    monkeypatch.setattr(os, "replace", real)
    assert store.stage_marker("r1", "export") is None  # incomplete: redone next time
    store.clear_stage("r1", "export")
    assert not Path(store.path("runs/r1/export")).exists()


def test_finish_run_needs_every_stage(store, tmp_path):
    for s in STAGES[:-1]:
        store.publish_stage("r1", s, _stage_dir(tmp_path / "x", s, {"f": b"x"}))
    with pytest.raises(PosstatsError, match="stage\\(s\\) export not complete"):
        store.finish_run("r1", {})
    assert store.run_marker("r1") is None
    store.publish_stage("r1", "export", _stage_dir(tmp_path / "y", "export", {"f": b"x"}))
    assert store.finish_run("r1", {"k": 1})["k"] == 1
    assert store.run_status("r1")["complete"] and store.run_ids() == ["r1"]


def test_latest_only_names_complete_runs_and_never_moves_back(store, tmp_path):
    with pytest.raises(PosstatsError, match="not complete"):
        store.move_latest("r0")
    assert store.latest() is None
    _complete_run(store, tmp_path, "older")
    time.sleep(0.01)
    _complete_run(store, tmp_path, "newer")
    assert store.move_latest("newer") and store.latest()["run_id"] == "newer"
    assert store.move_latest("older") is False and store.latest()["run_id"] == "newer"
    assert store.latest()["path"] == "runs/newer"
    assert [k for k in store.listdir() if k.startswith("latest.tmp")] == []


def test_latest_is_replaced_atomically_under_concurrent_readers(tmp_path):
    store = Store(str(tmp_path / "store"))
    ids = [f"r{i}" for i in range(12)]
    for rid in ids:
        _complete_run(store, tmp_path, rid)
        time.sleep(0.002)
    seen, errors = set(), []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            try:
                latest = store.latest()
            except PosstatsError as exc:  # a torn read would not parse
                errors.append(exc)
                return
            if latest:
                seen.add(latest["run_id"])
                if store.run_marker(latest["run_id"]) is None:
                    errors.append(f"latest names {latest['run_id']} without a marker")

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for _ in range(20):
        for rid in ids:
            store.write_json("latest-scratch", {"x": rid})
            store.move_latest(rid)
        store.remove("latest")
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert seen  # the readers did see pointers


def test_read_json_never_unpickles(tmp_path):
    import pickle

    store = Store(str(tmp_path))
    (tmp_path / "latest").write_bytes(pickle.dumps({"run_id": "x"}))
    with pytest.raises(PosstatsError, match="not readable JSON"):
        store.latest()


# ----------------------------------------------------------------------------- lock rule


def _record(**over):
    now = time.time()
    return {"pid": os.getpid(), "hostname": HOST, "heartbeat_ts": now, "run_id": "r", "start_ticks": None, **over}


def test_lock_rule_heartbeat_timeout_any_host():
    now = time.time()
    assert lock_is_stale(_record(heartbeat_ts=now - 601, hostname="elsewhere"), now=now, hostname=HOST, stale_after=600)[0]
    stale, why = lock_is_stale(_record(heartbeat_ts=now - 30, hostname="elsewhere"), now=now, hostname=HOST,
                               stale_after=600)
    assert not stale and why == "heartbeat 30 s ago"


def test_lock_rule_dead_pid_on_this_host_only():
    now = time.time()
    dead = _record(pid=123456)
    assert lock_is_stale(dead, now=now, hostname=HOST, stale_after=600, pid_alive=lambda p: False) == (
        True, f"its process 123456 on this host ({HOST}) is gone")
    # the same pid on another host says nothing about that host's process
    assert not lock_is_stale({**dead, "hostname": "other"}, now=now, hostname=HOST, stale_after=600,
                             pid_alive=lambda p: False)[0]


def test_lock_rule_pid_reuse_and_damage():
    now = time.time()
    rec = _record(start_ticks=100)
    assert lock_is_stale(rec, now=now, hostname=HOST, stale_after=600, pid_alive=lambda p: True,
                         start_ticks=lambda p: 101)[0]
    assert not lock_is_stale(rec, now=now, hostname=HOST, stale_after=600, pid_alive=lambda p: True,
                             start_ticks=lambda p: 100)[0]
    for damaged in (None, {}, {"pid": 1}, {"pid": "x", "heartbeat_ts": "y"}):
        assert lock_is_stale(damaged, now=now, hostname=HOST, stale_after=600)[0]


def test_second_run_is_refused_with_the_holder_named(store):
    with store.lock(run_id="first", stale_after=600):
        with pytest.raises(PosstatsError) as err:
            with store.lock(run_id="second"):
                pass
        msg = str(err.value)
        assert "is in use by run first (pipeline, pid" in msg and "heartbeat 0 s ago" in msg
        assert "stale only when its heartbeat is older than 600 s" in msg
    with store.lock(run_id="third"):  # released: free again
        assert store.read_lock()[0]["run_id"] == "third"
    assert store.read_lock() == (None, False)


def test_heartbeat_refreshes_and_a_stale_heartbeat_is_taken_over(store):
    with store.lock(run_id="beating", heartbeat=0.1) as lk:
        first = store.read_lock()[0]["heartbeat_ts"]
        time.sleep(0.5)
        assert store.read_lock()[0]["heartbeat_ts"] > first
        lk._stop.set()  # freeze the heartbeat: the holder looks hung
        lk._thread.join()
        old = {**store.read_lock()[0], "heartbeat_ts": time.time() - 3600, "hostname": "another-host"}
        store.write_json("lock", old)
        with store.lock(run_id="taker", stale_after=600):
            assert store.read_lock()[0]["run_id"] == "taker"
            with pytest.raises(PosstatsError, match="lost the lock .* now belongs to run taker"):
                lk.check()


def test_a_holder_that_lost_its_lock_notices_at_its_heartbeat(tmp_path):
    store = Store(str(tmp_path))
    with store.lock(run_id="slow", heartbeat=0.1) as lk:
        store.write_json("lock", _record(run_id="usurper", token="x", hostname="other"))
        time.sleep(0.4)
        assert lk.lost and "usurper" in lk.lost
        with pytest.raises(PosstatsError, match="presumed dead"):
            lk.check()
    assert store.read_lock()[0]["run_id"] == "usurper"  # release never deletes another run's lock


HOLD = """
import sys, time
from posstats.service.pipeline_store import Store
with Store(sys.argv[1]).lock(run_id=sys.argv[2], heartbeat=0.2):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_crashed_holder_never_blocks_the_store(tmp_path):
    store = Store(str(tmp_path / "store"))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, store.root, "crashing"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(PosstatsError, match="in use by run crashing"):
            with store.lock(run_id="waiting"):
                pass
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        holder.kill()
    assert store.read_lock()[0]["run_id"] == "crashing"  # the dead run's lock is still there...
    logged = []
    with store.lock(run_id="next", log=logged.append):  # ...but stale at once: its pid is gone
        pass
    assert logged and f"its process {holder.pid} on this host" in logged[0]


RACE = """
import sys, time
from posstats.errors import PosstatsError
from posstats.service.pipeline_store import Store
time.sleep(max(0.0, float(sys.argv[3]) - time.time()))  # a loaded machine may start us late
try:
    with Store(sys.argv[1]).lock(run_id=sys.argv[2]):
        print("won", flush=True)
        time.sleep(1.5)
except PosstatsError:
    print("refused", flush=True)
"""


def test_racing_takers_of_one_stale_lock_get_it_once(tmp_path):
    store = Store(str(tmp_path / "store"))
    for trial in range(3):
        store.write_json("lock", _record(pid=999999, hostname=HOST, run_id="dead"))
        start = time.time() + 5.0  # room for four interpreters to import posstats on a loaded machine
        procs = [subprocess.Popen([sys.executable, "-c", RACE, store.root, f"t{trial}-{i}", str(start)],
                                  stdout=subprocess.PIPE, text=True) for i in range(4)]
        outs = [p.communicate(timeout=60)[0].strip() for p in procs]
        assert sorted(outs) == ["refused", "refused", "refused", "won"], outs


def test_read_only_and_full_disk_errors_are_explained():
    assert "read-only file system" in describe_os_error(OSError(30, "Read-only file system", "/s/lock"))
    text = describe_os_error(RuntimeError("wrapped").with_traceback(None))
    assert text is None
    inner = OSError(28, "No space left on device", "/s/runs/x")
    outer = RuntimeError("task failed")
    outer.__cause__ = inner
    assert describe_os_error(outer).startswith("/s/runs/x: no space left on the device")


def test_store_json_is_plain_json(store, tmp_path):
    _complete_run(store, tmp_path, "r1")
    store.move_latest("r1")
    for rel in ("latest", "runs/r1/done.json", "runs/r1/count/done.json"):
        json.loads(store.read_bytes(rel))


def test_status_shows_a_stale_lock_and_incomplete_runs(tmp_path, capsys):
    from posstats.cli import main as cli

    store = Store(str(tmp_path))
    _complete_run(store, tmp_path, "done-run")
    store.move_latest("done-run")
    store.publish_stage("half-run", "config", _stage_dir(tmp_path / "h", "config", {"config.json": b"{}"}))
    store.write_json("lock", _record(pid=999999, run_id="half-run"))
    assert cli(["status", "--store", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "latest: done-run" in out and "half-run: INCOMPLETE  [config -count" in out
    assert f"lock: STALE by run half-run (pid 999999 on {HOST}" in out and "is gone" in out
    assert cli(["logs", "--store", str(tmp_path), "--run-id", "half-run"]) == 2
    assert "no such log" in capsys.readouterr().err
