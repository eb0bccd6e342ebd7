"""A snapshot's write cut short (kill -9 mid-write, a full disk, a state_dir it cannot write) leaves the last
good snapshot or none, never a torn one read as good, and the controller keeps running.

The controller runs in a child process (tests/functional/warm_child.py) writing a snapshot every few
milliseconds while the test writes to the store; the test kills it -9 at moments when a write is under
way (its temporary file exists), at several points of the write, then starts a controller on the
same state_dir: it resumes from whatever good snapshot is there, and its cache equals the store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from dfpubsub.controller.snapfile import FILE, TEMP_PREFIX, read_file
from tests.conftest import wait_for
from tests.functional.replay_helpers import Backend
from tests.functional.warm_helpers import Run, cache_state, populated, store_state

N = 5000
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture
def backend(tmp_path):
    return Backend("sqlite", f"sqlite:///{tmp_path}/nb.sqlite")


@pytest.fixture
def store(backend):
    with populated(backend, N) as s:
        yield s


def _child(backend, state_dir, interval, fsize=None):
    args = [sys.executable, "-m", "tests.functional.warm_child", backend.url, str(state_dir), str(interval)]
    if fsize is not None:
        args.append(str(fsize))
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.strip() == "synced", (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc


def _counts(proc):
    """The child's (snapshots written, snapshot errors), from its latest line."""
    written, errors = map(int, proc.stdout.readline().split())
    return written, errors


def _temporaries(state_dir):
    return [n for n in os.listdir(state_dir) if n.startswith(TEMP_PREFIX)]


@pytest.mark.parametrize("delay", [0.0, 0.002, 0.01, 0.03])
def test_kill_9_during_a_snapshot_write_leaves_the_last_good_one(backend, store, tmp_path, delay):
    state_dir = tmp_path / "state"
    proc = _child(backend, state_dir, interval=0.001)
    stop = threading.Event()

    def writes():
        i = 0
        while not stop.is_set():
            store.update("port", f"k{i % N}", {"i": -i})
            i += 1
            # Paced: what changes between the last good snapshot and the restart must stay within
            # what a replay may read (a tenth of the cache), or the start rightly relists instead.
            stop.wait(0.002)

    writer = threading.Thread(target=writes, daemon=True)
    writer.start()
    try:
        wait_for(lambda: _counts(proc)[0] >= 2, timeout=180, what="two snapshots written")
        wait_for(lambda: _temporaries(state_dir), timeout=180, interval=0.0005, what="a write under way")
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    finally:
        stop.set()
        writer.join()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    snapshot = read_file(str(state_dir))  # never torn: the last good one
    assert snapshot.header["objects"] == N + 20
    for i in range(20):  # and more while it is down
        store.update("port", f"k{i}", {"down": i})
    run = Run(store, state_dir, f"killed-{delay}")
    try:
        assert run.start.result == "resumed", run.start
        assert cache_state(run.ctrl) == store_state(store)
        assert not _temporaries(state_dir)  # what the killed write left is removed at the start
    finally:
        run.stop()


def test_a_full_disk_keeps_the_last_good_snapshot_and_the_controller_running(backend, store, tmp_path):
    state_dir = tmp_path / "state"
    run = Run(store, state_dir, "full-disk-first")
    run.stop()
    good = os.path.getsize(state_dir / FILE)
    for i in range(1000):  # the next snapshot is bigger (and a replay still reads less than a relist)
        store.update("port", f"k{i}", {"i": i, "pad": "y" * 300})
    # No file of the child's may grow past the good snapshot's size: as a disk with that much room.
    proc = _child(backend, state_dir, interval=0.05, fsize=good + 4096)
    try:
        wait_for(lambda: _counts(proc)[1] >= 3, timeout=180, what="three failed writes")
        assert proc.poll() is None  # still running
        # The child retries every 0.05 s, so a write may be under way at any look; what a failed
        # write must not do is leave its temporary behind: none seen now outlives two more failures.
        seen = set(_temporaries(state_dir))
        errors = _counts(proc)[1]
        wait_for(lambda: _counts(proc)[1] >= errors + 2, timeout=180, what="two more failed writes")
        assert not seen & set(_temporaries(state_dir))
        written, _ = _counts(proc)
        assert written == 0
        assert read_file(str(state_dir)).header["objects"] == N + 20  # the last good one
    finally:
        proc.kill()
        proc.wait()
    run = Run(store, state_dir, "full-disk-after")
    try:
        assert run.start.result == "resumed", run.start
        assert cache_state(run.ctrl) == store_state(store)
    finally:
        run.stop()


def test_a_state_dir_it_cannot_write_is_counted_and_the_controller_runs_cold(backend, store, tmp_path):
    (tmp_path / "file").write_text("not a directory")
    run = Run(store, tmp_path / "file" / "state", "unwritable", interval=0.05)
    try:
        assert (run.start.result, run.start.reason) == ("relisted", "unreadable")
        assert cache_state(run.ctrl) == store_state(store)
        wait_for(lambda: run.ctrl.stats.get("snapshot_errors", "ENOTDIR") >= 2, timeout=120,
                 what="failed writes counted")
        store.update("port", "k1", {"still": "running"})
        assert run.ctrl.synced.is_set()
    finally:
        run.stop()
