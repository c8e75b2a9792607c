"""posstats.corpus.shard_store: partials + markers (a killed writer never leaves a marker), the
store's configuration binding, and the lock rule with real processes (a live holder
refuses the second run; a SIGKILLed one does not). Sums and storage choice: test_reduce."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from posstats.corpus.shard_store import RunStore, config_key
from posstats.corpus.shards import Shard
from posstats.counting.counts import (
    CountSpec,
    PositionalCounts,
    count_sequences,
    fingerprint_of,
)
from posstats.counting.io import load_counts, save_counts
from posstats.errors import PosstatsError
from posstats.processes import process_start_ticks
from posstats.storage.locks import run_store_lock_is_stale as lock_is_stale

SPEC = CountSpec(6, 20)


def shard(i: int) -> Shard:
    return Shard(
        shard_id=f"{i:064x}", path=f"f{i}.parquet", format="parquet", kind="row_group", index=0, count=1,
        first_row=0, first_line=0, start=0, stop=1, member="", rows=3, size_hint=100, input_fingerprint="",
    )


def random_counts(seed: int, *, docs: int = 30, sparse: bool = False) -> PositionalCounts:
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, 20, size=rng.integers(0, 10)).tolist() for _ in range(docs)]
    c = count_sequences(seqs, positions=6, vocab_size=20, dense=not sparse)
    return PositionalCounts(c.spec, c.matrix, c.sequences, c.windows, c.tokens, fingerprint_of(f"s{seed}"))


def run_python(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])


def wait_line(proc: subprocess.Popen, expected: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.strip() == expected:
            return
        if not line and proc.poll() is not None:
            break
    proc.kill()
    pytest.fail(f"the helper process never printed {expected!r}")


# ----------------------------------------------------------------------------- partials


def test_partial_then_marker(tmp_path):
    store = RunStore(tmp_path)
    c = random_counts(1)
    assert not store.is_done(shard(1).shard_id) and store.marker(shard(1).shard_id) is None
    marker = store.write_partial(shard(1), c, pid=123)
    assert store.is_done(shard(1).shard_id)
    assert marker == store.marker(shard(1).shard_id)
    assert marker["tokens"] == c.tokens and marker["pid"] == 123 and marker["shard"] == shard(1).to_dict()
    back = load_counts(store.partial_dir(shard(1).shard_id))
    assert back.equals(c) and back.fingerprint == c.fingerprint
    assert store.done_ids() == {shard(1).shard_id}
    store.remove_partial(shard(1).shard_id)
    assert not store.is_done(shard(1).shard_id) and store.done_ids() == set()


def test_failed_write_leaves_no_marker(tmp_path, monkeypatch):
    import posstats.corpus.shard_store as runstore

    def broken(counts, directory, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(runstore, "save_counts", broken)
    store = RunStore(tmp_path)
    with pytest.raises(OSError, match="disk full"):
        store.write_partial(shard(2), random_counts(2))
    assert not store.is_done(shard(2).shard_id)


def test_writer_killed_mid_partial_leaves_no_marker(tmp_path):
    """SIGKILL between the counts file and the marker: the shard is not done, and a rerun
    completes it."""
    proc = run_python(f"""
        import time, posstats.corpus.shard_store as rs
        from tests.test_shard_store import random_counts, shard
        real = rs.save_counts
        def slow(counts, directory, **kwargs):
            path = real(counts, directory, **kwargs)
            print("saved", flush=True)
            time.sleep(60)
            return path
        rs.save_counts = slow
        rs.RunStore({str(tmp_path)!r}).write_partial(shard(3), random_counts(3))
    """)
    try:
        wait_line(proc, "saved")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.stdout.close()
    store = RunStore(tmp_path)
    assert (store.partial_dir(shard(3).shard_id) / "counts.safetensors").exists() or (
        store.partial_dir(shard(3).shard_id) / "counts.parquet"
    ).exists()
    assert not store.is_done(shard(3).shard_id)
    store.write_partial(shard(3), random_counts(3))
    assert store.is_done(shard(3).shard_id)
    assert load_counts(store.partial_dir(shard(3).shard_id)).equals(random_counts(3))


# ----------------------------------------------------------------------------- binding, manifest


def test_store_is_bound_to_one_configuration(tmp_path):
    store = RunStore(tmp_path)
    config = {"spec": SPEC.to_metadata(), "column": "ids"}
    assert store.bind(config)["key"] == config_key(config)
    store.bind(dict(config))  # the same again is fine
    other = {"spec": CountSpec(7, 20).to_metadata(), "column": "ids"}
    with pytest.raises(PosstatsError) as info:
        store.bind(other)
    assert str(info.value).startswith(f"run store {tmp_path} holds counts of another configuration (spec: ")
    assert str(info.value).endswith("; use another store")  # the library names the parameter
    from posstats.jobs.guard import error_text  # the command line names its flag

    assert error_text(info.value, argparse.Namespace()).endswith("; use another --store")


def test_publish_keeps_only_the_named_result(tmp_path):
    store = RunStore(tmp_path)
    first = store.new_result_dir("r1")
    save_counts(random_counts(1), first)
    store.publish({"result": os.path.relpath(first, tmp_path)})
    second = store.new_result_dir("r2")
    save_counts(random_counts(2), second)
    assert store.result_file() == first / "counts.safetensors"
    store.publish({"result": os.path.relpath(second, tmp_path)})
    assert not first.exists() and store.result_file() == second / "counts.safetensors"
    assert json.loads(store.manifest_path.read_text())["result"] == os.path.relpath(second, tmp_path)


# ----------------------------------------------------------------------------- lock


def test_lock_refuses_while_held_and_frees_on_sigkill(tmp_path):
    holder = run_python(f"""
        import time
        from posstats.corpus.shard_store import RunStore
        with RunStore({str(tmp_path)!r}).lock(run_id="first-run", command="count"):
            print("locked", flush=True)
            time.sleep(120)
    """)
    try:
        wait_line(holder, "locked")
        info = json.loads((tmp_path / "lock").read_text())
        assert info["pid"] == holder.pid and info["hostname"] == socket.gethostname() and info["run_id"] == "first-run"
        with pytest.raises(PosstatsError) as refused:
            with RunStore(tmp_path).lock(run_id="second-run", command="count"):
                pass
        message = str(refused.value)
        assert message.startswith(f"run store {tmp_path} is in use by run first-run (count, pid {holder.pid} on ")
        assert "\n" not in message
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        holder.kill()
        holder.stdout.close()
    # the dead holder's lock file is still there, with its pid, but does not block
    assert json.loads((tmp_path / "lock").read_text())["pid"] == holder.pid
    with RunStore(tmp_path).lock(run_id="second-run", command="count") as mine:
        assert mine["pid"] == os.getpid()
        with pytest.raises(PosstatsError, match="is in use by run second-run"):
            with RunStore(tmp_path).lock(run_id="third", command="refresh"):
                pass
    assert (tmp_path / "lock").read_text() == ""  # released: emptied, never unlinked


def test_pid_rule():
    me = socket.gethostname()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    base = {"hostname": me, "started": "2026-01-01T00:00:00+00:00", "run_id": "r", "command": "count"}
    assert lock_is_stale({**base, "pid": dead.pid})
    assert not lock_is_stale({**base, "pid": os.getpid()})
    assert not lock_is_stale({**base, "pid": dead.pid, "hostname": "another-host"})
    ticks = process_start_ticks(os.getpid())
    if ticks is not None:  # Linux: a reused pid is a different process
        assert not lock_is_stale({**base, "pid": os.getpid(), "start_ticks": ticks})
        assert lock_is_stale({**base, "pid": os.getpid(), "start_ticks": ticks + 1})
    assert lock_is_stale({})
